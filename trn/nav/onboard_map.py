"""The onboard landmark map: every catalogue crater of a Luna-1 directory, its landmark render
embedded by the flight model, with its body-fixed position and diameter.

On disk a map is a directory of ``landmarks.db`` and ``map.json``, written and read by
:mod:`trn.db.map_format` (the format export packs for a board, so it lives below both). This
module builds one: rendering or predicting each crater's appearance, embedding it in resumable
chunks (inline, in processes or on Ray) and writing the map; and its compressed index.

A crater's centre lies on the surface: at the elevation model's height when the build is given
the source data (``--source``: the real GLD100 or the built-in world's elevation), otherwise on
the reference sphere (then the fix must allow a few km of height error: ``landmark_sigma_km``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trn.data.datasets.luna1 import Luna1Dataset, Luna1Metadata
from trn.data.files import atomic_write_text
from trn.db.map_format import (CRATERS_FILE, DB_FILE, INDEX_FILE, MAP_FILE, MAP_FORMAT, MAP_VERSION, OnboardMap,
                               shared_descriptors, write_map)  # (re-exported for the map's callers)
from trn.errors import DataError
from trn.geometry import MOON_RADIUS_KM, latlon_to_xyz
from trn_board.bundle import sha256_file as _sha256

CHUNK_DIR = ".chunks"  # an unfinished build's finished chunks (resumable)
log = logging.getLogger(__name__)


APPEARANCES = ("catalogue", "predicted")

# per-process render state of a predicted-appearance build (set by _init_render in each worker)
_RENDER: dict = {}


def _init_render(meta: Luna1Metadata, source: str) -> None:
    import cv2

    from trn.data.datasets.build import built_render_config, built_surface

    cv2.setNumThreads(1)
    _RENDER["cfg"], _RENDER["surface"] = built_render_config(meta), built_surface(meta, source)


def _render_predicted(task: tuple[int, float, float, float, float | None, float | None, float]
                      ) -> tuple[int, np.ndarray]:
    from trn.data.worlds.render import CraterView, crater_window_km, render_crater
    from trn.nav.appearance import rim_window_px

    cid, lat, lon, dia, az, el, margin = task
    cfg = _RENDER["cfg"]
    view = CraterView() if az is None else CraterView(light_azimuth_deg=az, light_elevation_deg=el)
    # only the rim's square (times the model's crop margin, within the render) is shaded: the pixels
    # of the whole render cut to it (render_crater's window)
    full = crater_window_km(dia, cfg)
    window = rim_window_px(cfg.crater_size, min(dia * margin, full), full)
    return cid, render_crater(_RENDER["surface"], lat, lon, dia, cfg, view, window=window)


def predicted_renders(ds: Luna1Dataset, meta: Luna1Metadata, ids: list[int], source: Path, workers: int = 2,
                      craters: dict[int, tuple[float, float, float]] | None = None, lit_by_pass: bool = True,
                      margin: float = 1.0, min_side: float = 0.0):
    """Yield (crater id, image) for every crater of ``ids``: rendered from ``source`` with the
    dataset's own renderer settings under the Sun of the planned trajectory's closest pass
    (:func:`trn.nav.appearance.pass_illumination`), cut to the rim's window (``margin`` times the
    diameter, at most the whole render: the model's crop margin; with ``min_side``, the model's
    least crop side in frame pixels, the margin a query crop of the crater gets on its closest
    pass: :func:`pass_margins`). A crater whose pass
    is in the dark (Sun below 1 degree) is never seen lit on this trajectory; it keeps its
    catalogue render, cut the same way (rendered with the build's own landmark view when the
    dataset has none, as for a union-catalogue crater). ``craters``: {id: (lat, lon, diameter)},
    by default the dataset's metadata; ``lit_by_pass=False`` renders every crater in the landmark
    view (a catalogue-appearance map of craters the dataset did not render)."""
    import multiprocessing as mp

    from trn.data.datasets.build import built_render_config
    from trn.data.worlds.render import crater_window_km
    from trn.nav.appearance import pass_illumination, rim_window

    if ds.kitti is None or len(meta.frames) != len(ds.kitti):
        raise DataError("a predicted-appearance map needs the planned trajectory: poses and metadata.json frames "
                        "(epochs, Sun directions) for every pose; rebuild the dataset with trn-data build", ds.root)
    if craters is None:
        craters = {c: (meta.craters[c]["lat"], meta.craters[c]["lon"], meta.craters[c]["diameter_km"]) for c in ids}
    lat = np.array([craters[c][0] for c in ids], np.float64)
    lon = np.array([craters[c][1] for c in ids], np.float64)
    dia = np.array([craters[c][2] for c in ids], np.float64)
    sun = np.array([f["sun_dir_body"] for f in meta.frames], np.float64)
    az, el, k = pass_illumination(lat, lon, ds.kitti[:, :, 3], sun)
    if not lit_by_pass:
        az, el = np.zeros(len(ids)), np.full(len(ids), -90.0)
    margins = pass_margins(dia, ds.kitti[k, :, 3], meta.camera, margin, min_side)
    window = built_render_config(meta)
    rendered = set(ds.crater_ids)
    lit = [(c, float(a), float(b), float(d), float(z), float(min(e, 90.0)), float(m))
           for c, a, b, d, z, e, m in zip(ids, lat, lon, dia, az, el, margins) if e >= 1.0]
    for c, a, b, d, e, m in zip(ids, lat, lon, dia, el, margins):
        if e >= 1.0:
            continue
        if c in rendered:
            full = crater_window_km(float(d), window)
            yield c, rim_window(ds.load_crater(c), min(float(d) * float(m), full), full)
        else:
            lit.append((c, float(a), float(b), float(d), None, None, float(m)))
    if workers <= 1:
        _init_render(meta, str(source))
        yield from map(_render_predicted, lit)
        return
    with mp.get_context("spawn").Pool(workers, initializer=_init_render, initargs=(meta, str(source))) as pool:
        yield from pool.imap(_render_predicted, lit, chunksize=8)


CATALOGUES = ("dataset", "union")


def pass_margins(diameter_km: np.ndarray, positions_km: np.ndarray, camera: dict | None, margin: float,
                 min_side: float) -> np.ndarray:
    """The crop margin of each crater's predicted view: ``margin``, or with ``min_side`` the margin
    a query crop of the crater gets (:func:`trn.data.views.crops.crop_side_margin`) where the
    trajectory passes it (``positions_km`` [N, 3], the closest pose's position for each crater):
    its diameter in frame pixels at that altitude, the nadir's ground width of a pixel being
    altitude x 2 tan(fov / 2) / width (``camera``: the dataset's, fov_deg and width)."""
    from trn.data.views.crops import crop_side_margin

    dia = np.asarray(diameter_km, np.float64)
    if not min_side:
        return np.full(len(dia), float(margin))
    if not camera or not {"fov_deg", "width"} <= set(camera):
        raise DataError("a least crop side needs the dataset's camera (fov_deg, width) in metadata.json")
    altitude = np.linalg.norm(np.asarray(positions_km, np.float64).reshape(-1, 3), axis=1) - MOON_RADIUS_KM
    km_per_px = np.maximum(altitude, 1e-3) * 2.0 * math.tan(math.radians(float(camera["fov_deg"])) / 2.0) \
        / float(camera["width"])
    return np.array([crop_side_margin(d / s, margin, min_side) for d, s in zip(dia, km_per_px)])


def near_track(lat: np.ndarray, lon: np.ndarray, positions_km: np.ndarray, km: float, chunk: int = 2048) -> np.ndarray:
    """bool [N]: the crater lies within ``km`` (surface arc) of some nadir point of the trajectory."""
    nadir = np.asarray(positions_km, np.float64)
    nadir = nadir / np.linalg.norm(nadir, axis=1, keepdims=True)
    c = latlon_to_xyz(np.asarray(lat, np.float64), np.asarray(lon, np.float64), 1.0).reshape(-1, 3)
    cos_min = np.cos(km / MOON_RADIUS_KM)
    out = np.zeros(len(c), bool)
    for i in range(0, len(c), chunk):
        out[i:i + chunk] = (c[i:i + chunk] @ nadir.T >= cos_min).any(axis=1)
    return out


def build_map(ds: Luna1Dataset, emb, out: str | Path, source: str | Path | None = None, batch: int = 256,
              appearance: str = "catalogue", workers: int = 2, catalogue: str = "dataset",
              near_track_km: float | None = None, chunk: int = 4096, executor: str = "inline",
              model_spec: str | None = None, ray_address: str | None = None, backend: str = "torch") -> OnboardMap:
    """Embed every crater of ``ds`` with ``emb`` and write the map to ``out``. ``appearance``:
    "catalogue" embeds the dataset's landmark renders as they are; "predicted" renders each
    crater from ``source`` under the illumination of the planned pass and cuts it to the rim
    (:func:`predicted_renders`). ``catalogue``: "dataset", the craters the dataset rendered;
    "union", every crater of ``source``'s union catalogue (Head et al. >= 20 km and Povilaitis et
    al. 5-20 km within 60 degrees, or a built-in world's analogue), each rendered from ``source``
    (in the landmark view for the catalogue appearance); or the path of a catalogue CSV (ids: its
    row numbers), rendered the same way. ``near_track_km``: only the craters within
    that distance of the planned trajectory's ground track (the ground the mission flies over).
    The work goes in chunks of ``chunk`` craters kept in ``out/.chunks`` as they finish: an
    interrupted build, run again with the same inputs, does only the unfinished chunks
    (:func:`_chunked_embeddings`). ``executor``: "inline" renders (``workers`` processes) and
    embeds with ``emb`` in this process; "processes" (``workers`` local processes) and "ray" (Ray
    tasks on the cluster at ``ray_address``, or "local" for one started on this machine) run each
    chunk as one task (:func:`chunk_task`) that renders and embeds with the model ``model_spec``
    on one thread, so both give the same bytes; ``emb`` must be that model run by ``backend``
    (:data:`trn.sim.embedders.BACKENDS`: "tflite" is the int8 export a board runs; its output on a
    fixed image is checked in every task)."""
    from trn.data.views.crops import preprocess

    if appearance not in APPEARANCES:
        raise DataError(f"map appearance {appearance!r}: expected one of {APPEARANCES}")
    from_file = catalogue not in CATALOGUES
    if from_file and not (catalogue.endswith(".csv") and Path(catalogue).is_file()):
        raise DataError(f"map catalogue {catalogue!r}: expected one of {CATALOGUES} or a catalogue CSV file "
                        "(e.g. trn-data dense-catalogue's)")
    if (appearance == "predicted" or catalogue != "dataset") and source is None:
        raise DataError("a predicted-appearance or union-catalogue map renders the craters: pass the terrain source "
                        "(--source / --map-source, e.g. ../shared/data/moon, or the built-in world's directory)")
    if executor not in EXECUTORS:
        raise DataError(f"map build executor {executor!r}: expected one of {EXECUTORS}")
    if executor != "inline" and not model_spec:
        raise DataError(f"the {executor} executor rebuilds the model in each task: give its model_spec (--model)")
    out = Path(out)
    meta_path = ds.root / "metadata.json"
    if not meta_path.is_file():
        raise DataError("a map needs metadata.json (crater latitude, longitude, diameter); rebuild the dataset "
                        "with trn-data build", ds.root)
    meta = Luna1Metadata.read(meta_path)
    craters = None
    if catalogue != "dataset":
        from trn.data.catalogues.catalogue import UnionRule, read_catalogue
        from trn.data.datasets.detection import source_union_catalogue

        cat = read_catalogue(catalogue) if from_file else source_union_catalogue(source, UnionRule())
        craters = {int(c): (float(a), float(b), float(d)) for c, a, b, d in zip(cat.ids, cat.lat, cat.lon,
                                                                                 cat.diameter_km)}
        ids = list(craters)
    else:
        ids = [c for c in ds.crater_ids if c in meta.craters]
    if near_track_km is not None:
        if ds.kitti is None:
            raise DataError("--near-track needs the planned trajectory (poses)", ds.root)
        ll = np.array([craters[c][:2] if craters else (meta.craters[c]["lat"], meta.craters[c]["lon"]) for c in ids],
                      np.float64).reshape(-1, 2)
        ids = [c for c, k in zip(ids, near_track(ll[:, 0], ll[:, 1], ds.kitti[:, :, 3], near_track_km)) if k]
    if not ids:
        raise DataError("no crater to map (none of crater_images/ in metadata.json, or none near the track)", ds.root)
    job = ChunkJob(str(ds.root), None if source is None else str(source), appearance, catalogue, batch,
                   model_spec or "", _probe(emb, threads=1 if executor != "inline" else None), backend,
                   float(getattr(emb, "crop_margin", 1.0)), float(getattr(emb, "crop_min_px", 0.0)))

    def sub(cids: list[int]) -> dict | None:
        return None if craters is None else {c: craters[c] for c in cids}

    if executor == "inline":
        def run(chunks):
            for k, cids in chunks:
                yield k, _embed_chunk(emb, list(job.images(ds, meta, cids, sub(cids), workers)), batch, preprocess)
    else:
        def run(chunks):
            yield from _run_tasks(executor, chunks, job, sub, workers, ray_address)
    plan = {"model": emb.name, "model_probe": job.probe, "dataset": str(ds.root), "source": str(source),
            "appearance": appearance, "catalogue": catalogue, "near_track_km": near_track_km, "batch": batch,
            "one_thread_tasks": executor != "inline"}
    order, vectors = _chunked_embeddings(out / CHUNK_DIR, plan, ids, chunk, run)
    ids = order
    if craters is None:
        craters = {c: (meta.craters[c]["lat"], meta.craters[c]["lon"], meta.craters[c]["diameter_km"]) for c in ids}
    lat = np.array([craters[c][0] for c in ids], np.float64)
    lon = np.array([craters[c][1] for c in ids], np.float64)
    diam = np.array([craters[c][2] for c in ids], np.float64)
    if source is not None:
        from trn.data.worlds.terrain import load_elevation

        radius = MOON_RADIUS_KM + load_elevation(Path(source)).height(lat, lon)
        surface = f"elevation of {source}"
    else:
        radius = np.full(len(ids), MOON_RADIUS_KM)
        surface = f"reference sphere of {MOON_RADIUS_KM} km"
    write_map(out, ids, vectors, np.stack([lat, lon, radius, diam], axis=1),
              {"model": emb.name, "input_size": emb.input_size, "embedding_dim": emb.dim, "dataset": str(ds.root),
               "surface": surface, "appearance": appearance, "catalogue": catalogue, "near_track_km": near_track_km})
    progress = out / CHUNK_DIR / "progress.jsonl"
    if progress.is_file():  # the chunks' finishing times, for the build's throughput
        shutil.copyfile(progress, out / "build_progress.jsonl")
    shutil.rmtree(out / CHUNK_DIR, ignore_errors=True)  # the map is complete: its work is no longer needed
    return OnboardMap.load(out)


def _probe(emb, threads: int | None = None) -> str:
    """sha256 of the embedding of a fixed ramp image (with ``threads`` torch threads, if given): a
    partial build is resumed, and a task's model accepted, only when it computes the same numbers."""
    import torch

    s = emb.input_size
    ramp = np.add.outer(np.arange(s), np.arange(s)).astype(np.float32) / (2.0 * s)
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return hashlib.sha256(np.ascontiguousarray(emb(ramp[None]).global_, np.float32).tobytes()).hexdigest()
    finally:
        torch.set_num_threads(before)


EXECUTORS = ("inline", "processes", "ray")


@dataclass(frozen=True)
class ChunkJob:
    """What a chunk task needs besides its craters (picklable, for processes and Ray workers)."""

    dataset: str
    source: str | None
    appearance: str
    catalogue: str
    batch: int
    model: str
    probe: str
    backend: str = "torch"  # how the task runs ``model`` (trn.sim.embedders.BACKENDS)
    margin: float = 1.0  # the model's crop margin: predicted renders are cut to the rim times this
    min_side: float = 0.0  # the model's least crop side in frame pixels (pass_margins)

    def images(self, ds: Luna1Dataset, meta: Luna1Metadata, cids: list[int], craters: dict | None, workers: int):
        """(id, image) of the craters ``cids`` (:func:`build_map`)."""
        if self.appearance == "predicted" or self.catalogue != "dataset":
            return predicted_renders(ds, meta, cids, Path(self.source), workers, craters,
                                     lit_by_pass=self.appearance == "predicted", margin=self.margin,
                                     min_side=self.min_side)
        return ((c, ds.load_crater(c)) for c in cids)


_TASK: dict = {}  # per worker process: the dataset, metadata and embedder of the last job


def chunk_task(job: ChunkJob, cids: list[int], craters: dict | None) -> tuple[list[int], np.ndarray]:
    """One chunk of a map build in a worker (a local process or a Ray task): render the craters in
    this process and embed them with ``job.model`` run by ``job.backend`` on one thread. Refuses a
    model whose output on the fixed image differs from the driver's."""
    import torch

    from trn.data.datasets.luna1 import read_luna1
    from trn.data.views.crops import preprocess
    from trn.sim.embedders import make_embedder

    torch.set_num_threads(1)
    key = (job.dataset, job.model, job.backend)
    if _TASK.get("key") != key:
        ds = read_luna1(job.dataset)
        _TASK.update(key=key, ds=ds, meta=Luna1Metadata.read(ds.root / "metadata.json"),
                     emb=make_embedder(job.model, None, 1, job.backend))
        if _probe(_TASK["emb"]) != job.probe:
            _TASK.clear()
            raise DataError(f"model {job.model!r} computes other numbers in this worker than in the driver (another "
                            "file or library version); install the same model and versions on every worker")
    ds, meta, emb = _TASK["ds"], _TASK["meta"], _TASK["emb"]
    return _embed_chunk(emb, list(job.images(ds, meta, cids, craters, 1)), job.batch, preprocess)


def _run_tasks(executor: str, chunks, job: ChunkJob, sub, workers: int, ray_address: str | None):
    """Yield (chunk index, (ids, vectors)) as the tasks finish, on ``workers`` local processes or
    on a Ray cluster (a worker that dies has its task retried by Ray)."""
    chunks = list(chunks)
    if not chunks:
        return
    if executor == "processes":
        yield from _process_tasks(chunks, job, sub, workers)
        return
    try:
        import ray
    except ImportError:
        raise DataError("the ray executor needs Ray: pip install -e '.[ray]'") from None
    started = not ray.is_initialized()
    if started:
        if ray_address in (None, "local"):  # a new cluster of this machine, never one found running
            ray.init(address="local", num_cpus=max(1, workers), include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=ray_address, log_to_driver=False)
    try:
        task = ray.remote(max_retries=3)(chunk_task)
        pending = {task.remote(job, cids, sub(cids)): k for k, cids in chunks}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            yield pending.pop(done[0]), ray.get(done[0])
    finally:
        if started:
            ray.shutdown()


POOL_RESTARTS = 3  # a local process pool whose worker died is started again this often (as Ray retries a task)


def _process_tasks(chunks: list, job: ChunkJob, sub, workers: int):
    """The chunks as tasks of ``workers`` spawned local processes, yielded as they finish. A
    worker that dies (killed, out of memory) breaks the pool: the unfinished chunks go to a new
    pool, up to :data:`POOL_RESTARTS` times; the finished ones are already kept."""
    import concurrent.futures as cf
    import multiprocessing as mp
    from concurrent.futures.process import BrokenProcessPool

    todo = dict(chunks)
    for attempt in range(POOL_RESTARTS + 1):
        try:
            with cf.ProcessPoolExecutor(max(1, workers), mp_context=mp.get_context("spawn")) as pool:
                futures = {pool.submit(chunk_task, job, cids, sub(cids)): k for k, cids in todo.items()}
                for f in cf.as_completed(futures):
                    k = futures[f]
                    result = f.result()
                    del todo[k]
                    yield k, result
            return
        except BrokenProcessPool:
            if attempt == POOL_RESTARTS:
                raise DataError(f"map build: a worker process died {POOL_RESTARTS + 1} times (killed, or out of "
                                f"memory); {len(todo)} chunks unfinished, the finished ones are kept: run the same "
                                "command again to finish the map") from None
            log.warning("map build: a worker process died; %d unfinished chunks go to a new pool (restart %d of %d)",
                        len(todo), attempt + 1, POOL_RESTARTS)


def _embed_chunk(emb, items: list[tuple[int, np.ndarray]], batch: int, preprocess) -> tuple[list[int], np.ndarray]:
    """One chunk's crater ids and embeddings [n, dim] float32, ``batch`` images at a time."""
    ids, parts = [], []
    for i in range(0, len(items), batch):
        part = items[i:i + batch]
        x = np.stack([preprocess(img, emb.input_size) for _, img in part]).astype(np.float32)
        parts.append(np.asarray(emb(x).global_, np.float32))
        ids.extend(c for c, _ in part)
    return ids, np.concatenate(parts) if parts else np.zeros((0, emb.dim), np.float32)


def _chunk_path(work: Path, k: int) -> Path:
    return work / f"chunk-{k:05d}.npz"


def chunk_craters(out: str | Path) -> int:
    """Craters in the finished chunks an interrupted map build left in the map directory ``out``
    (0 for a new build): work a resumed build does not do again."""
    n = 0
    for path in sorted((Path(out) / CHUNK_DIR).glob("chunk-*.npz")):  # as _chunk_path names them
        try:
            with np.load(path) as z:
                n += len(z["ids"])
        except (OSError, ValueError, KeyError):
            pass  # an unreadable chunk is the build's to report (it names the file and the fix)
    return n


def _chunked_embeddings(work: Path, plan: dict, ids: list[int], chunk: int, run) -> tuple[list[int], np.ndarray]:
    """Every crater's embedding, in chunks of ``chunk`` craters that are kept in ``work`` as they
    finish (``chunk-NNNNN.npz``, written atomically) beside ``plan.json`` (the inputs): a build
    that is stopped loses only its unfinished chunks, and the next build with the same inputs
    reuses the finished ones. ``run(chunks)``, given (index, crater ids) of the unfinished chunks,
    yields (index, (ids, vectors)) in any order. Returns the ids in chunk order and their vectors
    [n, dim]."""
    if chunk < 1:
        raise DataError(f"map chunk size {chunk}: expected at least 1 crater")
    chunks = [ids[i:i + chunk] for i in range(0, len(ids), chunk)]
    plan = dict(plan, chunk=chunk, craters=len(ids),
                ids_sha256=hashlib.sha256(np.asarray(ids, np.int64).tobytes()).hexdigest())
    plan_path = work / "plan.json"
    if plan_path.is_file():
        try:
            held = json.loads(plan_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            held = None
        if held != json.loads(json.dumps(plan)):
            raise DataError("holds an unfinished map build of other inputs (model, craters, appearance, chunk "
                            "size); build into another --out, or delete this directory to start again", work)
        done = sum(_chunk_path(work, k).is_file() for k in range(len(chunks)))
        log.info("map build: resuming, %d of %d chunks already done in %s", done, len(chunks), work)
    else:
        work.mkdir(parents=True, exist_ok=True)
        atomic_write_text(plan_path, json.dumps(plan, indent=1) + "\n")
    path_of = lambda k: _chunk_path(work, k)  # noqa: E731
    for k, (got_ids, got) in run([(k, cids) for k, cids in enumerate(chunks) if not path_of(k).is_file()]):
        if sorted(got_ids) != sorted(chunks[k]):
            raise DataError(f"map chunk {k}: embedded {len(got_ids)} craters for {len(chunks[k])} asked", work)
        tmp = path_of(k).with_name(f".chunk-{k:05d}.tmp.npz")
        np.savez(tmp, ids=np.asarray(got_ids, np.int64), vectors=np.asarray(got, np.float32))
        tmp.replace(path_of(k))
        with open(work / "progress.jsonl", "a", encoding="utf-8") as f:  # throughput across interrupted runs
            f.write(json.dumps({"chunk": k, "craters": len(chunks[k]), "unix_s": round(time.time(), 3)}) + "\n")
        log.info("map build: chunk %d of %d done (%d craters)", k + 1, len(chunks), len(chunks[k]))
    order: list[int] = []
    vectors: list[np.ndarray] = []
    for k, cids in enumerate(chunks):
        path = path_of(k)
        try:
            with np.load(path) as z:
                got_ids, got = [int(c) for c in z["ids"]], np.asarray(z["vectors"], np.float32)
        except (OSError, ValueError, KeyError) as e:
            raise DataError(f"map chunk {k} cannot be read ({e}); delete it and build again to redo it", path) from None
        if sorted(got_ids) != sorted(cids) or got.shape != (len(cids), got.shape[1]):
            raise DataError(f"map chunk {k} holds other craters than the plan; delete it and build again", path)
        order.extend(got_ids)
        vectors.append(got)
    return order, np.concatenate(vectors) if vectors else np.zeros((0, 1), np.float32)


def write_map_index(path: str | Path, name: str, visit: int, seed: int = 0) -> dict:
    """Build the compressed index ``name`` (:data:`trn.nav.map_index.SPECS`) over a finished map's
    descriptors, searching ``visit`` lists (or graph entries) per query, and write it with the
    crater metadata a board needs beside the map (both atomically, then ``map.json``'s ``index``
    entry). Returns that entry."""
    import faiss

    from trn.nav.map_index import build_index, factory_string

    path = Path(path)
    omap = OnboardMap.load(path, index=False)
    t0 = time.perf_counter()
    index = build_index(omap.db.embeddings, name, seed=seed)
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.make_direct_map()  # the windowed search decodes given craters
    build_s = time.perf_counter() - t0
    tmp = path / f".{INDEX_FILE}.tmp"
    faiss.write_index(index, str(tmp))
    tmp.replace(path / INDEX_FILE)
    meta = np.stack([omap.lat, omap.lon, omap.radius_km, omap.diameter_km], axis=1).astype(np.float32)
    tmp = path / f".{CRATERS_FILE}.tmp.npz"
    ids = np.asarray(omap.ids, np.int64)
    small = len(ids) == 0 or (ids.min() >= -2 ** 31 and ids.max() < 2 ** 31)
    np.savez(tmp, ids=ids.astype(np.int32 if small else np.int64), craters=meta)  # 20 bytes a crater, ids permitting
    tmp.replace(path / CRATERS_FILE)
    entry = {"name": name, "factory": factory_string(name, len(omap.ids)), "visit": int(visit), "seed": seed,
             "file": INDEX_FILE, "sha256": _sha256(path / INDEX_FILE), "bytes": (path / INDEX_FILE).stat().st_size,
             "craters_file": CRATERS_FILE, "craters_sha256": _sha256(path / CRATERS_FILE),
             "craters_bytes": (path / CRATERS_FILE).stat().st_size, "craters": len(omap.ids),
             "build_s": round(build_s, 2)}
    doc = json.loads((path / MAP_FILE).read_text(encoding="utf-8"))
    doc["index"] = entry
    atomic_write_text(path / MAP_FILE, json.dumps(doc) + "\n")
    OnboardMap.load(path)  # the written map loads, index and metadata agreeing
    return entry


def catalogue_crater_map(source: str | Path):
    """The lost-in-space map of ``source``'s union catalogue (Head et al. >= 20 km and Povilaitis
    et al. 5-20 km within 60 degrees, or a built-in world's analogue): every crater's id, its centre
    on the elevation model (km, body frame) and its diameter, with a spatial index
    (:class:`trn.nav.lost.CraterMap`). Geometry only: no render, no descriptor."""
    from trn.data.catalogues.catalogue import UnionRule
    from trn.data.datasets.detection import source_union_catalogue
    from trn.data.worlds.terrain import load_elevation
    from trn.nav.lost import CraterMap

    cat = source_union_catalogue(source, UnionRule())
    radius = MOON_RADIUS_KM + load_elevation(Path(source)).height(cat.lat, cat.lon)
    return CraterMap(np.asarray(cat.ids, np.int64), latlon_to_xyz(cat.lat, cat.lon, radius).reshape(-1, 3),
                     cat.diameter_km)


def descriptor_crater_map(omap: OnboardMap):
    """The lost-in-space map of an onboard descriptor map's craters, in the order of ``omap.ids``."""
    from trn.nav.lost import CraterMap

    return CraterMap(np.asarray(omap.ids, np.int64), omap.positions(list(omap.ids)), omap.diameter_km)

