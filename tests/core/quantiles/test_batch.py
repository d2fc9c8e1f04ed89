"""release_many: many groups in one call, each with its own mechanism's distribution.

Distribution tests compare draws with the exact law where it can be enumerated (JointExp on a few
points, the discrete Laplace noise, auto's choice) and with the per-group core mechanism
otherwise, by chi-square at fixed seeds; each is shown to reject a deliberately wrong variant at
the same sample size.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest
from scipy import stats
from scipy.stats import chi2_contingency, chisquare, kstest

from dpq_spark.core import agg_tree, approx_quantiles, histogram, ind_exp, joint_exp
from dpq_spark.core.randomness.dlap_table import DLapTable, _floor_scaled
from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.core.randomness.samplers import dlap_scale
from dpq_spark.core.quantiles.agg_tree import _descend, honaker_aggregate
from dpq_spark.core.quantiles.batch import BATCH_MECHANISMS, FlatGroups, _post_process, release_many
from dpq_spark.core.quantiles.choose import choose_mechanism
from dpq_spark.core.randomness.grid import Grid
from dpq_spark.core.quantiles.joint_exp import _sample_indices as joint_sample
from dpq_spark.core.accounting.neighboring import NeighboringRelation, joint_exp_sensitivity

LOWER, UPPER = 0.0, 10.0
GRID = Grid(LOWER, UPPER)
Q3 = np.array([0.25, 0.5, 0.75])
ALPHA = 1e-3  # accept above, reject below (p-values of wrong variants are far smaller)

# Tiny groups (values, counts): empty, one row, two rows, three rows with a tie.
GROUPS = {
    "empty": (np.zeros(0), np.zeros(0, dtype=np.int64)),
    "one": (np.array([4.0]), np.array([1])),
    "two": (np.array([2.0, 7.0]), np.array([1, 1])),
    "tie": (np.array([2.0, 7.0]), np.array([2, 1])),
    "three": (np.array([2.0, 4.0, 7.0]), np.array([1, 1, 1])),
}


def _pooled_chi2(observed: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square p-value of counts against probabilities, pooling cells expected below 5."""
    observed = np.asarray(observed, dtype=float)
    expected = probs * observed.sum()
    small = expected < 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


# ------------------------------------------------------------------------------------------
# Regions of the grid for a tiny dataset, and the exact JointExp law over region sequences.


def _regions(values, counts):
    """Regions 0..2r of the grid: the gap before the first point, each point, the gap after it.

    Returns (distinct grid indices, widths, mid-ranks); written independently of the core.
    """
    k = GRID.snap(values)
    d = sorted(set(int(v) for v, c in zip(k, counts) if c > 0))
    mult = [int(sum(c for v, c in zip(k, counts) if v == p)) for p in d]
    edges = [-1] + d + [GRID.size]
    widths, ranks, below = [], [], 0
    for i in range(len(d) + 1):
        widths.append(edges[i + 1] - edges[i] - 1)  # gap before point i (or after the last)
        ranks.append(float(below))
        if i < len(d):
            widths.append(1)
            ranks.append(below + (mult[i] + 1) / 2.0)
            below += mult[i]
    return np.array(d, dtype=np.int64), widths, ranks, below


def _region_codes(outputs, distinct):
    """Region index of every output value (shape (D, m) -> (D, m))."""
    k = GRID.snap(outputs)
    i = np.searchsorted(distinct, k, side="left")
    on_point = (i < distinct.size) & (distinct[np.minimum(i, max(distinct.size - 1, 0))] == k) \
        if distinct.size else np.zeros(k.shape, dtype=bool)
    return 2 * i + on_point


def _exact_law(values, counts, quantiles, epsilon, relation, factorial=True):
    """Exact probabilities of every nondecreasing region sequence (dict seq -> prob).

    This is JointExp on the grid itself. The mechanisms split each default-grid point into 2**8
    fine points (``Grid.tie_bits``); that moves mass only inside the data's own grid points,
    regions of width 1 of 2**32 here, so the law of the regions is the same to about 1e-9.

    ``factorial=False`` is the wrong variant w**k instead of C(w + k - 1, k) ~ w**k / k!.
    """
    _, widths, ranks, n = _regions(values, counts)
    q = np.asarray(quantiles, dtype=float)
    c = epsilon / (2.0 * joint_exp_sensitivity(q, NeighboringRelation.parse(relation)))
    targets = np.diff(np.concatenate(([0.0], q, [1.0]))) * n
    live = [r for r, w in enumerate(widths) if w > 0]
    logw = {}
    for seq in itertools.combinations_with_replacement(live, q.size):
        path = [0.0] + [ranks[r] for r in seq] + [float(n)]
        u = -sum(abs(path[j + 1] - path[j] - targets[j]) for j in range(q.size + 1))
        mult = 0.0
        for r, run in itertools.groupby(seq):
            k = len(list(run))
            mult += math.log(math.comb(widths[r] + k - 1, k)) if factorial else k * math.log(widths[r])
        logw[seq] = c * u + mult
    top = max(logw.values())
    total = sum(math.exp(v - top) for v in logw.values())
    return {s: math.exp(v - top) / total for s, v in logw.items()}


def _law_pvalue(outputs, values, counts, law) -> float:
    distinct, *_ = _regions(values, counts)
    codes = _region_codes(outputs, distinct)
    seqs = list(law)
    index = {s: i for i, s in enumerate(seqs)}
    observed = np.zeros(len(seqs))
    for row in map(tuple, codes.tolist()):
        observed[index[row]] += 1  # a KeyError would be an impossible sequence: a failure too
    return _pooled_chi2(observed, np.array([law[s] for s in seqs]))


