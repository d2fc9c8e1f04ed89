"""The Spark transformations behind ``dp_quantiles`` (DataFrame API and built-in functions only).

Each function takes and returns a lazy DataFrame; none of them runs a job. Nothing here chooses
a path from the data: every branch depends only on public arguments.
"""

from __future__ import annotations

import functools
from functools import reduce

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dpq_spark.core.randomness.grid import Grid
from dpq_spark.spark._compat import create_dataframe
from dpq_spark.spark._buckets import (
    BUCKET_BITS,
    BUCKET_CAP,
    BUCKET_EMIN,
    BUCKET_FLOOR,
    BUCKET_OFFSET,
)
from dpq_spark.spark._columns import BUCKET, CELL, CODE, CODES, COUNT, COUNTS, GID, UNITS
from dpq_spark.spark._packing import pack_partition

CODE_SPAN = 1 << 33  # public-key codes: GID * 2**33 + grid index (k <= 2**32)
MAX_PACKED_KEYS = 1 << 30
#: the public-key shuffle partitions by bucket, ``GID >> shift``: with more than 2**PACK_BUCKET_BITS
#: keys the groups go ``2**shift`` to a bucket, so that there are at most 2**PACK_BUCKET_BITS
#: buckets (and at least half as many): many small groups then travel in a few full packed rows
#: rather than a row or more each, while the buckets still far outnumber the shuffle's partitions
PACK_BUCKET_BITS = 14
ISIN_CELLS = 4096  # global pass 2 filters by isin up to this many kept cells, else a semi join

__all__ = ["VALUE", "UNIT", "key_frame", "clean_rows", "attach_key_index", "bound_contributions",
           "grid_index_column", "bucket_column", "value_cell", "cell_counts",
           "coarse_counts", "fine_counts_in", "CODE_SPAN", "MAX_PACKED_KEYS", "PACK_BUCKET_BITS",
           "bucket_shift", "partitioned_cells", "partitioned_codes"]

VALUE = "__dpq_value"
UNIT = "__dpq_unit"
_CODE_SCHEMA = T.StructType([T.StructField(CODE, T.LongType(), True)])
PACKED_SCHEMA = T.StructType([T.StructField(BUCKET, T.LongType(), False),
                              T.StructField(CODES, T.BinaryType(), False),
                              T.StructField(COUNTS, T.BinaryType(), False)])
_KEY = "__dpq_key"
_RAND = "__dpq_rand"
_KEPT = "__dpq_kept"
_COARSE = "__dpq_coarse"
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


def index_by_literals(rows: DataFrame, key: str, values: list) -> DataFrame:
    """What :func:`attach_key_index` gives for a short list of keys of one integral or
    ``UTF8_BINARY`` string column with no null: ``GID`` is the key's place in ``values`` (a
    ``CASE WHEN key = value ...`` over literals, plain equality for these types; a null key
    matches none), and rows whose key is not listed are dropped. No join: on Spark Connect the
    broadcast of the key list cost about 0.1-0.2 s of a 0.5-0.7 s release of 1e5 rows."""
    column = F.col(key)
    place = F.when(column == F.lit(values[0]), F.lit(0))
    for i, value in enumerate(values[1:], start=1):
        place = place.when(column == F.lit(value), F.lit(i))
    return rows.withColumn(GID, place.cast("long")).where(F.col(GID).isNotNull())


