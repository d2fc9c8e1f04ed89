"""The pure quantile mechanisms by name, as their modules define them (bounds required).

:mod:`~dpq_spark.core.quantiles.mechanisms` offers them with optional bounds (a missing bound
released privately first), and ``auto`` (:mod:`~dpq_spark.core.quantiles.choose`) runs the one
its rule picks.
"""

from __future__ import annotations

from typing import Callable

from dpq_spark.core.quantiles.agg_tree import agg_tree as _base_agg_tree
from dpq_spark.core.quantiles.agg_tree import histogram as _base_histogram
from dpq_spark.core.quantiles.approx_quantiles import approx_quantiles as _base_approx_quantiles
from dpq_spark.core.quantiles.ind_exp import ind_exp as _base_ind_exp
from dpq_spark.core.quantiles.joint_exp import joint_exp as _base_joint_exp
from dpq_spark.core.quantiles.sized_tree import agg_tree_8x3 as _base_agg_tree_8x3
from dpq_spark.core.quantiles.sized_tree import agg_tree_12x3 as _base_agg_tree_12x3
from dpq_spark.core.quantiles.sized_tree import agg_tree_8x4 as _base_agg_tree_8x4

__all__ = ["get_base_mechanism"]

# The pure mechanisms as their modules define them (``lower``/``upper`` required).
_BASE: dict[str, Callable] = {
    "joint_exp": _base_joint_exp,
    "ind_exp": _base_ind_exp,
    "agg_tree": _base_agg_tree,
    "histogram": _base_histogram,
    "approx_quantiles": _base_approx_quantiles,
    "agg_tree_8x3": _base_agg_tree_8x3,
    "agg_tree_12x3": _base_agg_tree_12x3,
    "agg_tree_8x4": _base_agg_tree_8x4,
}


def get_base_mechanism(name: str) -> Callable:
    """The pure mechanism ``name`` as its module defines it (bounds required)."""
    return _BASE[name]
