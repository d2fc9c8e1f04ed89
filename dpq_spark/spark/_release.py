"""The per-group step of ``dp_quantiles``: grid-index (or bucket) counts in, one DP release out.

This runs inside ``mapInArrow`` on the executors (streaming each partition's rows through a
:class:`Fold`) and on the driver when there is no grouping or a public key has no rows. With
bounds, JointExp and IndExp get each group's indices on the core's default grid (exact, or for a
partition past the fold budget the represented data of :mod:`dpq_spark.core.coarse_bands`);
ApproxQuantiles and AggTree get coarse cells. For ``mechanism="auto"`` the noisy count and choice
come first (:func:`~dpq_spark.core.choose.plan_auto`), so the fold knows which data a spilled
group needs. It imports numpy and pyarrow only (pandas only for the driver's per-group frames),
never pyspark or scipy, so that it pickles by reference and stays cheap to import in a Python
worker (tests/spark/test_worker_imports.py).
"""

from __future__ import annotations

import functools
import tempfile
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dpq_spark.core._random import resolve_rng
from dpq_spark.core.batch import BATCH_MECHANISMS, FlatGroups, release_many
from dpq_spark.core._samplers import discrete_laplace
from dpq_spark.core.choose import plan_auto
from dpq_spark.core.coarse_bands import (
    BAND_LOG_TOL,
    COARSE_SHIFT,
    coarse_midpoints,
    coarse_of,
    reachable,
    represent,
)
from dpq_spark.core.grid import Grid
from dpq_spark.core.ind_exp import ind_exp_indices
from dpq_spark.core.joint_exp import joint_exp_indices
from dpq_spark.core.privacy import (
    NeighboringRelation,
    joint_exp_sensitivity,
    single_quantile_sensitivity,
)
from dpq_spark.spark._mechanisms import get_mechanism

__all__ = ["CELL", "COUNT", "UNITS", "KEY_HASH", "MECHANISM", "ReleaseParams",
           "release_group", "release_counts", "release_values", "release_partition", "pack_partition",
           "CODE", "CODES", "COUNTS", "GID",
           "BUCKET_BITS", "BUCKET_EMIN", "BUCKET_EMAX", "BUCKET_FLOOR", "BUCKET_CAP",
           "BUCKET_OFFSET", "BUCKETS", "bucket_index", "bucket_values", "release_keyed_partition"]

# Internal column names of the aggregated frame (the "__dpq_" prefix is reserved).
CELL = "__dpq_cell"
CODE = "__dpq_code"  # public-key path: key index * resolution + cell, packed in the JVM
GID = "__dpq_gid"  # public-key path: index of the key in the driver's key list
CODES = "__dpq_codes"  # public-key path after packing: sorted codes of one group, as bytes
COUNTS = "__dpq_counts"  # ... and their counts as bytes (empty: one row each)
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
#: Distinct (group, grid index) pairs a partition may hold in memory before it considers a
#: spill (the driver copies the value into ``ReleaseParams.fold_budget``; tests lower it).
FOLD_BUDGET = 1 << 21
#: A fold past its budget spills only when its coarse counts would be at most this fraction of
#: its fine counts; otherwise the spill would hold as many counts as it frees, and the budget
#: doubles instead (copied into ``ReleaseParams.spill_shrink``; tests set 1.0 to force spills).
SPILL_SHRINK = 0.5


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
    extra_columns: tuple[str, ...] = ()
    key_hashes: tuple[int, ...] | None = None  # public-key path with a seeded rng only
    bounds_share: float | None = None  # bounds-free path only
    fold_budget: int = FOLD_BUDGET  # distinct (group, grid index) pairs before a partition spills
    spill_shrink: float = SPILL_SHRINK  # ... if its coarse counts are at most this fraction

    @property
    def bounds_free(self) -> bool:
        return self.lower is None


def _group_rng(params: ReleaseParams, key_hash) -> np.random.Generator:
    if params.base_seed is None:
        return resolve_rng(None)
    return np.random.default_rng([params.base_seed, int(key_hash) % _UINT64])


def release_group(pdf: pd.DataFrame, params: ReleaseParams) -> pd.DataFrame:
    """Release the quantiles of one group from its index counts (driver side).

    Parameters
    ----------
    pdf : pandas.DataFrame
        The rows of one group: key columns (absent when ungrouped), ``CELL`` (grid index with
        bounds, bucket without),
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
    ``params.epsilon``-DP for the group's rows under ``params.neighboring`` (the mechanism's
    guarantee, as implemented ``(epsilon + eta, delta)``); with partition selection, also the
    Laplace threshold step.
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
    the one it picked), or ``None`` when partition selection drops the group. With bounds,
    ``cells`` are grid indices (:func:`release_fine`); without, bucket indices."""
    if not params.bounds_free:
        return release_fine(cells, counts, units, key_hash, params)
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
        bucket_values(cells),
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


