"""The training image bank: every landmark image read through trn.data.files.read_image, so a
file that cannot be read is named by its cause (permission denied, empty, a directory), never
reported as corrupt."""

import cv2
import numpy as np
import pytest

from trn.data.datasets.landmarks import read_luna1_landmarks
from trn.errors import DataError
from trn.train.data import ImageBank


def craters(root, n=3):
    (root / "crater_images").mkdir(parents=True)
    for i in range(n):
        cv2.imwrite(str(root / "crater_images" / f"{i}.png"), np.full((20, 20), 40 * i, np.uint8))
    return root


def test_the_bank_reads_every_image():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        root = craters(Path(d))
        bank = ImageBank(read_luna1_landmarks(root), ["0", "2"], 16)
        assert bank.images.shape == (2, 1, 16, 16) and bank.views == [[0], [1]]


@pytest.mark.parametrize("damage, match", [
    (lambda p: p.write_bytes(b""), "landmark image is empty \\(0 bytes\\)"),
    (lambda p: (p.unlink(), p.mkdir()), "landmark image is a directory, not a file"),
    (lambda p: p.write_bytes(p.read_bytes()[:60]), "landmark image is truncated"),
    (lambda p: p.write_bytes(b"not an image"), "landmark image cannot be decoded"),
])
def test_each_problem_is_named_by_its_cause(tmp_path, damage, match):
    root = craters(tmp_path)
    ls = read_luna1_landmarks(root)
    victim = root / "crater_images" / "1.png"
    damage(victim)
    with pytest.raises(DataError, match=match) as e:
        ImageBank(ls, ["0", "1", "2"], 16)
    assert e.value.path == str(victim)


def test_a_permission_denied_image_is_unreadable_not_corrupt(tmp_path):
    from tests import permissions

    root = craters(tmp_path)
    png = permissions.unreadable(root / "crater_images" / "1.png")
    code = ("from trn.data.datasets.landmarks import read_luna1_landmarks; from trn.train.data import ImageBank\n"
            f"ImageBank(read_luna1_landmarks({str(root)!r}), ['0', '1', '2'], 16)\n")
    r = permissions.python(code)
    assert r.returncode != 0
    assert r.stderr.splitlines()[-1] == (f"trn.errors.DataError: {png}: landmark image is unreadable: permission "
                                         f"denied; make it readable (chmod u+r {png}) or run as its owner"), r.stderr
