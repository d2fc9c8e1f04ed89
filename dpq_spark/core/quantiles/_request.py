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
    check_quantiles,
    check_values,
)
from dpq_spark.core.accounting.neighboring import NeighboringRelation

__all__ = ["QuantileRequest", "validate_request"]


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
