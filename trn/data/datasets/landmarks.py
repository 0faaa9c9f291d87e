"""Landmark image sets for training and evaluation: Luna-1 crater images, the HiRISE v3 "Mars
Crater" set, and a generic folder format.

Every reader returns a :class:`LandmarkSet`: one entry per image, each tagged with its instance
(identity) and view name. Views of one instance are images of the same landmark.

* Luna-1: ``crater_images/<id>.png``, one view per crater.
* HiRISE v3 (Wagstaff et al., "Mars orbital image (HiRISE) labeled data set version 3.2"):
  a labels file of ``<image file> <class id>`` lines (``labels-map-proj_v3_2.txt``), an optional
  class map CSV (``<id>,<name>``) and the images folder (``map-proj-v3_2/``). Only the crater class
  is kept; ``<name>-r90``, ``-r180``, ``-r270``, ``-fh``, ``-fv`` and ``-brt`` are views of ``<name>``.
* Folder: ``<instance>.png`` (one view) or ``<instance>_<view>.png`` or ``<instance>/<view>.png``
  (png, jpg, jpeg, tif); for Earth Stadium or a user's own crops.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trn.data.datasets.luna1 import (ANNOTATIONS, CRATER_DIR, FRAME_VIEWS_DIR, METADATA, NAV_DIR, VIEWS_DIR,
                                     Luna1Metadata, read_annotations)
from trn.data.files import png_structure, read_bytes, read_image, unreadable
from trn.errors import DataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff")
HIRISE_VARIANTS = ("-r90", "-r180", "-r270", "-fh", "-fv", "-brt")


@dataclass(frozen=True)
class LandmarkItem:
    path: Path
    instance: str
    view: str


@dataclass(frozen=True)
class LandmarkSet:
    """Images with identities. ``instances`` lists each identity once, in first-seen order."""

    name: str
    items: tuple[LandmarkItem, ...]

    @property
    def instances(self) -> list[str]:
        return list(dict.fromkeys(i.instance for i in self.items))

    def views_per_instance(self) -> Counter:
        return Counter(i.instance for i in self.items)

    def __len__(self) -> int:
        return len(self.items)


FRAME_VIEW_PREFIX = "frame"  # view name of a frame-domain view: frame<k>


def is_frame_view(view: str) -> bool:
    """Whether a landmark item's view is a frame-domain view (a crop as the navigation camera
    records it) rather than a landmark render."""
    return view.startswith(FRAME_VIEW_PREFIX)


def _require_dir(root: str | Path, what: str) -> None:
    """Refuse a dataset root that is missing or a file, saying which."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{what} directory {'is a file, not a directory' if root.exists() else 'does not exist'}", root)


def _numbered_views(vdir: Path) -> dict[str, list[Path]]:
    """``<id>_<k>.png`` files of a folder, per crater id, in k order."""
    out: dict[str, list[Path]] = {}
    for p in vdir.glob("*.png"):
        cid, _, k = p.stem.partition("_")
        if cid.isdigit() and k.isdigit():
            out.setdefault(cid, []).append(p)
    return {c: sorted(v, key=lambda q: int(q.stem.partition("_")[2])) for c, v in out.items()}


