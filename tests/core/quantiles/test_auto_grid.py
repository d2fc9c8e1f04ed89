"""``mechanism="auto"`` on the data's public grid: the rule's choices, that it reads no data, and
that auto's accounting is the same with a granularity (dpq_spark.core.quantiles.choose)."""

from __future__ import annotations

import numpy as np
import pytest

from dpq_spark.core import auto, choose_mechanism
from dpq_spark.core.quantiles._pure import get_base_mechanism
from dpq_spark.core.quantiles.choose import TYPED_GRID_MAX, grid_points, plan_auto
from dpq_spark.core.randomness.dlap_table import dlap_many
from dpq_spark.core.randomness.samplers import dlap_scale
from dpq_spark.core.randomness.source import resolve_rng


def _typed(m, s, g=501):
    return choose_mechanism(m, n=s, epsilon=1.0, grid_size=g, granularity=0.01)


def _plain(m, s):
    return choose_mechanism(m, n=s, epsilon=1.0)


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(grid_size=0), ValueError, "`grid_size` must be an integer >= 1 or None, got 0"),
        (dict(grid_size=2.5), ValueError, "`grid_size` must be an integer >= 1 or None"),
        (dict(grid_size=True), ValueError, "`grid_size` must be an integer >= 1 or None"),
        (dict(granularity=-1.0), ValueError, "`granularity` must be finite and > 0, got -1.0"),
        (dict(granularity="0.01"), TypeError, "`granularity` must be a real number"),
    ],
)
def test_choose_mechanism_grid_iv(kwargs, error, match):
    with pytest.raises(error, match=match):
        choose_mechanism(5, n=1000, epsilon=1.0, **kwargs)


def test_auto_granularity_iv_before_any_draw():
    drawn = []

    class Spy(np.random.Generator):
        def integers(self, *a, **k):  # pragma: no cover - must not be reached
            drawn.append(a)
            return super().integers(*a, **k)

    with pytest.raises(ValueError, match="`granularity` must be finite and > 0, got 0.0"):
        auto([1.0, 2.0], [0.5], epsilon=1.0, lower=0, upper=5, granularity=0.0,
             rng=Spy(np.random.PCG64(0)))
    with pytest.raises(ValueError, match="`granularity` must give at most 2\\*\\*52 steps"):
        auto([1.0, 2.0], [0.5], epsilon=1.0, lower=0, upper=5, granularity=1e-300)
    assert drawn == []


def test_grid_points():
    assert grid_points(0, 5, 0.01) == 501
    assert grid_points(0, 100, 1) == 101
    assert grid_points(-100, 100) == 2**32 + 1


# --------------------------------------------------------------------------- the rule
def test_rule_without_a_declared_grid():
    """The measured tables (benchmarks/choosing_auto_grid.py, continuous N(0, 5), bounds +-100;
    benchmarks/choosing_few_rows.py below n * epsilon = 10**3.5: JointExp up to
    m = 16 (s / 1000) ** 0.6, between 2 and 16, a sized tree beyond; benchmarks/choosing_small_m.py
    for one quantile below 10**1.25 and for m = 3, 7, 15 from 316, 1000, 1778)."""
    assert {_plain(1, s) for s in (17.8, 100, 1e3, 1e7)} == {"ind_exp"}
    assert {_plain(1, s) for s in (1, 10, 17.7)} == {"histogram"}
    assert {_plain(m, 10) for m in (3, 9, 29, 99, 199)} == {"histogram"}
    assert _plain(3, 100) == "joint_exp" and _plain(9, 100) == "agg_tree_8x3"
    assert _plain(29, 100) == _plain(99, 100) == "agg_tree_8x3"
    assert [_plain(3, 316), _plain(7, 999), _plain(15, 1778)] == ["joint_exp"] * 3
    assert [_plain(3, 317), _plain(7, 1000), _plain(15, 1779)] == ["approx_quantiles"] * 3
    assert {_plain(m, s) for m in (3, 7, 15) for s in (1e4, 1e7)} == {"approx_quantiles"}
    assert {_plain(m, s) for m in (2, 4, 5, 6, 8, 14, 16) for s in (1e3, 1e4, 1e7)} == {"joint_exp"}
    assert {_plain(9, s) for s in (1e3, 1e4, 1e5, 1e6, 1e7)} == {"joint_exp"}
    assert _plain(29, 1000) == _plain(29, 3162) == "agg_tree_12x3" and _plain(16, 3162) == "joint_exp"
    assert {_plain(29, s) for s in (1e4, 1e5, 1e6, 1e7)} == {"approx_quantiles"}
    assert {_plain(m, 1e3) for m in (99, 199)} == {"agg_tree_8x3"}
    assert {_plain(m, 1e4) for m in (99, 199)} == {"agg_tree_12x3"}
    assert {_plain(m, s) for m in (99, 199) for s in (1e5, 1e6)} == {"agg_tree"}
    assert _plain(99, 1e7) == _plain(199, 1e7) == "approx_quantiles"
    # the band edges: 25 and half decades of n * epsilon, m = 16 | 17, 53 | 54
    assert _plain(2, 24.9) == "histogram" and _plain(2, 25) == "joint_exp"
    assert _plain(4, 100) == "joint_exp" and _plain(5, 100) == "agg_tree_8x3"
    assert _plain(2, 25) == "joint_exp" and _plain(3, 25) == "agg_tree_8x3"
    assert _plain(16, 1000) == "joint_exp" and _plain(17, 1000) == "agg_tree_12x3"
    assert _plain(29, 562) == "agg_tree_8x3" and _plain(29, 563) == "agg_tree_12x3"
    assert _plain(49, 3162) == "agg_tree_12x3" and _plain(49, 3163) == "approx_quantiles"
    assert _plain(16, 1e5) == "joint_exp" and _plain(17, 1e5) == "approx_quantiles"
    assert _plain(53, 1e5) == "approx_quantiles" and _plain(54, 1e5) == "agg_tree"
    # the sized trees (m >= 50): 8**3 leaves from 25 to 10**3.25, 12**3 up to 12,000, 8**4 up
    # to 10**4.75, or 12**3 only up to 10**3.5 for m = 50-53, where they only tie ApproxQuantiles
    assert _plain(50, 24.9) == "histogram" and _plain(50, 25) == "agg_tree_8x3"
    assert _plain(99, 1778) == "agg_tree_8x3" and _plain(99, 1779) == "agg_tree_12x3"
    assert _plain(53, 3162) == "agg_tree_12x3" and _plain(53, 3163) == "approx_quantiles"
    assert _plain(54, 3163) == "agg_tree_12x3"
    assert _plain(54, 11_999) == "agg_tree_12x3" and _plain(54, 12_000) == "agg_tree_8x4"
    assert _plain(54, 56234) == "agg_tree_8x4" and _plain(54, 56235) == "agg_tree"


