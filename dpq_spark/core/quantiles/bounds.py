"""Private clamping bounds, for quantile releases without user-supplied ``lower``/``upper``.

Every quantile mechanism of dpq_spark needs bounds ``[lower, upper]`` chosen without looking at
the data, and bounds chosen too wide cost a lot of accuracy (30 JointExp quantiles of 1,000
N(0, 5) values at epsilon = 1: mean absolute error 0.48 with bounds +-100, 319 with +-1e4; see
docs/choosing_parameters.md). When the user has none,
:func:`private_bounds` spends a stated share of the budget to find them from the data itself with
a mechanism that needs no bounds: Durfee's AboveThreshold over an exponentially growing public
sequence of candidates (D. Durfee, "Unbounded Differentially Private Quantile and Maximum
Estimation", NeurIPS 2023), on exact discrete-Laplace noise over integer counts.

The candidates
--------------
A public, data-independent grid symmetric around 0: ``0`` and ``+-UNIT * RATIO**j`` for
``j = 0 .. J`` with ``UNIT = 2**-20``, ``RATIO = 1.1`` and ``J`` such that the last point
exceeds ``2**50`` (about 1e15): about 1,000 points, resolution 10% of the magnitude away from 0 and
``2**-20`` near 0. (A finer ratio, 1.05, stops early more often at n = 500: more candidates where
the count crosses the threshold give the noise more chances; a coarser one, 1.2, overshoots
further when the threshold noise is very negative: the search then runs on past the data, and
each step beyond multiplies the bound by the ratio.) The same grid is what the Spark layer buckets values into (see
``docs/choosing_parameters.md``).

One side (the upper bound; the lower is the mirror image)
----------------------------------------------------------
Walk the grid upwards ``g_0 < g_1 < ...`` and ask ``C_i = #{x > g_i}`` (an integer count of
sensitivity 1). With ``rho ~ DLap(1 / epsilon_1)`` and ``nu_i ~ DLap(1 / epsilon_2)``,
``epsilon_1 = epsilon_2 = epsilon_side / 2``, stop at the first ``i`` with
``C_i + nu_i <= T + rho`` and output ``g_i``. ``T = 2 * ceil(1 / epsilon_2)`` rows, capped at
``n / 8`` when ``n`` is public (swap) or hinted. Between neighbouring datasets every ``C_i`` moves
in the same direction (adding, removing or raising a row never lowers any count above), so the
monotone AboveThreshold of Lyu, Su and Li ("Understanding the Sparse Vector Technique", VLDB 2017,
Theorem 4: ``epsilon_1 + epsilon_2``) is ``epsilon_side``-DP, for any
number of candidates. Discrete Laplace on integer counts keeps the proof exact (integer shifts).

The stopping point leaves about ``T`` rows above it (fewer when the data ends before that).
Clamping those rows does not move any quantile below rank ``n - T``; at small ``n`` ``T`` is a
large share of the rows, so both raw bounds ``lo_raw <= hi_raw`` are widened by ``WIDEN = 1``
times their distance on each side: ``[lo_raw - w s, hi_raw + w s]``, ``s = hi_raw - lo_raw`` (a
function of the two released points: post-processing). When ``n`` is public (swap) or hinted,
``w = min(1, 16 T / n)``: at large ``n`` the raw bounds already leave only a sliver of rows
outside, and widening would only loosen them. If both land on the same point, the
neighbouring grid points are used.

(A 2:1 split towards the threshold makes the overshoot below rarer but stops the search earlier
in the data: deciles of 500 N(0, 5) values got 3.5x worse; the even split is the default.)

Tuned on N(0, 5), Goodreads ratings and log-normal incomes (deciles at epsilon = 1, n = 500 and
1e5; ``benchmarks/choosing_parameters.py``); the defaults need about ``n >= 40 / epsilon_bounds``
rows: below that the noise of the counts is as large as the data and the bounds are arbitrary.
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass

import numpy as np

from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.core.randomness.samplers import discrete_laplace, dlap_scale
from dpq_spark.core._validation import (
    _is_real,
    check_counts,
    check_epsilon,
    check_granularity,
    check_quantiles,
    check_values,
)
from dpq_spark.core.accounting.neighboring import NeighboringRelation
from dpq_spark.core.quantiles.release import QuantileRelease

__all__ = ["PrivateBounds", "private_bounds", "candidate_grid", "DEFAULT_BOUNDS_SHARE", "WIDEN"]

#: Share of epsilon spent on private bounds when ``lower``/``upper`` are missing.
DEFAULT_BOUNDS_SHARE = 0.2
#: Each raw bound moves out by this share of the distance between them.
WIDEN = 1.0
UNIT = 2.0**-20
RATIO = 1.1
_TOP = 2.0**50


@functools.lru_cache(maxsize=1)
def candidate_grid() -> np.ndarray:
    """The public candidate grid, ascending (read-only float64 array)."""
    j = np.arange(int(math.ceil(math.log(_TOP / UNIT) / math.log(RATIO))) + 1)
    pos = UNIT * RATIO ** j.astype(np.float64)
    grid = np.concatenate([-pos[::-1], [0.0], pos])
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
        The grid points the two searches stopped at, before widening (``None`` for a side the
        user gave).
    """

    lower: float
    upper: float
    epsilon: float
    raw_lower: float | None
    raw_upper: float | None