def bound_contributions(rows: DataFrame, keys: tuple[str, ...], max_rows: int, max_groups: int,
                        row_seed: int, group_seed: int) -> DataFrame:
    """Keep at most ``max_groups`` groups per unit and ``max_rows`` rows per (unit, group).

    Groups are ranked per unit by ``xxhash64(group_seed, unit, key...)``, a pseudo-random order
    keyed by a secret seed; rows by ``xxhash64(row_seed, unit, key..., value)`` then the value.
    Both choices depend only on the unit's own rows and the seeds, so adding or removing one
    unit leaves the other units' kept rows identically distributed. They are also
    deterministic: rows equal in (unit, key, value) are interchangeable, so every evaluation of
    the plan keeps the same multiset of values (the ungrouped path reads it twice). Adds
    ``UNITS`` = 1 on exactly one kept row per (unit, group).
    """
    rows = rows.withColumn(_RAND, F.xxhash64(F.lit(row_seed), F.col(UNIT),
                                             *[F.col(k) for k in keys], F.col(VALUE)))
    per_group = Window.partitionBy(UNIT, *keys).orderBy(_RAND, VALUE)
    rows = rows.withColumn(_ROW_RANK, F.row_number().over(per_group))
    keep = F.col(_ROW_RANK) <= max_rows
    if keys:
        ghash = F.xxhash64(F.lit(group_seed), F.col(UNIT), *[F.col(k) for k in keys])
        per_unit = Window.partitionBy(UNIT).orderBy(ghash, *keys)
        rows = rows.withColumn(_GROUP_RANK, F.dense_rank().over(per_unit))
        keep = keep & (F.col(_GROUP_RANK) <= max_groups)
    first = F.when(F.col(_ROW_RANK) == 1, F.lit(1)).otherwise(F.lit(0))
    return rows.where(keep).withColumn(UNITS, first).drop(_RAND, _ROW_RANK, _GROUP_RANK)


def grid_index_column(lower: float, upper: float, granularity: float | None = None):
    """The value's index on the grid ``Grid(lower, upper, granularity)``, as a long.

    ``clip(floor((clamp(x) - lower) / g + 0.5), 0, N)`` with the grid's float64 step ``g`` and
    its ``N`` steps (``2**32`` for the default grid, ``granularity=None``; a declared grid has
    at most ``2**32``, :func:`dpq_spark.spark._arguments.release_grid`): the same correctly
    rounded float64 operations as :meth:`dpq_spark.core.randomness.grid.Grid.snap`, so the index
    is the core's bit for bit. A per-record map of public constants. Built-in functions only.
    """
    grid = _grid(lower, upper, granularity)
    clamped = F.least(F.greatest(F.col(VALUE), F.lit(float(lower))), F.lit(float(upper)))
    k = F.floor((clamped - F.lit(float(lower))) / F.lit(grid.granularity) + F.lit(0.5))
    return F.least(F.greatest(k, F.lit(0)), F.lit(grid.steps)).cast("long")


@functools.lru_cache(maxsize=8)
def _grid(lower: float, upper: float, granularity: float | None) -> Grid:
    return Grid(lower, upper, granularity)


def bucket_column():
    """The value's index in the public log-scale bucket grid (bounds-free path), as a long.

    Same map as :func:`dpq_spark.spark._buckets.bucket_index`: ``a = |x|`` clamped to
    ``[BUCKET_FLOOR, BUCKET_CAP]``; ``e = floor(log2 a)``, corrected by one where ``log2``
    rounded across a power of two (``pow(2, e)`` is exact, so the corrected ``e`` has ``2**e <= a
    < 2**(e+1)``, within ``[BUCKET_EMIN, BUCKET_EMAX]``); the mantissa bucket ``floor((a / 2**e
    - 1) * 2**20)`` (exact: division by a power of two); the magnitude 0 where ``|x| <
    BUCKET_FLOOR``; and the sign. It reads one value and public constants only (a per-record
    map), and it is monotone in x.

    Written without conditional expressions (the corrections and the zero bucket are booleans
    cast to 0 or 1), so Spark's generated code computes ``a``, ``log2 a`` and ``2**floor(log2
    a)`` once per row: with ``when`` branches it computed them again in each, and the map
    took 1.6 s instead of 0.6 s on 1e7 rows (``local[2]``).
    """
    x = F.col(VALUE)
    a = F.least(F.greatest(F.abs(x), F.lit(BUCKET_FLOOR)), F.lit(BUCKET_CAP))
    two = F.lit(2.0)
    e0 = F.floor(F.log2(a))
    p0 = F.pow(two, e0)
    e = e0 - (a < p0).cast("long") + (a >= p0 * two).cast("long")
    scale = float(1 << BUCKET_BITS)
    b = F.floor((a / F.pow(two, e) - F.lit(1.0)) * F.lit(scale))
    b = F.least(F.greatest(b, F.lit(0)), F.lit((1 << BUCKET_BITS) - 1)).cast("long")
    mag = (e - F.lit(BUCKET_EMIN)).cast("long") * F.lit(1 << BUCKET_BITS) + b + F.lit(1)
    mag = mag * (F.abs(x) >= F.lit(BUCKET_FLOOR)).cast("long")
    sign = F.signum(x).cast("long")
    return (F.lit(BUCKET_OFFSET).cast("long") + sign * mag).cast("long")