_COMPACT_ROWS = 1 << 20  # raw codes buffered before they are merged into counts (or spilled)
_MERGE_CAP = 1 << 23  # ... and at most this many more when the merged codes are already many
_PACK_ROWS = 1 << 20  # codes a map task sorts together before packing them
_PACK_WIDTH = 256  # at most this many codes (2 KiB) in one packed row
_OUTPUT_GROUPS = 512  # groups per yielded output batch
_BATCH_GROUPS = 16384  # groups per release_many call (its fixed costs paid once per call)


def _run_starts(codes) -> np.ndarray:
    """Where each run of equal values starts in sorted, non-empty ``codes``."""
    new = np.empty(codes.size, dtype=bool)
    new[0] = True
    np.not_equal(codes[1:], codes[:-1], out=new[1:])
    return np.flatnonzero(new)


def _reduce_sorted(codes, counts):
    """Sum ``counts`` over runs of equal ``codes`` (sorted)."""
    if codes.size == 0:
        return codes, counts
    starts = _run_starts(codes)
    if starts.size == codes.size:  # no ties
        return codes, counts
    return codes[starts], np.add.reduceat(counts, starts)


class _Counter:
    """Counts per distinct int64 code, fed in chunks and merged every few million entries.

    Memory: the distinct codes seen so far (two int64 each) plus at most ``_COMPACT_ROWS``
    buffered entries."""

    def __init__(self):
        self.codes = np.zeros(0, dtype=np.int64)
        self.counts = np.zeros(0, dtype=np.int64)
        self._chunks: list[tuple[np.ndarray, np.ndarray | None]] = []
        self._buffered = 0
        self._few_ties = False  # the merged codes hold at most two rows each on average

    def add(self, codes, counts=None) -> bool:
        """Buffer codes (one row each, or with ``counts``); True when a merge ran."""
        self._chunks.append((np.asarray(codes, dtype=np.int64), counts))
        self._buffered += len(codes)
        # Merge when the buffer holds as many entries as the merged codes (at least
        # _COMPACT_ROWS): each merge re-sorts the accumulated codes, so waiting until the buffer
        # matches them keeps the total sorting work O(n log n) when most rows are distinct.
        # While the merged codes have few ties, merging saves no memory (a buffered row is 8
        # bytes, a merged code 16), so the buffer may grow to four times them (a fifth of the
        # sorting work).
        ahead = 4 if self.codes.size and self._few_ties else 1
        if self._buffered >= max(_COMPACT_ROWS, min(ahead * self.codes.size, _MERGE_CAP)):
            self.compact()
            return True
        return False

    def compact(self) -> None:
        """Merge the buffered chunks into the sorted distinct codes and their counts.

        Raw chunks (one row each) are sorted with ``np.sort`` and counted by runs; chunks with
        counts by an unstable argsort (equal codes are summed, so their order does not
        matter); the sorted parts are then merged by a stable argsort, which finds the runs.
        Each buffered array is dropped once merged. For 500 groups of 1e4 random codes, folded
        without a spill, this took 0.71-0.98 s of CPU against 0.99-1.46 s for one stable
        argsort of everything. While the merged codes have few ties (at most two rows a code on
        average) they are expanded back to rows and sorted with the raw chunks instead: on
        packed input of 5e6 distinct codes this halved the fold's CPU."""
        if not self._chunks:
            return
        chunks, self._chunks, self._buffered = self._chunks, [], 0
        raw = [c for c, w in chunks if w is None]
        weighted = [(c, np.asarray(w, dtype=np.int64)) for c, w in chunks if w is not None]
        del chunks  # each buffered array is freed as soon as it is merged
        parts = [(self.codes, self.counts)] if self.codes.size else []
        if raw and parts and self._few_ties:
            # few ties so far: the merged codes as rows (at most twice as many) join the raw
            # ones, and one np.sort replaces the stable argsort of the merge
            raw.append(np.repeat(self.codes, self.counts))
            parts = []
            self.codes = self.counts = np.zeros(0, dtype=np.int64)
        if raw:
            codes = np.concatenate(raw) if len(raw) > 1 else raw[0].copy()
            del raw
            codes.sort()
            parts.append(_count_runs(codes))
            del codes
        if weighted:
            parts.append(_sum_weighted(weighted))
        if len(parts) == 1:
            self.codes, self.counts = parts[0]
        else:
            codes = np.concatenate([c for c, _ in parts])
            order = np.argsort(codes, kind="stable")  # sorted runs: timsort merges them
            codes = codes[order]
            counts = np.concatenate([w for _, w in parts])[order]
            del parts, order
            self.codes, self.counts = _reduce_sorted(codes, counts)
        self._few_ties = int(self.counts.sum()) <= 2 * self.codes.size


def _sum_weighted(weighted):
    """``(distinct codes, summed counts)`` of buffered ``(codes, counts)`` chunks (an unstable
    argsort: equal codes are summed, so their order does not matter). Empties ``weighted``,
    so that the chunks are freed before the sort."""
    codes = np.concatenate([c for c, _ in weighted])
    counts = np.concatenate([w for _, w in weighted])
    weighted.clear()
    order = np.argsort(codes)
    return _reduce_sorted(codes[order], counts[order])


