"""The job's ``release.granularity``: parsed and validated with the config (before any job or
ledger step), and passed to ``dp_quantiles`` as its ``granularity``."""

from __future__ import annotations

import copy
import os

import numpy as np
import pandas as pd
import pytest

from dpq_spark.pipeline.config import ConfigError, parse_config
from dpq_spark.pipeline.job import main
from jobconfig import write_job_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "data", "goodreads_books.csv")


def _raw(**release) -> dict:
    raw = {
        "job": {"name": "t"},
        "input": {"format": "csv", "path": DATA, "column": "average_rating",
                  "schema": {"average_rating": "double"}},
        "release": {"quantiles": "deciles", "epsilon": 1.0, "lower": 0.0, "upper": 5.0},
        "output": {"path": "/tmp/dpq-test-out", "format": "csv", "mode": "error"},
        "ledger": {"path": "/tmp/dpq-test-ledger.sqlite", "dataset_id": "books",
                   "epsilon_cap": 10.0},
    }
    raw = copy.deepcopy(raw)
    raw["release"].update(release)
    for key in [k for k, v in release.items() if v is None]:
        raw["release"].pop(key)
    return raw


def test_granularity_is_optional_and_recorded():
    cfg = parse_config(_raw())
    assert cfg.release.granularity is None  # the column type's grid
    cfg = parse_config(_raw(granularity=0.01))
    assert cfg.release.granularity == 0.01
    assert cfg.public_parameters()["granularity"] == 0.01
    free = parse_config(_raw(lower=None, upper=None, granularity=1))  # without bounds too
    assert free.release.granularity == 1.0


@pytest.mark.parametrize("value, words", [
    (0, "`release.granularity` must be finite and > 0"),
    (-0.5, "`release.granularity` must be finite and > 0"),
    ("0.01", "`release.granularity` must be a real number"),
    (True, "`release.granularity` must be a real number"),
    (1e-9, "at most 2**32 steps"),
    (1e-16, "`release.granularity` must give at most 2**52 steps"),
])
def test_bad_granularity_is_a_config_error(value, words):
    with pytest.raises(ConfigError, match=words.replace("*", r"\*")):
        parse_config(_raw(granularity=value))


def _ages_csv(tmp_path) -> str:
    ages = np.clip(np.round(np.random.default_rng(0).normal(40, 15, 3000)), 0, 100).astype(int)
    path = tmp_path / "ages.csv"
    pd.DataFrame({"age": ages, "grp": np.where(np.arange(ages.size) % 2, "a", "b")}).to_csv(
        path, index=False)
    return str(path)


@pytest.mark.parametrize("column_type, granularity, step", [
    ("int", None, 1.0),          # the integers' grid, from the schema
    ("double", None, None),      # no declared grid: the default one
    ("double", 5, 5.0),          # release.granularity overrides
])
def test_job_releases_on_the_declared_grid(spark, tmp_path, column_type, granularity, step):
    extra = "" if granularity is None else f"granularity = {granularity}\n"
    config = write_job_config(
        tmp_path / "job.toml", data=_ages_csv(tmp_path), column="age", group_by=["grp"],
        keys=["a", "b"], quantiles="[0.1, 0.25, 0.5, 0.75, 0.9]", epsilon=1.0,
        bounds="lower = 0.0\nupper = 100.0\n" + extra, output=tmp_path / "out",
        ledger_url="sqlite://" + str(tmp_path / "ledger.sqlite"), dataset_id="ages", cap=10.0,
        create=True, column_type=column_type)
    assert main(["--config", config]) == 0
    files = [f for f in os.listdir(tmp_path / "out") if f.endswith(".csv")]
    values = pd.read_csv(tmp_path / "out" / files[0])["value"].to_numpy()
    if step is None:  # the default grid of 2**32 steps: off the integers
        assert not np.array_equal(values, np.round(values))
    else:
        np.testing.assert_array_equal(values / step, np.round(values / step))


def test_budget_session_forwards_granularity(spark, tmp_path):
    from dpq_spark import BudgetSession
    from dpq_spark.pipeline.ledger import init_ledger

    ages = pd.read_csv(_ages_csv(tmp_path))
    df = spark.createDataFrame(ages.astype({"age": "int32"}))
    ledger = str(tmp_path / "ledger.sqlite")
    init_ledger(ledger, dataset_id="ages", epsilon_cap=5.0)
    session = BudgetSession(df, ledger=ledger, dataset="ages")
    out = session.quantiles("age", quantiles=[0.25, 0.5, 0.75], epsilon=1.0, lower=0,
                            upper=100, granularity=5).toPandas()["value"].to_numpy()
    np.testing.assert_array_equal(out % 5, 0.0)
    with pytest.raises(ValueError, match="`granularity` must be finite and > 0"):
        session.quantiles("age", quantiles=[0.5], epsilon=1.0, lower=0, upper=100,
                          granularity=-1)
