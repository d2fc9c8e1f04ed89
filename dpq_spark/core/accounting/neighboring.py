"""Neighbouring relations and the sensitivity formulas of the quantile utilities.

A reader looking for a sensitivity should find it here and nowhere else.
"""

from __future__ import annotations

import enum

import numpy as np

__all__ = ["NeighboringRelation", "joint_exp_sensitivity", "single_quantile_sensitivity"]


class NeighboringRelation(str, enum.Enum):
    """Which pairs of datasets differential privacy protects.

    ``ADD_REMOVE``: the datasets differ by adding or removing one privacy unit (n is private).
    ``SWAP``: the datasets have the same size and differ in one unit's value (n is public).
    """

    ADD_REMOVE = "add_remove"
    SWAP = "swap"

    @classmethod
    def parse(cls, value: "str | NeighboringRelation", name: str = "neighboring") -> "NeighboringRelation":
        """Accept an enum member or its string value; raise ``ValueError`` naming ``name``."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls(value.lower())
            except ValueError:
                pass
        allowed = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"`{name}` must be one of {allowed}, got {value!r}")


def joint_exp_sensitivity(quantiles: np.ndarray, neighboring: NeighboringRelation) -> float:
    """Sensitivity of JointExp's utility ``u(o) = -sum_j |rho(o_j) - rho(o_{j-1}) - (q_j - q_{j-1}) n|``.

    ``rho`` is the mid-rank on the public grid (``#{x < k} + (t + 1) / 2`` with t points on k).
    Swap: 2, whatever m is. Add/remove: ``2 (1 - min_j (q_j - q_{j-1}))`` with ``q_0 = 0`` and
    ``q_{m+1} = 1`` (Gillenwater, Joseph and Kulesza 2021, Lemma 3 and Appendix A; the mid-rank
    keeps these values, proof in :mod:`dpq_spark.core.quantiles.joint_exp`).
    """
    if neighboring is NeighboringRelation.SWAP:
        return 2.0
    q = np.concatenate(([0.0], np.asarray(quantiles, dtype=np.float64), [1.0]))
    return 2.0 * (1.0 - float(np.min(np.diff(q))))


def single_quantile_sensitivity(q: float, neighboring: NeighboringRelation) -> float:
    """Sensitivity of the single-quantile utility ``-|rho(o) - q n|`` (Smith 2011).

    ``rho`` is the mid-rank on the public grid; adding a point moves it by an amount in [0, 1]
    and ``q n`` by q. Swap: 1. Add/remove: ``max(q, 1 - q)``.
    """
    if neighboring is NeighboringRelation.SWAP:
        return 1.0
    return float(max(q, 1.0 - q))
