"""Private clamping bounds, for quantile releases without user-supplied ``lower``/``upper``.

Every quantile mechanism of dpq_spark needs bounds ``[lower, upper]`` chosen without looking at
the data, and bounds chosen too wide cost accuracy (30 JointExp quantiles of 1,000 N(0, 5)
values at epsilon = 1: mean absolute error 0.48 with bounds +-100, 319 with +-1e4; see
docs/choosing_parameters.md). When the user has none, :func:`private_bounds` spends a stated
share of the budget to find them with a search that needs no bounds itself: Durfee's idea of a
noisy search over an exponentially growing public sequence of candidates (D. Durfee,
"Unbounded Differentially Private Quantile and Maximum Estimation", NeurIPS 2023), as a monotone
AboveThreshold on exact discrete-Laplace noise over integer counts.

The candidates
--------------
A public, data-independent ladder of magnitudes ``m_0 = 0 < m_1 < m_2 < ...``: ``m_j = u * 1.1**(j-1)``
up to ``2**50`` (about 1e15), with ``u = 2**-20`` by default. With a public ``granularity`` ``g``
(integral data: 1, cents: 0.01) the ladder starts at ``u = g`` and every magnitude is rounded to
a multiple of ``g`` (duplicates dropped): integral data is searched on integers, and no candidate
is wasted between 0 and the first representable value. The full grid (:func:`candidate_grid`) is
``-m[::-1]`` and ``m``.

The search: outwards from 0, one side per sign
----------------------------------------------
The upper bound is searched over ``0, m_1, m_2, ...`` with the counts ``C_j = #{x > m_j}``; the
lower bound is the mirror image (``#{x < -m_j}`` over ``0, -m_1, ...``). Each side is a monotone
AboveThreshold: draw ``rho ~ DLap(1/eps_1)`` once and ``nu_j ~ DLap(1/eps_2)`` per candidate,
``eps_1 = 0.75 eps_side``, ``eps_2 = 0.25 eps_side``, and stop at the first ``j`` with
``C_j + nu_j <= T + rho``; the raw bound is ``m_j`` (``-m_j`` below). The upper side reads only
rows ``x > 0`` and the lower side only rows ``x < 0``: they see disjoint rows.

Why it cannot run away (the failure bound)
------------------------------------------
Call a side *failed* when it stops more than ``L = 30`` candidates beyond the data's extreme on
its side (beyond the first ``m_j >= max(x)`` for the upper side; candidate 0 when no row is
positive). Both searches start at 0 and walk outwards, so a stop before the data's extreme is
inside the data's hull (together with 0) and can only make the bounds tighter; running past the
data is the only way out. Past the extreme every count is 0, so, given ``rho = r``, each of the
next ``L`` candidates fires independently with probability ``F(T + r) = P(nu <= T + r)``, and

    P(failed) = sum_r P(rho = r) (1 - F(T + r))**L =: B(T).

``B`` is computed in closed form for the two discrete-Laplace laws (:func:`overshoot_bound`, the
tail ``|r| > R`` of ``rho`` counted as failure in full) and ``T`` is the smallest integer with
``B(T) <= 4e-7`` (:func:`side_threshold`; e.g. ``T = 56`` rows at ``eps_side = 0.18``, 11
at 0.9). A large share for ``rho`` is what makes this cheap: a very negative ``rho`` is what keeps a
search going past the data, and ``B`` falls like ``exp(-eps_1 T) (L/2)**(-eps_1/eps_2)``. By the
union bound over the two sides, **the released bounds are garbage with probability below
8e-7 < 1e-6, for every dataset**: with probability at least ``1 - 8e-7`` each raw bound lies
within ``L`` ladder steps of the data, so its magnitude is at most ``M = 1.1**31 max(|x|_max, u)
< 19.2 max(|x|_max, u)`` (the first candidate at or past the extreme is within a factor 1.1 of
it; with a granularity ``g``, rounding to multiples of ``g`` adds at most ``31 g``), and after the
widening below (``w <= 2``) each released bound has magnitude at most ``5 M``. For data whose hull
holds 0 (signed data, or non-negative data that reaches down to about 0), ``|x|_max`` is at most
the data's span, so no released bound lies more than 96 spans (plus ``155 g``) outside the data;
data far from 0 relative to its spread (timestamps, years) get bounds reaching down to 0 (Notes).

Data too small for the budget
-----------------------------
Before any search, a gate decides whether there are enough rows for the searches to see the data
at all: ``n_min = 2 (T + 2 ceil(1/eps_2))`` rows (:func:`min_rows`; 204 at the defaults and
epsilon = 1 under add/remove, 42 at epsilon = 5). Under swap ``n`` is public and is compared
directly; under add/remove a public ``n_hint`` is used when given, else a noisy count
``n + DLap(1/eps_c)`` bought with ``eps_c = 0.1`` of the bounds budget. Below ``n_min`` the step raises
:class:`~dpq_spark.core.errors.BoundsNotFoundError` (the budget of the count is spent; nothing is
released). The failure bound above does not depend on the gate: a release that passes it with
few rows gets tight or useless bounds, never far ones.

Widening
--------
The stopping points leave about ``T`` rows beyond them (more at small ``n``, where the per-candidate
noise stops the search early), so each raw bound that is not 0 moves out by ``w`` times the
distance between the raw bounds: ``w = min(2, 16 T / n)``, with ``n`` the public row count
(swap), the hint, or the gate's noisy count (post-processing of a released value). Deciles lose
little to loose bounds and much to bounds that cut the tails: at n = 500 ``w = 2`` gave 1.04-1.25x
the data-range error where ``w = 1`` gave 1.2-1.3x (80 repetitions). A raw bound at 0 (no rows,
or fewer than about ``T``, on that side) stays at 0. If both raw bounds are 0, the bounds are
``[-m_1, m_1]``. All of this is post-processing of the released stopping points.

Notes
-----
The bounds always contain 0. For data far from 0 relative to its spread (epoch timestamps, years,
temperatures in kelvin) they are therefore loose, and the release is better with a public offset
subtracted first, or with bounds.

Accuracy (``benchmarks/bench_bounds.py``; docs/choosing_parameters.md has the tables): bounds-free
JointExp deciles at epsilon = 1 under add/remove came within 1.5x of the error with the data's own
range as bounds at n = 500 and 1e5 on N(0, 5), Student-t(2), log-normal incomes and Goodreads
page counts. Under swap each side gets half the bounds budget, and near 0 the ladder is fine
(about 145 candidates between ``2**-20`` and 1), so data centred on 0 with few rows for the budget
is stopped early by the per-candidate noise: at n = 500 and epsilon = 1 under swap, N(0, 5)
deciles had about 9x the data-range error (at n = 1e5, 1.2x). A granularity, more epsilon or
add/remove neighbours avoid it.
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass

import numpy as np

from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.core.randomness.dlap_table import dlap_many, dlap_table
from dpq_spark.core.randomness.samplers import dlap_scale
from dpq_spark.core._validation import (
    _is_real,
    check_counts,
    check_epsilon,
    check_granularity,
    check_quantiles,
    check_values,
)
from dpq_spark.core.accounting.neighboring import NeighboringRelation
from dpq_spark.core.errors import BoundsNotFoundError
from dpq_spark.core.quantiles.release import QuantileRelease

__all__ = ["PrivateBounds", "private_bounds", "candidate_grid", "min_rows", "side_threshold",
           "overshoot_bound", "DEFAULT_BOUNDS_SHARE", "WIDEN", "FAILURE_PROBABILITY"]

#: Share of epsilon spent on private bounds when ``lower``/``upper`` are missing.
DEFAULT_BOUNDS_SHARE = 0.2
#: Each raw bound (other than 0) moves out by this share of the distance between them.
WIDEN = 2.0
UNIT = 2.0**-20
RATIO = 1.1
_TOP = 2.0**50
#: Share of a side's epsilon given to the threshold noise ``rho`` (the rest to each ``nu_j``).
THRESHOLD_SHARE = 0.75
#: A side fails when it stops more than this many ladder steps beyond the data's extreme.
OVERSHOOT_STEPS = 30
#: Bound on the probability that one side fails (two sides: twice this).
SIDE_FAILURE = 4e-7
#: Bound on the probability that the released bounds are garbage (both sides, union bound).
FAILURE_PROBABILITY = 2 * SIDE_FAILURE
#: Share of the bounds budget spent on the noisy row count of the gate (add/remove, no n_hint).
COUNT_SHARE = 0.1


@functools.lru_cache(maxsize=16)
def _ladder(unit: float) -> np.ndarray:
    """The public magnitudes ``0 = m_0 < m_1 < ...`` (read-only), multiples of ``unit`` when
    ``unit`` is a granularity."""
    j = np.arange(int(math.ceil(math.log(_TOP / unit) / math.log(RATIO))) + 1)
    mags = unit * RATIO ** j.astype(np.float64)
    if unit != UNIT:  # a granularity: round to its multiples, drop repeats
        mags = np.unique(np.maximum(np.round(mags / unit), 1.0)) * unit
    out = np.concatenate([[0.0], mags])
    out.setflags(write=False)
    return out


def candidate_grid(granularity=None) -> np.ndarray:
    """The public candidate grid, ascending and symmetric around 0 (read-only float64 array)."""
    mags = _ladder(UNIT if granularity is None else check_granularity(granularity))
    grid = np.concatenate([-mags[:0:-1], mags])
    grid.setflags(write=False)
    return grid


@dataclass(frozen=True)
class PrivateBounds:
    """Bounds released by :func:`private_bounds` (public once released).

    Attributes
    ----------
    lower, upper : float
        The bounds to clamp to (``lower < upper``).
    epsilon : float
        Budget spent on them.
    raw_lower, raw_upper : float
        The candidates the two searches stopped at, before widening (``None`` for a side the
        user gave).
    """

    lower: float
    upper: float
    epsilon: float
    raw_lower: float | None
    raw_upper: float | None


def _dlap_cdf(scale: float, t: np.ndarray) -> np.ndarray:
    """``P(nu <= t)`` for ``nu ~ DLap(scale)`` (``P(y) ∝ exp(-|y| / scale)``), integer ``t``."""
    a = math.exp(-1.0 / scale)
    t = np.asarray(t, dtype=np.float64)
    # both exponents >= 0 (np.where evaluates both sides): no overflow when a is 0 or tiny
    below = a ** np.maximum(-t, 0.0) / (1.0 + a)
    above = 1.0 - a ** np.maximum(t + 1.0, 0.0) / (1.0 + a)
    return np.where(t < 0, below, above)


def overshoot_bound(threshold: int, rho_scale, nu_scale, steps: int = OVERSHOOT_STEPS) -> float:
    """``P(a side walks more than `steps` candidates past the data)`` for threshold ``T``:
    ``sum_r P(rho = r) (1 - P(nu <= T + r))**steps``, with ``P(|rho| > R)`` added in full."""
    s1, s2 = float(rho_scale), float(nu_scale)
    a = math.exp(-1.0 / s1)
    reach = int(80 * s1) + 10
    r = np.arange(-reach, reach + 1)
    p = (1.0 - a) / (1.0 + a) * a ** np.abs(r).astype(np.float64)
    miss = 1.0 - _dlap_cdf(s2, threshold + r)
    tail = 2.0 * a ** (reach + 1) / (1.0 + a)
    return float(np.sum(p * miss**steps) + tail)


def _scales(eps_side: float):
    return (dlap_scale(1, THRESHOLD_SHARE * eps_side),
            dlap_scale(1, (1.0 - THRESHOLD_SHARE) * eps_side))


@functools.lru_cache(maxsize=256)
def side_threshold(eps_side: float) -> int:
    """The smallest integer ``T >= 0`` with ``overshoot_bound(T) <= SIDE_FAILURE`` at ``eps_side``."""
    rho_scale, nu_scale = _scales(eps_side)
    if overshoot_bound(0, rho_scale, nu_scale) <= SIDE_FAILURE:
        return 0
    lo, hi = 0, max(1, int(math.ceil(rho_scale)))
    while overshoot_bound(hi, rho_scale, nu_scale) > SIDE_FAILURE:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:  # B(T) decreases in T
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if overshoot_bound(mid, rho_scale, nu_scale) > SIDE_FAILURE else (lo, mid)
    return hi


def min_rows(eps_side: float) -> int:
    """The gate's rule: ``2 (T + 2 ceil(1 / eps_2))`` rows for a side budget ``eps_side``."""
    _, nu_scale = _scales(eps_side)
    return 2 * (side_threshold(eps_side) + 2 * math.ceil(nu_scale))


