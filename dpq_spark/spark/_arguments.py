"""Validation of every argument of ``dp_quantiles``, before any Spark job runs.

Reading ``df.schema`` resolves the plan (an analysis request on Spark Connect) but runs no job.
Messages name the argument and echo only public values (names, types, parameters).

The release grid (:func:`release_grid`) is chosen here from the column's Spark type, the bounds
and ``granularity``: public schema and arguments, never the values.
"""

from __future__ import annotations

import datetime
import decimal
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.core._validation import (
    check_bounds,
    check_delta,
    check_epsilon,
    check_granularity,
    check_positive_int,
    check_quantiles,
)
from dpq_spark.core.accounting.neighboring import NeighboringRelation
from dpq_spark.core.randomness.grid import Grid
from dpq_spark.spark._compat import arrow_type, is_collated, is_dataframe
from dpq_spark.spark._mechanisms import get_mechanism
from dpq_spark.spark._buckets import BUCKETS

__all__ = ["QuantileRequest", "parse_request", "MAX_RESOLUTION", "MAX_DECLARED_STEPS",
           "schema_granularity", "release_grid"]

MAX_RESOLUTION = 2**30
#: A declared grid (``granularity``) may have at most this many steps between the bounds: the
#: Spark path packs a grid index into 33 bits of a code (``_dataflow.CODE_SPAN``).
MAX_DECLARED_STEPS = 2**32
DEFAULT_RESOLUTION = 2**20
_OUTPUT_COLUMNS = ("quantile", "value", "mechanism")
LAYOUTS = ("long", "wide")
_RESERVED_PREFIX = "__dpq_"


@dataclass(frozen=True)
class QuantileRequest:
    """All arguments of ``dp_quantiles``, validated and normalised."""

    df: DataFrame
    column: str
    quantiles: tuple[float, ...]
    epsilon: float
    lower: float | None  # None (both): the bounds-free path
    upper: float | None
    keys: tuple[str, ...]
    groups: object  # None, a DataFrame of keys, or a pyarrow.Table of the listed keys
    neighboring: NeighboringRelation
    privacy_unit: str | None
    max_rows_per_unit: int
    max_groups_per_unit: int
    delta: float | None
    resolution: int
    mechanism: str
    selection_fraction: float
    rng: np.random.Generator
    seeded: bool
    bounds_share: float | None = None  # bounds-free path only; None: the core's default
    layout: str = "long"  # "long": a row per group and quantile; "wide": a row per group
    # The declared grid step (release_grid): None is the default grid of 2**32 steps. With
    # bounds, ``lower``/``upper`` above are then the grid's own bounds.
    granularity: float | None = None

    @property
    def bounds_free(self) -> bool:
        return self.lower is None

    @property
    def selects_partitions(self) -> bool:
        return self.delta is not None


def _check_column_name(name, argument: str, fields: dict) -> str:
    if not isinstance(name, str):
        raise TypeError(f"`{argument}` must be a column name (str), got {type(name).__name__}")
    if name not in fields:
        raise ValueError(f"`{argument}` names a column that is not in the DataFrame: {name!r}")
    if name.startswith(_RESERVED_PREFIX):
        raise ValueError(f"`{argument}`: column names starting with {_RESERVED_PREFIX!r} are reserved")
    return name


def _check_group_by(group_by, fields: dict) -> tuple[str, ...]:
    if group_by is None:
        return ()
    names = [group_by] if isinstance(group_by, str) else group_by
    try:
        names = list(names)
    except TypeError:
        raise TypeError(
            f"`group_by` must be a column name or a list of names, got {type(group_by).__name__}"
        ) from None
    if not names:
        raise ValueError("`group_by` must name at least one column (or be None)")
    for name in names:
        _check_column_name(name, "group_by", fields)
        if name in _OUTPUT_COLUMNS:
            raise ValueError(
                f"`group_by` column {name!r} clashes with an output column; rename it first"
            )
    if len(set(names)) != len(names):
        raise ValueError(f"`group_by` must not repeat a column, got {names!r}")
    return tuple(names)


