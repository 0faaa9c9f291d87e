"""Galleries of decisions and report.html, opened in a real headless Chromium when one is installed."""

import re
import shutil
import subprocess

import cv2
import numpy as np
import pytest

from trn.db.database import Decision
from trn.sim.embedders import NCCEmbedder
from trn.sim.gallery import COLOURS, THUMB, draw_gallery, pick_ranked, pick_stream, thumbnails
from trn.sim.run import run_luna1
from tests.sim.test_scenarios import SIZE, Oracle, quiet, write_dataset


def _thumbs(n):
    return np.stack([np.full((THUMB, THUMB), 10 * k, np.uint8) for k in range(n)])


def test_stream_picks_pair_each_query_with_the_crop_that_made_its_entry():
    labels = ["a", "b", "a", "c", "b", "c"]
    dec = [Decision(0, False, float("nan"), None), Decision(1, False, 0.2, None), Decision(0, True, 0.95, "a"),
           Decision(2, False, 0.5, None), Decision(2, True, 0.91, "c"), Decision(3, False, 0.8, None)]
    t = _thumbs(6)
    picks = {p.position: p for p in pick_stream(dec, labels, t)}
    assert {k: p.kind for k, p in picks.items()} == {0: "new", 1: "new", 2: "correct", 3: "new", 4: "wrong",
                                                     5: "duplicate"}
    same = np.array_equal
    assert same(picks[2].match, t[0]) and same(picks[4].match, t[3])  # entries 0 and 2: made by queries 0 and 3
    assert same(picks[5].match, t[3])  # the duplicate's partner: crater c's first stored crop
    assert picks[0].match is None and picks[4].matched_label == "c"


def test_read_only_picks_use_the_database_thumbnails():
    stored = ({7: 0, 9: 1}, _thumbs(2))
    dec = [Decision(9, True, 0.93, "x"), Decision(-1, False, 0.3, None)]
    picks = pick_stream(dec, ["x", "y"], _thumbs(2) + 100, stored=stored)
    assert [p.kind for p in picks] == ["correct", "unmatched"]
    assert np.array_equal(picks[0].match, stored[1][1]) and picks[1].match is None


def test_ranked_picks_and_spread_cap():
    top = np.array([0, 0, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    picks = pick_ranked(top, np.ones(11), [str(k) for k in range(11)], _thumbs(11), _thumbs(11), per_kind=4)
    kinds = [p.kind for p in picks]
    assert kinds.count("wrong") == 1 and kinds.count("correct") == 4
    assert [p.position for p in picks if p.kind == "correct"] == [0, 4, 7, 10]  # evenly over the 10 correct ones


def test_gallery_image_has_a_row_per_kind_in_its_colour():
    labels = ["a", "a", "b", "b"]
    dec = [Decision(0, False, float("nan"), None), Decision(0, True, 0.95, "a"), Decision(0, True, 0.92, "a"),
           Decision(1, False, 0.4, None)]
    img = draw_gallery(pick_stream(dec, labels, thumbnails(np.random.default_rng(0).random((4, 20, 20)))), "t")
    for kind in ("correct", "wrong", "new"):
        assert (img == np.array(COLOURS[kind], np.uint8)).all(axis=2).sum() > 100, kind
    assert not (img == np.array(COLOURS["duplicate"], np.uint8)).all(axis=2).any()


def _report(tmp_path):
    ds = write_dataset(tmp_path / "d", [[0, 1], [2], [0, 1, 2], [3], [0], [1, 3]] + [[k % 4] for k in range(8)])
    s = quiet(orbits=((0, 1), (2, 3), (4, 13)))
    rep = run_luna1(ds, [Oracle(same={0, 1}), NCCEmbedder(SIZE, 16)], ["moon_navigation", "lost_in_space"], s,
                    {"dataset": "hand-built <world>", "command": "pytest"}, progress=False)
    out = tmp_path / "out"
    rep.write(out)
    return rep, out


def test_report_html_is_self_contained(tmp_path):
    rep, out = _report(tmp_path)
    page = (out / "report.html").read_text(encoding="utf-8")
    pngs = sorted(p.name for p in [*out.glob("*.png"), *out.glob("*.jpg")])
    assert any(n.startswith("gallery_moon_navigation__oracle") and n.endswith(".jpg") for n in pngs)
    assert page.count('src="data:image/') == len(pngs)
    assert "<script" not in page and not re.search(r"(src|href)=\"(https?:|//|file:)", page)
    assert "hand-built &lt;world&gt;" in page  # context is escaped
    assert "<td>oracle</td>" in page and "<th>Moon Navigation</th>" in page
    # re-rendered from report.json alone (no thumbnails), the page still shows the run's galleries
    from trn.sim.report import Report
    import json

    Report.from_json(json.loads((out / "report.json").read_text())).write(out)
    assert (out / "report.html").read_text(encoding="utf-8").count("data:image/") == len(pngs)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (Debian: apt-get install chromium)")
def test_report_html_renders_in_headless_chromium(tmp_path):
    _, out = _report(tmp_path)
    shot = tmp_path / "shot.png"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars", "--window-size=1400,5000",
           f"--screenshot={shot}", (out / "report.html").as_uri()]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    img = cv2.imread(str(shot))
    assert img is not None and img.shape[1] == 1400
    # the galleries were decoded and laid out: their green (correct) and red (wrong) frames are on screen
    for kind in ("correct", "wrong"):
        b, g, r = COLOURS[kind]
        near = (np.abs(img.astype(int) - np.array([b, g, r])).sum(axis=2) < 30).sum()
        assert near > 500, f"no {kind} frames in the screenshot"
    dom = subprocess.run([*cmd[:-2], "--dump-dom", (out / "report.html").as_uri()], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    assert dom.count("<tr>") >= 3 and "Moon Navigation" in dom
