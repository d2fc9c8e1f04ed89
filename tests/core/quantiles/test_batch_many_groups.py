"""release_many on many groups of 100 and 1,000 rows: JointExp's cells and bands for all groups
at once (batch._flat_cells, batch._flat_bands), against the per-group core.

The cells and bands must be the very integers and floats the per-group core computes; the
releases must be the same draws, seed for seed, as with the per-group cells and bands; and each
group's law must be the core sampler's (chi-square at fixed seeds, rejecting epsilon x0.7 and
x1.3 at the same sample size).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from dpq_spark.core.quantiles import batch as B
from dpq_spark.core.quantiles import joint_exp_many as JM
from dpq_spark.core.quantiles.batch import FlatGroups, release_many
from dpq_spark.core.quantiles.joint_exp import _band_set, _bands, _grid_cells
from dpq_spark.core.quantiles.joint_exp_envelope import Bands
from dpq_spark.core.quantiles.joint_exp import _sample_indices as joint_sample
from dpq_spark.core.randomness.grid import Grid
from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.core.accounting.neighboring import NeighboringRelation, joint_exp_sensitivity

LOWER, UPPER = -100.0, 100.0
GRID = Grid(LOWER, UPPER)
DECILES = np.arange(1, 10) / 10
ALPHA = 1e-3


def _normal_groups(G, rows, seed, ties=False):
    """G groups of ``rows`` grid indices of N(0, 5) rows, as a fold holds them (sorted
    distinct indices per group, their counts)."""
    gen = np.random.default_rng(seed)
    x = gen.normal(0.0, 5.0, G * rows)
    if ties:
        x = np.round(x, 1)
    codes = np.repeat(np.arange(G, dtype=np.int64), rows) * (1 << 33) + GRID.snap(x)
    u, c = np.unique(codes, return_counts=True)
    g = u >> 33
    return FlatGroups(u - (g << 33), c.astype(np.int64),
                      np.searchsorted(g, np.arange(G + 1)).astype(np.int64))


def _random_groups(gen, G, size):
    """Groups of assorted sizes, spreads, ties and zero counts, unsorted (as any caller may
    pass them)."""
    ks, cs = [], []
    top = int(gen.choice([20, 200, 3000]))
    spread = float(gen.choice([1e2, 1e6, 1e9]))
    for n in gen.integers(1, top, G):
        k = np.clip(gen.normal(size / 2, spread, n).astype(np.int64), 0, size - 1)
        if gen.random() < 0.3:
            k = k[:max(1, n // 5)].repeat(5)[:n]
        ks.append(k)
        cs.append(gen.integers(0, 3, k.size) if gen.random() < 0.3 else np.ones(k.size, np.int64))
    return ks, cs


@pytest.mark.parametrize("seed", range(6))
def test_flat_cells_and_bands_are_the_per_group_ones(seed):
    """Every group's cells (bit for bit, dtypes included) and bands (the same integers) equal
    what joint_exp._grid_cells and _bands give it alone, over assorted m, epsilon, sizes, ties
    and zero counts, on one grid or, every other time, on grids of a size of their own."""
    gen = np.random.default_rng(seed)
    size = GRID.size
    checked = 0
    for t in range(8):
        G = int(gen.integers(1, 200))
        m = int(gen.choice([1, 2, 3, 9, 19, 99]))
        q = np.sort(gen.choice(np.arange(1, 1000), m, replace=False)) / 1000.0
        c = float(gen.choice([0.01, 0.1, 1.0, 10.0])) / 2.0
        ks, cs = _random_groups(gen, G, size)
        live = np.flatnonzero([cc.sum() > 0 for cc in cs])
        if live.size == 0:
            continue
        bounds = np.concatenate(([0], np.cumsum([k.size for k in ks])))
        k, counts = np.concatenate(ks), np.concatenate(cs)
        if t % 2:  # each group's grid just above its largest index, or far above
            sizes = np.array([int(kk.max(initial=0)) + 1 + int(gen.choice([0, 7, 10**6]))
                              for kk in ks])
        else:
            sizes = np.full(G, size)
        given = sizes[live] if t % 2 else size
        start, width, log_width, pos, n, coff = B._flat_cells(k, counts, bounds, live, given)
        bands = B._flat_bands(start, width, log_width, pos, n, coff, q, c, given)
        for i, g in enumerate(live.tolist()):
            own = int(sizes[g])
            alone = _grid_cells(ks[g], cs[g], own)
            a, b = int(coff[i]), int(coff[i + 1])
            flat = (start[a + i:b + i + 1], width[a:b], log_width[a:b], pos[a:b])
            for want, got in zip(alone[:4], flat):
                assert want.dtype == got.dtype and np.array_equal(want, got)
            assert alone[4] == int(n[i])
            want = _band_set(alone[0], alone[3], alone[4], q, c, *_bands(*alone, q, c, own))
            got = bands.take(slice(i, i + 1))
            for f in dataclasses.fields(Bands):
                assert np.array_equal(getattr(want, f.name), getattr(got, f.name)), f.name
            checked += 1
    assert checked > 300


def _per_group_cells(k, counts, bounds, members, slow, q, c, size):
    """The per-group construction _slow_cells replaces: _grid_cells per group, bands left to
    _sample_many (its own _bands loop)."""
    def cells_of(i):
        g = int(members[slow[i]])
        return _grid_cells(k[bounds[g]:bounds[g + 1]], counts[bounds[g]:bounds[g + 1]],
                           int(size[slow[i]]))

    def band_of(i):
        cells = cells_of(i)
        return _band_set(cells[0], cells[3], cells[4], q, c,
                         *_bands(*cells, q, c, int(size[slow[i]]))), 0

    yield slow, cells_of, band_of


@pytest.mark.parametrize("G, rows, ties", [(3000, 100, False), (300, 1000, False),
                                           (1000, 100, True)])
def test_release_many_draws_what_the_per_group_cells_draw(monkeypatch, G, rows, ties):
    """Seed for seed: release_many with the flat cells and bands gives the same releases as
    with each group's own _grid_cells and _bands (the same draws in the same order), at the
    sizes of 1e5 groups of 100 rows and 1e4 of 1,000 (one partition's batch, scaled down). JointExp
    by name: at 100 rows ``auto`` runs the 8**3 tree for deciles."""
    groups = _normal_groups(G, rows, seed=G + rows, ties=ties)
    kwargs = dict(epsilon=1.0, lower=LOWER, upper=UPPER, mechanism="joint_exp", grid_indices=True,
                  coarse_cells=True)
    flat = release_many(groups, DECILES, rng=np.random.default_rng(7), **kwargs)
    monkeypatch.setattr(B, "_slow_cells", _per_group_cells)
    alone = release_many(groups, DECILES, rng=np.random.default_rng(7), **kwargs)
    assert flat.mechanisms == alone.mechanisms
    assert flat.mechanisms.count("joint_exp") > 0.9 * G
    np.testing.assert_array_equal(flat.values, alone.values)


def test_release_many_chunks_cells_and_bands(monkeypatch):
    """Chunks of a few groups (_CELL_GROUPS lowered) give the same draws as one chunk (the
    sampled batches, cut by CELLS_HELD, stay the same)."""
    groups = _normal_groups(400, 100, seed=3)
    kwargs = dict(epsilon=1.0, lower=LOWER, upper=UPPER, mechanism="joint_exp",
                  grid_indices=True)
    one = release_many(groups, DECILES, rng=np.random.default_rng(1), **kwargs)
    monkeypatch.setattr(B, "_CELL_GROUPS", 7)
    chunked = release_many(groups, DECILES, rng=np.random.default_rng(1), **kwargs)
    np.testing.assert_array_equal(one.values, chunked.values)


def _median_ranks(values_k, data_k):
    """Each release's median as a rank among the group's data (0..n), binned by 5 ranks."""
    return np.searchsorted(np.sort(data_k), values_k[:, 4], side="left") // 5


def _law_pvalue(rows, epsilon, seed=11):
    """Chi-square p-value of the binned median rank: many copies of one group released
    together by release_many (the batched path, each copy an independent draw) at
    ``epsilon``, against as many draws of the core sampler at epsilon 1."""
    draws = max(1000, 300_000 // rows)  # 3,000 releases of 100 rows, 1,000 of 1,000
    data = _normal_groups(1, rows, seed=rows).values  # distinct grid indices
    k = np.tile(data, draws)
    counts = np.ones(k.size, dtype=np.int64)
    bounds = np.arange(0, k.size + 1, data.size, dtype=np.int64)
    got = release_many(FlatGroups(k, counts, bounds), DECILES, epsilon=epsilon, lower=LOWER,
                       upper=UPPER, mechanism="joint_exp", grid_indices=True,
                       rng=np.random.default_rng(seed)).values
    c = 1.0 / (2.0 * joint_exp_sensitivity(DECILES, NeighboringRelation.ADD_REMOVE))
    core = joint_sample(data, None, DECILES, c, GRID.size,
                        resolve_rng(np.random.default_rng(seed + 1)), draws=draws)
    ours = _median_ranks(GRID.snap(got), data)
    theirs = _median_ranks(core, data)
    bins = np.arange(max(ours.max(), theirs.max()) + 2)
    table = np.array([np.histogram(ours, bins)[0], np.histogram(theirs, bins)[0]])
    table = table[:, table.sum(axis=0) >= 10]
    return chi2_contingency(table).pvalue


@pytest.mark.parametrize("rows", [100, 1000])
def test_batched_joint_exp_has_the_core_law(rows):
    assert _law_pvalue(rows, 1.0) > ALPHA


@pytest.mark.parametrize("rows", [100, 1000])
@pytest.mark.parametrize("factor", [0.7, 1.3])
def test_batched_joint_exp_law_test_has_power(rows, factor):
    assert _law_pvalue(rows, factor) < ALPHA


def test_kernel_sums_carry_is_the_same_in_any_batch():
    """The lockstep carry of _kernel_sums_many: a group's forward tables are the same bits
    with other groups of other sizes beside it as alone."""
    groups = _normal_groups(60, 100, seed=5)
    c = 1.0 / (2.0 * joint_exp_sensitivity(DECILES, NeighboringRelation.ADD_REMOVE))
    cells = [_grid_cells(groups.values[a:b], groups.counts[a:b], GRID.size)
             for a, b in zip(groups.bounds[:-1], groups.bounds[1:])]
    big = _grid_cells(_normal_groups(1, 1000, seed=6).values, None, GRID.size)
    cells.insert(30, big)

    def tables(cells_list):
        lo, hi, _ = zip(*[_bands(*cl, DECILES, c, GRID.size) for cl in cells_list])
        lo, hi = np.array(lo), np.array(hi)
        a, b = lo.min(axis=1), hi.max(axis=1)
        coff = np.concatenate(([0], np.cumsum(b - a)))
        parts = [np.concatenate([cl[t][x:y] for cl, x, y in zip(cells_list, a, b)])
                 for t in (1, 2, 3)]
        n = np.array([cl[4] for cl in cells_list], dtype=np.float64)
        fw = JM._Forward(*parts, coff, n, DECILES, c, lo - a[:, None], hi - a[:, None])
        fw.run()
        return fw

    together = tables(cells)
    alone = tables([big])
    j = DECILES.size - 1
    mine = together.S[j][together.off[j, 30]:together.off[j, 31]]
    assert mine.size and np.array_equal(mine, alone.S[j])


@pytest.mark.parametrize("table", [False, True])
def test_group_search_is_searchsorted_group_by_group(table, monkeypatch):
    """The look-up table and the shifted search both give numpy's per-group indices, for
    queries inside, between and outside each group's half-integer positions."""
    if not table:
        monkeypatch.setattr(B, "_SEARCH_TABLE", 0)
    gen = np.random.default_rng(7)
    groups = []
    for _ in range(50):
        doubled = np.arange(0, 2 * int(gen.integers(1, 60)) + 1)
        groups.append(np.sort(gen.choice(doubled, min(doubled.size, int(gen.integers(1, 20))),
                                         replace=False)) / 2.0)
    pos = np.concatenate(groups)
    coff = np.concatenate(([0], np.cumsum([g.size for g in groups])))
    search = B._GroupSearch(pos, coff)
    assert (search.table is not None) == table
    x = gen.uniform(-3.0, 35.0, (len(groups), 40))
    x[:, :10] = np.round(x[:, :10] * 2.0) / 2.0  # on the half-integers too
    for side in ("left", "right"):
        want = np.array([np.searchsorted(g, row, side=side) for g, row in zip(groups, x)])
        assert np.array_equal(search(x, side), want)
        assert np.array_equal(search(x[:, :, None], side)[:, :, 0], want)
