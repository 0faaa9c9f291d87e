"""Scenario reports: report.json (every count and setting), report.md, plots, galleries of
decisions, and report.html (the same content in one self-contained file: images embedded, no
script, no network)."""

from __future__ import annotations

import base64
import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trn.data.files import atomic_write_text
from trn.errors import DataError
from trn.sim.gallery import KINDS, draw_gallery
from trn.sim.scenarios import ScenarioResult
from trn.sim.timing import CADENCE_S, COVERS_SHORT

TITLES = {"recall_at_1": "Recall@1", "incremental_recall_at_1": "Incremental Recall@1",
          "moon_navigation": "Moon Navigation", "lost_in_space": "Lost-in-Space"}
PAPER = {"recall_at_1": 100.00, "incremental_recall_at_1": 94.78, "moon_navigation": 66.31,
         "lost_in_space": 97.21}


# the one legend of the counts in brackets, wherever a result is written (console, log, report, README)
LEGEND_COUNTS = "In brackets: correct / incorrect / missed (missed: a crater seen again but inserted as new)."
LEGEND_LIS = ("Lost-in-Space: frames recognised / query frames in orbit 2, then in orbit 3 (the paper's rule); "
              "Lost-in-Space strict: RA under the strict rule (at least one correct match and half of a frame's "
              "boxes), in brackets its ceiling.")
LEGEND = f"RA in percent. {LEGEND_COUNTS} {LEGEND_LIS}"


def legend(scenarios: list[str]) -> str:
    """:data:`LEGEND`, cut to the scenarios a table shows."""
    parts = ["RA in percent."]
    if any(x != "lost_in_space" for x in scenarios):
        parts.append(LEGEND_COUNTS)
    if "lost_in_space" in scenarios:
        parts.append(LEGEND_LIS)
    return " ".join(parts)


def counts_text(r: ScenarioResult) -> str:
    """The counts in brackets after a result's RA (see :data:`LEGEND`): ``correct/incorrect/missed``,
    or for Lost-in-Space ``recognised/frames`` of orbit 2, then orbit 3."""
    if r.scenario == "lost_in_space":
        return ", ".join(f"{o['recognised']}/{o['frames']}" for o in r.extra.get("per_orbit", []))
    return f"{r.correct}/{r.incorrect}/{r.missed}"


def result_line(r: ScenarioResult) -> str:
    """One result for the console and the log, in the table's format with its legend spelled out."""
    if r.scenario == "lost_in_space":
        orbits = ", ".join(f"orbit {o['orbit']} {o['recognised']}/{o['frames']}" for o in r.extra.get("per_orbit", []))
        return (f"{r.method} / {TITLES.get(r.scenario, r.scenario)}: RA {_fmt(r.ra)} (frames recognised / query "
                f"frames: {orbits}); crops: {r.correct} matched correctly, {r.incorrect} wrongly, "
                f"{r.extra.get('unmatched', 0)} unmatched")
    return (f"{r.method} / {TITLES.get(r.scenario, r.scenario)}: RA {_fmt(r.ra)} (correct/incorrect/missed "
            f"{counts_text(r)})")


def trained_on_lines(c: dict) -> list[str]:
    """One line per descriptor that trained or validated on craters the run queries (the
    context's ``trained_on``, :mod:`trn.sim.provenance`): its figures there are not recognition of
    unseen craters."""
    out = []
    for name, by_source in (c.get("trained_on") or {}).items():
        for source, n in by_source.items():
            what = "landmark renders" if source == "landmarks" else "navigation frames' craters"
            if n.get("trained_on"):
                out.append(f"{name} trained or validated on {n['trained_on']} of the {n['queried']} {what} this run "
                           "queries: its figures on them are not recognition of unseen craters")
            elif n.get("trained_on", 0) is None:
                out.append(f"{name}: which of the {n['queried']} {what} this run queries it trained on is unknown here "
                           "(its training data is not on this machine)")
    return out


def _thresholds(c: dict) -> str:
    """The match threshold of a run, or each model's where they differ (operating points)."""
    per = c.get("thresholds") or {}
    if per and len(set(per.values())) > 1:
        return ", ".join(f"{m} {t:g}" for m, t in per.items())
    return str(next(iter(per.values()), c.get("threshold")))


def _pair_text(name: str, members: dict) -> str:
    return (f"{name} is a descriptor pair: frame crops embedded by {members.get('frames')}, landmark renders by "
            f"{members.get('landmarks')}")


