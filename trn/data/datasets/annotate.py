"""Crater boxes in navigation frames, from the projection of each catalogue crater's rim."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from trn.data.catalogues.catalogue import Catalogue
from trn.data.datasets.luna1 import Box
from trn.errors import ConfigError
from trn.geometry import MOON_RADIUS_KM, PinholeCamera, east_north_up, latlon_to_xyz, world_to_camera, xyz_to_latlon

HeightFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class AnnotateConfig:
    """Which craters get a box.

    min_box_px: smallest box side (after clipping to the frame) in pixels.
    min_sun_elevation_deg: the Sun must be at least this high over the crater centre (0 = lit side
        only; -90 annotates night-side craters too).
    rim_points: points sampled on the rim circle.
    """

    min_box_px: int = 12
    min_sun_elevation_deg: float = 0.0
    rim_points: int = 48

    def __post_init__(self) -> None:
        if not 1 <= self.min_box_px <= 10000:
            raise ConfigError(f"min_box_px={self.min_box_px}: expected 1 to 10000 pixels")
        if not -90 <= self.min_sun_elevation_deg <= 90:
            raise ConfigError(f"min_sun_elevation_deg={self.min_sun_elevation_deg}: expected -90 to 90")
        if not 8 <= self.rim_points <= 1024:
            raise ConfigError(f"rim_points={self.rim_points}: expected 8 to 1024")


def rim_points(lat, lon, diameter_km, n: int) -> np.ndarray:
    """Unit vectors [..., n, 3] of points on the sphere at geodesic distance diameter/2 from each
    centre (scalars give [n, 3])."""
    east, north, up = east_north_up(lat, lon)
    rho = np.asarray(0.5 * np.asarray(diameter_km, np.float64) / MOON_RADIUS_KM)[..., None, None]
    phi = 2 * np.pi * np.arange(n) / n
    return np.cos(rho) * up[..., None, :] + np.sin(rho) * (np.cos(phi)[:, None] * east[..., None, :]
                                                           + np.sin(phi)[:, None] * north[..., None, :])


def annotate_frame(cat: Catalogue, rotation: np.ndarray, position_km: np.ndarray, camera: PinholeCamera,
                   height: HeightFn, sun_dir: np.ndarray | None, cfg: AnnotateConfig) -> list[Box]:
    """Boxes of the catalogue craters seen in one frame, sorted by id.

    A crater gets a box when its centre projects inside the image, it faces the camera (not behind
    the limb), the Sun is at least ``min_sun_elevation_deg`` over it (when ``sun_dir`` is given)
    and its rim's projected box, clipped to the image, is at least ``min_box_px`` on each side.
    ``height(lat, lon)`` gives the elevation in km used to place the centre and the rim.
    """
    pos = np.asarray(position_km, dtype=np.float64)
    up_all = latlon_to_xyz(cat.lat, cat.lon, 1.0)
    # Coarse cull for any camera attitude: centres (on the reference sphere) that project within the
    # image grown by the crater's projected radius.
    x, y, z = camera.project(world_to_camera(up_all * MOON_RADIUS_KM, rotation, pos))
    margin = 0.5 * cat.diameter_km * camera.focal_px / np.maximum(z, 1e-6) + 2.0
    facing = np.einsum("ij,ij->i", pos - up_all * MOON_RADIUS_KM, up_all) > 0  # not behind the limb
    near = np.nonzero(facing & (z > 0) & (x > -margin) & (x < camera.width + margin)
                      & (y > -margin) & (y < camera.height + margin))[0]
    boxes: list[Box] = []
    for k in near:
        box = crater_box(float(cat.lat[k]), float(cat.lon[k]), float(cat.diameter_km[k]), rotation, pos, camera, height,
                         sun_dir, cfg, up=up_all[k])
        if box is not None:
            boxes.append(Box(int(cat.ids[k]), *box))
    return sorted(boxes, key=lambda bx: bx.id)


def crater_box(lat: float, lon: float, diameter_km: float, rotation: np.ndarray, position_km: np.ndarray,
               camera: PinholeCamera, height: HeightFn, sun_dir: np.ndarray | None,
               cfg: AnnotateConfig, up: np.ndarray | None = None) -> tuple[int, int, int, int] | None:
    """The annotation rule for one crater: its box (l, r, t, b) in the frame, or None when it
    gets none (see :func:`annotate_frame`). Frames and frame-domain training views both use it.
    ``up``: the centre's unit vector when the caller has it."""
    pos = np.asarray(position_km, dtype=np.float64)
    up = latlon_to_xyz(lat, lon, 1.0) if up is None else up
    centre = up * (MOON_RADIUS_KM + float(height(np.array([lat]), np.array([lon]))[0]))
    if (pos - centre) @ up <= 0:
        return None  # behind the limb
    if sun_dir is not None and np.degrees(np.arcsin(np.clip(up @ sun_dir, -1, 1))) < cfg.min_sun_elevation_deg:
        return None
    cx, cy, cz = camera.project(world_to_camera(centre, rotation, pos))
    if cz <= 0 or not (0 <= cx < camera.width and 0 <= cy < camera.height):
        return None
    rim = rim_points(lat, lon, diameter_km, cfg.rim_points)
    rlat, rlon, _ = xyz_to_latlon(rim)
    rim_xyz = rim * (MOON_RADIUS_KM + height(rlat, rlon))[:, None]
    x, y, z = camera.project(world_to_camera(rim_xyz, rotation, pos))
    if (z <= 0).any():
        return None
    l = int(np.clip(np.floor(x.min()), 0, camera.width))
    r = int(np.clip(np.ceil(x.max()), 0, camera.width))
    t = int(np.clip(np.floor(y.min()), 0, camera.height))
    b = int(np.clip(np.ceil(y.max()), 0, camera.height))
    if min(r - l, b - t) < cfg.min_box_px:
        return None
    return l, r, t, b
