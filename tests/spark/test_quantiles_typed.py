"""dp_quantiles on typed columns: the grid comes from the schema (or ``granularity``).

An integral column has the grid of the integers, a ``decimal(p, s)`` column that of ``10**-s``, a
float/double column the default grid; ``granularity`` overrides. Spark must release what the
core releases on the same data with that ``granularity``, seed for seed: the same per-group
generator (``default_rng([base_seed, key_seed(key)])``, as in test_quantiles_exact.py) and the
group's distinct values in increasing order with their counts (the core jitters ties one row at
a time in input order; Spark's fold hands the mechanism sorted grid indices).
"""

from __future__ import annotations

import decimal

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("pyspark")
from pyspark.sql import types as T  # noqa: E402

from dpq_spark import dp_quantiles  # noqa: E402
from dpq_spark.core.accounting.neighboring import NeighboringRelation  # noqa: E402
from dpq_spark.core.quantiles.choose import auto, plan_auto  # noqa: E402
from dpq_spark.core.quantiles.mechanisms import get_mechanism  # noqa: E402
from dpq_spark.core.randomness.source import resolve_rng  # noqa: E402
from dpq_spark.spark import _fold  # noqa: E402
from dpq_spark.spark._arguments import release_grid, schema_granularity  # noqa: E402
from dpq_spark.spark._keys import key_seed  # noqa: E402

DECILES = [j / 10 for j in range(1, 10)]


def _rngs(seed):
    """The per-group generators dp_quantiles derives from ``default_rng(seed)``."""
    source = resolve_rng(np.random.default_rng(seed))
    source.seed63(), source.seed63()  # row and group seeds of contribution bounding
    base = source.seed63()
    return lambda *key: np.random.default_rng([base, (key_seed(key) if key else 0) % 2**64])


def _ages(n, seed):
    return np.clip(np.round(np.random.default_rng(seed).normal(40, 15, n)), 0, 100).astype(int)


def _ratings(n, seed):
    """Two-decimal values in [2.5, 5] (as Python Decimals for a decimal(3, 2) column)."""
    cents = np.clip(np.round(np.random.default_rng(seed).normal(395, 30, n)), 250, 500)
    return cents.astype(int)


def _core(mechanism, values, **kw):
    """The core's release on the distinct values in increasing order, with their counts."""
    x, c = np.unique(np.asarray(values, dtype=np.float64), return_counts=True)
    return np.asarray(get_mechanism(mechanism)(x, kw.pop("quantiles"), counts=c, **kw))


GROUPS = {"a": 3000, "b": 400, "c": 40}


def _int_frame(spark):
    parts = [(g, _ages(n, i)) for i, (g, n) in enumerate(GROUPS.items())]
    pdf = pd.DataFrame({"g": np.repeat([g for g, _ in parts], [v.size for _, v in parts]),
                        "age": np.concatenate([v for _, v in parts]).astype(np.int32)})
    schema = T.StructType([T.StructField("g", T.StringType()),
                           T.StructField("age", T.IntegerType())])
    return spark.createDataFrame(pdf, schema), dict(parts)


def _decimal_frame(spark):
    parts = [(g, _ratings(n, 10 + i)) for i, (g, n) in enumerate(GROUPS.items())]
    rows = [(g, decimal.Decimal(int(c)).scaleb(-2)) for g, v in parts for c in v]
    schema = T.StructType([T.StructField("g", T.StringType()),
                           T.StructField("rating", T.DecimalType(3, 2))])
    return spark.createDataFrame(rows, schema), {g: v / 100.0 for g, v in parts}


# --------------------------------------------------------------------------------------------
# The rule (no Spark job)


def test_schema_granularity_rule():
    assert schema_granularity(T.IntegerType()) == 1
    assert schema_granularity(T.LongType()) == 1
    assert schema_granularity(T.ByteType()) == 1 and schema_granularity(T.ShortType()) == 1
    assert float(schema_granularity(T.DecimalType(3, 2))) == 0.01
    assert schema_granularity(T.DecimalType(10, 0)) == 1
    assert schema_granularity(T.DoubleType()) is None
    assert schema_granularity(T.FloatType()) is None