def _batch(group, draws, *, mechanism, epsilon, relation="add_remove", quantiles=Q3, seed=1, **kw):
    out = release_many([group] * draws, quantiles, epsilon=epsilon, lower=LOWER, upper=UPPER,
                       neighboring=relation, mechanism=mechanism, rng=np.random.default_rng(seed), **kw)
    return out.values, out.mechanisms


# ------------------------------------------------------------------------------------------
# JointExp by enumeration


@pytest.mark.parametrize("name", ["one", "two", "tie", "three"])
@pytest.mark.parametrize("relation", ["add_remove", "swap"])
def test_joint_exp_matches_the_exact_law_and_the_core_sampler(name, relation):
    values, counts = GROUPS[name]
    eps = 4.0
    law = _exact_law(values, counts, Q3, eps, relation)
    batch, names = _batch((values, counts), 3000, mechanism="joint_exp", epsilon=eps, relation=relation)
    assert set(names) == {"joint_exp"}
    assert _law_pvalue(batch, values, counts, law) > ALPHA
    # the core's own sampler on the same group agrees with the same law (the law is the core's)
    c = eps / (2.0 * joint_exp_sensitivity(Q3, NeighboringRelation.parse(relation)))
    core_idx = joint_sample(GRID.snap(values), counts, Q3, c, GRID.size, resolve_rng(np.random.default_rng(2)), 3000)
    assert _law_pvalue(GRID.value(core_idx), values, counts, law) > ALPHA


def test_joint_exp_law_test_has_power():
    """The same test, same sample size, rejects epsilon x1.3 and the law without 1/k!."""
    values, counts = GROUPS["three"]  # x1.3 moves this law by 0.09 in total variation
    law = _exact_law(values, counts, Q3, 4.0, "add_remove")
    wrong_eps, _ = _batch((values, counts), 3000, mechanism="joint_exp", epsilon=4.0 * 1.3)
    assert _law_pvalue(wrong_eps, values, counts, law) < ALPHA
    # draws from the law without the 1/k! factor of runs (sampled here from its exact pmf)
    values, counts = GROUPS["one"]
    right = _exact_law(values, counts, Q3, 4.0, "add_remove")
    wrong = _exact_law(values, counts, Q3, 4.0, "add_remove", factorial=False)
    seqs = list(right)
    picks = np.random.default_rng(3).choice(len(seqs), size=3000, p=[wrong[s] for s in seqs])
    distinct, *_ = _regions(values, counts)
    edges = [0, int(distinct[0]), int(distinct[0]) + 1]  # a grid point inside each region
    outputs = GRID.value(np.array([[edges[r] for r in seqs[p]] for p in picks]))
    assert _law_pvalue(outputs, values, counts, right) < ALPHA


def test_joint_exp_empty_group_is_a_uniform_multiset_of_grid_points():
    values, counts = GROUPS["empty"]
    out, _ = _batch((values, counts), 4000, mechanism="joint_exp", epsilon=1.0)
    assert np.all(np.diff(out, axis=1) >= 0)
    # the smallest of 3 uniform points: P(min <= x) = 1 - (1 - x)**3 on [0, 1]
    assert kstest(out[:, 0] / UPPER, lambda x: 1 - (1 - x) ** 3).pvalue > ALPHA
    # ... and the test sees a wrong law (the median of 3 instead of the minimum)
    assert kstest(out[:, 1] / UPPER, lambda x: 1 - (1 - x) ** 3).pvalue < ALPHA


@pytest.mark.parametrize("split_entries", [None, 500])
def test_joint_exp_interleaved_groups_each_keep_their_own_law(monkeypatch, split_entries):
    """Groups with different numbers of cells, interleaved with one beyond enumeration, in one
    call: each enumerated group's draws follow its own exact law (a draw given to the wrong
    group, or cells mixed up between rows, would fail), and the large group runs the core. Also
    with the tie split done 500 entries at a time (many chunks of groups)."""
    from dpq_spark.core.quantiles import batch

    if split_entries is not None:
        monkeypatch.setattr(batch, "_SPLIT_ENTRIES", split_entries)
    names = ["one", "two", "tie", "three", "empty"]
    big = (np.linspace(1.0, 9.0, 40), None)
    batch = [GROUPS[k] for k in names] * 4000 + [big] * 5
    out = release_many(batch, Q3, epsilon=4.0, lower=LOWER, upper=UPPER, mechanism="joint_exp",
                       rng=np.random.default_rng(47)).values
    for i, name in enumerate(names[:4]):
        values, counts = GROUPS[name]
        law = _exact_law(values, counts, Q3, 4.0, "add_remove")
        assert _law_pvalue(out[i:len(names) * 4000:len(names)], values, counts, law) > ALPHA
    # power of the same check: the draws of "two" judged by the law of "tie"
    values, counts = GROUPS["tie"]
    law = _exact_law(values, counts, Q3, 4.0, "add_remove")
    assert _law_pvalue(out[1:len(names) * 4000:len(names)], values, counts, law) < ALPHA
    tail = out[-5:]
    assert np.all(np.diff(tail, axis=1) >= 0) and np.all((tail >= LOWER) & (tail <= UPPER))


def test_joint_exp_nine_deciles_on_five_points_uses_the_core_path():
    """Above the enumeration limit the core's sampler runs (same law, checked on the outputs)."""
    values = np.array([1.0, 2.0, 3.0, 6.0, 8.0])
    out, names = _batch((values, None), 30, mechanism="joint_exp", epsilon=1.0,
                        quantiles=np.arange(1, 10) / 10)
    assert out.shape == (30, 9) and set(names) == {"joint_exp"}
    assert np.all(np.diff(out, axis=1) >= 0) and np.all((out >= LOWER) & (out <= UPPER))


# ------------------------------------------------------------------------------------------
# IndExp and ApproxQuantiles against the per-group core


