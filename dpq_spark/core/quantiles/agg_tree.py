"""AggTree: quantiles read from one noisy, consistently aggregated hierarchical histogram.

The range ``[lower, upper]`` is cut into ``branching**height`` equal-width leaves; every node of the
complete ``branching``-ary tree above them counts the points in its range. Each non-root count gets
discrete Laplace noise (sampled exactly on the integers), then Honaker's (2015) two-pass inverse-variance aggregation combines every node's
own noisy count with the estimates implied by its subtree (from below) and by its parent and
siblings (from above). Quantiles descend the aggregated tree from the root and interpolate inside
the node where they stop (as Google's ``BoundedQuantiles`` does), and are rounded to the public
default grid of :class:`~dpq_spark.core.randomness.grid.Grid` (2**32 steps), so that every release of the
package is a grid point. All quantiles come from the same noisy tree, so the budget does not
depend on m.
"""

from __future__ import annotations

import math

import numpy as np

from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.core.quantiles._request import validate_request
from dpq_spark.core.randomness.dlap_table import dlap_many
from dpq_spark.core.randomness.samplers import dlap_scale
from dpq_spark.core.quantiles._sorted_data import SortedData, sort_data
from dpq_spark.core._validation import check_positive_int
from dpq_spark.core.errors import DPQValueError
from dpq_spark.core.randomness.grid import Grid
from dpq_spark.core.accounting.neighboring import NeighboringRelation

__all__ = ["agg_tree", "histogram", "honaker_aggregate", "HISTOGRAM_BINS"]

_MAX_LEAVES = 1 << 24
#: Bins of :func:`histogram` unless told otherwise (AggTree's default branching).
HISTOGRAM_BINS = 16


def leaf_index(values: np.ndarray, lower: float, upper: float, leaves: int) -> np.ndarray:
    """The equal-width leaf of each value of ``[lower, upper]`` (the top leaf is closed at ``upper``)."""
    idx = np.floor((values - lower) / (upper - lower) * leaves).astype(np.int64)
    return np.clip(idx, 0, leaves - 1)


def _leaf_histogram(data: SortedData, lower: float, upper: float, leaves: int) -> np.ndarray:
    """Exact point counts of the equal-width leaves."""
    idx = leaf_index(data.values, lower, upper, leaves)
    return np.bincount(idx, weights=data.counts.astype(np.float64), minlength=leaves)


def node_noise(source, scale, size: int) -> np.ndarray:
    """``size`` independent discrete Laplace draws of ``scale`` (int64), exactly
    (:func:`~dpq_spark.core.randomness.dlap_table.dlap_many`: the cached table of the scale, 16
    random bits a draw, about 0.1 us where the rejection sampler takes a few)."""
    return dlap_many(source, scale, size)


def noisy_levels(data: SortedData, lower: float, upper: float, branching: int, height: int, scale, gen) -> list:
    """The tree's node counts, level ``l`` holding ``branching**l`` nodes, each plus one discrete
    Laplace draw of ``scale`` (:func:`node_noise`; levels 1 to ``height`` in that order, as
    :func:`dpq_spark.core.quantiles.batch.release_many` draws them; entry 0 is None)."""
    exact = [None] * (height + 1)
    exact[height] = _leaf_histogram(data, lower, upper, branching**height)
    for level in range(height - 1, 0, -1):
        exact[level] = exact[level + 1].reshape(-1, branching).sum(axis=1)
    # counts are whole numbers below 2**53 (check_counts): the int64 conversion is exact
    return [None] + [
        (exact[level].astype(np.int64) + node_noise(gen, scale, exact[level].size)).astype(np.float64)
        for level in range(1, height + 1)
    ]


def node_variance(scale) -> float:
    """The variance ``2 q / (1 - q)**2``, ``q = exp(-1 / scale)``, of one discrete Laplace count,
    for the least squares. Every count has the same variance and the least squares depend only on
    variance ratios, so a variance that underflows (huge epsilon) is replaced by 1."""
    q = math.exp(-1.0 / float(scale))
    return 2.0 * q / (1.0 - q) ** 2 if q > 0.0 else 1.0


