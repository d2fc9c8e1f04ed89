"""``dp_quantiles``: differentially private quantiles of a DataFrame column, per group."""

from __future__ import annotations

import logging
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dpq_spark.core import _coarse_bands as bands
from dpq_spark.spark import _dataflow as flow
from dpq_spark.spark import _release as rel
from dpq_spark.spark._arguments import QuantileRequest, parse_request
from dpq_spark.spark._release import CELL, COUNT, FINE, GID, UNITS, ReleaseParams
from dpq_spark.spark._selection import laplace_scale, selection_threshold

__all__ = ["dp_quantiles", "DEFAULT_RESOLUTION"]

logger = logging.getLogger(__name__)

DEFAULT_RESOLUTION = 2**20
_KEEP_ALL_ROWS = 4096  # groups with at most this many rows bring all their fine counts
_BROADCAST_ROWS = 200_000  # key lists and reachable-cell lists up to this size are broadcast


def dp_quantiles(
    df: DataFrame,
    column: str,
    *,
    quantiles,
    epsilon: float,
    lower: float,
    upper: float,
    group_by=None,
    groups=None,
    neighboring: str = "add_remove",
    privacy_unit: str | None = None,
    max_rows_per_unit: int = 1,
    max_groups_per_unit: int = 1,
    delta: float | None = None,
    resolution: int = DEFAULT_RESOLUTION,
    mechanism: str = "joint_exp",
    selection_fraction: float = 0.5,
    rng: np.random.Generator | None = None,
) -> DataFrame:
    """Release differentially private quantiles of ``column``, globally or per group.

    Parameters
    ----------
    df : pyspark.sql.DataFrame
        The private data (classic or Spark Connect).
    column : str
        A numeric column. Rows where it is null or NaN are dropped; values outside
        ``[lower, upper]`` are clamped to the nearer bound.
    quantiles : sequence of float
        Strictly increasing, each in (0, 1). Chosen without looking at the data.
    epsilon : float
        Total privacy budget of the whole release, finite and > 0.
    lower, upper : float
        Public bounds, finite, ``lower < upper``, chosen without looking at the data.
    group_by : str or list of str, optional
        Key column(s). Without it, one release for the whole DataFrame.
    groups : list or DataFrame, optional
        The public keys: a list of values (tuples when there are several ``group_by`` columns)
        or a DataFrame holding the ``group_by`` columns. Every listed key gets an answer, also
        one with no rows; rows whose key is not listed are dropped. Required with ``group_by``
        unless ``delta`` is given.
    neighboring : {"add_remove", "swap"}
        Neighbouring relation. ``"swap"`` (n public) only without ``group_by`` and
        ``privacy_unit``.
    privacy_unit : str, optional
        Column identifying whose data a row is (e.g. ``"user_id"``). Without it, one row is the
        unit. Rows with a null unit are dropped.
    max_rows_per_unit : int, default 1
        With ``privacy_unit``: rows kept per unit in each group, chosen uniformly at random.
    max_groups_per_unit : int, default 1
        With ``privacy_unit`` and ``group_by``: groups kept per unit, chosen at random.
    delta : float, optional
        With ``group_by`` and no ``groups``: select keys from the data by DP partition selection,
        making the release ``(epsilon, delta)``-DP.
    resolution : int, default 2**20
        Cells of the value grid for mechanisms other than JointExp (at most 2**30). JointExp
        always sees the data on the fine grid of 2**32 steps (see Notes).
    mechanism : str, default "joint_exp"
        ``"joint_exp"``, or a name registered in ``dpq_spark.core.mechanisms.MECHANISMS``.
    selection_fraction : float, default 0.5
        Share of ``epsilon`` spent on partition selection when ``delta`` is given.
    rng : numpy.random.Generator, optional
        Source of randomness. ``None`` (production) draws fresh OS entropy for every group;
        pass a seeded Generator only in tests: each group then draws from
        ``default_rng([base_seed, key_seed(key)])`` (``base_seed`` the Generator's first 63
        bits), so the release is reproducible for the same data on any path or deployment.

    Returns
    -------
    pyspark.sql.DataFrame
        The ``group_by`` columns, ``quantile`` (double) and ``value`` (double): one row per group
        and quantile, sorted by group (nulls first) then quantile. The release is computed once
        on the driver and returned as a DataFrame over those local rows
        (``|groups| x len(quantiles)``), so every action on it sees the same numbers.

    Raises
    ------
    TypeError, ValueError
        For any invalid argument, before any Spark job runs: the message names the argument.

    Notes
    -----
    Data path (see ``docs/spark.md``). Spark casts the column to double, drops null/NaN and
    puts every value on the *fine grid*: ``k = clip(floor((clip(x) - lower) / g + 0.5), 0, N)``
    with ``N = 2**32`` and ``g = (upper - lower) / N`` (built-in functions only). JointExp sees
    each group's data at these grid points, so a released quantile is within ``g / 2`` (1.2e-10
    of the range) of what the core's ``joint_exp`` releases on the raw values, and equal to it
    for data already on the grid. Two passes keep memory per group independent of its rows:

    1. counts per (group, coarse cell of 4,096 fine steps), aggregated in Spark (at most
       2**20 per group), collected to the driver;
    2. for the coarse cells JointExp can reach (a band bound computed from the coarse counts,
       proved in :mod:`dpq_spark.core._coarse_bands`), counts per (group, fine index) after a
       broadcast join with the reachable cells: at most 4,096 per reachable cell. Pruned cells
       are passed as their count at the cell's left edge, which changes the sampled
       distribution by less than 2**-59 in total variation.

    The driver then runs the mechanism per group (small groups by exact enumeration) and
    returns the rows sorted by key then quantile. Public keys given as a list need no Spark
    job; a DataFrame of keys costs one job to collect it. A release runs 2 Spark actions (3
    with a keys DataFrame, 1 for mechanisms other than JointExp, which see cell midpoints of
    the ``resolution`` grid); one INFO log line gives their number and the time. Group keys
    travel as Arrow columns (int64 beyond 2**53 kept, null and NaN distinct keys).

    Privacy
    -------
    Assumes ``quantiles``, ``lower``, ``upper``, ``groups`` and all other parameters are chosen
    without looking at the data.

    * No ``privacy_unit``, no ``group_by``: ``epsilon``-DP under ``neighboring`` for one row.
      With ``"swap"``, the number of non-null values is treated as public.
    * No ``privacy_unit``, public ``groups``: ``epsilon``-DP, adding or removing one row. A row
      is in at most one group, so every group gets the full ``epsilon`` (parallel composition).
    * ``privacy_unit``: ``epsilon``-DP, adding or removing all rows of one unit. After
      bounding, a unit is in at most ``G = max_groups_per_unit`` groups with at most
      ``R = max_rows_per_unit`` rows in each; each group's mechanism runs at
      ``epsilon / (G * R)`` for one row, hence ``epsilon / G`` for ``R`` rows (group privacy),
      and ``epsilon`` over the ``G`` groups (basic composition).
    * ``delta`` (keys from the data): ``(epsilon, delta)``-DP for the same unit.
      ``selection_fraction * epsilon`` pays for Laplace partition selection on the count of
      units per key (scale ``G / eps_s``, threshold ``1 + (G / eps_s) ln(1 / (2 delta_key))``,
      ``delta_key = 1 - (1 - delta)**(1/G)``); the rest is split as above.

    The mechanism named by ``mechanism`` must be ``epsilon``-DP for one row under
    ``neighboring`` (JointExp is).

    Examples
    --------
    >>> out = dp_quantiles(df, "rating", quantiles=[0.25, 0.5, 0.75], epsilon=1.0,
    ...                    lower=0.0, upper=5.0, group_by="genre", groups=["fantasy", "poetry"])
    >>> df.transform(dp_quantiles, "rating", quantiles=[0.5], epsilon=1.0, lower=0, upper=5)
    """
    req = parse_request(
        df, column, quantiles=quantiles, epsilon=epsilon, lower=lower, upper=upper,
        group_by=group_by, groups=groups, neighboring=neighboring, privacy_unit=privacy_unit,
        max_rows_per_unit=max_rows_per_unit, max_groups_per_unit=max_groups_per_unit,
        delta=delta, resolution=resolution, mechanism=mechanism,
        selection_fraction=selection_fraction, rng=rng,
    )
    started = time.perf_counter()
    actions = _Actions()
    params, row_seed, group_seed = _params(req)
    spark = req.df.sparkSession
    key_table = None
    if isinstance(req.groups, DataFrame):  # public keys in a DataFrame: one job collects them
        key_table = actions.arrow(req.groups.select(*req.keys).distinct())
    elif req.groups is not None:
        key_table = req.groups
    rows = flow.clean_rows(req)
    if key_table is not None:
        key_table = _sorted_distinct(key_table, req.keys)
        index = key_table.append_column(GID, pa.array(np.arange(key_table.num_rows, dtype=np.int64)))
        index_df = spark.createDataFrame(index, schema=_key_schema(req, with_gid=True))
        rows = flow.attach_key_index(
            rows, req.keys, index_df, broadcast=key_table.num_rows <= _BROADCAST_ROWS,
            null_safe=any(key_table.column(k).null_count for k in req.keys))
    elif not req.keys:
        rows = rows.withColumn(GID, F.lit(0).cast("long"))
        key_table = pa.table({})
    if req.privacy_unit is not None:
        rows = flow.bound_contributions(rows, req.keys, req.max_rows_per_unit,
                                        req.max_groups_per_unit, row_seed, group_seed)
    rows = flow.with_cells(rows, req.lower, req.upper, params.fine, req.resolution)
    group_cols = list(req.keys) if req.selects_partitions else [GID]
    units = req.selects_partitions and req.privacy_unit is not None
    coarse = actions.arrow(flow.coarse_counts(rows, group_cols, units))
    if req.selects_partitions:  # keys from the data: index them on the driver
        key_table, gid = _index_keys(coarse, req.keys)
    else:
        gid = coarse.column(GID).to_numpy()
    n_groups = key_table.num_rows if req.keys else 1
    groups = _Groups(gid, coarse, n_groups, units)
    rngs = _group_rngs(params, key_table, req.keys, n_groups)
    chosen = np.arange(n_groups)
    if req.selects_partitions:
        chosen = np.array([g for g in chosen
                           if rel.passes_selection(groups.size(g), rngs[g], params)], dtype=np.int64)
    fine = None
    if params.fine:
        keep = groups.reachable(chosen, params)
        if keep.any():
            reach = _reach_frame(req, groups, keep, key_table, group_cols)
            fine = _FineCounts(actions.arrow(flow.fine_counts(
                rows, reach, group_cols, broadcast=int(keep.sum()) <= _BROADCAST_ROWS,
                null_safe=req.selects_partitions and _has_null(key_table, req.keys))))
    values = []
    for g in chosen:
        points, counts = groups.represented(g, fine, params)
        values.append(rel.release_values(points, counts, rngs[g], params))
    out = _materialise(req, key_table, chosen, values)
    logger.info("dp_quantiles: released in %.2fs with %d Spark jobs", time.perf_counter() - started,
                actions.count)
    return out


