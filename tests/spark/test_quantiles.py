"""dp_quantiles on a local[2] session: routing, keys, bounding, selection, materialisation.

Exactness checks use a huge epsilon, where JointExp puts each output in the interval between the
order statistics at the target ranks; with continuous data those intervals (plus the grid's half
cell) are far below the tolerance, so ``assertDataFrameEqual(..., atol=...)`` is deterministic.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import functions as F  # noqa: E402
from pyspark.testing import assertDataFrameEqual  # noqa: E402

from dpq_spark import dp_quantiles  # noqa: E402

HUGE = 1e6
Q = [0.1, 0.5, 0.9]


def exact(values, quantiles=Q):
    """Exact quantiles as JointExp targets them: the ceil(q n)-th order statistic."""
    return np.quantile(np.asarray(values, dtype=float), quantiles, method="inverted_cdf")


def expected_frame(spark, rows, key_cols, schema_keys, mechanism="approx_quantiles"):
    """Expected release; ``mechanism`` is the name the ``mechanism`` column must hold (for
    ``"auto"`` with m = 3 quantiles and a huge epsilon, ApproxQuantiles)."""
    ddl = ", ".join([*schema_keys, "quantile double", "value double", "mechanism string"])
    # Python values (None stays None, numpy scalars become ints and floats), so that the frame
    # is built the same way with Arrow conversions on or off
    rows = [tuple(v.item() if isinstance(v, np.generic) else v for v in (*row, mechanism))
            for row in rows]
    return spark.createDataFrame(rows, ddl)


@pytest.fixture(scope="module")
def grouped(spark):
    """Three groups a, b, c of 2,000 N(0, 1) values each, plus the numpy truth."""
    gen = np.random.default_rng(11)
    data = {g: gen.normal(loc, 1.0, 2000) for g, loc in [("a", -3.0), ("b", 0.0), ("c", 3.0)]}
    pdf = pd.DataFrame({"g": np.repeat(list(data), 2000), "x": np.concatenate(list(data.values()))})
    return spark.createDataFrame(pdf).cache(), data


def test_ungrouped_huge_epsilon_matches_numpy(spark, grouped):
    df, data = grouped
    out = dp_quantiles(df, "x", quantiles=Q, epsilon=HUGE, lower=-10, upper=10,
                       rng=np.random.default_rng(1))
    assert out.columns == ["quantile", "value", "mechanism"]
    assert [f.dataType.simpleString() for f in out.schema] == ["double", "double", "string"]
    truth = exact(np.concatenate(list(data.values())))
    expected = expected_frame(spark, list(zip(Q, truth)), [], [])
    assertDataFrameEqual(out, expected, atol=0.02, checkRowOrder=True)


def test_public_keys_empty_group_and_unlisted_key(spark, grouped):
    df, data = grouped
    out = dp_quantiles(df, "x", quantiles=Q, epsilon=HUGE, lower=-10, upper=10, group_by="g",
                       groups=["b", "a", "zz"], rng=np.random.default_rng(2))
    got = out.toPandas()
    assert list(got["g"]) == ["a"] * 3 + ["b"] * 3 + ["zz"] * 3  # sorted, "c" dropped
    assert list(got["quantile"]) == Q * 3
    listed = got[got.g != "zz"]
    rows = [(g, q, v) for g in ["a", "b"] for q, v in zip(Q, exact(data[g]))]
    assertDataFrameEqual(out.where("g != 'zz'"), expected_frame(spark, rows, ["g"], ["g string"]),
                         atol=0.02, checkRowOrder=True)
    empty = got[got.g == "zz"]["value"].to_numpy()  # released from no data: anywhere in bounds
    assert np.all((empty >= -10) & (empty <= 10)) and np.all(np.diff(empty) >= 0)
    assert len(listed) == 6


def test_multi_column_keys_null_key_and_keys_dataframe(spark):
    gen = np.random.default_rng(5)
    keys = [(1, "x"), (1, "y"), (None, "y")]
    parts = [pd.DataFrame({"k1": [k1] * 1500, "k2": [k2] * 1500, "x": gen.normal(i, 1, 1500)})
             for i, (k1, k2) in enumerate(keys)]
    pdf = pd.concat(parts, ignore_index=True)
    df = spark.createDataFrame(pdf, "k1 int, k2 string, x double")
    key_df = spark.createDataFrame(keys + keys + [(2, "z")], "k1 int, k2 string").withColumn("junk", F.lit(1))
    rows = []
    for (k1, k2), part in zip(keys, parts):
        rows += [(k1, k2, q, v) for q, v in zip(Q, exact(part["x"]))]
    rows = [(None, "y", q, v) for _, _, q, v in rows[6:9]] + rows[:6]  # nulls sort first
    expected = expected_frame(spark, rows, ["k1", "k2"], ["k1 int", "k2 string"])
    for groups in (keys, key_df.where("k1 is null or k1 < 2")):
        out = dp_quantiles(df, "x", quantiles=Q, epsilon=HUGE, lower=-10, upper=10,
                           group_by=["k1", "k2"], groups=groups, rng=np.random.default_rng(3))
        assert out.columns == ["k1", "k2", "quantile", "value", "mechanism"]
        assertDataFrameEqual(out, expected, atol=0.02, checkRowOrder=True)


def test_nulls_and_nan_dropped_and_infinities_clamped(spark):
    gen = np.random.default_rng(8)
    clean = gen.uniform(-5, 5, 3000)
    dirty = [float(v) for v in clean] + [None] * 500 + [float("nan")] * 500 + [float("inf")] * 10
    df = spark.createDataFrame([(v,) for v in dirty], "x double")
    out = dp_quantiles(df, "x", quantiles=Q, epsilon=HUGE, lower=-10, upper=10,
                       rng=np.random.default_rng(4))
    truth = exact(np.concatenate([clean, [10.0] * 10]))
    assertDataFrameEqual(out, expected_frame(spark, list(zip(Q, truth)), [], []), atol=0.02,
                         checkRowOrder=True)


def test_integer_column_and_transform(spark):
    df = spark.range(1, 1001).withColumnRenamed("id", "n")
    out = df.transform(dp_quantiles, "n", quantiles=[0.5], epsilon=HUGE, lower=0, upper=2000,
                       rng=np.random.default_rng(6))
    assert abs(out.first()["value"] - 500) <= 1.01


def test_release_is_materialised_once(spark, grouped, tmp_path):
    df, _ = grouped
    kwargs = dict(quantiles=Q, epsilon=0.5, lower=-10, upper=10, group_by="g", groups=["a", "b"])
    out = dp_quantiles(df, "x", **kwargs)  # rng=None: fresh OS entropy, a re-run would differ
    first = out.collect()
    assert out.collect() == first
    assert out.count() == 6
    out.write.parquet(str(tmp_path / "release"))
    assertDataFrameEqual(spark.read.parquet(str(tmp_path / "release")), out)
    # Power: two separate releases do differ, so equal actions above are not a coincidence.
    assert dp_quantiles(df, "x", **kwargs).collect() != first


def test_seeded_rng_is_reproducible(spark, grouped):
    df, _ = grouped
    kwargs = dict(quantiles=Q, epsilon=0.5, lower=-10, upper=10, group_by="g", groups=["a", "c"])
    one = dp_quantiles(df, "x", rng=np.random.default_rng(42), **kwargs)
    two = dp_quantiles(df, "x", rng=np.random.default_rng(42), **kwargs)
    assertDataFrameEqual(one, two, checkRowOrder=True)
    other = dp_quantiles(df, "x", rng=np.random.default_rng(43), **kwargs)
    assert other.collect() != one.collect()


def test_other_registered_mechanism(spark, grouped):
    df, data = grouped
    out = dp_quantiles(df, "x", quantiles=Q, epsilon=HUGE, lower=-10, upper=10, group_by="g",
                       groups=["a"], mechanism="ind_exp", rng=np.random.default_rng(9)).toPandas()
    assert np.allclose(out["value"], exact(data["a"]), atol=0.05)


def _unit_frame(spark, light_per_group: int, groups: list[str], heavy_rows: int):
    """Light units (one row each, values 0, 1, ...) in every group, plus unit "heavy" with
    ``heavy_rows`` rows of 99.5 in every group."""
    rows = []
    for g in groups:
        rows += [(f"{g}-{i}", g, float(i)) for i in range(light_per_group)]
        rows += [("heavy", g, 99.5)] * heavy_rows
    return spark.createDataFrame(rows, "user string, g string, x double")


def test_privacy_unit_with_1000_rows_moves_the_median_by_at_most_its_cap(spark):
    df = _unit_frame(spark, 97, ["a"], heavy_rows=1000)
    out = dp_quantiles(df, "x", quantiles=[0.5], epsilon=HUGE, lower=0, upper=100, group_by="g",
                       groups=["a"], privacy_unit="user", max_rows_per_unit=3,
                       rng=np.random.default_rng(10)).first()["value"]
    # 97 light rows 0..96 and at most 3 heavy rows: the median is in [48, 50); without the cap
    # (1,097 rows, 1,000 of them 99.5) it would be 99.5.
    assert 48.0 <= out < 50.0


def test_bounding_keeps_at_most_the_caps_at_random(spark):
    from dpq_spark.spark import _dataflow as flow

    groups = ["a", "b", "c", "d", "e"]
    rows = _unit_frame(spark, 20, groups, heavy_rows=50).select(
        "g", F.col("x").alias(flow.VALUE), F.col("user").alias(flow.UNIT)).cache()
    picks = set()
    for seed in (1, 2, 3):
        kept = flow.bound_contributions(rows, ("g",), max_rows=3, max_groups=2, row_seed=seed,
                                        group_seed=seed).toPandas()
        heavy = kept[kept[flow.VALUE] == 99.5]
        assert heavy.groupby("g").size().tolist() == [3, 3]  # 3 rows in each of 2 groups
        assert heavy["__dpq_units"].sum() == 2  # one "first row" per (unit, group)
        assert len(kept) - len(heavy) == 20 * 5  # light units untouched
        picks.add(frozenset(heavy["g"]))
    assert len(picks) > 1  # which groups a unit keeps depends on the seed, not on order
    rows.unpersist()


def test_partition_selection_counts_units_not_rows(spark):
    rows = [(f"u{i}", "popular", float(i % 50)) for i in range(400)]
    rows += [("loner", "rare", 1.0)] * 1000  # one unit, many rows: one unit in the count
    rows += [("solo", "single", 2.0)]
    df = spark.createDataFrame(rows, "user string, g string, x double")
    out = dp_quantiles(df, "x", quantiles=[0.5], epsilon=2.0, lower=0, upper=100, group_by="g",
                       delta=1e-6, privacy_unit="user", max_rows_per_unit=10,
                       rng=np.random.default_rng(12))
    assert out.columns == ["g", "quantile", "value", "mechanism"]
    assert [r["g"] for r in out.collect()] == ["popular"]
    # Row-level selection: "rare" has 1,000 rows, i.e. 1,000 units, and is released too.
    row_level = dp_quantiles(df, "x", quantiles=[0.5], epsilon=2.0, lower=0, upper=100,
                             group_by="g", delta=1e-6, rng=np.random.default_rng(13))
    assert sorted(r["g"] for r in row_level.collect()) == ["popular", "rare"]


def test_partition_selection_can_release_nothing(spark):
    df = spark.createDataFrame([("a", 1.0)], "g string, x double")
    out = dp_quantiles(df, "x", quantiles=[0.5], epsilon=1.0, lower=0, upper=10, group_by="g",
                       delta=1e-9, rng=np.random.default_rng(0))
    assert out.collect() == [] and out.columns == ["g", "quantile", "value", "mechanism"]


def test_the_release_log_holds_public_parameters_and_time_only(spark, caplog):
    """The INFO line of a release names its public parameters, its time and its path; not the
    number of Spark jobs, which the ungrouped path decides from the data."""
    import logging
    import re

    caplog.set_level(logging.INFO, logger="dpq_spark")
    df = spark.createDataFrame(pd.DataFrame({"x": np.linspace(0.0, 9.0, 500)}))
    dp_quantiles(df, "x", quantiles=[0.5], epsilon=1.0, lower=0.0, upper=10.0,
                 mechanism="joint_exp", rng=np.random.default_rng(0)).collect()
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("dpq_spark")]
    assert lines and all(re.fullmatch(
        r"dp_quantiles: column='x' keys=\[\] m=1 epsilon=1 mechanism=joint_exp: released in "
        r"[0-9.]+s, path=global", line) for line in lines), lines
