"""The detector on images of any size: the scale, the tile grid, merging across seams, the
whole-image NMS against the board's, the one-tile case against the frame path, and a 4000 x 4000
image run whole with the tile batch as its only large allocation; several scales, each keeping
its band of sizes, merged by the one NMS."""

import math
import tracemalloc

import cv2
import numpy as np
import pytest

from trn.detect.boxes import iou_matrix, nms_boxes
from trn.detect.model import STRIDE, CraterDetector, DetectorConfig
from trn.detect.tiles import (REFERENCE_CRATER_PX, REFERENCE_GSD_KM, ArraySource, ImageScale, ScaleBand, box_side,
                              choose_scale, default_bands, detect_multiscale, detect_tiled, nms_large, tile_boxes,
                              tile_grid, torch_maps)
from trn.train.detector import targets
from trn.errors import ConfigError


def test_scale_from_ground_sampling_crater_sizes_or_an_explicit_factor():
    assert choose_scale(gsd_km=REFERENCE_GSD_KM / 2).factor == pytest.approx(0.5)
    s = choose_scale(crater_px=(12, 80))
    assert math.sqrt(12 * 80) * s.factor == pytest.approx(math.sqrt(REFERENCE_CRATER_PX[0] * REFERENCE_CRATER_PX[1]))
    assert "12-80 image px" in s.describe()
    assert choose_scale(gsd_km=0.1, crater_px=(12, 80), factor=3.0).factor == 3.0
    default = choose_scale()
    assert default.factor == 0.5 and "navigation-camera frame" in default.describe()
    with pytest.raises(ConfigError, match="MIN <= MAX"):
        choose_scale(crater_px=(80, 12))
    with pytest.raises(ConfigError, match="expected 0.001 to 64"):
        ImageScale(0.0, "x")


@pytest.mark.parametrize("shape, factor, overlap", [((1700, 1700), 1.26, 96), ((300, 900), 0.5, 32), ((100, 90), 3.0, 0),
                                                    ((512, 512), 0.5, 96)])
def test_tiles_cover_the_image_and_neighbours_share_the_overlap(shape, factor, overlap):
    tiles = tile_grid(shape, factor, 256, overlap)
    cover = np.zeros(shape, np.int32)
    for t in tiles:
        assert 1 <= t.w <= 256 and 1 <= t.h <= 256
        assert t.w == min(256, round((t.c1 - t.c0) * factor)) and t.h == min(256, round((t.r1 - t.r0) * factor))
        cover[t.r0:t.r1, t.c0:t.c1] += 1
    assert cover.min() >= 1
    starts = sorted({t.c0 for t in tiles})
    ends = sorted({t.c1 for t in tiles})
    for a, b in zip(ends[:-1], starts[1:]):
        assert a - b >= math.floor(overlap / factor)   # the next tile starts at least `overlap` input px back


def test_the_whole_image_nms_equals_the_board_s_on_random_boxes():
    rng = np.random.default_rng(0)
    for n in (0, 1, 50, 400):
        xy = rng.uniform(0, 500, (n, 2))
        wh = rng.uniform(2, 80, (n, 2))
        boxes = np.stack([xy[:, 0], xy[:, 0] + wh[:, 0], xy[:, 1], xy[:, 1] + wh[:, 1]], axis=1).astype(np.float32)
        scores = rng.choice(np.linspace(0.1, 1, 20), n).astype(np.float32)   # ties too
        for thr in (0.3, 0.5):
            assert nms_large(boxes, scores, thr).tolist() == nms_boxes(boxes, scores, thr).tolist()
            assert nms_large(boxes, scores, thr, cell=7.0).tolist() == nms_boxes(boxes, scores, thr).tolist()


