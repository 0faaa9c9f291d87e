"""Build a Luna-1-format dataset from a source directory (real lunar data or a synthetic world).

Stages (each a plain function of the config): load inputs -> annotate every frame -> render crater
landmarks -> render navigation frames -> write annotations, poses and metadata. Images are written
atomically and skipped when already present, so an interrupted build resumes where it stopped; a
manifest (``.trn-build.json``) records the settings, and resuming with different settings is
refused rather than mixing two renders in one dataset. Output bytes depend only on the inputs and
the settings (seed included), not on the number of workers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing as mp
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import cv2
import numpy as np

from trn.data.catalogues.catalogue import Catalogue, catalogue_registration, find_catalogue, read_catalogue, registered
from trn.data.datasets import luna1
from trn.data.datasets.annotate import AnnotateConfig, annotate_frame
from trn.data.datasets.frame_views import FrameViewRanges, render_frame_track, render_frame_view
from trn.data.datasets.landmarks import SPLIT_SEED, TEST_FRACTION, VAL_FRACTION, forced_craters, split_ids
from trn.data.files import atomic_write_text
from trn.data.progress import progress
from trn.data.worlds.ephemeris import sun_direction_body
from trn.data.worlds.render import RENDERER_VERSION, CraterView, RenderConfig, Surface, render_crater, render_frame
from trn.data.worlds.synth import SynthConfig, make_world
from trn.data.worlds.terrain import Albedo, load_albedo, load_elevation
from trn.data.worlds.trajectory import (Trajectory, read_trajectory, scaled_trajectory, segment_trajectory, write_poses_csv,
                                        write_poses_kitti)
from trn.errors import ConfigError, DataError
from trn.geometry import MOON_RADIUS_KM, xyz_to_latlon

log = logging.getLogger(__name__)
MANIFEST = luna1.BUILD_MANIFEST
BUILD_PARTS = ("all", "scenarios")
BUILD_LOG = "build_log.json"
# "physical": the source's trajectory as flown. "authors": the Luna-1 authors' Blender scene, whose
# camera sits at the trajectory's positions divided by AUTHORS_POSITION_DIVISOR about a Moon of
# radius one (droneslab/mars, data/lro_navigation/pose_csv/blender_world_poses.txt against
# data/pose_csv/LROCWAC_22Sep06_000000_6H_10S_poses.csv; docs/luna1-build.md): in lunar
# kilometres the positions times MOON_RADIUS_KM / 1500, attitudes unchanged.
SCENES = ("physical", "authors")
AUTHORS_POSITION_DIVISOR = 1500.0


@dataclass(frozen=True)
class BuildConfig:
    """What to build and how.

    source: directory laid out like ``../shared/data/moon``.
    out: output dataset directory (Luna-1 format).
    catalogue: file name in source/catalogs (default: the Head et al. 2010 catalogue, or the only one).
    min_diameter_km / max_abs_lat: catalogue filter. Luna-1 kept the Head craters within +-80 deg
        latitude (5,068 here; the paper reports 5,067).
    limit_frames / limit_craters: build only N frames / N craters (craters seen in the built frames
        first) for quick runs; None = all.
    first_frame: the first frame built (frame numbers stay those of the trajectory; pose files
        always start at frame 0 so that row = frame number).
    workers: parallel render processes.
    seed: seed of the detail synthesis.
    max_dem_ppd: ignore DEM levels finer than this (None = use the finest available).
    use_albedo: modulate by the source's albedo map (else uniform albedo).
    render_frames: render the navigation frames; False writes everything else (landmarks,
        annotations, poses, metadata) and leaves the build marked incomplete, so that training can
        start at once and the same command without the flag renders the frames later.
    views: extra renders of every crater under other illumination and viewing geometry (see
        :class:`ViewRanges`), written to ``crater_views/<id>_<k>.png`` for training; the Luna-1
        files and the test protocol are untouched. They can be added to a finished build.
    frame_views: K frame-domain views of every crater of the training and validation halves
        (never the test half): the crater as the navigation camera records it, cut by the
        annotation rule's box with detector noise (:mod:`trn.data.datasets.frame_views`), written to
        ``frame_views/<id>_<k>.png`` with their settings in ``frame_views/<id>.json``; for
        training. They can be added to a finished build and K raised later.
    segments: fly the source trajectory several times, copy j turned by segments[j][0] degrees
        about the spin axis and shifted by segments[j][1] seconds (:func:`validation_segments`
        draws a plan): other ground tracks and other Suns over the same terrain.
    annotate_validation_of: box only the craters of the validation half of that build's split
        (the split training and trn-sim draw), so that a sequence built this way holds no
        test-half crater: the validation orbit.
    annotate_training_of: box only the craters of the training half of that build's split: a
        training orbit, navigation frames whose boxes name training craters only (its pixels show
        whatever lies there, as a validation orbit's do). Exclusive with annotate_validation_of.
    scene: "physical" (the trajectory as flown) or "authors" (the Luna-1 authors' camera: every
        position scaled by MOON_RADIUS_KM / 1500, attitude unchanged; 360-407 km up on the LRO
        arc). The authors' light is ``render.illumination = "baked"``, which ``trn-data build
        --scene authors`` sets; under it no frame has a Sun, so no crater loses its box to one.
    parts: "all", or "scenarios": render first only what the four scenarios read (the landmarks
        of the test half, drawn by the same split as training, and the annotated frames); the
        build stays marked incomplete and the same command with parts "all" renders the rest,
        each file byte-identical to a build made in one go.
    """

    source: Path
    out: Path
    catalogue: str | None = None
    min_diameter_km: float = 20.0
    max_abs_lat: float = 80.0
    limit_frames: int | None = None
    limit_craters: int | None = None
    first_frame: int = 0
    workers: int = max(1, os.cpu_count() or 1)
    seed: int = 0
    max_dem_ppd: int | None = None
    use_albedo: bool = True
    render_frames: bool = True
    views: int = 0
    parts: str = "all"
    view_ranges: "ViewRanges" = None  # type: ignore[assignment]
    frame_views: int = 0
    frame_view_ranges: FrameViewRanges = field(default_factory=FrameViewRanges)
    segments: tuple[tuple[float, float], ...] = ()
    annotate_validation_of: Path | None = None
    annotate_training_of: Path | None = None
    scene: str = "physical"
    render: RenderConfig = field(default_factory=RenderConfig)
    annotate: AnnotateConfig = field(default_factory=AnnotateConfig)

    def __post_init__(self) -> None:
        for name in ("limit_frames", "limit_craters", "first_frame"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ConfigError(f"{name}={v}: expected a non-negative count")
        if not 1 <= self.workers <= 256:
            raise ConfigError(f"workers={self.workers}: expected 1 to 256")
        if not 0 <= self.max_abs_lat <= 90:
            raise ConfigError(f"max_abs_lat={self.max_abs_lat}: expected 0 to 90 degrees")
        if self.min_diameter_km <= 0:
            raise ConfigError(f"min_diameter_km={self.min_diameter_km}: expected > 0")
        if not 0 <= self.views <= 16:
            raise ConfigError(f"views={self.views}: expected 0 to 16 extra renders per crater")
        if not 0 <= self.frame_views <= 64:
            raise ConfigError(f"frame_views={self.frame_views}: expected 0 to 64 frame-domain views per crater")
        if self.scene not in SCENES:
            raise ConfigError(f"scene={self.scene!r}: expected one of {SCENES}")
        if self.parts not in BUILD_PARTS:
            raise ConfigError(f"parts={self.parts!r}: expected one of {BUILD_PARTS}")
        if self.view_ranges is None:
            object.__setattr__(self, "view_ranges", ViewRanges())
        if self.annotate_validation_of is not None and self.annotate_training_of is not None:
            raise ConfigError("annotate_validation_of and annotate_training_of exclude each other: a sequence names "
                              "the craters of one half of the split")
        for seg in self.segments:
            if len(seg) != 2 or not all(np.isfinite(seg)):
                raise ConfigError(f"segment {seg}: expected (rotation_deg, epoch_offset_s), both finite")

    def render_key(self) -> str:
        """Hash of everything that changes the pixels of an image that is already written."""
        doc = {
            "renderer_version": RENDERER_VERSION,
            "source": str(Path(self.source).resolve()), "catalogue": self.catalogue, "seed": self.seed,
            "max_dem_ppd": self.max_dem_ppd, "use_albedo": self.use_albedo, "render": self.render.key_dict(),
            "annotate": asdict(self.annotate), "min_diameter_km": self.min_diameter_km, "max_abs_lat": self.max_abs_lat,
        }
        if self.scene != "physical":  # likewise
            doc["scene"] = self.scene
        if self.segments:  # only then, so that the key of every earlier build stays what it was
            doc["segments"] = [list(map(float, seg)) for seg in self.segments]
        reg = catalogue_registration(self.source)
        if any(reg):  # the landmark renders and boxes sit where the registered catalogue puts the craters
            doc["catalogue_registration_km"] = list(reg)
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ViewRanges:
    """Where the extra views of a crater are drawn from (uniformly, seeded by (seed, id, k)).

    The light's azimuth anywhere around the crater and its elevation from low (long shadows, as
    in navigation frames near the terminator) to high Sun; the window scale as a detector's box
    would vary it; a small off-nadir tilt in any direction. The navigation frames show craters
    under the real Sun and in perspective, which the single tethered-light render never does.
    """

    light_elevation_deg: tuple[float, float] = (10.0, 60.0)
    scale: tuple[float, float] = (0.9, 1.15)
    tilt_deg: tuple[float, float] = (0.0, 12.0)

    def draw(self, seed: int, crater_id: int, k: int) -> CraterView:
        rng = np.random.default_rng([seed, 7_919, crater_id, k])
        az, el, sc, tilt, tilt_az = rng.random(5)
        return CraterView(light_azimuth_deg=round(360.0 * az, 3),
                          light_elevation_deg=round(self.light_elevation_deg[0] + el * (self.light_elevation_deg[1] - self.light_elevation_deg[0]), 3),
                          scale=round(self.scale[0] + sc * (self.scale[1] - self.scale[0]), 4),
                          tilt_deg=round(self.tilt_deg[0] + tilt * (self.tilt_deg[1] - self.tilt_deg[0]), 3),
                          tilt_azimuth_deg=round(360.0 * tilt_az, 3))


@dataclass
class BuildSummary:
    out: Path
    craters: int
    frames: int
    boxes: int
    seconds: dict[str, float]
    rendered_craters: int
    rendered_frames: int


# Per-process render state: set by _init_worker in each worker (spawned, so that no thread pool of
# the parent is inherited half-locked), or directly in the parent when running with one worker.
_STATE: dict = {}


def surface_of(source: str | Path, render: RenderConfig, seed: int, use_albedo: bool = True,
               max_dem_ppd: int | None = None) -> Surface:
    """The surface a build renders from: the source's elevation and albedo, detail seeded by ``seed``."""
    elevation = load_elevation(Path(source), max_dem_ppd)
    albedo = load_albedo(Path(source), render.albedo_strength) if use_albedo else Albedo.uniform()
    return Surface(elevation, albedo, replace(render.detail, seed=seed))


