"""AggTree with a tree sized for the budget: small trees of height 3 and 4 for many quantiles.

:func:`~dpq_spark.core.quantiles.agg_tree.agg_tree` by default cuts ``[lower, upper]`` into
``16**4 = 65,536`` leaves. Every level of the tree takes its share of epsilon (the noise scale of
every count grows with the height ``h``), and a quantile read from the tree sums about
``(branching - 1) / 2`` noisy counts per level, so the rank error of a quantile grows like
``h**1.5 / epsilon``. When ``n * epsilon`` is moderate, the resolution of the deepest levels is
far below that error: a shallower tree has less noise in every count and loses nothing that the
noise had not already blurred. The three mechanisms here are AggTree itself (the same leaf counts,
exact discrete Laplace noise, Honaker aggregation, descent and grid rounding), with a fixed,
smaller tree:

=================  =========  ======  ======  ==========================================
name               branching  height  leaves  ``auto`` runs it (m >= 54)
=================  =========  ======  ======  ==========================================
``agg_tree_8x3``   8          3       512     ``25 <= n * epsilon < 10**3.25``
``agg_tree_12x3``  12         3       1,728   ``10**3.25 <= n * epsilon < 12,000``
``agg_tree_8x4``   8          4       4,096   ``12,000 <= n * epsilon < 10**4.75``
=================  =========  ======  ======  ==========================================

(For 50 to 53 quantiles ``auto`` runs the first two only, up to ``10**3.5``. For fewer than 50
quantiles below ``n * epsilon = 10**3.5`` it runs the 8**3 tree, or the 12**3 tree from
``10**2.75``, once m is too large for JointExp: :mod:`~dpq_spark.core.quantiles.choose`.)

The shape is part of the name, so a mechanism name alone says what runs (the Spark layer and the
batched path look mechanisms up by name). The measurements behind the shapes and the bands are
``benchmarks/bench_many_quantiles.py`` (``docs/choosing_parameters.md``, "Many quantiles"): at
m = 99 quantiles of 10,000 N(0, 5) values with bounds +-100 and epsilon = 1, the 12**3 tree's
mean absolute error is 0.76 times the 16**4 tree's and 0.91 times the 8**4 tree's. Shapes are chosen from public numbers
only; the leaves must stay narrow compared with the data's spread, so bounds far wider than the
data (hundreds of standard deviations) favour the deeper default tree at large ``n * epsilon``.
"""

from __future__ import annotations

import numpy as np

from dpq_spark.core.accounting.neighboring import NeighboringRelation
from dpq_spark.core.quantiles.agg_tree import agg_tree

__all__ = ["agg_tree_8x3", "agg_tree_12x3", "agg_tree_8x4", "SIZED_TREES"]

#: The sized trees by registry name: ``(branching, height)``.
SIZED_TREES: dict[str, tuple[int, int]] = {"agg_tree_8x3": (8, 3), "agg_tree_12x3": (12, 3), "agg_tree_8x4": (8, 4)}

_DOC = """AggTree on an {b}-ary tree of height {h} ({leaves:,} equal-width leaves of ``[lower, upper]``).

    Exactly :func:`~dpq_spark.core.quantiles.agg_tree.agg_tree` with ``branching={b}, height={h}``:
    the same leaf counts, exact discrete Laplace noise, Honaker aggregation, descent and rounding
    to the public grid.

    Parameters
    ----------
    values, quantiles, epsilon, lower, upper, neighboring, counts, rng, granularity
        As for :func:`~dpq_spark.core.quantiles.agg_tree.agg_tree` (no ``branching`` or
        ``height``: the name fixes the tree).

    Returns
    -------
    numpy.ndarray
        m estimates, sorted, float64, points of the public grid in ``[lower, upper]``.

    Raises
    ------
    ValueError, TypeError
        If an argument breaks its rule (the message names it), as for ``agg_tree``.

    Privacy
    -------
    ``epsilon``-differential privacy (pure), whatever m is, under add/remove or swap neighbours,
    one row (one unit of multiplicity) being the unit of privacy. Sensitivity per level: adding
    or removing a row changes one count of each of the {h} levels by 1; swapping a row changes
    two counts of a level by 1 each, or none. The integer vector of all {nodes:,} non-root node
    counts therefore has L1 sensitivity ``{h} * s`` (``s = 1`` add/remove, ``s = 2`` swap) and
    gets ``DLap(b)`` noise, sampled exactly on the integers, with ``b = dlap_scale({h} * s,
    epsilon)`` (achieved epsilon ``{h} * s / b <= epsilon``). Aggregation, descent and rounding
    are post-processing of the noisy integers (and, under swap, of the public n). Assumes
    ``lower``, ``upper`` and ``quantiles`` are chosen without looking at the data.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=1000)
    >>> {name}(x, [0.25, 0.5, 0.75], epsilon=1.0, lower=-10, upper=10,
    ...        rng=np.random.default_rng(1)).shape
    (3,)
    """


def _sized(name: str):
    """The mechanism ``name`` of :data:`SIZED_TREES`: ``agg_tree`` with its shape fixed."""
    b, h = SIZED_TREES[name]

    def release(values, quantiles, *, epsilon: float, lower: float, upper: float,
                neighboring: str | NeighboringRelation = "add_remove", counts=None,
                rng: np.random.Generator | None = None,
                granularity: float | None = None) -> np.ndarray:
        return agg_tree(values, quantiles, epsilon=epsilon, lower=lower, upper=upper,
                        neighboring=neighboring, counts=counts, rng=rng, branching=b, height=h,
                        granularity=granularity)

    release.__name__ = release.__qualname__ = name
    release.__doc__ = _DOC.format(b=b, h=h, leaves=b**h, nodes=sum(b**k for k in range(1, h + 1)),
                                  name=name)
    return release


agg_tree_8x3 = _sized("agg_tree_8x3")
agg_tree_12x3 = _sized("agg_tree_12x3")
agg_tree_8x4 = _sized("agg_tree_8x4")
