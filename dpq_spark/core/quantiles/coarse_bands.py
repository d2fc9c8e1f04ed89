"""Which coarse cells of the default grid JointExp can reach, from coarse counts alone.

The Spark path of ``dp_quantiles`` hands JointExp each group's data on the default grid of
:class:`~dpq_spark.core.randomness.grid.Grid` ``(lower, upper)``: points ``k = 0..N``, ``N = 2**32``, a value
going to ``k = clip(floor((x - lower) / g + 0.5), 0, N)`` (``Grid.snap``, which Spark computes
with the same float64 steps). Data is first counted per *coarse cell* ``C = k >> s`` (``2**s``
grid points each; cell ``N >> s`` holds only ``k = N``), and its fine indices
are re-read only for the cells :func:`reachable` keeps. The shift ``s`` is public and fixed in
advance (every function here takes it as ``shift``): ``s = 12`` (4,096 grid points a cell,
``2**20`` cells) for a group whose distinct indices do not fit a worker's memory budget, and
``s = 16`` (65,536 grid points a cell, ``2**16`` cells) for the ungrouped Spark path's first pass.

The represented data ``Y``
--------------------------
``Y`` is the fine data ``X`` in kept cells, and every point of a pruned cell moved to the cell's
left edge ``2**s C`` (:func:`represent`). JointExp then runs on ``Y``, exactly as the core's
:func:`~dpq_spark.core.quantiles.joint_exp.joint_exp_indices` samples it.

Nothing below uses the cell width: a cell is any run of consecutive grid points (its width
enters only through the grid points it covers, counted in ``|B_j|`` and ``w``), so the argument
holds word for word for every shift ``s`` (indeed for any public partition of the grid into
runs).

Why this is JointExp on ``X`` to within total variation ``2**-59``
------------------------------------------------------------------
Notation of :mod:`dpq_spark.core.quantiles.joint_exp`: outputs are sorted m-tuples of grid points, weight
``exp(c u(o))``, ``u(o) = -sum_{j=1}^{m+1} |rho(o_j) - rho(o_{j-1}) - t_j|`` with the mid-rank
``rho(k) = #{x < k} + f(#{x = k})``, ``0 <= f(t) <= t``, ``rho(o_0) = 0``, ``rho(o_{m+1}) = n``,
``P_j = q_j n``; ``S = N + 1`` grid points. For a non-empty coarse cell ``C`` write
``lo_C = #points in cells < C`` and ``hi_C = lo_C + count_C``.

(a) *Rank ranges are the same for X and Y.* For a grid point k of cell C, every point of an
    earlier cell is below k and every point of a later one above it, and the mid-rank adds
    between 0 and all of the points tied at k, so ``rho(k)`` lies in ``[lo_C, hi_C]`` for X and
    for Y (Y moves points only inside their own cell, and keeps every cell's count).
(b) *Off the pruned cells the weights are equal.* For k outside a pruned cell C, C's points are
    all below k or all above it, in X and in Y alike; so ``rho_X(k) = rho_Y(k)`` and
    ``u_X(o) = u_Y(o)`` on the event ``E`` that no output lies in a pruned cell.
(c) *Upper bound on the pruned mass.* The triangle inequality on the first j gaps and on the
    last ``m + 1 - j`` gives ``u(o) <= -2 |rho(o_j) - P_j|``. The sorted tuples with output j in
    a set of w grid points number at most ``w V_j``, ``V_j = (S + m)^(m-1) / ((j-1)! (m-j)!)``.
    A non-empty cell is pruned only if ``d_j(C) > h_j`` for every j (``d_j(C)`` the distance from
    ``P_j`` to ``[lo_C, hi_C]``), where ``S V_j exp(-2 c h_j) = tol L / m``; an empty cell holds no
    data and is the same in X and Y. The pruned cells hold at most S points, so the mass (under
    X or under Y) of the complement of E is at most ``tol L``, ``tol = 2**-60``.
(d) *Lower bound L on both normalisers.* Cut the grid into *pieces*: each non-empty cell (ranks
    in ``[lo_C, hi_C]``) and the runs of empty cells between them (one rank each). For each j a
    box ``B_j`` is a run of pieces whose ranks lie in ``[P_j - h, P_j + h)``, h at most half the
    distance to the neighbouring targets, so the boxes are disjoint and increasing and one point
    per box is a sorted tuple. With ``rho(o_j) = P_j + e_j``, ``|e_j| <= d_j``, the gaps miss
    their targets by ``e_j - e_{j-1}``, so ``u >= -2 sum_j d_j`` on the product of boxes and
    ``Z >= exp(-2 c sum_j d_j) prod_j |B_j| = L`` (``|B_j|`` in grid points), for X and for Y by
    (a). Without a box for some j nothing is pruned (``Y = X``).
    A kept cell whose data is known may be cut further, into a piece per distinct data point
    ``k`` (ranks ``[#{x < k}, #{x <= k}]``) and the runs between them (one rank each): those
    points are the same in X and Y, so the ranks are again the same for both, and finer pieces
    only allow more boxes (a larger ``L``, a narrower band).

Hence ``|Z_X - Z_Y| <= tol L <= tol min(Z_X, Z_Y)``; on E the two densities have the same shape,
and each gives E's complement at most ``tol``: the total variation between JointExp on X and on Y
is below ``(tol + 2 tol) / 2 < 2**-59``.

Which cells are kept may depend on the data, in any way, provided the pruned ones meet the
test of (c) with the ``L`` actually used: the bound above holds for each data set on its own.
:func:`settle` reads the fine data of a first guess of cells, computes ``L`` from it, and reads
more cells until every cell its band reaches is among those read; the cells read are kept.

How this folds into the guarantee. The core states that its sampler on data D draws from a
distribution within a factor ``exp(+-theta)`` of a target ``R_D`` with ``TV(R_D, P_D) < 2**-60``
(``P_D`` exact JointExp on D; ``eta = 2 theta``). Run on Y, the target ``R_Y`` is within
``tau = 2**-60 + 2**-59 < 2**-58`` of ``P_X``. Writing ``Q(X)`` for what is released and
``P_X`` for the exact epsilon-DP mechanism: ``Q(X)(E) <= e^theta (P_X(E) + tau) <=
e^theta (e^eps P_X'(E) + tau) <= e^(eps + 2 theta) Q(X')(E) + (1 + e^eps) e^theta tau``, so the
release is ``(epsilon + eta, delta)``-DP with ``delta = (1 + exp(epsilon + eta)) 2**-58``. The
same holds whether or not a group was spilled (``Y = X`` is a special case), so the worker's
data-dependent choice between the exact and the represented path samples, in both branches, a
distribution within these bounds of the same JointExp on X: the branch itself reveals nothing
beyond ``delta``.

This module uses numpy and scipy only (no pyspark, pandas or pyarrow).
"""

