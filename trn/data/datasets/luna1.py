"""The Luna-1 on-disk format, read, written and checked.

Layout (the authors' dataset; every path relative to the dataset root)::

    crater_images/<id>.png                         one landmark render per catalogue crater
    lro_navigation/nav_images/<n>.png              navigation frames, 10 s apart
    lro_navigation/annotations.txt                 <img_path> id,l,r,t,b id,l,r,t,b ...
    lro_navigation/poses/LROCWAC_22Sep06_000000_6H_10S_poses.csv        x,y,z,q0,q1,q2,q3
    lro_navigation/poses/kitti_LROCWAC_22Sep06_000000_6H_10S_poses.txt  12 numbers: [R | t]
    metadata.json                                  ours, optional (see :class:`Luna1Metadata`)

Box values are pixels: left, right, top, bottom; a frame's number is its image file's stem.
Poses: position in km (MOON_PA) and the SPICE quaternion (scalar first) of camera -> body.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from trn.data.files import atomic_write_text, png_structure, read_bytes, read_gray, read_image, unreadable
from trn.data.worlds.trajectory import read_poses_csv, read_poses_kitti
from trn.errors import DataError

CRATER_DIR = "crater_images"
VIEWS_DIR = "crater_views"  # ours, optional: extra renders <id>_<k>.png of each crater (training only)
VIEWS_MANIFEST = f"{VIEWS_DIR}/views.json"
FRAME_VIEWS_DIR = "frame_views"  # ours, optional: frame-domain views <id>_<k>.png + <id>.json records (training only)
FRAME_VIEWS_MANIFEST = f"{FRAME_VIEWS_DIR}/frame_views.json"
NAV_DIR = "lro_navigation"
NAV_IMAGES = f"{NAV_DIR}/nav_images"
ANNOTATIONS = f"{NAV_DIR}/annotations.txt"
POSES_CSV = f"{NAV_DIR}/poses/LROCWAC_22Sep06_000000_6H_10S_poses.csv"
POSES_KITTI = f"{NAV_DIR}/poses/kitti_LROCWAC_22Sep06_000000_6H_10S_poses.txt"
METADATA = "metadata.json"
BUILD_MANIFEST = ".trn-build.json"  # ours: written by trn-data build (settings, whether complete, which parts)
METADATA_FORMAT = "trn-luna1-metadata"
METADATA_VERSION = 1


@dataclass(frozen=True)
class Box:
    """A crater box in a navigation frame: catalogue id and pixel bounds (x = column, y = row)."""

    id: int
    l: int
    r: int
    t: int
    b: int

    def to_token(self) -> str:
        return f"{self.id},{self.l},{self.r},{self.t},{self.b}"

    @property
    def center(self) -> tuple[float, float]:
        return 0.5 * (self.l + self.r), 0.5 * (self.t + self.b)


@dataclass(frozen=True)
class FrameAnnotation:
    """One line of annotations.txt: the frame number, the image path as written, its boxes."""

    frame: int
    image: str
    boxes: tuple[Box, ...]

    def to_line(self) -> str:
        return " ".join([self.image] + [b.to_token() for b in self.boxes])


def _frame_number(token: str, path: Path, line: int) -> int:
    stem = Path(token).stem
    if not stem.isdigit():
        raise DataError(f"image path {token!r} does not end in <frame number>.png", path, line)
    return int(stem)


def parse_box(token: str, path: Path | str = "<annotations>", line: int | None = None) -> Box:
    """Parse ``id,l,r,t,b``; integers, or reals with an integral value."""
    parts = token.split(",")
    if len(parts) != 5:
        raise DataError(f"box {token!r} has {len(parts)} fields; expected id,l,r,t,b", path, line)
    vals = []
    for name, p in zip(("id", "l", "r", "t", "b"), parts):
        try:
            v = float(p)
        except ValueError:
            raise DataError(f"box {token!r}: {name}={p!r} is not a number", path, line) from None
        if not math.isfinite(v):
            raise DataError(f"box {token!r}: {name} is not finite", path, line)
        vals.append(int(round(v)))
    box = Box(*vals)
    if box.id < 0:
        raise DataError(f"box {token!r}: crater id must be >= 0", path, line)
    # a box of zero width or height holds no pixel: no crop can be cut from it
    if box.l >= box.r or box.t >= box.b:
        raise DataError(f"box {token!r}: needs l < r and t < b (width {box.r - box.l}, height {box.b - box.t} "
                        "px: a box of zero or negative size holds no pixel)", path, line)
    return box


def _parse_annotations(data: bytes, path: Path) -> tuple[list[FrameAnnotation], list[DataError]]:
    """Every line of an annotations file: the frames that parse (a line's good boxes kept) and one
    error per problem, in line order. The one parser of the format: :func:`read_annotations`
    raises the first error, :func:`scan_luna1` lists them all."""
    frames: list[FrameAnnotation] = []
    errors: list[DataError] = []
    seen: dict[int, int] = {}
    for i, raw_bytes in enumerate(data.splitlines(), start=1):
        try:
            raw = raw_bytes.decode("utf-8")
        except UnicodeDecodeError as exc:
            errors.append(DataError(f"line is not UTF-8 text (byte {exc.start}); annotations.txt must be UTF-8",
                                    path, i))
            continue
        tokens = raw.split()
        if not tokens:
            continue
        try:
            frame = _frame_number(tokens[0], path, i)
        except DataError as e:
            errors.append(e)
            continue
        if frame in seen:
            errors.append(DataError(f"frame {frame} is annotated twice (first on line {seen[frame]})", path, i))
        else:
            seen[frame] = i
        boxes = []
        for t in tokens[1:]:
            try:
                boxes.append(parse_box(t, path, i))
            except DataError as e:
                errors.append(e)
        frames.append(FrameAnnotation(frame, tokens[0], tuple(boxes)))
    return frames, errors


def read_annotations(path: str | Path) -> list[FrameAnnotation]:
    """Parse annotations.txt; raises :class:`DataError` naming the file and line of the first problem."""
    path = Path(path)
    frames, errors = _parse_annotations(read_bytes(path, "annotations file"), path)
    if errors:
        raise errors[0]
    return frames


def image_token_problem(image: str) -> str | None:
    """Why ``image`` cannot be the first token of an annotations.txt line (a line is the image
    path and boxes separated by spaces, one frame a line), or None."""
    if not image or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in image):
        return (f"image path {image!r} holds a space, a line break or a control character, which an annotations.txt "
                "line cannot carry (its fields are separated by spaces); rename the image")
    return None


def write_annotations(path: str | Path, frames: Iterable[FrameAnnotation]) -> None:
    frames = list(frames)
    for f in frames:
        problem = image_token_problem(f.image)
        if problem:  # refused before anything is written: one name would inject a line
            raise DataError(problem, Path(path))
    atomic_write_text(Path(path), "".join(f.to_line() + "\n" for f in frames))


@dataclass
class Luna1Metadata:
    """Our optional ``metadata.json``.

    source: free-form description of the inputs (directories, catalogue, trajectory, world seed).
    renderer: the :class:`trn.data.worlds.render.RenderConfig` used, as a dict.
    craters: id -> {lat, lon (deg east), diameter_km, catalogue, row}.
    frames: per frame {frame, epoch_utc, sun_dir_body [3], sun_elevation_deg (at the sub-camera
        point), altitude_km}.
    camera: {width, height, fov_deg}.
    navigation_craters: scene name -> the craters that scene's navigation sequence boxes over the
        source's trajectory (the default annotation rule, every frame), whichever scene this build
        renders; the split forces all of them into the test half, so that every build of one
        source splits alike (:func:`trn.data.datasets.landmarks.forced_craters`). Empty in builds
        made before it existed.
    """

    source: dict = field(default_factory=dict)
    renderer: dict = field(default_factory=dict)
    craters: dict[int, dict] = field(default_factory=dict)
    frames: list[dict] = field(default_factory=list)
    camera: dict = field(default_factory=dict)
    navigation_craters: dict[str, list[int]] = field(default_factory=dict)

    def to_json(self) -> str:
        doc = {
            "format": METADATA_FORMAT, "version": METADATA_VERSION, "source": self.source,
            "renderer": self.renderer, "camera": self.camera,
            "craters": {str(k): v for k, v in sorted(self.craters.items())}, "frames": self.frames,
        }
        if self.navigation_craters:  # only then, so that every earlier build's file stays what it was
            doc["navigation_craters"] = {k: sorted(int(c) for c in v) for k, v in sorted(self.navigation_craters.items())}
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"

    @classmethod
    def read(cls, path: str | Path) -> "Luna1Metadata":
        path = Path(path)
        data = read_bytes(path, "metadata")
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DataError(f"metadata is not readable JSON ({exc}); delete it or rebuild the dataset", path) from None
        except RecursionError:  # Python's json reads nesting by recursion
            raise DataError("metadata is nested too deep to read as JSON (it is a few levels deep); delete it or "
                            "rebuild the dataset", path) from None
        if not isinstance(doc, dict) or doc.get("format") != METADATA_FORMAT:
            raise DataError(f"metadata format is {doc.get('format') if isinstance(doc, dict) else None!r}; "
                            f"expected {METADATA_FORMAT!r}", path)
        if doc.get("version") != METADATA_VERSION:
            raise DataError(f"metadata version {doc.get('version')} is not supported (this trn reads {METADATA_VERSION})", path)
        try:
            craters = {int(k): dict(v) for k, v in doc.get("craters", {}).items()}
        except (TypeError, ValueError):
            raise DataError("metadata 'craters' must map integer ids to objects", path) from None
        nav = doc.get("navigation_craters", {})
        if not isinstance(nav, dict) or not all(
                isinstance(v, list) and all(type(c) is int for c in v) for v in nav.values()):
            raise DataError("metadata 'navigation_craters' must map scene names to lists of integer crater ids; "
                            "rebuild the dataset's metadata (run its trn-data build command again)", path)
        return cls(source=doc.get("source", {}), renderer=doc.get("renderer", {}), craters=craters,
                   frames=list(doc.get("frames", [])), camera=doc.get("camera", {}),
                   navigation_craters={str(k): list(v) for k, v in nav.items()})


@dataclass
class Luna1Dataset:
    """A Luna-1-format directory, read. Images are loaded on demand.

    crater_ids: sorted ids that have an image in crater_images/.
    frames: annotations in file order (empty if the dataset has no navigation part).
    poses: float64 [N, 7] or None; kitti: float64 [N, 3, 4] or None.
    metadata: our metadata.json when present.
    """

    root: Path
    crater_ids: list[int]
    frames: list[FrameAnnotation]
    poses: np.ndarray | None
    kitti: np.ndarray | None
    metadata: Luna1Metadata | None

    def crater_path(self, crater_id: int) -> Path:
        return self.root / CRATER_DIR / f"{crater_id}.png"

    def frame_path(self, frame: int) -> Path:
        return self.root / NAV_IMAGES / f"{frame}.png"

    def load_crater(self, crater_id: int) -> np.ndarray:
        return read_gray(self.crater_path(crater_id))

    def load_frame(self, frame: int) -> np.ndarray:
        return read_gray(self.frame_path(frame))

    def navigation_crater_ids(self) -> set[int]:
        return {b.id for f in self.frames for b in f.boxes}


def _crater_ids(root: Path) -> list[int]:
    cdir = root / CRATER_DIR
    if not cdir.is_dir():
        return []
    return sorted(int(p.stem) for p in cdir.glob("*.png") if p.stem.isdigit())


def read_luna1(root: str | Path) -> Luna1Dataset:
    """Read a Luna-1-format directory (the authors' or one we built).

    Needs crater_images/ or lro_navigation/; the pose files and metadata.json are optional. Pose
    files, when present, must have one row per annotated frame number.
    """
    root = Path(root)
    if not root.is_dir():
        raise DataError("dataset directory does not exist; pass --data DIR of a Luna-1-format dataset", root)
    has_craters = (root / CRATER_DIR).is_dir()
    has_nav = (root / NAV_DIR).is_dir()
    if not has_craters and not has_nav:
        raise DataError(f"not a Luna-1 dataset: neither {CRATER_DIR}/ nor {NAV_DIR}/ found", root)
    frames = read_annotations(root / ANNOTATIONS) if has_nav else []
    poses = read_poses_csv(root / POSES_CSV) if (root / POSES_CSV).is_file() else None
    kitti = read_poses_kitti(root / POSES_KITTI) if (root / POSES_KITTI).is_file() else None
    for arr, rel in ((poses, POSES_CSV), (kitti, POSES_KITTI)):
        if arr is not None and frames and max(f.frame for f in frames) >= len(arr):
            raise DataError(f"has {len(arr)} poses but annotations.txt goes up to frame {max(f.frame for f in frames)}",
                            root / rel)
    meta = Luna1Metadata.read(root / METADATA) if (root / METADATA).is_file() else None
    return Luna1Dataset(root, _crater_ids(root), frames, poses, kitti, meta)


@dataclass(frozen=True)
class Problem:
    """One finding of :func:`check_luna1`: file (relative to the root), line (1-based or None), text."""

    file: str
    line: int | None
    message: str
    blocks_scenarios: bool = True  # False for what only some uses need (optional pose files)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}" if self.line else f"{self.file}: {self.message}"


def _probe_image(path: Path, decode: bool) -> tuple[tuple[int, int] | None, str | None]:
    """((height, width) or None, problem or None) of an image file: decoded in full, or its PNG
    structure and checksums verified (:func:`png_structure`)."""
    try:
        if decode:
            return read_image(path, cv2.IMREAD_UNCHANGED).shape[:2], None
        size, problem = png_structure(read_bytes(path, "image"))
    except DataError as e:
        return None, e.message
    return size, None if problem is None else f"image {problem}; replace or re-render it"


PARTIAL_NOTE = "not rendered by this partial build (--parts scenarios); `trn-data build` without --parts renders it"


def partial_build(root: Path) -> bool:
    """Whether ``root`` is a finished build of the scenarios' parts only (``--parts scenarios``,
    as ``trn-sim`` builds its built-in world): its manifest says so, and it left the frames
    without boxes (and training's landmark images) unrendered on purpose."""
    try:
        doc = json.loads((Path(root) / BUILD_MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("complete") is False and doc.get("parts") == "scenarios"


@dataclass(frozen=True)
class Luna1Scan:
    """What :func:`scan_luna1` read: the dataset as far as it could be read (``None`` when the
    root is not a directory), every problem found, and ``not_rendered``: the frames a partial
    build (:func:`partial_build`) left out on purpose, which are not problems."""

    dataset: Luna1Dataset | None
    problems: list[Problem]
    not_rendered: list[str] = field(default_factory=list)

    @property
    def blocking(self) -> list[Problem]:
        """The problems that make the dataset unusable for the scenarios (``trn-sim``)."""
        return [p for p in self.problems if p.blocks_scenarios]


def scan_luna1(root: str | Path, decode_images: bool = True) -> Luna1Scan:
    """Read and validate a Luna-1 directory in one pass: the single validation of the format.
    ``trn-data check`` prints its problems; :func:`read_luna1_checked` (the loader ``trn-sim``
    uses) refuses the dataset when any of them blocks and otherwise returns the dataset this very
    scan read, so that the two cannot disagree.

    Blocking: a missing or empty ``crater_images/``, unexpected files in it, annotation lines that
    are not UTF-8 or do not parse (a box of zero width or height included), frames annotated
    twice, a frame with boxes whose image is missing, boxes outside their frame, crater ids
    without an image, malformed pose files or pose files shorter than the sequence, a malformed
    metadata.json, and any crater image or listed frame that is unreadable (its cause named:
    permission denied, a directory, ...) or damaged. Images are decoded with ``decode_images``;
    without it their PNG structure and every chunk's checksum are verified (which catches flipped
    bits and truncations; only a PNG with intact checksums around undecodable data needs the
    decode). Not blocking: missing pose files and missing images of frames without boxes. Not a
    problem at all: the images of frames without boxes that a partial build (``--parts
    scenarios``) left out on purpose (``not_rendered``).
    """
    root = Path(root)
    problems: list[Problem] = []
    not_rendered: list[str] = []

    def add(rel: str, line: int | None, msg: str) -> None:
        problems.append(Problem(rel, line, msg))

    if not root.is_dir():
        what = "is a file, not a directory" if root.exists() else "does not exist"
        return Luna1Scan(None, [Problem(str(root), None, f"dataset directory {what}")])
    cdir = root / CRATER_DIR
    listed = True
    try:
        entries = sorted(cdir.iterdir()) if cdir.is_dir() else []
    except OSError as exc:
        entries, listed = [], False
        add(CRATER_DIR, None, unreadable(cdir, "folder", exc).message)
    crater_ids = sorted(int(p.stem) for p in entries if p.suffix == ".png" and p.stem.isdigit())
    if cdir.is_dir():
        for p in entries:
            if p.suffix != ".png" or not p.stem.isdigit():
                if not p.name.startswith("."):
                    add(f"{CRATER_DIR}/{p.name}", None, "unexpected file; crater images are named <id>.png")
                continue
            _, msg = _probe_image(p, decode_images)
            if msg:
                add(f"{CRATER_DIR}/{p.name}", None, msg)
        if not crater_ids and listed:
            add(CRATER_DIR, None, "has no <id>.png crater landmark images; render them with trn-data build (or "
                                  "restore them)")
    elif cdir.exists():
        add(CRATER_DIR, None, "is a file, not a directory (crater landmark images are crater_images/<id>.png)")
    else:
        add(CRATER_DIR, None, "missing (no crater landmark images)")
    frames: list[FrameAnnotation] = []
    poses = kitti = None
    if (root / NAV_DIR).exists() and not (root / NAV_DIR).is_dir():
        add(NAV_DIR, None, "is a file, not a directory (the navigation sequence)")
    elif not (root / NAV_DIR).is_dir():
        add(NAV_DIR, None, "missing (no navigation sequence)")
    else:
        ann = root / ANNOTATIONS
        try:
            frames, errors = _parse_annotations(read_bytes(ann, "annotations file"), ann)
        except DataError as e:
            frames, errors = [], []
            add(ANNOTATIONS, None, e.message.removeprefix("annotations file "))
        for e in errors:
            add(ANNOTATIONS, e.line, e.message)
        known = set(crater_ids)
        partial = partial_build(root)
        for f in frames:
            ipath = root / NAV_IMAGES / f"{f.frame}.png"
            rel = f"{NAV_IMAGES}/{f.frame}.png"
            size = None
            if not ipath.exists() and not f.boxes and partial:
                not_rendered.append(rel)
            elif not ipath.exists() and not f.boxes:
                # no scenario reads a frame without boxes (a build with --parts scenarios
                # leaves them for later): reported, not blocking
                problems.append(Problem(rel, None, "missing (listed in annotations.txt, no boxes; `trn-data build` "
                                                   "without --parts renders it)", blocks_scenarios=False))
            elif not ipath.exists():
                add(rel, None, "missing (listed in annotations.txt)")
            else:
                size, msg = _probe_image(ipath, decode_images)
                if msg:
                    add(rel, None, msg)
            for b in f.boxes:
                if known and b.id not in known:
                    add(ANNOTATIONS, None, f"frame {f.frame}: crater id {b.id} has no {CRATER_DIR}/{b.id}.png")
                if size is not None and (b.l < 0 or b.t < 0 or b.r > size[1] or b.b > size[0]):
                    add(ANNOTATIONS, None, f"frame {f.frame}: box {b.to_token()} lies outside the "
                                           f"{size[1]}x{size[0]} image")
        n_frames = (max(f.frame for f in frames) + 1) if frames else 0
        read = {}
        for rel, reader in ((POSES_CSV, read_poses_csv), (POSES_KITTI, read_poses_kitti)):
            p = root / rel
            if not p.exists():
                problems.append(Problem(rel, None, "missing (optional, but Lost-in-Space orbit splits and metadata use it)",
                                        blocks_scenarios=False))
                continue
            try:
                arr = reader(p)
            except DataError as e:
                add(rel, e.line, e.message)
                continue
            if n_frames and len(arr) < n_frames:
                add(rel, None, f"has {len(arr)} rows; annotations.txt needs at least {n_frames}")
            read[rel] = arr
        poses, kitti = read.get(POSES_CSV), read.get(POSES_KITTI)
    meta = None
    if (root / METADATA).exists():
        try:
            meta = Luna1Metadata.read(root / METADATA)
        except DataError as e:
            add(METADATA, None, e.message)
    return Luna1Scan(Luna1Dataset(root, crater_ids, frames, poses, kitti, meta), problems, not_rendered)


def check_luna1(root: str | Path, decode_images: bool = True) -> list[Problem]:
    """Validate a Luna-1 directory; returns every problem found (empty list = valid). See
    :func:`scan_luna1` for what is checked and what blocks."""
    return scan_luna1(root, decode_images).problems


def read_luna1_checked(root: str | Path, decode_images: bool = False) -> Luna1Dataset:
    """The dataset as :func:`scan_luna1` read it, refused with one :class:`DataError` (the first
    blocking problem and how many more) when ``trn-data check`` would report any blocking problem.
    The loader of ``trn-sim``: with the same ``decode_images`` (``trn-data check --no-decode``),
    what one accepts the other accepts; ``trn-data check``'s default decode is only stricter."""
    scan = scan_luna1(root, decode_images)
    blocking = scan.blocking
    if scan.dataset is None:
        raise DataError(f"{blocking[0].message}; pass --data DIR of a Luna-1-format dataset", root)
    if blocking:
        more = f" (and {len(blocking) - 1} more)" if len(blocking) > 1 else ""
        raise DataError(f"dataset has problems: {blocking[0]}{more}; `trn-data check {root}` lists them all", root)
    return scan.dataset