def test_release_grid_moves_bounds_onto_the_type_grid_and_falls_back_publicly():
    assert release_grid(T.IntegerType(), 0.0, 100.0, None) == (0.0, 100.0, 1.0)
    assert release_grid(T.IntegerType(), -0.5, 100.5, None) == (0.0, 100.0, 1.0)
    assert release_grid(T.DecimalType(3, 2), 0.001, 4.999, None) == (0.01, 4.99, 0.01)
    # no two integers inside the bounds, or more than 2**32 steps: the default grid
    assert release_grid(T.IntegerType(), 0.2, 0.8, None) == (0.2, 0.8, None)
    assert release_grid(T.LongType(), 0.0, 1e12, None) == (0.0, 1e12, None)
    assert release_grid(T.DoubleType(), 0.0, 5.0, None) == (0.0, 5.0, None)
    # a given granularity is the core's grid on the given bounds
    assert release_grid(T.DoubleType(), 0.0, 5.0, 0.01) == (0.0, 5.0, 0.01)
    assert release_grid(T.IntegerType(), 0.5, 9.5, 2.0) == (0.5, 9.5, 2.0)
    # without bounds only a given step is used (private bounds may span > 2**52 steps)
    assert release_grid(T.IntegerType(), None, None, None) == (None, None, None)
    assert release_grid(T.DecimalType(38, 18), None, None, None) == (None, None, None)
    assert release_grid(T.DoubleType(), None, None, 0.5) == (None, None, 0.5)


@pytest.mark.parametrize("n, m, picked", [(20, 3, "histogram"), (20_000, 99, "agg_tree")])
def test_core_auto_with_granularity_rounds_tree_releases_to_the_grid(n, m, picked):
    """The core's ``auto`` passes ``granularity`` to whatever it picks: AggTree and the
    histogram take it and round their estimates to that grid (post-processing)."""
    x = _ages(n, 1).astype(np.float64)
    q = list(np.linspace(0.01, 0.99, m))
    out = auto(x, q, epsilon=1.0, lower=0.0, upper=100.0, granularity=1.0,
               rng=np.random.default_rng(0))
    assert out.mechanism == picked
    np.testing.assert_array_equal(out, np.round(out))
    # the same mechanism and draws without the grid (auto's noisy count, then the mechanism;
    # auto itself would pick by the rule for columns without a grid)
    source = resolve_rng(np.random.default_rng(0))
    name, rest, _ = plan_auto(m, n, epsilon=1.0, neighboring=NeighboringRelation.parse("add_remove"),
                              source=source, grid_size=101, granularity=1.0)
    assert name == picked
    plain = get_mechanism(picked)(x, q, epsilon=rest, lower=0.0, upper=100.0, rng=source)
    np.testing.assert_array_equal(np.asarray(out), np.clip(np.round(plain), 0, 100))


@pytest.mark.parametrize("bad, error, words", [
    (0.0, ValueError, "`granularity` must be finite and > 0"),
    (-1, ValueError, "`granularity` must be finite and > 0"),
    (float("nan"), ValueError, "`granularity` must be finite and > 0"),
    (float("inf"), ValueError, "`granularity` must be finite and > 0"),
    ("0.01", TypeError, "`granularity` must be a real number"),
    (True, TypeError, "`granularity` must be a real number"),
    (1e-9, ValueError, "at most 2**32 steps"),  # 1e11 steps on [0, 100]: Spark's limit
    (1e-14, ValueError, "at most 2**52 steps"),  # the core's limit
])
def test_bad_granularity_is_refused_before_any_job(spark, bad, error, words):
    from dpq_spark.spark.quantiles import counting_jobs

    df = spark.createDataFrame([(1.0,)], "x double")
    with counting_jobs() as jobs, pytest.raises(error, match=words.replace("*", r"\*")):
        dp_quantiles(df, "x", quantiles=[0.5], epsilon=1.0, lower=0.0, upper=100.0,
                     granularity=bad)
    assert jobs[0] == 0


