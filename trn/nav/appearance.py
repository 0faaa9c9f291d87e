"""Predicted landmark appearance for the onboard map, and the query crops matched against it.

A catalogue render (Luna-1's ``crater_images``) shows a crater under a light tethered to the
camera, with a margin around the rim; a navigation frame shows it under the real Sun, cropped by
the detector's box. Flown systems close that gap on the map side: OSIRIS-REx's Natural Feature
Tracking rendered each feature from the shape model under the illumination predicted for the
moment it would be imaged. :func:`pass_illumination` does the same from the planned trajectory
and the Sun ephemeris (the dataset's poses and ``metadata.json``), and :func:`rim_window` keeps
the square that the crater's rim spans, which is what a detector's box frames. On the frame side,
:func:`trn.data.views.crops.square_crop` cuts the square centred on the detection whose side is the box's longer side,
so that the crop is not stretched when it is resized to the network's input.

Measured on the real Luna-1 build with the default model (docs/navigation.md): the true crater's
median similarity 0.43 (catalogue renders, box crops) -> 0.80 (predicted illumination, rim
window, square crops), its median rank among 5,068 map craters 1,942 -> 34.
"""

from __future__ import annotations

import numpy as np

from trn.errors import DataError
from trn.geometry import east_north_up, latlon_to_xyz


def pass_illumination(lat_deg: np.ndarray, lon_deg: np.ndarray, positions_km: np.ndarray, sun_dirs: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each crater, the Sun as seen from it when the planned trajectory passes closest
    (largest cosine between the crater's and the spacecraft's body-fixed directions): (compass
    azimuth of the Sun, clockwise from north, degrees; its elevation above the local horizon,
    degrees; the index of that pose). ``positions_km`` [N, 3] and ``sun_dirs`` [N, 3] (unit, body
    frame) are per pose."""
    lat = np.asarray(lat_deg, np.float64)
    lon = np.asarray(lon_deg, np.float64)
    pos = np.asarray(positions_km, np.float64)
    sun = np.asarray(sun_dirs, np.float64)
    if pos.ndim != 2 or pos.shape[1] != 3 or sun.shape != pos.shape or not len(pos):
        raise DataError(f"positions {pos.shape} and Sun directions {sun.shape}: need two [N>0, 3] arrays")
    if not (np.isfinite(pos).all() and np.isfinite(sun).all()):
        raise DataError("positions or Sun directions contain NaN or infinite values")
    u = pos / np.linalg.norm(pos, axis=1, keepdims=True)
    c = latlon_to_xyz(lat, lon, 1.0)
    k = np.empty(len(lat), np.int64)
    for i in range(0, len(lat), 4096):  # [chunk, N] at a time: bounded memory for long trajectories
        k[i:i + 4096] = np.argmax(c[i:i + 4096] @ u.T, axis=1)
    east, north, up = east_north_up(lat, lon)
    s = sun[k] / np.linalg.norm(sun[k], axis=1, keepdims=True)
    elevation = np.degrees(np.arcsin(np.clip((s * up).sum(1), -1.0, 1.0)))
    azimuth = np.degrees(np.arctan2((s * east).sum(1), (s * north).sum(1))) % 360.0
    return azimuth, elevation, k


def rim_window_px(size: int, diameter_km: float, window_km: float) -> tuple[int, int]:
    """(offset, side) in pixels of the centred square that a crater's rim spans in a square
    landmark render of ``size`` pixels and ground width ``window_km``."""
    if not 0 < diameter_km <= window_km:
        raise DataError(f"crater diameter {diameter_km} km must be positive and within the render's {window_km} km")
    k = max(4, int(round(size * diameter_km / window_km)))
    return (size - k) // 2, k


def rim_window(image: np.ndarray, diameter_km: float, window_km: float) -> np.ndarray:
    """The centred square of a landmark render (ground width ``window_km``) that the crater's
    diameter spans: what a detector's box around the rim frames."""
    if image.ndim != 2 or image.shape[0] != image.shape[1]:
        raise DataError(f"landmark render has shape {image.shape}; expected a square grey image")
    o, k = rim_window_px(image.shape[0], diameter_km, window_km)
    return image[o:o + k, o:o + k]
