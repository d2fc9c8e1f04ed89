"""ApproxQuantiles on coarse cells: each row at a random sub-cell of its cell, not at one point.

The Spark path of ``dp_quantiles`` hands ApproxQuantiles a group's rows counted per coarse cell
``C = k >> shift`` of the default grid (:mod:`dpq_spark.core.quantiles.coarse_bands`), so that the
release is the same whether or not the group's fine indices fit a worker's memory. Putting every
row of a cell at one representative point makes the cell one block of ties, and ApproxQuantiles
handles ties badly: it splits its data at a drawn point ``v`` into the rows below ``v`` and the
rest, so when a group's rows share one cell (1,000 timestamps within half an hour, bounds of
60 years) the first split leaves one side empty, and that side's quantiles come out uniform
over everything between ``v`` and a bound.

:func:`spread_in_cells` instead sends each row of cell ``C``, independently of every other row,
to a uniform one of the ``2**SUB_CELL_BITS`` equal sub-cells of ``C`` and represents it by that
sub-cell's midpoint grid index (the counts per sub-cell are a multinomial, drawn exactly by
:func:`~dpq_spark.core.randomness.samplers.uniform_split`). A tied block of ``t`` rows becomes up to 16
blocks of about ``t / 16``, so the splits of the recursion fall inside the cell and its
sub-problems keep rows. A row moves by less than one cell (``2**-20`` of the bounds' span on the
default grid), where the cell's middle moved it by half a cell. The grid's last point, the
upper bound, has a cell of its own on the default grid; its rows are spread over the cell below,
as rows at the lower bound are over the first cell. What remains is ApproxQuantiles'
own weakness on concentrated data in wide bounds: a last sub-problem of few rows, next to a wide
empty range, may release into that range. For 1,000 timestamps within 10 minutes in [0, 2e9],
quartiles and 7 quantiles stayed in the cell in 100 of 100 seeded releases, but the outermost of
15 quantiles left it in 89 (ApproxQuantiles on the raw values: in 100).

When it applies: only to a release whose ``auto`` counted its rows publicly (the noisy count
under add/remove, the public n under swap) at most ``SPREAD_MAX_ROWS`` = 2**20
(:func:`spreads`). A group holds at most 16 points per non-empty cell and never more points
than rows, so the spread then costs about what a group of 2**20 cells costs with the cells'
middles. Larger groups, and ApproxQuantiles asked for by name (no public count), keep every row
at its cell's middle: spread over many cells they would otherwise hold up to 16 times as many
points (2**24 for one group, 3 GiB in ApproxQuantiles). For them a cell holding the whole group
needs bounds about a million times wider than the data, but a large block of ties (most rows
on one value) still splits badly: give the column's ``granularity``. The choice depends on the
noisy count, a differentially private output, or under swap on the public n: post-processing.

Privacy: the map is applied to each row on its own, with randomness independent of everything
else, so it costs nothing. For neighbours D and D' that differ in one row, fix the sub-cells of
the shared rows: the two represented data sets are neighbours, so the mechanism's inequality
holds for them; averaging over the independent sub-cell draws keeps it (the argument of
:mod:`dpq_spark.core.randomness.grid` for the jitter of ties). The release keeps the mechanism's
guarantee, neighbouring relation and unit of privacy. Which rows share a cell is never looked at
to decide anything: every cell is spread, whatever its count.

This module uses numpy only (no pyspark, pandas or pyarrow).
"""

from __future__ import annotations

import numpy as np

from dpq_spark.core.randomness.samplers import uniform_split

__all__ = ["SUB_CELL_BITS", "SPREAD_MAX_ROWS", "spreads", "spread_in_cells", "spread_groups"]

#: Each coarse cell is cut into ``2**SUB_CELL_BITS`` = 16 sub-cells: enough for the splits of
#: ApproxQuantiles' recursion over 15 quantiles to stay inside one tied cell, while a group
#: still has at most 16 points per non-empty cell.
SUB_CELL_BITS = 4
#: The largest public row count (auto's) of a group whose rows are spread (module docstring).
SPREAD_MAX_ROWS = 1 << 20


def spreads(name: str, declared: bool, n_used) -> bool:
    """Whether a group's rows go to random sub-cells: ApproxQuantiles on the default grid
    (``declared`` False) with a public row count ``n_used`` (auto's; None when the mechanism was
    named) of at most ``SPREAD_MAX_ROWS``. Public: a function of public quantities only."""
    return bool(spreads_many([name], declared, None if n_used is None else [n_used])[0])


