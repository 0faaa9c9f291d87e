"""Luna-1 format: write -> read round trips, and every kind of bad input gives a clear error."""

import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest

from tests.data.worlds.test_trajectory import random_poses
from trn.data.datasets import luna1
from trn.data.datasets.luna1 import Box, FrameAnnotation
from trn.data.files import read_gray
from trn.data.worlds.trajectory import poses_to_kitti, write_poses_csv, write_poses_kitti
from trn.errors import DataError
from trn.geometry import quat_to_matrix

rng = np.random.default_rng(1)


def make_dataset(root: Path, n_frames: int = 4, crater_ids=(1, 5, 9)) -> list[FrameAnnotation]:
    (root / luna1.CRATER_DIR).mkdir(parents=True)
    (root / luna1.NAV_IMAGES).mkdir(parents=True)
    for c in crater_ids:
        cv2.imwrite(str(root / luna1.CRATER_DIR / f"{c}.png"), rng.integers(0, 255, (32, 32), dtype=np.uint8))
    frames = []
    for i in range(n_frames):
        cv2.imwrite(str(root / luna1.NAV_IMAGES / f"{i}.png"), rng.integers(0, 255, (64, 64), dtype=np.uint8))
        boxes = tuple(Box(c, 2 + i, 30 + i, 4, 40) for c in crater_ids[: i % 3])
        frames.append(FrameAnnotation(i, f"nav_images/{i}.png", boxes))
    luna1.write_annotations(root / luna1.ANNOTATIONS, frames)
    poses = random_poses(n_frames)
    write_poses_csv(root / luna1.POSES_CSV, poses)
    write_poses_kitti(root / luna1.POSES_KITTI, poses_to_kitti(poses))
    return frames


def test_round_trip_identical(tmp_path):
    frames = make_dataset(tmp_path)
    ds = luna1.read_luna1(tmp_path)
    assert ds.frames == frames
    assert ds.crater_ids == [1, 5, 9]
    # writing what was read gives the same bytes
    for rel, write, arr in ((luna1.POSES_CSV, write_poses_csv, ds.poses),
                            (luna1.POSES_KITTI, write_poses_kitti, ds.kitti)):
        before = (tmp_path / rel).read_bytes()
        write(tmp_path / rel, arr)
        assert (tmp_path / rel).read_bytes() == before
    before = (tmp_path / luna1.ANNOTATIONS).read_bytes()
    luna1.write_annotations(tmp_path / luna1.ANNOTATIONS, ds.frames)
    assert (tmp_path / luna1.ANNOTATIONS).read_bytes() == before
    np.testing.assert_allclose(ds.kitti[:, :, :3], quat_to_matrix(ds.poses[:, 3:]), atol=1e-12)
    assert luna1.check_luna1(tmp_path) == []


def test_metadata_round_trip(tmp_path):
    make_dataset(tmp_path)
    meta = luna1.Luna1Metadata(source={"a": 1}, renderer={"nav_size": 64}, craters={5: {"lat": 1.5}, 1: {"lat": -3.0}},
                               frames=[{"frame": 0, "epoch_utc": "2022-09-06T00:00:00Z"}], camera={"width": 64})
    (tmp_path / luna1.METADATA).write_text(meta.to_json())
    back = luna1.read_luna1(tmp_path).metadata
    assert back == meta
    assert back.to_json() == meta.to_json()


def test_reader_works_without_metadata_and_poses(tmp_path):
    make_dataset(tmp_path)
    (tmp_path / luna1.POSES_CSV).unlink()
    (tmp_path / luna1.POSES_KITTI).unlink()
    ds = luna1.read_luna1(tmp_path)
    assert ds.poses is None and ds.metadata is None and len(ds.frames) == 4


def test_annotation_accepts_authors_variants(tmp_path):
    p = tmp_path / "annotations.txt"
    p.write_text("/abs/path/lro_navigation/nav_images/12.png 3,1.0,5.0,2,9\n\nnav_images/13.png\n")
    fr = luna1.read_annotations(p)
    assert [f.frame for f in fr] == [12, 13]
    assert fr[0].boxes == (Box(3, 1, 5, 2, 9),)


@pytest.mark.parametrize("line, match", [
    ("nav_images/0.png 1,2,3,4", "4 fields; expected id,l,r,t,b"),
    ("nav_images/0.png 1,2,x,4,5", "not a number"),
    ("nav_images/0.png 1,9,3,4,5", "l < r"),
    ("nav_images/0.png 1,3,3,4,5", r"width 0, height 1 px: a box of zero"),  # zero width
    ("nav_images/0.png 1,2,3,5,5", r"width 1, height 0 px: a box of zero"),  # zero height
    ("nav_images/0.png 1,2.4,2.4,5,9", "width 0"),  # reals rounding to a zero-width box
    ("nav_images/zero.png 1,2,3,4,5", "frame number"),
    ("nav_images/0.png 1,2,3,nan,5", "not finite"),
])
def test_malformed_annotation_line_names_file_and_line(tmp_path, line, match):
    p = tmp_path / "annotations.txt"
    p.write_text("nav_images/7.png 1,2,3,4,5\n" + line + "\n")
    with pytest.raises(DataError, match=match) as e:
        luna1.read_annotations(p)
    assert e.value.line == 2 and e.value.path == str(p)
    assert f"{p}:2" in str(e.value)


