"""Instance tokens against the CraterBench-R equations, computed by hand."""

import numpy as np
import pytest

from trn.db.tokens import (TokenConfig, aggregate, dequantize, farthest_point_seeds, instance_tokens,
                           late_interaction, quantize, select_seeds)
from trn.errors import ConfigError


def l2(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_aggregation_follows_equation_2():
    t = l2(np.array([[1, 0, 0], [0.9, 0.1, 0], [0, 1, 0], [0.1, 0.9, 0.2], [0, 0.2, 1]], np.float32))
    seeds = np.array([0, 2])
    z = aggregate(t, seeds)
    # token 1 is nearest seed 0; tokens 3 and 4 are nearest seed 2
    assert np.allclose(z[0], l2(t[0] + t[1]), atol=1e-6)
    assert np.allclose(z[1], l2(t[2] + (t[3] + t[4]) / 2), atol=1e-6)


def test_an_empty_cluster_keeps_its_seed():
    t = l2(np.array([[1, 0], [0, 1], [0.99, 0.01]], np.float32))
    z = aggregate(t, np.array([0, 1]))
    assert np.allclose(z[1], t[1]) and np.allclose(z[0], l2(t[0] + t[2]))


def test_seed_selection():
    t = l2(np.random.default_rng(0).normal(size=(9, 4)).astype(np.float32))
    sal = np.array([0.1, 0.9, 0.3, 0.9, 0.0, 0.5, 0.2, 0.1, 0.4])
    assert select_seeds(t, sal, 3, "saliency").tolist() == [1, 3, 5]  # ties keep the lower index
    fps = farthest_point_seeds(t, 4)
    assert len(set(fps.tolist())) == 4
    # each FPS pick is the token least similar to those already picked
    for k in range(1, 4):
        best = (t @ t[fps[:k]].T).max(axis=1)
        best[fps[:k]] = np.inf
        assert fps[k] == np.argmin(best)
    assert len(select_seeds(t, sal, 20, "fps")) == 9


def test_late_interaction_is_equation_1():
    rng = np.random.default_rng(1)
    q = l2(rng.normal(size=(3, 5)).astype(np.float32))
    g = l2(rng.normal(size=(4, 2, 5)).astype(np.float32))
    want = [np.mean([max(q[i] @ g[s, j] for j in range(2)) for i in range(3)]) for s in range(4)]
    assert np.allclose(late_interaction(q, g), want, atol=1e-6)
    assert late_interaction(q, q[None])[0] == pytest.approx(1.0)


def test_instance_tokens_batch_and_int8_storage():
    rng = np.random.default_rng(2)
    feats = rng.normal(size=(2, 9, 16)).astype(np.float32)
    sal = rng.random((2, 9))
    z = instance_tokens(feats, sal, TokenConfig(k=4))
    assert z.shape == (2, 4, 16) and np.allclose(np.linalg.norm(z, axis=-1), 1, atol=1e-5)
    manual = aggregate(l2(feats[1]), select_seeds(l2(feats[1]), sal[1], 4, "saliency"))
    assert np.allclose(z[1], manual)
    q, s = quantize(z)
    assert q.dtype == np.int8 and s.shape == (2, 4)
    assert np.abs(dequantize(q, s) - z).max() < 0.01
    with pytest.raises(ConfigError, match="k=0"):
        TokenConfig(k=0)
    with pytest.raises(ConfigError, match="seeds='kmeans'"):
        TokenConfig(seeds="kmeans")
