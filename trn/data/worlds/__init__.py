"""The worlds frames are rendered from: the elevation and albedo of a source directory
(:mod:`.terrain`), the renderer (:mod:`.render`), the Sun (:mod:`.ephemeris`), the spacecraft's
trajectory and its pose files (:mod:`.trajectory`), and the built-in procedural Moon
(:mod:`.synth`) with its catalogue of craters down to 1 km (:mod:`.dense_catalogue`)."""
