"""The single-quantile exponential mechanism against its closed form (chi-square, with power)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dpq_spark.core.quantiles.ind_exp import ind_exp
from dpq_spark.core.quantiles.single_quantile import single_quantile

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


# ------------------------------------------------------------------------------- on the grid

from dpq_spark.core.quantiles.approx_quantiles import approx_quantiles  # noqa: E402
from dpq_spark.core.randomness.grid import Grid  # noqa: E402

GRID_X = np.array([0.0, 0.5, 0.5, 0.5, 1.5, 3.0, 3.0])  # ties and points on the bounds
GRID = Grid(0.0, 3.0, 0.5)  # 7 points


def grid_pmf(q, epsilon, sensitivity, tie=lambda t: (t + 1) / 2, jitter=1):
    """P(k) ∝ exp(-eps |rho(k) - q n| / (2 Delta)), rho the mid-rank, from the definition; with
    ``jitter`` S > 1, on the fine grid of step g / S averaged over every jitter of the data
    (:func:`~dpq_spark.core.randomness.grid.jitter_indices`), each fine point rounded to its grid index."""
    import itertools

    idx = GRID.snap(GRID_X)
    steps, half = GRID.steps, jitter // 2
    size = steps * jitter + 1
    pts = np.arange(size)
    ranges = [range(max(k * jitter - half, 0), min(k * jitter + half - 1, steps * jitter) + 1) if jitter > 1
              else range(k, k + 1) for k in idx]
    fine_total = np.zeros(size)
    jitters = list(itertools.product(*ranges))
    for fine in jitters:
        fine = np.asarray(fine)
        tied = (fine[None, :] == pts[:, None]).sum(axis=1)
        rho = (fine[None, :] < pts[:, None]).sum(axis=1) + np.where(tied > 0, tie(tied), 0.0)
        w = np.exp(-epsilon / (2 * sensitivity) * np.abs(rho - q * idx.size))
        fine_total += w / w.sum() / len(jitters)
    grid_index = np.clip((pts + half) // jitter, 0, steps) if jitter > 1 else pts
    return np.bincount(grid_index, weights=fine_total, minlength=GRID.size)


JITTER = 4  # fine points per grid step in these tests (2**16 by default: too many to enumerate)


@pytest.fixture(scope="module")
def grid_draws():
    from dpq_spark.core.randomness import grid as grid_module

    out = {}
    rng = np.random.default_rng(77)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grid_module, "_JITTER_SCALE", JITTER)
        for relation, q, eps in (("swap", 0.5, 2.0), ("add_remove", 0.3, 1.5)):
            sample = [single_quantile(GRID_X, q, epsilon=eps, lower=0.0, upper=3.0, granularity=0.5,
                                      neighboring=relation, rng=rng) for _ in range(3 * DRAWS)]
            out[relation] = q, eps, np.bincount(GRID.snap(sample), minlength=GRID.size)
    return out


def grid_p(observed, probs):
    return stats.chisquare(observed, probs * observed.sum()).pvalue


@pytest.mark.parametrize("relation", ["swap", "add_remove"])
def test_single_quantile_on_the_grid_matches_the_pmf(grid_draws, relation):
    # A declared granularity: the mechanism on the jittered fine grid, rounded (the exact mixture).
    q, eps, observed = grid_draws[relation]
    assert grid_p(observed, grid_pmf(q, eps, SENSITIVITY[relation](q), jitter=JITTER)) > 1e-3


@pytest.mark.parametrize("relation", ["swap", "add_remove"])
def test_grid_chi_square_has_power(grid_draws, relation):
    q, eps, observed = grid_draws[relation]
    sens = SENSITIVITY[relation](q)
    assert grid_p(observed, grid_pmf(q, 1.3 * eps, sens, jitter=JITTER)) < 1e-6
    # No jitter (mid-rank on the grid points themselves), or a jitter of another width. (The tie
    # rule on fine points is checked without jitter in test_joint_exp: jittered ties are rare.)
    assert grid_p(observed, grid_pmf(q, eps, sens)) < 1e-6
    assert grid_p(observed, grid_pmf(q, eps, sens, jitter=2)) < 1e-6


@pytest.mark.parametrize("q", [0.2, 0.5, 0.9])
def test_single_quantile_sensitivity_exhaustively(q):
    # Every dataset of <= 3 points on 4 grid points, every add/remove and swap neighbour, every k:
    # |u - u'| <= max(q, 1 - q) (add/remove) and <= 1 (swap), both attained.
    import itertools

    def rho(data):
        data = np.asarray(data, dtype=int)
        return np.array([np.sum(data < k) + ((np.sum(data == k) + 1) / 2 if np.sum(data == k) else 0)
                         for k in range(4)])

    worst = {"add_remove": 0.0, "swap": 0.0}
    for n in range(4):
        for d in itertools.combinations_with_replacement(range(4), n):
            d = list(d)
            u = -np.abs(rho(d) - q * n)
            for k in range(4):
                u2 = -np.abs(rho(d + [k]) - q * (n + 1))
                worst["add_remove"] = max(worst["add_remove"], np.abs(u - u2).max())
                for r in range(n):
                    u3 = -np.abs(rho(d[:r] + [k] + d[r + 1:]) - q * n)
                    worst["swap"] = max(worst["swap"], np.abs(u - u3).max())
    assert worst["add_remove"] <= max(q, 1 - q) + 1e-12 and worst["add_remove"] > 0.9 * max(q, 1 - q)
    assert worst["swap"] <= 1.0 + 1e-12 and worst["swap"] > 0.9


def test_approx_quantiles_outputs_grid_values_and_lands_on_ties():
    x = np.repeat([1.0, 2.0, 3.0], [100, 300, 100])
    out = approx_quantiles(x, [0.3, 0.5, 0.7], epsilon=5.0, lower=0.0, upper=5.0, granularity=0.01,
                           rng=np.random.default_rng(3))
    np.testing.assert_array_equal(out, Grid(0.0, 5.0, 0.01).value(Grid(0.0, 5.0, 0.01).snap(out)))
    assert out[1] == 2.0  # the median sits mid-block: released as the tied value