@dataclass
class Report:
    """Results of one run. ``context``: dataset, command, models and anything else worth keeping.
    ``gallery_rows``: the kinds of decision each gallery shows, by (scenario, method), for a report
    rebuilt from report.json (a live result knows them from its picks)."""

    context: dict
    results: list[ScenarioResult] = field(default_factory=list)
    gallery_rows: dict = field(default_factory=dict)

    def rows_of(self, r: ScenarioResult) -> list[str]:
        """The rows of ``r``'s gallery, in drawing order."""
        if r.gallery:
            return [k for k in KINDS if any(p.kind == k for p in r.gallery)]
        return list(self.gallery_rows.get((r.scenario, r.method), []))

    def methods(self) -> list[str]:
        return list(dict.fromkeys(r.method for r in self.results))

    def scenarios(self) -> list[str]:
        return list(dict.fromkeys(r.scenario for r in self.results))

    def get(self, method: str, scenario: str) -> ScenarioResult | None:
        return next((r for r in self.results if r.method == method and r.scenario == scenario), None)

    def to_json(self) -> dict:
        """Everything except timings, which live under "timing" (so equal seeds give equal
        "results")."""
        res = []
        for r in self.results:
            d = r.summary()
            d.pop("wall_s")
            d["sweep"] = r.sweep
            d["series"] = r.series
            d["similarities"] = {k: [round(float(v), 6) for v in vals] for k, vals in r.similarities.items()}
            d["gallery_rows"] = self.rows_of(r)
            res.append(d)
        return {"format": "trn-sim-report", "version": 1, "context": self.context, "results": res,
                "timing": [{"scenario": r.scenario, "method": r.method, "wall_s": round(r.wall_s, 3)} for r in self.results]}

    def table(self) -> list[str]:
        """Markdown table: one row per method, RA per scenario with its counts; then a blank line
        and the legend of the counts (:func:`legend`)."""
        return self.table_rows() + ["", legend(self.scenarios())]

    def table_rows(self) -> list[str]:
        """The summary table alone (markdown)."""
        scen = self.scenarios()
        strict = "lost_in_space" in scen
        titles = [TITLES.get(s, s) for s in scen] + (["Lost-in-Space strict (ceiling)"] if strict else [])
        lines = ["| method | " + " | ".join(titles) + " |", "| --- | " + " | ".join("---" for _ in titles) + " |"]
        for m in self.methods():
            cells = []
            for s in scen:
                r = self.get(m, s)
                cells.append("" if r is None else f"{_fmt(r.ra)} ({counts_text(r)})")
            if strict:
                r = self.get(m, "lost_in_space")
                cells.append("" if r is None or "strict_ra" not in r.extra else
                             f"{_fmt(r.extra['strict_ra'])} ({_fmt(r.extra.get('oracle_strict_ra', float('nan')))})")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("| paper (best, Luna-1) | " + " | ".join([_fmt(PAPER[s]) if s in PAPER else "" for s in scen]
                                                            + ([""] if strict else [])) + " |")
        return lines

    def declined_table(self) -> list[str]:
        """Markdown table of the crops declined before matching (nothing to recognise), per
        method and scenario; empty when none was."""
        rows = []
        for r in self.results:
            d = r.extra.get("declined") if isinstance(r.extra, dict) else None
            if d and d.get("count"):
                why = ", ".join(f"{k} {v}" for k, v in sorted(d["by_reason"].items()))
                first = "; ".join(f"frame {e['frame']} crater {e['label']} ({e['reason']})" for e in d["examples"][:4])
                rows.append(f"| {r.method} | {TITLES.get(r.scenario, r.scenario)} | {d['count']} | {why} | {first} |")
        if not rows:
            return []
        return ["| method | scenario | declined crops | why | first of them |", "| --- | --- | --- | --- | --- |", *rows]

    def sweep_table(self) -> list[str]:
        """Markdown table: the best RA over the threshold sweep and where it is, per method."""
        scen = [s for s in self.scenarios() if any(r.sweep for r in self.results if r.scenario == s)]
        if not scen:
            return []
        lines = ["| method | " + " | ".join(f"{TITLES.get(s, s)}: best RA (threshold)" for s in scen) + " |",
                 "| --- | " + " | ".join("---" for _ in scen) + " |"]
        for m in self.methods():
            cells = []
            for s in scen:
                r = self.get(m, s)
                best = _best(r.sweep) if r is not None and r.sweep else None
                cells.append("" if best is None else f"{_fmt(best['ra'])} ({best['threshold']})")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        return lines

    def timing_table(self) -> list[str]:
        """Markdown table of the Moon Navigation frame latency (``--profile`` / ``--board``), then
        what the figures cover; empty when no result was timed."""
        rows, covers = [], set()
        for r in self.results:
            t = r.extra.get("timing") if isinstance(r.extra, dict) else None
            if not t:
                continue
            covers.add(t.get("covers", "embedding and database search"))
            src = t["source"].removesuffix(f" ({COVERS_SHORT})")
            rows.append(f"| {r.method} | {src} | {t['per_landmark_ms']:.2f} | {t['mean_frame_ms']:.1f} | "
                        f"{t['worst_frame_ms']:.1f} | {t['frames_over_budget']} | {t['margin_ms'] / 1e3:.2f} |")
        if not rows:
            return []
        return ["| method | source | per landmark ms | mean frame ms | worst frame ms | frames over the "
                f"{CADENCE_S:g} s cadence | margin s |", "| --- | --- | --- | --- | --- | --- | --- |", *rows, "",
                "A frame's time covers " + "; ".join(sorted(covers)) + "."]

    @classmethod
    def from_json(cls, doc: dict) -> "Report":
        """Rebuild a report from report.json (timings are restored from its "timing" list)."""
        if not isinstance(doc, dict) or doc.get("format") != "trn-sim-report":
            raise DataError("not a trn-sim report.json")
        wall = {(t["scenario"], t["method"]): t["wall_s"] for t in doc.get("timing", [])}
        results, rows = [], {}
        for d in doc["results"]:
            extra = dict(d.get("extra", {}))
            if "distinct" in extra and "db_craters" not in extra:
                # reports before the rename: "distinct" was the craters a method's database held
                extra["db_craters"] = extra.pop("distinct")
            results.append(ScenarioResult(d["scenario"], d["method"], float(d["ra"]), d["correct"], d["incorrect"],
                                          d["missed"], d["queries"], d["seed"], d["settings"], extra,
                                          d.get("series", {}), d.get("sweep", []), d.get("similarities", {}),
                                          wall.get((d["scenario"], d["method"]), 0.0)))
            if "gallery_rows" in d:
                rows[(d["scenario"], d["method"])] = list(d["gallery_rows"])
        return cls(doc.get("context", {}), results, rows)

    def write(self, out: Path) -> list[Path]:
        out.mkdir(parents=True, exist_ok=True)
        written = [out / "report.json", out / "report.md"]
        atomic_write_text(out / "report.json", json.dumps(self.to_json(), indent=1, allow_nan=True) + "\n")
        atomic_write_text(out / "report.md", self.markdown())
        written += plot_all(self, out)
        written += write_galleries(self, out)
        images = [p for p in written if p.suffix in (".png", ".jpg")]
        # re-rendered from report.json (no thumbnails): keep the galleries the run drew
        images += [p for p in map(lambda r: out / gallery_name(r), self.results) if p.is_file() and p not in images]
        atomic_write_text(out / "report.html", self.html(out, images))
        written.append(out / "report.html")
        return written

    def html(self, out: Path, images: list[Path]) -> str:
        """report.html: each table with its legend and the figure that belongs to it right after it
        (summary; frame latency; threshold sweep and its plot; declined crops; Moon Navigation along
        the sequence; decision scores; galleries), every image of ``images`` (read from ``out``)
        embedded as a data URI, so that the file opens anywhere on its own."""
        c = self.context
        parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                 "<title>trn-sim report</title>", f"<style>{_CSS}</style></head><body>",
                 "<h1>trn-sim report</h1>", "<ul>"]
        for key in ("dataset", "world", "command", "seed", "threshold", "nms", "test_landmarks"):
            if key in c:
                value = _thresholds(c) if key == "threshold" else c[key]
                parts.append(f"<li><b>{html.escape(key)}</b>: <code>{html.escape(str(value))}</code></li>")
        for name, m in (c.get("pairs") or {}).items():
            parts.append(f"<li>{html.escape(_pair_text(name, m))}</li>")
        parts += [f"<li><b>{html.escape(line)}</b></li>" for line in trained_on_lines(c)]
        parts += ["</ul>", "<h2>Summary</h2>", f'<p class="legend">{html.escape(legend(self.scenarios()))}</p>',
                  _html_table(self.table_rows(), "summary")]
        by_stem = {p.stem: p for p in images}
        shown: set[str] = set()

        def figure(stem: str, caption: str) -> None:
            p = by_stem.get(stem)
            if p is None or stem in shown:
                return
            shown.add(stem)
            data = base64.b64encode((out / p.name).read_bytes()).decode("ascii")
            mime = "image/jpeg" if p.suffix == ".jpg" else "image/png"
            cap = html.escape(caption)
            parts.append(f'<figure id="{html.escape(stem)}"><img alt="{cap}" src="data:{mime};base64,{data}">'
                         f"<figcaption>{cap}</figcaption></figure>")

        timing = self.timing_table()
        if timing:
            parts += ["<h2>Frame latency (Moon Navigation)</h2>",
                      f'<p class="legend">{html.escape(timing[-1])}</p>', _html_table(timing, "timing")]
        if self.sweep_table():
            parts += ["<h2>Threshold sweep</h2>", f"<p>{html.escape(SWEEP_TEXT)}</p>",
                      _html_table(self.sweep_table(), "sweep")]
            figure("threshold_sweep", _caption("threshold_sweep"))
        if self.declined_table():
            parts += ["<h2>Declined crops</h2>", "<p>Detections whose crop is black, saturated or flat are declined "
                      "before matching: never matched, not in RA.</p>", _html_table(self.declined_table(), "declined")]
        if "moon_navigation" in by_stem:
            parts.append("<h2>Moon Navigation along the sequence</h2>")
            figure("moon_navigation", _caption("moon_navigation"))
        scores = [st for st in (f"similarity_{x}" for x in TITLES) if st in by_stem]
        if scores:
            parts.append("<h2>Decision scores</h2>")
            for st in scores:
                figure(st, _caption(st))
        galleries = [r for r in self.results if gallery_name(r)[:-4] in by_stem]
        if galleries:
            parts += ["<h2>Galleries of decisions</h2>", f'<p class="legend">{html.escape(GALLERY_TEXT)}</p>']
            order = {x: k for k, x in enumerate(TITLES)}
            for r in sorted(galleries, key=lambda r: order.get(r.scenario, len(order))):
                figure(gallery_name(r)[:-4], gallery_caption(r.scenario, r.method, self.rows_of(r)))
        rest = sorted(st for st in by_stem if st not in shown)
        if rest:
            parts.append("<h2>Other figures</h2>")
            for st in rest:
                figure(st, _caption(st))
        parts.append("</body></html>")
        return "\n".join(parts) + "\n"

    def markdown(self) -> str:
        c = self.context
        lines = ["# trn-sim report", "", f"- dataset: `{c.get('dataset')}`"]
        if c.get("world"):
            lines.append(f"- world: {c['world']}")
        lines += [f"- command: `{c.get('command')}`",
                  f"- seed: {c.get('seed')}, threshold: {_thresholds(c)}, NMS: {c.get('nms')}"]
        lines += [f"- {_pair_text(name, m)}" for name, m in (c.get("pairs") or {}).items()]
        lines += [f"- **{line}**" for line in trained_on_lines(c)] + [""]
        lines += self.table()
        if self.timing_table():
            lines += ["", "Frame latency of Moon Navigation:", ""] + self.timing_table()
        if self.sweep_table():
            lines += ["", SWEEP_TEXT, ""]
            lines += self.sweep_table()
        if self.declined_table():
            lines += ["", "Crops declined before matching (black, saturated or flat; never matched, not in RA):", ""]
            lines += self.declined_table()
        lines += ["", "## Details", ""]
        for r in self.results:
            lines.append(f"### {TITLES.get(r.scenario, r.scenario)} — {r.method}")
            lines.append("")
            lines.append(f"RA {_fmt(r.ra)}; correct {r.correct}, incorrect {r.incorrect}, missed {r.missed}, "
                         f"queries {r.queries}; {r.wall_s:.1f} s.")
            for k, v in r.extra.items():
                lines.append(f"- {k}: {json.dumps(v) if isinstance(v, (list, dict)) else _fmt(v)}")
            if r.sweep:
                best = _best(r.sweep)
                lines.append(f"- threshold sweep: best RA {_fmt(best['ra'])} at {best['threshold']} "
                             f"(precision {_fmt(best['precision'])}, recall {_fmt(best['recall'])})")
            lines.append("")
        return "\n".join(lines) + "\n"