def value_cell(lower, upper, resolution: int, granularity: float | None = None):
    """The value's index: on the grid ``Grid(lower, upper, granularity)``, or with ``lower =
    upper = None`` a bucket of the public log-scale grid (``resolution`` is not used)."""
    if lower is None:
        return bucket_column()
    return grid_index_column(lower, upper, granularity)


def coarse_counts(rows: DataFrame, lower: float, upper: float, shift: int,
                  granularity: float | None = None) -> DataFrame:
    """Global path, pass 1: rows per coarse cell ``k >> shift`` (``CELL``, at most ``2**(32 -
    shift) + 1`` rows), partial-aggregated before the shuffle."""
    coarse = F.shiftright(grid_index_column(lower, upper, granularity), shift)
    return rows.groupBy(coarse.alias(CELL)).agg(F.count(F.lit(1)).alias(COUNT))


def fine_counts_in(rows: DataFrame, lower: float, upper: float, cells, shift: int, *,
                   aggregate: bool = True, granularity: float | None = None) -> DataFrame:
    """Global path, pass 2: rows per grid index (``CELL``, ``COUNT``) of the rows whose coarse
    cell ``k >> shift`` is one of ``cells``; with ``aggregate=False`` the grid index of every
    such row (``CELL`` only: no shuffle, the caller counts).

    Up to ``ISIN_CELLS`` cells the filter is ``isin`` on the cell as an int (Spark turns a
    short int list into a switch, a longer one into a hash set: one lookup per row, no join);
    a longer list goes to a broadcast left-semi join."""
    k = grid_index_column(lower, upper, granularity)
    coarse = F.shiftright(k, shift).cast("int")  # at most 2**(32 - shift) (shift >= 2)
    cells = np.asarray(cells, np.int64)
    if cells.size <= ISIN_CELLS:
        selected = rows.select(k.alias(CELL)).where(coarse.isin([int(c) for c in cells]))
    else:
        kept = create_dataframe(rows.sparkSession,
                                pa.table({_KEPT: pa.array(cells.astype(np.int32))}),
                                T.StructType([T.StructField(_KEPT, T.IntegerType(), False)]))
        selected = (rows.select(k.alias(CELL), coarse.alias(_COARSE))
                    .join(F.broadcast(kept), F.col(_COARSE) == F.col(_KEPT), "left_semi")
                    .select(CELL))
    if not aggregate:
        return selected
    return selected.groupBy(CELL).agg(F.count(F.lit(1)).alias(COUNT))


def cell_counts(rows: DataFrame, lower, upper, resolution: int,
                granularity: float | None = None) -> DataFrame:
    """Rows per index (bounds-free global path: per bucket), partial-aggregated before the
    shuffle."""
    cell = value_cell(lower, upper, resolution, granularity)
    return rows.groupBy(cell.alias(CELL)).agg(F.count(F.lit(1)).alias(COUNT))


def partitioned_cells(rows: DataFrame, keys: tuple[str, ...], lower, upper,
                      resolution: int, extra: list, granularity: float | None = None) -> DataFrame:
    """Grouped path with keys from the data: one row per kept data row with its key and index
    (grid index, or bucket without bounds), hash partitioned by key (one shuffle) so that every
    group is whole in one partition."""
    cell = value_cell(lower, upper, resolution, granularity)
    cols = [F.col(k) for k in keys] + [cell.alias(CELL)] + extra
    return rows.select(*cols).repartition(*keys)


