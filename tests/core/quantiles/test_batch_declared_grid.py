"""release_many on a declared grid (``granularity``): each group has the law of the core
mechanism called on it alone with the same ``granularity``.

On a grid of nine integer points every release is a tuple of grid points, so the batch's draws
and the core's are compared outcome by outcome (chi-square homogeneity at fixed seeds); the same
comparison rejects the batch run at a wrong epsilon and the batch run without the declared grid.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from dpq_spark.core import agg_tree, approx_quantiles, histogram, ind_exp, joint_exp
from dpq_spark.core.quantiles.batch import FlatGroups, release_many
from dpq_spark.core.quantiles.choose import choose_mechanism
from dpq_spark.core.randomness.grid import Grid

LOWER, UPPER, STEP = 0.0, 8.0, 1.0
Q3 = np.array([0.25, 0.5, 0.75])
ALPHA = 1e-3
DRAWS = 1500
# tied integer data (the case the jitter is for), two distinct points, and an empty group
GROUPS = [
    (np.array([2.0, 3.0, 5.0, 7.0]), np.array([2, 1, 3, 1])),
    (np.array([1.0, 4.0]), np.array([1, 1])),
    (np.zeros(0), np.zeros(0, dtype=np.int64)),
]
TREE = dict(branching=2, height=3)
CORE = {"joint_exp": joint_exp, "ind_exp": ind_exp, "approx_quantiles": approx_quantiles,
        "agg_tree": agg_tree, "histogram": histogram}


def _batch(mechanism, epsilon, seed, granularity=STEP, relation="add_remove"):
    extra = TREE if mechanism == "agg_tree" else {}
    out = release_many(GROUPS * DRAWS, Q3, epsilon=epsilon, lower=LOWER, upper=UPPER,
                       neighboring=relation, mechanism=mechanism, granularity=granularity,
                       rng=np.random.default_rng(seed), **extra)
    return [out.values[i::len(GROUPS)] for i in range(len(GROUPS))]


def _core(mechanism, group, epsilon, seed, relation="add_remove"):
    extra = TREE if mechanism == "agg_tree" else {}
    rng = np.random.default_rng(seed)
    values, counts = group
    return np.array([CORE[mechanism](values, Q3, epsilon=epsilon, lower=LOWER, upper=UPPER,
                                     neighboring=relation, counts=counts, granularity=STEP,
                                     rng=rng, **extra) for _ in range(DRAWS)])


def _pvalue(a, b) -> float:
    """Chi-square homogeneity of two samples of output tuples (cells seen under 10 times pooled)."""
    ca, cb = Counter(map(tuple, a.tolist())), Counter(map(tuple, b.tolist()))
    keys = sorted(set(ca) | set(cb))
    ta = np.array([ca[k] for k in keys], dtype=float)
    tb = np.array([cb[k] for k in keys], dtype=float)
    small = (ta + tb) < 10
    ta, tb = np.append(ta[~small], ta[small].sum()), np.append(tb[~small], tb[small].sum())
    keep = (ta + tb) > 0
    if keep.sum() < 2:
        return 1.0 if np.array_equal(ta, tb) else 0.0
    return chi2_contingency(np.vstack([ta[keep], tb[keep]]))[1]


@pytest.mark.parametrize("mechanism, relation", [
    ("joint_exp", "add_remove"), ("joint_exp", "swap"), ("ind_exp", "add_remove"),
    ("approx_quantiles", "swap"), ("agg_tree", "add_remove"), ("histogram", "add_remove")])
def test_each_group_has_the_law_of_the_core_on_the_declared_grid(mechanism, relation):
    eps = 2.0 if mechanism in ("agg_tree", "histogram") else 1.0
    batch = _batch(mechanism, eps, seed=3, relation=relation)
    for i, group in enumerate(GROUPS[:2]):
        out = batch[i]
        assert np.array_equal(out, np.round(out)), "releases on an integer grid are integers"
        assert np.all((out >= LOWER) & (out <= UPPER)) and np.all(np.diff(out, axis=1) >= 0)
        core = _core(mechanism, group, eps, seed=10 + i, relation=relation)
        assert _pvalue(out, core) > ALPHA, (mechanism, i)


@pytest.mark.parametrize("mechanism", ["joint_exp", "approx_quantiles"])
def test_the_comparison_rejects_a_wrong_epsilon_and_a_missing_grid(mechanism):
    core = _core(mechanism, GROUPS[0], 1.0, seed=10)
    assert _pvalue(_batch(mechanism, 2.0, seed=3)[0], core) < ALPHA  # twice the budget
    # the default grid: no jitter of ties, outputs off the integers
    assert _pvalue(_batch(mechanism, 1.0, seed=3, granularity=None)[0], core) < ALPHA


def test_jitter_keeps_the_groups_apart_and_in_order():
    """Grid indices with counts (the Spark fold's input), groups of different sizes and an empty
    one in between: every row is jittered inside its own cell and stays in its own group, so at
    a huge epsilon each group's deciles are its own tied values."""
    gen = np.random.default_rng(8)
    groups = [np.sort(gen.integers(0, 101, size)) for size in (50, 0, 400, 90)]
    k = [np.unique(g, return_counts=True) for g in groups]
    flat = FlatGroups(np.concatenate([u for u, _ in k]), np.concatenate([c for _, c in k]),
                      np.cumsum([0] + [len(u) for u, _ in k]))
    q = np.arange(1, 10) / 10
    out = release_many(flat, q, epsilon=1e6, lower=0.0, upper=100.0, mechanism="joint_exp",
                       granularity=1.0, grid_indices=True, rng=np.random.default_rng(2)).values
    for g, data in enumerate(groups):
        if data.size == 0:
            assert np.array_equal(out[g], np.round(out[g]))
            continue
        # a quantile whose rank falls inside a tie block is released as the tied value
        low = np.quantile(data, q, method="inverted_cdf")
        high = np.quantile(data, q, method="higher")
        assert np.all((out[g] >= low - 1) & (out[g] <= high + 1)), g


@pytest.mark.parametrize("relation", ["swap", "add_remove"])
def test_auto_reads_the_declared_grid(relation):
    """Under swap n is public, so auto's choice per group is the typed rule's at that n; at these
    sizes the rule without the grid picks otherwise (so the test sees a missing grid)."""
    m, eps, q = 2, 1.0, [0.25, 0.75]
    sizes = [5_000_000, 20_000_000]  # AggTree on the grid, JointExp without it
    groups = [(np.full(1, 50.0), np.array([n])) for n in sizes]
    got = release_many(groups, q, epsilon=eps, lower=0.0, upper=100.0, neighboring=relation,
                       mechanism="auto", granularity=1.0, rng=np.random.default_rng(1))
    grid = Grid(0.0, 100.0, 1.0)
    for n, name in zip(sizes, got.mechanisms):
        typed = choose_mechanism(m, n=n, epsilon=eps if relation == "swap" else 0.95 * eps,
                                 grid_size=grid.size, granularity=1.0)
        assert typed != choose_mechanism(m, n=n, epsilon=eps)
        # under add/remove the rule reads a noisy count (scale 20): the same choice at these n
        assert name == typed
    assert np.all(got.values == 50.0)


def test_granularity_is_validated_before_any_draw():
    with pytest.raises(ValueError, match="granularity"):
        release_many(GROUPS, Q3, epsilon=1.0, lower=LOWER, upper=UPPER, granularity=-1.0)
    with pytest.raises((TypeError, ValueError), match="granularity"):
        release_many(GROUPS, Q3, epsilon=1.0, lower=LOWER, upper=UPPER, granularity="1")


def test_jittered_sorts_each_entrys_rows_as_a_full_sort_does(monkeypatch):
    """The jitter of a fold's groups (sorted distinct indices with counts, tie blocks large
    enough that rows of one entry collide on a fine index) gives each group's sorted distinct
    fine indices with their counts: the same arrays as sorting all rows by (group, index), for
    the same draws."""
    from dpq_spark.core.quantiles import batch
    from dpq_spark.core.randomness.source import resolve_rng

    gen = np.random.default_rng(4)
    sizes = [3, 0, 40, 1, 25]
    k = np.concatenate([np.sort(gen.choice(101, s, replace=False)) for s in sizes])
    counts = gen.integers(0, 3000, k.size)
    counts[::7] = 1
    bounds = np.concatenate(([0], np.cumsum(sizes)))
    grid = Grid(0.0, 100.0, 1.0)
    members = np.array([4, 0, 1, 2])

    def run():
        return batch._jittered(k, counts, bounds, members, grid, resolve_rng(np.random.default_rng(9)))

    f, w, b = run()
    monkeypatch.setattr(batch, "_in_group_order", lambda v, g: False)  # the full sort
    f0, w0, b0 = run()
    assert np.array_equal(f, f0) and np.array_equal(w, w0) and np.array_equal(b, b0)
    assert (w > 1).sum() > 10  # collisions were merged
    for i, g in enumerate(members):
        got = f[b[i]:b[i + 1]]
        assert np.all(np.diff(got) > 0)
        assert w[b[i]:b[i + 1]].sum() == counts[bounds[g]:bounds[g + 1]].sum()


def test_chunks_of_jittered_rows_keep_each_groups_law(monkeypatch):
    """The jitter runs a chunk of groups at a time (at most _JITTER_ROWS rows, lowered here to
    64, so about 7 groups a chunk): each group still has the core's law, and the comparison
    still rejects a wrong epsilon."""
    from dpq_spark.core.quantiles import batch

    calls = []
    real = batch._jittered
    monkeypatch.setattr(batch, "_jittered", lambda *a: calls.append(a[3].size) or real(*a))
    monkeypatch.setattr(batch, "_JITTER_ROWS", 64)
    out = _batch("joint_exp", 1.0, seed=5)
    assert len(calls) > 100 and max(calls) <= 64
    for i, group in enumerate(GROUPS[:2]):
        assert _pvalue(out[i], _core("joint_exp", group, 1.0, seed=20 + i)) > ALPHA, i
    assert _pvalue(out[0], _core("joint_exp", GROUPS[0], 2.0, seed=30)) < ALPHA


# --------------------------------------------------------------------------------------------
# joint_exp_index_grids: groups on declared index grids of different sizes, drawn together

def _index_groups(groups):
    return FlatGroups(np.concatenate([k for k, _ in groups]).astype(np.int64),
                      np.concatenate([c for _, c in groups]).astype(np.int64),
                      np.cumsum([0] + [len(k) for k, _ in groups]))


@pytest.mark.parametrize("rows, steps, relation", [
    (3, 5, "add_remove"), (40, 60, "swap"), (900, 2000, "add_remove"), (5000, 40_000, "swap")])
def test_index_grids_draw_one_group_as_release_many_draws_it(rows, steps, relation):
    """One group: the same jitter, the same JointExp on the fine grid and the same rounding as
    release_many on ``Grid(0, N, 1)``, seed for seed (few rows: the enumerated path; many: the
    batched sampler)."""
    from dpq_spark.core.quantiles.batch import joint_exp_index_grids
    from dpq_spark.core.randomness.source import resolve_rng

    q = np.arange(1, 10) / 10
    for seed in range(3):
        k, c = np.unique(np.random.default_rng(seed).integers(0, steps + 1, rows),
                         return_counts=True)
        flat = _index_groups([(k, c)])
        want = release_many(flat, q, epsilon=1.0, lower=0.0, upper=float(steps),
                            neighboring=relation, mechanism="joint_exp", granularity=1.0,
                            grid_indices=True, rng=np.random.default_rng(seed + 5)).values
        got = joint_exp_index_grids(flat, [steps], q, epsilon=1.0, neighboring=relation,
                                    source=resolve_rng(np.random.default_rng(seed + 5)))
        np.testing.assert_array_equal(got, want)


# tied integer data on index grids of 5, 9 and 13 steps: the last gap, up to N, is a large part
# of the 0.75 quantile's mass, so a group drawn on another group's grid has another law
SIZED = [(np.array([1, 2]), np.array([2, 1]), 5), (np.array([2, 3, 5]), np.array([2, 1, 2]), 9),
         (np.array([0, 4]), np.array([1, 3]), 13)]


def _index_grids_batch(steps_of, seed):
    from dpq_spark.core.quantiles.batch import joint_exp_index_grids
    from dpq_spark.core.randomness.source import resolve_rng

    flat = _index_groups([(k, c) for k, c, _ in SIZED] * DRAWS)
    out = joint_exp_index_grids(flat, [steps_of(n) for _, _, n in SIZED] * DRAWS, Q3,
                                epsilon=1.0, neighboring="add_remove",
                                source=resolve_rng(np.random.default_rng(seed)))
    return [out[i::len(SIZED)] for i in range(len(SIZED))]


def test_index_grids_of_different_sizes_in_one_call_have_each_groups_law():
    """Groups on grids of 5, 9 and 13 steps interleaved in one call: each group's outputs have
    the law of the core's joint_exp on its own ``Grid(0, N, 1)`` (chi-square homogeneity), and
    not the law of the batch that draws every group on the largest grid."""
    batch = _index_grids_batch(lambda n: n, seed=4)
    wrong = _index_grids_batch(lambda n: 13, seed=4)
    for i, (k, c, steps) in enumerate(SIZED):
        rng = np.random.default_rng(20 + i)
        core = np.array([joint_exp(k.astype(float), Q3, epsilon=1.0, lower=0.0,
                                   upper=float(steps), counts=c, granularity=1.0, rng=rng)
                         for _ in range(DRAWS)])
        out = batch[i]
        assert np.all((out >= 0) & (out <= steps)) and np.all(np.diff(out, axis=1) >= 0)
        assert _pvalue(out, core) > ALPHA, steps
        if steps < 13:
            assert _pvalue(wrong[i], core) < ALPHA, steps