def _count_runs(codes):
    """``(distinct codes, count of each)`` of sorted ``codes`` (one row each)."""
    if codes.size == 0:
        return codes, np.zeros(0, dtype=np.int64)
    starts = _run_starts(codes)
    if starts.size == codes.size:  # no ties
        return codes, np.ones(codes.size, dtype=np.int64)
    return codes[starts], np.diff(starts, append=codes.size).astype(np.int64)


class Fold:
    """One partition's rows as counts per (group, grid index), in bounded memory.

    Codes are ``gid * 2**33 + k`` (``k`` the index on the default grid, at most ``2**32``).
    While the partition's distinct codes stay within ``budget`` they are counted exactly. Past
    it the fold *spills* if the spill saves memory, that is if the distinct (group, coarse cell
    ``k >> 12``) codes are at most ``shrink`` times the distinct codes; otherwise (values
    spread over more cells than they fill, as 1e4 rows a group over a span of 2**20 coarse
    cells) the coarse counts would be as many as the fine ones, so the budget doubles and the
    test is made again when it is reached. A spilled fold appends the codes to a temporary file
    in the worker's temp directory (deleted by :meth:`close`) in chunks of up to
    ``_COMPACT_ROWS`` rows, each stored as raw codes (8 bytes a row) or as distinct (code,
    count) pairs when that is smaller, and memory keeps only counts per (group, coarse cell),
    at most ``2**20 + 1`` per group whatever its number of rows.
    :meth:`fine_counts` re-reads the file in chunks for the coarse cells asked for.

    Spilled or not, each group's release has the same distribution to within total variation
    2**-59 (:mod:`dpq_spark.core.coarse_bands`); the choice depends on the data's spread, and
    shows only in time and memory.
    """

    SHIFT = 33  # bits of k in a code
    _COARSE_SHIFT = 21  # bits of the coarse cell in a coarse code

    def __init__(self, budget: int, shrink: float = SPILL_SHRINK):
        self.budget = int(budget)
        self.shrink = float(shrink)
        self.fine = _Counter()
        self.coarse: _Counter | None = None
        self._spill = None

    @property
    def spilled(self) -> bool:
        return self._spill is not None

    def add(self, codes, counts=None) -> None:
        """Count ``codes`` (one row each, or ``counts`` rows each)."""
        codes = np.asarray(codes, dtype=np.int64)
        if codes.size == 0:
            return
        if self._spill is None:
            if self.fine.add(codes, counts) and self.fine.codes.size > self.budget:
                self._over_budget()
            return
        if counts is None:
            self._pending.append(codes)
        else:
            self._weighted.append((codes, np.asarray(counts, dtype=np.int64)))
        self._pending_rows += codes.size
        if self._pending_rows >= _COMPACT_ROWS:
            self._flush()

    def finish(self) -> None:
        if self._spill is None:
            self.fine.compact()
            if self.fine.codes.size > self.budget:
                self._over_budget()
        self._flush()
        if self.coarse is not None:
            self.coarse.compact()

    def _over_budget(self) -> None:
        """Spill if the coarse counts would be at most ``shrink`` times the fine ones, else
        double the budget."""
        coarse = self.coarse_code(self.fine.codes)  # sorted, as the fine codes are
        distinct = 1 + int(np.count_nonzero(coarse[1:] != coarse[:-1]))  # fine codes: >= 1
        del coarse
        if distinct <= self.shrink * self.fine.codes.size:
            self._start_spill()
        else:
            while self.budget < self.fine.codes.size:
                self.budget *= 2

    def _start_spill(self) -> None:
        self._spill = tempfile.TemporaryFile(prefix="dpq_fold_")
        self._pending, self._weighted, self._pending_rows = [], [], 0
        self.coarse = _Counter()
        codes, counts = self.fine.codes, self.fine.counts
        self.fine = _Counter()
        self._write(codes, counts)

    def _flush(self) -> None:
        if self._spill is None:
            return
        pending, weighted = self._pending, self._weighted
        self._pending, self._weighted, self._pending_rows = [], [], 0
        if pending:
            raw = np.sort(np.concatenate(pending))
            del pending
            codes, counts = _count_runs(raw)
            if 2 * codes.size > raw.size:  # mostly distinct: raw codes are the smaller record
                self._write(raw, None)
                self.coarse.add(*_reduce_sorted(self.coarse_code(codes), counts))
            else:
                self._write(codes, counts)
        if weighted:
            self._write(*_sum_weighted(weighted))

    def _write(self, codes, counts) -> None:
        """Append one chunk: header (size, has counts), the codes, then the counts if any."""
        header = np.array([codes.size, counts is not None], dtype=np.int64)
        self._spill.write(header.tobytes())
        self._spill.write(np.ascontiguousarray(codes, dtype=np.int64).tobytes())
        if counts is not None:
            self._spill.write(np.ascontiguousarray(counts, dtype=np.int64).tobytes())
            self.coarse.add(*_reduce_sorted(self.coarse_code(codes), counts))

    def _chunks(self):
        """The spilled (codes, counts) chunks, read back one at a time."""
        self._spill.flush()
        self._spill.seek(0)
        while True:
            head = self._spill.read(16)
            if not head:
                return
            size, has_counts = np.frombuffer(head, dtype=np.int64)
            codes = np.frombuffer(self._spill.read(8 * int(size)), dtype=np.int64)
            if has_counts:
                counts = np.frombuffer(self._spill.read(8 * int(size)), dtype=np.int64)
            else:
                counts = np.ones(codes.size, dtype=np.int64)
            yield codes, counts

    @classmethod
    def coarse_code(cls, codes):
        """``gid * 2**21 + (k >> 12)`` of ``gid * 2**33 + k``: since ``k < 2**33`` this is the
        code shifted right by 12 bits (monotone, so sorted codes give sorted coarse codes)."""
        return codes >> COARSE_SHIFT

    def groups(self):
        """Sorted gids and, per gid, ``(a, b)`` slices into :meth:`arrays`."""
        codes, shift = (self.fine.codes, self.SHIFT) if self._spill is None else (
            self.coarse.codes, self._COARSE_SHIFT)
        gid = codes >> shift
        starts = np.flatnonzero(np.r_[True, gid[1:] != gid[:-1]]) if gid.size else np.zeros(0, int)
        ends = np.r_[starts[1:], gid.size].astype(np.int64)
        return gid[starts], starts, ends

    def arrays(self):
        """``(index, counts)``: fine grid indices when not spilled, else coarse cells."""
        if self._spill is None:
            codes = self.fine.codes
            return codes - ((codes >> self.SHIFT) << self.SHIFT), self.fine.counts
        codes = self.coarse.codes
        return codes - ((codes >> self._COARSE_SHIFT) << self._COARSE_SHIFT), self.coarse.counts

    def fine_counts(self, wanted) -> tuple[np.ndarray, np.ndarray]:
        """Exact counts per fine code of the spilled rows whose coarse code is in ``wanted``
        (sorted int64), read back in chunks."""
        out = _Counter()
        wanted = np.asarray(wanted, dtype=np.int64)
        if wanted.size == 0:
            return out.codes, out.counts
        for codes, counts in self._chunks():
            coarse = self.coarse_code(codes)
            at = np.minimum(np.searchsorted(wanted, coarse), wanted.size - 1)
            hit = wanted[at] == coarse
            if hit.any():
                out.add(codes[hit], counts[hit])
        out.compact()
        return out.codes, out.counts

    def close(self) -> None:
        if self._spill is not None:
            self._spill.close()


