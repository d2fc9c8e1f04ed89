"""JointExp: m differentially private quantiles from one exponential-mechanism draw, on a grid.

Gillenwater, Joseph and Kulesza, "Differentially Private Quantiles", ICML 2021. The math, with the
choices made for dpq_spark, is in ``shared/papers/ALGORITHMS.md`` section 1. dpq_spark runs the
mechanism over a finite public grid, so that its guarantee survives floating point (Mironov,
CCS 2012): the paper's continuous outputs and float uniforms are replaced by grid points drawn
with exact integer draws.

The distribution. :class:`~dpq_spark.core.randomness.grid.Grid` ``(lower, upper, granularity)`` has points
``k = 0..N`` (value ``a + k g``); every value is clamped and snapped to its nearest point (a
per-record map; extra error at most ``g / 2``). Outputs are sorted m-tuples ``o_1 <= ... <= o_m``
of grid points, drawn with probability proportional to ``exp(c u(o))``, ``c = eps / (2 Delta)``,

    u(o) = -sum_{j=1}^{m+1} |(rho(o_j) - rho(o_{j-1})) - (q_j - q_{j-1}) n|,
    rho(o_0) = 0, rho(o_{m+1}) = n,

with the *mid-rank* ``rho(k) = #{x < k} + f(#{x = k})``, ``f(0) = 0``, ``f(t) = (t + 1) / 2``
(``t = 1``: ``#{x <= k}``). A tied value's rank sits in the middle of its block, so a quantile in
the middle half of a tie block is released *as* the tied value (not strictly between blocks).

Ties in a declared resolution. When ``granularity`` is given, :func:`joint_exp` does not run the
above on the grid itself but on the grid's fine grid (``Grid.jitter`` = S = ``2**16`` fine
points per step): each record is jittered, independently, to a uniform fine point of its own grid
cell, the mechanism draws fine points, and each is rounded to its grid cell
(:func:`~dpq_spark.core.randomness.grid.jitter_indices`, :func:`~dpq_spark.core.randomness.grid.round_indices`). The
copies of a tied value spread over its cell, so any output whose rank falls inside the tie block,
also near the block's edges, is released as the tied value (Goodreads ratings, deciles at eps = 1,
granularity 0.01: mean absolute error 0.0006 against 0.0034 with the mid-rank alone). The jitter
is a per-record random map and costs no privacy (:mod:`dpq_spark.core.randomness.grid`, "Privacy of the
jitter"); rounding is post-processing. :func:`joint_exp_indices` never jitters (its caller
chooses).

Ties on the default grid. Without ``granularity`` :func:`joint_exp` runs on the default grid's
fine points instead (``Grid.tie_bits`` = 8: 256 fine points per grid point): each row goes,
independently, to a uniform fine point of its own grid point, and each output is released as
the grid point it lies in (:func:`~dpq_spark.core.randomness.grid.split_ties`). A block of tied
doubles (80% zeros, rows clamped at a bound) then spreads over its point's fine points, and
quantiles inside it are released as the tied value (5,000 rows, 80% zeros, deciles at eps = 1:
mean absolute error 0.19 against 35 on the grid itself). The split costs no privacy, by the
jitter's argument. It makes at most ``min(n, 256 D)`` entries for D distinct values; past
``SPLIT_MAX_ENTRIES`` (2**22) only the grid points inside JointExp's band are split
(:func:`~dpq_spark.core.quantiles.coarse_bands.mechanism_band`), the others stay whole, which
moves the release by less than ``2**-59`` in total variation (added to ``delta`` below).

Sensitivity (``Delta`` of :func:`~dpq_spark.core.accounting.neighboring.joint_exp_sensitivity`; checked
exhaustively on small cases in the tests). Adding a point x shifts rho by 0 below x, by
``f(t+1) - f(t)`` in [0, 1] at x and by 1 above x: a nondecreasing shift from 0 (``o_0``) to 1
(``o_{m+1}``, n -> n + 1), so the m + 1 rank gaps grow by non-negative amounts ``e_j`` summing to 1,
on at most two gaps. Swap (remove then add, n fixed): the rank part of u moves by at most 1 + 1 = 2.
Add/remove: the targets move by ``g_j = q_j - q_{j-1}`` too, so u moves by at most
``sum_j |e_j - g_j| = 2 TV(e, g) = 2 (1 - sum_j min(e_j, g_j)) <= 2 (1 - min_j g_j)`` (with e on
one gap ``j0``, ``sum min >= g_{j0}``; on two gaps ``s, 1 - s``, ``sum min`` is ``1``, or at least
one of ``g_{j0}``, ``g_{j0+1}``). Removal is symmetric. Any f with ``0 <= f(t+1) - f(t) <= 1``
gives the same Delta.

Cells (notation as in ALGORITHMS.md, in grid units). Maximal runs of grid points of equal rho: the
gap before the first data point (rank 0); for each distinct data index d with t copies and
``lo = #{x < d}``: if t = 1, the cell ``[d, next)`` of rank ``lo + 1``; if t >= 2, the point cell
``{d}`` (rank ``lo + (t + 1)/2``), then the gap ``(d, next)`` (rank ``lo + t``) if not empty.
Ranks ``p_i`` strictly increase (half-integers); ``w_i`` is the integer number of grid points.
For continuous data (no ties) these are exactly the paper's cells. Targets
``t_j = (q_j - q_{j-1}) n``, ``P_j = q_j n``, kernel ``phi_j(g) = exp(-c |g - t_j|)``.

Three facts make the sampler fast without changing its distribution:

1. *Runs.* k outputs in one cell of w points are ``C(w + k - 1, k) = w R_k(w)`` multisets,
   ``R_k(w) = Gamma(w + k) / (Gamma(k + 1) Gamma(w + 1))``; the weight of a run of k outputs
   ending at output j in cell i is ``A_{j-k+1}(i) * prod_{t=j-k+2..j} phi_t(0) * R_k(w_i)`` where
   ``A`` is the one-output ("k = 1") slice, so only ``A`` is stored. With
   ``rho_k(w) = log R_k(w) - (k - 1) log w``, ``rho_{k+1} - rho_k = log((w + k) / (w (k + 1))) <= 0``,
   so the remaining terms k..j are at most ``(j - k + 1)`` times the bound of term k; the sum
   stops once that is below ``2**-72`` of the sum so far, per cell (:meth:`_Forward.run_sums`).
2. *Toeplitz steps in O(K).* The kernel is two-sided geometric in the rank gap, so
   ``sum_{i'} phi_j(p_i - p_{i'}) exp(S(i'))`` splits into a causal part (gap >= t_j, a decaying
   running sum) and a window part (gap < t_j) read from suffix/prefix scans within blocks of
   positions of length ``0.75 t_j`` (van Herk / Gil-Werman); only the order of positions matters,
   so half-integer ranks change nothing. Every sum adds positive terms only
   (:mod:`dpq_spark.core.quantiles._logscan`), so small entries keep their relative precision.
3. *Bands and their envelope.* Write ``d_k = rho(o_k) - P_k`` for an output tuple's rank
   deviations (``d_0 = d_{m+1} = 0``); then ``u(o) = -sum_{k=1}^{m+1} |d_k - d_{k-1}|``, the
   total variation of the path ``0, d_1, ..., d_m, 0``, so a tuple whose largest deviation is
   ``D = max_k |d_k|`` has ``u <= -2 D``. The forward and backward passes run on bands: output
   k keeps the cells within ``h`` ranks of ``P_k`` (and a reference cell). The tuples outside
   the bands are not dropped: :mod:`~dpq_spark.core.quantiles.joint_exp_envelope` dominates
   them by an envelope of total mass ``B`` (uniform tuples near the targets, weighted by
   ``exp(-2 c M)`` for ``D`` in ``(M, M']``), and each draw first chooses the bands or the
   envelope with probabilities ``Z_N : B`` (``Z_N`` the mass inside the bands, from the forward
   pass), keeping an envelope proposal with probability ``p / E`` if it lies outside the bands
   and starting again otherwise. Every sorted tuple then has probability exactly ``p(o) / Z``:
   the bands set the cost, not the law. :func:`_bands` takes the smallest ``h`` whose envelope
   bound is at most ``exp(-2)`` of a lower bound on ``Z`` (so a round leaves the bands with
   probability below 12%), found by a few Newton steps on the bound:

   - *Deviation bound* (:func:`_deviation_log_mass`). A tuple whose largest deviation ``D``
     lies in ``(M, M']`` has ``u <= -2 D < -2 M`` and all its outputs within ``M'`` ranks of
     their targets: there are at most ``prod_k G_k(M')`` of them, ``G_k(M')`` the grid points
     of the cells within ``M'`` of ``P_k``. Cutting ``D > h`` into intervals
     ``(h + (2**l - 1) / (2 c), h + (2**(l+1) - 1) / (2 c)]`` and a tail (at most
     ``C(S + m - 1, m)`` tuples, ``S = N + 1`` grid points) bounds the mass of every tuple with
     some output farther than h from its target; the envelope is the same sum (its tail counts
     ``S**m`` ordered tuples).
   - *Lower bounds.* The mass of one reference cell sequence near the true quantiles; that of a
     product of disjoint boxes around them, each counted by its number of grid points at its
     largest deviation (:func:`_box_lower_bound`); and that of the same kind of product with
     each box's cells weighted by their own deviation, ``prod_j sum_{i in box j} w_i
     exp(-2 c |p_i - P_j|)`` (:func:`_weighted_box_bound`: one grid point per box is a sorted
     tuple, and ``u >= -2 sum_k |d_k|`` by the triangle inequality).

   On N(0, 5) deciles at epsilon 1 the bands keep about 1,300 cells of 9 steps (h of about 70
   ranks) at 1,000 to 100,000 rows, against about 2,800 when cells were pruned once their
   mass stayed below ``2**-60`` of the normaliser. When the search finds no half-width, or the
   bands hold every cell, nothing lies outside them and no round is drawn.

Exact draws. The cell sequence is drawn backwards (last output's cell, then run lengths and
predecessor cells) by :func:`~dpq_spark.core.randomness.grid.draw_index`, which picks index r with
probability *exactly* ``w~_r / sum w~`` for the float64 weights ``w~_r = exp(l~_r - max l~)`` it
computes (rejection on mantissas and exponents with exact integer draws; no float uniform, no
cumulative sum). Each run of k outputs in a cell of w points then gets a uniform multiset of k of
its grid points (:func:`~dpq_spark.core.randomness.grid.uniform_multiset`: a uniform k-subset of
``[0, w + k - 1)``, minus ``0..k-1``). Released numbers are ``Grid.value(k)``.

Many groups. :mod:`dpq_spark.core.quantiles.joint_exp_many` samples this same distribution for many groups
in one pass (for :func:`dpq_spark.core.quantiles.batch.release_many` and the Spark fold); this module's
sampler stays the single-group one, which is faster for one group.

Guarantee as implemented. Write ``P`` for the exact mechanism above and ``P~`` for what the code
samples. (i) No pruning: the envelope's rounds make ``P~`` target ``P`` over every sorted tuple,
the bands only set the cost; the round's choice uses ``Z_N`` from the forward pass (error as in
(iii)) and the envelope's float64 sums, a few roundings each. (ii) Run truncation: every run sum is
low by a relative ``<= 2**-72``; positive sums compound this to ``<= m 2**-72`` on any weight.
(iii) Forward-pass rounding: every log weight ``l~`` is a sum/log-sum-exp chain of at most ``16 m``
correctly rounded float64 operations on numbers of magnitude at most ``M = 3 c n + m log(S + m) +
800``, so its absolute error is at most ``gamma = 16 m 2**-52 M`` (first-order error analysis; not
machine-checked). (iv) ``exp`` rounds with relative error ``2**-52``; weights below ``2**-1074`` of
the largest underflow to 0 (total variation ``< K 2**-1074``). Each conditional probability of the
backward pass (at most 2m of them) is a ratio of such weights, and the round's choice and an
envelope tuple's keep test add at most four more such factors, so every output's probability under
``P~`` is within a factor ``exp(theta)`` of ``P``, with ``theta = (4 m + 4) (gamma + 2**-52) + m
2**-71``. Hence the implementation is ``(epsilon + eta, delta)``-DP with ``eta = 2 theta`` and
``delta = (1 + exp(epsilon + eta)) 2**-59`` (from the partial split of ties above and (iv)).
Example: n = 1e6, m = 30, eps = 1 (c = 0.26): ``M = 7.8e5``, ``gamma = 8.3e-8``, ``eta = 2.1e-5``,
``delta = 6.5e-18``. The uniform draws inside cells are exact. (Exact "interval refining" that
removes ``eta`` is not implemented.)
The batched sampler for many groups (:mod:`~dpq_spark.core.quantiles.joint_exp_many`, which the
Spark path runs) keeps every run sum whole and states its own rounding bound, ``gamma_many``,
and the ``eta`` that follows from it, in its module docstring.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from dpq_spark.core.quantiles.coarse_bands import mechanism_band
from dpq_spark.core.quantiles.joint_exp_envelope import (Bands, Envelope, box_ranges, components,
                                                         draw_outside, log_totals)
from dpq_spark.core.quantiles._logscan import (
    lgamma,
    logaddexp,
    segment_ends,
    segmented_logcumsumexp,
    segmented_logcumsumexp_reverse,
)
from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.core.quantiles._request import validate_index_request, validate_request
from dpq_spark.core._validation import check_positive_int
from dpq_spark.core.randomness.grid import MAX_GRID_STEPS, Grid, draw_index, uniform_multiset
from dpq_spark.core.accounting.neighboring import NeighboringRelation, joint_exp_sensitivity

__all__ = ["joint_exp", "joint_exp_indices"]

_LOG_RUN_TOL = 72 * math.log(2.0)  # run-sum truncation: remaining terms < 2**-72 of the sum
#: the sampler's bands: the envelope of the tuples outside them weighs at most exp(-2) of a
#: lower bound on the normaliser, so that a draw's round leaves them with probability below 12%
_ENVELOPE_NATS = 2.0


def joint_exp(
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
    """Release m quantiles of ``values`` with one draw of the JointExp exponential mechanism.

    Parameters
    ----------
    values : array_like of float
        The private data, in any order. Values outside ``[lower, upper]`` (also ±inf) are clamped
        to the bounds, then snapped to the public grid. NaN is an error. Empty data is allowed.
    quantiles : array_like of float
        Strictly increasing, each in (0, 1). Their number m may exceed ``len(values)``.
    epsilon : float
        Privacy parameter, finite and > 0.
    lower, upper : float
        Public, finite bounds with ``lower < upper``, chosen without looking at the data.
    neighboring : {"add_remove", "swap"} or NeighboringRelation
        ``"add_remove"`` (default): utility sensitivity ``2 (1 - min_j (q_j - q_{j-1}))`` with
        ``q_0 = 0, q_{m+1} = 1``. ``"swap"``: sensitivity 2.
    counts : array_like of int, optional
        Non-negative integer multiplicities of ``values``. The result has exactly the
        distribution of ``joint_exp(np.repeat(values, counts), ...)``, at a cost that grows with
        ``len(values)``, not with ``sum(counts)``.
    granularity : float, optional
        Step g of the public output grid ``lower + k g`` (:class:`~dpq_spark.core.randomness.grid.Grid`).
        Default ``(upper - lower) / 2**32``: extra error at most ``g / 2``, 1.2e-10 of the span.
        Giving it declares the data's public resolution (0.01 for two-decimal ratings, 1 for
        integer ages): tied records are then jittered inside their grid cell before sampling and
        the outputs rounded back to the grid (module docstring), so a quantile anywhere inside a
        tie block is released as the tied value. With ``counts`` this costs O(sum of counts)
        (one jitter per row) instead of O(len(values)). Without it, ties are split over the
        default grid's fine points (module docstring, "Ties on the default grid").
    rng : numpy.random.Generator, optional
        ``None`` (default): the OS cryptographic generator. A seeded generator is for tests and
        reproducible experiments only.

    Returns
    -------
    numpy.ndarray
        m sorted float64 grid values in ``[lower, upper]``, the j-th for ``quantiles[j]``.

    Raises
    ------
    TypeError, ValueError
        For a bad argument, naming it; raised before any sampling.

    Privacy
    -------
    epsilon-DP (pure) for the mechanism defined below, under the chosen neighbouring relation
    (add/remove or swap of one element of ``values``, that is one unit of ``counts``). The unit of
    privacy is one row. Assumes ``lower``, ``upper``, ``granularity`` and ``quantiles`` are
    public (not derived from the data). The implementation samples it from float64 weights with
    exact random draws; what it guarantees is ``(epsilon + eta, delta)``-DP with the ``eta`` and
    ``delta`` of the module docstring (section "Guarantee as implemented"; with jitter, its
    number of grid points is that of the fine grid, at most ``2**52 + 1``); for example ``eta = 2.0e-5``, ``delta = 6.5e-18`` at
    n = 1e6, m = 30, epsilon = 1. With ``granularity`` given, the per-row jitter is a mixture
    over independent per-record maps of this mechanism and keeps the same guarantee, relation
    and unit, even if the jitter were public (:mod:`dpq_spark.core.randomness.grid`); the rounding of the
    outputs is post-processing. Without it, the split of ties over the default grid's fine
    points is the same kind of mixture and keeps the same guarantee; when the split keeps the
    grid points outside the band whole (more than 2**22 entries), ``delta`` grows to
    ``(1 + exp(epsilon + eta)) 2**-58``.

    Notes
    -----
    The exponential mechanism over the finite grid: outputs are sorted m-tuples of grid points
    ``o_1 <= ... <= o_m``, with probability proportional to ``exp(epsilon u(o) / (2 Delta))``,
    ``u(o) = -sum_{j=1}^{m+1} |rho(o_j) - rho(o_{j-1}) - (q_j - q_{j-1}) n|``, ``rho(o_0) = 0``,
    ``rho(o_{m+1}) = n`` and the mid-rank ``rho(k) = #{x < k} + (t + 1) / 2`` when ``t >= 1``
    data points sit on grid point k (``#{x < k}`` when none do). See :func:`joint_exp_indices`;
    this function snaps the data to the grid, jitters them (``granularity`` given) or splits
    them (the default grid) on the fine grid, samples, and returns ``grid.release(k)``. Cost: sorting the data, then
    O(m K) for the K cells within the bands; memory O(m K). Jittered data have about two cells
    per row (as continuous data), not per distinct value.

    References
    ----------
    J. Gillenwater, M. Joseph, A. Kulesza, "Differentially Private Quantiles", ICML 2021.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(0, 5, 10_000)
    >>> joint_exp(x, [0.25, 0.5, 0.75], epsilon=1.0, lower=-100, upper=100,
    ...           rng=np.random.default_rng(1)).round(1)  # doctest: +SKIP
    array([-3.4,  0. ,  3.4])
    """
    grid = Grid(lower, upper, granularity)  # public arguments first
    request, x, c_arr = validate_request(
        values, quantiles, epsilon=epsilon, lower=lower, upper=upper, neighboring=neighboring, counts=counts
    )
    source = resolve_rng(rng)
    delta_u = joint_exp_sensitivity(request.quantiles, request.neighboring)
    c = request.epsilon / (2.0 * delta_u)
    f, f_counts = grid.fine_indices(x, c_arr, source, band=functools.partial(
        mechanism_band, "joint_exp", quantiles=request.quantiles, epsilon=request.epsilon,
        neighboring=request.neighboring, steps=grid.fine_size - 1, shift=grid.tie_bits))
    k = _sample_indices(f, f_counts, request.quantiles, c, grid.fine_size, source)[0]
    return grid.release(k)


def joint_exp_indices(
    k,
    counts,
    grid_size: int,
    quantiles,
    *,
    epsilon: float,
    neighboring: str | NeighboringRelation = "add_remove",
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """JointExp on grid indices: the sampler behind :func:`joint_exp`, integers in and out.

    Parameters
    ----------
    k : array_like of int
        The private data as grid indices in ``[0, grid_size)`` (e.g. ``Grid.snap`` of the values,
        or the same formula computed by Spark), in any order, repeats allowed.
    counts : array_like of int or None
        Non-negative multiplicities of ``k`` (None: one each), exactly as ``np.repeat(k, counts)``.
    grid_size : int
        The number of grid points ``N + 1``, public, ``1 <= grid_size <= 2**52 + 1``.
    quantiles, epsilon, neighboring, rng
        As in :func:`joint_exp`.

    Returns
    -------
    numpy.ndarray
        m sorted int64 grid indices in ``[0, grid_size)``.

    Raises
    ------
    TypeError, ValueError
        For a bad argument, naming it (never echoing data); raised before any sampling.

    Privacy
    -------
    As :func:`joint_exp`: epsilon-DP for the exponential mechanism over the grid indices (up to
    the implementation's ``eta`` and ``delta``, module docstring), under the chosen neighbouring
    relation, one unit of ``counts`` being the unit of privacy. ``grid_size`` and ``quantiles``
    must be public. No jitter or split here: a caller that wants the tie handling of
    :func:`joint_exp` passes :func:`~dpq_spark.core.randomness.grid.jitter_indices` (a declared
    grid) or :func:`~dpq_spark.core.randomness.grid.split_ties` (the default grid) of its
    indices with ``grid_size = Grid.fine_size`` and releases ``Grid.release`` of the outputs;
    both keep this guarantee.
    """
    if check_positive_int(grid_size, "grid_size") > MAX_GRID_STEPS + 1:
        raise ValueError(f"`grid_size` must be <= 2**52 + 1, got {grid_size!r}")
    idx, c_arr, size, q, eps, relation = validate_index_request(
        k, counts, grid_size, quantiles, epsilon=epsilon, neighboring=neighboring)
    source = resolve_rng(rng)
    c = eps / (2.0 * joint_exp_sensitivity(q, relation))
    return _sample_indices(idx, c_arr, q, c, size, source)[0]


# --------------------------------------------------------------------------------------------
# Cells


def _tie_rank(t: np.ndarray) -> np.ndarray:
    """``f(t)``: the rank a grid point holding ``t >= 1`` tied points adds to ``#{x < k}``.

    The mid-rank ``(t + 1) / 2`` (``t = 1`` gives ``#{x <= k}``). Any f with ``f(0) = 0``,
    ``0 <= f(t+1) - f(t) <= 1`` and ``f(t) <= t`` keeps the sensitivity.
    """
    return (t + 1.0) / 2.0


def _grid_cells(idx: np.ndarray, counts: np.ndarray | None, size: int):
    """Merge grid indices (with multiplicities) into cells of equal mid-rank.

    Returns ``(start, width, log_width, pos, n)``: cell i is the grid points
    ``start[i] .. start[i] + width[i] - 1`` (``start`` has a final entry ``size``), all of
    mid-rank ``pos[i]`` (float64, half-integers, strictly increasing).
    """
    if counts is None:
        distinct, mult = np.unique(idx, return_counts=True)
    else:
        keep = counts > 0
        if not keep.all():
            idx, counts = idx[keep], counts[keep]
        if idx.size and np.all(idx[1:] > idx[:-1]):  # already sorted and distinct (Spark's fold)
            distinct, mult = idx, counts
        elif idx.size:
            order = np.argsort(idx, kind="stable")
            xs = idx[order]
            first = np.flatnonzero(np.concatenate(([True], xs[1:] != xs[:-1])))
            distinct, mult = xs[first], np.add.reduceat(counts[order], first)
        else:
            distinct, mult = idx, np.zeros(0, dtype=np.int64)
    distinct = distinct.astype(np.int64)
    mult = mult.astype(np.int64)
    n = int(mult.sum())
    d = distinct.size
    if d == 0:
        start = np.array([0, size], dtype=np.int64)
        width = np.array([size], dtype=np.int64)
        pos = np.zeros(1)
        return start, width, np.log(width.astype(np.float64)), pos, 0
    below = np.cumsum(mult) - mult  # #{x < d}
    nxt = np.append(distinct[1:], size)
    single = mult == 1
    # Per distinct value: its own cell, then the gap after it if not empty (only after a tie);
    # before them the gap before the first value if not empty.
    w_main = np.where(single, nxt - distinct, 1)
    w_gap = np.where(single, 0, nxt - distinct - 1)
    gaps = np.flatnonzero(w_gap > 0)
    lead = int(distinct[0] > 0)
    main_at = np.arange(d) + lead
    if gaps.size:
        extra = np.zeros(d, dtype=np.int64)
        extra[gaps[gaps + 1 < d] + 1] = 1
        main_at += np.cumsum(extra)
    gap_at = main_at[gaps] + 1
    K = lead + d + gaps.size
    width = np.empty(K, dtype=np.int64)
    start = np.empty(K + 1, dtype=np.int64)
    pos = np.empty(K, dtype=np.float64)
    if lead:
        width[0], start[0], pos[0] = distinct[0], 0, 0.0
    width[main_at], start[main_at] = w_main, distinct
    pos[main_at] = below + _tie_rank(mult.astype(np.float64))
    width[gap_at], start[gap_at] = w_gap[gaps], distinct[gaps] + 1
    pos[gap_at] = (below[gaps] + mult[gaps]).astype(np.float64)
    start[K] = size
    return start, width, np.log(width.astype(np.float64)), pos, n


# --------------------------------------------------------------------------------------------
# Bands


def _bands(start, width, log_width, pos, n, q, c, size):
    """The sampler's bands (module docstring, "Bands"): ``(lo, hi, h)``, contiguous ranges
    ``[lo_j, hi_j)`` of cells for step j, each holding every cell of rank within ``h`` of its
    target (and the reference cell), ``h`` the smallest half-width the search finds whose
    envelope mass is at most ``exp(-_ENVELOPE_NATS)`` of a lower bound on the normaliser.
    ``h = inf`` when the bands hold every cell (nothing lies outside them), also when the
    search finds no such half-width."""
    m = q.size
    K = pos.size
    cum_target = q * n  # P_j
    # Lower bound 1, a reference sequence: per j, the cell near P_j maximising
    # log w - 2c |p - P_j|, made monotone.
    centre = np.searchsorted(pos, cum_target, side="right") - 1
    span = np.arange(-32, 33)
    cand = np.clip(centre[:, None] + span[None, :], 0, K - 1)
    score = log_width[cand] - 2.0 * c * np.abs(pos[cand] - cum_target[:, None])
    ref = np.maximum.accumulate(cand[np.arange(m), np.argmax(score, axis=1)])
    log_z_low = _log_sequence_weight(ref, width, log_width, pos, n, q, c)
    boxes = _box_lower_bound(start, pos, n, q, c)
    if boxes is not None and boxes > log_z_low:
        log_z_low = boxes
    # The search starts from a union bound's half-width: a tuple with output j in cell i has
    # u <= -2 |p_i - P_j|, and at most w_i (S + m)^(m-1) / ((j-1)! (m-j)!) tuples put it there.
    j = np.arange(1, m + 1)
    log_volume = (m - 1) * math.log(size + m) - lgamma(j) - lgamma(m - j + 1)
    slack = log_volume + math.log(size) + math.log(m) - _ENVELOPE_NATS - log_z_low
    half = np.maximum(slack, 0.0) / (2.0 * c)
    one = np.array([0, K], dtype=np.int64)
    n_arr = np.array([n], dtype=np.int64)

    def search(x, side):
        return np.searchsorted(pos, x, side=side)

    log_z_new = np.maximum(np.array([log_z_low]),
                           _weighted_box_bound(log_width, pos, n_arr, one, q, c, search))
    lo, hi, h = _deviation_bands(start, n_arr, one, q, c, search,
                                 np.array([math.log(size + m)]), log_z_new,
                                 half[None, :].max(axis=1), ref[None, :])
    return lo[0], hi[0], float(h[0])


#: Newton steps of the search for the deviation bound's smallest half-width (the third moves h
#: by a rank or two, the fourth by less than one)
_DEVIATION_NEWTON = 3
#: the weighted boxes reach at most this many nats of decay from their target (16: their bound
#: is within 3e-6 nats of the whole box's on N(0, 5) deciles at eps 0.1-10, with a third fewer
#: cells)
_BOX_NATS = 16.0


def _deviation_log_mass(h, start, n, coff, q, c, search, log_sm) -> np.ndarray:
    """The deviation bound of the module docstring ("Bands"), per group: the log of an upper
    bound on the mass of the output tuples whose largest rank deviation
    ``max_k |rho(o_k) - P_k|`` exceeds ``h`` (shape ``(G,)``), summed over the intervals
    ``(M_l, M_{l+1}]``, ``M_l = h + (2**l - 1) / (2 c)`` for l < L, and the tail past ``M_L``.
    L depends on m alone (so a group's numbers do not depend on its batch):
    ``2**L >= 45 m + 11``, so that for any grid of at most ``2**64`` points the tail, at most
    ``exp(-2 c M_L) C(S + m - 1, m)``, is below ``exp(-10 - 2 c h)``. Flat arrays, ``search``
    and ``log_sm`` as in :func:`_deviation_bands`."""
    G, m = n.size, q.size
    cum = q[None, :] * n[:, None].astype(np.float64)  # P_j, per group
    sbase = (coff[:-1] + np.arange(G))[:, None, None]
    log_all = m * log_sm - math.lgamma(m + 1)  # log C(S + m - 1, m) <= m log(S + m) - log m!
    L = math.ceil(math.log2(45 * m + 11))
    steps = (2.0 ** np.arange(L + 1) - 1.0) / (2.0 * c)
    M = h[:, None] + steps[None, :]  # (G, L + 1)
    within = M[:, None, 1:]  # (G, 1, L)
    lo = search(cum[:, :, None] - within, "left")
    hi = search(cum[:, :, None] + within, "right")
    count = (start[hi + sbase] - start[lo + sbase]).astype(np.float64)  # G_k(M), (G, m, L)
    with np.errstate(divide="ignore"):
        log_count = np.ascontiguousarray(np.log(count).transpose(0, 2, 1)).sum(axis=2)
    terms = np.concatenate([-2.0 * c * M[:, :-1] + log_count,
                            (-2.0 * c * M[:, -1] + log_all)[:, None]], axis=1)
    top = terms.max(axis=1)  # finite: the last term is
    return top + np.log(np.exp(terms - top[:, None]).sum(axis=1))


def _deviation_bands(start, n, coff, q, c, search, log_sm, log_z_low, h0, ref):
    """The sampler's bands for G groups of cells at once: ``(lo, hi, h)``, ``lo`` and ``hi`` of
    shape ``(G, m)`` (local cell indices), each group's band j the cells within ``h`` ranks of
    ``P_j`` and its reference cell ``ref[:, j]``, for the smallest ``h`` the search finds with
    :func:`_deviation_log_mass` at most ``exp(-_ENVELOPE_NATS)`` of ``exp(log_z_low)``; on the
    rows where it finds none, and where the bands hold every cell, the bands are all cells and
    ``h = inf`` (nothing lies outside them).

    The arrays are flat over the groups: group g's cells are ``coff[g]:coff[g + 1]`` and its
    starts ``coff[g] + g:coff[g + 1] + g + 1``; ``search(x, side)`` is
    ``np.searchsorted(pos_g, x[g], side)`` for every row g of ``x`` (shape ``(G, ...)``).
    ``log_sm`` is ``log(S + m)`` per group, ``log_z_low`` a lower bound on each group's log
    normaliser and ``h0`` the half-width the search starts from (a few Newton steps on the
    bound's ``-2 c h``, each keeping the smallest ``h`` that passed). Every operation is
    elementwise or a reduction within one group's row, so a group's numbers are the same in any
    batch. The bands set the sampler's cost only: whatever they are, the draw is exact
    (:mod:`~dpq_spark.core.quantiles.joint_exp_envelope`).
    """
    G = n.size
    K = np.diff(coff)[:, None]
    cum = q[None, :] * n[:, None].astype(np.float64)
    target = log_z_low - _ENVELOPE_NATS
    h = np.maximum(h0, 0.0)
    best = np.full(G, np.inf)
    for _ in range(_DEVIATION_NEWTON):
        bound = _deviation_log_mass(h, start, n, coff, q, c, search, log_sm)
        ok = bound <= target
        best = np.where(ok & (h < best), h, best)
        # aim one nat below the target, as if the bound were -2 c h plus a constant
        h = np.maximum(h + (bound - target + 1.0) / (2.0 * c), 0.0)
    found = np.isfinite(best)
    half = np.where(found, best, 0.0)[:, None]
    lo = np.minimum(search(cum - half, "left"), ref)
    hi = np.maximum(search(cum + half, "right"), ref + 1)
    lo = np.where(found[:, None], lo, 0)
    hi = np.where(found[:, None], hi, K)
    every = np.all((lo == 0) & (hi == K), axis=1)
    return lo, hi, np.where(every, np.inf, best)


def _weighted_box_bound(log_width, pos, n, coff, q, c, search) -> np.ndarray:
    """The weighted boxes' lower bound on each group's log normaliser (module docstring,
    "Bands"): boxes of half-width ``h_j``, half the distance from ``P_j`` to its nearer
    neighbouring target but at most ``_BOX_NATS / (2 c)``, each counted as
    ``sum_{cells i in box j} w_i exp(-2 c |p_i - P_j|)``; ``-inf`` for a group with an empty
    box. Flat arrays and ``search`` as in :func:`_deviation_bands`."""
    G, m = n.size, q.size
    nf = n.astype(np.float64)
    cum = q[None, :] * nf[:, None]
    gaps = np.diff(np.concatenate([np.zeros((G, 1)), cum, nf[:, None]], axis=1), axis=1)
    # half the distance to the nearer neighbouring target, and no more than _BOX_NATS / (2 c):
    # any smaller box still gives a lower bound, and cells farther out weigh exp(-_BOX_NATS) of
    # an equally wide cell at the target
    h = np.minimum(np.minimum(gaps[:, :-1], gaps[:, 1:]) / 2.0, _BOX_NATS / (2.0 * c))
    left = search(cum - h, "left")
    right = search(cum + h, "left")  # box j: the cells of rank in [P_j - h_j, P_j + h_j)
    size = np.maximum(right - left, 0).ravel()
    full = size > 0
    first = (left + coff[:-1, None]).ravel()
    ends = np.cumsum(size)
    seg = np.repeat(np.arange(size.size), size)
    cell = np.arange(int(ends[-1]) if size.size else 0) - np.repeat(ends - size, size) + first[seg]
    v = log_width[cell] - 2.0 * c * np.abs(pos[cell] - cum.ravel()[seg])
    box = np.full(size.size, -np.inf)
    if v.size:
        at = (ends - size)[full]
        top = np.maximum.reduceat(v, at)
        box[full] = top + np.log(np.add.reduceat(np.exp(v - np.repeat(top, size[full])), at))
    return np.ascontiguousarray(box.reshape(G, m)).sum(axis=1)


def _box_lower_bound(start, pos, n, q, c):
    """Lower bound 2, a product of boxes: output j anywhere in the cells of rank in
    ``[P_j - h_j, P_j + h_j)``, with ``h_j`` at most half the distance to the neighbouring targets
    (so the boxes are disjoint and increasing, and their outputs sorted). Each output's rank is
    within ``d_j`` of ``P_j``, so ``u >= -2 sum_j d_j`` and the mass is at least
    ``exp(-2c sum_j d_j) prod_j |box_j|`` (``|box_j|`` its number of grid points: one point per
    box gives distinct sorted tuples). Returns the log bound, or None.
    """
    cum = q * n
    gaps = np.diff(np.concatenate(([0.0], cum, [float(n)])))
    h_max = np.minimum(gaps[:-1], gaps[1:]) / 2.0
    if not np.all(h_max >= 1.0):
        return None
    grid = 2.0 ** np.arange(0, int(np.ceil(np.log2(h_max.max()))) + 1)
    h = np.minimum(grid[None, :], h_max[:, None])
    left = np.searchsorted(pos, cum[:, None] - h, side="left")
    right = np.searchsorted(pos, cum[:, None] + h, side="left")
    valid = right > left
    lc = np.minimum(left, pos.size - 1)
    rc = np.clip(right - 1, 0, pos.size - 1)
    dist = np.maximum(np.abs(pos[lc] - cum[:, None]), np.abs(pos[rc] - cum[:, None]))
    with np.errstate(divide="ignore"):
        length = np.log((start[np.minimum(right, pos.size)] - start[lc]).astype(np.float64))
    score = np.where(valid, length - 2.0 * c * dist, -np.inf)
    best = np.argmax(score, axis=1)
    rows = np.arange(q.size)
    if not np.all(np.isfinite(score[rows, best])):
        return None
    return float(score[rows, best].sum())


def _log_sequence_weight(seq, width, log_width, pos, n, q, c) -> float:
    """log of exp(c u(s)) prod_runs C(w + k - 1, k) for a nondecreasing cell sequence ``seq``:
    the mass of the grid tuples whose cells are ``seq``."""
    ranks = np.concatenate(([0.0], pos[seq], [float(n)]))
    targets = np.diff(np.concatenate(([0.0], q, [1.0]))) * n
    util = -np.abs(np.diff(ranks) - targets).sum()
    cells, run_lengths = np.unique(seq, return_counts=True)
    log_mult = 0.0
    for i, k in zip(cells, run_lengths):
        w = np.float64(width[i])
        log_mult += float(log_width[i])
        for kk in range(2, int(k) + 1):
            log_mult += float(_log_run_step(w, kk))
    return float(c * util + log_mult)


# --------------------------------------------------------------------------------------------
# Toeplitz step


def _kernel_sums(src_pos, src_log, rec_pos, t, c):
    """``log sum_{i': src_pos[i'] < rec_pos[i]} exp(src_log[i'] - c |rec_pos[i] - src_pos[i'] - t|)``.

    Sources and receivers are sorted by position. Exact up to a few ulps of relative error.
    """
    out = np.full(rec_pos.size, -np.inf)
    if src_pos.size == 0 or rec_pos.size == 0:
        return out
    T = rec_pos - t  # a source at p contributes exp(-c (T - p)) if p <= T, exp(-c (p - T)) if p > T
    lo = np.searchsorted(src_pos, T, side="right")  # sources [0, lo) are causal
    hi = np.searchsorted(src_pos, rec_pos, side="left")  # sources [lo, hi) are in the window
    lo = np.minimum(lo, hi)  # only when t = 0 (n = 0): a source must lie strictly left
    tau = 0.75 * t if t > 0 else 1.0  # t = 0 only when n = 0: no window part then
    block = np.floor(src_pos / tau)
    starts = np.flatnonzero(np.concatenate(([True], block[1:] != block[:-1])))
    nseg = starts.size
    seg = np.repeat(np.arange(nseg), np.diff(np.append(starts, src_pos.size)))
    base = block[starts] * tau
    local = src_pos - base[seg]  # in [0, tau) up to rounding
    z_plus = src_log + c * local
    z_minus = src_log - c * local
    pre_plus = segmented_logcumsumexp(z_plus, starts)
    pre_minus = segmented_logcumsumexp(z_minus, starts)
    suf_minus = segmented_logcumsumexp_reverse(z_minus, starts)
    ends = segment_ends(starts, src_pos.size)
    tot_plus = pre_plus[ends]
    tot_minus = pre_minus[ends]

    # Decayed sum of all sources of earlier segments, taken at each segment's base:
    # carry[s] = log sum_{i' in segments < s} exp(src_log[i'] - c (base[s] - p_{i'})).
    carry = np.full(nseg, -np.inf)
    running = -math.inf
    for s in range(1, nseg):
        prev = _logaddexp_scalar(running, float(tot_plus[s - 1]))
        running = prev - c * float(base[s] - base[s - 1])
        carry[s] = running

    # Causal part.
    has_causal = lo > 0
    _add_causal(out, has_causal, lo, seg, T, base, carry, pre_plus, c)
    _add_window(out, lo, hi, seg, starts, ends, base, T, pre_minus, suf_minus, tot_minus, src_pos,
                src_log, c)
    return out


def _add_causal(out, has_causal, lo, seg, T, base, carry, pre_plus, c) -> None:
    """The causal part of a Toeplitz step, added to ``out`` in place for the receivers
    ``has_causal``: the sources before ``lo`` (at least ``t`` to the left), from the carry into
    the last one's block and that block's prefix scan ``pre_plus``. Shared by
    :func:`_kernel_sums` and :func:`dpq_spark.core.quantiles.joint_exp_many._kernel_sums_many`."""
    if has_causal.any():
        last = lo[has_causal] - 1
        s_last = seg[last]
        shift = c * (T[has_causal] - base[s_last])
        out[has_causal] = logaddexp(carry[s_last], pre_plus[last]) - shift


def _add_window(out, lo, hi, seg, starts, ends, base, T, pre_minus, suf_minus, tot_minus, src_pos,
                src_log, c) -> None:
    """The window part of a Toeplitz step, added to ``out`` in place: for each receiver, the
    sources ``[lo, hi)`` (closer than ``t``), from the segment scans (``pre_minus``,
    ``suf_minus``, ``tot_minus`` over blocks starting at ``starts``, ``seg`` each source's block,
    ``base`` each block's left end, ``T`` the receiver's position minus ``t``). Shared by
    :func:`_kernel_sums` and :func:`dpq_spark.core.quantiles.joint_exp_many._kernel_sums_many`."""
    # Window part: sources [lo, hi) = suffix of lo's segment, whole segments between, prefix of
    # (hi - 1)'s segment. Blocks are shorter than t, so at most one whole segment lies between.
    has_window = lo < hi
    if has_window.any():
        idx = np.flatnonzero(has_window)
        first, last = lo[idx], hi[idx] - 1
        s_first, s_last = seg[first], seg[last]
        Ti = T[idx]
        same = s_first == s_last
        win = np.full(idx.size, -np.inf)
        # Same segment: must be a prefix (first is the segment start) or a suffix (last is its end).
        if same.any():
            k = np.flatnonzero(same)
            is_prefix = first[k] == starts[s_first[k]]
            is_suffix = last[k] == ends[s_first[k]]
            kp = k[is_prefix]
            win[kp] = pre_minus[last[kp]] - c * (base[s_first[kp]] - Ti[kp])
            ks = k[~is_prefix & is_suffix]
            win[ks] = suf_minus[first[ks]] - c * (base[s_first[ks]] - Ti[ks])
            kd = k[~is_prefix & ~is_suffix]
            for r in kd:  # interior range: cannot happen for exact block ids; kept for safety
                sl = slice(int(first[r]), int(last[r]) + 1)
                win[r] = np.logaddexp.reduce(src_log[sl] - c * (src_pos[sl] - Ti[r]))
        diff = np.flatnonzero(~same)
        if diff.size:
            sf, sl_ = s_first[diff], s_last[diff]
            head = suf_minus[first[diff]] - c * (base[sf] - Ti[diff])
            tail = pre_minus[last[diff]] - c * (base[sl_] - Ti[diff])
            part = logaddexp(head, tail)
            mid = sl_ - sf == 2
            if mid.any():
                sm = sf[mid] + 1
                part[mid] = logaddexp(part[mid], tot_minus[sm] - c * (base[sm] - Ti[diff][mid]))
            wide = sl_ - sf > 2
            for r in np.flatnonzero(wide):  # impossible with blocks of 0.75 t; kept for safety
                sl = slice(int(first[diff][r]), int(last[diff][r]) + 1)
                part[r] = np.logaddexp.reduce(src_log[sl] - c * (src_pos[sl] - Ti[diff][r]))
            win[diff] = part
        out[idx] = logaddexp(out[idx], win)


# --------------------------------------------------------------------------------------------
# Forward pass


class _Forward:
    """The forward tables over the bands: ``A_j`` (k = 1 slices) and prefix maxima for runs."""

    def __init__(self, width, log_width, pos, n, q, c, lo, hi):
        self.width = np.asarray(width, dtype=np.float64)  # integer counts of grid points
        self.log_width, self.pos, self.n, self.q, self.c = log_width, pos, n, q, c
        self.lo, self.hi = lo, hi
        self.m = q.size
        self.cum_target = q * n
        self.targets = np.diff(np.concatenate(([0.0], q, [1.0]))) * n
        self.A: list[np.ndarray] = []  # A_j on band j, stored minus nu[j]
        self.G_max: list[np.ndarray] = []  # max_{j'<=j} (A_j' - Lambda_j') on band j, true scale
        self.nu = np.zeros(self.m)
        self.S_last: np.ndarray | None = None
        # Keep every S_j for the backward pass unless that would take more than 512 MiB.
        self.S_cache: dict[int, np.ndarray] | None = {} if int((hi - lo).sum()) <= 2**26 else None

    def _band(self, j: int) -> slice:  # j is 1-based
        return slice(int(self.lo[j - 1]), int(self.hi[j - 1]))

    def run(self) -> None:
        for j in range(1, self.m + 1):
            band = self._band(j)
            L = self.log_width[band]
            p = self.pos[band]
            if j == 1:
                A = L - self.c * np.abs(p - self.targets[0])
                nu_a = 0.0
            else:
                prev = self._band(j - 1)
                A = L + _kernel_sums(self.pos[prev], self.S_last, p, self.targets[j - 1], self.c)
                nu_a = self.nu[j - 2]
            self._store(j, A, nu_a)
            self.nu[j - 1] = nu_a
            S = self.run_sums(j)
            shift = float(np.max(S))
            if not math.isfinite(shift):  # cannot happen: the reference sequence has mass
                raise FloatingPointError("JointExp forward pass lost all mass")
            self.A[-1] -= shift
            self.nu[j - 1] = nu_a + shift
            self.S_last = S - shift
            if self.S_cache is not None:
                self.S_cache[j] = self.S_last

    def _store(self, j: int, A: np.ndarray, nu_a: float) -> None:
        band = self._band(j)
        lam = self._log_lambda(j, band)
        G = A + nu_a - lam
        if j > 1:
            prev = self._band(j - 1)
            ov_lo, ov_hi = max(band.start, prev.start), min(band.stop, prev.stop)
            if ov_lo < ov_hi:
                mine = slice(ov_lo - band.start, ov_hi - band.start)
                theirs = self.G_max[-1][ov_lo - prev.start : ov_hi - prev.start]
                G[mine] = np.maximum(G[mine], theirs)
        self.A.append(A)
        self.G_max.append(G)

    def _log_lambda(self, j: int, band: slice) -> np.ndarray:
        """Lambda_j(i) = sum_{t<=j} log(phi_t(0) w_i) = -c P_j + j log w_i."""
        return -self.c * self.cum_target[j - 1] + j * self.log_width[band]

    def _gather(self, table: list[np.ndarray], jp: int, cells: np.ndarray, offset: float) -> np.ndarray:
        """``table[jp-1]`` (plus ``offset``) at sorted global cells ``cells``; -inf outside band jp."""
        lo, hi = int(self.lo[jp - 1]), int(self.hi[jp - 1])
        if cells.size and cells[0] >= lo and cells[-1] < hi:
            return table[jp - 1][cells - lo] + offset
        out = np.full(cells.size, -np.inf)
        inside = (cells >= lo) & (cells < hi)
        out[inside] = table[jp - 1][cells[inside] - lo] + offset
        return out

    def finished_sums(self, j: int) -> np.ndarray:
        """S_j of a finished step (cached, or computed again)."""
        if self.S_cache is not None:
            return self.S_cache[j]
        return self.run_sums(j)

    def _on_band(self, table: list[np.ndarray], jp: int, band: slice, offset: float) -> np.ndarray:
        """``table[jp-1]`` (plus ``offset``) over all cells of ``band``; -inf outside band jp."""
        lo, hi = int(self.lo[jp - 1]), int(self.hi[jp - 1])
        if lo <= band.start and band.stop <= hi:
            return table[jp - 1][band.start - lo : band.stop - lo] + offset
        out = np.full(band.stop - band.start, -np.inf)
        a, b = max(lo, band.start), min(hi, band.stop)
        if a < b:
            out[a - band.start : b - band.start] = table[jp - 1][a - lo : b - lo] + offset
        return out

    def run_sums(self, j: int) -> np.ndarray:
        """S_j = log sum_k alpha(j, i, k) on band j, minus nu_j (the scale of the stored A_j).

        A run of k outputs in cell i (w grid points) carries ``C(w + k - 1, k) = w R_k(w)``
        multisets, ``log R_k(w) = sum_{t=2..k} log((w + t - 1) / t)``. Run lengths are added while
        an upper bound on all longer runs is not below ``2**-72`` of the sum so far, for any cell:
        with ``rho_k(w) = log R_k(w) - (k - 1) log w`` nonincreasing in k (for w >= 1), the terms
        with run start <= jp are each at most ``exp(G_max_jp + Lambda_j + rho_k(w))``, so the
        j - k + 1 of them sum to at most that times j - k + 1. While many cells need a term, it is
        added on the whole band (adding a negligible term to a finished cell only makes it more
        exact); once few do, only on those.
        """
        band = self._band(j)
        acc = self.A[j - 1].copy()
        if j == 1:
            return acc
        scale = self.nu[j - 1]
        L = self.log_width[band]
        W = self.width[band]
        lam_j = self._log_lambda(j, band) - scale
        size = acc.size
        active: np.ndarray | None = None  # None: every cell of the band (dense mode)
        log_r = np.zeros(size)  # log R_k(w) on the current cells (band, or active)
        for k in range(2, j + 1):
            jp = j - k + 1  # the run of k outputs starts at output jp
            log_count = math.log(j - k + 1)
            shift = -self.c * (self.cum_target[j - 1] - self.cum_target[jp - 1]) - scale
            if active is None:
                log_r += _log_run_step(W, k)
                bound = self._on_band(self.G_max, jp, band, log_count) + lam_j + log_r - (k - 1) * L
                need = bound >= acc - _LOG_RUN_TOL
                count = int(np.count_nonzero(need))
                if count == 0:
                    break
                if count * 8 < size:
                    active = np.flatnonzero(need)
                    log_r = log_r[active]
                else:
                    term = self._on_band(self.A, jp, band, self.nu[jp - 1] + shift) + log_r
                    acc = logaddexp(acc, term)
                    continue
            else:
                log_r += _log_run_step(W[active], k)
                cells = band.start + active
                bound = (
                    self._gather(self.G_max, jp, cells, log_count)
                    + lam_j[active]
                    + log_r
                    - (k - 1) * L[active]
                )
                keep = bound >= acc[active] - _LOG_RUN_TOL
                active, log_r = active[keep], log_r[keep]
                if active.size == 0:
                    break
            cells = band.start + active
            term = self._gather(self.A, jp, cells, self.nu[jp - 1] + shift) + log_r
            acc[active] = logaddexp(acc[active], term)
        return acc

    def run_terms_single(self, j: int, i: int) -> np.ndarray:
        """log alpha(j, i, k) for k = 1..j at one global cell i (true scale minus nu_j)."""
        scale = self.nu[j - 1]
        terms = np.full(j, -np.inf)
        w = np.float64(self.width[i])
        log_r = 0.0
        for k in range(1, j + 1):
            if k > 1:
                log_r += float(_log_run_step(w, k))
            jp = j - k + 1
            lo, hi = int(self.lo[jp - 1]), int(self.hi[jp - 1])
            if not lo <= i < hi:
                continue
            A_true = self.A[jp - 1][i - lo] + self.nu[jp - 1]
            terms[k - 1] = A_true - scale - self.c * (self.cum_target[j - 1] - self.cum_target[jp - 1]) + log_r
        return terms


def _log_run_step(w, k: int):
    """``log R_k(w) - log R_{k-1}(w) = log((w + k - 1) / k)``: one more output in a cell of w grid
    points (multisets: ``C(w + k - 1, k) = w R_k(w)``)."""
    return np.log(w + (k - 1.0)) - math.log(k)


def _logaddexp_scalar(a: float, b: float) -> float:
    top = max(a, b)
    if top == -math.inf:
        return top
    return top + math.log1p(math.exp(-abs(a - b)))


def _sample_indices(idx, counts, q, c, size, source, draws=1):
    """``draws`` independent draws from one forward pass: sorted grid indices, shape (draws, m).

    ``idx`` are grid indices in ``[0, size)`` (validated), ``counts`` their multiplicities or None.
    """
    return _sample_cells(_grid_cells(idx, counts, size), q, c, size, source, draws)


def _sample_cells(cells, q, c, size, source, draws=1):
    """:func:`_sample_indices` from the data's cells, ``cells = _grid_cells(idx, counts, size)``
    (for a caller that has built them already)."""
    start, width, log_width, pos, n = cells
    m = q.size
    lo, hi, h = _bands(start, width, log_width, pos, n, q, c, size)
    fw = _Forward(width, log_width, pos, n, q, c, lo, hi)
    fw.run()
    band_m = fw._band(m)
    log_w_last = fw.S_last - c * np.abs(n - pos[band_m] - fw.targets[m])
    out = np.empty((draws, m), dtype=np.int64)
    env = None
    if math.isfinite(h):  # some tuples lie outside the bands: each draw's rounds may leave them
        env = Envelope(_band_set(start, pos, n, q, c, lo, hi, h), np.array([n]), size, q, c)
        log_zn = fw.nu[m - 1] + log_totals(log_w_last, np.zeros(1, np.int64),
                                           np.array([log_w_last.size]))

        def ranks(g, x):
            return pos[np.searchsorted(start, x, side="right") - 1]
    for r in range(draws):
        if env is not None:
            inside, x = draw_outside(env, np.zeros(1, dtype=np.int64), log_zn, ranks, source)
            if not inside[0]:
                out[r] = x[0]
                continue
        cell_of = _backward(fw, band_m.start + draw_index(log_w_last, source), source)
        j = 0
        while j < m:  # runs of equal cells: one uniform multiset of grid points each
            i = int(cell_of[j])
            k = int(np.searchsorted(cell_of, i, side="right")) - j
            out[r, j : j + k] = int(start[i]) + uniform_multiset(source, int(width[i]), k)
            j += k
    return out


def _band_set(start, pos, n, q, c, lo, hi, h) -> Bands:
    """One group's :class:`~dpq_spark.core.quantiles.joint_exp_envelope.Bands` from its
    :func:`_bands` ``lo``, ``hi`` and ``h``."""
    def search(x, side):
        return np.searchsorted(pos, x, side=side)

    if math.isfinite(h):
        g_lo, g_hi = box_ranges(np.array([h]), start, np.zeros(1, dtype=np.int64), np.array([n]),
                                q, c, search)
    else:  # nothing outside the bands: no envelope
        g_lo = g_hi = np.zeros((1, q.size, components(q.size)), dtype=np.int64)
    return Bands(lo[None, :], hi[None, :], np.array([h]), g_lo, g_hi, start[lo][None, :],
                 start[hi][None, :])


def _backward(fw: _Forward, i: int, source) -> np.ndarray:
    """Given the cell ``i`` of output m, draw the cells of all outputs, backwards by runs."""
    pos, c = fw.pos, fw.c
    cell_of = np.empty(fw.m, dtype=np.int64)
    j = fw.m
    while True:
        k = 1 + draw_index(fw.run_terms_single(j, i), source)
        cell_of[j - k : j] = i
        j -= k
        if j == 0:
            return cell_of
        band = fw._band(j)
        S = fw.finished_sums(j)
        stop = min(band.stop, i) - band.start  # predecessors lie strictly left of cell i
        log_w = S[:stop] - c * np.abs(pos[i] - pos[band][:stop] - fw.targets[j])
        i = band.start + draw_index(log_w, source)
