"""The navigation loop on a synthetic orbit whose answers are known: fixes from correctly
matched craters hold the position to a fraction of a km; dead reckoning drifts; a wrong match is
rejected."""

from __future__ import annotations

import numpy as np

from trn.data.datasets.luna1 import Luna1Dataset, Luna1Metadata
from trn.geometry import MOON_RADIUS_KM, PinholeCamera, latlon_to_xyz, matrix_to_quat, nadir_pose, world_to_camera
from trn.nav.ekf import MU_KM3_S2, OMEGA_RAD_S, rk4
from trn.nav.scenario import Match, navigate
from trn.nav.sensors import SensorModel

CAM = PinholeCamera(512, 512, 39.6)


def synthetic(n: int = 120, dt: float = 10.0):
    r = MOON_RADIUS_KM + 100.0
    x = np.array([r, 0.0, 0.0, 0.0, 0.0, np.sqrt(MU_KM3_S2 / r)])
    x[3:] -= np.cross([0, 0, OMEGA_RAD_S], x[:3])
    states = [x]
    for _ in range(n - 1):
        states.append(rk4(states[-1], dt))
    states = np.array(states)
    rots = np.array([nadir_pose(s[:3], s[3:]) for s in states])
    poses = np.concatenate([states[:, :3], np.array([matrix_to_quat(r) for r in rots])], axis=1)
    t0 = np.datetime64("2022-09-06T00:00:00")
    frames = [{"frame": i, "epoch_utc": str(t0 + np.timedelta64(int(i * dt), "s")) + "Z", "sun_elevation_deg": 30.0}
              for i in range(n)]
    meta = Luna1Metadata(frames=frames, camera={"width": 512, "height": 512, "fov_deg": 39.6})
    ds = Luna1Dataset(root=__import__("pathlib").Path("."), crater_ids=[], frames=[], poses=poses, kitti=None,
                      metadata=meta)
    # a grid of craters under the ground track
    lat, lon = np.meshgrid(np.arange(-40, 41, 1.0), np.arange(-2, 2.5, 1.0))
    craters = latlon_to_xyz(lat.ravel(), lon.ravel(), MOON_RADIUS_KM).reshape(-1, 3)
    return ds, states, rots, craters


def oracle_matches(states, rots, craters, every: int = 3, wrong_at: int | None = None):
    out = {}
    for i in range(0, len(states), every):
        pc = world_to_camera(craters, rots[i], states[i, :3])
        u, v, z = CAM.project(pc)
        vis = np.flatnonzero((z > 0) & (u > 20) & (u < 492) & (v > 20) & (v < 492))
        ms = [Match(int(k), int(k), (float(u[k]), float(v[k])), 0.95) for k in vis]
        if wrong_at is not None and i == wrong_at and len(ms) >= 3:
            m = ms[0]
            ms[0] = Match((m.crater + 17) % len(craters), m.true_crater, m.pixel, 0.91)
        out[i] = ms
    return out


