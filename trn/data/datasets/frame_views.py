"""Frame-domain training views: a crater as the navigation camera records it.

A landmark render is a nadir orthographic view under a light tethered to the camera; a
navigation crop is cut by a detector's box from a perspective frame under the real Sun, anywhere
in the field of view, sometimes clipped by the frame edge. A frame view is the second kind made on
purpose for a training crater: a pinhole camera (the frame renderer's, same photometry, shadows and
detail) is placed so that the crater's centre falls on a drawn pixel at a drawn altitude, the Sun
is drawn over the crater, the annotation rule (:func:`trn.data.datasets.annotate.crater_box`) gives the
box, the scenarios' detector noise (:func:`trn.data.views.crops.jitter_box`) moves it, and only that
box is rendered (:func:`trn.data.worlds.render.render_frame` with a window), so a view costs its own
pixels, not a 512 px frame. A draw whose crater gets no box, or whose crop carries nothing to
recognise (:func:`trn.data.views.crops.crop_information`), is drawn again.

Everything about view k of crater c comes from ``numpy.random.default_rng([seed, 104729, c, k])``,
so a view is the same bytes whatever the order, the process or the number of workers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Callable

import numpy as np

from trn.data.datasets.annotate import AnnotateConfig, crater_box
from trn.data.views.crops import InformationRule, crop_information, jitter_box
from trn.data.worlds.render import RenderConfig, Surface, render_frame
from trn.errors import ConfigError, DataError
from trn.geometry import MOON_RADIUS_KM, east_north_up, latlon_to_xyz

HeightFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
VIEW_SEED_TAG = 104_729


def _pair(name: str, v: tuple[float, float], lo: float, hi: float) -> None:
    if not (lo <= v[0] <= v[1] <= hi):
        raise ConfigError(f"frame view {name}={tuple(v)}: need {lo} <= low <= high <= {hi}")


@dataclass(frozen=True)
class FrameViewRanges:
    """What a frame view is drawn from (each uniformly, unless said otherwise).

    altitude_km: camera altitude above the reference sphere (the LRO sequence flies 74-114 km).
    off_nadir_deg: angle of the boresight from the local vertical under the camera, in a uniformly
        drawn direction (the LRO frames point within 0.04 degrees of nadir).
    sun_elevation_deg: the Sun's elevation over the crater centre; low values give the long
        shadows of the terminator (under the LRO sequence's day-side frames it spans 0-78.4
        degrees, median 43.7; its azimuth takes every value).
    sun_azimuth_deg: its compass azimuth (clockwise from north).
    shrink_px / shift_px: the detector noise applied to the annotation rule's box (the
        scenarios' defaults).
    max_tries: draws per view before the crater is reported as impossible to view.
    pass_sun_deg: None draws the Sun for every view on its own. A number draws one Sun per crater
        (from the ranges above, seeded by the crater alone) and moves it by at most this many
        degrees in elevation and azimuth per view: the views of a crater are then what one pass,
        or consecutive orbits, record (Moon Navigation's and Lost-in-Space's re-observations see
        nearly the same Sun), while the craters together still cover every Sun. A crater whose
        view finds no box or no informative crop in a quarter of ``max_tries`` draws under that
        Sun (a bright floor saturated under a high Sun, a floor in shadow) moves on to the next
        Sun of its own seeded sequence, so its views may then see two Suns; each view's record
        holds the Sun it saw.
    track_step_px: None draws every view's geometry on its own. A pair (lo, hi) makes a crater's
        K views K consecutive frames of one pass: one altitude, pointing, heading and Sun per
        crater, the crater moving along the image's y axis by a step drawn once per crater from
        [lo, hi] px per frame (the LRO sequence, 10 s a frame at 1.6 km/s from 74-114 km with a
        39.6-degree field, moves the ground by about 100-160 px), so that the views differ as Moon
        Navigation's re-observations do: position in the field, perspective, clipping, box noise.
        A track is drawn again whole (up to ``max_tries``) until every view has a box and an
        informative crop; a view's box noise is its own.
    The crater centre falls on a pixel drawn uniformly over the whole frame, and the image's
    heading (the azimuth of its +x axis) is uniform: craters near the edge come out clipped as the
    annotation rule allows.
    """

    altitude_km: tuple[float, float] = (30.0, 200.0)
    off_nadir_deg: tuple[float, float] = (0.0, 5.0)
    sun_elevation_deg: tuple[float, float] = (1.0, 85.0)
    sun_azimuth_deg: tuple[float, float] = (0.0, 360.0)
    shrink_px: int = 10
    shift_px: int = 10
    max_tries: int = 40
    pass_sun_deg: float | None = None
    track_step_px: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if self.track_step_px is not None:
            _pair("track_step_px", self.track_step_px, 1.0, 400.0)
            if self.pass_sun_deg is not None:
                raise ConfigError("frame views: track_step_px and pass_sun_deg are exclusive (a track has one Sun)")
        if self.pass_sun_deg is not None and not 0.0 <= self.pass_sun_deg <= 30.0:
            raise ConfigError(f"frame view pass_sun_deg={self.pass_sun_deg}: expected 0 to 30 degrees (or None)")
        _pair("altitude_km", self.altitude_km, 5.0, 2000.0)
        _pair("off_nadir_deg", self.off_nadir_deg, 0.0, 30.0)
        _pair("sun_elevation_deg", self.sun_elevation_deg, 0.5, 90.0)
        _pair("sun_azimuth_deg", self.sun_azimuth_deg, 0.0, 360.0)
        if self.shrink_px < 0 or self.shift_px < 0:
            raise ConfigError(f"frame view detector noise shrink_px={self.shrink_px}, shift_px={self.shift_px}: need >= 0")
        if not 1 <= self.max_tries <= 1000:
            raise ConfigError(f"frame view max_tries={self.max_tries}: expected 1 to 1000")

    def key_dict(self) -> dict:
        """The settings as recorded in frame_views.json (pass_sun_deg and track_step_px only when
        set, so that the views rendered before they existed keep their manifest)."""
        d = asdict(self)
        for optional in ("pass_sun_deg", "track_step_px"):
            if d[optional] is None:
                d.pop(optional)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "FrameViewRanges":
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"unknown frame view settings {sorted(unknown)}; known: {sorted(cls.__dataclass_fields__)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


@dataclass(frozen=True)
class ViewDraw:
    """One draw of the viewing geometry (degrees, km, pixels)."""

    altitude_km: float
    pixel: tuple[float, float]
    heading_deg: float
    off_nadir_deg: float
    off_nadir_azimuth_deg: float
    sun_elevation_deg: float
    sun_azimuth_deg: float

    @classmethod
    def sample(cls, rng: np.random.Generator, ranges: FrameViewRanges, width: int, height: int) -> "ViewDraw":
        u = rng.random(8)

        def lerp(r: tuple[float, float], x: float) -> float:
            return float(r[0] + x * (r[1] - r[0]))

        return cls(altitude_km=lerp(ranges.altitude_km, u[0]), pixel=(float(u[1] * width), float(u[2] * height)),
                   heading_deg=float(360.0 * u[3]), off_nadir_deg=lerp(ranges.off_nadir_deg, u[4]),
                   off_nadir_azimuth_deg=float(360.0 * u[5]), sun_elevation_deg=lerp(ranges.sun_elevation_deg, u[6]),
                   sun_azimuth_deg=lerp(ranges.sun_azimuth_deg, u[7]))


def local_direction(lat: float, lon: float, azimuth_deg: float, elevation_deg: float) -> np.ndarray:
    """Unit vector (body frame) at compass azimuth / elevation over the local horizon at (lat, lon)."""
    east, north, up = east_north_up(lat, lon)
    az, el = np.radians(azimuth_deg), np.radians(elevation_deg)
    return np.cos(el) * (np.sin(az) * east + np.cos(az) * north) + np.sin(el) * up


def view_pose(lat: float, lon: float, centre_height_km: float, draw: ViewDraw, render: RenderConfig
              ) -> tuple[np.ndarray, np.ndarray]:
    """Camera pose (R camera->body, position km) that puts the crater centre (at
    ``centre_height_km``) on pixel ``draw.pixel`` with the camera at ``draw.altitude_km``.

    The boresight leans ``off_nadir_deg`` from the vertical over the crater towards
    ``off_nadir_azimuth_deg``; the image's +x axis points at compass ``heading_deg`` (projected
    across the boresight); the camera then sits on the ray back through the drawn pixel.
    """
    camera = render.camera
    east, north, up = east_north_up(lat, lon)
    lean = local_direction(lat, lon, draw.off_nadir_azimuth_deg, 0.0)
    t = np.radians(draw.off_nadir_deg)
    z = -(np.cos(t) * up) + np.sin(t) * lean  # boresight, towards the ground
    h = np.radians(draw.heading_deg)
    x = np.sin(h) * east + np.cos(h) * north
    x = x - (x @ z) * z
    if np.linalg.norm(x) < 1e-9:  # heading along the boresight: any perpendicular
        x = np.cross(z, east)
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    rotation = np.stack([x, y, z], axis=1)
    cx, cy = camera.principal_point
    d_cam = np.array([(draw.pixel[0] - cx) / camera.focal_px, (draw.pixel[1] - cy) / camera.focal_px, 1.0])
    d = rotation @ (d_cam / np.linalg.norm(d_cam))  # from the camera towards the crater centre
    centre = latlon_to_xyz(lat, lon, MOON_RADIUS_KM + centre_height_km)
    r = MOON_RADIUS_KM + draw.altitude_km
    # camera = centre - s d with |camera| = r: s^2 - 2 s (centre . d) + |centre|^2 - r^2 = 0
    cd = float(centre @ d)
    disc = cd * cd - float(centre @ centre) + r * r
    if disc < 0:
        raise DataError(f"no camera at {draw.altitude_km} km sees ({lat}, {lon}) through pixel {draw.pixel}")
    s = cd + np.sqrt(disc)
    return rotation, centre - s * d


@dataclass(frozen=True)
class FrameViewRecord:
    """How a frame view was made: the accepted draw, the rule's box and the cut box in the
    (virtual) frame, whether the rule's box is clipped by the frame edge, how many draws were
    refused and why."""

    crater: int
    k: int
    draw: ViewDraw
    box: tuple[int, int, int, int]
    crop_box: tuple[int, int, int, int]
    clipped: bool
    tries: int
    refused: dict

    def to_dict(self) -> dict:
        d = asdict(self)
        d["draw"]["pixel"] = [round(v, 3) for v in d["draw"]["pixel"]]
        d["draw"] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in d["draw"].items()}
        return d


def _shoot(surface: Surface, height: HeightFn, lat: float, lon: float, diameter_km: float, h_centre: float,
           draw: ViewDraw, jitter: np.random.Generator, render: RenderConfig, annotate: AnnotateConfig,
           ranges: FrameViewRanges, rule: InformationRule | None
           ) -> tuple[np.ndarray, tuple[int, int, int, int], tuple[int, int, int, int], bool] | str:
    """One view at ``draw``: the crop cut by the annotation rule's box moved by detector noise from
    ``jitter``, with the rule's box, the cut box and whether the box is clipped; or why there is
    none ("no box", or :func:`crop_information`'s reason). Raises DataError when no camera can
    see the crater through the drawn pixel."""
    camera = render.camera
    rotation, position = view_pose(lat, lon, h_centre, draw, render)
    sun = local_direction(lat, lon, draw.sun_azimuth_deg, draw.sun_elevation_deg)
    box = crater_box(lat, lon, diameter_km, rotation, position, camera, height, sun, annotate)
    if box is None:
        return "no box"
    cut = jitter_box(box, jitter, ranges.shrink_px, ranges.shift_px, (camera.height, camera.width))
    l, r, t, b = cut
    crop, _ = render_frame(surface, rotation, position, sun, render, window=(l, t, r, b))
    why = crop_information(crop, rule)
    if why is not None:
        return why
    clipped = box[0] == 0 or box[2] == 0 or box[1] == camera.width or box[3] == camera.height
    return crop, box, cut, bool(clipped)


def render_frame_view(surface: Surface, height: HeightFn, crater: int, lat: float, lon: float, diameter_km: float,
                      k: int, seed: int, render: RenderConfig, annotate: AnnotateConfig,
                      ranges: FrameViewRanges, rule: InformationRule | None = None
                      ) -> tuple[np.ndarray, FrameViewRecord]:
    """View ``k`` of a crater: the uint8 crop a detector would cut, and its record.

    ``height(lat, lon)``: the elevation the annotation rule places rims with (the build's coarse
    one). Draws are repeated until the crater gets a box under the rule and its crop carries
    information; after ``ranges.max_tries`` draws a DataError names the crater.
    """
    rng = np.random.default_rng([seed, VIEW_SEED_TAG, int(crater), int(k)])
    camera = render.camera
    pass_suns: list[tuple[float, float]] = []
    if ranges.pass_sun_deg is not None:  # one Sun per crater, drawn from the crater alone
        u = np.random.default_rng([seed, VIEW_SEED_TAG, int(crater)]).random((4, 2))
        el0, az0 = ranges.sun_elevation_deg, ranges.sun_azimuth_deg
        pass_suns = [(el0[0] + a * (el0[1] - el0[0]), az0[0] + b * (az0[1] - az0[0])) for a, b in u]
    per_sun = max(1, ranges.max_tries // len(pass_suns)) if pass_suns else 0
    h_centre = float(height(np.array([lat]), np.array([lon]))[0])
    refused: dict[str, int] = {}
    for tries in range(1, ranges.max_tries + 1):
        draw = ViewDraw.sample(rng, ranges, camera.width, camera.height)
        if pass_suns:
            pass_sun = pass_suns[min((tries - 1) // per_sun, len(pass_suns) - 1)]
            j = ranges.pass_sun_deg * (2.0 * rng.random(2) - 1.0)
            el = float(np.clip(pass_sun[0] + j[0], *ranges.sun_elevation_deg))
            draw = replace(draw, sun_elevation_deg=el, sun_azimuth_deg=float((pass_sun[1] + j[1]) % 360.0))
        shot = _shoot(surface, height, lat, lon, diameter_km, h_centre, draw, rng, render, annotate, ranges, rule)
        if isinstance(shot, str):
            refused[shot] = refused.get(shot, 0) + 1
            continue
        crop, box, cut, clipped = shot
        return crop, FrameViewRecord(int(crater), int(k), draw, box, cut, clipped, tries, refused)
    raise DataError(f"crater {crater} ({diameter_km:.1f} km at {lat:.3f}, {lon:.3f}): no frame view with a box and an "
                    f"informative crop in {ranges.max_tries} draws (refused: {refused}); widen the view ranges")


TRACK_SEED_TAG = 7_919


def render_frame_track(surface: Surface, height: HeightFn, crater: int, lat: float, lon: float, diameter_km: float,
                       views: int, seed: int, render: RenderConfig, annotate: AnnotateConfig,
                       ranges: FrameViewRanges, rule: InformationRule | None = None
                       ) -> list[tuple[np.ndarray, FrameViewRecord]]:
    """Views 0..views-1 of a crater as consecutive frames of one pass (``ranges.track_step_px``).

    Attempt t draws the track from ``default_rng([seed, 104729, crater, 7919, t])``: one
    :class:`ViewDraw` (its pixel is the track's middle), and the step along the image's y axis.
    View k puts the crater centre at ``y_mid + (k - (views - 1) / 2) * step``; its box noise comes
    from view k's own generator, as in :func:`render_frame_view`. The first attempt whose every
    view has a box and an informative crop is kept; after ``ranges.max_tries`` a DataError names
    the crater.
    """
    if ranges.track_step_px is None:
        raise ConfigError("render_frame_track needs ranges.track_step_px")
    camera = render.camera
    h_centre = float(height(np.array([lat]), np.array([lon]))[0])
    refused: dict[str, int] = {}
    for tries in range(1, ranges.max_tries + 1):
        rng = np.random.default_rng([seed, VIEW_SEED_TAG, int(crater), TRACK_SEED_TAG, tries])
        base = ViewDraw.sample(rng, ranges, camera.width, camera.height)
        lo, hi = ranges.track_step_px
        step = float(lo + rng.random() * (hi - lo))
        out: list[tuple[np.ndarray, FrameViewRecord]] = []
        for k in range(views):
            y = base.pixel[1] + (k - (views - 1) / 2.0) * step
            draw = replace(base, pixel=(base.pixel[0], float(y)))
            jitter = np.random.default_rng([seed, VIEW_SEED_TAG, int(crater), int(k)])
            try:
                shot = _shoot(surface, height, lat, lon, diameter_km, h_centre, draw, jitter, render, annotate, ranges,
                              rule)
            except DataError:
                shot = "no camera"
            if isinstance(shot, str):
                refused[shot] = refused.get(shot, 0) + 1
                break
            crop, box, cut, clipped = shot
            out.append((crop, FrameViewRecord(int(crater), int(k), draw, box, cut, clipped, tries, dict(refused))))
        if len(out) == views:
            return out
    raise DataError(f"crater {crater} ({diameter_km:.1f} km at {lat:.3f}, {lon:.3f}): no track of {views} frame views "
                    f"with boxes and informative crops in {ranges.max_tries} draws (refused: {refused}); widen the "
                    "view ranges or lower --frame-views")
