"""The single-quantile exponential mechanism against its closed form (chi-square, with power)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dpq_spark.core.ind_exp import ind_exp
from dpq_spark.core.single_quantile import single_quantile

X = np.array([1.0, 1.5, 3.0, 3.0, 4.2, 6.0, 7.5, 8.0, 8.0, 9.1])
LO, HI = 0.0, 10.0
DRAWS = 4000


def closed_form_bins(x, q, epsilon, sensitivity):
    """Bin edges (each data interval cut in half) and their probabilities, from the definition."""
    xs = np.sort(x)
    edges = np.concatenate(([LO], xs, [HI]))
    n = xs.size
    weight = np.diff(edges) * np.exp(-epsilon / (2 * sensitivity) * np.abs(np.arange(n + 1) - q * n))
    keep = np.diff(edges) > 0
    left, right, w = edges[:-1][keep], edges[1:][keep], weight[keep]
    p = w / w.sum()
    mids = (left + right) / 2
    bin_edges = np.sort(np.concatenate((left, mids, [HI])))
    return bin_edges, np.repeat(p / 2, 2)


@pytest.fixture(scope="module")
def draws():
    """IndExp with one quantile, through the public function, many times."""
    out = {}
    rng = np.random.default_rng(20240601)
    for relation, q, eps in (("swap", 0.5, 2.0), ("add_remove", 0.3, 1.5)):
        out[relation] = (
            q,
            eps,
            np.array(
                [
                    ind_exp(X, [q], epsilon=eps, lower=LO, upper=HI, neighboring=relation, rng=rng)[0]
                    for _ in range(DRAWS)
                ]
            ),
        )
    return out


def chi_square_p(sample, q, epsilon, sensitivity):
    bin_edges, probs = closed_form_bins(X, q, epsilon, sensitivity)
    observed = np.histogram(sample, bins=bin_edges)[0]
    return stats.chisquare(observed, probs * sample.size).pvalue


SENSITIVITY = {"swap": lambda q: 1.0, "add_remove": lambda q: max(q, 1 - q)}


@pytest.mark.parametrize("relation", ["swap", "add_remove"])
def test_ind_exp_matches_closed_form(draws, relation):
    q, eps, sample = draws[relation]
    assert chi_square_p(sample, q, eps, SENSITIVITY[relation](q)) > 1e-3


@pytest.mark.parametrize("factor", [1.3, 0.7])
@pytest.mark.parametrize("relation", ["swap", "add_remove"])
def test_chi_square_has_power_against_a_wrong_epsilon(draws, relation, factor):
    q, eps, sample = draws[relation]
    assert chi_square_p(sample, q, factor * eps, SENSITIVITY[relation](q)) < 1e-6


def test_chi_square_has_power_against_the_other_sensitivity(draws):
    q, eps, sample = draws["add_remove"]
    assert chi_square_p(sample, q, eps, 1.0) < 1e-6


@pytest.mark.parametrize("relation", ["swap", "add_remove"])
def test_single_quantile_is_ind_exp_with_one_quantile(relation):
    a = single_quantile(X, 0.4, epsilon=1.0, lower=LO, upper=HI, neighboring=relation, rng=np.random.default_rng(2))
    b = ind_exp(X, [0.4], epsilon=1.0, lower=LO, upper=HI, neighboring=relation, rng=np.random.default_rng(2))
    assert a == b[0]


def test_single_quantile_rejects_a_list():
    with pytest.raises(ValueError, match=r"`quantile` must be a single number, got shape \(2,\)"):
        single_quantile(X, [0.2, 0.4], epsilon=1.0, lower=LO, upper=HI)


def test_single_quantile_rejects_out_of_range():
    with pytest.raises(ValueError, match=r"`quantile` must each be in the open interval \(0, 1\)"):
        single_quantile(X, 1.0, epsilon=1.0, lower=LO, upper=HI)


def test_never_lands_in_zero_width_intervals_or_outside():
    x = np.array([LO, LO, 2.0, 2.0, 2.0, HI])  # points on the bounds and ties
    rng = np.random.default_rng(0)
    out = np.array([single_quantile(x, 0.5, epsilon=50.0, lower=LO, upper=HI, rng=rng) for _ in range(300)])
    assert np.all((out >= LO) & (out <= HI))
    # At a large epsilon the mass sits in the intervals next to the ties at 2.0, never on a point.
    assert np.mean(np.abs(out - 2.0) < 8.0) > 0.9