def honaker_variances(branching: int, height: int, variance: float, root_known: bool) -> tuple[np.ndarray, np.ndarray]:
    """The variances of :func:`honaker_aggregate`'s two passes, per level ``0 .. height``.

    ``var_low[l]`` is the variance of a node's subtree estimate (bottom-up), ``var_high[l]`` that
    of its estimate from its own count and everything outside its strict subtree (top-down);
    ``var_high[0]`` is infinite when the root is not observed, and a level below an infinite one
    has only its own count (``variance``).
    """
    var_low = np.zeros(height + 1)
    var_low[height] = variance
    for level in range(height - 1, 0, -1):
        var_children = branching * var_low[level + 1]
        var_low[level] = variance * var_children / (variance + var_children)
    var_low[0] = 0.0 if root_known else branching * var_low[1]
    var_high = np.zeros(height + 1)
    var_high[0] = 0.0 if root_known else np.inf
    for level in range(1, height + 1):
        if np.isinf(var_high[level - 1]):
            var_high[level] = variance
            continue
        var_above = var_high[level - 1] + (branching - 1) * var_low[level]
        var_high[level] = variance * var_above / (variance + var_above)
    return var_low, var_high


def honaker_aggregate(noisy: list[np.ndarray], branching: int, variance: float, root: float | None) -> list[np.ndarray]:
    """Inverse-variance (least-squares) estimates of every node count of a complete tree.

    Parameters
    ----------
    noisy : list of numpy.ndarray
        ``noisy[l]`` holds the noisy counts of the ``branching**l`` nodes of level ``l``,
        ``l = 1 .. height``, left to right (``noisy[0]`` is ignored). Leading axes, if any, index
        independent trees aggregated at once (shape ``(..., branching**l)``).
    branching : int
        Children per node.
    variance : float
        Noise variance of every noisy count.
    root : float, array or None
        The exact root count when it is public (swap: n; one per tree with leading axes), else
        None (the root is not observed).

    Returns
    -------
    list of numpy.ndarray
        Aggregated counts per level, level 0 being the root. They are consistent: children sum to
        their parent (up to rounding).

    Notes
    -----
    Bottom-up, ``low[l]`` combines a node's own count with the sum of its children's ``low``;
    top-down, ``high[l]`` combines it with the parent's ``high`` minus the siblings' ``low``; the
    final estimate combines ``low`` (subtree) with the parent-minus-siblings estimate (everything
    else). Each combination weights two independent estimates by inverse variance (Honaker 2015).
    """
    height = len(noisy) - 1
    lead = np.shape(noisy[height])[:-1]  # leading axes: independent trees (batch), () for one

    def up(a):  # children summed into their parent
        return a.reshape(*a.shape[:-1], -1, branching).sum(axis=-1)

    var_low, var_high = honaker_variances(branching, height, variance, root is not None)
    low = [None] * (height + 1)
    low[height] = noisy[height].astype(np.float64)
    for level in range(height - 1, 0, -1):
        child_sum = up(low[level + 1])
        var_children = branching * var_low[level + 1]
        w = var_children / (variance + var_children)
        low[level] = w * noisy[level] + (1.0 - w) * child_sum
    if root is None:
        low[0] = up(low[1])
    else:
        low[0] = np.asarray(root, dtype=np.float64).reshape(*lead, 1)

    # high[l]: estimate of a node from everything outside its strict subtree. An unobserved root
    # carries no such information (infinite variance).
    high = [None] * (height + 1)
    high[0] = low[0]
    final = [None] * (height + 1)
    final[0] = low[0]
    for level in range(1, height + 1):
        if np.isinf(var_high[level - 1]):
            high[level], final[level] = noisy[level].astype(np.float64), low[level]
            continue
        # parent-minus-siblings, by broadcasting over (..., parents, branching) (no repeats)
        low_kids = low[level].reshape(*lead, -1, branching)
        sibling_sum = low_kids.sum(axis=-1, keepdims=True)
        from_above = (high[level - 1][..., None] - (sibling_sum - low_kids)).reshape(low[level].shape)
        var_above = var_high[level - 1] + (branching - 1) * var_low[level]
        # high: own noisy count combined with parent-minus-siblings.
        w_own = var_above / (variance + var_above)
        high[level] = w_own * noisy[level] + (1.0 - w_own) * from_above
        # final: subtree estimate combined with parent-minus-siblings.
        w_low = var_above / (var_low[level] + var_above)
        final[level] = w_low * low[level] + (1.0 - w_low) * from_above
    return final