def _core_draws(fn, group, draws, epsilon, relation, seed):
    values, counts = group
    rng = np.random.default_rng(seed)
    return np.array([fn(values, Q3, epsilon=epsilon, lower=LOWER, upper=UPPER, neighboring=relation,
                        counts=counts, rng=rng) for _ in range(draws)])


def _two_sample_pvalue(a, b, values, counts) -> float:
    """Chi-square homogeneity of region sequences of two samples (pooled small cells)."""
    distinct, *_ = _regions(values, counts)
    ca = [tuple(r) for r in _region_codes(a, distinct).tolist()]
    cb = [tuple(r) for r in _region_codes(b, distinct).tolist()]
    keys = sorted(set(ca) | set(cb))
    ta = np.array([ca.count(k) for k in keys], dtype=float)
    tb = np.array([cb.count(k) for k in keys], dtype=float)
    small = (ta + tb) < 10
    ta = np.append(ta[~small], ta[small].sum())
    tb = np.append(tb[~small], tb[small].sum())
    keep = (ta + tb) > 0
    return chi2_contingency(np.vstack([ta[keep], tb[keep]]))[1]


@pytest.mark.parametrize("mechanism, fn", [("ind_exp", ind_exp), ("approx_quantiles", approx_quantiles)])
@pytest.mark.parametrize("name, relation", [("empty", "add_remove"), ("one", "swap"), ("two", "swap"),
                                            ("tie", "add_remove"), ("three", "swap")])
def test_single_quantile_mechanisms_match_the_core(mechanism, fn, name, relation):
    group = GROUPS[name]
    batch, names = _batch(group, 2500, mechanism=mechanism, epsilon=4.0, relation=relation)
    assert set(names) == {mechanism}
    core = _core_draws(fn, group, 2500, 4.0, relation, seed=5)
    assert _two_sample_pvalue(batch, core, *group) > ALPHA


@pytest.mark.parametrize("mechanism, fn", [("approx_quantiles", approx_quantiles), ("ind_exp", ind_exp)])
def test_small_groups_drawn_together_follow_the_core_at_nine_deciles(mechanism, fn):
    """Small ApproxQuantiles and IndExp groups draw together (ApproxQuantiles node by node of its
    recursion, four levels at nine deciles; IndExp quantile by quantile): with ties, a zero
    count, values on and beyond the bounds (and infinite), interleaved with another group and
    an empty one, each group's draws follow the core's law; the same check rejects one group's
    draws judged against the other's."""
    odd = (np.array([0.0, 2.5, 2.5, 10.0, 11.0, -np.inf]), np.array([1, 2, 0, 1, 1, 1]))
    groups = [odd, GROUPS["three"], GROUPS["empty"]]
    deciles = np.arange(1, 10) / 10
    out = release_many(groups * 1500, deciles, epsilon=4.0, lower=LOWER, upper=UPPER,
                       mechanism=mechanism, rng=np.random.default_rng(53)).values
    cores = []
    for i, (values, counts) in enumerate(groups[:2]):
        rng = np.random.default_rng(60 + i)
        core = np.array([fn(values, deciles, epsilon=4.0, lower=LOWER, upper=UPPER,
                            counts=counts, rng=rng) for _ in range(1500)])
        cores.append(core)
        assert _two_sample_pvalue(out[i::3], core, values, counts) > ALPHA
    # power, on each quantile's region alone (the joint sequences spread over too many cells
    # to tell these two laws apart reliably), Bonferroni over the nine
    wrong = min(_two_sample_pvalue(out[0::3][:, [j]], cores[1][:, [j]], *GROUPS["three"])
                for j in range(deciles.size))
    assert wrong * deciles.size < ALPHA
    empty = out[2::3]
    assert np.all(np.diff(empty, axis=1) >= 0) and np.all((empty >= LOWER) & (empty <= UPPER))


def _ks_min_pvalue(a, b) -> float:
    """Two-sample KS on each output column, Bonferroni over the columns."""
    return min(stats.ks_2samp(a[:, j], b[:, j]).pvalue for j in range(a.shape[1])) * a.shape[1]


@pytest.mark.parametrize("mechanism, fn", [("ind_exp", ind_exp), ("approx_quantiles", approx_quantiles)])
def test_larger_groups_drawn_in_blocks_follow_the_core(mechanism, fn):
    """Groups of 40-300 rows (blocks of similar sizes, padded to the widest) released together
    in one call: a 150-row group's draws, interleaved with groups of other sizes, follow the
    core's law, and the core at 2 epsilon is rejected."""
    gen = np.random.default_rng(71)
    target = (np.round(gen.normal(5, 2, 150), 2), gen.integers(1, 3, 150))
    others = [(gen.uniform(-1, 11, k), None) for k in (40, 90, 300)]
    draws = 1200
    out = release_many([target, *others] * draws, Q3, epsilon=1.0, lower=LOWER, upper=UPPER,
                       mechanism=mechanism, rng=np.random.default_rng(72)).values[0::4]
    core = np.array([fn(target[0], Q3, epsilon=e, lower=LOWER, upper=UPPER, counts=target[1],
                        rng=np.random.default_rng([73, i])) for e in (1.0, 2.0) for i in range(draws)])
    assert _ks_min_pvalue(out, core[:draws]) > ALPHA
    assert _ks_min_pvalue(out, core[draws:]) < ALPHA


@pytest.mark.parametrize("mechanism, fn", [("ind_exp", ind_exp), ("approx_quantiles", approx_quantiles)])
def test_single_quantile_comparison_has_power(mechanism, fn):
    group = GROUPS["three"]
    batch, _ = _batch(group, 2500, mechanism=mechanism, epsilon=4.0 * 1.3)
    core = _core_draws(fn, group, 2500, 4.0, "add_remove", seed=5)
    assert _two_sample_pvalue(batch, core, *group) < ALPHA


