"""The single-quantile exponential mechanism (Smith 2011) on a public grid, shared by IndExp,
AppIndExp and ApproxQuantiles.

The data are clamped to ``[lower, upper]`` and snapped to the public grid
(:class:`~dpq_spark.core.randomness.grid.Grid`); the output is a grid point k, drawn with probability
proportional to ``exp(-c |rho(k) - q n|)``, ``c = epsilon / (2 Delta)``, where ``rho`` is the
mid-rank ``#{x < k} + (t + 1) / 2`` if t >= 1 points sit on k (``#{x < k}`` if none do), the
convention of :mod:`dpq_spark.core.quantiles.joint_exp`. So a quantile inside the middle half of a block of
tied values is released as that value. When ``granularity`` is given (a declared resolution), the
records are first jittered, each independently, to uniform points of their own cell on the fine
grid of :class:`~dpq_spark.core.randomness.grid.Grid` (``Grid.fine_indices``), the mechanism runs on the
fine grid and the output is rounded back (``Grid.release``): a quantile anywhere inside a tie
block, edges included, is then released as the tied value. The jitter costs no privacy
(:mod:`dpq_spark.core.randomness.grid`, "Privacy of the jitter"); IndExp and ApproxQuantiles share it.
Without ``granularity`` the records are split instead, each to a uniform one of the 256 fine
points of its own default-grid point (``Grid.tie_bits``;
:func:`~dpq_spark.core.randomness.grid.split_ties`), with the same effect on ties and the same
privacy argument; a block of t tied rows holds at most ``min(t, 256)`` entries. Sensitivity: adding a point moves ``rho`` by an amount in [0, 1] and
``q n`` by q, so the utility moves by at most ``max(q, 1 - q)``; a swap (n fixed) moves ``rho`` by
at most 1 (Delta = 1), as for the continuous mechanism.

Sampling, exactly: grid points of equal mid-rank form *cells* (the gap before the first data
point, each data point, each gap after one); a cell of w points has weight
``w exp(-c |rho - q n|)``; the cell is drawn with :func:`~dpq_spark.core.randomness.grid.draw_index` (exactly
proportional to the float64 weights) and the point within it with an exact uniform integer draw.
The guarantee as implemented is that of :mod:`dpq_spark.core.quantiles.joint_exp` with m = 1.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.core.quantiles._sorted_data import SortedData, sort_data
from dpq_spark.core._validation import (
    check_bounds,
    check_counts,
    check_epsilon,
    check_quantiles,
    check_values,
)
from dpq_spark.core.errors import DPQValueError
from dpq_spark.core.quantiles.coarse_bands import mechanism_band
from dpq_spark.core.randomness.grid import Grid, draw_index
from dpq_spark.core.accounting.neighboring import NeighboringRelation, single_quantile_sensitivity

__all__ = ["single_quantile", "GridCells", "sample_grid_index"]


@dataclass(frozen=True)
class GridCells:
    """Runs of grid points ``first .. stop - 1`` of equal mid-rank, for data on those points.

    Cell ``r`` is the points ``start[r] .. start[r] + width[r] - 1``, all of mid-rank ``rank[r]``
    (half-integers, strictly increasing). Built once per dataset and reused for every quantile.
    """

    start: np.ndarray
    width: np.ndarray
    rank: np.ndarray
    n: int

    @classmethod
    def of(cls, data: SortedData, first: int, stop: int) -> "GridCells":
        """Cells of ``data`` (grid indices, all in ``[first, stop)``) on points ``first..stop-1``."""
        d = data.values.astype(np.int64)
        mult = data.counts.astype(np.int64)
        if d.size == 0:
            return cls(np.array([first]), np.array([stop - first]), np.zeros(1), 0)
        below = data.cum - mult
        nxt = np.append(d[1:], stop)
        single = mult == 1
        w_main = np.where(single, nxt - d, 1)
        w_gap = np.where(single, 0, nxt - d - 1)
        widths = np.concatenate(([d[0] - first], np.column_stack((w_main, w_gap)).ravel()))
        starts = np.concatenate(([first], np.column_stack((d, d + 1)).ravel()))
        ranks = np.concatenate(
            ([0.0], np.column_stack((below + (mult + 1) / 2.0, (below + mult).astype(float))).ravel())
        )
        keep = widths > 0
        return cls(starts[keep], widths[keep], ranks[keep], data.n)

    def log_weights(self, q: float, scale: float) -> np.ndarray:
        """Unnormalised log-weights ``log(width) - scale |rank - q n|``, ``scale = eps / (2 Delta)``."""
        return np.log(self.width.astype(np.float64)) - scale * np.abs(self.rank - q * self.n)

    def sample(self, q: float, epsilon: float, sensitivity: float, source) -> int:
        """One draw of the exponential mechanism for quantile ``q``: a grid index."""
        r = draw_index(self.log_weights(q, epsilon / (2.0 * sensitivity)), source)
        return int(self.start[r]) + source.below(int(self.width[r]))


def sample_grid_index(
    data: SortedData,
    first: int,
    last: int,
    q: float,
    epsilon: float,
    sensitivity: float,
    source,
) -> int:
    """One draw of the exponential mechanism for quantile ``q`` on grid points ``first..last``
    (validated inputs; ``data`` holds grid indices in that range).

    ``epsilon`` is the budget of this one draw; ``sensitivity`` is that of its utility on the
    neighbouring relation the caller protects.
    """
    return GridCells.of(data, first, last + 1).sample(q, epsilon, sensitivity, source)


def single_quantile(
    values,
    quantile: float,
    *,
    epsilon: float,
    lower: float,
    upper: float,
    neighboring: str | NeighboringRelation = "add_remove",
    counts=None,
    granularity: float | None = None,
    rng: np.random.Generator | None = None,
) -> float:
    """Estimate one quantile with the exponential mechanism of Smith (2011).

    Parameters
    ----------
    values : array_like of float
        The private data, 1-d. Values outside ``[lower, upper]`` are clamped; NaN is an error.
    quantile : float
        The quantile to estimate, in (0, 1).
    epsilon : float
        Privacy budget, finite and > 0.
    lower, upper : float
        Public bounds with ``lower < upper``, chosen without looking at the data.
    neighboring : {"add_remove", "swap"} or NeighboringRelation, default "add_remove"
        Which datasets are neighbours.
    counts : array_like of int, optional
        Multiplicity of each entry of ``values``; same distribution as ``np.repeat(values, counts)``.
    granularity : float, optional
        Step of the public output grid; default ``(upper - lower) / 2**32`` (see
        :class:`~dpq_spark.core.randomness.grid.Grid`; extra error at most half a step). Giving it declares
        the data's resolution: ties are jittered inside their grid cell (module docstring), at a
        cost of O(sum of counts) when ``counts`` is given. Without it ties are split over the
        default grid's fine points (module docstring), at a cost of
        O(min(sum of counts, 256 len(values))).
    rng : numpy.random.Generator, optional
        Source of randomness; ``None`` draws fresh OS entropy.

    Returns
    -------
    float
        The estimate, a grid value in ``[lower, upper]``.

    Raises
    ------
    ValueError
        If an argument breaks its rule (the message names it).
    TypeError
        If an argument has the wrong type.

    Notes
    -----
    Grid point k is released with probability proportional to
    ``exp(-epsilon |rho(k) - q n| / (2 Delta))`` (``rho`` the mid-rank, module docstring) with
    ``Delta = 1`` (swap) or ``max(q, 1 - q)`` (add/remove). Runtime O(n log n) for the sort, O(n)
    for the draw.

    Privacy
    -------
    ``epsilon``-differential privacy (pure) for the chosen neighbouring relation, one row being the
    unit of privacy (one unit of multiplicity when ``counts`` is given). Assumes ``lower``,
    ``upper``, ``granularity`` and ``quantile`` are chosen without looking at the data. As
    implemented (float64 weights, exact draws): ``(epsilon + eta, delta)``-DP with ``eta`` and
    ``delta`` of :mod:`dpq_spark.core.quantiles.joint_exp` for m = 1. With ``granularity`` given, the
    per-row jitter keeps this guarantee, relation and unit (it would even if the jitter were
    public; :mod:`dpq_spark.core.randomness.grid`), and the rounding is post-processing; so does
    the default grid's split of ties.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=1000)
    >>> m = single_quantile(x, 0.5, epsilon=1.0, lower=-10, upper=10, rng=np.random.default_rng(1))
    >>> abs(m) < 1
    True
    """
    eps = check_epsilon(epsilon)
    lo, hi = check_bounds(lower, upper)
    if np.ndim(quantile) != 0:
        raise DPQValueError(f"`quantile` must be a single number, got shape {np.shape(quantile)}")
    q = float(check_quantiles(quantile, name="quantile")[0])
    relation = NeighboringRelation.parse(neighboring)
    x = check_values(values)
    c = None if counts is None else check_counts(counts, x.size)
    grid = Grid(lo, hi, granularity)
    source = resolve_rng(rng)
    # past SPLIT_MAX_ENTRIES only the grid points its band reaches are split (IndExp, m = 1)
    f, f_counts = grid.fine_indices(x, c, source, band=functools.partial(
        mechanism_band, "ind_exp", quantiles=[q], epsilon=eps, neighboring=relation,
        steps=grid.fine_size - 1, shift=grid.tie_bits))
    data = sort_data(f, f_counts, 0, grid.fine_size - 1)
    k = sample_grid_index(data, 0, grid.fine_size - 1, q, eps, single_quantile_sensitivity(q, relation), source)
    return float(grid.release(k))