def _load_surface(cfg: "BuildConfig") -> Surface:
    return surface_of(cfg.source, cfg.render, cfg.seed, cfg.use_albedo, cfg.max_dem_ppd)


def built_render_config(meta: luna1.Luna1Metadata) -> RenderConfig:
    """The renderer settings a dataset was built with, from its metadata.json."""
    return RenderConfig.from_dict({k: v for k, v in meta.renderer.items() if k != "annotate"})


def built_surface(meta: luna1.Luna1Metadata, source: str | Path) -> Surface:
    """The surface a dataset's images were rendered from (``source``: its terrain directory), with
    the build's detail seed, albedo and DEM settings: a render made on it matches the build's."""
    src = meta.source if isinstance(meta.source, dict) else {}
    return surface_of(source, built_render_config(meta), int(src.get("seed", 0)), bool(src.get("use_albedo", True)),
                      src.get("max_dem_ppd"))


def _init_worker(cfg: "BuildConfig", trajectory: "Trajectory", sun: np.ndarray) -> None:
    cv2.setNumThreads(1)
    _STATE.update(out=Path(cfg.out), surface=_load_surface(cfg), render=cfg.render, trajectory=trajectory, sun=sun,
                  view_ranges=cfg.view_ranges, seed=cfg.seed, annotate=cfg.annotate,
                  frame_view_ranges=cfg.frame_view_ranges)


