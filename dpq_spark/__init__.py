"""dpq_spark: differentially private quantiles and counting queries on Apache Spark.

The numpy core (``dpq_spark.core``) needs only numpy and scipy. The Spark functions are imported
lazily, so ``import dpq_spark`` works without pyspark installed; touching a Spark name without
pyspark raises an ImportError that says which extra to install.
"""

from __future__ import annotations

from dpq_spark.core import *  # noqa: F401,F403
from dpq_spark.core import __all__ as _core_all

__version__ = "0.1.0"

_SPARK_NAMES = {
    "dp_quantiles": "dpq_spark.spark",
    "MedianMechanismSession": "dpq_spark.spark",
}

__all__ = list(_core_all) + sorted(_SPARK_NAMES)


def __getattr__(name: str):
    module = _SPARK_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'dpq_spark' has no attribute {name!r}")
    import importlib

    try:
        mod = importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - exercised by the no-pyspark test
        raise ImportError(
            f"dpq_spark.{name} needs the Spark extra: pip install 'dpq_spark[spark]' ({exc})"
        ) from exc
    return getattr(mod, name)
