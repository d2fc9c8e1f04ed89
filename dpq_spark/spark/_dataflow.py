"""The Spark transformations behind ``dp_quantiles`` (DataFrame API and built-in functions only).

Each function takes and returns a lazy DataFrame; none of them runs a job. Nothing here chooses
a path from the data: every branch depends only on public arguments.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from dpq_spark.spark._release import (
    BUCKET_BITS,
    BUCKET_CAP,
    BUCKET_EMAX,
    BUCKET_EMIN,
    BUCKET_FLOOR,
    BUCKET_OFFSET,
    CELL,
    CODE,
    COUNT,
    GID,
    UNITS,
)

__all__ = ["VALUE", "UNIT", "key_frame", "clean_rows", "attach_key_index", "bound_contributions",
           "cell_column", "bucket_column", "value_cell", "cell_counts", "partitioned_cells", "partitioned_codes"]

VALUE = "__dpq_value"
UNIT = "__dpq_unit"
_RAND = "__dpq_rand"
_GROUP_RANK = "__dpq_group_rank"
_ROW_RANK = "__dpq_row_rank"


def key_frame(keys: tuple[str, ...], groups: DataFrame) -> DataFrame:
    """The distinct public keys of a ``groups`` DataFrame (its key columns were checked to have
    the key types of the data, so no cast is needed)."""
    return groups.select(*[F.col(k) for k in keys]).distinct()


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

    Groups are ranked per unit by ``xxhash64(group_seed, unit, key...)``, a pseudo-random order
    keyed by a secret seed; rows by ``rand(row_seed)``. Both choices depend only on the unit's
    own rows and the seeds, so adding or removing one unit leaves the other units' kept rows
    identically distributed. Adds ``UNITS`` = 1 on exactly one kept row per (unit, group).
    """
    rows = rows.withColumn(_RAND, F.rand(row_seed))
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
    resolution``; ``upper`` itself falls in the last cell. Built-in functions only.
    """
    width = (upper - lower) / resolution
    clamped = F.least(F.greatest(F.col(VALUE), F.lit(lower)), F.lit(upper))
    cell = F.least(F.floor((clamped - F.lit(lower)) / F.lit(width)), F.lit(resolution - 1))
    return F.greatest(cell, F.lit(0)).cast("int")


def bucket_column():
    """The value's index in the public log-scale bucket grid (bounds-free path), as a long.

    Same map as :func:`dpq_spark.spark._release.bucket_index`: ``|x|`` clamped to
    ``BUCKET_CAP``; below ``BUCKET_FLOOR`` the zero bucket ``BUCKET_OFFSET``; else ``e =
    floor(log2|x|)``, corrected by one where ``log2`` rounded across a power of two (``pow(2,
    e)`` is exact, so the corrected ``e`` has ``2**e <= |x| < 2**(e+1)``), the mantissa bucket
    ``floor((|x| / 2**e - 1) * 2**20)`` (exact: division by a power of two), and the sign. It
    reads one value and public constants only (a per-record map), and it is monotone in x.
    """
    x = F.col(VALUE)
    a = F.least(F.abs(x), F.lit(BUCKET_CAP))
    e0 = F.floor(F.log2(F.greatest(a, F.lit(BUCKET_FLOOR))))
    two = F.lit(2.0)
    e1 = (F.when(a < F.pow(two, e0), e0 - 1)
          .when(a >= F.pow(two, e0 + 1), e0 + 1)
          .otherwise(e0))
    e = F.least(F.greatest(e1, F.lit(BUCKET_EMIN)), F.lit(BUCKET_EMAX))
    scale = float(1 << BUCKET_BITS)
    b = F.floor((a / F.pow(two, e) - F.lit(1.0)) * F.lit(scale))
    b = F.least(F.greatest(b, F.lit(0)), F.lit((1 << BUCKET_BITS) - 1))
    mag = (e - F.lit(BUCKET_EMIN)).cast("long") * F.lit(1 << BUCKET_BITS) + b.cast("long") + F.lit(1)
    mag = F.when(a >= F.lit(BUCKET_FLOOR), mag).otherwise(F.lit(0).cast("long"))
    sign = F.signum(x).cast("long")
    return (F.lit(BUCKET_OFFSET).cast("long") + sign * mag).cast("long")


def value_cell(lower, upper, resolution: int):
    """The cell of the value: a cell of ``[lower, upper]``, or with ``lower = upper = None`` a
    bucket of the public log-scale grid."""
    if lower is None:
        return bucket_column()
    return cell_column(lower, upper, resolution)


def cell_counts(rows: DataFrame, lower, upper, resolution: int) -> DataFrame:
    """Rows per cell (ungrouped path): at most ``resolution`` rows, partial-aggregated
    before the shuffle."""
    return rows.groupBy(value_cell(lower, upper, resolution).alias(CELL)).agg(F.count(F.lit(1)).alias(COUNT))


def partitioned_cells(rows: DataFrame, keys: tuple[str, ...], lower, upper,
                      resolution: int, extra: list) -> DataFrame:
    """Grouped path with keys from the data: one row per kept data row with its key and cell,
    hash partitioned by key (one shuffle) so that every group is whole in one partition."""
    cols = [F.col(k) for k in keys] + [value_cell(lower, upper, resolution).alias(CELL)] + extra
    return rows.select(*cols).repartition(*keys)


def partitioned_codes(rows: DataFrame, lower, upper, resolution: int) -> DataFrame:
    """Grouped path with public keys: one int64 ``CODE = GID * resolution + cell`` per kept row,
    hash partitioned by ``GID`` (one shuffle); only ``CODE`` travels to Python."""
    code = F.col(GID).cast("long") * F.lit(resolution) + value_cell(lower, upper, resolution)
    return rows.select(F.col(GID), code.alias(CODE)).repartition(GID).select(CODE)
