"""The job's input path cannot ask the data questions: declared CSV types, an allow-list of
reader options, a charge that stays once a private row was read, ``--set`` into nested
tables, and Spark's own log without private rows (one job in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dpq_spark.pipeline import launch
from dpq_spark.pipeline.config import ConfigError, load_config, parse_config, parse_override
from dpq_spark.pipeline.inputs import read_input
from dpq_spark.pipeline.job import main, run_job
from dpq_spark.pipeline.ledger import open_ledger
from jobconfig import write_job_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOODREADS = os.path.join(ROOT, "data", "goodreads_books.csv")
JOB = os.path.join(ROOT, "jobs", "dp_quantiles.py")


def raw_config(**input_keys) -> dict:
    return {
        "input": {"format": "csv", "path": GOODREADS, "column": "average_rating",
                  "group_by": ["language_code"], **input_keys},
        "groups": {"keys": ["eng"]},
        "release": {"quantiles": "median", "epsilon": 1.0, "lower": 0.0, "upper": 5.0},
        "output": {"path": "/tmp/dpq-safety-out"},
        "ledger": {"path": "/tmp/dpq-safety-ledger.sqlite", "dataset_id": "g",
                   "epsilon_cap": 1.0},
    }


# --- 1. a CSV value column must be declared numeric: decided from the configuration ----------


def test_the_value_column_of_a_csv_must_be_declared_numeric():
    with pytest.raises(ConfigError, match=r"`input.schema` must declare the type of "
                                          r"`input.column` 'average_rating'"):
        parse_config(raw_config())
    with pytest.raises(ConfigError, match=r"declares `input.column` 'title' as string; the "
                                          r"release needs a number type"):
        parse_config(raw_config(column="title", schema={"title": "string"}))
    with pytest.raises(ConfigError, match=r"must declare the type of `input.column` 'title'"):
        parse_config(raw_config(column="title", schema={"average_rating": "double"}))
    cfg = parse_config(raw_config(schema={"average_rating": "DECIMAL(3, 2)"}))
    assert (cfg.input.schema, cfg.input.schema_complete) == \
        ((("average_rating", "decimal(3,2)"),), False)


def test_a_ddl_schema_lists_every_column_in_order():
    cfg = parse_config(raw_config(schema="`bookID` BIGINT, average_rating double, "
                                         "language_code STRING, price decimal(10,2)"))
    assert cfg.input.schema_complete
    assert cfg.input.schema == (("bookID", "bigint"), ("average_rating", "double"),
                                ("language_code", "string"), ("price", "decimal(10,2)"))
    for schema, match in [
        ("average_rating double, language_code", r"`input.schema` must be a DDL string"),
        ("average_rating double", r"`input.group_by` names column 'language_code', which is "
                                  r"not in `input.schema`"),
        ("average_rating vector, language_code string", r"must be one of tinyint"),
        ("average_rating double, average_rating int", r"must not repeat a column"),
        ({"average_rating": 1.5}, r"must be a type name"),
        ({}, r"must be a DDL string .* or a table of types"),
        ("average_rating decimal(40,2), language_code string", r"precision must be in 1..38"),
    ]:
        with pytest.raises(ConfigError, match=match):
            parse_config(raw_config(schema=schema))
    with pytest.raises(ConfigError, match=r"`input.csv.header = false` needs `input.schema` "
                                          r"as a DDL string"):
        parse_config(raw_config(schema={"average_rating": "double"}, csv={"header": False}))
    assert parse_config(raw_config(schema="average_rating double, language_code string",
                                   csv={"header": False})).input.csv_options == {"header": False}
    parquet = raw_config(schema={"average_rating": "double"})
    parquet["input"].update(format="parquet")
    with pytest.raises(ConfigError, match=r"`input.schema` is only for `input.format` 'csv'"):
        parse_config(parquet)


def test_a_text_column_is_refused_before_the_ledger_is_touched(tmp_path, caplog):
    """`--column title` on the Goodreads demo: refused by the configuration alone, before the
    ledger is opened and before Spark starts (the ledger file is never created)."""
    ledger = tmp_path / "ledger.sqlite"
    args = ["--config", os.path.join(ROOT, "conf", "goodreads.toml"), "--ledger", str(ledger),
            "--output", str(tmp_path / "out")]
    assert main(args + ["--column", "title"]) == 2
    assert "must declare the type of `input.column` 'title'" in caplog.text
    assert main(args + ["--column", "title", "--set", 'input.schema.title="string"']) == 2
    assert "declares `input.column` 'title' as string" in caplog.text
    assert not ledger.exists() and not (tmp_path / "out").exists()


def test_declared_types_are_applied_and_a_ddl_schema_ignores_the_header(spark, tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("Alice Smith,ssn,score,grp\n1,x,1.5,a\n2,y,2.25,b\n3,z,oops,a\n"
                    "4,w,9.75,b,extra\n")
    cfg = parse_config(raw_config(
        path=str(data), column="v", group_by=["g"],
        schema="id BIGINT, s STRING, v DECIMAL(4,2), g STRING", csv={"mode": "DROPMALFORMED"}))
    df = read_input(spark, cfg.input)
    assert df.columns == ["g", "v"] and df.schema["v"].dataType.simpleString() == "decimal(4,2)"
    rows = sorted((r.g, r.v) for r in df.collect())
    assert rows == [("a", 1.5), ("b", 2.25)]  # "oops" and the row with 5 fields are malformed
    # a table of types: the header names the columns, undeclared ones are strings
    data.write_text("id,v,g\n1,1.5,7\n2,x,8\n")
    cfg = parse_config(raw_config(path=str(data), column="v", group_by=["g"],
                                  schema={"v": "float", "g": "int"}))
    df = read_input(spark, cfg.input)
    assert [f.dataType.simpleString() for f in df.schema.fields] == ["int", "double"]
    assert [(r.g, r.v) for r in df.collect()] == [(7, 1.5)]


# --- 3. reader options: an allow-list; a row read keeps the charge ---------------------------


@pytest.mark.parametrize("key,value,match", [
    ("comment", "#", r"`input.csv.comment` is not allowed: it skips lines by their content"),
    ("maxCharsPerColumn", 10, r"`input.csv.maxCharsPerColumn` is not allowed: it fails a row "
                              r"by the length of a field"),
    ("maxColumns", 3, r"`input.csv.maxColumns` is not allowed"),
    ("inferSchema", True, r"`input.csv.inferSchema` is not allowed: types come from "
                          r"`input.schema`"),
    ("multiLine", True, r"`input.csv.multiLine` is not allowed: a record must be one line"),
    ("columnNameOfCorruptRecord", "_bad", r"it would copy raw rows into a column"),
    ("Comment", "#", r"unknown key `input.csv.Comment`; the CSV options are mode, header, sep"),
    ("unescapedQuoteHandling", "RAISE_ERROR", r"unknown key `input.csv.unescapedQuoteHandling`"),
    ("quote", "BB", r"`input.csv.quote` must be one character"),
    ("header", "yes", r"`input.csv.header` must be true or false, got 'yes'"),
    ("sep", "", r"`input.csv.sep` must be a non-empty string"),
])
def test_csv_options_are_an_allow_list(key, value, match):
    with pytest.raises(ConfigError, match=match):
        parse_config(raw_config(schema={"average_rating": "double"}, csv={key: value}))


def test_allowed_csv_options_pass_through():
    options = {"header": True, "sep": ";", "quote": "'", "escape": "\\", "nullValue": "NA",
               "encoding": "ISO-8859-1", "ignoreLeadingWhiteSpace": True}
    cfg = parse_config(raw_config(schema={"average_rating": "double"},
                                  csv={**options, "mode": "failfast"}))
    assert cfg.input.csv_options == options and cfg.input.csv_mode == "FAILFAST"


def test_set_reaches_nested_input_tables(tmp_path):
    """`--set input.csv.mode=...` changes one key of [input.csv] and keeps the others; the same
    for `input.schema.<column>`."""
    assert parse_override("input.csv.mode=FAILFAST") == ("input", "csv.mode", "FAILFAST")
    config = write_job_config(
        tmp_path / "job.toml", data=GOODREADS, column="average_rating", output=tmp_path / "o",
        ledger_url=f"sqlite://{tmp_path / 'l.sqlite'}", dataset_id="g", epsilon=1.0,
        bounds="lower = 0.0\nupper = 5.0", extra='[input.csv]\nsep = ","\nmode = "PERMISSIVE"\n')
    cfg = load_config(config, [parse_override("input.csv.mode=FAILFAST"),
                               parse_override('input.schema.num_pages="int"')])
    assert cfg.input.csv_mode == "FAILFAST" and cfg.input.csv_options == {"sep": ","}
    assert dict(cfg.input.schema) == {"average_rating": "double", "num_pages": "int"}
    cfg = load_config(config, [parse_override("input.csv.quote='\"'")])
    assert cfg.input.csv_options == {"sep": ",", "quote": '"'}
    assert cfg.input.csv_mode == "PERMISSIVE"
    with pytest.raises(ConfigError, match=r"`input.column` must be a table to override"):
        load_config(config, [parse_override("input.column.x=1")])
    with pytest.raises(ConfigError, match=r"unknown key `input.csv.comments`"):
        load_config(config, [parse_override('input.csv.comments="#"')])


def test_the_quote_oracle_is_paid(spark, tmp_path, caplog):
    """`quote = "B"` under FAILFAST fails exactly when a field starts with "B". Two files that
    differ in one field's first character, the same configuration: both runs are charged the
    same epsilon (the failing one is `spent`, not `cancelled`), so the question costs budget.
    The release metadata records whether the random source was cryptographic."""
    usage = {}
    for name, first in (("bob", "B"), ("rob", "R")):
        data = tmp_path / f"{name}.csv"
        rows = [f"p{i},{i % 10}.5,{'ab'[i % 2]}" for i in range(40)]
        rows[7] = f"{first}ob,3.5,b"
        data.write_text("name,score,grp\n" + "\n".join(rows) + "\n")
        config = write_job_config(
            tmp_path / f"{name}.toml", data=data, column="score", group_by=["grp"],
            keys=["a", "b"], epsilon=1.0, output=tmp_path / f"out_{name}",
            ledger_url=f"sqlite://{tmp_path / (name + '.sqlite')}", dataset_id="people",
            cap=3.0, create=True, extra='[input.csv]\nquote = "B"\nmode = "FAILFAST"\n')
        code = main(["--config", config])
        ledger = open_ledger(f"sqlite://{tmp_path / (name + '.sqlite')}")
        (rec,) = ledger.records("people")
        usage[name] = (code, rec.status, rec.epsilon, ledger.usage("people").epsilon_spent)
    assert usage["bob"] == (2, "spent", 1.0, 1.0)       # the oracle's "yes": failed, charged
    assert usage["rob"] == (0, "committed", 1.0, 1.0)   # its "no": released, charged the same
    assert "Bob" not in caplog.text
    meta = json.load(open(tmp_path / "out_rob" / "_release.json"))
    assert meta["cryptographic"] is True                 # main(): the OS generator
    cfg = load_config(str(tmp_path / "rob.toml"), [("output", "path", str(tmp_path / "seeded"))])
    run_job(cfg, rng=np.random.default_rng(7))
    assert json.load(open(tmp_path / "seeded" / "_release.json"))["cryptographic"] is False


# --- 2. Spark's own log: no private row ------------------------------------------------------


def test_the_jvm_the_job_starts_gets_the_log4j2_configuration(tmp_path, monkeypatch):
    monkeypatch.delenv("MASTER", raising=False)
    option = "-Dlog4j2.configurationFile=file://" + os.path.join(ROOT, "conf",
                                                                   "log4j2.properties")
    args = launch._submit_args(os.path.join(ROOT, "conf", "spark-local.conf"))
    assert args[:2] == ["--master", "local[*]"] and args[-1] == "pyspark-shell"
    assert args[args.index("--conf") + 1] == "spark.driver.extraJavaOptions=" + option
    props = tmp_path / "spark.conf"
    props.write_text("spark.master local[2]\nspark.driver.extraJavaOptions = -Xss4m\n")
    args = launch._submit_args(str(props))
    assert "--master" not in args
    assert args[args.index("--conf") + 1] == f"spark.driver.extraJavaOptions=-Xss4m {option}"
    props.write_text("spark.driver.extraJavaOptions -Dlog4j2.configurationFile=file:/mine\n")
    assert "--conf" not in launch._submit_args(str(props))  # the operator's own file stays
    monkeypatch.setattr(launch, "LOG4J2_PROPERTIES", str(tmp_path / "missing.properties"))
    with pytest.raises(ConfigError, match=r"log configuration .* is missing"):
        launch._submit_args(None)


@pytest.mark.slow
def test_spark_logs_never_print_a_malformed_private_row(tmp_path):
    """A FAILFAST job in its own process (it starts its JVM) on a CSV whose malformed row holds
    a unique marker, with Spark's log at INFO: the marker is in none of stdout, stderr and the
    files the run wrote (logs, ledger, output). Without conf/log4j2.properties Spark's
    executor, task-set and CSV-reader lines print the row in full."""
    marker = "ZQXV-private-7731"
    rows = [f"p{i},{i % 10}.5,{'ab'[i % 2]}" for i in range(60)]
    rows[31] = f"{marker} Jones,4.5,a,{marker}"   # one field too many: malformed
    data = tmp_path / "input" / "people.csv"
    data.parent.mkdir()
    data.write_text("name,score,grp\n" + "\n".join(rows) + "\n")
    props = tmp_path / "spark.conf"
    props.write_text("spark.log.level INFO\nspark.ui.enabled false\n"
                     "spark.ui.showConsoleProgress false\nspark.driver.memory 1g\n"
                     f"spark.local.dir {tmp_path / 'spark-local'}\n")
    config = write_job_config(
        tmp_path / "job.toml", data=data, column="score", group_by=["grp"], keys=["a", "b"],
        epsilon=1.0, output=tmp_path / "out", ledger_url=f"sqlite://{tmp_path / 'l.sqlite'}",
        dataset_id="people", cap=2.0, create=True,
        extra=f'[job]\nspark_properties = "{props}"\n[input.csv]\nmode = "FAILFAST"\n')
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    for key in ("PYSPARK_SUBMIT_ARGS", "SPARK_REMOTE", "MASTER"):
        env.pop(key, None)
    result = subprocess.run([sys.executable, JOB, "--config", config], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stderr[-3000:]
    assert '`input.csv.mode` is "FAILFAST"' in result.stderr
    assert "ERROR Executor: Exception in task" in result.stderr  # Spark did log the failure
    assert marker not in result.stdout and marker not in result.stderr
    written = [os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files
               if os.path.join(d, f) != str(data)]
    assert written  # at least the ledger
    for path in written:
        with open(path, "rb") as fh:
            assert marker.encode() not in fh.read(), path
    (rec,) = open_ledger(f"sqlite://{tmp_path / 'l.sqlite'}").records("people")
    assert rec.status == "spent"
