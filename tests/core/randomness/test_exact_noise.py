"""Release paths draw exact discrete Laplace noise on integers with the documented scales."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from dpq_spark.core.randomness.samplers import dlap_scale
from dpq_spark.core.quantiles.agg_tree import agg_tree, node_noise
from dpq_spark.core.quantiles.mechanisms import FLOAT_SAFE, MECHANISMS

agg_module = importlib.import_module("dpq_spark.core.quantiles.agg_tree")  # the module, not the function


@pytest.fixture
def draws(monkeypatch):
    """Record every discrete Laplace call of AggTree (its ``node_noise``): scale, size, noisy
    integers; the real sampler runs."""
    calls = []

    def recording(source, scale, size):
        out = node_noise(source, scale, size)
        calls.append((scale, size, out))
        return out

    monkeypatch.setattr(agg_module, "node_noise", recording)
    return calls


@pytest.mark.parametrize("relation, per_level", [("add_remove", 1), ("swap", 2)])
def test_agg_tree_counts_get_discrete_laplace_of_the_formula_scale(draws, relation, per_level):
    x = np.random.default_rng(0).normal(size=2_000)
    eps, b, h = 0.7, 4, 3
    out = agg_tree(x, [0.25, 0.5], epsilon=eps, lower=-5, upper=5, neighboring=relation,
                   branching=b, height=h, rng=np.random.default_rng(1))
    assert out.shape == (2,) and np.all(np.diff(out) >= 0)
    scale = dlap_scale(h * per_level, eps)
    assert [(s, size) for s, size, _ in draws] == [(scale, b**level) for level in range(1, h + 1)]
    assert all(noise.dtype == np.int64 for _, _, noise in draws)


def test_agg_tree_noise_scale_has_power(monkeypatch):
    # The level-1 noisy counts minus the exact ones follow DLap(h * s / eps): their spread grows
    # with 1/eps (a wrong scale would show here), checked on many repetitions of one tree.
    x = np.random.default_rng(2).uniform(-1, 1, size=1_000)
    spreads = {}
    for eps in (0.5, 2.0):
        noise = []
        for seed in range(200):
            calls = []

            def recording(source, scale, size):
                out = node_noise(source, scale, size)
                calls.append(out)
                return out

            monkeypatch.setattr(agg_module, "node_noise", recording)
            agg_tree(x, [0.5], epsilon=eps, lower=-1, upper=1, branching=4, height=2,
                     rng=np.random.default_rng(seed))
            noise.append(calls[0])
        spreads[eps] = np.std(np.concatenate(noise))
    # scale ratio 4: std ratio close to 4 (DLap std ~ sqrt(2) * scale for large scales)
    assert 3.3 < spreads[0.5] / spreads[2.0] < 4.7


def test_float_safe_marks_the_continuous_baselines():
    assert set(FLOAT_SAFE) == set(MECHANISMS)
    for name in ("smooth", "csmooth", "app_ind_exp"):
        assert FLOAT_SAFE[name] is False
    assert FLOAT_SAFE["agg_tree"] is True


def test_float_safe_quantile_mechanisms_release_grid_points():
    from dpq_spark.core.randomness.grid import Grid
    from dpq_spark.core.quantiles.mechanisms import get_base_mechanism

    x = np.random.default_rng(3).normal(0.0, 2.0, 500)
    grid = Grid(-10.0, 10.0, 0.001)
    for name in ("joint_exp", "ind_exp", "approx_quantiles"):
        assert FLOAT_SAFE[name] is True
        out = get_base_mechanism(name)(x, [0.1, 0.5, 0.9], epsilon=1.0, lower=-10.0, upper=10.0,
                                       granularity=0.001, rng=np.random.default_rng(4))
        k = grid.snap(out)
        assert np.array_equal(grid.value(k), out), name