# --------------------------------------------------------------------------------------------
# Spark releases what the core releases, seed for seed


@pytest.mark.parametrize("mechanism", ["joint_exp", "ind_exp", "approx_quantiles", "agg_tree",
                                       "histogram"])
def test_grouped_integral_column_equals_core_with_granularity_1(spark, mechanism):
    df, data = _int_frame(spark)
    out = dp_quantiles(df, "age", quantiles=DECILES, epsilon=1.0, lower=0, upper=100,
                       group_by="g", groups=[*data, "empty"], mechanism=mechanism,
                       rng=np.random.default_rng(3)).toPandas()
    rng_of = _rngs(3)
    for g in [*data, "empty"]:
        got = out.loc[out["g"] == g, "value"].to_numpy()
        want = _core(mechanism, data.get(g, []), quantiles=DECILES, epsilon=1.0, lower=0.0,
                     upper=100.0, granularity=1.0, rng=rng_of(g))
        np.testing.assert_array_equal(got, want, err_msg=g)
        np.testing.assert_array_equal(got, np.round(got))  # integers
    # power: the default grid's release (a double column) is another one
    other = _core(mechanism, data["a"], quantiles=DECILES, epsilon=1.0, lower=0.0, upper=100.0,
                  rng=rng_of("a"))
    assert not np.array_equal(out.loc[out["g"] == "a", "value"].to_numpy(), other)


@pytest.mark.parametrize("seed", [0, 1])
def test_grouped_auto_on_integral_column_equals_core_auto(spark, seed):
    df, data = _int_frame(spark)
    out = dp_quantiles(df, "age", quantiles=DECILES, epsilon=1.0, lower=0, upper=100,
                       group_by="g", groups=list(data),
                       rng=np.random.default_rng(seed)).toPandas()
    rng_of = _rngs(seed)
    picked = set()
    for g, v in data.items():
        x, c = np.unique(v.astype(np.float64), return_counts=True)
        want = auto(x, DECILES, epsilon=1.0, lower=0.0, upper=100.0, counts=c, granularity=1.0,
                    rng=rng_of(g))
        part = out[out["g"] == g]
        assert set(part["mechanism"]) == {want.mechanism}
        np.testing.assert_array_equal(part["value"].to_numpy(), np.asarray(want), err_msg=g)
        picked.add(want.mechanism)
    assert "joint_exp" in picked


@pytest.mark.parametrize("mechanism", ["auto", "joint_exp", "approx_quantiles"])
def test_grouped_decimal_column_equals_core_with_its_scale(spark, mechanism):
    df, data = _decimal_frame(spark)
    out = dp_quantiles(df, "rating", quantiles=DECILES, epsilon=1.0, lower=0.0, upper=5.0,
                       group_by="g", groups=list(data), mechanism=mechanism,
                       rng=np.random.default_rng(4)).toPandas()
    rng_of = _rngs(4)
    for g, v in data.items():
        want = _core(mechanism, v, quantiles=DECILES, epsilon=1.0, lower=0.0, upper=5.0,
                     granularity=0.01, rng=rng_of(g))
        got = out.loc[out["g"] == g, "value"].to_numpy()
        np.testing.assert_array_equal(got, want, err_msg=g)
        np.testing.assert_allclose(got * 100, np.round(got * 100), atol=1e-9)  # on 0.01's grid


