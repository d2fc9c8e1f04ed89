"""Ties: jitter inside a declared granularity (issue 12 section 4).

The jittered mechanisms against the exact mixture over every jitter (chi-square, with power), the
privacy of that mixture on tiny neighbours (exact pmf ratios), the grid helpers, and accuracy on
tied and continuous data.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chisquare

from dpq_spark.core.randomness import grid as grid_module
from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.core.quantiles.approx_quantiles import approx_quantiles
from dpq_spark.core.randomness.grid import MAX_GRID_STEPS, Grid, jitter_indices, round_indices
from dpq_spark.core.quantiles.ind_exp import ind_exp
from dpq_spark.core.quantiles.joint_exp import joint_exp
from dpq_spark.core.accounting.neighboring import NeighboringRelation, joint_exp_sensitivity
from dpq_spark.core.quantiles.single_quantile import single_quantile

S = 4  # fine points per step in the exact tests (the default 2**16 is lowered for them)


@pytest.fixture
def small_jitter(monkeypatch):
    monkeypatch.setattr(grid_module, "_JITTER_SCALE", S)


# ------------------------------------------------------------------------------- exact mixture


def fine_mid_ranks(fine, fine_size):
    """rho(f) = #{x < f} + (t + 1)/2 if t points sit on f (else #{x < f}), for every fine point."""
    fine = np.asarray(fine)
    pts = np.arange(fine_size)
    below = (fine[None, :] < pts[:, None]).sum(axis=1)
    tied = (fine[None, :] == pts[:, None]).sum(axis=1)
    return below + np.where(tied > 0, (tied + 1) / 2.0, 0.0)


def joint_pmf(fine, fine_size, q, c):
    """P(o) ∝ exp(c u(o)) over every sorted m-tuple o of fine points, from the definition."""
    rho = fine_mid_ranks(fine, fine_size)
    n = len(fine)
    q = np.asarray(q)
    targets = np.diff(np.concatenate(([0.0], q, [1.0]))) * n
    tuples = list(itertools.combinations_with_replacement(range(fine_size), q.size))
    ranks = np.column_stack([np.zeros(len(tuples)), rho[np.array(tuples)], np.full(len(tuples), float(n))])
    logw = -c * np.abs(np.diff(ranks, axis=1) - targets).sum(axis=1)
    w = np.exp(logw - logw.max())
    return tuples, w / w.sum()


def support(k, jitter, steps):
    """The fine indices record k can be jittered to (as jitter_indices defines them)."""
    half = jitter // 2
    return range(max(k * jitter - half, 0), min(k * jitter + half - 1, steps * jitter) + 1)


