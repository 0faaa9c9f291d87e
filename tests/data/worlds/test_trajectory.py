"""Pose files: read with errors that name the file and line, written as the SPICE quaternion and
the matching KITTI [R | t]."""

import numpy as np
import pytest

from trn.data.worlds.trajectory import poses_to_kitti, read_poses_csv, read_poses_kitti
from trn.errors import DataError
from trn.geometry import matrix_to_quat

rng = np.random.default_rng(1)


def random_poses(n: int) -> np.ndarray:
    """float64 [n, 7]: random positions (km) and unit quaternions, scalar first and positive."""
    q = rng.normal(size=(n, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    q *= np.sign(q[:, :1])
    return np.concatenate([rng.normal(scale=1800, size=(n, 3)), q], axis=1)


def test_wrong_pose_column_count(tmp_path):
    p = tmp_path / "poses.csv"
    p.write_text("1,2,3,1,0,0,0\n1,2,3,1,0,0\n")
    with pytest.raises(DataError, match="6 columns; expected 7") as e:
        read_poses_csv(p)
    assert e.value.line == 2


def test_non_unit_quaternion_and_bad_rotation(tmp_path):
    p = tmp_path / "poses.csv"
    p.write_text("1,2,3,2,0,0,0\n")
    with pytest.raises(DataError, match="unit quaternion"):
        read_poses_csv(p)
    k = tmp_path / "kitti.txt"
    k.write_text(" ".join(["2"] * 12) + "\n")
    with pytest.raises(DataError, match="orthonormal"):
        read_poses_kitti(k)


def test_matrix_quat_consistency_of_written_kitti(tmp_path):
    poses = random_poses(5)
    k = poses_to_kitti(poses)
    for p, m in zip(poses, k):
        np.testing.assert_allclose(matrix_to_quat(m[:, :3]), p[3:], atol=1e-12)
