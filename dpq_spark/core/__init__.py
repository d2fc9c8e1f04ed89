"""The numpy/scipy core of dpq_spark: mechanisms and privacy accounting. Never imports pyspark."""

from __future__ import annotations

from dpq_spark.core.errors import BudgetExceededError, DPQValueError, SessionHaltedError
from dpq_spark.core.bounds import PrivateBounds, private_bounds
from dpq_spark.core.choose import QuantileRelease, choose_mechanism
from dpq_spark.core.median_mechanism import AnswerKind, MedianAnswer, MedianMechanism
from dpq_spark.core.mechanisms import (
    MECHANISMS, agg_tree, app_ind_exp, approx_quantiles, auto, csmooth, histogram, ind_exp, joint_exp,
    smooth,
)
from dpq_spark.core.planner import Plan, plan_median_session
from dpq_spark.core.privacy import NeighboringRelation

__all__ = [
    "joint_exp",
    "auto",
    "choose_mechanism",
    "QuantileRelease",
    "private_bounds",
    "PrivateBounds",
    "plan_median_session",
    "Plan",
    "MECHANISMS",
    "ind_exp",
    "app_ind_exp",
    "smooth",
    "csmooth",
    "agg_tree",
    "histogram",
    "approx_quantiles",
    "MedianMechanism",
    "MedianAnswer",
    "AnswerKind",
    "NeighboringRelation",
    "BudgetExceededError",
    "DPQValueError",
    "SessionHaltedError",
]
