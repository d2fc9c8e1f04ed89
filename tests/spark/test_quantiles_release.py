"""The Python side of dp_quantiles without Spark: streaming counts and the selection threshold."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

pytest.importorskip("pandas")

from dpq_spark.core.randomness.source import resolve_rng  # noqa: E402
from dpq_spark.core.randomness.samplers import discrete_laplace  # noqa: E402
from dpq_spark.spark import _release  # noqa: E402
from dpq_spark.spark import _columns  # noqa: E402
from dpq_spark.spark import _fold  # noqa: E402
from dpq_spark.spark import _packing  # noqa: E402
from dpq_spark.spark._release import ReleaseParams  # noqa: E402
from dpq_spark.core.quantiles.coarse_bands import coarse_midpoints, coarse_of  # noqa: E402
from dpq_spark.core.randomness.grid import Grid  # noqa: E402
from dpq_spark.spark._selection import laplace_scale, selection_threshold  # noqa: E402
from _shuffle import sorted_by_bucket  # noqa: E402


def _params(**kw):
    base = dict(keys=("k1", "k2"), quantiles=(0.5,), epsilon=1.0, lower=0.0, upper=1.0,
                resolution=64, neighboring="add_remove", mechanism="joint_exp")
    base.update(kw)
    return ReleaseParams(**base)


GRID = Grid(0.0, 1.0)  # the grid of _params(): indices 0 .. 2**32


def _released(out, key):
    return {key(r): r.value for r in out.itertuples()}


@pytest.mark.parametrize("budget, ties", [(1 << 22, False), (40, False), (40, True)])
def test_fold_counts_exactly_within_budget_and_spills_past_it(monkeypatch, budget, ties):
    """Exact counts per (group, grid index) across batches and merges; past the budget, exact
    counts per (group, coarse cell) and the spill file gives back exact fine counts of the
    coarse cells asked for (chunks of raw codes, or of pairs when values are tied)."""
    monkeypatch.setattr(_fold, "_COMPACT_ROWS", 700)  # force several merges
    gen = np.random.default_rng(0)
    gids = gen.integers(0, 5, 6000)
    k = np.where(gen.random(6000) < 0.5, gen.integers(0, 2**32 + 1, 6000),
                 2**31 + gen.integers(0, 3 * 4096, 6000))
    if ties:  # 60 distinct values: every spilled chunk is stored as (code, count) pairs
        k = np.sort(np.unique(k))[:60][gen.integers(0, 60, 6000)]
    codes = (gids << 33) + k
    fold = _fold.Fold(budget, shrink=1.0)  # spill past the budget whatever the spread
    try:
        for i in range(0, codes.size, 333):
            fold.add(codes[i:i + 333])
        fold.finish()
        want_codes, want_counts = np.unique(codes, return_counts=True)
        index, counts = fold.arrays()
        gid_list, starts, ends = fold.groups()
        assert gid_list.tolist() == [0, 1, 2, 3, 4]
        assert fold.spilled == (budget < want_codes.size)
        if not fold.spilled:
            assert index.tolist() == (want_codes - ((want_codes >> 33) << 33)).tolist()
            assert counts.tolist() == want_counts.tolist()
            return
        coarse = (gids << 21) + (k >> 12)
        c_codes, c_counts = np.unique(coarse, return_counts=True)
        assert counts.tolist() == c_counts.tolist()
        assert index.tolist() == (c_codes - ((c_codes >> 21) << 21)).tolist()
        wanted = np.sort(c_codes[::3])
        got_codes, got_counts = fold.fine_counts(wanted)
        sel = np.isin(coarse, wanted)
        e_codes, e_counts = np.unique(codes[sel], return_counts=True)
        assert got_codes.tolist() == e_codes.tolist()
        assert got_counts.tolist() == e_counts.tolist()
    finally:
        fold.close()


def _sliced(fold):
    """(gids, index, counts) of every slice of a fold, concatenated, and the slices' sizes."""
    parts = list(fold.slices())
    gids, index, counts, sizes = [], [], [], []
    for part in parts:
        g, a, b = part.groups()
        i, c = part.arrays()
        gids += np.repeat(g, b - a).tolist()
        index += i.tolist()
        counts += c.tolist()
        sizes.append(len(i))
    return np.array(gids), np.array(index), np.array(counts), sizes


