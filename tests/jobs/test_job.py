"""The dp_quantiles job in-process on the shared local session: inputs, output, ledger, logs."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pandas as pd
import pytest

from dpq_spark.config import load_config, parse_config
from dpq_spark.core.errors import BudgetExceededError
from dpq_spark.job import main, read_input, run_job
from dpq_spark.ledger import Ledger

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOODREADS = os.path.join(ROOT, "data", "goodreads_books.csv")


def small_csv(tmp_path) -> str:
    """Scores 0..9.9 in groups a/b, a header with padded names, and two malformed rows."""
    lines = ["id,  score ,grp"]
    for i in range(200):
        lines.append(f"{i},{(i % 100) / 10:.1f},{'ab'[i % 2]}")
    lines.append("900,1.0,a,extra field")       # one field too many: dropped
    lines.append("901,2.0,b,x,y")               # two too many: dropped
    lines.append("902,not a number,a")          # not numeric: null, dropped by dp_quantiles
    path = tmp_path / "scores.csv"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def toml(tmp_path, data: str, *, out="out/rel", cap=1e6, epsilon=1e5, extra="") -> str:
    text = f"""
[input]
format = "csv"
path = "{data}"
column = "score"
group_by = ["grp"]

[groups]
keys = ["a", "b", "c"]

[release]
quantiles = [0.25, 0.5, 0.75]
epsilon = {epsilon}
lower = 0.0
upper = 10.0

[output]
path = "{tmp_path / out}"
format = "csv"