def rule_height(surface: Surface):
    """The elevation the annotation rule places centres and rims with (1 km: no sub-km detail)."""
    return lambda la, lo: surface.elevation.height(la, lo, 1.0)


def _render_crater_task(task: tuple[int, float, float, float]) -> int:
    cid, lat, lon, dia = task
    path = _STATE["out"] / luna1.CRATER_DIR / f"{cid}.png"
    img = render_crater(_STATE["surface"], lat, lon, dia, _STATE["render"])
    _write_png(path, img)
    return cid


def _render_view_task(task: tuple[int, int, float, float, float]) -> int:
    cid, k, lat, lon, dia = task
    view = _STATE["view_ranges"].draw(_STATE["seed"], cid, k)
    img = render_crater(_STATE["surface"], lat, lon, dia, _STATE["render"], view)
    _write_png(_STATE["out"] / luna1.VIEWS_DIR / f"{cid}_{k}.png", img)
    return cid


def _render_frame_view_task(task: tuple[int, float, float, float, int, int]) -> int:
    """Views k0..k1-1 of one crater; its record file is written last, so it marks them done."""
    cid, lat, lon, dia, k0, k1 = task
    out = _STATE["out"] / luna1.FRAME_VIEWS_DIR
    surface = _STATE["surface"]
    rec_path = out / f"{cid}.json"
    ranges: FrameViewRanges = _STATE["frame_view_ranges"]
    if ranges.track_step_px is not None:  # one pass: the track is drawn whole, so all its views again
        track = render_frame_track(surface, rule_height(surface), cid, lat, lon, dia, k1, _STATE["seed"],
                                   _STATE["render"], _STATE["annotate"], ranges)
        for crop, rec in track:
            _write_png(out / f"{cid}_{rec.k}.png", crop)
        atomic_write_text(rec_path, json.dumps([rec.to_dict() for _, rec in track]) + "\n")
        return cid
    records = json.loads(rec_path.read_text(encoding="utf-8")) if k0 > 0 else []
    for k in range(k0, k1):
        crop, rec = render_frame_view(surface, rule_height(surface), cid, lat, lon, dia, k, _STATE["seed"],
                                      _STATE["render"], _STATE["annotate"], _STATE["frame_view_ranges"])
        _write_png(out / f"{cid}_{k}.png", crop)
        records.append(rec.to_dict())
    atomic_write_text(rec_path, json.dumps(records) + "\n")
    return cid