def read_luna1_landmarks(root: str | Path, extra_views: bool = False, frame_views: bool = False) -> LandmarkSet:
    """Crater landmark images of a Luna-1 directory; instance = crater id. With ``extra_views``,
    each crater's extra renders in ``crater_views/<id>_<k>.png`` (``trn-data build --views``)
    follow its Luna-1 render as further views of the same instance (views ``view<k>``); with
    ``frame_views``, its frame-domain views ``frame_views/<id>_<k>.png`` (``trn-data build
    --frame-views``, training and validation craters only) follow as views ``frame<k>``."""
    _require_dir(root, "Luna-1 dataset")
    cdir = Path(root) / CRATER_DIR
    if not cdir.is_dir():
        raise DataError(f"no {CRATER_DIR}/ folder: not a Luna-1 dataset", root)
    try:
        listed = list(cdir.iterdir())  # unlike glob, says when the folder cannot be read
    except OSError as exc:
        raise unreadable(cdir, f"{CRATER_DIR}/ folder", exc) from None
    paths = sorted((p for p in listed if p.suffix == ".png" and p.stem.isdigit()), key=lambda p: int(p.stem))
    if not paths:
        raise DataError("no <id>.png crater images", cdir)
    extra: list[tuple[str, dict[str, list[Path]]]] = []
    for wanted, folder, prefix, how in ((extra_views, VIEWS_DIR, "view", "--views K"),
                                        (frame_views, FRAME_VIEWS_DIR, FRAME_VIEW_PREFIX, "--frame-views K")):
        if not wanted:
            continue
        vdir = Path(root) / folder
        if not vdir.is_dir():
            raise DataError(f"no {folder}/ folder; render the views with trn-data build ... {how}", root)
        found = _numbered_views(vdir)
        if not found:
            raise DataError("no <id>_<k>.png views", vdir)
        extra.append((prefix, found))
    items = []
    for p in paths:
        items.append(LandmarkItem(p, p.stem, "render"))
        for prefix, found in extra:
            for v in found.get(p.stem, []):
                items.append(LandmarkItem(v, p.stem, f"{prefix}{v.stem.partition('_')[2]}"))
    return LandmarkSet("luna1", tuple(items))


def _hirise_base(stem: str) -> tuple[str, str]:
    for v in HIRISE_VARIANTS:
        if stem.endswith(v):
            return stem[: -len(v)], v[1:]
    return stem, "orig"


def read_hirise(root: str | Path, class_name: str = "crater") -> LandmarkSet:
    """The HiRISE v3 labelled set, crater class only, variants grouped as views of one instance."""
    root = Path(root)
    _require_dir(root, "HiRISE")
    labels = [p for p in sorted(root.glob("labels*.txt")) if "train_val_test" not in p.name]
    labels = labels or sorted(root.glob("labels*.txt"))
    if not labels:
        raise DataError("no labels*.txt file (lines '<image file> <class id>')", root)
    class_id = _hirise_class_id(root, class_name)
    img_dirs = [d for d in sorted(root.iterdir()) if d.is_dir()]
    items = []
    for i, raw in enumerate(labels[0].read_text(encoding="utf-8").splitlines(), start=1):
        parts = raw.split()
        if not parts:
            continue
        if len(parts) < 2 or not parts[1].lstrip("-").isdigit():
            raise DataError(f"line {raw!r} is not '<image file> <class id>'", labels[0], i)
        if int(parts[1]) != class_id:
            continue
        path = next((d / parts[0] for d in [root, *img_dirs] if (d / parts[0]).is_file()), None)
        if path is None:
            raise DataError(f"image {parts[0]} listed but not found under {root}", labels[0], i)
        base, view = _hirise_base(Path(parts[0]).stem)
        items.append(LandmarkItem(path, base, view))
    if not items:
        raise DataError(f"no images of class {class_name!r} (id {class_id})", labels[0])
    return LandmarkSet("hirise", tuple(items))


def _hirise_class_id(root: Path, class_name: str) -> int:
    maps = sorted(root.glob("*classmap*.csv"))
    if not maps:
        return 1  # crater is class 1 in v3
    for i, raw in enumerate(maps[0].read_text(encoding="utf-8").splitlines(), start=1):
        parts = [p.strip() for p in raw.split(",")]
        if len(parts) >= 2 and parts[1].lower() == class_name.lower():
            try:
                return int(parts[0])
            except ValueError:
                raise DataError(f"class id {parts[0]!r} is not an integer", maps[0], i) from None
    raise DataError(f"class {class_name!r} not in the class map", maps[0])


_VIEW_RE = re.compile(r"^(?P<inst>.+)_(?P<view>[^_]+)$")


