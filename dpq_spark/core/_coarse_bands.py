"""Which coarse cells JointExp can reach: the band bound computed from coarse counts only.

The Spark path of ``dp_quantiles`` gives JointExp each group's data on the *fine grid*: the
``N + 1 = 2**32 + 1`` points ``v(k) = lower + k g`` with ``g = (upper - lower) / 2**32``, a value
``x`` (clamped to the bounds) going to ``k = clip(floor((x - lower) / g + 0.5), 0, N)``
(:func:`fine_index`). Holding every distinct fine index of a large group would cost memory that
grows with its rows, so the data travels in two passes:

1. counts per *coarse cell* ``C(k) = min(k >> 12, 2**20 - 1)`` (4,096 fine points each; the last
   one also holds ``k = N``);
2. fine indices with counts, only for the coarse cells that :func:`reachable` keeps.

The mechanism then runs on the *represented* data ``Y``: the fine data ``X`` in kept cells, and
all points of a pruned cell moved to the cell's left edge ``v(4096 C)``. Memory per group is at
most 2**20 coarse counts plus 4,096 fine counts per kept cell, whatever its number of rows.

What is sampled, and why it is (to 2**-60) the distribution on ``X``
--------------------------------------------------------------------
Write ``r_X(o) = #{x in X : x < o}``. JointExp's density over sorted outputs ``o_1 <= ... <= o_m``
in ``[a, b]`` is ``exp(c u_X(o)) / Z_X`` with ``u_X(o) = -sum_j |r_X(o_j) - r_X(o_{j-1}) - t_j|``
(``r(o_0) = 0``, ``r(o_{m+1}) = n``), ``c = eps / (2 Delta)``, targets ``t_j`` and cumulative
targets ``P_j = q_j n``. Let ``S_C = [v(4096 C), v(4096 (C + 1)))`` be the span of coarse cell C
(the last span is closed at ``b``); every point of C lies in ``S_C``.

(a) *Rank ranges are known from coarse counts and are the same for X and Y.* For ``o`` inside
    ``S_C`` (and not a data point, a null set), every point of an earlier cell is below ``o`` and
    every point of a later cell above it, so ``r(o)`` is in ``[lo_C, hi_C]`` with
    ``lo_C = #points in cells < C`` and ``hi_C = lo_C + count_C``, for ``X`` and for ``Y``
    alike: ``Y`` moves points only inside their own cell.
(b) *Outside the pruned spans the two utilities are equal.* Moving points inside ``S_C``
    changes ``r(o)`` only for ``o`` inside ``S_C``. So ``u_X(o) = u_Y(o)`` on the event ``E`` that
    no output lies in a pruned span.
(c) *Upper bound on what is pruned.* The triangle inequality on the first j gaps and on the
    last ``m + 1 - j`` gives ``u(o) <= -2 |r(o_j) - P_j|``. The sorted outputs other than the j-th
    fill at most ``(b - a)^(m - 1) / ((j - 1)! (m - j)!) = V_j``. Hence the mass (under ``X`` or
    ``Y``) of outputs with ``o_j`` in ``S_C`` is at most ``|S_C| V_j exp(-2c d_j(C))`` with
    ``d_j(C)`` the distance from ``P_j`` to ``[lo_C, hi_C]``. A non-empty cell is pruned only if
    ``d_j(C) > h_j`` for every j, where ``(b - a) V_j exp(-2c h_j) = 2**-60 L / m`` and ``L`` is
    the lower bound of (d); as the spans are disjoint (total width ``<= b - a``), the whole
    complement of ``E`` has mass at most ``2**-60 L`` under ``X`` and under ``Y``.
(d) *Lower bound ``L`` on both normalisers.* Cut ``[a, b]`` into *pieces*: each non-empty
    cell's span (ranks ``[lo_C, hi_C]``) and the gaps between them (one rank each). For each j,
    box ``B_j`` is a run of pieces whose ranks all lie in ``[P_j - h, P_j + h)`` with ``h`` at most
    half the distance to the neighbouring targets, so boxes are disjoint and increasing and any
    choice of one output per box is sorted. Every rank in ``B_j`` is within ``d_j`` of ``P_j``, so
    ``u >= -2 sum_j d_j`` on the product of boxes and
    ``Z >= exp(-2c sum_j d_j) prod_j |B_j| = L``. By (a) this holds for ``X`` and ``Y``. When no
    box exists for some j, nothing is pruned (``Y = X``).

Therefore ``Z_X`` and ``Z_Y`` differ by at most ``2**-60 L <= 2**-60 min(Z_X, Z_Y)``; on ``E`` the
two densities have the same shape, so their ratio there lies in ``[1 - 2**-60, 1 + 2**-59]``, and
each gives ``E``'s complement probability below ``2**-60``. The sampled distribution is JointExp
on ``Y`` *exactly* (the core's sampler, with its own 2**-60 band tolerance); its total-variation
distance to JointExp on the fine data ``X`` is below ``2**-59``: the same order as the core's
band pruning and far below float64's own rounding of the weights.

This module uses numpy only (no pyspark, pandas or pyarrow).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import gammaln

__all__ = ["FINE_BITS", "FINE_SIZE", "COARSE_SHIFT", "COARSE_CELLS", "fine_step", "fine_index",
           "coarse_of", "fine_values", "reachable", "represent"]

FINE_BITS = 32
FINE_SIZE = 1 << FINE_BITS  # N: fine points are k = 0 .. N
COARSE_SHIFT = 12
COARSE_CELLS = 1 << (FINE_BITS - COARSE_SHIFT)
_CELL_SPAN = 1 << COARSE_SHIFT
_LOG_TOL = 60 * math.log(2.0)


def fine_step(lower: float, upper: float) -> float:
    """The fine grid step ``g = (upper - lower) / 2**32``."""
    return (upper - lower) / FINE_SIZE


def fine_index(x: np.ndarray, lower: float, upper: float) -> np.ndarray:
    """``clip(floor((clip(x) - lower) / g + 0.5), 0, N)``: the same float64 steps as Spark's."""
    g = fine_step(lower, upper)
    clamped = np.clip(np.asarray(x, dtype=np.float64), lower, upper)
    return np.clip(np.floor((clamped - lower) / g + 0.5), 0, FINE_SIZE).astype(np.int64)


