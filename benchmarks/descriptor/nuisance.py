"""What separates two crops of one crater in Moon Navigation: one nuisance at a time.

    python benchmarks/descriptor/nuisance.py --data data/luna1-val MODEL [MODEL ...]
    python benchmarks/descriptor/nuisance.py --data data/luna1-val --table-only [--margin 1.25] MODEL [MODEL ...]

First, the perturbation table (:mod:`trn.sim.pairs`): every crater box of the annotated frames
after the scenario's NMS (uninformative crops declined), paired with the same crater's box in the
next frame (same-crater pairs), with five boxes of other craters drawn from the whole sequence
(impostors of the sequence) and with the other craters' boxes in the next frame (impostors of the
next frame; few on a validation orbit, which boxes few craters a frame). Each crop is cut,
perturbed with the scenario's own code and settings (detector box noise, brightness and contrast,
rotation; each crop its own seeded draw) and embedded; a row per perturbation alone and combined
gives the same-crater pairs' mean cosine and share >= 0.9, the impostors' share >= 0.9, and the
same-crater share at the thresholds that let 5 % and 1 % of the sequence's impostors through (the
separation, whatever the scale of a model's cosines). The
crops are cut as the model asks (``crop_margin``) unless ``--margin`` sets it.

Then (unless ``--table-only``) the Moon Navigation crops of a Luna-1 directory exactly as the
scenario cuts them (NMS, seeded detector noise, rotation, photometric jitter, uninformative crops
declined), per model:

- the same detection cut again with one nuisance changed (rotation +97 degrees, the photometric
  jitter removed, the box shrunk by 8 px on each side): mean cosine and share >= 0.9, over the
  first 300 detections;
- pairs of detections of one crater by how many frames apart they are, by box size and by
  clipping at the frame edge;
- separation (AUC) with every crop first turned to its mean shading gradient, against as cut.

Run it on a validation orbit: every annotated crater of a test sequence is a test crater.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402


def canonical(x: np.ndarray) -> np.ndarray:
    """Each image turned so that its centre-weighted mean intensity gradient points along +x."""
    import cv2

    s = x.shape[1]
    yy, xx = np.mgrid[:s, :s] - (s - 1) / 2
    w = np.exp(-(xx ** 2 + yy ** 2) / (2 * (0.3 * s) ** 2))
    out = np.empty_like(x)
    for i, im in enumerate(x):
        b = cv2.GaussianBlur(im, (0, 0), 1.5)
        gx, gy = cv2.Sobel(b, cv2.CV_32F, 1, 0, ksize=3), cv2.Sobel(b, cv2.CV_32F, 0, 1, ksize=3)
        ang = float(np.degrees(np.arctan2((w * gy).sum(), (w * gx).sum())))
        m = cv2.getRotationMatrix2D(((s - 1) / 2, (s - 1) / 2), ang, 1.0)
        out[i] = cv2.warpAffine(im, m, (s, s), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
    return out


class Canonical:
    """An embedder that sees every crop turned to its canonical orientation first."""

    def __init__(self, emb):
        self.emb = emb
        self.input_size, self.dim, self.tokens, self.token_dim = emb.input_size, emb.dim, emb.tokens, emb.token_dim

    def __call__(self, images: np.ndarray):
        return self.emb(canonical(np.asarray(images, np.float32)))


class Margin:
    """An embedder whose navigation crops are cut with another margin."""

    def __init__(self, emb, margin: float):
        self.emb, self.crop_margin = emb, float(margin)
        self.name = f"{emb.name} (margin {margin:g})"
        self.input_size, self.dim, self.tokens, self.token_dim = emb.input_size, emb.dim, emb.tokens, emb.token_dim

    def __call__(self, images: np.ndarray):
        return self.emb(images)


# the table's rows: which of the protocol's perturbations each crop gets
PERTURBATIONS = (("clean box crops, no perturbation", ()),
                 ("rotation only", ("rotation",)),
                 ("detector box noise only", ("noise",)),
                 ("brightness and contrast only", ("photometric",)),
                 ("box noise + rotation", ("noise", "rotation")),
                 ("box noise + brightness and contrast", ("noise", "photometric")),
                 ("the full protocol", ("noise", "photometric", "rotation")))


def perturbation_table(ds, emb, s) -> list[str]:
    """The table's lines for one embedder (see the module docstring)."""
    from trn.sim import scenarios as sc
    from trn.sim.pairs import at_frame_edge, consecutive_pairs, navigation_boxes, pair_shares

    clean = navigation_boxes(ds, s)
    same, other = consecutive_pairs(clean)
    edge = at_frame_edge(clean, sc.frame_shape(ds))
    cut = edge[same[:, 0]] | edge[same[:, 1]]
    lines = [f"{len(clean)} boxes of {len({d.label for d in clean})} craters; {len(same)} same-crater pairs in "
             f"consecutive frames; impostor pairs: {len(other)} of the next frame, 5 a box of the sequence; crops cut "
             f"with margin {getattr(emb, 'crop_margin', 1.0):g}",
             "| crops | same-crater mean cosine | same-crater share >= 0.9 | impostors of the sequence: mean cosine | "
             "share >= 0.9 | impostors of the next frame: share >= 0.9 | same-crater share where 5 % / 1 % of the "
             "sequence's impostors pass (threshold) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, parts in PERTURBATIONS:
        r = pair_shares(ds, emb, s, parts, boxes=clean, threshold=0.9)
        (s5, t5), (s1, t1) = r.same_at_impostor_share(0.05), r.same_at_impostor_share(0.01)
        lines.append(f"| {name} | {r.same.mean():.3f} | {100 * r.same_share:.1f} % | {r.impostor_any.mean():.3f} | "
                     f"{100 * r.impostor_any_share:.1f} % | {100 * r.impostor_share:.1f} % | {100 * s5:.1f} % ({t5:.3f}) / "
                     f"{100 * s1:.1f} % ({t1:.3f}) |")
        if name in ("clean box crops, no perturbation", "the full protocol"):
            # the same pairs split by whether the frame's border cuts either crater
            for part, m in (("neither crater cut by the frame's edge", ~cut), ("one or both cut by the edge", cut)):
                c = r.same[m]
                if len(c):
                    lines.append(f"| {name}: {part} ({m.sum()} pairs) | {c.mean():.3f} | {100 * (c >= 0.9).mean():.1f} % "
                                 f"| | | | {100 * (c >= t5).mean():.1f} % / {100 * (c >= t1).mean():.1f} % |")
    return lines


def _row(name: str, c: np.ndarray) -> str:
    return f"| {name} | {len(c)} | {c.mean():.3f} | {(c >= 0.9).mean():.3f} |" if len(c) else f"| {name} | 0 | - | - |"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="shipped model names, run directories or checkpoints")
    ap.add_argument("--data", type=Path, required=True, help="Luna-1 directory with annotated frames (a validation orbit)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n", type=int, default=300, help="detections for the one-nuisance rows")
    ap.add_argument("--margin", type=float, default=None,
                    help="cut every model's crops with this margin (default: each model's own crop_margin)")
    ap.add_argument("--table-only", action="store_true", help="print the perturbation table only")
    args = ap.parse_args()
    import torch

    from trn.data.datasets.luna1 import read_luna1
    from trn.sim import scenarios as sc
    from trn.sim.embedders import make_embedder
    from trn.sim.metrics import separation

    torch.set_num_threads(args.threads)
    print("hardware:", hardware())
    ds = read_luna1(args.data)
    s = sc.ScenarioSettings()
    embedders = {}
    for spec in args.models:
        emb = make_embedder(spec)
        embedders[spec] = Margin(emb, args.margin) if args.margin is not None else emb
        print(f"\n{spec}: perturbation table", flush=True)
        print("\n".join(perturbation_table(ds, embedders[spec], s)), flush=True)
    if args.table_only:
        return 0
    flat, declined = sc.moon_navigation_crops(ds, s)  # exactly Moon Navigation's inputs
    h, w = sc.frame_shape(ds)
    lab = np.array([d.label for d in flat])
    print(f"{len(flat)} crops of {len(set(lab))} craters ({len(declined)} declined)")
    few = flat[:args.n]
    changes = (("rotation +97 degrees", [replace(d, angle=(d.angle + 97.0) % 360.0) for d in few]),
               ("photometric jitter removed", [replace(d, brightness=1.0, contrast=1.0) for d in few]),
               ("box shrunk by 8 px on each side",
                [replace(d, box=(d.box[0] + 8, d.box[1] - 8, d.box[2] + 8, d.box[3] - 8)) for d in few]))
    fr = np.array([d.frame for d in flat])
    size = np.array([min(d.box[1] - d.box[0], d.box[3] - d.box[2]) for d in flat])
    clip = np.array([d.box[0] <= 0 or d.box[2] <= 0 or d.box[1] >= w or d.box[3] >= h for d in flat])
    same = (lab[:, None] == lab[None, :]) & ~np.eye(len(lab), dtype=bool)
    upper = np.triu(np.ones_like(same), 1)
    gap = np.abs(fr[:, None] - fr[None, :])
    for spec, emb in embedders.items():
        e = sc._embed_crops(ds, flat, emb).global_
        sim = e @ e.T
        print(f"\n{spec}\n| pairs | n | mean cosine | share >= 0.9 |\n| --- | --- | --- | --- |")
        base = e[:len(few)]
        for name, alt in changes:
            print(_row(f"same detection, {name}", (base * sc._embed_crops(ds, alt, emb).global_).sum(1)), flush=True)
        for lo, hi in ((1, 2), (2, 4), (4, 8), (8, 10 ** 9)):
            m = same & upper & (gap >= lo) & (gap < hi)
            span = f"{lo}+" if hi > 10 ** 6 else (f"{lo}" if hi == lo + 1 else f"{lo}-{hi - 1}")
            print(_row(f"one crater, {span} frame{'' if span == '1' else 's'} apart", sim[m]))
        for lo, hi in ((0, 80), (80, 160), (160, 300), (300, 10 ** 9)):
            k = (size >= lo) & (size < hi)
            print(_row(f"one crater, both boxes {lo}{'+' if hi > 10 ** 6 else f'-{hi - 1}'} px", sim[same & upper & k[:, None] & k[None, :]]))
        for name, k in (("both clipped at the frame edge", clip), ("neither clipped", ~clip)):
            print(_row(f"one crater, {name}", sim[same & upper & k[:, None] & k[None, :]]))
        c = sc._embed_crops(ds, flat, Canonical(emb)).global_
        print(f"AUC as cut {separation(e, lab, 0.9).auc:.4f}; every crop turned to its mean shading gradient first "
              f"{separation(c, lab, 0.9).auc:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
