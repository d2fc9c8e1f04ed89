"""The job as a separate process: spark-submit in local mode, spark-submit to the standalone
cluster on loopback, and a job killed between the release and the write.

Each run starts its own JVM (20-40 s), so there are exactly three.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pandas as pd
import pytest

from dpq_spark.pipeline.ledger import open_ledger as Ledger

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
    # no released value in the logs. Round values (multiples of 0.1) are skipped: they occur
    # in any log by chance (quantile levels, epsilon), and "auto" may pick AggTree for a tiny
    # group, whose data-free answer is the evenly spaced 0.5, 1.0, ... 4.5 on [0, 5]. The
    # stages' durations ("done in 3.75 s"), which a two-decimal rating can equal by chance, are
    # taken out of the logs first
    without_durations = re.sub(r"\b\d+\.\d+ ?s\b", "<duration>", logs)
    for v in rel["value"]:
        if float(v) * 10 != round(float(v) * 10):
            assert repr(float(v)) not in without_durations
    # conf/spark-local.conf sets spark.log.level=WARN: a handful of Spark start-up INFO lines
    # (before the level applies) instead of hundreds
    spark_info = [ln for ln in logs.splitlines() if " INFO " in ln and "dpq_spark" not in ln]
    assert len(spark_info) <= 10, spark_info[:20]


def test_spark_submit_standalone_cluster(standalone_cluster, tmp_path):
    out, ledger = str(tmp_path / "rel"), str(tmp_path / "ledger.sqlite")
    result = standalone_cluster.spark_submit(
        JOB, "--config", "conf/goodreads.toml", "--output", out, "--ledger", ledger,
        "--set", "release.quantiles=\"deciles\"", cwd=ROOT)
    _check_goodreads_release(result, out, ledger)


def _job_toml(tmp_path, url, out):
    data = tmp_path / "d.csv"
    data.write_text("v\n" + "\n".join(str(i % 10) for i in range(100)) + "\n")
    path = tmp_path / "job.toml"
    path.write_text(f"""
[input]
format = "csv"
path = "{data}"
column = "v"
schema = {{ v = "double" }}
[release]
quantiles = "median"
epsilon = 1.0
lower = 0.0
upper = 10.0
[output]
path = "{out}"
format = "csv"
[ledger]
url = "{url}"
dataset_id = "d"
epsilon_cap = 2.0
""")
    return str(path)


def test_job_killed_between_release_and_write_stays_charged(tmp_path, pg_url):
    """SIGKILL after the release was sampled, with the PostgreSQL ledger (password from
    PGPASSWORD, as on a cluster): the record stays `spent`, the budget charged."""
    open_ledger = _init(pg_url)
    config = _job_toml(tmp_path, pg_url, tmp_path / "out" / "rel")
    env = {**_env(), "DPQ_SPARK_FAULT": "after_sample"}
    result = subprocess.run([sys.executable, JOB, "--config", config],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == -signal.SIGKILL, result.stderr[-4000:]
    assert "stage release: done in" in result.stderr
    assert not os.path.exists(tmp_path / "out") or not os.listdir(tmp_path / "out")
    (rec,) = open_ledger(pg_url).records("d")
    assert rec.status == "spent" and rec.output is None  # the noisy values existed: charged
    assert open_ledger(pg_url).usage("d").epsilon_remaining == 1.0
    show = subprocess.run([sys.executable, "-m", "dpq_spark.pipeline.cli", "ledger", "show", "--dataset",
                           "d", "--ledger", pg_url], capture_output=True, text=True, timeout=60,
                          env=_env())
    assert show.returncode == 0 and "spent" in show.stdout and "left 1" in show.stdout
    assert os.environ["PGPASSWORD"] not in show.stdout + result.stdout + result.stderr
    assert ":***@" not in pg_url and pg_url in show.stdout  # the URL had no password to hide


def _init(url):
    from dpq_spark.pipeline.ledger import init_ledger, open_ledger

    init_ledger(url, dataset_id="d", epsilon_cap=2.0)
    return open_ledger


def test_job_killed_while_writing_leaves_no_hidden_release_and_is_cleaned(spark, tmp_path):
    """SIGKILL once Spark has written the temporary directory: only an `.incomplete-`
    directory is left (recorded in the ledger), and the next run of the dataset removes it."""
    url = f"sqlite://{tmp_path / 'ledger.sqlite'}"
    open_ledger = _init(url)
    out = tmp_path / "out" / "rel"
    config = _job_toml(tmp_path, url, out)
    env = {**_env(), "DPQ_SPARK_FAULT": "during_write"}
    result = subprocess.run([sys.executable, JOB, "--config", config],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == -signal.SIGKILL, result.stderr[-4000:]
    (left,) = os.listdir(tmp_path / "out")
    assert left.startswith(".rel.incomplete-r1-") and not out.exists()
    assert not os.path.exists(tmp_path / "out" / left / "_release.json")
    (rec,) = open_ledger(url).records("d")
    assert rec.status == "spent" and rec.output == str(tmp_path / "out" / left)
    # the next run (here in-process) removes the dead run's directory and releases normally
    from dpq_spark.pipeline.job import main

    assert main(["--config", config]) == 0
    assert os.listdir(tmp_path / "out") == ["rel"] and (out / "_release.json").exists()
    first, second = open_ledger(url).records("d")
    assert first.status == "spent" and "incomplete output was removed" in first.note
    assert second.status == "committed"
