"""Crater-detector data: navigation frames labelled from the union catalogue.

Two products share one label format (:mod:`trn.data.datasets.labels`):

* :func:`build_detection_set` renders navigation frames for training a detector, along copies of
  the source trajectory turned to other ground tracks and flown at other epochs (other Suns), and
  keeps only frames whose ground footprint stays clear of the source pass itself: the real
  build's LRO test sequence (and the built-in world's test sequence) image terrain that no
  training frame shows. Whole segments are held out as the detector's validation frames.
* :func:`label_build` labels the frames of an existing Luna-1 build (the LRO sequence) from the
  union catalogue, beside the build's own Head et al. annotations, which the scenarios keep.

Boxes follow the annotation rule (:func:`trn.data.datasets.annotate.annotate_frame`): centre in the image,
lit, rim box clipped to the frame at least ``min_box_px`` on each side. Pixel boxes are (l, r, t,
b); x = column, y = row.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from trn.data.catalogues.catalogue import Catalogue, UnionRule, catalogue_registration, union_catalogue
from trn.data.datasets import luna1
from trn.data.datasets.annotate import AnnotateConfig, annotate_frame
from trn.data.datasets.build import BuildConfig, built_render_config, render_frames, rule_height, surface_of
from trn.data.datasets.labels import (LABELS, DetectionLabels, LabelledBox, LabelledFrame, read_labels, write_labels,
                                      write_union_annotations)
from trn.data.files import atomic_write_text
from trn.data.progress import progress
from trn.data.worlds.ephemeris import sun_direction_body
from trn.data.worlds.render import RENDERER_VERSION, PinholeCamera, RenderConfig
from trn.data.worlds.synth import WORLD_MARKER, small_crater_catalogue
from trn.data.worlds.trajectory import read_trajectory, segment_trajectory
from trn.errors import ConfigError, DataError
from trn.geometry import MOON_RADIUS_KM, latlon_to_xyz

log = logging.getLogger(__name__)


def label_frames(cat: Catalogue, kitti: np.ndarray, sun: np.ndarray, frames: list[int], camera: PinholeCamera,
                 height, annotate: AnnotateConfig, desc: str = "label") -> dict[int, tuple[LabelledBox, ...]]:
    """The union boxes of each listed frame. kitti: [N, 3, 4] camera -> body [R | t] (km); sun: unit
    vectors [N, 3] towards the Sun, body frame; rows indexed by frame number."""
    index = cat.index_of()
    up = latlon_to_xyz(cat.lat, cat.lon, 1.0)
    out = {}
    for i in progress(frames, desc=desc, unit="frame"):
        k = kitti[i]
        boxes = []
        for b in annotate_frame(cat, k[:, :3], k[:, 3], camera, height, sun[i], annotate):
            j = index[b.id]
            elev = math.degrees(math.asin(float(np.clip(up[j] @ sun[i], -1.0, 1.0))))
            clipped = b.l <= 0 or b.t <= 0 or b.r >= camera.width or b.b >= camera.height
            boxes.append(LabelledBox(int(b.id), (b.l, b.r, b.t, b.b), round(float(cat.diameter_km[j]), 4),
                                     round(elev, 3), bool(clipped)))
        out[i] = tuple(boxes)
    return out


def _frame(i: int, split: str, segment: int, kitti: np.ndarray, sun: np.ndarray, boxes: tuple[LabelledBox, ...]
           ) -> LabelledFrame:
    t = kitti[i][:, 3]
    r = float(np.linalg.norm(t))
    lat, lon = math.degrees(math.asin(t[2] / r)), math.degrees(math.atan2(t[1], t[0])) % 360.0
    elev = math.degrees(math.asin(float(np.clip(t @ sun[i] / r, -1.0, 1.0))))
    return LabelledFrame(i, split, segment, round(r - MOON_RADIUS_KM, 3), round(elev, 3), round(lat, 4), round(lon, 4),
                         boxes)


def source_union_catalogue(source: str | Path, rule: UnionRule) -> Catalogue:
    """The union catalogue of a source; for a built-in world its small-crater catalogue is made
    first when it is missing (:func:`trn.data.worlds.synth.small_crater_catalogue`)."""
    if (Path(source) / WORLD_MARKER).is_file():
        small_crater_catalogue(Path(source))
    return union_catalogue(source, rule)


RELIEF_FLOOR = (0.0, 0.15, 0.3)  # radii sampled for the floor (median)
RELIEF_RIM = (0.9, 1.0, 1.1)  # radii sampled for the rim (mean)


def crater_relief(height, lat: np.ndarray, lon: np.ndarray, diameter_km: np.ndarray, samples: int = 48) -> np.ndarray:
    """float [N]: each crater's depth in an elevation model as a fraction of its diameter, the mean
    height on circles of 0.9, 1.0 and 1.1 radii about the catalogue centre minus the median height
    within 0.3 radii. A fresh simple crater has about 0.2; a crater the model does not resolve, or
    one erosion and later deposits have filled, about 0. ``height(lat, lon)``: km."""
    lat, lon, dia = (np.atleast_1d(np.asarray(v, np.float64)) for v in (lat, lon, diameter_km))
    theta = np.linspace(0.0, 2.0 * np.pi, samples, endpoint=False)
    phi, lam = np.radians(lat)[:, None], np.radians(lon)[:, None]

    def ring(f: float) -> np.ndarray:
        d = (f * dia / 2.0 / MOON_RADIUS_KM)[:, None]  # angular distance, rad
        p2 = np.arcsin(np.clip(np.sin(phi) * np.cos(d) + np.cos(phi) * np.sin(d) * np.cos(theta), -1.0, 1.0))
        l2 = lam + np.arctan2(np.sin(theta) * np.sin(d) * np.cos(phi), np.cos(d) - np.sin(phi) * np.sin(p2))
        return np.asarray(height(np.degrees(p2), np.mod(np.degrees(l2), 360.0)), np.float64).reshape(len(lat), -1)

    floor = np.median(np.concatenate([ring(f) for f in RELIEF_FLOOR], axis=1), axis=1)
    rim = np.concatenate([ring(f) for f in RELIEF_RIM], axis=1).mean(axis=1)
    return (rim - floor) / dia


# the least wall contrast at which a rendered frame shows a crater (docs/detector.md, "Relief-visible
# labels for rendered frames": fixed before any detector was scored against it)
RELIEF_VISIBLE_CONTRAST = 0.10


def relief_contrast(relief: np.ndarray, sun_elevation_deg: np.ndarray) -> np.ndarray:
    """float [N]: the Michelson contrast between a crater's sunward and far walls in a rendered
    frame, from its relief ``r`` (depth / diameter in the rendered elevation, :func:`crater_relief`)
    and the Sun's elevation ``e`` over it: a paraboloid bowl's steepest wall has ``tan s = 4 r``;
    under a cosine law the walls differ by ``tan s / tan e = 4 r / tan e``, 1 once ``s >= e`` (the
    far wall in shadow); 0 for no relief or no Sun."""
    r = np.clip(np.asarray(relief, np.float64), 0.0, None)
    e = np.radians(np.asarray(sun_elevation_deg, np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.where(e > 0, 4.0 * r / np.tan(np.clip(e, 1e-9, None)), 0.0)
    return np.minimum(c, 1.0)


def label_relief(frames: list[LabelledFrame], source: str | Path, rule: UnionRule) -> dict[int, float]:
    """{crater id: relief} (:func:`crater_relief`) of every crater labelled in ``frames``, in the
    finest elevation of ``source`` (the model the frames were rendered from)."""
    from trn.data.worlds.terrain import load_elevation

    ids = sorted({b.id for f in frames for b in f.boxes})
    if not ids:
        return {}
    cat = source_union_catalogue(source, rule)
    row = {int(c): k for k, c in enumerate(cat.ids)}
    missing = [c for c in ids if c not in row]
    if missing:
        raise DataError(f"{len(missing)} labelled craters (e.g. {missing[:3]}) are not in this source's union catalogue; "
                        "give the --source the labels were made from", source)
    k = np.array([row[c] for c in ids])
    elevation = load_elevation(Path(source))
    rel = crater_relief(lambda la, lo: elevation.height(la, lo, 0.0), cat.lat[k], cat.lon[k], cat.diameter_km[k])
    return dict(zip(ids, rel.tolist()))


def label_build(build: str | Path, source: str | Path, rule: UnionRule | None = None,
                all_frames: bool = False) -> DetectionLabels:
    """Label every rendered navigation frame of a Luna-1 build from ``source``'s union catalogue
    (split "test": the build's own sequence), writing ``detection_labels.json`` and
    ``lro_navigation/annotations_union.txt`` beside its annotations.txt, which stays as it was.
    ``all_frames``: label every pose of the build, rendered or not (for the geometric scenarios,
    which read boxes but no pixels: lost-in-space fixes on the union boxes)."""
    root = Path(build)
    settings, frames = _labelled(root, source, rule or UnionRule(), all_frames)
    write_labels(root, settings, frames)
    write_union_annotations(root, frames, "nav_images")
    return read_labels(root)


def _labelled(root: Path, source: str | Path, rule: UnionRule, all_frames: bool = False, every: int = 1
              ) -> tuple[dict, list[LabelledFrame]]:
    """The settings and the labelled frames (split "test") of a build: every ``every``-th of its
    rendered frames (with ``all_frames``, of its poses)."""
    ds = luna1.read_luna1(root)
    if ds.kitti is None or ds.metadata is None or not ds.metadata.frames:
        raise DataError("needs a Luna-1 build with poses and metadata.json (frames with their Sun)", root)
    meta = ds.metadata
    # the metadata lists the frames built, each with its frame number (a build from --first-frame K
    # starts at K, its poses at frame 0): the Sun by frame number, the frames built only
    numbers = np.array([int(f.get("frame", i)) for i, f in enumerate(meta.frames)])
    if numbers.min() < 0 or numbers.max() >= len(ds.kitti) or len(set(numbers.tolist())) != len(numbers):
        raise DataError(f"metadata.json lists frames {numbers.min()}-{numbers.max()} (or one twice) but the poses "
                        f"hold {len(ds.kitti)}; rebuild the dataset", root)
    sun = np.full((len(ds.kitti), 3), np.nan)
    sun[numbers] = np.array([f["sun_dir_body"] for f in meta.frames], dtype=np.float64)
    built = set(numbers.tolist())
    rendered = sorted(int(p.stem) for p in (root / luna1.NAV_IMAGES).glob("*.png") if p.stem.isdigit())
    rendered = [i for i in rendered if i in built]
    if all_frames:
        rendered = sorted(built)
    rendered = rendered[::every]
    if not rendered:
        raise DataError("has no rendered navigation frames to label", root / luna1.NAV_IMAGES)
    cfg = built_render_config(meta)
    src = meta.source if isinstance(meta.source, dict) else {}
    surface = surface_of(source, cfg, int(src.get("seed", 0)), bool(src.get("use_albedo", True)), src.get("max_dem_ppd"))
    annotate = AnnotateConfig(**meta.renderer.get("annotate", {}))
    cat = source_union_catalogue(source, rule)
    boxes = label_frames(cat, ds.kitti, sun, rendered, cfg.camera, rule_height(surface), annotate)
    frames = [_frame(i, "test", 0, ds.kitti, sun, boxes[i]) for i in rendered]
    settings = {"kind": "build", "source": str(Path(source).name), "rule": asdict(rule), "annotate": asdict(annotate),
                "catalogue_craters": len(cat), "catalogue_registration_km": list(catalogue_registration(source))}
    return settings, frames


def label_subset(build: str | Path, source: str | Path, out: str | Path, every: int, val_frames: int,
                 rule: UnionRule | None = None) -> DetectionLabels:
    """A detector's training set from an existing Luna-1 build: every ``every``-th rendered frame
    (consecutive frames 10 s apart share most of their ground, so a stride thins them), labelled
    from ``source``'s union catalogue and copied with its image into ``out``; the last
    ``val_frames`` of them (the end of the build's pass) are its validation split, the rest train.
    The build itself is left as it was. Refuses an ``out`` that already holds labels."""
    root, dst = Path(build), Path(out)
    if every < 1 or val_frames < 0:
        raise ConfigError(f"every={every}, val_frames={val_frames}: expected a stride of 1 or more and 0 or more "
                          "validation frames")
    if (dst / LABELS).exists():
        raise DataError("already holds detection labels; give a new --out directory or remove it", dst)
    settings, frames = _labelled(root, source, rule or UnionRule(), every=every)
    if val_frames >= len(frames):
        raise ConfigError(f"val_frames={val_frames}: the stride keeps {len(frames)} frames of {root}; leave some "
                          "for training")
    cut = len(frames) - val_frames
    frames = [replace(f, split="train" if k < cut else "val") for k, f in enumerate(frames)]
    images = dst / luna1.NAV_IMAGES
    images.mkdir(parents=True, exist_ok=True)
    for f in frames:
        shutil.copyfile(root / luna1.NAV_IMAGES / f"{f.frame}.png", images / f"{f.frame}.png")
    write_labels(dst, {**settings, "kind": "subset", "build": root.name, "every": every, "val_frames": val_frames},
                 frames)
    return read_labels(dst)


def union_labels(build: str | Path) -> DetectionLabels:
    """A build's union labels: read where ``trn-detect label`` (:func:`label_build`) wrote them, or
    made now for a built-in world's build, whose world lies in its ``.world``; any other build
    without them is refused with the command that labels it."""
    root = Path(build)
    if not (root / LABELS).is_file():
        world = root / ".world"
        if (world / WORLD_MARKER).is_file():
            log.info("labelling %s from its world's union catalogue (first use)", root)
            return label_build(root, world)
        raise DataError(f"has no union-catalogue labels; run: trn-detect label {root} --source ../shared/data/moon", root)
    return read_labels(root)


def detection_segments(n: int, first_rotation_deg: float = 3.75, day_step: float = 2.3,
                       rotations: tuple[float, ...] = ()) -> tuple[tuple[float, float], ...]:
    """``n`` copies of the source pass: ground tracks spread evenly in longitude, the first
    ``first_rotation_deg`` east of the source's (never on it), or the tracks ``rotations`` degrees
    east of it when given; each flown ``day_step`` days after the previous one (the Sun's
    body-fixed longitude moves about 12.2 degrees a day; 0: every copy at the source's own epochs,
    so its ground is lit as the source pass lights its own)."""
    if not 1 <= n <= 200:
        raise ConfigError(f"detector segments={n}: expected 1 to 200")
    if rotations and len(rotations) != n:
        raise ConfigError(f"{len(rotations)} rotations for {n} segments: give one rotation a segment")
    rot = [r % 360.0 for r in rotations] if rotations else [first_rotation_deg + j * 360.0 / n for j in range(n)]
    return tuple((round(r, 6), round((j + 1) * day_step * 86400.0, 3)) for j, r in enumerate(rot))


@dataclass(frozen=True)
class DetectionBuildConfig:
    """A detector's training frames.

    source: directory laid out like ``../shared/data/moon`` (or a built-in world).
    out: output directory (resumable).
    segments: copies of the source pass (:func:`detection_segments`); the last ``val_segments``
        of them are the detector's validation frames.
    first_rotation_deg, day_step, rotations: the segments' plan (:func:`detection_segments`);
        another first rotation gives other ground tracks, for more frames beside an existing build;
        ``rotations`` near 0 with ``day_step`` 0 and every segment held out give validation frames
        of the source pass itself (its Sun, neighbouring ground it did not image).
    stride: keep every stride-th frame of a segment (10 s apart: 10 frames = 100 s, about 160 km
        along track, more than a frame's footprint, so no two kept frames overlap).
    min_sun_elevation_deg: the Sun's least elevation at the sub-camera point (day side).
    clear_deg_per_km: a frame is kept only when its nadir point lies farther from every nadir
        point of the source pass than (its altitude + that frame's altitude) times this
        (half the footprint's diagonal per km of altitude for a 39.6 degree camera is
        tan(26.7 degrees) = 0.503 km; the default, in degrees of arc per km of altitude, is that
        plus a margin, so that no pixel of a kept frame images ground the source pass imaged).
    """

    source: Path
    out: Path
    segments: int = 16
    val_segments: int = 2
    first_rotation_deg: float = 3.75
    day_step: float = 2.3
    rotations: tuple[float, ...] = ()
    stride: int = 10
    min_sun_elevation_deg: float = 5.0
    clear_deg_per_km: float = 0.6 * 180.0 / (math.pi * MOON_RADIUS_KM)
    limit_frames: int | None = None
    workers: int = 2
    seed: int = 0
    rule: UnionRule = field(default_factory=UnionRule)
    render: RenderConfig = field(default_factory=RenderConfig)
    annotate: AnnotateConfig = field(default_factory=AnnotateConfig)

    def __post_init__(self) -> None:
        if not 1 <= self.segments <= 200:
            raise ConfigError(f"segments={self.segments}: expected 1 to 200")
        if not 0 <= self.val_segments <= self.segments:
            raise ConfigError(f"val_segments={self.val_segments}: expected 0 to segments ({self.segments})")
        if not (0.0 <= self.first_rotation_deg < 360.0 and 0.0 <= self.day_step <= 100.0):
            raise ConfigError(f"first_rotation_deg={self.first_rotation_deg}, day_step={self.day_step}: expected "
                              "0 to 360 degrees and 0 to 100 days")
        if any(not math.isfinite(r) or r % 360.0 == 0.0 for r in self.rotations):
            raise ConfigError(f"rotations={list(self.rotations)}: expected finite rotations, none on the source's own "
                              "track (0 degrees)")
        self.plan()  # one rotation a segment (detection_segments refuses any other count)
        if not 1 <= self.stride <= 10000:
            raise ConfigError(f"stride={self.stride}: expected 1 to 10000 frames")
        if not -90 <= self.min_sun_elevation_deg <= 90:
            raise ConfigError(f"min_sun_elevation_deg={self.min_sun_elevation_deg}: expected -90 to 90")
        if not 0 <= self.clear_deg_per_km <= 1:
            raise ConfigError(f"clear_deg_per_km={self.clear_deg_per_km}: expected 0 to 1")
        if self.limit_frames is not None and self.limit_frames < 1:
            raise ConfigError(f"limit_frames={self.limit_frames}: expected at least 1")

    def plan(self) -> tuple[tuple[float, float], ...]:
        return detection_segments(self.segments, self.first_rotation_deg, self.day_step, self.rotations)

    def key(self) -> str:
        doc = {"renderer_version": RENDERER_VERSION, "source": str(Path(self.source).resolve()),
               "segments": self.segments, "val_segments": self.val_segments, "stride": self.stride,
               "min_sun": self.min_sun_elevation_deg, "clear": self.clear_deg_per_km, "seed": self.seed,
               "rule": asdict(self.rule), "render": self.render.key_dict(), "annotate": asdict(self.annotate)}
        if self.plan() != detection_segments(self.segments):  # builds with the default plan keep their keys
            doc["plan"] = [list(x) for x in self.plan()]
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def clear_of(nadir: np.ndarray, alt: np.ndarray, ref_nadir: np.ndarray, ref_alt: np.ndarray,
             deg_per_km: float, chunk: int = 2048) -> np.ndarray:
    """bool [N]: nadir point i (unit vector, [N, 3]) lies farther from every reference nadir point
    than (alt[i] + ref_alt[j]) * deg_per_km degrees of arc."""
    ok = np.ones(len(nadir), bool)
    for s in range(0, len(nadir), chunk):
        cos = np.clip(nadir[s:s + chunk] @ ref_nadir.T, -1.0, 1.0)
        need = np.radians((alt[s:s + chunk, None] + ref_alt[None, :]) * deg_per_km)
        ok[s:s + chunk] = ~(np.arccos(cos) <= need).any(axis=1)
    return ok


def select_frames(cfg: DetectionBuildConfig, kitti: np.ndarray, sun: np.ndarray, per_segment: int,
                  ref_kitti: np.ndarray) -> list[tuple[int, int]]:
    """(frame, segment) of the frames to render: every stride-th of each segment, on the day side,
    clear of the reference pass's footprint."""
    t = kitti[:, :, 3]
    r = np.linalg.norm(t, axis=1)
    nadir, alt = t / r[:, None], r - MOON_RADIUS_KM
    rt = ref_kitti[:, :, 3]
    rr = np.linalg.norm(rt, axis=1)
    elev = np.degrees(np.arcsin(np.clip(np.einsum("ij,ij->i", nadir, sun), -1.0, 1.0)))
    idx = np.arange(0, len(kitti), cfg.stride)
    keep = idx[elev[idx] >= cfg.min_sun_elevation_deg]
    keep = keep[clear_of(nadir[keep], alt[keep], rt / rr[:, None], rr - MOON_RADIUS_KM, cfg.clear_deg_per_km)]
    chosen = [(int(i), int(i) // per_segment) for i in keep]
    return chosen[: cfg.limit_frames] if cfg.limit_frames else chosen


def build_detection_set(cfg: DetectionBuildConfig) -> DetectionLabels:
    """Render and label the detector's frames (resumable: a frame whose image exists is kept)."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = out / "detection_build.json"
    if manifest.is_file():
        try:
            old = json.loads(manifest.read_text(encoding="utf-8")).get("key")
        except (OSError, json.JSONDecodeError):
            raise DataError("build manifest is unreadable; delete the output directory and rebuild", manifest) from None
        if old != cfg.key():
            raise DataError("this directory was built with other settings; resume with the same ones or choose a new --out",
                            manifest)
    elif any(out.iterdir()):
        raise DataError("output directory is not empty and was not made by this builder; choose a new --out", out)
    atomic_write_text(manifest, json.dumps({"key": cfg.key(), "complete": False}) + "\n")
    source_traj = read_trajectory(cfg.source)
    traj = segment_trajectory(source_traj, cfg.plan())
    sun = sun_direction_body(traj.epochs)
    chosen = select_frames(cfg, traj.kitti, sun, len(source_traj), source_traj.kitti)
    if not chosen:
        raise DataError("no frame of the segments is on the day side and clear of the source pass; lower "
                        "min_sun_elevation_deg or clear_deg_per_km, or add segments", cfg.source)
    bcfg = BuildConfig(source=Path(cfg.source), out=out, workers=cfg.workers, seed=cfg.seed, render=cfg.render,
                       annotate=cfg.annotate)
    surface = surface_of(cfg.source, cfg.render, cfg.seed)
    cat = source_union_catalogue(cfg.source, cfg.rule)
    frames_idx = [i for i, _ in chosen]
    boxes = label_frames(cat, traj.kitti, sun, frames_idx, cfg.render.camera, rule_height(surface), cfg.annotate)
    first_val = cfg.segments - cfg.val_segments
    frames = [_frame(i, "val" if seg >= first_val else "train", seg, traj.kitti, sun, boxes[i]) for i, seg in chosen]
    (out / luna1.NAV_IMAGES).mkdir(parents=True, exist_ok=True)
    settings = {"kind": "detector-training", "source": Path(cfg.source).name, "segments": cfg.segments,
                "plan": [list(s) for s in cfg.plan()], "val_segments": cfg.val_segments,
                "stride": cfg.stride, "min_sun_elevation_deg": cfg.min_sun_elevation_deg,
                "clear_deg_per_km": cfg.clear_deg_per_km, "rule": asdict(cfg.rule), "annotate": asdict(cfg.annotate),
                "render": cfg.render.key_dict(), "catalogue_craters": len(cat), "frames_per_segment": len(source_traj),
                "catalogue_registration_km": list(catalogue_registration(cfg.source))}
    write_labels(out, settings, frames)
    write_union_annotations(out, frames, "nav_images")
    todo = [i for i in frames_idx if not (out / luna1.NAV_IMAGES / f"{i}.png").is_file()]
    render_frames(bcfg, traj, sun, todo, surface, "detector frames")
    atomic_write_text(manifest, json.dumps({"key": cfg.key(), "complete": True}) + "\n")
    return read_labels(out)