def mixture(k, grid_steps, jitter, q, c):
    """Output pmf of the jittered JointExp after rounding: the average over every jitter of the
    data of the exact fine pmf, each fine tuple mapped to grid indices."""
    fine_size = grid_steps * jitter + 1
    total = {}
    jitters = list(itertools.product(*[support(int(v), jitter, grid_steps) for v in k]))
    for fine in jitters:
        tuples, p = joint_pmf(list(fine), fine_size, q, c)
        for o, pr in zip(tuples, p):
            key = tuple(int(min(max((f + jitter // 2) // jitter, 0), grid_steps)) for f in o)
            total[key] = total.get(key, 0.0) + pr / len(jitters)
    return total


def grid_pmf(k, grid_steps, q, c):
    """Output pmf of JointExp on the grid itself, no jitter (the mid-rank handles ties)."""
    tuples, p = joint_pmf(list(k), grid_steps + 1, q, c)
    return dict(zip(tuples, p))


def c_of(q, eps, neighboring="add_remove"):
    return eps / (2 * joint_exp_sensitivity(np.asarray(q, dtype=float), NeighboringRelation(neighboring)))


def pvalue(samples, probs):
    observed = {}
    for s in samples:
        observed[s] = observed.get(s, 0) + 1
    assert set(observed) <= {o for o, p in probs.items() if p > 0}, "an impossible output"
    keys = list(probs)
    obs = np.array([observed.get(o, 0) for o in keys], dtype=float)
    exp = np.array([probs[o] for o in keys]) * len(samples)
    small = exp < 5
    if small.any():  # pool rare outputs so that the chi-square approximation holds
        obs = np.append(obs[~small], obs[small].sum())
        exp = np.append(exp[~small], exp[small].sum())
    return chisquare(obs, exp).pvalue


# Three records on Grid(0, 3, 1) (N = 3), two of them tied: fine grid of 13 points with S = 4.
TIED = np.array([1.0, 1.0, 2.0])
K_TIED = [1, 1, 2]
STEPS = 3
DRAWS = 12_000


@pytest.fixture(scope="module")
def joint_draws():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grid_module, "_JITTER_SCALE", S)
        rng = np.random.default_rng(2024)
        q = [0.3, 0.7]
        out = [tuple(int(v) for v in joint_exp(TIED, q, epsilon=2.0, lower=0.0, upper=3.0, granularity=1.0,
                                               rng=rng)) for _ in range(DRAWS)]
    return q, out


def test_joint_exp_is_the_mixture_over_jitters(joint_draws):
    q, out = joint_draws
    assert pvalue(out, mixture(K_TIED, STEPS, S, q, c_of(q, 2.0))) > 1e-3


def test_joint_exp_mixture_test_has_power(joint_draws):
    # Rejects the mechanism without jitter, a jitter of a different width, and epsilon x 1.3.
    q, out = joint_draws
    c = c_of(q, 2.0)
    assert pvalue(out, grid_pmf(K_TIED, STEPS, q, c)) < 1e-6
    assert pvalue(out, mixture(K_TIED, STEPS, 2, q, c)) < 1e-6
    assert pvalue(out, mixture(K_TIED, STEPS, S, q, 1.3 * c)) < 1e-6


@pytest.fixture(scope="module")
def single_draws():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grid_module, "_JITTER_SCALE", S)
        rng = np.random.default_rng(7)
        kw = dict(epsilon=2.0, lower=0.0, upper=3.0, granularity=1.0)
        out = {
            "single_quantile": [single_quantile(TIED, 0.3, rng=rng, **kw) for _ in range(DRAWS)],
            "ind_exp": [ind_exp(TIED, [0.3], rng=rng, **kw)[0] for _ in range(DRAWS)],
            "approx_quantiles": [approx_quantiles(TIED, [0.3], rng=rng, **kw)[0] for _ in range(DRAWS)],
        }
    return {name: [(int(v),) for v in vals] for name, vals in out.items()}


@pytest.mark.parametrize("name", ["single_quantile", "ind_exp", "approx_quantiles"])
def test_single_quantile_samplers_are_the_mixture_over_jitters(single_draws, name):
    # m = 1: JointExp's utility is -2 |rho - q n| and its Delta is 2 max(q, 1 - q), the
    # single-quantile mechanism's -|rho - q n| with Delta = max(q, 1 - q): the same pmf.
    probs = mixture(K_TIED, STEPS, S, [0.3], c_of([0.3], 2.0))
    assert pvalue(single_draws[name], probs) > 1e-3
    assert pvalue(single_draws[name], grid_pmf(K_TIED, STEPS, [0.3], c_of([0.3], 2.0))) < 1e-6
    assert pvalue(single_draws[name], mixture(K_TIED, STEPS, S, [0.3], 1.3 * c_of([0.3], 2.0))) < 1e-6


# ------------------------------------------------------------------------------- privacy


def neighbour_pairs(grid_steps, max_n):
    """(dataset, neighbour, relation) for every dataset of <= max_n grid indices."""
    for n in range(max_n + 1):
        for d in itertools.combinations_with_replacement(range(grid_steps + 1), n):
            d = list(d)
            for k in range(grid_steps + 1):
                yield d, sorted(d + [k]), "add_remove"
                for r in range(n):
                    yield d, sorted(d[:r] + [k] + d[r + 1 :]), "swap"


def worst_log_ratio(q, eps, spend=1.0, grid_steps=2, max_n=2, jitter=S, law=None):
    """Largest |log P(o | D) / P(o | D')| of the jittered mechanism over neighbours and outputs,
    the mechanism run with ``spend * eps`` (the true one: spend = 1). ``law(data, c)``: another
    mechanism's exact output pmf (default: the jitter's mixture)."""
    if law is None:
        def law(data, c):
            return mixture(data, grid_steps, jitter, q, c)
    worst = {"add_remove": 0.0, "swap": 0.0}
    cache = {}
    for d, d2, relation in neighbour_pairs(grid_steps, max_n):
        c = c_of(q, spend * eps, relation)
        p = []
        for data in (d, d2):
            key = (tuple(data), c)
            if key not in cache:
                cache[key] = law(data, c)
            p.append(cache[key])
        for o in p[0]:
            worst[relation] = max(worst[relation], abs(math.log(p[0][o] / p[1][o])))
    return worst


def check_exactly_dp(worst, eps=3.0):
    """``worst(eps, spend)`` (a :func:`worst_log_ratio`) is within ``eps`` for both relations
    and comes near it; run with ``2 eps`` it is not (the check's power)."""
    found = worst(eps, 1.0)
    for relation, value in found.items():
        assert value <= eps + 1e-9, relation
    assert found["add_remove"] > 0.45 * eps
    assert worst(eps, 2.0)["add_remove"] > eps * 1.1


@pytest.mark.parametrize("q", [[0.5], [0.3, 0.7]])
def test_jittered_mechanism_is_epsilon_dp_exactly(q):
    # Every dataset of <= 2 records on 3 grid points (S = 4: 9 fine points), every add/remove and
    # swap neighbour, every output: the exact mixture pmfs are within e**eps of each other.
    # epsilon = 3 so that the worst ratio comes near the bound (2.0 and 1.5 of 3 measured); with
    # 2 eps the check fails (4.9 and 3.5 measured).
    check_exactly_dp(lambda eps, spend: worst_log_ratio(q, eps, spend))


# ------------------------------------------------------------------------------- grid helpers


def test_jitter_rule_depends_only_on_the_arguments():
    assert Grid(0.0, 5.0).jitter == 1  # default grid: no declared resolution, no jitter
    g = Grid(0.0, 5.0, 0.01)
    assert g.jitter == 2**16 and g.fine_size == 500 * 2**16 + 1
    big = Grid(0.0, 1.0, 2.0**-40)  # N = 2**40: S = 2**12 keeps N S <= 2**52
    assert big.jitter == 2**12 and big.fine_size == MAX_GRID_STEPS + 1
    assert Grid(0.0, 1.0, 2.0**-52).jitter == 1  # no room for a finer grid


def test_jitter_stays_in_the_cell_and_rounds_back():
    g = Grid(0.0, 5.0, 0.01)
    k = np.repeat(np.arange(g.size), 40)
    source = resolve_rng(np.random.default_rng(1))
    f = jitter_indices(k, None, g.jitter, g, source)
    assert f.min() >= 0 and f.max() <= g.fine_size - 1
    np.testing.assert_array_equal(round_indices(f, g.jitter, g), k)
    np.testing.assert_array_equal(round_indices(k * g.jitter, g.jitter, g), k)
    # counts: one draw per copy, in the order of np.repeat.
    a = jitter_indices([3, 7], [2, 1], g.jitter, g, resolve_rng(np.random.default_rng(2)))
    b = jitter_indices([3, 3, 7], None, g.jitter, g, resolve_rng(np.random.default_rng(2)))
    np.testing.assert_array_equal(a, b)


def test_jitter_is_uniform_on_the_cell():
    # Record k = 1 on Grid(0, 2, 1) with S = 8 lands uniformly on fine points 4..11; k = 0 on 0..3,
    # k = 2 on 12..16 (the last cell is cut by the bound N S = 16).
    g = Grid(0.0, 2.0, 1.0)
    source = resolve_rng(np.random.default_rng(3))
    for k, lo, hi in ((1, 4, 11), (0, 0, 3), (2, 12, 16)):
        f = jitter_indices(np.full(8000, k), None, 8, g, source)
        counts = np.bincount(f - lo, minlength=hi - lo + 1)
        assert counts.size == hi - lo + 1
        assert chisquare(counts).pvalue > 1e-3
    # Power: a jitter one point narrower is visibly not uniform over the cell.
    f = 4 + source.below_array(np.full(8000, 7))
    assert chisquare(np.bincount(f - 4, minlength=8)).pvalue < 1e-6


# ------------------------------------------------------------------------------- accuracy


def ratings():
    import csv

    out = []
    with open(Path(__file__).resolve().parents[3] / "data" / "goodreads_books.csv", newline="",
              encoding="utf-8") as fh:
        for row in csv.reader(fh):
            if len(row) != 12 or row[3] == "average_rating":  # the malformed rows, the header
                continue
            out.append(float(row[3]))
    return np.array(out)


DECILES = np.arange(1, 10) / 10


def mean_abs_error(x, lower, upper, reps, seed, granularity=None, mechanism=joint_exp):
    true = np.quantile(x, DECILES, method="lower")
    rng = np.random.default_rng(seed)
    return float(np.mean([np.abs(mechanism(x, DECILES, epsilon=1.0, lower=lower, upper=upper,
                                           granularity=granularity, rng=rng) - true).mean()
                          for _ in range(reps)]))


def test_goodreads_deciles_land_on_the_ties(monkeypatch):
    # Goodreads average_rating (11,123 values, 209 distinct), deciles at eps = 1, 30 repetitions,
    # granularity 0.01 declared: target of issue 12 <= 0.0022 (PipelineDP's tree). Measured
    # 0.00063 with jitter (IndExp 0.0014, ApproxQuantiles 0.0006); 0.0034 without jitter
    # (mid-rank on the 0.01 grid), 0.0039 on the default grid.
    x = ratings()
    assert x.size == 11_123
    assert mean_abs_error(x, 0.0, 5.0, 30, seed=0, granularity=0.01) <= 0.0022
    assert mean_abs_error(x, 0.0, 5.0, 30, seed=0, granularity=0.01, mechanism=approx_quantiles) <= 0.0022
    # Power: the same grid without the jitter misses the target.
    monkeypatch.setattr(grid_module, "_JITTER_SCALE", 1)
    assert mean_abs_error(x, 0.0, 5.0, 30, seed=0, granularity=0.01) > 0.0028


def test_continuous_data_keeps_its_accuracy_with_and_without_granularity():
    # 1,000 N(0, 5) values, bounds ±100, deciles, eps = 1, 200 datasets (seed 5): measured 0.087
    # on the default grid (no jitter) and 0.092 with granularity 0.01 (jitter); one dataset's
    # error has a standard deviation of about 0.05, so 30 datasets alone ranged 0.089-0.121.
    for g in (None, 0.01):
        gen = np.random.default_rng(5)
        errs = [mean_abs_error(gen.normal(0.0, 5.0, 1000), -100.0, 100.0, 1, seed=s, granularity=g)
                for s in range(200)]
        assert np.mean(errs) < 0.105, g