def test_fold_spills_only_when_coarse_counts_are_fewer(monkeypatch):
    """Past its budget a fold spills to coarse counts only if they would be at most half its
    fine ones: values tied into few coarse cells spill; values spread one per coarse cell are
    written out as sorted runs instead, and the merge of the runs gives back every exact count,
    whole groups in gid order, in slices of about the budget. Either way the counts are exact."""
    monkeypatch.setattr(_fold, "_COMPACT_ROWS", 500)
    gen = np.random.default_rng(4)
    spread = (gen.integers(0, 30, 5000) << 33) + 4096 * gen.choice(2**20, 5000, replace=False)
    dense = (gen.integers(0, 3, 5000) << 33) + 2**31 + gen.integers(0, 8 * 4096, 5000)
    for codes, spills in [(spread, False), (dense, True)]:
        fold = _fold.Fold(300)
        try:
            for i in range(0, codes.size, 250):
                fold.add(codes[i:i + 250])
            fold.finish()
            assert fold.spilled == spills and fold.has_runs == (not spills)
            if spills:
                want, counts = np.unique(codes >> 12, return_counts=True)
                index, got = fold.arrays()
                assert got.tolist() == counts.tolist()
                continue
            want, counts = np.unique(codes, return_counts=True)
            gids, index, got, sizes = _sliced(fold)
            assert gids.tolist() == (want >> 33).tolist()
            assert index.tolist() == (want - ((want >> 33) << 33)).tolist()
            assert got.tolist() == counts.tolist()
            assert fold.budget == 300 and len(sizes) > 5 and max(sizes) < 2 * 300 + 200
        finally:
            fold.close()


@pytest.mark.parametrize("seed", [0, 1])
def test_fold_runs_merge_ties_across_runs_and_a_group_larger_than_the_budget(monkeypatch, seed):
    """Runs hold the same codes more than once (a value seen before and after a run was
    written): the merge sums them. A group with more distinct codes than the budget comes out
    whole in one slice; groups never straddle two slices; groups without codes do not appear."""
    monkeypatch.setattr(_fold, "_COMPACT_ROWS", 300)
    gen = np.random.default_rng(seed)
    gid = np.concatenate([gen.integers(0, 40, 6000) * 2, np.full(3000, 41)])  # even gids, 41
    k = 4096 * gen.integers(0, 2**20, gid.size)
    k[:2000] = 4096 * gen.integers(0, 50, 2000)  # ties spread through the runs
    codes = gen.permutation((gid << 33) + k)
    fold = _fold.Fold(400)
    try:
        for i in range(0, codes.size, 200):
            fold.add(codes[i:i + 200])
            if i == 4000:  # counts mixed in, as packed rows carry them
                fold.add(codes[:50], np.full(50, 3))
        fold.finish()
        assert fold.has_runs
        extra = np.repeat(codes[:50], 3)
        want, counts = np.unique(np.concatenate([codes, extra]), return_counts=True)
        gids, index, got, sizes = _sliced(fold)
        assert gids.tolist() == (want >> 33).tolist() and got.tolist() == counts.tolist()
        assert index.tolist() == (want - ((want >> 33) << 33)).tolist()
        seen = [set(p.groups()[0].tolist()) for p in fold.slices()]
        assert sum(len(s) for s in seen) == len(set().union(*seen))  # no group in two slices
        assert any(s == {41} or 41 in s for s in seen)
        assert max(sizes) >= np.count_nonzero(want >> 33 == 41)
    finally:
        fold.close()


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("shift", [0, 2])
def test_packed_rows_keep_every_groups_codes(monkeypatch, ties, shift):
    """pack_partition (before the shuffle) sorts codes in chunks and cuts them into rows of one
    bucket (``gid >> shift``) and at most _PACK_WIDTH codes, with counts when tied; unpacking
    any mix of its rows (rows of tied and of distinct chunks in one batch, as a shuffle delivers
    them) gives back every code with its multiplicity, and every code travels in a row of its
    group's bucket (what the shuffle partitions by)."""
    monkeypatch.setattr(_packing, "_PACK_ROWS", 1500)
    gen = np.random.default_rng(5)
    gid = gen.integers(0, 6 << shift, 9000)
    k = gen.integers(0, 40, 9000) if ties else gen.integers(0, 2**32 + 1, 9000)
    k[:3000] = gen.integers(0, 3, 3000)  # the first chunks tied whatever ``ties``
    codes = (gid << 33) + k
    raw = [pa.RecordBatch.from_arrays([pa.array(codes[i:i + 700])], names=[_columns.CODE])
           for i in range(0, codes.size, 700)]
    packed = list(_packing.pack_partition(iter(raw), 1 << 33, shift=shift))
    table = pa.Table.from_batches(packed)
    assert table.schema.names == [_columns.BUCKET, _columns.CODES, _columns.COUNTS]
    assert sorted(set(table.column(_columns.BUCKET).to_pylist())) == list(range(6))
    shuffled = table.take(gen.permutation(table.num_rows)).combine_chunks()
    got = {}
    for batch in shuffled.to_batches(max_chunksize=97):
        c, w = _packing.unpacked(batch)
        w = np.ones(c.size, dtype=np.int64) if w is None else w
        assert np.all(c >> (33 + shift) == np.repeat(batch.column(_columns.BUCKET).to_numpy(),
                                            _packing.int64s(batch.column(_columns.CODES))[1]))
        for code, n in zip(c.tolist(), w.tolist()):
            got[code] = got.get(code, 0) + n
    want_codes, want_counts = np.unique(codes, return_counts=True)
    assert sorted(got) == want_codes.tolist()
    assert [got[c] for c in want_codes.tolist()] == want_counts.tolist()
    lengths = _packing.int64s(table.column(_columns.CODES).combine_chunks())[1]
    assert lengths.max() <= _packing._PACK_WIDTH and lengths.min() >= 1
    assert any(len(b.column(_columns.COUNTS).buffers()[2] or b"") for b in packed)  # tied chunks
    # large_binary offsets (Spark 4's arrow.useLargeVarTypes) read the same
    big = shuffled.cast(pa.schema([table.schema.field(0), pa.field(_columns.CODES, pa.large_binary()),
                                   pa.field(_columns.COUNTS, pa.large_binary())]))
    for small_batch, large_batch in zip(shuffled.to_batches(), big.to_batches()):
        a, b = _packing.unpacked(small_batch), _packing.unpacked(large_batch)
        assert np.array_equal(a[0], b[0])
        assert (a[1] is None) == (b[1] is None) and (a[1] is None or np.array_equal(a[1], b[1]))


