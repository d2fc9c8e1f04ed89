"""The smooth sensitivity search against a brute-force maximum over all index pairs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpq_spark.core.quantiles._sorted_data import sort_data
from dpq_spark.core.quantiles.smooth_sensitivity import log_smooth_sensitivity


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


# --------------------------------------------------------------------------------------------
# The two properties the noise calibration relies on, checked on every neighbour of small
# datasets: S(X) >= local sensitivity, and S(X) <= e^beta S(X') for neighbours X, X'.

LO, HI = -5.0, 6.0


def _f(x, q):
    """The released statistic: x_(floor((n - 1) q)), with index -1 (empty data) read as LO."""
    xs = np.sort(x)
    k = int(math.floor((len(xs) - 1) * q))
    return LO if k < 0 else xs[k]


def _S(x, q, beta, beta_used=None, factor=1.0):
    """The library's bound at ``beta_used`` (default ``beta``), times ``factor``."""
    data = sort_data(np.asarray(x, dtype=float), None, LO, HI)
    k = int(math.floor((data.n - 1) * q))
    return factor * math.exp(log_smooth_sensitivity(data, k, beta if beta_used is None else beta_used, LO, HI))


def _neighbours(x, relation):
    grid = np.unique(np.concatenate(([LO, HI], x, (x[:-1] + x[1:]) / 2 if len(x) > 1 else [])))
    if relation == "swap":
        for i in range(len(x)):
            for v in grid:
                y = x.copy()
                y[i] = v
                yield y
    else:
        for i in range(len(x)):
            yield np.delete(x, i)
        for v in grid:
            yield np.append(x, v)


def _violations(relation, **variant):
    """Count neighbour pairs breaking S(X) >= |f(X) - f(X')| or S(X) <= e^beta S(X')."""
    rng = np.random.default_rng(11)
    bad = checked = 0
    for _ in range(40):
        n = int(rng.integers(1 if relation == "swap" else 0, 9))
        x = np.clip(np.round(rng.normal(0.0, 2.5, n), 1), LO, HI)
        q = float(rng.choice([0.1, 0.5, 0.8]))
        beta = float(rng.choice([0.05, 0.5, 2.0]))
        s_x = _S(x, q, beta, **variant)
        f_x = _f(x, q)
        for y in _neighbours(x, relation):
            s_y = _S(y, q, beta, **variant)
            ok = (
                abs(_f(y, q) - f_x) <= s_x * (1 + 1e-12)
                and s_x <= math.exp(beta) * s_y * (1 + 1e-12)
                and s_y <= math.exp(beta) * s_x * (1 + 1e-12)
            )
            bad += not ok
            checked += 1
    assert checked > 500
    return bad


@pytest.mark.parametrize("relation", ["swap", "add_remove"])
def test_smooth_bound_dominates_local_sensitivity_and_is_smooth(relation):
    assert _violations(relation) == 0


@pytest.mark.parametrize("relation", ["swap", "add_remove"])
@pytest.mark.parametrize(
    "variant",
    [{"factor": 0.5}, {"beta_used": 1e3}],
    ids=["half-the-bound", "local-sensitivity-only"],
)
def test_property_check_has_power(relation, variant):
    assert _violations(relation, **variant) > 0


def test_property_check_catches_too_fast_decay():
    # Decay at 2 beta while claiming beta-smoothness: the ratio check fails somewhere.
    bad = 0
    for beta in (0.05, 0.5):
        x = np.array([-1.0, -0.5, 0.0, 0.1, 3.0, 4.0])
        for y in _neighbours(x, "add_remove"):
            s_x, s_y = _S(x, 0.5, beta, beta_used=2 * beta), _S(y, 0.5, beta, beta_used=2 * beta)
            bad += s_x > math.exp(beta) * s_y * (1 + 1e-12) or s_y > math.exp(beta) * s_x * (1 + 1e-12)
    assert bad > 0