class _Actions:
    """Every Spark action of a release goes through here, so that it can be counted (classic
    and Connect alike) and logged."""

    def __init__(self):
        self.count = 0

    def arrow(self, frame: DataFrame) -> pa.Table:
        self.count += 1
        return frame.toArrow()


def _params(req: QuantileRequest):
    """Per-group parameters and the seeds of contribution bounding (no job runs here)."""
    g = req.max_groups_per_unit if req.privacy_unit is not None else 1
    r = req.max_rows_per_unit if req.privacy_unit is not None else 1
    eps_quantiles = req.epsilon
    threshold = noise_scale = None
    if req.selects_partitions:
        eps_select = req.selection_fraction * req.epsilon
        eps_quantiles = req.epsilon - eps_select
        threshold = selection_threshold(eps_select, req.delta, g)
        noise_scale = laplace_scale(eps_select, g)
    # Fresh OS entropy for every group unless the caller passed a Generator (tests).
    base_seed = req.rng.seed63() if req.seeded else None
    row_seed, group_seed = req.rng.seed63(), req.rng.seed63()
    params = ReleaseParams(
        quantiles=req.quantiles,
        epsilon=eps_quantiles / (g * r),
        lower=req.lower,
        upper=req.upper,
        resolution=req.resolution,
        neighboring=req.neighboring.value,
        mechanism=req.mechanism,
        base_seed=base_seed,
        threshold=threshold,
        noise_scale=noise_scale,
    )
    return params, row_seed, group_seed