def _tile_targets(b, t, out, heat, sz, off, k):
    """Write into row k of the maps the training targets of image boxes ``b`` (l, r, t, b) as far
    as they show in tile ``t``: moved and scaled into it, clipped at its edges."""
    b = np.stack([(b[:, 0] - t.c0) * t.fx, (b[:, 1] - t.c0) * t.fx, (b[:, 2] - t.r0) * t.fy,
                  (b[:, 3] - t.r0) * t.fy], axis=1)
    b[:, :2] = np.clip(b[:, :2], 0, t.w)
    b[:, 2:] = np.clip(b[:, 2:], 0, t.h)
    b = b[(b[:, 1] - b[:, 0] >= 2) & (b[:, 3] - b[:, 2] >= 2)].astype(np.float32)
    if len(b):
        heat[k, 0], sz[k], off[k], _ = targets(b, out)


def oracle(image_shape, craters, factor, size, overlap):
    """A perfect detector for the tiler: for each tile, in the order the tiler runs them, the
    training targets (:func:`trn.train.detector.targets`) of the crater boxes as far as they show in
    that tile (clipped at its edges, as a real network sees a cut crater)."""
    tiles = iter(tile_grid(image_shape, factor, size, overlap))

    def maps(x):
        n, out = len(x), size // STRIDE
        heat, sz, off = np.zeros((n, 1, out, out), np.float32), np.zeros((n, 2, out, out), np.float32), \
            np.zeros((n, 2, out, out), np.float32)
        for k in range(n):
            t = next(tiles)
            b = np.array(craters, np.float64)
            _tile_targets(b, t, out, heat, sz, off, k)
        return heat, sz, off

    return maps


def test_a_crater_cut_by_a_tile_seam_comes_out_as_one_box():
    shape, factor, size, overlap = (400, 600), 1.0, 128, 48
    tiles = tile_grid(shape, factor, size, overlap)
    seam = tiles[0].c1            # the first tile's right edge, inside the second tile
    corner_r, corner_c = tiles[0].r1, seam
    craters = [[seam - 20, seam + 20, 40, 80],                    # across a vertical seam
               [corner_c - 15, corner_c + 15, corner_r - 15, corner_r + 15],   # across a corner of four tiles
               [300, 330, 300, 330]]                                # whole in its tiles
    assert tiles[0].inner[1] and craters[0][0] < seam < craters[0][1]
    run = detect_tiled(oracle(shape, craters, factor, size, overlap), ArraySource(np.zeros(shape, np.uint8)),
                       ImageScale(factor, "test"), size, STRIDE, 0.5, overlap=overlap, batch=3)
    got = run.detections.boxes
    assert len(got) == 3, got
    iou = iou_matrix(np.array(craters, np.float32), got)
    assert (iou.max(axis=1) > 0.9).all()
    # without the seam rule the cut crater's part in the first tile would survive the NMS as a second box
    assert iou_matrix(np.array([[craters[0][0], seam, 40, 80]], np.float32), np.array([craters[0]], np.float32))[0, 0] <= 0.5


def test_a_small_crater_inside_a_large_cut_one_keeps_both():
    shape, factor, size, overlap = (128, 400), 1.0, 128, 32
    seam = tile_grid(shape, factor, size, overlap)[0].c1
    craters = [[seam - 60, seam + 40, 14, 114], [seam + 5, seam + 25, 50, 70]]   # a 20 px crater in a 100 px one
    run = detect_tiled(oracle(shape, craters, factor, size, overlap), ArraySource(np.zeros(shape, np.uint8)),
                       ImageScale(factor, "test"), size, STRIDE, 0.5, overlap=overlap)
    assert len(run.detections) == 2 and (iou_matrix(np.array(craters, np.float32), run.detections.boxes).max(1) > 0.9).all()


def test_a_crater_larger_than_the_overlap_across_a_seam_is_still_one_box():
    shape, factor, size, overlap = (128, 400), 1.0, 128, 32
    tiles = tile_grid(shape, factor, size, overlap)
    seam = tiles[0].c1
    craters = [[seam - 50, seam + 40, 20, 110]]       # 90 px wide, the overlap 32
    run = detect_tiled(oracle(shape, craters, factor, size, overlap), ArraySource(np.zeros(shape, np.uint8)),
                       ImageScale(factor, "test"), size, STRIDE, 0.5, overlap=overlap)
    assert len(run.detections) == 1


