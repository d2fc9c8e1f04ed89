"""The batched JointExp sampler (:mod:`dpq_spark.core.quantiles.joint_exp_many`): for each group, the
same forward tables as in a batch of one, bit for bit, and the exact law of the group alone."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.core.randomness.grid import Grid
from dpq_spark.core.quantiles.joint_exp_envelope import Bands
from test_joint_exp import brute_force, c_of, chi_square_pvalue  # the single-group oracles

J = importlib.import_module("dpq_spark.core.quantiles.joint_exp")
JM = importlib.import_module("dpq_spark.core.quantiles.joint_exp_many")


def _mixed_groups(grid, gen):
    """Grid indices and counts of groups of 0, 1, 2, 50, 1e3 and 1e4 rows, with ties (counts
    above 1 and repeated indices) and data at both ends of the grid (bands touching the ends)."""
    groups = []
    for n in (0, 1, 2, 50, 1000, 10_000):
        k = grid.snap(gen.normal(0.0, 5.0, n)).astype(np.int64)
        groups.append((k, None))
    k = grid.snap(np.round(gen.normal(0.0, 5.0, 3000))).astype(np.int64)  # heavy ties
    groups.append((k, gen.integers(0, 4, k.size)))
    k = np.concatenate(([0, 0, 0], grid.snap(gen.normal(0.0, 30.0, 200)).astype(np.int64), [grid.steps] * 4))
    groups.append((k, None))  # clamped tails: point cells at both ends
    groups.append((np.array([0, grid.steps]), np.array([5, 7])))
    return groups


def _forward(cells_list, q, c, size):
    G, m = len(cells_list), q.size
    lo, hi = np.empty((G, m), dtype=np.int64), np.empty((G, m), dtype=np.int64)
    for g, cells in enumerate(cells_list):
        lo[g], hi[g], _ = J._bands(*cells, q, c, size)
    coff = np.concatenate(([0], np.cumsum([cells[1].size for cells in cells_list])))
    fw = JM._Forward(*(np.concatenate([cells[i] for cells in cells_list]) for i in (1, 2, 3)), coff,
                    [cells[4] for cells in cells_list], q, c, lo, hi)
    fw.run()
    return fw


def _mismatches(m, neighboring):
    """Compare every table of a batched forward pass (A, prefix maxima, run sums, scales, cells)
    on 27 mixed groups, restricted to one group, with that group's tables computed alone;
    returns the (group, step, table) that differ in any bit."""
    grid = Grid(-50.0, 50.0)
    q = np.arange(1, m + 1) / (m + 1)
    c = c_of(q, 1.0, neighboring)
    gen = np.random.default_rng(77)
    cells_list = [J._grid_cells(k, w, grid.size) for _ in range(3) for k, w in _mixed_groups(grid, gen)]
    batch = _forward(cells_list, q, c, grid.size)
    bad = []
    for g, cells in enumerate(cells_list):
        alone = _forward([cells], q, c, grid.size)
        if not np.array_equal(batch.nu[g], alone.nu[0]):
            bad.append((g, None, "nu"))
        for j in range(m):
            part = slice(batch.off[j, g], batch.off[j, g + 1])
            for table in ("A", "S"):
                if not np.array_equal(getattr(batch, table)[j][part], getattr(alone, table)[j]):
                    bad.append((g, j, table))
            if not np.array_equal(batch.cells(j + 1)[part] - batch.first[g, j], alone.cells(j + 1) - alone.first[0, j]):
                bad.append((g, j, "cells"))
    return bad


@pytest.mark.parametrize("m", [1, 2, 9])
@pytest.mark.parametrize("neighboring", ["add_remove", "swap"])
def test_batched_forward_tables_equal_each_group_alone(m, neighboring):
    """Restricted to one group, every table of the batched forward pass is bit for bit the
    group's table computed in a batch of one: groups of 0 to 1e4 rows,
    ties, bands touching both ends of the grid."""
    assert _mismatches(m, neighboring) == []


def test_batched_forward_comparison_has_power(monkeypatch):
    """The same comparison fails when the scans pick their layout from the whole batch (the
    default of :mod:`dpq_spark.core.quantiles._logscan`): a group's numbers then depend on the others."""
    from dpq_spark.core.quantiles import _logscan as L

    def whole_batch_layout(z_plus, z_minus, starts):
        return (L.segmented_logcumsumexp(z_plus, starts), L.segmented_logcumsumexp(z_minus, starts),
                L.segmented_logcumsumexp_reverse(z_minus, starts))

    monkeypatch.setattr(JM, "segmented_scans", whole_batch_layout)
    assert len(_mismatches(9, "add_remove")) > 0


# groups sharing q, epsilon and the grid (grid indices, counts): ties, ends, empty, n = 1
MANY_Q, MANY_SIZE, MANY_EPS = [0.25, 0.5, 0.75], 9, 3.0
MANY = {
    "distinct": [1, 4, 6, 7],
    "ties": [2, 2, 5, 5, 5],
    "on_the_bounds": [0, 0, 3, 8, 5],
    "empty": [],
    "one": [4],
    "all_equal": [3, 3, 3],
}
MANY_DRAWS = 6000