[ledger]
path = "{tmp_path / 'ledger.sqlite'}"
dataset_id = "scores"
epsilon_cap = {cap}
{extra}"""
    path = tmp_path / "job.toml"
    path.write_text(text)
    return str(path)


def read_release(path) -> pd.DataFrame:
    files = [f for f in os.listdir(path) if f.endswith(".csv")]
    assert len(files) == 1
    return pd.read_csv(os.path.join(path, files[0]), keep_default_na=False)


def test_read_input_drops_malformed_rows_and_strips_header(spark, tmp_path):
    cfg = load_config(toml(tmp_path, small_csv(tmp_path)))
    df = read_input(spark, cfg.input)
    assert df.columns == ["grp", "score"]
    assert dict(df.schema["score"].jsonValue()) ["type"] == "double"
    rows = df.collect()
    assert len(rows) == 201  # 200 good rows + the non-numeric one; malformed rows are gone
    assert sum(r.score is None for r in rows) == 1


def test_read_input_goodreads(spark, tmp_path):
    raw = {"input": {"format": "csv", "path": GOODREADS, "column": "num_pages",
                     "group_by": ["language_code"]},
           "groups": {"keys": ["eng"]},
           "release": {"quantiles": "median", "epsilon": 1.0, "lower": 0, "upper": 2000},
           "output": {"path": str(tmp_path / "o")},
           "ledger": {"path": str(tmp_path / "l.sqlite"), "dataset_id": "g", "epsilon_cap": 1}}
    df = read_input(spark, parse_config(raw).input)
    pdf = df.toPandas()
    assert len(pdf) == 11123  # 11,127 rows minus the 4 with an extra comma
    assert pdf["num_pages"].notna().all() and pdf["language_code"].str.len().max() <= 5


def test_job_writes_release_commits_ledger_and_logs_no_data(spark, tmp_path, caplog, capsys):
    config = toml(tmp_path, small_csv(tmp_path))
    caplog.set_level(logging.INFO, logger="dpq_spark")
    assert main(["--config", config]) == 0
    out = str(tmp_path / "out" / "rel")
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"Release written to {out}" and "dpq-spark ledger show" in printed[1]
    rel = read_release(out)
    assert list(rel.columns) == ["grp", "quantile", "value"]
    assert list(rel["grp"]) == ["a"] * 3 + ["b"] * 3 + ["c"] * 3  # "c" has no rows: answered
    # a huge epsilon makes the release close to the true quartiles (a: 0,0.2,..; b: 0.1,0.3,..)
    got = rel[rel.grp != "c"].set_index(["grp", "quantile"])["value"]
    assert np.allclose(got.to_numpy(), [2.4, 4.8, 7.4, 2.5, 4.9, 7.5], atol=0.25)
    meta = json.load(open(os.path.join(out, "_release.json")))
    assert meta["epsilon"] == 1e5 and meta["dataset_id"] == "scores"
    assert meta["guarantee"].startswith("100000-DP for adding or removing one row")
    assert not [f for f in os.listdir(tmp_path / "out") if f.startswith(".")]  # no temp left
    (rec,) = Ledger(str(tmp_path / "ledger.sqlite")).records("scores")
    assert (rec.status, rec.output, rec.epsilon) == ("committed", out, 1e5)
    # logs: stages, timings and public parameters; never values or counts
    text = "\n".join(r.getMessage() for r in caplog.records).replace(str(tmp_path), "<tmp>")
    for stage in ("reserve budget", "read input", "release", "write output", "commit ledger"):
        assert f"stage {stage}: done in" in text
    assert '"epsilon": 100000.0' in text
    for v in rel["value"]:
        assert f"{v:.4f}"[:-1] not in text
    for count in ("200", "201", "100", "101"):
        assert count not in text.replace("100000", "")


def test_rerun_without_overwrite_is_refused_and_overwrite_replaces(spark, tmp_path):
    config = toml(tmp_path, small_csv(tmp_path))
    assert main(["--config", config]) == 0
    out = tmp_path / "out" / "rel"
    before = read_release(out)
    assert main(["--config", config]) == 4  # refused before reserving anything
    ledger = Ledger(str(tmp_path / "ledger.sqlite"))
    assert [r.status for r in ledger.records("scores")] == ["committed"]
    pd.testing.assert_frame_equal(read_release(out), before)
    assert main(["--config", config, "--output-mode", "overwrite", "--epsilon", "0.5"]) == 0
    assert [r.status for r in ledger.records("scores")] == ["committed", "committed"]
    assert json.load(open(out / "_release.json"))["epsilon"] == 0.5
    assert not [f for f in os.listdir(tmp_path / "out") if f.startswith(".")]


def test_budget_is_checked_before_any_data_is_read(spark, tmp_path):
    data = small_csv(tmp_path)
    config = toml(tmp_path, data, cap=1.5, epsilon=1.0)
    assert main(["--config", config]) == 0
    cfg = load_config(config, [("output", "path", str(tmp_path / "out" / "second"))])
    os.remove(data)  # reading would fail: the refusal must come first
    with pytest.raises(BudgetExceededError, match="asks for epsilon=1 but only epsilon=0.5"):
        run_job(cfg)
    assert [r.status for r in Ledger(cfg.ledger.path).records("scores")] == ["committed"]
    assert not os.path.exists(tmp_path / "out" / "second")


def test_failure_before_sampling_gives_the_budget_back(spark, tmp_path, caplog):
    config = toml(tmp_path, small_csv(tmp_path), cap=1.0, epsilon=1.0)
    assert main(["--config", config, "--column", "price"]) == 2  # no such column in the data
    (rec,) = Ledger(str(tmp_path / "ledger.sqlite")).records("scores")
    assert rec.status == "cancelled" and "ConfigError" in rec.note
    assert "`input.column` names column 'price'" in caplog.text
    assert main(["--config", config]) == 0  # the whole budget is still there


def test_parquet_input_keys_from_file_and_table_input_keys_from_table(spark, tmp_path):
    rng = np.random.default_rng(7)
    pdf = pd.DataFrame({"g1": np.repeat(["x", "y"], 300), "g2": np.tile([1, 2, 3], 200),
                        "user": np.arange(600) % 150, "v": rng.uniform(0, 100, 600)})
    spark.createDataFrame(pdf).write.parquet(str(tmp_path / "data.parquet"))
    (tmp_path / "keys.csv").write_text("g1,g2\nx,1\nx,2\ny,3\nz,9\n")
    common = f"""
