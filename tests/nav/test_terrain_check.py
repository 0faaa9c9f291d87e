"""The terrain check of a position fix (trn.nav.terrain_check): frames rendered from a procedural
world, checked against the coarse map's prediction at the true position and elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

from trn.data.worlds.render import RenderConfig, render_frame
from trn.data.worlds.terrain import DetailConfig
from trn.errors import ConfigError, DataError
from trn.geometry import MOON_RADIUS_KM, east_north_up, latlon_to_xyz, nadir_pose
from trn.nav.lost import LostConfig
from trn.nav.terrain_check import (MIN_LIT_FRACTION, TerrainCheck, TerrainMatch, _lit_correlation, _peak,
                                   _second_peak, _shifted_correlations, gradient_shift, normalised_correlation)

RENDER = RenderConfig(nav_size=128, fov_deg=60.0, detail=DetailConfig(enabled=False))


def _pose(lat: float, lon: float, alt: float = 400.0):
    sc = latlon_to_xyz(np.array([lat]), np.array([lon]), MOON_RADIUS_KM + alt)[0]
    vel = np.cross([0.0, 0.0, 1.0], sc)
    return sc, nadir_pose(sc, vel / np.linalg.norm(vel))


def _sun(sc, elevation_deg: float = 30.0):
    """A Sun ``elevation_deg`` above the horizon below ``sc``, from the east."""
    u = sc / np.linalg.norm(sc)
    east = np.cross([0.0, 0.0, 1.0], u)
    east /= np.linalg.norm(east)
    e = np.radians(elevation_deg)
    return np.cos(e) * east + np.sin(e) * u


@pytest.fixture(scope="module")
def check(tiny_world):
    return TerrainCheck.from_source(tiny_world, RENDER, RENDER.fov_deg, size_px=32, max_ppd=4)


def test_the_prediction_at_the_true_position_agrees_and_elsewhere_does_not(check):
    """A frame of the world (128 px) agrees with the prediction at its own position (32 px from
    the same elevation) far better than with the prediction 300 km away or at another place."""
    agree, apart = [], []
    for lat, lon in [(5.0, 20.0), (-20.0, 140.0), (30.0, 250.0)]:
        sc, rot = _pose(lat, lon)
        sun = _sun(sc)
        frame, _ = render_frame(check.surface, rot, sc, sun, RENDER)
        small = check.reduced(frame)
        agree.append(check.agreement(small, rot, sc, sun))
        u = sc / np.linalg.norm(sc)
        away = sc + 300.0 * np.cross(u, [0.0, 0.0, 1.0]) / np.linalg.norm(np.cross(u, [0.0, 0.0, 1.0]))
        away *= np.linalg.norm(sc) / np.linalg.norm(away)
        apart.append(check.agreement(small, rot, away, sun))
    assert min(agree) > 0.9, agree
    assert max(apart) < 0.6, apart


def test_the_correlation_peak_measures_how_far_the_fix_is_off(check):
    """From 250 km a reduced pixel is 250 km x tan 30 deg / 16 = 9.0 km (the map's pixel 7.6 km);
    a fix 0.6 px off (5.4 km north-east) is matched: the offset, across the fix's vertical, points
    back to the true position within 0.2 px (a third of the error), its correlation at the fix is
    :meth:`agreement`'s, its peak's at least as high. With the search's reach below the error the
    peak lies on its edge: no offset."""
    for lat, lon in [(5.0, 20.0), (-20.0, 140.0)]:
        sc, rot = _pose(lat, lon, 250.0)
        sun = _sun(sc)
        frame, _ = render_frame(check.surface, rot, sc, sun, RENDER)
        small = check.reduced(frame)
        east, north, _ = east_north_up(lat, lon)
        px = 250.0 * np.tan(np.radians(30.0)) / 16.0
        fix = sc + 0.6 * px * (0.8 * east + 0.6 * north)
        m = check.match(small, rot, fix, sun, reach_km=40.0)
        assert m.ncc == pytest.approx(check.agreement(small, rot, fix, sun))
        assert m.km_per_px == pytest.approx(px, rel=0.01)
        assert m.offset_km @ fix == pytest.approx(0.0, abs=1e-6)
        assert np.linalg.norm(fix + m.offset_km - sc) < 0.2 * px, (m.offset_km, sc - fix)
        assert m.peak_ncc >= m.ncc
        # without a search the same agreement, no offset
        plain = check.match(small, rot, fix, sun, reach_km=None)
        assert plain.ncc == m.ncc and plain.offset_km is None and plain.km_per_px == m.km_per_px
        # 200 km off with a reach of 20 km: the best shift lies on the search's edge
        far = check.match(small, rot, sc + 200.0 * east, sun, reach_km=20.0)
        assert far is None or far.offset_km is None


def test_the_agreement_near_the_fix_is_the_best_whole_shift_within_the_distance(check):
    """A fix two reduced pixels off: the agreement it reads near itself (``near_km``) is the highest
    of the shifted correlations within that distance (at least the eight next to it), above its
    own; without ``near_km`` it is its own; the peak and its offset are those of ``reach_km``
    alone, whatever ``near_km`` searched."""
    sc, rot = _pose(5.0, 20.0, 250.0)
    sun = _sun(sc)
    small = check.reduced(render_frame(check.surface, rot, sc, sun, RENDER)[0])
    east, _, _ = east_north_up(5.0, 20.0)
    px = 250.0 * np.tan(np.radians(30.0)) / 16.0
    fix = sc + 2.0 * px * east
    m = check.match(small, rot, fix, sun, reach_km=None, near_km=2.5 * px)
    grid = _shifted_correlations(small, check.predicted(rot, fix, sun), 3)
    dy, dx = np.mgrid[-3:4, -3:4]
    within = grid[(np.hypot(dx, dy) <= 2.5) & np.isfinite(grid)]
    assert m.offset_km is None and m.near_ncc == pytest.approx(max(m.ncc, within.max()), abs=1e-9)
    assert m.near_ncc > m.ncc + 0.1
    assert check.match(small, rot, fix, sun, reach_km=None).near_ncc == m.ncc
    tiny = check.match(small, rot, fix, sun, reach_km=None, near_km=0.01)  # the eight neighbours
    assert tiny.near_ncc == pytest.approx(max(m.ncc, np.nanmax(grid[2:5, 2:5])), abs=1e-9)
    a, b = check.match(small, rot, fix, sun, reach_km=1.5 * px), check.match(small, rot, fix, sun, 1.5 * px, 3.0 * px)
    assert (a.offset_km is None and b.offset_km is None) or np.allclose(a.offset_km, b.offset_km)
    assert a.peak_ncc == b.peak_ncc and b.near_ncc >= m.near_ncc


def test_a_check_answers_on_fewer_lit_pixels_only_where_asked(check):
    """Near the terminator a frame lights a few of the compared pixels: with the default share no
    answer, with ``min_lit`` below the lit share the same correlation over the same pixels."""
    frame = np.zeros((32, 32))
    pred = np.zeros((32, 32))
    rng = np.random.default_rng(3)
    frame[:, :2], pred[:, :2] = 1.0 + rng.random((32, 2)), 1.0 + rng.random((32, 2))  # 6.25 % lit in both
    assert _lit_correlation(frame, pred) is None
    lit = (frame > 0) & (pred > 0)
    assert _lit_correlation(frame, pred, 0.05) == pytest.approx(normalised_correlation(frame, pred, lit))
    grid = _shifted_correlations(frame, pred, 1, 0.05)
    assert grid[1, 1] == pytest.approx(normalised_correlation(frame, pred, lit))
    assert np.isnan(_shifted_correlations(frame, pred, 1)[1, 1])
    assert check.min_lit == MIN_LIT_FRACTION
    with pytest.raises(ConfigError, match="min_lit"):
        TerrainCheck(check.surface, RENDER, RENDER.fov_deg, 32, min_lit=0.0)
    with pytest.raises(ConfigError, match="terrain_min_lit"):
        LostConfig(terrain_min_lit=2.0)


def test_the_peak_is_found_to_a_fraction_of_a_pixel():
    """A sampled paraboloid peaking at (0.3, -0.2) px from the grid's centre: :func:`_peak` finds
    it exactly (a parabola through three samples is exact for a parabola); a peak on the edge or
    a grid without a finite value gives None."""
    y, x = np.mgrid[-3:4, -3:4].astype(float)
    grid = 0.9 - 0.05 * ((x - 0.3) ** 2 + (y + 0.2) ** 2)
    dx, dy, value = _peak(grid)
    assert dx == pytest.approx(0.3) and dy == pytest.approx(-0.2) and value == grid[3, 3]
    assert _peak(0.9 - 0.05 * ((x - 3.0) ** 2 + y ** 2)) is None
    assert _peak(np.full((7, 7), np.nan)) is None


def test_a_gradient_step_measures_a_sub_pixel_shift_with_gain_and_offset_free():
    """A smooth image moved by (0.3, -0.2) px, its brightness scaled by 0.7 and raised by 20: one
    Lucas-Kanade step finds the shift to a hundredth of a pixel, blurred or not; the same image
    unmoved gives no shift; a shift beyond ``max_shift_px``, an inverted image (no positive gain)
    or an image lit on too few pixels gives None."""
    y, x = np.mgrid[0:64, 0:64].astype(float)

    def scene(dx, dy):
        u, v = x - dx, y - dy
        return 100.0 + 40.0 * np.sin(u / 5.0) * np.cos(v / 7.0) + 30.0 * np.cos((u + 2.0 * v) / 9.0)

    pred = scene(0.0, 0.0)
    for blur in (0.0, 1.0):
        dx, dy = gradient_shift(20.0 + 0.7 * scene(0.3, -0.2), pred, blur_px=blur)
        assert dx == pytest.approx(0.3, abs=0.01) and dy == pytest.approx(-0.2, abs=0.01)
        assert np.hypot(*gradient_shift(pred, pred, blur_px=blur)) < 1e-9
    assert gradient_shift(scene(0.3, -0.2), pred, max_shift_px=0.2) is None
    assert gradient_shift(300.0 - pred, pred) is None
    dark = pred.copy()
    dark[:, 4:] = 0.0
    assert gradient_shift(dark, pred) is None


def test_refinement_steps_bring_a_fix_a_third_of_a_pixel_off_back_to_the_truth(check):
    """A fix 0.35 px off (north-east) on the procedural world: two steps against supersampled
    predictions bring it within 0.03 px of the true position, across the local vertical (one step
    at least halves the error); bad settings are refused with their range."""
    lat, lon = 5.0, 20.0
    sc, rot = _pose(lat, lon, 250.0)
    sun = _sun(sc)
    small = check.reduced(render_frame(check.surface, rot, sc, sun, RENDER)[0])
    east, north, _ = east_north_up(lat, lon)
    px = check.km_per_px(rot, sc)
    fix = sc + 0.35 * px * (0.8 * east + 0.6 * north)
    one = check.refine(small, rot, fix, sun, passes=1)
    two = check.refine(small, rot, fix, sun, passes=2)
    assert two @ fix == pytest.approx(0.0, abs=1e-6)
    assert np.linalg.norm(fix + one - sc) < 0.5 * 0.35 * px
    assert np.linalg.norm(fix + two - sc) < 0.03 * px, (two, sc - fix)
    with pytest.raises(ConfigError, match="passes=0: expected 1 to 8"):
        check.refine(small, rot, fix, sun, passes=0)
    with pytest.raises(ConfigError, match="supersample=9: expected 1 to 8"):
        check.refine(small, rot, fix, sun, passes=1, supersample=9)


def test_a_windowed_refinement_renders_where_the_frame_has_gradient_and_still_converges(check):
    """refine_box picks the square of the asked fraction where a frame holds its gradient (a frame
    flat but for one textured corner gives that corner; 1 gives the whole frame); a windowed
    prediction is the whole prediction's window pixel for pixel, at about the window's share of
    the rays; two windowed steps bring a fix 0.35 px off within 0.05 px; bad windows are refused."""
    side = check.size_px
    y, x = np.mgrid[0:side, 0:side].astype(float)
    frame = np.full((side, side), 120.0)
    h = side // 2
    frame[h:, h:] += 60.0 * np.sin(x[h:, h:] / 2.0) * np.cos(y[h:, h:] / 3.0)
    x0, y0, x1, y1 = check.refine_box(frame, 0.5)
    assert (x1 - x0, y1 - y0) == (h, h) and x0 >= h // 2 and y0 >= h // 2
    assert check.refine_box(frame, 1.0) is None
    lat, lon = 5.0, 20.0
    sc, rot = _pose(lat, lon, 250.0)
    sun = _sun(sc)
    small = check.reduced(render_frame(check.surface, rot, sc, sun, RENDER)[0])
    box = check.refine_box(small, 0.5)
    whole = check.predicted_fine(rot, sc, sun, 4)
    assert np.array_equal(check.predicted_fine(rot, sc, sun, 4, box), whole[box[1]:box[3], box[0]:box[2]])
    east, north, _ = east_north_up(lat, lon)
    px = check.km_per_px(rot, sc)
    fix = sc + 0.35 * px * (0.8 * east + 0.6 * north)
    two = check.refine(small, rot, fix, sun, passes=2, window=0.5)
    assert np.linalg.norm(fix + two - sc) < 0.05 * px, (two, sc - fix)
    for bad in (0.2, 1.5):
        with pytest.raises(ConfigError, match="window"):
            check.refine(small, rot, fix, sun, passes=1, window=bad)
    with pytest.raises(ConfigError, match="terrain_refine_window"):
        LostConfig(terrain_refine_window=0.1)


def test_the_refinements_prediction_in_bands_is_the_whole_render(check):
    """Rendered in 2 or 3 horizontal bands the supersampled prediction is the whole render pixel for
    pixel (so the steps measure the same offset), under a low Sun whose shadows cross the bands'
    edges; each banded render adds the bands' time less the longest band's to ``side_ms`` (a clock
    that ticks 1 s a reading: every band takes 1,000 ms); bad band counts are refused."""
    sc, rot = _pose(-20.0, 140.0, 250.0)
    sun = _sun(sc, 12.0)
    small = check.reduced(render_frame(check.surface, rot, sc, sun, RENDER)[0])
    fix = sc + 0.3 * check.km_per_px(rot, sc) * east_north_up(-20.0, 140.0)[0]
    whole = TerrainCheck(check.surface, RENDER, RENDER.fov_deg, size_px=32)
    image, plain = whole.predicted_fine(rot, fix, sun, 4), whole.predicted(rot, fix, sun)
    assert whole.side_ms == 0.0
    for bands in (2, 3):
        banded = TerrainCheck(check.surface, RENDER, RENDER.fov_deg, size_px=32, bands=bands)
        ticks = iter(range(1000))
        banded.clock = lambda: float(next(ticks))
        assert np.array_equal(banded.predicted_fine(rot, fix, sun, 4), image)
        assert banded.side_ms == pytest.approx(1000.0 * (bands - 1))
        assert np.array_equal(banded.predicted(rot, fix, sun), plain)  # the check's prediction too
        assert banded.side_ms == pytest.approx(2000.0 * (bands - 1))
        assert np.array_equal(banded.refine(small, rot, fix, sun, passes=1), whole.refine(small, rot, fix, sun, passes=1))
    for bad in (0, 9, 1.5):
        with pytest.raises(ConfigError, match="bands="):
            TerrainCheck(check.surface, RENDER, RENDER.fov_deg, size_px=32, bands=bad)


def test_a_second_peak_is_another_local_maximum():
    """One smooth peak has no second (its flanks and the grid's edge below it are no maxima); a
    second bump (repeating terrain) is found with its value, on the edge too; NaN shifts are skipped."""
    y, x = np.mgrid[-5:6, -5:6].astype(float)
    one = 0.9 - 0.02 * (x ** 2 + y ** 2)
    assert _second_peak(one) is None
    two = np.maximum(one, 0.8 - 0.1 * ((x - 4.0) ** 2 + (y - 1.0) ** 2))
    assert _second_peak(two) == pytest.approx(0.8)
    edge = np.maximum(one, 0.7 - 0.1 * ((x - 5.0) ** 2 + y ** 2))
    assert _second_peak(edge) == pytest.approx(0.7)
    holed = two.copy()
    holed[0, :] = np.nan
    assert _second_peak(holed) == pytest.approx(0.8)
    assert _second_peak(np.full((5, 5), np.nan)) is None


def test_the_offsets_sigma_grows_with_the_peaks_mismatch():
    """The offset's sigma is the given reduced pixels at a peak of 0.9, scaled by the root of
    (1 - peak) / 0.1, in quadrature with the floor; a perfect match keeps the floor; no peak, no
    sigma."""
    assert TerrainMatch(0.8, np.zeros(3), 0.9, 2.0).sigma_km(0.15) == pytest.approx(0.3)
    assert TerrainMatch(0.8, np.zeros(3), 0.99, 2.0).sigma_km(0.15) == pytest.approx(0.3 * np.sqrt(0.1))
    assert TerrainMatch(0.8, np.zeros(3), 0.6, 2.0).sigma_km(0.15) == pytest.approx(0.3 * 2.0)
    assert TerrainMatch(0.8, np.zeros(3), 0.9, 2.0).sigma_km(0.15, 0.2) == pytest.approx(2.0 * np.hypot(0.15, 0.2))
    assert TerrainMatch(0.8, np.zeros(3), 1.0, 2.0).sigma_km(0.15, 0.05) == pytest.approx(0.1)
    assert np.isnan(TerrainMatch(0.8).sigma_km(0.15))


def test_a_dark_frame_gives_no_answer(check):
    sc, rot = _pose(0.0, 60.0)
    night = -sc / np.linalg.norm(sc)
    assert check.agreement(np.zeros((32, 32), np.uint8), rot, sc, night) is None


def _correlations_shift_by_shift(frame, pred, reach):
    """The definition: each shift's overlap, its pixels lit in both, correlated on their own."""
    h, w = frame.shape
    out = np.full((2 * reach + 1, 2 * reach + 1), np.nan)
    for dy in range(-reach, reach + 1):
        for dx in range(-reach, reach + 1):
            f = frame[max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)].astype(float)
            p = pred[max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)].astype(float)
            mask = (f > 0) & (p > 0)
            if mask.sum() >= MIN_LIT_FRACTION * frame.size:
                c = normalised_correlation(f, p, mask)
                out[dy + reach, dx + reach] = np.nan if c is None else c
    return out