#: The search stops where about ``THRESHOLD_SCALES`` noise scales of rows are left beyond.
THRESHOLD_SCALES = 2
#: Share of a side's epsilon given to the threshold noise (the rest to the per-candidate noise).
THRESHOLD_SHARE = 0.5


def _threshold(scale, n_public) -> int:
    t = THRESHOLD_SCALES * math.ceil(scale)
    if n_public is not None:
        t = min(t, max(1, int(n_public // 8)))
    return t


def _search(counts_beyond: np.ndarray, rho_scale, nu_scale, threshold: int, source,
            runs: int | None = None):
    """Index of the first candidate with ``count + nu <= T + rho`` (monotone AboveThreshold).

    ``counts_beyond`` is in search order; the last index is returned if nothing fires. With
    ``runs`` it performs that many independent searches at once (for the statistical tests) and
    returns an array of indices.
    """
    size = 1 if runs is None else int(runs)
    rho = discrete_laplace(source, rho_scale, size=(size, 1))
    nu = discrete_laplace(source, nu_scale, size=(size, counts_beyond.size))
    fires = counts_beyond[None, :] + nu <= threshold + rho
    first = np.where(fires.any(axis=1), fires.argmax(axis=1), counts_beyond.size - 1)
    return int(first[0]) if runs is None else first


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
    rng=None,
) -> PrivateBounds:
    """Release clamping bounds for ``values`` with ``epsilon``-DP, needing no bounds itself.

    Parameters
    ----------
    values : array-like of float
        The private data (NaN is an error; +-inf is allowed and lands beyond the grid).
    epsilon : float
        Budget for the bounds, finite and > 0; split evenly between the sides searched.
    lower, upper : float, optional
        A side given here is public and is not searched (its budget goes to the other side).
    neighboring : {"add_remove", "swap"}, optional
        Neighbouring relation; under swap ``n`` is public and caps the threshold at ``n / 8``.
    counts : array-like of int, optional
        Multiplicities of ``values``.
    n_hint : float, optional
        A public guess of the row count under add/remove (caps the threshold like ``n``).
    rng : numpy.random.Generator or None, optional
        Source of randomness; ``None`` uses the OS CSPRNG.

    Returns
    -------
    PrivateBounds

    Raises
    ------
    ValueError
        If an argument breaks its rule, or both bounds are given (nothing to release).

    Privacy
    -------
    ``epsilon``-DP (pure) under the chosen neighbouring relation, one row as the unit of
    privacy: each searched side is a monotone AboveThreshold (``epsilon_side``-DP for any number
    of candidates) and the sides compose (basic composition). The candidate grid, the threshold
    and the widening are public. Only the two stopping points are released.
    """
    eps = check_epsilon(epsilon)
    lo_given = _check_bound(lower, "lower")
    hi_given = _check_bound(upper, "upper")
    if lo_given is not None and hi_given is not None:
        raise ValueError("`lower` and `upper` are both given: there are no bounds to release")
    relation = NeighboringRelation.parse(neighboring)
    if n_hint is not None and (not _is_real(n_hint) or not float(n_hint) >= 1 or not math.isfinite(float(n_hint))):
        raise ValueError(f"`n_hint` must be a finite number >= 1, got {n_hint!r}")
    x = check_values(values)
    c = None if counts is None else check_counts(counts, x.size)
    source = resolve_rng(rng)

    order = np.argsort(x, kind="stable")
    xs = x[order]
    w = np.ones(xs.size, dtype=np.int64) if c is None else np.asarray(c, dtype=np.int64)[order]
    cum = np.concatenate([[0], np.cumsum(w)])
    total = int(cum[-1])
    n_public = total if relation is NeighboringRelation.SWAP else (None if n_hint is None else float(n_hint))

    grid = candidate_grid()
    sides = int(lo_given is None) + int(hi_given is None)
    eps_side = eps / sides
    rho_scale = dlap_scale(1, THRESHOLD_SHARE * eps_side)
    nu_scale = dlap_scale(1, (1.0 - THRESHOLD_SHARE) * eps_side)
    threshold = _threshold(nu_scale, n_public)

    raw_hi = raw_lo = None
    if hi_given is None:
        above = total - cum[np.searchsorted(xs, grid, side="right")]       # #{x > g}, ascending g
        raw_hi = float(grid[_search(above, rho_scale, nu_scale, threshold, source)])
    if lo_given is None:
        below = cum[np.searchsorted(xs, grid, side="left")][::-1]          # #{x < g}, descending g
        raw_lo = float(grid[::-1][_search(below, rho_scale, nu_scale, threshold, source)])

    lo = raw_lo if lo_given is None else lo_given
    hi = raw_hi if hi_given is None else hi_given
    if lo > hi:
        if lo_given is None and hi_given is None:
            lo, hi = hi, lo
        elif lo_given is None:
            lo = hi
        else:
            hi = lo
    span = hi - lo
    widen = WIDEN if n_public is None else min(WIDEN, 16.0 * threshold / n_public)
    if span > 0:
        if lo_given is None:
            lo = lo - widen * span
        if hi_given is None:
            hi = hi + widen * span
    else:
        k = int(np.searchsorted(grid, lo))
        if lo_given is None:
            lo = float(grid[max(k - 1, 0)]) if grid[min(k, grid.size - 1)] >= lo else lo
            lo = min(lo, hi - UNIT)
        if hi_given is None:
            hi = max(float(grid[min(k + 1, grid.size - 1)]), lo + UNIT)
    return PrivateBounds(float(lo), float(hi), eps, raw_lo, raw_hi)


def with_private_bounds(mechanism):
    """Wrap a quantile mechanism so that ``lower`` and ``upper`` become optional.

    The wrapped function has the mechanism's signature plus ``bounds_share`` (default
    :data:`DEFAULT_BOUNDS_SHARE`) and ``n_hint``. With both bounds given it is the mechanism
    itself, at the full ``epsilon``. With a bound missing it first releases the missing bound(s)
    with :func:`private_bounds` at ``bounds_share * epsilon`` and then runs the mechanism inside
    them at ``(1 - bounds_share) * epsilon``.

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
        if extra.get("granularity") is not None:
            check_granularity(extra["granularity"])
        source = resolve_rng(rng)
        found = private_bounds(values, epsilon=share * eps, lower=lower, upper=upper,
                               neighboring=neighboring, counts=counts, n_hint=n_hint, rng=source)
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
