"""Real labelled crater image sets that the project can use, each fetched outside git and checked
file by file against the SHA-256 it was catalogued with (docs/real_crater_sets.md is the card of
each: source, licence, resolution, label rule).

A set comes from a public repository snapshot: a bare git directory or an ordinary checkout. :func:`install_set`
copies the set's files from it at the catalogued commit into a directory outside the work tree
and refuses any file whose hash differs; :func:`verify_set` re-checks a copy.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trn.errors import ConfigError, DataError
from trn_board.bundle import sha256_file


@dataclass(frozen=True)
class RealSet:
    """name: what the command line calls it; repo: OWNER/NAME on GitHub; commit: the catalogued
    commit; files: {path in the repository: SHA-256 hex}."""

    name: str
    repo: str
    commit: str
    files: dict[str, str]

    @property
    def mirror_name(self) -> str:
        return self.repo.replace("/", "+")


def _manifest(text: str) -> dict[str, str]:
    return {path: digest for digest, path in (line.split(None, 1) for line in text.strip().splitlines())}


# LRO NAC crops with hand-drawn crater boxes (CraterDANet; GPL-3.0): 12 training and 8 test images
CRATERDANET_NAC = RealSet("craterdanet-nac", "yizuifangxiuyh/Lunar_Crater_Detection_Data",
                          "ed5464dc1ac5973b86277157b04d2c17e599f3cf", _manifest("""