def test_fixes_hold_the_position_and_dead_reckoning_drifts():
    ds, states, rots, craters = synthetic()
    sensors = SensorModel(pixel_sigma=1.0, landmark_sigma_km=0.05)
    res = navigate(ds, oracle_matches(states, rots, craters, wrong_at=30), lambda ids: craters[ids], sensors,
                   seed=1)
    s = res.summary()
    assert s["frames_with_fix"] >= 25  # every third frame while the craters are in view
    assert s["trn"]["rms_km"] < s["dead_reckoning"]["rms_km"] / 5
    late = res.error_km[len(res.error_km) // 2:]
    assert late.max() < 0.5  # converged well below the 5 km start
    assert np.all(res.error_km[len(res.error_km) // 2:] < res.sigma3_km[len(res.error_km) // 2:] * 1.5)
    assert s["wrong_matches"] == 1 and s["used_wrong"] == 0 and s["rejected_ransac"] >= 1


def test_without_matches_the_filter_is_dead_reckoning():
    ds, states, rots, craters = synthetic(n=40)
    res = navigate(ds, {}, lambda ids: craters[ids], SensorModel(), seed=2)
    np.testing.assert_allclose(res.error_km, res.dr_error_km)
    assert res.summary()["frames_with_fix"] == 0


def test_search_window_picks_the_predicted_crater_over_a_better_scoring_one_far_away():
    """A detection of crater A scores 0.80 against A and 0.95 against a crater 300 km away: the
    window around A's predicted pixel (5 km, 3 sigma) keeps only A; with a covariance of 1,000 km
    the window covers the visible map and the far crater wins, as in a search of the whole map."""
    from types import SimpleNamespace

    from trn.nav.scenario import SearchWindow

    ds, states, rots, craters = synthetic(n=3)
    pc = world_to_camera(craters, rots[0], states[0, :3])
    u, v, z = CAM.project(pc)
    vis = np.flatnonzero((z > 0) & (u > 100) & (u < 412) & (v > 100) & (v < 412))
    a = int(vis[0])
    far = int(np.argmax(np.linalg.norm(craters - craters[a], axis=1) * (np.linalg.norm(craters - craters[a], axis=1) < 330)))
    box = (int(u[a]) - 10, int(u[a]) + 10, int(v[a]) - 10, int(v[a]) + 10)
    det = SimpleNamespace(frame=0, box=box, label=str(a))
    sims = np.full((1, len(craters)), 0.1, np.float32)
    sims[0, a], sims[0, far] = 0.80, 0.95
    ids = list(range(len(craters)))
    w = SearchWindow([det], sims, ids, craters, CAM, threshold=0.7)
    got = w(0, states[0, :3] + np.array([1.0, -1.0, 0.5]), np.eye(3) * 25.0, rots[0])
    assert [(m.crater, m.true_crater) for m in got] == [(a, a)] and got[0].score == np.float32(0.80)
    assert w.candidates[-1] < 10
    wide = w(0, states[0, :3], np.eye(3) * 1e6, rots[0])
    assert [m.crater for m in wide] == [far] and w.candidates[-1] > 50
    high = SearchWindow([det], sims, ids, craters, CAM, threshold=0.9)
    assert high(0, states[0, :3], np.eye(3) * 25.0, rots[0]) == []  # A is below the threshold
    assert w(1, states[1, :3], np.eye(3), rots[1]) == []  # no detection in that frame
    # a crater of A's descriptor near A (a featureless render shared by both): a tie in the window is
    # no identity, so no match; far outside the window the same tie does not matter
    with_twin = np.vstack([craters, craters[a] + np.array([2.0, 0.0, 0.0])])  # a crater 2 km from A
    twin = np.concatenate([sims, sims[:, a:a + 1]], axis=1)
    tw = SearchWindow([det], twin, ids + [len(craters)], with_twin, CAM, threshold=0.7)
    assert tw(0, states[0, :3], np.eye(3) * 25.0, rots[0]) == [] and tw.tied == 1
    twin[0, -1], twin[0, far] = 0.1, 0.80  # the tie is far outside the window now
    tw = SearchWindow([det], twin, ids + [len(craters)], with_twin, CAM, threshold=0.7)
    assert [m.crater for m in tw(0, states[0, :3], np.eye(3) * 25.0, rots[0])] == [a] and tw.tied == 0


def test_the_spatial_index_gives_the_windows_of_a_scan_of_the_whole_map():
    """A dense map over the whole sphere (20,000 craters, heights of +-9 km), seeded draws of the
    pose (off-nadir up to 20 degrees, 30 to 300 km up), the filter's sigma (0.1 km to 3,000 km) and
    the boxes (some cut by or beyond the frame's edge): the windowed search through the k-d tree
    and through the cells of :class:`trn.nav.spatial.CellIndex` returns exactly the matches and
    window sizes of the scan of every map crater, and projects far fewer craters when the window is
    small."""
    from types import SimpleNamespace

    from trn.geometry import latlon_to_xyz
    from trn.nav.scenario import SearchWindow
    from trn.nav.spatial import CellIndex

    rng = np.random.default_rng(23)
    n = 20_000
    lat = np.degrees(np.arcsin(rng.uniform(-1, 1, n)))
    lon = rng.uniform(0, 360, n)
    rad = MOON_RADIUS_KM + rng.uniform(-9.0, 9.0, n)
    craters = latlon_to_xyz(lat, lon, rad).reshape(-1, 3)
    cells = CellIndex(lat, lon, rad)  # the same positions, computed for the craters it returns only
    ids = list(range(n))
    small_windows, windows = [], 0
    for _ in range(60):
        up = rng.normal(size=3)
        up /= np.linalg.norm(up)
        x = up * (MOON_RADIUS_KM + rng.uniform(30.0, 300.0))
        tilt = np.radians(rng.uniform(0.0, 20.0))
        side = np.cross(up, rng.normal(size=3))
        side /= np.linalg.norm(side)
        look = -np.cos(tilt) * up + np.sin(tilt) * side
        # camera axes: z along the look direction, x along ``side`` made orthogonal to it
        zc = look / np.linalg.norm(look)
        xc = side - zc * (side @ zc)
        xc /= np.linalg.norm(xc)
        rot = np.stack([xc, np.cross(zc, xc), zc], 1)
        dets = []
        for _ in range(int(rng.integers(1, 6))):
            cx, cy, h = rng.uniform(-60, 572), rng.uniform(-60, 572), rng.uniform(4, 200)
            dets.append(SimpleNamespace(frame=0, box=(cx - h, cx + h, cy - h, cy + h), label="0"))
        sims = rng.uniform(-0.2, 1.0, (len(dets), n)).astype(np.float32)
        sigma = 10 ** rng.uniform(-1, 3.5)
        p = np.eye(3) * sigma ** 2
        fast = SearchWindow(dets, sims, ids, craters, CAM, threshold=0.5, pixel_sigma=4.0)
        slow = SearchWindow(dets, sims, ids, craters, CAM, threshold=0.5, pixel_sigma=4.0, spatial=False)
        by_cell = SearchWindow(dets, sims, ids, cells, CAM, threshold=0.5, pixel_sigma=4.0)
        got, ref, celled = fast(0, x, p, rot), slow(0, x, p, rot), by_cell(0, x, p, rot)
        assert [(m.crater, m.score) for m in got] == [(m.crater, m.score) for m in ref]
        assert [(m.crater, m.score) for m in celled] == [(m.crater, m.score) for m in ref]
        assert fast.candidates == slow.candidates == by_cell.candidates
        assert by_cell.projected[-1] >= fast.projected[-1]  # the cells' box around the tree's ball
        windows += sum(c > 0 for c in fast.candidates)
        assert slow.projected == [n]
        if sigma < 1.0:
            small_windows.append(fast.projected[-1])
    assert windows > 50 and small_windows and max(small_windows) < n // 20  # a small window projects a few per cent of the map


def test_map_size_gate_keeps_boxes_that_can_be_map_craters():
    """At 100 km with a 512 px, 39.6 degree camera (focal 711.6 px) a 20 km crater spans 142 px:
    with the gate at 20 km a 150 px box is kept, a 100 px box (14 km) dropped, and the longer side
    judges an elongated box; no altimeter noise here."""
    from types import SimpleNamespace

    from trn.nav.scenario import map_size_gate

    ds, states, rots, craters = synthetic(n=3)
    dets = [SimpleNamespace(frame=0, box=(100, 250, 100, 250)), SimpleNamespace(frame=1, box=(100, 200, 100, 200)),
            SimpleNamespace(frame=2, box=(0, 150, 200, 260))]
    height = np.linalg.norm(states[:, :3], axis=1) - MOON_RADIUS_KM
    assert np.allclose(height, 100.0, atol=0.5)
    np.testing.assert_array_equal(map_size_gate(ds, dets, 20.0, 0.0, seed=0), [True, False, True])
    np.testing.assert_array_equal(map_size_gate(ds, dets, 22.0, 0.0, seed=0), [False, False, False])
    assert map_size_gate(ds, [], 20.0, 0.05, seed=0).shape == (0,)


def _lost_fixes(states, frames, rng, sigma_km=0.2, offset=None):
    out = {}
    for i in frames:
        z = states[i, :3] + rng.normal(0, sigma_km, 3) + (0 if offset is None else offset)
        out[i] = (z, np.eye(3) * sigma_km ** 2)
    return out


def test_cold_start_initialises_from_two_lost_in_space_fixes_and_then_navigates():
    """No state at all: nothing is estimated until two verified fixes 60 s apart give the orbit
    through them; from there the windowed fixes keep the error small, and the first frames have
    no estimate (NaN), not a made-up one."""
    from trn.nav.scenario import ColdStart

    ds, states, rots, craters = synthetic()
    rng = np.random.default_rng(5)
    cold = ColdStart(_lost_fixes(states, [12, 18, 40], rng))
    res = navigate(ds, oracle_matches(states, rots, craters), lambda ids: craters[ids],
                   SensorModel(pixel_sigma=1.0, landmark_sigma_km=0.05), seed=1, cold=cold)
    assert np.isnan(res.error_km[:18]).all() and np.isfinite(res.error_km[18:]).all()
    s = res.summary()
    assert s["first_lost_fix_s"] == 120.0 and s["initialised_s"] == 180.0 and s["initialisations"] == 1
    assert s["initial_error_km"] < 1.0 and res.error_km[60:].max() < 0.5
    assert np.isnan(res.dr_error_km).all() and s["trn"]["rms_km"] < 1.0


def test_cold_start_uses_an_earlier_frame_fixed_late_from_the_frame_that_declared_it():
    """Frame 20's fix also fixed frame 15, late (lost-in-space windows): the pair initialises the
    filter at frame 20 itself; without the late fix one fix alone cannot, and nothing is estimated
    before frame 20 either way."""
    from trn.nav.scenario import ColdStart

    ds, states, rots, craters = synthetic()
    rng = np.random.default_rng(7)
    own = _lost_fixes(states, [20], rng)
    z15, r15 = _lost_fixes(states, [15], rng)[15]
    kw = dict(sensors=SensorModel(pixel_sigma=1.0, landmark_sigma_km=0.05), seed=1)
    res = navigate(ds, oracle_matches(states, rots, craters), lambda ids: craters[ids],
                   cold=ColdStart(own, {20: [(150.0, z15, r15)]}), **kw)
    s = res.summary()
    assert s["first_lost_fix_s"] == 200.0 and s["initialised_s"] == 200.0 and s["initial_error_km"] < 1.0
    assert np.isnan(res.error_km[:20]).all() and res.error_km[60:].max() < 0.5
    alone = navigate(ds, oracle_matches(states, rots, craters), lambda ids: craters[ids], cold=ColdStart(own), **kw)
    assert alone.summary()["initialised_s"] is None and np.isnan(alone.error_km).all()


def test_cold_start_reinitialises_when_the_filter_has_lost_track():
    """Two consistent but wrong fixes (50 km off) initialise the filter wrongly; the right windowed
    fixes are then refused by its gate, and after five refusals a lost-in-space fix that disagrees
    restarts the initialisation, which two right fixes complete."""
    from trn.nav.scenario import ColdStart, SearchWindow  # noqa: F401

    ds, states, rots, craters = synthetic(n=72)  # the crater grid stays in view
    rng = np.random.default_rng(6)
    fixes = _lost_fixes(states, [3, 9], rng, offset=np.array([50.0, 0.0, 0.0]))
    fixes |= _lost_fixes(states, [30, 36], rng)
    res = navigate(ds, oracle_matches(states, rots, craters, every=2), lambda ids: craters[ids],
                   SensorModel(pixel_sigma=1.0, landmark_sigma_km=0.05), seed=2, cold=ColdStart(fixes, reinit_after=5))
    s = res.summary()
    assert s["initialisations"] == 2 and s["reinitialisations"] == 1
    assert res.error_km[9:30].min() > 10.0  # lost: the wrong start
    assert np.isnan(res.error_km[31:36]).all()  # re-initialising: no estimate
    assert res.error_km[50:].max() < 0.5  # found again


def test_cold_start_fuses_the_later_fixes_and_refuses_one_its_gate_rejects():
    """Fixes of 30 m every third frame after a two-fix start: fused, they hold the filter near
    their accuracy where the windowed matches of a coarse detector (8 px) alone leave it several
    times farther; a fix 50 km off among them is refused by the gate, counted, and moves nothing.
    With ``fuse_fixes=False`` the same fixes only start the filter."""
    from trn.nav.scenario import ColdStart

    ds, states, rots, craters = synthetic()
    rng = np.random.default_rng(9)
    fixes = _lost_fixes(states, range(12, 120, 3), rng, sigma_km=0.03)
    fixes[60] = _lost_fixes(states, [60], rng, sigma_km=0.03, offset=np.array([50.0, 0.0, 0.0]))[60]
    kw = dict(sensors=SensorModel(pixel_sigma=8.0, landmark_sigma_km=0.05), seed=1)
    fused = navigate(ds, oracle_matches(states, rots, craters), lambda ids: craters[ids], cold=ColdStart(fixes), **kw)
    alone = navigate(ds, oracle_matches(states, rots, craters), lambda ids: craters[ids],
                     cold=ColdStart(fixes, fuse_fixes=False), **kw)
    f, a = fused.summary(), alone.summary()
    assert f["initialised_s"] == a["initialised_s"] == 150.0
    assert f["lost_fixes_fused"] == len(fixes) - 3 and f["lost_fixes_refused"] == 1
    assert "lost_fixes_fused" not in a and f.get("reinitialisations", 0) == 0
    late = slice(40, 120)
    assert np.sqrt(np.mean(fused.error_km[late] ** 2)) < 0.5 * np.sqrt(np.mean(alone.error_km[late] ** 2))
    assert fused.error_km[late].max() < 0.15 and abs(fused.error_km[60] - fused.error_km[59]) < 0.1


def test_cold_start_from_one_fix_takes_the_velocity_from_the_terrain_motion(tmp_path):
    """Frames 11 and 12 are on disk (a textured sphere rendered along the orbit): the first fix,
    at frame 12, initialises the filter at once with the velocity their terrain motion gives, and
    the error stays within its 3 sigma, and 2 km, until the first windowed match 180 s later; with ``velocity="fixes"`` nothing is
    estimated until that second fix. The featureless frames of a dark sky would be refused and
    fall back to two fixes."""
    import dataclasses

    import cv2
    from tests.nav.test_motion import render, waves

    from trn.data.datasets.luna1 import NAV_IMAGES
    from trn.nav.scenario import ColdStart

    ds, states, rots, craters = synthetic()
    ds = dataclasses.replace(ds, root=tmp_path)
    (tmp_path / NAV_IMAGES).mkdir(parents=True)
    tex = waves(3)
    for i in (11, 12):
        cv2.imwrite(str(ds.frame_path(i)), render(states[i, :3], rots[i], CAM, tex))
    rng = np.random.default_rng(8)
    fixes = _lost_fixes(states, [12, 40], rng)
    kw = dict(sensors=SensorModel(pixel_sigma=1.0, landmark_sigma_km=0.05), seed=1)
    res = navigate(ds, oracle_matches(states, rots, craters, every=30), lambda ids: craters[ids],
                   cold=ColdStart(fixes), **kw)
    s = res.summary()
    assert s["initialised_s"] == 120.0 and s["initialised_by"] == "image motion"
    assert np.isnan(res.error_km[:12]).all() and np.isfinite(res.error_km[12:]).all()
    assert np.all(res.error_km[12:30] < res.sigma3_km[12:30]) and res.error_km[12:30].max() < 2.0
    assert np.all(res.error_km[30:] < res.sigma3_km[30:]) and res.error_km[90:].max() < 0.5
    two = navigate(ds, oracle_matches(states, rots, craters, every=30), lambda ids: craters[ids],
                   cold=ColdStart(fixes, velocity="fixes"), **kw).summary()
    assert two["initialised_s"] == 400.0 and two["initialised_by"] == "two fixes"
    cv2.imwrite(str(ds.frame_path(11)), np.zeros((512, 512), np.uint8))
    dark = navigate(ds, oracle_matches(states, rots, craters, every=30), lambda ids: craters[ids],
                    cold=ColdStart(fixes), **kw).summary()
    assert dark["initialised_s"] == 400.0 and dark["initialised_by"] == "two fixes"


def test_search_window_reads_a_cut_box_by_its_uncut_rim_and_skips_a_box_cut_both_ways():
    """A 120 px crater centred 20 px inside the left border is boxed (0, 80, t, b): the box centre
    (40 px) is 20 px off, the window's bearing pixel is the right rim edge minus half the uncut
    height, 20 px; a box cut by two borders gives no bearing at all."""
    from types import SimpleNamespace

    from trn.nav.scenario import SearchWindow

    ds, states, rots, craters = synthetic(n=1)
    pc = world_to_camera(craters, rots[0], states[0, :3])
    u, v, z = CAM.project(pc)
    a = int(np.flatnonzero((z > 0) & (u > 150) & (u < 362) & (v > 150) & (v < 362))[0])
    ids = list(range(len(craters)))
    sims = np.full((2, len(craters)), 0.1, np.float32)
    sims[:, a] = 0.95
    y = float(v[a])
    cut = SimpleNamespace(frame=0, box=(0, 80, int(y) - 60, int(y) + 60), label=str(a))
    corner = SimpleNamespace(frame=0, box=(0, 80, 0, 70), label=str(a))
    w = SearchWindow([cut, corner], sims, ids, craters, CAM, threshold=0.7, pixel_sigma=5.0)
    got = w(0, states[0, :3], np.eye(3) * 1e4, rots[0])
    assert len(got) == 1 and got[0].crater == a
    assert got[0].pixel[0] == 20.0 and abs(got[0].pixel[1] - int(y)) < 1e-9


def test_the_window_covariance_eigenvalue_in_closed_form_is_numpys():
    from trn.nav.scenario import largest_eigenvalue

    rng = np.random.default_rng(4)
    cases = [np.eye(3) * 0.25, np.zeros((3, 3)), np.diag([1.0, 9.0, 4.0]), np.full((3, 3), 2.0)]
    for _ in range(400):
        a = rng.normal(size=(3, 3))
        v = rng.normal(size=3)
        cases += [a @ a.T * 10.0 ** rng.uniform(-6, 8), np.outer(v, v), a @ a.T + np.eye(3) * 1e6]
    for p in cases:
        want = np.linalg.eigvalsh(p).max()
        assert abs(largest_eigenvalue(p) - want) <= 1e-12 * max(abs(want), 1e-300), p


def test_uncut_boxes_give_the_geometry_of_the_general_rules():
    # a frame whose boxes are all uncut skips the cut rules; the same boxes beside a cut one take them
    from trn.nav.lost import box_geometry

    rng = np.random.default_rng(2)
    cx, cy, h = rng.uniform(80, 430, 20), rng.uniform(80, 430, 20), rng.uniform(5, 40, 20)
    uncut = np.stack([cx - h, cx + h, cy - h * 0.9, cy + h * 0.9], 1)
    cut = np.array([[-10.0, 60.0, 200.0, 280.0]])
    alone = box_geometry(uncut, CAM, 2.0, 6.0)
    mixed = box_geometry(np.vstack([uncut, cut]), CAM, 2.0, 6.0)
    for a, m in zip(alone, mixed):
        np.testing.assert_array_equal(a, m[:-1])
    assert mixed[0][-1, 0] == 60.0 - 40.0 and mixed[3][-1] > 2.0  # the cut box: centre from its rim edge
