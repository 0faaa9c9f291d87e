"""Embedding functions the scenarios call. Any backend fits: the scenarios only need

    embedder(images: float32 [N, S, S] in [0, 1]) -> Embeddings(global_ [N, D], tokens [N, K, Dt] | None)

plus the attributes ``name``, ``input_size``, ``dim``, ``tokens`` and ``token_dim`` (and optionally
``shortlist``, the re-ranking depth to use with its tokens). Here: the torch
descriptor (with optional instance tokens) and normalised cross-correlation template matching,
the technique flown terrain-relative-navigation systems use. ONNX or TFLite backends implement
the same protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import cv2
import numpy as np
import torch

from trn.db.tokens import TokenConfig, instance_tokens
from trn.errors import ConfigError, DataError
from trn.models.descriptor import Descriptor
from trn.models.registry import (DEFAULT_MODEL, MODELS_DIR, SOURCES, DescriptorPair, read_pair,  # noqa: F401
                                 resolve_model)
from trn_board.preprocess import disk_cells, part_tokens


@dataclass(frozen=True)
class Embeddings:
    """global_: float32 [N, D], L2-normalised. tokens: float32 [N, K, Dt], L2-normalised, or None.
    mix: bool [N], which crops the database scores by their tokens (None: all that have them)."""

    global_: np.ndarray
    tokens: np.ndarray | None = None
    mix: np.ndarray | None = None


class Embedder(Protocol):
    """What the scenarios call. ``crop_margin`` (optional, default 1.0): how navigation crops are
    cut for it (:func:`trn.sim.scenarios.crop_margin`)."""

    name: str
    input_size: int
    dim: int
    tokens: int
    token_dim: int

    def __call__(self, images: np.ndarray) -> Embeddings: ...


def _check_images(images: np.ndarray, size: int) -> np.ndarray:
    x = np.asarray(images, np.float32)
    if x.ndim != 3 or x.shape[1:] != (size, size):
        raise DataError(f"images have shape {x.shape}; this embedder takes [N, {size}, {size}]")
    if not np.isfinite(x).all():
        raise DataError("images contain NaN or infinite values")
    return x


def _set_parts(emb, settings: dict[str, float], h: int, w: int, dim: int, token_cfg: TokenConfig | None) -> None:
    """An exported part model's tokens (its part map is h x w x dim) and how the database mixes
    them in (as the torch model's)."""
    if token_cfg is not None:
        raise ConfigError(f"{emb.name} carries learned part tokens; instance tokens (--tokens) are for models without "
                          "them")
    emb.tokens, emb.token_dim = int(disk_cells(h, w).sum()), dim
    emb.token_weight, emb.token_offset = settings["part_weight"], settings["part_offset"]
    emb.token_edge_px = int(settings["part_edge_px"])


def _exported_parts(emb, glob: np.ndarray, part_map: list[np.ndarray]) -> Embeddings:
    """Embeddings of an exported part model: the host's part tokens of its part maps, and with an
    edge rule every crop scored by its cosine until its box says otherwise (as :class:`TorchEmbedder`)."""
    toks = part_tokens(np.concatenate(part_map)) if part_map else np.zeros((0, emb.tokens, emb.token_dim), np.float32)
    return Embeddings(glob, toks, np.zeros(len(glob), bool) if emb.token_edge_px else None)


class TorchEmbedder:
    """A trained :class:`Descriptor`, evaluated on the CPU in batches; with ``token_cfg`` it also
    returns K instance tokens from the last feature map (projected by the head when
    ``token_cfg.project``), and a model with a part head returns its learned part tokens, to be
    scored with its own ``part_weight`` (``token_weight``)."""

    def __init__(self, model: Descriptor, name: str, token_cfg: TokenConfig | None = None, batch: int = 128):
        self.model = model.eval()
        self.name = name
        self.input_size = model.cfg.input_size
        self.crop_margin = float(model.cfg.crop_margin)
        self.crop_min_px = float(model.cfg.crop_min_px)
        self.dim = model.cfg.embed_dim
        self.token_cfg = token_cfg
        self.batch = batch
        self.tokens = 0
        self.token_dim = 0
        self.token_weight = 1.0
        self.token_offset = 0.0
        self.token_edge_px = 0  # > 0: only crops whose box comes this near the frame's border mix in tokens
        if model.parts is not None:
            # learned part tokens: every disk location of the part stage, no aggregation
            if token_cfg is not None:
                raise ConfigError(f"{name} carries learned part tokens; instance tokens (--tokens) are for models "
                                  "without them")
            self.tokens, self.token_dim = model.part_count, model.cfg.part_dim
            self.token_weight = model.cfg.part_weight
            self.token_offset, self.token_edge_px = model.cfg.part_offset, model.cfg.part_edge_px
        if token_cfg is not None:
            cells = (self.input_size // model.cfg.stage_strides[-1]) ** 2
            if token_cfg.k > cells:
                raise ConfigError(f"tokens k={token_cfg.k}: the last feature map of {name} has only {cells} locations")
            self.tokens = token_cfg.k
            self.token_dim = self.dim if token_cfg.project else model.backbone.out_channels

    def _tokens(self, feat: torch.Tensor) -> np.ndarray:
        m, cfg = self.model, self.token_cfg
        b, c, h, w = feat.shape
        loc = feat.permute(0, 2, 3, 1).reshape(b * h * w, c)
        p = m.pool.p.detach()
        saliency = loc.clamp(min=m.pool.eps).pow(p).mean(dim=1).reshape(b, h * w)
        if cfg.project:
            # the head applied to one location: GeM of a single value is the value itself
            loc = m.act(m.bn(m.fc(loc.clamp(min=m.pool.eps))))
        return instance_tokens(loc.reshape(b, h * w, -1).numpy(), saliency.numpy(), cfg)

    @torch.no_grad()
    def __call__(self, images: np.ndarray) -> Embeddings:
        x = _check_images(images, self.input_size)
        g, t = [], []
        for i in range(0, len(x), self.batch):
            xb = torch.from_numpy(x[i:i + self.batch])[:, None]
            if self.model.parts is not None:
                e, parts = self.model.forward_parts(xb)
                t.append(parts.numpy())
            else:
                e, feat = self.model.forward_with_features(xb)
                if self.token_cfg is not None:
                    t.append(self._tokens(feat))
            g.append(e.numpy())
        glob = np.concatenate(g) if g else np.zeros((0, self.dim), np.float32)
        toks = ((np.concatenate(t) if t else np.zeros((0, self.tokens, self.token_dim), np.float32))
                if self.tokens else None)
        # images alone are never cut by a frame's edge: with an edge rule, scored by cosine
        # (navigation crops get theirs from their boxes: trn.sim.scenarios.part_mix)
        mix = np.zeros(len(glob), bool) if self.token_edge_px else None
        return Embeddings(glob, toks, mix)


class OnnxEmbedder:
    """An exported descriptor (``trn-export onnx``: outputs embedding, token_map, saliency, and a
    part model's part_map) run by onnxruntime on the CPU; with ``token_cfg`` the host aggregates
    instance tokens from the token map in numpy, as a board does (the projected map only:
    ``token_cfg.project`` must be set); a part model's tokens come from its part map."""

    def __init__(self, path: Path, name: str, token_cfg: TokenConfig | None = None, threads: int = 1,
                 numerics: str = "reference"):
        from trn.export.to_onnx import onnx_session, read_crop_margin, read_crop_min_px, read_part_settings

        self.session = onnx_session(path, threads, numerics)
        inp = self.session.get_inputs()[0]
        outs = [o.name for o in self.session.get_outputs()]
        if inp.name != "image" or outs[:3] != ["embedding", "token_map", "saliency"]:
            raise DataError(f"not a trn-export graph (input {inp.name!r}, outputs {outs}); export it with trn-export onnx",
                            path)
        self.batch = inp.shape[0] if isinstance(inp.shape[0], int) else 64
        self.input_size = int(inp.shape[2])
        self.name = name
        self.dim = int(self.session.get_outputs()[0].shape[1])
        self.token_cfg = token_cfg
        self.tokens = token_cfg.k if token_cfg else 0
        self.token_dim = self.dim if token_cfg else 0
        if token_cfg is not None and not token_cfg.project:
            raise ConfigError("an exported graph gives the projected token map only: use projected tokens")
        self.crop_margin, self.crop_min_px = read_crop_margin(self.session), read_crop_min_px(self.session)
        self.token_weight, self.token_offset, self.token_edge_px = 1.0, 0.0, 0
        parts = read_part_settings(self.session, path)
        self.n_out = 4 if parts else 3
        if parts:
            d, h, w = (int(v) for v in self.session.get_outputs()[3].shape[1:])  # the batch may be dynamic
            _set_parts(self, parts, h, w, d, token_cfg)

    def __call__(self, images: np.ndarray) -> Embeddings:
        x = _check_images(images, self.input_size)[:, None]
        g, t, pmaps = [], [], []
        for i in range(0, len(x), self.batch):
            xb = x[i:i + self.batch]
            if len(xb) != self.batch:  # a fixed-batch graph takes its own batch size only
                outs = [self.session.run(None, {"image": xb[j:j + 1]}) for j in range(len(xb))]
                outs = [np.concatenate([o[k] for o in outs]) for k in range(self.n_out)]
            else:
                outs = self.session.run(None, {"image": xb})
            emb, tmap, sal = outs[:3]
            if self.n_out > 3:
                pmaps.append(outs[3])
            g.append(emb)
            if self.token_cfg is not None:
                n, d = tmap.shape[:2]
                loc = np.moveaxis(tmap.reshape(n, d, -1), 1, 2)
                t.append(instance_tokens(loc, sal.reshape(n, -1), self.token_cfg))
        glob = (np.concatenate(g) if g else np.zeros((0, self.dim), np.float32)).astype(np.float32)
        if self.n_out > 3:
            return _exported_parts(self, glob, pmaps)
        toks = (np.concatenate(t) if t else np.zeros((0, self.tokens, self.token_dim), np.float32)) if self.token_cfg else None
        return Embeddings(glob, toks)


class NCCEmbedder:
    """Normalised cross-correlation template matching as an embedding: a template resized to
    ``template`` pixels, mean removed, L2-normalised. The cosine of two such vectors is exactly
    their zero-shift NCC score, so the same database and thresholds apply."""

    def __init__(self, input_size: int = 96, template: int = 32):
        if not 4 <= template <= input_size:
            raise ConfigError(f"NCC template={template}: need 4 <= template <= input size {input_size}")
        self.name = "ncc"
        self.input_size = input_size
        self.template = template
        self.dim = template * template
        self.tokens = 0
        self.token_dim = 0

    def __call__(self, images: np.ndarray) -> Embeddings:
        x = _check_images(images, self.input_size)
        out = np.empty((len(x), self.dim), np.float32)
        for i, im in enumerate(x):
            t = cv2.resize(im, (self.template, self.template), interpolation=cv2.INTER_AREA).ravel()
            t = t - t.mean()
            n = np.linalg.norm(t)
            # a flat template correlates with nothing; give it a fixed direction instead of NaN
            out[i] = t / n if n > 1e-8 else np.full(self.dim, 1.0 / np.sqrt(self.dim), np.float32)
        return Embeddings(out, None)


class PairEmbedder:
    """Two descriptors flown together (:class:`trn.models.registry.DescriptorPair`): ``frames``
    embeds crops cut from navigation frames and the views an onboard map matches against them,
    ``landmarks`` embeds landmark renders. It embeds nothing itself: every caller asks
    :func:`for_source` for the member of its source, so that a frame crop never reaches the
    landmark descriptor nor the reverse."""

    def __init__(self, name: str, frames: Embedder, landmarks: Embedder):
        self.name = name
        self.members = {"frames": frames, "landmarks": landmarks}

    @property
    def description(self) -> str:
        return f"{self.name} (frames: {self.members['frames'].name}, landmarks: {self.members['landmarks'].name})"

    def __call__(self, images: np.ndarray) -> Embeddings:
        raise ConfigError(f"{self.name} is a descriptor pair: embed frame crops with its frame descriptor "
                          f"({self.members['frames'].name}) and landmark renders with its landmark descriptor "
                          f"({self.members['landmarks'].name}), through for_source")


def for_source(emb, source: str):
    """The embedder that embeds ``source`` ("frames" or "landmarks"): a pair's member, or ``emb``
    itself when it is a single model (which then embeds both)."""
    if source not in SOURCES:
        raise ConfigError(f"descriptor source {source!r}: expected one of {SOURCES}")
    return emb.members[source] if isinstance(emb, PairEmbedder) else emb


def pair_members(embedders) -> dict[str, dict[str, str]]:
    """{pair name: {source: member name}} for the pairs among ``embedders`` (for reports)."""
    return {e.name: {k: m.name for k, m in e.members.items()} for e in embedders if isinstance(e, PairEmbedder)}


BACKENDS = ("torch", "onnx", "onnx-int8", "onnx-int8-kernels", "tflite", "tflite-float")
_EXPORT_FILES = {"onnx": "model.onnx", "onnx-int8": "model_int8.onnx", "onnx-int8-kernels": "model_int8.onnx",
                 "tflite": "model_int8.tflite", "tflite-float": "model_float.tflite"}
_EXPORT_CMD = {"onnx": "onnx", "onnx-int8": "onnx-int8", "onnx-int8-kernels": "onnx-int8", "tflite": "tflite",
               "tflite-float": "tflite"}


def resolve_export(spec: str, backend: str = "onnx") -> Path:
    """An exported file (.onnx / .tflite), or a ``trn-export`` output directory holding the
    backend's file (``model.onnx``, ``model_int8.onnx``, ``model_int8.tflite``,
    ``model_float.tflite``), or a shipped model's export under ``export/<name>/``."""
    p = Path(spec)
    name = _EXPORT_FILES[backend]
    suffix = Path(name).suffix
    for cand in (p if p.suffix == suffix else None, p / name, MODELS_DIR.parent / "export" / spec / name):
        if cand is not None and cand.is_file():
            return cand
    raise DataError(f"no {name} at {spec!r}: pass a {suffix} file or a trn-export directory; export one with "
                    f"trn-export {_EXPORT_CMD[backend]} --model {p.name or spec} --out export/{p.name or spec}")


class TfliteEmbedder:
    """A ``trn-export tflite`` backbone run by a TFLite interpreter, with the descriptor's host part
    (``head.npz``) and the instance-token aggregation in numpy, as a board runs it (a part model's
    part tokens from its second output)."""

    def __init__(self, path: Path, name: str, token_cfg: TokenConfig | None = None, threads: int = 1):
        from trn.export.tflite import TfliteRunner

        self.runner = TfliteRunner(path, None, threads)
        self.name = name
        self.input_size = self.runner.input_size
        self.dim = int(self.runner.head.weight.shape[0])
        self.token_cfg = token_cfg
        self.tokens = token_cfg.k if token_cfg else 0
        self.token_dim = self.dim if token_cfg else 0
        if token_cfg is not None and not token_cfg.project:
            raise ConfigError("an exported graph gives the projected token map only: use projected tokens")
        self.crop_margin = float(self.runner.head.crop_margin)
        self.crop_min_px = float(self.runner.head.crop_min_px)
        self.token_weight, self.token_offset, self.token_edge_px = 1.0, 0.0, 0
        if self.runner.part_out is not None:
            _, h, w, d = (int(v) for v in self.runner.part_out["shape"])
            _set_parts(self, dict(self.runner.head.parts), h, w, d, token_cfg)

    def __call__(self, images: np.ndarray) -> Embeddings:
        x = _check_images(images, self.input_size)
        outs = self.runner(x)
        emb, tmap, sal = outs[:3]
        if len(outs) > 3:
            return _exported_parts(self, emb.astype(np.float32), [outs[3]])
        toks = None
        if self.token_cfg is not None:
            n, d = tmap.shape[:2]
            loc = np.moveaxis(tmap.reshape(n, d, -1), 1, 2)
            toks = instance_tokens(loc, sal.reshape(n, -1), self.token_cfg) if n else \
                np.zeros((0, self.tokens, self.token_dim), np.float32)
        return Embeddings(emb.astype(np.float32), toks)


def make_embedder(spec: str, token_cfg: TokenConfig | None = None, threads: int | None = None,
                  backend: str = "torch") -> Embedder:
    """An embedder from a model spec: "ncc", or for the torch backend anything
    :func:`resolve_model` accepts, for an export backend anything :func:`resolve_export` accepts."""
    from trn.models.checkpoint import load_descriptor

    if backend not in BACKENDS:
        raise ConfigError(f"backend {backend!r}: expected one of {BACKENDS}")
    pair = read_pair(spec) if spec != "ncc" else None
    if pair is not None:
        return make_pair_embedder(pair, token_cfg, threads, backend)
    if threads:
        torch.set_num_threads(threads)
    if spec == "ncc":
        if token_cfg is not None:
            raise ConfigError("the NCC baseline has no instance tokens")
        return NCCEmbedder()
    if backend in _EXPORT_FILES:
        path = resolve_export(spec, backend)
        base = path.parent.name if path.name == _EXPORT_FILES[backend] else path.stem
        if backend.startswith("tflite"):
            emb = TfliteEmbedder(path, f"{base}@{backend}", token_cfg, threads or 1)
        else:
            emb = OnnxEmbedder(path, f"{base}@{backend}", token_cfg, threads or 1,
                               "kernels" if backend.endswith("-kernels") else "reference")
        # an export of a shipped model flies with that model's operating point
        emb.operating_threshold = _operating_threshold(path.parent, MODELS_DIR / base)
        emb.model_dir = MODELS_DIR / base if (MODELS_DIR / base).is_dir() else path.parent
        return emb
    path = resolve_model(spec)
    name = path.parent.name if path.name == "weights.pt" else path.stem
    emb = TorchEmbedder(load_descriptor(path), name, token_cfg)
    emb.operating_threshold = _operating_threshold(path.parent)
    emb.model_dir = path.parent  # its split.json and config.yaml say what it trained on
    return emb


def make_pair_embedder(pair: DescriptorPair, token_cfg: TokenConfig | None = None, threads: int | None = None,
                       backend: str = "torch") -> PairEmbedder:
    """A pair's two embedders, each at its own operating point. Instance tokens (``token_cfg``)
    re-rank the landmark descriptor's matches; the frame descriptor keeps its own (learned part
    tokens, or none)."""
    frames = make_embedder(pair.frames, None, threads, backend)
    landmarks = make_embedder(pair.landmarks, token_cfg, threads, backend)
    name = pair.name if backend == "torch" else f"{pair.name}@{backend}"
    return PairEmbedder(name, frames, landmarks)


def _operating_threshold(*dirs: Path) -> float | None:
    """The match threshold of the first of ``dirs`` that holds an operating point, else None."""
    from trn.models.operating_point import read_operating_point

    for d in dirs:
        op = read_operating_point(d)
        if op is not None:
            return op.match_threshold
    return None
