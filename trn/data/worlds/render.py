"""Physically based rendering of crater landmarks and navigation frames from a height field.

Two products, one surface model (:class:`Surface` = elevation + albedo + detail synthesis):

* :func:`render_crater`: nadir, orthographic view over a crater centre, window width = diameter +
  ``margin_px`` native (64 px/deg) pixels as in Luna-1, light tethered to the camera at a fixed
  incidence from the image's left, cast shadows by an exact horizon scan.
* :func:`render_frame`: pinhole camera at a spacecraft pose, true perspective with occlusion by
  ray marching the height field (bracketing then bisection), shading under the real Sun with the
  lunar-Lambert photometric function (McEwen), soft cast shadows (the Sun's 0.53 degree disc),
  night side black.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import cv2
import numpy as np

from trn.data.worlds.terrain import KM_PER_DEG, Albedo, DetailConfig, DetailSynth, Elevation
from trn.errors import ConfigError
from trn.geometry import (MOON_RADIUS_KM, PinholeCamera, east_north_up, latlon_to_xyz_at, norm_last,
                          ray_sphere_intersection, xyz_to_latlon)

NATIVE_GSD_KM = KM_PER_DEG / 64.0  # the original Luna-1 pixel (64 px/deg) that the margin is counted in
SUN_ANGULAR_RADIUS_RAD = np.radians(0.2666)
PHOTOMETRY_MODELS = ("lunar-lambert", "lommel-seeliger", "lambert")
ILLUMINATIONS = ("physical", "baked")
RENDERER_VERSION = 4  # bump when the same settings would give different pixels


@dataclass(frozen=True)
class RenderConfig:
    """Renderer settings (recorded in metadata.json of every build).

    nav_size: navigation frame width = height in pixels.
    fov_deg: navigation camera field of view (Luna-1: 39.6 degrees).
    crater_size: landmark image size in pixels (Luna-1: 256).
    crater_margin_px: margin added to the crater diameter, in native 64 px/deg pixels (Luna-1: 25).
    crater_supersample: landmark renders are computed at this factor and area-averaged down (1 by
        default: the descriptor sees them at 128 px, itself a 2x area-averaged reduction).
    light_elevation_deg: elevation of the camera-tethered light above the local horizon at the
        crater centre; the light comes from the image's left (west, north up).
    photometry: "lunar-lambert" (McEwen 1991), "lommel-seeliger" or "lambert".
    exposure: output grey level = 255 * exposure * reflectance (normal incidence, albedo 1 -> exposure).
    shadows: cast shadows on (both products).
    shadow_step: navigation frames march shadow rays on every k-th pixel of each row and column
        first, then exactly at every pixel whose cell corners disagree (a shadow edge or a
        penumbra); where all four corners are fully lit or fully dark the cell takes that value.
        1 marches every pixel. 2 costs about a third and differs only where a shadow or a lit
        patch is narrower than k pixels (``benchmarks/dataset/render_throughput.py``).
    albedo_strength: 0 = uniform albedo, 1 = the albedo map as is.
    detail: sub-pixel detail synthesis (see :class:`DetailConfig`).
    illumination: "physical" (landmark renders under the tethered light, frames under the real
        Sun with cast shadows and a night side), or "baked": the paper's scene conditions, a
        texture shaded once under one light fixed to the local horizon everywhere (no cast
        shadows, no night) draped over the terrain and seen by both products, as Luna-1's authors
        draped one photographic mosaic with baked-in illumination over the elevation model. A
        diagnostic, not a navigation world.
    baked_light_deg: (compass azimuth, elevation) of the baked light over the local horizon; the
        default is Luna-1's tethered light (from the image's left, west, at 45 degrees).
    """

    nav_size: int = 512
    fov_deg: float = 39.6
    crater_size: int = 256
    crater_margin_px: float = 25.0
    crater_supersample: int = 1
    light_elevation_deg: float = 45.0
    photometry: str = "lunar-lambert"
    exposure: float = 0.85
    shadows: bool = True
    shadow_step: int = 4
    albedo_strength: float = 1.0
    detail: DetailConfig = field(default_factory=DetailConfig)
    illumination: str = "physical"
    baked_light_deg: tuple[float, float] = (270.0, 45.0)

    def __post_init__(self) -> None:
        checks = [
            (32 <= self.nav_size <= 4096, f"nav_size={self.nav_size}: expected 32 to 4096 pixels"),
            (32 <= self.crater_size <= 2048, f"crater_size={self.crater_size}: expected 32 to 2048 pixels"),
            (0 <= self.crater_margin_px <= 1000, f"crater_margin_px={self.crater_margin_px}: expected 0 to 1000"),
            (1 <= self.crater_supersample <= 4, f"crater_supersample={self.crater_supersample}: expected 1 to 4"),
            (1 <= self.light_elevation_deg <= 90, f"light_elevation_deg={self.light_elevation_deg}: expected 1 to 90"),
            (self.photometry in PHOTOMETRY_MODELS, f"photometry={self.photometry!r}: expected one of {PHOTOMETRY_MODELS}"),
            (0 < self.exposure <= 10, f"exposure={self.exposure}: expected (0, 10]"),
            (1 <= self.shadow_step <= 8, f"shadow_step={self.shadow_step}: expected 1 to 8"),
            (self.illumination in ILLUMINATIONS, f"illumination={self.illumination!r}: expected one of {ILLUMINATIONS}"),
            (len(self.baked_light_deg) == 2 and 1 <= self.baked_light_deg[1] <= 90,
             f"baked_light_deg={self.baked_light_deg}: expected (azimuth, elevation 1 to 90)"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(f"render setting {msg}")
        PinholeCamera(self.nav_size, self.nav_size, self.fov_deg)

    @property
    def camera(self) -> PinholeCamera:
        return PinholeCamera(self.nav_size, self.nav_size, self.fov_deg)

    @classmethod
    def from_dict(cls, d: dict) -> "RenderConfig":
        d = dict(d)
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"unknown render settings {sorted(unknown)}; known: {sorted(cls.__dataclass_fields__)}")
        if isinstance(d.get("detail"), dict):
            d["detail"] = DetailConfig(**d["detail"])
        if isinstance(d.get("baked_light_deg"), list):
            d["baked_light_deg"] = tuple(d["baked_light_deg"])
        return cls(**d)

    def key_dict(self) -> dict:
        """The settings as a dict for build keys: the illumination fields only when not the
        physical default, so that every build made before they existed keeps its key."""
        d = asdict(self)
        if self.illumination == "physical":
            d.pop("illumination")
            d.pop("baked_light_deg")
        return d


class Surface:
    """Elevation + albedo + detail synthesis, queried by (lat, lon)."""

    def __init__(self, elevation: Elevation, albedo: Albedo, detail: DetailConfig | None = None):
        self.elevation = elevation
        self.albedo = albedo
        self.detail = DetailSynth(detail or DetailConfig(enabled=False))

    def height(self, lat: np.ndarray, lon: np.ndarray, gsd_km: float, detail: bool = True) -> np.ndarray:
        """Elevation (km) seen at ground sampling ``gsd_km``: the DEM level suited to it, plus the
        synthetic detail between the render's Nyquist wavelength and the DEM's."""
        h = self.elevation.height(lat, lon, gsd_km, cubic=True)
        if detail and self.detail.cfg.enabled:
            dem_gsd = KM_PER_DEG / self.elevation.ppd_for(gsd_km)
            h = h + self.detail.height(lat, lon, 2.0 * gsd_km, 2.0 * dem_gsd)
        return h


def reflectance(mu0: np.ndarray, mu: np.ndarray, phase_deg: np.ndarray, model: str) -> np.ndarray:
    """Bidirectional reflectance relative to normal illumination and viewing (1 at mu0 = mu = 1).

    mu0, mu: cosines of the incidence and emission angles; phase_deg: phase angle.
    Lunar-Lambert: L(a) * 2 mu0 / (mu0 + mu) + (1 - L(a)) mu0 with McEwen's L(a) polynomial.
    """
    mu0 = np.clip(mu0, 0.0, 1.0)
    mu = np.clip(mu, 1e-3, 1.0)
    if model == "lambert":
        return mu0
    ls = 2.0 * mu0 / (mu0 + mu + 1e-12)
    if model == "lommel-seeliger":
        return ls
    a = np.asarray(phase_deg, dtype=np.float64)
    lw = np.clip(1.0 - 0.019 * a + 2.42e-4 * a * a - 1.46e-6 * a * a * a, 0.0, 1.0)
    return lw * ls + (1.0 - lw) * mu0


def baked_reflectance(normal: np.ndarray, lat: np.ndarray, lon: np.ndarray, cfg: RenderConfig) -> np.ndarray:
    """The baked texture's shading at surface points: the photometric function under the baked
    light (fixed to each point's local horizon), seen from the local vertical, as an
    orthorectified mosaic records it. normal: unit normals [..., 3] at (lat, lon)."""
    east, north, up = east_north_up(lat, lon)
    az, el = np.radians(cfg.baked_light_deg[0]), np.radians(cfg.baked_light_deg[1])
    light = np.cos(el) * (np.sin(az) * east + np.cos(az) * north) + np.sin(el) * up
    mu0 = np.einsum("...i,...i->...", normal, light)
    mu = np.einsum("...i,...i->...", normal, up)
    phase = np.full(np.shape(mu0), 90.0 - float(cfg.baked_light_deg[1]))
    return reflectance(mu0, mu, phase, cfg.photometry)


def _to_uint8(value: np.ndarray, exposure: float) -> np.ndarray:
    return np.clip(np.round(255.0 * exposure * value), 0, 255).astype(np.uint8)


def crater_window_km(diameter_km: float, cfg: RenderConfig) -> float:
    """Ground width of a landmark render: the diameter plus ``crater_margin_px`` native pixels."""
    if not diameter_km > 0:
        raise ConfigError(f"crater diameter {diameter_km} km must be positive")
    width_km = diameter_km + cfg.crater_margin_px * NATIVE_GSD_KM
    if width_km >= 1.9 * MOON_RADIUS_KM:
        raise ConfigError(f"crater diameter {diameter_km} km is too large for a nadir orthographic render")
    return width_km


def _window_relief(surface: Surface, lat: float, lon: float, width_km: float) -> float:
    """Elevation range (km) over a square window centred on (lat, lon), from a coarse sample, plus
    a margin for what the sample misses."""
    east, north, up = east_north_up(lat, lon)
    g = (np.linspace(-0.5, 0.5, 33) * width_km) / MOON_RADIUS_KM
    a, b = np.meshgrid(g, g)
    c = np.sqrt(np.clip(1.0 - a * a - b * b, 0.0, None))
    plat, plon, _ = xyz_to_latlon(c[..., None] * up + a[..., None] * east + b[..., None] * north)
    h = surface.elevation.height(plat, plon, width_km / 32)
    return float(h.max() - h.min()) + 1.0


@dataclass(frozen=True)
class CraterView:
    """How one landmark render looks at its crater: the light and the camera.

    light_azimuth_deg: compass azimuth (clockwise from north) of the direction towards the light;
        270 (west, the image's left) is Luna-1's tethered light.
    light_elevation_deg: the light's elevation; None = the render config's (45 by default).
    scale: ground window width as a multiple of the Luna-1 window (the crater looks 1/scale as big).
    tilt_deg / tilt_azimuth_deg: off-nadir angle of the (orthographic) camera and the compass
        azimuth it leans towards. Relief parallax is modelled; self-occlusion is not, which is
        sound for the small angles this is meant for (<= 15 degrees).
    The default view is Luna-1's nadir render, byte for byte.
    """

    light_azimuth_deg: float = 270.0
    light_elevation_deg: float | None = None
    scale: float = 1.0
    tilt_deg: float = 0.0
    tilt_azimuth_deg: float = 0.0

    def __post_init__(self) -> None:
        if self.light_elevation_deg is not None and not 1 <= self.light_elevation_deg <= 90:
            raise ConfigError(f"view light_elevation_deg={self.light_elevation_deg}: expected 1 to 90")
        if not 0.5 <= self.scale <= 2.0:
            raise ConfigError(f"view scale={self.scale}: expected 0.5 to 2")
        if not 0 <= self.tilt_deg <= 15:
            raise ConfigError(f"view tilt_deg={self.tilt_deg}: expected 0 to 15 degrees")

    @property
    def is_nadir_default(self) -> bool:
        return (self.light_azimuth_deg % 360 == 270.0 and self.light_elevation_deg is None and self.scale == 1.0
                and self.tilt_deg == 0.0)


def render_crater(surface: Surface, lat: float, lon: float, diameter_km: float, cfg: RenderConfig,
                  view: CraterView | None = None, window: tuple[int, int] | None = None) -> np.ndarray:
    """Landmark image, uint8 [crater_size, crater_size], north up, east right.

    The scene is shaded on a ground grid whose rows run along the light's horizontal direction
    (so cast shadows are an exact horizon scan along each row); for Luna-1's default view that grid
    is the image itself. Any other view (light azimuth, scale, tilt) is shaded on a larger rotated
    grid and resampled (bilinear) into the north-up image.

    ``window`` = (offset, size): only the square ``img[offset:offset + size, offset:offset + size]``
    of that image, shaded from the grid rows it needs (and, for the shadows' horizon scan, every
    column on the light's side): the same pixels as cutting the whole render, bit for bit, at a
    fraction of its cost when the square is small (the rim of a small crater in its landmark
    window, :func:`trn.nav.appearance.rim_window_px`). A tilted view shades the whole grid.
    """
    view = view or CraterView()
    o, k = (0, cfg.crater_size) if window is None else (int(window[0]), int(window[1]))
    if not (0 <= o and k >= 1 and o + k <= cfg.crater_size):
        raise ConfigError(f"render window {window} (offset, size): must lie inside the {cfg.crater_size}-pixel "
                          "landmark image")
    ss = cfg.crater_supersample
    width_km = crater_window_km(diameter_km, cfg) * view.scale
    n = cfg.crater_size * ss
    out = slice(o * ss, (o + k) * ss)  # the window's pixels at the shading resolution
    gsd = width_km / n
    elev = cfg.light_elevation_deg if view.light_elevation_deg is None else view.light_elevation_deg
    tan_e = np.tan(np.radians(elev))
    east0, north0, up = east_north_up(lat, lon)
    default = view.is_nadir_default
    # Grid axes: light from the grid's left (-gx), rows along -gy; gx, gy, up right-handed.
    az = np.radians(view.light_azimuth_deg)
    towards_light = np.sin(az) * east0 + np.cos(az) * north0
    gx = -towards_light
    gy = np.cross(up, gx)
    tan_t = np.tan(np.radians(view.tilt_deg))
    # Grid size: the image itself for the default view; else the image's circumscribed square
    # plus room for relief parallax.
    relief = _window_relief(surface, lat, lon, 2.0 * width_km) if (cfg.shadows or tan_t > 0) else 0.0
    if default:
        m = n
    else:
        m = int(np.ceil(n * np.sqrt(2.0) / (np.cos(np.radians(view.tilt_deg))) + 2 * relief * tan_t / gsd)) + 4
    # Extra columns on the light's side so that shadows cast from outside the window are kept:
    # as far as the local relief can throw a shadow at this light elevation.
    extra = int(min(m, np.ceil(min(relief / tan_e, width_km) / gsd))) if cfg.shadows else 0
    half = m * gsd / 2.0
    ta = np.radians(view.tilt_azimuth_deg)
    lean = np.sin(ta) * east0 + np.cos(ta) * north0
    # The grid rows [r0, r1) and columns [c0, c1) (counted from the first extra column) that the
    # window reads, with a margin of two for the normals' differences and the bilinear taps.
    if default:
        r0, r1, c0, c1 = out.start - 1, out.stop + 1, out.start - 1 + extra, out.stop + 1 + extra
        coords = None
    else:
        coords = _ViewCoords(n, gsd, half, extra, east0, north0, gx, gy, lean, view, out)
        if view.tilt_deg > 0:  # parallax moves the taps by the relief: shade it all
            r0, r1, c0, c1 = 0, m, 0, m + extra
        else:
            col, row = coords.at(coords.xe, coords.xn)
            r0, r1 = int(np.floor(row.min())) - 2, int(np.ceil(row.max())) + 3
            c0, c1 = int(np.floor(col.min())) - 2, int(np.ceil(col.max())) + 3
    r0, r1, c1 = max(0, r0), min(m, r1), min(m + extra, c1)
    if cfg.shadows and cfg.illumination == "physical":
        # The horizon scan of the window's columns starts as far towards the light as a shadow can
        # reach them: z varies by at most the relief plus the sphere's drop over the grid, so a
        # point more than that / tan(e) away on the light's side stays under the light ray of every
        # window point. Starting nearer changes no pixel of the whole render, and saves most of a
        # small window's columns (a tilted view shades from the first column as before).
        drop = ((m / 2.0 + extra) * gsd * np.sqrt(2.0)) ** 2 / (2.0 * MOON_RADIUS_KM)
        reach = int(np.ceil((relief + drop) / tan_e / gsd)) + 2
        c0 = 0 if view.tilt_deg > 0 else max(0, c0 - reach)
    else:
        c0 = max(0, c0)
    u = ((np.arange(-extra, m) + 0.5) * gsd - half)[c0:c1]  # along gx, km
    v = (half - (np.arange(m) + 0.5) * gsd)[r0:r1]  # along gy, km (row 0 at the top)
    uu, vv = np.meshgrid(u, v)
    a, b = uu / MOON_RADIUS_KM, vv / MOON_RADIUS_KM
    c = np.sqrt(np.clip(1.0 - a * a - b * b, 0.0, None))
    dirs = c[..., None] * up + a[..., None] * gx + b[..., None] * gy
    plat, plon, _ = xyz_to_latlon(dirs)
    h = surface.height(plat, plon, gsd)
    radius = MOON_RADIUS_KM + h
    pts = dirs * radius[..., None]
    # Exact surface normal from the 3-D positions of the grid.
    du = np.gradient(pts, axis=1)
    dv = np.gradient(pts, axis=0)
    normal = np.cross(du, -dv)  # (gx x gy) points up
    normal /= np.linalg.norm(normal, axis=-1, keepdims=True)
    light = np.cos(np.radians(elev)) * (-gx) + np.sin(np.radians(elev)) * up
    look = np.cos(np.radians(view.tilt_deg)) * up + np.sin(np.radians(view.tilt_deg)) * lean  # towards the camera
    mu0 = normal @ light
    mu = normal @ look
    phase = np.full(mu.shape, float(np.degrees(np.arccos(np.clip(light @ look, -1.0, 1.0)))))
    value = reflectance(mu0, mu, phase, cfg.photometry)
    if cfg.illumination == "baked":
        value = baked_reflectance(normal, plat, plon, cfg)
    value *= surface.albedo(plat, plon)
    z = pts @ up - MOON_RADIUS_KM
    if cfg.shadows and cfg.illumination == "physical":
        # Height above the tangent plane at the centre; a point is shadowed when some point on the
        # light's side rises above the light ray: max_{u'<u}(z + u' tan e) > z + u tan e.
        g = z + uu * tan_e
        horizon = np.maximum.accumulate(g, axis=1)
        prev = np.concatenate([np.full((len(v), 1), -np.inf), horizon[:, :-1]], axis=1)
        value = np.where(prev > g + 1e-9, 0.0, value)
    if coords is None:
        img = _to_uint8(value[out.start - r0:out.stop - r0, out.start + extra - c0:out.stop + extra - c0],
                        cfg.exposure)
    else:
        img = _to_uint8(coords.resample(value, z, r0, c0), cfg.exposure)
    if ss > 1:
        img = cv2.resize(img.astype(np.float32), (k, k), interpolation=cv2.INTER_AREA)
        img = np.clip(np.round(img), 0, 255).astype(np.uint8)
    return img


class _ViewCoords:
    """Where the north-up image's pixels (those of ``out``, rows and columns alike) fall on a
    view's rotated shading grid.

    An output pixel at image-plane offset w (km, east/north) sees the ground point x solving
    x = w' + z(x) tan(tilt) * lean, where w' stretches w by 1/cos(tilt) along the lean (the
    foreshortening of an orthographic camera tilted towards ``lean``); three fixed-point steps.
    """

    def __init__(self, n: int, gsd: float, half: float, extra: int, east: np.ndarray, north: np.ndarray,
                 gx: np.ndarray, gy: np.ndarray, lean: np.ndarray, view: CraterView, out: slice):
        e = ((np.arange(n) + 0.5) * gsd - n * gsd / 2.0)[out]
        we, wn = np.meshgrid(e, -e)  # east, north offsets in the image plane
        self.le, self.ln = float(lean @ east), float(lean @ north)
        self.tilt = np.radians(view.tilt_deg)
        along = (we * self.le + wn * self.ln) * (1.0 / np.cos(self.tilt) - 1.0)
        self.xe, self.xn = we + along * self.le, wn + along * self.ln
        self.ge = np.array([gx @ east, gx @ north])
        self.gn = np.array([gy @ east, gy @ north])
        self.gsd, self.half, self.extra = gsd, half, extra

    def at(self, pe: np.ndarray, pn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(column, row) float32 on the whole grid (columns counted from the first extra one)."""
        gu = pe * self.ge[0] + pn * self.ge[1]
        gv = pe * self.gn[0] + pn * self.gn[1]
        col = (gu + self.half) / self.gsd - 0.5 + self.extra
        row = (self.half - gv) / self.gsd - 0.5
        return col.astype(np.float32), row.astype(np.float32)

    def resample(self, value: np.ndarray, z: np.ndarray, r0: int, c0: int) -> np.ndarray:
        """The image from the grid's part whose first row is ``r0`` and first column ``c0``
        (shifting float32 coordinates by whole pixels is exact, so the taps are the whole grid's)."""
        def remap(src: np.ndarray, col: np.ndarray, row: np.ndarray) -> np.ndarray:
            return cv2.remap(src.astype(np.float32), col - np.float32(c0), row - np.float32(r0), cv2.INTER_LINEAR,
                             borderMode=cv2.BORDER_REPLICATE)

        pe, pn = self.xe, self.xn
        if self.tilt > 0:
            for _ in range(3):
                zz = remap(z, *self.at(pe, pn))
                pe = self.xe + zz * np.tan(self.tilt) * self.le
                pn = self.xn + zz * np.tan(self.tilt) * self.ln
        return remap(value, *self.at(pe, pn))


@dataclass(frozen=True)
class FrameGeometry:
    """Per-pixel result of ray casting a frame: hit mask [H, W] and lat/lon/height where hit."""

    hit: np.ndarray
    lat: np.ndarray
    lon: np.ndarray
    height_km: np.ndarray
    top_bound_km: float = float("nan")  # upper elevation bound over the whole frame's footprint


def _local_height_bounds(surface: Surface, rays: np.ndarray, origin: np.ndarray, gsd: float) -> tuple[float, float]:
    """Elevation bounds over a frame's footprint, from a coarse sample of its rays (where each
    meets the reference sphere, or its closest approach for rays past the limb), with a margin."""
    e = surface.elevation
    t_near, _ = ray_sphere_intersection(origin, rays, MOON_RADIUS_KM)
    t = np.where(np.isfinite(t_near), t_near, np.maximum(-(rays @ origin), 0.0))
    la, lo, _ = xyz_to_latlon(origin + t[:, None] * rays)
    hh = e.height(la, lo, gsd)
    margin = 1.5
    return max(e.min_km, float(hh.min()) - margin), min(e.max_km, float(hh.max()) + margin)


Window = tuple[int, int, int, int]  # (x0, y0, x1, y1): columns x0..x1-1, rows y0..y1-1 of a frame


def check_window(window: Window, camera: PinholeCamera) -> Window:
    """A pixel window inside the frame, as ints; refused with the frame size when it is not."""
    x0, y0, x1, y1 = (int(v) for v in window)
    if not (0 <= x0 < x1 <= camera.width and 0 <= y0 < y1 <= camera.height):
        raise ConfigError(f"pixel window {window} (x0, y0, x1, y1) must lie inside the "
                          f"{camera.width}x{camera.height} frame with x0 < x1 and y0 < y1")
    return x0, y0, x1, y1


def cast_rays(surface: Surface, camera: PinholeCamera, rotation: np.ndarray, position_km: np.ndarray,
              lipschitz: float = 1.0, tol_km: float = 0.002, max_iter: int = 200,
              window: Window | None = None) -> FrameGeometry:
    """First intersection of every pixel's ray with the height field (occlusion-correct).

    Height-field sphere tracing: with the terrain slope bounded by ``lipschitz`` (tan of the
    steepest slope, 1 = 45 degrees), a ray whose vertical clearance above the terrain is f can
    advance f / (cos(theta) + L sin(theta)) without passing through it, theta being the ray's angle
    from the local vertical. Near nadir this converges in about ten steps.

    ``window``: trace only the pixels of that window of the frame (the result has the window's
    shape). The height bounds still come from the whole frame's footprint and every ray is traced
    on its own, so each pixel's hit is the one the whole frame gives.
    """
    cam_rays = camera.shared_rays()
    rot_t = np.asarray(rotation).T
    origin = np.asarray(position_km, dtype=np.float64)
    gsd = float(np.linalg.norm(origin) - MOON_RADIUS_KM) / camera.focal_px
    sub = cam_rays[::8, ::8].reshape(-1, 3) @ rot_t
    hmin, hmax = _local_height_bounds(surface, sub, origin, gsd)
    x0, y0, x1, y1 = check_window(window, camera) if window is not None else (0, 0, camera.width, camera.height)
    rays = cam_rays[y0:y1, x0:x1].reshape(-1, 3) @ rot_t
    t_top, t_top_far = ray_sphere_intersection(origin, rays, MOON_RADIUS_KM + hmax)
    t_bot, _ = ray_sphere_intersection(origin, rays, MOON_RADIUS_KM + hmin)
    n = rays.shape[0]
    cand = np.isfinite(t_top) & (t_top_far > 0)
    idx = np.nonzero(cand)[0]
    t = np.maximum(t_top[idx], 0.0)
    t_end = np.where(np.isfinite(t_bot[idx]), t_bot[idx], t_top_far[idx])
    entry = origin + t[:, None] * rays[idx]
    cos_th = np.clip(-np.einsum("ij,ij->i", rays[idx], entry) / np.linalg.norm(entry, axis=1), 0.0, 1.0)
    gain = 1.0 / (cos_th + lipschitz * np.sqrt(1.0 - cos_th * cos_th))
    t_hit = np.full(n, np.nan)
    for _ in range(max_iter):
        if idx.size == 0:
            break
        p = origin + t[:, None] * rays[idx]
        la, lo, r = xyz_to_latlon(p)
        f = r - MOON_RADIUS_KM - surface.elevation.height(la, lo, gsd)
        done = f < tol_km
        t_hit[idx[done]] = t[done]
        t_next = t + f * gain
        keep = ~done & (t_next <= t_end + tol_km)
        idx, t, t_end, gain = idx[keep], t_next[keep], t_end[keep], gain[keep]
    hit = np.isfinite(t_hit)
    lat = np.full(n, np.nan)
    lon = np.full(n, np.nan)
    hgt = np.full(n, np.nan)
    j = np.nonzero(hit)[0]
    p = origin + t_hit[j, None] * rays[j]
    lat[j], lon[j], r = xyz_to_latlon(p)
    hgt[j] = r - MOON_RADIUS_KM
    shape = (y1 - y0, x1 - x0)
    return FrameGeometry(hit.reshape(shape), lat.reshape(shape), lon.reshape(shape), hgt.reshape(shape), hmax)


def _sun_visibility(surface: Surface, points: np.ndarray, sun: np.ndarray, hmax: float, gsd: float,
                    lipschitz: float = 1.0, max_iter: int = 96) -> np.ndarray:
    """Visible fraction of the solar disc (0..1) at surface points [N, 3] (soft shadows).

    Marches towards the Sun recording the smallest clearance angle (clearance / distance); steps
    are bounded by the clearance over the rate at which the terrain could close it (Lipschitz).
    """
    n = points.shape[0]
    up = points / np.linalg.norm(points, axis=1, keepdims=True)
    sin_e = np.clip(up @ sun, -1.0, 1.0)
    cos_e = np.sqrt(1.0 - sin_e * sin_e)
    closing = np.maximum(lipschitz * cos_e - sin_e, 1e-3)
    min_angle = np.full(n, np.inf)
    # Where the Sun is higher than the steepest slope nothing can shadow (beyond self-shadowing,
    # which the cosine of incidence handles).
    active = np.nonzero(sin_e < lipschitz * cos_e)[0]
    s = np.full(active.size, max(2.0 * gsd, 0.05))
    for _ in range(max_iter):
        if active.size == 0:
            break
        q = points[active] + s[:, None] * sun
        la, lo, r = xyz_to_latlon(q)
        ray_h = r - MOON_RADIUS_KM
        clearance = ray_h - surface.elevation.height(la, lo, gsd)
        min_angle[active] = np.minimum(min_angle[active], clearance / s)
        keep = (ray_h < hmax) & (min_angle[active] > -SUN_ANGULAR_RADIUS_RAD) & (s < 500.0)
        step = np.maximum(np.abs(clearance) / closing[active], 0.05 + 0.03 * s)
        active, s = active[keep], (s + step)[keep]
    return np.clip((min_angle + SUN_ANGULAR_RADIUS_RAD) / (2 * SUN_ANGULAR_RADIUS_RAD), 0.0, 1.0)


def _frame_visibility(surface: Surface, m: np.ndarray, pts: np.ndarray, cand: np.ndarray, sun: np.ndarray,
                      hmax: float, gsd: float, step: int) -> np.ndarray:
    """Sun visibility of the candidate pixels ``cand`` (indices into the hit pixels of mask ``m``,
    whose points are ``pts``), coarse to fine with ``step`` (see RenderConfig.shadow_step)."""
    if step == 1:
        return _sun_visibility(surface, pts[cand], sun, hmax, gsd)
    h, w = m.shape
    pix = np.flatnonzero(m)[cand]  # flat image index of each candidate
    r, c = pix // w, pix % w
    # the corners: samples on rows and columns that are multiples of step (and the last row/column)
    rows = np.unique(np.r_[np.arange(0, h, step), h - 1])
    cols = np.unique(np.r_[np.arange(0, w, step), w - 1])
    at = np.full((h, w), -1, dtype=np.int64)
    at.reshape(-1)[pix] = np.arange(pix.size)
    corner_img = np.full((rows.size, cols.size), np.nan)
    sub = at[np.ix_(rows, cols)]
    k = sub[sub >= 0]
    corner_img[sub >= 0] = _sun_visibility(surface, pts[cand[k]], sun, hmax, gsd)
    # the cell of each candidate: corners rows[i], rows[i + 1] around r (same for columns)
    i = np.clip(np.searchsorted(rows, r, side="right") - 1, 0, rows.size - 2)
    j = np.clip(np.searchsorted(cols, c, side="right") - 1, 0, cols.size - 2)
    quad = np.stack([corner_img[i, j], corner_img[i + 1, j], corner_img[i, j + 1], corner_img[i + 1, j + 1]])
    lo, hi = np.min(quad, axis=0), np.max(quad, axis=0)  # NaN (a corner off the lit surface) propagates
    settled = (lo == hi) & ((lo == 0.0) | (lo == 1.0))
    vis = np.where(settled, lo, np.nan)
    on_corner = np.isin(r, rows) & np.isin(c, cols)
    vis[on_corner] = corner_img[np.searchsorted(rows, r[on_corner]), np.searchsorted(cols, c[on_corner])]
    rest = np.nonzero(np.isnan(vis))[0]
    if rest.size:
        vis[rest] = _sun_visibility(surface, pts[cand[rest]], sun, hmax, gsd)
    return vis


def _one_sided_min(d_fwd: np.ndarray, d_bwd: np.ndarray) -> np.ndarray:
    """Per pixel, the one-sided difference of smaller magnitude (avoids depth discontinuities)."""
    fwd_ok = np.isfinite(d_fwd).all(-1)
    bwd_ok = np.isfinite(d_bwd).all(-1)
    # the magnitudes matter only where both are finite (np.linalg.norm's arithmetic there)
    near_fwd = norm_last(d_fwd) <= norm_last(d_bwd)
    use_fwd = fwd_ok & (~bwd_ok | near_fwd)
    return np.where(use_fwd[..., None], d_fwd, d_bwd)


def window_pad(cfg: RenderConfig) -> int:
    """Pixels a window render adds on each side so that its inner part equals the frame's: the
    normals' one-sided differences reach one pixel out, the shadow cells one ``shadow_step``."""
    return cfg.shadow_step + 2


def render_frame(surface: Surface, rotation: np.ndarray, position_km: np.ndarray, sun_dir: np.ndarray,
                 cfg: RenderConfig, window: Window | None = None,
                 shadow_ceiling_km: float | None = None) -> tuple[np.ndarray, FrameGeometry]:
    """Navigation frame uint8 [nav_size, nav_size] and its ray-cast geometry.

    rotation: camera -> body [3, 3]; position_km: camera position [3], body frame;
    sun_dir: unit vector [3] towards the Sun, body frame.

    ``window`` (x0, y0, x1, y1): render only that part of the frame, at the cost of its pixels
    (the result has the window's shape). The window is grown by :func:`window_pad` and aligned to
    the shadow cells, then cut back, so that every pixel equals the same pixel of the whole
    frame rendered with the same ``shadow_ceiling_km``.
    ``shadow_ceiling_km``: the height above which a shadow ray stops marching (it has cleared the
    terrain). The whole frame uses its highest visible point + 3 km; a window does not see the
    whole frame, so by default it uses the higher of its own highest point and the frame
    footprint's coarse elevation bound (both + 3 km): at least as high, so no occluder is missed.
    """
    camera = cfg.camera
    origin = np.asarray(position_km, dtype=np.float64)
    inner = None
    if window is not None:
        x0, y0, x1, y1 = check_window(window, camera)
        pad, step = window_pad(cfg), cfg.shadow_step
        gx0, gy0 = max(0, (x0 - pad) // step * step), max(0, (y0 - pad) // step * step)
        gx1, gy1 = min(camera.width, x1 + pad), min(camera.height, y1 + pad)
        inner = (slice(y0 - gy0, y1 - gy0), slice(x0 - gx0, x1 - gx0))
        window = (gx0, gy0, gx1, gy1)
    geom = cast_rays(surface, camera, rotation, origin, window=window)
    image, geom = _shade(surface, geom, camera, origin, sun_dir, cfg, window, shadow_ceiling_km)
    if inner is None:
        return image, geom
    return image[inner], FrameGeometry(geom.hit[inner], geom.lat[inner], geom.lon[inner], geom.height_km[inner],
                                       geom.top_bound_km)


def _shade(surface: Surface, geom: FrameGeometry, camera: PinholeCamera, origin: np.ndarray, sun_dir: np.ndarray,
           cfg: RenderConfig, window: Window | None, shadow_ceiling_km: float | None) -> tuple[np.ndarray, FrameGeometry]:
    m = geom.hit
    out = np.zeros(m.shape)
    if not m.any():
        return out.astype(np.uint8), geom
    gsd = float(np.linalg.norm(origin) - MOON_RADIUS_KM) / camera.focal_px
    lat, lon = geom.lat[m], geom.lon[m]
    # Shading uses the detailed surface: the ray-cast point lifted by the synthetic detail.
    h_full = surface.height(lat, lon, gsd)
    full, up, pts = latlon_to_xyz_at(lat, lon, [MOON_RADIUS_KM + h_full, 1.0, MOON_RADIUS_KM + geom.height_km[m]])
    pts_full = np.full(m.shape + (3,), np.nan)
    pts_full[m] = full
    nanrow = np.full((1, m.shape[1], 3), np.nan)
    nancol = np.full((m.shape[0], 1, 3), np.nan)
    across, along = pts_full[:, 1:] - pts_full[:, :-1], pts_full[1:] - pts_full[:-1]
    dx = _one_sided_min(np.concatenate([across, nancol], axis=1), np.concatenate([nancol, across], axis=1))
    dy = _one_sided_min(np.concatenate([along, nanrow], axis=0), np.concatenate([nanrow, along], axis=0))
    normal = np.cross(dy, dx)[m]
    bad = ~np.isfinite(normal).all(1) | (np.linalg.norm(np.nan_to_num(normal), axis=1) < 1e-12)
    normal[bad] = up[bad]
    normal /= np.linalg.norm(normal, axis=1, keepdims=True)
    view = origin - pts
    view /= np.linalg.norm(view, axis=1, keepdims=True)
    sun = np.asarray(sun_dir, dtype=np.float64)
    sun = sun / np.linalg.norm(sun)
    mu0 = normal @ sun
    mu = np.einsum("ij,ij->i", normal, view)
    phase = np.degrees(np.arccos(np.clip(view @ sun, -1.0, 1.0)))
    value = reflectance(mu0, mu, phase, cfg.photometry) * surface.albedo(lat, lon)
    lit = up @ sun > -0.05  # night side: the Sun is well below the local horizon
    value = np.where(lit, value, 0.0)
    if cfg.illumination == "baked":  # the draped texture: no Sun, no night, no cast shadows
        value = baked_reflectance(normal, lat, lon, cfg) * surface.albedo(lat, lon)
    elif cfg.shadows:
        cand = np.nonzero(lit & (mu0 > 0))[0]
        if cand.size:
            top = float(np.max(geom.height_km[m]))
            if shadow_ceiling_km is not None:
                hmax = float(shadow_ceiling_km)
            elif window is None:
                hmax = min(surface.elevation.max_km, top + 3.0)
            else:  # the frame footprint's bound, from the ray cast
                hmax = min(surface.elevation.max_km, max(top, geom.top_bound_km) + 3.0)
            value[cand] *= _frame_visibility(surface, m, pts, cand, sun, hmax, gsd, cfg.shadow_step)
    out[m] = value
    return _to_uint8(out, cfg.exposure), geom
