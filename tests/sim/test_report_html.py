"""Galleries of decisions and report.html, opened in a real headless Chromium when one is installed."""

import base64
import html
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


def _captions(page: str) -> dict[str, str]:
    return {k: html.unescape(v) for k, v in
            re.findall(r'<figure id="([^"]+)">.*?<figcaption>(.*?)</figcaption></figure>', page, flags=re.S)}


def _clear_margin(png: bytes | str, px: int = 3) -> bool:
    """Whether an image's outer ``px`` pixels are background: nothing drawn runs off its edge."""
    img = cv2.imread(png) if isinstance(png, str) else cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR)
    edge = np.concatenate([img[:px].reshape(-1, 3), img[-px:].reshape(-1, 3), img[:, :px].reshape(-1, 3),
                           img[:, -px:].reshape(-1, 3)])
    return bool((edge.min(axis=1) >= 235).all())


def _check_page(page: str) -> None:
    """What a reader needs from report.html, shared by the file check and the browser's DOM."""
    from trn.sim.report import LEGEND, ROW_TEXT

    # one format for the counts, with its legend beside the table
    assert LEGEND in html.unescape(page)
    assert re.search(r"<td>\d+\.\d\d \(\d+/\d+, \d+/\d+\)</td>", page), "Lost-in-Space cell not 'RA (a/b, c/d)'"
    caps = _captions(page)
    # every gallery caption explains the numbers under the tiles and names exactly the rows it shows
    lis = caps["gallery_lost_in_space__oracle"]
    assert "decision score" in lis and "#position in the stream" in lis
    assert ROW_TEXT["unmatched"] in lis
    assert "grey" not in lis and "missed re-observation" not in lis  # no such rows in Lost-in-Space
    nav = caps["gallery_moon_navigation__oracle"]
    assert "green" in nav and "grey" in nav
    # the sweep plot sits right under the sweep table
    assert re.search(r'<table class="sweep">.*?</table>\n<figure id="threshold_sweep">', page, flags=re.S)


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
    again = (out / "report.html").read_text(encoding="utf-8")
    assert again.count("data:image/") == len(pngs)
    _check_page(page)
    _check_page(again)  # the gallery rows and captions survive the round trip through report.json
    assert _captions(again) == _captions(page)


def test_counts_have_one_format_and_one_legend(tmp_path):
    """Console table, log line and report write Lost-in-Space as recognised/frames per orbit
    with the same legend (it was `a/b/c/d`, `(a/b, c/d)` and crop counts in three places)."""
    from trn.sim.report import LEGEND, Report, result_line

    rep, _ = _report(tmp_path)
    table = rep.table()
    assert table[-2:] == ["", LEGEND] and "frames recognised / query frames in orbit 2, then in orbit 3" in LEGEND
    nav_only = Report(rep.context, [rep.get("oracle", "moon_navigation")])
    assert "Lost-in-Space" not in nav_only.table()[-1]  # the legend names only what the table shows
    r = rep.get("oracle", "lost_in_space")
    (o2, o3) = r.extra["per_orbit"]
    cell = f"({o2['recognised']}/{o2['frames']}, {o3['recognised']}/{o3['frames']})"
    assert any(cell in line for line in table if line.startswith("| oracle"))
    line = result_line(r)
    assert (f"frames recognised / query frames: orbit 2 {o2['recognised']}/{o2['frames']}, orbit 3 "
            f"{o3['recognised']}/{o3['frames']}") in line
    m = rep.get("oracle", "moon_navigation")
    assert f"(correct/incorrect/missed {m.correct}/{m.incorrect}/{m.missed})" in result_line(m)