def _render_frame_task(i: int) -> int:
    traj: Trajectory = _STATE["trajectory"]
    path = _STATE["out"] / luna1.NAV_IMAGES / f"{i}.png"
    k = traj.kitti[i]
    img, _ = render_frame(_STATE["surface"], k[:, :3], k[:, 3], _STATE["sun"][i], _STATE["render"])
    _write_png(path, img)
    return i


def _write_png(path: Path, img: np.ndarray) -> None:
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.png")
    if not cv2.imwrite(str(tmp), img, [cv2.IMWRITE_PNG_COMPRESSION, 6]):
        raise DataError("could not write image (disk full or no permission?)", tmp)
    tmp.replace(path)


def _run_parallel(fn, tasks: list, workers: int, desc: str, init_args: tuple) -> None:
    if not tasks:
        return
    bar = progress(total=len(tasks), desc=desc, unit="img")
    if workers <= 1 or len(tasks) == 1:
        for t in tasks:
            fn(t)
            bar.update(1)
    else:
        ctx = mp.get_context("spawn")
        with ctx.Pool(min(workers, len(tasks)), initializer=_init_worker, initargs=init_args) as pool:
            for _ in pool.imap_unordered(fn, tasks, chunksize=1):
                bar.update(1)
    bar.close()


def render_frames(cfg: BuildConfig, trajectory: Trajectory, sun: np.ndarray, frames: list[int], surface: Surface,
                  desc: str = "frames") -> None:
    """Render the listed navigation frames of ``trajectory`` to ``cfg.out``'s nav_images/ (with
    ``cfg.workers`` processes; in this process when one): the builder's own frame renderer, for
    other builders (the detector's frames)."""
    _STATE.update(out=Path(cfg.out), surface=surface, render=cfg.render, trajectory=trajectory, sun=sun)
    try:
        _run_parallel(_render_frame_task, list(frames), cfg.workers, desc, (cfg, trajectory, sun))
    finally:
        _STATE.clear()


def select_craters(cat: Catalogue, cfg: BuildConfig) -> Catalogue:
    """The catalogue filter of Luna-1: diameter and latitude limits."""
    keep = (cat.diameter_km >= cfg.min_diameter_km) & (np.abs(cat.lat) <= cfg.max_abs_lat)
    return cat.subset(keep)


def _check_manifest(out: Path, cfg: BuildConfig) -> None:
    path = out / MANIFEST
    if not path.is_file():
        existing = sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) if out.is_dir() else []
        if existing:
            raise DataError(f"output directory is not empty and was not made by trn-data build ({existing[:5]}); "
                            "choose a new --out", out)
        return
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        raise DataError("build manifest is unreadable; delete the output directory and rebuild", path) from None
    if doc.get("render_key") != cfg.render_key():
        raise DataError("this directory was built with different settings (source, seed, renderer or filters); "
                        "resume with the same settings or choose a new --out", path)


