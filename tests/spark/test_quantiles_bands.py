"""The coarse-pass band bound of dp_quantiles (``dpq_spark.core._coarse_bands``), without Spark.

For one quantile the JointExp density is ``exp(-2c |r(o) - P|)`` over ``o`` in ``[a, b]``, so the
exact probability of each coarse cell's span is a finite sum over the data's intervals: the
tests check the pruned spans against it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import logsumexp

from dpq_spark.core import _coarse_bands as cb

A, B = 0.0, 2e9
G = cb.fine_step(A, B)


def span_log_mass(k: np.ndarray, q: float, c: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Exact log mass of every coarse span under JointExp with m = 1 on fine data ``k``.

    Returns (coarse cells touched by data, their log masses, log normaliser)."""
    k = np.sort(k)
    v = cb.fine_values(k, A, B)
    n = k.size
    P = q * n
    edges = np.concatenate(([A], v, [B]))
    ranks = np.arange(n + 1, dtype=float)  # rank on [edges[i], edges[i+1])
    width = np.diff(edges)
    ok = width > 0
    log_w = np.full(width.size, -np.inf)
    log_w[ok] = np.log(width[ok]) - 2 * c * np.abs(ranks[ok] - P)
    log_z = logsumexp(log_w[ok])
    cells = np.unique(cb.coarse_of(k))
    masses = []
    for C in cells:  # mass of [v(4096 C), v(4096 (C + 1))): clip every interval to the span
        lo_v, hi_v = cb.fine_values(np.array([C * 4096, min((C + 1) * 4096, cb.FINE_SIZE)]), A, B)
        part = np.clip(edges[1:], lo_v, hi_v) - np.clip(edges[:-1], lo_v, hi_v)
        inside = part > 0
        terms = np.log(part[inside]) - 2 * c * np.abs(ranks[inside] - P)
        masses.append(logsumexp(terms) if terms.size else -np.inf)
    return cells, np.array(masses), log_z


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pruned_spans_carry_below_2_pow_minus_60(seed):
    gen = np.random.default_rng(seed)
    # A dense cluster around the median plus scattered points far away in rank.
    centre = gen.integers(2**31, 2**31 + 40 * 4096, 300)
    far = gen.integers(0, 2**32, 60)
    k = np.concatenate([centre, far])
    q, c = 0.5, 0.5
    cells, log_mass, log_z = span_log_mass(k, q, c)
    counts = np.bincount(np.searchsorted(cells, cb.coarse_of(k)), minlength=cells.size)
    keep = cb.reachable(cells, counts, np.array([q]), c, A, B)
    assert not keep.all(), "the case must prune something to test anything"
    pruned = log_mass[~keep]
    assert logsumexp(pruned) - log_z < -60 * math.log(2)  # the bound of the module docstring
    heavy = log_mass - log_z > -30 * math.log(2)
    assert np.all(keep[heavy])  # every span with visible mass is kept


def test_a_wrong_tolerance_is_caught():
    """Power: pruning with c ten times too large (bands ten times too narrow) drops spans whose
    exact mass is far above 2**-60, and the same check flags it."""
    gen = np.random.default_rng(0)
    k = np.concatenate([gen.integers(2**31, 2**31 + 40 * 4096, 300), gen.integers(0, 2**32, 60)])
    cells, log_mass, log_z = span_log_mass(k, 0.5, 0.5)
    counts = np.bincount(np.searchsorted(cells, cb.coarse_of(k)), minlength=cells.size)
    keep = cb.reachable(cells, counts, np.array([0.5]), 5.0, A, B)
    assert logsumexp(log_mass[~keep]) - log_z > -60 * math.log(2)


def test_everything_kept_without_a_box():
    """One coarse cell holding every point straddles the target: no box, nothing pruned."""
    k = 2**31 + np.arange(1000)  # 1,000 points inside one coarse cell
    cells, counts = np.unique(cb.coarse_of(k), return_counts=True)
    assert cells.size == 1
    assert cb.reachable(cells, counts, np.array([0.1, 0.5, 0.9]), 0.5, A, B).all()