def test_plots_keep_every_title_inside_and_apart(tmp_path, monkeypatch):
    """Histogram titles were cut at the PNG's edge (a one-panel figure under a long suptitle) and
    long method names ran into each other: every text now lies inside its figure, no two axes
    titles overlap, none overlaps the suptitle, and nothing is drawn on the saved image's edge."""
    from trn.sim import report as rp
    from trn.sim.scenarios import ScenarioResult

    rng = np.random.default_rng(0)
    sims = {"correct": rng.uniform(0.8, 1, 40).tolist(), "incorrect": rng.uniform(0.5, 1, 20).tolist(),
            "inserted": rng.uniform(0, 0.9, 30).tolist()}
    sweep = [{"threshold": t, "ra": 50.0, "precision": 60.0, "recall": 40.0} for t in (0.5, 0.75, 1.0)]
    names = ["flight_conv2d_se_frames+tok4s20", "flight_ric_ca_mars+tok9s20_with_a_very_long_suffix"]

    def result(scen, method):
        return ScenarioResult(scen, method, 50.0, 1, 1, 0, 2, 0, {}, extra={}, similarities=sims, sweep=sweep,
                              series={"frame": [0, 1], "ra": [0.0, 50.0], "db_size": [1, 2]})

    checked = []
    real_save = rp._save

    def save(fig, path):
        fig.canvas.draw()
        rend = fig.canvas.get_renderer()
        box = fig.bbox
        texts = [x for a in fig.axes for x in (a.title, a.xaxis.label, a.yaxis.label)]
        texts += [x for a in fig.axes if a.get_legend() for x in a.get_legend().get_texts()]
        texts = [x for x in texts + [fig._suptitle] if x is not None and x.get_text()]
        for t in texts:
            e = t.get_window_extent(rend)
            assert box.x0 - 1 <= e.x0 and e.x1 <= box.x1 + 1 and box.y0 - 1 <= e.y0 and e.y1 <= box.y1 + 1, \
                (path.name, t.get_text())
        titles = [a.title.get_window_extent(rend) for a in fig.axes if a.get_title()]
        if fig._suptitle is not None:
            titles.append(fig._suptitle.get_window_extent(rend))
        for i in range(len(titles)):
            for j in range(i + 1, len(titles)):
                assert not titles[i].overlaps(titles[j]), (path.name, i, j)
        checked.append(path.name)
        return real_save(fig, path)

    monkeypatch.setattr(rp, "_save", save)
    for methods in (names[:1], names):  # one panel (the default run), then two side by side
        rep = rp.Report({"threshold": 0.9}, [result(s, m) for s in ("incremental_recall_at_1", "moon_navigation")
                                             for m in methods])
        out = tmp_path / f"p{len(methods)}"
        out.mkdir()
        for p in rp.plot_all(rep, out):
            assert _clear_margin(str(p)), p.name
    assert {"similarity_incremental_recall_at_1.png", "threshold_sweep.png", "moon_navigation.png"} <= set(checked)



def test_every_plotted_series_is_in_a_legend_and_the_grey_bars_are_named(tmp_path, monkeypatch):
    """The sweep's legend listed only the RA lines (not precision and recall) and the histograms'
    titles spoke of correct and incorrect matches while grey bars stood beside them: every line
    and histogram of every figure now has its legend entry, and each histogram figure's title says
    what its grey bars are."""
    from trn.sim import report as rp
    from trn.sim.scenarios import ScenarioResult

    rng = np.random.default_rng(0)
    sims = {"correct": rng.uniform(0.8, 1, 40).tolist(), "incorrect": rng.uniform(0.5, 1, 20).tolist(),
            "inserted": rng.uniform(0, 0.9, 30).tolist()}
    sweep = [{"threshold": t, "ra": 50.0, "precision": 60.0, "recall": 40.0} for t in (0.5, 0.75, 1.0)]
    seen = {}
    real_save = rp._save

    def save(fig, path):
        for a in fig.axes:
            shown = {t.get_text() for t in a.get_legend().get_texts()} if a.get_legend() else set()
            # a histogram's label is on its bars (the first patch), not on its container
            series = [ln.get_label() for ln in a.get_lines()] + [c.patches[0].get_label() for c in a.containers]
            assert series and all(x in shown for x in series), (path.name, series, shown)
        seen[path.name] = (fig._suptitle.get_text() if fig._suptitle else "").replace("\n", " ")
        return real_save(fig, path)

    monkeypatch.setattr(rp, "_save", save)
    rep = rp.Report({"threshold": 0.9}, [
        ScenarioResult(s, m, 50.0, 1, 1, 0, 2, 0, {}, extra={}, similarities=sims, sweep=sweep,
                       series={"frame": [0, 1], "ra": [0.0, 50.0], "db_size": [1, 2]})
        for s in ("incremental_recall_at_1", "moon_navigation", "lost_in_space") for m in ("a", "b")])
    rp.plot_all(rep, tmp_path)
    assert {"threshold_sweep.png", "moon_navigation.png", "similarity_lost_in_space.png"} <= set(seen)
    assert "inserted as new landmarks (grey)" in seen["similarity_moon_navigation.png"]
    assert "left unmatched (grey)" in seen["similarity_lost_in_space.png"]


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
    # as the browser laid it out: legends, captions naming only the rows shown, the sweep plot under
    # its table, and every plot and gallery the browser decoded drawn clear of its own edges (a
    # title cut off inside a PNG would touch it)
    _check_page(dom)
    for stem, data in re.findall(r'<figure id="([^"]+)"><img [^>]*src="data:image/\w+;base64,([^"]+)"', dom):
        if not stem.startswith("gallery_"):
            assert _clear_margin(base64.b64decode(data)), stem
