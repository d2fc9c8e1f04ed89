"""ApproxQuantiles on coarse cells with random sub-cells: the representation, and the error it
fixes (a group whose rows share one coarse cell)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from dpq_spark.core.quantiles import coarse_spread
from dpq_spark.core.quantiles.batch import FlatGroups, release_many
from dpq_spark.core.quantiles.coarse_bands import COARSE_SHIFT, FINE_STEPS
from dpq_spark.core.quantiles.coarse_spread import spread_in_cells
from dpq_spark.core.randomness.grid import Grid
from dpq_spark.core.randomness.source import resolve_rng

N = FINE_STEPS
QUARTILES = np.array([0.25, 0.5, 0.75])


def test_rows_stay_in_their_cell_at_sub_cell_midpoints():
    cells = np.array([0, 5, 900, N >> COARSE_SHIFT])  # the last cell holds k = N alone
    counts = np.array([1, 40, 100_000, 7])
    k, w = spread_in_cells(cells, counts, N, COARSE_SHIFT, resolve_rng(np.random.default_rng(1)))
    assert np.all(np.diff(k) > 0) and w.sum() == counts.sum()
    cell = k >> COARSE_SHIFT
    assert np.array_equal(np.bincount(np.searchsorted(cells, cell), weights=w), counts)
    inside = k[cell < cells[-1]] & 4095
    assert np.all(inside % 256 == 128)  # 16 sub-cells of 256 grid points, at their midpoints
    assert np.sum(cell == 900) == 16 and k[-1] == N and w[-1] == 7  # the top cell: k = N


def test_groups_are_spread_each_in_their_own_cells():
    groups = np.array([0, 0, 1, 2])
    cells = np.array([3, 4, 3, 0])
    g, k, w = spread_in_cells(cells, [50, 1, 50, 2], N, COARSE_SHIFT,
                              resolve_rng(np.random.default_rng(2)), groups=groups)
    assert np.all(np.diff(g * (N + 1) + k) > 0)
    for group, cell, count in zip(groups, cells, [50, 1, 50, 2]):
        here = (g == group) & ((k >> COARSE_SHIFT) == cell)
        assert w[here].sum() == count
    with pytest.raises(ValueError, match="`shift`"):
        spread_in_cells(cells, [1, 1, 1, 1], N, 2, resolve_rng(np.random.default_rng(2)))


def _one_cell_quartiles(reps=20):
    """Quartiles of 1,000 values inside one coarse cell (10 minutes of a 60-year span), by
    ApproxQuantiles on coarse cells, as the Spark path feeds it."""
    grid = Grid(0.0, 2e9)
    left = grid.value(np.array([891_000 << COARSE_SHIFT]))[0]
    x = left + np.random.default_rng(0).uniform(0, 600, 1000)
    k, c = np.unique(grid.snap(x), return_counts=True)
    errors = []
    for r in range(reps):
        out = release_many(FlatGroups(k, c, np.array([0, k.size])), QUARTILES, epsilon=1.0,
                           lower=0.0, upper=2e9, mechanism="approx_quantiles",
                           grid_indices=True, coarse_cells=True, rng=np.random.default_rng(r))
        errors.append(np.abs(out.values[0] - np.quantile(x, QUARTILES)).max())
    return np.array(errors)


def test_quartiles_of_one_cell_stay_in_the_cell(monkeypatch):
    """Every quartile lands within a cell width (about 1,900 of 2e9) of the true one; with one
    sub-cell (each cell at one point, what this replaced) the first split leaves a side empty
    and errors reach hundreds of millions."""
    width = 2e9 / 2**20
    assert np.all(_one_cell_quartiles() < width)
    from dpq_spark.core.quantiles import batch

    monkeypatch.setattr(batch, "spread_in_cells",
                        functools.partial(coarse_spread.spread_in_cells, bits=0))
    assert np.max(_one_cell_quartiles()) > 1e6
