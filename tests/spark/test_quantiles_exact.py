"""dp_quantiles gives JointExp each group's exact (fine-grid) data; keys stay exact; jobs are few.

The equality test replays the release with the core: the same per-group randomness
(``default_rng([base_seed, key_seed(key)])``, where ``base_seed`` is the first draw from the
caller's Generator) and the raw values, which are put on the fine grid (``k * g``, exact in
float64) so that "the raw values" and "the fine grid" are the same data.
"""

from __future__ import annotations

import logging
import re

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("pyspark")
from pyspark.sql import DataFrame  # noqa: E402

from dpq_spark import dp_quantiles  # noqa: E402
from dpq_spark.core import _coarse_bands as cb  # noqa: E402
from dpq_spark.core import joint_exp  # noqa: E402
from dpq_spark.core._random import resolve_rng  # noqa: E402
from dpq_spark.spark import _release as rel  # noqa: E402
from dpq_spark.spark._dataflow import VALUE, fine_column  # noqa: E402

A, B = 0.0, 2e9
G = cb.fine_step(A, B)
Q = [0.1, 0.5, 0.9]
DAY = 86_400 / G  # one day in fine steps


def grouped_data():
    gen = np.random.default_rng(4)
    base = 2**31 + 12_345 * 4096  # the left edge of one coarse (1,907 s) cell
    data = {
        # 1,000 timestamps inside one 1,907 s cell of [0, 2e9]
        "one_cell": base + gen.integers(0, 4096, 1000),
        # 600 in that cell, 400 spread over +-1 day
        "cell_and_day": np.concatenate([base + gen.integers(0, 4096, 600),
                                        base + gen.integers(-DAY, DAY, 400).astype(np.int64)]),
        # a cluster with far outliers: the outliers' coarse cells are pruned
        "outliers": np.concatenate([base + gen.integers(0, 200 * 4096, 6000),
                                    gen.integers(0, 2**32, 30)]),
        "tiny": base + gen.integers(0, 10**9, 3),
    }
    return {g: k * G for g, k in data.items()}  # k * G is exact in float64


def core_release(values, key, seed, epsilon):
    base_seed = resolve_rng(np.random.default_rng(seed)).seed63()
    params = rel.ReleaseParams(quantiles=tuple(Q), epsilon=epsilon, lower=A, upper=B,
                               resolution=2**20, neighboring="add_remove", mechanism="joint_exp",
                               base_seed=base_seed)
    rng = rel.group_rng(params, rel.key_seed(key))
    if values.size <= 3:  # small groups are sampled by enumeration (its own distribution test)
        k, counts = np.unique(cb.fine_index(values, A, B), return_counts=True)
        small = rel.small_joint_exp(cb.fine_values(k, A, B), counts, params, rng)
        assert small is not None
        return small
    return joint_exp(values, Q, epsilon=epsilon, lower=A, upper=B, rng=rng)


@pytest.mark.parametrize("epsilon", [1.0, 0.1])
def test_release_equals_core_on_raw_values_with_same_seed(spark, epsilon):
    data = grouped_data()
    pdf = pd.DataFrame({"g": np.repeat(list(data), [v.size for v in data.values()]),
                        "x": np.concatenate(list(data.values()))})
    df = spark.createDataFrame(pdf)
    names = [*data, "empty"]
    out = dp_quantiles(df, "x", quantiles=Q, epsilon=epsilon, lower=A, upper=B, group_by="g",
                       groups=names, rng=np.random.default_rng(9)).toPandas()
    for name in names:
        got = out.loc[out["g"] == name, "value"].to_numpy()
        want = core_release(data.get(name, np.zeros(0)), (name,), 9, epsilon)
        np.testing.assert_array_equal(got, want, err_msg=name)
    if epsilon < 1:
        return  # at epsilon 0.1 even the core is pulled into the wide empty intervals
    truth = np.quantile(data["one_cell"], Q, method="inverted_cdf")
    error = np.abs(out.loc[out["g"] == "one_cell", "value"].to_numpy() - truth)
    assert error.max() < 1907  # inside the cell, not the ~6e8 s of midpoints of empty cells


def test_outlier_group_exercises_pruning():
    """The "outliers" group is large enough to be pruned and some of its cells are pruned, so
    the equality tests cover the represented data, not only the exact one."""
    from dpq_spark.spark.quantiles import _KEEP_ALL_ROWS

    k = cb.fine_index(grouped_data()["outliers"], A, B)
    assert k.size > _KEEP_ALL_ROWS
    cells, counts = np.unique(cb.coarse_of(k), return_counts=True)
    c = 1.0 / (2 * 2 * (1 - 0.1))  # epsilon 1, add/remove, deciles gap 0.1
    assert not cb.reachable(cells, counts, np.array(Q), c, A, B).all()


def test_global_release_equals_core(spark):
    data = grouped_data()["outliers"]
    df = spark.createDataFrame(pd.DataFrame({"x": data}))
    out = dp_quantiles(df, "x", quantiles=Q, epsilon=1.0, lower=A, upper=B,
                       rng=np.random.default_rng(3)).toPandas()
    np.testing.assert_array_equal(out["value"].to_numpy(), core_release(data, (), 3, 1.0))