def _stops(counts_beyond: np.ndarray, rho_scale, nu_scale, threshold: int, source) -> np.ndarray:
    """One monotone AboveThreshold search per row of ``counts_beyond`` (shape ``(G, M)``, in
    search order): the index of the first candidate with ``count + nu <= T + rho``, or the last
    index if nothing fires. Draws ``rho`` for every row, then the ``nu`` of every row's
    candidates in order, from the exact discrete-Laplace table sampler (16 random bits a draw)."""
    G, M = counts_beyond.shape
    rho = dlap_table(rho_scale).sample(source, G).reshape(G, 1)
    nu = dlap_table(nu_scale).sample(source, G * M).reshape(G, M)
    fires = counts_beyond + nu <= threshold + rho
    return np.where(fires.any(axis=1), fires.argmax(axis=1), M - 1)


def _check_share(value, name: str) -> float:
    if not _is_real(value) or not math.isfinite(float(value)) or not 0.0 < float(value) < 1.0:
        raise ValueError(f"`{name}` must be in (0, 1), got {value!r}")
    return float(value)


def _check_bound(value, name: str) -> float | None:
    if value is None:
        return None
    if not _is_real(value) or not math.isfinite(float(value)):
        raise ValueError(f"`{name}` must be a finite real number or None, got {value!r}")
    return float(value)


