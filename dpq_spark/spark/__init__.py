"""The Spark layer of dpq_spark (DataFrame API only, so it also runs on Spark Connect)."""

from __future__ import annotations

from dpq_spark.spark.median_session import CategoricalColumn, MedianMechanismSession, NumericColumn, QuantileAnswer
from dpq_spark.spark.quantiles import dp_quantiles

__all__ = ["dp_quantiles", "MedianMechanismSession", "NumericColumn", "CategoricalColumn", "QuantileAnswer"]
