"""The coarse band bound (dpq_spark.core.quantiles.coarse_bands) against exact JointExp masses, and the
split of ``auto`` into count-and-choose then run."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import logsumexp

from dpq_spark.core.quantiles import coarse_bands as cb
from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.core.randomness.dlap_table import dlap_many
from dpq_spark.core.randomness.samplers import dlap_scale
from dpq_spark.core.quantiles.choose import auto, choose_mechanism, plan_auto
from dpq_spark.core.randomness.grid import Grid
from dpq_spark.core.quantiles.joint_exp import joint_exp_indices
from dpq_spark.core.quantiles.mechanisms import get_base_mechanism
from dpq_spark.core.accounting.neighboring import NeighboringRelation, joint_exp_sensitivity

N = cb.FINE_STEPS
TOL = -60 * math.log(2.0)


def _segments(k, counts, extra_edges):
    """Runs of grid points of equal mid-rank: (start, stop, rank) with stop exclusive."""
    d, t = np.unique(np.repeat(k, counts), return_counts=True)
    below = np.r_[0, np.cumsum(t)[:-1]]
    edges = np.unique(np.r_[0, N + 1, d, d + 1, extra_edges])
    edges = edges[(edges >= 0) & (edges <= N + 1)]
    start, stop = edges[:-1], edges[1:]
    i = np.searchsorted(d, start, side="right") - 1  # last data point <= start
    at = (i >= 0) & (d[np.maximum(i, 0)] == start)
    lo = np.where(i >= 0, below[np.maximum(i, 0)] + t[np.maximum(i, 0)], 0).astype(float)
    rank = np.where(at, below[np.maximum(i, 0)] + (t[np.maximum(i, 0)] + 1) / 2.0, lo)
    return start, stop, rank


def _pruned_log_fraction(k, q, c, keep_mask_fn, shift=12):
    """log of (JointExp mass with some output in a pruned coarse cell ``k >> shift``) / Z,
    exactly (m <= 2)."""
    k = np.asarray(k, dtype=np.int64)
    counts = np.ones(k.size, dtype=np.int64)
    cells, ccounts = np.unique(k >> shift, return_counts=True)
    keep = keep_mask_fn(cells, ccounts)
    n = k.size
    span = 1 << shift
    edges = np.r_[cells * span, np.minimum(cells * span + span, N + 1)]
    start, stop, rank = _segments(k, counts, edges)
    pruned_seg = np.isin(start >> shift, cells[~keep])
    length = (stop - start).astype(float)
    t = np.diff(np.r_[0.0, q, 1.0]) * n
    if len(q) == 1:
        logw = np.log(length) + c * -(np.abs(rank - t[0]) + np.abs(n - rank - t[1]))
        total = logsumexp(logw)
        if not pruned_seg.any():
            return -np.inf, keep
        return logsumexp(logw[pruned_seg]) - total, keep
    r1, r2 = rank[:, None], rank[None, :]
    u = -(np.abs(r1 - t[0]) + np.abs(r2 - r1 - t[1]) + np.abs(n - r2 - t[2]))
    pairs = np.log(length)[:, None] + np.log(length)[None, :]
    same = np.log(length * (length + 1) / 2)
    idx = np.arange(length.size)
    pairs[idx, idx] = same
    logw = np.where(idx[:, None] <= idx[None, :], pairs + c * u, -np.inf)
    total = logsumexp(logw)
    hit = pruned_seg[:, None] | pruned_seg[None, :]
    if not hit.any():
        return -np.inf, keep
    return logsumexp(np.where(hit, logw, -np.inf)) - total, keep


def _cases(size, shift=12):
    """Data shapes whose sizes scale with the cell width ``2**shift``."""
    gen = np.random.default_rng(8)
    base = 2**31
    span = 1 << shift
    return {
        "cluster_outliers": np.r_[base + gen.integers(0, 40 * span, size),
                                  gen.integers(0, N + 1, 8)],
        "one_cell_and_spread": np.r_[base + gen.integers(0, span, size // 2),
                                     base + gen.integers(-span << 12, span << 12, size // 2)],
        "two_clusters": np.r_[gen.integers(2**20, 2**20 + 8 * span, size // 2),
                              gen.integers(2**32 - (span << 10), 2**32 + 1, size // 2)],
    }


@pytest.mark.parametrize("shift", [12, 16])
@pytest.mark.parametrize("m, size", [(1, 1500), (2, 300)])
def test_pruned_mass_below_tolerance_and_wrong_tolerance_fails(m, size, shift):
    """Exact masses on the grid, for cells of 4,096 and of 65,536 grid points: what
    reachable() prunes has probability below 2**-60 under JointExp on the fine data. A band
    built with tolerance 1/2 (log_tol = log 2) prunes cells whose mass is far above 2**-60:
    the check has power."""
    q = np.array([0.5]) if m == 1 else np.array([0.3, 0.7])
    pruned_any = False
    wrong_caught = False
    for eps in (1.0, 4.0):
        c = eps / (2.0 * joint_exp_sensitivity(q, NeighboringRelation.ADD_REMOVE))
        for name, k in _cases(size, shift).items():
            frac, keep = _pruned_log_fraction(
                k, q, c, lambda cells, counts: cb.reachable(cells, counts, q, c, N, shift=shift),
                shift)
            pruned_any |= not keep.all()
            assert frac <= TOL, (name, eps, frac)
            wrong, _ = _pruned_log_fraction(
                k, q, c, lambda cells, counts: cb.reachable(cells, counts, q, c, N,
                                                            log_tol=math.log(2.0), shift=shift),
                shift)
            wrong_caught |= wrong > TOL
    assert pruned_any  # the right bound does prune (the test is not vacuous)
    assert wrong_caught


@pytest.mark.parametrize("shift", [12, 16])
def test_represented_data_keeps_rank_ranges_and_counts(shift):
    gen = np.random.default_rng(2)
    span = 1 << shift
    k = np.r_[2**31 + gen.integers(0, 200 * span, 10000), gen.integers(0, N + 1, 20)]
    fine_k, fine_w = np.unique(k, return_counts=True)
    cells, counts = np.unique(cb.coarse_of(k, shift), return_counts=True)
    keep = cb.reachable(cells, counts, [0.1, 0.5, 0.9], 0.25, N, shift=shift)
    assert not keep.all() and keep.any()
    kept = np.isin(cb.coarse_of(fine_k, shift), cells[keep])
    yk, yw = cb.represent(fine_k[kept], fine_w[kept], cells, counts, keep, shift)
    assert yw.sum() == k.size
    ycells, ycounts = np.unique(cb.coarse_of(np.repeat(yk, yw), shift), return_counts=True)
    assert ycells.tolist() == cells.tolist() and ycounts.tolist() == counts.tolist()
    # kept cells keep their fine data exactly; pruned ones sit at their left edge
    inside = np.isin(cb.coarse_of(yk, shift), cells[keep])
    assert yk[inside].tolist() == fine_k[kept].tolist()
    assert set(yk[~inside].tolist()) == set((cells[~keep] * span).tolist())


def test_cell_maps_at_two_shifts():
    """coarse_of, coarse_midpoints and the cell edges used by represent at 4,096 and 65,536
    grid points a cell (the last cell holds k = N alone, its midpoint clipped to N)."""
    k = np.array([0, 4095, 4096, 65535, 65536, N - 1, N])
    assert cb.coarse_of(k).tolist() == [0, 0, 1, 15, 16, 2**20 - 1, 2**20]
    assert cb.coarse_of(k, 16).tolist() == [0, 0, 0, 0, 1, 2**16 - 1, 2**16]
    assert cb.coarse_midpoints([0, 1, 2**20]).tolist() == [2048, 6144, N]
    assert cb.coarse_midpoints([0, 1, 2**16], shift=16).tolist() == [32768, 98304, N]
    yk, yw = cb.represent([], [], [3, 2**16], [5, 2], [False, False], 16)
    assert yk.tolist() == [3 * 65536, N] and yw.tolist() == [5, 2]


def _settled_mask(k, q, c, shift, log_tol=cb.BAND_LOG_TOL, first=None):
    """keep_mask_fn for _pruned_log_fraction: the band from the fine data read (settle)."""
    k = np.asarray(k, dtype=np.int64)

    def keep_mask(cells, counts):
        def band(fine):
            return cb.reachable(cells, counts, q, c, N, log_tol=log_tol, shift=shift, fine=fine)

        def fetch(mask):
            return np.unique(k[np.isin(k >> shift, cells[mask])], return_counts=True)

        guess = band(cb.spread_evenly(cells, counts, q, N, shift)) if first is None else first
        return cb.settle(band, fetch, guess)[0]
    return keep_mask


@pytest.mark.parametrize("shift", [12, 16])
@pytest.mark.parametrize("m, size", [(1, 1500), (2, 300)])
def test_settled_pruning_below_tolerance_and_wrong_tolerance_fails(m, size, shift):
    """The band whose L uses the fine data of the cells read (settle): what it prunes has exact
    JointExp mass below 2**-60, at cells of 4,096 and 65,536 grid points; it prunes at least as
    much as the coarse-only band, and somewhere more. With tolerance 1/2 it prunes mass above
    2**-60 (power)."""
    q = np.array([0.5]) if m == 1 else np.array([0.3, 0.7])
    tighter = wrong_caught = False
    for eps in (1.0, 4.0):
        c = eps / (2.0 * joint_exp_sensitivity(q, NeighboringRelation.ADD_REMOVE))
        for name, k in _cases(size, shift).items():
            frac, keep = _pruned_log_fraction(k, q, c, _settled_mask(k, q, c, shift), shift)
            assert frac <= TOL, (name, eps, frac)
            cells, counts = np.unique(np.asarray(k) >> shift, return_counts=True)
            coarse = cb.reachable(cells, counts, q, c, N, shift=shift)
            assert not (keep & ~coarse).any()
            tighter |= bool((coarse & ~keep).any())
            wrong, _ = _pruned_log_fraction(
                k, q, c, _settled_mask(k, q, c, shift, log_tol=math.log(2.0)), shift)
            wrong_caught |= wrong > TOL
    assert tighter
    assert wrong_caught


def test_settle_reads_until_the_band_is_covered():
    """From a one-cell first guess settle reads more cells (several rounds) until every cell
    its band keeps has been read; what it returns is all the data of the kept cells, and
    pruning at the end meets the band computed from it."""
    gen = np.random.default_rng(3)
    shift = 16
    k = np.sort(np.r_[2**31 + gen.integers(0, 300 << shift, 50_000), gen.integers(0, N + 1, 30)])
    q = np.array([0.1, 0.5, 0.9])
    c = 1.0 / (2.0 * joint_exp_sensitivity(q, NeighboringRelation.ADD_REMOVE))
    cells, counts = np.unique(k >> shift, return_counts=True)
    reads = []

    def band(fine):
        return cb.reachable(cells, counts, q, c, N, shift=shift, fine=fine)

    def fetch(mask):
        reads.append(int(mask.sum()))
        return np.unique(k[np.isin(k >> shift, cells[mask])], return_counts=True)

    one = np.zeros(cells.size, dtype=bool)
    one[cells.size // 2] = True
    keep, fk, fw = cb.settle(band, fetch, one)
    assert len(reads) >= 2 and sum(reads) == keep.sum() and not keep.all()
    assert not (band((fk, fw)) & ~keep).any()
    want_k, want_w = np.unique(k[np.isin(k >> shift, cells[keep])], return_counts=True)
    assert fk.tolist() == want_k.tolist() and fw.tolist() == want_w.tolist()
    # the first guess from rows spread evenly reads once here
    reads.clear()
    keep2, _, _ = cb.settle(band, fetch, band(cb.spread_evenly(cells, counts, q, N, shift)))
    assert len(reads) == 1 and keep2.sum() <= keep.sum()


def test_spread_evenly_and_incomplete_fine_data():
    cells, counts = np.array([0, 5, 9]), np.array([3, 10_000, 2])
    k, w = cb.spread_evenly(cells, counts, [0.5], N, 16)
    assert w.sum() == 10_000 and np.all(w > 0) and np.all(np.diff(k) > 0)
    assert np.all((k >> 16) == 5) and k.size == 4096
    with pytest.raises(ValueError, match="`fine` must hold all the data of its cells"):
        cb.reachable(cells, counts, [0.5], 1.0, N, shift=16, fine=(k[:10], w[:10]))


def test_no_box_keeps_everything():
    # n = 0 or a single point: no box for the targets, nothing is pruned
    assert cb.reachable([], [], [0.5], 1.0).size == 0
    assert cb.reachable([5], [1], [0.5], 1.0).all()


@pytest.mark.parametrize("shift", [12, 16])
def test_represented_release_close_to_fine_release(shift):
    """JointExp on the represented data and on the fine data: the same draws for most seeds
    (the pruned cells are essentially never sampled), so every released tuple lands in a kept
    cell."""
    gen = np.random.default_rng(5)
    k = np.r_[2**31 + gen.integers(0, 30 << shift, 10000), gen.integers(0, N + 1, 40)]
    q = np.array([0.1, 0.5, 0.9])
    grid = Grid(0.0, 1.0)
    fine_k, fine_w = np.unique(k, return_counts=True)
    cells, counts = np.unique(cb.coarse_of(k, shift), return_counts=True)
    c = 1.0 / (2.0 * joint_exp_sensitivity(q, NeighboringRelation.ADD_REMOVE))
    keep = cb.reachable(cells, counts, q, c, N, shift=shift)
    assert not keep.all()
    kept = np.isin(cb.coarse_of(fine_k, shift), cells[keep])
    yk, yw = cb.represent(fine_k[kept], fine_w[kept], cells, counts, keep, shift)
    for seed in range(30):
        a = joint_exp_indices(fine_k, fine_w, grid.size, q, epsilon=1.0,
                              rng=np.random.default_rng(seed))
        b = joint_exp_indices(yk, yw, grid.size, q, epsilon=1.0, rng=np.random.default_rng(seed))
        assert not np.isin(cb.coarse_of(b, shift), cells[~keep]).any()
        assert np.array_equal(a, b)


# ------------------------------------------------------------------------------------------
# auto split into plan_auto + the chosen mechanism


def _old_auto(x, q, epsilon, lower, upper, rng, share=0.05):
    """The pre-split ``auto`` recipe with bounds, written out: one source, noisy count, choice,
    then the base mechanism on the same source."""
    source = resolve_rng(rng)
    noisy = x.size + dlap_many(source, dlap_scale(1, share * epsilon), 1)[0]
    rest = (1 - share) * epsilon
    name = choose_mechanism(len(q), n=float(max(noisy, 0)), epsilon=rest)
    return name, get_base_mechanism(name)(x, q, epsilon=rest, lower=lower, upper=upper,
                                          rng=source)


@pytest.mark.parametrize("share", [0.05, 0.2])
def test_auto_split_gives_the_old_release(share):
    """auto (now plan_auto + mechanism) equals the old recipe draw for draw, over sizes that
    straddle choice boundaries; the recipe with a different count share (0.2) differs, so the
    comparison has power."""
    gen = np.random.default_rng(0)
    q = np.linspace(0.05, 0.95, 30)  # m = 30: JointExp vs ApproxQuantiles depends on n
    mismatches = 0
    names = set()
    for trial in range(40):
        n = int(gen.choice([3, 400, 700, 900, 1200, 5000]))
        x = gen.normal(0, 1, n)
        new = auto(x, q, epsilon=1.0, lower=-5, upper=5, rng=np.random.default_rng(trial))
        name, old = _old_auto(x, q, 1.0, -5, 5, np.random.default_rng(trial), share)
        names.add(new.mechanism)
        same = new.mechanism == name and np.array_equal(np.asarray(new), old)
        mismatches += not same
    assert len(names) >= 2
    if share == 0.05:
        assert mismatches == 0
    else:
        assert mismatches > 20


def test_plan_auto_then_mechanism_equals_auto():
    q = np.array([0.25, 0.5, 0.75])
    gen = np.random.default_rng(1)
    for seed in range(20):
        x = gen.uniform(0, 1, 50 + 37 * seed)
        want = auto(x, q, epsilon=0.5, lower=0, upper=1, rng=np.random.default_rng(seed))
        source = resolve_rng(np.random.default_rng(seed))
        name, rest, n_used = plan_auto(3, x.size, epsilon=0.5, neighboring="add_remove",
                                       source=source)
        got = get_base_mechanism(name)(x, q, epsilon=rest, lower=0, upper=1, rng=source)
        assert name == want.mechanism and n_used == want.n_used
        assert np.array_equal(got, np.asarray(want))