def bucket_shift(groups: int) -> int:
    """How many low bits of the key index the packed rows' ``BUCKET`` drops for ``groups``
    public keys (:data:`PACK_BUCKET_BITS`; a public count, so the rows' layout is too)."""
    return max(0, (max(int(groups), 1) - 1).bit_length() - PACK_BUCKET_BITS)


def partitioned_codes(rows: DataFrame, lower, upper, resolution: int,
                      lookup: tuple | None = None, granularity: float | None = None, *,
                      groups: int) -> DataFrame:
    """Grouped path with public keys: the kept rows' codes, packed and partitioned by group.

    Spark computes one int64 ``CODE`` per kept row, ``GID * 2**33 + k`` (k the grid index; the
    caller refuses more than 2**30 keys so it fits) or without bounds ``GID * resolution +
    bucket``. A first ``mapInArrow`` (:func:`~dpq_spark.spark._packing.pack_partition`, on each
    input partition, no shuffle) sorts them in memory-bounded chunks and packs them into rows of
    one bucket of groups each (``BUCKET`` = ``GID >> bucket_shift(groups)``, ``groups`` the
    number of public keys; then up to 256 codes, with their counts when tied, as bytes); the
    one shuffle, hash partitioned by ``BUCKET``, moves those rows, and Spark sorts each
    partition's packed rows by ``BUCKET`` (an external sort: it spills to disk past its memory).
    Every group is then whole in one partition, with the same multiset of codes, and a
    bucket's rows arrive together, after every smaller bucket's: the Python worker releases the
    groups a stretch of whole buckets at a time
    (:func:`~dpq_spark.spark._release.release_partition`) instead of sorting the whole
    partition's codes. Shuffling packed rows instead of one row
    per data row is what makes this cheap: on 1e7 rows in 1,000 groups (local[2]) the shuffle
    and transfer to Python took 3.4-3.7 s instead of 4.6-5.2 s; with 1e6 groups, rows of a
    bucket of 64 groups instead of rows of one group are 1.5e5 packed rows instead of 9.6e6
    (each map task packs a million codes at a time: with rows of one group, nearly a row a code).

    Both frames carry their schema (``DataFrame.to``), so that a Spark Connect client need not
    ask the server for it: ``mapInArrow`` reads its input's columns, which would otherwise cost
    an analysis round trip of the whole plan.

    ``lookup`` = ``(key, data_type, keys)``: ``rows`` have no ``GID`` yet; Spark passes the key
    column and the grid index, and the packing maps each key to its place in ``keys`` (a
    ``pyarrow.Array`` of distinct plain keys, no null), dropping unlisted keys
    (:func:`~dpq_spark.spark._packing.pack_partition`); ``data_type`` is the key column's Spark
    type (given, not read from ``rows``, which on Connect would cost a round trip)."""
    span = CODE_SPAN if lower is not None else resolution
    shift = bucket_shift(groups)
    cell = value_cell(lower, upper, resolution, granularity)
    if lookup is None:
        code = F.col(GID).cast("long") * F.lit(span).cast("long") + cell
        codes = rows.select(code.alias(CODE)).to(_CODE_SCHEMA)
        pack = functools.partial(pack_partition, span=int(span), shift=shift)
    else:
        key, data_type, keys = lookup
        schema = T.StructType([T.StructField(_KEY, data_type, True),
                               T.StructField(CELL, T.LongType(), True)])
        codes = rows.select(F.col(key).alias(_KEY), cell.cast("long").alias(CELL)).to(schema)
        pack = functools.partial(pack_partition, span=int(span), keys=keys, shift=shift)
    packed = codes.mapInArrow(pack, PACKED_SCHEMA)
    return packed.repartition(F.col(BUCKET)).sortWithinPartitions(BUCKET).to(PACKED_SCHEMA)