def test_fine_index_in_spark_matches_numpy(spark):
    gen = np.random.default_rng(1)
    x = np.concatenate([gen.uniform(-1e9, 3e9, 2000), (np.arange(50) + 0.5) * G,
                        [A, B, -0.0, G / 2, 1.5 * G]])
    df = spark.createDataFrame(pd.DataFrame({VALUE: x}))
    got = df.select(fine_column(A, B).alias("k")).toPandas()["k"].to_numpy()
    np.testing.assert_array_equal(got, cb.fine_index(x, A, B))


# ------------------------------------------------------------------------------------------
# Keys exactly as in the data

BIG = [2**60 + 1, 2**60 + 2, None]


@pytest.fixture(scope="module")
def keyed(spark):
    rows = [(k, d, float(i)) for i in range(40) for k, d in
            [(2**60 + 1, 1.0), (2**60 + 2, float("nan")), (None, None)]]
    return spark.createDataFrame(rows, "k bigint, d double, x double").cache()


def test_big_int_keys_and_null_kept_on_partition_selection(keyed):
    out = dp_quantiles(keyed, "x", quantiles=[0.5], epsilon=50.0, lower=0, upper=100,
                       group_by="k", delta=1e-6, rng=np.random.default_rng(0))
    assert [r["k"] for r in out.collect()] == [None, 2**60 + 1, 2**60 + 2]


def test_big_int_keys_kept_on_public_keys(keyed):
    out = dp_quantiles(keyed, "x", quantiles=[0.5], epsilon=50.0, lower=0, upper=100,
                       group_by="k", groups=[2**60 + 2, None, 2**60 + 1, 2**60 + 3],
                       rng=np.random.default_rng(0))
    assert [r["k"] for r in out.collect()] == [None, 2**60 + 1, 2**60 + 2, 2**60 + 3]


def test_null_and_nan_keys_are_distinct(keyed):
    out = dp_quantiles(keyed, "x", quantiles=[0.5], epsilon=50.0, lower=0, upper=100,
                       group_by="d", delta=1e-6, rng=np.random.default_rng(0)).collect()
    keys = [r["d"] for r in out]
    assert len(keys) == 3 and keys[0] is None and keys[1] == 1.0 and np.isnan(keys[2])
    listed = dp_quantiles(keyed, "x", quantiles=[0.5], epsilon=50.0, lower=0, upper=100,
                          group_by="d", groups=[float("nan"), None],
                          rng=np.random.default_rng(0)).collect()
    assert listed[0]["d"] is None and np.isnan(listed[1]["d"])
    assert all(abs(r["value"] - 19.5) < 2 for r in listed)  # each group saw its own 40 rows


# ------------------------------------------------------------------------------------------
# Spark jobs per release

_ACTIONS = ("collect", "toArrow", "toPandas", "count", "first", "head", "take", "show",
            "toLocalIterator", "foreach", "foreachPartition", "tail", "isEmpty")


@pytest.fixture
def counted(monkeypatch, keyed):
    """Counts every DataFrame action (the real method still runs) on the session's concrete
    DataFrame class (classic or Connect)."""
    calls = []
    cls = type(keyed)
    assert issubclass(cls, DataFrame)
    for name in _ACTIONS:
        original = getattr(cls, name)

        def wrapper(self, *args, __original=original, __name=name, **kwargs):
            calls.append(__name)
            return __original(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, wrapper)
    return calls


def _jobs_logged(caplog) -> int:
    lines = [r.getMessage() for r in caplog.records if "released in" in r.getMessage()]
    assert len(lines) == 1
    return int(re.search(r"with (\d+) Spark jobs", lines[0]).group(1))


@pytest.mark.parametrize("path, expected", [
    ("global", 2), ("list", 2), ("frame", 3), ("selection", 2), ("unit", 2), ("ind_exp", 1)])
def test_spark_jobs_per_release(spark, keyed, counted, caplog, path, expected):
    kw = dict(quantiles=[0.5], epsilon=1.0, lower=0, upper=100, rng=np.random.default_rng(0))
    if path == "list":
        kw.update(group_by="k", groups=[2**60 + 1, 5])
    elif path == "frame":
        kw.update(group_by="k", groups=spark.createDataFrame([(2**60 + 1,)], "k bigint"))
    elif path == "selection":
        kw.update(group_by="k", delta=1e-6)
    elif path == "unit":
        kw.update(group_by="k", groups=[2**60 + 1], privacy_unit="x")
    elif path == "ind_exp":
        kw.update(mechanism="ind_exp")
    with caplog.at_level(logging.INFO, logger="dpq_spark"):
        out = dp_quantiles(keyed, "x", **kw)
    assert len(counted) == expected == _jobs_logged(caplog)
    log = " ".join(r.getMessage() for r in caplog.records)
    assert "2**60" not in log and str(2**60 + 1) not in log  # no data in the log


def test_reading_the_result_runs_no_spark_job(spark, keyed):
    """The result is local rows already in order: ``collect`` runs no job (no sort). (On a
    classic session ``toPandas``/``toArrow`` launch one job for Spark's Arrow collection, even
    over local rows.)"""
    out = dp_quantiles(keyed, "x", quantiles=[0.5, 0.9], epsilon=1.0, lower=0, upper=100,
                       group_by="k", groups=[2**60 + 1, None], rng=np.random.default_rng(0))
    tracker = spark.sparkContext.statusTracker()
    spark.sparkContext.setJobGroup("dpq-read", "read the release")
    try:
        rows = out.collect()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert len(rows) == 4
    assert list(tracker.getJobIdsForGroup("dpq-read")) == []
    assert [r["k"] for r in rows] == [None, None, 2**60 + 1, 2**60 + 1]
