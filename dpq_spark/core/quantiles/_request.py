"""Validation of the arguments every quantile mechanism shares, in one place.

Public arguments are checked first (their messages echo the offending value), then the private
``values`` and ``counts`` (whose messages never echo data). Nothing is sampled here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpq_spark.core._validation import (
    check_bounds,
    check_counts,
    check_epsilon,
    check_grid_indices,
    check_positive_int,
    check_quantiles,
    check_values,
)
from dpq_spark.core.accounting.neighboring import NeighboringRelation

__all__ = ["QuantileRequest", "validate_request", "validate_index_request"]


@dataclass(frozen=True)
class QuantileRequest:
    """Validated public arguments of a multi-quantile release."""

    quantiles: np.ndarray
    epsilon: float
    lower: float
    upper: float
    neighboring: NeighboringRelation

    @property
    def m(self) -> int:
        """The number of quantiles."""
        return int(self.quantiles.size)


def validate_request(
    values, quantiles, *, epsilon, lower, upper, neighboring, counts
) -> tuple[QuantileRequest, np.ndarray, np.ndarray | None]:
    """Check the shared arguments; return the request, the values and the counts as arrays."""
    eps = check_epsilon(epsilon)
    lo, hi = check_bounds(lower, upper)
    q = check_quantiles(quantiles)
    relation = NeighboringRelation.parse(neighboring)
    x = check_values(values)
    c = None if counts is None else check_counts(counts, x.size)
    return QuantileRequest(q, eps, lo, hi, relation), x, c


def validate_index_request(k, counts, grid_size, quantiles, *, epsilon, neighboring):
    """The shared arguments of a mechanism on grid indices (``*_indices``): returns
    ``(indices, counts or None, grid_size, quantiles, epsilon, relation)``, public ones checked
    first."""
    size = check_positive_int(grid_size, "grid_size")
    eps = check_epsilon(epsilon)
    q = check_quantiles(quantiles)
    relation = NeighboringRelation.parse(neighboring)
    idx = check_grid_indices(k, size)
    c = None if counts is None else check_counts(counts, idx.size)
    return idx, c, size, q, eps, relation
