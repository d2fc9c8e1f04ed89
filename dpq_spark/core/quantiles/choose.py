"""``mechanism="auto"``: pick the quantile mechanism from public quantities, never from the data.

The rule
--------
Inputs: ``m`` (the number of quantiles), ``epsilon`` (the budget left for the quantiles) and ``n``
(the row count: public under swap neighbours; under add/remove the user's public ``n_hint``, or
else a noisy count bought with ``count_share * epsilon``). With ``size = n * epsilon``:

=====================================  ======================
condition                              mechanism
=====================================  ======================
``m == 1``                             ``ind_exp``
``size < 25``                          ``histogram`` (16 bins)
``m <= M1 = 35 (size / 1000) ** 0.4``  ``joint_exp``
``m <= M2 = 55 (size / 1000) ** 0.4``  ``approx_quantiles``
otherwise                              ``agg_tree``
=====================================  ======================

(``M1`` and ``M2`` are at least 2.) Where it comes from: ``docs/evaluation.md``'s tables at
``n = 1000``, ``epsilon = 1`` (``benchmarks/results/accuracy_trials.csv``; geometric mean over the
four datasets of the mean missed points): JointExp is best for ``m = 2 .. 30`` (ApproxQuantiles
1.2x worse at 30, 0.87x at 40: crossover about 35), ApproxQuantiles at 40 and 50, AggTree from 60
(0.56 against 0.59 at 50, 0.41 against 0.37 at 60: crossover about 55); at ``m = 1`` IndExp and
JointExp are the same mechanism under swap (0.91x, trial noise) and IndExp is the simpler one.
The crossovers move with ``n * epsilon``: in a check on N(0, 5) (6 trials, swap, bounds +-100;
``benchmarks/choosing_parameters.py --part crossover``) JointExp stayed best up to ``m = 80`` at
``n epsilon = 1e4`` and ``1e5``, while at ``n epsilon = 250`` ApproxQuantiles and AggTree beat it
from ``m = 20-30``. The power 0.4 fits those three points (35 (0.25) ** 0.4 = 20, 35 * 10 ** 0.4 =
88). The rule is a fitted summary of these measurements, not a theorem; it is public, so using it
costs no privacy.

Few rows (``size < 25``). Below about 25 rows' worth of budget every fine mechanism is mostly
noise, and a 16-bin noisy histogram (:func:`~dpq_spark.core.quantiles.agg_tree.histogram`, one count per
bin with noise ``1 / epsilon``) does better: against the previous rule's pick, on N(0, 5) data at
``n = 5 .. 30``, ``epsilon = 0.95``, ``m = 2 .. 99`` and bounds ``+-10``, ``+-50`` and ``+-5e4``
(``benchmarks/choosing_parameters.py --part tiny``; ``docs/choosing_parameters.md``), its mean
absolute error was at most 1.13x and mostly a fraction of it, its mean missed points at most 1.25x
(m = 2 with bounds ``+-10``) and mostly below 1. At ``n = 50`` it starts to lose (1.5x missed
points at m = 2; up to 1.25x with wide bounds and many quantiles), hence the threshold of 25. It
is also the cheapest mechanism (16 noise draws), which matters when a release has many small
groups.
"""

from __future__ import annotations

import math

import numpy as np

from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.core.randomness.samplers import discrete_laplace, dlap_scale
from dpq_spark.core._validation import _is_real, check_counts, check_epsilon, check_quantiles, check_values
from dpq_spark.core.accounting.neighboring import NeighboringRelation
from dpq_spark.core.quantiles._pure import get_base_mechanism
from dpq_spark.core.quantiles.bounds import DEFAULT_BOUNDS_SHARE, with_private_bounds
from dpq_spark.core.quantiles.release import QuantileRelease

__all__ = ["choose_mechanism", "auto", "plan_auto", "DEFAULT_COUNT_SHARE"]

#: Share of epsilon spent on a noisy row count when ``mechanism="auto"`` needs ``n`` under
#: add/remove neighbours and no ``n_hint`` is given.
DEFAULT_COUNT_SHARE = 0.05
#: Below this ``n * epsilon`` (and ``m > 1``) ``"auto"`` runs the 16-bin ``histogram``.
TINY_SIZE = 25.0
_M1, _M2, _POWER, _REF = 35.0, 55.0, 0.4, 1000.0


def choose_mechanism(m, *, n, epsilon) -> str:
    """The mechanism ``"auto"`` runs for ``m`` quantiles of about ``n`` rows at ``epsilon``.

    Only public numbers go in (see the module notes for the rule and where it comes from).

    Raises
    ------
    ValueError
        If ``m`` is not a positive integer, ``n`` is not a finite number >= 0, or ``epsilon`` is
        not finite and > 0.
    """
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"`m` must be an integer >= 1, got {m!r}")
    if not _is_real(n) or not math.isfinite(float(n)) or float(n) < 0:
        raise ValueError(f"`n` must be a finite number >= 0, got {n!r}")
    eps = check_epsilon(epsilon)
    if m == 1:
        return "ind_exp"
    if float(n) * eps < TINY_SIZE:
        return "histogram"
    factor = (max(float(n), 1.0) * eps / _REF) ** _POWER
    if m <= max(2.0, _M1 * factor):
        return "joint_exp"
    if m <= max(2.0, _M2 * factor):
        return "approx_quantiles"
    return "agg_tree"