_CSS = ("body{font-family:sans-serif;margin:2em;max-width:1400px} table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #bbb;padding:4px 8px;text-align:left} th{background:#eee}"
        "figure{margin:1em 0 2em 0} img{max-width:100%;border:1px solid #ddd} figcaption{font-size:90%;color:#444}"
        ".legend{font-size:90%;color:#333}")

SWEEP_TEXT = ("Threshold sweep: the same streams replayed at thresholds 0.5 to 1.0 in steps of 0.025; each cell is "
              "the best RA and, in brackets, the threshold where it occurs.")
GALLERY_TEXT = ("In each gallery, a row per kind of decision. Under each pair: the decision score (the similarity "
                "the threshold applies to: cosine for the descriptors, correlation for NCC) and #k, the query's "
                "position in its stream; below, the query's crater id -> the crater id it was matched to.")
PAIRS = {"recall_at_1": "each query view (left) beside the gallery view it ranked first (right)",
         "lost_in_space": ("each query crop of orbits 2 and 3 (left) beside the orbit-1 database crop it matched "
                           "(right)")}
ROW_TEXT = {"correct": "green: matched to the same crater",
            "wrong": "red: matched to another crater",
            "new": "grey: inserted, the crater's first appearance (no partner)",
            "duplicate": "amber: inserted although the crater was already stored, a missed re-observation "
                         "(right: the crater's first stored crop)",
            "unmatched": "amber: no match above the threshold (the database is read-only)"}
