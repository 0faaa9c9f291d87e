"""Per-frame latency of the navigation pipeline in Moon Navigation: predicted on a timing profile
(``trn-sim run luna1 --profile NAME``) or measured on a board agent (``--board HOST:PORT``).

A frame's time is the embedding of its detections plus one database search per detection, against
the database as it stands when the frame arrives, and nothing else (:data:`COVERS`): not reading
and decoding the frame, not cutting and resizing the crops, and no detection when the boxes come
from the annotations. With the shipped detector's boxes (``--boxes detector``) a predicted frame
also runs the detector's int8 network once (:data:`COVERS_DETECTOR`). Predicted: the latency model
(:mod:`trn.hw.latency`) over the embedder's int8 TFLite backbone (an exported file, or the torch
model lowered on the spot with fixed activation ranges: timing does not depend on them) and the
profile's exact-scan search. Measured: the frame's crops sent to the board in one request (the
board's own clock, request read to inference done) plus an exact inner-product scan of the
database's size timed on this machine; with the shipped detector's boxes, the frame itself sent in
one DETECT request too (the board's clock: network and decoding on the board,
:data:`COVERS_DETECTOR_BOARD`), once the board is shown to run the detector evaluated. The budget
is the frame cadence (10 s on Luna-1's orbit).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from trn.errors import ConfigError, differing_digests

CADENCE_S = 10.0
# what a frame's figure covers, written beside every figure (report, console, docs)
COVERS = ("descriptor inference of every detection's crop and one database search per detection; "
          "not frame reading and decoding, cropping, resizing or detection (the boxes come from the "
          "annotations; with --boxes detector the detector's network is timed too: COVERS_DETECTOR)")
COVERS_SHORT = "inference + database search only; no frame I/O, cropping, resizing or detection"


def timeable(emb) -> bool:
    """Whether an embedder is a descriptor whose latency can be modelled or measured (a torch
    model or an int8 TFLite export; not NCC template matching)."""
    runner = getattr(emb, "runner", None)
    return getattr(emb, "model", None) is not None or (runner is not None and getattr(runner, "int8", False))


def write_timing_tflite(emb, path: Path) -> Path:
    """The embedder's torch model lowered to an int8 TFLite backbone at ``path``, with fixed
    activation ranges: its operators and parameter bytes, for timing only."""
    from trn.export.graph import ExportGraph
    from trn.export.tflite_format import write_tflite
    from trn.export.tflite_ir import lower_backbone, quantize

    g = lower_backbone(ExportGraph(emb.model))
    quantize(g, {i: (-8.0, 8.0) for i, t in enumerate(g.tensors) if t.role == "act"})
    return write_tflite(g, path, quantized=True, description=f"{emb.name}, timing only")


def _tflite_info(emb):
    """The parsed int8 TFLite backbone of the embedder: its own file, or its torch model lowered now."""
    from trn.export.tflite_format import read_tflite

    if not timeable(emb):
        raise ConfigError(f"{emb.name}: latency needs a descriptor (a torch model or an int8 TFLite export), "
                          "not this method")
    runner = getattr(emb, "runner", None)
    if runner is not None and getattr(runner, "int8", False):
        return read_tflite(runner.path)
    with tempfile.TemporaryDirectory(prefix="trn-timing-") as tmp:
        return read_tflite(write_timing_tflite(emb, Path(tmp) / f"{emb.name}.tflite"))


def _summary(frame_ms: list[float], source: str, per_landmark_ms: float, extra: dict) -> dict:
    budget = CADENCE_S * 1e3
    v = np.asarray(frame_ms, float)
    worst = float(v.max()) if len(v) else 0.0
    short = COVERS_SHORT if "detector_ms_per_frame" not in extra else "detector network + " + COVERS_SHORT.replace(
        " or detection", "")
    return {"source": f"{source} ({short})", "covers": COVERS, "cadence_s": CADENCE_S,
            "per_landmark_ms": per_landmark_ms,
            "mean_frame_ms": float(v.mean()) if len(v) else 0.0, "worst_frame_ms": worst,
            "frames_over_budget": int((v > budget).sum()), "margin_ms": budget - worst,
            "keeps_cadence": bool(worst <= budget), **extra}


# with the crater detector's boxes, the detector's network on the frame is in the figure too
COVERS_DETECTOR = ("the crater detector's network on the frame, descriptor inference of every detection's crop and "
                   "one database search per detection; not frame reading and decoding, the detector's resizing and "
                   "decoding on the host, cropping or resizing the crops")


COVERS_DETECTOR_BOARD = ("the crater detector on the frame (network and box decoding on the board, DETECT), "
                         "descriptor inference of every detection's crop and one database search per detection; not "
                         "frame reading and decoding, resizing the frame to the detector's input, cropping or "
                         "resizing the crops")


class ProfileTiming:
    def __init__(self, profile: str, detector_tflite: Path | None = None):
        from trn.hw.profiles import load_profile

        from trn.hw.latency import predict

        self.profile = load_profile(profile)
        self.detector_tflite = detector_tflite
        # the detector's network: the same graph on every frame, predicted once
        self.detector_ms = predict(detector_tflite, self.profile).per_landmark_ms if detector_tflite else 0.0
        self._cache: dict[str, object] = {}

    def with_detector(self, detector_tflite: Path) -> "ProfileTiming":
        """The same profile with the detector's int8 TFLite graph run once per frame."""
        return ProfileTiming(self.profile.name, Path(detector_tflite))

    def frames(self, emb, counts: list[int], db_sizes: list[int], crops=None, images=None) -> tuple[dict, list[float]]:
        from trn.hw.latency import predict

        if emb.name not in self._cache:
            self._cache[emb.name] = predict(_tflite_info(emb), self.profile, emb.dim, "int8")
        pr = self._cache[emb.name]
        det_ms = self.detector_ms
        ms = [det_ms + n * pr.per_landmark_ms + n * pr.search_ms(m) for n, m in zip(counts, db_sizes)]
        extra = {"parts_ms": pr.parts, "streamed_bytes": pr.streamed_bytes}
        if self.detector_tflite:
            extra |= {"detector_ms_per_frame": det_ms, "covers": COVERS_DETECTOR}
        return _summary(ms, f"predicted: profile {self.profile.name}", pr.per_landmark_ms, extra), ms


