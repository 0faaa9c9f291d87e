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

from trn.data.luna1 import atomic_write_text
from trn.errors import DataError
from trn.sim.gallery import draw_gallery
from trn.sim.scenarios import ScenarioResult

TITLES = {"recall_at_1": "Recall@1", "incremental_recall_at_1": "Incremental Recall@1",
          "moon_navigation": "Moon Navigation", "lost_in_space": "Lost-in-Space"}
PAPER = {"recall_at_1": 100.00, "incremental_recall_at_1": 94.78, "moon_navigation": 66.31,
         "lost_in_space": 97.21}


def _thresholds(c: dict) -> str:
    """The match threshold of a run, or each model's where they differ (operating points)."""
    per = c.get("thresholds") or {}
    if per and len(set(per.values())) > 1:
        return ", ".join(f"{m} {t:g}" for m, t in per.items())
    return str(next(iter(per.values()), c.get("threshold")))


@dataclass
class Report:
    """Results of one run. ``context``: dataset, command, models and anything else worth keeping."""

    context: dict
    results: list[ScenarioResult] = field(default_factory=list)

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
            res.append(d)
        return {"format": "trn-sim-report", "version": 1, "context": self.context, "results": res,
                "timing": [{"scenario": r.scenario, "method": r.method, "wall_s": round(r.wall_s, 3)} for r in self.results]}

    def table(self) -> list[str]:
        """Markdown table: one row per method, RA per scenario with its counts."""
        scen = self.scenarios()
        strict = "lost_in_space" in scen
        titles = [TITLES.get(s, s) for s in scen] + (["Lost-in-Space strict (ceiling)"] if strict else [])
        lines = ["| method | " + " | ".join(titles) + " |", "| --- | " + " | ".join("---" for _ in titles) + " |"]
        for m in self.methods():
            cells = []
            for s in scen:
                r = self.get(m, s)
                cells.append("" if r is None else f"{_fmt(r.ra)} ({_counts(r)})")
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

    @classmethod
    def from_json(cls, doc: dict) -> "Report":
        """Rebuild a report from report.json (timings are restored from its "timing" list)."""
        if not isinstance(doc, dict) or doc.get("format") != "trn-sim-report":
            raise DataError("not a trn-sim report.json")
        wall = {(t["scenario"], t["method"]): t["wall_s"] for t in doc.get("timing", [])}
        results = []
        for d in doc["results"]:
            results.append(ScenarioResult(d["scenario"], d["method"], float(d["ra"]), d["correct"], d["incorrect"],
                                          d["missed"], d["queries"], d["seed"], d["settings"], d.get("extra", {}),
                                          d.get("series", {}), d.get("sweep", []), d.get("similarities", {}),
                                          wall.get((d["scenario"], d["method"]), 0.0)))
        return cls(doc.get("context", {}), results)

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
        """report.html: the summary and sweep tables, then every image of ``images`` (read from
        ``out``) embedded as a data URI, so that the file opens anywhere on its own."""
        c = self.context
        parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                 "<title>trn-sim report</title>", f"<style>{_CSS}</style></head><body>",
                 "<h1>trn-sim report</h1>", "<ul>"]
        for key in ("dataset", "command", "seed", "threshold", "nms", "test_landmarks"):
            if key in c:
                value = _thresholds(c) if key == "threshold" else c[key]
                parts.append(f"<li><b>{html.escape(key)}</b>: <code>{html.escape(str(value))}</code></li>")
        parts += ["</ul>", "<h2>Summary</h2>",
                  "<p>RA in percent; in brackets: correct / incorrect / missed (Lost-in-Space: recognised "
                  "frames of orbits 2 and 3).</p>", _html_table(self.table(), "summary")]
        if self.sweep_table():
            parts += ["<h2>Threshold sweep</h2>", _html_table(self.sweep_table(), "sweep")]
        if self.declined_table():
            parts += ["<h2>Declined crops</h2>", "<p>Detections whose crop is black, saturated or flat are declined "
                      "before matching: never matched, not in RA.</p>", _html_table(self.declined_table(), "declined")]
        order = sorted(images, key=lambda p: (not p.name.startswith("moon_navigation"), not p.name.startswith("gallery"),
                                              p.name))
        for p in order:
            data = base64.b64encode((out / p.name).read_bytes()).decode("ascii")
            caption = html.escape(_caption(p.stem))
            mime = "image/jpeg" if p.suffix == ".jpg" else "image/png"
            parts.append(f'<figure id="{html.escape(p.stem)}"><img alt="{caption}" src="data:{mime};base64,{data}">'
                         f"<figcaption>{caption}</figcaption></figure>")
        parts.append("</body></html>")
        return "\n".join(parts) + "\n"

    def markdown(self) -> str:
        c = self.context
        lines = ["# trn-sim report", "", f"- dataset: `{c.get('dataset')}`", f"- command: `{c.get('command')}`",
                 f"- seed: {c.get('seed')}, threshold: {_thresholds(c)}, NMS: {c.get('nms')}", "",
                 "RA in percent; in brackets: correct / incorrect / missed (Lost-in-Space: recognised frames "
                 "of orbits 2 and 3; missed is 0 there because the database is read-only).", ""]
        lines += self.table()
        if self.sweep_table():
            lines += ["", "Threshold sweep (the same streams replayed at thresholds 0.5 to 1.0 in steps of 0.025):", ""]
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
        "figure{margin:1.5em 0} img{max-width:100%;border:1px solid #ddd} figcaption{font-size:90%;color:#444}")