def bowls(shape, centres, radii, seed=0):
    """uint8 image of crater-like bowls lit from the left (a dark and a bright half-rim) on noise."""
    rng = np.random.default_rng(seed)
    img = np.full(shape, 120, np.float32) + rng.normal(0, 4, shape).astype(np.float32)
    for (cx, cy), r in zip(centres, radii):
        r0, r1 = max(0, int(cy - 1.3 * r)), min(shape[0], int(cy + 1.3 * r) + 1)
        c0, c1 = max(0, int(cx - 1.3 * r)), min(shape[1], int(cx + 1.3 * r) + 1)
        yy, xx = np.mgrid[r0:r1, c0:c1].astype(np.float32)
        d = np.hypot(xx - cx, yy - cy) / r
        inside = d < 1.0
        shade = np.where(inside, -60.0 * (xx - cx) / r, 0.0) * (1 - d ** 4)
        rim = np.where((d >= 0.85) & (d < 1.15), 40.0 * (xx - cx) / r, 0.0)
        img[r0:r1, c0:c1] += (shade + rim).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def test_one_tile_frame_gives_the_frame_path_s_boxes_bit_for_bit():
    from trn.detect.model import chosen_threshold, load_detector
    from trn.detect.run import detect_frames

    model, meta = load_detector("models/detector/detector.pt")
    rng = np.random.default_rng(1)
    img = bowls((512, 512), rng.uniform(60, 450, (12, 2)), rng.uniform(10, 50, 12))
    a = detect_frames(model, [img], 0.05)[0]
    b = detect_tiled(torch_maps(model), ArraySource(img), choose_scale(), 256, STRIDE, 0.05).detections
    assert len(a) > 0 and np.array_equal(a.boxes, b.boxes) and np.array_equal(a.scores, b.scores)
    assert chosen_threshold(meta) > 0


def test_a_4000_px_image_runs_whole_holding_only_a_tile_batch():
    shape = (4000, 4000)
    rng = np.random.default_rng(2)
    img = bowls(shape, rng.uniform(50, 3950, (300, 2)), rng.uniform(8, 40, 300))
    # a small network with the largest input, so that few tiles cover the image at full scale
    model = CraterDetector(DetectorConfig(input_size=1024, widths=(4, 4, 4, 4, 4), depths=(0, 0, 0, 0, 0), neck=4))
    tracemalloc.start()
    try:
        run = detect_tiled(torch_maps(model), ArraySource(img), ImageScale(1.0, "test"), 1024, STRIDE, 0.0, batch=2,
                           top_k=64)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert run.tiles == 25 and run.batch_bytes == 2 * 1024 * 1024 * 4
    whole = 4 * shape[0] * shape[1]       # the image at full scale as float32: what a whole-image resize costs
    assert peak < whole / 2, f"peak traced {peak / 2**20:.1f} MiB"
    b = run.detections.boxes
    assert len(b) and b[:, 0].min() >= 0 and b[:, 1].max() <= 4000 and b[:, 3].max() <= 4000


def ranged_oracle(image_shape, craters, bands, size, overlap, seen_px=(0.0, math.inf)):
    """A detector for the multi-scale tiler, over the tiles of every band's scale in the order the
    tiler runs them: a crater whose side in the network input lies in ``seen_px`` gives its box
    (clipped to the tile, as :func:`oracle`); a larger one gives a wrong box, half its size around
    its centre (a network that catches only the floor of a crater too large for it); a smaller one
    gives nothing."""
    tiles = iter([(b.factor, t) for b in bands for t in tile_grid(image_shape, b.factor, size, overlap)])

    def maps(x):
        n, out = len(x), size // STRIDE
        heat, sz, off = np.zeros((n, 1, out, out), np.float32), np.zeros((n, 2, out, out), np.float32), \
            np.zeros((n, 2, out, out), np.float32)
        for k in range(n):
            f, t = next(tiles)
            b = np.array(craters, np.float64)
            side = np.sqrt((b[:, 1] - b[:, 0]) * (b[:, 3] - b[:, 2])) * f
            cx, cy, half = (b[:, 0] + b[:, 1]) / 2, (b[:, 2] + b[:, 3]) / 2, (b[:, 1] - b[:, 0]) / 4
            big = side > seen_px[1]
            b[big] = np.stack([cx - half, cx + half, cy - half, cy + half], axis=1)[big]
            b = b[side >= seen_px[0]]
            _tile_targets(b, t, out, heat, sz, off, k)
        return heat, sz, off

    return maps


