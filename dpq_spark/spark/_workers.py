"""The Python workers of a local session: a one-line error, before any Spark job, when they
would run an interpreter that cannot import dpq_spark.

pyspark starts its Python workers with the interpreter it read from ``PYSPARK_PYTHON`` when the
SparkContext was created, or with ``python3`` from ``PATH`` when that was unset (the conf
``spark.pyspark.python`` is read by ``spark-submit`` only, not by a session built in Python).
A script run as ``.venv/bin/python script.py`` without an activated venv therefore gets workers
that run the system's ``python3``, without pyarrow or dpq_spark, and the first release fails
deep inside Spark with a worker traceback. A running session keeps its workers' interpreter
(the DataFrame API offers no way to change it; only ``PYSPARK_PYTHON`` set before the session
is created does), so :func:`check_workers` tells the user in one line how to fix it instead.

Only releases that run Python workers are checked: grouped ones (their groups are released
inside ``mapInArrow``), and on pyspark 3.5 every release (its collect goes through
``mapInArrow``); on pyspark 4 an ungrouped release runs in the JVM and on the driver alone, and
works whatever the workers' interpreter (so does :class:`~dpq_spark.spark.MedianMechanismSession`,
whose one job is a JVM ``groupBy``: it is not checked). The check runs on local classic sessions
only (master ``local`` or ``local[...]``: the workers run on this machine, so the driver can try
their interpreter itself); Spark Connect, clusters and Databricks start their workers elsewhere
and are never checked. The answer is cached per SparkContext and interpreter; when the workers
run this very interpreter nothing is started.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys

__all__ = ["WorkerPythonError", "check_workers"]

logger = logging.getLogger(__name__)

#: What a Python worker imports to run a release (tests/spark/test_worker_imports.py).
WORKER_MODULES = ("numpy", "pyarrow", "dpq_spark.spark._release")
_PROBE = (
    "import sys\n"
    "missing = []\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        __import__(name)\n"
    "    except Exception:\n"
    "        missing.append(name.split('.')[0])\n"
    "print('%d.%d' % sys.version_info[:2], *dict.fromkeys(missing))\n"
)
_PROBE_TIMEOUT = 60.0
_checked: dict[tuple[str, str], str | None] = {}


class WorkerPythonError(RuntimeError):
    """The Python workers of a local session would run an interpreter that cannot run
    dpq_spark (raised before any Spark job; nothing was computed or spent)."""


def check_workers(spark, what: str = "dp_quantiles", *, grouped: bool = True) -> None:
    """Raise :class:`WorkerPythonError` if the local session's Python workers cannot import
    what a release needs (numpy, pyarrow, dpq_spark) or run another Python version.

    Parameters
    ----------
    spark : SparkSession
        The session of the DataFrame about to be released.
    what : str
        The caller's name, for the message.
    grouped : bool
        Whether the release has group keys (then it runs Python workers on any pyspark).

    Raises
    ------
    WorkerPythonError
        One line: which interpreter the workers run, what it lacks, and how to fix it.
    """
    if not (grouped or _collects_in_workers()):
        return
    python, app = _local_worker_python(spark)
    if python is None or _is_this_interpreter(python):
        return
    key = (app, python)
    if key not in _checked:
        _checked[key] = _probe(python)
    problem = _checked[key]
    if problem is None:
        return
    if os.environ.get("PYSPARK_PYTHON"):
        source = "from PYSPARK_PYTHON"
    else:
        source = "pyspark's default while PYSPARK_PYTHON is unset"
    ignored = ""
    if _conf(spark, "spark.pyspark.python") is not None:
        ignored = " (`spark.pyspark.python` is read by spark-submit only, not here)"
    raise WorkerPythonError(
        f"{what}: the Python workers of this local Spark session run {python!r} ({source}), "
        f"which {problem}{ignored}; set PYSPARK_PYTHON to this interpreter before the session "
        f"is created, e.g. `os.environ[\"PYSPARK_PYTHON\"] = sys.executable` "
        f"(here {sys.executable}) before `SparkSession.builder...getOrCreate()` or "
        f"`export PYSPARK_PYTHON={sys.executable}`, then restart the session")


def _collects_in_workers() -> bool:
    from dpq_spark.spark._compat import SPARK_VERSION  # pyspark is there: a session exists

    return SPARK_VERSION < (4, 0)


def _conf(spark, key: str) -> str | None:
    try:
        return spark.conf.get(key, None)
    except Exception:  # a session that refuses to read its conf: treat as unset
        return None


def _local_worker_python(spark) -> tuple[str | None, str]:
    """The interpreter the workers of a local classic session run, and the application id;
    ``(None, "")`` when there is nothing to check (Connect, a cluster, Databricks)."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return None, ""
    if "DATABRICKS_RUNTIME_VERSION" in os.environ:
        return None, ""
    master = _conf(spark, "spark.master") or ""
    if not (master == "local" or master.startswith("local[")):
        return None, ""
    # What pyspark hands the JVM with every Python function is PYSPARK_PYTHON as it was when
    # the session started, else "python3"; read from the environment, not from the session's
    # SparkContext (this package uses the DataFrame API only). A PYSPARK_PYTHON changed after
    # the session started is checked in place of the one its workers run.
    python = os.environ.get("PYSPARK_PYTHON") or "python3"
    return python, _conf(spark, "spark.app.id") or ""


def _is_this_interpreter(python: str) -> bool:
    # Compare paths, never their symlink targets: a venv's python links to the base
    # interpreter but has other packages.
    if python == sys.executable:
        return True
    found = shutil.which(python)
    return found is not None and os.path.abspath(found) == os.path.abspath(sys.executable)


def _probe(python: str) -> str | None:
    """What is wrong with ``python`` as a worker interpreter (None: nothing)."""
    try:
        result = subprocess.run([python, "-c", _PROBE, *WORKER_MODULES], capture_output=True,
                                text=True, timeout=_PROBE_TIMEOUT, stdin=subprocess.DEVNULL)
    except OSError as exc:
        return f"cannot be started ({exc.strerror or type(exc).__name__})"
    except subprocess.TimeoutExpired:
        logger.warning("worker python %r did not answer within %.0f s; not checked", python,
                       _PROBE_TIMEOUT)
        return None
    words = result.stdout.split()
    if result.returncode != 0 or not words:
        return f"fails to start (exit code {result.returncode})"
    version, missing = words[0], words[1:]
    here = "%d.%d" % sys.version_info[:2]
    if missing:
        return f"cannot import {', '.join(missing)}"
    if version != here:
        return f"is Python {version}, not this driver's Python {here}"
    return None
