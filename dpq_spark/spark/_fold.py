"""One partition's rows counted per (group, grid index) in bounded memory: the fold and its spill.

The codes are int64s, ``gid * 2**33 + k`` with bounds (``k`` the index on the core's default
grid) or ``gid * resolution + bucket`` without; :class:`CodeCounter` counts them exactly,
:class:`Fold` also goes to a temporary file past its budget (sorted runs, or a spill with coarse
counts). Imports numpy only.
"""

from __future__ import annotations

import tempfile

import numpy as np

from dpq_spark.core.quantiles.coarse_bands import COARSE_SHIFT

__all__ = ["FOLD_BUDGET", "SPILL_SHRINK", "Fold", "CodeCounter", "run_starts", "count_runs"]

#: Distinct (group, grid index) pairs a fold may hold in memory before it considers a spill
#: (the driver copies the value into ``ReleaseParams.fold_budget``; tests lower it); with public
#: keys a partition is released in stretches of whole buckets of it and one bucket more at most
#: (:func:`~dpq_spark.spark._packing.bucket_pieces`), each in a fold of twice this budget, so
#: such a fold goes past its budget only for a bucket larger than this. The
#: fold's merges hold a few times this many codes at once: one partition of 8e6 rows, released
#: in one process, grew by 254-260 MiB at 2**21 and by 144-179 MiB at 2**20, for the same CPU
#: time within noise (1e3 to 8e4 groups, with bounds; 1e3 groups of 1e3 rows without bounds:
#: +255-300 against +192 MiB).
FOLD_BUDGET = 1 << 20


#: A fold past its budget spills to coarse counts only when they would be at most this
#: fraction of its fine counts; otherwise the coarse counts would hold as many as they free, and
#: the fold writes its fine counts out as a sorted run instead (copied into
#: ``ReleaseParams.spill_shrink``; tests set 1.0 to force coarse spills).
SPILL_SHRINK = 0.5


_COMPACT_ROWS = 1 << 20  # raw codes buffered before they are merged into counts (or spilled)


_MERGE_CAP = 1 << 23  # ... and at most this many more when the merged codes are already many


def run_starts(codes) -> np.ndarray:
    """Where each run of equal values starts in sorted, non-empty ``codes``."""
    new = np.empty(codes.size, dtype=bool)
    new[0] = True
    np.not_equal(codes[1:], codes[:-1], out=new[1:])
    return np.flatnonzero(new)


def reduce_sorted(codes, counts):
    """Sum ``counts`` over runs of equal ``codes`` (sorted)."""
    if codes.size == 0:
        return codes, counts
    starts = run_starts(codes)
    if starts.size == codes.size:  # no ties
        return codes, counts
    return codes[starts], np.add.reduceat(counts, starts)


class CodeCounter:
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
            codes.sort(kind="stable")  # packed rows are sorted runs: timsort merges them
            parts.append(count_runs(codes))
            del codes
        if weighted:
            parts.append(sum_weighted(weighted))
        self.codes, self.counts = _merge_sorted(parts)
        self._few_ties = int(self.counts.sum()) <= 2 * self.codes.size


def sum_weighted(weighted):
    """``(distinct codes, summed counts)`` of buffered ``(codes, counts)`` chunks (an unstable
    argsort: equal codes are summed, so their order does not matter). Empties ``weighted``,
    so that the chunks are freed before the sort."""
    codes = np.concatenate([c for c, _ in weighted])
    counts = np.concatenate([w for _, w in weighted])
    weighted.clear()
    order = np.argsort(codes, kind="stable")  # sorted runs, as in compact
    return reduce_sorted(codes[order], counts[order])


def count_runs(codes):
    """``(distinct codes, count of each)`` of sorted ``codes`` (one row each)."""
    if codes.size == 0:
        return codes, np.zeros(0, dtype=np.int64)
    starts = run_starts(codes)
    if starts.size == codes.size:  # no ties
        return codes, np.ones(codes.size, dtype=np.int64)
    return codes[starts], np.diff(starts, append=codes.size).astype(np.int64)


