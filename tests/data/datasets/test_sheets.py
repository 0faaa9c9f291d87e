"""Contact sheets: counts and seeds checked before anything is read; the sheets are written."""

import cv2
import pytest

from tests.data.datasets.test_luna1 import make_dataset
from trn.data.datasets.luna1 import read_luna1
from trn.data.datasets.sheets import crater_sheet, frame_sheet, write_sheets
from trn.errors import ConfigError


@pytest.mark.parametrize("kw, match", [
    ({"n_craters": -1}, "sheet craters=-1: expected a whole number >= 1"),
    ({"n_craters": 0}, "sheet craters=0"),
    ({"n_frames": 0}, "sheet frames=0: expected a whole number >= 1"),
    ({"seed": -1}, "sheet seed=-1: expected a whole number >= 0"),
    ({"n_craters": 2.5}, "sheet craters=2.5"),
    ({"n_frames": True}, "sheet frames=True"),
])
def test_bad_counts_and_seeds_are_config_errors_before_any_read(tmp_path, kw, match):
    # the dataset does not exist: the counts are refused first
    with pytest.raises(ConfigError, match=match):
        write_sheets(tmp_path / "nope", tmp_path / "s", **kw)


def test_the_sheets_hold_the_tiles_asked_for(tmp_path):
    make_dataset(tmp_path / "d", n_frames=4)
    ds = read_luna1(tmp_path / "d")
    assert crater_sheet(ds, n=2, cols=2).shape == (4 + 36, 4 + 2 * 36, 3)  # one row of two 32-px tiles, 4-px gaps
    assert frame_sheet(ds, n=1, cols=1).shape == (72, 72, 3)
    for bad in (dict(n=0), dict(cols=0), dict(seed=-5)):
        with pytest.raises(ConfigError):
            crater_sheet(ds, **bad)
    paths = write_sheets(tmp_path / "d", tmp_path / "s" / "x", 3, 2, seed=2**40)  # numpy takes big seeds
    assert [p.name for p in paths] == ["x_craters.png", "x_frames.png"]
    assert all(cv2.imread(str(p)) is not None for p in paths)