def test_duplicate_frame_is_an_error(tmp_path):
    p = tmp_path / "annotations.txt"
    p.write_text("nav_images/1.png\nnav_images/1.png\n")
    with pytest.raises(DataError, match="twice"):
        luna1.read_annotations(p)


def test_corrupt_png_and_missing_files_reported_by_check(tmp_path):
    make_dataset(tmp_path)
    (tmp_path / luna1.CRATER_DIR / "5.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    (tmp_path / luna1.NAV_IMAGES / "2.png").unlink()
    with open(tmp_path / luna1.ANNOTATIONS, "a") as f:
        f.write("nav_images/3.png 1,2,3\n")
    problems = [str(p) for p in luna1.check_luna1(tmp_path)]
    # a PNG signature followed by junk: named by what is wrong with it
    assert any("crater_images/5.png: image is truncated (it ends before its IEND chunk)" in p for p in problems)
    assert any("nav_images/2.png" in p and "missing" in p for p in problems)
    assert any("annotations.txt:5" in p and "twice" in p for p in problems)
    assert any("annotations.txt:5" in p and "expected id,l,r,t,b" in p for p in problems)
    with pytest.raises(DataError, match="image is truncated"):
        read_gray(tmp_path / luna1.CRATER_DIR / "5.png")


def test_check_flags_boxes_outside_image_and_unknown_crater(tmp_path):
    make_dataset(tmp_path)
    luna1.write_annotations(tmp_path / luna1.ANNOTATIONS, [FrameAnnotation(0, "nav_images/0.png", (Box(77, 0, 100, 0, 10),))])
    msgs = " | ".join(str(p) for p in luna1.check_luna1(tmp_path))
    assert "crater id 77" in msgs and "outside the 64x64 image" in msgs


def test_not_a_dataset(tmp_path):
    with pytest.raises(DataError, match="not a Luna-1 dataset"):
        luna1.read_luna1(tmp_path)
    with pytest.raises(DataError, match="does not exist"):
        luna1.read_luna1(tmp_path / "nope")


def test_pose_count_must_cover_frames(tmp_path):
    make_dataset(tmp_path, n_frames=4)
    write_poses_csv(tmp_path / luna1.POSES_CSV, random_poses(2))
    with pytest.raises(DataError, match="has 2 poses"):
        luna1.read_luna1(tmp_path)


# ---- the one validation of the format (scan_luna1): the check lists, the loader refuses, alike


def test_a_permission_denied_png_is_unreadable_not_corrupt(tmp_path):
    from tests import permissions

    make_dataset(tmp_path / "d")
    png = permissions.unreadable(tmp_path / "d" / luna1.CRATER_DIR / "5.png")
    code = ("from pathlib import Path; from trn.data.datasets import luna1; from trn.data.files import read_gray\n"
            f"p = Path({str(png)!r})\n"
            "print('\\n'.join(str(x) for x in luna1.check_luna1(p.parents[1])))\n"
            "print('\\n'.join(str(x) for x in luna1.check_luna1(p.parents[1], decode_images=False)))\n"
            "read_gray(p)\n")
    r = permissions.python(code)
    want = f"is unreadable: permission denied; make it readable (chmod u+r {png}) or run as its owner"
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("crater_images/5.png: image " + want) for line in lines), r.stdout
    assert "corrupt" not in r.stdout + r.stderr and "decode" not in r.stdout + r.stderr
    assert r.returncode != 0 and f"DataError: {png}: image {want}" in r.stderr