@pytest.mark.parametrize("key_type", [pa.int64(), pa.int32(), pa.large_string()])
def test_packing_with_a_key_lookup_numbers_listed_keys_and_drops_the_rest(monkeypatch, key_type):
    """pack_partition with ``keys``: each (key, grid index) row becomes the code of the key's
    place in the list, across chunks and for the key column's own Arrow type (the list is cast
    to it); unlisted and null keys are dropped; a chunk with no listed key packs nothing."""
    monkeypatch.setattr(_packing, "_PACK_ROWS", 1000)
    gen = np.random.default_rng(6)
    listed = [40, -7, 3, 2**20]
    pool = listed + [5, 6]  # 5 and 6 are not listed
    picks = gen.integers(0, len(pool) + 1, 5000)  # the last index stands for a null key
    k = gen.integers(0, 2**32 + 1, picks.size)
    picks[:1200] = 4  # a first chunk of unlisted keys only
    def as_key(values):
        return pa.array([None if v is None else (str(v) if pa.types.is_large_string(key_type) else v)
                         for v in values], type=key_type)
    key = as_key([pool[p] if p < len(pool) else None for p in picks.tolist()])
    rows = [pa.RecordBatch.from_arrays([key.slice(i, 600), pa.array(k[i:i + 600])],
                                       names=["key", _columns.CELL])
            for i in range(0, picks.size, 600)]
    keys = as_key(listed).cast(pa.string() if pa.types.is_large_string(key_type) else pa.int64())
    packed = list(_packing.pack_partition(iter(rows), 1 << 33, keys=keys))
    got = np.sort(np.concatenate([_packing.unpacked(b)[0] for b in packed]))
    kept = picks < len(listed)  # pool[i] is listed[i]: its place in the list is i
    want = np.sort(picks[kept].astype(np.int64) * (1 << 33) + k[kept])
    assert np.array_equal(got, want)
    assert all(_packing.unpacked(b)[1] is None for b in packed)  # distinct codes here


@pytest.mark.parametrize("key_type", [pa.int8(), pa.int16(), pa.int32(), pa.int64()])
def test_key_table_places_keys_as_index_in_does(key_type):
    """KeyLookup's table (signed integral keys over a short range) gives every row the place
    Arrow's index_in gives it: listed keys their place in the list, unlisted keys inside and
    outside the range and null keys none, also keys at the ends of int64 (whose offset from
    the range would overflow)."""
    gen = np.random.default_rng(7)
    info = np.iinfo(key_type.to_pandas_dtype())
    listed = gen.permutation(np.arange(-50, 70))[:100]  # 100 of the 120 values of the range
    index = _packing.KeyLookup(pa.array(listed, type=key_type))
    assert index.table is not None and index.table.size == int(listed.max() - listed.min()) + 1
    data = gen.integers(-60, 80, 4000).astype(object)
    data[gen.integers(0, data.size, 300)] = None
    data[:4] = [info.min, info.max, info.min + 1, int(listed.max()) + 1]
    column = pa.array(data.tolist(), type=key_type)
    gid, ok = index.places(column)
    want = pc.index_in(column, value_set=pa.array(listed, type=key_type))
    assert np.array_equal(ok, np.asarray(want.is_valid()))
    assert np.array_equal(gid[ok], np.asarray(want.drop_null(), dtype=np.int64))
    assert 0 < ok.sum() < data.size and not ok[:4].any()


