"""Bad inputs for the seven command lines, each run as a real subprocess and classified.

    python benchmarks/reliability/bad_inputs.py [--jobs 2] [--timeout 90] [--out docs/benchmarks/reliability/bad_inputs.txt]

Every case is a command a user could type with one thing wrong: an option out of range or of the
wrong kind, a missing, empty, corrupt, truncated or permission-denied file, a malformed annotation
line, NaN in a pose file or a config, a file of the wrong shape, a YAML config with a key given
twice, an option the run would ignore; every path and config argument of the seven given empty
and nested deeper than anything can read (a path past the system's limit, a YAML value of 5,000
brackets: :func:`path_and_config_arguments`); config, report, metadata, label, manifest and board
state files nested too deep; bundles signed with a model name that is a path or a version above
2**53 - 1; board roots changed by someone without the signing key. The fixtures are built in a
temporary directory from scratch (a small Luna-1 dataset written with trn's own writers, configs,
a landmark database, a key pair and, when the repository's models and exports are present, a
signed bundle and board roots flashed with it); nothing under data/ is read, and every command
runs with the temporary directory as its working directory and as its TRN_CACHE, so no built-in
world is used or built.

Each outcome is one of:

* clear: a non-zero exit status, no traceback, and the output names the thing that is wrong
  (every expected fragment of the case is in stdout or stderr, case-insensitive);
* traceback: a Python traceback, or a death by a signal;
* silent success: exit status 0, or still running after the timeout (the bad input was
  accepted and work started);
* unclear: a refusal that does not name the thing (or names another cause).

Permission-denied cases run with the file at mode 000; as root, whose reads ignore file modes,
they run under ``setpriv --bounding-set -dac_override,-dac_read_search`` (skipped when setpriv
is absent). The script prints the table per command line and in total, the hardware, and every
case that is not clear with its command and the last line it printed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CLIS = ("trn-data", "trn-sim", "trn-train", "trn-db", "trn-export", "trn-hw", "trn-detect")
MODULES = {c: f"trn.cli.{c.removeprefix('trn-')}" for c in CLIS}
CLASSES = ("clear", "traceback", "silent success", "unclear")
# who owns the code a case exercises, where it is not this script's (see the report)
OWNERS = {"trn-hw": "hw/export owner", "trn-export": "hw/export owner", "trn-db": "db owner"}
NO_DAC = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]


@dataclass(frozen=True)
class Case:
    """One bad invocation. ``argv`` follows the program name; every fragment of ``expect`` (each
    may list alternatives separated by ``|``) must appear in the output for the case to be clear.
    ``unreadable``: the command must run without the power to read mode-000 files. ``needs``:
    the fixture it needs (skipped when that could not be built). ``owner``: who owns the code the
    case exercises when that is not the command line's own (see OWNERS)."""

    cli: str
    name: str
    argv: tuple[str, ...]
    expect: tuple[str, ...]
    unreadable: bool = False
    needs: str | None = None
    timeout: float | None = None
    owner: str | None = None  # where the code it exercises lives, when not with its command line
    succeeds: bool = False  # an odd but valid input: clear when it exits 0 and prints every fragment


@dataclass
class Outcome:
    case: Case
    kind: str  # one of CLASSES, or "skipped"
    rc: int | None
    seconds: float
    last_line: str
    note: str = ""


@dataclass
class Fixtures:
    """Paths of everything the cases use, under ``root``; ``missing`` lists the optional fixtures
    that could not be built (and why)."""

    root: Path
    missing: dict[str, str] = field(default_factory=dict)
    near_digests: tuple[str, str] = ("", "")  # how a refusal should show models/near.pt's two digests
    geo_expect: str = ""  # what trn-detect run prints of the reference float raster's craters

    def p(self, *parts: str) -> str:
        return str(self.root.joinpath(*parts))


# ---------------------------------------------------------------- fixtures

N_CRATERS, N_FRAMES, CRATER_PX, FRAME_H, FRAME_W = 24, 8, 64, 96, 256
TRAIN_HALF_CRATER = 20  # never in a box, so in the training half of the split
ANNOTATED_FRAME = 2


def write_luna1(root: Path, seed: int = 0) -> None:
    """A small valid Luna-1 dataset: 24 crater discs, 8 frames of 96x256 px with two 64-px boxes
    each (craters 0..7), poses of a circular orbit in both formats."""
    from trn.data.datasets import luna1
    from trn.data.datasets.luna1 import Box, FrameAnnotation
    from trn.data.worlds.trajectory import poses_to_kitti, write_poses_csv, write_poses_kitti

    rng = np.random.default_rng(seed)
    (root / luna1.CRATER_DIR).mkdir(parents=True)
    (root / luna1.NAV_IMAGES).mkdir(parents=True)
    yy, xx = np.mgrid[:CRATER_PX, :CRATER_PX]
    discs = []
    for c in range(N_CRATERS):
        img = rng.normal(110, 10, (CRATER_PX, CRATER_PX))
        r = 6 + (c * 7) % 22
        img[(yy - 32) ** 2 + (xx - 32 - c % 5) ** 2 < r * r] -= 50
        discs.append(np.clip(img, 0, 255).astype(np.uint8))
        cv2.imwrite(str(root / luna1.CRATER_DIR / f"{c}.png"), discs[-1])
    frames = []
    for i in range(N_FRAMES):
        img = np.clip(rng.normal(100, 10, (FRAME_H, FRAME_W)), 0, 255).astype(np.uint8)
        boxes = []
        for j, cid in enumerate(((2 * i) % 8, (2 * i + 1) % 8)):
            left = 16 + 96 * j
            img[16:80, left:left + 64] = discs[cid]
            boxes.append(Box(cid, left, left + 64, 16, 80))
        cv2.imwrite(str(root / luna1.NAV_IMAGES / f"{i}.png"), img)
        frames.append(FrameAnnotation(i, f"nav_images/{i}.png", tuple(boxes)))
    luna1.write_annotations(root / luna1.ANNOTATIONS, frames)
    a = np.linspace(0, 0.2, N_FRAMES)
    poses = np.stack([1837 * np.cos(a), 1837 * np.sin(a), np.zeros_like(a),
                      np.cos(a / 2), np.zeros_like(a), np.zeros_like(a), np.sin(a / 2)], axis=1)
    write_poses_csv(root / luna1.POSES_CSV, poses)
    write_poses_kitti(root / luna1.POSES_KITTI, poses_to_kitti(poses))


def _flip(path: Path, at: float = 0.5) -> None:
    b = bytearray(path.read_bytes())
    b[int(len(b) * at)] ^= 0x5A
    path.write_bytes(bytes(b))


def _edit(path: Path, fn: Callable[[str], str]) -> None:
    path.write_text(fn(path.read_text(encoding="utf-8")), encoding="utf-8")


def _replace_first_box(token: str) -> Callable[[Path], None]:
    def damage(d: Path) -> None:
        _edit(d / "lro_navigation" / "annotations.txt", lambda t: t.replace("0,16,80,16,80", token, 1))
    return damage


def _unreadable(rel: str) -> Callable[[Path], None]:
    def damage(d: Path) -> None:
        (d / rel).chmod(0)
    return damage


def _as_dir(rel: str) -> Callable[[Path], None]:
    def damage(d: Path) -> None:
        p = d / rel
        p.unlink()
        p.mkdir()
    return damage


def _rewrite(rel: str, data: bytes) -> Callable[[Path], None]:
    def damage(d: Path) -> None:
        (d / rel).write_bytes(data)
    return damage


CRATER = f"crater_images/{TRAIN_HALF_CRATER}.png"
FRAME = f"lro_navigation/nav_images/{ANNOTATED_FRAME}.png"
ANN = "lro_navigation/annotations.txt"
CSV = "lro_navigation/poses/LROCWAC_22Sep06_000000_6H_10S_poses.csv"
KITTI = "lro_navigation/poses/kitti_LROCWAC_22Sep06_000000_6H_10S_poses.txt"


def _metadata(doc: dict) -> Callable[[Path], None]:
    def damage(d: Path) -> None:
        (d / "metadata.json").write_text(json.dumps(doc), encoding="utf-8")
    return damage


def _text(rel: str, transform: Callable[[str], str]) -> Callable[[Path], None]:
    return lambda d: _edit(d / rel, transform)


def _truncate(rel: str, size: int) -> Callable[[Path], None]:
    return lambda d: (d / rel).write_bytes((d / rel).read_bytes()[:size])


def _columns(n: int, sep: str | None = ",") -> Callable[[str], str]:
    """Every row cut to its first ``n`` fields."""
    join = sep or " "
    return lambda t: "\n".join(join.join(r.split(sep)[:n]) for r in t.splitlines()) + "\n"


def _first_row(fn: Callable[[str], str]) -> Callable[[str], str]:
    return lambda t: "\n".join([fn(t.splitlines()[0]), *t.splitlines()[1:]]) + "\n"


def _first_value_nan(t: str) -> str:
    return t.replace(t.split(",")[1], "nan", 1)


def _no_crater_images(d: Path) -> None:
    for p in (d / "crater_images").iterdir():
        p.unlink()


def _crater_images_a_file(d: Path) -> None:
    shutil.rmtree(d / "crater_images")
    (d / "crater_images").write_text("x")


def _not_utf8(d: Path) -> None:
    (d / ANN).write_bytes((d / ANN).read_bytes().replace(b"nav_images/1.png", b"nav_images/1.png \xff\xfe", 1))


def _unreadable_metadata(d: Path) -> None:
    (d / "metadata.json").write_text("{}")
    (d / "metadata.json").chmod(0)


# name -> (damage, fragments naming it, read by training (trn-train --check sees it), unreadable)
CRATER_N, FRAME_N = f"{TRAIN_HALF_CRATER}.png", f"{ANNOTATED_FRAME}.png"
DAMAGES: dict[str, tuple[Callable[[Path], None], tuple[str, ...], bool, bool]] = {
    "zero-width box": (_replace_first_box("0,16,16,16,80"), ("annotations.txt", "l < r"), True, False),
    "zero-height box": (_replace_first_box("0,16,80,16,16"), ("annotations.txt", "t < b"), True, False),
    "inverted box": (_replace_first_box("0,80,16,16,80"), ("annotations.txt", "l < r"), True, False),
    "NaN in a box": (_replace_first_box("0,nan,80,16,80"), ("annotations.txt", "finite"), True, False),
    "box with 4 fields": (_replace_first_box("0,16,80,16"), ("annotations.txt", "id,l,r,t,b"), True, False),
    "box with text": (_replace_first_box("0,16,eighty,16,80"), ("annotations.txt", "not a number"), True, False),
    "negative crater id": (_replace_first_box("-3,16,80,16,80"), ("annotations.txt", "id"), True, False),
    "box outside its frame": (_replace_first_box("0,200,300,16,80"), ("annotations.txt", "outside"), False, False),
    "box of an unknown crater": (_replace_first_box("999,16,80,16,80"), ("annotations.txt", "999"), False, False),
    "frame annotated twice": (_text(ANN, lambda t: t + t.splitlines()[1] + "\n"), ("annotations.txt", "twice"), True,
                              False),
    "image path without a frame number": (_text(ANN, lambda t: t.replace("nav_images/3.png", "nav_images/x.png")),
                                          ("annotations.txt", "frame number"), True, False),
    "annotations not UTF-8": (_not_utf8, ("annotations.txt", "UTF-8"), True, False),
    "annotations missing": (lambda d: (d / ANN).unlink(), ("annotations.txt", "missing"), True, False),
    "annotations a directory": (_as_dir(ANN), ("annotations.txt", "directory"), True, False),
    "annotations unreadable": (_unreadable(ANN), ("annotations.txt", "permission denied"), True, True),
    "empty crater_images/": (_no_crater_images, ("crater_images", "no <id>.png|no crater"), True, False),
    "no crater_images/": (lambda d: shutil.rmtree(d / "crater_images"), ("crater_images",), True, False),
    "crater_images a file": (_crater_images_a_file, ("crater_images", "not a directory|no crater_images"), True, False),
    "stray file in crater_images/": (lambda d: (d / "crater_images" / "notes.txt").write_text("x"),
                                     ("notes.txt", "unexpected"), False, False),
    "crater_images/ unreadable": (_unreadable("crater_images"), ("crater_images", "permission denied"), True, True),
    "crater image bit flip": (lambda d: _flip(d / CRATER), (CRATER_N, "corrupt|checksum|decode"), True, False),
    "crater image truncated": (_truncate(CRATER, 300), (CRATER_N, "truncated|decode"), True, False),
    "crater image empty (0 bytes)": (_rewrite(CRATER, b""), (CRATER_N, "empty|0 bytes"), True, False),
    "crater image is text": (_rewrite(CRATER, b"not an image\n"), (CRATER_N, "not a PNG|decode"), True, False),
    "crater image a directory": (_as_dir(CRATER), (CRATER_N, "directory"), True, False),
    "crater image unreadable": (_unreadable(CRATER), (CRATER_N, "permission denied"), True, True),
    "annotated frame missing": (lambda d: (d / FRAME).unlink(), (FRAME_N, "missing"), False, False),
    "annotated frame bit flip": (lambda d: _flip(d / FRAME), (FRAME_N, "corrupt|checksum|decode"), False, False),
    "annotated frame truncated": (_truncate(FRAME, 500), (FRAME_N, "truncated|decode"), False, False),
    "annotated frame unreadable": (_unreadable(FRAME), (FRAME_N, "permission denied"), False, True),
    "frame smaller than its boxes": (lambda d: cv2.imwrite(str(d / FRAME), np.zeros((40, 40), np.uint8)),
                                     ("annotations.txt", "outside"), False, False),
    "NaN in the pose CSV": (_text(CSV, _first_value_nan), ("poses.csv", "NaN"), False, False),
    "pose CSV with 6 columns": (_text(CSV, _columns(6)), ("poses.csv", "columns"), False, False),
    "pose CSV with text": (_text(CSV, lambda t: "x,y,z,q0,q1,q2,q3\n" + t), ("poses.csv", "not a number"), False, False),
    "non-unit quaternion": (_text(CSV, _first_row(lambda r: ",".join(r.split(",")[:3] + ["2", "0", "0", "0"]))),
                            ("poses.csv", "unit quaternion"), False, False),
    "pose CSV shorter than the sequence": (_text(CSV, lambda t: "\n".join(t.splitlines()[:3]) + "\n"),
                                           ("poses.csv", "rows|poses"), False, False),
    "KITTI rotation not orthonormal": (_text(KITTI, _first_row(lambda r: " ".join(["2"] * 12))),
                                       ("kitti", "orthonormal"), False, False),
    "KITTI row of 11 numbers": (_text(KITTI, _first_row(lambda r: " ".join(r.split()[:11]))), ("kitti", "columns"),
                                False, False),
    "pose file unreadable": (_unreadable(CSV), ("poses.csv", "permission denied"), False, True),
    "metadata.json not JSON": (_rewrite("metadata.json", b"{not json"), ("metadata.json", "JSON"), True, False),
    "metadata.json of another format": (_metadata({"format": "other", "version": 1}), ("metadata.json", "format"),
                                        True, False),
    "metadata.json of a newer version": (_metadata({"format": "trn-luna1-metadata", "version": 9}),
                                         ("metadata.json", "version"), True, False),
    "metadata.json unreadable": (_unreadable_metadata, ("metadata.json", "permission denied"), True, True),
}


