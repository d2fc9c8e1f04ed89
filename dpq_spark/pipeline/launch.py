"""The Spark session a job runs on: the active one, or a local JVM the job starts and stops.

A JVM the job starts logs through ``conf/log4j2.properties`` (the repository's), which keeps
private rows out of Spark's own log: exceptions are printed as their class and location only,
and the loggers whose messages embed a task's failure (a malformed record, a Python traceback)
are raised above the levels they print it at. A session the job did not start (spark-submit,
Spark Connect, Databricks) logs as its operator configured it: docs/jobs.md says what to set.
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
import shlex
import sys
from typing import TYPE_CHECKING

from dpq_spark.pipeline.config import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

__all__ = ["get_session", "stop_session"]

log = logging.getLogger(__name__)

#: The log4j2 configuration a JVM started by the job uses (the repository's ``conf/``).
LOG4J2_PROPERTIES = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "conf", "log4j2.properties")
_LOG4J2_OPTION = "-Dlog4j2.configurationFile="


def get_session(properties_file: str | None) -> "tuple[SparkSession, bool]":
    """The active session, or a plain ``getOrCreate()``; and whether the job started its JVM
    (then the job stops the session on every exit path; a session owned by spark-submit,
    Spark Connect or Databricks is never stopped).

    Under spark-submit (or on Databricks) the master and settings come from there. Only when the
    job starts its own JVM (``python jobs/dp_quantiles.py``) does it pass ``job.spark_properties``
    to Spark's launcher as ``--properties-file``, adding ``--master local[*]`` when that file
    names no master, ``PYSPARK_PYTHON`` defaulting to this interpreter, and the driver JVM
    option ``-Dlog4j2.configurationFile`` naming :data:`LOG4J2_PROPERTIES` (appended to the
    file's ``spark.driver.extraJavaOptions``; a file that names a log4j2 configuration of its
    own keeps it). No Spark setting is made in code.

    Raises
    ------
    ConfigError
        When the job would start its own JVM but :data:`LOG4J2_PROPERTIES` is missing (an
        install without the repository's ``conf/``) and the properties file names no log4j2
        configuration: Spark's default log would print private rows.
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
        os.environ["PYSPARK_SUBMIT_ARGS"] = shlex.join(_submit_args(properties_file))
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


def _submit_args(properties_file: str | None) -> list[str]:
    """The launcher arguments of a JVM the job starts (``PYSPARK_SUBMIT_ARGS``)."""
    props = _properties(properties_file)
    args = []
    if "spark.master" not in props and "MASTER" not in os.environ:
        args += ["--master", "local[*]"]
    if properties_file:
        args += ["--properties-file", properties_file]
    java = props.get("spark.driver.extraJavaOptions", "")
    if _LOG4J2_OPTION not in java:  # a file naming its own log4j2 configuration keeps it
        args += ["--conf", "spark.driver.extraJavaOptions=" + " ".join(
            filter(None, [java, _log4j2_option()]))]
    return args + ["pyspark-shell"]


def _log4j2_option() -> str:
    if not os.path.isfile(LOG4J2_PROPERTIES):
        raise ConfigError(
            f"the job starts its own Spark JVM but its log configuration {LOG4J2_PROPERTIES!r} "
            "is missing (dpq_spark installed without the repository's conf/): Spark's default "
            "log prints malformed rows and task failures in full. Name a log4j2 file in "
            "`job.spark_properties` (spark.driver.extraJavaOptions "
            "-Dlog4j2.configurationFile=file:/path/log4j2.properties; see docs/jobs.md, Logs)")
    return _LOG4J2_OPTION + pathlib.Path(LOG4J2_PROPERTIES).as_uri()


def _properties(properties_file: str | None) -> dict[str, str]:
    """The keys and values of a Spark properties file (``key value`` or ``key=value``)."""
    if not properties_file:
        return {}
    props = {}
    with open(properties_file, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line or line.startswith(("#", "!")):
                continue
            match = _PROPERTY.match(line)
            if match:
                props[match.group(1)] = match.group(2).strip()
    return props


_PROPERTY = re.compile(r"([^\s=:]+)\s*[\s=:]\s*(.*)")
