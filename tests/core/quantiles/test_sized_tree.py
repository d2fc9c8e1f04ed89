"""The sized AggTrees (dpq_spark.core.quantiles.sized_tree): the noise law at the stated scale and
the exact privacy loss of the noisy counts (with power against a variant spending 2 epsilon),
post-processing only after the noise, accuracy on fixed seeds, argument validation, and
``auto``'s choice for many quantiles."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

import dpq_spark.core.quantiles.agg_tree as AT
from dpq_spark.core.quantiles.agg_tree import agg_tree
from dpq_spark.core.quantiles.batch import release_many
from dpq_spark.core.quantiles.choose import auto, choose_mechanism, plan_auto
from dpq_spark.core.quantiles.mechanisms import FLOAT_SAFE, GUARANTEES, MECHANISMS, get_base_mechanism
from dpq_spark.core.quantiles.sized_tree import SIZED_TREES, agg_tree_8x3, agg_tree_8x4, agg_tree_12x3
from dpq_spark.core.randomness.samplers import dlap_scale
from dpq_spark.core.randomness.source import resolve_rng

LO, HI = -100.0, 100.0
FUNCS = {"agg_tree_8x3": agg_tree_8x3, "agg_tree_12x3": agg_tree_12x3, "agg_tree_8x4": agg_tree_8x4}
RELATIONS = {"add_remove": 1, "swap": 2}  # relation -> per-level sensitivity s


def _node_counts(x, branching, height, lo=LO, hi=HI):
    """Exact counts of every level 1..height, computed level by level from the values (not from
    the leaves, as the code does)."""
    u = (np.clip(np.asarray(x, dtype=np.float64), lo, hi) - lo) / (hi - lo)
    out = []
    for level in range(1, height + 1):
        size = branching**level
        idx = np.clip(np.floor(u * size).astype(np.int64), 0, size - 1)
        out.append(np.bincount(idx, minlength=size))
    return out


def _dlap_pmf(scale, k):
    a = math.exp(-1.0 / float(scale))
    return (1 - a) / (1 + a) * a ** np.abs(k).astype(np.float64)


def _record_noise(monkeypatch):
    """Wrap agg_tree's sampler: every call's (scale, size, noise) is recorded, noise unchanged."""
    calls = []
    real = AT.node_noise

    def recording(source, scale, size):
        z = real(source, scale, size)
        calls.append((Fraction(scale), size, np.asarray(z)))
        return z

    monkeypatch.setattr(AT, "node_noise", recording)
    return calls


def _neighbours(x, relation, gen):
    """Neighbouring datasets: a row added (add/remove) or replaced (swap) at the bounds, outside
    them, on leaf edges and inside the bulk."""
    spots = [LO, HI, -1e9, 1e9, 0.0, 12.5, -12.5, 100 / 64, 3.3, -7.7]
    if relation == "add_remove":
        for v in spots:
            yield np.append(x, v)
        yield x[1:]
    else:
        for v in spots:
            y = x.copy()
            y[gen.integers(x.size)] = v
            yield y


def _worst_loss(x, y, branching, height, scale):
    """The exact privacy loss of the noisy count vector between x and y: for independent
    DLap(scale) noise, sup over outputs of |log P(out | x) - log P(out | y)| is
    ||counts(x) - counts(y)||_1 / scale (attained by outputs beyond both counts)."""
    cx, cy = _node_counts(x, branching, height), _node_counts(y, branching, height)
    l1 = sum(int(np.abs(a - b).sum()) for a, b in zip(cx, cy))
    return l1 / float(scale), l1


# --------------------------------------------------------------------------- registry
def test_registered_pure_float_safe_with_optional_bounds():
    for name, fn in FUNCS.items():
        assert GUARANTEES[name] == "pure" and FLOAT_SAFE[name] is True
        assert get_base_mechanism(name) is fn
        assert MECHANISMS[name].__wrapped__ is fn
    assert SIZED_TREES == {"agg_tree_8x3": (8, 3), "agg_tree_12x3": (12, 3), "agg_tree_8x4": (8, 4)}


@pytest.mark.parametrize("name", sorted(FUNCS))
@pytest.mark.parametrize("relation", sorted(RELATIONS))
def test_is_agg_tree_with_its_shape_draw_for_draw(name, relation):
    b, h = SIZED_TREES[name]
    x = np.random.default_rng(0).normal(0, 5, 3000)
    q = np.arange(1, 60) / 60
    got = FUNCS[name](x, q, epsilon=0.7, lower=LO, upper=HI, neighboring=relation,
                      rng=np.random.default_rng(1))
    want = agg_tree(x, q, epsilon=0.7, lower=LO, upper=HI, neighboring=relation,
                    rng=np.random.default_rng(1), branching=b, height=h)
    np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------- privacy
@pytest.mark.parametrize("name", sorted(FUNCS))
@pytest.mark.parametrize("relation", sorted(RELATIONS))
@pytest.mark.parametrize("eps", [0.3, 1.0, 4.0])
def test_noisy_counts_are_eps_dp_and_a_double_spend_is_caught(monkeypatch, name, relation, eps):
    """Every level's counts get DLap(b) with b = dlap_scale(h * s, eps); between neighbours the
    exact loss ||c - c'||_1 / b of the whole noisy vector is at most eps, and reaches it (the
    sensitivity h * s is attained). The same vector noised for 2 eps (b for 2 eps) loses 2 eps."""
    b, h = SIZED_TREES[name]
    s = RELATIONS[relation]
    calls = _record_noise(monkeypatch)
    gen = np.random.default_rng(2)
    x = gen.normal(0, 5, 400)
    FUNCS[name](x, [0.1, 0.5, 0.9], epsilon=eps, lower=LO, upper=HI, neighboring=relation,
                rng=np.random.default_rng(3))
    assert [size for _, size, _ in calls] == [b**level for level in range(1, h + 1)]
    scales = {scale for scale, _, _ in calls}
    assert scales == {dlap_scale(h * s, eps)}
    scale = scales.pop()
    double = dlap_scale(h * s, 2 * eps)
    worst = worst2 = 0.0
    for y in _neighbours(x, relation, gen):
        loss, l1 = _worst_loss(x, y, b, h, scale)
        assert l1 <= h * s
        worst = max(worst, loss)
        worst2 = max(worst2, _worst_loss(x, y, b, h, double)[0])
    assert worst <= eps * (1 + 1e-12)
    assert worst >= eps * (1 - 2e-6)        # tight: the family reaches the sensitivity
    assert worst2 > 1.9 * eps               # the check rejects a variant spending 2 eps


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_noise_has_the_discrete_laplace_law_and_a_wrong_scale_is_rejected(monkeypatch, name):
    """The noise added to the counts, pooled over releases, against the exact DLap(b) law with b
    for epsilon = 1 (add/remove): accepted at b, rejected at the scales of 2 eps, 1.3 eps and
    0.7 eps."""
    b, h = SIZED_TREES[name]
    calls = _record_noise(monkeypatch)
    x = np.random.default_rng(4).normal(0, 5, 500)
    source = resolve_rng(np.random.default_rng(5))
    releases = 30 if h == 3 else 5     # about 15,000 / 23,000 draws
    for _ in range(releases):
        FUNCS[name](x, [0.5], epsilon=1.0, lower=LO, upper=HI, rng=source)
    z = np.concatenate([noise for _, _, noise in calls]).astype(np.int64)

    def pvalue(scale):
        k = np.arange(-60, 61)
        expected = _dlap_pmf(scale, k) * z.size
        observed = np.bincount(np.clip(z, -60, 60) + 60, minlength=k.size)
        big = expected >= 5
        o = np.append(observed[big], observed[~big].sum())
        e = np.append(expected[big], expected[~big].sum())
        return stats.chisquare(o, e * o.sum() / e.sum()).pvalue

    assert pvalue(dlap_scale(h, 1.0)) > 1e-3
    for wrong in (2.0, 1.3, 0.7):
        assert pvalue(dlap_scale(h, wrong)) < 1e-6


@pytest.mark.parametrize("name", sorted(FUNCS))
@pytest.mark.parametrize("relation", sorted(RELATIONS))
def test_the_release_reads_the_data_only_through_the_noisy_counts(monkeypatch, name, relation):
    """Feed the mechanism, on x and on a neighbour, noise that gives both the same noisy counts:
    the releases are equal, so all that follows the noise is post-processing (under swap the
    public n is the same for both)."""
    b, h = SIZED_TREES[name]
    gen = np.random.default_rng(6)
    x = gen.normal(0, 5, 2000)
    y = np.append(x, 4.2) if relation == "add_remove" else np.where(np.arange(x.size) == 7, 4.2, x)
    target = [c + g for c, g in zip(_node_counts(x, b, h),
                                    (gen.integers(-9, 10, size=b**lv) for lv in range(1, h + 1)))]
    q = np.arange(1, 100) / 100

    def run(data):
        exact = _node_counts(data, b, h)
        level = iter(range(h))

        def forced(source, scale, size):
            i = next(level)
            return target[i] - exact[i]

        monkeypatch.setattr(AT, "node_noise", forced)
        return FUNCS[name](data, q, epsilon=1.0, lower=LO, upper=HI, neighboring=relation,
                           rng=np.random.default_rng(0))

    a, c = run(x), run(y)
    np.testing.assert_array_equal(a, c)
    # and the test can tell: different noisy counts give a different release
    target[h - 1][b ** h // 2] += 50
    assert not np.array_equal(run(x), a)


# --------------------------------------------------------------------------- accuracy
def _median_error(fn, n, eps, reps, m=99, **kw):
    """The median absolute error over ``reps`` data sets (seeds 0..reps-1, noise seeds
    100..) and m quantiles: the per-release mean has heavy tails (one unlucky node count moves
    many quantiles), so a mean over a dozen releases swings by a third from seed to seed."""
    q = np.arange(1, m + 1) / (m + 1)
    errs = []
    for r in range(reps):
        x = np.random.default_rng(r).normal(0, 5, n)
        est = fn(x, q, epsilon=eps, lower=LO, upper=HI, rng=np.random.default_rng(100 + r), **kw)
        errs.append(np.abs(est - np.quantile(x, q, method="inverted_cdf")))
    return float(np.median(errs))


def test_accuracy_at_99_quantiles_beats_the_default_tree():
    # n = 1e4, epsilon = 1 (auto's 12**3 band), 40 releases: median error about 0.020 for the
    # 16**4 tree, 0.012-0.014 for the 12**3 tree, 0.014 for the 8**4 tree (ratios 0.59-0.63 and
    # 0.63-0.69 on three sets of 40 seeds)
    default = _median_error(agg_tree, 10_000, 1.0, 40)
    for fn, most, ratio in ((agg_tree_12x3, 0.016, 0.75), (agg_tree_8x4, 0.017, 0.8)):
        sized = _median_error(fn, 10_000, 1.0, 40)
        assert sized < most and sized < ratio * default
    # n = 1e3, epsilon = 1 (the 8**3 band): ratio 0.45-0.51
    sized = _median_error(agg_tree_8x3, 1000, 1.0, 40)
    default = _median_error(agg_tree, 1000, 1.0, 40)
    assert sized < 0.6 * default


def test_ordered_grid_points_in_bounds():
    x = np.random.default_rng(7).normal(0, 5, 500)
    for fn in FUNCS.values():
        out = fn(x, np.arange(1, 50) / 50, epsilon=1.0, lower=-10, upper=10, granularity=0.5,
                 rng=np.random.default_rng(8))
        assert np.all(np.diff(out) >= 0) and out.min() >= -10 and out.max() <= 10
        np.testing.assert_array_equal(out, np.round(out * 2) / 2)


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("name", sorted(FUNCS))
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(epsilon=-1.0), ValueError, r"`epsilon` must be finite and > 0, got -1\.0"),
    (dict(epsilon=float("inf")), ValueError, r"`epsilon` must be finite and > 0"),
    (dict(lower=5.0, upper=5.0), ValueError, r"`lower`"),
    (dict(quantiles=[0.5, 0.2]), ValueError, r"`quantiles`"),
    (dict(quantiles=[0.0, 0.5]), ValueError, r"`quantiles`"),
    (dict(neighboring="bounded"), ValueError, r"`neighboring`"),
    (dict(granularity=0.0), ValueError, r"`granularity`"),
    (dict(branching=16), TypeError, r"branching"),
    (dict(height=2), TypeError, r"height"),
])
def test_validation(name, kwargs, error, match):
    args = dict(quantiles=[0.25, 0.75], epsilon=1.0, lower=-1.0, upper=1.0)
    args.update(kwargs)
    q = args.pop("quantiles")
    with pytest.raises(error, match=match):
        FUNCS[name]([0.1, 0.2], q, **args)


def test_nan_is_refused_without_echoing_values():
    with pytest.raises(ValueError, match=r"`values`") as info:
        agg_tree_8x4([0.123456, float("nan")], [0.5], epsilon=1.0, lower=-1, upper=1)
    assert "0.123456" not in str(info.value)


# --------------------------------------------------------------------------- auto
def test_auto_picks_the_sized_trees_for_many_quantiles():
    assert choose_mechanism(99, n=10_000, epsilon=1.0) == "agg_tree_12x3"
    assert choose_mechanism(99, n=30_000, epsilon=1.0) == "agg_tree_8x4"
    assert choose_mechanism(50, n=1000, epsilon=1.0) == "agg_tree_8x3"
    assert choose_mechanism(199, n=100, epsilon=1.0) == "agg_tree_8x3"
    # band edges: 10**3.25, 12,000 and 10**4.75; below 25 the histogram; beyond, the rule before
    assert choose_mechanism(99, n=10**3.25 - 1, epsilon=1.0) == "agg_tree_8x3"
    assert choose_mechanism(99, n=10**3.25, epsilon=1.0) == "agg_tree_12x3"
    assert choose_mechanism(99, n=11_999, epsilon=1.0) == "agg_tree_12x3"
    assert choose_mechanism(99, n=12_000, epsilon=1.0) == "agg_tree_8x4"
    assert choose_mechanism(99, n=10**4.75, epsilon=1.0) == "agg_tree"
    assert choose_mechanism(99, n=1e7, epsilon=1.0) == "approx_quantiles"
    assert choose_mechanism(99, n=20, epsilon=1.0) == "histogram"
    # fewer quantiles and declared (typed) grids keep their rules
    assert choose_mechanism(49, n=10_000, epsilon=1.0) == "approx_quantiles"
    assert choose_mechanism(53, n=3000, epsilon=1.0) == "agg_tree_12x3"
    assert choose_mechanism(53, n=10_000, epsilon=1.0) == "approx_quantiles"  # a tie: 10**3.5
    assert choose_mechanism(99, n=10_000, epsilon=1.0, grid_size=101, granularity=1.0) == "agg_tree"


@pytest.mark.parametrize("relation", sorted(RELATIONS))
def test_auto_runs_the_chosen_tree_draw_for_draw(relation):
    """auto = plan_auto + the base mechanism at the epsilon left (the contract the Spark layer
    relies on), here with the noisy count under add/remove."""
    x = np.random.default_rng(9).normal(0, 5, 8000)
    q = np.arange(1, 100) / 100
    out = auto(x, q, epsilon=1.0, lower=LO, upper=HI, neighboring=relation,
               rng=np.random.default_rng(10))
    assert out.mechanism == "agg_tree_12x3"
    source = resolve_rng(np.random.default_rng(10))
    name, rest, _ = plan_auto(q.size, x.size, epsilon=1.0, neighboring=relation, source=source)
    again = get_base_mechanism(name)(x, q, epsilon=rest, lower=LO, upper=HI, neighboring=relation,
                                     rng=source)
    assert name == out.mechanism
    np.testing.assert_array_equal(np.asarray(out), again)


# --------------------------------------------------------------------------- batched (Spark) path
@pytest.mark.parametrize("name", sorted(FUNCS))
@pytest.mark.parametrize("relation", sorted(RELATIONS))
def test_batch_without_noise_is_the_core_tree(name, relation):
    """At epsilon = 1e9 the noise is 0 (but with probability ~2**-60), so release_many must give
    the core's numbers exactly: the shape the name says, not the batch's default 16**4 tree."""
    gen = np.random.default_rng(21)
    groups = [(gen.normal(0, 5, k), gen.integers(0, 3, k)) for k in (0, 1, 5, 300, 2000)]
    q = np.arange(1, 100) / 100
    got = release_many(groups, q, epsilon=1e9, lower=LO, upper=HI, neighboring=relation,
                       mechanism=name, rng=np.random.default_rng(1))
    assert got.mechanisms == [name] * len(groups)
    for g, (x, c) in enumerate(groups):
        want = FUNCS[name](x, q, epsilon=1e9, lower=LO, upper=HI, neighboring=relation, counts=c,
                           rng=np.random.default_rng(2))
        np.testing.assert_array_equal(got.values[g], want)
    deeper = agg_tree(groups[-1][0], q, epsilon=1e9, lower=LO, upper=HI, counts=groups[-1][1],
                      neighboring=relation, rng=np.random.default_rng(2))
    assert not np.array_equal(got.values[-1], deeper)  # the shapes are told apart


def test_batch_noise_has_the_cores_law_and_a_double_spend_is_caught():
    """One group's median, released 600 times in one batch at epsilon = 0.5, against 600 core
    releases: a two-sample KS test accepts the same law and rejects the core at 2 epsilon."""
    x = np.random.default_rng(22).normal(0, 5, 400)
    groups = [(x, None)] * 600
    batch = release_many(groups, [0.5], epsilon=0.5, lower=LO, upper=HI, mechanism="agg_tree_8x3",
                         rng=np.random.default_rng(3)).values[:, 0]
    core = [agg_tree_8x3(x, [0.5], epsilon=e, lower=LO, upper=HI, rng=np.random.default_rng(s))[0]
            for e, s in [(0.5, k) for k in range(600)] + [(1.0, k) for k in range(600, 1200)]]
    same, double = np.array(core[:600]), np.array(core[600:])
    assert stats.ks_2samp(batch, same).pvalue > 1e-3
    assert stats.ks_2samp(batch, double).pvalue < 1e-3


def test_batch_auto_runs_the_sized_trees():
    """auto in the batch (the Spark path) picks and runs the sized trees for many quantiles."""
    gen = np.random.default_rng(23)
    groups = [(gen.normal(0, 5, k), None) for k in (1000, 10_000, 30_000)]
    q = np.arange(1, 100) / 100
    out = release_many(groups, q, epsilon=1.0, lower=LO, upper=HI, neighboring="swap",
                       mechanism="auto", rng=np.random.default_rng(4))
    assert out.mechanisms == ["agg_tree_8x3", "agg_tree_12x3", "agg_tree_8x4"]
    for g, (x, _) in enumerate(groups):
        assert np.abs(out.values[g] - np.quantile(x, q)).mean() < 0.5
