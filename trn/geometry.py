"""Coordinate conventions, written down once.

Units: km and degrees. Frame: Moon body-fixed (MOON_PA ~ IAU_MOON), X towards (lat 0, lon 0),
Z towards the north pole. Longitudes are degrees east; functions accept any real longitude and
return values in [0, 360). Latitudes are planetocentric.

Camera frame: +Z is the boresight, +X points to increasing image column, +Y to increasing image
row. A pose is ``(R, t)`` with ``R`` [3, 3] the rotation camera -> body (columns are the camera
axes in the body frame) and ``t`` [3] the camera position in km, as in the Luna-1 KITTI file.
Continuous pixel coordinates put the centre of pixel (row r, column c) at (x, y) = (c + 0.5, r + 0.5).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from trn.errors import ConfigError

MOON_RADIUS_KM = 1737.4
MOON_GM_KM3_S2 = 4902.800066  # GM of the Moon (DE421), km^3 / s^2


def latlon_to_xyz(lat_deg: np.ndarray, lon_deg: np.ndarray, radius_km: np.ndarray | float = MOON_RADIUS_KM) -> np.ndarray:
    """Body-fixed position, float64 [..., 3] km, of points at ``radius_km`` from the centre."""
    lat = np.radians(np.asarray(lat_deg, dtype=np.float64))
    lon = np.radians(np.asarray(lon_deg, dtype=np.float64))
    r = np.asarray(radius_km, dtype=np.float64)
    lat, lon, r = np.broadcast_arrays(lat, lon, r)
    c = np.cos(lat)
    return np.stack([r * c * np.cos(lon), r * c * np.sin(lon), r * np.sin(lat)], axis=-1)


def latlon_to_xyz_at(lat_deg: np.ndarray, lon_deg: np.ndarray, radii: list) -> list[np.ndarray]:
    """:func:`latlon_to_xyz` of the same points at each radius of ``radii`` (arrays shaped like
    ``lat_deg``, or floats), the same values, the angles' sines and cosines computed once."""
    lat = np.radians(np.asarray(lat_deg, dtype=np.float64))
    lon = np.radians(np.asarray(lon_deg, dtype=np.float64))
    c, s, cos_lon, sin_lon = np.cos(lat), np.sin(lat), np.cos(lon), np.sin(lon)
    return [np.stack([r * c * cos_lon, r * c * sin_lon, r * s], axis=-1) for r in radii]


def norm_last(v: np.ndarray) -> np.ndarray:
    """``np.linalg.norm(v, axis=-1)``, the same values (its own arithmetic) without its argument
    handling, for small arrays in loops."""
    return np.sqrt(np.add.reduce(v * v, axis=-1))


