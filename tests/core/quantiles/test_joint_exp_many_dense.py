"""The dense path of the batched JointExp sampler (:class:`joint_exp_many._Dense`): groups whose
bands span few cells get their forward tables from linear-space sums on one row per group.

Its tables must equal the flat path's (:class:`joint_exp_many._Forward`) within the float error
the module docstring states (here: 1e-10 on every log weight; the flat and dense numbers differ
by about 1e-13), with the same -inf pattern, for groups of up to 3,000 rows at epsilon 1; a
group's tables must not depend on the other groups of its batch; a group the range guards
refuse must be drawn by the flat path (and one the span guard refuses must not enter the dense
pass at all); and the draws must follow each group's law, with groups interleaved (chi-square
at fixed seeds, rejecting epsilon x0.7 and x1.3).
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from dpq_spark.core.randomness.grid import Grid
from dpq_spark.core.randomness.source import resolve_rng
from test_joint_exp import brute_force, c_of, chi_square_pvalue  # the single-group oracles
from test_joint_exp_many import MANY, MANY_Q, MANY_SIZE, MANY_EPS, _mixed_groups

J = importlib.import_module("dpq_spark.core.quantiles.joint_exp")
JM = importlib.import_module("dpq_spark.core.quantiles.joint_exp_many")

TOL = 1e-10
DECILES = np.arange(1, 10) / 10


def _batch(cells_list, q, c, size):
    """The unfilled forward tables of these groups, and their cells' offsets."""
    G, m = len(cells_list), q.size
    lo, hi = np.empty((G, m), dtype=np.int64), np.empty((G, m), dtype=np.int64)
    for g, cells in enumerate(cells_list):
        lo[g], hi[g], _ = J._bands(*cells, q, c, size)
    a, b = lo.min(axis=1), hi.max(axis=1)
    coff = np.concatenate(([0], np.cumsum(b - a)))
    parts = [np.concatenate([cl[t][x:y] for cl, x, y in zip(cells_list, a, b)]) for t in (1, 2, 3)]
    n = np.array([cl[4] for cl in cells_list], dtype=np.float64)
    return JM._Forward(*parts, coff, n, q, c, lo - a[:, None], hi - a[:, None]), coff


def _tables(cells_list, q, c, size, dense):
    """The forward tables of these groups by one path; (fw, ok)."""
    fw, coff = _batch(cells_list, q, c, size)
    if dense:
        return fw, JM._Dense(fw, coff).run()
    fw.run()
    return fw, np.ones(len(cells_list), dtype=bool)


def _group_tables(fw, g):
    return [getattr(fw, t)[j][fw.off[j, g]:fw.off[j, g + 1]] for j in range(fw.m) for t in ("A", "S")]


def _cases(m, neighboring, eps, gen):
    grid = Grid(-50.0, 50.0)
    q = np.arange(1, m + 1) / (m + 1)
    cells = [J._grid_cells(k, w, grid.size) for k, w in _mixed_groups(grid, gen)]
    cells += [J._grid_cells(grid.snap(gen.normal(0.0, 5.0, n)).astype(np.int64), None, grid.size)
              for n in (100, 100, 300, 1000, 3000)]
    return cells, q, c_of(q, eps, neighboring), grid.size


def _worst_difference(m, neighboring, eps, scale=1.0):
    """Largest |dense - flat| over every finite log weight of the groups the dense path takes
    (inf if the -inf patterns differ), and how many groups it took."""
    cells, q, c, size = _cases(m, neighboring, eps, np.random.default_rng(77))
    flat, _ = _tables(cells, q, c, size, dense=False)
    dense, ok = _tables(cells, q, scale * c, size, dense=True)
    return _difference(flat, dense, ok), int(ok.sum())


def _difference(flat, dense, ok):
    """Largest |dense - flat| over the finite log weights of the groups ``ok`` (inf if the
    -inf patterns differ)."""
    worst = 0.0
    for g in np.flatnonzero(ok):
        for x, y in zip(_group_tables(flat, g), _group_tables(dense, g)):
            if not np.array_equal(np.isfinite(x), np.isfinite(y)):
                return np.inf
            fin = np.isfinite(x)
            if fin.any():
                worst = max(worst, float(np.abs(x[fin] - y[fin]).max()))
        worst = max(worst, float(np.abs(flat.nu[g] - dense.nu[g]).max()))
    return worst