# the rows a scenario can have, for reports written before galleries recorded theirs
SCENARIO_ROWS = {"recall_at_1": ["correct", "wrong"], "lost_in_space": ["correct", "wrong", "unmatched"]}


def gallery_caption(scenario: str, method: str, rows: list[str]) -> str:
    """The caption of one gallery: what is paired, and a legend of exactly the rows it shows."""
    rows = rows or SCENARIO_ROWS.get(scenario, ["correct", "wrong", "new", "duplicate"])
    pairs = PAIRS.get(scenario, "each query crop (left) beside the database crop it matched (right)")
    return (f"{TITLES.get(scenario, scenario)}, {method}: {pairs}. Rows: " + "; ".join(ROW_TEXT[k] for k in rows)
            + ". Under each pair: decision score, #position in the stream; query crater -> matched crater.")


def _caption(stem: str) -> str:
    if stem.startswith("gallery_"):
        scen, _, method = stem[len("gallery_"):].partition("__")
        return gallery_caption(scen, method, [])
    if stem == "moon_navigation":
        return ("Moon Navigation: cumulative RA along the navigation sequence (left) and the number of landmarks in "
                "the database (right; dotted: the craters detected, the size a perfect descriptor would reach)")
    if stem == "threshold_sweep":
        return ("Threshold sweep: RA (solid), precision (dashed) and recall (dotted) of each method when the same "
                "streams are replayed at each threshold")
    if stem.startswith("similarity_"):
        scen = stem[len("similarity_"):]
        grey = "queries left unmatched (grey)" if scen == "lost_in_space" else "insertions (grey)"
        return (f"{TITLES.get(scen, stem)}: histograms of the decision scores of correct matches (green), wrong "
                f"matches (red) and {grey}, one panel per method; dashed: the method's threshold")
    return stem.replace("_", " ")