def _grid(params: ReleaseParams) -> Grid:
    return _grid_of(params.lower, params.upper)


@functools.lru_cache(maxsize=8)
def _grid_of(lower: float, upper: float) -> Grid:
    return Grid(lower, upper)


def _start_group(n: int, units, key_hash, params: ReleaseParams):
    """Partition selection, then the choice of mechanism, for one group (bounded path).

    Returns ``(source, name, epsilon)`` for the mechanism step, or ``None`` when partition
    selection drops the group. Draws in the order of the core: the selection noise, then (for
    ``"auto"``) the noisy count of :func:`~dpq_spark.core.choose.plan_auto`; the same source then
    feeds the mechanism."""
    source = resolve_rng(_group_rng(params, key_hash))
    if params.threshold is not None:
        size = n if units is None else int(units)
        if size + discrete_laplace(source, params.noise_scale) < params.threshold:
            return None
    if params.mechanism != "auto":
        return source, params.mechanism, params.epsilon
    name, rest, _ = plan_auto(len(params.quantiles), n, epsilon=params.epsilon,
                              neighboring=params.neighboring, source=source)
    return source, name, rest


#: Mechanisms that get the group's grid indices (exact, or the represented data of a spilled
#: group, built from their bands); the others get coarse cells.
FINE_MECHANISMS = ("joint_exp", "ind_exp")


def _run_fine(name, k, counts, source, epsilon, params: ReleaseParams) -> np.ndarray:
    """JointExp or IndExp on grid indices (exact or represented data), released as grid
    values: the same draws as the core's ``joint_exp``/``ind_exp`` on values with these
    indices."""
    grid = _grid(params)
    run = joint_exp_indices if name == "joint_exp" else ind_exp_indices
    out = run(k, counts, grid.size, np.asarray(params.quantiles, dtype=np.float64),
              epsilon=epsilon, neighboring=params.neighboring, rng=source)
    return grid.value(out)


