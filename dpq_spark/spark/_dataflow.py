"""The Spark transformations behind ``dp_quantiles`` (DataFrame API and built-in functions only).

Each function takes and returns a lazy DataFrame; none of them runs a job. Nothing here chooses
a path from the data: every branch depends only on public arguments.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dpq_spark.core._coarse_bands import COARSE_CELLS, COARSE_SHIFT, FINE_SIZE, fine_step
from dpq_spark.spark._release import CELL, COUNT, FINE, GID, UNITS

__all__ = ["VALUE", "UNIT", "clean_rows", "attach_key_index", "bound_contributions",
           "cell_column", "fine_column", "coarse_column", "with_cells", "coarse_counts",
           "fine_counts"]

VALUE = "__dpq_value"
UNIT = "__dpq_unit"
_RAND = "__dpq_rand"
_GROUP_RANK = "__dpq_group_rank"
_ROW_RANK = "__dpq_row_rank"


def clean_rows(req) -> DataFrame:
    """Keys, privacy unit and the value as double; rows with a null or NaN value (or a null
    privacy unit) are dropped, each on its own, which keeps the step stable for DP."""
    value = F.col(req.column).cast("double")
    cols = [F.col(k) for k in req.keys] + [value.alias(VALUE)]
    if req.privacy_unit is not None:
        cols.append(F.col(req.privacy_unit).alias(UNIT))
    rows = req.df.select(*cols)
    keep = F.col(VALUE).isNotNull() & ~F.isnan(F.col(VALUE))
    if req.privacy_unit is not None:
        keep = keep & F.col(UNIT).isNotNull()
    return rows.where(keep)


def attach_key_index(rows: DataFrame, keys: tuple[str, ...], index_df: DataFrame,
                     broadcast: bool, null_safe: bool) -> DataFrame:
    """Inner join with the public key list: drops rows of unlisted keys and adds ``GID``, the
    key's index in the driver's list. ``null_safe`` (when a listed key holds a null) makes a
    listed null match null; otherwise the plain equi-join is used, which is cheaper."""
    renamed = index_df.select(*[F.col(k).alias(f"__dpq_k{i}") for i, k in enumerate(keys)],
                              F.col(GID))
    if broadcast:
        renamed = F.broadcast(renamed)
    pairs = [(F.col(k), F.col(f"__dpq_k{i}")) for i, k in enumerate(keys)]
    cond = reduce(lambda a, b: a & b,
                  [left.eqNullSafe(right) if null_safe else left == right for left, right in pairs])
    joined = rows.join(renamed, on=cond, how="inner")
    return joined.drop(*[f"__dpq_k{i}" for i in range(len(keys))])


def bound_contributions(rows: DataFrame, keys: tuple[str, ...], max_rows: int, max_groups: int,
                        row_seed: int, group_seed: int) -> DataFrame:
    """Keep at most ``max_groups`` groups per unit and ``max_rows`` rows per (unit, group).

    Groups are ranked per unit by ``xxhash64(group_seed, unit, key...)``, rows by
    ``xxhash64(row_seed, unit, key..., value)``: pseudo-random orders keyed by secret seeds.
    Both choices depend only on the unit's own rows and the seeds, so adding or removing one
    unit leaves the other units' kept rows identically distributed. The row order is a function
    of the row, not of its position, so the two passes over the data keep the same rows (rows
    that tie are identical in key and value, so which of them is kept changes nothing). Adds
    ``UNITS`` = 1 on exactly one kept row per (unit, group).
    """
    rows = rows.withColumn(_RAND, F.xxhash64(F.lit(row_seed), F.col(UNIT), *[F.col(k) for k in keys],
                                             F.col(VALUE)))
    per_group = Window.partitionBy(UNIT, *keys).orderBy(_RAND)
    rows = rows.withColumn(_ROW_RANK, F.row_number().over(per_group))
    keep = F.col(_ROW_RANK) <= max_rows
    if keys:
        ghash = F.xxhash64(F.lit(group_seed), F.col(UNIT), *[F.col(k) for k in keys])
        per_unit = Window.partitionBy(UNIT).orderBy(ghash, *keys)
        rows = rows.withColumn(_GROUP_RANK, F.dense_rank().over(per_unit))
        keep = keep & (F.col(_GROUP_RANK) <= max_groups)
    first = F.when(F.col(_ROW_RANK) == 1, F.lit(1)).otherwise(F.lit(0))
    return rows.where(keep).withColumn(UNITS, first).drop(_RAND, _ROW_RANK, _GROUP_RANK)


def cell_column(lower: float, upper: float, resolution: int):
    """The grid cell of the value: clamp to ``[lower, upper]``, then ``floor((x - lower) / w)``.

    Cell ``k`` covers ``[lower + k w, lower + (k + 1) w)`` with ``w = (upper - lower) /
    resolution``; ``upper`` itself falls in the last cell. Used only for mechanisms other than
    JointExp. Built-in functions only.
    """
    width = (upper - lower) / resolution
    clamped = F.least(F.greatest(F.col(VALUE), F.lit(lower)), F.lit(upper))
    cell = F.least(F.floor((clamped - F.lit(lower)) / F.lit(width)), F.lit(resolution - 1))
    return F.greatest(cell, F.lit(0)).cast("long")


def fine_column(lower: float, upper: float):
    """The fine grid index ``clip(floor((clip(x) - lower) / g + 0.5), 0, 2**32)`` as a long.

    The same float64 operations as :func:`dpq_spark.core._coarse_bands.fine_index`, so Spark
    and numpy agree bit for bit.
    """
    g = fine_step(lower, upper)
    clamped = F.least(F.greatest(F.col(VALUE), F.lit(lower)), F.lit(upper))
    k = F.floor((clamped - F.lit(lower)) / F.lit(g) + F.lit(0.5))
    return F.least(F.greatest(k, F.lit(0)), F.lit(FINE_SIZE)).cast("long")


def coarse_column(fine):
    """The coarse cell ``min(k >> 12, 2**20 - 1)`` of a fine index column."""
    return F.least(F.shiftright(fine, COARSE_SHIFT), F.lit(COARSE_CELLS - 1)).cast("long")


def with_cells(rows: DataFrame, lower: float, upper: float, fine: bool,
               resolution: int) -> DataFrame:
    """Add ``FINE`` and ``CELL`` (the coarse cell) for JointExp, or only ``CELL`` (a cell of the
    ``resolution`` grid) for the other mechanisms."""
    if fine:
        rows = rows.withColumn(FINE, fine_column(lower, upper))
        return rows.withColumn(CELL, coarse_column(F.col(FINE)))
    return rows.withColumn(CELL, cell_column(lower, upper, resolution))


def coarse_counts(rows: DataFrame, group_cols: list[str], units: bool) -> DataFrame:
    """Pass 1: rows (and privacy units first seen) per (group, cell), partial-aggregated before
    the shuffle: at most one row per distinct (group, cell)."""
    aggs = [F.count(F.lit(1)).alias(COUNT)]
    if units:
        aggs.append(F.sum(F.col(UNITS)).cast("long").alias(UNITS))
    return rows.groupBy(*[F.col(c) for c in group_cols], F.col(CELL)).agg(*aggs)


def fine_counts(rows: DataFrame, reach: DataFrame, group_cols: list[str], broadcast: bool,
                null_safe: bool) -> DataFrame:
    """Pass 2: ``(GID, FINE, COUNT)`` for the rows whose (group, coarse cell) is in ``reach``.

    ``reach`` holds ``group_cols``, ``CELL`` and ``GID``; the join keeps only reachable rows and
    the aggregation is partial before the shuffle, so at most 4,096 rows per reachable cell
    leave Spark.
    """
    renamed = reach.select(*[F.col(c).alias(f"__dpq_r{i}") for i, c in enumerate(group_cols)],
                           F.col(CELL).alias("__dpq_rcell"), F.col(GID).alias("__dpq_rgid"))
    if broadcast:
        renamed = F.broadcast(renamed)
    conds = [F.col(CELL) == F.col("__dpq_rcell")]
    for i, c in enumerate(group_cols):
        left, right = F.col(c), F.col(f"__dpq_r{i}")
        conds.append(left.eqNullSafe(right) if null_safe else left == right)
    joined = rows.join(renamed, on=reduce(lambda a, b: a & b, conds), how="inner")
    return (joined.groupBy(F.col("__dpq_rgid").alias(GID), F.col(FINE))
            .agg(F.count(F.lit(1)).alias(COUNT)))