def coarse_of(k: np.ndarray) -> np.ndarray:
    """Coarse cell of fine indices: ``min(k >> 12, 2**20 - 1)``."""
    return np.minimum(np.asarray(k, dtype=np.int64) >> COARSE_SHIFT, COARSE_CELLS - 1)


def fine_values(k: np.ndarray, lower: float, upper: float) -> np.ndarray:
    """The grid points ``v(k) = lower + k g`` (clipped to ``upper`` against rounding)."""
    return np.minimum(lower + np.asarray(k, dtype=np.float64) * fine_step(lower, upper), upper)


def reachable(cells: np.ndarray, counts: np.ndarray, quantiles: np.ndarray, c: float,
              lower: float, upper: float) -> np.ndarray:
    """Boolean mask over the sorted non-empty coarse ``cells``: True where JointExp can reach.

    ``c = epsilon / (2 Delta)``. See the module docstring for the bound; a cell is kept when its
    rank range comes within ``h_j`` of some target ``P_j``. Without a lower bound of the
    normaliser (no box for some target) every cell is kept.
    """
    cells = np.asarray(cells, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    q = np.asarray(quantiles, dtype=np.float64)
    if cells.size == 0:
        return np.zeros(0, dtype=bool)
    hi = np.cumsum(counts).astype(np.float64)
    lo = hi - counts
    n = float(hi[-1])
    target = q * n
    log_low = _log_box_bound(cells, lo, hi, n, target, c, lower, upper)
    if log_low is None:
        return np.ones(cells.size, dtype=bool)
    m = q.size
    j = np.arange(1, m + 1)
    log_range = math.log(upper - lower)
    log_volume = (m - 1) * log_range - gammaln(j) - gammaln(m - j + 1)
    slack = log_volume + log_range + math.log(m) + _LOG_TOL - log_low
    half = np.maximum(slack, 0.0) / (2.0 * c)
    # Keep C when [lo_C, hi_C] meets the union of [P_j - h_j, P_j + h_j] (merged, sorted).
    s, e = target - half, target + half
    order = np.argsort(s, kind="stable")
    s, e = s[order], np.maximum.accumulate(e[order])
    new_run = np.r_[True, s[1:] > e[:-1]]
    run_start = s[new_run]
    run_end = e[np.r_[np.flatnonzero(new_run)[1:] - 1, e.size - 1]]
    idx = np.searchsorted(run_start, hi, side="right") - 1
    return (idx >= 0) & (run_end[np.maximum(idx, 0)] >= lo)


def _log_box_bound(cells, lo, hi, n, target, c, lower, upper):
    """log of the lower bound ``L`` of (d) in the module docstring, or None."""
    m = target.size
    # Pieces in order: gap before cell 0, cell 0, gap, cell 1, ..., cell K-1, gap after.
    left = cells * _CELL_SPAN
    right = np.minimum((cells + 1) * _CELL_SPAN, FINE_SIZE)
    K = cells.size
    start = np.empty(2 * K + 1, dtype=np.float64)
    stop = np.empty(2 * K + 1, dtype=np.float64)
    rlo = np.empty(2 * K + 1)
    rhi = np.empty(2 * K + 1)
    start[0], start[2::2] = 0.0, right
    stop[-1], stop[:-1:2] = FINE_SIZE, left
    start[1::2], stop[1::2] = left, right
    gap_rank = np.concatenate(([0.0], hi))
    rlo[0::2], rhi[0::2] = gap_rank, gap_rank
    rlo[1::2], rhi[1::2] = lo, hi
    neighbours = np.full(m, np.inf)
    if m > 1:
        d = np.diff(target)
        neighbours[:-1] = np.minimum(neighbours[:-1], d)
        neighbours[1:] = np.minimum(neighbours[1:], d)
    h_max = np.minimum(neighbours, max(n, 1.0)) / 2.0
    if not np.all(h_max > 0):
        return None
    h = h_max[:, None] * 2.0 ** -np.arange(0, 64)[None, :]
    first = np.searchsorted(rlo, target[:, None] - h, side="left")
    last = np.searchsorted(rhi, target[:, None] + h, side="left")  # exclusive
    valid = last > first
    fc = np.minimum(first, rlo.size - 1)
    lc = np.clip(last - 1, 0, rlo.size - 1)
    length = stop[lc] - start[fc]
    valid &= length > 0
    dist = np.maximum(np.abs(target[:, None] - rlo[fc]), np.abs(rhi[lc] - target[:, None]))
    log_g = math.log(fine_step(lower, upper))
    with np.errstate(divide="ignore"):
        score = np.where(valid, np.log(np.where(valid, length, 1.0)) + log_g - 2.0 * c * dist,
                         -np.inf)
    best = score.max(axis=1)
    if not np.all(np.isfinite(best)):
        return None
    return float(best.sum())


def represent(kept_k: np.ndarray, kept_counts: np.ndarray, cells: np.ndarray,
              counts: np.ndarray, keep: np.ndarray):
    """The represented data ``Y``: sorted distinct fine indices and their counts.

    ``kept_k``/``kept_counts`` are the fine counts of the kept cells; every pruned cell
    (``~keep``) adds its count at its left edge ``4096 C``.
    """
    pruned = ~np.asarray(keep, dtype=bool)
    k = np.concatenate([np.asarray(kept_k, dtype=np.int64),
                        np.asarray(cells, dtype=np.int64)[pruned] * _CELL_SPAN])
    w = np.concatenate([np.asarray(kept_counts, dtype=np.int64),
                        np.asarray(counts, dtype=np.int64)[pruned]])
    if k.size == 0:
        return k, w
    order = np.argsort(k, kind="stable")
    k, w = k[order], w[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    return k[starts], np.add.reduceat(w, starts)
