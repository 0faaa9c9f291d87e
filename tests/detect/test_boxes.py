"""Decoding of the centre-point maps, the training targets that invert it, and frame refusals."""

import numpy as np
import pytest

from trn.detect.boxes import decode, peaks, preprocess_frame
from trn.train.detector import targets
from trn.errors import DataError


def test_peaks_are_local_maxima_in_descending_order():
    h = np.zeros((8, 8), np.float32)
    h[2, 3], h[2, 4], h[6, 6] = 0.9, 0.5, 0.7   # (2, 4) is not a maximum: its neighbour is higher
    s, r, c = peaks(h, 5)
    assert s[:2].tolist() == pytest.approx([0.9, 0.7]) and (r[0], c[0]) == (2, 3) and (r[1], c[1]) == (6, 6)
    assert 0.5 not in s.tolist()


def test_targets_decode_back_to_the_boxes():
    # boxes in px of a 128 px input; maps at stride 4 -> 32 cells; the frame is 512 px, so 4x
    boxes = np.array([[10, 42, 20, 44], [60, 124, 64, 128], [100, 112, 8, 20]], np.float32)
    heat, size, off, mask = targets(boxes, 32)
    assert mask.sum() == 3 and heat.max() == 1.0
    d = decode(heat, size, off, 4, 128, (512, 512), score_threshold=0.99)
    got = d.boxes[np.argsort(d.boxes[:, 0])]
    assert got == pytest.approx(boxes * 4, abs=1e-3)


def test_decode_clips_to_the_frame_and_thresholds():
    heat = np.zeros((16, 16), np.float32)
    heat[0, 0], heat[8, 8] = 0.8, 0.2
    size = np.full((2, 16, 16), np.log(6.0), np.float32)   # 6 cells = 24 px of a 64 px input
    off = np.zeros((2, 16, 16), np.float32)
    d = decode(heat, size, off, 4, 64, (64, 64), score_threshold=0.5)
    assert len(d) == 1 and d.boxes[0].tolist() == pytest.approx([0, 12, 0, 12])


@pytest.mark.parametrize("bad, what", [(np.zeros((0, 5)), "shape"), (np.zeros((4, 4)), "shape"),
                                       (np.zeros((16, 16, 3)), "shape"), (np.full((16, 16), np.nan), "NaN")])
def test_bad_frames_are_refused_by_name(bad, what):
    with pytest.raises(DataError, match=what):
        preprocess_frame(bad, 64)


def test_a_uniform_frame_is_not_blown_up_to_full_contrast():
    x = preprocess_frame(np.full((32, 32), 100, np.uint8) + np.eye(32, dtype=np.uint8), 32)
    assert np.abs(x).max() < 8.0 and abs(float(x.mean())) < 1e-5
