"""Public-key codes sorted and packed per bucket of groups before the shuffle, and unpacked after it.

:func:`pack_partition` is a ``mapInArrow`` body on the map side; :func:`unpacked` reads its rows
on the reduce side, and :func:`bucket_pieces` cuts a partition's rows, sorted by bucket, into
stretches of whole buckets. Reads no randomness and releases nothing: the codes only change place.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dpq_spark.spark._arrow import numeric, scalar, to_numpy
from dpq_spark.spark._columns import BUCKET, CODES, COUNTS
from dpq_spark.spark._fold import count_runs, run_starts
from dpq_spark.spark._heap import trim_heap

__all__ = ["KeyLookup", "pack_partition", "unpacked", "bucket_pieces"]

_PACK_ROWS = 1 << 20  # codes a map task sorts together before packing them


_PACK_WIDTH = 256  # at most this many codes (2 KiB) in one packed row


def pack_partition(batches, span: int, keys: pa.Array | None = None, shift: int = 0):
    """``mapInArrow`` body before the public-key shuffle: the same codes, sorted and packed.

    Each input row is one ``CODE`` (``gid * span + index``). Up to ``_PACK_ROWS`` codes at a time
    are sorted and cut into rows of one bucket each, ``BUCKET`` (``gid >> shift``: the groups
    ``2**shift`` at a time) and at most ``_PACK_WIDTH`` codes as the bytes of int64s in
    ``CODES``; when the sorted codes have many ties they go as distinct codes with their counts
    (``COUNTS``, else empty bytes: one row each). The shuffle partitions by ``BUCKET``, so every
    group is still whole in one partition, and the multiset of codes of every group is
    unchanged, so the release is too. The shuffle then moves rows of bytes, about 1/230 as many
    as data rows (4.3e4 for 1e7 rows in 1,000 groups), where its cost per row was most of its
    cost; with many small groups a row holds several groups (``shift`` > 0, see
    :func:`~dpq_spark.spark._dataflow.partitioned_codes`) rather than a few codes each. Memory:
    the buffered codes and their sorted copy (tens of MiB), whatever the partition's size.
    Reads no randomness and releases nothing (the codes only change place).

    With ``keys`` (the public keys of one integral or plain string column, distinct, no null)
    each input row is instead a key and a grid index, and the code is made here: ``gid`` is the
    key's place in ``keys`` (:class:`KeyLookup`: exact equality on these types), and a row whose
    key is not listed is dropped (a null key matches nothing). That is the inner join with the
    key list, without the driver building and broadcasting it.
    """
    index = None if keys is None else KeyLookup(keys)
    buffered, size = [], 0
    for batch in batches:
        if len(batch) == 0:
            continue
        buffered.append(batch)
        size += len(batch)
        if size >= _PACK_ROWS:
            yield from _packed_batches(buffered, span, index, shift)
            buffered, size = [], 0
    if buffered:
        yield from _packed_batches(buffered, span, index, shift)
    del buffered
    trim_heap()  # the worker is reused (the reduce stage's task may be next): see _heap


def _packed_batches(batches, span: int, index, shift: int):
    if index is None:
        codes = [to_numpy(b.column(0)).astype(np.int64, copy=False) for b in batches]
    else:
        gid, listed = index.places(pa.concat_arrays([b.column(0) for b in batches]))
        cell = np.concatenate([to_numpy(b.column(1)).astype(np.int64, copy=False) for b in batches])
        codes = [gid[listed] * span + cell[listed]]
        if codes[0].size == 0:
            return
    yield _packed(codes, span, shift)


#: integral keys spanning at most this many values per key (plus _TABLE_SLACK) are looked up
#: in a table indexed by the key, at most _TABLE_CELLS entries (8 bytes each)
_TABLE_SPREAD = 4
_TABLE_SLACK = 1 << 16
_TABLE_CELLS = 1 << 24


class KeyLookup:
    """Each key's place in a list of distinct public keys (one integral or plain string
    column, no null), for a column of data keys: ``places(column)`` gives ``(gid, listed)``,
    the place of each row's key (0 where not listed) and whether it is listed (a null key is
    not).

    Signed integral keys whose range spans at most ``_TABLE_SPREAD`` values a key (plus
    ``_TABLE_SLACK``, at most ``_TABLE_CELLS`` entries) are looked up in a table of every value
    of that range, built once per partition: one gather per row. Others go through Arrow's
    ``index_in``, which hashes the whole key list again for every chunk (for 1e6 keys, 135 ms
    per chunk of 2**20 rows against about 10 ms for the table). Both give the same places:
    exact equality of the values. The choice depends on the public keys only."""

    def __init__(self, keys: pa.Array):
        self.keys = keys
        self.table = None
        if len(keys) and pa.types.is_signed_integer(keys.type):
            values = to_numpy(keys).astype(np.int64, copy=False)
            low, high = int(values.min()), int(values.max())
            cells = high - low + 1
            if cells <= min(_TABLE_SPREAD * values.size + _TABLE_SLACK, _TABLE_CELLS):
                self.low, self.high = low, high
                self.table = np.full(cells, -1, dtype=np.int64)
                self.table[values - low] = np.arange(values.size, dtype=np.int64)

    def places(self, key: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        if self.table is None or not pa.types.is_signed_integer(key.type):
            index = pc.index_in(key, value_set=self.keys.cast(key.type))
            return (to_numpy(index.fill_null(scalar(0, index.type))).astype(np.int64),
                    to_numpy(index.is_valid()))
        values = to_numpy(key.fill_null(scalar(self.low, key.type))).astype(np.int64, copy=False)
        inside = (values >= self.low) & (values <= self.high)
        # outside the range the offset would overflow for keys far from it: read the table at
        # its first entry there, and let ``inside`` reject them
        gid = self.table.take(np.where(inside, values, self.low) - self.low)
        listed = inside & (gid >= 0)
        if key.null_count:
            listed &= to_numpy(key.is_valid())
        return np.maximum(gid, 0), listed


def _packed(buffered, span: int, shift: int) -> pa.RecordBatch:
    raw = np.concatenate(buffered) if len(buffered) > 1 else buffered[0].copy()
    raw.sort()
    codes, counts = count_runs(raw)
    if 2 * codes.size > raw.size:  # mostly distinct: raw codes are the smaller record
        codes, counts = raw, None
    del raw
    bucket = (codes // span) >> shift
    starts = run_starts(bucket)
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
    return pa.RecordBatch.from_arrays([numeric(bucket[first], pa.int64()), blob(codes),
                                       counts_column], names=[BUCKET, CODES, COUNTS])


def int64s(column) -> tuple[np.ndarray, np.ndarray]:
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


def unpacked(batch):
    """``(codes, counts or None)`` of one batch of :func:`pack_partition`'s rows."""
    codes, lengths = int64s(batch.column(CODES))
    counts, given = int64s(batch.column(COUNTS))
    if counts.size == 0:
        return codes, None
    if counts.size == codes.size:
        return codes, counts
    weights = np.ones(codes.size, dtype=np.int64)  # rows of both kinds: counts where given
    weights[np.repeat(given > 0, lengths)] = counts
    return codes, weights