def spreads_many(names, declared: bool, n_used) -> np.ndarray:
    """:func:`spreads` of many groups at once: ``names`` and ``n_used`` (or None) one per group;
    a boolean array."""
    names = np.asarray(names, dtype=object)
    if declared or n_used is None:
        return np.zeros(names.size, dtype=bool)
    # the integer part of the public count, as int() takes it (counts are never negative)
    return (names == "approx_quantiles") & (np.floor(np.asarray(n_used, dtype=np.float64))
                                            <= SPREAD_MAX_ROWS)


def spread_in_cells(cells, counts, steps: int, shift: int, source, bits: int = SUB_CELL_BITS):
    """Each row of coarse cell ``C`` (grid indices ``[2**shift C, 2**shift (C + 1))``) at the
    midpoint grid index of a uniform, independent one of the cell's ``2**bits`` equal sub-cells
    (at most ``steps``, the grid's last index).

    ``cells``: sorted distinct coarse cells; ``counts``: their rows. Returns ``(k, counts)``,
    the sorted distinct grid indices and their rows. Needs ``shift >= bits``. One group of
    :func:`spread_groups`, each cell given by its first grid index."""
    cells = np.asarray(cells, dtype=np.int64)
    k, w, _ = spread_groups(cells << shift, counts, np.array([0, cells.size]), steps, shift,
                            source, bits)
    return k, w


def _below_the_top(cells, steps: int, shift: int):
    """Cells with the top cell ``steps >> shift`` moved one down when it holds the grid's last
    point alone (``steps`` a multiple of ``2**shift``, as on the default grid): rows at the upper
    bound are spread over the last full cell, as rows at the lower bound are over the first."""
    top = steps >> shift
    if top > 0 and steps % (1 << shift) == 0:
        return np.where(cells == top, top - 1, cells)
    return cells


def spread_groups(k, counts, bounds, steps: int, shift: int, source, bits: int = SUB_CELL_BITS):
    """:func:`spread_in_cells` for many groups given by their grid indices: group ``i`` holds the
    sorted distinct indices ``k[bounds[i]:bounds[i + 1]]`` with ``counts``. Every row goes, on
    its own, to a uniform sub-cell of its cell ``k >> shift`` (the distribution of
    :func:`spread_in_cells` on the group's cell counts); returns ``(k, counts, bounds)`` of the
    groups' sorted distinct sub-cell midpoints, in the same order.

    Work per entry: a few array passes, plus a sort of the entries whose cell holds another
    entry of the same group (rows of nearby values), which are few unless the data are."""
    if shift < bits:
        raise ValueError(f"`shift` must be at least `bits` ({bits}), got {shift}")
    k = np.asarray(k, dtype=np.int64)
    bounds = np.asarray(bounds, dtype=np.int64)
    cell = _below_the_top(k >> shift, steps, shift)
    entry, part, w = uniform_split(source, counts, bits)
    width = 1 << (shift - bits)
    out = np.minimum((cell[entry] << shift) + part * width + width // 2, steps)
    first = np.searchsorted(entry, bounds)  # each group's outputs start here
    # Entries that share a cell with a neighbour of their group (and those of a last cell cut
    # short by the grid, whose sub-cells clamp to N) give outputs out of order or equal: sort
    # and merge those.
    shared = cell[1:] == cell[:-1]
    inner = bounds[1:-1]
    shared[inner[(inner > 0) & (inner < k.size)] - 1] = False
    mixed = np.zeros(k.size, dtype=bool)
    mixed[:-1] |= shared
    mixed[1:] |= shared
    mixed |= (cell << shift) + (1 << shift) - 1 > steps
    if not mixed.any():
        return out, w, first
    at = np.flatnonzero(mixed[entry])  # positions of the outputs to sort, in order
    group = np.searchsorted(bounds, entry[at], side="right") - 1
    code = (group << 34) | out[at]  # grid indices < 2**33 on grids up to 2**33 steps
    order = np.argsort(code, kind="stable")
    out[at], w[at] = out[at][order], w[at][order]
    code = code[order]
    dup = np.zeros(out.size, dtype=bool)
    dup[at[1:]] = code[1:] == code[:-1]  # the same (group, index) as the output before it
    if dup.any():
        # positions in `at` are contiguous within a run, so the output before a duplicate
        # is the previous entry of `at`
        keep = ~dup
        starts = np.flatnonzero(keep[at])
        w[at[starts]] = np.add.reduceat(w[at], starts)
        gone = np.concatenate(([0], np.cumsum(dup)))
        out, w, first = out[keep], w[keep], first - gone[first]
    return out, w, first
