"""What the job reads: the input table (CSV, Parquet, a catalog table) and the public keys.

Each reader resolves a schema and builds a lazy DataFrame; none of them reads a private row.
"""

from __future__ import annotations

import datetime
import decimal
import logging
import re
from typing import TYPE_CHECKING, Any

from dpq_spark.pipeline.config import ConfigError, GroupsConfig, InputConfig

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["read_csv", "read_input", "read_keys"]

log = logging.getLogger(__name__)


def read_csv(spark: "SparkSession", path: str, *, mode: str = "DROPMALFORMED",
             options: dict[str, Any] | None = None, numeric: tuple[str, ...] = (),
             schema: "dict[str, str] | list[tuple[str, str]] | None" = None) -> "DataFrame":
    """Read a CSV file with declared column types, every other column as a string, and header
    names stripped of spaces.

    Parameters
    ----------
    spark : SparkSession
    path : str
        The file or directory.
    mode : {"DROPMALFORMED", "PERMISSIVE", "FAILFAST"}
        Spark's CSV parse mode. With ``"DROPMALFORMED"`` (the default) rows whose number of
        fields differs from the header, or whose typed fields do not parse as their type, are
        dropped, e.g. the four Goodreads rows with an unquoted comma; ``"FAILFAST"`` fails on
        them (when the data is read); ``"PERMISSIVE"`` keeps them with nulls.
    options : dict, optional
        Further Spark CSV reader options (``header`` defaults to true).
    numeric : tuple of str
        Columns (stripped header names) read as double, when ``schema`` does not type them.
    schema : dict or list of (name, type), optional
        Declared types as Spark type names (``"double"``, ``"decimal(10,2)"``). A dict types
        the named header columns (stripped names). A list is the complete schema, every column
        in order: the header line, if any, is skipped and its names are not used (nothing of
        the file is read to build the DataFrame).

    Notes
    -----
    Spark's CSV column pruning parses only the columns a query selects, and then cannot see
    that a row has too many fields. A filter that reads every column (always true:
    ``length(concat_ws(...)) >= 0``) keeps the full parse without caching anything.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    options = {"header": True, **(options or {})}
    if isinstance(schema, list):
        names = [n for n, _ in schema]
        struct = T.StructType([T.StructField(n, _spark_type(t)) for n, t in schema])
        df = spark.read.schema(struct).options(**options, mode=mode).csv(path)
    else:
        header = spark.read.options(**options).csv(path).columns
        names = [c.strip() for c in header]
        if len(set(names)) != len(names):
            # Positions only: with some reader options the "header" is a data row.
            first: dict[str, int] = {}
            repeated = []
            for i, n in enumerate(names):
                if n in first:
                    repeated.append(f"{first[n] + 1} and {i + 1}")
                else:
                    first[n] = i
            where = ", ".join(repeated)
            raise ConfigError(f"the CSV header of {path!r} repeats a column name (columns "
                              f"{where}; names are not shown: with some reader options the "
                              "header line is a data row)")
        types = {n: "double" for n in numeric}
        types.update(schema or {})
        unknown = [n for n in types if n not in names]
        if unknown:  # a declared name, from the config: public
            raise ConfigError(f"`input.schema` names column {unknown[0]!r}, which is not in the "
                              f"CSV header ({len(names)} columns; not shown: with some reader "
                              "options the header line is a data row)")
        struct = T.StructType([
            T.StructField(h, _spark_type(types.get(n, "string"))) for h, n in zip(header, names)])
        df = spark.read.schema(struct).options(**options, mode=mode).csv(path).toDF(*names)
    if mode.upper() in ("DROPMALFORMED", "FAILFAST"):
        every_column = F.concat_ws(",", *[F.col(f"`{n}`").cast("string") for n in names])
        df = df.where(F.length(every_column) >= 0)
    return df


def _spark_type(name: str):
    """The Spark type of a type name of ``input.schema`` (as the configuration normalised it)."""
    from pyspark.sql import types as T

    simple = {"tinyint": T.ByteType(), "smallint": T.ShortType(), "int": T.IntegerType(),
              "bigint": T.LongType(), "float": T.FloatType(), "double": T.DoubleType(),
              "string": T.StringType(), "boolean": T.BooleanType(), "date": T.DateType(),
              "timestamp": T.TimestampType()}
    if name in simple:
        return simple[name]
    if name.startswith("decimal(") and name.endswith(")"):
        precision, scale = (int(v) for v in name[len("decimal("):-1].split(","))
        return T.DecimalType(precision, scale)
    raise ValueError(f"unknown column type {name!r}")


def read_input(spark: "SparkSession", inp: InputConfig,
               privacy_unit: str | None = None) -> "DataFrame":
    """The private input with the group columns and ``column`` (as double, or kept integral or
    decimal: that type sets ``dp_quantiles``' release grid), lazily (only the
    schema is resolved: for CSV the header line, or nothing with a complete
    ``input.schema``; for Parquet the footers; for a table the catalog).

    A typed source (Parquet, table) must have a numeric ``column``. A CSV has no types: the
    configuration declares them (``input.schema``, checked by :func:`load_config` to give the
    value column a number type), and a field that does not parse as its declared type makes
    its row malformed (dropped under ``"DROPMALFORMED"``, a failure under ``"FAILFAST"``).

    Raises
    ------
    ConfigError
        If ``input.column``, a group column or the privacy-unit column is not in the input, or
        ``input.column`` is not numeric.
    """
    from pyspark.sql import types as T

    from dpq_spark.spark._compat import try_cast

    if inp.format == "table":
        df = spark.table(inp.table)
    elif inp.format == "parquet":
        df = spark.read.parquet(inp.path)
    else:
        schema = list(inp.schema) if inp.schema_complete else dict(inp.schema)
        df = read_csv(spark, inp.path, mode=inp.csv_mode, options=inp.csv_options,
                      schema=schema)
    wanted = [(inp.column, "input.column")] + [(g, "input.group_by") for g in inp.group_by]
    if privacy_unit is not None:
        wanted.append((privacy_unit, "release.privacy_unit"))
    for name, key in wanted:
        if name not in df.columns:
            if inp.format == "csv":  # never echo a CSV header: it may be a data row
                shown = (f"the CSV header has {len(df.columns)} columns (not shown: with some "
                         "reader options the header line is a data row)")
            else:
                shown = f"columns are {df.columns}"
            raise ConfigError(f"`{key}` names column {name!r}, which is not in the input; {shown}")
    kind = df.schema[inp.column].dataType
    if not isinstance(kind, T.NumericType):
        raise ConfigError(f"`input.column` {inp.column!r} has type {kind.simpleString()} in the "
                          "input; the release needs a numeric column (cast it in a view or "
                          "table first)")
    unit = [privacy_unit] if privacy_unit is not None else []
    if isinstance(kind, (T.IntegralType, T.DecimalType)):  # its type sets the release grid
        return df.select(*inp.group_by, *unit, inp.column)
    return df.select(*inp.group_by, *unit, try_cast(inp.column, "double").alias(inp.column))


def read_keys(spark: "SparkSession", groups: GroupsConfig | None, data: "DataFrame",
              group_by: tuple[str, ...]) -> "DataFrame | list | None":
    """The public group keys, typed exactly as the input's group columns, never cast.

    Keys from the config (``groups.keys``) are checked value by value against the group
    columns' Spark types, as ``dp_quantiles`` checks a list. Keys from a CSV file are text:
    each is parsed exactly into its column's type (an integer from its digits, never through
    a float). Keys from a typed source (a Parquet file, a table) must have the group columns'
    types. A key that does not fit is a :class:`ConfigError` naming ``groups`` and the column,
    raised before any budget is reserved; so is an empty key set. The keys are public, so the
    job may look at them (and collects those of a CSV file).

    Returns
    -------
    list of tuple or DataFrame or None
        A list of keys (config, CSV file) or a DataFrame of keys (typed source), for
        ``dp_quantiles(groups=...)``.
    """
    if groups is None:
        return None
    fields = {f.name: f for f in data.schema.fields}
    if groups.keys is not None:
        return _checked_keys([tuple(k) for k in groups.keys], group_by, fields, "`groups.keys`")
    where = ("`groups.path` " + repr(groups.path) if groups.path is not None
             else f"`groups.table` {groups.table!r}")
    if groups.path is not None:
        reader = spark.read.option("header", True) if groups.format == "csv" else spark.read
        if groups.format == "csv":
            reader = reader.option("inferSchema", False)
        keys = reader.format(groups.format).load(groups.path)
        keys = keys.toDF(*[c.strip() for c in keys.columns])
    else:
        keys = spark.table(groups.table)
    missing = [c for c in group_by if c not in keys.columns]
    if missing:
        raise ConfigError(f"the public keys in {where} lack the group column(s) {missing}; "
                          f"their columns are {keys.columns}")
    keys = keys.select(*group_by).distinct()
    if groups.path is not None and groups.format == "csv":  # text: parse each key exactly
        rows = [tuple(_parse_key(v, c, fields[c].dataType, where) for v, c in zip(row, group_by))
                for row in keys.collect()]
        if not rows:
            raise ConfigError(f"the public keys in {where} are empty: there is nothing to release")
        return _checked_keys(rows, group_by, fields, where)
    have = {f.name: f.dataType for f in keys.schema.fields}
    wrong = [c for c in group_by if have[c] != fields[c].dataType]
    if wrong:
        c = wrong[0]
        raise ConfigError(f"`groups`: the public keys in {where} have column {c!r} of type "
                          f"{have[c].simpleString()}, but the input's {c!r} is "
                          f"{fields[c].dataType.simpleString()}; keys are never cast (give "
                          "them the column's type)")
    if not keys.take(1):
        raise ConfigError(f"the public keys in {where} are empty: there is nothing to release")
    return keys


_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")


def _parse_key(text, column: str, dtype, where: str):
    """One key read as text from a key file, parsed exactly into ``dtype`` (None stays a null
    key)."""
    from pyspark.sql import types as T

    if text is None:
        return None
    value = text.strip()

    def refuse(need: str):
        return ConfigError(f"`groups`: key {text!r} in {where} does not fit the group column "
                           f"{column!r} ({dtype.simpleString()}): {need}; keys are never cast")

    if isinstance(dtype, T.StringType):
        return text
    if isinstance(dtype, T.IntegralType):
        if not _INTEGER_TEXT.fullmatch(value):
            raise refuse("it needs an integer")
        return int(value)
    if isinstance(dtype, (T.FloatType, T.DoubleType)):
        try:
            return float(value)
        except ValueError:
            raise refuse("it needs a number") from None
    if isinstance(dtype, T.DecimalType):
        try:
            return decimal.Decimal(value)
        except decimal.InvalidOperation:
            raise refuse("it needs a decimal number") from None
    if isinstance(dtype, T.BooleanType):
        if value.lower() not in ("true", "false"):
            raise refuse("it needs true or false")
        return value.lower() == "true"
    if isinstance(dtype, T.DateType):
        try:
            return datetime.date.fromisoformat(value)
        except ValueError:
            raise refuse("it needs a date as YYYY-MM-DD") from None
    raise ConfigError(f"`groups`: keys for the {dtype.simpleString()} group column {column!r} "
                      f"cannot be read from a CSV file; use a Parquet file or a table of keys")


def _checked_keys(rows: list[tuple], group_by: tuple[str, ...], fields: dict, where: str) -> list:
    """``rows`` checked as ``dp_quantiles`` checks a list of keys (no cast), as a ConfigError."""
    from dpq_spark.spark._arguments import check_groups

    try:
        check_groups(rows, group_by, fields)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"the public keys in {where}: {exc}") from None
    return rows