def _many_draws(c, seed):
    """MANY_DRAWS draws of every MANY group, interleaved in one call of _sample_many."""
    names = list(MANY)
    cells = [J._grid_cells(np.asarray(MANY[k], dtype=np.int64), None, MANY_SIZE) for k in names]
    rows = np.tile(np.arange(len(names)), MANY_DRAWS)
    out = JM._sample_many(cells, np.asarray(MANY_Q), c, MANY_SIZE, resolve_rng(np.random.default_rng(seed)), rows=rows)
    return {k: out[rows == g] for g, k in enumerate(names)}


@pytest.mark.parametrize("neighboring", ["add_remove", "swap"])
def test_batched_groups_each_follow_their_own_exact_law(neighboring):
    c = c_of(MANY_Q, MANY_EPS, neighboring)
    draws = _many_draws(c, seed=21)
    for name, idx in MANY.items():
        assert chi_square_pvalue(draws[name], brute_force(idx, MANY_SIZE, MANY_Q, c)) > 1e-3, name


def test_batched_law_test_has_power():
    """The same check rejects one group's draws judged by another group's law, and draws made
    at 1.3 epsilon."""
    c = c_of(MANY_Q, MANY_EPS)
    draws = _many_draws(c, seed=22)
    assert chi_square_pvalue(draws["distinct"], brute_force(MANY["on_the_bounds"], MANY_SIZE, MANY_Q, c)) < 1e-6
    assert chi_square_pvalue(draws["ties"], brute_force(MANY["all_equal"], MANY_SIZE, MANY_Q, c)) < 1e-6
    wrong = _many_draws(1.3 * c, seed=23)
    for name in ("distinct", "ties", "on_the_bounds"):
        assert chi_square_pvalue(wrong[name], brute_force(MANY[name], MANY_SIZE, MANY_Q, c)) < 1e-6, name


@pytest.mark.parametrize("cap", [1, 40])
def test_batches_of_bounded_size_keep_each_group_law(monkeypatch, cap):
    """With the forward pass split into batches of at most ``cap`` band cells (1: every group
    alone; 40: a few together), interleaved rows still get their own group's law."""
    monkeypatch.setattr(JM, "_BATCH_CELLS", cap)
    c = c_of(MANY_Q, MANY_EPS)
    draws = _many_draws(c, seed=31)
    for name, idx in MANY.items():
        assert chi_square_pvalue(draws[name], brute_force(idx, MANY_SIZE, MANY_Q, c)) > 1e-3, name
    # power: the same draws judged by a neighbouring group's law fail
    assert chi_square_pvalue(draws["distinct"], brute_force(MANY["on_the_bounds"], MANY_SIZE, MANY_Q, c)) < 1e-6


#: what a worker may spend on JointExp's batches: the cells a caller holds (CELLS_HELD, four
#: 8-byte arrays) plus the sampler's peak on them, in bytes (128 MiB until the dense pass kept
#: only each step's columns, 2 December 2026: 112 MiB of 100-row groups, now 78 MiB)
_WORKING_MEMORY = 100 << 20


def _held_and_peak(rows: int) -> int:
    """The bytes of CELLS_HELD cells of groups of ``rows`` N(0, 5) rows (deciles, epsilon 1,
    bounds +-100, with their bands, as batch.py builds them for ``_sample_many``) plus
    tracemalloc's peak of one ``_sample_many`` call on them."""
    import tracemalloc

    grid = Grid(-100.0, 100.0)
    gen = np.random.default_rng(5)
    q = np.arange(1, 10) / 10
    c = c_of(q, 1.0)
    cells, held = [], 0
    while held < JM.CELLS_HELD:
        k = np.unique(grid.snap(gen.normal(0.0, 5.0, rows)).astype(np.int64))
        cells.append(J._grid_cells(k, None, grid.size))
        held += cells[-1][1].size
    bands = Bands.stack([J._band_set(cl[0], cl[3], cl[4], q, c, *J._bands(*cl, q, c, grid.size))
                         for cl in cells])
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        JM._sample_many(cells, q, c, grid.size, resolve_rng(np.random.default_rng(1)),
                        bands=bands)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    return 32 * held + peak


def test_working_memory_of_many_groups_is_bounded():
    """CELLS_HELD cells of 100-row groups (the dense path, thousands of groups) and their
    sampling fit in _WORKING_MEMORY (about 78 MiB; 112 MiB before the dense pass worked on each
    step's columns only, when a worker's peak RSS stayed near 350 MiB,
    benchmarks/bench_worker_memory.py)."""
    assert _held_and_peak(100) < _WORKING_MEMORY


def test_working_memory_check_has_power(monkeypatch):
    """The same check fails with the former CELLS_HELD, 2**21 (about 127 MiB; 190 MiB with the
    dense tables of every step kept padded, when worker peaks were near 560 MiB)."""
    monkeypatch.setattr(JM, "CELLS_HELD", 1 << 21)
    assert _held_and_peak(100) > _WORKING_MEMORY
