"""ApproxQuantiles (Kaplan, Schnapp and Stemmer, ICML 2022): recursive splitting at the middle
quantile.

With quantiles ``q_1 < ... < q_m`` on data in ``[a, b]``: estimate the middle quantile ``q*`` with
the single-quantile exponential mechanism, split the data and the range at the estimate ``v``,
rescale the left quantiles to ``q / q*`` and the right ones to ``(q - q*) / (1 - q*)``, and recurse
on both halves. The recursion has ``L = ceil(log2(m + 1))`` levels and every row is used by one
sub-problem per level, so each level gets ``epsilon / L``: the error grows with ``log m``.
"""

from __future__ import annotations

import math

import numpy as np

from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.core.quantiles._request import validate_index_request, validate_request
from dpq_spark.core.quantiles._sorted_data import SortedData, sort_data
from dpq_spark.core.accounting.neighboring import NeighboringRelation, single_quantile_sensitivity
from dpq_spark.core.quantiles.coarse_bands import band_halves, log_box_bound
from dpq_spark.core.randomness.grid import Grid, split_ties
from dpq_spark.core.randomness.samplers import uniform_split
from dpq_spark.core.quantiles.single_quantile import sample_grid_index

__all__ = ["approx_quantiles", "approx_quantiles_indices", "split_lazily", "recursion_depth"]


def recursion_depth(m: int) -> int:
    """Levels of the recursion for m quantiles: ``ceil(log2(m + 1))``."""
    return int(math.ceil(math.log2(m + 1)))


def _sensitivity(q: float, relation: NeighboringRelation, top: bool) -> float:
    """Utility sensitivity of one sub-problem (see the Privacy section of approx_quantiles)."""
    if relation is NeighboringRelation.ADD_REMOVE:
        return single_quantile_sensitivity(q, relation)
    if top:
        return 1.0
    return 2.0 * single_quantile_sensitivity(q, NeighboringRelation.ADD_REMOVE)