@pytest.mark.parametrize("keys", [[-2**63, 0, 2**63 - 1], ["b", "a", "c"]])
def test_keys_off_the_table_take_index_in(keys):
    """Keys spread over a range too wide for a table, and string keys, are looked up by
    index_in: the same places, nulls and unlisted keys dropped."""
    index = _packing.KeyLookup(pa.array(keys))
    assert index.table is None
    column = pa.array([keys[1], keys[2], None, keys[0], keys[1]] + ([5] if keys[1] == 0 else ["z"]))
    gid, ok = index.places(column)
    assert ok.tolist() == [True, True, False, True, True, False]
    assert gid[ok].tolist() == [1, 2, 0, 1]


def dlap_tail(k, scale):
    """Exact ``P(Y >= k)`` for the discrete Laplace of ``scale`` and an integer ``k >= 1``."""
    q = math.exp(-1.0 / float(scale))
    return q**k / (1 + q)


def test_selection_threshold_formula():
    assert laplace_scale(0.5, 3) == 6
    for eps, delta, g in [(1.0, 1e-6, 1), (2.0, 1e-5, 4), (0.3, 1e-9, 7), (5.0, 0.05, 2)]:
        tau = selection_threshold(eps, delta, g)
        b = laplace_scale(eps, g)
        assert isinstance(tau, int) and b >= Fraction(g) / Fraction(eps)
        dk = -math.expm1(math.log1p(-delta) / g)
        # the smallest integer threshold whose one-unit release probability is <= delta_key
        assert dlap_tail(tau - 1, b) <= dk
        assert tau - 1 == 1 or dlap_tail(tau - 2, b) > dk
    # near the continuous threshold 1 + b ln(1 / (2 delta_key)), slightly above it
    cont = 1 + math.log(1 / 2e-6)
    assert cont <= selection_threshold(1.0, 1e-6, 1) <= cont + 2


@pytest.mark.parametrize("groups", [1, 3])
def test_new_key_released_with_probability_at_most_delta(groups):
    """Monte Carlo with the exact sampler: a key with one unit passes w.p. P(Y >= tau - 1) (exact
    formula); G such keys: any w.p. <= delta. A threshold that ignores G (the scale of one key)
    lets far more through."""
    eps, delta, draws = 1.0, 0.05, 300_000
    src = resolve_rng(np.random.default_rng(7))
    tau = selection_threshold(eps, delta, groups)
    b = laplace_scale(eps, groups)
    noise = discrete_laplace(src, b, size=(draws, groups))
    expected = 1 - (1 - dlap_tail(tau - 1, b)) ** groups
    assert expected <= delta
    any_released = np.mean(np.any(1 + noise >= tau, axis=1))
    se = math.sqrt(expected * (1 - expected) / draws)
    assert abs(any_released - expected) < 5 * se
    assert any_released < delta + 3 * se
    if groups > 1:  # power: the one-key threshold lets far more than delta through
        wrong = selection_threshold(eps / groups, delta, 1)
        assert np.mean(np.any(1 + noise >= wrong, axis=1)) > delta + 10 * se


@pytest.mark.parametrize("budget", [1 << 22, 4])
def test_packed_codes_are_released_per_key_index(monkeypatch, budget):
    """Public-key path: one int64 code = key index * 2**33 + grid index per row, packed per
    group (pack_partition); spilled or not, each key index is released from its own rows."""
    monkeypatch.setattr(_fold, "_COMPACT_ROWS", 700)
    gen = np.random.default_rng(3)
    gids = gen.integers(0, 7, 4000)
    k = 5000 * (gids + 1) + gen.integers(0, 3, 4000)  # each group within a few grid points
    codes = (gids << 33) + k
    monkeypatch.setattr(_packing, "_PACK_ROWS", 1000)  # several packed chunks per group
    raw = [pa.RecordBatch.from_arrays([pa.array(codes[i:i + 450])], names=[_columns.CODE])
           for i in range(0, 4000, 450)]
    batches = sorted_by_bucket(_packing.pack_partition(iter(raw), 1 << 33), 3)
    params = _params(keys=("g",), extra_columns=(_columns.CODE,), epsilon=1e4,
                     fold_budget=budget, spill_shrink=1.0)
    out = pa.Table.from_batches(list(_release.release_partition(iter(batches), params))).to_pandas()
    assert list(out.columns) == [_columns.GID, "value", "mechanism"]  # one row per group
    assert set(out["mechanism"]) == {"joint_exp"}
    assert out[_columns.GID].tolist() == list(range(7))
    for g, value in zip(out[_columns.GID], out["value"]):
        assert [GRID.value(np.median(k[gids == g]))] == list(value)


def _packed_groups(monkeypatch, groups, rows, seed, shift=0):
    """Codes of ``groups`` groups of ``rows`` grid indices each, in random order,
    packed in chunks of 1,000 codes (each chunk's rows sorted on their own, as a map task's)."""
    monkeypatch.setattr(_packing, "_PACK_ROWS", 1000)
    gen = np.random.default_rng(seed)
    gids = np.repeat(np.arange(groups, dtype=np.int64), rows)
    k = 2**31 + (gids << 22) + gen.integers(0, 2**21, gids.size)  # each group its own range
    codes = (gids << 33) + k
    order = gen.permutation(codes.size)
    raw = [pa.RecordBatch.from_arrays([pa.array(codes[order][i:i + 500])], names=[_columns.CODE])
           for i in range(0, codes.size, 500)]
    return gids, k, list(_packing.pack_partition(iter(raw), 1 << 33, shift=shift))