def test_default_bands_meet_where_a_crater_is_as_far_from_the_trained_sizes_at_either_scale():
    b = default_bands([0.6, 2.0])
    mid = math.sqrt(REFERENCE_CRATER_PX[0] * REFERENCE_CRATER_PX[1])
    assert [x.factor for x in b] == [0.6, 2.0]
    assert b[1].min_px == 0.0 and b[0].max_px == math.inf
    assert b[1].max_px == b[0].min_px == pytest.approx(mid / math.sqrt(1.2))
    assert b[1].max_px * 2.0 / mid == pytest.approx(mid / (b[0].min_px * 0.6))
    with pytest.raises(ConfigError, match="0 <= MIN < MAX"):
        ScaleBand(1.0, 30.0, 20.0)
    with pytest.raises(ConfigError, match="each scale once"):
        default_bands([1.0, 1.0])


def test_a_large_and_a_small_crater_are_each_found_once_at_their_own_scale():
    shape, size, overlap = (400, 400), 256, 96
    small, large = [293, 307, 293, 307], [69, 219, 69, 219]      # 14 and 150 image px
    bands = default_bands([2.0, 0.6])                             # boundary about 36 image px
    seen = (10.0, 120.0)                                          # network px this detector sees well
    run = detect_multiscale(ranged_oracle(shape, [small, large], bands, size, overlap, seen),
                            ArraySource(np.zeros(shape, np.uint8)), bands, size, STRIDE, 0.5, overlap=overlap)
    assert len(run.detections) == 2 and run.tiles == (25, 1)
    iou = iou_matrix(np.array([small, large], np.float32), run.detections.boxes)
    assert (iou.max(axis=1) > 0.9).all()
    assert run.band[iou[0].argmax()] == 0 and run.band[iou[1].argmax()] == 1   # small from 2.0, large from 0.6
    assert "2 (boxes of 0-35.8" in run.describe() or "2 (boxes of 0-35.7" in run.describe()
    # scale 2 alone misses the large crater (a wrong box inside it); both scales without bands keep that box too
    one = detect_tiled(ranged_oracle(shape, [small, large], bands[:1], size, overlap, seen),
                       ArraySource(np.zeros(shape, np.uint8)), ImageScale(2.0, "test"), size, STRIDE, 0.5,
                       overlap=overlap).detections
    assert iou_matrix(np.array([large], np.float32), one.boxes).max() < 0.5
    open_bands = [ScaleBand(2.0), ScaleBand(0.6)]
    both = detect_multiscale(ranged_oracle(shape, [small, large], open_bands, size, overlap, seen),
                             ArraySource(np.zeros(shape, np.uint8)), open_bands, size, STRIDE, 0.5, overlap=overlap)
    assert len(both.detections) == 3


def test_each_scale_keeps_only_the_boxes_of_its_band():
    shape, size, overlap = (600, 600), 256, 96
    rng = np.random.default_rng(3)
    side = rng.uniform(8, 120, 40)
    side = side[np.abs(side - 30) > 3]                            # clear of the boundary
    xy = rng.uniform(70, 530, (len(side), 2))
    craters = np.stack([xy[:, 0] - side / 2, xy[:, 0] + side / 2, xy[:, 1] - side / 2, xy[:, 1] + side / 2], 1)
    bands = [ScaleBand(2.0, 0.0, 30.0), ScaleBand(0.6, 30.0)]
    run = detect_multiscale(ranged_oracle(shape, craters, bands, size, overlap), ArraySource(np.zeros(shape, np.uint8)),
                            bands, size, STRIDE, 0.5, overlap=overlap, batch=7)
    got = box_side(run.detections.boxes)
    for k, b in enumerate(bands):
        assert ((got[run.band == k] >= b.min_px) & (got[run.band == k] < b.max_px)).all()
    iou = iou_matrix(craters.astype(np.float32), run.detections.boxes)
    # every crater once, from the band of its size (craters overlapping each other may share a box)
    found = iou.max(axis=1) > 0.8
    assert found.mean() > 0.9
    assert (run.band[iou[found].argmax(axis=1)] == (side[found] >= 30)).all()


