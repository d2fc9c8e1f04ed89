"""A gray-box neighbour harness for ``dp_quantiles`` (after Cebere et al., Re:cord-play, 2026).

The release is run on two neighbouring DataFrames, ``D`` and ``D'`` = ``D`` without every row
of one privacy unit, with the same seeded Generator, so that every random choice outside the
noise is the same on both sides. :func:`observe` records, from outside the production code:

- what a reader of the release sees: the number of Spark jobs (``counting_jobs``), the output
  schema, its rows;
- the data each group's mechanism receives: the rows kept by contribution bounding, clamped and
  mapped to their grid index (or bucket), rebuilt on the driver from the plan ``dp_quantiles``
  builds (``quantiles._plan``), with one extra Spark job that the release itself never runs;
- on the public-key path, the fold of each stretch of whole buckets of each shuffle partition
  (spilled or not, distinct cells held) and the release replayed in this process from the very
  codes Spark fed the Python workers, which must equal what Spark released (the replay is
  seed-for-seed the executors' code).

:func:`transcript_bound` is the statistic of the transcript-ratio test: from the outputs of
many seeded runs on each neighbour, binned, a lower confidence bound on the largest log-ratio
of the two output laws over the bins (a DP release keeps it at most epsilon).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import functions as F
from scipy import stats

from dpq_spark import dp_quantiles
from dpq_spark.spark import _compat
from dpq_spark.spark import _dataflow as flow
from dpq_spark.spark import _release
from dpq_spark.spark import quantiles as Q
from dpq_spark.spark._arguments import parse_request
from dpq_spark.spark._columns import BUCKET, CELL, CODE, CODES, COUNTS, GID, KEY_HASH
from dpq_spark.spark._fold import Fold
from dpq_spark.spark._packing import bucket_pieces

_PID = "__neighbours_pid"

#: dp_quantiles' keyword arguments and their defaults (parse_request wants all of them).
ARGUMENTS = dict(lower=None, upper=None, group_by=None, groups=None, neighboring="add_remove",
                 privacy_unit=None, max_rows_per_unit=1, max_groups_per_unit=1, delta=None,
                 resolution=None, mechanism="auto", selection_fraction=0.5, bounds_share=None,
                 layout="long")


def without_unit(pdf: pd.DataFrame, unit_column: str, unit) -> pd.DataFrame:
    """The neighbour of ``pdf`` without every row of one privacy unit."""
    return pdf[pdf[unit_column] != unit].reset_index(drop=True)


@dataclasses.dataclass
class Observed:
    """What one release showed: its public face and its internals."""

    jobs: int  # Spark jobs the release ran
    schema: str  # the output's schema, as JSON
    rows: list  # the output's rows, as tuples, in order
    kept: Counter  # (unit, keys..., cell) -> rows kept by bounding (unit None without one)
    # public keys: per stretch of each shuffle partition, (spilled, distinct codes, its keys,
    # the partition's keys)
    folds: list | None
    # public keys: each shuffle partition's packed rows, as Spark handed them to the worker,
    # and the key tuple of each group id (for replays at other budgets: stretch_folds)
    partitions: list | None
    key_of: list | None
    replayed: dict | None  # public keys, seeded: key tuple -> values, replayed in this process
    params: _release.ReleaseParams  # the per-group parameters the release used
    keys: tuple  # key columns

    def keys_out(self) -> list:
        """The output's keys, one per row (the long layout)."""
        return [row[:len(self.keys)] for row in self.rows]

    def values(self) -> dict:
        """key tuple -> tuple of (quantile, value, mechanism) rows of that key."""
        out: dict = {}
        for row in self.rows:
            out.setdefault(tuple(row[:len(self.keys)]), []).append(tuple(row[len(self.keys):]))
        return {k: tuple(v) for k, v in out.items()}

    def group_data(self) -> dict:
        """key tuple -> Counter of cells: the data that group's mechanism receives."""
        out: dict = {}
        for (unit, *rest), n in self.kept.items():
            key, cell = tuple(rest[:-1]), rest[-1]
            out.setdefault(key, Counter())[cell] += n
        return out

    def unit_rows(self, unit) -> dict:
        """key tuple -> rows of ``unit`` kept in that group."""
        out: dict = {}
        for (u, *rest), n in self.kept.items():
            if u == unit:
                out[tuple(rest[:-1])] = out.get(tuple(rest[:-1]), 0) + n
        return out


def _request(df, column, seed, kwargs):
    args = {**ARGUMENTS, **kwargs}
    rng = None if seed is None else np.random.default_rng(seed)
    return parse_request(df, column, rng=rng, **args)


def observe(spark, pdf: pd.DataFrame, column: str, seed, *, schema=None, folds: bool = True,
            **kwargs) -> Observed:
    """Release ``dp_quantiles(df, column, rng=default_rng(seed), **kwargs)`` on the DataFrame of
    ``pdf`` (``seed=None``: production randomness) and record what it showed. Without a
    ``privacy_unit`` the unit is one row and the kept rows carry no unit (``None``).
    ``folds=False`` skips the replay of the public-key path's folds (one Spark job less)."""
    df = spark.createDataFrame(pdf, schema=schema)
    rng = None if seed is None else np.random.default_rng(seed)
    with Q.counting_jobs() as jobs:
        out = dp_quantiles(df, column, rng=rng, **kwargs)
    rows = [tuple(r) for r in out.collect()]
    req = _request(df, column, seed, kwargs)
    key_table = Q._public_keys(req)
    params, frame, lookup = Q._plan(req, key_table)
    kept = _kept(req, frame)
    replay = folds and key_table is not None and req.lower is not None
    folds = partitions = key_of = replayed = None
    if replay:
        folds, partitions, key_of, replayed = _public_key_folds(req, params, frame, key_table,
                                                                lookup, seed is not None)
    return Observed(jobs[0], out.schema.json(), rows, kept, folds, partitions, key_of, replayed,
                    params, req.keys)