def plan_auto(m: int, true_n: int, *, epsilon: float, neighboring, source, n_hint=None,
              count_share: float = DEFAULT_COUNT_SHARE, bounds_missing: bool = False,
              bounds_share: float | None = None) -> tuple[str, float, float]:
    """The first step of :func:`auto`: draw the noisy count (if one is needed) and choose.

    Returns ``(name, rest, n_used)``: the mechanism to run, the epsilon left for it (and for the
    private bounds when ``bounds_missing``) and the row count the rule used. Running
    ``with_private_bounds(get_base_mechanism(name))`` on the same data at ``rest`` with the same
    ``source`` afterwards is exactly :func:`auto` (same draws, same order): callers that must
    know the choice before they prepare the data (the Spark fold) use the two steps.
    Arguments are validated by the caller (``source`` a
    :class:`~dpq_spark.core.randomness.source.RandomSource`, ``neighboring`` a ``NeighboringRelation``,
    ``true_n`` the exact count of rows).

    Privacy
    -------
    The noisy count is ``count_share * epsilon``-DP (discrete Laplace, sensitivity 1) under
    add/remove; nothing is spent under swap (n public) or with a public ``n_hint``. The choice is
    post-processing of public values and that count.
    """
    relation = NeighboringRelation.parse(neighboring)
    rest = float(epsilon)
    if relation is NeighboringRelation.SWAP:
        n_used = float(true_n)
    elif n_hint is not None:
        n_used = float(n_hint)
    else:
        noisy = int(true_n) + discrete_laplace(source, dlap_scale(1, count_share * epsilon))
        n_used = float(max(noisy, 0))
        rest = (1.0 - count_share) * epsilon
    if bounds_missing:
        share = DEFAULT_BOUNDS_SHARE if bounds_share is None else bounds_share
        quantile_eps = rest * (1.0 - share)
    else:
        quantile_eps = rest
    return choose_mechanism(int(m), n=n_used, epsilon=quantile_eps), rest, n_used


def _check_share(value, name: str) -> float:
    if not _is_real(value) or not math.isfinite(float(value)) or not 0.0 < float(value) < 1.0:
        raise ValueError(f"`{name}` must be in (0, 1), got {value!r}")
    return float(value)


def auto(values, quantiles, *, epsilon, lower=None, upper=None, neighboring="add_remove", counts=None,
         rng=None, n_hint=None, count_share=DEFAULT_COUNT_SHARE, bounds_share=None, **extra):
    """Release quantiles with the mechanism the public rule picks (``mechanism="auto"``).

    Parameters
    ----------
    values, quantiles, epsilon, neighboring, counts, rng
        As for :func:`dpq_spark.core.joint_exp`.
    lower, upper : float, optional
        Clamping bounds; a missing bound is released privately first (see
        :func:`dpq_spark.core.quantiles.bounds.with_private_bounds`, share ``bounds_share``, default
        :data:`dpq_spark.core.quantiles.bounds.DEFAULT_BOUNDS_SHARE`).
    n_hint : float, optional
        Public guess of the row count, used under add/remove instead of a noisy count.
    count_share : float, optional
        Under add/remove without ``n_hint``: the share of ``epsilon`` spent on a noisy count
        (discrete Laplace, sensitivity 1), default 0.05.
    **extra
        Passed to the chosen mechanism (e.g. ``branching`` for ``agg_tree``).

    Returns
    -------
    QuantileRelease
        The m sorted estimates; ``.mechanism`` names the mechanism that ran.

    Privacy
    -------
    ``epsilon``-DP (pure) under the chosen neighbouring relation, one row as the unit, by basic
    composition of at most three steps: the noisy count (``count_share * epsilon``, only under
    add/remove without ``n_hint``), the private bounds (only when a bound is missing) and the
    chosen mechanism with the rest. The choice itself is a function of public values (``m``,
    ``epsilon``, the public/hinted/released ``n``), so it costs nothing more.
    """
    eps = check_epsilon(epsilon)
    q = check_quantiles(quantiles)
    relation = NeighboringRelation.parse(neighboring)
    share = _check_share(count_share, "count_share")
    bshare = DEFAULT_BOUNDS_SHARE if bounds_share is None else _check_share(bounds_share, "bounds_share")
    if n_hint is not None and (not _is_real(n_hint) or not math.isfinite(float(n_hint)) or float(n_hint) < 0):
        raise ValueError(f"`n_hint` must be a finite number >= 0, got {n_hint!r}")
    x = check_values(values)
    c = None if counts is None else check_counts(counts, x.size)
    source = resolve_rng(rng)

    true_n = int(x.size if c is None else c.sum())
    name, rest, n_used = plan_auto(int(q.size), true_n, epsilon=eps, neighboring=relation,
                                   source=source, n_hint=n_hint, count_share=share,
                                   bounds_missing=lower is None or upper is None,
                                   bounds_share=bshare)
    missing = lower is None or upper is None
    mechanism = with_private_bounds(get_base_mechanism(name))
    out = mechanism(x, q, epsilon=rest, lower=lower, upper=upper, neighboring=relation, counts=c,
                    rng=source, bounds_share=bshare, **extra)
    return QuantileRelease(
        out, mechanism=name,
        lower=getattr(out, "lower", lower), upper=getattr(out, "upper", upper),
        bounds="private" if missing else "given", epsilon=eps, n_used=n_used,
    )