def _key_schema(req: QuantileRequest, with_gid: bool = False) -> T.StructType:
    fields = [T.StructField(k, req.df.schema[k].dataType, True) for k in req.keys]
    if with_gid:
        fields.append(T.StructField(GID, T.LongType(), False))
    return T.StructType(fields)


def _output_schema(req: QuantileRequest) -> T.StructType:
    return T.StructType([*_key_schema(req).fields,
                         T.StructField("quantile", T.DoubleType(), False),
                         T.StructField("value", T.DoubleType(), False)])


def _has_null(table: pa.Table, keys) -> bool:
    return any(table.column(k).null_count for k in keys)


def _factorize(table: pa.Table, keys) -> tuple[np.ndarray, np.ndarray]:
    """Codes of the distinct key tuples of ``table`` (Arrow, exact: int64 beyond 2**53 stays
    itself; null and NaN are distinct) and the row index of each code's first occurrence."""
    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    codes = []
    for k in keys:
        column = table.column(k).combine_chunks()
        encoded = pc.dictionary_encode(column, null_encoding="encode")
        codes.append(encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64))
    stacked = np.stack(codes, axis=1)
    _, first, inverse = np.unique(stacked, axis=0, return_index=True, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64), first


def _sorted_distinct(table: pa.Table, keys) -> pa.Table:
    """Distinct key tuples sorted as the output is (nulls first, NaN after every number)."""
    _, first = _factorize(table, keys)
    distinct = table.select(list(keys)).take(pa.array(first, type=pa.int64()))
    return distinct.take(_sort_order(distinct, keys))