# ------------------------------------------------------------------------------------------
# AggTree


def _dlap_pmf(scale, support):
    q = math.exp(-1.0 / float(scale))
    return (1 - q) / (1 + q) * q ** np.abs(support)


@pytest.mark.parametrize("sensitivity, epsilon", [(4, 0.95), (8, 1.0), (1, 0.05)])
def test_dlap_table_matches_the_exact_pmf(sensitivity, epsilon):
    scale = dlap_scale(sensitivity, epsilon)
    draws = DLapTable(scale).sample(resolve_rng(np.random.default_rng(11)), 200_000)
    support = np.arange(-200, 201)
    observed = np.array([np.count_nonzero(draws == y) for y in support])
    assert observed.sum() > 0.999 * draws.size
    assert _pooled_chi2(np.append(observed, draws.size - observed.sum()),
                        np.append(_dlap_pmf(scale, support), 1 - _dlap_pmf(scale, support).sum())) > ALPHA


def test_dlap_table_test_has_power():
    scale = dlap_scale(4, 0.95)
    wrong = DLapTable(dlap_scale(4, 0.95 * 1.3)).sample(resolve_rng(np.random.default_rng(11)), 200_000)
    support = np.arange(-200, 201)
    observed = np.array([np.count_nonzero(wrong == y) for y in support])
    p = _dlap_pmf(scale, support)
    assert _pooled_chi2(np.append(observed, wrong.size - observed.sum()), np.append(p, 1 - p.sum())) < ALPHA


def test_dlap_table_thresholds_are_exact_floors():
    """T_k = floor(2**63 r_k) checked against exact rational bounds on exp (Taylor series)."""
    from fractions import Fraction

    scale = dlap_scale(4, 0.95)
    table = DLapTable(scale)

    def exp_bounds(x: Fraction):  # e**-x for 0 < x < 40: two consecutive partial sums of the
        terms = [Fraction(1)]  # alternating series bracket it once its terms decrease
        for i in range(1, 300):
            terms.append(terms[-1] * x / i)
        parts = [sum(t * (-1) ** i for i, t in enumerate(terms[:k])) for k in (299, 300)]
        return min(parts), max(parts)

    one = 1 / scale
    lo_q, hi_q = exp_bounds(one)
    for k in (1, 2, 5, table.depth):
        lo_k, hi_k = exp_bounds(one * k)
        lo = 2 * lo_k / (1 + hi_q) * 2**63
        hi = 2 * hi_k / (1 + lo_q) * 2**63
        assert math.floor(lo) == math.floor(hi) == int(table.thresholds[k - 1])
    # the further bits that settle a tie (2**127, 2**191: beyond decimal's default 28 digits)
    for k in (1, 3):
        lo_k, hi_k = exp_bounds(one * k)
        for bits in (127, 191):
            lo = 2 * lo_k / (1 + hi_q) * 2**bits
            hi = 2 * hi_k / (1 + lo_q) * 2**bits
            assert math.floor(lo) == math.floor(hi) == _floor_scaled(table.scale, k, bits)