def xyz_to_latlon(xyz: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inverse of :func:`latlon_to_xyz`: (lat deg, lon deg east in [0, 360), radius km)."""
    xyz = np.asarray(xyz, dtype=np.float64)
    r = norm_last(xyz)
    lat = np.degrees(np.arcsin(np.clip(xyz[..., 2] / np.maximum(r, 1e-300), -1.0, 1.0)))
    lon = np.mod(np.degrees(np.arctan2(xyz[..., 1], xyz[..., 0])), 360.0)
    return lat, lon, r


def wrap_lon(lon_deg: np.ndarray | float) -> np.ndarray:
    """Longitude in [0, 360)."""
    return np.mod(np.asarray(lon_deg, dtype=np.float64), 360.0)


def east_north_up(lat_deg: np.ndarray, lon_deg: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Local unit vectors (east, north, up), each float64 [..., 3], in the body frame."""
    lat = np.radians(np.asarray(lat_deg, dtype=np.float64))
    lon = np.radians(np.asarray(lon_deg, dtype=np.float64))
    sl, cl, so, co = np.sin(lat), np.cos(lat), np.sin(lon), np.cos(lon)
    east = np.stack([-so, co, np.zeros_like(so)], axis=-1)
    north = np.stack([-sl * co, -sl * so, cl], axis=-1)
    up = np.stack([cl * co, cl * so, sl], axis=-1)
    return east, north, up


def quat_to_matrix(q: np.ndarray) -> np.ndarray:
    """SPICE quaternion (scalar first, [..., 4]) -> rotation matrix [..., 3, 3] (SPICE q2m)."""
    q = np.asarray(q, dtype=np.float64)
    q = q / np.linalg.norm(q, axis=-1, keepdims=True)
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    m = np.empty(q.shape[:-1] + (3, 3))
    m[..., 0, 0] = 1 - 2 * (y * y + z * z)
    m[..., 0, 1] = 2 * (x * y - w * z)
    m[..., 0, 2] = 2 * (x * z + w * y)
    m[..., 1, 0] = 2 * (x * y + w * z)
    m[..., 1, 1] = 1 - 2 * (x * x + z * z)
    m[..., 1, 2] = 2 * (y * z - w * x)
    m[..., 2, 0] = 2 * (x * z - w * y)
    m[..., 2, 1] = 2 * (y * z + w * x)
    m[..., 2, 2] = 1 - 2 * (x * x + y * y)
    return m


def matrix_to_quat(m: np.ndarray) -> np.ndarray:
    """Rotation matrix [3, 3] -> SPICE quaternion (scalar first, w >= 0), inverse of quat_to_matrix."""
    m = np.asarray(m, dtype=np.float64)
    tr = np.trace(m)
    if tr > 0:
        s = 2.0 * np.sqrt(tr + 1.0)
        q = [0.25 * s, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s]
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2])
        q = [(m[2, 1] - m[1, 2]) / s, 0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s]
    elif m[1, 1] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2])
        q = [(m[0, 2] - m[2, 0]) / s, (m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s]
    else:
        s = 2.0 * np.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1])
        q = [(m[1, 0] - m[0, 1]) / s, (m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s]
    q = np.asarray(q)
    q /= np.linalg.norm(q)
    return q if q[0] >= 0 else -q


def pixel_to_latlon(row: np.ndarray, col: np.ndarray, ppd: float, top_lat: float, west_lon: float) -> tuple[np.ndarray, np.ndarray]:
    """Centre of pixel (row, col) of an equirectangular grid -> (lat, lon) in degrees.

    The grid has ``ppd`` pixels per degree, its top edge at ``top_lat`` and its left edge at
    ``west_lon`` (rows run north to south, columns west to east).
    """
    lat = top_lat - (np.asarray(row, dtype=np.float64) + 0.5) / ppd
    lon = wrap_lon(west_lon + (np.asarray(col, dtype=np.float64) + 0.5) / ppd)
    return lat, lon


def latlon_to_pixel(lat_deg: np.ndarray, lon_deg: np.ndarray, ppd: float, top_lat: float, west_lon: float) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`pixel_to_latlon`: fractional (row, col); integer values are pixel centres."""
    row = (top_lat - np.asarray(lat_deg, dtype=np.float64)) * ppd - 0.5
    col = np.mod(np.asarray(lon_deg, dtype=np.float64) - west_lon, 360.0) * ppd - 0.5
    return row, col


@dataclass(frozen=True)
class PinholeCamera:
    """Ideal pinhole camera.

    width, height: image size in pixels.
    fov_deg: full field of view across the larger image dimension (Blender's "auto" sensor fit),
    39.6 degrees for Luna-1.
    """

    width: int
    height: int
    fov_deg: float = 39.6

    def __post_init__(self) -> None:
        if self.width < 8 or self.height < 8:
            raise ConfigError(f"camera size {self.width}x{self.height} is too small; use at least 8x8 pixels")
        if not 1.0 <= self.fov_deg <= 170.0:
            raise ConfigError(f"camera fov_deg={self.fov_deg} is out of range; expected 1 to 170 degrees")

    @property
    def focal_px(self) -> float:
        return 0.5 * max(self.width, self.height) / np.tan(np.radians(self.fov_deg) / 2.0)

    @property
    def principal_point(self) -> tuple[float, float]:
        return 0.5 * self.width, 0.5 * self.height

    def project(self, p_cam: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Camera-frame points [..., 3] -> continuous pixel (x, y) and depth z (km)."""
        p_cam = np.asarray(p_cam, dtype=np.float64)
        z = p_cam[..., 2]
        safe = np.where(np.abs(z) < 1e-12, 1e-12, z)
        cx, cy = self.principal_point
        return cx + self.focal_px * p_cam[..., 0] / safe, cy + self.focal_px * p_cam[..., 1] / safe, z

    def rays(self) -> np.ndarray:
        """Unit ray directions in the camera frame through every pixel centre, float64 [H, W, 3]."""
        return _camera_rays(self.width, self.height, float(self.fov_deg)).copy()

    def shared_rays(self) -> np.ndarray:
        """:meth:`rays`, computed once per camera shape and shared: read-only."""
        return _camera_rays(self.width, self.height, float(self.fov_deg))


@functools.lru_cache(maxsize=32)
def _camera_rays(width: int, height: int, fov_deg: float) -> np.ndarray:
    cam = PinholeCamera(width, height, fov_deg)
    cx, cy = cam.principal_point
    xs = (np.arange(width) + 0.5 - cx) / cam.focal_px
    ys = (np.arange(height) + 0.5 - cy) / cam.focal_px
    gx, gy = np.meshgrid(xs, ys)
    d = np.stack([gx, gy, np.ones_like(gx)], axis=-1)
    d = d / np.linalg.norm(d, axis=-1, keepdims=True)
    d.setflags(write=False)
    return d


def world_to_camera(points_body: np.ndarray, rotation: np.ndarray, position_km: np.ndarray) -> np.ndarray:
    """Body-frame points [..., 3] -> camera frame, for a pose (R camera->body, t km)."""
    return (np.asarray(points_body, dtype=np.float64) - position_km) @ np.asarray(rotation)


def camera_to_world(points_cam: np.ndarray, rotation: np.ndarray, position_km: np.ndarray) -> np.ndarray:
    """Inverse of :func:`world_to_camera`."""
    return np.asarray(points_cam, dtype=np.float64) @ np.asarray(rotation).T + position_km


def ray_sphere_intersection(origin: np.ndarray, directions: np.ndarray, radius_km: float) -> tuple[np.ndarray, np.ndarray]:
    """Nearest distances along unit rays from ``origin`` [3] to a centred sphere.

    Returns (t_near, t_far), float64 [...]; NaN where the ray misses. For an origin inside
    the sphere t_near is negative.
    """
    o = np.asarray(origin, dtype=np.float64)
    b = directions @ o
    c = o @ o - radius_km * radius_km
    disc = b * b - c
    sq = np.sqrt(np.where(disc >= 0, disc, np.nan))
    return -b - sq, -b + sq


def nadir_pose(position_km: np.ndarray, velocity_km_s: np.ndarray) -> np.ndarray:
    """Camera -> body rotation [3, 3] for a nadir-pointing camera whose image "up" (-Y) is the
    direction of flight: +Z towards the body centre, -Y along the horizontal velocity."""
    p = np.asarray(position_km, dtype=np.float64)
    z = -p / np.linalg.norm(p)
    v = np.asarray(velocity_km_s, dtype=np.float64)
    v_h = v - (v @ z) * z
    n = np.linalg.norm(v_h)
    if n < 1e-12:
        raise ConfigError("velocity is parallel to the radius vector; a nadir pose needs horizontal motion")
    y = -v_h / n
    x = np.cross(y, z)
    return np.stack([x, y, z], axis=1)
