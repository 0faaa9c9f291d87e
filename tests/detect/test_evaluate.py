"""Detector metrics against hand-computed cases: IoU, greedy matching, COCO AP@0.5, P/R/F1."""

import numpy as np
import pytest

from trn.detect.boxes import iou_matrix, nms_boxes
from trn.detect.evaluate import THRESHOLD_GRID, average_precision, best_f1_threshold, match_frame, pr_curve, summarise


def test_iou_by_hand():
    a = np.array([[0, 10, 0, 10]], float)            # l, r, t, b: a 10 x 10 square
    b = np.array([[5, 15, 0, 10], [20, 30, 20, 30], [0, 10, 0, 10]], float)
    # half overlap: 50 / (100 + 100 - 50) = 1/3; disjoint: 0; identical: 1
    assert iou_matrix(a, b) == pytest.approx(np.array([[1 / 3, 0.0, 1.0]]))


def test_matching_is_greedy_by_score_and_one_to_one():
    gt = np.array([[0, 10, 0, 10]], float)
    dets = np.array([[0, 10, 0, 9], [0, 10, 0, 10]], float)   # IoU 0.9 and 1.0
    m = match_frame(dets, np.array([0.9, 0.5]), gt)
    # the higher score takes the label although the other box fits better; the second is a false positive
    assert m.det_hit.tolist() == [True, False] and m.gt_hit.tolist() == [True]


def test_a_detection_below_iou_half_is_not_a_hit():
    m = match_frame(np.array([[5, 15, 0, 10]], float), np.array([0.9]), np.array([[0, 10, 0, 10]], float))
    assert not m.det_hit[0] and not m.gt_hit[0]


def test_average_precision_by_hand():
    # ranked hits T, F, T over 2 labels: precision 1, 1/2, 2/3 at recall 1/2, 1/2, 1;
    # monotone precision: 1 up to recall 0.5, 2/3 beyond; 101 points: 51 at 1, 50 at 2/3
    ap = average_precision(np.array([0.9, 0.8, 0.7]), np.array([True, False, True]), 2)
    assert ap == pytest.approx((51 * 1.0 + 50 * 2 / 3) / 101)
    # a label never found: recall stops at 1/2, so the points above 0.5 count 0
    assert average_precision(np.array([0.9]), np.array([True]), 2) == pytest.approx(51 / 101)
    assert average_precision(np.zeros(0), np.zeros(0, bool), 3) == 0.0
    assert np.isnan(average_precision(np.array([0.5]), np.array([False]), 0))


def test_precision_recall_f1_at_a_threshold():
    gt = np.array([[0, 10, 0, 10], [20, 30, 20, 30]], float)
    dets = np.array([[0, 10, 0, 10], [50, 60, 50, 60], [20, 30, 20, 30]], float)
    m = match_frame(dets, np.array([0.9, 0.6, 0.3]), gt)
    s = summarise([m], 0.5)
    assert (s.detections, s.hits, s.labels) == (2, 1, 2)
    assert (s.precision, s.recall) == (0.5, 0.5) and s.f1 == pytest.approx(0.5)
    s = summarise([m], 0.2)
    assert s.precision == pytest.approx(2 / 3) and s.recall == 1.0
    assert best_f1_threshold([m], np.array([0.2, 0.5, 0.95])) == 0.2
    curve = pr_curve([m], np.array([0.2, 0.5, 0.95]))
    assert curve[:2] == [[0.2, 0.6667, 1.0], [0.5, 0.5, 0.5]]
    assert curve[2][0] == 0.95 and np.isnan(curve[2][1]) and curve[2][2] == 0.0  # no detection left: no precision
    assert [row[0] for row in pr_curve([m])] == THRESHOLD_GRID.tolist()


def test_nms_keeps_the_best_of_overlapping_boxes():
    boxes = np.array([[0, 10, 0, 10], [1, 11, 0, 10], [30, 40, 30, 40]], float)
    kept = nms_boxes(boxes, np.array([0.5, 0.9, 0.4]), 0.5)
    assert kept.tolist() == [1, 2]


def test_detections_on_ignored_labels_count_neither_way() -> None:
    from trn.detect.evaluate import match_frame_ignoring

    gt = np.array([[0, 10, 0, 10]], np.float32)
    ignored = np.array([[50, 70, 50, 70]], np.float32)
    det = np.array([[0, 10, 0, 10], [50, 70, 51, 70], [100, 110, 100, 110]], np.float32)
    scores = np.array([0.9, 0.8, 0.7])
    m = match_frame_ignoring(det, scores, gt, ignored)
    # the detection on the ignored crater is left out: one hit, one false detection, one label
    assert m.scores.tolist() == [0.9, 0.7] and m.det_hit.tolist() == [True, False] and m.gt_hit.tolist() == [True]
    s = summarise([m], 0.5)
    assert (s.precision, s.recall) == (0.5, 1.0)
    plain = match_frame(det, scores, gt)
    assert summarise([plain], 0.5).precision == pytest.approx(1 / 3)