def build_luna1(cfg: BuildConfig) -> BuildSummary:
    """Run the whole build; returns counts and stage timings (also written to build_log.json)."""
    t_all = time.perf_counter()
    timings: dict[str, float] = {}
    out = Path(cfg.out)
    source = Path(cfg.source)
    if not source.is_dir():
        raise DataError("source directory does not exist; point --source at ../shared/data/moon or a synthetic world", source)
    out.mkdir(parents=True, exist_ok=True)
    _check_manifest(out, cfg)
    key = cfg.render_key()
    (out / MANIFEST).write_text(json.dumps({"render_key": key, "complete": False}, indent=1) + "\n", encoding="utf-8")

    t = time.perf_counter()
    log.info("build %s: reading the trajectory, the catalogue and the surface of %s", out, source)
    flown = read_trajectory(source)
    traj = scene_trajectory(flown, cfg.scene)
    one_pass = len(traj)
    if cfg.segments:
        traj = segment_trajectory(traj, cfg.segments)
    if cfg.first_frame >= len(traj):
        raise ConfigError(f"first_frame={cfg.first_frame} but the trajectory has {len(traj)} epochs")
    end = len(traj) if cfg.limit_frames is None else min(cfg.first_frame + cfg.limit_frames, len(traj))
    frame_ids = list(range(cfg.first_frame, end))
    n_frames = end
    cat_path = find_catalogue(source, cfg.catalogue)
    cat = registered(select_craters(read_catalogue(cat_path), cfg), *catalogue_registration(source))
    boxed = cat
    half_of = cfg.annotate_validation_of or cfg.annotate_training_of
    if half_of is not None:
        half = "validation" if cfg.annotate_validation_of is not None else "training"
        allowed = split_craters(half_of, half)
        unknown = allowed - {int(c) for c in cat.ids}
        if unknown:
            raise DataError(f"{len(unknown)} {half} craters of that build are not in this catalogue selection "
                            f"(first: {sorted(unknown)[0]}); build with the same catalogue and filters", half_of)
        boxed = cat.subset(np.isin(cat.ids, sorted(allowed)))
    sun = sun_direction_body(traj.epochs[:n_frames]) if n_frames else np.zeros((0, 3))  # row = frame number
    surface = _load_surface(cfg)
    elevation = surface.elevation
    timings["load_s"] = time.perf_counter() - t

    t = time.perf_counter()
    log.info("build %s: annotating %d frames against %d craters", out, len(frame_ids), len(boxed.ids))
    camera = cfg.render.camera
    coarse = 1.0  # km; the rim and centre heights need no sub-km detail

    def height(la: np.ndarray, lo: np.ndarray) -> np.ndarray:
        return elevation.height(la, lo, coarse)

    lit = cfg.render.illumination == "physical"  # the baked light has no Sun and no night side
    frames: list[luna1.FrameAnnotation] = []
    for i in progress(frame_ids, desc="annotate", unit="frame"):
        k = traj.kitti[i]
        boxes = annotate_frame(boxed, k[:, :3], k[:, 3], camera, height, sun[i] if lit else None, cfg.annotate)
        frames.append(luna1.FrameAnnotation(i, f"nav_images/{i}.png", tuple(boxes)))
    nav_craters = scene_navigation_craters(flown, cat, camera, height)
    timings["annotate_s"] = time.perf_counter() - t

    seen = sorted({b.id for f in frames for b in f.boxes})
    index = cat.index_of()
    order = seen + [int(c) for c in cat.ids if int(c) not in set(seen)]
    if cfg.limit_craters is not None:
        order = order[: cfg.limit_craters]
    chosen = set(order)
    dropped = sum(1 for f in frames for b in f.boxes if b.id not in chosen)
    if dropped:
        log.warning("--limit-craters leaves %d boxes without a landmark image; they are left out of annotations.txt", dropped)
        frames = [luna1.FrameAnnotation(f.frame, f.image, tuple(b for b in f.boxes if b.id in chosen)) for f in frames]

    (out / luna1.CRATER_DIR).mkdir(parents=True, exist_ok=True)
    (out / luna1.NAV_IMAGES).mkdir(parents=True, exist_ok=True)
    # annotations, poses and metadata first: they do not depend on any render, and the split that
    # training and the frame views draw needs them while the images are still being rendered
    luna1.write_annotations(out / luna1.ANNOTATIONS, frames)
    write_poses_csv(out / luna1.POSES_CSV, traj.poses[:n_frames])
    write_poses_kitti(out / luna1.POSES_KITTI, traj.kitti[:n_frames])
    meta = _metadata(cfg, cat, cat_path, order, traj, frame_ids, sun, one_pass)
    meta.navigation_craters = {k: sorted(set(v) & chosen) for k, v in nav_craters.items()}
    atomic_write_text(out / luna1.METADATA, meta.to_json())
    wanted_craters, wanted_frames = set(order), set(frame_ids)
    if cfg.parts == "scenarios":
        wanted_craters = scenario_craters(order, frames, nav_craters)
        wanted_frames = {f.frame for f in frames if f.boxes}
    _STATE.update(out=out, surface=surface, render=cfg.render, trajectory=traj, sun=sun, view_ranges=cfg.view_ranges,
                  seed=cfg.seed, annotate=cfg.annotate, frame_view_ranges=cfg.frame_view_ranges)
    try:
        crater_tasks = [(c, float(cat.lat[index[c]]), float(cat.lon[index[c]]), float(cat.diameter_km[index[c]]))
                        for c in sorted(order) if c in wanted_craters and not (out / luna1.CRATER_DIR / f"{c}.png").is_file()]
        t = time.perf_counter()
        _run_parallel(_render_crater_task, crater_tasks, cfg.workers, "craters", (cfg, traj, sun))
        timings["craters_s"] = time.perf_counter() - t
        view_tasks = _view_tasks(cfg, out, key, cat, index, order) if cfg.parts == "all" else []
        t = time.perf_counter()
        _run_parallel(_render_view_task, view_tasks, cfg.workers, "views", (cfg, traj, sun))
        timings["views_s"] = time.perf_counter() - t
        frame_tasks = [i for i in frame_ids if cfg.render_frames and i in wanted_frames
                       and not (out / luna1.NAV_IMAGES / f"{i}.png").is_file()]
        t = time.perf_counter()
        _run_parallel(_render_frame_task, frame_tasks, cfg.workers, "frames", (cfg, traj, sun))
        timings["frames_s"] = time.perf_counter() - t
        fv_tasks = _frame_view_tasks(cfg, out, key, cat, index, order, frames) if cfg.parts == "all" else []
        t = time.perf_counter()
        _run_parallel(_render_frame_view_task, fv_tasks, cfg.workers, "frame views", (cfg, traj, sun))
        timings["frame_views_s"] = time.perf_counter() - t
    finally:
        _STATE.clear()

    timings["total_s"] = time.perf_counter() - t_all
    n_boxes = sum(len(f.boxes) for f in frames)
    log.info("build %s: done in %.0f s (%d landmark images and %d frames rendered, parts: %s)", out,
             timings["total_s"], len(crater_tasks), len(frame_tasks), cfg.parts)
    summary = BuildSummary(out, len(order), len(frame_ids), n_boxes, timings, len(crater_tasks), len(frame_tasks))
    complete = cfg.render_frames and cfg.parts == "all"
    (out / MANIFEST).write_text(json.dumps({"render_key": key, "complete": complete, "parts": cfg.parts}, indent=1)
                                + "\n", encoding="utf-8")
    log_doc = {"craters": len(order), "frames": len(frame_ids), "boxes": n_boxes, "rendered_craters": len(crater_tasks),
               "rendered_frames": len(frame_tasks), "workers": cfg.workers, "seconds": timings}
    (out / BUILD_LOG).write_text(json.dumps(log_doc, indent=1) + "\n", encoding="utf-8")
    return summary