def _world_file(pattern: str) -> Callable[[Path], Path]:
    return lambda w: next(iter(sorted(w.glob(pattern))))


DEM_TILE = _world_file("dem/*/*lat+00_lon000.png")
CATALOGUE = _world_file("catalogs/*.csv")
TRAJECTORY = _world_file("trajectory/*_poses_moon_pa.csv")
KITTI_TRAJECTORY = _world_file("trajectory/*_kitti_3x4_iau_moon.txt")
ALBEDO = _world_file("albedo/*.png")

# damages of a source directory (the tiny procedural world) for trn-data build luna1:
# name -> (damage, fragments naming it, unreadable); the DEM and albedo readers are in trn/data/worlds/terrain.py
TERRAIN = "trn/data/worlds/terrain.py"
def _in_world(file: Callable[[Path], Path], damage: Callable[[Path], None]) -> Callable[[Path], None]:
    return lambda w: damage(file(w))


def _text_of(transform: Callable[[str], str]) -> Callable[[Path], None]:
    return lambda path: _edit(path, transform)


SOURCE_DAMAGES: dict[str, tuple[Callable[[Path], None], tuple[str, ...], bool]] = {
    "DEM tile bit flip": (_in_world(DEM_TILE, _flip), ("lat+00_lon000.png", "corrupt|decode|checksum"), False),
    "DEM tile truncated": (_in_world(DEM_TILE, lambda p: p.write_bytes(p.read_bytes()[:200])),
                           ("lat+00_lon000.png", "truncated|decode"), False),
    "DEM tile of the wrong shape": (_in_world(DEM_TILE, lambda p: cv2.imwrite(str(p), np.zeros((7, 9), np.uint16))),
                                    ("lat+00_lon000.png", "shape"), False),
    "DEM tile 8-bit": (_in_world(DEM_TILE, lambda p: cv2.imwrite(str(p), np.zeros((120, 120), np.uint8))),
                       ("lat+00_lon000.png", "uint16|dtype"), False),
    "DEM tile unreadable": (_in_world(DEM_TILE, lambda p: p.chmod(0)), ("lat+00_lon000.png", "permission denied"), True),
    "no dem/": (lambda w: shutil.rmtree(w / "dem"), ("dem",), False),
    "catalogue missing": (_in_world(CATALOGUE, Path.unlink), ("catalogs", "catalogue"), False),
    "catalogue with NaN": (_in_world(CATALOGUE, _text_of(lambda t: t.replace(t.splitlines()[1].split(",")[2], "nan", 1))),
                           ("synth_craters.csv", "diameter|nan|finite"), False),
    "catalogue with text": (_in_world(CATALOGUE, _text_of(lambda t: t + "east,north,big\n")),
                            ("synth_craters.csv", "numeric"), False),
    "catalogue without a diameter column": (_in_world(CATALOGUE, _text_of(lambda t: t.replace("Diam_km", "Size", 1))),
                                            ("synth_craters.csv", "column"), False),
    "catalogue unreadable": (_in_world(CATALOGUE, lambda p: p.chmod(0)), ("synth_craters.csv", "permission denied"),
                             True),
    "trajectory missing": (_in_world(TRAJECTORY, Path.unlink), ("trajectory", "poses"), False),
    "trajectory with NaN": (_in_world(TRAJECTORY, _text_of(_first_value_nan)), ("poses_moon_pa.csv", "NaN"), False),
    "trajectory with 6 columns": (_in_world(TRAJECTORY, _text_of(_columns(6))), ("poses_moon_pa.csv", "columns"), False),
    "trajectory files disagree": (_in_world(KITTI_TRAJECTORY, _text_of(lambda t: "\n".join(t.splitlines()[:-1]) + "\n")),
                                  ("kitti", "poses"), False),
    "trajectory.json without a step": (lambda w: (w / "trajectory" / "trajectory.json").write_text(
        '{"start_utc": "2022-09-06T00:00:00Z"}'), ("trajectory.json", "step_s"), False),
    "albedo corrupt": (_in_world(ALBEDO, lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))),
                       ("albedo", "corrupt|decode|checksum"), False),
}


def _yaml_config(path: Path, data: str, body: str = "model: {preset: flight}\nepochs: 2\nbatch_size: 8\n") -> str:
    path.write_text(f"data: {{kind: luna1, path: {data}}}\n{body}", encoding="utf-8")
    return str(path)


def _labels_doc(**frame) -> str:
    f = {"frame": 0, "split": "val", "segment": 0, "altitude_km": 100, "sun_elevation_deg": 10, "lat_deg": 0,
         "lon_deg": 0, "boxes": [{"id": 1, "box": [3, 9, 0, 9], "diameter_km": 5, "sun_elevation_deg": 10,
                                  "clipped": False}], **frame}
    return json.dumps({"format": "trn-detection-labels", "version": 1, "frames": [f]})


# label files an audit found read with a traceback or silently (name -> text), and their families
HOSTILE_LABELS = {
    "infinity_in_a_box": _labels_doc().replace("[3, 9, 0, 9]", "[3, Infinity, 0, 9]"),
    "nan_altitude": _labels_doc().replace('"altitude_km": 100', '"altitude_km": NaN'),
    "huge_float_altitude": _labels_doc().replace('"altitude_km": 100', '"altitude_km": 1e999'),
    "negative_altitude": _labels_doc(altitude_km=-5),
    "box_of_1e11_px": _labels_doc().replace("[3, 9, 0, 9]", "[3, 100000000000, 0, 9]"),
    "latitude_91": _labels_doc(lat_deg=91),
    "frame_listed_twice": json.dumps({"format": "trn-detection-labels", "version": 1,
                                      "frames": [json.loads(_labels_doc())["frames"][0]] * 2}),
    "settings_a_list": json.dumps({**json.loads(_labels_doc()), "settings": [1, 2]}),
    "rule_not_a_mapping": json.dumps({**json.loads(_labels_doc()), "settings": {"rule": "strict"}}),
    "rule_unknown_key": json.dumps({**json.loads(_labels_doc()), "settings": {"rule": {"smal_min_km": 3}}}),
    "integer_of_5001_digits": _labels_doc().replace('"segment": 0', '"segment": ' + "9" * 5001),
}
HOSTILE_LABEL_WORDS = {"infinity_in_a_box": "Infinity", "nan_altitude": "NaN", "huge_float_altitude": "64-bit float",
                       "negative_altitude": "altitude_km", "box_of_1e11_px": "box coordinate",
                       "latitude_91": "lat_deg", "frame_listed_twice": "listed twice", "settings_a_list": "settings",
                       "rule_not_a_mapping": "settings.rule", "rule_unknown_key": "smal_min_km",
                       "integer_of_5001_digits": "not readable JSON"}


def _detect_run_fixtures(root: Path) -> None:
    """Images and catalogues for trn-detect run: a PNG whose header claims 65535 x 65535 px, a
    catalogue that is a FIFO, a directory, JSON, or holds a field over the csv module's limit, an
    image whose name holds a line break."""
    import struct
    import zlib

    d = root / "detect_run"
    d.mkdir()

    def chunk(t: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + t + data + struct.pack(">I", zlib.crc32(t + data) & 0xFFFFFFFF)

    (d / "huge.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 65535, 65535, 8, 0, 0, 0, 0))
                                 + chunk(b"IDAT", zlib.compress(bytes(100))) + chunk(b"IEND", b""))
    cv2.imwrite(str(d / "plain.png"), np.full((64, 64), 120, np.uint8))
    (d / "line\nbreak.png").write_bytes((d / "plain.png").read_bytes())
    os.mkfifo(d / "fifo.csv")
    (d / "dir.csv").mkdir()
    (d / "craters.geojson").write_text('{"type": "FeatureCollection", "features": []}', encoding="utf-8")
    (d / "big_field.csv").write_text("lat,lon,diameter_km\n1,2," + "9" * 200_000 + "\n", encoding="utf-8")
    (d / "cfg_5001_digits.yaml").write_text("epochs: " + "9" * 5001 + "\n", encoding="utf-8")
    _huge_headers(d)
    det = d / "detector_deep_report"
    det.mkdir()
    (det / "detector_int8.tflite").write_bytes(b"TFL3" * 8)
    (det / "export_report.json").write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")


def _huge_headers(d: Path) -> None:
    """JPEG, BMP and TIFF files whose headers claim 65535 x 65535 px (the PNG case's family)."""
    small = np.full((8, 8), 120, np.uint8)
    jpg = bytearray(cv2.imencode(".jpg", small)[1].tobytes())
    sof = jpg.index(b"\xff\xc0")  # baseline frame header: length, precision, height, width
    jpg[sof + 5:sof + 9] = (65535).to_bytes(2, "big") * 2
    (d / "huge.jpg").write_bytes(bytes(jpg))
    bmp = bytearray(cv2.imencode(".bmp", small)[1].tobytes())
    bmp[18:26] = (65535).to_bytes(4, "little") * 2  # BITMAPINFOHEADER width and height
    (d / "huge.bmp").write_bytes(bytes(bmp))
    # a little-endian TIFF of one strip whose ImageWidth and ImageLength say 65535
    import struct

    pixels = small.tobytes()
    tags = [(256, 3, 1, 65535), (257, 3, 1, 65535), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1),
            (273, 4, 1, 8), (277, 3, 1, 1), (278, 3, 1, 65535), (279, 4, 1, len(pixels))]
    ifd = 8 + len(pixels)
    head = b"II*\x00" + struct.pack("<I", ifd) + pixels
    body = struct.pack("<H", len(tags)) + b"".join(
        struct.pack("<HHI", t, k, n) + (struct.pack("<HH", v, 0) if k == 3 else struct.pack("<I", v))
        for t, k, n, v in tags) + struct.pack("<I", 0)
    (d / "huge.tif").write_bytes(head + body)


GEOTIFFS = {  # name: (CRS, top-left x, y, pixel size): each puts its pixels off the body or at no usable scale
    "far_north": ("+proj=eqc +R=1737400 +units=m +no_defs", 0.0, 1e13, 100.0),
    "far_east": ("+proj=eqc +R=1737400 +units=m +no_defs", 1e13, 0.0, 100.0),
    "longitudes_of_3e10": ("+proj=longlat +R=1737400 +no_defs", 3.3e10, 20.0, 0.001),
    "orthographic_off_the_disc": ("+proj=ortho +lat_0=0 +lon_0=0 +R=1737400 +units=m +no_defs", 1735662.6, 347480.0,
                                  100.0),
    "stereographic_far_off": ("+proj=stere +lat_0=-90 +lon_0=0 +k=1 +R=1737400 +units=m +no_defs", 1e13, 80000.0,
                              100.0),
    "micrometre_pixels": ("+proj=eqc +R=1737400 +units=m +no_defs", 0.0, 0.0, 1e-6),
}


def _bowl_scene(side: int = 256) -> np.ndarray:
    """float64 [side, side]: three shaded bowls (lit from the left) on a flat plain, mean 0."""
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float64)
    scene = np.zeros((side, side))
    for cx, cy, r in ((70, 70, 22), (180, 95, 30), (100, 190, 26)):
        d = np.hypot(xx - cx, yy - cy) / r
        inside = d < 1
        scene[inside] -= ((xx - cx) / r)[inside] * 40 + 20 * (1 - d[inside] ** 2)
        rim = (d >= 1) & (d < 1.15)
        scene[rim] += 15
    return cv2.GaussianBlur(scene, (0, 0), 1.5) - scene.mean()