[release]
quantiles = "median"
epsilon = 1000.0
lower = 0.0
upper = 100.0
privacy_unit = "user"
max_rows_per_unit = 2
max_groups_per_unit = 2

[ledger]
path = "{tmp_path / 'ledger.sqlite'}"
dataset_id = "synthetic"
epsilon_cap = 5000.0
"""
    (tmp_path / "a.toml").write_text(f"""
[input]
format = "parquet"
path = "{tmp_path / 'data.parquet'}"
column = "v"
group_by = ["g1", "g2"]
[groups]
path = "{tmp_path / 'keys.csv'}"
[output]
path = "{tmp_path / 'out_a'}"
format = "json"
""" + common)
    assert main(["--config", str(tmp_path / "a.toml")]) == 0
    rel = spark.read.json(str(tmp_path / "out_a")).orderBy("g1", "g2").toPandas()
    assert [(r.g1, r.g2) for r in rel.itertuples()] == [("x", 1), ("x", 2), ("y", 3), ("z", 9)]
    assert rel["value"].between(0, 100).all()
    meta = json.load(open(tmp_path / "out_a" / "_release.json"))
    assert "all rows of one `user`" in meta["guarantee"]

    spark.read.parquet(str(tmp_path / "data.parquet")).createOrReplaceTempView("dpq_job_events")
    spark.createDataFrame([("y", 1), ("y", 2)], ["g1", "g2"]).createOrReplaceTempView("dpq_job_keys")
    (tmp_path / "b.toml").write_text(f"""
[input]
format = "table"
table = "dpq_job_events"
column = "v"
group_by = ["g1", "g2"]
[groups]
table = "dpq_job_keys"
[output]
path = "{tmp_path / 'out_b'}"
format = "parquet"
""" + common)
    assert main(["--config", str(tmp_path / "b.toml")]) == 0
    rel = spark.read.parquet(str(tmp_path / "out_b")).orderBy("g2").toPandas()
    assert list(rel["g2"]) == [1, 2] and list(rel["quantile"]) == [0.5, 0.5]
    assert [r.status for r in Ledger(str(tmp_path / "ledger.sqlite")).records("synthetic")] == \
        ["committed", "committed"]


def test_partition_selection_run_charges_delta(spark, tmp_path):
    pdf = pd.DataFrame({"g": np.repeat(["x", "y"], 400), "v": np.tile(np.arange(400.0) / 4, 2)})
    spark.createDataFrame(pdf).write.parquet(str(tmp_path / "data.parquet"))
    (tmp_path / "ps.toml").write_text(f"""
[input]
format = "parquet"
path = "{tmp_path / 'data.parquet'}"
column = "v"
group_by = ["g"]
[release]
quantiles = "median"
epsilon = 50.0
delta = 1e-6
lower = 0.0
upper = 100.0
[output]
path = "{tmp_path / 'out'}"
[ledger]
path = "{tmp_path / 'ledger.sqlite'}"
dataset_id = "ps"
epsilon_cap = 60.0
delta_cap = 1.5e-6
""")
    assert main(["--config", str(tmp_path / "ps.toml")]) == 0
    rel = spark.read.parquet(str(tmp_path / "out")).toPandas()
    assert set(rel["g"]) <= {"x", "y"} and rel["value"].between(0, 100).all()
    meta = json.load(open(tmp_path / "out" / "_release.json"))
    assert meta["guarantee"].startswith("(50, 1e-06)-DP")
    ledger = Ledger(str(tmp_path / "ledger.sqlite"))
    assert ledger.usage("ps").delta_spent == 1e-6
    # a second release would pass the delta cap: refused before reading
    assert main(["--config", str(tmp_path / "ps.toml"), "--output", str(tmp_path / "o2"),
                 "--epsilon", "1"]) == 3