def test_a_crater_kept_at_two_scales_is_one_box_after_the_nms():
    shape, size, overlap = (300, 300), 256, 96
    crater = [[120, 150, 120, 150]]                                # 30 px: inside both bands
    bands = [ScaleBand(2.0, 0.0, 40.0), ScaleBand(0.8, 20.0)]
    per = [tile_boxes(ranged_oracle(shape, crater, [b], size, overlap), ArraySource(np.zeros(shape, np.uint8)),
                      b.factor, size, STRIDE, 0.5, overlap=overlap) for b in bands]
    assert all(len(p.scores) >= 1 for p in per)                   # seen at both scales
    run = detect_multiscale(ranged_oracle(shape, crater, bands, size, overlap), ArraySource(np.zeros(shape, np.uint8)),
                            bands, size, STRIDE, 0.5, overlap=overlap)
    assert len(run.detections) == 1
    assert iou_matrix(np.array(crater, np.float32), run.detections.boxes)[0, 0] > 0.9


def test_one_band_of_every_size_gives_the_one_scale_run():
    from trn.detect.model import load_detector

    model, _ = load_detector("models/detector/detector.pt")
    rng = np.random.default_rng(4)
    img = bowls((700, 500), rng.uniform(40, 460, (20, 2)), rng.uniform(8, 40, 20))
    a = detect_tiled(torch_maps(model), ArraySource(img), ImageScale(0.8, "test"), 256, STRIDE, 0.05).detections
    b = detect_multiscale(torch_maps(model), ArraySource(img), [ScaleBand(0.8)], 256, STRIDE, 0.05).detections
    assert len(a) > 0 and np.array_equal(a.boxes, b.boxes) and np.array_equal(a.scores, b.scores)


def _real_detector_finds(img, centres, radii):
    from trn.detect.model import chosen_threshold, load_detector
    from trn.detect.tiles import detect_multiscale, parse_bands

    model, meta = load_detector("models/detector_real/detector.pt")
    bands = parse_bands(meta["run_scales"], meta["run_bands"])
    run = detect_multiscale(torch_maps(model), ArraySource(img), bands, 256, STRIDE, chosen_threshold(meta))
    truth = np.stack([centres[:, 0] - radii, centres[:, 0] + radii, centres[:, 1] - radii, centres[:, 1] + radii], 1)
    iou = iou_matrix(truth.astype(np.float32), run.detections.boxes)
    return (iou >= 0.5).any(axis=1), run.detections


def test_the_real_image_detector_finds_constructed_craters_at_its_chosen_scales():
    """models/detector_real (checked by its hash on loading) at the scales and bands it carries
    (chosen on validation images) and its shipped threshold: clear bowls of 12-80 px are each found
    once, with few boxes besides."""
    rng = np.random.default_rng(3)
    centres, radii = rng.uniform(80, 920, (16, 2)), rng.uniform(6, 40, 16)
    found, det = _real_detector_finds(bowls((1000, 1000), centres, radii), centres, radii)
    assert found.sum() >= 14 and len(det.boxes) <= found.sum() + 2


