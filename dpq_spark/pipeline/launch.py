"""The Spark session a job runs on: the active one, or a local JVM the job starts and stops."""

from __future__ import annotations

import logging
import os
import shlex
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

__all__ = ["get_session", "stop_session"]

log = logging.getLogger(__name__)


def get_session(properties_file: str | None) -> "tuple[SparkSession, bool]":
    """The active session, or a plain ``getOrCreate()``; and whether the job started its JVM
    (then the job stops the session on every exit path; a session owned by spark-submit,
    Spark Connect or Databricks is never stopped).

    Under spark-submit (or on Databricks) the master and settings come from there. Only when the
    job starts its own JVM (``python jobs/dp_quantiles.py``) does it pass ``job.spark_properties``
    to Spark's launcher as ``--properties-file``, adding ``--master local[*]`` when that file
    names no master, and ``PYSPARK_PYTHON`` defaulting to this interpreter. No Spark setting
    is made in code.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    launched_by_spark = any(v in os.environ for v in (
        "PYSPARK_GATEWAY_PORT", "SPARK_REMOTE", "DATABRICKS_RUNTIME_VERSION"))
    if launched_by_spark:  # spark-submit, Connect or Databricks own the session: never stop it
        return SparkSession.builder.getOrCreate(), False
    if "PYSPARK_SUBMIT_ARGS" not in os.environ:
        args = []
        if not _names_master(properties_file) and "MASTER" not in os.environ:
            args += ["--master", "local[*]"]
        if properties_file:
            args += ["--properties-file", properties_file]
        os.environ["PYSPARK_SUBMIT_ARGS"] = shlex.join(args + ["pyspark-shell"])
        # Local Python workers run the driver's interpreter (where dpq_spark is installed).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return SparkSession.builder.getOrCreate(), True


def stop_session(spark: "SparkSession") -> None:
    """Stop a session the job started (its local JVM with it); never raise from here."""
    try:
        spark.stop()
        log.info("spark session stopped")
    except Exception as exc:  # pragma: no cover - best effort on the way out
        log.warning("stopping the spark session failed (%s)", type(exc).__name__)


def _names_master(properties_file: str | None) -> bool:
    if not properties_file:
        return False
    with open(properties_file, encoding="utf-8") as fh:
        return any(line.split(None, 1)[:1] == ["spark.master"] for line in fh)