def private_bounds(
    values,
    *,
    epsilon,
    lower=None,
    upper=None,
    neighboring="add_remove",
    counts=None,
    n_hint=None,
    granularity=None,
    rng=None,
) -> PrivateBounds:
    """Release clamping bounds for ``values`` with ``epsilon``-DP, needing no bounds itself.

    The search and its failure bound are in the module notes: two monotone AboveThreshold
    searches walk outwards from 0 over a public ladder of magnitudes, one per sign, after a
    gate that refuses data too small for the budget.

    Parameters
    ----------
    values : array-like of float
        The private data (NaN is an error; +-inf is allowed and lands beyond the ladder).
    epsilon : float
        Budget for the bounds, finite and > 0.
    lower, upper : float, optional
        A side given here is public and is not searched.
    neighboring : {"add_remove", "swap"}, optional
        Neighbouring relation; under swap ``n`` is public (the gate reads it, nothing is spent on
        a count).
    counts : array-like of int, optional
        Multiplicities of ``values``.
    n_hint : float, optional
        A public guess of the row count under add/remove: the gate reads it instead of buying a
        noisy count (and the widening uses it like ``n``).
    granularity : float, optional
        Public resolution of the data (1 for integers): the ladder starts at it and its
        candidates are its multiples.
    rng : numpy.random.Generator or None, optional
        Source of randomness; ``None`` uses the OS CSPRNG.

    Returns
    -------
    PrivateBounds

    Raises
    ------
    ValueError
        If an argument breaks its rule, or both bounds are given (nothing to release).
    BoundsNotFoundError
        If the gate finds fewer than :func:`min_rows` rows for the budget: the public ``n``
        (swap), ``n_hint``, or else the noisy count (whose budget is then spent). The error
        states the rule and the budget, never a count.

    Privacy
    -------
    ``epsilon``-DP (pure) under the chosen neighbouring relation, one row as the unit of
    privacy; the candidate ladder, thresholds, gate rule and widening are public, and only the
    gate's decision and the two stopping points are released. Under add/remove without
    ``n_hint``, the noisy count spends ``eps_c = 0.1 epsilon`` and each searched side
    ``eps_side = 0.9 epsilon`` (all of ``epsilon`` with ``n_hint``): a row is positive, negative
    or 0, so adding or removing it changes the counts of one side at most (parallel
    composition), and each side is a monotone AboveThreshold (Lyu, Su and Li, "Understanding the
    Sparse Vector Technique", VLDB 2017, Theorem 4: ``eps_1 + eps_2 = eps_side`` for any number
    of candidates; every count of a side moves in the same direction between neighbours). So the
    whole is ``eps_c + eps_side = epsilon``. Under swap ``n`` is public, nothing is spent on the
    count, and a replaced row can change both sides (it leaves one and joins the other, or is
    raised or lowered within one: each a monotone change), so with both sides searched each gets
    ``epsilon / 2``. Discrete Laplace on integer counts keeps the proof exact.

    Guarantee against run-away bounds, by construction: with probability at least
    ``1 - 8e-7`` over the noise, for every dataset, each raw bound lies within 30 ladder steps
    beyond the data's extreme on its side (a factor below 19.2 in magnitude; module notes).
    """
    eps = check_epsilon(epsilon)
    lo_given = _check_bound(lower, "lower")
    hi_given = _check_bound(upper, "upper")
    if lo_given is not None and hi_given is not None:
        raise ValueError("`lower` and `upper` are both given: there are no bounds to release")
    relation = NeighboringRelation.parse(neighboring)
    if n_hint is not None and (not _is_real(n_hint) or not float(n_hint) >= 1 or not math.isfinite(float(n_hint))):
        raise ValueError(f"`n_hint` must be a finite number >= 1, got {n_hint!r}")
    unit = UNIT if granularity is None else check_granularity(granularity)
    x = check_values(values)
    c = None if counts is None else check_counts(counts, x.size)
    source = resolve_rng(rng)

    w = np.ones(x.size, dtype=np.int64) if c is None else np.asarray(c, dtype=np.int64)
    sides = int(lo_given is None) + int(hi_given is None)
    gate = bounds_gate(np.array([int(w.sum())]), epsilon=eps, neighboring=relation, sides=sides,
                       n_hint=n_hint, source=source)
    if not gate.passed[0]:
        raise BoundsNotFoundError(epsilon=eps, min_rows=gate.min_rows, judged_by=gate.judged_by)
    return search_bounds(x, w, epsilon=eps, gate=gate, n_public=float(gate.n_public[0]),
                         lower=lo_given, upper=hi_given, unit=unit, source=source)