def _sort_order(table: pa.Table, keys) -> pa.Array:
    """Row order by the key columns as Spark's ``asc_nulls_first``: nulls first, then numbers,
    then NaN (Arrow would put NaN beside the nulls, so NaN gets a column of its own)."""
    columns, sort_keys = {}, []
    for i, k in enumerate(keys):
        column = table.column(k)
        columns[f"v{i}"] = pc.is_valid(column)
        sort_keys.append((f"v{i}", "ascending"))
        if pa.types.is_floating(column.type):
            columns[f"n{i}"] = pc.fill_null(pc.is_nan(column), False)
            sort_keys.append((f"n{i}", "ascending"))
        columns[f"k{i}"] = column
        sort_keys.append((f"k{i}", "ascending"))
    return pc.sort_indices(pa.table(columns), sort_keys=sort_keys)


def _index_keys(coarse: pa.Table, keys) -> tuple[pa.Table, np.ndarray]:
    """Partition selection: the distinct keys of pass 1, sorted, and each row's key index."""
    codes, first = _factorize(coarse, keys)
    distinct = coarse.select(list(keys)).take(pa.array(first, type=pa.int64()))
    order = _sort_order(distinct, keys).to_numpy()
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size)
    return distinct.take(pa.array(order, type=pa.int64())), rank[codes]


def _group_rngs(params: ReleaseParams, key_table: pa.Table, keys, n_groups: int) -> list:
    if params.base_seed is None:
        return [rel.group_rng(params, 0) for _ in range(n_groups)]
    if not keys:
        return [rel.group_rng(params, rel.key_seed(()))]
    rows = zip(*[key_table.column(k).to_pylist() for k in keys])
    return [rel.group_rng(params, rel.key_seed(tuple(r))) for r in rows]