from __future__ import annotations

import math

import numpy as np

from dpq_spark.core.accounting.neighboring import (
    NeighboringRelation,
    joint_exp_sensitivity,
    single_quantile_sensitivity,
)
from dpq_spark.core.quantiles._logscan import lgamma

__all__ = ["FINE_STEPS", "COARSE_SHIFT", "coarse_of", "grid_coarse_shift", "coarse_midpoints", "reachable",
           "mechanism_band", "band_halves", "settle", "spread_evenly", "represent", "log_box_bound", "BAND_LOG_TOL"]

FINE_STEPS = 2**32  # N of the default Grid(lower, upper)
COARSE_SHIFT = 12  # default coarse cell C = k >> 12: 4,096 grid points (cell 2**20 is k = N alone)
#: ``-log(tol)`` of (c) in the module docstring
BAND_LOG_TOL = 60 * math.log(2.0)


def coarse_of(k, shift: int = COARSE_SHIFT) -> np.ndarray:
    """Coarse cell of grid indices: ``k >> shift``."""
    return np.asarray(k, dtype=np.int64) >> shift


def grid_coarse_shift(steps: int, declared: bool) -> int:
    """The shift of the coarse cells ``k >> shift`` that ApproxQuantiles and AggTree see on a grid
    of ``steps`` steps: ``COARSE_SHIFT`` on the default grid (``declared`` False), and on a
    declared grid the shift that leaves at most 2**20 cells (0, the grid itself, up to
    ``steps = 2**20 - 1``). Public: a function of the grid."""
    if not declared:
        return COARSE_SHIFT
    return max(0, int(steps).bit_length() - 20)


