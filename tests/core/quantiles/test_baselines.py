"""Baselines of issue 5: validation, invariants, multiplicities, and exactness checks.

Statistical checks of the single-quantile exponential mechanism are in test_single_quantile.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpq_spark.core.quantiles.agg_tree import agg_tree, histogram, honaker_aggregate
from dpq_spark.core.quantiles.approx_quantiles import approx_quantiles, recursion_depth
from dpq_spark.core.quantiles.ind_exp import app_ind_exp, ind_exp
from dpq_spark.core.quantiles.mechanisms import GUARANTEES, MECHANISMS, get_mechanism
from dpq_spark.core.quantiles.smooth import csmooth, csmooth_parameters, smooth

BASELINES = ["ind_exp", "app_ind_exp", "smooth", "csmooth", "agg_tree", "histogram", "approx_quantiles"]
LO, HI = -10.0, 10.0


CASES = [(name, rel) for name in BASELINES for rel in ("swap", "add_remove")]


def _call(name, values, quantiles=(0.25, 0.5, 0.75), **kw):
    kw.setdefault("epsilon", 1.0)
    kw.setdefault("lower", LO)
    kw.setdefault("upper", HI)
    kw.setdefault("rng", np.random.default_rng(0))
    kw.setdefault("neighboring", "swap")
    return MECHANISMS[name](values, quantiles, **kw)


# --------------------------------------------------------------------------------------------
# Registry


def test_registry_names_and_guarantees():
    assert set(MECHANISMS) == {"joint_exp", "auto", "agg_tree_8x3", "agg_tree_12x3", "agg_tree_8x4",
                               *BASELINES}
    assert set(GUARANTEES) == set(MECHANISMS)
    assert GUARANTEES["csmooth"] == "zcdp" and GUARANTEES["app_ind_exp"] == "approx"
    # registered with optional bounds (dpq_spark.core.quantiles.bounds.with_private_bounds)
    assert get_mechanism("agg_tree").__wrapped__ is agg_tree


def test_get_mechanism_rejects_unknown_name():
    with pytest.raises(ValueError, match=r"`mechanism` must be one of .*'joint_exp'.*got 'median'"):
        get_mechanism("median")


# --------------------------------------------------------------------------------------------
# Validation: one message per test


@pytest.mark.parametrize("name", BASELINES)
def test_shared_validation_epsilon(name):
    with pytest.raises(ValueError, match=r"`epsilon` must be finite and > 0, got -1.0"):
        _call(name, [1.0, 2.0], epsilon=-1.0)


@pytest.mark.parametrize("name", BASELINES)
def test_shared_validation_bounds(name):
    with pytest.raises(ValueError, match=r"`lower` must be < `upper`"):
        _call(name, [1.0, 2.0], lower=3.0, upper=3.0)


@pytest.mark.parametrize("name", BASELINES)
def test_shared_validation_quantiles(name):
    with pytest.raises(ValueError, match=r"`quantiles` must be strictly increasing"):
        _call(name, [1.0, 2.0], quantiles=[0.5, 0.4])


@pytest.mark.parametrize("name", BASELINES)
def test_shared_validation_neighboring(name):
    with pytest.raises(ValueError, match=r"`neighboring` must be one of 'add_remove', 'swap', got 'replace'"):
        _call(name, [1.0, 2.0], neighboring="replace")


@pytest.mark.parametrize("name", BASELINES)
def test_shared_validation_nan_values_not_echoed(name):
    with pytest.raises(ValueError, match=r"`values` must not contain NaN") as info:
        _call(name, [1.234567, np.nan])
    assert "1.234567" not in str(info.value)


@pytest.mark.parametrize("name", BASELINES)
def test_shared_validation_counts_length(name):
    with pytest.raises(ValueError, match=r"`counts` must be 1-d with the same length as `values`"):
        _call(name, [1.0, 2.0], counts=[1, 2, 3])


@pytest.mark.parametrize("name", BASELINES)
def test_shared_validation_rng_type(name):
    with pytest.raises(TypeError, match=r"`rng` must be a numpy.random.Generator, a RandomSource or None, got int"):
        _call(name, [1.0, 2.0], rng=42)


@pytest.mark.parametrize("name", ["app_ind_exp", "smooth"])
def test_delta_validation(name):
    with pytest.raises(ValueError, match=r"`delta` must be in \(0, 1\), got 0.0"):
        _call(name, [1.0, 2.0], delta=0.0)


@pytest.mark.parametrize("name", ["smooth", "csmooth"])
def test_smooth_refuses_empty_data_under_swap(name):
    with pytest.raises(ValueError, match=rf"`values` must hold at least one point for {name} with neighboring='swap'"):
        _call(name, [1.0, 2.0], counts=[0, 0])


def test_csmooth_t_must_be_positive():
    with pytest.raises(ValueError, match=r"`t` must be finite and > 0"):
        _call("csmooth", [1.0, 2.0], t=0.0)


def test_csmooth_t_shape():
    with pytest.raises(ValueError, match=r"`t` must be a number or have one entry per quantile \(3\)"):
        _call("csmooth", [1.0, 2.0], t=[0.1, 0.1])


def test_agg_tree_branching():
    with pytest.raises(ValueError, match=r"`branching` must be >= 2, got 1"):
        _call("agg_tree", [1.0], branching=1)


def test_agg_tree_height():
    with pytest.raises(ValueError, match=r"`height` must be >= 1, got 0"):
        _call("agg_tree", [1.0], height=0)


def test_histogram_bins():
    with pytest.raises(ValueError, match=r"`bins` must be >= 2, got 1"):
        _call("histogram", [1.0], bins=1)
    with pytest.raises(ValueError, match=r"`bins` must be <= 2\*\*24"):
        _call("histogram", [1.0], bins=2**24 + 1)


@pytest.mark.parametrize("relation", ["swap", "add_remove"])
def test_histogram_is_agg_tree_with_one_level(relation):
    # the same noise, the same post-processing: equal outputs for equal seeds; a two-level tree
    # with the same 16 leaves (more noise per count) gives other outputs
    x = np.random.default_rng(3).normal(0.0, 2.0, 40)
    for seed in range(20):
        kw = dict(epsilon=0.7, lower=LO, upper=HI, neighboring=relation)
        got = histogram(x, [0.2, 0.5, 0.8], rng=np.random.default_rng(seed), bins=16, **kw)
        same = agg_tree(x, [0.2, 0.5, 0.8], rng=np.random.default_rng(seed), branching=16, height=1, **kw)
        other = agg_tree(x, [0.2, 0.5, 0.8], rng=np.random.default_rng(seed), branching=4, height=2, **kw)
        np.testing.assert_array_equal(got, same)
        assert not np.array_equal(got, other)


def test_agg_tree_leaf_cap():
    with pytest.raises(ValueError, match=r"`branching`\*\*`height` must be <= 2\*\*24 leaves, got 16\*\*7"):
        _call("agg_tree", [1.0], height=7)


# --------------------------------------------------------------------------------------------
# Invariants


DATASETS = {
    "normal": np.random.default_rng(1).normal(0.0, 3.0, 300),
    "ties_and_outliers": np.concatenate(
        [np.full(40, 2.0), np.full(10, LO), [-1e9, np.inf, -np.inf, 55.0], np.arange(20.0) / 4]
    ),
    "single": np.array([0.5]),
}


@pytest.mark.parametrize("data", sorted(DATASETS))
@pytest.mark.parametrize("name,relation", CASES)
def test_invariants(name, relation, data):
    qs = np.linspace(0.05, 0.95, 7)
    out = _call(name, DATASETS[data], quantiles=qs, neighboring=relation)
    assert out.shape == (7,) and out.dtype == np.float64
    assert np.all(np.diff(out) >= 0)
    assert np.all((out >= LO) & (out <= HI))


@pytest.mark.parametrize("name", BASELINES)
def test_empty_data_gives_outputs_in_bounds(name):
    out = _call(name, np.empty(0), neighboring="add_remove")
    assert out.shape == (3,) and np.all((out >= LO) & (out <= HI))


# --------------------------------------------------------------------------------------------
# counts == repeated array, exactly, with a shared seed


@pytest.mark.parametrize("name,relation", CASES)
def test_counts_equal_repeated_array(name, relation):
    rng = np.random.default_rng(7)
    distinct = np.round(rng.normal(0.0, 4.0, 60), 1)  # some equal values across entries too
    counts = rng.integers(0, 6, distinct.size)
    counts[0] = 0
    repeated = rng.permutation(np.repeat(distinct, counts))
    qs = [0.1, 0.3, 0.5, 0.9]
    a = _call(name, distinct, quantiles=qs, counts=counts, neighboring=relation, rng=np.random.default_rng(3))
    b = _call(name, repeated, quantiles=qs, neighboring=relation, rng=np.random.default_rng(3))
    np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------------------------
# Accuracy at a huge epsilon (checks the wiring, not privacy)


def _sorted_normal(n=1001, seed=2):
    return np.sort(np.random.default_rng(seed).normal(0.0, 2.0, n))


@pytest.mark.parametrize("relation", ["swap", "add_remove"])
@pytest.mark.parametrize("name", ["smooth", "csmooth"])
def test_smooth_is_the_order_statistic_at_huge_epsilon(name, relation):
    x = _sorted_normal()
    qs = np.array([0.1, 0.5, 0.77])
    out = _call(name, x, quantiles=qs, epsilon=1e9, neighboring=relation)
    np.testing.assert_allclose(out, x[np.floor((x.size - 1) * qs).astype(int)], atol=1e-6)


@pytest.mark.parametrize("name,relation", [c for c in CASES if c[0] in ("ind_exp", "app_ind_exp", "approx_quantiles")])
def test_exponential_mechanisms_hit_the_quantile_at_huge_epsilon(name, relation):
    x = _sorted_normal()
    qs = np.array([0.1, 0.25, 0.5, 0.6, 0.9])
    out = _call(name, x, quantiles=qs, epsilon=1e6, neighboring=relation)
    ranks = np.searchsorted(x, out)
    assert np.all(np.abs(ranks - qs * x.size) <= 2)


@pytest.mark.parametrize("relation", ["swap", "add_remove"])
def test_agg_tree_within_a_leaf_at_huge_epsilon(relation):
    x = _sorted_normal()
    qs = np.array([0.1, 0.5, 0.9])
    out = _call("agg_tree", x, quantiles=qs, epsilon=1e9, neighboring=relation, branching=4, height=5)
    leaf = (HI - LO) / 4**5
    ranks = np.floor(qs * x.size).astype(int)
    assert np.all(out >= x[ranks - 1] - leaf) and np.all(out <= x[ranks + 1] + leaf)


# --------------------------------------------------------------------------------------------
# Mechanism-specific exactness


@pytest.mark.parametrize("relation", ["swap", "add_remove"])
def test_approx_quantiles_with_one_quantile_is_the_single_mechanism(relation):
    x = _sorted_normal(200)
    a = approx_quantiles(x, [0.3], epsilon=0.5, lower=LO, upper=HI, neighboring=relation, rng=np.random.default_rng(9))
    b = ind_exp(x, [0.3], epsilon=0.5, lower=LO, upper=HI, neighboring=relation, rng=np.random.default_rng(9))
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("m,depth", [(1, 1), (2, 2), (3, 2), (4, 3), (7, 3), (8, 4), (30, 5), (100, 7)])
def test_recursion_depth(m, depth):
    assert recursion_depth(m) == depth


def test_app_ind_exp_uses_the_ddr_epsilon_per_quantile():
    from dpq_spark.core.accounting.composition import app_ind_exp_epsilon

    x = _sorted_normal(300)
    qs = [0.2, 0.5, 0.8]
    eps0 = app_ind_exp_epsilon(1.0, 1e-6, 3)
    a = app_ind_exp(x, qs, epsilon=1.0, lower=LO, upper=HI, rng=np.random.default_rng(4))
    b = ind_exp(x, qs, epsilon=3 * eps0, lower=LO, upper=HI, rng=np.random.default_rng(4))
    np.testing.assert_array_equal(a, b)


def test_csmooth_default_parameters():
    t, sigma, s = csmooth_parameters(0.8)
    assert t == pytest.approx(0.8 / (2 * np.sqrt(5)))
    assert sigma == pytest.approx(1 / np.sqrt(5), rel=1e-9)
    assert s == pytest.approx(np.exp(-1.5 * sigma**2) * (0.8 - t / sigma))
    # sigma solves the cubic for any t, and s stays positive.
    for t in (1e-4, 0.05, 2.0):
        _, sigma, s = csmooth_parameters(0.8, t)
        assert (5 * 0.8 / t) * sigma**3 - 5 * sigma**2 - 1 == pytest.approx(0.0, abs=1e-8)
        assert s > 0


def test_csmooth_explicit_t_matches_scalar_and_array():
    x = _sorted_normal(300)
    a = csmooth(x, [0.2, 0.7], epsilon=1.0, lower=LO, upper=HI, neighboring="swap", t=0.1, rng=np.random.default_rng(1))
    b = csmooth(x, [0.2, 0.7], epsilon=1.0, lower=LO, upper=HI, neighboring="swap", t=[0.1, 0.1], rng=np.random.default_rng(1))
    np.testing.assert_array_equal(a, b)


def test_smooth_noise_scale_follows_epsilon():
    # With a fixed seed the Laplace draw is shared, so the deviation scales like 1/epsilon'
    # times the smooth sensitivity, which itself grows as beta (~epsilon) falls.
    x = _sorted_normal(501)
    kw = dict(lower=LO, upper=HI, neighboring="swap")
    k = 250
    dev = [abs(smooth(x, [0.5], epsilon=e, rng=np.random.default_rng(5), **kw)[0] - x[k]) for e in (4.0, 1.0)]
    assert dev[1] > 3.9 * dev[0]


# --------------------------------------------------------------------------------------------
# Honaker aggregation


@pytest.mark.parametrize("root", ["public", "unobserved"])
def test_honaker_aggregate_is_least_squares_and_consistent(root):
    rng = np.random.default_rng(0)
    b, h = 3, 3
    exact = [None] * (h + 1)
    exact[h] = rng.integers(0, 10, b**h).astype(float)
    for level in range(h - 1, -1, -1):
        exact[level] = exact[level + 1].reshape(-1, b).sum(axis=1)
    noisy = [None] + [exact[level] + rng.laplace(0.0, 2.0, exact[level].size) for level in range(1, h + 1)]
    root_value = float(exact[0][0]) if root == "public" else None
    tree = honaker_aggregate(noisy, b, 8.0, root_value)
    for level in range(h):
        np.testing.assert_allclose(tree[level], tree[level + 1].reshape(-1, b).sum(axis=1), atol=1e-9)
    # Generalised least squares on the leaves, written out directly.
    rows, obs = [], []
    for level in range(1, h + 1):
        size = b ** (h - level)
        for j in range(b**level):
            row = np.zeros(b**h)
            row[j * size : (j + 1) * size] = 1.0
            rows.append(row)
            obs.append(noisy[level][j])
    design, obs = np.array(rows), np.array(obs)
    if root_value is None:
        leaves = np.linalg.lstsq(design, obs, rcond=None)[0]
    else:  # equality constraint sum(leaves) = root, by a Lagrange system
        k = design.shape[1]
        kkt = np.block([[2 * design.T @ design, np.ones((k, 1))], [np.ones((1, k)), np.zeros((1, 1))]])
        leaves = np.linalg.solve(kkt, np.concatenate([2 * design.T @ obs, [root_value]]))[:k]
    np.testing.assert_allclose(tree[h], leaves, atol=1e-9)
    if root_value is not None:
        assert tree[0][0] == pytest.approx(root_value)