def _geo_fixtures(fx: Fixtures) -> None:
    """GeoTIFFs whose transform or CRS puts their pixels off the body (GEOTIFFS), and float rasters
    of a bowl scene at +-1e38 (float32) and +-1.5e308 (float64) beside the same scene at +-40,
    whose crater count (run once here) each must reproduce; needs rasterio (the geo extra)."""
    try:
        import rasterio
        from rasterio.transform import from_origin
    except ImportError as exc:
        fx.missing["geo"] = f"rasterio not installed ({exc}): pip install -e '.[geo]'"
        return
    d = fx.root / "geo"
    d.mkdir()
    for name, (crs, x0, y0, px) in GEOTIFFS.items():
        with rasterio.open(d / f"{name}.tif", "w", driver="GTiff", height=64, width=64, count=1, dtype="uint8",
                           crs=crs, transform=from_origin(x0, y0, px, px)) as ds:
            ds.write(np.full((64, 64), 120, np.uint8), 1)
    scene = _bowl_scene()
    crs, x0, y0, px = "+proj=eqc +R=1737400 +units=m +no_defs", 0.0, 0.0, 100.0
    for name, image in (("reference", (scene * (40 / np.abs(scene).max())).astype(np.float32)),
                        ("float32_1e38", (scene * (3e38 / np.abs(scene).max())).astype(np.float32)),
                        ("float64_1e308", scene * (1.5e308 / np.abs(scene).max()))):
        with rasterio.open(d / f"{name}.tif", "w", driver="GTiff", height=image.shape[0], width=image.shape[1],
                           count=1, dtype=image.dtype.name, crs=crs, transform=from_origin(x0, y0, px, px)) as ds:
            ds.write(image, 1)
    r = subprocess.run(_command("trn-detect") + ["run", str(REPO / "models" / "detector"), str(d / "reference.tif"),
                                                 "--out", str(fx.root / "runs" / "geo_reference")],
                       capture_output=True, text=True, cwd=fx.root, env=_env(fx), timeout=300)
    last = (r.stdout.strip().splitlines() or [""])[-1]
    if r.returncode != 0 or " craters at score" not in last or last.split(", ")[1].startswith("0 craters"):
        fx.missing["geo"] = f"the reference float raster gave no craters to compare with: {last or r.stderr[-200:]}"
        return
    fx.geo_expect = last.split(", ")[1].split(";")[0]  # "N craters at score >= T"


def build_fixtures(root: Path, optional: bool = True) -> Fixtures:
    """Everything the cases need, under ``root``. ``optional``: also the tiny procedural world, the
    landmark database, the key pair and the signed bundle (some trn-data, trn-db, trn-export and
    trn-hw cases need them; without them those cases are skipped)."""
    fx = Fixtures(root)
    good = root / "good"
    write_luna1(good)
    (root / "cfg").mkdir()
    _yaml_config(root / "cfg" / "good.yaml", str(good))
    for name, (damage, _, _, _) in DAMAGES.items():
        d = root / "bad" / _slug(name)
        shutil.copytree(good, d)
        damage(d)
        _yaml_config(root / "cfg" / f"{_slug(name)}.yaml", str(d))
    (root / "empty_dir").mkdir()
    (root / "a_file").write_text("not a directory\n", encoding="utf-8")
    (root / "empty_file").write_bytes(b"")
    (root / "random.bin").write_bytes(np.random.default_rng(1).bytes(4096))
    (root / "unreadable.yaml").write_text((root / "cfg" / "good.yaml").read_text(), encoding="utf-8")
    (root / "unreadable.yaml").chmod(0)
    # landmark folders
    one = root / "one_landmark"
    one.mkdir()
    shutil.copy(good / "crater_images" / "0.png", one / "a.png")
    broken = root / "folder_broken"
    shutil.copytree(good / "crater_images", broken)
    _flip(broken / "3.png")
    hirise = root / "hirise_bad"
    hirise.mkdir()
    shutil.copy(good / "crater_images" / "0.png", hirise / "a.png")
    (hirise / "labels-map-proj_v3_2.txt").write_text("a.png\n", encoding="utf-8")
    hirise_missing = root / "hirise_missing"
    hirise_missing.mkdir()
    (hirise_missing / "labels-map-proj_v3_2.txt").write_text("gone.png 1\nother.png 1\n", encoding="utf-8")
    # model files
    (root / "models").mkdir()
    (root / "models" / "empty.pt").write_bytes(b"")
    (root / "models" / "random.pt").write_bytes(np.random.default_rng(2).bytes(2048))
    (root / "models" / "run_without_weights").mkdir()
    (root / "models" / "model.onnx").write_bytes(b"not onnx")
    # a model whose checksum file differs from its own digest only after the 12th hex digit
    near = root / "models" / "near.pt"
    near.write_bytes(np.random.default_rng(6).bytes(2048))
    real = hashlib.sha256(near.read_bytes()).hexdigest()
    recorded = real[:20] + ("0" if real[20] != "0" else "1") + real[21:]
    (root / "models" / "near.pt.sha256").write_text(f"{recorded}  near.pt\n", encoding="utf-8")
    fx.near_digests = (real[:25], recorded[:25])
    (root / "tiny_image").mkdir()
    cv2.imwrite(str(root / "tiny_image" / "1.png"), np.zeros((1, 1), np.uint8))
    # reports for trn-sim report
    rep = root / "reports"
    (rep / "no_json").mkdir(parents=True)
    (rep / "bad_json").mkdir()
    (rep / "bad_json" / "report.json").write_text("{", encoding="utf-8")
    (rep / "list_json").mkdir()
    (rep / "list_json" / "report.json").write_text("[1, 2]", encoding="utf-8")
    (rep / "wrong_keys").mkdir()
    (rep / "wrong_keys" / "report.json").write_text('{"context": 3, "results": "x"}', encoding="utf-8")
    (rep / "no_results").mkdir()
    (rep / "no_results" / "report.json").write_text('{"format": "trn-sim-report"}', encoding="utf-8")
    (rep / "results_of_numbers").mkdir()
    (rep / "results_of_numbers" / "report.json").write_text('{"format": "trn-sim-report", "context": {}, "results": [1, 2]}',
                                                            encoding="utf-8")
    # DEM sources for trn-data build luna1
    src = root / "sources"
    (src / "no_dem").mkdir(parents=True)
    (src / "empty_dem" / "dem").mkdir(parents=True)
    (root / "runs").mkdir()
    # detector labels and configs for trn-detect
    det = root / "detlabels"
    for name, text in (("not_json", "{"), ("wrong_format", '{"format": "x", "version": 1}'),
                       ("malformed_frame", '{"format": "trn-detection-labels", "version": 1, "frames": [{"frame": 0}]}'),
                       ("empty_box", '{"format": "trn-detection-labels", "version": 1, "frames": [{"frame": 0, '
                                     '"split": "val", "segment": 0, "altitude_km": 100, "sun_elevation_deg": 10, '
                                     '"lat_deg": 0, "lon_deg": 0, "boxes": [{"id": 1, "box": [9, 3, 0, 9], '
                                     '"diameter_km": 5, "sun_elevation_deg": 10, "clipped": false}]}]}')):
        (det / name).mkdir(parents=True)
        (det / name / "detection_labels.json").write_text(text, encoding="utf-8")
    for name, text in HOSTILE_LABELS.items():
        (det / name).mkdir(parents=True)
        (det / name / "detection_labels.json").write_text(text, encoding="utf-8")
    _detect_run_fixtures(root)
    for name, body in (("ok", "data: [x]\nepochs: 2\n"),
                       ("unknown_key", "data: [x]\nepochs: 2\nwings: 3\n"), ("epochs_text", "data: [x]\nepochs: many\n"),
                       ("no_data", "epochs: 2\n"), ("crop_too_big", "data: [x]\ncrop: 1024\n"),
                       ("lr_zero", "data: [x]\nlr: 0\n"), ("model_neck_float", "data: [x]\nmodel: {neck: 2.5}\n"),
                       ("not_yaml", "data: [x\n")):
        (root / "cfg" / f"det_{name}.yaml").write_text(body, encoding="utf-8")
    _deep_fixtures(fx)
    if optional:
        _world_fixtures(fx)
        _db_fixtures(fx)
        _export_fixtures(fx)
        _board_fixtures(fx)
        _geo_fixtures(fx)
    else:
        fx.missing.update({k: "not built (optional fixtures off)"
                           for k in ("world", "db", "keys", "bundle", "boards", "geo")})
    return fx


# signed manifests whose numbers no board can use: (edit, the word the refusal must name)
UNUSABLE_MANIFESTS = {
    "input_shape_0": lambda m: m["input"].update(shape=[1, 1, 0, 0]),
    "embedding_dim_0": lambda m: m.update(embedding_dim=0),
    "match_threshold_nan": lambda m: m.update(match_threshold=float("nan")),
    "match_threshold_infinity": lambda m: m.update(match_threshold=float("inf")),
}
UNUSABLE_WORDS = {"input_shape_0": "input.shape", "embedding_dim_0": "embedding_dim", "match_threshold_nan": "NaN",
                  "match_threshold_infinity": "Infinity"}

# a path nested deeper than the system takes (4,199 bytes), and documents nested far deeper than any
# config: PyYAML and Python's json read nesting by recursion
DEEP_PATH = "/".join(["d"] * 2100)
DEEP_YAML = "[" * 5000 + "]" * 5000
DEEP_JSON = "[" * 100_000 + "]" * 100_000


def _deep_fixtures(fx: Fixtures) -> None:
    """Files whose content is nested too deep: YAML configs (flow and block), JSON documents a
    command line reads (a report, a dataset's metadata, detection labels), each beside what else
    its reader needs."""
    d = fx.root / "deep"
    d.mkdir()
    (d / "config.yaml").write_text(DEEP_YAML, encoding="utf-8")
    (d / "block.yaml").write_text("".join(" " * i + "k:\n" for i in range(3000)), encoding="utf-8")
    (d / "report").mkdir()
    (d / "report" / "report.json").write_text(DEEP_JSON, encoding="utf-8")
    shutil.copytree(fx.root / "good", d / "dataset")
    (d / "dataset" / "metadata.json").write_text(DEEP_JSON, encoding="utf-8")
    (d / "labels").mkdir()
    (d / "labels" / "detection_labels.json").write_text(DEEP_JSON, encoding="utf-8")


def _world_fixtures(fx: Fixtures) -> None:
    """The tiny procedural world (4 px/deg, a short orbit; a few seconds) as a source directory,
    and one damaged copy per SOURCE_DAMAGES entry."""
    try:
        from trn.data.worlds.synth import SynthConfig, make_world

        world = fx.root / "sources" / "world"
        make_world(SynthConfig(seed=3, ppd=4, min_crater_km=30.0, orbits=0.04, step_s=30.0, n20=3000), world)
        for name, (damage, _, _) in SOURCE_DAMAGES.items():
            d = fx.root / "sources" / "damaged" / _slug(name)
            shutil.copytree(world, d)
            damage(d)
    except Exception as exc:  # noqa: BLE001 - a fixture we could not build: its cases are skipped
        fx.missing["world"] = f"{type(exc).__name__}: {exc}"


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")


def _db_fixtures(fx: Fixtures) -> None:
    try:
        from trn.db import DBConfig, LandmarkDB
        from trn.db.store import journal_path

        d = fx.root / "db"
        d.mkdir()
        rng = np.random.default_rng(3)
        good = d / "good.trndb"
        with LandmarkDB.open(good, DBConfig(dim=16)) as db:
            for _ in range(5):
                db.match_or_insert(rng.normal(size=(1, 16)).astype(np.float32))
            db.checkpoint()
            for _ in range(3):
                db.match_or_insert(rng.normal(size=(1, 16)).astype(np.float32))
        j = journal_path(good)
        for name, fn in (("flipped", lambda p: _flip(p, 0.6)), ("truncated", lambda p: p.write_bytes(p.read_bytes()[:40])),
                         ("no_journal", None), ("journal_garbage", None), ("journal_truncated", None),
                         ("unreadable", lambda p: p.chmod(0))):
            copy = d / f"{name}.trndb"
            shutil.copy(good, copy)
            shutil.copy(j, journal_path(copy))
            if fn is not None:
                fn(copy)
        journal_path(d / "no_journal.trndb").unlink()
        journal_path(d / "journal_garbage.trndb").write_bytes(np.random.default_rng(4).bytes(300))
        jt = journal_path(d / "journal_truncated.trndb")
        jt.write_bytes(jt.read_bytes()[:10])
        (fx.root / "db_journal_dir").mkdir()
        shutil.copy(good, fx.root / "db_journal_dir" / "x.trndb")
        journal_path(fx.root / "db_journal_dir" / "x.trndb").mkdir()
        fx.missing.pop("db", None)
    except Exception as exc:  # noqa: BLE001 - a fixture we could not build: its cases are skipped
        fx.missing["db"] = f"{type(exc).__name__}: {exc}"


def _export_fixtures(fx: Fixtures) -> None:
    exe = _command("trn-export")
    keys = fx.root / "keys"
    r = subprocess.run(exe + ["keygen", "--out", str(keys)], capture_output=True, text=True, cwd=fx.root,
                       env=_env(fx), timeout=120)
    if r.returncode != 0:
        fx.missing["keys"] = (r.stderr or r.stdout).strip().splitlines()[-1:]
        fx.missing["bundle"] = "no key pair"
        return
    (fx.root / "other_keys").mkdir()
    r = subprocess.run(exe + ["keygen", "--out", str(fx.root / "other_keys")], capture_output=True, text=True,
                       cwd=fx.root, env=_env(fx), timeout=120)
    shipped = REPO / "export" / "flight_conv2d_se_union"
    if not (shipped / "model_int8.tflite").is_file():
        fx.missing["bundle"] = f"no export at {shipped}"
        return
    # the TFLite part only (a Coral board's bundle): no ONNX file in it
    export = fx.root / "export_tflite"
    export.mkdir()
    for name in ("model_int8.tflite", "head.npz", "tflite_report.json", "edgetpu_report.json", "edgetpu_report.md"):
        if (shipped / name).is_file():
            shutil.copy(shipped / name, export / name)
    r = subprocess.run(exe + ["bundle", "--model", "flight_conv2d_se_union", "--export", str(export), "--key",
                              str(keys / "trn_signing_key.pem"), "--out", str(fx.root / "bundle")],
                       capture_output=True, text=True, cwd=fx.root, env=_env(fx), timeout=300)
    if r.returncode != 0:
        fx.missing["bundle"] = " ".join((r.stderr or r.stdout).strip().splitlines()[-1:])
        return
    tampered = fx.root / "bundle_tampered"
    shutil.copytree(fx.root / "bundle", tampered)
    victim = next(p for p in sorted(tampered.rglob("*"))
                  if p.is_file() and p.name != "manifest.json" and p.stat().st_size > 64)
    _flip(victim)