9483b41ce7559878b1107e86cccffe90c6a8bf6ea44acb35441401c4201f9be6  LRO_DATA/test/M115143943RE_cal_echo_2_2.png
2b40876863e4c2ca150260ef097b31e60761fb038b3c523b4feacf9f823338e6  LRO_DATA/test/M115143943RE_cal_echo_2_2.txt
40390a3ebf2ef457d781c5e19fb8cfe374669ab3cb0630d203a1f4034e7d855a  LRO_DATA/test/M1183658592LE_cal_echo_23_0.png
5716cbe347b55e66f409d9660b8c4845a7e50f767e1bf5e5eac871ff6cfad424  LRO_DATA/test/M1183658592LE_cal_echo_23_0.txt
cc98172db32a05b485a1a10ce59747f47c15406bfffcd18a2edcf7b090de2276  LRO_DATA/test/M1229577647LE_cal_echo_14_4.png
e797797d76940501b352cd587f80330617f2fbe35a7986285824b12adb30ef4c  LRO_DATA/test/M1229577647LE_cal_echo_14_4.txt
9604d86a1948cd06b27ed71836be3b36f04d7e9e07a544d1ef8bcf58ccdb45ab  LRO_DATA/test/M1303619844LE_cal_echo_26_2.png
bedd0a682214e5faab724f6926978c7f0b56706526dbd98cfe5ba480a0750e75  LRO_DATA/test/M1303619844LE_cal_echo_26_2.txt
24ca24a5b208f872256b5e1eb0f52fdf35902c71db62b65d7dceff0988c11ab8  LRO_DATA/test/M1303640934LE_cal_echo_map5_7_0.png
a76951040d946c8cfa2041bdef40fe5c3845fef222e6ef86ce7ed302a1d0ef2a  LRO_DATA/test/M1303640934LE_cal_echo_map5_7_0.txt
2bc6c224ad9913ed477593e99267d2dd2fde40316fd1771aa7b722d5ad37102b  LRO_DATA/test/M1305967189RE_cal_echo_11_2.png
b8795e18626b10fac36aa9c136c14feef948837c64add7cfbaec81593ce852cc  LRO_DATA/test/M1305967189RE_cal_echo_11_2.txt
0c63ad28d7220a521112549be6a725342f8ba7ee50f0463f0e02916b89d985bf  LRO_DATA/test/M1309534046LE_cal_echo_9_2.png
bc824caa4c51f1e2a7a18d844c310c2adf76a225126c80c4433b27851279e7aa  LRO_DATA/test/M1309534046LE_cal_echo_9_2.txt
6a4b1b16ed231f50b0f0b21585f08e7ff57f219a991a9861584335caec02062c  LRO_DATA/test/M161142858RE_cal_echo_1_2.png
b1d8e945854a46b92616bb49966374e44bc0d78ea626b2b29eb057ecbe5f8d13  LRO_DATA/test/M161142858RE_cal_echo_1_2.txt
25dc53d3f8d99c94896d33a111ddd0cde528a6fa6f1bc2fc8dc37afd4137555e  LRO_DATA/train/M115143943_mosaic_train_small.png
941e62a4527be39b8abcec7481d9a20658b4e05467a7876aeb2eff77babc3fb1  LRO_DATA/train/M115143943_mosaic_train_small.txt
66de57f1a582fc499c7ebc07c253646cd235d96cd1fe1b6927d27ee7f39e0f20  LRO_DATA/train/M1155395732_mosaic_train_small.png
24beff3141868c6677e67f456fa88387a98555122863cb7daf06c638efb4ecec  LRO_DATA/train/M1155395732_mosaic_train_small.txt
23bd53f99a1c86927c9289ba795ec40e0728c2cdd99213ce2060cea29b43fb71  LRO_DATA/train/M1183658592_mosaic_train_small.png
f61070cbe4e13601ed5e639dc0363e2cd5fb0e74fdae6c64eef8f0a4a2e014b8  LRO_DATA/train/M1183658592_mosaic_train_small.txt
94a49d331147e159cda9f10416f734b0d1942c232f94aa25200be47f0411af85  LRO_DATA/train/M1229577647_mosaic_train_small.png
b19901ea532981245e6e78101d5fcc70f7c4de41860cdfb064f71749fd826d48  LRO_DATA/train/M1229577647_mosaic_train_small.txt
e8e74133a29785870e79258b6d067424ffbd2670000ca5851c2bd9b35d2ecf24  LRO_DATA/train/M1231933714_mosaic_train_small.png
8b9d512d57bdddae5a530f7d4b464b9d15f3b20c521e130d1cc77125dbda7a0f  LRO_DATA/train/M1231933714_mosaic_train_small.txt
46602aafa269547f614dd9b0462c4acdc0a97d9b71c098e6865324d82f488a92  LRO_DATA/train/M1266003170_mosaic_train_small.png
4385e0678641a2dc316e824ff97b8537a305ef41c7c235587adcbd324c762910  LRO_DATA/train/M1266003170_mosaic_train_small.txt
4c4ac70095360bd38ee807bf6053bafcc6c2fee7b9a54e28e1a157f536ea38e7  LRO_DATA/train/M1275410097_mosaic_train_small.png
f87875d3507d1d688c329571a17df0928c05d7cf379e6806f774dcd5148bd4db  LRO_DATA/train/M1275410097_mosaic_train_small.txt
6f02a4b9e483c8ed283380160800fd222393cde187c70c6e615fed4873bc6aa7  LRO_DATA/train/M134022629_mosaic_train_small.png
bde5937845238622bc4d158c33407ce78526f7460674ffefbbf1298dac84de94  LRO_DATA/train/M134022629_mosaic_train_small.txt
79514ddb11bc66a9ddcfc9349008bb1df12a09b7732e1eb8e6f04f0f5a702242  LRO_DATA/train/M161142858_mosaic_train_small.png
0e10b08639b48b19e18f9181fd1b030a202ef415c6b2385f2bc4ca3d60a4ea8d  LRO_DATA/train/M161142858_mosaic_train_small.txt
66492445fa5dd34e90f0258f36693b8865eaf4969cc5751141bc121b49fdafdd  LRO_DATA/train/M161149639_mosaic_train_small.png
fc5c9b1501d4074917615492c797dca9569759f96290dd774476c31ce0d80fe3  LRO_DATA/train/M161149639_mosaic_train_small.txt
7b611c2f7b3a458ca808e0dfe1874aab45baf3f832cae04ea28185510434b074  LRO_DATA/train/M180000082_mosaic_train_small.png
66e4f00565f66aea133a9b03b9b08ade7029b85205c22aa5187570b4512fd9cf  LRO_DATA/train/M180000082_mosaic_train_small.txt
a72e6a95f00121e0ab88589e34c5ddbb2c368bb8cd32a2654d9fe560475369ed  LRO_DATA/train/M180007222_mosaic_train_small.png
1490e47d3363011986583547926ace4eb360191ebaf785e0c1ea16be495dcec6  LRO_DATA/train/M180007222_mosaic_train_small.txt
"""))

REAL_SETS = {s.name: s for s in (CRATERDANET_NAC,)}


def real_set(name: str) -> RealSet:
    if name not in REAL_SETS:
        raise ConfigError(f"unknown real image set {name!r}; known: {', '.join(sorted(REAL_SETS))}")
    return REAL_SETS[name]


def _read_from(source: Path, commit: str, path: str) -> bytes:
    """A file of the repository at ``source``: from its git objects at ``commit`` when it is a git
    directory or a checkout with one, else from the checkout's files."""
    git_dir = source if (source / "objects").is_dir() else source / ".git"
    if git_dir.is_dir():
        res = subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{commit}:{path}"], capture_output=True)
        if res.returncode != 0:
            raise DataError(f"has no {path} at commit {commit[:12]} ({res.stderr.decode(errors='replace').strip()}); "
                            "fetch the repository again", source)
        return res.stdout
    f = source / path
    if not f.is_file():
        raise DataError(f"has no {path}; give the repository's snapshot or checkout", source)
    return f.read_bytes()