def test_represent_moves_pruned_points_to_the_left_edge():
    cells = np.array([3, 7, 9])
    counts = np.array([5, 2, 4])
    keep = np.array([False, True, False])
    kept_k, kept_counts = np.array([7 * 4096 + 1, 7 * 4096 + 50]), np.array([1, 1])
    k, w = cb.represent(kept_k, kept_counts, cells, counts, keep)
    assert k.tolist() == [3 * 4096, 7 * 4096 + 1, 7 * 4096 + 50, 9 * 4096]
    assert w.tolist() == [5, 1, 1, 4]


def test_fine_index_rounds_to_the_nearest_grid_point_and_clips():
    x = np.array([-5.0, 0.0, 0.49 * G, 0.51 * G, 7 * G, B, 3e9])
    assert cb.fine_index(x, A, B).tolist() == [0, 0, 0, 1, 7, cb.FINE_SIZE, cb.FINE_SIZE]
    assert cb.coarse_of(np.array([cb.FINE_SIZE, cb.FINE_SIZE - 1, 4095, 4096])).tolist() == [
        cb.COARSE_CELLS - 1, cb.COARSE_CELLS - 1, 0, 1]


# ------------------------------------------------------------------------------------------
# Small groups by enumeration: the core's distribution


def _params(epsilon, quantiles, lower=0.0, upper=10.0):
    from dpq_spark.spark._release import ReleaseParams

    return ReleaseParams(quantiles=tuple(quantiles), epsilon=epsilon, lower=lower, upper=upper,
                         resolution=2**20, neighboring="add_remove", mechanism="joint_exp")


def _interval_table(outputs: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Counts of each (interval of output 1, interval of output 2) pair."""
    cells = np.searchsorted(values, outputs, side="right")  # 0 .. len(values)
    K = values.size + 1
    return np.bincount(cells[:, 0] * K + cells[:, 1], minlength=K * K)


def _core_draws(values, counts, quantiles, epsilon, draws, seed):
    import importlib

    je = importlib.import_module("dpq_spark.core.joint_exp")
    from dpq_spark.core.privacy import NeighboringRelation, joint_exp_sensitivity

    q = np.asarray(quantiles, dtype=float)
    c = epsilon / (2 * joint_exp_sensitivity(q, NeighboringRelation.ADD_REMOVE))
    out, _ = je._sample_many(values, counts, q, c, 0.0, 10.0, np.random.default_rng(seed), draws)
    return out


def _small_draws(values, counts, quantiles, epsilon, draws, seed):
    from dpq_spark.core._random import resolve_rng
    from dpq_spark.spark._release import small_joint_exp

    params = _params(epsilon, quantiles)
    rng = resolve_rng(np.random.default_rng(seed))
    return np.array([small_joint_exp(values, counts, params, rng) for _ in range(draws)])


def _chi2_pvalue(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import chi2_contingency

    keep = (a + b) > 0
    return chi2_contingency(np.vstack([a[keep], b[keep]]))[1]


VALUES = np.array([2.0, 4.0, 5.0, 7.0])
COUNTS = np.array([1, 2, 1, 1])
QS = [0.3, 0.7]


def test_small_group_enumeration_matches_the_core_sampler():
    draws = 30_000
    core = _interval_table(_core_draws(VALUES, COUNTS, QS, 1.0, draws, 1), VALUES)
    small = _interval_table(_small_draws(VALUES, COUNTS, QS, 1.0, draws, 2), VALUES)
    assert _chi2_pvalue(core, small) > 1e-3


def test_small_group_enumeration_test_has_power():
    """The same test rejects enumeration at a wrong epsilon (x1.3 and x0.7)."""
    draws = 30_000
    core = _interval_table(_core_draws(VALUES, COUNTS, QS, 1.0, draws, 1), VALUES)
    for wrong in (1.3, 0.7):
        small = _interval_table(_small_draws(VALUES, COUNTS, QS, wrong, draws, 2), VALUES)
        assert _chi2_pvalue(core, small) < 1e-3


def test_empty_group_is_sorted_uniforms():
    from scipy.stats import kstest

    out = _small_draws(np.zeros(0), np.zeros(0, dtype=np.int64), [0.5], 1.0, 4000, 3)
    assert kstest(out[:, 0] / 10.0, "uniform").pvalue > 1e-3
    out = _small_draws(np.zeros(0), np.zeros(0, dtype=np.int64), [0.25, 0.75], 1.0, 2000, 4)
    assert np.all(np.diff(out, axis=1) >= 0)
    assert kstest(out.min(axis=1) / 10.0, lambda x: 1 - (1 - x) ** 2).pvalue > 1e-3