def _descend(tree: list[np.ndarray], branching: int, lower: float, upper: float, q: float) -> float:
    """Walk down from the root to the child whose cumulative share first reaches ``q``."""
    height = len(tree) - 1
    node, left, width = 0, lower, upper - lower
    for level in range(1, height + 1):
        children = tree[level][node * branching : (node + 1) * branching]
        cum = np.cumsum(children)
        total = cum[-1]
        if not total > 0:
            break
        target = q * total
        child = min(int(np.searchsorted(cum, target, side="left")), branching - 1)
        before = cum[child] - children[child]
        q = min(max((target - before) / children[child], 0.0), 1.0) if children[child] > 0 else 0.5
        node = node * branching + child
        width /= branching
        left += child * width
    return left + q * width


def agg_tree(
    values,
    quantiles,
    *,
    epsilon: float,
    lower: float,
    upper: float,
    neighboring: str | NeighboringRelation = "add_remove",
    counts=None,
    rng: np.random.Generator | None = None,
    branching: int = 16,
    height: int = 4,
    granularity: float | None = None,
) -> np.ndarray:
    """Estimate m quantiles from a Laplace-noised, Honaker-aggregated hierarchical histogram.

    Parameters
    ----------
    values : array_like of float
        The private data, 1-d. Values outside ``[lower, upper]`` are clamped; NaN is an error.
    quantiles : array_like of float
        Strictly increasing quantiles in (0, 1).
    epsilon : float
        Total privacy budget, finite and > 0.
    lower, upper : float
        Public bounds with ``lower < upper``; the leaves cut this range evenly.
    neighboring : {"add_remove", "swap"} or NeighboringRelation, default "add_remove"
        Which datasets are neighbours.
    counts : array_like of int, optional
        Multiplicity of each entry of ``values``: the histogram is built from the counts directly,
        exactly as for ``np.repeat(values, counts)``.
    rng : numpy.random.Generator, RandomSource or None, optional
        Source of randomness; ``None`` (production) is the OS cryptographic generator, a seeded
        generator is for tests and reproducible experiments only.
    branching : int, default 16
        Children per node, >= 2.
    height : int, default 4
        Levels below the root, >= 1; ``branching**height`` leaves (at most 2**24).
    granularity : float, optional
        Step of the public grid the estimates are rounded to
        (:class:`~dpq_spark.core.randomness.grid.Grid`); default ``(upper - lower) / 2**32``.
        Public, like the bounds; the rounding is post-processing.

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
    Every non-root node count (an integer) gets discrete Laplace noise ``DLap(b)``, sampled exactly
    on the integers, with ``b = dlap_scale(height * s, epsilon)``, i.e. ``height * s / epsilon``
    rounded up to a rational (relative excess below ``2**-20``), ``s = 2`` (swap) or 1
    (add/remove): one row changes one count per level by 1 (add/remove) or two counts per level by
    1 (swap), so the integer vector of all node counts has L1 sensitivity ``height * s``. Under
    swap the root count n is public and used exactly; under add/remove the root is not released
    and is estimated from its children. Aggregation (weighted by the exact discrete-Laplace
    variance ``2 q / (1 - q)**2``, ``q = exp(-1 / b)``) and the quantile descent are
    post-processing of the noisy integers. Time O(n log n + branching**height + m * branching * height).

    Privacy
    -------
    ``epsilon``-differential privacy (pure) for the chosen neighbouring relation, one row (one unit
    of multiplicity) being the unit of privacy, whatever m is; the epsilon achieved by the
    rounded-up scale is ``height * s / b <= epsilon``. The noisy counts are exact integer samples,
    so no floating-point artefact of the sampler can separate neighbours. Assumes ``lower``, ``upper``,
    ``quantiles``, ``branching`` and ``height`` are chosen without looking at the data.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=1000)
    >>> agg_tree(x, [0.25, 0.5, 0.75], epsilon=1.0, lower=-10, upper=10,
    ...          rng=np.random.default_rng(1)).shape
    (3,)
    """
    b = check_positive_int(branching, "branching", minimum=2)
    h = check_positive_int(height, "height", minimum=1)
    grid = Grid(lower, upper, granularity)  # public arguments first
    if b**h > _MAX_LEAVES:
        raise DPQValueError(f"`branching`**`height` must be <= 2**24 leaves, got {b}**{h}")
    request, x, c = validate_request(
        values, quantiles, epsilon=epsilon, lower=lower, upper=upper, neighboring=neighboring, counts=counts
    )
    gen = resolve_rng(rng)
    data = sort_data(x, c, request.lower, request.upper)
    swap = request.neighboring is NeighboringRelation.SWAP
    scale = dlap_scale(h * (2 if swap else 1), request.epsilon)

    noisy = noisy_levels(data, request.lower, request.upper, b, h, scale, gen)
    tree = honaker_aggregate(noisy, b, node_variance(scale), float(data.n) if swap else None)  # post-processing
    out = np.array([_descend(tree, b, request.lower, request.upper, float(q)) for q in request.quantiles])
    # Rounded to the public grid, like every other release (post-processing).
    return grid.value(grid.snap(np.sort(np.clip(out, request.lower, request.upper))))