def _normal_groups(sizes, seed):
    """Cells of N(0, 5) groups of these sizes on the grid of [-100, 100] (the benchmark's)."""
    grid = Grid(-100.0, 100.0)
    gen = np.random.default_rng(seed)
    return [J._grid_cells(np.unique(grid.snap(gen.normal(0.0, 5.0, n)).astype(np.int64)), None, grid.size)
            for n in sizes], grid.size


@pytest.mark.parametrize("m", [1, 2, 9])
@pytest.mark.parametrize("neighboring", ["add_remove", "swap"])
@pytest.mark.parametrize("eps", [0.1, 1.0, 10.0])
def test_dense_tables_are_the_flat_ones_within_the_float_bound(m, neighboring, eps):
    """Groups of 0 to 1e3 rows, ties, clamped tails, bands at both ends of the grid: every
    table of every group the dense path accepts is the flat path's within 1e-10."""
    worst, taken = _worst_difference(m, neighboring, eps)
    assert taken >= 6  # the groups of 100 rows at least (at epsilon 10, c n > _DENSE_SPAN above)
    assert worst <= TOL


def test_groups_of_up_to_3000_rows_take_the_dense_path():
    """At epsilon 1 (deciles), groups of 1,300 and 3,000 rows fit the span guard step by step
    (a guard over the whole row refused every group past about 1,150 rows), and their dense
    tables are the flat ones within TOL."""
    cells, size = _normal_groups((1300, 3000, 3000), seed=12)
    c = c_of(DECILES, 1.0)
    flat, _ = _tables(cells, DECILES, c, size, dense=False)
    dense, ok = _tables(cells, DECILES, c, size, dense=True)
    assert ok.all()
    assert _difference(flat, dense, ok) <= TOL


def test_span_guard_refuses_before_the_dense_pass(monkeypatch):
    """A group whose steps do not fit the span guard (1,000 rows at epsilon 10: c t alone is
    278) goes to the flat pass without entering the dense one: every group the dense pass
    gets, it accepts."""
    cells, size = _normal_groups((100, 1000, 100), seed=13)
    c = c_of(DECILES, 10.0)
    lo, hi, _ = J._bands(*cells[1], DECILES, c, size)
    assert hi.max() - lo.min() <= JM._DENSE_WIDTH  # offered to the dense path by its width
    calls = []
    real = JM._Dense.run
    monkeypatch.setattr(JM._Dense, "run", lambda self: calls.append(real(self)) or calls[-1])
    JM._sample_many(cells, DECILES, c, size, resolve_rng(np.random.default_rng(2)))
    assert [ok.tolist() for ok in calls] == [[True, True]]


def test_dense_comparison_has_power():
    """The same comparison fails for a dense pass run at 1.0001 c."""
    worst, _ = _worst_difference(9, "add_remove", 1.0, scale=1.0001)
    assert worst > 100 * TOL


def test_dense_tables_are_the_same_in_any_batch():
    """A group's dense tables are the same bits beside other groups (wider rows, other sizes)
    as alone."""
    cells, q, c, size = _cases(9, "add_remove", 1.0, np.random.default_rng(5))
    together, ok = _tables(cells, q, c, size, dense=True)
    checked = 0
    for g in np.flatnonzero(ok):
        alone, ok_alone = _tables([cells[g]], q, c, size, dense=True)
        assert ok_alone[0]
        for x, y in zip(_group_tables(together, g), _group_tables(alone, 0)):
            assert np.array_equal(x, y), g
        assert np.array_equal(together.nu[g], alone.nu[0])
        checked += 1
    assert checked >= 8


def test_dense_tables_in_chunks_are_the_tables_of_one_pass(monkeypatch):
    """Run in chunks of a few groups (:func:`joint_exp_many._dense_tables`, as a batch larger
    than ``_DENSE_ELEMENTS`` is), every group's tables, scales and guard are the same bits as
    in one dense pass over all of them: each chunk's tables land where the batch's backward
    pass reads that group."""
    cells, q, c, size = _cases(9, "add_remove", 1.0, np.random.default_rng(5))
    cells = cells + cells[::-1]  # groups of different widths on both sides of every cut
    one, ok_one = _tables(cells, q, c, size, dense=True)
    assert ok_one.sum() >= 8 and not ok_one.all()  # refused groups inside chunks, too
    chunked, coff = _batch(cells, q, c, size)
    monkeypatch.setattr(JM, "_DENSE_ELEMENTS", 3 * 9 * 600)  # 1 to about 20 groups a chunk
    ok = JM._dense_tables(chunked, coff)
    np.testing.assert_array_equal(ok, ok_one)
    for g in np.flatnonzero(ok):
        for x, y in zip(_group_tables(chunked, g), _group_tables(one, g)):
            assert np.array_equal(x, y), g
        assert np.array_equal(chunked.nu[g], one.nu[g])


