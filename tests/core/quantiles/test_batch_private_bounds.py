"""release_many_private_bounds: many groups without public bounds, each with the law of the core's
``auto`` (or ``joint_exp``) with ``lower = upper = None`` on its data alone.

One group is drawn seed for seed as the core draws it (the same steps from the same source in
the same order); many groups in one call are compared in law with the core (chi-square
homogeneity of the median's rank among the data, at fixed seeds), with power against a wrong
epsilon."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from dpq_spark.core import auto
from dpq_spark.core.errors import BoundsNotFoundError
from dpq_spark.core.quantiles import batch_private_bounds as bpb
from dpq_spark.core.quantiles.batch import FlatGroups
from dpq_spark.core.quantiles.mechanisms import joint_exp
from dpq_spark.core.randomness.source import resolve_rng

DECILES = np.arange(1, 10) / 10
CORE = {"auto": auto, "joint_exp": joint_exp}


def _flat(groups):
    values = [np.unique(g, return_counts=True) for g in groups]
    return FlatGroups(np.concatenate([v for v, _ in values]), np.concatenate([c for _, c in values]),
                      np.cumsum([0] + [v.size for v, _ in values]))


@pytest.mark.parametrize("mechanism", ["auto", "joint_exp"])
@pytest.mark.parametrize("n, epsilon, relation, granularity", [
    (60, 1.0, "add_remove", None),  # below the bounds' gate: flagged
    (300, 0.3, "add_remove", None), (1000, 1.0, "add_remove", None), (5000, 10.0, "swap", None),
    (2000, 0.05, "add_remove", None),  # auto picks another mechanism
    (1000, 1.0, "add_remove", 0.1), (3000, 2.0, "swap", 0.1), (400, 1.0, "add_remove", 5.0)])
def test_one_group_is_drawn_as_the_core_draws_it(mechanism, n, epsilon, relation, granularity):
    """The same steps from the same source in the same order; with a declared granularity
    (tenths, and a step of 5 much coarser than the data) the jitter and the grid are the
    core's too."""
    extra = {} if granularity is None else {"granularity": granularity}
    for seed in range(3):
        gen = np.random.default_rng(seed)
        data = np.round(gen.lognormal(3.0, 1.0, n), 1)  # ties
        v, c = np.unique(data, return_counts=True)
        try:
            want = np.asarray(CORE[mechanism](v, DECILES, epsilon=epsilon, counts=c,
                                              neighboring=relation,
                                              rng=np.random.default_rng(seed + 10), **extra))
        except BoundsNotFoundError:
            want = None
        got = bpb.release_many_private_bounds(
            _flat([data]), DECILES, epsilon=epsilon, neighboring=relation, mechanism=mechanism,
            source=resolve_rng(np.random.default_rng(seed + 10)), **extra)
        if want is None:
            assert got.mechanisms == ["bounds_not_found"] and np.isnan(got.values).all()
        else:
            np.testing.assert_array_equal(got.values[0], want)
            assert got.mechanisms[0] != "bounds_not_found"


def _median_ranks(draws, data):
    return np.searchsorted(np.sort(data), draws[:, 4], side="right")


def _pvalue(a, b):
    lo, hi = np.percentile(np.concatenate([a, b]), [2, 98])
    edges = np.unique(np.linspace(lo, hi, 9).round())
    ta, tb = (np.bincount(np.digitize(x, edges), minlength=edges.size + 1) for x in (a, b))
    keep = (ta + tb) > 0
    return chi2_contingency(np.vstack([ta[keep], tb[keep]]))[1]