def read_folder(root: str | Path, name: str = "folder") -> LandmarkSet:
    """Generic folder: ``<instance>.png``, ``<instance>_<view>.png`` or ``<instance>/<view>.png``.

    A flat file name with an underscore is read as ``<instance>_<view>`` only when at least one
    other file shares its ``<instance>`` prefix; otherwise the whole stem is the instance.
    """
    root = Path(root)
    _require_dir(root, "landmark folder")
    flat = sorted(p for p in root.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    nested = sorted(p for d in root.iterdir() if d.is_dir() for p in d.iterdir()
                    if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    prefixes = Counter(m["inst"] for p in flat if (m := _VIEW_RE.match(p.stem)))
    items = []
    for p in flat:
        m = _VIEW_RE.match(p.stem)
        if m and prefixes[m["inst"]] > 1:
            items.append(LandmarkItem(p, m["inst"], m["view"]))
        else:
            items.append(LandmarkItem(p, p.stem, "0"))
    items += [LandmarkItem(p, p.parent.name, p.stem) for p in nested]
    if not items:
        raise DataError(f"no images ({', '.join(IMAGE_SUFFIXES)}) found", root)
    return LandmarkSet(name, tuple(items))


def verify_images(ls: LandmarkSet) -> list[DataError]:
    """One error per image of ``ls`` that cannot be used, naming the file and the cause:
    unreadable (missing, permission denied, a directory), or damaged. PNGs are verified by their
    structure and checksums (:func:`trn.data.files.png_structure`, no decoding), other formats
    are decoded. What ``trn-train`` runs before it trains (and with ``--check``), so that a bad
    image is named before any work rather than in the middle of an epoch."""
    errors: list[DataError] = []
    for item in ls.items:
        try:
            if item.path.suffix.lower() == ".png":
                _, problem = png_structure(read_bytes(item.path, "landmark image"))
                if problem:
                    errors.append(DataError(f"landmark image {problem}; replace it or rebuild the dataset", item.path))
            else:
                read_image(item.path, what="landmark image")
        except DataError as e:
            errors.append(e)
    return errors


def refuse_bad_images(ls: LandmarkSet) -> None:
    """Raise one :class:`DataError` naming the first image of ``ls`` that :func:`verify_images`
    finds unusable, and how many more there are; the check ``trn-train`` and ``trn-sim run
    landmarks`` run before any work."""
    bad = verify_images(ls)
    if bad:
        more = f" (and {len(bad) - 1} more of {len(ls.items)} images)" if len(bad) > 1 else ""
        raise DataError(f"{bad[0]}{more}")


KINDS = ("luna1", "hirise", "folder")
LAYOUTS = {
    "luna1": "a Luna-1 directory (crater_images/<id>.png, optionally lro_navigation/)",
    "hirise": "the HiRISE v3 layout (labels*.txt with '<image> <class id>' lines, an optional *classmap*.csv, "
              "the images beside them or in a folder)",
    "folder": "a generic folder (<instance>.png, <instance>_<view>.png or <instance>/<view>.png)",
}


def detect_kind(root: str | Path) -> str:
    """The layout of a landmark dataset: ``luna1`` (a ``crater_images/`` folder), ``hirise`` (a
    ``labels*.txt`` file), else ``folder``."""
    root = Path(root)
    _require_dir(root, "landmark dataset")
    if (root / CRATER_DIR).is_dir():
        return "luna1"
    if any(root.glob("labels*.txt")):
        return "hirise"
    return "folder"


def read_landmarks(root: str | Path, kind: str | None = None, min_identities: int = 2,
                   extra_views: bool = False, frame_views: bool = False) -> tuple[LandmarkSet, str]:
    """(landmark set, kind) of a dataset, detecting the kind when it is not given; a set with
    fewer than ``min_identities`` identities is refused, naming the layout that was read.
    ``extra_views``: Luna-1 only, see :func:`read_luna1_landmarks`."""
    detected = kind is None
    kind = detect_kind(root) if kind is None else kind
    if kind not in KINDS:
        raise DataError(f"unknown dataset kind {kind!r}; expected one of {KINDS}", root)
    if (extra_views or frame_views) and kind != "luna1":
        raise DataError(f"extra and frame-domain views exist only for Luna-1 datasets; this one is {kind!r}", root)
    ls = read_luna1_landmarks(root, extra_views, frame_views) if kind == "luna1" else \
        {"hirise": read_hirise, "folder": read_folder}[kind](root)
    n = len(ls.instances)
    if n < min_identities:
        how = "detected" if detected else "given"
        raise DataError(f"read as {LAYOUTS[kind]} ({how} kind {kind!r}), it holds {n} landmark identit"
                        f"{'y' if n == 1 else 'ies'}; at least {min_identities} are needed. If it has another layout, "
                        "pass --kind", root)
    return ls, kind


@dataclass(frozen=True)
class Split:
    """Identity names of each part (instance-disjoint)."""

    train: list[str]
    val: list[str]
    test: list[str]

    def to_json(self) -> str:
        return json.dumps({"train": self.train, "val": self.val, "test": self.test}, indent=0) + "\n"


# the split of the shipped models and of trn-sim's test half (DataConfig's defaults)
TEST_FRACTION, VAL_FRACTION, SPLIT_SEED = 0.5, 0.1, 0


def split_ids(ids: list[str], forced: set[str], test_fraction: float, val_fraction: float, seed: int) -> Split:
    """The split itself, a pure function of the identity list: ``forced`` identities go to the
    test half first, the rest is shuffled by ``seed``; ``val_fraction`` of the train identities
    are held out for validation."""
    rng = np.random.default_rng(seed)
    first = [i for i in ids if i in forced]
    rest = [i for i in ids if i not in forced]
    rest = [rest[k] for k in rng.permutation(len(rest))]
    n_test = max(int(round(test_fraction * len(ids))), len(first)) if test_fraction > 0 else len(first)
    test = first + rest[: max(0, n_test - len(first))]
    train_all = rest[max(0, n_test - len(first)):]
    n_val = int(round(val_fraction * len(train_all)))
    val, train = train_all[:n_val], train_all[n_val:]
    pos = {k: n for n, k in enumerate(ids)}
    return Split(sorted(train, key=pos.__getitem__), sorted(val, key=pos.__getitem__), sorted(test, key=pos.__getitem__))


def luna1_identities(root: str | Path) -> list[str] | None:
    """Every crater of a Luna-1 build, from its metadata.json (None without one): the identity
    list that the split is drawn over, so that a build whose landmark images are not all rendered
    yet (``trn-data build --parts scenarios``) splits exactly as the finished build does."""
    path = Path(root) / METADATA
    if not path.is_file():
        return None
    return [str(c) for c in sorted(Luna1Metadata.read(path).craters)]


def forced_craters(root: str | Path) -> set[str]:
    """The craters a Luna-1 build's split forces into the test half: every crater its own
    navigation sequence boxes, and every crater either scene's sequence over the source's
    trajectory boxes (metadata.json's ``navigation_craters``, written by ``trn-data build``), so
    that the physical build and the authors' scene split alike and no model trains on a crater a
    scenario of either queries."""
    root = Path(root)
    forced: set[str] = set()
    # a navigation sequence without a readable annotations file would let its craters into the
    # training half (trn-sim refuses such a dataset): read_annotations refuses it, naming why
    if (root / NAV_DIR).exists():
        forced = {str(b.id) for f in read_annotations(root / ANNOTATIONS) for b in f.boxes}
    if (root / METADATA).is_file():
        for craters in Luna1Metadata.read(root / METADATA).navigation_craters.values():
            forced |= {str(c) for c in craters}
    return forced


def split_identities(ls: LandmarkSet, path: str | Path, kind: str = "auto",
                     test_fraction: float = TEST_FRACTION, val_fraction: float = VAL_FRACTION,
                     split_seed: int = SPLIT_SEED) -> Split:
    """The instance-disjoint split of the landmark set ``ls`` read from ``path`` (``kind`` given or
    ``auto``): ``test_fraction`` of the identities go to the test half; for Luna-1 every crater
    seen in either scene's navigation sequence goes to the test half first (:func:`forced_craters`), and the identities are the
    build's craters (metadata.json) where it lists them. ``val_fraction`` of the train identities
    are held out for validation. Fewer than two training identities is refused."""
    ids = ls.instances
    forced: set[str] = set()
    kind = detect_kind(path) if kind == "auto" else kind
    if kind == "luna1":
        forced = forced_craters(path)
        listed = luna1_identities(path)
        if listed is not None and set(ids) <= set(listed):
            ids = listed
    split = split_ids(ids, forced, test_fraction, val_fraction, split_seed)
    if len(split.train) < 2:
        raise DataError(f"only {len(split.train)} training identities after the split; the dataset has {len(ids)}")
    return split