@pytest.mark.parametrize("shift", [0, 2])
def test_bucket_pieces_end_stretches_only_after_whole_buckets(monkeypatch, shift):
    """Packed rows sorted by bucket, in batches that cut buckets anywhere: the pieces carry
    every code once, a stretch ends (``whole``) only when every bucket before it is complete
    (none comes again), once it holds the budget: every stretch but the last holds at least
    the budget and at most the budget and one bucket more."""
    gids, k, packed = _packed_groups(monkeypatch, 60, 150, 11, shift)
    batches = sorted_by_bucket(packed, 7)
    budget = 1000
    got, seen, done, stretch, sizes = [], set(), set(), 0, []
    for codes, counts, whole in _packing.bucket_pieces(iter(batches), budget):
        assert counts is None  # distinct codes: raw
        buckets = set(((codes >> 33) >> shift).tolist())
        assert not buckets & done  # a bucket of an ended stretch never comes again
        seen |= buckets
        got.append(codes)
        stretch += codes.size
        if whole:
            done |= seen
            sizes.append(stretch)
            stretch = 0
    assert np.array_equal(np.sort(np.concatenate(got)), np.sort((gids << 33) + k))
    bucket = 150 << shift  # codes in a bucket
    assert len(sizes) >= 5 and all(budget <= size <= budget + bucket for size in sizes)


