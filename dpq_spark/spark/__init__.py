"""The Spark layer of dpq_spark (DataFrame API only, so it also runs on Spark Connect).

The public names are imported on first use (PEP 562): a Spark Python worker that imports
``dpq_spark.spark._release`` pays for that module alone, not for pyspark.sql, pandas and the
median-mechanism session.
"""

from __future__ import annotations

from dpq_spark._lazy import lazy_attributes

_NAMES = {
    "dp_quantiles": "dpq_spark.spark.quantiles",
    "MedianMechanismSession": "dpq_spark.spark.median_session",
    "NumericColumn": "dpq_spark.spark.median_session",
    "CategoricalColumn": "dpq_spark.spark.median_session",
    "QuantileAnswer": "dpq_spark.spark.median_session",
}

__all__ = ["dp_quantiles", "MedianMechanismSession", "NumericColumn", "CategoricalColumn", "QuantileAnswer"]


__getattr__, __dir__ = lazy_attributes(globals(), _NAMES)
