"""The dp_quantiles job in-process on the shared local session: inputs, output, ledger, logs."""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import numpy as np
import pandas as pd
import pytest

from dpq_spark.pipeline.config import load_config, parse_config
from dpq_spark.core.errors import BudgetExceededError
from dpq_spark.pipeline._signals import FAULT_ENV
from dpq_spark.pipeline.inputs import read_input
from dpq_spark.pipeline.job import main, run_job
from dpq_spark.pipeline.ledger import open_ledger
from jobconfig import write_job_config

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


def Ledger(path):
    return open_ledger(str(path))


def toml(tmp_path, data: str, *, out="out/rel", cap=1e6, epsilon=1e5, extra="",
         ledger=None, bounds="lower = 0.0\nupper = 10.0") -> str:
    return write_job_config(
        tmp_path / "job.toml", data=data, column="score", group_by=["grp"],
        keys=["a", "b", "c"], quantiles="[0.25, 0.5, 0.75]", epsilon=epsilon, bounds=bounds,
        output=tmp_path / out, ledger_url=ledger or "sqlite://" + str(tmp_path / "ledger.sqlite"),
        dataset_id="scores", cap=cap, create=True, extra=extra)


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
    assert len(rows) == 200  # malformed rows (also the non-numeric score) are dropped
    assert sum(r.score is None for r in rows) == 0