def approx_quantiles(
    values,
    quantiles,
    *,
    epsilon: float,
    lower: float,
    upper: float,
    neighboring: str | NeighboringRelation = "add_remove",
    counts=None,
    granularity: float | None = None,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Estimate m quantiles by recursive splitting (Kaplan, Schnapp and Stemmer 2022).

    Parameters
    ----------
    values : array_like of float
        The private data, 1-d. Values outside ``[lower, upper]`` are clamped; NaN is an error.
    quantiles : array_like of float
        Strictly increasing quantiles in (0, 1).
    epsilon : float
        Total privacy budget, finite and > 0.
    lower, upper : float
        Public bounds with ``lower < upper``.
    neighboring : {"add_remove", "swap"} or NeighboringRelation, default "add_remove"
        Which datasets are neighbours.
    counts : array_like of int, optional
        Multiplicity of each entry of ``values`` (exactly ``np.repeat(values, counts)``).
    granularity : float, optional
        Step of the public output grid; default ``(upper - lower) / 2**32`` (see
        :class:`~dpq_spark.core.randomness.grid.Grid`; extra error at most half a step). Giving it declares
        the data's resolution: ties are jittered inside their grid cell once, before the
        recursion (:mod:`dpq_spark.core.quantiles.single_quantile`), which then runs on the fine grid; the
        outputs are rounded back. Cost O(sum of counts) with ``counts``. Without it, each row is
        sent once to a uniform one of the 256 fine points of its own default-grid point
        (:func:`~dpq_spark.core.randomness.grid.split_ties`), so the splits of the recursion
        divide a block of tied doubles instead of leaving one side empty (5,000 rows, 80%
        zeros, quartiles at eps = 1: mean absolute error 0 against 13 on the grid itself). Cost
        O(min(sum of counts, 256 len(values))) with ``counts``.
    rng : numpy.random.Generator, optional
        Source of randomness; ``None`` draws fresh OS entropy.

    Returns
    -------
    numpy.ndarray
        m estimates, sorted, float64, in ``[lower, upper]``.

    Raises
    ------
    ValueError
        If an argument breaks its rule (the message names it).
    TypeError
        If an argument has the wrong type.

    Notes
    -----
    Everything runs on the indices of one public grid: the data are snapped to it, a sub-problem
    is a range of grid indices ``[a, b]``, and its middle quantile (index ``len // 2`` of its
    quantile list) is a grid index v drawn by
    :func:`dpq_spark.core.quantiles.single_quantile.sample_grid_index` on the sub-problem's own points and
    rescaled quantile. The left sub-problem takes the points ``< v`` and the range ``[a, v]``, the
    right one the points ``>= v`` and ``[v, b]``. The outputs are the grid values of the indices. Time O(n log n + n log m).

    Privacy
    -------
    ``epsilon``-differential privacy (pure) for the chosen neighbouring relation, one row (one unit
    of multiplicity) being the unit of privacy; each of the ``L = ceil(log2(m + 1))`` levels
    spends ``epsilon / L`` and the levels compose adaptively. Within a level the sub-problems hold
    disjoint rows given the earlier outputs. Add/remove: a row touches one sub-problem per level,
    whose utility moves by at most ``max(q', 1 - q')`` (its own rescaled ``q'``), the sensitivity
    used. Swap: at the top level n is fixed and the sensitivity is 1; deeper, a swapped row may
    leave one sub-problem and join another, an add/remove change in each, so each sub-problem
    uses twice its add/remove sensitivity and the two changes together cost at most
    ``epsilon / L``. Assumes ``lower``, ``upper``, ``granularity`` and ``quantiles`` are chosen
    without looking at the data. As implemented (float64 weights, exact draws), each draw adds
    the ``eta`` and ``delta`` of :mod:`dpq_spark.core.quantiles.joint_exp` for m = 1: ``(epsilon + L eta,
    L delta)``-DP overall. With ``granularity`` given, the whole recursion runs on one per-row
    jitter of the data (grid indices above are then fine-grid indices); for each fixed jitter it
    has this guarantee, so the mixture does too (:mod:`dpq_spark.core.randomness.grid`); the final
    rounding is post-processing. The same holds for the default grid's split of ties.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=1000)
    >>> approx_quantiles(x, [0.25, 0.5, 0.75], epsilon=1.0, lower=-10, upper=10,
    ...                  rng=np.random.default_rng(1)).shape
    (3,)
    """
    request, x, c = validate_request(
        values, quantiles, epsilon=epsilon, lower=lower, upper=upper, neighboring=neighboring, counts=counts
    )
    grid = Grid(request.lower, request.upper, granularity)
    source = resolve_rng(rng)
    top = grid.fine_size - 1
    if grid.tie_bits:
        k, w = grid.distinct(x, c)
        if grid.splits_many(w):  # many tied rows: split each grid point when a step needs it
            return grid.release(split_lazily(k, w, grid.tie_bits, top, request.quantiles,
                                             request.epsilon, request.neighboring, source))
        f, f_counts = split_ties(k, w, grid.tie_bits, source)
    else:
        f, f_counts = grid.fine_indices(x, c, source)
    data = sort_data(f, f_counts, 0, top)
    return grid.release(_sample_indices(data, top, request.quantiles, request.epsilon, request.neighboring, source))


def split_lazily(k, counts, bits: int, top: int, quantiles: np.ndarray, epsilon: float,
                 relation: NeighboringRelation, source) -> np.ndarray:
    """The recursion of :func:`approx_quantiles` on data split over ``2**bits`` fine points per
    grid point, each grid point split only when a step's band first reaches it.

    ``k``: sorted distinct grid indices with ``counts`` rows; ``top``: the fine grid's last
    index. Every grid point starts whole (its rows at its first fine point ``k 2**bits``).
    Before each draw, the grid points of the step's sub-problem that its single-quantile draw
    can reach (the band of :mod:`~dpq_spark.core.quantiles.coarse_bands` for m = 1, each grid
    point a cell of its fine points, cut to the sub-problem's range) are split as
    :func:`~dpq_spark.core.randomness.grid.split_ties` splits them, once; the others stay
    whole. Each draw is then within total variation ``2**-59`` of its draw on the fully split
    sub-problem (the whole points carry at most ``2**-60`` of its mass, and the pieces' rank
    ranges are the same either way), so the release is within ``m 2**-59`` of
    :func:`approx_quantiles` on the fully split data, holding about ``256`` entries per grid
    point near a quantile instead of up to ``256`` per grid point. A whole point that an
    earlier draw fell inside (an event of that negligible mass) is never split. Returns m
    sorted fine indices.
    """
    f = np.asarray(k, dtype=np.int64) << bits
    w = np.asarray(counts, dtype=np.int64).copy()
    whole = np.ones(f.size, dtype=bool)
    m = quantiles.size
    eps_level = epsilon / recursion_depth(m)
    out = np.empty(m, dtype=np.int64)
    # sub-problems: (data in [d_lo, d_hi), range [lo, hi], quantiles, output slots, top?)
    stack = [(0, top + 1, 0, top, quantiles, np.arange(m), True)]
    while stack:
        d_lo, d_hi, lo, hi, qs, slots, is_top = stack.pop()
        mid = qs.size // 2
        q_star = float(qs[mid])
        delta_u = _sensitivity(q_star, relation, is_top)
        a, b = np.searchsorted(f, [d_lo, d_hi])
        if whole[a:b].any():
            f, w, whole = _split_in_band(f, w, whole, a, b, (d_lo, d_hi, lo, hi), q_star,
                                         eps_level / (2.0 * delta_u), bits, source)
            a, b = np.searchsorted(f, [d_lo, d_hi])
        data = sort_data(f[a:b], w[a:b], lo, hi)
        v = sample_grid_index(data, lo, hi, q_star, eps_level, delta_u, source)
        out[slots[mid]] = v
        if mid > 0:
            stack.append((d_lo, v, lo, v, qs[:mid] / q_star, slots[:mid], False))
        if mid + 1 < qs.size:
            right_q = (qs[mid + 1 :] - q_star) / (1.0 - q_star)
            stack.append((v, d_hi, v, hi, right_q, slots[mid + 1 :], False))
    return np.sort(out)


def _split_in_band(f, w, whole, a, b, box, q: float, c_q: float, bits: int, source):
    """Split the whole entries ``a..b`` of one sub-problem (``box``: its data interval
    ``[d_lo, d_hi)`` and range ``[lo, hi]``) whose grid point the draw for quantile ``q`` at
    ``exp(-c_q |rho - q n|)`` can reach; returns the new ``(f, w, whole)``, sorted."""
    d_lo, d_hi, lo, hi = box
    g = f[a:b] >> bits
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    t = np.add.reduceat(w[a:b], starts)
    rhi = np.cumsum(t).astype(np.float64)
    rlo = rhi - t
    gs = g[starts]
    left = np.maximum(gs << bits, lo) - lo
    right = np.minimum((gs + 1) << bits, hi + 1) - lo
    target = np.array([q * rhi[-1]])
    c = c_q / 2.0  # exp(-c_q |rho - q n|) is JointExp's exp(c u) for m = 1, u = -2 |rho - q n|
    log_low = log_box_bound(left, right, rlo, rhi, rhi[-1], target, c, hi - lo)
    if log_low is None:
        reach = np.ones(gs.size, dtype=bool)
    else:
        half = band_halves(log_low, 1, c, hi - lo)[0]  # m = 1 on the sub-problem's range
        reach = (rhi >= target[0] - half) & (rlo <= target[0] + half)
    point = np.cumsum(np.r_[False, g[1:] != g[:-1]])  # each entry's grid point among gs
    inside = ((g << bits) >= d_lo) & (((g + 1) << bits) <= d_hi)  # not cut by a draw
    pick = a + np.flatnonzero(whole[a:b] & reach[point] & inside)
    if pick.size == 0:
        return f, w, whole
    entry, part, cnt = uniform_split(source, w[pick], bits)
    rest = np.ones(f.size, dtype=bool)
    rest[pick] = False
    f = np.concatenate([f[rest], f[pick][entry] + part])
    w = np.concatenate([w[rest], cnt])
    whole = np.concatenate([whole[rest], np.zeros(entry.size, dtype=bool)])
    order = np.argsort(f, kind="stable")
    return f[order], w[order], whole[order]


def approx_quantiles_indices(k, counts, grid_size: int, quantiles, *, epsilon: float,
                             neighboring: str | NeighboringRelation = "add_remove",
                             rng=None) -> np.ndarray:
    """ApproxQuantiles on grid indices: the recursion of :func:`approx_quantiles`, integers in
    and out, on exactly the indices given (no jitter and no tie split: the caller chooses, as
    the Spark layer does for rows at its coarse cells' points).

    ``k`` are grid indices in ``[0, grid_size)`` with multiplicities ``counts`` (None: one
    each); returns m sorted int64 indices. Privacy as :func:`approx_quantiles`: ``epsilon``-DP
    (as implemented ``(epsilon + L eta, L delta)``), one unit of ``counts`` the unit of privacy;
    ``grid_size`` and ``quantiles`` public.
    """
    idx, c_arr, size, q, eps, relation = validate_index_request(
        k, counts, grid_size, quantiles, epsilon=epsilon, neighboring=neighboring)
    data = sort_data(idx, c_arr, 0, size - 1)
    return _sample_indices(data, size - 1, q, eps, relation, resolve_rng(rng))


def _sample_indices(data: SortedData, top: int, quantiles: np.ndarray, epsilon: float,
                    relation: NeighboringRelation, source) -> np.ndarray:
    """The recursion of :func:`approx_quantiles` on validated grid data (indices ``0..top``):
    m sorted int64 grid indices. Shared with :mod:`dpq_spark.core.quantiles.batch`."""
    m = quantiles.size
    eps_level = epsilon / recursion_depth(m)
    out = np.empty(m, dtype=np.int64)
    # Work list of sub-problems: (data, first, last grid index, rescaled quantiles, output slots, top?).
    stack: list[tuple[SortedData, int, int, np.ndarray, np.ndarray, bool]] = [
        (data, 0, top, quantiles, np.arange(m), True)
    ]
    while stack:
        sub, lo, hi, qs, slots, is_top = stack.pop()
        mid = qs.size // 2
        q_star = float(qs[mid])
        delta_u = _sensitivity(q_star, relation, is_top)
        v = sample_grid_index(sub, lo, hi, q_star, eps_level, delta_u, source)
        out[slots[mid]] = v
        if mid > 0:
            stack.append((sub.restrict(lo, v, include_hi=False), lo, v, qs[:mid] / q_star, slots[:mid], False))
        if mid + 1 < qs.size:
            right_q = (qs[mid + 1 :] - q_star) / (1.0 - q_star)
            stack.append((sub.restrict(v, hi, include_hi=True), v, hi, right_q, slots[mid + 1 :], False))
    return np.sort(out)