def install_set(name: str, source: Path, out: Path) -> list[Path]:
    """Copy the set's files from the repository snapshot ``source`` into ``out`` (same relative
    paths), each checked against its catalogued SHA-256 before it is written; files already there
    with the right hash are kept. Returns the paths written or kept."""
    s = real_set(name)
    if not Path(source).is_dir():
        raise DataError(f"is not a directory; fetch {s.repo} first (a git snapshot or a checkout)", source)
    done = []
    for rel, digest in s.files.items():
        dst = Path(out) / rel
        if dst.is_file() and sha256_file(dst) == digest:
            done.append(dst)
            continue
        data = _read_from(Path(source), s.commit, rel)
        got = hashlib.sha256(data).hexdigest()
        if got != digest:
            raise DataError(f"{rel} has SHA-256 {got[:16]}..., the catalogue says {digest[:16]}...: not the "
                            f"catalogued file; fetch {s.repo} at {s.commit[:12]}", source)
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + ".part")
        tmp.write_bytes(data)
        tmp.replace(dst)
        done.append(dst)
    return done


def verify_set(name: str, root: Path) -> list[str]:
    """The problems of a copy of the set under ``root``: missing files and files whose SHA-256
    differs from the catalogue (empty: the copy is whole)."""
    s = real_set(name)
    problems = []
    for rel, digest in s.files.items():
        f = Path(root) / rel
        if not f.is_file():
            problems.append(f"{rel}: missing")
        elif sha256_file(f) != digest:
            problems.append(f"{rel}: SHA-256 differs from the catalogue")
    return problems


# ---------------------------------------------------------------------------------------------
# Labelled images of a set, their split, and training frames cut from them

OBSERVATION = re.compile(r"M\d+")

# craterdanet-nac, split by NAC observation (docs/real_crater_sets.md says which and why): an
# observation's every file is in one split, and observations whose numbers (mission elapsed
# seconds) lie within a day of each other are in the same split (neighbouring orbits: the same
# Sun, possibly the same ground)
CRATERDANET_NAC_SPLIT = {
    **dict.fromkeys(("M1303619844", "M1303640934", "M1305967189", "M1309534046"), "test"),
    **dict.fromkeys(("M115143943", "M161142858", "M161149639"), "val"),
    **dict.fromkeys(("M1155395732", "M1183658592", "M1229577647", "M1231933714", "M1266003170", "M1275410097",
                     "M134022629", "M180000082", "M180007222"), "train"),
}

SET_SPLITS = {"craterdanet-nac": CRATERDANET_NAC_SPLIT}


@dataclass(frozen=True)
class RealImage:
    """One labelled image of a set: path of its PNG; observation (NAC ``M`` number); split; boxes
    float32 [k, 4] (l, r, t, b) in its pixels (x = column, y = row)."""

    path: Path
    observation: str
    split: str
    boxes: np.ndarray


def observation_of(path: str | Path) -> str:
    """The NAC observation a file of the set comes from: the ``M`` and digits its name starts with."""
    m = OBSERVATION.match(Path(path).name)
    if m is None:
        raise DataError("names no NAC observation (expected a name starting with M and digits)", Path(path))
    return m.group(0)