class _Groups:
    """Pass 1 on the driver: each group's sorted non-empty cells and counts."""

    def __init__(self, gid: np.ndarray, coarse: pa.Table, n_groups: int, units: bool):
        cells = coarse.column(CELL).to_numpy()
        counts = coarse.column(COUNT).to_numpy()
        order = np.lexsort((cells, gid))
        self.gid, self.cells, self.counts = gid[order], cells[order], counts[order]
        self.units = coarse.column(UNITS).to_numpy()[order] if units else None
        self.bounds = np.searchsorted(self.gid, np.arange(n_groups + 1), side="left")
        self.keep: dict[int, np.ndarray] = {}

    def span(self, g: int) -> slice:
        return slice(int(self.bounds[g]), int(self.bounds[g + 1]))

    def size(self, g: int) -> int:
        source = self.counts if self.units is None else self.units
        return int(source[self.span(g)].sum())

    def reachable(self, chosen: np.ndarray, params: ReleaseParams) -> np.ndarray:
        """Mask over all pass-1 rows: the (group, coarse cell) pairs pass 2 must bring."""
        keep = np.zeros(self.gid.size, dtype=bool)
        for g in chosen:
            s = self.span(g)
            if s.stop - s.start <= 1 or self.counts[s].sum() <= _KEEP_ALL_ROWS:
                keep[s] = True  # always sound; a small group's fine counts are few anyway
            else:
                keep[s] = rel.keep_cells(self.cells[s], self.counts[s], params)
        self.keep_all = keep
        return keep

    def represented(self, g: int, fine, params: ReleaseParams):
        s = self.span(g)
        if not params.fine:
            return self.cells[s], self.counts[s]
        kept_k, kept_counts = fine.of(g) if fine is not None else (np.zeros(0, np.int64),) * 2
        return bands.represent(kept_k, kept_counts, self.cells[s], self.counts[s],
                               self.keep_all[s])


class _FineCounts:
    """Pass 2 on the driver: each group's sorted fine indices and counts."""

    def __init__(self, table: pa.Table):
        gid = table.column(GID).to_numpy()
        fine = table.column(FINE).to_numpy()
        counts = table.column(COUNT).to_numpy()
        order = np.lexsort((fine, gid))
        self.gid, self.fine, self.counts = gid[order], fine[order], counts[order]

    def of(self, g: int):
        a, b = np.searchsorted(self.gid, [g, g + 1])
        return self.fine[a:b], self.counts[a:b]


def _reach_frame(req: QuantileRequest, groups: _Groups, keep: np.ndarray, key_table: pa.Table,
                 group_cols) -> DataFrame:
    """The reachable (group, coarse cell) pairs as a local DataFrame for the pass-2 join."""
    gid = groups.gid[keep]
    columns = {}
    fields = []
    if req.selects_partitions:
        taken = key_table.take(pa.array(gid, type=pa.int64()))
        for k in req.keys:
            columns[k] = taken.column(k)
        fields = list(_key_schema(req).fields)
    columns[CELL] = pa.array(groups.cells[keep], type=pa.int64())
    columns[GID] = pa.array(gid, type=pa.int64())
    fields += [T.StructField(CELL, T.LongType(), False), T.StructField(GID, T.LongType(), False)]
    return req.df.sparkSession.createDataFrame(pa.table(columns), schema=T.StructType(fields))


def _materialise(req: QuantileRequest, key_table: pa.Table, chosen: np.ndarray,
                 values: list) -> DataFrame:
    """A DataFrame over the released rows, already in key then quantile order (the key table
    is sorted on the driver, so reading the result runs no sort job)."""
    m = len(req.quantiles)
    reps = np.repeat(np.asarray(chosen, dtype=np.int64), m)
    columns = {k: key_table.column(k).take(pa.array(reps, type=pa.int64())) for k in req.keys}
    columns["quantile"] = pa.array(np.tile(np.asarray(req.quantiles), len(chosen)), pa.float64())
    flat = np.concatenate(values) if values else np.zeros(0)
    columns["value"] = pa.array(flat, type=pa.float64())
    table = pa.table(columns) if columns else None
    return req.df.sparkSession.createDataFrame(table, schema=_output_schema(req))
