"""Job configuration: loading, overrides, shorthands, and one test per validation error."""

from __future__ import annotations

import copy
import datetime as dt
import glob
import os

import pytest

from dpq_spark.pipeline.config import (
    QUANTILE_SHORTHANDS,
    ConfigError,
    load_config,
    parse_config,
    parse_override,
    quantiles_from_text,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "data", "goodreads_books.csv")


def valid() -> dict:
    return {
        "job": {"name": "t"},
        "input": {"format": "csv", "path": DATA, "column": "average_rating",
                  "group_by": ["language_code"], "schema": {"average_rating": "double"},
                  "csv": {"mode": "DROPMALFORMED"}},
        "groups": {"keys": ["eng", "spa"]},
        "release": {"quantiles": "deciles", "epsilon": 1.0, "lower": 0.0, "upper": 5.0},
        "output": {"path": "/tmp/dpq-test-out", "format": "csv", "mode": "error"},
        "ledger": {"path": "/tmp/dpq-test-ledger.sqlite", "dataset_id": "books",
                   "epsilon_cap": 10.0},
    }


def with_(change) -> dict:
    raw = copy.deepcopy(valid())
    change(raw)
    return raw


def test_valid_config_parses():
    cfg = parse_config(valid())
    assert cfg.input.group_by == ("language_code",)
    assert cfg.groups.keys == (("eng",), ("spa",))
    assert cfg.release.quantiles == QUANTILE_SHORTHANDS["deciles"]
    assert cfg.output.mode == "error" and cfg.ledger.delta_cap is None  # the ledger's


def test_bounds_and_mechanism_are_optional():
    """No bounds: private bounds (bounds_share, default None = the core's 0.2); mechanism "auto"."""
    def drop(r):
        r["release"].pop("lower")
        r["release"].pop("upper")
        r["release"]["bounds_share"] = 0.25
    cfg = parse_config(with_(drop))
    r = cfg.release
    assert (r.lower, r.upper, r.resolution, r.bounds_share, r.mechanism) == (None, None, None, 0.25, "auto")
    assert cfg.public_parameters()["bounds_share"] == 0.25
    bounded = parse_config(valid()).release
    assert (bounded.lower, bounded.upper, bounded.bounds_share, bounded.mechanism) == (0.0, 5.0, None, "auto")


@pytest.mark.parametrize("name,m", [("deciles", 9), ("percentiles", 99), ("quartiles", 3),
                                    ("median", 1)])
def test_quantile_shorthands(name, m):
    q = parse_config(with_(lambda r: r["release"].update(quantiles=name))).release.quantiles
    assert len(q) == m and q[m // 2] == 0.5 and all(0 < a < b < 1 for a, b in zip(q, q[1:]))


def test_every_example_config_is_valid():
    files = sorted(glob.glob(os.path.join(ROOT, "conf", "*.toml")))
    assert len(files) >= 3
    cwd = os.getcwd()
    os.chdir(ROOT)  # example paths are relative to the repository root
    try:
        for f in files:
            load_config(f)
    finally:
        os.chdir(cwd)


def test_load_and_override(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    conf.mkdir()
    path = conf / "job.toml"
    path.write_text(
        '[input]\nformat="csv"\npath="%s"\ncolumn="average_rating"\n'
        'schema={average_rating="double"}\n'
        '[release]\nquantiles=[0.5]\nepsilon=1.0\nlower=0\nupper=5\n'
        '[output]\npath="../out/{timestamp}"\n'
        '[ledger]\npath="l.sqlite"\ndataset_id="d"\nepsilon_cap=2\n' % DATA)
    monkeypatch.chdir(ROOT)  # somewhere else: file paths follow the file, not the cwd
    now = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.timezone.utc)
    cfg = load_config(str(path), [parse_override("release.epsilon=0.25"),
                                  parse_override("release.quantiles=\"quartiles\""),
                                  ("output", "mode", "overwrite")], now=now)
    assert cfg.release.epsilon == 0.25 and len(cfg.release.quantiles) == 3
    head, stamp = os.path.split(cfg.output.path)
    assert head == str(tmp_path / "out") and stamp.startswith("20260102T030405.678901Z-")
    assert cfg.output.mode == "overwrite"
    assert cfg.ledger.url == f"sqlite://{conf / 'l.sqlite'}" and cfg.ledger.create is False
    # flags are relative to the working directory, and --ledger replaces the file's ledger
    cfg = load_config(str(path), [("ledger", "url", "other.sqlite")], now=now)
    assert cfg.ledger.url == f"sqlite://{os.path.join(ROOT, 'other.sqlite')}"
    cfg = load_config(str(path), [("ledger", "url", "postgresql://dpq@db:5432/p")])
    assert cfg.ledger.url == "postgresql://dpq@db:5432/p"


def test_timestamped_outputs_never_collide():
    now = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    raw = with_(lambda r: r["output"].update(path="/tmp/o/{timestamp}"))
    paths = {parse_config(raw, now=now).output.path for _ in range(50)}
    assert len(paths) == 50  # the same microsecond still gives distinct paths


def test_override_values_are_toml_or_strings():
    assert parse_override("release.epsilon=0.5") == ("release", "epsilon", 0.5)
    assert parse_override("groups.keys=[\"a\", \"b\"]") == ("groups", "keys", ["a", "b"])
    assert parse_override("input.column=num_pages") == ("input", "column", "num_pages")
    assert quantiles_from_text("0.1, 0.5,0.9") == [0.1, 0.5, 0.9]
    assert quantiles_from_text("Deciles") == "deciles"


# --- one test per error --------------------------------------------------------------------------


def test_error_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "nope.toml"))