@pytest.mark.parametrize("mechanism", ["auto", "joint_exp", "agg_tree"])
def test_ungrouped_integral_and_decimal_equal_core(spark, mechanism):
    ages = _ages(5000, 7)
    df = spark.createDataFrame(pd.DataFrame({"age": ages.astype(np.int64)}))  # long
    out = dp_quantiles(df, "age", quantiles=DECILES, epsilon=1.0, lower=0, upper=100,
                       mechanism=mechanism, rng=np.random.default_rng(5)).toPandas()
    want = _core(mechanism, ages, quantiles=DECILES, epsilon=1.0, lower=0.0, upper=100.0,
                 granularity=1.0, rng=_rngs(5)())
    np.testing.assert_array_equal(out["value"].to_numpy(), want)

    cents = _ratings(3000, 8)
    rows = [(decimal.Decimal(int(c)).scaleb(-2),) for c in cents]
    df = spark.createDataFrame(rows, T.StructType([T.StructField("r", T.DecimalType(3, 2))]))
    out = dp_quantiles(df, "r", quantiles=DECILES, epsilon=1.0, lower=0.0, upper=5.0,
                       mechanism=mechanism, rng=np.random.default_rng(6)).toPandas()
    want = _core(mechanism, cents / 100.0, quantiles=DECILES, epsilon=1.0, lower=0.0,
                 upper=5.0, granularity=0.01, rng=_rngs(6)())
    np.testing.assert_array_equal(out["value"].to_numpy(), want)


def test_double_column_with_granularity_equals_core_and_overrides_schema(spark):
    """A double column has no declared step: ``granularity=0.01`` gives it the core's grid,
    and on an int column ``granularity=5`` replaces the integers' grid."""
    cents = _ratings(2000, 9)
    df = spark.createDataFrame(pd.DataFrame({"r": cents / 100.0}))
    out = dp_quantiles(df, "r", quantiles=DECILES, epsilon=1.0, lower=0.0, upper=5.0,
                       mechanism="joint_exp", granularity=0.01,
                       rng=np.random.default_rng(2)).toPandas()
    want = _core("joint_exp", cents / 100.0, quantiles=DECILES, epsilon=1.0, lower=0.0,
                 upper=5.0, granularity=0.01, rng=_rngs(2)())
    np.testing.assert_array_equal(out["value"].to_numpy(), want)
    ages = _ages(2000, 9)
    df = spark.createDataFrame(pd.DataFrame({"age": ages.astype(np.int32)}))
    out = dp_quantiles(df, "age", quantiles=DECILES, epsilon=1.0, lower=0, upper=100,
                       mechanism="joint_exp", granularity=5,
                       rng=np.random.default_rng(2)).toPandas()
    want = _core("joint_exp", ages, quantiles=DECILES, epsilon=1.0, lower=0.0, upper=100.0,
                 granularity=5.0, rng=_rngs(2)())
    np.testing.assert_array_equal(out["value"].to_numpy(), want)
    assert set(out["value"] % 5) == {0.0}


@pytest.mark.parametrize("mechanism", ["auto", "joint_exp", "approx_quantiles"])
def test_partitions_past_the_fold_budget_release_the_core_on_a_declared_grid(spark, monkeypatch,
                                                                             mechanism):
    """Fold budget lowered to 16 pairs: every partition is past it (on a declared grid the fold
    writes sorted runs then, never a coarse spill). Every mechanism still gets the group's exact
    grid data (no pruning, no coarse cells)."""
    monkeypatch.setattr(_fold, "FOLD_BUDGET", 16)
    df, data = _int_frame(spark)
    out = dp_quantiles(df, "age", quantiles=DECILES, epsilon=1.0, lower=0, upper=100,
                       group_by="g", groups=list(data), mechanism=mechanism,
                       rng=np.random.default_rng(8)).toPandas()
    rng_of = _rngs(8)
    for g, v in data.items():
        want = _core(mechanism, v, quantiles=DECILES, epsilon=1.0, lower=0.0, upper=100.0,
                     granularity=1.0, rng=rng_of(g))
        np.testing.assert_array_equal(out.loc[out["g"] == g, "value"].to_numpy(), want,
                                      err_msg=g)


def test_partition_selection_on_integral_column_equals_core(spark):
    df, data = _int_frame(spark)
    out = dp_quantiles(df, "age", quantiles=DECILES, epsilon=2.0, lower=0, upper=100,
                       group_by="g", delta=1e-6, mechanism="joint_exp",
                       rng=np.random.default_rng(11)).toPandas()
    assert set(out["g"]) >= {"a", "b"}
    np.testing.assert_array_equal(out["value"], np.round(out["value"]))