def _damaged(root: Path, how: str) -> Path:
    make_dataset(root, n_frames=4)
    ann = root / luna1.ANNOTATIONS
    if how == "zero-width box":
        ann.write_text(ann.read_text().replace("1,3,31,4,40", "1,3,3,4,40", 1))
    elif how == "zero-height box":
        ann.write_text(ann.read_text().replace("1,3,31,4,40", "1,3,31,40,40", 1))
    elif how == "empty crater_images":
        for p in (root / luna1.CRATER_DIR).iterdir():
            p.unlink()
    elif how == "crater_images a file":
        shutil.rmtree(root / luna1.CRATER_DIR)
        (root / luna1.CRATER_DIR).write_text("x")
    elif how == "crater bit flip":
        p = root / luna1.CRATER_DIR / "9.png"  # crater 9 is in no box: scenarios never read it
        b = bytearray(p.read_bytes())
        b[len(b) // 2] ^= 1
        p.write_bytes(bytes(b))
    elif how == "frame truncated":
        p = root / luna1.NAV_IMAGES / "2.png"
        p.write_bytes(p.read_bytes()[:100])
    elif how == "frame without boxes truncated":
        p = root / luna1.NAV_IMAGES / "0.png"
        p.write_bytes(p.read_bytes()[:100])
    elif how == "frame a directory":
        p = root / luna1.NAV_IMAGES / "1.png"
        p.unlink()
        p.mkdir()
    elif how == "nav a file":
        shutil.rmtree(root / luna1.NAV_DIR)
        (root / luna1.NAV_DIR).write_text("x")
    elif how == "annotations a directory":
        ann.unlink()
        ann.mkdir()
    elif how != "intact":
        raise AssertionError(how)
    return root


DAMAGES = {
    "zero-width box": "lro_navigation/annotations.txt:2: box '1,3,3,4,40': needs l < r and t < b (width 0, height 36 px",
    "zero-height box": "lro_navigation/annotations.txt:2: box '1,3,31,40,40': needs l < r and t < b (width 28, height 0 px",
    "empty crater_images": "crater_images: has no <id>.png crater landmark images",
    "crater_images a file": "crater_images: is a file, not a directory",
    "crater bit flip": "crater_images/9.png: image is corrupt (the checksum of its 'IDAT' chunk does not match)",
    "frame truncated": "lro_navigation/nav_images/2.png: image is truncated",
    "frame without boxes truncated": "lro_navigation/nav_images/0.png: image is truncated",
    "frame a directory": "lro_navigation/nav_images/1.png: image is a directory, not a file",
    "nav a file": "lro_navigation: is a file, not a directory",
    "annotations a directory": "lro_navigation/annotations.txt: is a directory, not a file",
}


@pytest.mark.parametrize("how", list(DAMAGES))
def test_check_and_the_scenario_loader_refuse_the_same_problem(tmp_path, how):
    root = _damaged(tmp_path / "d", how)
    for decode in (False, True):
        blocking = [str(p) for p in luna1.check_luna1(root, decode_images=decode) if p.blocks_scenarios]
        assert blocking and blocking[0].startswith(DAMAGES[how]), (decode, blocking)
        with pytest.raises(DataError) as e:
            luna1.read_luna1_checked(root, decode_images=decode)
        assert f"dataset has problems: {blocking[0]}" in str(e.value)


@pytest.mark.parametrize("how", ["zero-width box", "crater bit flip", "nav a file"])
def test_the_map_builder_loads_through_the_same_scan(tmp_path, how, capsys):
    """`trn-sim map build` reads its dataset with trn-sim's loader too: what the check blocks, it
    refuses before any model is loaded or any file written."""
    from trn.cli import sim as sim_cli

    root = _damaged(tmp_path / "d", how)
    assert sim_cli.main(["map", "build", "--data", str(root), "--out", str(tmp_path / "m"), "--model", "ncc",
                         "--threads", "1"]) == 2
    assert f"dataset has problems: {DAMAGES[how]}" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_an_intact_dataset_passes_both_and_the_loader_returns_what_read_luna1_reads(tmp_path):
    root = _damaged(tmp_path / "d", "intact")
    assert luna1.check_luna1(root) == [] and luna1.check_luna1(root, decode_images=False) == []
    a, b = luna1.read_luna1(root), luna1.read_luna1_checked(root)
    assert a.crater_ids == b.crater_ids and a.frames == b.frames and a.metadata == b.metadata
    np.testing.assert_array_equal(a.poses, b.poses)
    np.testing.assert_array_equal(a.kitti, b.kitti)


def test_the_loader_names_a_missing_root_or_a_file(tmp_path):
    with pytest.raises(DataError, match="dataset directory does not exist; pass --data DIR"):
        luna1.read_luna1_checked(tmp_path / "nope")
    (tmp_path / "f").write_text("x")
    with pytest.raises(DataError, match="dataset directory is a file, not a directory"):
        luna1.read_luna1_checked(tmp_path / "f")


def test_an_unreadable_crater_folder_is_named_as_such(tmp_path):
    from tests import permissions

    make_dataset(tmp_path / "d")
    (tmp_path / "d" / luna1.CRATER_DIR / "notes.txt").write_text("x")
    cdir = tmp_path / "d" / luna1.CRATER_DIR
    assert [str(p) for p in luna1.check_luna1(tmp_path / "d")] == [
        "crater_images/notes.txt: unexpected file; crater images are named <id>.png"]
    permissions.unreadable(cdir)
    try:
        r = permissions.python(f"from trn.data.datasets import luna1; print(*luna1.check_luna1({str(tmp_path / 'd')!r}), sep='\\n')")
    finally:
        cdir.chmod(0o755)
    assert r.stdout.splitlines() == [f"crater_images: folder is unreadable: permission denied; make it readable "
                                     f"(chmod u+rx {cdir}) or run as its owner"], r.stdout + r.stderr
