"""The numpy/scipy core of dpq_spark: mechanisms and privacy accounting. Never imports pyspark."""

from __future__ import annotations

from dpq_spark.core.errors import BudgetExceededError, DPQValueError, SessionHaltedError
from dpq_spark.core.joint_exp import joint_exp
from dpq_spark.core.privacy import NeighboringRelation

__all__ = [
    "joint_exp",
    "NeighboringRelation",
    "BudgetExceededError",
    "DPQValueError",
    "SessionHaltedError",
]
