"""Smooth sensitivity of an order statistic (Nissim, Raskhodnikova and Smith 2007, Section 3.1).

For clamped data ``x_0 <= ... <= x_{n-1}`` with ``x_{-1} = lower`` and ``x_n = upper``, the
``beta``-smooth sensitivity of the order statistic ``x_k`` under swap neighbours is::

    S = max_{t >= 0} e^{-beta t} max_{0 <= l <= t+1} (x_{k+l} - x_{k+l-t-1})
      = max_{-1 <= i <= k <= j <= n, i < j} e^{-beta (j - i - 1)} (x_j - x_i)

(indices beyond the data read as the bounds). ``log(x_j - x_i) - beta (j - i - 1)`` satisfies the
(inverse) Monge inequality because ``log`` is concave, so the best ``j`` is non-decreasing in
``i`` and a divide-and-conquer search over ``i`` finds the maximum with O(R log R) evaluations,
done here level by level with vectorised numpy.

Two reductions keep R small, both exact:
- with repeated values only the last index of a run can be a best ``i`` and only the first index of
  a run a best ``j`` (the value is the same, the distance shorter), so R is at most the number of
  distinct values; this is also how ``counts`` are handled without expanding them;
- a pair further apart than ``T = (log(upper - lower) - L0) / beta`` cannot beat a known lower
  bound ``L0`` (taken from pairs ``(k - r, k + r)``, r = 1, 2, 4, ...), so only a window around
  ``k`` is searched.

The same S is a beta-smooth upper bound under **add/remove** neighbours too, with the index
``k = floor((n - 1) q)`` recomputed from the private n (and ``x_(-1) = lower`` for empty data).
Let X' be X plus one point at sorted position p, so ``k' = floor(n q)`` is k or k + 1:
- ``S(X) >= LS(X)``: adding or removing a point moves the released order statistic to a value
  between ``x_{k-1}`` and ``x_{k+1}``, and by at most one adjacent gap, which the t = 0 terms cover;
- ``S(X) <= e^beta S(X')``: the best pair (i, j) of X maps to indices of X' holding the same
  values at most one place further apart; when the mapped pair no longer straddles k', replacing
  its end by k' only widens it, and the distance still grows by at most one;
- ``S(X') <= e^beta S(X)``: the best pair (i', j') of X' maps back to indices of X whose values
  lie at least as far apart (``x_{p-1} <= v <= x_p`` for the new point v), one place further apart
  at most; the cases that need an end moved to k (``k = k' - 1`` with ``i' = k' < p``, or ``k = k'``
  with ``j' = k' > p``) exclude each other and the case ``i' = j' = p``.
That is Definition 2.1 of Nissim, Raskhodnikova and Smith (2007), all their noise calibration
needs; tests/core/quantiles/test_smooth_sensitivity.py checks both inequalities on every neighbour of small
datasets, for both relations.
"""

from __future__ import annotations

import math

import numpy as np

from dpq_spark.core.quantiles._sorted_data import SortedData

__all__ = ["log_smooth_sensitivity", "order_statistic_at", "order_statistic_index"]


def order_statistic_index(n: int, q: float) -> int:
    """The 0-based index ``floor((n - 1) q)`` of the order statistic released for quantile ``q``."""
    return int(math.floor((n - 1) * q))


def order_statistic_at(data: SortedData, idx, lower: float, upper: float) -> np.ndarray:
    """Order statistics at 0-based indices; indices below 0 read as ``lower``, from n on as ``upper``."""
    idx = np.asarray(idx, dtype=np.int64)
    out = np.empty(idx.shape, dtype=np.float64)
    inside = (idx >= 0) & (idx < data.n)
    out[idx < 0] = lower
    out[idx >= data.n] = upper
    out[inside] = data.order_statistic(idx[inside])
    return out


