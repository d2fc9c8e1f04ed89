"""The pyspark-version helpers of ``dpq_spark.spark._compat``.

Both test targets run this file: ``make test`` checks the 4.x code paths, ``make test-spark35``
the 3.5 ones, against the same expectations.
"""

from __future__ import annotations

import datetime as dt

import pytest

pytest.importorskip("pyspark")
import pyarrow as pa  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql import types as T  # noqa: E402

from dpq_spark.spark import _compat  # noqa: E402

BIG = 2**53 + 1  # not a float64: an integer column that went through float would lose it

SCHEMA = T.StructType([
    T.StructField("i", T.LongType(), True),
    T.StructField("s", T.StringType(), True),
    T.StructField("d", T.DateType(), True),
    T.StructField("x", T.DoubleType(), False),
])
ROWS = [(BIG, "a", dt.date(2024, 1, 31), 0.5), (None, None, None, 1.5),
        (-BIG, "é", dt.date(1970, 1, 1), -2.0), (7, "", dt.date(2000, 2, 29), 3.25)]


def _as_rows(table: pa.Table):
    return [tuple(r.values()) for r in table.to_pylist()]


def test_to_arrow_keeps_types_values_and_order(spark):
    df = spark.createDataFrame(ROWS, SCHEMA).repartition(1).union(
        spark.createDataFrame(ROWS[:1], SCHEMA))
    table = _compat.to_arrow(df)
    assert table.schema.names == ["i", "s", "d", "x"]
    assert table.schema.field("i").type == pa.int64()
    assert table.schema.field("d").type == pa.date32()
    assert _as_rows(table) == [tuple(r) for r in df.collect()]
    assert _as_rows(table)[0][0] == BIG


def test_to_arrow_of_many_partitions_and_batches(spark):
    df = spark.range(0, 25_000, numPartitions=3).select(
        (F.col("id") + F.lit(BIG)).alias("i"), F.when(F.col("id") % 2 == 0, F.col("id")).alias("n"))
    table = _compat.to_arrow(df)
    assert table.num_rows == 25_000
    assert table.column("i").to_pylist() == [BIG + k for k in range(25_000)]
    assert table.column("n").null_count == 12_500


def test_to_arrow_of_no_rows_has_the_schema(spark):
    table = _compat.to_arrow(spark.createDataFrame([], SCHEMA))
    assert table.num_rows == 0
    assert table.schema.names == ["i", "s", "d", "x"]
    assert table.schema.field("i").type == pa.int64()


def test_create_dataframe_round_trips_exactly(spark):
    table = pa.table({
        "i": pa.array([BIG, None, -BIG, 7], pa.int64()),
        "s": pa.array(["a", None, "é", ""]),
        "d": pa.array([dt.date(2024, 1, 31), None, dt.date(1970, 1, 1), dt.date(2000, 2, 29)]),
        "x": pa.array([0.5, 1.5, -2.0, 3.25]),
    })
    df = _compat.create_dataframe(spark, table, SCHEMA)
    assert df.schema == SCHEMA
    assert [tuple(r) for r in df.collect()] == ROWS


@pytest.fixture
def arrow_batches(spark):
    """Small Arrow batches, and no local relation however small the table (Spark 4 keeps a
    table under 48 MiB as one): the conversion makes one partition per batch of 1,000 rows."""
    confs = {"spark.sql.execution.arrow.maxRecordsPerBatch": "1000",
             "spark.sql.execution.arrow.localRelationThreshold": "0"}
    before = {k: spark.conf.get(k, None) for k in confs}
    for k, v in confs.items():
        spark.conf.set(k, v)
    yield
    for k, v in before.items():
        if v is None:
            spark.conf.unset(k)
        else:
            spark.conf.set(k, v)


def _partitions(df) -> int:
    return df.select(F.spark_partition_id()).distinct().count()


def test_create_dataframe_holds_a_partition_per_block_of_rows(spark, arrow_batches, monkeypatch):
    """Spark's Arrow conversion makes one partition per batch (100 tasks to read 1e6 rows at its
    default 10,000 rows a batch): a table of more than LOCAL_ROWS_PER_PARTITION rows is held in
    one partition per that many rows, in order; a smaller one is left as Spark makes it."""
    monkeypatch.setattr(_compat, "LOCAL_ROWS_PER_PARTITION", 10_000)
    for rows, parts in ((25_000, 3), (10_000, 10)):
        table = pa.table({"i": pa.array(range(rows), pa.int64()), "s": pa.nulls(rows, pa.string()),
                          "d": pa.nulls(rows, pa.date32()), "x": pa.array([0.5] * rows)})
        raw = _partitions(_compat._create(spark, table, SCHEMA))
        if _compat.SPARK_VERSION >= (4, 0):
            assert raw == rows // 1000  # the batches of the conversion (the test's power)
        df = _compat.create_dataframe(spark, table, SCHEMA)
        assert _partitions(df) == min(raw, parts)
        assert [r[0] for r in df.select("i").collect()] == list(range(rows))


def test_create_dataframe_of_no_rows(spark):
    empty = pa.schema([("i", pa.int64()), ("s", pa.string()), ("d", pa.date32()),
                       ("x", pa.float64())]).empty_table()
    df = _compat.create_dataframe(spark, empty, SCHEMA)
    assert df.schema == SCHEMA
    assert df.count() == 0


@pytest.fixture
def ansi(spark):
    before = spark.conf.get("spark.sql.ansi.enabled")
    spark.conf.set("spark.sql.ansi.enabled", "true")
    yield
    spark.conf.set("spark.sql.ansi.enabled", before)


def test_try_cast_gives_null_not_an_error_under_ansi(spark, ansi):
    df = spark.createDataFrame([("1.5",), ("secret-value",), (None,), ("-7",)], "s string")
    got = [r[0] for r in df.select(_compat.try_cast("s", "double")).collect()]
    assert got == [1.5, None, None, -7.0]
    keys = [r[0] for r in df.select(_compat.try_cast("s", T.LongType())).collect()]
    assert keys == [None, None, None, -7]


def test_try_cast_resolves_names_as_col_does(spark, ansi):
    df = spark.createDataFrame([("2", ("3",), "4")], "`a.b` string, st struct<f: string>, `q``t` string")
    row = df.select(_compat.try_cast("`a.b`", "int"), _compat.try_cast("st.f", "int"),
                    _compat.try_cast("`q``t`", "int")).first()
    assert tuple(row) == (2, 3, 4)


def test_try_cast_argument_errors():
    with pytest.raises(TypeError, match="`column` must be a column name"):
        _compat.try_cast(F.col("s"), "double")
    assert _compat._name_parts("a.`b.c`.d") == ["a", "b.c", "d"]
    with pytest.raises(ValueError, match="unclosed backtick"):
        _compat._name_parts("`a")


def test_column_and_dataframe_checks(spark):
    df = spark.range(1)
    assert _compat.is_dataframe(df) and not _compat.is_dataframe(df.toPandas())
    assert _compat.is_column(F.col("id")) and _compat.is_column(df.id)
    assert not _compat.is_column("id") and not _compat.is_dataframe(None)