def _html_table(md: list[str], name: str) -> str:
    """A markdown table (the "|" lines of what :meth:`Report.table_rows` writes) as an HTML table."""
    rows = [[html.escape(c.strip()) for c in line.strip().strip("|").split("|")] for line in md
            if line.startswith("|") and "---" not in line]
    if not rows:
        return ""
    head = "".join(f"<th>{c}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows[1:])
    return f'<table class="{name}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def gallery_name(r: ScenarioResult) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in r.method)
    return f"gallery_{r.scenario}__{safe}.jpg"


def write_galleries(rep: Report, out: Path) -> list[Path]:
    """gallery_<scenario>__<method>.jpg for every result that kept decisions (JPEG at quality 90:
    the crops are photographs, and PNG made each gallery five times larger)."""
    import cv2

    written = []
    for r in rep.results:
        if not r.gallery:
            continue
        path = out / gallery_name(r)
        img = draw_gallery(r.gallery, f"{TITLES.get(r.scenario, r.scenario)} - {r.method}: decisions")
        ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])
        if not ok:
            raise DataError("gallery image could not be encoded", path)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(buf.tobytes())
        tmp.replace(path)
        written.append(path)
    return written


def _best(sweep: list[dict]) -> dict:
    return max(sweep, key=lambda x: -1 if math.isnan(x["ra"]) else x["ra"])


def _fmt(v) -> str:
    if isinstance(v, float):
        return "n/a" if math.isnan(v) else f"{v:.2f}"
    return str(v)


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False)) or text