def band_keep(name, cells, counts, epsilon, params: ReleaseParams,
              shift: int = COARSE_SHIFT, fine=None, log_tol: float = BAND_LOG_TOL) -> np.ndarray:
    """The coarse cells (``k >> shift``) a spilled group must bring at full precision for
    mechanism ``name`` (``fine``: all the data of some cells, for a tighter band; ``log_tol``
    larger than the default only for a guess; see
    :func:`~dpq_spark.core.coarse_bands.reachable`).

    JointExp: :func:`~dpq_spark.core.coarse_bands.reachable` at ``c = epsilon / (2 Delta)``.
    IndExp: each quantile's draw is JointExp with m = 1 at half its ``c`` (weight
    ``exp(-c_q |rho - q n|)`` with ``c_q = (epsilon / m) / (2 Delta_q)`` is ``exp(c u)`` for
    ``u = -2 |rho - q n|``); the union of the m bands (keeping more cells only shrinks what is
    pruned), so each draw is within total variation 2**-59 of its draw on the fine data.
    """
    q = np.asarray(params.quantiles, dtype=np.float64)
    relation = NeighboringRelation.parse(params.neighboring)
    steps = _grid(params).steps
    if name == "joint_exp":
        return reachable(cells, counts, q, epsilon / (2.0 * joint_exp_sensitivity(q, relation)),
                         steps, log_tol, shift, fine)
    keep = np.zeros(len(cells), dtype=bool)
    for qj in q:
        c = (epsilon / q.size) / (2.0 * single_quantile_sensitivity(float(qj), relation)) / 2.0
        keep |= reachable(cells, counts, [qj], c, steps, log_tol, shift, fine)
    return keep


def _run_coarse(name, cells, counts, source, epsilon, params: ReleaseParams) -> np.ndarray:
    """A mechanism other than JointExp on coarse cells, each row at its cell's fixed
    representative grid point (a per-record map of public constants)."""
    grid = _grid(params)
    if name == params.mechanism:
        mechanism = get_mechanism(name)
    else:  # picked by auto: the pure mechanism, bounds given
        from dpq_spark.core.mechanisms import get_base_mechanism

        mechanism = get_base_mechanism(name)
    out = mechanism(grid.value(coarse_midpoints(cells, grid.steps)),
                    np.asarray(params.quantiles, dtype=np.float64), epsilon=epsilon,
                    lower=params.lower, upper=params.upper, neighboring=params.neighboring,
                    counts=counts, rng=source)
    return np.asarray(out, dtype=np.float64)


def _to_coarse(k, counts):
    return _reduce_sorted(coarse_of(k), np.asarray(counts, dtype=np.int64))