def test_all_shifts_correlated_at_once_equal_each_shift_correlated_on_its_own():
    rng = np.random.default_rng(3)
    for case in range(12):
        frame = rng.integers(1, 255, (48, 48)).astype(np.uint8)
        frame[rng.random(frame.shape) < 0.3] = 0  # shadows: unlit pixels
        pred = np.clip(np.roll(frame, (2, -1), (0, 1)) + rng.integers(-15, 15, frame.shape), 0, 255).astype(np.uint8)
        if case == 1:
            pred[:] = 9  # flat: no correlation at any shift
        if case == 2:
            pred[:, :43] = 0  # lit only at one edge: the shifts that lose it give no answer
        reach = int(rng.integers(1, 12))
        want, got = _correlations_shift_by_shift(frame, pred, reach), _shifted_correlations(frame, pred, reach)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got[np.isfinite(want)], want[np.isfinite(want)], atol=1e-12)
        if case == 0:  # the peak where the prediction was rolled to: 2 rows down, 1 column left
            assert np.unravel_index(np.nanargmax(got), got.shape) == (reach - 2, reach + 1)
    assert np.isnan(_shifted_correlations(frame, np.full_like(frame, 9), 3)).all()


def test_correlation_of_flat_or_empty_images_is_no_answer():
    a = np.arange(16, dtype=float).reshape(4, 4)
    m = np.ones((4, 4), bool)
    assert normalised_correlation(a, 2 * a + 3, m) == pytest.approx(1.0)
    assert normalised_correlation(a, -a, m) == pytest.approx(-1.0)
    assert normalised_correlation(a, np.full((4, 4), 7.0), m) is None
    assert normalised_correlation(a, a, np.zeros((4, 4), bool)) is None


