"""Clamped, sorted, de-duplicated data with multiplicities: the form every baseline works on.

A dataset ``x_1 <= ... <= x_n`` (after clamping to ``[lower, upper]``) is held as its distinct
values ``v_0 < ... < v_{d-1}`` and the cumulative counts ``cum[r] = #{i : x_i <= v_r}``. Repeated
values and integer multiplicities (``counts``) therefore give the same object, so every mechanism
that reads only this object treats ``counts`` exactly like ``np.repeat(values, counts)``.

The grid mechanisms (IndExp, AppIndExp, ApproxQuantiles, via
:mod:`dpq_spark.core.quantiles.single_quantile`) build it from *grid indices* (``Grid.snap`` of the values,
clamped to ``[0, N]``): ``values`` then holds distinct indices as float64, exact below 2**53, and
:meth:`SortedData.restrict` splits on index ranges.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SortedData", "sort_data"]


@dataclass(frozen=True)
class SortedData:
    """Distinct clamped values and their cumulative counts (private data: never log it).

    Attributes
    ----------
    values : numpy.ndarray
        Distinct values, strictly increasing, all in ``[lower, upper]`` (float64, length d).
    cum : numpy.ndarray
        ``cum[r]`` is the number of data points ``<= values[r]`` (int64, length d, increasing).
    """

    values: np.ndarray
    cum: np.ndarray

    @property
    def n(self) -> int:
        """The number of data points (with multiplicity)."""
        return int(self.cum[-1]) if self.cum.size else 0

    @property
    def counts(self) -> np.ndarray:
        """Multiplicity of each distinct value."""
        return np.diff(self.cum, prepend=0)

    def order_statistic(self, k: np.ndarray | int) -> np.ndarray:
        """The ``k``-th smallest point (0-based); ``k`` must lie in ``[0, n)``."""
        return self.values[np.searchsorted(self.cum, np.asarray(k), side="right")]

    def restrict(self, lo: float, hi: float, *, include_hi: bool) -> "SortedData":
        """The points in ``[lo, hi)`` (or ``[lo, hi]`` when ``include_hi``), as a new object."""
        start = np.searchsorted(self.values, lo, side="left")
        stop = np.searchsorted(self.values, hi, side="right" if include_hi else "left")
        counts = self.counts[start:stop]
        return SortedData(self.values[start:stop], np.cumsum(counts, dtype=np.int64))


def sort_data(values: np.ndarray, counts: np.ndarray | None, lower: float, upper: float) -> SortedData:
    """Clamp validated ``values`` to ``[lower, upper]`` and collapse them to distinct values.

    Values whose multiplicity is zero are dropped, so they never split an interval.
    """
    x = np.clip(values, lower, upper)
    if counts is None:
        distinct, mult = np.unique(x, return_counts=True)
        return SortedData(distinct.astype(np.float64), np.cumsum(mult, dtype=np.int64))
    keep = counts > 0
    x, c = x[keep], counts[keep]
    if x.size == 0:
        return SortedData(np.empty(0), np.empty(0, dtype=np.int64))
    order = np.argsort(x, kind="stable")
    xs, cs = x[order], c[order]
    starts = np.concatenate(([0], np.flatnonzero(np.diff(xs) != 0) + 1))
    mult = np.add.reduceat(cs, starts)
    return SortedData(xs[starts].astype(np.float64), np.cumsum(mult, dtype=np.int64))