def test_read_input_goodreads(spark, tmp_path):
    raw = {"input": {"format": "csv", "path": GOODREADS, "column": "num_pages",
                     "group_by": ["language_code"], "schema": {"num_pages": "double"}},
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
    assert printed[0] == f"Release written to {out}"
    assert printed[1] == "Spent epsilon 100000 of dataset 'scores': 900000 of 1e+06 left"
    assert "dpq-spark ledger show" in printed[2]
    rel = read_release(out)
    assert list(rel.columns) == ["grp", "quantile", "value", "mechanism"]
    assert list(rel["grp"]) == ["a"] * 3 + ["b"] * 3 + ["c"] * 3  # "c" has no rows: answered
    assert set(rel.loc[rel.grp != "c", "mechanism"]) == {"approx_quantiles"}  # auto, m = 3
    # a huge epsilon makes the release close to the true quartiles (a: 0,0.2,..; b: 0.1,0.3,..)
    got = rel[rel.grp != "c"].set_index(["grp", "quantile"])["value"]
    # (observed spread of these values under OS entropy: up to about 0.35, with either CSV
    # read path; 0.25 failed about one run in three)
    assert np.allclose(got.to_numpy(), [2.4, 4.8, 7.4, 2.5, 4.9, 7.5], atol=0.45)
    meta = json.load(open(os.path.join(out, "_release.json")))
    assert meta["epsilon"] == 1e5 and meta["dataset_id"] == "scores"
    assert meta["guarantee"].startswith("100000-DP for adding or removing one row")
    assert not [f for f in os.listdir(tmp_path / "out") if f.startswith(".")]  # no temp left
    (rec,) = Ledger(str(tmp_path / "ledger.sqlite")).records("scores")
    assert (rec.status, rec.output, rec.epsilon) == ("committed", out, 1e5)
    # logs: stages, timings and public parameters; never values or counts
    text = "\n".join(r.getMessage() for r in caplog.records).replace(str(tmp_path), "<tmp>")
    for stage in ("open ledger", "check input", "reserve budget", "release", "write output",
                  "commit ledger"):
        assert f"stage {stage}: done in" in text
    assert '"epsilon": 100000.0' in text
    for v in rel["value"]:
        assert f"{v:.4f}"[:-1] not in text
    for count in ("200", "201", "100", "101"):
        assert count not in text.replace("100000", "")


def test_job_without_bounds_charges_the_whole_epsilon(spark, tmp_path):
    """No `lower`/`upper`: private bounds per group with bounds_share, then the quartiles; the
    ledger is charged the whole epsilon once (both steps)."""
    config = toml(tmp_path, small_csv(tmp_path), epsilon=1e4, bounds="bounds_share = 0.25")
    assert main(["--config", config]) == 0
    out = str(tmp_path / "out" / "rel")
    rel = read_release(out)
    assert list(rel["grp"]) == ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    got = rel[rel.grp != "c"].set_index(["grp", "quantile"])["value"].astype(float)
    assert np.allclose(got.to_numpy(), [2.4, 4.8, 7.4, 2.5, 4.9, 7.5], atol=0.45)
    # the listed key without rows is too small for its bounds budget: flagged, no values
    empty = rel[rel.grp == "c"]
    assert set(empty["mechanism"]) == {"bounds_not_found"} and set(empty["value"]) == {""}
    meta = json.load(open(os.path.join(out, "_release.json")))
    assert meta["lower"] is None and meta["upper"] is None and meta["bounds_share"] == 0.25
    assert "private clamping bounds with 0.25 of epsilon" in meta["guarantee"]
    (rec,) = Ledger(str(tmp_path / "ledger.sqlite")).records("scores")
    assert (rec.status, rec.epsilon) == ("committed", 1e4)


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
    assert [r.status for r in Ledger(cfg.ledger.url).records("scores")] == ["committed"]
    assert not os.path.exists(tmp_path / "out" / "second")


def test_input_problems_are_refused_before_any_reservation(spark, tmp_path, caplog):
    data = small_csv(tmp_path)
    config = toml(tmp_path, data, cap=1.0, epsilon=1.0)
    ledger_file = tmp_path / "ledger.sqlite"
    assert main(["--config", config, "--column", "price"]) == 2  # no declared type
    assert "`input.schema` must declare the type of `input.column` 'price'" in caplog.text
    assert main(["--config", config, "--column", "price", "--set",
                 'input.schema.price="double"']) == 2  # declared, not in the data
    assert "`input.schema` names column 'price', which is not in the CSV header" in caplog.text
    assert not ledger_file.exists() or Ledger(ledger_file).records("scores") == []
    # a Parquet string column: refused by its type, before the budget is touched
    pd.DataFrame({"v": ["1.5", "2.5", "x"], "g": ["a", "b", "a"]}).to_parquet(tmp_path / "s.pq")
    typed = tmp_path / "typed.toml"
    typed.write_text(open(config).read().replace('schema = { "score" = "double" }\n', ""))
    assert main(["--config", str(typed), "--set", 'input.format="parquet"', "--set",
                 "input.csv={}", "--input", str(tmp_path / "s.pq"), "--column", "v",
                 "--set", "input.group_by=[\"g\"]"]) == 2
    assert "`input.column` 'v' has type string in the input" in caplog.text
    # a key file with a header and no keys
    (tmp_path / "keys.csv").write_text("grp\n")
    keyed = tmp_path / "keyed.toml"
    keyed.write_text(open(config).read().replace('keys = ["a", "b", "c"]',
                                                 f'path = "{tmp_path / "keys.csv"}"'))
    assert main(["--config", str(keyed)]) == 2
    assert "public keys in `groups.path`" in caplog.text and "are empty" in caplog.text
    assert not ledger_file.exists() or Ledger(ledger_file).records("scores") == []
    assert main(["--config", config]) == 0  # the whole budget is still there


def test_failfast_fails_and_stays_charged(spark, tmp_path, caplog):
    """A FAILFAST parse failure depends on the data: it is reported without the row, and the
    budget stays charged (a refund would answer "is there a malformed row?" for free)."""
    config = toml(tmp_path, small_csv(tmp_path), cap=2.0, epsilon=1.0,
                  extra="")
    assert main(["--config", config, "--set", 'input.csv.mode="FAILFAST"']) == 2
    assert '`input.csv.mode` is "FAILFAST" and the input has a malformed row' in caplog.text
    assert "the budget stays charged" in caplog.text
    assert "extra field" not in caplog.text and "not a number" not in caplog.text
    (rec,) = Ledger(tmp_path / "ledger.sqlite").records("scores")
    assert rec.status == "spent" and "ConfigError; budget stays charged" in rec.note
    assert not (tmp_path / "out").exists()
    # power: the same file under DROPMALFORMED releases, so FAILFAST is what failed
    assert main(["--config", config]) == 0


def test_a_missing_ledger_is_never_created(spark, tmp_path, caplog):
    config = toml(tmp_path, small_csv(tmp_path))
    typo = tmp_path / "ledgr.sqlite"
    assert main(["--config", config, "--set", "ledger.create=false", "--ledger", str(typo)]) == 2
    assert f"ledger {typo}: does not exist" in caplog.text and not typo.exists()
    # an existing ledger without this dataset: a mistyped dataset id is not a fresh budget
    assert main(["--config", config]) == 0
    assert main(["--config", config, "--set", "ledger.create=false", "--dataset-id", "scorez",
                 "--output", str(tmp_path / "o2")]) == 2
    assert "has no budget for dataset 'scorez'" in caplog.text


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_sigterm_before_sampling_cancels_after_sampling_stays_charged(
        spark, tmp_path, monkeypatch, caplog, backend, request):
    url = (f"sqlite://{tmp_path / 'ledger.sqlite'}" if backend == "sqlite"
           else request.getfixturevalue("pg_url"))
    config = toml(tmp_path, small_csv(tmp_path), cap=2.0, epsilon=1.0, ledger=url)
    monkeypatch.setenv(FAULT_ENV, "after_reserve")  # the job sends itself a real SIGTERM
    assert main(["--config", config]) == 143
    monkeypatch.setenv(FAULT_ENV, "after_sample_term")
    assert main(["--config", config]) == 143
    a, b = open_ledger(url).records("scores")
    assert (a.status, a.note) == ("cancelled", "failed before reading the input: JobInterrupted")
    assert b.status == "spent" and "JobInterrupted; budget stays charged" in b.note
    assert "stopped by signal SIGTERM" in caplog.text
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")
    assert open_ledger(url).usage("scores").epsilon_remaining == 1.0
    monkeypatch.delenv(FAULT_ENV)
    assert main(["--config", config]) == 0  # the cancelled epsilon was given back


def test_output_that_appears_during_the_run_is_not_exit_4(spark, tmp_path):
    from dpq_spark.pipeline.config import OutputConfig
    from dpq_spark.pipeline.outputs import OutputConflictError, write_release

    target = tmp_path / "rel"
    target.mkdir()
    df = spark.createDataFrame([(0.5, 1.0)], ["quantile", "value"])
    with pytest.raises(OutputConflictError, match="appeared while the job ran.*stays charged"):
        write_release(df, OutputConfig(path=str(target), format="csv"), {}, record=7)
    assert os.listdir(tmp_path) == ["rel"]  # no temporary directory left beside it


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
create = true
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
create = true
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


def test_a_cap_conflict_is_refused_before_spark_starts(tmp_path, monkeypatch):
    """A configured cap above the ledger's, or a charge past the stored cap of a config that
    gives none, is refused by the pre-check: no Spark session, no record."""
    from dpq_spark.pipeline import job
    from dpq_spark.pipeline.ledger import LedgerError, init_ledger

    url = "sqlite://" + str(tmp_path / "ledger.sqlite")
    init_ledger(url, dataset_id="scores", epsilon_cap=1.0)

    def no_spark(*args, **kwargs):
        raise AssertionError("Spark was started")

    monkeypatch.setattr(job, "get_session", no_spark)
    config = toml(tmp_path, small_csv(tmp_path), cap=5.0, epsilon=0.5)
    cfg = load_config(config, [("ledger", "create", False)])
    with pytest.raises(LedgerError, match=r"configured epsilon_cap=5 .* above the ledger's "
                                          r"epsilon_cap=1"):
        run_job(cfg)
    raw_caps = load_config(config, [("ledger", "create", False), ("release", "epsilon", 2.0)])
    raw_caps = dataclasses.replace(raw_caps, ledger=dataclasses.replace(
        raw_caps.ledger, epsilon_cap=None))
    with pytest.raises(BudgetExceededError, match="asks for epsilon=2 but only epsilon=1"):
        run_job(raw_caps)
    assert Ledger(tmp_path / "ledger.sqlite").records("scores") == []


def test_public_keys_are_typed_never_cast(spark, tmp_path, caplog):
    """Keys that do not fit the group column's type are refused before any reservation (a
    try_cast once released them as a NULL key, charged); integral keys from a text file are
    parsed exactly (no float round trip)."""
    big = 2**53 + 1  # a float would round it to 2**53
    pdf = pd.DataFrame({"g": np.repeat(np.array([300, big, 7], dtype=np.int64), 50),
                        "s": np.repeat(["1", "2", "3"], 50), "v": np.tile(np.arange(50.0), 3)})
    spark.createDataFrame(pdf).write.parquet(str(tmp_path / "data.parquet"))

    def config(name, group_by, groups):
        path = tmp_path / f"{name}.toml"
        path.write_text(f"""
[input]
format = "parquet"
path = "{tmp_path / 'data.parquet'}"
column = "v"
group_by = ["{group_by}"]
[groups]
{groups}
[release]
quantiles = "median"
epsilon = 100.0
lower = 0.0
upper = 50.0
[output]
path = "{tmp_path / ('out_' + name)}"
format = "json"
[ledger]
path = "{tmp_path / 'ledger.sqlite'}"
dataset_id = "typed"
epsilon_cap = 1000.0
create = true
""")
        return str(path)

    assert main(["--config", config("words", "g", 'keys = ["abc", "300", "xyz"]')]) == 2
    assert "`groups" in caplog.text and "'g' is bigint and needs int, got str" in caplog.text
    assert main(["--config", config("ints", "s", "keys = [1, 2]")]) == 2
    assert "'s' is string and needs str, got int" in caplog.text
    (tmp_path / "bad.csv").write_text("g\n300\n3e2\n")
    assert main(["--config", config("badfile", "g", f'path = "{tmp_path / "bad.csv"}"')]) == 2
    assert "key '3e2'" in caplog.text and "needs an integer" in caplog.text
    spark.createDataFrame([(300,)], "g int").write.parquet(str(tmp_path / "keys32.parquet"))
    assert main(["--config", config("narrow", "g", f'path = "{tmp_path / "keys32.parquet"}"\n'
                                                   'format = "parquet"')]) == 2
    assert "column 'g' of type int, but the input's 'g' is bigint; keys are never cast" in \
        caplog.text
    assert not os.path.exists(tmp_path / "ledger.sqlite") or \
        Ledger(tmp_path / "ledger.sqlite").records("typed") == []  # nothing reserved

    (tmp_path / "keys.csv").write_text(f"g\n300\n{big}\n")
    assert main(["--config", config("file", "g", f'path = "{tmp_path / "keys.csv"}"')]) == 0
    released = spark.read.json(str(tmp_path / "out_file")).toPandas()
    assert sorted(released["g"].tolist()) == [300, big]


def test_a_csv_header_is_never_echoed(spark, tmp_path, caplog):
    """A file without its header line gives Spark a data row as column names: the column checks
    must not print them (nothing is reserved either). `comment`, which made the header line a
    data row, is refused. A repeated name is reported by position."""
    data = tmp_path / "people.csv"
    data.write_text("name,ssn,salary,grp\nAlice Smith,123-45-6789,99000,a\n"
                    "Bob Jones,987-65-4321,50000,b\n")
    config = toml(tmp_path, str(data), extra="")
    text = open(config).read().replace('"score"', '"salary"')
    open(config, "w").write(text.replace('[input]', '[input]\ncsv = { comment = "n" }'))
    assert main(["--config", config]) == 2
    assert "`input.csv.comment` is not allowed: it skips lines by their content" in caplog.text
    caplog.clear()
    headless = tmp_path / "headless.csv"
    headless.write_text("Alice Smith,123-45-6789,99000,a\nBob Jones,987-65-4321,50000,b\n")
    open(config, "w").write(text.replace(str(data), str(headless)))
    assert main(["--config", config]) == 2
    assert "`input.schema` names column 'salary', which is not in the CSV header" in caplog.text
    for field in ("Alice", "123-45-6789", "99000"):
        assert field not in caplog.text
    assert not (tmp_path / "ledger.sqlite").exists() or \
        Ledger(tmp_path / "ledger.sqlite").records("scores") == []
    caplog.clear()
    twice = tmp_path / "twice.csv"
    twice.write_text("Carol Diaz,x, Carol Diaz,grp\n1,2,3,a\n")  # a data row read as the header
    open(config, "w").write(text.replace(str(data), str(twice)))
    assert main(["--config", config]) == 2
    assert "repeats a column name (columns 1 and 3" in caplog.text and "Carol" not in caplog.text


def test_a_named_run_released_before_is_returned_and_charges_nothing(spark, tmp_path, capsys):
    """`--run-id` names the run's release: an orchestrator's retry of the same run returns the
    committed release (same output, one charge); the same run id with other parameters is
    refused before anything is reserved."""
    config = toml(tmp_path, small_csv(tmp_path), cap=3e5)
    assert main(["--config", config, "--run-id", "2026-11-30"]) == 0
    first = capsys.readouterr().out.splitlines()
    assert main(["--config", config, "--run-id", "2026-11-30"]) == 0  # the retry
    again = capsys.readouterr().out.splitlines()
    assert again[0] == first[0]  # "Release written to <the same output>"
    assert again[1].startswith("Nothing spent: run '2026-11-30' was released before")
    records = Ledger(tmp_path / "ledger.sqlite").records("scores")
    assert [(r.status, r.name) for r in records] == [("committed", "dp_quantiles 2026-11-30")]
    assert main(["--config", config, "--run-id", "2026-11-30", "--epsilon", "5e4"]) == 2
    assert main(["--config", config, "--run-id", "2026-12-01", "--output",
                 str(tmp_path / "out" / "next")]) == 0  # the next day: charged anew
    assert [r.name for r in Ledger(tmp_path / "ledger.sqlite").records("scores")] == \
        ["dp_quantiles 2026-11-30", "dp_quantiles 2026-12-01"]
