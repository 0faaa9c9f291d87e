"""Instance tokens: K tokens per landmark for late-interaction re-ranking (CraterBench-R, Sec. 4).

Training-free aggregation of the descriptor's last feature map [C, h, w] (h * w = N tokens):

1. seed selection: K seed indices, by saliency (top-K, the CNN analogue of CLS attention; here the
   location's share of the GeM pool, mean_c x^p) or by farthest-point sampling in cosine space;
2. hard assignment: each non-seed token joins the seed it is most cosine-similar to, giving
   clusters C_k (seeds are not members of any cluster);
3. residual aggregation (paper Eq. 2): z_k = l2(t_{s_k} + (1 / max(|C_k|, eps)) * sum_{i in C_k} t_i).

Tokens are matched by late interaction (paper Eq. 1): s_LI(q, g) = (1/K_q) sum_i max_j <t_i^q, t_j^g>.

Before aggregation each location can be projected by the descriptor's own head (Linear -> BN ->
PReLU, applied per location): a token is then the embedding the head would give to that one
location, 512-d like the global embedding, and trained with it. Stored tokens are int8 with one
float32 scale per token (symmetric quantisation), 4x smaller than float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trn.errors import ConfigError

SEED_METHODS = ("saliency", "fps")


@dataclass(frozen=True)
class TokenConfig:
    """k: tokens per landmark (>= 1; at most the number of feature-map locations).
    seeds: "saliency" (top-K by GeM saliency) or "fps" (farthest-point sampling, cosine).
    eps: the paper's epsilon in max(|C_k|, eps); only matters for empty clusters.
    project: apply the descriptor head per location (512-d tokens) instead of raw C-d features."""

    k: int = 4
    seeds: str = "saliency"
    eps: float = 1e-6
    project: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 1:
            raise ConfigError(f"tokens k={self.k!r}: need an integer >= 1")
        if self.seeds not in SEED_METHODS:
            raise ConfigError(f"tokens seeds={self.seeds!r}: choose one of {SEED_METHODS}")
        if not self.eps > 0:
            raise ConfigError(f"tokens eps={self.eps!r}: need > 0")


def _l2(x: np.ndarray, axis: int = -1) -> np.ndarray:
    n = np.linalg.norm(x, axis=axis, keepdims=True)
    return x / np.maximum(n, 1e-12)


def farthest_point_seeds(tokens: np.ndarray, k: int) -> np.ndarray:
    """K indices by farthest-point sampling in cosine space, deterministic: the first seed is the
    token closest to the mean direction, each next one the token whose best cosine to the chosen
    seeds is lowest (ties to the lowest index). tokens: float32 [N, D], L2-normalised."""
    n = tokens.shape[0]
    first = int(np.argmax(tokens @ _l2(tokens.mean(axis=0))))
    chosen = [first]
    best = tokens @ tokens[first]
    for _ in range(1, min(k, n)):
        best_masked = best.copy()
        best_masked[chosen] = np.inf
        nxt = int(np.argmin(best_masked))
        chosen.append(nxt)
        best = np.maximum(best, tokens @ tokens[nxt])
    return np.array(chosen, dtype=np.int64)


def select_seeds(tokens: np.ndarray, saliency: np.ndarray | None, k: int, method: str) -> np.ndarray:
    """K seed indices (int64 [min(K, N)]) for one image. tokens: [N, D] L2-normalised;
    saliency: [N] (required for "saliency"; ties broken by lower index)."""
    k = min(k, tokens.shape[0])
    if method == "saliency":
        if saliency is None:
            raise ConfigError("saliency seeds need a saliency map")
        return np.argsort(-saliency, kind="stable")[:k].astype(np.int64)
    if method == "fps":
        return farthest_point_seeds(tokens, k)
    raise ConfigError(f"unknown seed method {method!r}; choose one of {SEED_METHODS}")


def aggregate(tokens: np.ndarray, seeds: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Instance tokens float32 [K, D] from L2-normalised tokens [N, D] and seed indices [K]:
    hard nearest-seed assignment by cosine, then z_k = l2(t_seed + mean of the cluster)."""
    seed_vecs = tokens[seeds]
    is_seed = np.zeros(tokens.shape[0], dtype=bool)
    is_seed[seeds] = True
    others = np.flatnonzero(~is_seed)
    sums = np.zeros_like(seed_vecs)
    counts = np.zeros(len(seeds), dtype=np.float64)
    if len(others):
        owner = np.argmax(tokens[others] @ seed_vecs.T, axis=1)
        np.add.at(sums, owner, tokens[others])
        np.add.at(counts, owner, 1.0)
    z = seed_vecs + sums / np.maximum(counts, eps)[:, None].astype(tokens.dtype)
    return _l2(z).astype(np.float32)


def instance_tokens(feature_tokens: np.ndarray, saliency: np.ndarray | None, cfg: TokenConfig) -> np.ndarray:
    """Instance tokens for a batch. feature_tokens: float32 [B, N, D] (need not be normalised);
    saliency: [B, N] or None. Returns float32 [B, K', D] with K' = min(K, N), L2-normalised."""
    if feature_tokens.ndim != 3:
        raise ConfigError(f"feature tokens have shape {feature_tokens.shape}; expected [B, N, D]")
    t = _l2(feature_tokens.astype(np.float32))
    out = []
    for b in range(t.shape[0]):
        seeds = select_seeds(t[b], None if saliency is None else saliency[b], cfg.k, cfg.seeds)
        out.append(aggregate(t[b], seeds, cfg.eps))
    return np.stack(out) if out else np.zeros((0, min(cfg.k, t.shape[1]), t.shape[2]), np.float32)


def late_interaction(query: np.ndarray, gallery: np.ndarray) -> np.ndarray:
    """Eq. 1 for one query against many: query [Kq, D], gallery [S, Kg, D] (L2-normalised)
    -> float32 [S]: mean over query tokens of the best cosine with the candidate's tokens."""
    if gallery.shape[0] == 0:
        return np.zeros(0, np.float32)
    sims = np.einsum("qd,skd->sqk", query, gallery, optimize=True)
    return sims.max(axis=2).mean(axis=1).astype(np.float32)


def mixed_score(cosine: np.ndarray, li: np.ndarray, weight: float = 1.0, offset: float = 0.0) -> np.ndarray:
    """The decision score with tokens: ``(1 - weight) * cosine + weight * late interaction + offset``
    (float32; ``li`` itself for weight 1 and offset 0, the instance tokens' score)."""
    score = li if weight >= 1.0 else (1.0 - weight) * cosine + weight * li
    if offset:
        score = score + offset
    return np.asarray(score, np.float32)


def quantize(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-token int8: tokens float32 [..., K, D] -> (int8 [..., K, D], float32 scales
    [..., K]) with tokens ~= q * scale[..., None]."""
    amax = np.abs(tokens).max(axis=-1)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(tokens / scale[..., None]), -127, 127).astype(np.int8)
    return q, scale


def dequantize(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Inverse of :func:`quantize`, re-normalised to unit length (float32)."""
    return _l2(q.astype(np.float32) * scale[..., None])