class BoardTiming:
    def __init__(self, board: str, client=None, info: dict | None = None, detector_tflite: Path | None = None):
        from trn.hw.client import BoardClient

        self.board = board
        self.client = client or BoardClient(board)
        self.info = info or self.client.info()
        self.detector_tflite = detector_tflite

    def with_detector(self, detector_tflite: Path) -> "BoardTiming":
        """The same board, also timing a DETECT request per frame; refused unless the board's bundle
        carries this very detector graph (its sha256 in INFO)."""
        import hashlib

        det = self.info.get("detector")
        want = hashlib.sha256(Path(detector_tflite).read_bytes()).hexdigest()
        if not det:
            raise ConfigError(f"the board at {self.board} carries no crater detector "
                              f"({self.info.get('detector_error') or 'none in its bundle'}); flash a bundle made "
                              f"with trn-export bundle --detector {Path(detector_tflite).parent}")
        if det.get("file_sha256") != want:
            runs, evaluated = differing_digests(str(det.get("file_sha256")), want)
            raise ConfigError(f"the board at {self.board} runs another detector graph (sha256 {runs}) than the one "
                              f"evaluated ({detector_tflite}, {evaluated}); flash a bundle made from it")
        return BoardTiming(self.board, self.client, self.info, Path(detector_tflite))

    def frames(self, emb, counts: list[int], db_sizes: list[int], crops=None, images=None) -> tuple[dict, list[float]]:
        from trn.hw.client import board_descriptor, check_board_model, model_name

        identity = check_board_model(self.client, emb, info=self.info)  # the model evaluated, or refused
        source, described = board_descriptor(self.info, model_name(emb))  # a pair's member: through its source
        if self.detector_tflite is not None and images is None:
            raise ConfigError("detection timing on the board needs the frames; this scenario gives none")
        rng = np.random.default_rng(0)
        db = rng.standard_normal((max(db_sizes + [1]), emb.dim)).astype(np.float32)
        ms, board, det_ms = [], [], []
        limit = int(self.info.get("max_batch", 64))
        for i, (n, m) in enumerate(zip(counts, db_sizes)):
            x = crops(i)
            t_board = 0.0
            if self.detector_tflite is not None:
                from trn.detect.boxes import preprocess_frame

                det_ms.append(self.client.detect(preprocess_frame(images(i), int(self.info["detector"]["input_size"])
                                                                  )).board_total_ms)
                t_board += det_ms[-1]
            # a bundle with part tokens answers them too (PARTS): what the database needs per crop
            embed = self.client.parts if described.get("parts") else self.client.infer
            for j in range(0, n, limit):
                t_board += embed(x[j:j + limit], source).board_total_ms
            q = rng.standard_normal((n, emb.dim)).astype(np.float32)
            t0 = time.perf_counter()
            if m and n:
                np.argmax(q @ db[:m].T, axis=1)
            t_search = (time.perf_counter() - t0) * 1e3
            board.append((t_board - (det_ms[-1] if det_ms else 0.0)) / max(n, 1))
            ms.append(t_board + t_search)
        per = float(np.median([b for b, n in zip(board, counts) if n])) if any(counts) else 0.0
        extra = {"board_model": described.get("model"), "board": identity.to_dict()}
        if det_ms:
            extra |= {"detector_ms_per_frame": float(np.median(det_ms)), "detector_ms_p99": float(np.percentile(det_ms, 99)),
                      "covers": COVERS_DETECTOR_BOARD}
        return _summary(ms, f"measured: board agent at {self.board} ({self.info.get('backend')})", per, extra), ms


def make_timing(profile: str | None, board: str | None):
    if profile and board:
        raise ConfigError("--profile (predicted) and --board (measured) are exclusive; choose one")
    if profile:
        return ProfileTiming(profile)
    if board:
        return BoardTiming(board)
    return None