def scene_trajectory(flown: Trajectory, scene: str) -> Trajectory:
    """The trajectory a scene's camera flies: ``flown`` itself, or the authors' (positions scaled
    by MOON_RADIUS_KM / AUTHORS_POSITION_DIVISOR, attitudes unchanged)."""
    if scene not in SCENES:
        raise ConfigError(f"scene={scene!r}: expected one of {SCENES}")
    if scene == "physical":
        return flown
    return scaled_trajectory(flown, MOON_RADIUS_KM / AUTHORS_POSITION_DIVISOR, "the authors' camera")


def scene_navigation_craters(flown: Trajectory, cat: Catalogue, camera, height) -> dict[str, list[int]]:
    """For each scene, the craters its navigation sequence over ``flown`` (every epoch, one pass)
    boxes under the default annotation rule: under the real Sun for "physical", with no Sun rule
    for "authors" (its light is fixed to the camera). The split forces both sets into the test
    half whichever scene a build renders, so that the two builds of one source split alike."""
    rule = AnnotateConfig()
    sun = sun_direction_body(flown.epochs) if len(flown) else np.zeros((0, 3))
    out: dict[str, list[int]] = {}
    for scene in SCENES:
        traj = scene_trajectory(flown, scene)
        seen: set[int] = set()
        for i in range(len(traj)):
            k = traj.kitti[i]
            seen |= {b.id for b in annotate_frame(cat, k[:, :3], k[:, 3], camera, height,
                                                  sun[i] if scene == "physical" else None, rule)}
        out[scene] = sorted(seen)
    return out


def scenario_craters(order: list[int], frames: list[luna1.FrameAnnotation],
                     navigation: dict[str, list[int]] | None = None) -> set[int]:
    """The craters whose landmark images the scenarios read: the test half of the split that the
    shipped models and ``trn-sim`` draw (the craters of this build's sequence and of ``navigation``,
    each scene's sequence, first; default fractions and seed)."""
    forced = {str(b.id) for f in frames for b in f.boxes}
    forced |= {str(c) for v in (navigation or {}).values() for c in v}
    split = split_ids([str(c) for c in sorted(order)], forced, TEST_FRACTION, VAL_FRACTION, SPLIT_SEED)
    return {int(c) for c in split.test}


