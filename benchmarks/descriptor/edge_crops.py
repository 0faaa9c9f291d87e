"""Other crops for a crater cut by the frame's edge, measured on Moon Navigation and trained with.

    python benchmarks/descriptor/edge_crops.py measure --crop axis --data data/luna1-val MODEL [MODEL ...]
    python benchmarks/descriptor/edge_crops.py train --crop axis -- --config CONFIG --out RUN [key=value ...]
    python benchmarks/descriptor/edge_crops.py train --crop mirror --min-side 240 -- --config CONFIG --out RUN

The navigation crop of a model with a margin (:func:`trn.data.views.crops.square_crop`) is the
square of ``margin`` times the box's longer side centred on the box, the frame mirrored where the
square leaves it. For a crater that the frame's edge cuts, that centres the crop on the part in
view and mirrors it at the border, so two frames that cut one crater differently show two
different pictures. The variants here replace that one function, in this process only, for
everything that cuts navigation crops (the scenarios, the training orbits' views, the training
log's validation orbit):

- ``mirror``: the product's crop, unchanged (the control);
- ``complete``: the square centred on the whole crater (a box within ``--near`` px of one edge of
  an axis is taken to be cut there; the crater's diameter is the box's longer side, the uncut axis,
  since a box is annotated while the crater's centre is in view), the part outside the frame filled
  with the mean of the part inside;
- ``axis``: the same square, the part outside the frame mirrored about the crater's own centre
  line (a crater is near symmetric) instead of about the frame's edge;
- ``clamp``: the product's square moved inward until it lies inside the frame (no filled pixels;
  the crater off centre).

``--min-side PX`` then cuts every square crop at least PX frame pixels a side (a margin that grows
as the crater is smaller: the model setting ``crop_min_px``, added to a training's overrides and
given to a measured embedder), with ``--crop mirror`` the product's crop otherwise.

``measure`` prints Moon Navigation's RA at each threshold with the variant's crops (the scenario's
detections, database and counting: ``benchmarks/descriptor/moon_navigation_edges.py``). ``train``
runs ``trn-train`` with the variant's crops; the run's checkpoint holds nothing that records the
variant, so measure it with the same ``--crop``. These are experiments: the product cuts ``mirror``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # moon_navigation_edges, which reports

VARIANTS = ("mirror", "complete", "axis", "clamp")


def _centre(lo: int, hi: int, n: int, d: int, near: int) -> float:
    at_lo, at_hi = lo <= near, hi >= n - near
    if at_lo and not at_hi:
        return hi - d / 2
    if at_hi and not at_lo:
        return lo + d / 2
    return (lo + hi) / 2


def edge_crop(kind: str, near: int):
    """A replacement for :func:`trn.data.views.crops.square_crop` (same signature, its least side
    applied as the product applies it)."""
    from trn.data.views import crops

    product = crops.square_crop

    def crop(frame: np.ndarray, box, margin: float = 1.0, min_side: float = 0.0) -> np.ndarray:
        l, r, t, b = (int(v) for v in box)
        h, w = frame.shape
        d = max(r - l, b - t)
        if min_side:
            margin = crops.crop_side_margin(d, margin, min_side)
        side = max(1, int(round(margin * d)))
        if kind == "mirror" or (kind == "clamp" and side > min(h, w)):
            return product(frame, box, margin)
        if kind == "clamp":
            x0 = min(max((l + r - side) // 2, 0), w - side)
            y0 = min(max((t + b - side) // 2, 0), h - side)
            return frame[y0:y0 + side, x0:x0 + side]
        cx, cy = _centre(l, r, w, d, near), _centre(t, b, h, d, near)
        x0, y0 = int(round(cx - side / 2)), int(round(cy - side / 2))
        xs, ys = np.arange(x0, x0 + side), np.arange(y0, y0 + side)
        if kind == "axis":
            def fold(v: np.ndarray, c: float, n: int) -> np.ndarray:
                out = (v < 0) | (v >= n)
                return np.clip(np.where(out, np.round(2 * c - v).astype(int), v), 0, n - 1)

            return frame[np.ix_(fold(ys, cy, h), fold(xs, cx, w))]
        inside = frame[max(y0, 0):min(y0 + side, h), max(x0, 0):min(x0 + side, w)]
        out = np.full((side, side), float(inside.mean()), dtype=frame.dtype)
        ok_y, ok_x = (ys >= 0) & (ys < h), (xs >= 0) & (xs < w)
        out[np.ix_(ok_y, ok_x)] = frame[np.ix_(ys[ok_y], xs[ok_x])]
        return out

    return crop


def use(kind: str, near: int) -> None:
    from trn.data.views import crops

    crops.square_crop = edge_crop(kind, near)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="Moon Navigation RA with the variant's crops")
    m.add_argument("models", nargs="+")
    m.add_argument("--data", type=Path, required=True)
    m.add_argument("--threshold", type=float, action="append")
    m.add_argument("--threads", type=int, default=2)
    t = sub.add_parser("train", help="trn-train with the variant's crops (arguments after --)")
    t.add_argument("rest", nargs=argparse.REMAINDER)
    for p in (m, t):
        p.add_argument("--crop", choices=VARIANTS, required=True)
        p.add_argument("--near", type=int, default=20,
                       help="px from an edge within which a box counts as cut (the protocol's box noise moves a "
                            "side by up to 10 + 10 px)")
        p.add_argument("--min-side", type=float, default=None, metavar="PX",
                       help="then cut every square crop at least PX frame pixels a side (moon_navigation_edges.py)")
    args = ap.parse_args()
    use(args.crop, args.near)
    if args.cmd == "train":
        from trn.cli.train import main as train_main

        rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
        if args.min_side is not None:  # the model setting: its checkpoint then says how its crops are cut
            rest = [*rest, f"model.crop_min_px={args.min_side:g}"]
        return train_main(rest)
    from moon_navigation_edges import report

    return report(args.data, args.models, args.threshold, args.threads,
                  f"; crops: {args.crop} (near {args.near} px)"
                  + ("" if args.min_side is None else f", at least {args.min_side:g} px a side"),
                  min_side=args.min_side)

if __name__ == "__main__":
    sys.exit(main())
