"""``dp_quantiles``: differentially private quantiles of a DataFrame column, per group."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dpq_spark.core.quantiles.coarse_bands import (
    BAND_LOG_TOL,
    represent,
    settle,
    spread_evenly,
)
from dpq_spark.spark import _compat
from dpq_spark.spark import _dataflow as flow
from dpq_spark.spark import _release
from dpq_spark.spark import _fold
from dpq_spark.spark._arguments import DEFAULT_RESOLUTION, QuantileRequest, parse_request
from dpq_spark.spark._compat import create_dataframe, is_collated
from dpq_spark.spark._keys import key_seed, normalise, spark_order
from dpq_spark.spark._columns import CELL, CODE, COUNT, GID, KEY_HASH, MECHANISM, UNITS
from dpq_spark.spark._release import (
    ReleaseParams,
    release_group,
    release_keyed_partition,
    release_partition,
)
from dpq_spark.spark._selection import laplace_scale, selection_threshold
from dpq_spark.spark._workers import check_workers

__all__ = ["dp_quantiles", "release_request", "collect_keys", "DEFAULT_RESOLUTION"]

logger = logging.getLogger(__name__)

_SEED_HIGH = 2**63 - 1
_BROADCAST_KEYS = 200_000  # public key lists up to this size are broadcast to the join
_LITERAL_KEYS = 32  # up to this many plain keys of one column: a literal lookup, no join
_LOOKUP_KEY_BYTES = 16 << 20  # more plain keys, up to this size: looked up in the UDF, no join
_RAW_PASS2_ROWS = 1 << 22  # ungrouped pass 2 collects raw grid indices up to this many rows
#: The ungrouped pass 1 counts rows per coarse cell k >> 16 (2**16 + 1 cells at most: a small
#: hash aggregate); the grouped spill path keeps cells of k >> 12 (COARSE_SHIFT).
GLOBAL_SHIFT = 16
_JOBS: contextvars.ContextVar = contextvars.ContextVar("dpq_spark_jobs", default=None)


def to_arrow(df: DataFrame) -> pa.Table:
    """Collect ``df`` (:func:`dpq_spark.spark._compat.to_arrow`): one Spark job of the running
    release, counted for :func:`counting_jobs`. Every job a release runs goes through here."""
    counter = _JOBS.get()
    if counter is not None:
        counter[0] += 1
    return _compat.to_arrow(df)


@contextlib.contextmanager
def counting_jobs():
    """Count the Spark jobs that releases run inside the ``with`` block (``counter[0]``), for
    tests and audits of the data path. Never logged: the ungrouped path decides from the data
    whether it reads a second time."""
    counter = [0]
    token = _JOBS.set(counter)
    try:
        yield counter
    finally:
        _JOBS.reset(token)


def dp_quantiles(
    df: DataFrame,
    column: str,
    *,
    quantiles,
    epsilon: float,
    lower: float | None = None,
    upper: float | None = None,
    group_by=None,
    groups=None,
    neighboring: str = "add_remove",
    privacy_unit: str | None = None,
    max_rows_per_unit: int = 1,
    max_groups_per_unit: int = 1,
    delta: float | None = None,
    resolution: int | None = None,
    mechanism: str = "auto",
    selection_fraction: float = 0.5,
    bounds_share: float | None = None,
    rng: np.random.Generator | None = None,
    layout: str = "long",
    granularity: float | None = None,
) -> DataFrame:
    """Release differentially private quantiles of ``column``, globally or per group.

    This function charges no privacy ledger and records nothing: every call spends ``epsilon``
    again on the same people, and nothing counts it. To keep a dataset's budget across calls,
    notebooks and jobs, release through :class:`dpq_spark.BudgetSession` (its ``quantiles``
    takes these same arguments).

    Parameters
    ----------
    df : pyspark.sql.DataFrame
        The private data (classic or Spark Connect).
    column : str
        A numeric column. Rows where it is null or NaN are dropped; values outside
        ``[lower, upper]`` are clamped to the nearer bound (without bounds, to the private
        bounds of the group). Its Spark type sets the release grid (``granularity``).
    quantiles : sequence of float
        Strictly increasing, each in (0, 1). Chosen without looking at the data.
    epsilon : float
        Total privacy budget of the whole release, finite and > 0.
    lower, upper : float, optional
        Public bounds, finite, ``lower < upper``, chosen without looking at the data. Give both
        or neither: without them each group first releases private bounds with
        ``bounds_share`` of its epsilon (see Notes and Privacy). One bound alone is refused
        (clamp the column yourself if one side is known).
    group_by : str or list of str, optional
        Key column(s). Without it, one release for the whole DataFrame.
    groups : list or DataFrame, optional
        The public keys: a list of values (tuples when there are several ``group_by`` columns)
        or a DataFrame holding the ``group_by`` columns. Every listed key gets an answer, also
        one with no rows; rows whose key is not listed are dropped. Required with ``group_by``
        unless ``delta`` is given. Nothing is cast: a listed value must have the Python type of
        its column (``int`` for integral columns, not ``bool``; ``float`` for float/double,
        where an ``int`` that converts exactly is accepted; ``str``; ``bytes``; ``bool``;
        ``decimal.Decimal`` or ``int``; ``datetime.date``; a timezone-aware
        ``datetime.datetime`` for timestamp and a naive one for timestamp_ntz; ``None`` for
        the null key, ``float("nan")`` for the NaN key), and a DataFrame's key columns must
        have the data's Spark types; anything else, a dict, a set or an empty list is an error
        naming ``groups``. A list is turned into keys on the driver (no Spark job); duplicate
        keys are dropped (``-0.0`` and ``0.0`` are one key, as are all NaNs, as in Spark's
        grouping). A DataFrame's distinct keys are collected (one job).
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
    resolution : int, optional
        Validated (at most 2**30; only with bounds) but not used: the grid is set by the column
        type and ``granularity`` (see Notes). Kept so existing calls keep working.
    granularity : float, optional
        The step of the public grid the data are snapped to and the values released on,
        finite and > 0; it overrides the column type's. Left out, the column's Spark type
        declares it: 1 for byte/short/int/long, ``10**-s`` for ``decimal(p, s)``, none for
        float/double (the default grid of 2**32 steps of ``[lower, upper]``). With bounds, a
        given ``granularity`` makes the grid ``lower + k granularity`` (the core's
        :class:`~dpq_spark.core.randomness.grid.Grid`) and must give at most 2**32 steps; the
        type's step instead uses its multiples inside ``[lower, upper]`` (the bounds moved
        inwards onto them), and falls back to the default grid when there are fewer than two
        or more than 2**32 steps of them. A declared grid releases a quantile inside a block
        of tied values as the tied value (ties are jittered inside their grid cell, as
        ``joint_exp(..., granularity=...)`` does). Without bounds the type's step is not used
        (private bounds may span more steps of it than a grid can have); a given
        ``granularity`` goes to each group's private-bounds search and mechanism, and a group
        whose private bounds span more than 2**52 of its steps fails. Date and timestamp
        columns are not numeric and are refused (cast them to a number first).
    mechanism : str, default "auto"
        ``"auto"`` picks per group from public numbers only (``m``, the group's epsilon and its
        row count: public under swap, else a noisy count with 5% of the group's epsilon;
        :mod:`dpq_spark.core.quantiles.choose`): IndExp for one quantile, the 16-bin histogram when
        ``n epsilon < 25``, JointExp up to ``16 (n epsilon / 1000) ** 0.6`` quantiles (between 2
        and 16; more quantiles at ``n epsilon < 3162`` get AggTree on a small tree), then
        ApproxQuantiles, then AggTree (for 50 quantiles or more at moderate ``n epsilon``, on a
        smaller tree). Or a pure mechanism by name: ``"joint_exp"``, ``"ind_exp"``,
        ``"approx_quantiles"``, ``"agg_tree"``, ``"histogram"``, ``"agg_tree_8x3"``,
        ``"agg_tree_12x3"``, ``"agg_tree_8x4"``.
    selection_fraction : float, default 0.5
        Share of ``epsilon`` spent on partition selection when ``delta`` is given.
    bounds_share : float, optional
        Without bounds only: the share of each group's epsilon spent on its private bounds, in
        (0, 1); default 0.2 (:data:`dpq_spark.core.quantiles.bounds.DEFAULT_BOUNDS_SHARE`).
    rng : numpy.random.Generator, optional
        Source of randomness. ``None`` (production) draws fresh OS entropy in every Python
        worker call; pass a seeded Generator only in tests, which makes the release reproducible
        for the same data and partitioning.
    layout : {"long", "wide"}, default "long"
        The shape of the result (see Returns); the release is the same. ``"wide"`` has one row
        per group, like ``percentile_approx`` with a list of percentages, and is much cheaper to
        read back for many groups (1e5 groups of deciles: 1e5 rows instead of 9e5).

    Returns
    -------
    pyspark.sql.DataFrame
        ``layout="long"``: the ``group_by`` columns, ``quantile`` (double), ``value`` (double:
        a point of the release grid; with bounds, a whole number for an integral column on its
        integers' grid, and ``lower + k 10**-s`` in float64 for a ``decimal(p, s)`` one)
        and ``mechanism`` (string: the mechanism that ran for the group, e.g. what ``"auto"``
        picked): one row per group and quantile, sorted by group then quantile as
        ``orderBy(asc_nulls_first(key)..., "quantile")`` would (null key first, NaN after every
        number). ``layout="wide"``: the ``group_by`` columns, ``value`` (array of double, one
        entry per quantile in the order of ``quantiles``, which the field's metadata also holds
        under ``"quantiles"``) and ``mechanism``: one row per group, sorted by group the same
        way. The key columns have the ``group_by`` columns' types and hold the keys exactly as
        in the data or in ``groups`` (a null and a NaN key are two groups; 64-bit integers are
        never rounded). The release is computed once, collected to the driver (``|groups| x
        len(quantiles)`` numbers), sorted there and returned as a DataFrame over those local
        rows (no ``orderBy``), so every action on it sees the same numbers and
        ``collect()``/``show()`` run no Spark job.

    Raises
    ------
    TypeError, ValueError
        For any invalid argument, before any Spark job runs: the message names the argument.
        (A ``groups`` DataFrame with no rows is found empty by the job that collects it.)

    Notes
    -----
    The grid. It is chosen before any job from the column's Spark type, the bounds and
    ``granularity`` (see that parameter), never from the values. On the default grid
    ``Grid(lower, upper)`` (2**32 steps) the data path below runs as described. On a declared
    grid ``Grid(lower, upper, g)`` (at most 2**32 steps) every mechanism gets each group's exact
    grid indices: JointExp and IndExp on the jittered fine grid exactly as the core's
    ``joint_exp``/``ind_exp`` with ``granularity=g``, ApproxQuantiles with ``granularity=g``,
    AggTree and the histogram rounded to the grid; no band pruning and no coarse cells (but
    on grids of more than 2**20 steps, where the other mechanisms see cells of ``2**s`` grid
    points, ``s`` the least that leaves at most 2**20 cells). The jitter holds one fine index
    per row, so a group's release then costs memory and time in its rows (about 8 bytes and
    0.35 µs per row in the Python worker, or on the driver ungrouped), and groups are released
    one at a time rather than batched; cast the column to double to keep the default grid.

    Data path (see ``docs/spark.md``): Spark casts the column to double, drops null/NaN, clamps
    it to ``[lower, upper]`` and maps each value to its index ``k`` on the grid (the same
    float64 operations as ``Grid.snap``, built-in functions only). Grouped, rows are hash partitioned by key (one shuffle, no sort); with
    public keys Spark packs the key's index and ``k`` into one int64 and ``mapInArrow`` streams
    the codes, with partition selection ``mapInArrow`` streams the key columns (as Arrow arrays,
    never pandas) and ``k``. Python folds each partition into counts per distinct (group, k), so
    it never holds raw rows. While the partition's distinct pairs stay within a budget (2**21
    pairs) every group gets its exact grid data, and JointExp and IndExp release exactly what
    the core's ``joint_exp``/``ind_exp`` release on the raw values (both split each grid
    point's rows over its 256 fine points, so that quantiles inside a block of tied doubles
    come out as the tied value: ``Grid.tie_bits``). Past the budget the
    partition spills its pairs to a local temporary file and keeps counts per (group, coarse
    cell of 4,096 grid points), at most 2**20 + 1 per group however many rows it has; after the
    noisy count and choice of each group, JointExp (IndExp) gets the exact ``k`` of the coarse
    cells it can reach, read back from the file (their rows split over fine points), and each
    other cell's rows whole at the cell's left edge: within total variation 2**-59 of the same
    mechanism on the grid data (:mod:`dpq_spark.core.quantiles.coarse_bands`). ApproxQuantiles and AggTree always see coarse cells
    (AggTree each row at its cell's middle grid point, within 4.8e-7 of the span;
    ApproxQuantiles picked by ``"auto"`` for a group of at most 2**20 rows by its public
    count each row at a random one of its cell's 16 sub-cells, drawn per row, which costs no
    privacy: :mod:`dpq_spark.core.quantiles.coarse_spread`). Ungrouped, Spark
    counts rows per wider coarse cell of 65,536 grid points (at most 2**16 + 1 rows
    collected), the driver chooses, and a second job brings, for JointExp/IndExp, the grid
    indices of the reachable cells only, and for the other mechanisms the rows per 4,096-point
    cell (so the input is read twice: it must give the same rows both times, e.g. not an
    unseeded ``rand()`` column). The public keys (``|groups|`` rows; collected by one job when
    ``groups`` is a DataFrame) are joined (broadcast up to 200,000 keys); the release
    (``|groups| x len(quantiles)`` rows) is collected and sorted on the driver. Each release
    logs one INFO line with its time and the number of Spark jobs it ran. ``resolution`` is
    validated but no longer used with bounds.

    Without bounds, Spark cannot place values in cells of ``[lower, upper]``; instead each
    value goes to a bucket of a public log-scale grid, computed with built-ins from the value
    alone: ``|x|`` written ``2**e * f`` (``1 <= f < 2``, ``e`` in [-32, 63]), the bucket is
    ``sign(x)`` and ``(e, floor((f - 1) * 2**20))``, relative width 2**-20 (about 9.5e-7);
    ``|x| < 2**-32`` (0 included) is one zero bucket and ``|x|`` beyond about 1.8e19 is clamped.
    The (group, bucket) counts are folded exactly like (group, cell) counts, so memory per
    group is bounded by its distinct buckets (at most about 2e8, in practice a few per distinct
    value), never by its rows. Per group the mechanism gets the buckets' representative values
    (midpoints, within 2**-21 relative of every member) with their counts and ``lower = upper =
    None``: it releases private bounds from them (:mod:`dpq_spark.core.quantiles.bounds`), then the
    quantiles inside those bounds.

    Privacy
    -------
    Assumes ``quantiles``, ``lower``, ``upper``, ``groups``, ``granularity`` and all other
    parameters are chosen without looking at the data. The grid is a function of the column's
    Spark type (public schema), the bounds and ``granularity`` alone, and the map of a value
    to its grid index reads that value and public constants only (a per-record map); the
    jitter of a declared grid is an independent per-record random map, which keeps each
    mechanism's guarantee (:mod:`dpq_spark.core.randomness.grid`). Below, "the group's mechanism at epsilon_g" is itself
    ``epsilon_g``-DP for one row by basic composition of at most three steps, all inside the
    group's release: with ``"auto"`` under add/remove, a noisy row count (discrete Laplace,
    5% of ``epsilon_g``; under swap ``n`` is public and nothing is spent); without bounds, the
    private bounds (``bounds_share`` of what is left; monotone AboveThreshold on the buckets'
    counts); and the chosen mechanism with the rest. The choice of mechanism is a function of
    public values and of the noisy count (post-processing). The bucket map reads one value and
    public constants (a per-record map), so adding or removing one row changes one bucket
    count by one, whatever the float rounding does: the steps' guarantees on bucket counts are
    guarantees on rows. Every released number is thus covered by the statements below with the
    whole ``epsilon``; nothing is charged twice and nothing is free.

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
    ``neighboring`` (all offered ones are: JointExp, IndExp, ApproxQuantiles, AggTree, auto).

    As implemented (float64 weights, exact integer draws), each mechanism is ``(epsilon + eta,
    delta)``-DP with the core's tiny ``eta`` and ``delta`` (:mod:`dpq_spark.core.quantiles.joint_exp`).
    With bounds, JointExp and IndExp on a spilled group or on the ungrouped path run on
    represented data whose release is within total variation 2**-59 of the release on the grid
    data (per IndExp draw), giving ``delta = (1 + exp(epsilon + eta)) 2**-58`` (IndExp: m times
    that); whether a partition spilled depends on its data, but both branches sample, within
    that distance, the same distribution (:mod:`dpq_spark.core.quantiles.coarse_bands`).

    Examples
    --------
    >>> out = dp_quantiles(df, "rating", quantiles=[0.25, 0.5, 0.75], epsilon=1.0,
    ...                    lower=0.0, upper=5.0, group_by="genre", groups=["fantasy", "poetry"])
    >>> df.transform(dp_quantiles, "rating", quantiles=[0.5], epsilon=1.0, lower=0, upper=5)
    >>> dp_quantiles(df, "income", quantiles=[0.1, 0.5, 0.9], epsilon=1.0)  # no bounds
    """
    req = parse_request(
        df, column, quantiles=quantiles, epsilon=epsilon, lower=lower, upper=upper,
        group_by=group_by, groups=groups, neighboring=neighboring, privacy_unit=privacy_unit,
        max_rows_per_unit=max_rows_per_unit, max_groups_per_unit=max_groups_per_unit,
        delta=delta, resolution=resolution, mechanism=mechanism,
        selection_fraction=selection_fraction, rng=rng, bounds_share=bounds_share,
        layout=layout, granularity=granularity,
    )
    return release_request(req)


def release_request(req: QuantileRequest) -> DataFrame:
    """Run the release that :func:`dp_quantiles` describes, from its validated request (for
    callers that validated it first: :class:`dpq_spark.pipeline.session.BudgetSession`)."""
    check_workers(req.df.sparkSession, grouped=bool(req.keys))  # one line, not a worker trace
    started = time.perf_counter()
    what = (f"column={req.column!r} keys={list(req.keys)!r} m={len(req.quantiles)} "
            f"epsilon={req.epsilon:g} mechanism={req.mechanism}")  # public parameters only
    logger.debug("dp_quantiles: %s: starting", what)
    key_table = _public_keys(req)
    params, rows, lookup = _plan(req, key_table)
    if key_table is not None:
        path, wide = "public keys", _release_public_keys(req, params, rows, key_table, lookup)
    elif req.keys:
        path, wide = "partition selection", _wide(req, _release_selected_keys(req, params, rows))
    else:
        path, wide = "global", _wide(req, _release_global(req, params, rows))
    out = _materialise(req, wide)
    # Public parameters only: not the number of Spark jobs, which the ungrouped path decides
    # from the data (a second pass when its coarse counts leave cells open).
    logger.info("dp_quantiles: %s: released in %.2fs, path=%s", what,
                time.perf_counter() - started, path)
    return out


def collect_keys(req: QuantileRequest) -> QuantileRequest:
    """``req`` with a DataFrame of public keys collected into the Arrow table a list becomes
    while validating (its distinct keys, normalised as Spark groups them: one job over the
    keys, never over the data); any other request as it is. The keys are public, so collecting
    them spends nothing; a caller that needs them before the release (a budget session's
    digest) collects them once here."""
    if req.groups is None or isinstance(req.groups, pa.Table):
        return req
    table = to_arrow(flow.key_frame(req.keys, req.groups))
    if table.num_rows == 0:
        raise ValueError("`groups` DataFrame holds no keys: give at least one key (a release "
                         "over no groups would answer nothing)")
    table = pa.table({k: normalise(table.column(k).combine_chunks()) for k in req.keys})
    return dataclasses.replace(req, groups=table)


def _public_keys(req: QuantileRequest) -> pa.Table | None:
    """The public keys as an Arrow table with ``KEY_HASH`` (a per-key seed offset, used only
    when the caller passed a Generator; 0 otherwise), from :func:`collect_keys`."""
    req = collect_keys(req)
    if req.groups is None:
        return None
    table = req.groups
    if req.seeded:
        rows = zip(*[table.column(k).to_pylist() for k in req.keys])
        hashes = pa.array([key_seed(values) for values in rows], type=pa.int64())
    else:
        hashes = pa.array(np.zeros(table.num_rows, dtype=np.int64))
    return table.append_column(KEY_HASH, hashes)


def _plan(req: QuantileRequest, key_table):
    """Build the lazy frame of kept rows and the per-group parameters (no job runs here), and
    the key ``lookup`` for :func:`~dpq_spark.spark._dataflow.partitioned_codes` (None unless
    :func:`_lookup_keys`: then the rows carry no ``GID`` yet)."""
    g = req.max_groups_per_unit if req.privacy_unit is not None else 1
    r = req.max_rows_per_unit if req.privacy_unit is not None else 1
    eps_quantiles = req.epsilon
    threshold = noise_scale = None
    if req.selects_partitions:
        eps_select = req.selection_fraction * req.epsilon
        eps_quantiles = req.epsilon - eps_select
        threshold = selection_threshold(eps_select, req.delta, g)
        noise_scale = laplace_scale(eps_select, g)
    seed = req.rng.seed63
    row_seed, group_seed = seed(), seed()
    # Fresh OS entropy in every worker call unless the caller passed a Generator (tests).
    base_seed = seed() if req.seeded else None
    params = ReleaseParams(
        keys=req.keys,
        quantiles=req.quantiles,
        epsilon=eps_quantiles / (g * r),
        lower=req.lower,
        upper=req.upper,
        resolution=req.resolution,
        neighboring=req.neighboring.value,
        mechanism=req.mechanism,
        bounds_share=req.bounds_share,
        granularity=req.granularity,
        fold_budget=_fold.FOLD_BUDGET,  # read here, on the driver (tests lower it)
        spill_shrink=_fold.SPILL_SHRINK,
        base_seed=base_seed,
        threshold=threshold,
        noise_scale=noise_scale,
    )
    rows = flow.clean_rows(req)
    lookup = None
    if key_table is not None and _literal_keys(req, key_table):
        key = req.keys[0]
        rows = flow.index_by_literals(rows, key, key_table.column(key).to_pylist())
    elif key_table is not None and _lookup_keys(req, key_table):
        key = req.keys[0]
        lookup = (key, req.df.schema[key].dataType, key_table.column(key).combine_chunks())
    elif key_table is not None:
        index = key_table.select(list(req.keys)).append_column(
            GID, pa.array(np.arange(key_table.num_rows, dtype=np.int64)))
        schema = T.StructType([*_key_fields(req),
                               T.StructField(GID, T.LongType(), False)])
        index_df = create_dataframe(req.df.sparkSession, index, schema)
        rows = flow.attach_key_index(
            rows, req.keys, index_df, broadcast=key_table.num_rows <= _BROADCAST_KEYS,
            null_safe=any(key_table.column(k).null_count for k in req.keys))
    if req.privacy_unit is not None:
        rows = flow.bound_contributions(rows, req.keys, r, g, row_seed, group_seed)
    return params, rows, lookup


def _plain_keys(req: QuantileRequest, key_table: pa.Table) -> bool:
    """Whether the public keys are of one integral or ``UTF8_BINARY`` string column, none null
    (types whose equality is plain, unlike doubles' NaN and -0.0 or collated strings)."""
    if len(req.keys) != 1:
        return False
    dtype = req.df.schema[req.keys[0]].dataType
    plain = isinstance(dtype, T.IntegralType) or (
        isinstance(dtype, T.StringType) and not is_collated(dtype))
    return plain and key_table.column(req.keys[0]).null_count == 0


def _literal_keys(req: QuantileRequest, key_table: pa.Table) -> bool:
    """Whether the public keys take :func:`~dpq_spark.spark._dataflow.index_by_literals`: at
    most ``_LITERAL_KEYS`` plain keys (:func:`_plain_keys`)."""
    return key_table.num_rows <= _LITERAL_KEYS and _plain_keys(req, key_table)


def _lookup_keys(req: QuantileRequest, key_table: pa.Table) -> bool:
    """Whether the public-key path looks the keys up in its packing UDF instead of joining with
    a key DataFrame (:func:`~dpq_spark.spark._dataflow.partitioned_codes` with ``lookup``):
    plain keys (:func:`_plain_keys`) taking at most ``_LOOKUP_KEY_BYTES`` (they travel inside
    the UDF, and on Spark Connect inside the plan), and no privacy unit (whose contribution
    bounding must see only listed keys' rows, so the join comes first there). The lookup saves
    building, shipping and broadcasting a key DataFrame; rows of unlisted keys reach Python
    before they are dropped."""
    return (req.privacy_unit is None and key_table.num_rows > _LITERAL_KEYS
            and key_table.select([req.keys[0]]).nbytes <= _LOOKUP_KEY_BYTES
            and _plain_keys(req, key_table))


_POSITION = "__dpq_position"  # a value's place in its group's array (long layout)
#: A long release of more rows than this is built as Spark's explode of its wide form (reading
#: it runs one local job); a smaller one is local rows, read with no job at all.
_EXPLODE_ROWS = 1 << 16


def _key_fields(req: QuantileRequest) -> list[T.StructField]:
    """The output's key columns: the ``group_by`` columns' types, nullable."""
    return [T.StructField(k, req.df.schema[k].dataType, True) for k in req.keys]


def _output_schema(req: QuantileRequest) -> T.StructType:
    """The long layout's schema (what every release path builds)."""
    fields = _key_fields(req)
    fields += [T.StructField("quantile", T.DoubleType(), False),
               T.StructField("value", T.DoubleType(), True),  # null: bounds_not_found
               T.StructField(MECHANISM, T.StringType(), False)]
    return T.StructType(fields)


def _wide_schema(req: QuantileRequest) -> T.StructType:
    """The wide layout's schema: keys, ``value`` (array of double, the quantiles in the field's
    metadata) and ``mechanism``."""
    fields = _key_fields(req)
    fields += [T.StructField("value", T.ArrayType(T.DoubleType(), False), False,
                             metadata={"quantiles": list(req.quantiles)}),
               T.StructField(MECHANISM, T.StringType(), False)]
    return T.StructType(fields)


def _wide(req: QuantileRequest, table: pa.Table) -> pa.Table:
    """The long release as one row per group. Every path emits a group's m rows together and
    in the order of ``quantiles``; that is checked, then each block becomes one row."""
    m = len(req.quantiles)
    rows = table.num_rows
    quantile = table.column("quantile").to_numpy()
    if rows % m or not np.array_equal(quantile, np.tile(np.asarray(req.quantiles), rows // m)):
        raise RuntimeError("dp_quantiles: the release is not in blocks of one group's quantiles "
                           "(a bug: please report it)")
    first = pa.array(np.arange(0, rows, m))
    values = np.ascontiguousarray(table.column("value").to_numpy(), dtype=np.float64)
    return _wide_table(req, table.select(list(req.keys)).take(first), values,
                       table.column(MECHANISM).take(first))


def _release_public_keys(req: QuantileRequest, params: ReleaseParams, rows: DataFrame, key_table,
                         lookup=None):
    """Public keys: stream ``GID * 2**33 + k`` codes (k the grid index) through ``mapInArrow``.

    One shuffle (by key index, no sort); Python folds each partition's codes into counts per
    distinct (group, grid index), spilling past the fold budget (:class:`_fold.Fold`). The
    UDF returns key indexes; the driver maps them back to the collected key values. A public
    key with no rows never reaches the UDF: the driver answers it from empty data, exactly as
    the UDF would. Returns the wide release (:func:`_wide_table`), built from the UDF's rows
    with one take of the keys per group (a long table of m rows per group, built and folded
    back, cost 1.5 s of driver time at 1e6 keys).
    """
    if req.lower is not None and key_table.num_rows > flow.MAX_PACKED_KEYS:
        raise ValueError("`groups` must hold at most 2**30 keys with `lower` and `upper`, got "
                         f"{key_table.num_rows}")
    hashes = key_table.column(KEY_HASH)
    seeded = params.base_seed is not None
    params = dataclasses.replace(params, extra_columns=(CODE,),
                                 key_hashes=tuple(hashes.to_pylist()) if seeded else None)
    declared = {} if req.granularity is None else {"granularity": req.granularity}
    codes = flow.partitioned_codes(rows, req.lower, req.upper, req.resolution, lookup, **declared,
                                   groups=key_table.num_rows)
    schema = T.StructType([T.StructField(GID, T.LongType(), False),
                           T.StructField("value", T.ArrayType(T.DoubleType()), False),
                           T.StructField(MECHANISM, T.StringType(), False)])

    def fn(batches):  # Arrow in and out: no pandas conversion
        yield from release_partition(batches, params)

    released = to_arrow(codes.mapInArrow(fn, schema=schema))  # one row per released group
    m = len(params.quantiles)
    lists = released.column("value").combine_chunks()
    if len(lists) and not np.all(np.diff(lists.offsets.to_numpy()) == m):
        raise RuntimeError("dp_quantiles: a group's release does not hold one value per "
                           "quantile (a bug: please report it)")
    gids = [released.column(GID).to_numpy()]
    values = [lists.flatten().to_numpy(zero_copy_only=False)]
    names = [released.column(MECHANISM).combine_chunks()]
    present = np.zeros(key_table.num_rows, dtype=bool)
    present[gids[0]] = True
    missing = np.flatnonzero(~present)
    if missing.size and _release._batchable(params):
        # public keys without rows, released from empty data on the driver in batches (the
        # distribution of the per-key path below; production randomness only)
        empty = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))
        got = _release._joined(list(_release._release_batch(
            missing, [0] * missing.size, [0] * missing.size, *empty, params)))
        gids.append(missing)
        values.append(np.ravel(got.values))
        names.append(pa.array(got.names, type=pa.string()))
        missing = missing[:0]
    for gid in missing:  # public keys without rows: released from empty data on the driver
        key_hash = hashes[int(gid)].as_py()
        empty = pd.DataFrame({GID: [int(gid)], CELL: [-1], COUNT: [0], KEY_HASH: [key_hash]})
        out = release_group(empty, dataclasses.replace(params, keys=(GID,)))
        gids.append(np.array([gid], dtype=np.int64))
        values.append(np.asarray(out["value"], dtype=np.float64))
        names.append(pa.array([out[MECHANISM].iloc[0]], type=pa.string()))
    return _wide_table(req, key_table.select(list(req.keys)).take(pa.array(np.concatenate(gids))),
                       np.concatenate(values), pa.concat_arrays(names))


def _wide_table(req: QuantileRequest, keys: pa.Table, values: np.ndarray, names) -> pa.Table:
    """The wide release from its parts: one row per group (``keys``), the group's m values
    (``values``, group after group, in the order of ``quantiles``; NaN for a group flagged
    ``bounds_not_found``) and its mechanism (``names``)."""
    m = len(req.quantiles)
    columns = {k: keys.column(k) for k in req.keys}
    offsets = pa.array(np.arange(0, values.size + 1, m, dtype=np.int32))
    columns["value"] = pa.ListArray.from_arrays(offsets, pa.array(values, type=pa.float64()))
    columns[MECHANISM] = names
    return pa.table(columns)


def _long(req: QuantileRequest, wide: pa.Table) -> pa.Table:
    """The long release (m rows per group, in the order of ``quantiles``) from the wide one;
    a group flagged ``bounds_not_found`` has null values."""
    m = len(req.quantiles)
    per_row = pa.array(np.repeat(np.arange(wide.num_rows, dtype=np.int64), m))
    columns = {k: wide.column(k).take(per_row) for k in req.keys}
    columns["quantile"] = pa.array(np.tile(np.asarray(req.quantiles, dtype=np.float64),
                                           wide.num_rows), type=pa.float64())
    values = np.asarray(pc.list_flatten(wide.column("value")).to_numpy(zero_copy_only=False),
                        dtype=np.float64)
    columns["value"] = pa.array(values, type=pa.float64(), mask=np.isnan(values))
    columns[MECHANISM] = wide.column(MECHANISM).take(per_row)
    return pa.table(columns)


def _release_selected_keys(req: QuantileRequest, params: ReleaseParams, rows: DataFrame):
    """Keys from DP partition selection: stream key columns and cells through ``mapInArrow``.

    The keys stay Arrow arrays of their Spark types end to end (no pandas): a null and a NaN
    key are two keys and int64 keys keep all their bits. Each group's noisy unit count is tested
    against the threshold before its release; one job.
    """
    extra = {UNITS: F.col(UNITS)} if req.privacy_unit is not None else {}
    params = dataclasses.replace(params, extra_columns=tuple(extra))
    cells = flow.partitioned_cells(rows, req.keys, req.lower, req.upper, req.resolution,
                                   list(extra.values()), granularity=req.granularity)
    schema = _output_schema(req)
    arrow_schema = _compat.arrow_schema(schema)

    def fn(batches):  # no type hints: pyspark must not try to infer an eval type (nor print params)
        for batch in release_keyed_partition(batches, params):
            yield pa.RecordBatch.from_arrays(
                [column.cast(field.type) for column, field in zip(batch.columns, arrow_schema)],
                schema=arrow_schema)

    return to_arrow(cells.mapInArrow(fn, schema=schema))


def _release_global(req: QuantileRequest, params: ReleaseParams, rows: DataFrame):
    """No grouping. With bounds: pass 1 collects rows per coarse cell ``k >> GLOBAL_SHIFT``
    (at most 2**16 + 1); the driver draws the noisy count and chooses (``"auto"``); JointExp
    and IndExp then get the grid indices of their reachable coarse cells (pass 2, filtered by
    cell; a further pass only if the band from the fine data read reaches a cell not read:
    :func:`~dpq_spark.core.quantiles.coarse_bands.settle`) and the pruned cells at their left edges; the
    other mechanisms get rows per cell ``k >> 12`` (pass 2) at those cells' representative
    points, as on the grouped path. Without bounds, bucket counts in one job."""
    if req.lower is None:
        counts = flow.cell_counts(rows, req.lower, req.upper, req.resolution)
        pdf = to_arrow(counts).to_pandas()
        if pdf.empty:
            pdf = pd.DataFrame({CELL: np.empty(0, np.int64), COUNT: np.empty(0, np.int64)})
        out = release_group(pdf, params)
        return pa.Table.from_pandas(out, preserve_index=False)
    g = req.granularity
    cells, counts = _cell_counts(flow.coarse_counts(rows, req.lower, req.upper, GLOBAL_SHIFT, g))
    source, name, eps, n_used = _release._start_group(int(counts.sum()), None, 0, params)
    if name not in _release.FINE_MECHANISMS:
        # The choice was made from the noisy count: which pass 2 runs depends on it alone.
        shift = _release.coarse_shift(params)  # COARSE_SHIFT; on a declared grid, <= 2**20 cells
        cells, counts = _cell_counts(flow.coarse_counts(rows, req.lower, req.upper, shift, g))
        values = _release._run_coarse(name, cells, counts, source, eps, params, shift, n_used)
    else:
        def band(fine):
            return _release.band_keep(name, cells, counts, eps, params, GLOBAL_SHIFT, fine)

        def fetch(mask):
            # Few rows: collect their indices and count on the driver (no shuffle); else count
            # in Spark. Both give the same counts, so the release does not depend on the branch.
            raw = int(counts[mask].sum()) <= _RAW_PASS2_ROWS
            fine = to_arrow(flow.fine_counts_in(rows, req.lower, req.upper, cells[mask],
                                                GLOBAL_SHIFT, aggregate=not raw, granularity=g))
            k = fine.column(CELL).to_numpy().astype(np.int64)
            if raw:
                k, w = np.unique(k, return_counts=True)
            else:
                order = np.argsort(k)
                k, w = k[order], fine.column(COUNT).to_numpy().astype(np.int64)[order]
            if int(w.sum()) != int(counts[mask].sum()):
                raise RuntimeError("`df` gave different rows in the two passes over it: the "
                                   "ungrouped path needs an input that gives the same rows "
                                   "each time (not an unseeded rand() column)")
            return k, w

        # Pass 2 reads a first guess of the reachable cells: the band from rows spread evenly
        # in the target cells, widened by 2 + m / 2 nats of log L (on 1e8 normal rows the
        # guessed log L was within 4 nats of the real one); the band from the real fine data
        # then decides, and a further pass reads any cell it reaches that was not read (settle).
        guess = spread_evenly(cells, counts, params.quantiles, shift=GLOBAL_SHIFT)
        first = _release.band_keep(name, cells, counts, eps, params, GLOBAL_SHIFT, guess,
                                   guess_log_tol(len(params.quantiles)))
        keep, k, w = settle(band, fetch, first)
        k, w = represent(k, w, cells, counts, keep, shift=GLOBAL_SHIFT)
        values = _release._run_fine(name, k, w, source, eps, params,
                                    _release.pruned_entries(k, cells, keep, GLOBAL_SHIFT))
    m = len(params.quantiles)
    return pa.table({"quantile": pa.array(params.quantiles, type=pa.float64()),
                     "value": pa.array(values, type=pa.float64()),
                     MECHANISM: pa.array([name] * m, type=pa.string())})


def guess_log_tol(m: int) -> float:
    """``-log(tol)`` of the first guess of the global path's band: 2 + m / 2 nats more than
    the real band's, to cover the guessed ``log L``'s error."""
    return BAND_LOG_TOL + 2.0 + m / 2.0


def _cell_counts(frame: DataFrame):
    """Collect ``(CELL, COUNT)`` rows as sorted int64 arrays (one job)."""
    table = to_arrow(frame)
    cells = table.column(CELL).to_numpy().astype(np.int64)
    counts = table.column(COUNT).to_numpy().astype(np.int64)
    order = np.argsort(cells, kind="stable")
    return cells[order], counts[order]


def _long_from_wide(req: QuantileRequest, ordered) -> DataFrame:
    """The long layout as Spark's explode of the wide local relation ``ordered`` (sorted by key):
    m rows per group, in the order of ``quantiles``, so the rows come sorted by key then
    quantile. The released numbers are the local data's, and the explode is a deterministic
    projection of them (reading it again releases nothing new); the local relation holds one
    row per group instead of m, which is what building and shipping it costs (1e5 keys of
    deciles, 9e5 rows: 2.7 s for the whole release against 4.9 s with a 9e5-row relation, and
    0.6-1.2 s against 3.2-3.9 s to read it by ``toPandas()``)."""
    spark = req.df.sparkSession
    wide = create_dataframe(spark, ordered, _wide_schema(req))
    at = F.col(_POSITION)
    quantile = F.lit(float(req.quantiles[-1]))
    for j in range(len(req.quantiles) - 2, -1, -1):  # literals only: never null
        quantile = F.when(at == j, F.lit(float(req.quantiles[j]))).otherwise(quantile)
    exploded = wide.select(*[F.col(k) for k in req.keys],
                           F.posexplode("value").alias(_POSITION, "value"), F.col(MECHANISM))
    # a group flagged bounds_not_found holds NaN in the wide arrays and null in the long rows
    value = F.when(F.isnan("value"), F.lit(None).cast("double")).otherwise(F.col("value"))
    return exploded.select(*[F.col(k) for k in req.keys], quantile.alias("quantile"),
                           value.alias("value"), F.col(MECHANISM)).to(_output_schema(req))


def _materialise(req: QuantileRequest, wide: pa.Table) -> DataFrame:
    """Return a DataFrame over the released rows (``wide``: one row per group, from
    :func:`_wide_table`), sorted on the driver by key (then quantile).

    The order is Spark's ``orderBy(asc_nulls_first(key)..., "quantile")``; the result is a
    local relation with no ``orderBy``, so reading it runs no sort job (and no job at all, but
    for a long release of more than ``_EXPLODE_ROWS`` rows: :func:`_long_from_wide`). Only for
    key types that :func:`dpq_spark.spark._keys.spark_order` does not order (nested types,
    strings with a collation other than ``UTF8_BINARY``) does Spark sort.
    """
    spark = req.df.sparkSession
    collated = any(is_collated(req.df.schema[k].dataType) for k in req.keys)
    long_rows = wide.num_rows * len(req.quantiles)
    if req.layout == "long" and req.keys and not collated and long_rows > _EXPLODE_ROWS:
        return _long_from_wide(req, spark_order(wide, req.keys, ()))
    if req.layout == "wide":
        table, schema, then = wide, _wide_schema(req), ()
    else:
        table, schema, then = _long(req, wide), _output_schema(req), ("quantile",)
    if not req.keys:
        ordered = table
    else:
        ordered = None if collated else spark_order(table, req.keys, then)
    if ordered is not None:
        return create_dataframe(spark, ordered, schema)
    out = create_dataframe(spark, table, schema)
    return out.orderBy(*[F.col(k).asc_nulls_first() for k in req.keys], *then)
