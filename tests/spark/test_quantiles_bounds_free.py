"""Bounds-free ``dp_quantiles(lower=None, upper=None)``: the public log-scale bucket map, the
release per group and globally, and equality with the core mechanism on the same buckets."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import functions as F  # noqa: E402

from dpq_spark import dp_quantiles  # noqa: E402
from dpq_spark.core.randomness.source import resolve_rng  # noqa: E402
from dpq_spark.core.quantiles.mechanisms import joint_exp  # noqa: E402
from dpq_spark.spark import _dataflow as flow  # noqa: E402
from dpq_spark.spark._buckets import (  # noqa: E402
    BUCKET_BITS,
    BUCKET_CAP,
    BUCKET_FLOOR,
    BUCKET_OFFSET,
    bucket_index,
    bucket_values,
)
from _shuffle import sorted_by_bucket  # noqa: E402

DECILES = [i / 10 for i in range(1, 10)]
N = 4000  # rows per group


def _edge_values() -> np.ndarray:
    powers = np.ldexp(1.0, np.arange(-40, 70))
    near = np.concatenate([powers, np.nextafter(powers, 0.0), np.nextafter(powers, np.inf)])
    special = [0.0, -0.0, BUCKET_FLOOR, np.nextafter(BUCKET_FLOOR, 0.0), 1e-300, 5e-324,
               BUCKET_CAP, 1e19, 1e300, np.finfo(float).max, np.inf, 1.0 + 2.0**-20,
               1.0 + 2.0**-21, 1.0 + 3 * 2.0**-21, 3.0, 0.1, 1 / 3, 12345.678, 2.0**20 - 0.5]
    gen = np.random.default_rng(0)
    random = gen.standard_cauchy(2000) * 10.0 ** gen.integers(-12, 14, 2000)
    x = np.concatenate([near, special, random])
    return np.concatenate([x, -x])


def test_bucket_map_matches_numpy_and_is_monotone(spark):
    x = _edge_values()
    df = spark.createDataFrame(pd.DataFrame({flow.VALUE: x}))
    got = np.array([r[0] for r in df.select(flow.bucket_column()).collect()], dtype=np.int64)
    ref = bucket_index(x)
    bad = np.flatnonzero(got != ref)
    assert bad.size == 0, x[bad[:5]]
    order = np.argsort(x, kind="stable")
    assert np.all(np.diff(ref[order]) >= 0)  # monotone in x
    assert ref[x == 0.0].tolist() == [BUCKET_OFFSET] * int(np.sum(x == 0.0))
    # powers of two open a bucket; the value just below one closes the previous one
    assert np.all(bucket_index(np.ldexp(1.0, np.arange(-32, 63))) % (1 << BUCKET_BITS) == 1)
    # representatives: strictly increasing and within 2**-21 relative of every member
    inside = (np.abs(x) >= BUCKET_FLOOR) & (np.abs(x) <= BUCKET_CAP)
    rel = np.abs(bucket_values(ref[inside]) / x[inside] - 1.0)
    assert rel.max() <= 2.0**-21 * (1 + 1e-12)
    assert np.all(np.diff(bucket_values(np.unique(ref))) > 0)


@pytest.fixture(scope="module")
def two_shapes(spark):
    """Group "normal": N(0, 5); group "income": 30,000 * lognormal(0, 0.8)."""
    gen = np.random.default_rng(21)
    data = {"normal": gen.normal(0.0, 5.0, N), "income": 30000.0 * gen.lognormal(0.0, 0.8, N)}
    pdf = pd.DataFrame({"g": np.repeat(list(data), N), "x": np.concatenate(list(data.values()))})
    return spark.createDataFrame(pdf).cache(), data


def _truth(x):
    return np.quantile(x, DECILES, method="inverted_cdf")


def test_bounds_free_deciles_per_group(two_shapes):
    df, data = two_shapes
    out = dp_quantiles(df, "x", quantiles=DECILES, epsilon=1.0, group_by="g",
                       groups=["normal", "income", "empty"], rng=np.random.default_rng(3)).toPandas()
    got = {g: part.sort_values("quantile")["value"].to_numpy() for g, part in out.groupby("g")}
    assert set(got) == {"normal", "income", "empty"} and all(len(v) == 9 for v in got.values())
    # N(0, 5): deciles within 0.2 (under 2% of the 10%-90% spread of 12.8; the core's auto on
    # these buckets, 300 seeds: median 0.06, 99.9th percentile 0.16 of the largest error)
    assert np.max(np.abs(got["normal"] - _truth(data["normal"]))) < 0.2
    # log-normal incomes: within 3% of the true decile (seeded: 1.5%)
    assert np.max(np.abs(got["income"] / _truth(data["income"]) - 1.0)) < 0.03
    # no rows: too few for the bounds budget (the core's gate), so the group is flagged, values null
    assert out.loc[out["g"] == "empty", "value"].isna().all()
    assert set(out.loc[out["g"] == "empty", "mechanism"]) == {"bounds_not_found"}
    # auto: 9 quantiles of 4,000 rows -> JointExp
    assert set(out.loc[out["g"] != "empty", "mechanism"]) == {"joint_exp"}


def test_bounds_free_global_path(two_shapes):
    df, data = two_shapes
    income = df.where(F.col("g") == "income")
    out = dp_quantiles(income, "x", quantiles=DECILES, epsilon=1.0, mechanism="joint_exp",
                       bounds_share=0.3, rng=np.random.default_rng(8)).toPandas()
    assert np.max(np.abs(out["value"].to_numpy() / _truth(data["income"]) - 1.0)) < 0.03


def test_spark_release_equals_core_on_the_same_buckets(two_shapes):
    """Seeded: Spark's global release is the core's joint_exp on the buckets' values and counts
    with lower = upper = None (the same private bounds, then the same quantiles)."""
    df, data = two_shapes
    x = data["normal"]
    normal = df.where(F.col("g") == "normal")
    out = dp_quantiles(normal, "x", quantiles=DECILES, epsilon=0.5, mechanism="joint_exp",
                       rng=np.random.default_rng(77)).toPandas()
    source = resolve_rng(np.random.default_rng(77))
    source.seed63(), source.seed63()  # the row and group seeds of contribution bounding
    base = source.seed63()            # the per-group seed base (global: key hash 0)
    cells, counts = np.unique(bucket_index(x), return_counts=True)
    core = joint_exp(bucket_values(cells), DECILES, epsilon=0.5, lower=None, upper=None,
                     counts=counts, rng=np.random.default_rng([base, 0]))
    assert out["value"].tolist() == np.asarray(core).tolist()
    # and not what a different seed gives (the comparison can fail)
    other = joint_exp(bucket_values(cells), DECILES, epsilon=0.5, lower=None, upper=None,
                      counts=counts, rng=np.random.default_rng([base, 1]))
    assert out["value"].tolist() != np.asarray(other).tolist()


@pytest.mark.parametrize("kwargs, message", [
    (dict(lower=0.0), "`lower` and `upper` must both be given or both be None"),
    (dict(upper=1.0), "`lower` and `upper` must both be given or both be None"),
    (dict(bounds_share=1.0), "`bounds_share` must be in (0, 1)"),
    (dict(bounds_share=0.0), "`bounds_share` must be in (0, 1)"),
    (dict(bounds_share=True), "`bounds_share` must be in (0, 1)"),
    (dict(lower=0.0, upper=1.0, bounds_share=0.2), "`bounds_share` applies only without bounds"),
    (dict(resolution=1024), "`resolution` applies only with `lower` and `upper`"),
])
def test_bounds_free_validation(spark, kwargs, message):
    df = spark.createDataFrame(pd.DataFrame({"x": [1.0, 2.0]}))
    with pytest.raises(ValueError) as err:
        dp_quantiles(df, "x", quantiles=[0.5], epsilon=1.0, **kwargs)
    assert message in str(err.value)


def test_bounds_free_with_partition_selection_and_privacy_unit(spark):
    """The mapInPandas path (keys from DP partition selection, contribution bounding)."""
    gen = np.random.default_rng(1)
    pdf = pd.DataFrame({"k": gen.choice(["a", "b"], 6000), "u": gen.integers(0, 3000, 6000),
                        "x": gen.lognormal(3.0, 1.0, 6000)})
    out = dp_quantiles(spark.createDataFrame(pdf), "x", quantiles=[0.1, 0.5, 0.9], epsilon=1.0,
                       group_by="k", delta=1e-6, privacy_unit="u", max_rows_per_unit=2,
                       rng=np.random.default_rng(3)).toPandas()
    assert sorted(set(out["k"])) == ["a", "b"] and set(out["mechanism"]) == {"approx_quantiles"}
    for key, part in out.groupby("k"):
        truth = np.quantile(pdf.loc[pdf["k"] == key, "x"], [0.1, 0.5, 0.9])
        # per-group epsilon 0.25 (half to selection, 2 rows per unit): over 12 seeds x 2 groups
        # the worst relative error was 0.25 (0.10 quantile; mean 0.06), so 0.1 held for only
        # some seeds; the seeded value depends on the per-group seed, which changed with the
        # Arrow key path (key_seed instead of Spark's xxhash64)
        assert np.max(np.abs(part["value"].to_numpy() / truth - 1.0)) < 0.3


@pytest.mark.parametrize("granularity", [None, 0.1])
def test_unseeded_partition_releases_bounds_free_groups_together(monkeypatch, granularity):
    """Production randomness, public keys: a partition's bounds-free groups go to
    release_many_private_bounds, whole groups a chunk of entries at a time (lowered here), each
    group released once from its own buckets: at epsilon 1e3 each decile lies in the gap of its
    group's data that its rank falls in (to the buckets' width). Seeded, each group
    keeps its own per-key draws (no batch)."""
    import pyarrow as pa

    from dpq_spark.spark import _columns, _packing, _release
    from dpq_spark.spark._buckets import BUCKETS

    monkeypatch.setattr(_release, "_FREE_ENTRIES", 3000)
    calls = []
    real = _release.release_many_private_bounds
    monkeypatch.setattr(_release, "release_many_private_bounds",
                        lambda *a, **k: calls.append(a[0].bounds.size - 1) or real(*a, **k))
    gen = np.random.default_rng(2)
    sizes = [2000, 700, 1500, 3000, 900, 2500, 1200]
    data = [100.0 * (g + 1) * gen.lognormal(0.0, 0.5, n) for g, n in enumerate(sizes)]
    if granularity:  # tenths, with ties: the declared grid (each group's own bounds)
        data = [np.round(x, 1) for x in data]
    codes = np.concatenate([g * BUCKETS + bucket_index(x) for g, x in enumerate(data)])
    gen.shuffle(codes)
    raw = [pa.RecordBatch.from_arrays([pa.array(codes[i:i + 1000])], names=[_columns.CODE])
           for i in range(0, codes.size, 1000)]
    params = _release.ReleaseParams(keys=("g",), quantiles=tuple(DECILES), epsilon=1e3,
                                    lower=None, upper=None, resolution=BUCKETS,
                                    neighboring="add_remove", mechanism="auto",
                                    extra_columns=(_columns.CODE,), granularity=granularity)
    batches = sorted_by_bucket(_packing.pack_partition(iter(raw), BUCKETS), 3)
    out = pa.Table.from_batches(list(_release.release_partition(iter(batches), params)))
    assert out.column(_columns.GID).to_pylist() == list(range(len(sizes)))
    assert len(calls) > 2 and sum(calls) == len(sizes)
    for g, (x, value, name) in enumerate(zip(data, out.column("value").to_pylist(),
                                             out.column("mechanism").to_pylist())):
        assert name == "joint_exp"
        x, qn = np.sort(x), np.asarray(DECILES) * x.size
        low, high = x[np.floor(qn).astype(int) - 1], x[np.ceil(qn).astype(int)]
        assert np.all((value >= low * (1 - 2e-6)) & (value <= high * (1 + 2e-6))), g
    calls.clear()
    seeded = dataclasses.replace(params, base_seed=5, key_hashes=tuple(range(len(sizes))))
    again = pa.Table.from_batches(list(_release.release_partition(iter(batches), seeded)))
    assert not calls and again.column(_columns.GID).to_pylist() == list(range(len(sizes)))


@pytest.mark.parametrize("keyed", [False, True])
def test_bounds_free_partition_past_the_fold_budget_releases_each_group_once(monkeypatch, keyed):
    """Without bounds the partition's (group, bucket) counts go through the same fold as with
    bounds, past a budget of 3,000 codes (lowered) never to coarse counts: the selected-key
    body's one fold writes sorted runs and releases its groups a slice at a time; the public-key
    body, whose rows come sorted by bucket, starts a fold for each stretch of whole buckets and
    writes no runs. Seeded (per-key draws), every group's release is the very one of an
    unbounded budget; unseeded, each group comes out once, in order, from its own buckets (at
    epsilon 1e3 each decile's rank is within 3 of its target)."""
    import pyarrow as pa

    from dpq_spark.spark import _columns, _fold, _packing, _release
    from dpq_spark.spark._buckets import BUCKETS

    with pytest.raises(ValueError, match="span"):  # coarse cells exist only with bounds
        _fold.Fold(3000, 0.5, span=BUCKETS)
    monkeypatch.setattr(_fold, "_COMPACT_ROWS", 500)  # merges, and budget checks, mid-stream
    monkeypatch.setattr(_packing, "_PACK_ROWS", 700)  # packed batches of at most 700 rows
    gen = np.random.default_rng(8)
    sizes = gen.integers(50, 900, 40)
    data = [10.0 * (g + 1) * gen.lognormal(0.0, 0.5, n) for g, n in enumerate(sizes)]
    cells = np.concatenate([bucket_index(x) for x in data])
    gid = np.repeat(np.arange(sizes.size), sizes)
    order = gen.permutation(cells.size)
    cells, gid = cells[order], gid[order]
    base = _release.ReleaseParams(keys=("g",), quantiles=tuple(DECILES), epsilon=1e3,
                                  lower=None, upper=None, resolution=BUCKETS,
                                  neighboring="add_remove", mechanism="auto")
    if keyed:
        table = pa.table({"g": pa.array(gid, pa.int64()), _columns.CELL: pa.array(cells)})
        batches = table.to_batches(max_chunksize=700)
        params = dataclasses.replace(base, threshold=-1e9, noise_scale=1e-6)

        def release(p):
            out = pa.Table.from_batches(list(_release.release_keyed_partition(iter(batches), p)))
            keys = np.asarray(out.column("g").to_pylist()[::len(DECILES)])
            values = np.asarray(out.column("value").to_pylist()).reshape(-1, len(DECILES))
            return sorted(keys.tolist()), values[np.argsort(keys)]  # in the keys' order
    else:
        codes = gid * BUCKETS + cells
        raw = [pa.RecordBatch.from_arrays([pa.array(codes[i:i + 700])], names=[_columns.CODE])
               for i in range(0, codes.size, 700)]
        batches = sorted_by_bucket(_packing.pack_partition(iter(raw), BUCKETS), 3)
        params = dataclasses.replace(base, extra_columns=(_columns.CODE,))

        def release(p):
            out = pa.Table.from_batches(list(_release.release_partition(iter(batches), p)))
            return out.column(_columns.GID).to_pylist(), np.asarray(out.column("value").to_pylist())

    runs, folds = [], []
    real_write, real_new = _fold.Fold._write_run, _release.new_fold
    monkeypatch.setattr(_fold.Fold, "_write_run",
                        lambda self, c, w: runs.append(c.size) or real_write(self, c, w))
    monkeypatch.setattr(_release, "new_fold", lambda *a: folds.append(1) or real_new(*a))

    def past_the_budget():
        if keyed:  # one fold for the partition: sorted runs of about the budget
            assert len(runs) > 2 and max(runs) <= 3000 + 500 + 700
        else:  # a fold for each stretch of whole buckets: no runs
            assert not runs and len(folds) > 2
        runs.clear()
        folds.clear()

    seeded = dataclasses.replace(params, base_seed=5, key_hashes=tuple(range(sizes.size)))
    whole_keys, whole = release(seeded)
    assert not runs and len(folds) == 1  # the default budget holds the partition
    folds.clear()
    small = dataclasses.replace(seeded, fold_budget=3000)
    sliced_keys, sliced = release(small)
    past_the_budget()
    assert sliced_keys == whole_keys == list(range(sizes.size))
    assert np.array_equal(sliced, whole)  # the same per-key draws on the same counts
    keys, values = release(dataclasses.replace(params, fold_budget=3000))
    past_the_budget()
    assert keys == list(range(sizes.size))
    for g, (x, value) in enumerate(zip(data, values)):
        # the rank of each decile among its group's data: within 3 of its target (2.4 the worst
        # over 30 releases of these groups, spilled or not)
        rank = np.searchsorted(np.sort(x), value * (1 - 2e-6))
        assert np.all(np.abs(rank - np.asarray(DECILES) * x.size) <= 3), g