@dataclass(frozen=True)
class BoundsGate:
    """The gate of :func:`private_bounds` for groups of rows (one entry per group): the row
    count it read (``n_public``: public ``n`` under swap, ``n_hint``, or a noisy count), the
    budget of each searched side, the rows it asks for, what it read, and which groups pass."""

    n_public: np.ndarray
    eps_sides: float
    min_rows: int
    judged_by: str
    passed: np.ndarray


def bounds_gate(totals: np.ndarray, *, epsilon: float, neighboring, sides: int = 2, n_hint=None,
                source) -> BoundsGate:
    """:func:`private_bounds`' gate for groups of ``totals`` rows (int array), each with the
    bounds budget ``epsilon`` and ``sides`` sides to search (arguments validated by the caller;
    ``neighboring`` a NeighboringRelation, ``source`` a RandomSource). Under add/remove without
    ``n_hint`` every group's noisy count ``n + DLap(1 / (COUNT_SHARE epsilon))`` is drawn in one
    array (:func:`~dpq_spark.core.randomness.dlap_table.dlap_many`, also for one group), so a batch of groups draws what that many calls of :func:`private_bounds` would
    draw in law, and a batch of one what one call draws, seed for seed.

    Privacy: the noisy count is ``COUNT_SHARE epsilon``-DP for each group (sensitivity 1 under
    add/remove); under swap ``n`` is public and nothing is spent; ``n_hint`` is public."""
    totals = np.asarray(totals, dtype=np.int64)
    if neighboring is NeighboringRelation.SWAP:
        n_public, eps_sides, judged_by = totals.astype(np.float64), epsilon / sides, "n (public under swap)"
    elif n_hint is not None:
        n_public, eps_sides, judged_by = np.full(totals.size, float(n_hint)), epsilon, "n_hint"
    else:
        noise = dlap_many(source, dlap_scale(1, COUNT_SHARE * epsilon), totals.size)
        n_public = (totals + noise).astype(np.float64)
        eps_sides, judged_by = (1.0 - COUNT_SHARE) * epsilon, "the noisy row count"
    n_min = min_rows(eps_sides)
    return BoundsGate(n_public, eps_sides, n_min, judged_by, n_public >= n_min)