def test_bad_inputs_name_the_fix(tmp_path, check):
    with pytest.raises(DataError, match="dem/"):
        TerrainCheck.from_source(tmp_path, RENDER, 40.0)
    with pytest.raises(ConfigError, match="size_px"):
        TerrainCheck(check.surface, RENDER, 40.0, size_px=4)
    with pytest.raises(DataError, match="square grey frame"):
        check.reduced(np.zeros((64, 80), np.uint8))


def test_the_scenarios_verifier_reads_each_frame_once_and_answers_only_what_it_can(check, tmp_path):
    """``trn.nav.scenario.terrain_verifier``: by a frame's time, the frame on disk (rendered from
    the world) checked at its position with the attitude the search drew; a frame not on disk, a
    dark frame, a time with no frame and a frame not yet searched give no answer; asked for the
    refinement's steps, it gives their offset and times them apart."""
    from types import SimpleNamespace

    import cv2

    from trn.nav.scenario import terrain_verifier

    sc, rot = _pose(-10.0, 200.0)
    sun = _sun(sc)
    frame, _ = render_frame(check.surface, rot, sc, sun, RENDER)
    cv2.imwrite(str(tmp_path / "0.png"), frame)
    cv2.imwrite(str(tmp_path / "2.png"), np.zeros_like(frame))
    ds = SimpleNamespace(frame_path=lambda k: tmp_path / f"{k}.png",
                         metadata=SimpleNamespace(frames=[{"sun_dir_body": list(sun)}] * 4))
    attitude = {0: rot, 1: rot, 2: rot}
    verify = terrain_verifier(ds, check, attitude, {0.0: 0, 10.0: 1, 20.0: 2, 30.0: 3})
    assert verify(0.0, sc).ncc > 0.9
    assert verify(10.0, sc) is None and verify(20.0, sc) is None  # not on disk; dark
    assert verify(30.0, sc) is None and verify(5.0, sc) is None  # not searched yet; no frame at 5 s
    assert len(verify.ms) == 1 and verify.answered == 1
    # asked again at the same place: the same answer from memory, no render; elsewhere, a render
    again = verify(0.0, sc.copy())
    assert again.ncc == verify(0.0, sc).ncc and len(verify.ms) == 1 and verify.remembered == 2
    assert verify(0.0, sc + 0.5 * rot[:, 0]) is not None and len(verify.ms) == 2
    # asked for the refinement's steps, the offset they measure (none at the true position)
    step = verify(0.0, sc, passes=1, supersample=2)
    assert step @ sc == pytest.approx(0.0, abs=1e-6) and np.linalg.norm(step) < 0.05 * check.km_per_px(rot, sc)
    assert len(verify.refine_ms) == 1 and len(verify.ms) == 2 and verify.answered == 2
    with pytest.raises(ConfigError, match="--map-source"):
        terrain_verifier(ds, None, attitude, {})