def test_rule_on_a_typed_grid():
    """Integers in [0, 100], [0, 1e4] and two decimals in [0, 5] (G = 101, 10,001, 501)."""
    for g in (101, 501, 10_001):
        assert {_typed(1, s, g) for s in (10, 1e3, 1e7)} == {"approx_quantiles"}
        assert {_typed(m, 10, g) for m in (3, 9, 29, 99, 199)} == {"histogram"}
        assert _typed(3, 100, g) == "joint_exp"
        # 2 to 5 quantiles: the histogram below 25 * m, then JointExp, ApproxQuantiles for m = 3
        assert [_typed(m, 25 * m - 0.1, g) for m in (2, 3, 4, 5)] == ["histogram"] * 4
        assert [_typed(m, 25 * m, g) for m in (2, 3, 4, 5)] == ["joint_exp"] * 4
        assert {_typed(m, s, g) for m in (2, 4, 5) for s in (317, 1e3, 1e4, 1e6)} == {"joint_exp"}
        assert {_typed(m, 1e7, g) for m in (2, 4, 5)} == {"agg_tree"}
        assert _typed(6, 100, g) == "histogram" and _typed(16, 317, g) == "joint_exp"
        assert {_typed(m, 100, g) for m in (9, 29, 99, 199)} == {"histogram"}
        assert {_typed(3, s, g) for s in (1e3, 1e4, 1e5, 1e7)} == {"approx_quantiles"}
        assert {_typed(9, s, g) for s in (1e3, 1e4, 1e5, 1e6)} == {"joint_exp"}
        assert {_typed(m, 1e3, g) for m in (29, 99, 199)} == {"histogram"}
        assert {_typed(29, s, g) for s in (1e4, 1e5, 1e6)} == {"approx_quantiles"}
        assert {_typed(m, s, g) for m in (99, 199) for s in (1e4, 1e5, 1e7)} == {"agg_tree"}
        assert {_typed(m, 1e7, g) for m in (9, 29)} == {"agg_tree"}


def test_rule_needs_both_grid_arguments_and_a_small_grid():
    # deciles at n epsilon = 1e3 on the declared grid, 29 quantiles at 1e3
    assert _plain(29, 1e3) == "agg_tree_12x3" and _typed(29, 1e3) == "histogram"
    assert choose_mechanism(29, n=1e3, epsilon=1.0, grid_size=501) == "agg_tree_12x3"        # no step
    assert choose_mechanism(29, n=1e3, epsilon=1.0, granularity=0.01) == "agg_tree_12x3"     # no G
    assert _typed(29, 1e3, TYPED_GRID_MAX) == "histogram"
    assert _typed(29, 1e3, TYPED_GRID_MAX + 1) == "agg_tree_12x3"
    assert _typed(29, 1e3, 2**32 + 1) == _plain(29, 1e3)