# the histograms' series, by kind of decision and whether the scenario's database is read-only
HIST_NAMES = {("correct", False): "correct match", ("correct", True): "correct match",
              ("incorrect", False): "wrong match", ("incorrect", True): "wrong match",
              ("inserted", False): "inserted as new landmarks", ("inserted", True): "left unmatched"}


def plot_all(rep: Report, out: Path) -> list[Path]:
    """moon_navigation.png, similarity_<scenario>.png and threshold_sweep.png. Every figure is laid
    out by matplotlib's constrained layout with titles wrapped to their panel, and saved with a
    tight bounding box, so that no title or label is cut at the image's edge."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    per = rep.context.get("thresholds") or {}
    nav = [r for r in rep.results if r.scenario == "moon_navigation"]
    if nav:
        fig, ax = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
        for r in nav:
            ax[0].plot(r.series["frame"], r.series["ra"], label=r.method)
            ax[1].plot(r.series["frame"], r.series["db_size"], label=r.method)
        ideal = nav[0].extra.get("craters")
        if nav[0].series.get("frame") and ideal is not None:
            ax[1].axhline(ideal, color="k", ls=":", lw=1, label=f"craters detected ({ideal}): a perfect descriptor")
        ax[0].set(xlabel="frame", ylabel="cumulative RA (%)", title="Moon Navigation: RA over the sequence")
        ax[1].set(xlabel="frame", ylabel="landmarks in database", title="Database growth")
        for a in ax:
            a.grid(alpha=0.3)
            a.legend(fontsize=7)
        written.append(_save(fig, out / "moon_navigation.png"))
    for scen in ("incremental_recall_at_1", "moon_navigation", "lost_in_space", "recall_at_1"):
        rs = [r for r in rep.results if r.scenario == scen and r.similarities]
        if not rs:
            continue
        fig, axes = plt.subplots(1, len(rs), figsize=(3.6 * len(rs), 3.4), squeeze=False, layout="constrained")
        # Lost-in-Space's database is read-only: a query below the threshold is left unmatched
        read_only = scen == "lost_in_space"
        for a, r in zip(axes[0], rs):
            bins = np.linspace(-0.2, 1.0, 49)
            for key, col in (("correct", "tab:green"), ("incorrect", "tab:red"), ("inserted", "tab:gray")):
                v = r.similarities.get(key, [])
                if len(v):
                    a.hist(np.clip(v, -0.2, 1.0), bins=bins, alpha=0.6, color=col,
                           label=f"{HIST_NAMES[key, read_only]} ({len(v)})")
            # the threshold the result ran at (a pair's members each at their own)
            t = (r.settings or {}).get("threshold", per.get(r.method, rep.context.get("threshold", 0.9)))
            a.axvline(t, color="k", ls="--", lw=1, label=f"threshold {t:g}")
            a.set_title(_wrap(r.method, 30), fontsize=9)
            a.set_xlabel("decision score")
            a.legend(fontsize=6)
        grey = HIST_NAMES["inserted", read_only]
        fig.suptitle(_wrap(f"{TITLES[scen]}: decision scores of correct matches (green), wrong matches (red) and "
                           f"queries {grey} (grey)", 14 * len(rs) + 20), fontsize=10)
        written.append(_save(fig, out / f"similarity_{scen}.png"))
    sw = [r for r in rep.results if r.sweep]
    if sw:
        scen = list(dict.fromkeys(r.scenario for r in sw))
        fig, axes = plt.subplots(1, len(scen), figsize=(5.5 * len(scen), 4.2), squeeze=False, layout="constrained")
        for a, s in zip(axes[0], scen):
            for r in (x for x in sw if x.scenario == s):
                th = [x["threshold"] for x in r.sweep]
                line, = a.plot(th, [x["ra"] for x in r.sweep], label=f"{r.method} RA")
                a.plot(th, [x["precision"] for x in r.sweep], ls="--", color=line.get_color(), lw=1,
                       label=f"{r.method} precision")
                a.plot(th, [x["recall"] for x in r.sweep], ls=":", color=line.get_color(), lw=1,
                       label=f"{r.method} recall")
            a.set_xlabel("threshold")
            a.set_ylabel("%")
            a.set_title(_wrap(f"{TITLES[s]}: RA (solid), precision (dashed), recall (dotted)", 48), fontsize=9)
            a.grid(alpha=0.3)
            a.legend(fontsize=7)
        written.append(_save(fig, out / "threshold_sweep.png"))
    return written


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.12, facecolor="white")
    plt.close(fig)
    return path