def _bits_of_accepted(fw, ok):
    return [t.view(np.int64).tobytes() for g in np.flatnonzero(ok) for t in _group_tables(fw, g)]


@pytest.mark.parametrize("m, eps, seed", [(9, 1.0, 1), (19, 3.0, 3), (3, 0.3, 2)])
def test_shared_windows_are_each_steps_own_bit_for_bit(monkeypatch, m, eps, seed):
    """The steps whose targets are the same floats share one window table (``_windows``);
    every table of every accepted group equals, bit for bit, the pass that computes each
    step's window on its own columns from its own target. Equally spaced quantiles give
    targets a few ulps apart (deciles of 1,000 rows: 99.99999999999997, 100, 100.00000000000003,
    ...) and ``floor(2 p - 2 t)`` then differs between them, so sharing a table across targets
    that are merely close (the blocks' 40-bit key) changes some windows: that variant fails."""
    cells, q, c, size = _cases(m, "add_remove", eps, np.random.default_rng(seed))
    shared, ok = _tables(cells, q, c, size, dense=True)

    def own(self, j, r0, r1):
        return self._window_pieces(self.fw.targets[:, j - 1], r0, r1)

    monkeypatch.setattr(JM._Dense, "_window", own)
    alone, ok_alone = _tables(cells, q, c, size, dense=True)
    assert np.array_equal(ok, ok_alone) and ok.sum() >= 4
    assert _bits_of_accepted(shared, ok) == _bits_of_accepted(alone, ok)


def test_window_starts_by_search_equal_the_rank_table(monkeypatch):
    """Rows with many ties find their window starts by one search instead of a table of their
    ranks: the same tables, bit for bit."""
    cells, q, c, size = _cases(9, "swap", 1.0, np.random.default_rng(8))
    table, ok = _tables(cells, q, c, size, dense=True)
    monkeypatch.setattr(JM, "_RANK_TABLE", 0)
    search, ok_search = _tables(cells, q, c, size, dense=True)
    assert np.array_equal(ok, ok_search)
    for g in np.flatnonzero(ok):
        for x, y in zip(_group_tables(table, g), _group_tables(search, g)):
            assert np.array_equal(x, y)


def test_refused_groups_are_drawn_by_the_flat_path(monkeypatch):
    """With range guards that refuse every group, the draws are seed for seed those of the
    flat path alone (the dense pass draws nothing for them)."""
    cells, q, c, size = _cases(9, "add_remove", 1.0, np.random.default_rng(9))
    rows = np.tile(np.arange(len(cells)), 3)

    def draws():
        return JM._sample_many(cells, q, c, size, resolve_rng(np.random.default_rng(4)), rows=rows)

    monkeypatch.setattr(JM, "_DENSE_WIDTH", 0)
    flat = draws()
    monkeypatch.setattr(JM, "_DENSE_WIDTH", 1 << 20)
    monkeypatch.setattr(JM, "_MIN_SOURCE", 2.0)  # no source can be that large
    refused = draws()
    np.testing.assert_array_equal(flat, refused)
    monkeypatch.undo()  # power: accepted, the dense groups are drawn first (another order)
    assert not np.array_equal(draws(), flat)


def test_small_grid_groups_take_the_dense_path(monkeypatch):
    """The brute-force law tests of test_joint_exp_many run on the dense path (every group
    accepted), so they test its law."""
    calls = []
    real = JM._Dense.run
    monkeypatch.setattr(JM._Dense, "run", lambda self: calls.append(real(self)) or calls[-1])
    names = list(MANY)
    cells = [J._grid_cells(np.asarray(MANY[k], dtype=np.int64), None, MANY_SIZE) for k in names]
    JM._sample_many(cells, np.asarray(MANY_Q), c_of(MANY_Q, MANY_EPS), MANY_SIZE,
                    resolve_rng(np.random.default_rng(1)))
    assert len(calls) == 1 and calls[0].all()