def _grid(req) -> dict:
    """The declared grid step of the request, as a keyword, when it has one (releases on a
    column type's own grid); none on the default grid."""
    step = getattr(req, "granularity", None)
    return {} if step is None else {"granularity": step}


def _kept(req, frame) -> Counter:
    """The rows that reach the mechanisms, after bounding: (unit, keys..., cell) counts."""
    unit = req.privacy_unit is not None
    cols = [F.col(flow.UNIT).alias("u") if unit else F.lit(None).alias("u")]
    cols += [F.col(k) for k in req.keys]
    cols.append(flow.value_cell(req.lower, req.upper, req.resolution, **_grid(req)).alias(CELL))
    table = _compat.to_arrow(frame.select(*cols))
    return Counter(zip(*[table.column(i).to_pylist() for i in range(table.num_columns)]))


def _public_key_folds(req, params, frame, key_table, lookup, seeded):
    """Replay the public-key path's Python side partition by partition, from the codes Spark
    shuffled: the fold of each stretch of whole buckets (spilled?, distinct codes; cut as
    ``release_partition`` cuts them) and, seeded, the partition's release (key tuple ->
    released values)."""
    key_of = list(zip(*[key_table.column(k).to_pylist() for k in req.keys]))
    hashes = key_table.column(KEY_HASH).to_pylist()
    params = dataclasses.replace(params, extra_columns=(CODE,),
                                 key_hashes=tuple(hashes) if seeded else None)
    codes = flow.partitioned_codes(frame, req.lower, req.upper, req.resolution, lookup,
                                   **_grid(req), groups=key_table.num_rows)
    table = _compat.to_arrow(codes.withColumn(_PID, F.spark_partition_id()))
    pids = np.asarray(table.column(_PID).to_numpy())
    partitions, replayed = [], {}
    for pid in sorted(set(pids.tolist())):
        part = table.filter(pa.array(pids == pid)).select([BUCKET, CODES, COUNTS])
        batches = part.combine_chunks().to_batches()
        partitions.append(batches)
        if seeded:
            for out in _release.release_partition(iter(batches), params):
                for gid, value in zip(out.column(GID).to_pylist(), out.column("value").to_pylist()):
                    replayed[key_of[gid]] = tuple(value)
    return (stretch_folds(partitions, params, key_of), partitions, key_of,
            replayed if seeded else None)


def stretch_folds(partitions, params, key_of) -> list:
    """Each partition's stretches as ``release_partition`` cuts them at ``params``' budget: per
    stretch with groups, (its fold spilled?, its distinct codes, its keys, its partition's
    keys)."""
    folds = []
    for batches in partitions:
        stretches, fold, gids = [], _release.stretch_fold(params), set()
        for codes, counts, whole in bucket_pieces(iter(batches), params.fold_budget):
            if codes.size:
                fold.add(codes, counts)
                gids |= set((codes >> Fold.SHIFT).tolist())
            if whole:
                stretches.append((fold, gids))
                fold, gids = _release.stretch_fold(params), set()
        stretches.append((fold, gids))
        everyone = frozenset(key_of[g] for _, gids in stretches for g in gids)
        for fold, gids in stretches:
            fold.finish()
            if gids:
                held = int((fold.coarse if fold.spilled else fold.fine).codes.size)
                folds.append((fold.spilled, held, frozenset(key_of[g] for g in gids), everyone))
            fold.close()
    return folds


def kept_of_others(observed: Observed, unit) -> Counter:
    """The kept rows of every unit but ``unit``."""
    return Counter({k: n for k, n in observed.kept.items() if k[0] != unit})


def transcript_bound(a, b, bins, alpha: float) -> float:
    """A lower confidence bound on ``max_S |log P_a(S) / P_b(S)|`` over the events ``S``.

    ``a`` and ``b`` are arrays of outputs (one per run) on the two neighbours: a released value,
    or NaN for a run that ended in a (documented, DP) refusal such as ``BoundsNotFoundError``.
    The events are the bins of ``bins`` (edges; values outside fall in the first or last bin)
    and NaN. For each event and direction, one-sided Clopper-Pearson bounds on the two
    probabilities at level ``alpha / (4 * events)`` (Bonferroni over every bound used), so that
    for an epsilon-DP release the returned bound exceeds epsilon with probability at most
    ``alpha``."""
    edges = np.asarray(bins, dtype=np.float64)

    def counts(x):
        x = np.asarray(x, dtype=np.float64)
        cells = np.clip(np.searchsorted(edges, x[~np.isnan(x)], side="right") - 1, 0,
                        edges.size - 2)
        return np.append(np.bincount(cells, minlength=edges.size - 1), np.isnan(x).sum())

    ca, cb = counts(a), counts(b)
    level = alpha / (4 * ca.size)
    best = -np.inf
    for x, nx, y, ny in ((ca, len(a), cb, len(b)), (cb, len(b), ca, len(a))):
        lo = np.where(x > 0, stats.beta.ppf(level, np.maximum(x, 1), nx - x + 1), 0.0)
        hi = np.where(y < ny, stats.beta.ppf(1 - level, y + 1, np.maximum(ny - y, 1)), 1.0)
        with np.errstate(divide="ignore"):
            ratio = np.where(lo > 0, np.log(np.maximum(lo, 1e-300)) - np.log(hi), -np.inf)
        best = max(best, float(ratio.max()))
    return best
