"""The one place that knows pyspark versions: 3.5.x and 4.x behind a few small helpers.

Everything else in dpq_spark calls these helpers and never looks at ``pyspark.__version__``.
All of them use the DataFrame API only (no RDD, no SparkContext, no py4j), so they also run on
Spark Connect. On pyspark 3.5 only classic sessions are tested and supported.

What differs:

* ``DataFrame.toArrow`` is new in 4.0. On 3.5, :func:`to_arrow` streams each partition's Arrow
  batches through ``mapInArrow`` as Arrow IPC bytes and collects those, which keeps every type
  exact (``toPandas`` would turn an integer column holding a null into float64 and lose
  integers past 2**53).
* ``createDataFrame`` accepts a ``pyarrow.Table`` from 4.0. On 3.5, :func:`create_dataframe`
  goes through pandas (with integer columns as Python objects, so nothing is rounded) and
  Spark's Arrow conversion; a table with a NaN in a floating column goes through Python rows
  instead, because pandas' Arrow conversion would turn the NaN into a null.
* ``Column.try_cast`` is new in 4.0. On 3.5, :func:`try_cast` writes the SQL ``try_cast``
  expression, which turns an unparsable value into null under ANSI mode too (so no value can
  appear in an error).
* On 3.5 the Connect ``Column`` and ``DataFrame`` are not subclasses of the classic ones;
  :func:`is_column` and :func:`is_dataframe` accept both.
"""

from __future__ import annotations

import sys

import pyarrow as pa
import pyarrow.compute as pc
import pyspark
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dpq_spark.spark._arrow import binary_value

__all__ = ["SPARK_VERSION", "to_arrow", "create_dataframe", "LOCAL_ROWS_PER_PARTITION",
           "arrow_type", "arrow_schema", "try_cast", "is_column", "is_dataframe", "is_collated"]

SPARK_VERSION: tuple[int, int] = tuple(int(p) for p in pyspark.__version__.split(".")[:2])
_SPARK4 = SPARK_VERSION >= (4, 0)
_IPC = "__dpq_arrow_ipc"


def to_arrow(df: DataFrame) -> pa.Table:
    """Collect ``df`` to the driver as a ``pyarrow.Table`` with the Arrow types of its schema.

    Runs one Spark job. On 3.5 each input batch is serialised to Arrow IPC in the Python worker
    and the bytes are collected; row order is that of ``df``.
    """
    if _SPARK4:
        return df.toArrow()
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(df.schema)

    def serialise(batches):  # runs in the Python workers
        for batch in batches:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, batch.schema) as writer:
                writer.write_batch(batch)
            yield pa.RecordBatch.from_arrays([binary_value(sink.getvalue())], names=[_IPC])

    out_schema = T.StructType([T.StructField(_IPC, T.BinaryType(), False)])
    rows = df.mapInArrow(serialise, schema=out_schema).collect()
    tables = [pa.ipc.open_stream(row[0]).read_all() for row in rows]
    if not tables:
        return schema.empty_table()
    return pa.concat_tables([t.cast(schema) for t in tables])


#: rows of a local table that one partition of :func:`create_dataframe`'s DataFrame holds
LOCAL_ROWS_PER_PARTITION = 1 << 19