def histogram(
    values,
    quantiles,
    *,
    epsilon: float,
    lower: float,
    upper: float,
    neighboring: str | NeighboringRelation = "add_remove",
    counts=None,
    rng: np.random.Generator | None = None,
    bins: int = HISTOGRAM_BINS,
    granularity: float | None = None,
) -> np.ndarray:
    """Estimate m quantiles from one noisy histogram of ``bins`` equal-width bins.

    This is :func:`agg_tree` with a single level (``branching=bins``, ``height=1``): every bin
    count gets exact discrete Laplace noise, and each quantile is read off the noisy cumulative
    counts, interpolating linearly inside its bin. It is what ``mechanism="auto"`` runs when the
    row count times epsilon is small (:mod:`dpq_spark.core.quantiles.choose`): with few rows, a coarse
    histogram whose counts carry little noise beats every finer mechanism (the measurements are
    in ``docs/choosing_parameters.md``).

    Parameters
    ----------
    values, quantiles, epsilon, lower, upper, neighboring, counts, rng, granularity
        As for :func:`agg_tree`.
    bins : int, default 16
        Equal-width bins of ``[lower, upper]``, from 2 to 2**24.

    Returns
    -------
    numpy.ndarray
        As :func:`agg_tree`: m sorted grid points in ``[lower, upper]``.

    Raises
    ------
    ValueError, TypeError
        As :func:`agg_tree`, a bad ``bins`` named as such.

    Privacy
    -------
    ``epsilon``-differential privacy (pure) for the chosen neighbouring relation, one row (one unit
    of multiplicity) being the unit of privacy, whatever m is: adding or removing a row changes
    one bin count by 1 (swapping one changes two), so the integer vector of bin counts has L1
    sensitivity 1 (add/remove) or 2 (swap) and gets ``DLap(s / epsilon)`` noise (scale rounded up,
    sampled exactly on the integers). The quantiles are post-processing of the noisy counts (and,
    under swap, of the public n). Assumes ``lower``, ``upper``, ``quantiles`` and ``bins`` are
    chosen without looking at the data.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=20)
    >>> histogram(x, [0.25, 0.5, 0.75], epsilon=1.0, lower=-10, upper=10,
    ...           rng=np.random.default_rng(1)).shape
    (3,)
    """
    b = check_positive_int(bins, "bins", minimum=2)
    if b > _MAX_LEAVES:
        raise DPQValueError(f"`bins` must be <= 2**24, got {b}")
    return agg_tree(values, quantiles, epsilon=epsilon, lower=lower, upper=upper,
                    neighboring=neighboring, counts=counts, rng=rng, branching=b, height=1,
                    granularity=granularity)
