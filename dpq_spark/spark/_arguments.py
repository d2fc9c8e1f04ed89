"""Validation of every argument of ``dp_quantiles``, before any Spark job runs.

Reading ``df.schema`` resolves the plan (an analysis request on Spark Connect) but runs no job.
Messages name the argument and echo only public values (names, types, parameters).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from dpq_spark.core._random import resolve_rng
from dpq_spark.core._validation import (
    check_bounds,
    check_delta,
    check_epsilon,
    check_positive_int,
    check_quantiles,
)
from dpq_spark.core.privacy import NeighboringRelation
from dpq_spark.spark._compat import is_dataframe
from dpq_spark.spark._mechanisms import get_mechanism
from dpq_spark.spark._release import BUCKETS

__all__ = ["QuantileRequest", "parse_request", "MAX_RESOLUTION"]

MAX_RESOLUTION = 2**30
DEFAULT_RESOLUTION = 2**20
_OUTPUT_COLUMNS = ("quantile", "value")
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
    groups: object  # None, a DataFrame of keys, or a list of key tuples
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


def _check_groups(groups, keys: tuple[str, ...]):
    """Return None, a DataFrame of keys, or a deduplicated list of key tuples."""
    if groups is None:
        return None
    if not keys:
        raise ValueError("`groups` lists group keys, so it needs `group_by`")
    if is_dataframe(groups):
        have = set(groups.columns)
        missing = [k for k in keys if k not in have]
        if missing:
            raise ValueError(f"`groups` DataFrame lacks the `group_by` column(s) {missing!r}")
        return groups
    if isinstance(groups, (str, bytes)) or not hasattr(groups, "__iter__"):
        raise TypeError(
            f"`groups` must be a list of keys or a DataFrame of keys, got {type(groups).__name__}"
        )
    rows = []
    for key in groups:
        if len(keys) == 1 and not isinstance(key, (tuple, list)):
            key = (key,)
        if not isinstance(key, (tuple, list)) or len(key) != len(keys):
            raise ValueError(
                f"`groups` entries must be tuples of {len(keys)} values (one per `group_by` "
                f"column {list(keys)!r}), got {key!r}"
            )
        rows.append(tuple(k.item() if isinstance(k, np.generic) else k for k in key))
    try:
        return list(dict.fromkeys(rows))
    except TypeError:
        raise TypeError("`groups` entries must be hashable values (numbers, strings, dates, None)") from None


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
    generator = resolve_rng(rng)

    fields = {f.name: f for f in df.schema.fields}
    column = _check_column_name(column, "column", fields)
    if not isinstance(fields[column].dataType, T.NumericType):
        raise TypeError(
            f"`column` {column!r} must be numeric, got {fields[column].dataType.simpleString()}"
        )
    keys = _check_group_by(group_by, fields)
    key_list = _check_groups(groups, keys)
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
    )