def _lower_bound(data: SortedData, k: int, beta: float, lower: float, upper: float) -> float:
    """A lower bound on the log smooth sensitivity from symmetric pairs around ``k``."""
    n = data.n
    r = 2 ** np.arange(0, max(1, int(math.ceil(math.log2(n + 2))) + 1))
    i = np.maximum(k - r, -1)
    j = np.minimum(k + r, n)
    with np.errstate(divide="ignore"):
        g = np.log(order_statistic_at(data, j, lower, upper) - order_statistic_at(data, i, lower, upper)) - beta * (j - i - 1)
    return float(g.max())


def _candidates(data: SortedData, k: int, i_min: int, j_max: int) -> tuple[np.ndarray, np.ndarray]:
    """Candidate left indices (last of each run, < k, >= i_min) and right indices (first of each
    run, > k, <= j_max), plus k itself on both sides and the bound sentinels when in range."""
    last = data.cum - 1
    first = data.cum - data.counts
    left = last[(last < k) & (last >= i_min)]
    right = first[(first > k) & (first <= j_max)]
    i_idx = np.concatenate(([-1] if i_min <= -1 else [], left, [k])).astype(np.int64)
    j_idx = np.concatenate(([k], right, [data.n] if j_max >= data.n else [])).astype(np.int64)
    return i_idx, j_idx


def _monotone_max(i_idx, i_val, j_idx, j_val, beta: float) -> float:
    """max over (i, j) of ``log(j_val - i_val) - beta (j_idx - i_idx - 1)`` (all j >= all i)."""
    best = -np.inf
    ilo = np.array([0])
    ihi = np.array([i_idx.size - 1])
    jlo = np.array([0])
    jhi = np.array([j_idx.size - 1])
    while ilo.size:
        mid = (ilo + ihi) // 2
        lens = jhi - jlo + 1
        starts = np.cumsum(lens) - lens
        pos = np.arange(lens.sum()) - np.repeat(starts, lens) + np.repeat(jlo, lens)
        ii = np.repeat(mid, lens)
        with np.errstate(divide="ignore"):
            g = np.log(j_val[pos] - i_val[ii]) - beta * np.maximum(j_idx[pos] - i_idx[ii] - 1, 0)
        seg_max = np.maximum.reduceat(g, starts)
        best = max(best, float(seg_max.max()))
        hits = np.flatnonzero(g == np.repeat(seg_max, lens))
        jstar = pos[hits[np.searchsorted(hits, starts)]]
        go_right = mid + 1 <= ihi
        go_left = ilo <= mid - 1
        ilo, ihi, jlo, jhi = (
            np.concatenate((mid[go_right] + 1, ilo[go_left])),
            np.concatenate((ihi[go_right], mid[go_left] - 1)),
            np.concatenate((jstar[go_right], jlo[go_left])),
            np.concatenate((jhi[go_right], jstar[go_left])),
        )
    return best


def log_smooth_sensitivity(data: SortedData, k: int, beta: float, lower: float, upper: float) -> float:
    """``log`` of the ``beta``-smooth sensitivity of the order statistic ``x_k`` (swap neighbours).

    Parameters
    ----------
    data : SortedData
        Clamped data (distinct values and cumulative counts), ``n >= 1``.
    k : int
        0-based order-statistic index in ``[0, n)``.
    beta : float
        Smoothing parameter, > 0.
    lower, upper : float
        The public bounds the data were clamped to.

    Returns
    -------
    float
        ``log S``; finite because the pair ``(-1, n)`` always has width ``upper - lower > 0``.
    """
    n = data.n
    bound = _lower_bound(data, k, beta, lower, upper)
    reach = (math.log(upper - lower) - bound) / beta
    span = int(min(reach, 2.0 * n + 2)) + 1
    i_idx, j_idx = _candidates(data, k, k - span - 1, k + span + 1)
    i_val = order_statistic_at(data, i_idx, lower, upper)
    j_val = order_statistic_at(data, j_idx, lower, upper)
    return max(bound, _monotone_max(i_idx, i_val, j_idx, j_val, beta))