def test_dlap_table_interval_thresholds_are_the_decimal_floors(monkeypatch):
    """The interval-arithmetic build gives every T_k of the decimal rule: all of them at small
    scales, a sample (the first, the last, 300 at random) at AggTree's small-epsilon scales. A
    straddled interval falls back to the decimal rule (forced here by a shift of one bit)."""
    import random
    from fractions import Fraction

    from dpq_spark.core.randomness import dlap_table as D

    for scale in (Fraction(3, 7), Fraction(1), dlap_scale(4, 0.95), Fraction(250)):
        table = D.DLapTable(scale)
        expected = []
        for k in range(1, table.depth + 2):
            t = _floor_scaled(table.scale, k, 63)
            if t < D._TAIL_FLOOR or (expected and t >= expected[-1]):
                break
            expected.append(t)
        assert table.thresholds.tolist() == (expected or [_floor_scaled(table.scale, 1, 63)])
    for scale in (dlap_scale(8, 0.01), dlap_scale(1, 0.05 * 0.001)):  # 800 and 20,000
        got = D._thresholds(scale)
        ks = [1, len(got)] + random.Random(0).sample(range(1, len(got) + 1), 300)
        assert all(got[k - 1] == _floor_scaled(scale, k, 63) for k in ks)
        assert _floor_scaled(scale, len(got) + 1, 63) >= got[-1] or \
            _floor_scaled(scale, len(got) + 1, 63) < D._TAIL_FLOOR  # it stopped where it should
    exact = D._thresholds(Fraction(5))
    wide = D._thresholds(Fraction(250))
    for bits in (20, 24, 28):  # narrow words: the bounds must still enclose every r_k
        monkeypatch.setattr(D, "_WORK_BITS", bits)
        assert D._thresholds(Fraction(250)) == wide
    monkeypatch.undo()
    calls = []
    real = D._floor_scaled
    monkeypatch.setattr(D, "_floor_scaled", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(D, "_WORK_BITS", 8)  # intervals too wide: T_k settled by decimal
    assert D._thresholds(Fraction(5)) == exact
    assert len(calls) > 0


def test_dlap_table_prefix_table_agrees_with_the_full_comparison():
    """Every prefix marked sure has one magnitude over its whole range of 63-bit U, the one the
    table gives; the full comparison (used for open prefixes) is a sampler of |Y| by itself."""
    from dpq_spark.core.randomness.dlap_table import _PREFIX_BITS, _REST_BITS

    table = DLapTable(dlap_scale(4, 0.95))
    source = resolve_rng(np.random.default_rng(31))
    p = np.arange(1 << _PREFIX_BITS, dtype=np.int64)
    sure = ~table._prefix_open
    assert 0.99 < sure.mean() < 1.0
    low, high = p << _REST_BITS, (p << _REST_BITS) + (1 << _REST_BITS) - 1
    assert np.array_equal(table._magnitudes(source, low[sure]), table._prefix_mag[sure])
    assert np.array_equal(table._magnitudes(source, high[sure]), table._prefix_mag[sure])
    u = (source.words(200_000) >> np.uint64(1)).astype(np.int64)
    mags = table._magnitudes(source, u)
    support = np.arange(0, 200)
    pmf = _dlap_pmf(table.scale, support) * np.where(support > 0, 2.0, 1.0)
    observed = np.bincount(mags, minlength=support.size)[: support.size]
    assert _pooled_chi2(observed, pmf / pmf.sum()) > ALPHA


def test_dlap_table_settles_ties_with_the_next_bits():
    """Given U == T_k, 'u < r_k' must come out with probability frac(2**63 r_k)."""
    scale = dlap_scale(4, 0.95)
    table = DLapTable(scale)
    source = resolve_rng(np.random.default_rng(13))
    for k in (1, 3):
        frac = (_floor_scaled(table.scale, k, 63 + 53) % 2**53) / 2**53
        hits = sum(table._below_threshold(source, k) for _ in range(20_000))
        assert abs(hits / 20_000 - frac) < 4.5 * math.sqrt(frac * (1 - frac) / 20_000)


@pytest.mark.parametrize("swap", [False, True])
def test_agg_tree_post_processing_equals_the_core_per_group(swap):
    """Batched Honaker aggregation and descent give the core's numbers bit for bit, also when
    noise makes counts negative (unsorted cumulative sums)."""
    rng = np.random.default_rng(17)
    b, h, G = 4, 3, 40
    noisy = [None] + [rng.integers(-6, 7, size=(G, b**level)).astype(float) for level in range(1, h + 1)]
    root = rng.integers(0, 5, size=G).astype(float) if swap else None
    scale = dlap_scale(h * (2 if swap else 1), 1.0)
    got = _post_process(noisy, b, scale, root, Q3, LOWER, UPPER)
    qq = math.exp(-1.0 / float(scale))
    variance = 2.0 * qq / (1.0 - qq) ** 2
    for g in range(G):
        tree = honaker_aggregate([None] + [noisy[level][g] for level in range(1, h + 1)], b, variance,
                                 None if root is None else float(root[g]))
        want = np.sort(np.clip([_descend(tree, b, LOWER, UPPER, float(v)) for v in Q3], LOWER, UPPER))
        assert np.array_equal(got[g], want)


AGG_KW = dict(branching=2, height=3)  # a small tree: the core takes ~3 ms a call even so


@functools.lru_cache(maxsize=None)
def _core_agg_tree(name, relation, draws=1500):
    values, counts = GROUPS[name]
    rng = np.random.default_rng(19)
    return np.array([agg_tree(values, Q3, epsilon=2.0, lower=LOWER, upper=UPPER, neighboring=relation,
                              counts=counts, rng=rng, **AGG_KW) for _ in range(draws)])


def _binned_pvalues(a, b) -> list[float]:
    """Per output: chi-square homogeneity of the two samples in 8 equal bins of [lower, upper]."""
    out = []
    for j in range(a.shape[1]):
        ta = np.histogram(a[:, j], bins=8, range=(LOWER, UPPER))[0]
        tb = np.histogram(b[:, j], bins=8, range=(LOWER, UPPER))[0]
        keep = (ta + tb) > 0
        out.append(chi2_contingency(np.vstack([ta[keep], tb[keep]]))[1])
    return out


@pytest.mark.parametrize("name, relation", [("empty", "add_remove"), ("tie", "swap"), ("three", "add_remove")])
def test_agg_tree_matches_the_core(name, relation):
    batch, names = _batch(GROUPS[name], 1500, mechanism="agg_tree", epsilon=2.0, relation=relation, **AGG_KW)
    assert set(names) == {"agg_tree"}
    assert min(_binned_pvalues(batch, _core_agg_tree(name, relation))) > ALPHA / 3


def test_agg_tree_comparison_has_power():
    batch, _ = _batch(GROUPS["three"], 1500, mechanism="agg_tree", epsilon=2.0 * 1.3, **AGG_KW)
    assert min(_binned_pvalues(batch, _core_agg_tree("three", "add_remove"))) < ALPHA / 3


@functools.lru_cache(maxsize=None)
def _core_histogram(name, relation, epsilon=2.0, draws=1500):
    values, counts = GROUPS[name]
    rng = np.random.default_rng(29)
    return np.array([histogram(values, Q3, epsilon=epsilon, lower=LOWER, upper=UPPER,
                               neighboring=relation, counts=counts, rng=rng) for _ in range(draws)])


@pytest.mark.parametrize("name, relation", [("tie", "swap"), ("three", "add_remove")])
def test_histogram_matches_the_core(name, relation):
    batch, names = _batch(GROUPS[name], 1500, mechanism="histogram", epsilon=2.0, relation=relation)
    assert set(names) == {"histogram"}
    assert min(_binned_pvalues(batch, _core_histogram(name, relation))) > ALPHA / 3


def test_histogram_comparison_has_power():
    # the batch at 1.3 epsilon, or cut into AggTree's default 16 x 4 leaves instead of 16 bins
    batch, _ = _batch(GROUPS["three"], 1500, mechanism="histogram", epsilon=2.0 * 1.3)
    assert min(_binned_pvalues(batch, _core_histogram("three", "add_remove"))) < ALPHA / 3
    deep, _ = _batch(GROUPS["three"], 1500, mechanism="agg_tree", epsilon=2.0)
    assert min(_binned_pvalues(deep, _core_histogram("three", "add_remove"))) < ALPHA / 3


# ------------------------------------------------------------------------------------------
# auto


def _choice_law(n, m, epsilon, share=0.05):
    """Exact probability of each mechanism auto picks for a group of n rows (add/remove)."""
    scale = dlap_scale(1, share * epsilon)
    support = np.arange(-2000, 2001)
    pmf = _dlap_pmf(scale, support)
    law: dict[str, float] = {}
    for y, p in zip(support, pmf):
        name = choose_mechanism(m, n=float(max(n + y, 0)), epsilon=(1 - share) * epsilon)
        law[name] = law.get(name, 0.0) + p
    return law


def _names_pvalue(names, law) -> float:
    keys = sorted(law)
    observed = np.array([names.count(k) for k in keys], dtype=float)
    assert len(names) == observed.sum()  # no name outside the law
    return _pooled_chi2(observed, np.array([law[k] for k in keys]))


@pytest.mark.parametrize("name", ["empty", "two", "three"])
def test_auto_choice_follows_the_noisy_count(name):
    values, counts = GROUPS[name]
    m = 3
    law = _choice_law(int(counts.sum()), m, 1.0)
    assert len([k for k, p in law.items() if p > 0.01]) >= 3  # histogram, agg_tree_8x3 and joint_exp all occur
    _, names = _batch((values, counts), 3000, mechanism="auto", epsilon=1.0, quantiles=np.array([0.25, 0.5, 0.75]),
                      branching=2, height=2)
    assert _names_pvalue(names, law) > ALPHA


def test_auto_choice_test_has_power():
    """A dropped noisy count (choice on the true n) and a count at epsilon x1.3 are both rejected."""
    law = _choice_law(2, 9, 1.0)
    dropped = [choose_mechanism(9, n=2.0, epsilon=0.95)] * 3000
    assert _names_pvalue(dropped, law) < ALPHA
    values, counts = GROUPS["two"]
    _, names = _batch((values, counts), 3000, mechanism="auto", epsilon=1.0, quantiles=np.arange(1, 10) / 10,
                      count_share=0.05 * 1.3, branching=2, height=2)
    assert _names_pvalue(names, law) < ALPHA


def test_auto_under_swap_uses_the_true_count_and_the_whole_epsilon():
    values, counts = GROUPS["three"]
    _, names = _batch((values, counts), 50, mechanism="auto", epsilon=1.0, relation="swap",
                      quantiles=np.arange(1, 10) / 10, branching=2, height=2)
    assert set(names) == {choose_mechanism(9, n=3.0, epsilon=1.0)}


def test_auto_joint_exp_groups_have_the_joint_exp_law_at_the_remaining_epsilon():
    """Conditioned on auto picking JointExp (m = 2 does unless the noisy n times epsilon is
    below 25, when it picks the histogram), the outputs follow JointExp at (1 - count_share)
    epsilon: the choice reads only the count's noise, independent of the JointExp draw."""
    values, counts = GROUPS["tie"]
    q2 = np.array([0.3, 0.7])
    out, names = _batch((values, counts), 6000, mechanism="auto", epsilon=8.0, quantiles=q2)
    picked = np.array(names) == "joint_exp"
    assert set(names) == {"joint_exp", "histogram"} and picked.sum() > 1500
    law = _exact_law(values, counts, q2, 0.95 * 8.0, "add_remove")
    assert _law_pvalue(out[picked], values, counts, law) > ALPHA


def test_release_many_mixes_mechanisms_in_one_batch():
    groups = [GROUPS[k] for k in ("empty", "one", "two", "tie", "three")] * 40
    out = release_many(groups, np.arange(1, 10) / 10, epsilon=1.0, lower=LOWER, upper=UPPER,
                       rng=np.random.default_rng(23), branching=4, height=2)
    assert out.values.shape == (200, 9) and len(out.mechanisms) == 200
    assert np.all(np.diff(out.values, axis=1) >= 0)
    assert np.all((out.values >= LOWER) & (out.values <= UPPER))
    assert set(out.mechanisms) <= set(BATCH_MECHANISMS) - {"auto"}


def test_release_many_without_groups():
    out = release_many([], Q3, epsilon=1.0, lower=LOWER, upper=UPPER, rng=np.random.default_rng(0))
    assert out.values.shape == (0, 3) and out.mechanisms == []


# ------------------------------------------------------------------------------------------
# validation


def _call(**overrides):
    kwargs = dict(groups=[GROUPS["two"]], quantiles=Q3, epsilon=1.0, lower=LOWER, upper=UPPER)
    kwargs.update(overrides)
    return release_many(kwargs.pop("groups"), kwargs.pop("quantiles"), **kwargs)


@pytest.mark.parametrize(
    "overrides, error, match",
    [
        (dict(epsilon=0.0), ValueError, r"`epsilon` must be finite and > 0, got 0.0"),
        (dict(epsilon="1"), TypeError, r"`epsilon` must be a real number"),
        (dict(quantiles=[0.5, 0.25]), ValueError, r"`quantiles` must be strictly increasing"),
        (dict(lower=5.0, upper=1.0), ValueError, r"`lower` must be < `upper`"),
        (dict(lower=None), TypeError, r"`lower` must be a real number"),
        (dict(neighboring="rows"), ValueError, r"`neighboring` must be one of"),
        (dict(mechanism="smooth"), ValueError, r"`mechanism` must be one of 'auto', .*got 'smooth'"),
        (dict(count_share=1.0), ValueError, r"`count_share` must be in \(0, 1\), got 1.0"),
        (dict(branching=1), ValueError, r"`branching` must be >= 2"),
        (dict(height=0), ValueError, r"`height` must be >= 1"),
        (dict(branching=64, height=5), ValueError, r"`branching`\*\*`height` must be <= 2\*\*24"),
        (dict(groups="ab"), TypeError, r"`groups` must be a sequence of \(values, counts\) pairs"),
        (dict(groups=[(np.ones(2),)]), TypeError, r"`groups` must be a sequence of \(values, counts\) pairs"),
        (dict(groups=[(np.ones(2), np.ones(3))]), ValueError, r"`groups` counts must be 1-d with the length"),
        (dict(groups=[(np.array([1.0, np.nan]), None)]), ValueError, r"`groups` must not contain NaN"),
        (dict(groups=[(np.array([1.0, 2.0]), np.array([1, -1]))]), ValueError,
         r"`groups' counts` must be non-negative"),
        (dict(rng=7), TypeError, r"`rng` must be a numpy.random.Generator"),
    ],
)
def test_validation_names_the_argument(overrides, error, match):
    with pytest.raises(error, match=match):
        _call(**overrides)


def test_validation_draws_nothing_and_echoes_no_data():
    rng = np.random.default_rng(29)
    before = rng.bit_generator.state
    with pytest.raises(ValueError) as info:
        _call(groups=[(np.array([123.456, 789.25]), np.array([3, -5]))], rng=rng)
    assert rng.bit_generator.state == before
    assert "123.456" not in str(info.value) and "-5" not in str(info.value)


# ------------------------------------------------------------------------------------------
# seeded equality where the batch makes the core's very draws


@pytest.mark.parametrize("relation", ["add_remove", "swap"])
def test_agg_tree_without_noise_equals_the_core(relation):
    """At epsilon = 1e9 every noisy count equals the exact one (the noise is 0 but with
    probability ~2**-63), so batch and core must give the same numbers: the histograms, the node
    mapping and the aggregation are checked exactly, on the default 16**4 tree."""
    rng = np.random.default_rng(37)
    groups = [(rng.uniform(-1, 11, size), rng.integers(0, 4, size)) for size in (0, 1, 2, 3, 7, 30)]
    groups.append((np.array([LOWER, UPPER, UPPER]), np.array([1, 2, 1])))
    got = release_many(groups, Q3, epsilon=1e9, lower=LOWER, upper=UPPER, neighboring=relation,
                       mechanism="agg_tree", rng=np.random.default_rng(1)).values
    for g, (values, counts) in enumerate(groups):
        want = agg_tree(values, Q3, epsilon=1e9, lower=LOWER, upper=UPPER, neighboring=relation,
                        counts=counts, rng=np.random.default_rng(2))
        assert np.array_equal(got[g], want)


@pytest.mark.parametrize("mechanism", ["joint_exp", "ind_exp", "approx_quantiles", "agg_tree"])
def test_grid_indices_give_the_release_of_their_grid_values(mechanism):
    """grid_indices=True on k is release_many on Grid.value(k), draw for draw."""
    rng = np.random.default_rng(41)
    idx = [np.sort(rng.integers(0, GRID.size, size)) for size in (0, 1, 2, 3, 12)]
    idx.append(np.array([0, GRID.steps]))
    counts = [rng.integers(1, 3, k.size) for k in idx]
    kw = dict(epsilon=2.0, lower=LOWER, upper=UPPER, mechanism=mechanism, branching=4, height=2)
    a = release_many(list(zip(idx, counts)), Q3, grid_indices=True, rng=np.random.default_rng(3), **kw)
    b = release_many([(GRID.value(k), c) for k, c in zip(idx, counts)], Q3, rng=np.random.default_rng(3), **kw)
    assert np.array_equal(a.values, b.values)


def test_grid_indices_are_checked():
    with pytest.raises(ValueError, match=r"`groups` must hold grid indices in \[0, 4294967296\]"):
        _call(groups=[(np.array([0.5]), None)], grid_indices=True)
    with pytest.raises(TypeError, match=r"`grid_indices` must be True or False, got 1"):
        _call(grid_indices=1)


@pytest.mark.parametrize("mechanism, fn", [("ind_exp", ind_exp), ("approx_quantiles", approx_quantiles),
                                           ("joint_exp", joint_exp)])
def test_larger_groups_and_values_off_the_bounds_reproduce_the_core(mechanism, fn):
    """Groups beyond the small paths (over 64 rows; JointExp beyond enumeration) run the core's samplers with the core's draws; values outside
    the bounds, also infinite, are clamped."""
    rng = np.random.default_rng(43)
    q = np.arange(1, 10) / 10
    sizes = (70, 150) if mechanism != "joint_exp" else (20, 70, 150)
    for seed, size in enumerate(sizes):
        x = np.concatenate((rng.normal(5, 3, size), [-np.inf, np.inf, -3.0, 12.0]))
        c = rng.integers(0, 3, x.size)
        want = fn(x, q, epsilon=1.0, lower=LOWER, upper=UPPER, counts=c, rng=np.random.default_rng(seed))
        got = release_many([(x, c)], q, epsilon=1.0, lower=LOWER, upper=UPPER, mechanism=mechanism,
                           rng=np.random.default_rng(seed)).values[0]
        assert np.array_equal(got, want)


@pytest.mark.parametrize("mechanism", ["auto", "joint_exp", "ind_exp", "approx_quantiles",
                                       "agg_tree", "histogram"])
def test_flat_groups_are_the_same_groups_as_pairs(mechanism):
    """FlatGroups (three arrays, as the Spark fold holds them) give the release of the same
    groups as pairs, seed for seed, empty groups and counts included; a shifted boundary (one
    row moved to the next group) changes it."""
    rng = np.random.default_rng(8)
    sizes = [0, 3, 1, 40, 0, 120, 7]
    idx = [np.sort(rng.integers(0, GRID.steps + 1, k)) for k in sizes]
    counts = [rng.integers(1, 4, k) for k in sizes]
    bounds = np.concatenate(([0], np.cumsum(sizes)))
    kw = dict(epsilon=1.0, lower=LOWER, upper=UPPER, mechanism=mechanism, grid_indices=True,
              coarse_cells=True)
    pairs = release_many(list(zip(idx, counts)), Q3, rng=np.random.default_rng(5), **kw)
    flat = release_many(FlatGroups(np.concatenate(idx), np.concatenate(counts), bounds), Q3,
                        rng=np.random.default_rng(5), **kw)
    assert np.array_equal(pairs.values, flat.values) and pairs.mechanisms == flat.mechanisms
    moved = bounds.copy()
    moved[4] -= 1  # the last row of group 3 joins group 4
    shifted = release_many(FlatGroups(np.concatenate(idx), np.concatenate(counts), moved), Q3,
                           rng=np.random.default_rng(5), epsilon=1e6, lower=LOWER, upper=UPPER,
                           mechanism="joint_exp", grid_indices=True)
    exact = release_many(list(zip(idx, counts)), Q3, rng=np.random.default_rng(5), epsilon=1e6,
                         lower=LOWER, upper=UPPER, mechanism="joint_exp", grid_indices=True)
    assert not np.array_equal(shifted.values, exact.values)


@pytest.mark.parametrize("bounds", [[1, 2], [0, 3, 2], [0, 1], [[0, 2]], [0.0, 2.0], []])
def test_flat_groups_bounds_are_checked(bounds):
    with pytest.raises(ValueError, match="`groups` bounds must be nondecreasing integers"):
        release_many(FlatGroups(np.array([1.0, 2.0]), None, np.array(bounds)), Q3, epsilon=1.0,
                     lower=LOWER, upper=UPPER)


def test_joint_exp_groups_beyond_enumeration_sampled_a_few_at_a_time(monkeypatch):
    """With CELLS_HELD lowered, release_many builds and samples the JointExp groups beyond
    enumeration a few at a time; at a huge epsilon every output falls in its own group's data
    at the rank that fits, as in one call (a mix-up of groups would not)."""
    import dpq_spark.core.quantiles.batch as batch

    rng = np.random.default_rng(9)
    idx = [np.sort(rng.choice(GRID.steps + 1, size, replace=False)) for size in (40, 88, 200, 60, 148)]  # q n integers: one rank fits
    calls = []
    real = batch._joint_many
    monkeypatch.setattr(batch, "_joint_many", lambda cells, *a, **kw: calls.append(len(cells)) or real(cells, *a, **kw))

    def run():
        calls.clear()
        return release_many([(k, None) for k in idx], Q3, epsilon=1e9, lower=LOWER, upper=UPPER,
                            mechanism="joint_exp", grid_indices=True).values

    whole = run()
    assert calls == [len(idx)]
    monkeypatch.setattr(batch, "CELLS_HELD", 300)
    parts = run()
    assert len(calls) > 1 and sum(calls) == len(idx)
    for g, k in enumerate(idx):
        rep = GRID.value(k)
        assert np.array_equal(np.searchsorted(rep, whole[g], side="right"),
                              np.searchsorted(rep, parts[g], side="right")), g
    other = GRID.value(idx[1])  # power: another group's points put the ranks elsewhere
    assert not np.array_equal(np.searchsorted(other, whole[0], side="right"),
                              np.searchsorted(other, parts[1], side="right"))


@pytest.mark.parametrize("mechanism", ["joint_exp", "ind_exp", "approx_quantiles"])
def test_small_groups_padded_to_their_widest_draw_as_padded_to_the_limit(monkeypatch, mechanism):
    """Small groups are drawn together on rows as wide as the most points any of them has (a
    private, data-dependent width: it may show in time only). Rows padded to the fixed limit
    instead give the same release seed for seed: padding slots carry no weight and no draw.
    A row one slot too narrow (a group's last point lost) changes the release."""
    import dpq_spark.core.quantiles.batch as batch

    rng = np.random.default_rng(12)
    sizes = [0, 1, 2, 5, 3, 2, 1, 4]
    groups = [(np.sort(rng.integers(0, GRID.steps + 1, k)), rng.integers(1, 3, k)) for k in sizes]
    kw = dict(epsilon=1.0, lower=LOWER, upper=UPPER, mechanism=mechanism, grid_indices=True)
    real = batch._distinct_rows

    def padded_to(extra):
        def rows(k, counts, bounds, members, D):
            pick, pts, mul, d, rest = real(k, counts, bounds, members, D)
            if extra >= 0:
                pts, mul = (np.pad(a, ((0, 0), (0, extra))) for a in (pts, mul))
            else:
                w = pts.shape[1] + extra
                pts, mul, d = pts[:, :w], mul[:, :w], np.minimum(d, w)
            return pick, pts, mul, d, rest
        return rows

    narrow = release_many(groups, Q3, rng=np.random.default_rng(4), **kw).values
    monkeypatch.setattr(batch, "_distinct_rows", padded_to(64))
    wide = release_many(groups, Q3, rng=np.random.default_rng(4), **kw).values
    assert np.array_equal(narrow, wide)
    monkeypatch.setattr(batch, "_distinct_rows", padded_to(-1))
    # a lost point need not show in one seed's draws; over five seeds it does
    changed = []
    for seed in range(4, 9):
        monkeypatch.setattr(batch, "_distinct_rows", real)
        right = release_many(groups, Q3, rng=np.random.default_rng(seed), **kw).values
        monkeypatch.setattr(batch, "_distinct_rows", padded_to(-1))
        changed.append(not np.array_equal(
            right, release_many(groups, Q3, rng=np.random.default_rng(seed), **kw).values))
    assert any(changed)