class Fold:
    """One partition's rows as counts per (group, grid index), in bounded memory.

    Codes are ``gid * span + index``: with bounds ``span = 2**33`` and ``index = k``, the
    index on the core's grid (at most ``2**32``); without bounds ``span`` is the bucket grid's
    size and ``index`` a bucket.

    While the partition's distinct codes stay within ``budget`` they are counted exactly. Past
    it the fold does one of two things:

    - it *spills* to coarse counts, if that saves memory: the distinct (group, coarse cell
      ``k >> 12``) codes are at most ``shrink`` times the distinct codes (a few groups with
      many rows each). Only with bounds on the default grid (``shrink > 0``). A spilled fold
      appends the codes to a temporary file in the worker's temp directory (deleted by
      :meth:`close`) in chunks of up to ``_COMPACT_ROWS`` rows, each stored as raw codes (8
      bytes a row) or as distinct (code, count) pairs when that is smaller, and memory keeps
      only counts per (group, coarse cell), at most ``2**20 + 1`` per group whatever its
      number of rows. :meth:`fine_counts` re-reads the file in chunks for the coarse cells
      asked for.
    - otherwise it writes *sorted runs*: its distinct codes and counts go to a temporary file
      as one sorted run, memory is emptied, and every later time the budget is reached another
      run follows (values spread over more cells than they fill, as many groups of 1e2 to 1e4
      rows: the coarse counts would be as many as the fine ones). A fold with runs is read back
      by :meth:`slices`, a merge of the runs in code order, which yields the whole groups a few
      at a time as unspilled folds of about ``budget`` codes, so the partition's groups are
      released as they complete and memory stays about the budget and the merge's read
      buffers whatever the number of groups (a single group with more distinct codes than the
      budget is held whole).

    Spilled or not, each group's release has the same distribution to within total variation
    2**-59 (:mod:`dpq_spark.core.quantiles.coarse_bands`); the choice depends on the data's
    spread, and shows only in time and memory. Runs change nothing: the merge gives the same
    counts.
    """

    SHIFT = 33  # bits of k in a code
    _COARSE_SHIFT = 21  # bits of the coarse cell in a coarse code

    def __init__(self, budget: int, shrink: float = SPILL_SHRINK, span: int = 1 << SHIFT):
        self.budget = int(budget)
        self.shrink = float(shrink)
        self.span = int(span)  # code = gid * span + index
        power = self.span & (self.span - 1) == 0
        self._shift = self.span.bit_length() - 1 if power else None
        if self.shrink > 0 and self.span != 1 << self.SHIFT:
            raise ValueError("Fold: coarse spills need codes gid * 2**33 + k (span 2**33); "
                             "give shrink=0 for any other span")
        self.fine = CodeCounter()
        self.coarse: CodeCounter | None = None
        self._spill = None
        self._run_file = None  # the sorted runs, when the fold writes runs
        self._runs: list[tuple[int, int]] = []  # (offset, pairs) of each run in that file

    @property
    def has_runs(self) -> bool:
        """Whether the fold wrote sorted runs (read it with :meth:`slices`)."""
        return bool(self._runs)

    @property
    def spilled(self) -> bool:
        return self._spill is not None

    def add(self, codes, counts=None) -> None:
        """Count ``codes`` (one row each, or ``counts`` rows each)."""
        codes = np.asarray(codes, dtype=np.int64)
        if codes.size == 0:
            return
        if self._spill is None:
            merged = self.fine.add(codes, counts)
            if not merged and self.fine.codes.size + self.fine._buffered > self.budget + _COMPACT_ROWS:
                self.fine.compact()  # the buffer would take the fold far past its budget
                merged = True
            if merged and self.fine.codes.size > self.budget:
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
                self._over_budget(final=True)
        self._flush()
        if self.coarse is not None:
            self.coarse.compact()

    def _over_budget(self, final: bool = False) -> None:
        """Spill if the coarse counts would be at most ``shrink`` times the fine ones, else
        write the fine counts out as a sorted run (and every later time the budget is
        reached). At the end (``final``) codes that need no coarse spill stay in memory: they
        are the last piece :meth:`slices` merges."""
        if final and self._runs:
            return
        if not self._runs:
            if self.shrink > 0:
                coarse = self.coarse_code(self.fine.codes)  # sorted, as the fine codes are
                distinct = 1 + int(np.count_nonzero(coarse[1:] != coarse[:-1]))  # >= 1
                del coarse
                if distinct <= self.shrink * self.fine.codes.size:
                    self._start_spill()
                    return
            if final:
                return
            self._run_file = tempfile.TemporaryFile(prefix="dpq_runs_")
        self._write_run(self.fine.codes, self.fine.counts)
        self.fine = CodeCounter()

    def _write_run(self, codes, counts) -> None:
        f = self._run_file
        f.seek(0, 2)
        self._runs.append((f.tell(), int(codes.size)))
        f.write(np.ascontiguousarray(codes, dtype=np.int64).tobytes())
        f.write(np.ascontiguousarray(counts, dtype=np.int64).tobytes())

    def _run_chunks(self, offset: int, pairs: int, chunk: int):
        """One run's (codes, counts), read back ``chunk`` pairs at a time."""
        f = self._run_file
        for at in range(0, pairs, chunk):
            size = min(chunk, pairs - at)
            f.seek(offset + 8 * at)
            codes = np.frombuffer(f.read(8 * size), dtype=np.int64)
            f.seek(offset + 8 * (pairs + at))
            counts = np.frombuffer(f.read(8 * size), dtype=np.int64)
            yield codes, counts

    def slices(self):
        """The fold's whole groups, in gid order, as unspilled folds (:meth:`groups`,
        :meth:`arrays`) of about ``budget`` distinct codes each (one group larger than that is
        one slice). Without runs this is the fold itself.

        With runs: a merge of the runs and the codes still in memory, each read ``chunk`` pairs
        at a time. The codes below the smallest last gid among the buffers of the runs not yet
        read to their end are complete (every run is sorted), so they are merged (equal codes
        of different runs summed), and the buffer that holds that gid reads its next chunk."""
        if not self._runs:  # finish() compacted the fine counts
            yield self
            return
        self._run_file.flush()
        sources = len(self._runs) + 1
        chunk = max(1 << 16, self.budget // (2 * sources))
        readers = [self._run_chunks(off, pairs, chunk) for off, pairs in self._runs]
        readers.append(iter([(self.fine.codes, self.fine.counts)]))
        self.fine = CodeCounter()
        bufs = [[np.zeros(0, np.int64), np.zeros(0, np.int64), r] for r in readers]
        for b in bufs:  # [codes, counts, reader or None when read to its end]
            self._refill(b, None)
        bufs = [b for b in bufs if b[0].size]
        pending, held = [], 0
        while bufs:
            live = [b for b in bufs if b[2] is not None]
            limit = min(self.gid_of(int(b[0][-1])) for b in live) if live else None
            cut = None if limit is None else limit * self.span
            done = []
            for b in bufs:
                i = b[0].size if cut is None else int(np.searchsorted(b[0], cut))
                if i:
                    done.append((b[0][:i], b[1][:i]))
                    b[0], b[1] = b[0][i:], b[1][i:]
            if done:
                merged = _merge_sorted(done)
                pending.append(merged)
                held += merged[0].size
            if held >= self.budget:
                *whole, rest = self._cut(pending)
                pending, held = [rest], rest[0].size  # the pieces _cut copied: freed first
                yield from whole
            for b in live:
                self._refill(b, limit)
            bufs = [b for b in bufs if b[0].size or b[2] is not None]
        if held:
            *whole, rest = self._cut(pending)
            pending = None
            yield from whole
            if rest[0].size:
                yield self._slice(*rest)

    def _cut(self, parts):
        """Whole groups (sorted ``(codes, counts)`` pieces) cut at group boundaries into unspilled
        folds of at least ``budget`` codes (a group is never split), and what is left after the
        last cut as a ``(codes, counts)`` piece (fewer codes than the budget, maybe none)."""
        codes = np.concatenate([c for c, _ in parts])
        counts = np.concatenate([w for _, w in parts])
        gid = self.gid_of(codes)
        out, at = [], 0
        while codes.size - at >= self.budget:
            # the first group boundary at or after `budget` codes from `at`
            end = int(np.searchsorted(gid, gid[at + self.budget - 1], side="right"))
            out.append(self._slice(codes[at:end], counts[at:end]))
            at = end
        return (*out, (codes[at:], counts[at:]))

    def _refill(self, b, limit) -> None:
        """Read a run's next chunks into its buffer ``b`` while the buffer is empty or ends in
        gid ``limit``, or until the run is read to its end (``b[2]`` set to None)."""
        while b[2] is not None and (b[0].size == 0 or self.gid_of(int(b[0][-1])) == limit):
            got = next(b[2], None)
            if got is None:
                b[2] = None
            elif b[0].size:
                b[0] = np.concatenate([b[0], got[0]])
                b[1] = np.concatenate([b[1], got[1]])
            else:
                b[0], b[1] = got

    def _slice(self, codes, counts) -> "Fold":
        """An unspilled fold holding these whole groups' sorted distinct codes and counts."""
        part = Fold(self.budget, self.shrink, self.span)
        part.fine.codes, part.fine.counts = codes, counts
        return part

    def _start_spill(self) -> None:
        self._spill = tempfile.TemporaryFile(prefix="dpq_fold_")
        self._pending, self._weighted, self._pending_rows = [], [], 0
        self.coarse = CodeCounter()
        codes, counts = self.fine.codes, self.fine.counts
        self.fine = CodeCounter()
        self._write(codes, counts)

    def _flush(self) -> None:
        if self._spill is None:
            return
        pending, weighted = self._pending, self._weighted
        self._pending, self._weighted, self._pending_rows = [], [], 0
        if pending:
            raw = np.sort(np.concatenate(pending), kind="stable")
            del pending
            codes, counts = count_runs(raw)
            if 2 * codes.size > raw.size:  # mostly distinct: raw codes are the smaller record
                self._write(raw, None)
                self.coarse.add(*reduce_sorted(self.coarse_code(codes), counts))
            else:
                self._write(codes, counts)
        if weighted:
            self._write(*sum_weighted(weighted))

    def _write(self, codes, counts) -> None:
        """Append one chunk: header (size, has counts), the codes, then the counts if any."""
        header = np.array([codes.size, counts is not None], dtype=np.int64)
        self._spill.write(header.tobytes())
        self._spill.write(np.ascontiguousarray(codes, dtype=np.int64).tobytes())
        if counts is not None:
            self._spill.write(np.ascontiguousarray(counts, dtype=np.int64).tobytes())
            self.coarse.add(*reduce_sorted(self.coarse_code(codes), counts))

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

    def gid_of(self, codes):
        """The gid of each code (an int or an int64 array): ``codes // span``."""
        return codes >> self._shift if self._shift is not None else codes // self.span

    def groups(self):
        """Sorted gids and, per gid, ``(a, b)`` slices into :meth:`arrays`."""
        if self._spill is None:
            gid = self.gid_of(self.fine.codes)
        else:
            gid = self.coarse.codes >> self._COARSE_SHIFT
        starts = np.flatnonzero(np.r_[True, gid[1:] != gid[:-1]]) if gid.size else np.zeros(0, int)
        ends = np.r_[starts[1:], gid.size].astype(np.int64)
        return gid[starts], starts, ends

    def arrays(self):
        """``(index, counts)``: fine grid indices when not spilled, else coarse cells."""
        if self._spill is None:
            codes = self.fine.codes
            return codes - self.gid_of(codes) * self.span, self.fine.counts
        codes = self.coarse.codes
        return codes - ((codes >> self._COARSE_SHIFT) << self._COARSE_SHIFT), self.coarse.counts

    def fine_counts(self, wanted) -> tuple[np.ndarray, np.ndarray]:
        """Exact counts per fine code of the spilled rows whose coarse code is in ``wanted``
        (sorted int64), read back in chunks."""
        out = CodeCounter()
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
        if self._run_file is not None:
            self._run_file.close()


def _merge_sorted(parts):
    """Distinct codes and summed counts of several sorted ``(codes, counts)`` pieces (each
    piece's codes distinct). Empties ``parts``, so that the pieces are freed before the sort."""
    if len(parts) == 1:
        return parts.pop()
    codes = np.concatenate([c for c, _ in parts])
    counts = np.concatenate([w for _, w in parts])
    parts.clear()
    order = np.argsort(codes, kind="stable")  # sorted runs: timsort merges them
    return reduce_sorted(codes[order], counts[order])
