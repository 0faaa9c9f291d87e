"""trn: terrain-relative-navigation landmark recognition for spacecraft.

Conventions used everywhere in the package (see ``trn.geometry``):

* Body: the Moon, sphere of radius ``MOON_RADIUS_KM`` = 1737.4 km. Lengths in km.
* Body-fixed frame: MOON_PA / IAU_MOON (the two differ by < 1 km; we do not distinguish them).
* Latitude planetocentric, longitude degrees east in [0, 360) unless stated otherwise.
* Camera frame: +Z boresight, +X image right (column), +Y image down (row).
* Pixels: x = column, y = row; pixel centres at integer + 0.5 in continuous coordinates.
"""

__version__ = "0.1.0"