def release_fine(k, counts, units, key_hash, params: ReleaseParams):
    """Release one group (bounded path) from its sorted distinct grid indices ``k`` and
    ``counts``. Returns ``(values, mechanism name)`` or ``None`` (dropped by selection)."""
    k = np.asarray(k, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    started = _start_group(int(counts.sum()), units, key_hash, params)
    if started is None:
        return None
    source, name, eps = started
    if name in FINE_MECHANISMS:
        return _run_fine(name, k, counts, source, eps, params), name
    return _run_coarse(name, *_to_coarse(k, counts), source, eps, params), name


def _release_fold(fold: Fold, params: ReleaseParams, units_of, hash_of):
    """Release every group of a finished fold: ``[(gid, values, name)]`` in gid order
    (dropped groups left out)."""
    gids, starts, ends = fold.groups()
    index, counts = fold.arrays()
    out = []
    if not fold.spilled:
        if _batchable(params):
            return _release_batch(gids.tolist(), starts, ends, index, counts, params)
        for gid, a, b in zip(gids.tolist(), starts, ends):
            got = release_fine(index[a:b], counts[a:b], units_of(gid), hash_of(gid), params)
            if got is not None:
                out.append((gid, *got))
        return out
    # Spilled: choose per group from exact coarse counts; JointExp/IndExp groups get their
    # reachable cells' fine counts from the spill file (one pass over it), the others coarse
    # cells. With production randomness the JointExp groups of one epsilon are then released
    # together (_joint_exp_many); seeded runs keep one _run_fine per group (per-key draws).
    pending = []
    wanted = []
    for gid, a, b in zip(gids.tolist(), starts, ends):
        cells, ccounts = index[a:b], counts[a:b]
        started = _start_group(int(ccounts.sum()), units_of(gid), hash_of(gid), params)
        if started is None:
            continue
        source, name, eps = started
        if name not in FINE_MECHANISMS:
            out.append((gid, _run_coarse(name, cells, ccounts, source, eps, params), name))
            continue
        keep = band_keep(name, cells, ccounts, eps, params)
        pending.append((gid, cells, ccounts, keep, source, eps, name))
        wanted.append((gid << Fold._COARSE_SHIFT) + cells[keep])
    if pending:
        codes, fine = fold.fine_counts(np.sort(np.concatenate(wanted)))
        fgid = codes >> Fold.SHIFT
        together: dict[float, list] = {}  # production JointExp groups, by epsilon
        for gid, cells, ccounts, keep, source, eps, name in pending:
            a, b = np.searchsorted(fgid, [gid, gid + 1])
            k, w = represent(codes[a:b] - (gid << Fold.SHIFT), fine[a:b], cells, ccounts, keep)
            if name == "joint_exp" and params.base_seed is None:
                together.setdefault(eps, []).append((gid, k, w))
                continue
            out.append((gid, _run_fine(name, k, w, source, eps, params), name))
        for eps, groups in together.items():
            values = _joint_exp_many([(k, w) for _, k, w in groups], eps, params)
            out += [(gid, row, "joint_exp") for (gid, _, _), row in zip(groups, values)]
        out.sort(key=lambda t: t[0])
    return out


def _joint_exp_many(groups, epsilon, params: ReleaseParams) -> np.ndarray:
    """JointExp for many groups (grid indices and counts each) with fresh OS entropy, by
    :func:`~dpq_spark.core.batch.release_many` (its ``"joint_exp"`` path: enumeration for the
    smallest groups, :func:`~dpq_spark.core.joint_exp_many._sample_many` about ``CELLS_HELD``
    cells at a time for the others): each group's row has the distribution :func:`_run_fine`
    gives it, released as grid values. Production randomness only; seeded runs keep
    :func:`_run_fine` per group (per-key draws)."""
    return release_many(groups, params.quantiles, epsilon=epsilon, lower=params.lower,
                        upper=params.upper, neighboring=params.neighboring,
                        mechanism="joint_exp", grid_indices=True).values


def _batchable(params: ReleaseParams) -> bool:
    """Whether groups can be released together by :func:`dpq_spark.core.batch.release_many`:
    public parameters only (production randomness, no partition selection, a mechanism it
    covers, bounds given)."""
    return (params.base_seed is None and params.threshold is None and not params.bounds_free
            and params.mechanism in BATCH_MECHANISMS)


def _release_batch(gids, starts, ends, index, counts, params: ReleaseParams):
    """Release the groups of an unspilled fold in batches of ``_BATCH_GROUPS``: each group
    with exactly the distribution :func:`release_fine` gives it (the noisy count and choice of
    ``"auto"``, JointExp/IndExp on the exact grid indices, ApproxQuantiles/AggTree on coarse
    cells), at a per-group cost of tens of microseconds instead of milliseconds."""
    out = []
    q = np.asarray(params.quantiles, dtype=np.float64)
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    if not np.array_equal(starts[1:], ends[:-1]):
        raise RuntimeError("dp_quantiles: the fold's groups are not contiguous (a bug: please "
                           "report it)")
    for lo in range(0, len(gids), _BATCH_GROUPS):
        hi = min(lo + _BATCH_GROUPS, len(gids))
        # the fold's groups are contiguous and in order: one slice of its arrays
        a, b = int(starts[lo]), int(ends[hi - 1])
        groups = FlatGroups(index[a:b], counts[a:b], np.append(starts[lo:hi], b) - a)
        got = release_many(groups, q, epsilon=params.epsilon, lower=params.lower,
                           upper=params.upper, neighboring=params.neighboring,
                           mechanism=params.mechanism, grid_indices=True, coarse_cells=True)
        out += zip(gids[lo:hi], got.values, got.mechanisms)
    return out


def _with_fold(body, batches, params: ReleaseParams):
    """Run a partition body with its sink: a :class:`Fold` with bounds (its spill file deleted
    when the body ends, also when the task fails), else a :class:`_Counter` of (group, bucket)
    codes."""
    sink = _Counter() if params.bounds_free else Fold(params.fold_budget, params.spill_shrink)
    try:
        yield from body(batches, params, sink)
    finally:
        if isinstance(sink, Fold):
            sink.close()


def _release_sink(sink, params: ReleaseParams, units_of, hash_of):
    """Release every group a finished partition put in ``sink``: ``[(gid, values, name)]``."""
    if isinstance(sink, Fold):
        sink.finish()
        return _release_fold(sink, params, units_of, hash_of)
    return _release_buckets(sink, params, units_of, hash_of)


def pack_partition(batches, span: int, keys: pa.Array | None = None):
    """``mapInArrow`` body before the public-key shuffle: the same codes, sorted and packed.

    Each input row is one ``CODE`` (``gid * span + index``). Up to ``_PACK_ROWS`` codes at a time
    are sorted and cut into rows of one group each, ``GID`` and at most ``_PACK_WIDTH`` codes
    as the bytes of int64s in ``CODES``; when the sorted codes have many ties they go as
    distinct codes with their counts (``COUNTS``, else empty bytes: one row each). The multiset
    of codes of every group is unchanged, so the release is too; the shuffle then moves rows of
    bytes, about 1/230 as many as data rows (4.3e4 for 1e7 rows in 1,000 groups), where its
    cost per row was most of its cost. Memory:
    the buffered codes and their sorted copy (tens of MiB), whatever the partition's size.
    Reads no randomness and releases nothing (the codes only change place).

    With ``keys`` (the public keys of one integral or plain string column, distinct, no null)
    each input row is instead a key and a grid index, and the code is made here: ``gid`` is the
    key's place in ``keys`` (Arrow's ``index_in``, exact equality on these types, one hash table
    per chunk), and a row whose key is not listed is dropped (a null key matches nothing). That
    is the inner join with the key list, without the driver building and broadcasting it.
    """
    buffered, size = [], 0
    for batch in batches:
        if len(batch) == 0:
            continue
        buffered.append(batch)
        size += len(batch)
        if size >= _PACK_ROWS:
            yield from _packed_batches(buffered, span, keys)
            buffered, size = [], 0
    if buffered:
        yield from _packed_batches(buffered, span, keys)


def _packed_batches(batches, span: int, keys):
    if keys is None:
        codes = [np.asarray(b.column(0), dtype=np.int64) for b in batches]
    else:
        key = pa.concat_arrays([b.column(0) for b in batches])
        index = pc.index_in(key, value_set=keys.cast(key.type))
        listed = np.asarray(index.is_valid())
        cell = np.concatenate([np.asarray(b.column(1), dtype=np.int64) for b in batches])
        gid = np.asarray(index.fill_null(0), dtype=np.int64)
        codes = [gid[listed] * span + cell[listed]]
        if codes[0].size == 0:
            return
    yield _packed(codes, span)


def _packed(buffered, span: int) -> pa.RecordBatch:
    raw = np.concatenate(buffered) if len(buffered) > 1 else buffered[0].copy()
    raw.sort()
    codes, counts = _count_runs(raw)
    if 2 * codes.size > raw.size:  # mostly distinct: raw codes are the smaller record
        codes, counts = raw, None
    del raw
    gid = codes // span
    starts = _run_starts(gid)
    ends = np.append(starts[1:], codes.size)
    pieces = -(-(ends - starts) // _PACK_WIDTH)
    piece = np.arange(int(pieces.sum())) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    first = np.repeat(starts, pieces) + _PACK_WIDTH * piece
    offsets = pa.py_buffer((8 * np.r_[first, codes.size]).astype(np.int32))
    n = first.size

    def blob(values):
        return pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(values)])

    if counts is None:
        counts_column = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(
            np.zeros(n + 1, dtype=np.int32)), pa.py_buffer(b"")])
    else:
        counts_column = blob(counts)
    return pa.RecordBatch.from_arrays([pa.array(gid[first]), blob(codes), counts_column],
                                      names=[GID, CODES, COUNTS])


