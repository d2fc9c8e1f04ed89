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
