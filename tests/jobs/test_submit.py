"""The job as a separate process: spark-submit in local mode, spark-submit to the standalone
cluster on loopback, and a job killed between the release and the write.

Each run starts its own JVM (20-40 s), so there are exactly three.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest

from dpq_spark.ledger import Ledger

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = os.path.join(ROOT, "jobs", "dp_quantiles.py")
GOODREADS_KEYS = 14  # languages listed in conf/goodreads.toml


def _env() -> dict:
    env = dict(os.environ)
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    return env


def _check_goodreads_release(result, out, ledger_path):
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"Release written to {out}" in result.stdout
    (csv,) = [f for f in os.listdir(out) if f.endswith(".csv")]
    rel = pd.read_csv(os.path.join(out, csv))
    assert len(rel) == GOODREADS_KEYS * 9 and rel["value"].between(0.0, 5.0).all()
    assert os.path.exists(os.path.join(out, "_release.json"))
    (rec,) = Ledger(ledger_path).records("goodreads_books")
    assert rec.status == "committed" and rec.output == out
    logs = result.stdout + result.stderr  # spark-submit merges Python's stderr into stdout
    for stage in ("open ledger", "start spark", "check input", "reserve budget", "release",
                  "write output"):
        assert f"stage {stage}: done in" in logs
    return rel, logs


def test_spark_submit_local_mode_goodreads(tmp_path):
    from cluster import spark_home

    out, ledger = str(tmp_path / "rel"), str(tmp_path / "ledger.sqlite")
    cmd = [str(spark_home() / "bin" / "spark-submit"), "--master", "local[2]",
           "--properties-file", "conf/spark-local.conf", JOB, "--config", "conf/goodreads.toml",
           "--output", out, "--ledger", ledger]
    result = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True,
                            timeout=600)
    rel, logs = _check_goodreads_release(result, out, ledger)
    for v in rel["value"]:  # no released value in the logs
        assert repr(float(v)) not in logs


def test_spark_submit_standalone_cluster(standalone_cluster, tmp_path):
    out, ledger = str(tmp_path / "rel"), str(tmp_path / "ledger.sqlite")
    result = standalone_cluster.spark_submit(
        JOB, "--config", "conf/goodreads.toml", "--output", out, "--ledger", ledger,
        "--set", "release.quantiles=\"deciles\"", cwd=ROOT)
    _check_goodreads_release(result, out, ledger)


def test_job_killed_between_release_and_write_stays_charged(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("v\n" + "\n".join(str(i % 10) for i in range(100)) + "\n")
    ledger = str(tmp_path / "ledger.sqlite")
    (tmp_path / "job.toml").write_text(f"""
[input]
format = "csv"
path = "{data}"
column = "v"
[release]
quantiles = "median"
epsilon = 1.0
lower = 0.0
upper = 10.0
[output]
path = "{tmp_path / 'out' / 'rel'}"
[ledger]
path = "{ledger}"
dataset_id = "d"
epsilon_cap = 1.0
""")
    env = {**_env(), "DPQ_SPARK_FAULT": "after_sample"}
    result = subprocess.run([sys.executable, JOB, "--config", str(tmp_path / "job.toml")],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 86, result.stderr[-4000:]
    assert "stage release: done in" in result.stderr
    assert not os.path.exists(tmp_path / "out" / "rel")
    assert not os.path.exists(tmp_path / "out") or not os.listdir(tmp_path / "out")
    (rec,) = Ledger(ledger).records("d")
    assert rec.status == "spent" and rec.output is None  # the noisy values existed: charged
    assert Ledger(ledger).usage("d").epsilon_remaining == 0.0
    show = subprocess.run([sys.executable, "-m", "dpq_spark.cli", "ledger", "show", "--dataset",
                           "d", "--ledger", ledger], capture_output=True, text=True, timeout=60)
    assert show.returncode == 0 and "spent" in show.stdout and "left 0" in show.stdout