def check_groups(groups, keys: tuple[str, ...], fields: dict):
    """Return None, a DataFrame of keys, or a ``pyarrow.Table`` of the distinct listed keys.

    Runs no Spark job. A ``groups`` DataFrame must hold the ``group_by`` columns with the same
    Spark types (read from its schema). A list is checked value by value against the key
    columns' types without any cast (an int is accepted for a float or double column when it
    converts exactly, and for a decimal column); duplicate keys are dropped (first one kept),
    with ``-0.0`` and ``0.0`` one key and every NaN one key, as Spark groups them.
    """
    if groups is None:
        return None
    if not keys:
        raise ValueError("`groups` lists group keys, so it needs `group_by`")
    if is_dataframe(groups):
        have = {f.name: f.dataType for f in groups.schema.fields}
        missing = [k for k in keys if k not in have]
        if missing:
            raise ValueError(f"`groups` DataFrame lacks the `group_by` column(s) {missing!r}")
        wrong = {k: have[k].simpleString() for k in keys if have[k] != fields[k].dataType}
        if wrong:
            want = {k: fields[k].dataType.simpleString() for k in wrong}
            raise TypeError(
                f"`groups` DataFrame columns must have the types of the `group_by` columns "
                f"{want}, got {wrong}; cast them explicitly first"
            )
        return groups
    if isinstance(groups, Mapping):
        raise TypeError("`groups` must be a list of keys or a DataFrame of keys, got a dict")
    if isinstance(groups, (set, frozenset)):
        raise TypeError("`groups` must be a list of keys or a DataFrame of keys, got a set "
                        "(unordered); pass a list")
    if isinstance(groups, (str, bytes)) or not hasattr(groups, "__iter__"):
        raise TypeError(
            f"`groups` must be a list of keys or a DataFrame of keys, got {type(groups).__name__}"
        )
    types = [fields[k].dataType for k in keys]
    if len(keys) == 1:
        table = _plain_keys(groups, keys[0], types[0])
        if table is not None:
            return table
    columns: list[list] = [[] for _ in keys]
    seen = set()
    for key in groups:
        if len(keys) == 1 and not isinstance(key, (tuple, list)):
            key = (key,)
        if not isinstance(key, (tuple, list)) or len(key) != len(keys):
            raise ValueError(
                f"`groups` entries must be tuples of {len(keys)} values (one per `group_by` "
                f"column {list(keys)!r}), got {key!r}"
            )
        values = tuple(_key_value(v, name, dtype) for v, name, dtype in zip(key, keys, types))
        marker = tuple(("nan",) if isinstance(v, float) and v != v else v for v in values)
        if marker in seen:
            continue
        seen.add(marker)
        for column, value in zip(columns, values):
            column.append(value)
    if not columns[0]:
        raise ValueError("`groups` is empty: list at least one key (a release over no groups "
                         "would answer nothing)")
    arrays = []
    for name, dtype, column in zip(keys, types, columns):
        try:
            arrays.append(pa.array(column, type=arrow_type(dtype)))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
            raise ValueError(f"`groups` values for `group_by` column {name!r} do not fit its "
                             f"type {dtype.simpleString()}") from None
    return pa.table(dict(zip(keys, arrays)))


def _plain_keys(groups, name: str, dtype):
    """:func:`check_groups` for the common case, without a Python step per key: one key
    column, integral with every key a plain ``int`` or string with every key a ``str``. Returns
    the table of distinct keys (first occurrence kept, in order) or None when the case does not
    apply (the general path then checks, and names, whatever is wrong)."""
    if not isinstance(groups, (list, tuple, range)) or not groups:
        return None  # (an iterator is read once, by the general path; it names an empty list)
    if isinstance(dtype, T.StringType):
        if is_collated(dtype):
            return None
        plain, arrow = str, pa.string()
    elif isinstance(dtype, T.IntegralType):
        plain, arrow = int, arrow_type(dtype)
    else:
        return None
    if not all(type(v) is plain for v in groups):
        return None
    if plain is int:
        values = np.asarray(groups)
        if values.dtype.kind != "i":  # beyond int64: the general path names the column
            return None
        bits = _INTEGRAL_BITS[type(dtype)]
        if values.min() < -(1 << (bits - 1)) or values.max() >= (1 << (bits - 1)):
            return None
        column = pa.array(values, type=arrow)
    else:
        column = pa.array(groups, type=arrow)
    return pa.table({name: pc.unique(column)})


_KEY_TYPES = (  # Spark type -> the Python types a listed key of it may have (checked in order)
    (T.BooleanType, (bool,)),
    (T.IntegralType, (int,)),
    (T.StringType, (str,)),
    (T.BinaryType, (bytes, bytearray)),
    (T.DecimalType, (decimal.Decimal, int)),
    (T.TimestampNTZType, (datetime.datetime,)),
    (T.TimestampType, (datetime.datetime,)),
    (T.DateType, (datetime.date,)),
)
_INTEGRAL_BITS = {T.ByteType: 8, T.ShortType: 16, T.IntegerType: 32, T.LongType: 64}


