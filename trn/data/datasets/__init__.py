"""The datasets made from the worlds and read by training, the detector and the scenarios: the
Luna-1 format (:mod:`.luna1`) and its builder (:mod:`.build`), the annotation rule
(:mod:`.annotate`), frame-domain views (:mod:`.frame_views`), the detector's labels
(:mod:`.labels`, made by :mod:`.detection`), landmark image sets and their split
(:mod:`.landmarks`), and contact sheets (:mod:`.sheets`)."""