@pytest.mark.parametrize("chunks", [False, True])
def test_dense_groups_follow_their_exact_law_with_refused_ones_beside(monkeypatch, chunks):
    """Tiny groups on a grid of 9 points against brute force, interleaved, with a large-epsilon
    group whose span the dense guard refuses in the same call (so both paths run); ``chunks``:
    each group's dense pass a chunk of its own, all rows drawn together."""
    if chunks:
        monkeypatch.setattr(JM, "_DENSE_ELEMENTS", 1)
    c = c_of(MANY_Q, MANY_EPS)
    names = ["distinct", "ties", "on_the_bounds", "all_equal"]
    cells = [J._grid_cells(np.asarray(MANY[k], dtype=np.int64), None, MANY_SIZE) for k in names]
    rows = np.tile(np.arange(len(names)), 6000)
    out = JM._sample_many(cells, np.asarray(MANY_Q), c, MANY_SIZE,
                          resolve_rng(np.random.default_rng(41)), rows=rows)
    for g, name in enumerate(names):
        assert chi_square_pvalue(out[rows == g], brute_force(MANY[name], MANY_SIZE, MANY_Q, c)) > 1e-3, name
    assert chi_square_pvalue(out[rows == 0], brute_force(MANY["on_the_bounds"], MANY_SIZE, MANY_Q, c)) < 1e-6


def _median_law_pvalue(rows, factor, seed):
    """Chi-square p-value of the binned median rank of three groups of ``rows`` rows drawn
    together (interleaved, dense path, at ``factor`` times c) against draws of the flat path."""
    grid = Grid(-100.0, 100.0)
    gen = np.random.default_rng(rows)
    data = [np.unique(grid.snap(gen.normal(0.0, 5.0, rows)).astype(np.int64)) for _ in range(3)]
    cells = [J._grid_cells(k, None, grid.size) for k in data]
    c = c_of(DECILES, 1.0)
    draws = max(1000, 300_000 // rows)
    order = np.tile(np.arange(3), draws)
    for cl in cells:  # every group on the dense path
        lo, hi, _ = J._bands(*cl, DECILES, c, grid.size)
        assert hi.max() - lo.min() <= JM._DENSE_WIDTH
    dense = JM._sample_many(cells, DECILES, factor * c, grid.size,
                            resolve_rng(np.random.default_rng(seed)), rows=order)
    saved = JM._DENSE_WIDTH
    JM._DENSE_WIDTH = 0
    try:
        flat = JM._sample_many(cells, DECILES, c, grid.size,
                               resolve_rng(np.random.default_rng(seed + 1)), rows=order)
    finally:
        JM._DENSE_WIDTH = saved
    worst = 1.0
    for g in range(3):
        ours = np.searchsorted(data[g], dense[order == g, 4]) // 5
        theirs = np.searchsorted(data[g], flat[order == g, 4]) // 5
        bins = np.arange(max(ours.max(), theirs.max()) + 2)
        table = np.array([np.histogram(ours, bins)[0], np.histogram(theirs, bins)[0]])
        worst = min(worst, chi2_contingency(table[:, table.sum(axis=0) >= 10]).pvalue)
    return worst


@pytest.mark.parametrize("rows", [100, 600])
def test_dense_groups_have_the_flat_law(rows):
    assert _median_law_pvalue(rows, 1.0, seed=3) > 1e-3 / 3


@pytest.mark.parametrize("rows", [100, 600])
@pytest.mark.parametrize("factor", [0.7, 1.3])
def test_dense_law_test_has_power(rows, factor):
    assert _median_law_pvalue(rows, factor, seed=5) < 1e-3


@pytest.mark.parametrize("shape", [(1, 1), (1, 300), (75, 3), (75, 130), (300, 1000)])
def test_block_sums_are_cumulative_sums_bit_for_bit(monkeypatch, shape):
    """The in-block prefix and suffix sums (:func:`joint_exp_many._cumulate`), by whole rows or
    by ``cumsum``, are ``np.cumsum``'s numbers down and up the columns."""
    v = np.random.default_rng(shape[0] * shape[1]).lognormal(0.0, 30.0, shape)
    want = np.cumsum(v, axis=0), np.cumsum(v[::-1], axis=0)[::-1]
    for row in (0, 1 << 30):  # rows always, never
        monkeypatch.setattr(JM, "_CUMULATE_ROW", row)
        pre, suf = v.copy(), v.copy()
        JM._cumulate(pre, suf)
        assert np.array_equal(pre, want[0]) and np.array_equal(suf, want[1])
