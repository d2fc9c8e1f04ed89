"""``mechanism="auto"``: pick the quantile mechanism from public quantities, never from the data.

The rule
--------
Inputs, all public: ``m`` (the number of quantiles), ``epsilon`` (the budget left for the
quantiles), ``n`` (the row count: public under swap neighbours; under add/remove the user's public
``n_hint``, or else a noisy count bought with ``count_share * epsilon``) and, when both bounds are
given, the public grid: its step ``granularity`` (declared by the caller) and ``G``, its number of
points between the bounds (:func:`grid_points`). With ``s = n * epsilon``, bands of ``m``
``1 | 2-49 | 50-53 | 54+`` and of ``s`` cut at 25 and at quarter decades (562 = 10**2.75, 1778,
3162, 10**4.75, 10**6.5; and 12,000 for the 12**3 tree), and ``M(s) = 16 (s / 1000) ** 0.6``
between 2 and 16 (2 up to ``s = 31``, 4.0 at 100, 8.0 at 316, 11.3 at 562, 16 from 1000):

=======================  ======  ================================  =========  =========
no declared grid         m = 1   m 2-49                            m 50-53    m >= 54
=======================  ======  ================================  =========  =========
s < 25                   IndExp  histogram                         histogram  histogram
25 <= s < 562            IndExp  JointExp if m <= M(s), else 8x3   8x3        8x3
562 <= s < 1778          IndExp  JointExp if m <= M(s), else 12x3  8x3        8x3
1778 <= s < 3162         IndExp  JointExp (m <= 16), else 12x3     12x3       12x3
3162 <= s < 12000        IndExp  JointExp (m <= 16), else AQ       AQ         12x3
12000 <= s < 10**4.75    IndExp  JointExp (m <= 16), else AQ       AQ         8x4
10**4.75 <= s < 10**6.5  IndExp  JointExp (m <= 16), else AQ       AQ         AggTree
s >= 10**6.5             IndExp  JointExp (m <= 16), else AQ       AQ         AQ
=======================  ======  ================================  =========  =========

with two exceptions for few quantiles (``benchmarks/choosing_small_m.py``): one quantile below
``s = 10**1.25`` (17.8) takes the histogram, and 3, 7 or 15 quantiles (``m + 1`` a power of two,
where ApproxQuantiles' tree of medians is balanced) take ApproxQuantiles from ``s`` = 316, 1000
and 1778 respectively.

A declared grid (``granularity`` given) of ``G <= TYPED_GRID_MAX = 16**4`` points (AggTree's
default leaves then hold at most one grid point each; integers, dates, decimals) has its own rule:

===================  =====  =========  =========  =========  =========  =========
typed grid           m = 1  m = 3      m 2, 4-5   m 6-16     m 17-53    m >= 54
===================  =====  =========  =========  =========  =========  =========
s < 25 m             AQ     histogram  histogram  histogram  histogram  histogram
25 m <= s < 316      AQ     JointExp   JointExp   histogram  histogram  histogram
316 <= s < 3162      AQ     AQ         JointExp   JointExp   histogram  histogram
3162 <= s < 10**6.5  AQ     AQ         JointExp   JointExp   AQ         AggTree
s >= 10**6.5         AQ     AQ         AggTree    AggTree    AggTree    AggTree
===================  =====  =========  =========  =========  =========  =========

(the first line's ``25 m`` is 25 for ``m >= 6``). The histogram wins on integers while a few
quantiles have fewer than about 25 rows' worth of budget each, and JointExp, which lands on the
exact grid points, beats ApproxQuantiles from ``s = 316`` except at m = 3, where ApproxQuantiles'
tree of medians is balanced (``benchmarks/choosing_small_m.py``).

8x3, 12x3 and 8x4 are ``agg_tree_8x3``, ``agg_tree_12x3`` and ``agg_tree_8x4``, AggTree on 8**3,
12**3 and 8**4 leaves (:mod:`~dpq_spark.core.quantiles.sized_tree`; 1778 is ``10**3.25``;
``benchmarks/bench_many_quantiles.py``, 3 December 2026: at m = 99, n = 1e4, epsilon = 1, the
12**3 tree has 0.76x the 16**4 tree's error and 0.91x the 8**4 tree's). The 12**3 tree stops at
``s = 12,000``, where its gain on bounds 20 standard deviations wide (0.80-0.98x the 8**4 tree's
error from ``s`` = 5,623 to 13,335) stops paying for its loss on bounds 200 standard deviations
wide, where its leaves are too wide (1.07-1.25x at ``s = 1e4``, 1.26-1.40x at 13,335). For
50 <= m <= 53 the sized trees only tie ApproxQuantiles from ``s = 10**3.5``, so they stop there.

(AQ = ApproxQuantiles; histogram = 16 bins.) A larger declared grid, or none, gets the first
table; so do callers that pass no grid (bounds missing: the grid is only known after the private
bounds). Below ``s = 3162`` and for fewer than 50 quantiles, ``M(s)`` is where JointExp hands over
to a sized tree: with m large for the rows, JointExp's draw spreads over the empty parts of the
bounds (tens of times the best error with bounds 200 standard deviations wide), while a small
tree's noise does not grow with m. ``benchmarks/choosing_few_rows.py`` (3 December 2026) measures
the choice on eleven data settings (N(0, 5), lognormal and uniform data with bounds 2 to 200
standard deviations wide, and two Goodreads columns) at 27 (m, s) cases; the rule's pick has the
smallest or nearly the smallest worst ratio to the best over the settings in each.

Where the tables come from: ``benchmarks/choosing_auto_grid.py`` (2 December 2026, continuous
rows again on 3 December with the 12**3 tree, and continuous m = 1, 3 and 29 on 4 December with
three to four times the repetitions; the errors in ``benchmarks/results/choosing_auto_grid_errors.csv``, auto's ratio
to the best per case in ``..._ratios.csv``): m in {1, 3, 9, 29, 99, 199}, s in {10, ..., 1e7}
(n up to 1e5, epsilon up to 100), add/remove, bounds given, mean absolute error against the true
quantiles over 8-240 seeded repetitions (half of them for G = 10,001), for N(0, 5) in +-100 (no
grid), two-decimal ratings in [0, 5] (G = 501), integers in [0, 100] (G = 101) and in [0, 1e4]
(G = 10,001). Each cell is the mechanism with the smallest worst ratio to the best over the
measured cases of its band (``benchmarks/choosing_few_rows.py`` and
``benchmarks/choosing_small_m.py`` add data settings where the grid's one setting per kind is not
enough to choose). On 158 of the 168 cases auto's error is within 1.15x of the best explicit
mechanism's; of the other 10, 8 are within two standard errors of it (errors of one grid step
in a few releases, or a close runner-up) and 2 are not, both trade-offs between settings:
integers in [0, 100] at m = 3, ``s = 100`` (1.28x: ApproxQuantiles is best there but 1.33x on
the decimals, and no mechanism is within 1.15x on all three typed columns), and continuous data
at m = 29, ``s = 1000`` (1.25x: the 8**3 tree is best on N(0, 5) in +-100 but 2.51x on the
ratings of ``choosing_few_rows.py``, where the 12**3 tree's worst is 1.64x).
The rule is a fitted summary of these measurements, not a theorem; it is public, so using it
costs no privacy, and it never reads the values.

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

from dpq_spark.core.randomness.grid import Grid
from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.core.randomness.dlap_table import dlap_many
from dpq_spark.core.randomness.samplers import dlap_scale
from dpq_spark.core._validation import (_is_real, check_counts, check_epsilon, check_granularity,
                                        check_quantiles, check_values)
from dpq_spark.core.accounting.neighboring import NeighboringRelation
from dpq_spark.core.quantiles._pure import get_base_mechanism
from dpq_spark.core.quantiles.bounds import DEFAULT_BOUNDS_SHARE, with_private_bounds
from dpq_spark.core.quantiles.release import QuantileRelease

__all__ = ["choose_mechanism", "auto", "plan_auto", "grid_points", "DEFAULT_COUNT_SHARE", "TYPED_GRID_MAX"]

#: Share of epsilon spent on a noisy row count when ``mechanism="auto"`` needs ``n`` under
#: add/remove neighbours and no ``n_hint`` is given.
DEFAULT_COUNT_SHARE = 0.05
#: Below this ``n * epsilon`` (and ``m > 1``) ``"auto"`` runs the 16-bin ``histogram``.
TINY_SIZE = 25.0
#: A declared grid (``granularity`` given) with at most this many points is "typed": AggTree's
#: default 16**4 leaves then hold at most one grid point each.
TYPED_GRID_MAX = 16**4
# n * epsilon band edges (half a decade above 100, 1e3, 1e6) and m band edges (between the
# measured m = 3 | 9, 9 | 29, 29 | 99), from the grid of benchmarks/choosing_auto_grid.py.
_S2, _S3, _S6 = 10**2.5, 10**3.5, 10**6.5
_FEW, _SOME, _MANY = 5, 16, 53
# Fewer than 50 quantiles below n * epsilon = _S3: JointExp up to m = _JE_M (s / _REF) ** _JE_POWER
# (at least 2, at most _SOME), beyond it the 8**3 tree below _S_FEW12 and the 12**3 tree above
# (benchmarks/choosing_few_rows.py).
_JE_M, _JE_POWER, _REF, _S_FEW12 = 16.0, 0.6, 1000.0, 10**2.75
# Many quantiles (m >= _TREES_FROM) without a declared grid: AggTree on 8**3 leaves below
# n * epsilon = _S_TREE3, on 12**3 leaves below _S_TREE12, on 8**4 leaves below _S_TREE4
# (benchmarks/bench_many_quantiles.py).
_TREES_FROM, _S_TREE3, _S_TREE12, _S_TREE4 = 50, 10**3.25, 12_000, 10**4.75
# Small m (benchmarks/choosing_small_m.py): one quantile without a declared grid takes the
# histogram below n * epsilon = _S_ONE_TINY; 3, 7 and 15 quantiles (m + 1 a power of two)
# ApproxQuantiles from _BALANCED[m]; on a typed grid, 2 to _FEW quantiles take the histogram
# below _HIST_PER_Q * m.
_S_ONE_TINY, _HIST_PER_Q = 10**1.25, 25.0
_BALANCED = {3: _S2, 7: _REF, 15: _S_TREE3}


def grid_points(lower, upper, granularity=None) -> int:
    """``G``, the number of points of the public grid on ``[lower, upper]`` with step ``granularity``.

    ``Grid(lower, upper, granularity).size``: ``floor((upper - lower) / granularity) + 1``, and
    ``2**32 + 1`` for the default grid (no granularity). Public arguments only.

    Raises
    ------
    TypeError, ValueError
        For a bad bound or granularity, naming it.
    """
    return Grid(lower, upper, granularity).size


def _continuous(m: int, size: float) -> str:
    """The rule without a declared grid (floats, or the default grid of 2**32 steps)."""
    if m == 1:
        return "histogram" if size < _S_ONE_TINY else "ind_exp"
    if size < TINY_SIZE:
        return "histogram"
    if size >= _BALANCED.get(m, math.inf):  # ApproxQuantiles' tree of medians is balanced
        return "approx_quantiles"
    if m >= _TREES_FROM and size < (_S_TREE4 if m > _MANY else _S3):  # the sized trees (notes)
        return _sized_tree(size)
    if size < _S3 and m < _TREES_FROM:  # JointExp while m is small for the rows, then a sized tree
        if m <= max(2.0, min(float(_SOME), _JE_M * (size / _REF) ** _JE_POWER)):
            return "joint_exp"
        return _sized_tree(size, small_until=_S_FEW12)
    if m <= _SOME:
        return "joint_exp"
    if m <= _MANY:
        return "approx_quantiles"
    return "agg_tree" if size < _S6 else "approx_quantiles"


def _sized_tree(size: float, small_until: float = _S_TREE3) -> str:
    """The sized tree of the band of ``size = n * epsilon`` (below ``_S_TREE4``): 8**3 leaves below
    ``small_until``, then 12**3 below ``_S_TREE12``, then 8**4."""
    if size < small_until:
        return "agg_tree_8x3"
    return "agg_tree_12x3" if size < _S_TREE12 else "agg_tree_8x4"


def _typed(m: int, size: float) -> str:
    """The rule on a declared grid of at most ``TYPED_GRID_MAX`` points (integers, decimals)."""
    if m == 1:
        return "approx_quantiles"
    if size < TINY_SIZE or (m <= _FEW and size < _HIST_PER_Q * m):
        return "histogram"
    if size < _S2:
        return "joint_exp" if m <= _FEW else "histogram"
    if m == 3:
        return "approx_quantiles"
    if m <= _SOME:
        return "joint_exp" if size < _S6 else "agg_tree"
    if size < _S3:
        return "histogram"
    if m <= _MANY:
        return "approx_quantiles" if size < _S6 else "agg_tree"
    return "agg_tree"


def choose_mechanism(m, *, n, epsilon, grid_size=None, granularity=None) -> str:
    """The mechanism ``"auto"`` runs for ``m`` quantiles of about ``n`` rows at ``epsilon``.

    Only public numbers go in (see the module notes for the rule and where it comes from).

    Parameters
    ----------
    m : int
        The number of quantiles, >= 1.
    n : float
        The row count the rule uses (public, hinted or released), >= 0.
    epsilon : float
        The budget left for the quantiles, finite and > 0.
    grid_size : int, optional
        ``G``, the number of points of the public grid between the bounds
        (:func:`grid_points`); None when the bounds are not known yet.
    granularity : float, optional
        The declared step of that grid; None when no granularity was given. The typed rule
        applies when both are given and ``grid_size <= TYPED_GRID_MAX``; otherwise the rule for
        columns without a declared grid (the same as with no grid arguments).

    Raises
    ------
    ValueError
        If ``m`` is not a positive integer, ``n`` is not a finite number >= 0, ``epsilon`` is
        not finite and > 0, ``grid_size`` is not an integer >= 1 or ``granularity`` is not
        finite and > 0.
    """
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"`m` must be an integer >= 1, got {m!r}")
    if not _is_real(n) or not math.isfinite(float(n)) or float(n) < 0:
        raise ValueError(f"`n` must be a finite number >= 0, got {n!r}")
    eps = check_epsilon(epsilon)
    integral = isinstance(grid_size, (int, np.integer)) and not isinstance(grid_size, bool)
    if grid_size is not None and (not integral or grid_size < 1):
        raise ValueError(f"`grid_size` must be an integer >= 1 or None, got {grid_size!r}")
    if granularity is not None:
        check_granularity(granularity)
    size = float(n) * eps
    if granularity is not None and grid_size is not None and grid_size <= TYPED_GRID_MAX:
        return _typed(int(m), size)
    return _continuous(int(m), size)


def plan_auto(m: int, true_n: int, *, epsilon: float, neighboring, source, n_hint=None,
              count_share: float = DEFAULT_COUNT_SHARE, bounds_missing: bool = False,
              bounds_share: float | None = None, grid_size: int | None = None,
              granularity: float | None = None) -> tuple[str, float, float]:
    """The first step of :func:`auto`: draw the noisy count (if one is needed) and choose.

    Returns ``(name, rest, n_used)``: the mechanism to run, the epsilon left for it (and for the
    private bounds when ``bounds_missing``) and the row count the rule used. Running
    ``with_private_bounds(get_base_mechanism(name))`` on the same data at ``rest`` with the same
    ``source`` afterwards is exactly :func:`auto` (same draws, same order): callers that must
    know the choice before they prepare the data (the Spark fold) use the two steps.
    Arguments are validated by the caller (``source`` a
    :class:`~dpq_spark.core.randomness.source.RandomSource`, ``neighboring`` a ``NeighboringRelation``,
    ``true_n`` the exact count of rows). ``grid_size`` and ``granularity`` go to
    :func:`choose_mechanism` as they are (public: from the bounds and the declared step; leave
    them None when a bound is missing).

    Privacy
    -------
    The noisy count is ``count_share * epsilon``-DP (discrete Laplace, sensitivity 1) under
    add/remove; nothing is spent under swap (n public) or with a public ``n_hint``. The choice is
    post-processing of public values and that count.
    """
    names, rest, n_used = plan_auto_many(
        m, np.array([int(true_n)]), epsilon=epsilon, neighboring=neighboring, source=source,
        n_hint=n_hint, count_share=count_share, bounds_missing=bounds_missing,
        bounds_share=bounds_share, grid_size=grid_size, granularity=granularity)
    return names[0], rest, float(n_used[0])


def plan_auto_many(m: int, totals: np.ndarray, *, epsilon: float, neighboring, source,
                   n_hint=None, count_share: float = DEFAULT_COUNT_SHARE,
                   bounds_missing: bool = False, bounds_share: float | None = None,
                   grid_size: int | None = None,
                   granularity: float | None = None) -> tuple[list, float, np.ndarray]:
    """:func:`plan_auto` for groups of ``totals`` rows (int array), the same arguments for all:
    ``(names, rest, n_used)``, one name and count per group, and the one ``rest``. The noisy
    counts are drawn as one array (:func:`~dpq_spark.core.randomness.dlap_table.dlap_many`, also
    for one group: :func:`plan_auto` is this with one group, seed for seed).

    Privacy
    -------
    As :func:`plan_auto`, for each group: ``count_share * epsilon``-DP under add/remove.
    """
    relation = NeighboringRelation.parse(neighboring)
    totals = np.asarray(totals, dtype=np.int64)
    rest = float(epsilon)
    if relation is NeighboringRelation.SWAP:
        n_used = totals.astype(np.float64)
    elif n_hint is not None:
        n_used = np.full(totals.size, float(n_hint))
    else:
        noisy = totals + dlap_many(source, dlap_scale(1, count_share * epsilon), totals.size)
        n_used = np.maximum(noisy, 0).astype(np.float64)
        rest = (1.0 - count_share) * epsilon
    if bounds_missing:
        share = DEFAULT_BOUNDS_SHARE if bounds_share is None else bounds_share
        quantile_eps = rest * (1.0 - share)
    else:
        quantile_eps = rest
    # the rule once per distinct count
    distinct, at = np.unique(n_used, return_inverse=True)
    rule = [choose_mechanism(int(m), n=n, epsilon=quantile_eps, grid_size=grid_size,
                             granularity=granularity) for n in distinct.tolist()]
    names = np.array(rule, dtype=object)[np.reshape(at, -1)].tolist()
    return names, rest, n_used


def _check_share(value, name: str) -> float:
    if not _is_real(value) or not math.isfinite(float(value)) or not 0.0 < float(value) < 1.0:
        raise ValueError(f"`{name}` must be in (0, 1), got {value!r}")
    return float(value)


def auto(values, quantiles, *, epsilon, lower=None, upper=None, neighboring="add_remove", counts=None,
         rng=None, n_hint=None, count_share=DEFAULT_COUNT_SHARE, bounds_share=None, granularity=None,
         **extra):
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
    granularity : float, optional
        The public step of the data's grid (1 for integers, 0.01 for two decimals), passed to
        the chosen mechanism (releases are points of ``Grid(lower, upper, granularity)``). With
        both bounds given, the rule also uses the number of grid points between them
        (:func:`grid_points`): a grid of at most ``TYPED_GRID_MAX`` points gets the typed rule
        (module notes). Without a bound the rule does not use it (the grid is not known before
        the private bounds) and it goes to the bounds search and the mechanism only.
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
    ``epsilon``, the public/hinted/released ``n``, the bounds and ``granularity``), so it costs
    nothing more; it never reads the values.
    """
    eps = check_epsilon(epsilon)
    q = check_quantiles(quantiles)
    relation = NeighboringRelation.parse(neighboring)
    share = _check_share(count_share, "count_share")
    bshare = DEFAULT_BOUNDS_SHARE if bounds_share is None else _check_share(bounds_share, "bounds_share")
    if n_hint is not None and (not _is_real(n_hint) or not math.isfinite(float(n_hint)) or float(n_hint) < 0):
        raise ValueError(f"`n_hint` must be a finite number >= 0, got {n_hint!r}")
    missing = lower is None or upper is None
    if granularity is not None:
        granularity = check_granularity(granularity)
        extra["granularity"] = granularity
    grid_size = None if missing else grid_points(lower, upper, granularity)  # checks the bounds
    x = check_values(values)
    c = None if counts is None else check_counts(counts, x.size)
    source = resolve_rng(rng)

    true_n = int(x.size if c is None else c.sum())
    name, rest, n_used = plan_auto(int(q.size), true_n, epsilon=eps, neighboring=relation,
                                   source=source, n_hint=n_hint, count_share=share,
                                   bounds_missing=missing, bounds_share=bshare,
                                   grid_size=grid_size, granularity=granularity)
    mechanism = with_private_bounds(get_base_mechanism(name))
    out = mechanism(x, q, epsilon=rest, lower=lower, upper=upper, neighboring=relation, counts=c,
                    rng=source, bounds_share=bshare, **extra)
    return QuantileRelease(
        out, mechanism=name,
        lower=getattr(out, "lower", lower), upper=getattr(out, "upper", upper),
        bounds="private" if missing else "given", epsilon=eps, n_used=n_used,
    )