def test_small_unmatched_detections_are_left_out_over_the_labelled_size_range() -> None:
    from trn.detect.evaluate import match_frame_min_side

    gt = np.array([[0, 6, 0, 6], [20, 32, 20, 32], [60, 90, 60, 90]], np.float32)   # 6, 12 and 30 px
    det = np.array([[0, 6, 0, 6],            # 6 px on the 6 px label: a hit, whatever its size
                    [40, 45, 40, 45],        # 5 px on nothing: left out
                    [100, 107, 100, 108],    # sqrt(7 x 8) = 7.48 px on nothing: left out
                    [20, 32, 20, 32],        # a hit
                    [200, 208, 200, 208],    # 8 px on nothing: false
                    [300, 320, 300, 320]],   # 20 px on nothing: false
                   np.float32)
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    m = match_frame_min_side(det, scores, gt, 8.0)
    assert m.scores.tolist() == [0.9, 0.6, 0.5, 0.4] and m.det_hit.tolist() == [True, True, False, False]
    assert m.gt_hit.tolist() == [True, True, False]
    s = summarise([m], 0.45)
    assert (s.detections, s.hits, s.precision, s.recall) == (3, 2, 2 / 3, 2 / 3)
    plain = summarise([match_frame(det, scores, gt)], 0.45)
    assert (plain.detections, plain.precision, plain.recall) == (5, 2 / 5, 2 / 3)


def test_large_unmatched_detections_are_left_out_above_the_labelled_size_range() -> None:
    from trn.detect.evaluate import match_frame_min_side

    gt = np.array([[0, 12, 0, 12], [100, 160, 100, 160]], np.float32)        # 12 and 60 px
    det = np.array([[100, 160, 100, 160],    # 60 px on the 60 px label: a hit, over the range or not
                    [300, 380, 300, 380],    # 80 px on nothing, over 50 px: left out
                    [500, 550, 500, 550],    # 50 px on nothing: false (the range is inclusive)
                    [600, 609, 600, 609]],   # 9 px on nothing, under 10 px: left out
                   np.float32)
    scores = np.array([0.9, 0.8, 0.7, 0.6])
    m = match_frame_min_side(det, scores, gt, 10.0, max_side=50.0)
    assert m.scores.tolist() == [0.9, 0.7] and m.det_hit.tolist() == [True, False]
    assert m.gt_hit.tolist() == [False, True]
    unbounded = match_frame_min_side(det, scores, gt, 10.0)
    assert unbounded.scores.tolist() == [0.9, 0.8, 0.7]


def test_matching_in_chunks_is_the_whole_matrix_greedy_match(monkeypatch):
    """Many detections against many labels: the chunked rows give exactly the greedy match of the
    whole IoU matrix (a reference written here), ties in score included."""
    import trn.detect.evaluate as ev
    from trn.detect.boxes import iou_matrix

    rng = np.random.default_rng(0)

    def boxes(n):
        xy = rng.uniform(0, 300, (n, 2))
        side = rng.uniform(4, 40, (n, 1))
        return np.hstack([xy[:, :1], xy[:, :1] + side, xy[:, 1:], xy[:, 1:] + side])

    gt = boxes(400)
    det = np.vstack([gt[rng.permutation(400)[:300]] + rng.normal(0, 2, (300, 4)), boxes(900)])
    scores = np.round(rng.uniform(0, 1, len(det)), 2)  # ties
    iou = iou_matrix(det, gt)
    hit, label, taken = np.zeros(len(det), bool), np.full(len(det), -1), np.zeros(len(gt), bool)
    for i in np.argsort(-scores, kind="stable"):
        cand = np.where(taken, -1.0, iou[i])
        j = int(np.argmax(cand))
        if cand[j] >= 0.5:
            hit[i], label[i], taken[j] = True, j, True
    monkeypatch.setattr(ev, "MATCH_CHUNK", 7)
    m = match_frame(det, scores, gt)
    assert hit.sum() > 200
    np.testing.assert_array_equal(m.det_hit, hit)
    np.testing.assert_array_equal(m.det_label, label)
    np.testing.assert_array_equal(m.gt_hit, taken)