def coarse_midpoints(cells, steps: int = FINE_STEPS, shift: int = COARSE_SHIFT) -> np.ndarray:
    """A data-independent representative grid index of each coarse cell: ``2**shift C +
    2**(shift - 1)`` (at most ``steps``)."""
    span = 1 << shift
    return np.minimum(np.asarray(cells, dtype=np.int64) * span + span // 2, steps)


def _cell_bounds(cells, steps, shift):
    span = 1 << shift
    left = cells * span
    right = np.minimum((cells + 1) * span, steps + 1)  # exclusive
    return left, right


def reachable(cells, counts, quantiles, c: float, steps: int = FINE_STEPS,
              log_tol: float = BAND_LOG_TOL, shift: int = COARSE_SHIFT,
              fine=None) -> np.ndarray:
    """Boolean mask over the sorted distinct non-empty coarse ``cells``: True where JointExp can
    reach (module docstring, (c) and (d)).

    ``counts`` are the cells' exact row counts (> 0), ``c = epsilon / (2 Delta)`` of the
    mechanism that will run, ``steps`` the grid's N, ``shift`` the cells' width ``2**shift``
    in grid points. ``fine = (k, w)``, when given, is all the data of some cells (sorted
    distinct grid indices and counts): their points become pieces of (d), which tightens
    ``L`` (to be sound, each such cell must be kept, so that ``Y = X`` there: see
    :func:`settle`). ``log_tol`` is ``-log(tol)``, the pruned-mass tolerance (tests pass a
    wrong one to show the check has power). Without a lower bound on the normaliser every cell
    is kept.
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
    log_low = log_box_bound(*_items(cells, counts, steps, shift, fine), n, target, c, steps)
    if log_low is None:
        return np.ones(cells.size, dtype=bool)
    half = band_halves(log_low, q.size, c, steps, log_tol)
    # Keep C when [lo_C, hi_C] meets the union of [P_j - h_j, P_j + h_j] (merged, sorted).
    s, e = target - half, target + half
    order = np.argsort(s, kind="stable")
    s, e = s[order], np.maximum.accumulate(e[order])
    new_run = np.r_[True, s[1:] > e[:-1]]
    run_start = s[new_run]
    run_end = e[np.r_[np.flatnonzero(new_run)[1:] - 1, e.size - 1]]
    idx = np.searchsorted(run_start, hi, side="right") - 1
    return (idx >= 0) & (run_end[np.maximum(idx, 0)] >= lo)


def band_halves(log_low: float, m: int, c: float, steps: int,
                log_tol: float = BAND_LOG_TOL) -> np.ndarray:
    """The half-widths ``h_j`` (in ranks) of the band around each target ``P_j``: the cells
    farther than ``h_j`` from ``P_j`` for every j carry at most ``tol L`` of the mass ((c) of
    the module docstring, with ``log L = log_low``, on ``steps + 1`` grid points)."""
    j = np.arange(1, m + 1)
    size = float(steps + 1)
    log_volume = (m - 1) * math.log(size + m) - lgamma(j) - lgamma(m - j + 1)
    slack = log_volume + math.log(size) + math.log(m) + log_tol - log_low
    return np.maximum(slack, 0.0) / (2.0 * c)


def mechanism_band(name: str, cells, counts, quantiles, epsilon: float, neighboring,
                   steps: int = FINE_STEPS, shift: int = COARSE_SHIFT, fine=None,
                   log_tol: float = BAND_LOG_TOL) -> np.ndarray:
    """:func:`reachable` for the mechanism ``name`` at its budget ``epsilon``.

    ``"joint_exp"``: ``c = epsilon / (2 Delta)``. ``"ind_exp"``: each quantile's draw is
    JointExp with m = 1 at half its ``c`` (weight ``exp(-c_q |rho - q n|)`` with ``c_q =
    (epsilon / m) / (2 Delta_q)`` is ``exp(c u)`` for ``u = -2 |rho - q n|``); the union of the m
    bands (keeping more cells only shrinks what is pruned), so each draw is within total
    variation 2**-59 of its draw on the unpruned data.

    A band computed on a grid also holds on the tie split's fine points
    (:func:`~dpq_spark.core.randomness.grid.split_ties`), and a band computed there may prune
    single grid points (``shift`` the split's bits, ``steps`` the fine grid's last index): every
    grid point becomes ``2**b`` fine points, which multiplies the boxes of (d) by ``2**(b m)``
    and the count of tuples in (c) by at most as much, and the split moves rows only inside
    their own grid point, so (a)-(d) hold word for word.
    """
    q = np.asarray(quantiles, dtype=np.float64)
    relation = NeighboringRelation.parse(neighboring)
    if name == "joint_exp":
        return reachable(cells, counts, q, epsilon / (2.0 * joint_exp_sensitivity(q, relation)),
                         steps, log_tol, shift, fine)
    if name != "ind_exp":
        raise ValueError(f"`name` must be 'joint_exp' or 'ind_exp', got {name!r}")
    keep = np.zeros(len(cells), dtype=bool)
    for qj in q:
        c = (epsilon / q.size) / (2.0 * single_quantile_sensitivity(float(qj), relation)) / 2.0
        keep |= reachable(cells, counts, [qj], c, steps, log_tol, shift, fine)
    return keep


def _items(cells, counts, steps, shift, fine):
    """Disjoint runs of grid points holding all the data, in grid order, with rank ranges:
    ``(left, right, lo, hi)`` (``right`` exclusive). A cell of ``fine`` gives one run per data
    point ``[k, k + 1)``; any other non-empty cell is one run."""
    left, right = _cell_bounds(cells, steps, shift)
    counts = np.asarray(counts, dtype=np.int64)
    if fine is not None and np.size(fine[0]):
        k = np.asarray(fine[0], dtype=np.int64)
        w = np.asarray(fine[1], dtype=np.int64)
        known = np.isin(cells, coarse_of(k, shift))
        if int(w.sum()) != int(counts[known].sum()):
            raise ValueError("`fine` must hold all the data of its cells")
        left = np.concatenate([left[~known], k])
        right = np.concatenate([right[~known], k + 1])
        counts = np.concatenate([counts[~known], w])
        order = np.argsort(left, kind="stable")
        left, right, counts = left[order], right[order], counts[order]
    hi = np.cumsum(counts).astype(np.float64)
    return left, right, hi - counts, hi


def log_box_bound(left, right, lo, hi, n, target, c, steps=FINE_STEPS):
    """log of the lower bound ``L`` of (d) in the module docstring, or None when some target
    has no box. ``left``/``right`` (exclusive) are the grid runs holding data, in order, and
    ``lo``/``hi`` their rank ranges; the runs between them hold no data."""
    m = target.size
    K = left.size
    # Pieces in grid order: empty run before run 0, run 0, empty run, ..., run K-1, empty run.
    start = np.empty(2 * K + 1, dtype=np.float64)
    stop = np.empty(2 * K + 1, dtype=np.float64)
    rlo = np.empty(2 * K + 1)
    rhi = np.empty(2 * K + 1)
    start[0], start[2::2] = 0.0, right
    stop[-1], stop[:-1:2] = float(steps + 1), left
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
    with np.errstate(divide="ignore"):
        score = np.where(valid, np.log(np.where(valid, length, 1.0)) - 2.0 * c * dist, -np.inf)
    best = score.max(axis=1)
    if not np.all(np.isfinite(best)):
        return None
    return float(best.sum())


def settle(band, fetch, first):
    """Kept cells and their fine data, read until the band they give needs no other cell.

    ``band(fine)`` is the mask of cells the mechanism can reach given ``fine = (k, w)`` (e.g.
    :func:`reachable` with ``fine``), ``fetch(mask)`` returns all the data of the masked cells
    (sorted distinct grid indices and counts), ``first`` is the first mask to read (any guess:
    it changes how many reads are made, not what is released). Returns ``(keep, k, w)``: every
    cell ``band((k, w))`` keeps is in ``keep``, and ``(k, w)`` is all the data of ``keep``, so
    pruning ``~keep`` is sound (module docstring). Each round reads at least one new cell.
    """
    first = np.asarray(first, dtype=bool)
    keep = np.zeros(first.size, dtype=bool)
    k = w = np.empty(0, dtype=np.int64)
    want = first
    while True:
        new = want & ~keep
        if new.any():
            nk, nw = fetch(new)
            k = np.concatenate([k, np.asarray(nk, dtype=np.int64)])
            w = np.concatenate([w, np.asarray(nw, dtype=np.int64)])
            order = np.argsort(k, kind="stable")
            k, w = k[order], w[order]
            keep |= new
        want = np.asarray(band((k, w)), dtype=bool)
        if not (want & ~keep).any():
            return keep, k, w


def spread_evenly(cells, counts, quantiles, steps: int = FINE_STEPS,
                  shift: int = COARSE_SHIFT, points: int = 4096):
    """Made-up fine data for a first guess of :func:`settle`: each cell holding a target rank
    ``q n`` gets its rows spread evenly over at most ``points`` of its grid points. Never
    released or used to prune: only to guess which cells to read first."""
    cells = np.asarray(cells, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    if cells.size == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    hi = np.cumsum(counts)
    target = np.asarray(quantiles, dtype=np.float64) * hi[-1]
    hit = np.unique(np.minimum(np.searchsorted(hi, target, side="left"), cells.size - 1))
    left, right = _cell_bounds(cells[hit], steps, shift)
    ks, ws = [], []
    for a, b, t in zip(left, right, counts[hit]):
        p = int(min(t, b - a, points))
        ks.append(a + (np.arange(p) * (b - a)) // p)
        ws.append(np.diff((np.arange(p + 1) * t) // p))
    return np.concatenate(ks), np.concatenate(ws)


def represent(kept_k, kept_counts, cells, counts, keep, shift: int = COARSE_SHIFT):
    """The represented data ``Y``: sorted distinct grid indices and their counts.

    ``kept_k``/``kept_counts`` are the fine counts of the kept cells; every pruned cell
    (``~keep``) adds its whole count at its left edge ``2**shift C``.
    """
    pruned = ~np.asarray(keep, dtype=bool)
    k = np.concatenate([np.asarray(kept_k, dtype=np.int64),
                        np.asarray(cells, dtype=np.int64)[pruned] << shift])
    w = np.concatenate([np.asarray(kept_counts, dtype=np.int64),
                        np.asarray(counts, dtype=np.int64)[pruned]])
    if k.size == 0:
        return k, w
    order = np.argsort(k, kind="stable")
    k, w = k[order], w[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    return k[starts], np.add.reduceat(w, starts)
