"""dp_quantiles beyond the classic local session: Spark Connect and a standalone cluster.

Both run in their own process (a Connect session and a classic one cannot share a driver) with
the same deterministic data and seeded Generator as the in-process run; the seeded release only
depends on each group's cell counts and key, so all three must agree exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("pyspark")
from pyspark.sql import functions as F  # noqa: E402

from dpq_spark import dp_quantiles  # noqa: E402

SCRIPT = textwrap.dedent('''
    import json, sys
    import numpy as np
    from pyspark.sql import SparkSession, functions as F
    from dpq_spark import dp_quantiles

    mode, out_path = sys.argv[1], sys.argv[2]
    builder = SparkSession.builder.appName("dpq-deploy-test")
    if mode == "connect":
        # Port 0: an ephemeral gRPC port, so parallel local Connect servers do not collide
        # (pyspark's client looks the real port up when SPARK_TESTING is set, see _env()).
        builder = (builder.master("local[2]").config("spark.api.mode", "connect")
                   .config("spark.connect.grpc.binding.port", "0"))
    spark = builder.getOrCreate()
    df = spark.range(3000).select((F.col("id") % 3).alias("g"),
                                  ((F.col("id") * 7919) % 1000 / 10.0).alias("x"))
    out = dp_quantiles(df, "x", quantiles=[0.25, 0.5, 0.75], epsilon=1.0, lower=0.0,
                       upper=100.0, group_by="g", groups=[0, 1, 2, 9],
                       rng=np.random.default_rng(7))
    rows = [list(r) for r in out.collect()]
    assert rows == [list(r) for r in out.collect()], "two actions disagree"
    with open(out_path, "w") as fh:
        master = spark.conf.get("spark.master") if mode == "submit" else None
        json.dump({"rows": rows, "session": type(spark).__module__, "master": master}, fh)
    spark.stop()
''')


def _local_rows(spark):
    df = spark.range(3000).select((F.col("id") % 3).alias("g"),
                                  ((F.col("id") * 7919) % 1000 / 10.0).alias("x"))
    out = dp_quantiles(df, "x", quantiles=[0.25, 0.5, 0.75], epsilon=1.0, lower=0.0,
                       upper=100.0, group_by="g", groups=[0, 1, 2, 9],
                       rng=np.random.default_rng(7))
    return [list(r) for r in out.collect()]


def _env(connect: bool = False):
    from cluster import clean_environ

    env = clean_environ()
    if connect:
        env["SPARK_TESTING"] = "1"  # lets the client find the server's ephemeral port
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return env


@pytest.mark.slow
@pytest.mark.spark4
def test_spark_connect_session_gives_the_same_release(spark, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    result_path = tmp_path / "connect.json"
    proc = subprocess.run([sys.executable, str(script), "connect", str(result_path)],
                          capture_output=True, text=True, env=_env(connect=True), timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(result_path.read_text())
    assert result["session"].startswith("pyspark.sql.connect")
    assert len(result["rows"]) == 12
    assert result["rows"] == _local_rows(spark)


@pytest.mark.slow
def test_standalone_cluster_spark_submit_gives_the_same_release(standalone_cluster, spark, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    result_path = tmp_path / "cluster.json"
    proc = standalone_cluster.spark_submit(script, "submit", result_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(result_path.read_text())
    assert result["rows"] == _local_rows(spark)
    assert result["master"] == standalone_cluster.master_url  # really ran on the cluster


def test_cluster_helper_stops_what_it_started():
    from cluster import StandaloneCluster

    c = StandaloneCluster(worker_memory="512m")
    assert c.master_url.startswith("spark://127.0.0.1:")
    c.stop()  # stopping before start is a no-op
    assert c._procs == []
