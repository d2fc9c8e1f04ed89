"""The per-group step of ``dp_quantiles``: grid-cell counts in, one DP release out.

This runs inside ``mapInArrow`` on the executors (streaming each partition's rows) and on the
driver when there is no grouping or a public key has no rows. It imports pandas, numpy and
pyarrow only, never pyspark, so that it pickles by reference and stays cheap to import in a
Python worker.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from dpq_spark.core._random import resolve_rng
from dpq_spark.core._samplers import discrete_laplace
from dpq_spark.spark._mechanisms import get_mechanism

__all__ = ["CELL", "COUNT", "UNITS", "KEY_HASH", "MECHANISM", "ReleaseParams", "cell_values",
           "release_group", "release_counts", "release_values", "release_partition", "CODE", "GID",
           "BUCKET_BITS", "BUCKET_EMIN", "BUCKET_EMAX", "BUCKET_FLOOR", "BUCKET_CAP",
           "BUCKET_OFFSET", "BUCKETS", "bucket_index", "bucket_values", "release_keyed_partition"]

# Internal column names of the aggregated frame (the "__dpq_" prefix is reserved).
CELL = "__dpq_cell"
CODE = "__dpq_code"  # public-key path: key index * resolution + cell, packed in the JVM
GID = "__dpq_gid"  # public-key path: index of the key in the driver's key list
COUNT = "__dpq_count"
UNITS = "__dpq_units"
KEY_HASH = "__dpq_key_hash"
MECHANISM = "mechanism"  # output column: the mechanism that ran for the group

# The public log-scale bucket grid of the bounds-free path (``lower = upper = None``). A value x
# with BUCKET_FLOOR <= |x| is written |x| = 2**e * f, 1 <= f < 2, e clamped to
# [BUCKET_EMIN, BUCKET_EMAX] (|x| is first clamped to BUCKET_CAP), and falls in mantissa bucket
# b = floor((f - 1) * 2**BUCKET_BITS): relative width 2**-20 (about 9.5e-7). Its index is
# BUCKET_OFFSET + sign(x) * ((e - BUCKET_EMIN) * 2**BUCKET_BITS + b + 1); |x| < BUCKET_FLOOR
# (0 included) has index BUCKET_OFFSET. The index is monotone in x; the Spark side computes it
# with built-ins (_dataflow.bucket_column), :func:`bucket_index` is the numpy reference.
BUCKET_BITS = 20
BUCKET_EMIN = -32
BUCKET_EMAX = 63
BUCKET_FLOOR = 2.0**BUCKET_EMIN  # about 2.3e-10
BUCKET_CAP = float(np.nextafter(2.0**(BUCKET_EMAX + 1), 0.0))  # just below 2**64, about 1.8e19
BUCKET_OFFSET = (BUCKET_EMAX - BUCKET_EMIN + 1) << BUCKET_BITS
BUCKETS = 2 * BUCKET_OFFSET + 1  # indexes 0 .. BUCKETS - 1 (about 2.0e8 < 2**28)


def bucket_index(x) -> np.ndarray:
    """The bucket index of each value (numpy reference of the Spark expression; no NaN)."""
    x = np.asarray(x, dtype=np.float64)
    a = np.minimum(np.abs(x), BUCKET_CAP)
    frac, exp = np.frexp(a)  # a = frac * 2**exp, 0.5 <= frac < 1
    e = np.clip(exp - 1, BUCKET_EMIN, BUCKET_EMAX)
    f = np.ldexp(a, -e)
    b = np.clip(np.floor((f - 1.0) * 2.0**BUCKET_BITS), 0, 2**BUCKET_BITS - 1).astype(np.int64)
    mag = (e.astype(np.int64) - BUCKET_EMIN) * (1 << BUCKET_BITS) + b + 1
    mag = np.where(a >= BUCKET_FLOOR, mag, 0)
    return BUCKET_OFFSET + np.sign(x).astype(np.int64) * mag


def bucket_values(index) -> np.ndarray:
    """The representative value of each bucket: the midpoint of its mantissa interval (0 for
    the zero bucket). Strictly increasing in the index."""
    idx = np.asarray(index, dtype=np.int64) - BUCKET_OFFSET
    mag = np.abs(idx)
    e = (mag - 1) // (1 << BUCKET_BITS) + BUCKET_EMIN
    b = (mag - 1) % (1 << BUCKET_BITS)
    v = np.ldexp(1.0 + (b + 0.5) / 2.0**BUCKET_BITS, e.astype(np.int64))
    return np.where(mag == 0, 0.0, np.sign(idx) * v)

_UINT64 = 1 << 64


@dataclass(frozen=True)
class ReleaseParams:
    """Public, validated parameters of one group's release (pickled to the executors).

    ``epsilon`` is what the mechanism receives for one group, after the split for partition
    selection and the scaling for contribution bounding. ``threshold``/``noise_scale`` are set
    only when keys come from DP partition selection. ``base_seed`` is ``None`` in production
    (fresh OS entropy in every call) and an int only when the caller passed a Generator.
    ``lower = upper = None`` is the bounds-free path: cells are indexes of the public log-scale
    bucket grid (``resolution == BUCKETS``) and the mechanism buys private bounds with
    ``bounds_share`` of ``epsilon`` (``None``: the core's default).
    """

    keys: tuple[str, ...]
    quantiles: tuple[float, ...]
    epsilon: float
    lower: float | None
    upper: float | None
    resolution: int
    neighboring: str
    mechanism: str
    base_seed: int | None = None
    threshold: float | None = None
    noise_scale: float | None = None
    integral_keys: tuple[bool, ...] = ()
    extra_columns: tuple[str, ...] = ()
    key_hashes: tuple[int, ...] | None = None  # public-key path with a seeded rng only
    bounds_share: float | None = None  # bounds-free path only

    @property
    def bounds_free(self) -> bool:
        return self.lower is None


def cell_values(cells: np.ndarray, params: ReleaseParams) -> np.ndarray:
    """Midpoints of grid cells ``0 .. resolution - 1`` over ``[lower, upper]``, or the
    representative values of log-scale buckets on the bounds-free path."""
    if params.bounds_free:
        return bucket_values(cells)
    width = (params.upper - params.lower) / params.resolution
    values = params.lower + (np.asarray(cells, dtype=np.float64) + 0.5) * width
    return np.clip(values, params.lower, params.upper)


def _group_rng(params: ReleaseParams, key_hash) -> np.random.Generator:
    if params.base_seed is None:
        return resolve_rng(None)
    return np.random.default_rng([params.base_seed, int(key_hash) % _UINT64])


def release_group(pdf: pd.DataFrame, params: ReleaseParams) -> pd.DataFrame:
    """Release the quantiles of one group from its cell counts (driver side).

    Parameters
    ----------
    pdf : pandas.DataFrame
        The rows of one group: key columns (absent when ungrouped), ``CELL`` (grid cell),
        ``COUNT`` (rows in the cell, 0 rows allowed), optionally ``UNITS`` (privacy units first
        seen in the cell) and ``KEY_HASH``.
    params : ReleaseParams
        Public parameters.

    Returns
    -------
    pandas.DataFrame
        Key columns, ``quantile`` and ``value``: one row per quantile, or no rows when partition
        selection drops the group.

    Privacy
    -------
    ``params.epsilon``-DP for the group's cell counts under ``params.neighboring`` (the
    mechanism's guarantee); with partition selection, also the Laplace threshold step.
    """
    real = pdf[pdf[COUNT] > 0]
    cells = real[CELL].to_numpy(dtype=np.int64)
    counts = real[COUNT].to_numpy(dtype=np.int64)
    order = np.argsort(cells, kind="stable")
    units = int(real[UNITS].sum()) if UNITS in real.columns else None
    key_hash = pdf[KEY_HASH].iloc[0] if KEY_HASH in pdf.columns and len(pdf) else 0
    keys = {k: pdf[k].iloc[0] for k in params.keys}
    return release_counts(keys, cells[order], counts[order], units, key_hash, params)


def release_counts(keys: dict, cells: np.ndarray, counts: np.ndarray, units, key_hash,
                   params: ReleaseParams) -> pd.DataFrame:
    """Release one group from sorted distinct ``cells`` and their ``counts``.

    ``units`` is the group's count of privacy units for partition selection (``None``: one row
    is one unit, so it is ``counts.sum()``).
    """
    out = release_values(cells, counts, units, key_hash, params)
    if out is None:
        return _frame(keys, params, np.empty(0), params.mechanism)
    return _frame(keys, params, *out)


def release_values(cells: np.ndarray, counts: np.ndarray, units, key_hash,
                   params: ReleaseParams) -> tuple[np.ndarray, str] | None:
    """The released values of one group and the name of the mechanism that ran (for ``"auto"``
    the one it picked), or ``None`` when partition selection drops the group."""
    rng = _group_rng(params, key_hash)
    if params.threshold is not None:
        # integer unit count + exact discrete Laplace noise vs an integer threshold (_selection)
        size = int(counts.sum()) if units is None else int(units)
        if size + discrete_laplace(resolve_rng(rng), params.noise_scale) < params.threshold:
            return None
    mechanism = get_mechanism(params.mechanism)
    # bounds-free: the registry entry buys private bounds first (bounds_share of epsilon)
    extra = {"bounds_share": params.bounds_share} if params.bounds_share is not None else {}
    out = mechanism(
        cell_values(cells, params),
        np.asarray(params.quantiles, dtype=np.float64),
        epsilon=params.epsilon,
        lower=params.lower,
        upper=params.upper,
        neighboring=params.neighboring,
        counts=counts,
        rng=rng,
        **extra,
    )
    name = getattr(out, "mechanism", None) or params.mechanism
    return np.asarray(out, dtype=np.float64), str(name)


_COMPACT_ROWS = 1 << 22  # raw (group, cell) codes buffered before they are merged into counts
_OUTPUT_GROUPS = 512  # groups per yielded output batch


def _normal_key(values: tuple) -> tuple:
    """Hashable, NaN-safe key (pandas turns a null into NaN; NaN != NaN would split groups)."""
    return tuple(("nan",) if isinstance(v, float) and v != v else v for v in values)


def _merge_codes(acc_codes, acc_counts, chunks):
    """Fold raw codes (one per row) into the sorted distinct codes and their counts."""
    raw = np.sort(np.concatenate(chunks))
    starts = np.flatnonzero(np.r_[True, raw[1:] != raw[:-1]])
    codes, counts = raw[starts], np.diff(np.r_[starts, len(raw)])
    if acc_codes.size:
        codes = np.concatenate([acc_codes, codes])
        counts = np.concatenate([acc_counts, counts])
        order = np.argsort(codes, kind="stable")
        codes, counts = codes[order], counts[order]
        starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
        codes, counts = codes[starts], np.add.reduceat(counts, starts)
    return codes, counts


def release_partition(batches, params: ReleaseParams):
    """``mapInPandas`` body: count (group, cell) pairs of one partition, release each group.

    The input is hash partitioned by key, so every group is whole in one partition. Each row is
    one kept data row. With public keys it is a single ``CODE`` (key index * resolution + cell)
    and the output carries ``GID`` instead of the key columns; with keys from partition
    selection it is the key columns, ``CELL``, optionally ``UNITS`` (1 on the first row of each
    privacy unit in the group) and ``KEY_HASH``. Rows are streamed batch by batch and reduced to
    counts per distinct (group, cell) every few million rows, so memory is bounded by the number
    of distinct (group, cell) pairs of the partition (at most ``resolution`` per group), never
    by a group's number of rows.
    """
    keys = list(params.keys)
    res = params.resolution
    packed = CODE in params.extra_columns
    gid_of: dict = {}
    key_values: list[tuple] = []
    key_hashes: list = []
    units = np.zeros(0, dtype=np.int64)
    acc_codes = np.zeros(0, dtype=np.int64)
    acc_counts = np.zeros(0, dtype=np.int64)
    chunks: list[np.ndarray] = []
    buffered = 0
    for pdf in batches:
        if len(pdf) == 0:
            continue
        if packed:  # key index and cell already packed into one int64 by Spark
            chunks.append(np.asarray(pdf[CODE], dtype=np.int64))  # pandas or Arrow batch
            buffered += len(pdf)
            if buffered >= _COMPACT_ROWS:
                acc_codes, acc_counts = _merge_codes(acc_codes, acc_counts, chunks)
                chunks, buffered = [], 0
            continue
        if len(keys) == 1:
            local, _ = pd.factorize(pdf[keys[0]], use_na_sentinel=False)
        else:
            local = pdf.groupby(keys, dropna=False, sort=False).ngroup().to_numpy()
        local = np.asarray(local, dtype=np.int64)
        _, first = np.unique(local, return_index=True)
        firsts = pdf.iloc[first]
        to_gid = np.empty(len(first), dtype=np.int64)
        hashes = firsts[KEY_HASH].tolist() if KEY_HASH in pdf.columns else [0] * len(first)
        for j, values in enumerate(firsts[keys].itertuples(index=False, name=None)):
            norm = _normal_key(values)
            gid = gid_of.get(norm)
            if gid is None:
                gid = gid_of[norm] = len(key_values)
                key_values.append(values)
                key_hashes.append(hashes[j])
            to_gid[j] = gid
        gids = to_gid[local]
        chunks.append(gids * res + pdf[CELL].to_numpy(dtype=np.int64))
        buffered += len(pdf)
        if UNITS in pdf.columns:
            add = np.bincount(gids, weights=pdf[UNITS].to_numpy(dtype=np.float64),
                              minlength=len(key_values)).astype(np.int64)
            units = np.concatenate([units, np.zeros(len(add) - len(units), dtype=np.int64)]) + add
        if buffered >= _COMPACT_ROWS:
            acc_codes, acc_counts = _merge_codes(acc_codes, acc_counts, chunks)
            chunks, buffered = [], 0
    if chunks:
        acc_codes, acc_counts = _merge_codes(acc_codes, acc_counts, chunks)
    if acc_codes.size == 0:
        return
    group_of = acc_codes // res
    cells = acc_codes - group_of * res
    starts = np.flatnonzero(np.r_[True, group_of[1:] != group_of[:-1]])
    ends = np.r_[starts[1:], len(group_of)]
    if packed:  # arrays only: no per-group pandas frame
        m = len(params.quantiles)
        q = np.asarray(params.quantiles, dtype=np.float64)
        for lo in range(0, len(starts), _OUTPUT_GROUPS):
            gids, values, names = [], [], []
            for a, b in zip(starts[lo:lo + _OUTPUT_GROUPS], ends[lo:lo + _OUTPUT_GROUPS]):
                gid = int(group_of[a])
                key_hash = params.key_hashes[gid] if params.key_hashes is not None else 0
                gids.append(gid)
                group_values, name = release_values(cells[a:b], acc_counts[a:b], None, key_hash,
                                                    params)
                values.append(group_values)
                names.append(name)
            yield pd.DataFrame({GID: np.repeat(np.asarray(gids, dtype=np.int64), m),
                                "quantile": np.tile(q, len(gids)),
                                "value": np.concatenate(values),
                                MECHANISM: np.repeat(np.asarray(names, dtype=object), m)})
        return
    done = []
    for a, b in zip(starts, ends):
        gid = int(group_of[a])
        group_keys = dict(zip(keys, _output_key(key_values[gid], params)))
        group_units = int(units[gid]) if UNITS in params.extra_columns else None
        done.append(release_counts(group_keys, cells[a:b], acc_counts[a:b], group_units,
                                   key_hashes[gid], params))
        if len(done) >= _OUTPUT_GROUPS:
            yield pd.concat(done, ignore_index=True)
            done = []
    if done:
        yield pd.concat(done, ignore_index=True)


def _output_key(values: tuple, params: ReleaseParams) -> tuple:
    """Key values as the output column types expect (pandas may have turned ints into floats
    and nulls into NaN within a batch)."""
    out = []
    for v, integral in zip(values, params.integral_keys):
        if isinstance(v, float) and v != v:
            v = None if integral else v
        elif integral and isinstance(v, (float, np.floating)):
            v = int(v)
        elif isinstance(v, np.generic):
            v = v.item()
        out.append(v)
    return tuple(out)


def _frame(keys: dict, params: ReleaseParams, values: np.ndarray, mechanism: str) -> pd.DataFrame:
    m = len(values)
    data = {k: pd.Series([v] * m) for k, v in keys.items()}
    data["quantile"] = np.asarray(params.quantiles[:m], dtype=np.float64)
    data["value"] = values
    data[MECHANISM] = pd.Series([mechanism] * m, dtype=object)
    return pd.DataFrame(data)


def release_keyed_partition(batches, params: ReleaseParams):
    """``mapInArrow`` body for keys from partition selection: Arrow batches in and out.

    Each input row is one kept data row: the key columns, ``CELL`` and, with a privacy unit,
    ``UNITS``. Keys are numbered with :class:`dpq_spark.spark._keys.KeyIndex` (pyarrow, never
    pandas: null and NaN are distinct keys, int64 keys stay exact), then folded into counts per
    distinct (key, cell) exactly as the public-key path folds its codes. Each group is released
    (or dropped by the partition-selection threshold); the output batches carry the key columns
    as the same Arrow arrays the keys came in, ``quantile``, ``value`` and ``MECHANISM``.
    """
    from dpq_spark.spark._keys import KeyIndex, key_seed

    index = KeyIndex(params.keys)
    res = params.resolution
    with_units = UNITS in params.extra_columns
    units = np.zeros(0, dtype=np.int64)
    acc_codes = np.zeros(0, dtype=np.int64)
    acc_counts = np.zeros(0, dtype=np.int64)
    chunks: list[np.ndarray] = []
    buffered = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        gids = index.gids([batch.column(k) for k in params.keys])
        cells = batch.column(CELL).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        chunks.append(gids * res + cells)
        buffered += batch.num_rows
        if with_units:
            weights = batch.column(UNITS).to_numpy(zero_copy_only=False).astype(np.float64)
            add = np.bincount(gids, weights=weights, minlength=index.size).astype(np.int64)
            units = np.concatenate([units, np.zeros(len(add) - len(units), dtype=np.int64)]) + add
        if buffered >= _COMPACT_ROWS:
            acc_codes, acc_counts = _merge_codes(acc_codes, acc_counts, chunks)
            chunks, buffered = [], 0
    if chunks:
        acc_codes, acc_counts = _merge_codes(acc_codes, acc_counts, chunks)
    if acc_codes.size == 0:
        return
    keys = index.table()
    group_of = acc_codes // res
    cells = acc_codes - group_of * res
    starts = np.flatnonzero(np.r_[True, group_of[1:] != group_of[:-1]])
    ends = np.r_[starts[1:], len(group_of)]
    q = np.asarray(params.quantiles, dtype=np.float64)
    for lo in range(0, len(starts), _OUTPUT_GROUPS):
        take, quantile, values, names = [], [], [], []
        for a, b in zip(starts[lo:lo + _OUTPUT_GROUPS], ends[lo:lo + _OUTPUT_GROUPS]):
            gid = int(group_of[a])
            seed = key_seed(index.values[gid]) if params.base_seed is not None else 0
            out = release_values(cells[a:b], acc_counts[a:b], int(units[gid]) if with_units
                                 else None, seed, params)
            if out is None:  # dropped by partition selection
                continue
            group_values, name = out
            take.append(np.full(len(group_values), gid, dtype=np.int64))
            quantile.append(q[:len(group_values)])
            values.append(group_values)
            names += [name] * len(group_values)
        if not take:
            continue
        picked = keys.take(pa.array(np.concatenate(take), type=pa.int64()))
        arrays = [picked.column(k).combine_chunks() for k in params.keys]
        arrays += [pa.array(np.concatenate(quantile), type=pa.float64()),
                   pa.array(np.concatenate(values), type=pa.float64()),
                   pa.array(names, type=pa.string())]
        yield pa.RecordBatch.from_arrays(arrays, names=[*params.keys, "quantile", "value",
                                                        MECHANISM])