def test_error_invalid_toml(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("[input\ncolumn = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(str(p))


def test_error_bad_override_syntax():
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override("epsilon=1")


def test_error_bad_quantiles_flag():
    with pytest.raises(ConfigError, match="--quantiles"):
        quantiles_from_text("0.1,x")


CASES = [
    ("spark section", lambda r: r.update(spark={"master": "local"}), r"\[spark\] section is not allowed"),
    ("unknown section", lambda r: r.update(extra={}), r"unknown section \[extra\]"),
    ("unknown key", lambda r: r["release"].update(epsilom=1), r"unknown key `release.epsilom`"),
    ("section not a table", lambda r: r.update(job=3), r"`job` must be a table"),
    ("missing section", lambda r: r.pop("ledger"), r"section \[ledger\] is required"),
    ("missing format", lambda r: r["input"].pop("format"), r"`input.format` is required"),
    ("bad format", lambda r: r["input"].update(format="xls"), r"`input.format` must be one of"),
    ("missing column", lambda r: r["input"].pop("column"), r"`input.column` is required"),
    ("column is group", lambda r: r["input"].update(column="language_code"), r"must not also be a group column"),
    ("bad group_by", lambda r: r["input"].update(group_by=[1]), r"`input.group_by` must be a column name"),
    ("repeated group_by", lambda r: r["input"].update(group_by=["a", "a"]), r"must not repeat a column"),
    ("missing path", lambda r: r["input"].pop("path"), r"`input.path` is required"),
    ("path not found", lambda r: r["input"].update(path="/nonexistent/x.csv"), r"`input.path` .* does not exist"),
    ("table with path", lambda r: r["input"].update(format="table", table="db.t"), r"`input.path` must not be set"),
    ("path with table", lambda r: r["input"].update(table="db.t"), r"`input.table` must not be set"),
    ("csv options on parquet", lambda r: (r["input"].pop("schema"), r["input"].update(format="parquet")), r"only for `input.format` 'csv'"),
    ("bad csv mode", lambda r: r["input"]["csv"].update(mode="LENIENT"), r"`input.csv.mode` must be one of"),
    ("csv schema given", lambda r: r["input"]["csv"].update(schema="a int"), r"`input.csv.schema` is not allowed: declare the types in `input.schema`"),
    ("group_by without keys", lambda r: r.pop("groups"), r"needs public keys in \[groups\]"),
    ("groups without group_by", lambda r: r["input"].update(group_by=[]), r"`input.group_by` is empty"),
    ("two key sources", lambda r: r["groups"].update(table="k"), r"exactly one of"),
    ("empty keys", lambda r: r["groups"].update(keys=[]), r"`groups.keys` must be a non-empty list"),
    ("key arity", lambda r: r["groups"].update(keys=[["eng", 1]]), r"must have 1 value"),
    ("key type", lambda r: r["groups"].update(keys=[True]), r"must be strings or numbers"),
    ("repeated key", lambda r: r["groups"].update(keys=["eng", "eng"]), r"must not repeat a key"),
    ("keys file missing", lambda r: r.update(groups={"path": "/nonexistent/k.csv"}), r"`groups.path` .* does not exist"),
    ("format without path", lambda r: r.update(groups={"table": "k", "format": "csv"}), r"`groups.format` is only for"),
    ("missing quantiles", lambda r: r["release"].pop("quantiles"), r"`release.quantiles` is required"),
    ("bad shorthand", lambda r: r["release"].update(quantiles="tertiles"), r"one of 'median'"),
    ("quantiles not numbers", lambda r: r["release"].update(quantiles=["a"]), r"list of numbers"),
    ("quantiles out of range", lambda r: r["release"].update(quantiles=[0.5, 1.0]), r"open interval \(0, 1\)"),
    ("quantiles unsorted", lambda r: r["release"].update(quantiles=[0.6, 0.4]), r"strictly increasing"),
    ("missing epsilon", lambda r: r["release"].pop("epsilon"), r"`release.epsilon` is required"),
    ("bad epsilon", lambda r: r["release"].update(epsilon=-1.0), r"`release.epsilon` must be finite and > 0, got -1.0"),
    ("epsilon type", lambda r: r["release"].update(epsilon="1"), r"`release.epsilon` must be a real number"),
    ("bad delta", lambda r: r["release"].update(delta=2.0), r"`release.delta` must be in \(0, 1\)"),
    ("one bound", lambda r: r["release"].pop("upper"), r"`release.lower` and `release.upper` must both be given"),
    ("bounds_share with bounds", lambda r: r["release"].update(bounds_share=0.2), r"`release.bounds_share` applies only without"),
    ("bounds_share out of range", lambda r: (r["release"].pop("lower"), r["release"].pop("upper"), r["release"].update(bounds_share=1.0)), r"`release.bounds_share` must be in \(0, 1\)"),
    ("resolution without bounds", lambda r: (r["release"].pop("lower"), r["release"].pop("upper"), r["release"].update(resolution=1024)), r"`release.resolution` applies only with"),
    ("bad bounds", lambda r: r["release"].update(lower=5.0, upper=0.0), r"`release.lower` must be < `release.upper`"),
    ("infinite bound", lambda r: r["release"].update(upper=float("inf")), r"`release.upper` must be finite"),
    ("bad neighboring", lambda r: r["release"].update(neighboring="replace"), r"`release.neighboring` must be one of"),
    ("bad max rows", lambda r: r["release"].update(privacy_unit="u", max_rows_per_unit=0), r"`release.max_rows_per_unit` must be >= 1"),
    ("unit is group column", lambda r: r["release"].update(privacy_unit="language_code"), r"`release.privacy_unit` .* must not be"),
    ("bounds without unit", lambda r: r["release"].update(max_groups_per_unit=2), r"need `release.privacy_unit`"),
    ("bad resolution", lambda r: r["release"].update(resolution=1), r"`release.resolution` must be >= 2"),
    ("resolution too fine", lambda r: r["release"].update(resolution=2**31), r"`release.resolution` must be <= 2\*\*30"),
    ("groups cap without group_by", lambda r: (r["input"].update(group_by=[]), r.pop("groups"), r["release"].update(privacy_unit="u", max_groups_per_unit=2)), r"`release.max_groups_per_unit` applies only with `input.group_by`"),
    ("swap with groups", lambda r: r["release"].update(neighboring="swap"), r"supported only without `input.group_by`"),
    ("delta with public keys", lambda r: (r["release"].update(delta=1e-6), r["ledger"].update(delta_cap=1e-5)), r"`release.delta` is only for DP partition selection"),
    ("bad mechanism", lambda r: r["release"].update(mechanism="laplace"), r"`release.mechanism` must be one of"),
    ("missing output path", lambda r: r["output"].pop("path"), r"needs `output.path` \(a directory\), `output.table`"),
    ("bad placeholder", lambda r: r["output"].update(path="out/{date}"), r"placeholder \{timestamp\}"),
    ("bad output format", lambda r: r["output"].update(format="xlsx"), r"`output.format` must be one of"),
    ("append mode", lambda r: r["output"].update(mode="append"), r"`output.mode` must be one of"),
    ("remote ledger path", lambda r: r["ledger"].update(path="s3a://b/l.sqlite"), r"`ledger.path` must be a local SQLite file"),
    ("url and path", lambda r: r["ledger"].update(url="sqlite:///x"), r"exactly one of `ledger.url` and `ledger.path`"),
    ("no ledger location", lambda r: r["ledger"].pop("path"), r"exactly one of `ledger.url` and `ledger.path`"),
    ("password in url", lambda r: (r["ledger"].pop("path"), r["ledger"].update(url="postgresql://u:hunter2@db/x")), r"must not contain a password \('postgresql://u:\*\*\*@db/x'\)"),
    ("password parameter", lambda r: (r["ledger"].pop("path"), r["ledger"].update(url="postgresql://u@db/x?password=hunter2")), r"must not contain a password"),
    ("bad scheme", lambda r: (r["ledger"].pop("path"), r["ledger"].update(url="mysql://db/x")), r"`ledger.url` must be sqlite:///PATH or postgresql://"),
    ("relative sqlite url", lambda r: (r["ledger"].pop("path"), r["ledger"].update(url="sqlite://rel.db")), r"sqlite:///ABSOLUTE/PATH"),
    ("create not bool", lambda r: r["ledger"].update(create="yes"), r"`ledger.create` must be true or false"),
    ("password file for sqlite", lambda r: r["ledger"].update(password_file="/etc/hostname"), r"`ledger.password_file` is only for a PostgreSQL"),
    ("password file missing", lambda r: (r["ledger"].pop("path"), r["ledger"].update(url="postgresql://u@db/x", password_file="/nonexistent/pw")), r"`ledger.password_file` .* does not exist"),
    ("missing dataset id", lambda r: r["ledger"].pop("dataset_id"), r"`ledger.dataset_id` is required"),
    ("creating without a cap", lambda r: (r["ledger"].pop("epsilon_cap"), r["ledger"].update(create=True)), r"`ledger.create = true` needs `ledger.epsilon_cap`"),
    ("bad cap", lambda r: r["ledger"].update(epsilon_cap=0), r"`ledger.epsilon_cap` must be finite and > 0"),
    ("bad delta cap", lambda r: r["ledger"].update(delta_cap=1.5), r"`ledger.delta_cap` must be in \[0, 1\)"),
    ("delta with a zero delta cap", lambda r: (r.pop("groups"), r["release"].update(delta=1e-6), r["ledger"].update(delta_cap=0.0)), r"`ledger.delta_cap` is 0: give the dataset a delta cap"),
    ("spark properties missing", lambda r: r["job"].update(spark_properties="/nonexistent.conf"), r"`job.spark_properties` .* does not exist"),
    ("empty name", lambda r: r["job"].update(name=""), r"`job.name` must be a non-empty string"),
]


@pytest.mark.parametrize("change,match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_config_error(change, match):
    with pytest.raises(ConfigError, match=match):
        parse_config(with_(change))


def test_partition_selection_needs_no_keys():
    raw = with_(lambda r: (r.pop("groups"), r["release"].update(delta=1e-6),
                           r["ledger"].update(delta_cap=1e-5)))
    cfg = parse_config(raw)
    assert cfg.groups is None and cfg.release.delta == 1e-6


def test_the_caps_come_from_the_ledger_unless_the_config_lowers_them():
    """A config need not repeat the dataset's caps: without them the ledger's stored ones apply."""
    raw = valid()
    raw["ledger"].pop("epsilon_cap")
    raw["ledger"].pop("delta_cap", None)
    cfg = parse_config(raw)
    assert (cfg.ledger.epsilon_cap, cfg.ledger.delta_cap) == (None, None)
    raw["ledger"].update(epsilon_cap=2.0)
    assert parse_config(raw).ledger.epsilon_cap == 2.0