def _record_views(man: Path, doc: dict, views: int, folder: str) -> None:
    """Check a views folder's manifest against ``doc`` (its settings) and record the larger of the
    view counts; other settings in the same folder are refused rather than mixed."""
    old = {}
    if man.is_file():
        try:
            old = json.loads(man.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            raise DataError(f"views manifest is unreadable; delete {folder}/ and build the views again", man) from None
        if {k: old.get(k) for k in doc} != json.loads(json.dumps(doc)):
            raise DataError(f"{folder}/ was rendered with other view settings; delete it to render it again", man)
    atomic_write_text(man, json.dumps({**doc, "views": max(views, int(old.get("views", 0)))}, indent=1) + "\n")


def _view_tasks(cfg: BuildConfig, out: Path, key: str, cat: Catalogue, index: dict, order: list[int]) -> list:
    """The extra-view renders still missing; records (and checks) their settings in views.json."""
    if cfg.views == 0:
        return []
    vdir = out / luna1.VIEWS_DIR
    vdir.mkdir(parents=True, exist_ok=True)
    doc = {"render_key": key, "seed": cfg.seed, "ranges": asdict(cfg.view_ranges)}
    _record_views(out / luna1.VIEWS_MANIFEST, doc, cfg.views, luna1.VIEWS_DIR)
    return [(c, k, float(cat.lat[index[c]]), float(cat.lon[index[c]]), float(cat.diameter_km[index[c]]))
            for c in sorted(order) for k in range(cfg.views) if not (vdir / f"{c}_{k}.png").is_file()]


def _frame_view_tasks(cfg: BuildConfig, out: Path, key: str, cat: Catalogue, index: dict, order: list[int],
                      frames: list[luna1.FrameAnnotation]) -> list:
    """The frame-domain views still missing, per crater of the training and validation halves;
    records (and checks) their settings in frame_views/frame_views.json."""
    if cfg.frame_views == 0:
        return []
    vdir = out / luna1.FRAME_VIEWS_DIR
    vdir.mkdir(parents=True, exist_ok=True)
    doc = {"render_key": key, "seed": cfg.seed, "ranges": cfg.frame_view_ranges.key_dict(),
           "annotate": asdict(cfg.annotate), "halves": "train+val (test half excluded)"}
    _record_views(out / luna1.FRAME_VIEWS_MANIFEST, doc, cfg.frame_views, luna1.FRAME_VIEWS_DIR)
    test = scenario_craters(order, frames, luna1.Luna1Metadata.read(out / luna1.METADATA).navigation_craters)
    tasks = []
    for c in sorted(order):
        if c in test:
            continue
        rec = vdir / f"{c}.json"
        have = 0
        if rec.is_file():
            try:
                have = len(json.loads(rec.read_text(encoding="utf-8")))
            except (OSError, json.JSONDecodeError):
                have = 0  # a damaged record: render the crater's views again
        if have < cfg.frame_views:
            tasks.append((c, float(cat.lat[index[c]]), float(cat.lon[index[c]]), float(cat.diameter_km[index[c]]),
                          have, cfg.frame_views))
    return tasks


def split_craters(build: str | Path, half: str = "validation") -> set[int]:
    """The ``half`` ("training" or "validation") of a Luna-1 build's split, as training and
    trn-sim draw it (the craters of either scene's navigation sequence forced into the test half
    first, :func:`trn.data.datasets.landmarks.forced_craters`; the default fractions and seed)."""
    root = Path(build)
    meta_path, ann_path = root / luna1.METADATA, root / luna1.ANNOTATIONS
    if not meta_path.is_file() or not ann_path.is_file():
        raise DataError("needs a finished Luna-1 build (metadata.json and annotations) to draw its split from", root)
    ids = [str(c) for c in sorted(luna1.Luna1Metadata.read(meta_path).craters)]
    split = split_ids(ids, forced_craters(root), TEST_FRACTION, VAL_FRACTION, SPLIT_SEED)
    if half not in ("training", "validation"):
        raise ConfigError(f"split half {half!r}: expected 'training' or 'validation'")
    return {int(c) for c in (split.val if half == "validation" else split.train)}


def validation_craters(build: str | Path) -> set[int]:
    """The validation half of a Luna-1 build's split (:func:`split_craters`)."""
    return split_craters(build, "validation")


def validation_segments(n: int, first_rotation_deg: float = 7.5, day_step: float = 1.7) -> tuple[tuple[float, float], ...]:
    """A plan of ``n`` segments for a validation orbit: ground tracks spread evenly in longitude
    (starting ``first_rotation_deg`` east of the source's, never on it) and each flown ``day_step``
    days after the previous one (the Sun's body-fixed longitude moves about 12.2 degrees a day),
    so the sequence sees ground and lighting the source pass does not."""
    if not 1 <= n <= 200:
        raise ConfigError(f"validation orbit segments={n}: expected 1 to 200")
    return tuple((round(first_rotation_deg + j * 360.0 / n, 6), round((j + 1) * day_step * 86400.0, 3)) for j in range(n))


def _metadata(cfg: BuildConfig, cat: Catalogue, cat_path: Path, order: list[int], traj: Trajectory,
              frame_ids: list[int], sun: np.ndarray, one_pass: int) -> luna1.Luna1Metadata:
    index = cat.index_of()
    craters = {c: {"lat": round(float(cat.lat[index[c]]), 7), "lon": round(float(cat.lon[index[c]]), 7),
                   "diameter_km": round(float(cat.diameter_km[index[c]]), 6), "catalogue": cat_path.name, "row": c}
               for c in sorted(order)}
    frames = []
    for i in frame_ids:
        pos = traj.kitti[i][:, 3]
        up = pos / np.linalg.norm(pos)
        slat, slon, _ = xyz_to_latlon(sun[i])
        frames.append({
            "frame": i, "epoch_utc": traj.epochs[i].strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "sun_dir_body": [round(float(v), 9) for v in sun[i]],
            "subsolar_lat_lon": [round(float(slat), 6), round(float(slon), 6)],
            "sun_elevation_deg": round(float(np.degrees(np.arcsin(np.clip(up @ sun[i], -1, 1)))), 4),
            "altitude_km": round(float(np.linalg.norm(pos) - MOON_RADIUS_KM), 4),
        })
    source = {"directory": Path(cfg.source).name, "catalogue": cat_path.name, "trajectory": traj.name,
              "filter": {"min_diameter_km": cfg.min_diameter_km, "max_abs_lat": cfg.max_abs_lat},
              "seed": cfg.seed, "max_dem_ppd": cfg.max_dem_ppd, "use_albedo": cfg.use_albedo}
    if cfg.scene != "physical":
        source["scene"] = cfg.scene
    if cfg.segments:
        source["segments"] = [{"rotation_deg": float(r), "epoch_offset_s": float(o), "first_frame": j * one_pass,
                               "frames": one_pass} for j, (r, o) in enumerate(cfg.segments)]
    if cfg.annotate_validation_of is not None:
        source["annotated"] = f"validation half of {Path(cfg.annotate_validation_of).name} only"
    if cfg.annotate_training_of is not None:
        source["annotated"] = f"training half of {Path(cfg.annotate_training_of).name} only"
    cam = cfg.render.camera
    return luna1.Luna1Metadata(source=source, renderer={**asdict(cfg.render), "annotate": asdict(cfg.annotate)},
                               craters=craters, frames=frames,
                               camera={"width": cam.width, "height": cam.height, "fov_deg": cam.fov_deg})


def build_synthetic_luna1(cfg: SynthConfig, out: Path, world_dir: Path | None = None, limit_frames: int | None = None,
                          limit_craters: int | None = None, workers: int = 2, render: RenderConfig | None = None,
                          annotate: AnnotateConfig | None = None, parts: str = "all", render_frames: bool = True,
                          views: int = 0, frame_views: int = 0, segments: tuple = (),
                          annotate_validation_of: Path | None = None, annotate_training_of: Path | None = None,
                          frame_view_ranges: "FrameViewRanges | None" = None, scene: str = "physical") -> BuildSummary:
    """Make (or reuse) the procedural world, then build its Luna-1 dataset with the common builder
    (``parts``, ``render_frames``, ``views``, ``frame_views``, ``segments``, ``annotate_validation_of``,
    ``annotate_training_of``, ``scene``: see :class:`BuildConfig`)."""
    out = Path(out)
    world_dir = Path(world_dir) if world_dir is not None else out / ".world"
    make_world(cfg, world_dir)
    bcfg = BuildConfig(source=world_dir, out=out, limit_frames=limit_frames, limit_craters=limit_craters,
                       workers=workers, seed=cfg.seed, render=render or RenderConfig(),
                       annotate=annotate or AnnotateConfig(), parts=parts, render_frames=render_frames, views=views,
                       frame_views=frame_views, segments=tuple(segments),
                       annotate_validation_of=annotate_validation_of, annotate_training_of=annotate_training_of,
                       frame_view_ranges=frame_view_ranges or FrameViewRanges(), scene=scene)
    return build_luna1(bcfg)
