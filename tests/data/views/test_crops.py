"""Navigation crops with a margin of context around the detector's box, at the frame's edges too."""

import numpy as np
import pytest

from trn.data.views.crops import box_crop, crop_side_margin, navigation_crop, square_crop
from trn.errors import ConfigError


def _frame() -> np.ndarray:
    return np.arange(64 * 80, dtype=np.int64).reshape(64, 80)


def test_margin_square_is_centred_on_the_box():
    f = _frame()
    c = square_crop(f, (20, 40, 24, 36), margin=1.25)  # 20 x 12 box, centre (30, 30): a 25 px square
    assert c.shape == (25, 25)
    np.testing.assert_array_equal(c, f[17:42, 17:42])
    assert np.array_equal(navigation_crop(f, (20, 40, 24, 36)), box_crop(f, (20, 40, 24, 36)))
    assert np.array_equal(navigation_crop(f, (20, 40, 24, 36), 1.25), c)


def test_margin_square_at_a_frame_corner_is_mirrored_and_square():
    f = _frame()
    # a box clipped by the top-left corner (as the detector's box of a crater half out of the frame)
    c = square_crop(f, (0, 16, 0, 16), margin=1.5)
    assert c.shape == (24, 24)
    # the square runs from -4 to 20 in both axes: 4 mirrored rows and columns, then the frame
    np.testing.assert_array_equal(c[4:, 4:], f[0:20, 0:20])
    np.testing.assert_array_equal(c[3, 4:], f[1, 0:20])  # row -1 mirrors row 1
    np.testing.assert_array_equal(c[4:, 0], f[0:20, 4])  # column -4 mirrors column 4
    # the bottom-right corner likewise
    d = square_crop(f, (70, 80, 54, 64), margin=2.0)
    assert d.shape == (20, 20)
    np.testing.assert_array_equal(d[:15, :15], f[49:64, 65:80])
    np.testing.assert_array_equal(d[15, :15], f[62, 65:80])  # row 64 mirrors row 62


def test_a_margin_wider_than_the_frame_repeats_its_edge():
    f = _frame()[:10, :10]
    c = square_crop(f, (0, 10, 0, 10), margin=3.0)
    assert c.shape == (30, 30)
    np.testing.assert_array_equal(c[10:20, 10:20], f)
    assert (c[0, 10:20] == f[0]).all()


@pytest.mark.parametrize("margin", [0.5, 3.5, float("nan")])
def test_a_margin_out_of_range_is_refused(margin):
    with pytest.raises(ConfigError, match="margin"):
        square_crop(_frame(), (0, 10, 0, 10), margin)


def test_a_least_side_raises_a_small_boxs_margin_up_to_three():
    """With ``min_side`` the square is at least that many frame pixels a side: a 20 px box at 1.25
    becomes a 50 px square (margin 2.5), a 10 px box stops at 3 times its side, a 60 px box keeps
    its 75 px square; without it nothing changes."""
    f = _frame()
    assert square_crop(f, (20, 40, 24, 36), 1.25, min_side=50).shape == (50, 50)
    np.testing.assert_array_equal(square_crop(f, (20, 40, 24, 36), 1.25, min_side=50),
                                  square_crop(f, (20, 40, 24, 36), 2.5))
    assert square_crop(f, (30, 40, 30, 40), 1.25, min_side=50).shape == (30, 30)
    assert square_crop(f, (10, 70, 10, 40), 1.25, min_side=50).shape == (75, 75)
    assert np.array_equal(navigation_crop(f, (20, 40, 24, 36), None, 50), square_crop(f, (20, 40, 24, 36), 2.5))
    assert crop_side_margin(20, 1.25, 0) == 1.25 and crop_side_margin(20, 1.25, 50) == 2.5
    with pytest.raises(ConfigError, match="min_side"):
        crop_side_margin(20, 1.25, -1)