def _int64s(column) -> tuple[np.ndarray, np.ndarray]:
    """The int64s stored as bytes in a binary (or large binary) Arrow column, concatenated in
    row order, and the number in each row (no copy)."""
    width = 8 if pa.types.is_large_binary(column.type) else 4
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int32 if width == 4 else np.int64,
                            count=len(column) + 1, offset=width * column.offset)
    lengths = np.diff(offsets) // 8
    data = column.buffers()[2]
    total = int(offsets[-1] - offsets[0]) // 8
    if total == 0:
        return np.zeros(0, dtype=np.int64), lengths
    return np.frombuffer(data, dtype=np.int64, count=total, offset=int(offsets[0])), lengths


def _unpacked(batch):
    """``(codes, counts or None)`` of one batch of :func:`pack_partition`'s rows."""
    codes, lengths = _int64s(batch.column(CODES))
    counts, given = _int64s(batch.column(COUNTS))
    if counts.size == 0:
        return codes, None
    if counts.size == codes.size:
        return codes, counts
    weights = np.ones(codes.size, dtype=np.int64)  # rows of both kinds: counts where given
    weights[np.repeat(given > 0, lengths)] = counts
    return codes, weights


def release_partition(batches, params: ReleaseParams):
    """``mapInArrow`` body of the public-key path: fold one partition, release each group
    (Arrow record batches out, one row per group: ``GID``, ``value`` as a list of the m released
    values in the order of the quantiles, ``MECHANISM``; one row a group rather than m keeps
    Spark's row conversions of the output, and of its collection, m times smaller).

    The input is hash partitioned by key index, so every group is whole in one partition. Each
    row is one kept data row, a single ``CODE``: key index * 2**33 + grid index, or key index *
    resolution + bucket without bounds. The output carries ``GID`` instead of the key columns
    (the driver maps it back to the key). With bounds the rows go through a :class:`Fold`
    (exact counts per distinct grid index within ``params.fold_budget`` pairs, else a spill file
    and coarse counts; see :mod:`dpq_spark.core.coarse_bands` for why the release is unchanged
    to within total variation 2**-59); without bounds they are counted per (group, bucket), at
    most ``BUCKETS`` per group.
    """
    yield from _with_fold(_release_partition, batches, params)