def _key_value(value, name: str, dtype):
    """One listed key value checked against its column's Spark type, without any cast."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None:
        return None
    kind = dtype.simpleString()
    if isinstance(dtype, (T.FloatType, T.DoubleType)):
        if isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool)
                                        and float(value) == value):
            v = float(value)
            return 0.0 if v == 0.0 else v  # -0.0 and 0.0 are one Spark key
        raise TypeError(f"`groups` values must match the types of the `group_by` columns: "
                        f"{name!r} is {kind} and needs float, got {type(value).__name__}")
    for spark_type, python_types in _KEY_TYPES:
        if not isinstance(dtype, spark_type):
            continue
        ok = isinstance(value, python_types) and not (
            isinstance(value, bool) and spark_type is not T.BooleanType)
        if spark_type is T.DateType and isinstance(value, datetime.datetime):
            ok = False
        if not ok:
            need = " or ".join(t.__name__ for t in python_types)
            raise TypeError(f"`groups` values must match the types of the `group_by` columns: "
                            f"{name!r} is {kind} and needs {need}, got {type(value).__name__}")
        if spark_type is T.TimestampType and value.tzinfo is None:
            raise TypeError(f"`groups` values for the timestamp column {name!r} must be "
                            f"timezone-aware datetimes (a naive one is ambiguous)")
        if spark_type is T.TimestampNTZType and value.tzinfo is not None:
            raise TypeError(f"`groups` values for the timestamp_ntz column {name!r} must be "
                            f"naive datetimes")
        bits = _INTEGRAL_BITS.get(type(dtype))
        if bits is not None and not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
            raise ValueError(f"`groups` value for `group_by` column {name!r} is out of the "
                             f"range of {kind}")
        return bytes(value) if isinstance(value, bytearray) else value
    raise TypeError(f"`groups` as a list is not supported for the {kind} `group_by` column "
                    f"{name!r}; pass a DataFrame of keys instead")


def schema_granularity(dtype) -> Fraction | None:
    """The grid step a column's Spark type declares, exactly: 1 for byte/short/int/long,
    ``10**-s`` for ``decimal(p, s)``, None for float/double (no declared step)."""
    if isinstance(dtype, T.IntegralType):
        return Fraction(1)
    if isinstance(dtype, T.DecimalType):
        return Fraction(1, 10**dtype.scale) if dtype.scale >= 0 else Fraction(10**-dtype.scale)
    return None


def release_grid(dtype, lower, upper, granularity):
    """The release grid: ``(lower, upper, granularity)``, from public schema and arguments only.

    ``granularity`` given (already validated, a float): the grid ``lower + k granularity`` of
    :class:`~dpq_spark.core.randomness.grid.Grid`, as the core builds it, with at most
    ``MAX_DECLARED_STEPS`` steps (else a ValueError naming ``granularity``). Not given: the
    column type's step ``g`` (:func:`schema_granularity`) on the multiples of ``g`` inside
    ``[lower, upper]`` (the bounds moved inwards onto them, which clamps values of the type the
    same way), when there are at least two such multiples and at most ``MAX_DECLARED_STEPS``
    steps; otherwise, and for float/double columns, the default grid (``granularity`` None).
    Without bounds only a given ``granularity`` is returned (with ``None`` bounds, which are
    then released privately): the type's step is not used there, because private bounds may
    span more than the 2**52 steps of it a grid can have."""
    if granularity is not None:
        if lower is None:
            return None, None, granularity
        steps = Grid(lower, upper, granularity).steps  # the core's rule (<= 2**52), named
        if steps > MAX_DECLARED_STEPS:
            raise ValueError(f"`granularity` must give at most 2**32 steps between `lower` and "
                             f"`upper` on Spark, got {granularity!r} on [{lower!r}, {upper!r}]")
        return lower, upper, granularity
    step = schema_granularity(dtype)
    if step is None:
        return lower, upper, None
    if lower is None:
        return None, None, None
    lo = math.ceil(Fraction(lower) / step) * step
    hi = math.floor(Fraction(upper) / step) * step
    if lo >= hi or (hi - lo) / step > MAX_DECLARED_STEPS:
        return lower, upper, None
    return float(lo), float(hi), float(step)


def parse_request(
    df,
    column,
    *,
    quantiles,
    epsilon,
    lower,
    upper,
    group_by,
    groups,
    neighboring,
    privacy_unit,
    max_rows_per_unit,
    max_groups_per_unit,
    delta,
    resolution,
    mechanism,
    selection_fraction,
    rng,
    bounds_share=None,
    layout="long",
    granularity=None,
) -> QuantileRequest:
    """Validate the arguments of ``dp_quantiles``; see its docstring for the rules."""
    if not is_dataframe(df):
        raise TypeError(f"`df` must be a pyspark.sql.DataFrame, got {type(df).__name__}")
    q = check_quantiles(quantiles)
    eps = check_epsilon(epsilon)
    if (lower is None) != (upper is None):
        raise ValueError(
            "`lower` and `upper` must both be given or both be None (None: bounds are released "
            f"privately), got lower={lower!r}, upper={upper!r}"
        )
    if granularity is not None:
        granularity = check_granularity(granularity)
    if lower is None:
        lo = hi = None
        if resolution is not None:
            raise ValueError("`resolution` applies only with `lower` and `upper`; without bounds "
                             "values are mapped to a fixed public log-scale grid")
        res = BUCKETS
        share = None
        if bounds_share is not None:
            if not isinstance(bounds_share, numbers.Real) or isinstance(bounds_share, bool) \
                    or not 0.0 < float(bounds_share) < 1.0:
                raise ValueError(f"`bounds_share` must be in (0, 1), got {bounds_share!r}")
            share = float(bounds_share)
    else:
        lo, hi = check_bounds(lower, upper)
        if granularity is not None:
            Grid(lo, hi, granularity)  # the core's rule: at most 2**52 steps (named)
        if bounds_share is not None:
            raise ValueError("`bounds_share` applies only without bounds (`lower` = `upper` = "
                             "None); with public bounds the whole epsilon goes to the quantiles")
        share = None
        res = check_positive_int(DEFAULT_RESOLUTION if resolution is None else resolution,
                                 "resolution", minimum=1)
        if res > MAX_RESOLUTION:
            raise ValueError(f"`resolution` must be <= 2**30, got {resolution!r}")
    relation = NeighboringRelation.parse(neighboring)
    get_mechanism(mechanism)
    rows_cap = check_positive_int(max_rows_per_unit, "max_rows_per_unit")
    groups_cap = check_positive_int(max_groups_per_unit, "max_groups_per_unit")
    if not isinstance(selection_fraction, numbers.Real) or isinstance(selection_fraction, bool) \
            or not 0.0 < float(selection_fraction) < 1.0:
        raise ValueError(f"`selection_fraction` must be in (0, 1), got {selection_fraction!r}")
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"`layout` must be 'long' or 'wide', got {layout!r}")
    generator = resolve_rng(rng)

    fields = {f.name: f for f in df.schema.fields}
    column = _check_column_name(column, "column", fields)
    if not isinstance(fields[column].dataType, T.NumericType):
        raise TypeError(
            f"`column` {column!r} must be numeric, got {fields[column].dataType.simpleString()}"
        )
    lo, hi, step = release_grid(fields[column].dataType, lo, hi, granularity)
    keys = _check_group_by(group_by, fields)
    key_list = check_groups(groups, keys, fields)
    if privacy_unit is not None:
        _check_column_name(privacy_unit, "privacy_unit", fields)
    else:
        if rows_cap != 1:
            raise ValueError("`max_rows_per_unit` applies only with `privacy_unit`; one row is the unit without it")
        if groups_cap != 1:
            raise ValueError("`max_groups_per_unit` applies only with `privacy_unit`; one row is the unit without it")
    if groups_cap != 1 and not keys:
        raise ValueError("`max_groups_per_unit` applies only with `group_by`")
    if relation is NeighboringRelation.SWAP and (keys or privacy_unit is not None):
        raise ValueError(
            "`neighboring='swap'` is supported only without `group_by` and `privacy_unit`: a "
            "swapped row can change its group, and a unit's row count is not public; use "
            "'add_remove'"
        )
    if delta is not None:
        d = check_delta(delta)
        if not keys or key_list is not None:
            raise ValueError(
                "`delta` is only used for DP partition selection, i.e. with `group_by` and "
                "without `groups`"
            )
    else:
        d = None
        if keys and key_list is None:
            raise ValueError(
                "`group_by` needs public keys: pass `groups` (a list of keys or a DataFrame of "
                "keys chosen without looking at the data). Keys read from the data would reveal "
                "who is in it; to select them privately instead, pass `delta` for DP partition "
                "selection"
            )
    return QuantileRequest(
        df=df,
        column=column,
        quantiles=tuple(float(v) for v in q),
        epsilon=eps,
        lower=lo,
        upper=hi,
        keys=keys,
        groups=key_list,
        neighboring=relation,
        privacy_unit=privacy_unit,
        max_rows_per_unit=rows_cap,
        max_groups_per_unit=groups_cap,
        delta=d,
        resolution=res,
        mechanism=mechanism,
        selection_fraction=float(selection_fraction),
        rng=generator,
        seeded=rng is not None,
        bounds_share=share,
        layout=layout,
        granularity=step,
    )