# --------------------------------------------------------------------------- auto
@pytest.mark.parametrize(("m", "n", "eps"), [(1, 300, 1.0), (3, 50, 1.0), (9, 2000, 1.0),
                                             (29, 20_000, 1.0), (99, 3000, 1.0)])
def test_auto_with_n_hint_is_the_chosen_base_mechanism_seed_for_seed(m, n, eps):
    """What benchmarks/choosing_auto_grid.py relies on to read auto's error off the table."""
    x = np.clip(np.round(np.random.default_rng(m).normal(40, 15, n)), 0, 100)
    q = np.arange(1, m + 1) / (m + 1)
    got = auto(x, q, epsilon=eps, lower=0, upper=100, granularity=1, n_hint=n,
               rng=np.random.default_rng(5))
    name = choose_mechanism(m, n=n, epsilon=eps, grid_size=101, granularity=1)
    want = get_base_mechanism(name)(x, q, epsilon=eps, lower=0, upper=100, granularity=1,
                                    rng=np.random.default_rng(5))
    assert got.mechanism == name and got.epsilon == eps
    assert np.array_equal(np.asarray(got), want)
    assert np.all(np.asarray(got) == np.round(np.asarray(got)))  # integers: points of the grid


def test_auto_choice_reads_no_data():
    """Same public inputs (m, n, epsilon, bounds, granularity), very different values: the same
    mechanism every time, under swap (n public) and with a hint; the public inputs alone move it."""
    gen = np.random.default_rng(3)
    sets = [gen.integers(0, 101, 1000).astype(float), np.full(1000, 7.0),
            np.clip(np.round(gen.normal(40, 15, 1000)), 0, 100), np.zeros(1000)]
    for m, want in ((3, "approx_quantiles"), (29, "histogram")):
        q = np.arange(1, m + 1) / (m + 1)
        for kwargs in (dict(neighboring="swap"), dict(n_hint=1000)):
            names = {auto(x, q, epsilon=1.0, lower=0, upper=100, granularity=1, rng=gen, **kwargs).mechanism
                     for x in sets}
            assert names == {want}
    q = np.arange(1, 30) / 30
    # without the granularity the same data get the other rule's pick
    assert {auto(x, q, epsilon=1.0, lower=0, upper=100, neighboring="swap", rng=gen).mechanism
            for x in sets} == {"agg_tree_12x3"}


def _auto_then_recipe(x, q, eps, rng, share):
    """auto's accounting written out: a noisy count at ``share * eps``, the rule on it, the chosen
    base mechanism at ``(1 - share) eps`` on the same source."""
    source = resolve_rng(rng)
    noisy = x.size + dlap_many(source, dlap_scale(1, share * eps), 1)[0]
    rest = (1 - share) * eps
    name = choose_mechanism(len(q), n=float(max(noisy, 0)), epsilon=rest, grid_size=101, granularity=1)
    return name, get_base_mechanism(name)(x, q, epsilon=rest, lower=0, upper=100, granularity=1,
                                          rng=source)


@pytest.mark.parametrize("share", [0.05, 0.5])
def test_auto_accounting_is_unchanged_with_a_granularity(share):
    """Under add/remove without a hint, auto with ``granularity`` spends ``count_share`` of epsilon
    on the count and the rest on the mechanism, draw for draw; the recipe at another share
    differs, so the comparison has power. Sizes straddle the rule's edges for quartiles (n * epsilon
    25 * 3 = 75 and 316)."""
    gen = np.random.default_rng(0)
    q = np.array([0.25, 0.5, 0.75])
    names, mismatches = set(), 0
    for trial in range(30):
        x = np.clip(np.round(gen.normal(40, 15, int(gen.choice([5, 20, 40, 150, 400, 500])))), 0, 100)
        got = auto(x, q, epsilon=1.0, lower=0, upper=100, granularity=1,
                   rng=np.random.default_rng(trial))
        name, want = _auto_then_recipe(x, q, 1.0, np.random.default_rng(trial), share)
        names.add(got.mechanism)
        mismatches += not (got.mechanism == name and np.array_equal(np.asarray(got), want))
        assert got.epsilon == 1.0
    assert names == {"histogram", "joint_exp", "approx_quantiles"}
    if share == 0.05:
        assert mismatches == 0
    else:
        assert mismatches > 10


def test_plan_auto_passes_the_grid():
    source = resolve_rng(np.random.default_rng(0))
    name, rest, n_used = plan_auto(29, 1000, epsilon=1.0, neighboring="swap", source=source,
                                   grid_size=501, granularity=0.01)
    assert (name, rest, n_used) == ("histogram", 1.0, 1000.0)
    name, _, _ = plan_auto(29, 1000, epsilon=1.0, neighboring="swap", source=source)
    assert name == "agg_tree_12x3"