def test_many_groups_in_one_call_have_the_law_of_the_core_alone(monkeypatch):
    """600 copies of one 1,500-row group in one call, set-aside groups drawn every 40,000 entries
    (several release_many calls): the median's rank among the data has the law of 600 core
    calls on the group alone, and not the law of the core at twice epsilon."""
    monkeypatch.setattr(bpb, "_HELD_ENTRIES", 40_000)
    calls = []
    real = bpb.release_many
    monkeypatch.setattr(bpb, "release_many", lambda *a, **k: calls.append(1) or real(*a, **k))
    data = np.random.default_rng(1).normal(0.0, 5.0, 1500)
    runs = 600
    got = bpb.release_many_private_bounds(_flat([data] * runs), DECILES, epsilon=1.0,
                                          mechanism="joint_exp",
                                          source=resolve_rng(np.random.default_rng(2)))
    assert len(calls) > 3 and set(got.mechanisms) == {"joint_exp"}
    rng = np.random.default_rng(3)
    core = np.array([joint_exp(data, DECILES, epsilon=1.0, rng=rng) for _ in range(runs)])
    wrong = np.array([joint_exp(data, DECILES, epsilon=2.0, rng=rng) for _ in range(runs)])
    batch = _median_ranks(got.values, data)
    assert _pvalue(batch, _median_ranks(core, data)) > 1e-3
    assert _pvalue(batch, _median_ranks(wrong, data)) < 1e-3


@pytest.mark.parametrize("granularity", [None, 0.1])
def test_groups_keep_their_own_data_and_small_ones_are_flagged(granularity):
    """Groups far apart (centres 1e3 g, so bounds and declared grids of many sizes), of 5 to
    3,000 rows: each large group's deciles lie near its own data's; a flagged group has NaN
    values; the groups of 5 and 8 rows are flagged (the bounds' gate passes such a group about
    once in fifty draws at this epsilon, as the core does)."""
    gen = np.random.default_rng(6)
    sizes = [3000, 8, 800, 2000, 5, 1500] * 5
    groups = [np.round(1000.0 * (g + 1) + gen.normal(0.0, 5.0, n), 1) for g, n in enumerate(sizes)]
    got = bpb.release_many_private_bounds(_flat(groups), DECILES, epsilon=2.0, mechanism="auto",
                                          granularity=granularity,
                                          source=resolve_rng(np.random.default_rng(7)))
    flagged = [g for g, name in enumerate(got.mechanisms) if name == "bounds_not_found"]
    assert flagged == [g for g, n in enumerate(sizes) if n < 10]
    assert np.isnan(got.values[flagged]).all()
    for g, (data, n) in enumerate(zip(groups, sizes)):
        if n >= 10:
            assert np.all(np.diff(got.values[g]) >= 0)
            assert np.all(np.abs(got.values[g] - np.quantile(data, DECILES)) < 2.0), g


@pytest.mark.parametrize("relation", ["add_remove", "swap"])
def test_the_gates_of_many_groups_pass_with_the_cores_probability(relation):
    """2,000 copies of a group 20 rows above the gate's rule, in one call (every group's noisy
    count drawn in one array): under add/remove the share that passes is binomial with the
    exact P(n + DLap(b) >= min_rows), b the scale of COUNT_SHARE of the bounds' budget, and
    not with the scale of twice that budget; under swap n is public and every group passes."""
    from scipy.stats import binomtest

    from dpq_spark.core.quantiles.bounds import COUNT_SHARE, _dlap_cdf, min_rows
    from dpq_spark.core.randomness.samplers import dlap_scale

    eps, share, runs = 1.0, 0.2, 2000
    bounds_eps = share * eps
    eps_sides = (1.0 - COUNT_SHARE) * bounds_eps if relation == "add_remove" else bounds_eps / 2
    n = min_rows(eps_sides) + 20
    data = np.random.default_rng(8).normal(0.0, 5.0, n)
    got = bpb.release_many_private_bounds(_flat([data] * runs), DECILES, epsilon=eps,
                                          neighboring=relation, mechanism="joint_exp",
                                          bounds_share=share,
                                          source=resolve_rng(np.random.default_rng(9)))
    passed = sum(name != "bounds_not_found" for name in got.mechanisms)
    if relation == "swap":
        assert passed == runs
        return

    def p_pass(scale):  # P(Y >= -20) = 1 - P(Y <= -21)
        return 1.0 - float(_dlap_cdf(float(scale), np.array(-21)))

    right = p_pass(dlap_scale(1, COUNT_SHARE * bounds_eps))
    wrong = p_pass(dlap_scale(1, 2 * COUNT_SHARE * bounds_eps))
    assert 0.6 < right < 0.7 and wrong - right > 0.1  # the test can tell them apart
    assert binomtest(passed, runs, right).pvalue > 1e-3
    assert binomtest(passed, runs, wrong).pvalue < 1e-6
