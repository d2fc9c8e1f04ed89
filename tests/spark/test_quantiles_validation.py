"""Every validation error of dp_quantiles, one pytest.raises(match=...) each.

The DataFrame's value column is a Python UDF that raises when evaluated: if any Spark job ran
before validation failed, the test would see that error instead of the expected one.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pyspark")
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql import types as T  # noqa: E402

from dpq_spark import dp_quantiles  # noqa: E402


@pytest.fixture(scope="module")
def bomb(spark):
    def explode(_):  # defined here so that it pickles by value to the Python worker
        raise AssertionError("a Spark job ran before validation")

    boom = F.udf(explode, T.DoubleType())
    return spark.range(3).select(
        (F.col("id") % 2).alias("g"), F.lit("s").alias("s"), F.col("id").alias("user"),
        F.col("id").alias("quantile"), F.lit("m").alias("mechanism"), boom("id").alias("x"), F.col("id").alias("__dpq_x"))


OK = dict(quantiles=[0.5], epsilon=1.0, lower=0.0, upper=1.0)


def call(df, column="x", **overrides):
    return dp_quantiles(df, column, **{**OK, **overrides})


@pytest.mark.parametrize(
    "column, overrides, exc, match",
    [
        ("x", dict(epsilon=-1.0), ValueError, r"`epsilon` must be finite and > 0, got -1.0"),
        ("x", dict(epsilon=float("inf")), ValueError, r"`epsilon` must be finite"),
        ("x", dict(lower=2.0), ValueError, r"`lower` must be < `upper`"),
        ("x", dict(upper=float("nan")), ValueError, r"`upper` must be finite"),
        ("x", dict(quantiles=[0.5, 0.2]), ValueError, r"`quantiles` must be strictly increasing"),
        ("x", dict(quantiles=[0.0, 0.5]), ValueError, r"`quantiles` must each be in the open"),
        ("x", dict(neighboring="nope"), ValueError, r"`neighboring` must be one of"),
        ("x", dict(resolution=0), ValueError, r"`resolution` must be >= 1"),
        ("x", dict(resolution=2**31), ValueError, r"`resolution` must be <= 2\*\*30"),
        ("x", dict(mechanism="nope"), ValueError, r"`mechanism` must be one of"),
        ("x", dict(mechanism="smooth"), ValueError, r"`mechanism` must be one of"),
        ("x", dict(selection_fraction=1.0), ValueError, r"`selection_fraction` must be in \(0, 1\)"),
        ("x", dict(rng=7), TypeError, r"`rng` must be a numpy.random.Generator"),
        ("missing", {}, ValueError, r"`column` names a column that is not in the DataFrame: 'missing'"),
        (3, {}, TypeError, r"`column` must be a column name"),
        ("s", {}, TypeError, r"`column` 's' must be numeric, got string"),
        ("__dpq_x", {}, ValueError, r"`column`: column names starting with '__dpq_' are reserved"),
        ("x", dict(group_by="nope", groups=[1]), ValueError, r"`group_by` names a column that is not"),
        ("x", dict(group_by=[], groups=[1]), ValueError, r"`group_by` must name at least one column"),
        ("x", dict(group_by=["g", "g"], groups=[(1, 1)]), ValueError, r"`group_by` must not repeat"),
        ("x", dict(group_by="quantile", groups=[1]), ValueError, r"clashes with an output column"),
        ("x", dict(group_by="mechanism", groups=["m"]), ValueError, r"`group_by` column 'mechanism' clashes"),
        ("x", dict(layout="tall"), ValueError, r"`layout` must be 'long' or 'wide', got 'tall'"),
        ("x", dict(layout=None), ValueError, r"`layout` must be 'long' or 'wide', got None"),
        ("x", dict(group_by=5, groups=[1]), TypeError, r"`group_by` must be a column name or a list"),
        ("x", dict(groups=[1]), ValueError, r"`groups` lists group keys, so it needs `group_by`"),
        ("x", dict(group_by="g"), ValueError, r"`group_by` needs public keys: pass `groups`"),
        ("x", dict(group_by="g", groups="ab"), TypeError, r"`groups` must be a list of keys or a DataFrame"),
        ("x", dict(group_by=["g", "s"], groups=[1]), ValueError, r"`groups` entries must be tuples of 2"),
        ("x", dict(group_by="g", groups=[[1, 2]]), ValueError, r"`groups` entries must be tuples of 1"),
        ("x", dict(group_by="g", groups=["text"]), TypeError, r"`groups` values must match the types"),
        ("x", dict(group_by="g", groups=[{}]), TypeError, r"`groups` values must match the types.*got dict"),
        ("x", dict(delta=1e-6), ValueError, r"`delta` is only used for DP partition selection"),
        ("x", dict(group_by="g", groups=[1], delta=1e-6), ValueError, r"`delta` is only used for DP"),
        ("x", dict(group_by="g", delta=1.5), ValueError, r"`delta` must be in \(0, 1\)"),
        ("x", dict(neighboring="swap", group_by="g", groups=[1]), ValueError,
         r"`neighboring='swap'` is supported only without `group_by`"),
        ("x", dict(neighboring="swap", privacy_unit="user"), ValueError,
         r"`neighboring='swap'` is supported only without"),
        ("x", dict(privacy_unit="who"), ValueError, r"`privacy_unit` names a column that is not"),
        ("x", dict(max_rows_per_unit=2), ValueError, r"`max_rows_per_unit` applies only with `privacy_unit`"),
        ("x", dict(max_groups_per_unit=2), ValueError, r"`max_groups_per_unit` applies only with `privacy_unit`"),
        ("x", dict(privacy_unit="user", max_groups_per_unit=2), ValueError,
         r"`max_groups_per_unit` applies only with `group_by`"),
        ("x", dict(privacy_unit="user", max_rows_per_unit=0), ValueError, r"`max_rows_per_unit` must be >= 1"),
        ("x", dict(privacy_unit="user", max_rows_per_unit=1.5), TypeError, r"`max_rows_per_unit` must be an integer"),
    ],
)
def test_invalid_argument(bomb, column, overrides, exc, match):
    with pytest.raises(exc, match=match):
        call(bomb, column, **overrides)


def test_groups_dataframe_must_hold_the_key_columns(spark, bomb):
    keys = spark.createDataFrame([(1,)], "other long")
    with pytest.raises(ValueError, match=r"`groups` DataFrame lacks the `group_by` column\(s\) \['g'\]"):
        call(bomb, group_by="g", groups=keys)


def test_df_must_be_a_dataframe():
    with pytest.raises(TypeError, match=r"`df` must be a pyspark.sql.DataFrame, got list"):
        dp_quantiles([1.0, 2.0], "x", **OK)


def test_valid_call_on_bomb_would_run_a_job(bomb):
    """Power of the fixture: a valid call does evaluate the column and hits the bomb."""
    with pytest.raises(Exception, match="a Spark job ran before validation"):
        call(bomb, rng=np.random.default_rng(0))