def test_bucket_pieces_refuse_rows_out_of_bucket_order(monkeypatch):
    """Rows out of bucket order, within a batch or from one batch to the next, raise before
    their stretch is released, naming no data."""
    _, _, packed = _packed_groups(monkeypatch, 20, 100, 12)
    batches = sorted_by_bucket(packed, 9)
    for bad in (batches[::-1], [pa.concat_tables(  # one batch, its halves swapped
            [pa.Table.from_batches(batches[len(batches) // 2:]),
             pa.Table.from_batches(batches[:len(batches) // 2])]).combine_chunks().to_batches()[0]]):
        with pytest.raises(RuntimeError, match="not in bucket order") as err:
            list(_packing.bucket_pieces(iter(bad), 10**9))
        assert not any(ch.isdigit() for ch in str(err.value))


def test_a_partition_is_released_a_stretch_at_a_time(monkeypatch):
    """A partition of many groups, past the fold budget several times over: its groups are
    released stretch by stretch, each exactly once and from its own rows (epsilon 1e4: within
    a point of the median; each group's rows have a range of their own), and no fold writes
    sorted runs or spills (each holds about a budget of codes, however many groups the
    partition has; the fold merges its buffered codes once they reach the budget, as with the
    production constants, so a stretch's fold of only the budget would write a run)."""
    monkeypatch.setattr(_fold, "_COMPACT_ROWS", 900)
    gids, k, packed = _packed_groups(monkeypatch, 200, 41, 13)
    batches = sorted_by_bucket(packed, 11)
    folds, writes = [], []
    real_new = _release.new_fold
    monkeypatch.setattr(_release, "new_fold", lambda *a: folds.append(real_new(*a)) or folds[-1])
    monkeypatch.setattr(_fold.Fold, "_write_run", lambda *a: writes.append(1))
    monkeypatch.setattr(_fold.Fold, "_start_spill", lambda *a: writes.append(1))
    params = _params(keys=("g",), extra_columns=(_columns.CODE,), epsilon=1e4, fold_budget=900)
    out = pa.Table.from_batches(list(_release.release_partition(iter(batches), params)))
    assert out.column(_columns.GID).to_pylist() == list(range(200))
    assert len(folds) >= 8 and not writes
    for g, value in zip(range(200), out.column("value").to_pylist()):
        x = GRID.value(np.sort(k[gids == g]))
        assert x[19] <= value[0] <= x[21]


@pytest.mark.parametrize("granularity", [None, 1.0])
def test_a_fold_on_a_declared_grid_writes_runs_instead_of_spilling(monkeypatch, granularity):
    """300 groups of 10 integers whose codes crowd one coarse cell, past a budget of 500 codes:
    on the default grid the partition's fold spills to coarse counts (they are 10 times fewer);
    on a declared grid every mechanism reads each group's whole grid data, so a spill would
    bring the whole partition back at once: the fold writes sorted runs instead, and the groups
    are released a slice at a time, each once, on the integers."""
    monkeypatch.setattr(_fold, "_COMPACT_ROWS", 200)  # merges (and budget checks) mid-stream
    gen = np.random.default_rng(5)
    gids = np.repeat(np.arange(300), 10)
    values = gen.integers(0, 101, gids.size)
    k = values if granularity else 2**31 + values  # one coarse cell (k >> 12) a group
    codes = (gids.astype(np.int64) << 33) + k
    params = _params(keys=("g",), extra_columns=(_columns.CODE,), quantiles=(0.25, 0.5, 0.75),
                     epsilon=1e9, lower=0.0, upper=100.0, mechanism="ind_exp",
                     granularity=granularity, fold_budget=500)
    fold = _release.new_fold(params)
    for i in range(0, codes.size, 250):
        fold.add(codes[i:i + 250])
    fold.finish()
    assert (fold.spilled, fold.has_runs) == ((True, False) if granularity is None else (False, True))
    fold.close()
    if granularity is None:
        return
    with pytest.raises(RuntimeError, match="declared grid"):
        list(_release._release_spilled(_fold_of([np.arange(3)]), params, None, None))
    calls = []
    real = _release.release_many
    monkeypatch.setattr(_release, "release_many",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    gen.shuffle(codes)
    raw = [pa.RecordBatch.from_arrays([pa.array(codes[i:i + 450])], names=[_columns.CODE])
           for i in range(0, codes.size, 450)]
    batches = sorted_by_bucket(_packing.pack_partition(iter(raw), 1 << 33), 3)
    out = pa.Table.from_batches(list(_release.release_partition(iter(batches), params)))
    assert out.column(_columns.GID).to_pylist() == list(range(300))
    assert len(calls) > 1  # a slice of groups at a time
    qn = np.array([2.5, 5.0, 7.5])  # the quantiles' target ranks among 10 rows
    for g, value in zip(range(300), out.column("value").to_pylist()):
        data = np.sort(values[gids == g])
        assert value == sorted(value) and all(v == round(v) for v in value)
        # at a huge epsilon each output lies in a gap whose rank is nearest its target
        low, high = data[np.floor(qn).astype(int) - 1], data[np.ceil(qn).astype(int)]
        assert np.all((value >= low) & (value <= high)), g


# --------------------------------------------------------------------------------------------
# Many groups in one call (production randomness): core.batch.release_many inside the fold


def _fold_of(groups):
    fold = _fold.Fold(1 << 22)
    for gid, k in enumerate(groups):
        fold.add((np.int64(gid) << 33) + np.asarray(k, dtype=np.int64))
    fold.finish()
    return fold


def test_output_blocks_recut_releases_in_order():
    """output_blocks cuts blocks of any sizes (one group, several, none) into blocks of the
    given size, the last smaller, keeping every group's values and name in order."""
    gen = np.random.default_rng(8)
    sizes = [1, 0, 7, 1, 1, 30, 2, 0, 13]
    blocks, at = [], 0
    for n in sizes:
        blocks.append(_release.Released(np.arange(at, at + n, dtype=np.int64),
                                        gen.random((n, 3)), [f"m{g}" for g in range(at, at + n)]))
        at += n
    got = list(_release.output_blocks(iter(blocks), 8))
    assert [len(b.gids) for b in got] == [8] * 6 + [at - 48]
    assert np.concatenate([b.gids for b in got]).tolist() == list(range(at))
    assert np.array_equal(np.concatenate([b.values for b in got]),
                          np.concatenate([b.values for b in blocks]))
    assert [n for b in got for n in b.names] == [f"m{g}" for g in range(at)]
    assert list(_release.output_blocks(iter([]), 8)) == []


def _fold_release(fold, params):
    return {g: (v.tolist(), name)
            for block in _release._release_fold(fold, params, lambda gid: None, lambda gid: gid)
            for g, v, name in zip(block.gids.tolist(), block.values, block.names)}


@pytest.mark.parametrize("mechanism", ["auto", "joint_exp", "ind_exp", "approx_quantiles",
                                       "agg_tree"])
def test_unseeded_fold_releases_groups_in_batches_with_the_per_group_data(monkeypatch, mechanism):
    """Without a seed (production) the fold hands its groups to release_many. At a huge epsilon
    every mechanism puts each output in the one gap (or point) of its data whose rank fits, so
    the batch path must give JointExp/IndExp (and auto, which picks JointExp for 4 quantiles) the exact grid
    indices and ApproxQuantiles/AggTree the coarse cells, exactly as the seeded per-group path
    (release_fine): the outputs' positions among the data each mechanism sees must agree. An
    output in the gap above a data point may be released as the point that closes the gap (the
    gap ends on the tie split's fine points of that grid point), so a released data point
    stands for the gaps on both of its sides."""
    gen = np.random.default_rng(4)
    groups = [np.sort(gen.choice(2**32 + 1, size, replace=False)) for size in (10, 20, 40, 300)]
    groups.append(np.sort(2**31 + gen.choice(3 * 4096, 50, replace=False)))  # 3 coarse cells
    calls = []
    real = _release.release_many
    monkeypatch.setattr(_release, "release_many",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q = (0.1, 0.3, 0.7, 0.9)
    batch = _fold_release(_fold_of(groups), _params(epsilon=1e9, quantiles=q, mechanism=mechanism))
    assert calls, "the unseeded fold did not use release_many"
    per_group = _fold_release(_fold_of(groups), _params(epsilon=1e9, quantiles=q,
                                                        mechanism=mechanism, base_seed=1))
    assert len(calls) == 1  # the seeded run stays on the per-group path
    assert batch.keys() == per_group.keys() == set(range(len(groups)))
    coarse = mechanism in ("approx_quantiles", "agg_tree")
    for g, k in enumerate(groups):
        assert batch[g][1] == per_group[g][1] == ("joint_exp" if mechanism == "auto" else mechanism)
        seen = coarse_midpoints(coarse_of(k), GRID.steps) if coarse else k
        rep = GRID.value(np.unique(seen))
        # the gaps an output can be in: [left, right] ranks (two when it is a data point)
        (lo_b, hi_b), (lo_p, hi_p) = [(np.searchsorted(rep, v, side="left"),
                                       np.searchsorted(rep, v, side="right"))
                                      for v in (batch[g][0], per_group[g][0])]
        assert np.all((lo_b <= hi_p) & (lo_p <= hi_b)), (g, mechanism)


@pytest.mark.parametrize("mechanism", ["auto", "joint_exp", "ind_exp", "approx_quantiles",
                                       "agg_tree", "histogram"])
def test_unseeded_fold_on_a_declared_grid_releases_in_batches(monkeypatch, mechanism):
    """An integral column's grid (granularity 1) goes through release_many too, with the
    declared grid: every release is an integer of the bounds and, at a huge epsilon, JointExp,
    IndExp and ApproxQuantiles (and auto, which picks among them here) put each decile inside the
    tie block its rank falls in, as the core does on the jittered grid data."""
    gen = np.random.default_rng(12)
    groups = [np.sort(gen.integers(0, 101, size)) for size in (40, 300, 2000)]
    calls = []
    real = _release.release_many
    monkeypatch.setattr(_release, "release_many",
                        lambda *a, **kw: calls.append(kw.get("granularity")) or real(*a, **kw))
    q = tuple(np.arange(1, 10) / 10)
    fold = _fold.Fold(1 << 22)
    for gid, k in enumerate(groups):
        fold.add((np.int64(gid) << 33) + k.astype(np.int64))
    fold.finish()
    params = _params(epsilon=1e9, quantiles=q, mechanism=mechanism, lower=0.0, upper=100.0,
                     granularity=1.0)
    out = _fold_release(fold, params)
    assert calls == [1.0], "the unseeded fold did not hand its declared grid to release_many"
    for g, data in enumerate(groups):
        values, name = out[g]
        assert name != "bounds_not_found" and np.array_equal(values, np.round(values))
        assert all(0 <= v <= 100 for v in values)
        if name in ("joint_exp", "ind_exp", "approx_quantiles"):
            low = np.quantile(data, q, method="inverted_cdf")
            high = np.quantile(data, q, method="higher")
            assert np.all((np.array(values) >= low) & (np.array(values) <= high)), (g, name)


@pytest.mark.parametrize("mechanism", ["approx_quantiles", "agg_tree"])
def test_release_many_coarse_cells_is_the_core_on_coarse_cells(mechanism):
    """coarse_cells=True feeds ApproxQuantiles/AggTree each row at its coarse cell's
    representative grid point, as the per-group path does: seeded (ApproxQuantiles) or at a
    huge epsilon (AggTree), the same release as the core mechanism on those points (for
    ApproxQuantiles its recursion on the points as they are, not split into fine points), and
    not the one on the exact indices."""
    from dpq_spark.core import MECHANISMS
    from dpq_spark.core.quantiles.approx_quantiles import approx_quantiles_indices
    from dpq_spark.core.quantiles.batch import release_many

    gen = np.random.default_rng(8)
    # 80 rows in 80 distinct coarse cells: more than release_many's 64-point small path, so
    # ApproxQuantiles runs the core's sampler and makes its very draws
    k = np.sort(2**31 + 4096 * gen.choice(200, 80, replace=False) + gen.integers(0, 4096, 80))
    counts = np.ones(k.size, dtype=np.int64)
    q = np.array([0.25, 0.5, 0.75])
    eps = 1.0 if mechanism == "approx_quantiles" else 1e9

    def batch(coarse):
        out = release_many([(k, counts)], q, epsilon=eps, lower=0.0, upper=1.0,
                           mechanism=mechanism, grid_indices=True, coarse_cells=coarse,
                           rng=np.random.default_rng(5))
        return out.values[0]

    points = coarse_midpoints(coarse_of(k), GRID.steps)
    if mechanism == "approx_quantiles":
        core = GRID.value(approx_quantiles_indices(points, counts, GRID.size, q, epsilon=eps,
                                                   rng=np.random.default_rng(5)))
    else:
        core = MECHANISMS[mechanism](GRID.value(points), q, epsilon=eps, lower=0.0, upper=1.0,
                                     counts=counts, rng=np.random.default_rng(5))
    assert np.array_equal(batch(True), np.asarray(core))
    if mechanism == "approx_quantiles":  # power: the exact indices give another release
        assert not np.array_equal(batch(False), np.asarray(core))
    # (AggTree's 16**4 leaves are unions of whole coarse cells, both aligned on powers of two,
    # so coarse cells cost it nothing: the two data shapes release the same there)


def test_unseeded_empty_public_keys_are_released_in_one_batch(spark, monkeypatch):
    """Public keys with no rows are answered on the driver; without a seed they go through
    release_many in one call (each from empty data: sorted points of the grid in the bounds,
    with auto's choice recorded), and a seeded release keeps the per-key path."""
    from dpq_spark import dp_quantiles

    calls = []
    real = _release.release_many
    monkeypatch.setattr(_release, "release_many",
                        lambda *a, **kw: calls.append(len(a[0].bounds) - 1) or real(*a, **kw))
    df = spark.createDataFrame(pd.DataFrame({"g": [0] * 50, "x": np.linspace(0.1, 0.9, 50)}))
    keys = list(range(40))
    out = dp_quantiles(df, "x", quantiles=[0.25, 0.75], epsilon=1.0, lower=0.0, upper=1.0,
                       group_by="g", groups=keys).toPandas()
    assert calls and calls[-1] == 39  # the 39 empty keys, in one driver-side call
    assert out["g"].tolist() == [g for g in keys for _ in range(2)]
    for _, rows in out.groupby("g"):
        v = rows["value"].to_numpy()
        assert v[0] <= v[1] and 0.0 <= v[0] and v[1] <= 1.0
        assert np.array_equal(GRID.value(GRID.snap(v)), v)  # grid points
    assert set(out["mechanism"]) <= {"joint_exp", "ind_exp", "approx_quantiles", "agg_tree",
                                     "histogram"}
    calls.clear()
    dp_quantiles(df, "x", quantiles=[0.25, 0.75], epsilon=1.0, lower=0.0, upper=1.0,
                 group_by="g", groups=keys, rng=np.random.default_rng(0)).collect()
    assert calls == []  # seeded: per-key path everywhere


@pytest.mark.parametrize("held", [None, 400])
def test_spilled_unseeded_joint_exp_groups_are_released_together(monkeypatch, held):
    """A spilled fold without a seed releases its JointExp groups together by release_many
    (whose joint_exp._sample_many gets one row per group, each group's own represented data);
    with a seed each group keeps its own sampler call. At a huge epsilon both put every output
    in the gap (or point) of its group's data whose rank fits, so they must agree on those
    positions; a mix-up of groups (rows or cells) would not. With ``held`` the groups' cells are
    built and sampled a few groups at a time (CELLS_HELD), with the same outcome."""
    from dpq_spark.core.quantiles import batch

    if held is not None:
        monkeypatch.setattr(batch, "CELLS_HELD", held)
    gen = np.random.default_rng(6)
    groups = [np.sort(gen.choice(2**32 + 1, size, replace=False)) for size in (30, 80, 300, 1000)]
    groups.append(np.sort(2**31 + gen.choice(40, 600)))  # heavy ties
    calls = []
    real = batch._joint_many
    monkeypatch.setattr(batch, "_joint_many", lambda cells, *a, **kw: calls.append(len(cells)) or real(cells, *a, **kw))
    monkeypatch.setattr(_fold, "_COMPACT_ROWS", 100)
    q = (0.1, 0.5, 0.9)

    def run(**kw):
        fold = _fold.Fold(8, shrink=1.0)
        for gid, k in enumerate(groups):
            fold.add((np.int64(gid) << 33) + np.asarray(k, dtype=np.int64))
        fold.finish()
        assert fold.spilled
        return _fold_release(fold, _params(epsilon=1e9, quantiles=q, mechanism="joint_exp", **kw))

    batch = run()
    assert sum(calls) == len(groups) and (len(calls) == 1) == (held is None)
    made = list(calls)
    per_group = run(base_seed=1)
    assert calls == made  # the seeded run called the per-group sampler only
    assert batch.keys() == per_group.keys() == set(range(len(groups)))
    for g, k in enumerate(groups):
        rep = GRID.value(np.unique(k))
        rank = [np.searchsorted(rep, v, side="right") for v in (batch[g][0], per_group[g][0])]
        assert np.array_equal(*rank), g
    # power: another group's data would put the outputs elsewhere
    other = [np.searchsorted(GRID.value(np.unique(groups[1])), v, side="right") for v in (batch[0][0], per_group[1][0])]
    assert not np.array_equal(*other)