def search_bounds(x: np.ndarray, w: np.ndarray, *, epsilon: float, gate: BoundsGate,
                  n_public: float, lower=None, upper=None, unit: float = UNIT,
                  source) -> PrivateBounds:
    """:func:`private_bounds` after its gate, for one group that passed it: the two searches
    (or the one of a missing side) on the values ``x`` with integer weights ``w`` (validated),
    at ``gate.eps_sides`` each, then the widening by ``n_public`` (the gate's count of this
    group). ``epsilon`` is the whole bounds budget (recorded in the result). The one-group
    case of :func:`search_bounds_many`: the same draws in the same order."""
    found = search_bounds_many(x, w, np.array([0, x.size]), eps_sides=gate.eps_sides,
                               n_public=np.array([float(n_public)]), lower=lower, upper=upper,
                               unit=unit, source=source)
    lo, hi, raw_lo, raw_hi = (float(a[0]) for a in found)
    return PrivateBounds(lo, hi, epsilon, raw_lo if lower is None else None,
                         raw_hi if upper is None else None)


#: ladder candidates (times groups) whose counts and noise :func:`search_bounds_many` holds at
#: once: about 2 MiB an array
_SEARCH_CELLS = 1 << 18


def _beyond_counts(values, weights, groups, size: int, mags: np.ndarray) -> np.ndarray:
    """``#{v > m_j}`` (weighted) per group (rows, ``groups`` in ``[0, size)``) and candidate
    ``m_j`` of the ladder ``mags`` (columns): one search of the ladder places every value,
    ``#{m_j < v}`` (so ``v > m_j`` iff ``j`` is below it), and each group's histogram of those
    places is summed from the top."""
    M = mags.size
    at = np.searchsorted(mags, values, side="left")
    hist = np.bincount(groups * (M + 1) + at, weights=weights, minlength=size * (M + 1))
    hist = hist.reshape(size, M + 1).astype(np.int64)  # sums of integers below 2**53: exact
    return np.cumsum(hist[:, :0:-1], axis=1)[:, ::-1]  # column j: the sum over places > j


