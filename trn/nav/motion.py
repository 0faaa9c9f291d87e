"""Ground velocity from the terrain's motion between two consecutive frames (the cold start's velocity).

A lost-in-space fix gives a position and no velocity. Waiting for a second fix far enough away in
time to give the velocity leaves the navigator without an estimate wherever single frames hold too
few craters (9 minutes on the LRO sequence). The frames themselves say how fast the ground moves:
descent-image motion estimation (MER's DIMES, Johnson et al. 2007) measured a lander's horizontal
velocity from the shift of the terrain between two images, the attitude and the altimeter. Here:

1. **De-rotation.** The second frame is warped into the first frame's orientation by the infinite
   homography ``K R1^T R2 K^-1`` (the star tracker's attitudes, camera -> body), so what is left of
   the terrain's motion is the camera's translation.
2. **Shift.** Phase correlation of the two frames (a Hann window against the edge's spectrum)
   gives the terrain's shift in pixels and a peak response; a weak peak (featureless or dark
   terrain) is refused. Ground at depth ``Z`` moves by ``-f d / Z`` pixels for a camera
   translation ``d`` across the boresight: a first translation, over flat ground at the
   altimeter's height.
3. **Refinement on the sphere.** The first frame is re-projected to the second camera's pose on
   the reference sphere (:func:`predict_view`) and the residual shift corrects the translation,
   so the sphere's curvature, the camera's tilt and its climb are modelled; the vertical part is
   the altimeter's two distances from the Moon's centre.
4. **Velocity** = translation / time, body frame, at the pair's mid time; its covariance comes
   from the shift's pixel error, the terrain's height over the sphere (``relief_sigma_km``: a scale
   error, along the motion) and the altimeter.

Pixel order x = column, y = row; km, s, body frame (the Moon's principal axes), as in
:mod:`trn.nav.fix`.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from trn.errors import ConfigError, DataError
from trn.geometry import MOON_RADIUS_KM, PinholeCamera


@dataclass(frozen=True)
class MotionConfig:
    """Settings of :func:`image_velocity`, each checked at construction.

    shift_sigma_px: 1-sigma error of the phase-correlation shift, per axis (pixels of the frame).
    relief_sigma_km: 1-sigma height of the imaged terrain over the reference sphere (the depth's
        error; a scale error of the horizontal velocity).

    The defaults were measured on validation frames of the real build (one day pass of the 4-pass
    validation orbit, 349 frame pairs 10 s apart, ``docs/lost_in_space.md``): across the motion the
    error is 0.6 m/s (0.06 px), along it the scale error is -1.1 % +- 1.6 % (1.5 km of terrain at
    80 km).
    min_response: phase-correlation peaks below this are refused (no reliable shift).
    max_shift_fraction: shifts larger than this fraction of the frame's smaller side are refused
        (too little overlap for a shift).
    iterations: refinements of the translation on the reference sphere (:func:`predict_view`).
    scale: the frames are resized by this factor before the shift is measured (the camera with
        them: ``shift_sigma_px`` is then in the resized frame's pixels); 0.5 costs a quarter of
        the pixels.
    """

    shift_sigma_px: float = 0.5
    relief_sigma_km: float = 1.5
    min_response: float = 0.05
    max_shift_fraction: float = 0.4
    iterations: int = 4
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.shift_sigma_px <= 50:
            raise ConfigError(f"image motion shift_sigma_px={self.shift_sigma_px!r}: expected above 0, at most 50")
        if not 0 <= self.relief_sigma_km <= 20:
            raise ConfigError(f"image motion relief_sigma_km={self.relief_sigma_km!r}: expected 0 to 20 km")
        if not 0 <= self.min_response < 1:
            raise ConfigError(f"image motion min_response={self.min_response!r}: expected 0 to below 1")
        if not 0 < self.max_shift_fraction <= 0.5:
            raise ConfigError(f"image motion max_shift_fraction={self.max_shift_fraction!r}: expected above 0, "
                              "at most 0.5")
        if not 0 <= self.iterations <= 20:
            raise ConfigError(f"image motion iterations={self.iterations!r}: expected 0 to 20")
        if not 0.05 <= self.scale <= 1.0:
            raise ConfigError(f"image motion scale={self.scale!r}: expected 0.05 to 1 (a factor the frames are "
                              "resized by)")


@dataclass(frozen=True)
class ImageMotion:
    """The ground velocity between two frames: ``velocity_km_s`` [3] (body frame, at ``t_mid_s``),
    ``cov`` [3, 3] (km/s)^2, the de-rotated shift (x, y) in pixels and the correlation peak."""

    velocity_km_s: np.ndarray
    cov: np.ndarray
    t_mid_s: float
    shift_px: tuple[float, float]
    response: float


def _intrinsics(camera: PinholeCamera) -> np.ndarray:
    cx, cy = camera.principal_point
    f = camera.focal_px
    # OpenCV puts pixel centres on integers, trn on half-integers (PinholeCamera.rays)
    return np.array([[f, 0.0, cx - 0.5], [0.0, f, cy - 0.5], [0.0, 0.0, 1.0]])


def derotate(image: np.ndarray, rotation: np.ndarray, reference: np.ndarray, camera: PinholeCamera) -> np.ndarray:
    """``image`` taken with attitude ``rotation`` (camera -> body) warped to the orientation
    ``reference``: the picture the same camera would take from the same point turned to
    ``reference``. Pixels with no source are NaN."""
    k = _intrinsics(camera)
    h = k @ np.asarray(reference).T @ np.asarray(rotation) @ np.linalg.inv(k)
    return cv2.warpPerspective(np.asarray(image, np.float32), h, (image.shape[1], image.shape[0]),
                               flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=np.nan)


def _checked(name: str, image: np.ndarray, camera: PinholeCamera) -> np.ndarray:
    a = np.asarray(image)
    if a.ndim == 3 and a.shape[2] in (1, 3):
        a = a.mean(axis=2)
    if a.shape != (camera.height, camera.width):
        raise DataError(f"image motion: {name} is {a.shape}, the camera is {camera.height}x{camera.width}; "
                        "give both frames at the camera's size, grey")
    a = a.astype(np.float32)
    if not np.all(np.isfinite(a)):
        raise DataError(f"image motion: {name} holds NaN or infinite pixels; give decoded frames")
    return a


def terrain_shift(first: np.ndarray, second: np.ndarray) -> tuple[float, float, float]:
    """Shift (x, y) in pixels that carries ``first``'s terrain onto ``second`` (the same
    orientation), and the phase-correlation peak response; NaN pixels (no data) of either are left
    out. Less than a third of the frame in common gives a response of 0."""
    a = np.asarray(first, np.float32)
    b = np.asarray(second, np.float32)
    valid = np.isfinite(a) & np.isfinite(b)
    if valid.mean() < 1.0 / 3.0:
        return 0.0, 0.0, 0.0
    a = np.where(valid, a - float(a[valid].mean()), 0.0).astype(np.float32)
    b = np.where(valid, b - float(b[valid].mean()), 0.0).astype(np.float32)
    win = cv2.createHanningWindow((a.shape[1], a.shape[0]), cv2.CV_32F)
    (dx, dy), response = cv2.phaseCorrelate(a, b, win)
    return float(dx), float(dy), float(response) if np.isfinite(response) else 0.0


def predict_view(first: np.ndarray, o1: np.ndarray, rot1: np.ndarray, o2: np.ndarray, rot2: np.ndarray,
                 camera: PinholeCamera) -> np.ndarray:
    """``first`` (taken from ``o1`` with attitude ``rot1``, body frame) as the camera would see it
    from ``o2`` with ``rot2``, the ground being the reference sphere: each pixel's ray meets the
    sphere, and the ground point is looked up in ``first``. Pixels with no source are NaN."""
    rays = camera.rays().reshape(-1, 3) @ np.asarray(rot2).T
    b = rays @ o2
    disc = b * b - (o2 @ o2 - MOON_RADIUS_KM ** 2)
    dist = -b - np.sqrt(np.where(disc > 0, disc, np.nan))
    pc = (o2 + dist[:, None] * rays - o1) @ np.asarray(rot1)
    u, v, z = camera.project(pc)
    bad = ~(z > 0)
    mx = np.where(bad, -1e4, u - 0.5).astype(np.float32).reshape(camera.height, camera.width)
    my = np.where(bad, -1e4, v - 0.5).astype(np.float32).reshape(camera.height, camera.width)
    return cv2.remap(np.asarray(first, np.float32), mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT,
                     borderValue=np.nan)


@dataclass(frozen=True)
class Displacement:
    """The spacecraft's displacement between two frames: ``d_km`` [3] from its position at
    ``t0_s`` to its position at ``t1_s`` (body frame). Its error has two parts: ``cov_km2`` [3, 3],
    errors independent from one frame pair to the next (the shift's pixel error, the altimeter),
    and ``relief_km`` [3], the 1-sigma error vector of the terrain's height under the frames (a
    scale error along the motion), which frame pairs over the same ground share. ``response``: the
    phase correlation's peak (the weakest of a chain); ``shift_px``: the de-rotated frames' first
    shift (x, y) in pixels (summed along a chain)."""

    t0_s: float
    t1_s: float
    d_km: np.ndarray
    cov_km2: np.ndarray
    relief_km: np.ndarray
    response: float
    shift_px: tuple[float, float] = (0.0, 0.0)

    @property
    def cov(self) -> np.ndarray:
        """The whole covariance [3, 3] km^2 of ``d_km``."""
        return self.cov_km2 + np.outer(self.relief_km, self.relief_km)

    def then(self, later: Displacement) -> Displacement:
        """This displacement followed by ``later`` (which must start where this one ends): the
        independent parts add in variance, the relief parts add as vectors (the same ground's
        height error, counted once along the whole chain; conservative where the ground changes)."""
        if abs(later.t0_s - self.t1_s) > 1e-6:
            raise DataError(f"a chain of displacements must be contiguous: one ends at {self.t1_s} s, the next "
                            f"starts at {later.t0_s} s")
        return Displacement(self.t0_s, later.t1_s, self.d_km + later.d_km, self.cov_km2 + later.cov_km2,
                            self.relief_km + later.relief_km, min(self.response, later.response),
                            (self.shift_px[0] + later.shift_px[0], self.shift_px[1] + later.shift_px[1]))

    def reversed(self) -> Displacement:
        """The same displacement from ``t1_s`` back to ``t0_s``."""
        return Displacement(self.t1_s, self.t0_s, -self.d_km, self.cov_km2, -self.relief_km, self.response,
                            (-self.shift_px[0], -self.shift_px[1]))


def terrain_displacement(first: np.ndarray, second: np.ndarray, t1_s: float, t2_s: float, rot1: np.ndarray,
                         rot2: np.ndarray, radius1_km: float, radius2_km: float, camera: PinholeCamera,
                         altimeter_sigma_km: float, cfg: MotionConfig = MotionConfig(),
                         up: np.ndarray | None = None) -> Displacement | None:
    """The spacecraft's displacement between two frames from the terrain's motion (module
    docstring; the inputs as :func:`image_velocity`'s). ``up``: the local vertical; a frame with
    no position yet (lost in space) takes the boresight's opposite, a nadir-pointing camera: a
    tilt of the camera by an angle a then costs a scale error of 1 - cos(a) (0.02 % at 1 deg) and
    a radial error that the altimeter's distance removes wherever the displacement is applied. None
    when the shift is not reliable."""
    rot1 = np.asarray(rot1, np.float64)
    up = -rot1[:, 2] if up is None else up
    return _translation(first, second, t1_s, t2_s, rot1, rot2, radius1_km, radius2_km, up, camera,
                        altimeter_sigma_km, cfg)


def _translation(first: np.ndarray, second: np.ndarray, t1_s: float, t2_s: float, rot1: np.ndarray,
                 rot2: np.ndarray, radius1_km: float, radius2_km: float, up: np.ndarray, camera: PinholeCamera,
                 altimeter_sigma_km: float, cfg: MotionConfig) -> Displacement | None:
    """The camera's translation between two frames (module docstring, steps 1-3) with its error
    in two parts (:class:`Displacement`)."""
    dt = float(t2_s - t1_s)
    if not dt > 0:
        raise ConfigError(f"image motion: frames at {t1_s} s and {t2_s} s; the second must be later")
    a = _checked("the first frame", first, camera)
    b = _checked("the second frame", second, camera)
    if cfg.scale != 1.0:  # the same field of view on fewer pixels
        size = (max(8, round(camera.width * cfg.scale)), max(8, round(camera.height * cfg.scale)))
        a = cv2.resize(a, size, interpolation=cv2.INTER_AREA)
        b = cv2.resize(b, size, interpolation=cv2.INTER_AREA)
        camera = PinholeCamera(size[0], size[1], camera.fov_deg)
    rot1, rot2 = np.asarray(rot1, np.float64), np.asarray(rot2, np.float64)
    up = np.asarray(up, np.float64) / np.linalg.norm(up)
    c = float(up @ rot1[:, 2])  # the boresight's vertical component (about -1 looking down)
    if c > -0.5:
        raise DataError(f"image motion: the camera looks {np.degrees(np.arccos(-c)):.0f} deg off nadir; "
                        "the shift-to-translation model needs a camera within 60 deg of nadir")
    radius = 0.5 * (radius1_km + radius2_km)
    if not radius > MOON_RADIUS_KM:
        raise DataError(f"image motion: the altimeter puts the camera {radius - MOON_RADIUS_KM:.1f} km above the "
                        "reference sphere; it must be above the ground")
    depth = (radius - MOON_RADIUS_KM) / -c
    f = camera.focal_px
    # first guess: the de-rotated frames' shift over a flat ground at the altimeter's height
    dx, dy, response = terrain_shift(a, derotate(b, rot2, rot1, camera))
    if not response >= cfg.min_response or np.hypot(dx, dy) > cfg.max_shift_fraction * min(camera.width, camera.height):
        return None
    o1 = radius1_km * up

    def place(h: np.ndarray) -> np.ndarray:  # the second camera, ``h`` across the vertical, at the altimeter's radius
        h = h - up * (up @ h)
        return o1 + h + up * (np.sqrt(max(radius2_km ** 2 - h @ h, 0.0)) - radius1_km)

    h = rot1[:, :2] @ (-np.array([dx, dy]) * depth / f)
    # refined on the sphere: the first frame re-projected to the second camera's pose until the
    # frames agree (curvature, the camera's tilt and climb are in the prediction)
    for _ in range(cfg.iterations):
        rx, ry, response = terrain_shift(predict_view(a, o1, rot1, place(h), rot2, camera), b)
        if not response >= cfg.min_response:
            return None
        h = h + rot2[:, :2] @ (-np.array([rx, ry]) * depth / f)
        if np.hypot(rx, ry) < 0.02:
            break
    d = place(h) - o1
    d_xy = rot1[:, :2].T @ d
    # covariance: the shift's pixel error across the vertical and the altimeter along it (independent
    # per pair), and the terrain's height, a scale error of the horizontal part:  d = J_xy d_xy + J_r dr
    j_xy = rot1[:, :2] - np.outer(rot1[:, 2], up @ rot1[:, :2]) / c
    j_r = rot1[:, 2] / c
    cov = (depth * cfg.shift_sigma_px / f) ** 2 * (j_xy @ j_xy.T) + 2.0 * altimeter_sigma_km ** 2 * np.outer(j_r, j_r)
    relief = j_xy @ (cfg.relief_sigma_km / depth * d_xy)
    return Displacement(float(t1_s), float(t2_s), d, cov, relief, float(response),
                        (float(dx) / cfg.scale, float(dy) / cfg.scale))


def image_velocity(first: np.ndarray, second: np.ndarray, t1_s: float, t2_s: float, rot1: np.ndarray,
                   rot2: np.ndarray, radius1_km: float, radius2_km: float, up: np.ndarray, camera: PinholeCamera,
                   altimeter_sigma_km: float, cfg: MotionConfig = MotionConfig()) -> ImageMotion | None:
    """Ground velocity between two frames (module docstring): frames ``first`` and ``second`` (grey,
    the camera's size) at ``t1_s`` < ``t2_s`` with the star tracker's attitudes ``rot1``/``rot2``
    (camera -> body), the altimeter's distances from the Moon's centre ``radius1_km``/
    ``radius2_km`` (1 sigma ``altimeter_sigma_km`` each) and ``up``, the local vertical (a rough
    position suffices: the first lost-in-space fix). None when the shift is not reliable (weak
    correlation peak, or too large a shift for the frames to overlap)."""
    m = _translation(first, second, t1_s, t2_s, rot1, rot2, radius1_km, radius2_km, up, camera,
                     altimeter_sigma_km, cfg)
    if m is None:
        return None
    dt = float(t2_s - t1_s)
    # the shift (dx, dy) of the first guess is reported as measured
    return ImageMotion(m.d_km / dt, m.cov / dt ** 2, 0.5 * (t1_s + t2_s), m.shift_px, m.response)