def _release_partition(batches, params: ReleaseParams, sink):
    for batch in batches:
        if len(batch) == 0:
            continue
        # key index and grid index (or bucket) in one int64, sorted and packed per group
        sink.add(*_unpacked(batch))
    if params.key_hashes is not None:
        def hash_of(gid):
            return params.key_hashes[gid]
    else:
        def hash_of(gid):
            return 0

    def units_of(gid):
        return None

    released = _release_sink(sink, params, units_of, hash_of)
    m = len(params.quantiles)
    for lo in range(0, len(released), _OUTPUT_GROUPS):
        part = released[lo:lo + _OUTPUT_GROUPS]
        values = pa.array(np.concatenate([v for _, v, _ in part]), type=pa.float64())
        yield pa.RecordBatch.from_arrays(
            [pa.array(np.asarray([g for g, _, _ in part], np.int64)),
             pa.ListArray.from_arrays(pa.array(np.arange(0, m * len(part) + 1, m, dtype=np.int32)),
                                      values),
             pa.array([n for _, _, n in part], type=pa.string())],
            names=[GID, "value", MECHANISM])


def _release_buckets(counter: _Counter, params: ReleaseParams, units_of, hash_of):
    """Bounds-free path: release each group from its (bucket, count) pairs."""
    span = params.resolution
    counter.compact()
    codes, counts = counter.codes, counter.counts
    group_of = codes // span
    cells = codes - group_of * span
    starts = np.flatnonzero(np.r_[True, group_of[1:] != group_of[:-1]]) if codes.size else []
    ends = np.r_[starts[1:], len(group_of)] if codes.size else []
    out = []
    for a, b in zip(starts, ends):
        gid = int(group_of[a])
        got = release_values(cells[a:b], counts[a:b], units_of(gid), hash_of(gid), params)
        if got is not None:
            out.append((gid, *got))
    return out


def _frame(keys: dict, params: ReleaseParams, values: np.ndarray, mechanism: str) -> pd.DataFrame:
    import pandas as pd  # here, not at import: the Arrow paths of a Spark worker never need it

    m = len(values)
    data = {k: pd.Series([v] * m) for k, v in keys.items()}
    data["quantile"] = np.asarray(params.quantiles[:m], dtype=np.float64)
    data["value"] = values
    data[MECHANISM] = pd.Series([mechanism] * m, dtype=object)
    return pd.DataFrame(data)


def release_keyed_partition(batches, params: ReleaseParams):
    """``mapInArrow`` body for keys from partition selection: Arrow batches in and out.

    Each input row is one kept data row: the key columns, ``CELL`` (grid index with bounds,
    bucket without) and, with a privacy unit, ``UNITS``. Keys are numbered with
    :class:`dpq_spark.spark._keys.KeyIndex` (pyarrow, never pandas: null and NaN are distinct
    keys, int64 keys stay exact), and the rows go through the same :class:`Fold` as the
    public-key path (``local gid * 2**33 + k``; without bounds a counter per (gid, bucket)).
    Each group is released or dropped by the partition-selection threshold; the output batches
    carry the key columns as the same Arrow arrays the keys came in, ``quantile``, ``value`` and
    ``MECHANISM``.
    """
    yield from _with_fold(_release_keyed, batches, params)


def _release_keyed(batches, params: ReleaseParams, sink):
    from dpq_spark.spark._keys import KeyIndex, key_seed

    index = KeyIndex(params.keys)
    span = (1 << Fold.SHIFT) if isinstance(sink, Fold) else params.resolution  # gid * span + index
    with_units = UNITS in params.extra_columns
    units = np.zeros(0, dtype=np.int64)
    for batch in batches:
        if batch.num_rows == 0:
            continue
        gids = index.gids([batch.column(k) for k in params.keys])
        cells = batch.column(CELL).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        sink.add(gids * span + cells)
        if with_units:
            weights = batch.column(UNITS).to_numpy(zero_copy_only=False).astype(np.float64)
            add = np.bincount(gids, weights=weights, minlength=index.size).astype(np.int64)
            units = np.concatenate([units, np.zeros(len(add) - len(units), dtype=np.int64)]) + add
    units_of = (lambda gid: int(units[gid])) if with_units else (lambda gid: None)
    if params.base_seed is not None:  # seeded runs (tests): a per-key seed
        def hash_of(gid):
            return key_seed(index.values[gid])
    else:
        def hash_of(gid):
            return 0
    released = _release_sink(sink, params, units_of, hash_of)
    if not released:
        return
    keys = index.table()
    q = np.asarray(params.quantiles, dtype=np.float64)
    for lo in range(0, len(released), _OUTPUT_GROUPS):
        part = released[lo:lo + _OUTPUT_GROUPS]
        take = np.concatenate([np.full(len(v), g, dtype=np.int64) for g, v, _ in part])
        picked = keys.take(pa.array(take, type=pa.int64()))
        arrays = [picked.column(k).combine_chunks() for k in params.keys]
        arrays += [pa.array(np.concatenate([q[:len(v)] for _, v, _ in part]), type=pa.float64()),
                   pa.array(np.concatenate([v for _, v, _ in part]), type=pa.float64()),
                   pa.array([n for _, v, n in part for _ in range(len(v))], type=pa.string())]
        yield pa.RecordBatch.from_arrays(arrays, names=[*params.keys, "quantile", "value",
                                                        MECHANISM])
