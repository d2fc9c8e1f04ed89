"""Ties on the default grid: every grid point split into 2**b fine points, each row to one.

The code's split followed by the code's sampler against the exact mixture over every split
(chi-square, with power), the privacy of that mixture on tiny neighbours (exact pmf ratios, with
power at 2 epsilon), the value-level mechanisms as exactly that composition (seed for seed), the
memory guard's band, and accuracy on tied doubles (each check fails with the split turned off).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dpq_spark.core.quantiles.approx_quantiles import approx_quantiles, approx_quantiles_indices, split_lazily
from dpq_spark.core.quantiles.coarse_bands import mechanism_band
from dpq_spark.core.quantiles.ind_exp import ind_exp, ind_exp_indices
from dpq_spark.core.quantiles.joint_exp import joint_exp, joint_exp_indices
from dpq_spark.core.quantiles.single_quantile import single_quantile
from dpq_spark.core.randomness import grid as grid_module
from dpq_spark.core.randomness.grid import TIE_BITS, Grid, split_ties
from dpq_spark.core.randomness.source import resolve_rng

from test_ties import check_exactly_dp, c_of, grid_pmf, joint_pmf, pvalue, worst_log_ratio

BITS = 2  # fine points per grid point in the exact tests: 4 (the default grid has 2**8)


# ------------------------------------------------------------------------------- exact mixture


def split_mixture(k, grid_size, bits, q, c):
    """Output pmf, as grid indices, of JointExp on the split data: the average over every
    assignment of the rows to fine points of their own grid point (each row uniform on its
    2**bits, independently) of the exact fine pmf, each fine output mapped to ``f >> bits``."""
    width = 1 << bits
    fine_size = grid_size << bits
    total = {}
    splits = list(itertools.product(*[range(int(v) * width, (int(v) + 1) * width) for v in k]))
    for fine in splits:
        tuples, p = joint_pmf(sorted(fine), fine_size, q, c)
        for o, pr in zip(tuples, p):
            key = tuple(f >> bits for f in o)
            total[key] = total.get(key, 0.0) + pr / len(splits)
    return total


def code_draws(k, grid_size, bits, q, eps, draws, seed):
    """The code path on a tiny grid: split_ties of the distinct indices, joint_exp_indices on the
    fine grid, each output shifted back to its grid point."""
    source = resolve_rng(np.random.default_rng(seed))
    d, counts = np.unique(np.asarray(k), return_counts=True)
    out = []
    for _ in range(draws):
        f, w = split_ties(d, counts, bits, source)
        o = joint_exp_indices(f, w, grid_size << bits, q, epsilon=eps, rng=source)
        out.append(tuple(int(v) for v in o >> bits))
    return out


K_TIED = [1, 1, 2]  # three records on a grid of 4 points, two of them tied
SIZE = 4
Q = [0.3, 0.7]
EPS = 2.0


@pytest.fixture(scope="module")
def draws():
    return code_draws(K_TIED, SIZE, BITS, Q, EPS, 12_000, 2026)


def test_split_then_sample_is_the_mixture_over_splits(draws):
    assert pvalue(draws, split_mixture(K_TIED, SIZE, BITS, Q, c_of(Q, EPS))) > 1e-3


def test_mixture_test_has_power(draws):
    # Rejects the mechanism on the grid itself (no split: the mid-rank alone), a split into a
    # different number of fine points, and epsilon x 1.3.
    c = c_of(Q, EPS)
    assert pvalue(draws, grid_pmf(K_TIED, SIZE - 1, Q, c)) < 1e-6
    assert pvalue(draws, split_mixture(K_TIED, SIZE, 1, Q, c)) < 1e-6
    assert pvalue(draws, split_mixture(K_TIED, SIZE, BITS, Q, 1.3 * c)) < 1e-6


# ------------------------------------------------------------------------------- privacy


def split_worst(q, eps, spend=1.0):
    """The exact worst log-ratio over neighbours (test_ties' check) of the split mechanism:
    every dataset of <= 2 records on 3 grid points, split into 2**BITS fine points each."""
    return worst_log_ratio(q, eps, spend, grid_steps=2,
                           law=lambda data, c: split_mixture(data, 3, BITS, q, c))


@pytest.mark.parametrize("q", [[0.5], [0.3, 0.7]])
def test_split_mechanism_is_epsilon_dp_exactly(q):
    # Every dataset of <= 2 records on 3 grid points (4 fine points each: 12), every add/remove
    # and swap neighbour, every output: the exact mixture pmfs are within e**eps of each other.
    # Power: the same check fails for the mechanism run with 2 eps.
    check_exactly_dp(lambda eps, spend: split_worst(q, eps, spend))


# ------------------------------------------------------------------------------- the code path


def test_the_rule_depends_only_on_the_arguments():
    g = Grid(-100.0, 100.0)
    assert g.tie_bits == TIE_BITS == 8 and g.jitter == 1 and g.fine_size == g.size << 8
    declared = Grid(-100.0, 100.0, 0.5)
    assert declared.tie_bits == 0 and declared.jitter == 2**16


X = np.concatenate([np.zeros(40), np.arange(1.0, 21.0), [-250.0, 300.0]])  # ties, clamping
QS = np.array([0.1, 0.4, 0.7, 0.9])


@pytest.mark.parametrize("name", ["joint_exp", "ind_exp", "approx_quantiles", "single_quantile"])
def test_value_mechanisms_split_then_sample_seed_for_seed(name):
    """Each value-level mechanism on the default grid is: snap, the distinct indices split by
    split_ties, the index sampler on the fine grid, each output's grid point (same draws)."""
    grid = Grid(-100.0, 100.0)
    kw = dict(epsilon=1.0, lower=-100.0, upper=100.0)
    q = QS[:1] if name == "single_quantile" else QS
    run = {"joint_exp": joint_exp, "ind_exp": ind_exp, "approx_quantiles": approx_quantiles,
           "single_quantile": lambda x, q, **a: [single_quantile(x, q[0], **a)]}[name]
    want = np.asarray(run(X, q, rng=np.random.default_rng(5), **kw), dtype=np.float64)
    source = resolve_rng(np.random.default_rng(5))
    k, counts = np.unique(grid.snap(X), return_counts=True)
    f, w = split_ties(k, counts, grid.tie_bits, source)
    index = {"joint_exp": joint_exp_indices, "ind_exp": ind_exp_indices,
             "approx_quantiles": approx_quantiles_indices,
             "single_quantile": approx_quantiles_indices}[name]  # m = 1: one exponential draw
    got = grid.value(index(f, w, grid.fine_size, q, epsilon=1.0, rng=source) >> grid.tie_bits)
    np.testing.assert_array_equal(got, want)
    # the same data given as counts: the same split, so the same release
    xs, cs = np.unique(X, return_counts=True)
    again = np.asarray(run(xs, q, counts=cs, rng=np.random.default_rng(5), **kw), dtype=np.float64)
    np.testing.assert_array_equal(again, want)


def test_split_ties_keeps_rows_in_their_point_and_whole_entries_whole():
    source = resolve_rng(np.random.default_rng(3))
    k = np.array([2, 5, 9, 11])
    counts = np.array([1000, 1, 3, 700])
    f, w = split_ties(k, counts, 4, source)
    assert np.all(np.diff(f) > 0) and w.sum() == counts.sum()
    assert np.array_equal(np.bincount(f >> 4, weights=w, minlength=12)[k], counts)
    assert (f >> 4 == 2).sum() == 16  # 1,000 rows fill all 16 fine points
    whole = np.array([True, False, False, True])
    f, w = split_ties(k, counts, 4, source, whole)
    assert np.all(np.diff(f) > 0) and w.sum() == counts.sum()
    assert f[0] == 2 << 4 and w[0] == 1000 and f[-1] == 11 << 4 and w[-1] == 700


def test_many_tied_rows_split_only_inside_the_band(monkeypatch):
    """Past SPLIT_MAX_ENTRIES, joint_exp splits only the grid points JointExp's band reaches
    (the others stay whole at their first fine point): the sampler sees few entries, and the
    release is as accurate as the full split."""
    x = np.round(np.random.default_rng(1).normal(0, 30, 200_000), 1)  # 1e-1 steps: ~2,000 ties
    grid = Grid(-100.0, 100.0)
    k, counts = np.unique(grid.snap(x), return_counts=True)
    full = int(np.minimum(counts, 256).sum())
    monkeypatch.setattr(grid_module, "SPLIT_MAX_ENTRIES", full // 4)
    band = mechanism_band("joint_exp", k, counts, QS, 1.0, "add_remove", grid.fine_size - 1,
                          grid.tie_bits)
    assert 0 < band.sum() < k.size // 4  # the band holds a small part of the points
    whole = grid.unsplit(k, counts, lambda kk, cc: mechanism_band(
        "joint_exp", kk, cc, QS, 1.0, "add_remove", grid.fine_size - 1, grid.tie_bits))
    assert np.array_equal(whole, ~band)
    f, _ = split_ties(k, counts, grid.tie_bits, resolve_rng(np.random.default_rng(2)), whole)
    assert f.size < full // 4
    truth = np.quantile(x, QS, method="inverted_cdf")
    errs = [np.abs(joint_exp(x, QS, epsilon=1.0, lower=-100.0, upper=100.0,
                             rng=np.random.default_rng(s)) - truth).max() for s in range(5)]
    assert max(errs) <= 0.1 + 1e-6  # on the tied values (a step of the data is 0.1)


# ------------------------------------------------------------------------------- accuracy

ZEROS = np.where(np.random.default_rng(7).random(5000) < 0.8, 0.0,
                 np.random.default_rng(8).integers(1, 101, 5000).astype(float))
UPPER_TIES = np.where(np.random.default_rng(9).random(5000) < 0.3, 100.0,
                      np.random.default_rng(10).uniform(0, 100, 5000))


def _error(run, x, q, lower, upper, reps=10):
    truth = np.quantile(np.clip(x, lower, upper), q, method="inverted_cdf")
    return float(np.mean([np.mean(np.abs(np.asarray(run(x, q, epsilon=1.0, lower=lower,
                                                        upper=upper,
                                                        rng=np.random.default_rng(s))) - truth))
                          for s in range(reps)]))


DECILES = np.arange(1, 10) / 10
CASES = [  # (mechanism, data, quantiles, bounds, error bound with the split)
    (joint_exp, ZEROS, DECILES, (-100.0, 100.0), 1.0),
    (ind_exp, ZEROS, DECILES, (-100.0, 100.0), 1.0),
    (approx_quantiles, ZEROS, np.array([0.25, 0.5, 0.75]), (-100.0, 100.0), 0.5),
    (joint_exp, UPPER_TIES, DECILES, (0.0, 100.0), 0.5),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_tied_doubles_without_granularity(case, monkeypatch):
    """80% zeros, or 30% of the rows at the upper bound, with the default grid: the quantiles
    inside the tie block come out as the tied value. Without the split (TIE_BITS = 0, the grid
    itself) the same releases miss by 5 to 30."""
    run, x, q, (lo, hi), bound = CASES[case]
    assert _error(run, x, q, lo, hi) < bound
    monkeypatch.setattr(grid_module, "TIE_BITS", 0)
    assert Grid(lo, hi).fine_size == Grid(lo, hi).size
    assert _error(run, x, q, lo, hi) > 4 * bound


def test_continuous_data_lose_nothing():
    """On data without ties the split changes nothing that matters: deciles of 1,000 N(0, 5)
    values are as accurate as on the grid itself."""
    x = np.random.default_rng(11).normal(0, 5, 1000)
    q = DECILES
    split = _error(joint_exp, x, q, -100.0, 100.0, reps=150)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grid_module, "TIE_BITS", 0)
        plain = _error(joint_exp, x, q, -100.0, 100.0, reps=150)
    assert split < 1.3 * plain and plain < 1.3 * split


# ------------------------------------------------------------------------------- large splits

TIED_BIG = np.round(np.random.default_rng(12).normal(0, 30, 40_000), 0)  # ~200 values, ties


def _two_sample_pvalue(a, b, edges):
    """Chi-square p-value that two samples of released values share one law, on ``edges``."""
    from scipy.stats import chi2_contingency

    ca = np.histogram(a, edges)[0]
    cb = np.histogram(b, edges)[0]
    table = np.array([ca, cb])
    table = table[:, table.sum(axis=0) > 0]
    return chi2_contingency(table).pvalue


def _coded(out, x):
    """Each released value as its place among the data's distinct values: an exact hit (even
    code) or the gap between two of them (odd code)."""
    d = np.unique(x)
    i = np.searchsorted(d, out)
    hit = (i < d.size) & (d[np.minimum(i, d.size - 1)] == out)
    return 2 * i + np.where(hit, 0, -1)


def test_approx_quantiles_splits_lazily_past_the_cap_with_the_same_law(monkeypatch):
    """Past SPLIT_MAX_ENTRIES ApproxQuantiles splits a grid point only when a step's band
    reaches it: released values follow the law of the full split (two-sample chi-square over
    which data value or gap each output hits), and the same test rejects the grid itself (no
    split), which shows its power. Below the cap nothing changes (seed for seed)."""
    q = np.array([0.2, 0.5, 0.8])
    kw = dict(epsilon=0.5, lower=-100.0, upper=100.0)
    full = np.concatenate([approx_quantiles(TIED_BIG, q, rng=np.random.default_rng(s), **kw)
                           for s in range(600)])
    monkeypatch.setattr(grid_module, "SPLIT_MAX_ENTRIES", 1000)
    calls = []
    real = split_lazily

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    import dpq_spark.core.quantiles.approx_quantiles as aq

    monkeypatch.setattr(aq, "split_lazily", counted)
    lazy = np.concatenate([approx_quantiles(TIED_BIG, q, rng=np.random.default_rng(10_000 + s),
                                            **kw) for s in range(600)])
    assert len(calls) == 600
    edges = np.arange(-0.5, 2 * np.unique(TIED_BIG).size + 1.5)
    assert _two_sample_pvalue(_coded(full, TIED_BIG), _coded(lazy, TIED_BIG), edges) > 1e-3
    monkeypatch.setattr(grid_module, "TIE_BITS", 0)
    plain = np.concatenate([approx_quantiles(TIED_BIG, q, rng=np.random.default_rng(s), **kw)
                            for s in range(600)])
    assert _two_sample_pvalue(_coded(full, TIED_BIG), _coded(plain, TIED_BIG), edges) < 1e-6


def test_split_in_band_splits_only_the_points_a_draw_can_reach():
    """One step of the lazy split on 1,000 grid points of 50 rows each, the median at eps 1:
    the points whose ranks lie near the middle are split into fine points, every other one
    stays whole at its first fine point."""
    from dpq_spark.core.quantiles.approx_quantiles import _split_in_band

    k = np.arange(1000, dtype=np.int64) * 1000
    f, w, whole = k << 8, np.full(1000, 50, dtype=np.int64), np.ones(1000, dtype=bool)
    top = (1000 * 1000 << 8) - 1
    f2, w2, whole2 = _split_in_band(f, w, whole, 0, 1000, (0, top + 1, 0, top), 0.5, 0.5, 8,
                                    resolve_rng(np.random.default_rng(1)))
    assert w2.sum() == w.sum() and np.all(np.diff(f2) > 0)
    split_points = np.unique(f2[~whole2] >> 8) // 1000
    assert 0 < split_points.size < 50  # a band around the middle point, not the 1,000
    assert np.all(np.abs(split_points - 499.5) < 30)
    assert np.array_equal(np.unique(f2[whole2] >> 8) // 1000,
                          np.setdiff1d(np.arange(1000), split_points))


@pytest.mark.parametrize("name", ["joint_exp", "ind_exp", "approx_quantiles"])
def test_release_many_follows_the_core_past_the_cap(name, monkeypatch):
    """A group whose split passes SPLIT_MAX_ENTRIES goes through release_many as through the
    core (JointExp and IndExp split only their band's grid points, ApproxQuantiles splits
    lazily): one group, seed for seed."""
    from dpq_spark.core.quantiles.batch import release_many

    monkeypatch.setattr(grid_module, "SPLIT_MAX_ENTRIES", 1000)
    run = {"joint_exp": joint_exp, "ind_exp": ind_exp, "approx_quantiles": approx_quantiles}[name]
    x = TIED_BIG[:5000]
    want = run(x, QS, epsilon=1.0, lower=-100.0, upper=100.0, rng=np.random.default_rng(4))
    got = release_many([(x, None)], QS, epsilon=1.0, lower=-100.0, upper=100.0, mechanism=name,
                       rng=np.random.default_rng(4)).values[0]
    np.testing.assert_array_equal(got, want)
