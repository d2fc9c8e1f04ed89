"""The numpy/scipy core of dpq_spark: mechanisms and privacy accounting. Never imports pyspark."""

from __future__ import annotations

from dpq_spark.core.errors import BudgetExceededError, DPQValueError, SessionHaltedError
from dpq_spark.core.joint_exp import joint_exp
from dpq_spark.core.median_mechanism import AnswerKind, MedianAnswer, MedianMechanism
from dpq_spark.core.mechanisms import MECHANISMS, agg_tree, app_ind_exp, approx_quantiles, csmooth, ind_exp, smooth
from dpq_spark.core.privacy import NeighboringRelation

__all__ = [
    "joint_exp",
    "MECHANISMS",
    "ind_exp",
    "app_ind_exp",
    "smooth",
    "csmooth",
    "agg_tree",
    "approx_quantiles",
    "MedianMechanism",
    "MedianAnswer",
    "AnswerKind",
    "NeighboringRelation",
    "BudgetExceededError",
    "DPQValueError",
    "SessionHaltedError",
]
