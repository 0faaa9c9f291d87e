"""Scenarios on a hand-built Luna-1 dataset whose answers are known.

Crater k is a bright disc filling a known fraction of its image (and of its box in the frames),
so an oracle embedder can read the identity back from any view: rotation keeps the disc, and
brightness, contrast and the small translations of T do not change its area much. The oracle's
mistakes are then chosen by the test, and so are the counts.
"""

import json

import cv2
import numpy as np
import pytest

from trn.data.datasets import luna1
from trn.data.datasets.landmarks import read_luna1_landmarks
from trn.data.datasets.luna1 import Box, FrameAnnotation
from trn.sim import scenarios as sc
from trn.sim.embedders import Embeddings, NCCEmbedder, TorchEmbedder
from trn.sim.run import run_luna1

FRACTIONS = (0.25, 0.4, 0.55, 0.7)  # disc radius / half-width, per crater 0..3
SIZE = 48


def disc(frac, size):
    img = np.full((size, size), 30, np.uint8)
    cv2.circle(img, (size // 2, size // 2), int(round(frac * size / 2)), 220, -1, lineType=cv2.LINE_AA)
    return img


def write_dataset(root, frames):
    """frames: list of lists of crater ids (0..3). Each crater gets a box of half-width 40 px."""
    (root / luna1.CRATER_DIR).mkdir(parents=True)
    (root / luna1.NAV_IMAGES).mkdir(parents=True)
    for k, f in enumerate(FRACTIONS):
        cv2.imwrite(str(root / luna1.CRATER_DIR / f"{k}.png"), disc(f, 128))
    anns = []
    for i, craters in enumerate(frames):
        img = np.full((100, 300), 30, np.uint8)
        boxes = []
        for j, k in enumerate(craters):
            img[10:90, 100 * j + 10:100 * j + 90] = disc(FRACTIONS[k], 80)
            boxes.append(Box(k, 100 * j + 10, 100 * j + 90, 10, 90))
        cv2.imwrite(str(root / luna1.NAV_IMAGES / f"{i}.png"), img)
        anns.append(FrameAnnotation(i, f"nav_images/{i}.png", tuple(boxes)))
    luna1.write_annotations(root / luna1.ANNOTATIONS, anns)
    return luna1.read_luna1(root)


class Oracle:
    """Reads the crater from the disc area. ``same``: identities given one shared vector (they
    get confused); ``fresh``: identities given a new random direction at every sighting (never
    matched, so every repeat is a duplicate)."""

    name, input_size, dim, tokens, token_dim = "oracle", SIZE, 16, 0, 0

    def __init__(self, same=(), fresh=()):
        self.same, self.fresh = set(same), set(fresh)
        self.rng = np.random.default_rng(0)
        self.seen = []

    def identity(self, im):
        mid = (im.min() + im.max()) / 2
        frac = np.sqrt((im > mid).mean() * 4 / np.pi)
        return int(np.argmin(np.abs(np.array(FRACTIONS) - frac)))

    def __call__(self, images):
        out = np.zeros((len(images), self.dim), np.float32)
        for i, im in enumerate(images):
            k = self.identity(im)
            self.seen.append(k)
            if k in self.fresh:
                out[i] = self.rng.normal(size=self.dim)
                out[i] /= np.linalg.norm(out[i])
            else:
                out[i, min(self.same) if k in self.same else k] = 1.0
        return Embeddings(out)


@pytest.fixture
def bank(tmp_path):
    write_dataset(tmp_path / "d", [[0]])
    ls = read_luna1_landmarks(tmp_path / "d")
    return sc.LandmarkViews(ls, ["0", "1", "2", "3"], SIZE)


def test_the_oracle_reads_every_augmented_view(bank):
    o = Oracle()
    sc.incremental_recall_at_1(bank, o, sc.ScenarioSettings(seed=3))
    assert sorted(o.seen) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_recall_at_1_counts(bank):
    r = sc.recall_at_1(bank, Oracle(), sc.ScenarioSettings())
    assert (r.ra, r.correct, r.incorrect) == (100.0, 4, 0)
    r = sc.recall_at_1(bank, Oracle(same={0, 1}), sc.ScenarioSettings())
    # queries of 0 and 1 tie between galleries 0 and 1; the first gallery entry wins
    assert (r.correct, r.incorrect, r.ra) == (3, 1, 75.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_incremental_recall_counts(bank, seed):
    s = sc.ScenarioSettings(seed=seed)
    r = sc.incremental_recall_at_1(bank, Oracle(), s)
    assert (r.correct, r.incorrect, r.missed, r.ra) == (4, 0, 0, 100.0)
    # 0 and 1 share a vector: whichever comes first is inserted, the other three sightings match it,
    # one of them correctly; 3 is never recognised, so its second sighting is a duplicate
    r = sc.incremental_recall_at_1(bank, Oracle(same={0, 1}, fresh={3}), s)
    assert (r.correct, r.incorrect, r.missed) == (2, 2, 1)
    assert r.ra == pytest.approx(100 * 2 / 5)
    assert r.extra["db_size"] == 4 and r.extra["db_craters"] == 3


def test_ra_definition():
    assert sc.Counts(3, 1, 1).ra == 60.0 and sc.Counts(3, 1, 1).matching_accuracy == 75.0
    assert np.isnan(sc.Counts(0, 0, 0).ra)


NAV = [[0], [0, 1], [1], [2], [0], [2, 3], [3]]


def quiet(**kw):
    return sc.ScenarioSettings(shrink_px=0, shift_px=0, **kw)


def test_moon_navigation_counts(tmp_path):
    ds = write_dataset(tmp_path / "d", NAV)
    r = sc.moon_navigation(ds, Oracle(), quiet())
    assert (r.correct, r.incorrect, r.missed, r.queries) == (5, 0, 0, 9)
    assert r.series["db_size"] == [1, 2, 2, 3, 3, 4, 4]
    r = sc.moon_navigation(ds, Oracle(same={0, 1}, fresh={3}), quiet())
    # 0 ins | 0 ok, 1 wrong | 1 wrong | 2 ins | 0 ok | 2 ok, 3 ins | 3 ins (duplicate)
    assert (r.correct, r.incorrect, r.missed) == (3, 2, 1)
    assert r.ra == pytest.approx(50.0)
    assert r.series["ra"][-1] == pytest.approx(50.0)
    # craters seen (the ideal database) are a property of the data; craters stored are the method's
    assert (r.extra["detections"], r.extra["craters"], r.extra["db_craters"]) == (9, 4, 3)


def test_moon_navigation_names_the_craters_left_after_declined_crops(tmp_path):
    """The report's crater counts agree with the dataset's: every crater after NMS, then those
    whose crops were not all declined (crater 3's two crops are flat here)."""
    ds = write_dataset(tmp_path / "d", NAV)
    for i, cols in ((5, slice(100, 200)), (6, slice(0, 300))):
        p = ds.frame_path(i)
        img = cv2.imread(str(p), cv2.IMREAD_GRAYSCALE)
        img[:, cols] = 30
        cv2.imwrite(str(p), img)
    r = sc.moon_navigation(ds, Oracle(), quiet())
    e = r.extra
    assert (e["detections_after_nms"], e["craters_after_nms"]) == (9, 4)
    assert (e["detections"], e["craters"], e["declined"]["count"]) == (7, 3, 2)
    assert e["db_craters"] == 3 and r.queries == 7


def test_lost_in_space_counts(tmp_path):
    # orbit 1: frames 0-1, orbit 2: frames 2-3, orbit 3: frames 4-5
    ds = write_dataset(tmp_path / "d", [[0, 1], [2], [0, 1, 2], [3], [0], [1, 3]])
    s = quiet(orbits=((0, 1), (2, 3), (4, 5)))
    r = sc.lost_in_space(ds, Oracle(), s)
    # crater 3 is not in the database. Frame 3 (one box, no correct match) still counts, since
    # floor(1 / 2) = 0: the paper's criterion. The strict variant needs at least one.
    assert r.extra["per_orbit"][0]["recognised"] == 2 and r.extra["per_orbit"][1]["recognised"] == 2
    assert r.ra == 100.0 and r.extra["strict_ra"] == pytest.approx(75.0)
    assert (r.correct, r.incorrect, r.extra["unmatched"]) == (5, 0, 2)
    r = sc.lost_in_space(ds, Oracle(same={0, 1}), s)
    # frame 2: 0 and 1 both resolve to whichever was seeded first -> 2 of 3 correct, still a hit
    assert r.extra["per_orbit"][0]["recognised"] == 2


def test_lost_in_space_hit_rule():
    assert sc.lost_in_space_hit(0, 1) and sc.lost_in_space_hit(1, 3) and not sc.lost_in_space_hit(1, 4)


def test_nms_variants():
    a, b = Box(1, 0, 10, 0, 10), Box(2, 2, 6, 2, 6)  # b lies inside a
    # release: a comes first (lower bottom edge); b's overlap is the intersection over the kept
    # box's area, 16 / 100 <= 0.5, so b survives
    assert sc.nms([a, b], 0.5, "release") == [a, b]
    # standard IoU = 16 / 100 as well: both kept; a near-duplicate is suppressed by both
    c = Box(3, 1, 10, 0, 10)
    assert sc.nms([a, c], 0.5, "standard") == [a]
    assert sc.nms([a, c], 0.5, "release") == [a]
    # the release's asymmetry: a small box kept first suppresses a big one it sits inside
    big, small = Box(1, 0, 10, 0, 8), Box(2, 2, 6, 4, 9)
    assert sc.nms([big, small], 0.5, "release") == [small]
    assert sc.nms([big, small], 0.5, "standard") == [big, small]


def test_detector_noise_is_bounded_and_seeded(tmp_path):
    ds = write_dataset(tmp_path / "d", NAV)
    s = sc.ScenarioSettings(shrink_px=10, shift_px=10)
    d1 = sc.detect(ds, [1, 5], s, np.random.default_rng(4), (100, 300))
    d2 = sc.detect(ds, [1, 5], s, np.random.default_rng(4), (100, 300))
    assert d1 == d2
    for d in d1[1] + d1[5]:
        l, r, t, b = d.box
        assert 0 <= l < r <= 300 and 0 <= t < b <= 100 and r - l >= 60 - 20
        assert 15 <= d.angle <= 345 and 0.75 <= d.brightness <= 1.25 and 0.75 <= d.contrast <= 1.25


def test_same_seed_same_report_with_a_real_model(tmp_path):
    from trn.models.descriptor import create_model

    ds = write_dataset(tmp_path / "d", NAV)
    model = create_model("flight", input_size=SIZE).eval()
    emb = TorchEmbedder(model, "tiny")
    names = ["0", "1", "2", "3"]

    def run(seed):
        s = sc.ScenarioSettings(seed=seed, threshold=0.95)
        bank = sc.LandmarkViews(read_luna1_landmarks(ds.root), names, SIZE)
        res = [sc.recall_at_1(bank, emb, s), sc.incremental_recall_at_1(bank, emb, s),
               sc.moon_navigation(ds, emb, s), sc.moon_navigation(ds, NCCEmbedder(SIZE, 16), s)]
        return json.dumps([{**r.summary(), "wall_s": 0, "sweep": r.sweep, "series": r.series} for r in res])

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_run_writes_a_report(tmp_path):
    ds = write_dataset(tmp_path / "d", [[0, 1], [2], [0, 1, 2], [3], [0], [1, 3]] + [[k % 4] for k in range(8)])
    s = quiet(orbits=((0, 1), (2, 3), (4, 13)))
    rep = run_luna1(ds, [Oracle(), NCCEmbedder(SIZE, 16)], ["moon_navigation", "lost_in_space"], s,
                    {"dataset": "hand-built"}, progress=False)
    files = rep.write(tmp_path / "out")
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    got = {(r["method"], r["scenario"]): r for r in doc["results"]}
    assert got[("oracle", "moon_navigation")]["ra"] == 100.0
    assert {"ra", "correct", "incorrect", "missed", "seed", "settings"} <= set(got[("ncc", "lost_in_space")])
    assert (tmp_path / "out" / "moon_navigation.png").is_file() and (tmp_path / "out" / "threshold_sweep.png").is_file()
    assert "| oracle |" in (tmp_path / "out" / "report.md").read_text()
    assert len(files) >= 5
    from trn.sim.report import Report

    assert json.loads(json.dumps(Report.from_json(doc).to_json())) == doc  # report.json alone re-renders the report


def test_uninformative_crops_are_declined_never_matched(tmp_path):
    # frames 0..3: crater 0, then 0 again (its frame blacked out: the night side), 1, and 0 in a
    # saturated frame; both broken crops are declined, counted and listed, never matched
    ds = write_dataset(tmp_path / "d", [[0], [0], [1], [0]])
    cv2.imwrite(str(tmp_path / "d" / luna1.NAV_IMAGES / "1.png"), np.zeros((100, 300), np.uint8))
    cv2.imwrite(str(tmp_path / "d" / luna1.NAV_IMAGES / "3.png"), np.full((100, 300), 255, np.uint8))
    r = sc.moon_navigation(ds, Oracle(), quiet())
    assert (r.correct, r.incorrect, r.missed, r.queries) == (0, 0, 0, 2)
    assert r.extra["declined"]["count"] == 2 and r.extra["declined"]["by_reason"] == {"black": 1, "saturated": 1}
    assert [e["frame"] for e in r.extra["declined"]["examples"]] == [1, 3]
    # without declining, the black crop reaches the database (the paper's protocol)
    r = sc.moon_navigation(ds, Oracle(), quiet(decline=False))
    assert r.queries == 4
    # Lost-in-Space: a query frame whose only crop is declined is not counted as recognised; an
    # orbit left with no frame is not scored, and the mean is over the other
    r = sc.lost_in_space(ds, Oracle(), quiet(orbits=((0, 0), (1, 2), (3, 3))))
    assert [o["frames"] for o in r.extra["per_orbit"]] == [1, 0]
    assert np.isnan(r.extra["per_orbit"][1]["accuracy"]) and r.ra == 100.0
    s = quiet(orbits=((0, 0), (1, 2), (2, 3)))
    r = sc.lost_in_space(ds, Oracle(), s)
    assert r.extra["frames_all_declined"] == 2 and r.extra["declined"]["count"] == 2
    assert [o["frames"] for o in r.extra["per_orbit"]] == [1, 1]


def test_each_model_matches_at_its_operating_point_unless_a_threshold_is_given(tmp_path):
    from trn.sim.run import run_luna1

    ds = write_dataset(tmp_path / "d", NAV)
    picky = Oracle()
    picky.name = "picky"
    loose = Oracle()
    loose.name, loose.operating_threshold = "loose", -1.0  # everything matches the first entry
    rep = run_luna1(ds, [picky, loose], ["moon_navigation"], quiet(), {}, progress=False, operating_points=True)
    assert rep.context["thresholds"] == {"picky": 0.9, "loose": -1.0}
    by = {r.method: r for r in rep.results}
    assert (by["picky"].correct, by["picky"].incorrect) == (5, 0)
    assert by["loose"].incorrect > 0 and by["loose"].settings["threshold"] == -1.0
    assert "picky 0.9, loose -1" in rep.markdown()
    rep = run_luna1(ds, [picky, loose], ["moon_navigation"], quiet(), {}, progress=False, operating_points=False)
    assert {r.method: r.incorrect for r in rep.results} == {"picky": 0, "loose": 0}


@pytest.mark.parametrize("seed", [-1, sc.MAX_SEED + 1, 2**62, 1.5, True])
def test_scenario_seeds_are_32_bit_whole_numbers(seed):
    from trn.errors import ConfigError

    with pytest.raises(ConfigError, match="seed=.*: need a whole number from 0 to 4294967295"):
        sc.ScenarioSettings(seed=seed)
    s = sc.ScenarioSettings(seed=sc.MAX_SEED)
    sc._generator(s.seed, 1000)  # the largest seed still seeds a torch generator


def test_detections_jitter_brightness_only_as_the_authors_evaluation_does():
    from trn.errors import ConfigError

    # droneslab/mars src/eval.py: ColorJitter(0.25, 0., 0., 0.): brightness only, no contrast
    s = sc.ScenarioSettings()
    assert (s.jitter, s.contrast_jitter) == (0.25, 0.0)
    both = sc.ScenarioSettings(contrast_jitter=0.25)
    a = [sc.draw_detection(0, "a", (100, 160, 100, 160), s, rng, (512, 512))
         for rng in [np.random.default_rng(7)] for _ in range(50)]
    b = [sc.draw_detection(0, "a", (100, 160, 100, 160), both, rng, (512, 512))
         for rng in [np.random.default_rng(7)] for _ in range(50)]
    assert all(d.contrast == 1.0 for d in a) and any(d.contrast != 1.0 for d in b)
    assert all(0.75 <= d.brightness <= 1.25 for d in a) and len({d.brightness for d in a}) > 40
    # the contrast range never moves the box, brightness and angle draws that follow it
    assert [(d.box, d.brightness, d.angle) for d in a] == [(d.box, d.brightness, d.angle) for d in b]
    with pytest.raises(ConfigError, match="contrast_jitter"):
        sc.ScenarioSettings(contrast_jitter=1.5)


def test_a_pair_embeds_frame_crops_with_its_frame_descriptor_and_landmark_renders_with_its_landmark_one(tmp_path):
    from trn.errors import ConfigError
    from trn.sim.embedders import PairEmbedder, for_source

    ds = write_dataset(tmp_path / "d", [[0], [0], [0], [0]])
    frames, landmarks = Oracle(), Oracle()
    frames.name, landmarks.name = "frame_oracle", "landmark_oracle"
    frames.operating_threshold = 0.5
    pair = PairEmbedder("pair", frames, landmarks)
    assert for_source(pair, "frames") is frames and for_source(pair, "landmarks") is landmarks
    assert for_source(frames, "landmarks") is frames  # a single model embeds both
    with pytest.raises(ConfigError, match="pair is a descriptor pair"):
        pair(np.zeros((1, SIZE, SIZE), np.float32))  # nothing reaches a pair unrouted
    s = quiet(orbits=((0, 1), (2, 2), (3, 3)))
    rep = run_luna1(ds, [pair], ["recall_at_1", "incremental_recall_at_1"], s, {}, progress=False,
                    operating_points=True)
    assert landmarks.seen and not frames.seen  # landmark renders never reach the frame descriptor
    n_landmark_views = len(landmarks.seen)
    rep2 = run_luna1(ds, [pair], ["moon_navigation", "lost_in_space"], s, {}, progress=False, operating_points=True)
    assert frames.seen and len(landmarks.seen) == n_landmark_views  # nor frame crops the landmark descriptor
    results = rep.results + rep2.results
    assert {r.method for r in results} == {"pair"}
    assert {r.scenario: r.extra["descriptor"] for r in results} == {
        "recall_at_1": "landmark_oracle", "incremental_recall_at_1": "landmark_oracle",
        "moon_navigation": "frame_oracle", "lost_in_space": "frame_oracle"}
    # each member at its own operating point, named in the report
    assert rep2.context["thresholds"] == {"pair frames": 0.5, "pair landmarks": 0.9}
    assert rep2.context["pairs"] == {"pair": {"frames": "frame_oracle", "landmarks": "landmark_oracle"}}
    assert {r.scenario: r.settings["threshold"] for r in results}["moon_navigation"] == 0.5
    assert {r.scenario: r.settings["threshold"] for r in results}["recall_at_1"] == 0.9
    assert ("pair is a descriptor pair: frame crops embedded by frame_oracle, landmark renders by landmark_oracle"
            in rep2.markdown())


def test_a_models_least_crop_side_cuts_its_scenario_crops():
    """An embedder with ``crop_min_px`` has its detections cut as squares at least that many frame
    pixels a side (the margin raised, at most 3): a 20 px box at 1.25 with 60 px becomes the 60 px
    square, the same crop as a margin of 3; a large box keeps 1.25; without it nothing changes."""
    from trn.data.views.crops import jittered_crop

    rng = np.random.default_rng(5)
    frame = (rng.random((200, 200)) * 255).astype(np.uint8)
    dets = [sc.Detection(0, "a", (90, 110, 90, 110), 1.0, 1.0, 0.0),
            sc.Detection(0, "b", (40, 160, 40, 160), 1.0, 1.0, 0.0)]

    class Emb:
        crop_margin, crop_min_px = 1.25, 60.0

    got = sc.detection_crops(lambda k: frame, dets, 32, sc.crop_margin(Emb), min_side=sc.crop_min_side(Emb))
    np.testing.assert_allclose(got[0], jittered_crop(frame, dets[0].box, 32, 3.0), atol=1e-6)
    np.testing.assert_allclose(got[1], jittered_crop(frame, dets[1].box, 32, 1.25), atol=1e-6)
    plain = sc.detection_crops(lambda k: frame, dets, 32, 1.25)
    np.testing.assert_allclose(plain[0], jittered_crop(frame, dets[0].box, 32, 1.25), atol=1e-6)
    assert sc.crop_min_side(object()) == 0.0
