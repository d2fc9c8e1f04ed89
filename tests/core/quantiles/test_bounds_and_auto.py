"""Private bounds (dpq_spark.core.quantiles.bounds) and mechanism="auto" (dpq_spark.core.quantiles.choose)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dpq_spark.core import auto, choose_mechanism, joint_exp, private_bounds
from dpq_spark.core.quantiles.bounds import candidate_grid
from dpq_spark.core.quantiles.release import QuantileRelease


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(epsilon=0.0), "`epsilon` must be finite and > 0"),
        (dict(lower=np.inf), "`lower` must be a finite real number or None"),
        (dict(lower=-1.0, upper=1.0), "`lower` and `upper` are both given"),
        (dict(n_hint=0.5), "`n_hint` must be a finite number >= 1"),
        (dict(neighboring="bogus"), "neighboring"),
    ],
)
def test_private_bounds_iv(kwargs, match):
    args = dict(epsilon=1.0) | kwargs
    with pytest.raises(ValueError, match=match):
        private_bounds([1.0, 2.0], **args)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(m=0), "`m` must be an integer >= 1"),
        (dict(n=-1), "`n` must be a finite number >= 0"),
        (dict(epsilon=float("nan")), "`epsilon` must be finite and > 0"),
    ],
)
def test_choose_mechanism_iv(kwargs, match):
    args = dict(m=5, n=1000, epsilon=1.0) | kwargs
    with pytest.raises(ValueError, match=match):
        choose_mechanism(args.pop("m"), **args)


def test_auto_share_iv():
    with pytest.raises(ValueError, match="`count_share` must be in \\(0, 1\\)"):
        auto([1.0, 2.0], [0.5], epsilon=1.0, count_share=1.0)
    with pytest.raises(ValueError, match="`bounds_share` must be in \\(0, 1\\)"):
        joint_exp([1.0, 2.0], [0.5], epsilon=1.0, bounds_share=0.0)


# --------------------------------------------------------------------------- the rule
def test_rule_follows_the_evaluation_tables():
    # n * epsilon = 1000, the setting of docs/evaluation.md, as measured again by
    # benchmarks/choosing_auto_grid.py (the whole table: test_auto_grid.py)
    assert choose_mechanism(1, n=1000, epsilon=1.0) == "ind_exp"
    assert {choose_mechanism(m, n=1000, epsilon=1.0) for m in range(2, 17) if m not in (3, 7)} == {"joint_exp"}
    # 3 and 7 quantiles: ApproxQuantiles' balanced tree of medians (benchmarks/choosing_small_m.py)
    assert {choose_mechanism(m, n=1000, epsilon=1.0) for m in (3, 7)} == {"approx_quantiles"}
    # beyond m = 16 (s / 1000) ** 0.6 (at most 16) a sized tree (benchmarks/choosing_few_rows.py)
    assert {choose_mechanism(m, n=1000, epsilon=1.0) for m in range(17, 50)} == {"agg_tree_12x3"}
    # many quantiles: AggTree on a tree sized for the budget (benchmarks/bench_many_quantiles.py)
    assert {choose_mechanism(m, n=1000, epsilon=1.0) for m in (50, 60, 99)} == {"agg_tree_8x3"}
    # below n * epsilon = 316 the first rule: JointExp hands over early
    assert choose_mechanism(30, n=1000, epsilon=0.25) != "joint_exp"
    # larger n * epsilon hands m = 17-53 to ApproxQuantiles
    assert choose_mechanism(30, n=1e5, epsilon=1.0) == "approx_quantiles"


def test_auto_records_the_mechanism_and_ignores_the_data():
    rng = np.random.default_rng(1)
    a = rng.normal(0, 5, 1000)
    b = rng.exponential(1000.0, 1000)      # same n, very different data
    q = np.arange(1, 41) / 41
    ra = auto(a, q, epsilon=1.0, lower=-100, upper=100, neighboring="swap", rng=rng)
    rb = auto(b, q, epsilon=1.0, lower=-100, upper=100, neighboring="swap", rng=rng)
    assert isinstance(ra, QuantileRelease)
    assert ra.mechanism == rb.mechanism == choose_mechanism(40, n=1000, epsilon=1.0)
    assert ra.bounds == "given" and (ra.lower, ra.upper) == (-100.0, 100.0)
    r = auto(a, [0.5], epsilon=1.0, neighboring="add_remove", n_hint=1000, rng=rng)
    assert r.mechanism == "ind_exp" and r.bounds == "private" and r.lower < r.upper
    assert r.n_used == 1000.0


def test_auto_noisy_count_is_close_and_private_bounds_are_reported():
    rng = np.random.default_rng(2)
    x = rng.normal(0, 5, 20_000)
    r = auto(x, np.arange(1, 10) / 10, epsilon=1.0, rng=rng)
    assert r.mechanism == "joint_exp" and r.bounds == "private"
    assert abs(r.n_used - 20_000) < 400          # DLap(1 / 0.05): P(|noise| >= 400) ~ e^-20
    assert r.lower < -15 and r.upper > 15        # the bounds hold the bulk of N(0, 5)


def test_with_both_bounds_the_wrapped_mechanism_is_the_base_one():
    x = np.random.default_rng(3).normal(0, 5, 500)
    q = [0.25, 0.5, 0.75]
    wrapped = joint_exp(x, q, epsilon=1.0, lower=-50, upper=50, rng=np.random.default_rng(7))
    base = joint_exp.__wrapped__(x, q, epsilon=1.0, lower=-50, upper=50, rng=np.random.default_rng(7))
    assert np.array_equal(wrapped, base)


# --------------------------------------------------------------------------- bounds accuracy
def test_private_bounds_hold_the_deciles():
    rng = np.random.default_rng(4)
    for x in (rng.normal(0, 5, 500), rng.lognormal(10.7, 0.9, 500), rng.normal(0, 5, 100_000)):
        b = private_bounds(x, epsilon=0.2, rng=rng)
        d = np.quantile(x, [0.1, 0.9])
        assert b.lower < d[0] and b.upper > d[1]
        assert b.upper - b.lower < 20 * (x.max() - x.min())


def test_grid_is_public_and_symmetric():
    g = candidate_grid()
    assert np.all(np.diff(g) > 0) and np.array_equal(g, -g[::-1]) and g[-1] >= 2.0**50


# --------------------------------------------------------------------------- privacy
def _max_log_ratio_lower_bound(hits_a, hits_b, runs, alpha=1e-3):
    """Largest Clopper-Pearson lower bound of log(P_a(o) / P_b(o)) over outcomes o (both ways)."""
    k = hits_a.size
    level = alpha / (2 * k)      # Bonferroni over outcomes and directions
    best = -np.inf
    for x, y in ((hits_a, hits_b), (hits_b, hits_a)):
        for i in range(k):
            if x[i] == 0:
                continue
            lo = stats.beta.ppf(level / 2, x[i], runs - x[i] + 1)
            hi = stats.beta.ppf(1 - level / 2, y[i] + 1, runs - y[i]) if y[i] < runs else 1.0
            best = max(best, np.log(lo / hi))
    return best


def test_bounds_free_refuses_bad_quantiles_before_drawing_anything():
    from dpq_spark.core.randomness.source import RandomSource
    from dpq_spark.core.quantiles.mechanisms import joint_exp

    drawn = []

    def read(k):
        drawn.append(k)
        return bytes(k)

    source = RandomSource(read, cryptographic=False, name="spy")
    x = np.linspace(0.0, 10.0, 2000)  # enough rows for the bounds' gate at epsilon = 0.2
    for bad, match in (([0.5, 0.2], "`quantiles`"), ([1.5], "`quantiles`")):
        with pytest.raises(ValueError, match=match):
            joint_exp(x, bad, epsilon=1.0, rng=source)
    with pytest.raises(ValueError, match="`granularity`"):
        joint_exp(x, [0.5], epsilon=1.0, granularity=-1.0, rng=source)
    assert drawn == []
    joint_exp(x, [0.5], epsilon=1.0, rng=np.random.default_rng(0))  # the valid call runs


def _auto_names(n_rows, epsilon, runs, seed):
    # 5 quantiles of n_rows points; under add/remove the choice reads a noisy count only
    x = np.linspace(1.0, 9.0, n_rows)
    rng = np.random.default_rng(seed)
    names = ("histogram", "agg_tree", "approx_quantiles", "joint_exp", "agg_tree_8x3")
    hits = np.zeros(len(names), dtype=np.int64)
    for _ in range(runs):
        r = auto(x, [0.1, 0.3, 0.5, 0.7, 0.9], epsilon=epsilon, lower=0.0, upper=10.0,
                 count_share=0.5, rng=rng)
        hits[names.index(r.mechanism)] += 1
    return hits


def test_auto_choice_costs_only_the_count_share_and_catches_double_spending():
    # The released mechanism name is a function of the noisy count alone, so between neighbours
    # (25 rows, and one row added) its log-ratio must stay within count_share * epsilon. With
    # count_share = 0.5 at epsilon = 2 (1 for the count), the choice switches from the
    # histogram to agg_tree_8x3 at a noisy count of 25 (n * epsilon reaches 25), in the geometric
    # tail of both neighbours' noise, where the ratio is exactly e^1: the bound is tight. An
    # auto that spends epsilon twice (run at 2 epsilon: count noise for 2) shows e^2 at its own
    # switch (noisy count 13 with epsilon 2 left for the quantiles) and must fail the same check.
    assert choose_mechanism(5, n=25, epsilon=1.0) == "agg_tree_8x3"
    assert choose_mechanism(5, n=24, epsilon=1.0) == "histogram"
    assert choose_mechanism(5, n=13, epsilon=2.0) == "agg_tree_8x3"
    assert choose_mechanism(5, n=12, epsilon=2.0) == "histogram"
    runs = 4000
    share_eps = 0.5 * 2.0
    a = _auto_names(25, 2.0, runs, 21)
    b = _auto_names(26, 2.0, runs, 22)
    assert _max_log_ratio_lower_bound(a, b, runs) <= share_eps
    a2 = _auto_names(13, 4.0, runs, 23)
    b2 = _auto_names(14, 4.0, runs, 24)
    assert _max_log_ratio_lower_bound(a2, b2, runs) > share_eps
