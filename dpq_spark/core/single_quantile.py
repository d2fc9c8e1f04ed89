"""The single-quantile exponential mechanism (Smith 2011), shared by IndExp, AppIndExp and
ApproxQuantiles.

With clamped data ``x_1 <= ... <= x_n`` and ``x_0 = lower``, ``x_{n+1} = upper``, the output is
drawn from the density proportional to ``exp(-c |#{x_i < o} - q n|)`` on ``[lower, upper]``, with
``c = epsilon / (2 Delta)``. It is sampled exactly in two steps: choose the interval
``[x_i, x_{i+1})`` with log-weight ``log(x_{i+1} - x_i) - c |i - q n|`` (intervals of width zero
have probability zero and are left out), then a uniform point inside it. The interval is drawn by
inverse CDF on weights normalised by their maximum (all in log space until the final ``exp``),
so nothing underflows that matters.

With multiplicities the intervals lie between consecutive *distinct* values and ``i`` is the
cumulative count, which is exactly the repeated-array mechanism with its empty intervals removed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpq_spark.core._random import resolve_rng
from dpq_spark.core._sorted_data import SortedData, sort_data
from dpq_spark.core._validation import (
    check_bounds,
    check_counts,
    check_epsilon,
    check_quantiles,
    check_values,
)
from dpq_spark.core.errors import DPQValueError
from dpq_spark.core.privacy import NeighboringRelation, single_quantile_sensitivity

__all__ = ["single_quantile", "Intervals", "sample_quantile"]


@dataclass(frozen=True)
class Intervals:
    """The intervals of positive width between the bounds and the distinct data values.

    Interval ``r`` is ``[left[r], right[r])``; ``below[r]`` is the number of data points
    ``<= left[r]`` (0 for the first interval). Built once per dataset and reused for every
    quantile drawn from it.
    """

    left: np.ndarray
    right: np.ndarray
    log_width: np.ndarray
    below: np.ndarray
    n: int

    @classmethod
    def of(cls, data: SortedData, lower: float, upper: float) -> "Intervals":
        """Intervals of ``data`` (already clamped) within ``[lower, upper]``."""
        edges = np.concatenate(([lower], data.values, [upper]))
        below = np.concatenate(([0], data.cum)).astype(np.float64)
        width = np.diff(edges)
        positive = width > 0
        return cls(edges[:-1][positive], edges[1:][positive], np.log(width[positive]), below[positive], data.n)

    def log_weights(self, q: float, scale: float) -> np.ndarray:
        """Unnormalised log-weights ``log(width) - scale * |below - q n|``, ``scale = eps / (2 Delta)``."""
        return self.log_width - scale * np.abs(self.below - q * self.n)

    def sample(self, q: float, epsilon: float, sensitivity: float, rng: np.random.Generator) -> float:
        """One draw of the exponential mechanism for quantile ``q`` (``epsilon`` for this draw).

        Needs ``lower < upper``, so that at least one interval has positive width.
        """
        log_weight = self.log_weights(q, epsilon / (2.0 * sensitivity))
        cdf = np.cumsum(np.exp(log_weight - log_weight.max()))
        r = min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), cdf.size - 1)
        return float(self.left[r] + rng.random() * (self.right[r] - self.left[r]))


def sample_quantile(
    data: SortedData,
    lower: float,
    upper: float,
    q: float,
    epsilon: float,
    sensitivity: float,
    rng: np.random.Generator,
) -> float:
    """One draw of the exponential mechanism for quantile ``q`` (validated inputs only).

    ``epsilon`` is the budget of this one draw; ``sensitivity`` is that of its utility on the
    neighbouring relation the caller protects. If ``lower == upper`` the only output is ``lower``.
    """
    if not upper > lower:
        return float(lower)
    return Intervals.of(data, lower, upper).sample(q, epsilon, sensitivity, rng)


def single_quantile(
    values,
    quantile: float,
    *,
    epsilon: float,
    lower: float,
    upper: float,
    neighboring: str | NeighboringRelation = "add_remove",
    counts=None,
    rng: np.random.Generator | None = None,
) -> float:
    """Estimate one quantile with the exponential mechanism of Smith (2011).

    Parameters
    ----------
    values : array_like of float
        The private data, 1-d. Values outside ``[lower, upper]`` are clamped; NaN is an error.
    quantile : float
        The quantile to estimate, in (0, 1).
    epsilon : float
        Privacy budget, finite and > 0.
    lower, upper : float
        Public bounds with ``lower < upper``, chosen without looking at the data.
    neighboring : {"add_remove", "swap"} or NeighboringRelation, default "add_remove"
        Which datasets are neighbours.
    counts : array_like of int, optional
        Multiplicity of each entry of ``values``; same distribution as ``np.repeat(values, counts)``.
    rng : numpy.random.Generator, optional
        Source of randomness; ``None`` draws fresh OS entropy.

    Returns
    -------
    float
        The estimate, in ``[lower, upper]``.

    Raises
    ------
    ValueError
        If an argument breaks its rule (the message names it).
    TypeError
        If an argument has the wrong type.

    Notes
    -----
    The output density on ``[lower, upper]`` is proportional to
    ``exp(-epsilon |#{x < o} - q n| / (2 Delta))`` with ``Delta = 1`` (swap) or
    ``max(q, 1 - q)`` (add/remove). Runtime O(n log n) for the sort, O(n) for the draw.

    Privacy
    -------
    ``epsilon``-differential privacy (pure) for the chosen neighbouring relation, one row being the
    unit of privacy (one unit of multiplicity when ``counts`` is given). Assumes ``lower``,
    ``upper`` and ``quantile`` are chosen without looking at the data.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=1000)
    >>> m = single_quantile(x, 0.5, epsilon=1.0, lower=-10, upper=10, rng=np.random.default_rng(1))
    >>> abs(m) < 1
    True
    """
    eps = check_epsilon(epsilon)
    lo, hi = check_bounds(lower, upper)
    if np.ndim(quantile) != 0:
        raise DPQValueError(f"`quantile` must be a single number, got shape {np.shape(quantile)}")
    q = float(check_quantiles(quantile, name="quantile")[0])
    relation = NeighboringRelation.parse(neighboring)
    x = check_values(values)
    c = None if counts is None else check_counts(counts, x.size)
    gen = resolve_rng(rng)
    data = sort_data(x, c, lo, hi)
    return sample_quantile(data, lo, hi, q, eps, single_quantile_sensitivity(q, relation), gen)
