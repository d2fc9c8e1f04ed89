"""Shared pytest fixtures.

``spark``: the ONE session-scoped SparkSession of the suite (``local[2]``, 4 shuffle partitions,
UI off, UTC, Arrow on). It reuses an active session when there is one and never stops a session
it did not start. Tests that need pyspark should take this fixture; core tests must not.

``standalone_cluster``: a real Spark standalone master and worker on 127.0.0.1 for
``spark-submit`` tests; see :mod:`tests.cluster`.

Under ``pytest -n 2`` (``make test``), every test outside ``tests/core`` runs in one xdist worker
(``pytest_xdist_make_scheduler`` below).
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # make `tests/cluster.py` importable as `cluster`

SPARK_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    # DPQ_TEST_ARROW=false runs the suite with Arrow conversions off, pyspark 3.5's default
    "spark.sql.execution.arrow.pyspark.enabled": os.environ.get("DPQ_TEST_ARROW", "true"),
    "spark.default.parallelism": "2",
    "spark.driver.memory": "2g",
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under ``pytest -n 2`` (``make test``), one xdist worker runs every test outside
    ``tests/core``, in collection order, as a serial run would: one Spark session, one PostgreSQL
    server, one standalone cluster, and never two tests starting JVMs at once on a 2-core machine.
    The numpy-only core tests go to the other worker(s) one by one. (xdist's own ``loadgroup``
    marks cannot do this on pytest >= 9.2, which no longer lets a plugin rename a test:
    pytest-dev/pytest-xdist issue 1386.)"""
    from xdist.scheduler import LoadScopeScheduling

    class JvmTestsInOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return nodeid if nodeid.startswith("tests/core/") else "jvm"

    return JvmTestsInOneWorker(config, log)


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.spark4`` tests (Spark Connect) are skipped, with the reason, on pyspark 3.5."""
    marked = [item for item in items if item.get_closest_marker("spark4")]
    if not marked:
        return
    try:
        from dpq_spark.spark._compat import SPARK_VERSION
    except ImportError:  # no pyspark: those tests skip themselves
        return
    if SPARK_VERSION >= (4, 0):
        return
    version = ".".join(map(str, SPARK_VERSION))
    reason = (f"needs pyspark 4.x, found {version}: on pyspark 3.5 dpq_spark supports and tests "
              f"classic sessions only (Spark Connect is tested on 4.x)")
    for item in marked:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def spark():
    """Session-scoped local[2] SparkSession (reuses the active one if present)."""
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master("local[2]").appName("dpq_spark-tests")
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def standalone_cluster():
    """A standalone master + one worker on 127.0.0.1, stopped at teardown.

    Yields a :class:`cluster.StandaloneCluster` whose ``master_url`` is
    ``spark://127.0.0.1:PORT``; use ``cluster.spark_submit(...)`` to send a job to it.
    """
    pytest.importorskip("pyspark")
    from cluster import StandaloneCluster

    with StandaloneCluster() as running:
        yield running