def read_boxes(path: str | Path) -> np.ndarray:
    """float32 [k, 4] (l, r, t, b) px of a CraterDANet label file: a header, then one box a line as
    ``ID, X, Y, W, H, C_X, CY`` (top-left corner, width, height, centre), separated by commas or
    tabs. A line that is not seven numbers, or a box of no width or height, is refused by line."""
    path = Path(path)
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines()[1:], start=2):
        if not line.strip():
            continue
        parts = re.split(r"[,\t]", line.strip())
        try:
            _, x, y, w, h = (float(v) for v in parts[:5])
        except ValueError:
            raise DataError(f"line {n} is not ID, X, Y, W, H, C_X, CY numbers: {line.strip()[:60]!r}", path) from None
        if len(parts) != 7 or not (w > 0 and h > 0):
            raise DataError(f"line {n}: expected 7 fields with W, H > 0, got {line.strip()[:60]!r}", path)
        rows.append((x, x + w, y, y + h))
    return np.array(rows, np.float32).reshape(-1, 4)


def real_images(name: str, root: str | Path, split: str | None = None) -> list[RealImage]:
    """The labelled PNG images of set ``name`` under ``root`` (a checked copy), with their split
    (all splits when ``split`` is None), sorted by path."""
    s = real_set(name)
    splits = SET_SPLITS[name]
    out = []
    for rel in sorted(p for p in s.files if p.endswith(".png")):
        obs = observation_of(rel)
        if split is not None and splits[obs] != split:
            continue
        png = Path(root) / rel
        if not png.is_file():
            raise DataError(f"missing; copy the set with trn-detect real-set {name} --from SNAPSHOT --out {root}", png)
        out.append(RealImage(png, obs, splits[obs], read_boxes(png.with_suffix(".txt"))))
    return out


def write_tile_frames(images: list[RealImage], out: str | Path, factor: float, size: int = 256,
                      overlap: int = 64, min_box: float = 4.0) -> Path:
    """A detector data directory (the labels format :func:`trn.detect.train.load_frames` reads) of
    the tiles of ``images`` at ``factor`` network px per image px: each image resized by
    ``factor`` and cut into ``size`` px tiles (``overlap`` px shared, the last tile of a row or
    column ending at the image edge), a tile being one frame of ``size`` px, already at the
    network's input size, in the split of its image. A box is in the tile that holds its centre,
    clipped to the tile (``clipped`` set) and kept when both sides are at least ``min_box`` px
    there. Frames have no altitude, Sun or position (0): the set has no georeference."""
    import cv2

    from trn.data.datasets import luna1
    from trn.data.datasets.labels import LabelledBox, LabelledFrame, write_labels
    from trn.detect.tiles import _starts

    out = Path(out)
    (out / luna1.NAV_IMAGES).mkdir(parents=True, exist_ok=True)
    frames, n = [], 0
    for im in images:
        a = cv2.imread(str(im.path), cv2.IMREAD_GRAYSCALE)
        if a is None:
            raise DataError("is not a readable image", im.path)
        h0, w0 = a.shape
        h, w = (max(size, int(round(v * factor))) for v in (h0, w0))
        a = cv2.resize(a, (w, h), interpolation=cv2.INTER_AREA if factor < 1 else cv2.INTER_LINEAR)
        b = im.boxes * np.array([w / w0, w / w0, h / h0, h / h0], np.float32)
        cx, cy = (b[:, 0] + b[:, 1]) / 2, (b[:, 2] + b[:, 3]) / 2
        for y in _starts(h, size, overlap):
            for x in _starts(w, size, overlap):
                y0, x0 = int(y), int(x)
                inside = (cx >= x0) & (cx < x0 + size) & (cy >= y0) & (cy < y0 + size)
                t = b[inside] - np.array([x0, x0, y0, y0], np.float32)
                c = np.clip(t, 0, size)
                keep = (c[:, 1] - c[:, 0] >= min_box) & (c[:, 3] - c[:, 2] >= min_box)
                clipped = (t != c).any(axis=1)
                boxes = tuple(LabelledBox(int(k), tuple(int(round(v)) for v in c[k]), 0.0, 0.0, bool(clipped[k]))
                              for k in np.nonzero(keep)[0])
                boxes = tuple(bx for bx in boxes if bx.box[1] > bx.box[0] and bx.box[3] > bx.box[2])
                cv2.imwrite(str(out / luna1.NAV_IMAGES / f"{n}.png"), a[y0:y0 + size, x0:x0 + size])
                frames.append(LabelledFrame(n, im.split, 0, 0.0, 0.0, 0.0, 0.0, boxes))
                n += 1
    settings = {"kind": "real-set tiles", "images": [str(im.path) for im in images], "factor": factor,
                "tile_px": size, "overlap_px": overlap, "min_box_px": min_box}
    return write_labels(out, settings, frames)