def create_dataframe(spark, table: pa.Table, schema: T.StructType) -> DataFrame:
    """A DataFrame over the local rows of ``table`` (column names and order as in ``schema``).

    Spark's Arrow conversion makes one partition per Arrow batch of
    ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows (10,000 by default; on pyspark 4 only
    for a table above ``spark.sql.execution.arrow.localRelationThreshold``, 48 MiB, a smaller
    one being a local relation, which Spark reads without a job), so reading 1e6 rows would
    run 100 tasks and writing them would make 100 files. A table of more than
    ``LOCAL_ROWS_PER_PARTITION`` rows is coalesced (no shuffle, row order kept) to one
    partition per that many rows; a smaller table is left as Spark makes it.
    """
    df = _create(spark, table, schema)
    if table.num_rows <= LOCAL_ROWS_PER_PARTITION:
        return df
    return df.coalesce(-(-table.num_rows // LOCAL_ROWS_PER_PARTITION))


def _create(spark, table: pa.Table, schema: T.StructType) -> DataFrame:
    if _SPARK4:
        return spark.createDataFrame(table, schema=schema)
    arrow = spark.conf.get("spark.sql.execution.arrow.pyspark.enabled", "false").lower() == "true"
    if not arrow or any(_holds_nan(c) for c in table.columns):
        # Go through Python rows (NaN stays NaN, floats are Python floats) where pandas would not
        # do: pandas -> Arrow would turn NaN into null (also inside arrays: the wide layout of a
        # group flagged bounds_not_found), and without Arrow conversions (pyspark 3.5's
        # default) createDataFrame checks each value's exact type and refuses numpy's floats
        # inside the wide layout's arrays
        rows = [tuple(r[name] for name in table.column_names) for r in table.to_pylist()]
        return spark.createDataFrame(rows, schema=schema)
    # integer_object_nulls: an integer column with a null stays integers (float64 would round)
    pdf = table.to_pandas(integer_object_nulls=True, date_as_object=True)
    if len(pdf) == 0:
        return spark.createDataFrame([], schema=schema)
    return spark.createDataFrame(pdf, schema=schema)


def _holds_nan(column) -> bool:
    """Whether a floating column, or a list column of floats, holds a NaN."""
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        column = pc.list_flatten(column)
    return pa.types.is_floating(column.type) and bool(pc.any(pc.is_nan(column)).as_py())


def arrow_type(data_type: T.DataType) -> pa.DataType:
    """The Arrow type of a Spark type as dpq_spark moves it (timestamps in UTC)."""
    from pyspark.sql.pandas.types import to_arrow_type

    return to_arrow_type(data_type, timezone="UTC") if _SPARK4 else to_arrow_type(data_type)


def arrow_schema(schema: T.StructType) -> pa.Schema:
    """The Arrow schema of a Spark schema (timestamps in UTC)."""
    return pa.schema([pa.field(f.name, arrow_type(f.dataType), nullable=f.nullable)
                      for f in schema.fields])


def try_cast(column: str, data_type) -> Column:
    """The column named ``column`` cast to ``data_type``, null where the cast fails (any mode).

    ``column`` is a name as ``F.col`` takes it (dots separate struct fields, backticks quote);
    ``data_type`` a :class:`pyspark.sql.types.DataType` or a DDL type string such as
    ``"double"``.
    """
    if not isinstance(column, str):
        raise TypeError(f"`column` must be a column name (str), got {type(column).__name__}")
    if _SPARK4:
        return F.col(column).try_cast(data_type)
    type_sql = data_type.simpleString() if isinstance(data_type, T.DataType) else str(data_type)
    path = ".".join("`" + part.replace("`", "``") + "`" for part in _name_parts(column))
    return F.expr(f"try_cast({path} AS {type_sql})")


def _name_parts(name: str) -> list[str]:
    """Split a column name the way ``F.col`` does: on dots outside backticks, with ```` `` ````
    an escaped backtick inside them."""
    parts, current, quoted, i = [], [], False, 0
    while i < len(name):
        ch = name[i]
        if ch == "`":
            if quoted and name[i + 1:i + 2] == "`":
                current.append("`")
                i += 1
            else:
                quoted = not quoted
        elif ch == "." and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    if quoted:
        raise ValueError(f"column name {name!r} has an unclosed backtick")
    parts.append("".join(current))
    return parts


def is_collated(data_type: T.DataType) -> bool:
    """Whether ``data_type`` is a string type with a collation other than ``UTF8_BINARY``
    (pyspark 4; on 3.5 strings have no collation): its equality and order are not those of
    its bytes."""
    return getattr(data_type, "collation", "UTF8_BINARY") != "UTF8_BINARY"


def is_column(obj) -> bool:
    """True for a classic or a Spark Connect ``Column``."""
    return isinstance(obj, Column) or _is_connect(obj, "pyspark.sql.connect.column", "Column")


def is_dataframe(obj) -> bool:
    """True for a classic or a Spark Connect ``DataFrame``."""
    return (isinstance(obj, DataFrame)
            or _is_connect(obj, "pyspark.sql.connect.dataframe", "DataFrame"))


def _is_connect(obj, module: str, name: str) -> bool:
    # Only 3.5 needs this (4.x Connect classes subclass the classic ones). An object of a
    # Connect class exists only once its module is imported, so look there and import nothing.
    loaded = sys.modules.get(module)
    cls = getattr(loaded, name, None) if loaded is not None else None
    return cls is not None and isinstance(obj, cls)