def _board_fixtures(fx: Fixtures) -> None:
    """Board roots for the anti-rollback cases, each flashed with versions 10, 20 and 30 of the
    signed bundle's export, then changed by someone without the key: ``current`` pointed below
    the counter or outside the root, the bundle to roll back to replaced by an older one. Also a bundle whose manifest, signed by the fixture key itself, names its model
    ``../../x``, one signed with a version above 2**53 - 1, one whose signed manifest is nested too
    deep, and a board root whose state file is."""
    if "bundle" in fx.missing:
        fx.missing["boards"] = "no signed bundle"
        return
    try:
        from trn.export.bundle import load_private_key, make_bundle, read_public_key
        from trn.hw.flash import flash, live, provision

        keys = fx.root / "keys"
        key, pub = keys / "trn_signing_key.pem", read_public_key(keys / "trn_signing_key.pub")
        exp = fx.root / "board_export"
        exp.mkdir()
        (exp / "model.onnx").write_bytes(np.random.default_rng(5).bytes(3000))
        versions = {v: make_bundle(exp, fx.root / f"board_bundle_v{v}", key, "m", 96, 512, 0.9, version=v).directory
                    for v in (10, 20, 30)}
        roots = {}
        for name in ("current_below", "current_outside", "rollback_replaced", "deep_state"):
            root = fx.root / "boards" / name
            provision(root, pub)
            dirs = {}
            for v, b in versions.items():
                flash(b, root)
                dirs[v] = live(root)
            roots[name] = (root, dirs)

        def relink(root: Path, link: str, target: Path) -> None:
            (root / link).unlink()
            os.symlink(target, root / link)

        relink(roots["current_below"][0], "current", roots["current_below"][1][10])
        shutil.copytree(roots["current_outside"][1][30], fx.root / "boards" / "outside_copy")
        relink(roots["current_outside"][0], "current", fx.root / "boards" / "outside_copy")
        root, dirs = roots["rollback_replaced"]
        shutil.rmtree(dirs[20])
        shutil.copytree(dirs[10], dirs[20])
        (roots["deep_state"][0] / "trust" / "state.json").write_text(DEEP_JSON, encoding="utf-8")
        signer = load_private_key(key)

        def resigned(name: str, manifest: bytes, source: Path = versions[10]) -> None:
            out = fx.root / name
            shutil.copytree(source, out)
            (out / "manifest.json").write_bytes(manifest)
            (out / "manifest.sig").write_bytes(signer.sign(manifest))

        doc = json.loads((versions[10] / "manifest.json").read_text(encoding="utf-8"))
        for name, change in (("bundle_model_path", {"model": "../../x"}),
                             ("bundle_version_huge", {"bundle_version": 1180591620717411303424})):
            resigned(name, (json.dumps({**doc, **change}, indent=1, sort_keys=True) + "\n").encode())
        resigned("bundle_deep_manifest", DEEP_JSON.encode())
        # the signed bundle of a real export, re-signed with numbers a board cannot use
        real = json.loads((fx.root / "bundle" / "manifest.json").read_text(encoding="utf-8"))
        for name, change in UNUSABLE_MANIFESTS.items():
            doc = json.loads(json.dumps(real))
            change(doc)  # Python's json writes NaN and Infinity
            resigned(f"bundle_{name}", (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode(), fx.root / "bundle")
    except Exception as exc:  # noqa: BLE001 - a fixture we could not build: its cases are skipped
        fx.missing["boards"] = f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------- cases


def cases(fx: Fixtures) -> list[Case]:
    p = fx.p
    out: list[Case] = []

    def add(cli: str, name: str, argv: list[str], expect: tuple[str, ...] | list[str], **kw) -> None:
        out.append(Case(cli, name, tuple(argv), tuple(expect), **kw))

    good = p("good")
    # ---- trn-data: options
    sheet = ["sheet", good, "--out", p("runs", "sheet")]
    for opt, val, exp in (("--craters", "-1", "--craters"), ("--craters", "0", "--craters"), ("--frames", "0", "--frames"),
                          ("--frames", "-2", "--frames"), ("--seed", "-1", "--seed"), ("--seed", str(2**40), "--seed"),
                          ("--craters", "many", "--craters"), ("--frames", "2.5", "--frames")):
        add("trn-data", f"sheet {opt} {val}", sheet + [opt, val], [exp])
    add("trn-data", "sheet without --out", ["sheet", good], ["--out"])
    synth = ["build", "luna1-synth", "--out", p("runs", "synth")]
    for opt, val in (("--workers", "0"), ("--workers", "100000"), ("--nav-size", "4"), ("--nav-size", "99999"),
                     ("--crater-size", "0"), ("--light-elevation", "nan"), ("--light-elevation", "95"),
                     ("--min-box", "0"), ("--min-sun-elevation", "-100"), ("--min-sun-elevation", "inf"),
                     ("--frame-view-pass-sun", "-1"), ("--frame-view-pass-sun", "45"), ("--views", "-1"),
                     ("--views", "17"), ("--frame-views", "65"), ("--segments", "0"), ("--segments", "201"),
                     ("--orbits", "0"), ("--orbits", "-3"), ("--orbits", "nan"), ("--limit-frames", "0"),
                     ("--limit-craters", "0"), ("--first-frame", "-5"), ("--seed", "-1"), ("--seed", str(2**33)),
                     ("--photometry", "phong"), ("--illumination", "sun"), ("--parts", "some")):
        add("trn-data", f"build luna1-synth {opt} {val}", synth + [opt, val], [opt])
    add("trn-data", "build luna1 --source missing", ["build", "luna1", "--source", p("no_such_source"), "--out", p("runs", "b1")],
        ["no_such_source"])
    add("trn-data", "build luna1 --source a file", ["build", "luna1", "--source", p("a_file"), "--out", p("runs", "b2")],
        ["a_file", "is a file|not a directory"])
    add("trn-data", "build luna1 --source without dem/", ["build", "luna1", "--source", p("sources", "no_dem"), "--out",
                                                           p("runs", "b3")], ["dem"])
    add("trn-data", "build luna1 --source with an empty dem/", ["build", "luna1", "--source", p("sources", "empty_dem"),
                                                                 "--out", p("runs", "b4")], ["dem"])
    for name, (_, exp, unreadable) in SOURCE_DAMAGES.items():
        add("trn-data", f"build luna1 --source: {name}", ["build", "luna1", "--source", p("sources", "damaged", _slug(name)), "--out",
                                                          p("runs", "src_" + _slug(name)), "--limit-frames", "2",
                                                          "--limit-craters", "4", "--workers", "1"],
            exp, unreadable=unreadable, needs="world", owner=TERRAIN if name.startswith(("DEM", "albedo")) else None)
    add("trn-data", "build luna1 --first-frame past the trajectory",
        ["build", "luna1", "--source", p("sources", "world"), "--out", p("runs", "b11"), "--first-frame", "100000",
         "--limit-craters", "4", "--workers", "1"], ["--first-frame|first_frame"], needs="world")
    add("trn-data", "build luna1 --catalogue unknown", ["build", "luna1", "--source", p("sources", "world"), "--out",
                                                        p("runs", "b12"), "--catalogue", "nope.csv"], ["nope.csv"],
        needs="world")
    add("trn-data", "build luna1 --max-dem-ppd 0", ["build", "luna1", "--source", p("sources", "no_dem"), "--out",
                                                     p("runs", "b6"), "--max-dem-ppd", "0"], ["--max-dem-ppd"])
    add("trn-data", "build luna1 without --source", ["build", "luna1", "--out", p("runs", "b7")], ["--source"])
    add("trn-data", "build luna1-synth --out a file", ["build", "luna1-synth", "--out", p("a_file"), "--limit-frames", "1",
                                                       "--limit-craters", "2"], ["a_file"])
    add("trn-data", "build luna1-synth --world-dir a file", ["build", "luna1-synth", "--out", p("runs", "b9"),
                                                             "--world-dir", p("a_file")], ["--world-dir", "a_file"])
    add("trn-data", "build luna1-synth --annotate-validation-of missing",
        ["build", "luna1-synth", "--out", p("runs", "b10"), "--annotate-validation-of", p("no_such_build")],
        ["--annotate-validation-of", "no_such_build"])
    add("trn-data", "build without a kind", ["build", "--out", p("runs", "b8")], ["luna1"])
    add("trn-data", "check a missing directory", ["check", p("no_such_dataset")], ["no_such_dataset", "does not exist"])
    add("trn-data", "check a file", ["check", p("a_file")], ["a_file", "not a directory"])
    add("trn-data", "check an empty directory", ["check", p("empty_dir")], ["crater_images"])
    add("trn-data", "stats of a missing directory", ["stats", p("no_such_dataset")], ["no_such_dataset"])
    add("trn-data", "stats --nms bogus", ["stats", good, "--nms", "bogus"], ["--nms"])
    add("trn-data", "stats without a directory", ["stats"], ["dirs"])
    add("trn-data", "unknown command", ["frobnicate"], ["frobnicate"])
    add("trn-data", "unknown option", ["check", good, "--decode-harder"], ["--decode-harder"])
    # ---- the damaged datasets: trn-data check, trn-sim run luna1, and trn-train --check where training reads it
    for name, (_, exp, training, unreadable) in DAMAGES.items():
        d = p("bad", _slug(name))
        add("trn-data", f"check: {name}", ["check", d], exp, unreadable=unreadable)
        add("trn-sim", f"run luna1: {name}", ["run", "luna1", "--data", d, "--model", "ncc", "--no-progress",
                                              "--threads", "1", "--out", p("runs", "sim_" + _slug(name))],
            exp, unreadable=unreadable)
        if training:
            add("trn-train", f"--check: {name}", ["--config", p("cfg", f"{_slug(name)}.yaml"), "--out",
                                                  p("runs", "train"), "--check"], exp, unreadable=unreadable)
    for name in ("zero-width box", "crater image bit flip", "annotated frame truncated", "NaN in a box"):
        d = p("bad", _slug(name))
        add("trn-data", f"sheet: {name}", ["sheet", d, "--out", p("runs", "sheet_" + _slug(name))], DAMAGES[name][1])
    for name in ("zero-height box", "pose CSV with 6 columns", "metadata.json not JSON"):
        add("trn-data", f"stats: {name}", ["stats", p("bad", _slug(name))], DAMAGES[name][1])

    # ---- trn-sim: options, on the good dataset
    run = ["run", "luna1", "--data", good, "--model", "ncc", "--no-progress", "--threads", "1"]

    def sim(name: str, extra: list[str], expect: list[str], **kw) -> None:
        add("trn-sim", name, run + ["--out", p("runs", "sim_opt_" + _slug(name))] + extra, expect, **kw)

    for opt, val in (("--threshold", "2"), ("--threshold", "nan"), ("--seed", "-1"),
                     ("--seed", str(2**40)), ("--threads", "0"), ("--max-landmarks", "1"), ("--max-frames", "0"),
                     ("--tokens", "-1"), ("--tokens", "1000"), ("--scenario", "bogus"), ("--nms", "bogus"),
                     ("--backend", "bogus"), ("--token-seeds", "bogus"), ("--world-seed", "-2"), ("--workers", "0")):
        sim(f"{opt} {val}", [opt, val], [opt])
    sim("--threshold=-inf", ["--threshold=-inf"], ["--threshold", "finite"])
    sim("--shortlist 0 with tokens", ["--tokens", "2", "--shortlist", "0"], ["--shortlist"])
    sim("--shortlist without --tokens", ["--shortlist", "5"], ["--shortlist", "--tokens"])
    sim("--token-seeds without --tokens", ["--token-seeds", "fps"], ["--token-seeds", "--tokens"])
    sim("--map without the map scenario", ["--map", p("empty_dir")], ["--map", "map_navigation"])
    sim("--map-source without the map scenario", ["--map-source", p("empty_dir")], ["--map-source", "map_navigation"])
    sim("--map-appearance without the map scenario", ["--map-appearance", "predicted"], ["--map-appearance", "map_navigation"])
    sim("--map and --map-source together", ["--scenario", "map_navigation", "--map", p("empty_dir"), "--map-source",
                                            p("empty_dir")], ["--map-source", "--map"])
    sim("--map-appearance predicted without a source", ["--scenario", "map_navigation", "--map-appearance", "predicted"],
        ["--map-source"])
    sim("--map of a directory that is not a map", ["--scenario", "map_navigation", "--map", p("empty_dir")],
        ["empty_dir"])
    sim("--map of a missing directory", ["--scenario", "map_navigation", "--map", p("no_such_map")], ["no_such_map"])
    sim("--profile without Moon Navigation", ["--scenario", "recall_at_1", "--profile", "rpi4-coral-usb3"],
        ["--profile", "moon_navigation"])
    sim("--profile unknown", ["--profile", "no-such-board"], ["no-such-board"])
    sim("--profile and --board together", ["--profile", "rpi4-coral-usb3", "--board", "127.0.0.1:9"],
        ["--profile", "--board"])
    sim("--board without a port", ["--scenario", "moon_navigation", "--board", "localhost"], ["localhost"])
    sim("--board with nothing listening", ["--scenario", "moon_navigation", "--board", "127.0.0.1:9"], ["127.0.0.1:9"])
    sim("--max-frames without a frame scenario", ["--scenario", "recall_at_1", "--max-frames", "3"], ["--max-frames"])
    sim("--nms without a frame scenario", ["--scenario", "recall_at_1", "--nms", "standard"], ["--nms"])
    sim("--max-landmarks without a landmark scenario", ["--scenario", "moon_navigation", "--max-landmarks", "5"],
        ["--max-landmarks"])
    sim("--world-seed with --data", ["--world-seed", "3"], ["--world-seed", "--data"])
    sim("--workers with --data", ["--workers", "2"], ["--workers", "--data"])
    sim("--model unknown", ["--model", "no_such_model"], ["no_such_model"])
    sim("--model an empty .pt", ["--model", p("models", "empty.pt")], ["empty.pt"])
    sim("--model a random .pt", ["--model", p("models", "random.pt")], ["random.pt"])
    sim("--model a run directory without weights", ["--model", p("models", "run_without_weights")],
        ["run_without_weights"])
    sim("--backend onnx with a file that is not ONNX", ["--backend", "onnx", "--model", p("models", "model.onnx")],
        ["model.onnx"])
    add("trn-sim", "--out is a file", run + ["--out", p("a_file")], ["a_file"])
    add("trn-sim", "run luna1 --data missing", ["run", "luna1", "--data", p("no_such_dataset"), "--model", "ncc"],
        ["no_such_dataset", "does not exist"])
    add("trn-sim", "run luna1 --data a file", ["run", "luna1", "--data", p("a_file"), "--model", "ncc"],
        ["a_file", "is a file|not a directory"])
    add("trn-sim", "run luna1 --data an empty directory", ["run", "luna1", "--data", p("empty_dir"), "--model", "ncc"],
        ["crater_images"])
    lm = ["run", "landmarks", "--model", "ncc", "--no-progress", "--threads", "1"]
    add("trn-sim", "run landmarks --data missing", lm + ["--data", p("no_such_dataset")], ["no_such_dataset", "does not exist"])
    add("trn-sim", "run landmarks --data a file", lm + ["--data", p("a_file")], ["a_file", "is a file|not a directory"])
    add("trn-sim", "run landmarks: one landmark", lm + ["--data", p("one_landmark"), "--out", p("runs", "lm1")],
        ["one_landmark", "identit"])
    add("trn-sim", "run landmarks --kind hirise on a folder", lm + ["--data", p("one_landmark"), "--kind", "hirise",
                                                                   "--out", p("runs", "lm2")], ["labels"])
    add("trn-sim", "run landmarks: malformed HiRISE labels", lm + ["--data", p("hirise_bad"), "--out", p("runs", "lm3")],
        ["labels-map-proj_v3_2.txt", "class id"])
    add("trn-sim", "run landmarks: HiRISE labels naming missing images", lm + ["--data", p("hirise_missing"), "--out",
                                                                               p("runs", "lm4")], ["gone.png"])
    add("trn-sim", "run landmarks: a corrupt image", lm + ["--data", p("folder_broken"), "--out", p("runs", "lm5")],
        ["3.png", "corrupt|decode|checksum"])
    add("trn-sim", "run landmarks --kind bogus", lm + ["--data", good, "--kind", "bogus"], ["--kind"])
    add("trn-sim", "run landmarks --scenario moon_navigation", lm + ["--data", good, "--scenario", "moon_navigation"],
        ["--scenario"])
    add("trn-sim", "map build --data missing", ["map", "build", "--data", p("no_such_dataset"), "--out", p("runs", "m1"),
                                                "--model", "ncc"], ["no_such_dataset"])
    add("trn-sim", "map build --out a file", ["map", "build", "--data", good, "--out", p("a_file"), "--model", "ncc",
                                              "--threads", "1"], ["a_file"])
    add("trn-sim", "map build --threads 0", ["map", "build", "--data", good, "--out", p("runs", "m2"), "--threads", "0"],
        ["--threads"])
    add("trn-sim", "map build --appearance predicted without --source",
        ["map", "build", "--data", good, "--out", p("runs", "m3"), "--appearance", "predicted", "--threads", "1"],
        ["--source|source"])
    add("trn-sim", "map build without metadata.json", ["map", "build", "--data", good, "--out", p("runs", "m4"),
                                                       "--threads", "1"], ["metadata.json"])
    add("trn-sim", "report of a missing directory", ["report", p("no_such_report")], ["no_such_report"])
    add("trn-sim", "report without report.json", ["report", p("reports", "no_json")], ["report.json", "missing"])
    add("trn-sim", "report.json not JSON", ["report", p("reports", "bad_json")], ["report.json", "JSON"])
    add("trn-sim", "report.json a list", ["report", p("reports", "list_json")], ["report.json"])
    add("trn-sim", "report.json with wrong fields", ["report", p("reports", "wrong_keys")], ["report.json"])
    add("trn-sim", "report.json without results", ["report", p("reports", "no_results")], ["report.json", "field"])
    add("trn-sim", "report.json with results of numbers", ["report", p("reports", "results_of_numbers")],
        ["report.json", "field"])
    add("trn-sim", "report of a file", ["report", p("a_file")], ["a_file", "is a file"])
    add("trn-sim", "run without a set", ["run"], ["luna1|landmarks"])

    # ---- trn-train
    cfg = fx.root / "cfg"
    gcfg = str(cfg / "good.yaml")

    def train(name: str, text: str | bytes | None, expect: list[str], extra: list[str] = (), config: str | None = None,
              **kw) -> None:
        path = config
        if path is None:
            path = str(cfg / f"t_{_slug(name)}.yaml")
            Path(path).write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
        add("trn-train", name, ["--config", path, "--out", p("runs", "train_" + _slug(name)), "--check", *extra],
            expect, **kw)

    head = f"data: {{kind: luna1, path: {good}}}\n"
    train("duplicated top-level key", head + "model: {preset: flight}\nepochs: 2\nepochs: 3\n",
          ["epochs", "twice", "line 4"])
    train("duplicated nested key", head + "model:\n  preset: flight\n  attention: se\n  attention: ca\n",
          ["attention", "twice", "line 5"])
    train("duplicated key in a flow mapping", f"data: {{kind: luna1, path: {good}, kind: folder}}\nmodel: {{preset: flight}}\n",
          ["kind", "twice"])
    train("duplicated section", head + "model: {preset: flight}\nmodel: {preset: flight}\n", ["model", "twice"])
    train("unknown top-level key", head + "model: {preset: flight}\nepoch: 2\n", ["epoch"])
    train("unknown nested key", head + "model: {preset: flight}\nmars: {enable: true}\n", ["enable"])
    train("epochs a string", head + "model: {preset: flight}\nepochs: ten\n", ["epochs"])
    train("epochs 0", head + "model: {preset: flight}\nepochs: 0\n", ["epochs"])
    train("epochs -1", head + "model: {preset: flight}\nepochs: -1\n", ["epochs"])
    train("batch_size 3", head + "model: {preset: flight}\nbatch_size: 3\n", ["batch_size"])
    train("lr NaN", head + "model: {preset: flight}\nlr: .nan\n", ["lr"])
    train("lr infinite", head + "model: {preset: flight}\nlr: .inf\n", ["lr"])
    train("lr negative", head + "model: {preset: flight}\nlr: -0.1\n", ["lr"])
    train("lr a quoted string", head + "model: {preset: flight}\nlr: \"1e-4\"\n", ["lr"])
    train("boolean as a string", head + "model: {preset: flight}\nmars: {enabled: \"false\"}\n", ["enabled"])
    train("seed -1", head + "model: {preset: flight}\nseed: -1\n", ["seed"])
    train("seed beyond 32 bits", head + "model: {preset: flight}\nseed: 100000000000000000000\n", ["seed"])
    train("split_seed -1", f"data: {{kind: luna1, path: {good}, split_seed: -1}}\nmodel: {{preset: flight}}\n",
          ["split_seed"])
    train("test_fraction 1.5", f"data: {{kind: luna1, path: {good}, test_fraction: 1.5}}\nmodel: {{preset: flight}}\n",
          ["test_fraction|fractions"])
    train("val_fraction NaN", f"data: {{kind: luna1, path: {good}, val_fraction: .nan}}\nmodel: {{preset: flight}}\n",
          ["val_fraction"])
    train("pair_mix of 2 numbers", head + "model: {preset: flight}\npair_mix: [1, 0]\n", ["pair_mix"])
    train("augment range reversed or short", head + "model: {preset: flight}\naugment: {angle_deg: [10]}\n",
          ["angle_deg"])
    train("data.kind bogus", f"data: {{kind: bogus, path: {good}}}\nmodel: {{preset: flight}}\n", ["kind"])
    train("data.path missing", f"data: {{kind: luna1, path: {p('no_such_dataset')}}}\nmodel: {{preset: flight}}\n",
          ["no_such_dataset", "does not exist"])
    train("data.path a file", f"data: {{kind: auto, path: {p('a_file')}}}\nmodel: {{preset: flight}}\n",
          ["a_file", "is a file|not a directory"])
    train("data.also missing", f"data: {{kind: luna1, path: {good}, also: [{p('no_such_dataset')}]}}\n"
          "model: {preset: flight}\n", ["no_such_dataset", "does not exist"])
    train("data.path empty", "data: {kind: luna1, path: ''}\nmodel: {preset: flight}\n", ["data.path"])
    train("no model section", head, ["model"])
    train("model a list", head + "model: [flight]\n", ["model"])
    train("model.preset unknown", head + "model: {preset: nope}\n", ["nope"])
    train("loss unknown", head + "model: {preset: flight}\nloss: hinge-of-doom\n", ["hinge-of-doom"])
    train("optimizer unknown", head + "model: {preset: flight}\noptimizer: sgdx\n", ["optimizer"])
    train("top level a list", "- 1\n- 2\n", ["mapping"])
    train("empty file", "", ["data"])
    train("invalid YAML", head + "model: [flight\n", ["YAML", "line"])
    train("tab-indented YAML", head + "model:\n\tpreset: flight\n", ["YAML", "line"])
    train("not UTF-8", b"data: {kind: luna1, path: \xff\xfe}\n", ["UTF-8"])
    train("config missing", None, ["no_such.yaml", "does not exist"], config=p("no_such.yaml"))
    train("config a directory", None, ["directory"], config=p("empty_dir"))
    train("config unreadable", None, ["unreadable.yaml", "permission denied"], config=p("unreadable.yaml"),
          unreadable=True)
    train("init a missing checkpoint", None, ["no_such.pt"], extra=[f"init={p('no_such.pt')}"], config=gcfg)
    train("init random bytes", None, ["random.pt"], extra=[f"init={p('models', 'random.pt')}"], config=gcfg)
    train("batch larger than the training half", None, ["batch_size", "identities"], extra=["batch_size=64"],
          config=gcfg)
    train("override without =", None, ["epochs"], extra=["epochs"], config=gcfg)
    train("override unknown key", None, ["epochz"], extra=["epochz=3"], config=gcfg)
    train("override of a bad value", None, ["epochs"], extra=["epochs=0"], config=gcfg)
    train("override NaN", None, ["lr"], extra=["lr=.nan"], config=gcfg)
    train("override not YAML", None, ["model"], extra=["model={preset: flight"], config=gcfg)
    train("override with a duplicated key", None, ["preset", "twice"], extra=["model={preset: flight, preset: tiny}"],
          config=gcfg)
    train("override into a value", None, ["epochs"], extra=["epochs.x=3"], config=gcfg)
    add("trn-train", "--stop-after 0", ["--config", gcfg, "--out", p("runs", "t1"), "--stop-after", "0"], ["--stop-after"])
    add("trn-train", "--stop-after -3", ["--config", gcfg, "--out", p("runs", "t2"), "--stop-after", "-3"], ["--stop-after"])
    add("trn-train", "without --out", ["--config", gcfg], ["--out"])
    add("trn-train", "--resume with nothing to resume", ["--config", gcfg, "--out", p("runs", "t3"), "--resume"],
        ["last.pt"])
    add("trn-train", "--out is a file", ["--config", gcfg, "--out", p("a_file")], ["a_file"])

    # ---- trn-db
    db = fx.root / "db"
    add("trn-db", "check a missing file", ["check", p("no_such.trndb")], ["no_such.trndb"])
    add("trn-db", "check a directory", ["check", p("empty_dir")], ["empty_dir", "directory"])
    add("trn-db", "check an empty file", ["check", p("empty_file")], ["empty_file"])
    add("trn-db", "check random bytes", ["check", p("random.bin")], ["random.bin"])
    add("trn-db", "check a YAML file", ["check", gcfg], ["good.yaml"])
    add("trn-db", "repair a missing file", ["repair", p("no_such.trndb")], ["no_such.trndb"])
    add("trn-db", "repair a directory", ["repair", p("empty_dir")], ["empty_dir", "directory"])
    add("trn-db", "without a command", [], ["check|repair|command"])
    add("trn-db", "check without a path", ["check"], ["path"])
    for name, exp, unreadable in (("flipped", ["flipped.trndb"], False), ("truncated", ["truncated.trndb"], False),
                                  ("no_journal", ["journal", "missing"], False),
                                  ("journal_garbage", ["journal"], False), ("journal_truncated", ["journal"], False),
                                  ("unreadable", ["unreadable.trndb", "permission denied"], True)):
        add("trn-db", f"check: snapshot {name}", ["check", str(db / f"{name}.trndb")], exp, needs="db",
            unreadable=unreadable)
    add("trn-db", "repair: snapshot flipped", ["repair", str(db / "flipped.trndb")], ["flipped.trndb"], needs="db")
    add("trn-db", "repair: snapshot unreadable", ["repair", str(db / "unreadable.trndb")],
        ["unreadable.trndb", "permission denied"], needs="db", unreadable=True)

    # ---- trn-export
    keys = fx.root / "keys"
    pub, pem = str(keys / "trn_signing_key.pub"), str(keys / "trn_signing_key.pem")
    bundle, tampered = p("bundle"), p("bundle_tampered")
    add("trn-export", "verify a missing bundle", ["verify", p("no_such_bundle"), "--pub", "00" * 32], ["no_such_bundle"])
    add("trn-export", "verify an empty directory", ["verify", p("empty_dir"), "--pub", "00" * 32], ["manifest"])
    add("trn-export", "verify a file", ["verify", p("a_file"), "--pub", "00" * 32], ["a_file"])
    add("trn-export", "verify --pub not hex", ["verify", bundle, "--pub", "zz" * 32], ["--pub|public key|hex"],
        needs="bundle")
    add("trn-export", "verify --pub too short", ["verify", bundle, "--pub", "abcd"], ["public key|--pub"], needs="bundle")
    add("trn-export", "verify --pub a missing file", ["verify", bundle, "--pub", p("no_such.pub")],
        ["no_such.pub"], needs="bundle")
    add("trn-export", "verify --pub an empty file", ["verify", bundle, "--pub", p("empty_file")], ["empty_file|public key"],
        needs="bundle")
    add("trn-export", "verify with another key", ["verify", bundle, "--pub", p("other_keys", "trn_signing_key.pub")],
        ["signature"], needs="bundle")
    add("trn-export", "verify a tampered bundle", ["verify", tampered, "--pub", pub], ["sha256|hash|signature|differ"],
        needs="bundle")
    add("trn-export", "keygen --out a file", ["keygen", "--out", p("a_file")], ["a_file", "is a file|not a directory"])
    add("trn-export", "keygen over an existing key", ["keygen", "--out", str(keys)], ["trn_signing_key.pem|exists"],
        needs="keys")
    add("trn-export", "bundle --export missing", ["bundle", "--model", "flight_conv2d_se_union", "--export",
                                                  p("no_such_export"), "--key", pem, "--out", p("runs", "bx1")],
        ["no_such_export"], needs="keys")
    add("trn-export", "bundle --key missing", ["bundle", "--model", "flight_conv2d_se_union", "--export",
                                               p("export_tflite"), "--key", p("no_such.pem"), "--out", p("runs", "bx2")],
        ["no_such.pem"], needs="bundle")
    add("trn-export", "bundle --key random bytes", ["bundle", "--model", "flight_conv2d_se_union", "--export",
                                                    p("export_tflite"), "--key", p("random.bin"), "--out", p("runs", "bx3")],
        ["random.bin|key"], needs="bundle")
    add("trn-export", "bundle of another model's export", ["bundle", "--model", "flight_ric_ca", "--export",
                                                           p("export_tflite"), "--key", pem, "--out", p("runs", "bx7")],
        ["flight_ric_ca|weights|sha256"], needs="bundle")
    add("trn-export", "bundle --threshold 2", ["bundle", "--model", "x", "--export", p("empty_dir"), "--key", pem,
                                               "--out", p("runs", "bx4"), "--threshold", "2"], ["--threshold"])
    add("trn-export", "bundle --version -1", ["bundle", "--model", "x", "--export", p("empty_dir"), "--key", pem,
                                              "--out", p("runs", "bx5"), "--version", "-1"], ["--version"])
    add("trn-export", "bundle --model unknown", ["bundle", "--model", "no_such_model", "--export", p("empty_dir"),
                                                 "--key", pem, "--out", p("runs", "bx6")], ["no_such_model|empty_dir"],
        needs="keys")
    for sub, opt, val in (("onnx", "--crops", "0"), ("onnx", "--min-cosine", "2"), ("onnx", "--threads", "0"),
                          ("onnx-int8", "--calib", "0"), ("tflite", "--calib", "-1"), ("tflite", "--min-cosine", "nan"),
                          ("tflite", "--crops", "x")):
        add("trn-export", f"{sub} {opt} {val}", [sub, "--model", "flight_conv2d_se", "--out", p("runs", "ex"), opt, val],
            [opt])
    add("trn-export", "onnx --model unknown", ["onnx", "--model", "no_such_model", "--out", p("runs", "ex1"),
                                               "--no-parity"], ["no_such_model"])
    add("trn-export", "onnx --model a random .pt", ["onnx", "--model", p("models", "random.pt"), "--out",
                                                    p("runs", "ex2"), "--no-parity"], ["random.pt"])
    add("trn-export", "tflite --model an empty .pt", ["tflite", "--model", p("models", "empty.pt"), "--out",
                                                      p("runs", "ex3")], ["empty.pt"])
    add("trn-export", "onnx without --data (parity needs crops)", ["onnx", "--model", "flight_conv2d_se", "--out",
                                                                   p("runs", "ex4")], ["--data"])

    # ---- trn-hw
    add("trn-hw", "flash a missing bundle", ["flash", p("no_such_bundle"), "--to", p("runs", "sd1"), "--pub", "00" * 32],
        ["no_such_bundle"])
    add("trn-hw", "flash an empty directory", ["flash", p("empty_dir"), "--to", p("runs", "sd2"), "--pub", "00" * 32],
        ["manifest"])
    add("trn-hw", "flash --pub not hex", ["flash", bundle, "--to", p("runs", "sd3"), "--pub", "zz" * 32],
        ["--pub|public key|hex"], needs="bundle")
    add("trn-hw", "flash --pub of another key", ["flash", bundle, "--to", p("runs", "sd4"), "--pub",
                                                 p("other_keys", "trn_signing_key.pub")], ["signature|key"], needs="bundle")
    add("trn-hw", "flash a tampered bundle", ["flash", tampered, "--to", p("runs", "sd5"), "--pub", pub],
        ["sha256|hash|signature|differ"], needs="bundle")
    add("trn-hw", "flash --to a file", ["flash", bundle, "--to", p("a_file"), "--pub", pub], ["a_file"], needs="bundle")
    add("trn-hw", "flash --to a bad ssh URL", ["flash", bundle, "--to", "ssh://", "--pub", pub], ["ssh://"],
        needs="bundle")
    add("trn-hw", "rollback --to a missing path", ["rollback", "--to", p("no_such_target")], ["no_such_target"])
    add("trn-hw", "rollback with nothing to roll back to", ["rollback", "--to", p("empty_dir")], ["previous"])
    add("trn-hw", "rollback --pub not hex", ["rollback", "--to", p("empty_dir"), "--pub", "xyz"], ["--pub|public key|hex"])
    add("trn-hw", "status --to a missing path", ["status", "--to", p("no_such_target")], ["no_such_target"])
    add("trn-hw", "status --to a file", ["status", "--to", p("a_file")], ["a_file", "is a file|not a directory"])
    agent = ["agent", "--bundle", bundle, "--pub", pub]
    for opt, val in (("--port", "-1"), ("--port", "70000"), ("--port", "http"), ("--threads", "0"),
                     ("--threads", "-4"), ("--backend", "cuda")):
        add("trn-hw", f"agent {opt} {val}", agent + [opt, val], [opt], needs="bundle", timeout=30)
    add("trn-hw", "agent --backend onnx on a bundle without ONNX", agent + ["--backend", "onnx", "--port", "0"],
        ["onnx"], needs="bundle", timeout=30)
    add("trn-hw", "agent --bundle missing", ["agent", "--bundle", p("no_such_bundle"), "--pub", "00" * 32, "--port", "0"],
        ["no_such_bundle"], timeout=30)
    add("trn-hw", "agent --bundle a file", ["agent", "--bundle", p("a_file"), "--pub", "00" * 32, "--port", "0"],
        ["a_file"], timeout=30)
    add("trn-hw", "agent --pub not hex", ["agent", "--bundle", bundle, "--pub", "nothex", "--port", "0"],
        ["--pub|public key|hex"], needs="bundle", timeout=30)
    add("trn-hw", "agent with a tampered bundle", ["agent", "--bundle", tampered, "--pub", pub, "--port", "0"],
        ["sha256|hash|signature|differ"], needs="bundle", timeout=30)
    bench = ["bench", "--board", "127.0.0.1:9", "--data", good, "--out", p("runs", "hil")]
    add("trn-hw", "bench --n 0", bench + ["--n", "0"], ["--n"])
    add("trn-hw", "bench --n -5", bench + ["--n", "-5"], ["--n"])
    add("trn-hw", "bench --warmup -1", bench + ["--warmup", "-1"], ["--warmup"])
    add("trn-hw", "bench --board without a port", ["bench", "--board", "localhost", "--data", good, "--out",
                                                   p("runs", "hil")], ["localhost"])
    add("trn-hw", "bench --board port 99999", ["bench", "--board", "127.0.0.1:99999", "--data", good, "--out",
                                               p("runs", "hil")], ["99999"])
    add("trn-hw", "bench with nothing listening", bench, ["127.0.0.1:9"])
    add("trn-hw", "unknown command", ["frobnicate"], ["frobnicate"])
    # ---- trn-detect
    for name in ("not_json", "wrong_format", "malformed_frame", "empty_box"):
        add("trn-detect", f"eval on labels: {name}", ["eval", p("models", "empty.pt"), "--data", p("detlabels", name)],
            ["empty.pt|detection labels|detection_labels.json"])
        add("trn-detect", f"sheet of labels: {name}", ["sheet", p("detlabels", name), "--out", p("runs", "s.png")],
            ["detection_labels.json"])
    for name, word in HOSTILE_LABEL_WORDS.items():
        add("trn-detect", f"eval on labels: {name}", ["eval", str(REPO / "models" / "detector"), "--data",
                                                      p("detlabels", name)], ["detection_labels.json", word])
    real = str(REPO / "models" / "detector")
    run = ["run", real, "--out", p("runs", "detect_run"), "--gsd", "0.1"]
    add("trn-detect", "run on a PNG claiming 65535 x 65535 px", run + [p("detect_run", "huge.png")],
        ["huge.png", "65535 x 65535"])
    add("trn-detect", "run on an image whose name holds a line break", run + [p("detect_run", "line\nbreak.png")],
        ["line break"])
    for name, word in (("fifo.csv", "not a regular file"), ("dir.csv", "is a directory"),
                       ("craters.geojson", "not CSV"), ("big_field.csv", "field larger than field limit")):
        add("trn-detect", f"run --catalogue {name}", run + [p("detect_run", "plain.png"), "--catalogue",
                                                           p("detect_run", name)], [name, word])
    for name in ("huge.jpg", "huge.bmp", "huge.tif"):
        add("trn-detect", f"run on a {name[5:].upper()} claiming 65535 x 65535 px", run + [p("detect_run", name)],
            [name])
    geo_run = ["run", real, "--out", p("runs", "geo_run")]
    for name in GEOTIFFS:
        add("trn-detect", f"run on a GeoTIFF: {name.replace('_', ' ')}", geo_run + [p("geo", f"{name}.tif")],
            [f"{name}.tif", "transform"], needs="geo")
    for name in ("float32_1e38", "float64_1e308"):
        add("trn-detect", f"run on a float raster of +-{name.split('_')[1]}", geo_run + [p("geo", f"{name}.tif")],
            [fx.geo_expect or "craters at score"], needs="geo", succeeds=True)
    add("trn-export", "bundle --detector whose export report is nested 100,000 deep",
        ["bundle", "--model", "flight_conv2d_se_union", "--export", p("export_tflite"), "--key",
         p("keys", "trn_signing_key.pem"), "--out", p("runs", "bundle_deep_detector"), "--detector",
         p("detect_run", "detector_deep_report")], ["export_report.json", "nested too deep"], needs="bundle")
    for name, word in UNUSABLE_WORDS.items():
        add("trn-hw", f"agent on a signed manifest with {name.replace('_', ' ')}",
            ["agent", "--bundle", p(f"bundle_{name}"), "--pub", p("keys", "trn_signing_key.pub"), "--port", "0"],
            [word], needs="boards", timeout=30)
    add("trn-detect", "run --out a file", ["run", real, p("detect_run", "plain.png"), "--out", p("a_file"), "--gsd", "0.1"],
        ["--out", "is a file"])
    add("trn-detect", "run --equirectangular with W > E", run + [p("detect_run", "plain.png"), "--equirectangular",
                                                               "10,5,0,1"], ["--equirectangular", "W < E"])
    add("trn-train", "a config integer of 5,001 digits", ["--config", p("detect_run", "cfg_5001_digits.yaml"), "--out",
                                                          p("runs", "train"), "--check"], ["5001 characters"])
    add("trn-detect", "sheet of a dir without labels", ["sheet", good, "--out", p("runs", "s.png")],
        ["detection_labels.json"])
    add("trn-detect", "eval a missing model", ["eval", p("no_such_model"), "--data", good], ["no_such_model"])
    add("trn-detect", "eval an empty checkpoint", ["eval", p("models", "empty.pt"), "--data", good], ["empty.pt"])
    add("trn-detect", "eval random bytes", ["eval", p("random.bin"), "--data", good], ["random.bin"])
    add("trn-detect", "eval a descriptor directory", ["eval", p("models", "run_without_weights"), "--data", good],
        ["run_without_weights"])
    add("trn-detect", "eval --threshold 2", ["eval", p("models", "empty.pt"), "--data", good, "--threshold", "2"],
        ["--threshold"])
    add("trn-detect", "eval --threshold nan", ["eval", p("models", "empty.pt"), "--data", good, "--threshold", "nan"],
        ["--threshold"])
    add("trn-detect", "eval --gate-km -1", ["eval", p("models", "empty.pt"), "--data", good, "--gate-km", "-1"],
        ["--gate-km"])
    add("trn-detect", "run on a missing folder", ["run", p("models", "empty.pt"), p("no_such_dir"), "--out",
                                                  p("runs", "r")], ["empty.pt|no_such_dir"])
    add("trn-detect", "run on an empty folder", ["run", p("models", "empty.pt"), p("empty_dir"), "--out",
                                                p("runs", "r")], ["empty.pt|empty_dir"])
    add("trn-detect", "label a directory that is no build", ["label", p("empty_dir"), "--source", p("empty_dir")],
        ["empty_dir"])
    add("trn-detect", "label without --source", ["label", good], ["--source"])
    add("trn-detect", "build from a missing source", ["build", "--source", p("no_such_src"), "--out", p("runs", "d")],
        ["no_such_src|trajectory"])
    add("trn-detect", "build --segments 0", ["build", "--source", good, "--out", p("runs", "d"), "--segments", "0"],
        ["--segments"])
    add("trn-detect", "build --stride -1", ["build", "--source", good, "--out", p("runs", "d"), "--stride", "-1"],
        ["--stride"])
    add("trn-detect", "build into a non-empty directory", ["build", "--source", good, "--out", good],
        ["good|not empty|trajectory"])
    add("trn-detect", "train a missing config", ["train", "--config", p("no_such.yaml"), "--out", p("runs", "t")],
        ["no_such.yaml"])
    for name, exp in (("unknown_key", ["wings"]), ("epochs_text", ["epochs"]), ("no_data", ["data"]),
                      ("crop_too_big", ["crop"]), ("lr_zero", ["lr"]), ("model_neck_float", ["neck"]),
                      ("not_yaml", ["line|YAML|yaml"])):
        add("trn-detect", f"train config: {name}", ["train", "--config", p("cfg", f"det_{name}.yaml"), "--out",
                                                     p("runs", "t_" + name)], exp)
    add("trn-detect", "train --resume with nothing to resume", ["train", "--config", p("cfg", "det_no_data.yaml"),
                                                                "--out", p("runs", "t9"), "--resume"], ["data|last.pt"])
    add("trn-detect", "ship a directory without best.pt", ["ship", p("empty_dir"), "--out", p("runs", "m")],
        ["best.pt"])
    add("trn-detect", "export a missing model", ["export", p("no_such_model"), "--out", p("runs", "e"), "--data", good],
        ["no_such_model"])
    add("trn-detect", "without a command", [], ["COMMAND|command|build"])

    # ---- what an audit found, each in one command
    tiny = p("tiny_image")
    add("trn-db", "check a journal that is a directory", ["check", p("db_journal_dir", "x.trndb")],
        ["x.trndb.journal", "is a directory, not a journal"], needs="db")
    add("trn-db", "repair a journal that is a directory", ["repair", p("db_journal_dir", "x.trndb")],
        ["x.trndb.journal", "is a directory, not a journal"], needs="db")
    add("trn-export", "onnx --model whose checksum differs after the 12th digit",
        ["onnx", "--model", p("models", "near.pt"), "--out", p("runs", "ex5"), "--no-parity"],
        [f"file {fx.near_digests[0]}", f"expected {fx.near_digests[1]}"])
    add("trn-detect", "run on a 1 x 1 image", ["run", str(REPO / "models" / "detector"), tiny, "--out", p("runs", "r1")],
        ["1.png", "image has shape (1, 1)"])
    add("trn-hw", "status of a directory that is not a board root", ["status", "--to", p("empty_dir")],
        ["empty_dir", "not a board root"])
    add("trn-hw", "rollback of a directory that is not a board root", ["rollback", "--to", p("empty_dir")],
        ["empty_dir", "not a board root"])
    add("trn-train", "unknown key names the config file", ["--config", p("cfg", "t_unknown_top_level_key.yaml"), "--out",
                                                           p("runs", "t4"), "--check"],
        ["t_unknown_top_level_key.yaml", "epoch"])
    add("trn-export", "bundle --version above 2**53 - 1",
        ["bundle", "--model", "x", "--export", p("empty_dir"), "--key", p("no.pem"), "--out", p("runs", "bx8"),
         "--version", "1180591620717411303424"], ["--version", "2**53 - 1"])
    add("trn-export", "verify a signed manifest naming its model ../../x",
        ["verify", p("bundle_model_path"), "--pub", pub], ["manifest.json", "../../x", "not a plain name"], needs="boards")
    add("trn-export", "verify a signed manifest of version 1180591620717411303424",
        ["verify", p("bundle_version_huge"), "--pub", pub], ["manifest.json", "2**53 - 1"], needs="boards")
    add("trn-hw", "flash a signed manifest of version 1180591620717411303424",
        ["flash", p("bundle_version_huge"), "--to", p("boards", "current_below")], ["2**53 - 1"], needs="boards")
    add("trn-hw", "agent on current pointed below the counter", ["agent", "--bundle", p("boards", "current_below", "current"),
                                                                 "--port", "0"], ["anti-rollback"], needs="boards",
        timeout=30)
    add("trn-hw", "agent on current pointed outside the root",
        ["agent", "--bundle", p("boards", "current_outside", "current"), "--port", "0"], ["outside"], needs="boards",
        timeout=30)
    add("trn-hw", "rollback to a bundle replaced by an older one", ["rollback", "--to", p("boards", "rollback_replaced")],
        ["previous bundle is refused", "version 20"], needs="boards")

    # ---- every path and config argument given empty, and nested deeper than anything can read
    for cli, label, argv, name, kind in path_and_config_arguments(fx):
        shown = name if name.startswith("-") else f"argument {name}"
        needs = next((fixture for fixture, part in (("boards", "board_bundle"), ("world", p("sources", "world")))
                      if any(part in a for a in argv)), None)

        def given(value: str) -> list[str]:
            return [value if a == ARG else a.replace(ARG, value) for a in argv]

        if kind == "config":  # KEY=VALUE: an empty value is YAML's null, refused for the key; a deep one too
            add(cli, f"{label} empty", given(""), [name, "expected"], needs=needs)
            add(cli, f"{label} nested too deep", given(DEEP_YAML), ["nested more than 100 levels"], needs=needs)
            continue
        add(cli, f"{label} empty", given(""), [shown, "is empty"], needs=needs)
        if kind in ("path", "file"):
            add(cli, f"{label} nested deeper than the system takes", given(DEEP_PATH), ["too long"], needs=needs)
        if kind == "name":  # a file looked up by name: not found among those there
            add(cli, f"{label} nested deeper than the system takes", given(DEEP_PATH), [name.lstrip("-"), "not found"],
                needs=needs)
    for cli, label, argv, expect in (
            ("trn-train", "--config nested too deep", ["--config", p("deep", "config.yaml"), "--out", p("runs", "t5"),
                                                       "--check"], ["config.yaml", "nested more than 100 levels"]),
            ("trn-train", "--config nested too deep by indentation",
             ["--config", p("deep", "block.yaml"), "--out", p("runs", "t6"), "--check"],
             ["block.yaml", "nested more than 100 levels"]),
            ("trn-detect", "train --config nested too deep", ["train", "--config", p("deep", "config.yaml"), "--out",
                                                              p("runs", "t7")], ["config.yaml", "nested more than 100"]),
            ("trn-sim", "report.json nested too deep", ["report", p("deep", "report")], ["report.json", "nested"]),
            ("trn-data", "check: metadata.json nested too deep", ["check", p("deep", "dataset")],
             ["metadata.json", "nested"]),
            ("trn-data", "stats: metadata.json nested too deep", ["stats", p("deep", "dataset")],
             ["metadata.json", "nested"]),
            ("trn-sim", "run luna1: metadata.json nested too deep",
             ["run", "luna1", "--data", p("deep", "dataset"), "--model", "ncc", "--no-progress", "--threads", "1",
              "--out", p("runs", "sim_deep")], ["metadata.json", "nested"]),
            ("trn-sim", "map build: metadata.json nested too deep",
             ["map", "build", "--data", p("deep", "dataset"), "--out", p("runs", "m5"), "--model", "ncc", "--threads",
              "1"], ["metadata.json", "nested"]),
            ("trn-detect", "eval on labels nested too deep", ["eval", p("models", "empty.pt"), "--data", p("deep", "labels")],
             ["empty.pt|detection_labels.json"]),
            ("trn-detect", "sheet of labels nested too deep", ["sheet", p("deep", "labels"), "--out", p("runs", "s2.png")],
             ["detection_labels.json", "nested"])):
        add(cli, label, argv, expect)
    add("trn-export", "verify a signed manifest nested too deep", ["verify", p("bundle_deep_manifest"), "--pub", pub],
        ["manifest.json", "nested"], needs="boards")
    add("trn-hw", "flash a signed manifest nested too deep", ["flash", p("bundle_deep_manifest"), "--to",
                                                              p("boards", "current_below")], ["manifest.json", "nested"],
        needs="boards")
    add("trn-hw", "status of a board whose state is nested too deep", ["status", "--to", p("boards", "deep_state")],
        ["state.json", "nested"], needs="boards")
    return out


ARG = "<ARG>"  # where path_and_config_arguments puts the value under test


def path_and_config_arguments(fx: Fixtures) -> list[tuple[str, str, list[str], str, str]]:
    """Every path and config argument of the seven command lines: (command line, label, argv with
    ``ARG`` where the value goes, the argument's name as argparse shows it (for "config", the key),
    kind). Kinds: "path" (a file or directory), "file" (a config file: YAML), "name" (a file looked
    up by name in a directory), "config" (a KEY=VALUE whose value is YAML), "value" (a name or list
    that an empty string would silently replace by the default). The other arguments are valid,
    so that the one under test is the cause."""
    p, good, pem, pub = fx.p, fx.p("good"), fx.p("keys", "trn_signing_key.pem"), fx.p("keys", "trn_signing_key.pub")
    out = p("runs", "arg")
    model = str(REPO / "models" / "detector")
    lm = ["run", "luna1", "--data", good, "--model", "ncc", "--no-progress", "--threads", "1", "--out", out]
    rows = [
        # trn-data
        ("trn-data", "build luna1 --source", ["build", "luna1", "--source", ARG, "--out", out], "--source", "path"),
        ("trn-data", "build luna1 --out", ["build", "luna1", "--source", p("sources", "no_dem"), "--out", ARG], "--out",
         "path"),
        ("trn-data", "build luna1 --catalogue", ["build", "luna1", "--source", p("sources", "world"), "--out", out,
                                                 "--catalogue", ARG], "--catalogue", "name"),
        ("trn-data", "build luna1 --annotate-validation-of", ["build", "luna1", "--source", p("sources", "no_dem"),
                                                              "--out", out, "--annotate-validation-of", ARG],
         "--annotate-validation-of", "path"),
        ("trn-data", "build luna1-synth --out", ["build", "luna1-synth", "--out", ARG], "--out", "path"),
        ("trn-data", "build luna1-synth --world-dir", ["build", "luna1-synth", "--out", out, "--world-dir", ARG],
         "--world-dir", "path"),
        ("trn-data", "check DIR", ["check", ARG], "dir", "path"),
        ("trn-data", "stats DIRS", ["stats", good, ARG], "dirs", "path"),
        ("trn-data", "sheet DIR", ["sheet", ARG, "--out", out], "dir", "path"),
        ("trn-data", "sheet --out", ["sheet", good, "--out", ARG], "--out", "path"),
        ("trn-data", "dense-catalogue --world", ["dense-catalogue", "--world", ARG], "--world", "path"),
        ("trn-data", "dense-catalogue --out", ["dense-catalogue", "--world", p("empty_dir"), "--out", ARG], "--out",
         "path"),
        # trn-sim
        ("trn-sim", "run luna1 --data", ["run", "luna1", "--data", ARG, "--model", "ncc"], "--data", "path"),
        ("trn-sim", "run luna1 --out", [*lm[:-1], ARG], "--out", "path"),
        ("trn-sim", "run luna1 --model", ["run", "luna1", "--data", good, "--model", ARG, "--out", out], "--model", "path"),
        ("trn-sim", "run luna1 --map", [*lm, "--scenario", "map_navigation", "--map", ARG], "--map", "path"),
        ("trn-sim", "run luna1 --map-source", [*lm, "--scenario", "map_navigation", "--map-source", ARG], "--map-source",
         "path"),
        ("trn-sim", "run luna1 --detector", [*lm, "--boxes", "detector", "--detector", ARG], "--detector", "path"),
        ("trn-sim", "run luna1 --boxes", [*lm, "--boxes", ARG], "--boxes", "value"),
        ("trn-sim", "run luna1 --profile", [*lm, "--scenario", "moon_navigation", "--profile", ARG], "--profile", "value"),
        ("trn-sim", "run luna1 --lis-set", [*lm, "--scenario", "lost_in_space_fix", "--lis-set", f"min_llr={ARG}"],
         "min_llr", "config"),
        ("trn-sim", "run landmarks --data", ["run", "landmarks", "--model", "ncc", "--data", ARG], "--data", "path"),
        ("trn-sim", "run landmarks --out", ["run", "landmarks", "--model", "ncc", "--data", good, "--out", ARG], "--out",
         "path"),
        ("trn-sim", "map build --data", ["map", "build", "--data", ARG, "--out", out, "--model", "ncc"], "--data", "path"),
        ("trn-sim", "map build --out", ["map", "build", "--data", good, "--out", ARG, "--model", "ncc"], "--out", "path"),
        ("trn-sim", "map build --model", ["map", "build", "--data", good, "--out", out, "--model", ARG], "--model", "path"),
        ("trn-sim", "map build --source", ["map", "build", "--data", good, "--out", out, "--model", "ncc", "--source",
                                           ARG], "--source", "path"),
        ("trn-sim", "map build --catalogue-file", ["map", "build", "--data", good, "--out", out, "--model", "ncc",
                                                   "--catalogue-file", ARG], "--catalogue-file", "path"),
        ("trn-sim", "map index --map", ["map", "index", "--map", ARG], "--map", "path"),
        ("trn-sim", "report DIR", ["report", ARG], "dir", "path"),
        # trn-train
        ("trn-train", "--config", ["--config", ARG, "--out", out, "--check"], "--config", "file"),
        ("trn-train", "--out", ["--config", p("cfg", "good.yaml"), "--out", ARG, "--check"], "--out", "path"),
        ("trn-train", "override", ["--config", p("cfg", "good.yaml"), "--out", out, "--check", f"epochs={ARG}"],
         "epochs", "config"),
        ("trn-train", "override given whole", ["--config", p("cfg", "good.yaml"), "--out", out, "--check", ARG],
         "overrides", "value"),
        # trn-db
        ("trn-db", "check PATH", ["check", ARG], "path", "path"),
        ("trn-db", "repair PATH", ["repair", ARG], "path", "path"),
        # trn-export
        *[("trn-export", f"{sub} {opt}", argv, opt, "path") for sub in ("onnx", "onnx-int8", "tflite")
          for opt, argv in (("--model", [sub, "--model", ARG, "--out", out]),
                            ("--out", [sub, "--model", "flight_conv2d_se", "--out", ARG]),
                            ("--data", [sub, "--model", "flight_conv2d_se", "--out", out, "--data", ARG]))],
        ("trn-export", "keygen --out", ["keygen", "--out", ARG], "--out", "path"),
        ("trn-export", "bundle --model", ["bundle", "--model", ARG, "--export", p("empty_dir"), "--key", pem, "--out", out],
         "--model", "path"),
        ("trn-export", "bundle --export", ["bundle", "--model", "flight_conv2d_se_union", "--export", ARG, "--key", pem,
                                           "--out", out], "--export", "path"),
        ("trn-export", "bundle --key", ["bundle", "--model", "flight_conv2d_se_union", "--export", p("empty_dir"),
                                        "--key", ARG, "--out", out], "--key", "path"),
        ("trn-export", "bundle --out", ["bundle", "--model", "flight_conv2d_se_union", "--export", p("empty_dir"),
                                        "--key", pem, "--out", ARG], "--out", "path"),
        ("trn-export", "bundle --detector", ["bundle", "--model", "flight_conv2d_se_union", "--export", p("empty_dir"),
                                             "--key", pem, "--out", out, "--detector", ARG], "--detector", "path"),
        ("trn-export", "bundle --map", ["bundle", "--model", "flight_conv2d_se_union", "--export", p("empty_dir"),
                                        "--key", pem, "--out", out, "--map", ARG], "--map", "path"),
        ("trn-export", "verify BUNDLE", ["verify", ARG, "--pub", "00" * 32], "bundle", "path"),
        ("trn-export", "verify --pub", ["verify", p("empty_dir"), "--pub", ARG], "--pub", "path"),
        # trn-hw
        ("trn-hw", "provision --to", ["provision", "--to", ARG, "--pub", "00" * 32], "--to", "path"),
        ("trn-hw", "provision --pub", ["provision", "--to", p("runs", "board_p"), "--pub", ARG], "--pub", "path"),
        ("trn-hw", "flash BUNDLE", ["flash", ARG, "--to", p("runs", "board_f")], "bundle", "path"),
        ("trn-hw", "flash --to", ["flash", p("board_bundle_v10"), "--to", ARG], "--to", "path"),
        ("trn-hw", "flash --pub", ["flash", p("board_bundle_v10"), "--to", p("runs", "board_f"), "--pub", ARG], "--pub",
         "path"),
        ("trn-hw", "rollback --to", ["rollback", "--to", ARG], "--to", "path"),
        ("trn-hw", "rollback --pub", ["rollback", "--to", p("empty_dir"), "--pub", ARG], "--pub", "path"),
        ("trn-hw", "status --to", ["status", "--to", ARG], "--to", "path"),
        ("trn-hw", "agent --bundle", ["agent", "--bundle", ARG, "--port", "0"], "--bundle", "path"),
        ("trn-hw", "agent --pub", ["agent", "--bundle", p("empty_dir"), "--pub", ARG, "--port", "0"], "--pub", "path"),
        ("trn-hw", "agent --stop-token-file", ["agent", "--bundle", p("empty_dir"), "--pub", pub, "--port", "0",
                                               "--stop-token-file", ARG], "--stop-token-file", "path"),
        ("trn-hw", "bench --data", ["bench", "--board", "127.0.0.1:9", "--data", ARG, "--out", out], "--data", "path"),
        ("trn-hw", "bench --out", ["bench", "--board", "127.0.0.1:9", "--data", good, "--out", ARG], "--out", "path"),
        ("trn-hw", "stop --token-file", ["stop", "--board", "127.0.0.1:9", "--token-file", ARG], "--token-file", "path"),
        # trn-detect
        ("trn-detect", "build --source", ["build", "--source", ARG, "--out", out], "--source", "path"),
        ("trn-detect", "build --out", ["build", "--source", good, "--out", ARG], "--out", "path"),
        ("trn-detect", "label BUILD", ["label", ARG, "--source", good], "build", "path"),
        ("trn-detect", "label --source", ["label", good, "--source", ARG], "--source", "path"),
        ("trn-detect", "sheet DIR", ["sheet", ARG, "--out", p("runs", "s3.png")], "dir", "path"),
        ("trn-detect", "sheet --out", ["sheet", p("detlabels", "not_json"), "--out", ARG], "--out", "path"),
        ("trn-detect", "train --config", ["train", "--config", ARG, "--out", out], "--config", "file"),
        ("trn-detect", "train --out", ["train", "--config", p("cfg", "det_no_data.yaml"), "--out", ARG], "--out", "path"),
        ("trn-detect", "train override", ["train", "--config", p("cfg", "det_ok.yaml"), "--out", out,
                                          f"epochs={ARG}"], "epochs", "config"),
        ("trn-detect", "eval MODEL", ["eval", ARG, "--data", good], "model", "path"),
        ("trn-detect", "eval --data", ["eval", model, "--data", ARG], "--data", "path"),
        ("trn-detect", "eval --source", ["eval", model, "--data", good, "--source", ARG], "--source", "path"),
        ("trn-detect", "eval --json", ["eval", model, "--data", good, "--json", ARG], "--json", "path"),
        ("trn-detect", "run MODEL", ["run", ARG, p("empty_dir"), "--out", out], "model", "path"),
        ("trn-detect", "run INPUTS", ["run", model, ARG, "--out", out], "inputs", "path"),
        ("trn-detect", "run --out", ["run", model, p("tiny_image"), "--out", ARG], "--out", "path"),
        ("trn-detect", "ship RUN", ["ship", ARG, "--out", out], "run", "path"),
        ("trn-detect", "ship --out", ["ship", p("empty_dir"), "--out", ARG], "--out", "path"),
        ("trn-detect", "export MODEL", ["export", ARG, "--out", out, "--data", good], "model", "path"),
        ("trn-detect", "export --out", ["export", model, "--out", ARG, "--data", good], "--out", "path"),
        ("trn-detect", "export --data", ["export", model, "--out", out, "--data", ARG], "--data", "path"),
    ]
    return rows


# ---------------------------------------------------------------- running


def _env(fx: Fixtures) -> dict:
    env = {**os.environ, "TRN_CACHE": str(fx.root / "cache"), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "COLUMNS": "200"}
    return env


def _command(cli: str) -> list[str]:
    exe = shutil.which(cli)
    if exe:
        return [exe]
    return [sys.executable, "-c", f"import sys; from {MODULES[cli]} import main; sys.exit(main())"]


def can_drop_read_override() -> bool:
    """Whether a mode-000 file is unreadable to the commands: always for an ordinary user; for root
    only under setpriv without the DAC capabilities."""
    return os.geteuid() != 0 or shutil.which("setpriv") is not None


def run_case(case: Case, fx: Fixtures, timeout: float) -> Outcome:
    if case.needs and case.needs in fx.missing:
        return Outcome(case, "skipped", None, 0.0, "", f"fixture {case.needs!r} unavailable: {fx.missing[case.needs]}")
    cmd = _command(case.cli) + list(case.argv)
    if case.unreadable and os.geteuid() == 0:
        if not shutil.which("setpriv"):
            return Outcome(case, "skipped", None, 0.0, "", "root without setpriv: mode-000 files stay readable")
        cmd = NO_DAC + cmd
    limit = case.timeout or timeout
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=fx.root, env=_env(fx),
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return Outcome(case, "silent success", None, time.perf_counter() - t0, _last(out, err),
                       f"accepted: still running after {limit:.0f} s")
    dt = time.perf_counter() - t0
    text_out, text_err = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    kind, note = classify(case, proc.returncode, text_out, text_err)
    return Outcome(case, kind, proc.returncode, dt, _last(out, err), note)


def _last(out: bytes, err: bytes) -> str:
    lines = [ln for ln in (err or out).decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1].strip()[:300] if lines else ""


def classify(case: Case, rc: int, out: str, err: str) -> tuple[str, str]:
    """(class, note) of one finished run; see the module docstring."""
    if "Traceback (most recent call last)" in err or "Traceback (most recent call last)" in out:
        return "traceback", ""
    if rc < 0:
        return "traceback", f"killed by signal {-rc}"
    text = (out + "\n" + err).lower()
    missing = [e for e in case.expect if not any(alt.lower() in text for alt in e.split("|"))]
    if case.succeeds:  # a valid input that once gave a silently wrong answer
        if rc != 0:
            return "unclear", f"exit {rc}: a valid input refused"
        return ("clear", "") if not missing else ("silent success", f"exit status 0 without {missing}")
    if rc == 0:
        return "silent success", "exit status 0"
    if missing:
        return "unclear", f"exit {rc}; does not name {missing}"
    return "clear", ""


def run_all(fx: Fixtures, selected: list[Case], jobs: int, timeout: float,
            progress: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(run_case, c, fx, timeout) for c in selected]
        results = []
        for f in futures:
            results.append(f.result())
            if progress:
                progress(results[-1])
    return results


def table(results: list[Outcome]) -> list[str]:
    lines = ["| command line | invocations | clear | traceback | silent success | unclear | skipped |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]

    def row(name: str, rs: list[Outcome]) -> str:
        ran = [r for r in rs if r.kind != "skipped"]
        counts = [sum(r.kind == k for r in ran) for k in CLASSES]
        return f"| {name} | {len(ran)} | " + " | ".join(map(str, counts)) + f" | {len(rs) - len(ran)} |"

    for cli in CLIS:
        lines.append(row(cli, [r for r in results if r.case.cli == cli]))
    lines.append(row("**total**", results))
    return lines


def _shown(argv: tuple[str, ...], root: Path) -> str:
    def one(a: str) -> str:
        a = a.replace(str(root), "$TMP")
        return a if len(a) <= 80 else f"{a[:40]}...({len(a)} characters)"

    return " ".join(shlex.quote(one(a)) for a in argv)


def report(results: list[Outcome], fx: Fixtures, seconds: float, jobs: int, timeout: float,
           command: str = "python benchmarks/reliability/bad_inputs.py") -> list[str]:
    ran = [r for r in results if r.kind != "skipped"]
    who = "root (mode-000 cases under setpriv without DAC capabilities)" if os.geteuid() == 0 else "an ordinary user"
    lines = ["# Bad inputs for the seven command lines",
             "",
             f"Command: `{command}` (each case a real subprocess; fixtures built in a temp directory, `$TMP` "
             "below; nothing under data/ read)",
             f"Date: {time.strftime('%Y-%m-%d', time.gmtime())} (UTC)",
             f"Hardware: {hardware()}",
             f"Run: {len(ran)} invocations ({len(results) - len(ran)} skipped) in {seconds:.0f} s, {jobs} at a time, "
             f"timeout {timeout:.0f} s per case; as {who}",
             ""]
    lines += table(results)
    bad = [r for r in ran if r.kind != "clear"]
    lines += ["", f"Not clear: {len(bad)}"]
    def owner_of(r: Outcome) -> str:
        return r.case.owner or OWNERS.get(r.case.cli, "trn-data / trn-sim / trn-train command lines")

    for owner in sorted({owner_of(r) for r in bad}):
        group = [r for r in bad if owner_of(r) == owner]
        lines += ["", f"## {owner}: {len(group)}"]
        for r in group:
            lines.append(f"- [{r.kind}] {r.case.cli}: {r.case.name}: `{r.case.cli} {_shown(r.case.argv, fx.root)}` "
                         f"({r.note}); last line: {r.last_line.replace(str(fx.root), '$TMP')[:300]}")
    skipped = [r for r in results if r.kind == "skipped"]
    if skipped:
        lines += ["", f"Skipped: {len(skipped)}"]
        lines += [f"- {r.case.cli}: {r.case.name} ({r.note})" for r in skipped]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2, help="cases run at a time (default 2)")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds before a case counts as accepted (default 90)")
    ap.add_argument("--only", default=None, help="comma-separated command lines to run (default: all seven)")
    ap.add_argument("--match", default=None, help="only the cases whose name contains this text")
    ap.add_argument("--all", action="store_true", help="list every case with its class and last line")
    ap.add_argument("--out", type=Path, default=None, help="also write the report to this file")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args(argv)
    if args.jobs < 1 or args.timeout <= 0:
        ap.error("--jobs needs 1 or more and --timeout a positive number")
    root = Path(tempfile.mkdtemp(prefix="trn-bad-inputs-"))
    try:
        t0 = time.perf_counter()
        fx = build_fixtures(root)
        selected = cases(fx)
        if args.only:
            wanted = set(args.only.split(","))
            selected = [c for c in selected if c.cli in wanted]
        if args.match:
            selected = [c for c in selected if args.match.lower() in c.name.lower()]
        print(f"{len(selected)} cases; fixtures in {root}" + (f" (unavailable: {fx.missing})" if fx.missing else ""),
              file=sys.stderr)

        def progress(o: Outcome) -> None:
            if o.kind not in ("clear", "skipped"):
                print(f"  {o.kind}: {o.case.cli}: {o.case.name}: {o.last_line}", file=sys.stderr)

        results = run_all(fx, selected, args.jobs, args.timeout, progress)
        command = " ".join(["python benchmarks/reliability/bad_inputs.py", *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
        lines = report(results, fx, time.perf_counter() - t0, args.jobs, args.timeout, command)
        if args.all:
            lines += ["", "Every case:"]
            lines += [f"- [{r.kind}] {r.case.cli}: {r.case.name}: {r.last_line.replace(str(root), '$TMP')}"
                      for r in results]
        print("\n".join(lines))
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
        ran = [r for r in results if r.kind != "skipped"]
        return 0 if all(r.kind == "clear" for r in ran) else 1
    finally:
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            for p in root.rglob("*"):
                try:
                    p.chmod(0o700 if p.is_dir() else 0o600)
                except OSError:
                    pass
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
