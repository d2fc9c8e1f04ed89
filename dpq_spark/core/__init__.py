"""The numpy/scipy core of dpq_spark: mechanisms and privacy accounting. Never imports pyspark.

The median mechanism and its planner (which need scipy.sparse) are imported on first use
(PEP 562), so that a Spark Python worker importing the quantile mechanisms does not pay for
them. The mechanisms are imported here: their names are also the names of submodules
(``joint_exp``, ``ind_exp``, ...), and a lazy name would lose to a submodule imported first.
"""

from __future__ import annotations

from dpq_spark._lazy import lazy_attributes

from dpq_spark.core.errors import (
    BoundsNotFoundError,
    BudgetExceededError,
    DPQValueError,
    SessionHaltedError,
)
from dpq_spark.core.quantiles.bounds import PrivateBounds, private_bounds
from dpq_spark.core.quantiles.choose import choose_mechanism
from dpq_spark.core.quantiles.release import QuantileRelease
from dpq_spark.core.quantiles.mechanisms import (
    MECHANISMS, agg_tree, app_ind_exp, approx_quantiles, auto, csmooth, histogram, ind_exp, joint_exp,
    smooth,
)
from dpq_spark.core.accounting.neighboring import NeighboringRelation

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
    "BoundsNotFoundError",
    "DPQValueError",
    "SessionHaltedError",
]

_LAZY = {
    "MedianMechanism": "dpq_spark.core.interactive.median_mechanism",
    "MedianAnswer": "dpq_spark.core.interactive.median_mechanism",
    "AnswerKind": "dpq_spark.core.interactive.median_mechanism",
    "plan_median_session": "dpq_spark.core.interactive.planner",
    "Plan": "dpq_spark.core.interactive.planner",
}


__getattr__, __dir__ = lazy_attributes(globals(), _LAZY)