def test_images_in_16_bit_or_float_reflectance_find_what_their_stretched_8_bit_version_finds():
    """The spread floor follows an image's own grey range: calibrated reflectances of 0-0.3 (float)
    and 16-bit counts of a scene are standardised as its 8-bit version stretched over the same
    0.1-99.9 percentiles is, and give its craters and boxes; with the 8-bit floor of 4 units the
    float image's tiles were flattened to nothing (no crater found)."""
    rng = np.random.default_rng(3)
    centres, radii = rng.uniform(80, 920, (16, 2)), rng.uniform(6, 40, 16)
    scene = cv2.GaussianBlur(bowls((1000, 1000), centres, radii).astype(np.float32), (0, 0), 2.0)
    lo, hi = np.percentile(scene, [0.1, 99.9])
    stretched = np.clip(np.round((scene - lo) * 255 / (hi - lo)), 0, 255).astype(np.uint8)
    ref, ref_det = _real_detector_finds(stretched, centres, radii)
    assert ref.sum() >= 14
    # the last: finite float32 values of +-1e38, whose spread overflowed float32 (an audit's image,
    # which found no crater with only a numpy warning)
    extreme = ((scene - scene.mean()) * (2e38 / np.abs(scene - scene.mean()).max())).astype(np.float32)
    assert np.isfinite(extreme).all() and np.abs(extreme).max() > 1e38
    # and float64 values of +-1.5e308, whose area sums and squares overflow float64 itself
    centred = (scene - scene.mean()).astype(np.float64)
    extreme64 = centred * (1.5e308 / float(np.abs(centred).max()))
    assert np.isfinite(extreme64).all()
    for other in (scene * (0.3 / 255), (scene * 200 + 1000).astype(np.uint16), extreme, extreme64):
        found, det = _real_detector_finds(other, centres, radii)
        assert abs(int(found.sum()) - int(ref.sum())) <= 1 and abs(len(det.boxes) - len(ref_det.boxes)) <= 2


def test_the_spread_floor_is_min_std_grey_levels_of_the_image_s_own_range():
    from trn.detect.boxes import MIN_STD
    from trn.detect.tiles import spread_floor

    ramp = np.tile(np.arange(256, dtype=np.uint8), (256, 1))
    assert spread_floor(ArraySource(ramp)) == MIN_STD
    f = spread_floor(ArraySource(ramp.astype(np.float32) * (0.3 / 255)))
    assert f == pytest.approx(MIN_STD * 0.3 / 255, rel=0.02)
    with_nan = ramp.astype(np.float32) * (0.3 / 255)
    with_nan[:, :20] = np.nan
    assert spread_floor(ArraySource(with_nan)) == pytest.approx(MIN_STD * (0.3 / 255) * (255 - 20) / 255, rel=0.03)
    flat = np.full((64, 64), 0.2, np.float32)
    assert spread_floor(ArraySource(flat)) == MIN_STD
    nodata = ramp.astype(np.float32) * 10.0
    nodata[:100] = -9999.0
    assert spread_floor(ArraySource(nodata, nodata=-9999.0)) == pytest.approx(MIN_STD * 10.0, rel=0.02)


def test_mirroring_keeps_an_equivariant_map_and_evens_out_one_that_is_not():
    from trn.detect.tiles import symmetry_averaged

    def pooled(x):  # heat: each 4 x 4 cell's mean; mirror-equivariant since the stride divides the input
        n, s = x.shape[0], x.shape[1] // 4
        h = x.reshape(n, s, 4, s, 4).mean(axis=(2, 4))[:, None]
        return h, np.concatenate([h, 2 * h], 1), np.zeros((n, 2, s, s), np.float32)

    x = np.random.default_rng(0).random((3, 32, 32)).astype(np.float32)
    h, s, o = symmetry_averaged(pooled, 2)(x)
    ref = pooled(x)
    assert np.allclose(h, ref[0]) and np.allclose(s, ref[1]) and np.array_equal(o, ref[2])

    def ramp(x):  # a map that grows to the right whatever the input: mirrored and averaged, it is flat
        n = x.shape[0]
        h = np.broadcast_to(np.arange(8, dtype=np.float32), (n, 1, 8, 8)).copy()
        return h, np.zeros((n, 2, 8, 8), np.float32), np.zeros((n, 2, 8, 8), np.float32)

    h, _, _ = symmetry_averaged(ramp, 2)(x)
    assert np.allclose(h, 3.5)