def search_bounds_many(x: np.ndarray, w: np.ndarray, starts: np.ndarray, *, eps_sides: float,
                       n_public: np.ndarray, lower=None, upper=None, unit: float = UNIT,
                       source) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The searches and widening of :func:`search_bounds` for G groups that passed the gate,
    as arrays over all of them.

    Group g holds the values ``x[starts[g]:starts[g + 1]]`` (validated, any order) with integer
    weights ``w``; ``n_public[g]`` is its gate's count; every group has the side budget
    ``eps_sides`` and the same given ``lower``/``upper`` (None: searched). Returns float64
    arrays ``(lower, upper, raw_lower, raw_upper)`` (a raw side that was given is NaN).

    Each side's counts ``#{x > m_j}`` come from one histogram of the values' ladder positions
    (``#{m_j < v}``, one search of the sorted ladder for all values), summed from the top. The
    noise of a side is drawn for a chunk of groups at once, ``rho`` for each group of the chunk
    then the ``nu`` of each group's candidates in order, upper side first. For one group that
    is exactly :func:`search_bounds`' order of draws from ``source``; for several, each group's
    searches have the same law, independent across groups.

    Privacy: each group's release is :func:`private_bounds`' after its gate (that docstring),
    on its own rows; groups are disjoint, so parallel composition applies.
    """
    starts = np.asarray(starts, dtype=np.int64)
    G = starts.size - 1
    mags = _ladder(unit)
    M = mags.size
    rho_scale, nu_scale = _scales(eps_sides)
    threshold = side_threshold(eps_sides)
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.int64)

    searched = [name for name, given in (("upper", upper), ("lower", lower)) if given is None]
    stops = {name: np.empty(G, dtype=np.int64) for name in searched}
    chunk = max(1, _SEARCH_CELLS // M)
    for a in range(0, G, chunk):
        b = min(G, a + chunk)
        v, c = x[starts[a]:starts[b]], w[starts[a]:starts[b]]
        gid = np.repeat(np.arange(b - a), np.diff(starts[a:b + 1]))
        for name in searched:  # the upper side first, as search_bounds
            side = v > 0 if name == "upper" else v < 0
            counts = _beyond_counts(np.abs(v[side]), c[side], gid[side], b - a, mags)
            stops[name][a:b] = _stops(counts, rho_scale, nu_scale, threshold, source)
    raw_hi = mags[stops["upper"]] if upper is None else np.full(G, np.nan)
    raw_lo = -mags[stops["lower"]] if lower is None else np.full(G, np.nan)
    lo = raw_lo if lower is None else np.full(G, float(lower))
    hi = raw_hi if upper is None else np.full(G, float(upper))
    if lower is not None and upper is None:
        hi = np.maximum(hi, lo)  # a given bound on the far side of the searched one
    elif upper is not None and lower is None:
        lo = np.minimum(lo, hi)
    span = hi - lo
    widen = np.minimum(WIDEN, 16.0 * max(threshold, 1) / np.asarray(n_public, dtype=np.float64))
    step = float(mags[1])
    wide = span > 0  # else lo == hi: each searched side moves out by the first candidate
    if lower is None:
        lo = np.where(wide, np.where(raw_lo != 0.0, lo - widen * span, lo), lo - step)
    if upper is None:
        hi = np.where(wide, np.where(raw_hi != 0.0, hi + widen * span, hi), hi + step)
    return lo, hi, raw_lo, raw_hi


def with_private_bounds(mechanism):
    """Wrap a quantile mechanism so that ``lower`` and ``upper`` become optional.

    The wrapped function has the mechanism's signature plus ``bounds_share`` (default
    :data:`DEFAULT_BOUNDS_SHARE`) and ``n_hint``. With both bounds given it is the mechanism
    itself, at the full ``epsilon``. With a bound missing it first releases the missing bound(s)
    with :func:`private_bounds` at ``bounds_share * epsilon`` (passing the mechanism's
    ``granularity``, if any, to the search) and then runs the mechanism inside them at
    ``(1 - bounds_share) * epsilon``.

    Raises
    ------
    BoundsNotFoundError
        When :func:`private_bounds` finds the data too small for the bounds budget (its gate);
        the quantile step does not run, and ``bounds_share * epsilon`` is spent.

    Privacy
    -------
    ``epsilon``-DP (pure) for the pair of steps by basic composition, under the mechanism's
    neighbouring relation with one row as the unit: the bounds are ``bounds_share * epsilon``-DP
    and the quantiles, given the released bounds, are ``(1 - bounds_share) * epsilon``-DP. The
    released bounds are public afterwards (they are attached to the result).
    """

    @functools.wraps(mechanism)
    def wrapped(values, quantiles, *, epsilon, lower=None, upper=None, neighboring="add_remove",
                counts=None, rng=None, bounds_share=DEFAULT_BOUNDS_SHARE, n_hint=None, **extra):
        if lower is not None and upper is not None:
            return mechanism(values, quantiles, epsilon=epsilon, lower=lower, upper=upper,
                             neighboring=neighboring, counts=counts, rng=rng, **extra)
        eps = check_epsilon(epsilon)
        share = _check_share(bounds_share, "bounds_share")
        # Validate what the second step needs before the first one reads the data.
        check_quantiles(quantiles)
        granularity = extra.get("granularity")
        if granularity is not None:
            check_granularity(granularity)
        source = resolve_rng(rng)
        found = private_bounds(values, epsilon=share * eps, lower=lower, upper=upper,
                               neighboring=neighboring, counts=counts, n_hint=n_hint,
                               granularity=granularity, rng=source)
        out = mechanism(values, quantiles, epsilon=(1.0 - share) * eps, lower=found.lower,
                        upper=found.upper, neighboring=neighboring, counts=counts, rng=source, **extra)
        return QuantileRelease(out, mechanism=mechanism.__name__, lower=found.lower, upper=found.upper,
                               bounds="private", epsilon=eps)

    wrapped.__wrapped_mechanism__ = mechanism
    # functools.wraps sets __wrapped__, so inspect.signature would show the base mechanism's
    # required bounds: state the wrapper's own call signature instead.
    wrapped.__signature__ = _optional_bounds_signature(mechanism)
    return wrapped


@functools.lru_cache(maxsize=None)  # auto() wraps a base mechanism on every call
def _optional_bounds_signature(mechanism) -> inspect.Signature:
    """The signature of ``with_private_bounds(mechanism)``: the mechanism's, with ``lower`` and
    ``upper`` defaulting to None, and the keyword-only ``bounds_share`` and ``n_hint`` added."""
    base = inspect.signature(mechanism)
    params = [p.replace(default=None, annotation="float | None") if p.name in ("lower", "upper")
              else p for p in base.parameters.values()]
    kw = inspect.Parameter.KEYWORD_ONLY
    params += [inspect.Parameter("bounds_share", kw, default=DEFAULT_BOUNDS_SHARE,
                                 annotation="float"),
               inspect.Parameter("n_hint", kw, default=None, annotation="int | None")]
    return base.replace(parameters=params)
