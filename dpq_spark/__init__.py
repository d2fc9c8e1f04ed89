"""dpq_spark: differentially private quantiles and counting queries on Apache Spark.

The numpy core (``dpq_spark.core``) needs only numpy and scipy. The Spark functions are imported
lazily, so ``import dpq_spark`` works without pyspark installed; touching a Spark name without
pyspark raises an ImportError that says which extra to install.
"""

from __future__ import annotations

import dpq_spark.core as _core
from dpq_spark.core import __all__ as _core_all

# The core's names, except those it imports on first use (the median mechanism), which
# __getattr__ below resolves through it.
globals().update({name: getattr(_core, name) for name in _core_all if name not in _core._LAZY})

from dpq_spark._version import __version__  # noqa: F401 (the package's version)

_SPARK_NAMES = {
    "dp_quantiles": "dpq_spark.spark",
    "MedianMechanismSession": "dpq_spark.spark",
    "BudgetSession": "dpq_spark.pipeline.session",
}
# Names of the pipeline that need no pyspark.
_PIPELINE_NAMES = {
    "PrivacyUnit": "dpq_spark.pipeline.ledger.unit",
}

__all__ = list(_core_all) + sorted(_SPARK_NAMES) + sorted(_PIPELINE_NAMES)


def __getattr__(name: str):
    if name in _core._LAZY:
        return getattr(_core, name)
    import importlib

    if name in _PIPELINE_NAMES:
        return getattr(importlib.import_module(_PIPELINE_NAMES[name]), name)
    module = _SPARK_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'dpq_spark' has no attribute {name!r}")
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:  # pragma: no cover - exercised by the no-pyspark test
        raise ImportError(
            f"dpq_spark.{name} needs the Spark extra: pip install 'dpq_spark[spark]' ({exc})"
        ) from exc