def test_symmetry_views_bring_each_map_back_and_swap_width_and_height_under_a_transpose():
    from trn.detect.tiles import symmetry_averaged

    x = np.random.default_rng(1).random((2, 32, 32)).astype(np.float32)

    def pooled(x):  # as above: equivariant under every symmetry of the square; size channels w = h, h = 2 h
        n, s = x.shape[0], x.shape[1] // 4
        h = x.reshape(n, s, 4, s, 4).mean(axis=(2, 4))[:, None]
        return h, np.concatenate([h, 2 * h], 1), np.zeros((n, 2, s, s), np.float32)

    ref = pooled(x)
    for views in (2, 4):
        h, s, _ = symmetry_averaged(pooled, views)(x)
        assert np.allclose(h, ref[0], atol=1e-6) and np.allclose(s, ref[1], atol=1e-6)
    h, s, _ = symmetry_averaged(pooled, 8)(x)  # half the views are transposed: their w and h trade places
    assert np.allclose(h, ref[0], atol=1e-6) and np.allclose(s, 1.5 * ref[0].repeat(2, axis=1), atol=1e-6)

    def corner(x):  # a map lit at the top-left cell of whatever it is shown: averaged, all four corners
        n = x.shape[0]
        h = np.zeros((n, 1, 8, 8), np.float32)
        h[:, :, 0, 0] = 1.0
        return h, np.zeros((n, 2, 8, 8), np.float32), np.zeros((n, 2, 8, 8), np.float32)

    h, _, _ = symmetry_averaged(corner, 4)(x)
    assert np.allclose(h[:, 0, [0, 0, 7, 7], [0, 7, 0, 7]], 0.25) and np.isclose(h.sum(), 2 * 1.0)
    h, _, _ = symmetry_averaged(corner, 8)(x)  # the top-left cell is on the diagonal: a transpose keeps it
    assert np.allclose(h[:, 0, [0, 0, 7, 7], [0, 7, 0, 7]], 0.25)
    with pytest.raises(ConfigError, match="views 3"):
        symmetry_averaged(corner, 3)


def test_the_command_line_offers_the_symmetry_sets_the_tiler_has():
    from trn.cli.detect import TTA_CHOICES
    from trn.detect.tiles import TTA_VIEWS

    assert TTA_CHOICES == tuple(TTA_VIEWS)


def test_freed_heap_memory_is_handed_back_every_few_batches(monkeypatch):
    import trn.detect.tiles as tiles

    calls = []
    monkeypatch.setattr(tiles, "release_freed_memory", lambda: calls.append(1) or True)
    img = bowls((512, 512), np.array([[100.0, 100.0]]), np.array([20.0]))
    maps = lambda x: (np.zeros((len(x), 1, 64, 64), np.float32), np.zeros((len(x), 2, 64, 64), np.float32),  # noqa: E731
                      np.zeros((len(x), 2, 64, 64), np.float32))
    run = tiles.tile_boxes(maps, ArraySource(img), 2.0, 256, STRIDE, 0.5, batch=1)
    assert run.tiles >= 2 * tiles.TRIM_EVERY and len(calls) == run.tiles // tiles.TRIM_EVERY
    import platform

    assert (tiles._malloc_trim() is not None) == (platform.libc_ver()[0] == "glibc")  # found where glibc is the C library


def test_a_run_off_a_terminal_reports_its_tiles_as_log_lines(monkeypatch, caplog):
    """An audit's nit: a redirected trn-detect run of a large image printed nothing for minutes."""
    import logging

    import trn.data.progress as prog
    from trn.detect.tiles import tile_boxes

    monkeypatch.setattr(prog, "on_terminal", lambda: False)
    monkeypatch.setattr(prog, "INTERVAL_S", 0.0)

    def maps(x):
        n = len(x)
        return (np.zeros((n, 1, 64, 64), np.float32), np.zeros((n, 2, 64, 64), np.float32),
                np.zeros((n, 2, 64, 64), np.float32))

    src = ArraySource(np.random.default_rng(0).integers(0, 255, (1200, 1200)).astype(np.uint8))
    with caplog.at_level(logging.INFO, logger="trn.data.progress"):
        tile_boxes(maps, src, 1.0, 256, STRIDE, 0.5, batch=4)
    lines = [r.getMessage() for r in caplog.records if r.name == "trn.data.progress"]
    assert lines[0].startswith("tiles: started") and lines[-1].startswith("tiles: done")
