"""The smooth sensitivity search against a brute-force maximum over all index pairs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpq_spark.core._sorted_data import sort_data
from dpq_spark.core.smooth_sensitivity import log_smooth_sensitivity


def brute_force(x, k, beta, lower, upper):
    """max over -1 <= i <= k <= j <= n, i < j, of exp(-beta (j - i - 1)) (x_j - x_i)."""
    xs = np.concatenate(([lower], np.sort(np.clip(x, lower, upper)), [upper]))
    n = len(x)
    best = 0.0
    for i in range(-1, k + 1):
        for j in range(max(k, i + 1), n + 1):
            best = max(best, math.exp(-beta * max(j - i - 1, 0)) * (xs[j + 1] - xs[i + 1]))
    return best


def test_matches_brute_force_with_ties_and_clamping():
    rng = np.random.default_rng(0)
    for _ in range(150):
        n = int(rng.integers(1, 35))
        x = np.round(rng.normal(size=n) * rng.choice([0.3, 3.0, 50.0]), int(rng.integers(0, 3)))
        k = int(rng.integers(0, n))
        beta = float(rng.choice([0.01, 0.1, 1.0, 5.0]))
        got = math.exp(log_smooth_sensitivity(sort_data(x, None, -5.0, 6.0), k, beta, -5.0, 6.0))
        assert got == pytest.approx(brute_force(x, k, beta, -5.0, 6.0), rel=1e-12)


def test_counts_give_the_same_sensitivity():
    x = np.array([0.0, 0.5, 0.5, 0.5, 2.0, 3.0, 3.0])
    distinct, counts = np.unique(x, return_counts=True)
    a = log_smooth_sensitivity(sort_data(x, None, -1.0, 4.0), 3, 0.2, -1.0, 4.0)
    b = log_smooth_sensitivity(sort_data(distinct, counts, -1.0, 4.0), 3, 0.2, -1.0, 4.0)
    assert a == b


def test_large_n_window_is_exact_on_a_slice():
    # The window pruning must not change the answer: compare a large dataset with brute force on
    # the pairs that can matter (beta large enough that far pairs cannot win).
    x = np.sort(np.random.default_rng(1).normal(size=4000))
    k, beta = 2000, 0.5
    got = math.exp(log_smooth_sensitivity(sort_data(x, None, -10.0, 10.0), k, beta, -10.0, 10.0))
    window = x[k - 150 : k + 151]
    assert got == pytest.approx(brute_force(window, 150, beta, window[0], window[-1]), rel=1e-12)
