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
blocks of about ``t / 16``, so the splits of a recursion of up to 15 quantiles fall inside the
cell and every released quantile of that block lies in its cell (within ``2**-20`` of the
bounds' span on the default grid). A row moves by less than one cell, as before (half a cell).

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

__all__ = ["SUB_CELL_BITS", "spread_in_cells"]

#: Each coarse cell is cut into ``2**SUB_CELL_BITS`` = 16 sub-cells: enough for the splits of
#: ApproxQuantiles' recursion over 15 quantiles to stay inside one tied cell, while a group
#: still has at most 16 points per non-empty cell.
SUB_CELL_BITS = 4


def spread_in_cells(cells, counts, steps: int, shift: int, source, bits: int = SUB_CELL_BITS,
                    groups=None):
    """Each row of coarse cell ``C`` (grid indices ``[2**shift C, 2**shift (C + 1))``) at the
    midpoint grid index of a uniform, independent one of the cell's ``2**bits`` equal sub-cells
    (at most ``steps``, the grid's last index).

    ``cells``: sorted distinct coarse cells, or with ``groups`` (each entry's group, sorted) sorted
    within each group; ``counts``: their rows. Returns ``(k, counts)``, the sorted distinct grid
    indices and their rows, or with ``groups`` ``(group, k, counts)`` sorted by group then ``k``.
    Needs ``shift >= bits``. Draws ``sum(counts) / 16 + 15 len(cells)`` random words or fewer."""
    if shift < bits:
        raise ValueError(f"`shift` must be at least `bits` ({bits}), got {shift}")
    cells = np.asarray(cells, dtype=np.int64)
    entry, part, w = uniform_split(source, counts, bits)
    width = 1 << (shift - bits)
    k = np.minimum((cells[entry] << shift) + part * width + width // 2, steps)
    # The cell N >> shift holds k = N alone: its sub-cells all clamp to N, so merge equal k.
    g = None if groups is None else np.asarray(groups, dtype=np.int64)[entry]
    same = (k[1:] == k[:-1]) if g is None else (k[1:] == k[:-1]) & (g[1:] == g[:-1])
    if same.any():
        starts = np.flatnonzero(np.r_[True, ~same])
        k, w = k[starts], np.add.reduceat(w, starts)
        g = None if g is None else g[starts]
    return (k, w) if g is None else (g, k, w)