def _caption(stem: str) -> str:
    if stem.startswith("gallery_"):
        scen, _, method = stem[len("gallery_"):].partition("__")
        return (f"{TITLES.get(scen, scen)}, {method}: query crop (left) beside the database crop it matched "
                "(right); green correct, red wrong, grey new insertion, amber a missed re-observation")
    if stem == "moon_navigation":
        return "Moon Navigation: RA along the navigation sequence and the database growth"
    if stem.startswith("similarity_"):
        return f"{TITLES.get(stem[len('similarity_'):], stem)}: decision scores"
    return stem.replace("_", " ")


def _html_table(md: list[str], name: str) -> str:
    """A markdown table (as :meth:`Report.table` writes it) as an HTML table."""
    rows = [[html.escape(c.strip()) for c in line.strip().strip("|").split("|")] for line in md if "---" not in line]
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


def _counts(r: ScenarioResult) -> str:
    if r.scenario == "lost_in_space":
        return "/".join(f"{o['recognised']}/{o['frames']}" for o in r.extra.get("per_orbit", []))
    return f"{r.correct}/{r.incorrect}/{r.missed}"


def plot_all(rep: Report, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    nav = [r for r in rep.results if r.scenario == "moon_navigation"]
    if nav:
        fig, ax = plt.subplots(1, 2, figsize=(11, 4))
        for r in nav:
            ax[0].plot(r.series["frame"], r.series["ra"], label=r.method)
            ax[1].plot(r.series["frame"], r.series["db_size"], label=r.method)
        if nav[0].series.get("frame"):
            ax[1].axhline(nav[0].extra.get("distinct", 0), color="k", ls=":", lw=1, label="distinct craters (ideal)")
        ax[0].set(xlabel="frame", ylabel="cumulative RA (%)", title="Moon Navigation: RA over the sequence")
        ax[1].set(xlabel="frame", ylabel="landmarks in database", title="Database growth")
        for a in ax:
            a.grid(alpha=0.3)
            a.legend(fontsize=7)
        fig.tight_layout()
        written.append(_save(fig, out / "moon_navigation.png"))
    for scen in ("incremental_recall_at_1", "moon_navigation", "lost_in_space", "recall_at_1"):
        rs = [r for r in rep.results if r.scenario == scen and r.similarities]
        if not rs:
            continue
        fig, axes = plt.subplots(1, len(rs), figsize=(3.6 * len(rs), 3.2), squeeze=False)
        for a, r in zip(axes[0], rs):
            bins = np.linspace(-0.2, 1.0, 49)
            for key, col in (("correct", "tab:green"), ("incorrect", "tab:red"), ("inserted", "tab:gray")):
                v = r.similarities.get(key, [])
                if len(v):
                    a.hist(np.clip(v, -0.2, 1.0), bins=bins, alpha=0.6, color=col, label=f"{key} ({len(v)})")
            a.axvline(rep.context.get("threshold", 0.9), color="k", ls="--", lw=1)
            a.set(title=r.method, xlabel="decision score")
            a.legend(fontsize=6)
        fig.suptitle(f"{TITLES[scen]}: scores of correct and incorrect matches")
        fig.tight_layout()
        written.append(_save(fig, out / f"similarity_{scen}.png"))
    sw = [r for r in rep.results if r.sweep]
    if sw:
        scen = list(dict.fromkeys(r.scenario for r in sw))
        fig, axes = plt.subplots(1, len(scen), figsize=(5.5 * len(scen), 4), squeeze=False)
        for a, s in zip(axes[0], scen):
            for r in (x for x in sw if x.scenario == s):
                th = [x["threshold"] for x in r.sweep]
                line, = a.plot(th, [x["ra"] for x in r.sweep], label=f"{r.method} RA")
                a.plot(th, [x["precision"] for x in r.sweep], ls="--", color=line.get_color(), lw=1)
                a.plot(th, [x["recall"] for x in r.sweep], ls=":", color=line.get_color(), lw=1)
            a.set(xlabel="threshold", ylabel="%", title=f"{TITLES[s]}: RA (solid), precision (dashed), recall (dotted)")
            a.title.set_fontsize(8)
            a.grid(alpha=0.3)
            a.legend(fontsize=7)
        fig.tight_layout()
        written.append(_save(fig, out / "threshold_sweep.png"))
    return written


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