def bucket_pieces(batches, budget: int):
    """The codes of one partition's packed rows, which arrive sorted by ``BUCKET``
    (:func:`~dpq_spark.spark._dataflow.partitioned_codes` sorts each partition after the
    shuffle), a batch or part of one at a time: ``(codes, counts or None, whole)``. ``whole``
    is true when every bucket of the pieces so far is complete: it ends a *stretch*, as soon as
    the stretch holds ``budget`` codes and the bucket that reached it has ended (the next row
    holds a later bucket; a bucket may continue into the next batch). A stretch is thus at most
    ``budget`` codes plus one bucket's. Every group is whole in its bucket, so the groups of a
    stretch are complete, and only they: the caller can release them and forget them.

    Packed rows out of bucket order raise ``RuntimeError`` (a bug: a stretch could miss rows
    of a group that comes again later). Reads no randomness and releases nothing."""
    held, last = 0, None  # codes in the stretch so far, and the bucket of its last row
    for batch in batches:
        n = len(batch)
        if n == 0:
            continue
        bucket = to_numpy(batch.column(BUCKET)).astype(np.int64, copy=False)
        if (last is not None and bucket[0] < last) or np.any(bucket[1:] < bucket[:-1]):
            raise RuntimeError("dp_quantiles: a partition's packed codes are not in bucket "
                               "order (a bug: please report it)")
        if held >= budget and bucket[0] != last:  # the bucket that reached the budget ended
            yield np.zeros(0, dtype=np.int64), None, True
            held = 0
        ends = np.cumsum(int64s(batch.column(CODES))[1])  # codes up to each row, inclusive
        start = 0  # the batch's first row not given yet
        while True:
            before = int(ends[start - 1]) if start else 0
            # the row at which the stretch reaches the budget, and the end of its bucket
            r = max(start, int(np.searchsorted(ends, budget - held + before)))
            stop = n if r >= n else int(np.searchsorted(bucket, bucket[r], side="right"))
            if stop == n:  # no budget reached, or its bucket may go on in the next batch
                yield (*unpacked(batch.slice(start)), False)
                held += int(ends[-1]) - before
                break
            yield (*unpacked(batch.slice(start, stop - start)), True)
            held, start = 0, stop
        last = int(bucket[-1])
