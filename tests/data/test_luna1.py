"""Luna-1 format: write -> read round trips, and every kind of bad input gives a clear error."""

from pathlib import Path

import cv2
import numpy as np
import pytest

from trn.data import luna1
from trn.data.luna1 import Box, FrameAnnotation
from trn.errors import DataError
from trn.geometry import matrix_to_quat, quat_to_matrix

rng = np.random.default_rng(1)


def _random_poses(n: int) -> np.ndarray:
    q = rng.normal(size=(n, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    q *= np.sign(q[:, :1])
    return np.concatenate([rng.normal(scale=1800, size=(n, 3)), q], axis=1)


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
    poses = _random_poses(n_frames)
    luna1.write_poses_csv(root / luna1.POSES_CSV, poses)
    luna1.write_poses_kitti(root / luna1.POSES_KITTI, luna1.poses_to_kitti(poses))
    return frames


def test_round_trip_identical(tmp_path):
    frames = make_dataset(tmp_path)
    ds = luna1.read_luna1(tmp_path)
    assert ds.frames == frames
    assert ds.crater_ids == [1, 5, 9]
    # writing what was read gives the same bytes
    for rel, write, arr in ((luna1.POSES_CSV, luna1.write_poses_csv, ds.poses),
                            (luna1.POSES_KITTI, luna1.write_poses_kitti, ds.kitti)):
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
    ("nav_images/0.png 1,9,3,4,5", "l <= r"),
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


def test_wrong_pose_column_count(tmp_path):
    p = tmp_path / "poses.csv"
    p.write_text("1,2,3,1,0,0,0\n1,2,3,1,0,0\n")
    with pytest.raises(DataError, match="6 columns; expected 7") as e:
        luna1.read_poses_csv(p)
    assert e.value.line == 2


def test_non_unit_quaternion_and_bad_rotation(tmp_path):
    p = tmp_path / "poses.csv"
    p.write_text("1,2,3,2,0,0,0\n")
    with pytest.raises(DataError, match="unit quaternion"):
        luna1.read_poses_csv(p)
    k = tmp_path / "kitti.txt"
    k.write_text(" ".join(["2"] * 12) + "\n")
    with pytest.raises(DataError, match="orthonormal"):
        luna1.read_poses_kitti(k)


def test_corrupt_png_and_missing_files_reported_by_check(tmp_path):
    make_dataset(tmp_path)
    (tmp_path / luna1.CRATER_DIR / "5.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    (tmp_path / luna1.NAV_IMAGES / "2.png").unlink()
    with open(tmp_path / luna1.ANNOTATIONS, "a") as f:
        f.write("nav_images/3.png 1,2,3\n")
    problems = [str(p) for p in luna1.check_luna1(tmp_path)]
    assert any("crater_images/5.png" in p and "corrupt" in p for p in problems)
    assert any("nav_images/2.png" in p and "missing" in p for p in problems)
    assert any("annotations.txt:5" in p and "twice" in p for p in problems)
    assert any("annotations.txt:5" in p and "expected id,l,r,t,b" in p for p in problems)
    with pytest.raises(DataError, match="cannot be decoded"):
        luna1.read_gray(tmp_path / luna1.CRATER_DIR / "5.png")


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
    luna1.write_poses_csv(tmp_path / luna1.POSES_CSV, _random_poses(2))
    with pytest.raises(DataError, match="has 2 poses"):
        luna1.read_luna1(tmp_path)


def test_matrix_quat_consistency_of_written_kitti(tmp_path):
    poses = _random_poses(5)
    k = luna1.poses_to_kitti(poses)
    for p, m in zip(poses, k):
        np.testing.assert_allclose(matrix_to_quat(m[:, :3]), p[3:], atol=1e-12)
