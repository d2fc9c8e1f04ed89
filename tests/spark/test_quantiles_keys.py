"""Group keys exactly as in the data, `groups` checked before any job, and the jobs a release runs.

Huge epsilon makes every group's median its data's median within a small tolerance, so a key
merged with another one, or a row counted in the wrong group, moves a released median by far
more than the tolerance. Each group's data lies in its own range for that reason.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import re
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("pyspark")
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql import types as T  # noqa: E402

from dpq_spark.core.randomness.grid import Grid  # noqa: E402
from dpq_spark import dp_quantiles  # noqa: E402
from dpq_spark.spark._compat import SPARK_VERSION, create_dataframe  # noqa: E402
from dpq_spark.spark._keys import KeyIndex, factorise, normalise, spark_order  # noqa: E402
from dpq_spark.spark.quantiles import counting_jobs  # noqa: E402

HUGE = 1e7
TOL = 1.0  # >= the spacing of a group's values (a released median lies between two of them)
BIG = 2**60
NAN = float("nan")
LOGGER = "dpq_spark.spark.quantiles"


def _median(values) -> float:
    return float(np.median(np.asarray(values, dtype=np.float64)))


def _frame(spark, groups: dict, ddl: str, rows_per_group: int = 201):
    """One row per value; group ``i`` (in ``groups`` order) holds ``100 i + 0 .. 100 i + 99``
    spread evenly, so its median is ``100 i + 49.5``; returns the frame and the medians."""
    rows, medians = [], {}
    for i, key in enumerate(groups):
        values = np.linspace(100 * i, 100 * i + 99, rows_per_group)
        medians[i] = _median(values)
        rows += [(*groups[key], float(v)) for v in values]
    return spark.createDataFrame(rows, ddl), medians


def _release(df, keys, **kw):
    base = dict(quantiles=[0.5], epsilon=HUGE, lower=0.0, upper=1000.0, group_by=keys,
                rng=np.random.default_rng(7))
    base.update(kw)
    return dp_quantiles(df, "x", **base)


def _marker(value):
    return "nan" if isinstance(value, float) and math.isnan(value) else value


def _released(out, keys):
    """{key tuple (NaN as "nan"): median} read from one collect()."""
    got = {}
    for row in out.collect():
        key = tuple(_marker(row[k]) for k in keys)
        assert key not in got, f"key {key!r} released twice"
        got[key] = row["value"]
    return got


# --------------------------------------------------------------------------------------------
# Keys exact on both key paths

def test_big_int_keys_with_a_null_stay_exact_on_both_paths(spark):
    """2**60 + 1 and 2**60 + 2 are two keys next to a null (pandas made them one float key)."""
    groups = {"a": (BIG + 1,), "b": (BIG + 2,), "null": (None,), "c": (-BIG - 1,)}
    df, medians = _frame(spark, groups, "g long, x double")
    expected = {(key[0],): medians[i] for i, key in enumerate(groups.values())}
    for kw in (dict(delta=1e-6), dict(groups=[k for (k,) in groups.values()])):
        out = _release(df, "g", **kw)
        assert out.schema["g"].dataType == T.LongType()
        got = _released(out, ["g"])
        assert set(got) == set(expected)
        for key, median in expected.items():
            assert abs(got[key] - median) < TOL, key


def test_null_nan_and_signed_zero_keys_on_both_paths(spark):
    """Null and NaN are two keys; -0.0 and 0.0 are one (Spark's grouping), released as 0.0."""
    groups = {"null": (None,), "nan": (NAN,), "neg0": (-0.0,), "pos0": (0.0,), "x": (1.5,)}
    df, _ = _frame(spark, groups, "g double, x double")
    both_zeros = np.r_[np.linspace(200, 299, 201), np.linspace(300, 399, 201)]
    expected = {(None,): 49.5, ("nan",): 149.5, (0.0,): _median(both_zeros), (1.5,): 449.5}
    for kw in (dict(delta=1e-6), dict(groups=[None, NAN, -0.0, 1.5]),
               dict(groups=df.select("g"))):
        got = _released(_release(df, "g", **kw), ["g"])
        assert set(got) == set(expected)
        for key, median in expected.items():
            assert abs(got[key] - median) < TOL, (kw, key)
        zero = [k for k in got if k[0] == 0.0]
        assert math.copysign(1.0, zero[0][0]) == 1.0  # released as +0.0


def test_multi_column_keys_with_nulls_nan_and_unicode_on_both_paths(spark):
    groups = {0: (BIG + 1, "é", NAN), 1: (BIG + 1, "e\u0301", NAN), 2: (BIG + 2, "é", None),
              3: (None, "😀", 0.5), 4: (None, None, NAN), 5: (BIG + 1, "é", 0.5)}
    df, medians = _frame(spark, groups, "k long, s string, d double, x double", rows_per_group=101)
    expected = {tuple(_marker(v) for v in key): medians[i] for i, key in enumerate(groups.values())}
    for kw in (dict(delta=1e-6), dict(groups=list(groups.values()))):
        out = _release(df, ["k", "s", "d"], **kw)
        assert out.columns == ["k", "s", "d", "quantile", "value", "mechanism"]
        got = _released(out, ["k", "s", "d"])
        assert set(got) == set(expected)
        for key, median in expected.items():
            assert abs(got[key] - median) < TOL, (kw, key)


def test_privacy_unit_path_keeps_keys_exact(spark):
    groups = {"a": (BIG + 1,), "b": (BIG + 2,), "null": (None,)}
    rows = []
    for i, (key,) in enumerate(groups.values()):
        rows += [(key, f"u{i}-{j}", float(100 * i + j % 100)) for j in range(300)]
    df = spark.createDataFrame(rows, "g long, user string, x double")
    got = _released(_release(df, "g", delta=1e-6, privacy_unit="user"), ["g"])
    assert set(got) == {(BIG + 1,), (BIG + 2,), (None,)}


def test_key_index_numbers_keys_across_batches():
    """Pure pyarrow: the same key in two batches gets one number; null, NaN and NaN payloads."""
    index = KeyIndex(("a", "b"))
    other_nan = np.frombuffer(np.uint64(0x7FF8000000000001).tobytes(), dtype=np.float64)[0]
    first = index.gids([pa.array([BIG + 1, None, BIG + 2, None], pa.int64()),
                        pa.array([NAN, NAN, -0.0, None], pa.float64())])
    second = index.gids([pa.array([BIG + 2, None, BIG + 1], pa.int64()),
                         pa.array([0.0, None, other_nan], pa.float64())])
    assert sorted(first.tolist()) == [0, 1, 2, 3] and index.size == 4
    assert second.tolist() == [first[2], first[3], first[0]]
    table = index.table()
    assert table.column("a").type == pa.int64()
    a, b = table.column("a").to_pylist(), table.column("b").to_pylist()
    assert [a[g] for g in first] == [BIG + 1, None, BIG + 2, None]
    assert math.isnan(b[first[0]]) and math.isnan(b[first[1]]) and b[first[3]] is None
    assert b[first[2]] == 0.0 and math.copysign(1.0, b[first[2]]) == 1.0


def test_factorise_matches_python_grouping_on_random_keys():
    gen = np.random.default_rng(3)
    n = 5000
    ints = [None if v < 0 else BIG + int(v) for v in gen.integers(-1, 6, n)]
    strs = [None if v < 0 else "ab"[v % 2] * (v % 3 + 1) for v in gen.integers(-1, 6, n)]
    local, first = factorise([pa.array(ints, pa.int64()), pa.array(strs, pa.string())])
    seen: dict = {}
    truth = [seen.setdefault(key, len(seen)) for key in zip(ints, strs)]
    # same partition of the rows: a bijection between local and truth labels
    assert len(set(zip(local.tolist(), truth))) == len(seen) == len(first)
    for j, row in enumerate(first):  # first[j] is the first row of local group j
        assert local[row] == j and not (local[:row] == j).any()


# --------------------------------------------------------------------------------------------
# `groups` validated early, with no job

@pytest.fixture(scope="module")
def typed(spark):
    return spark.createDataFrame(
        [(1, 1, "a", 1.0, True, datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc),
          datetime.date(2020, 1, 1), 0.5)],
        "g long, i int, s string, d double, b boolean, t timestamp, day date, x double")


def _jobs(spark) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(None))


@pytest.mark.parametrize(
    "group_by, groups, exc, match",
    [
        ("s", [1], TypeError, r"`groups` values must match the types.*'s' is string and needs str, got int"),
        ("g", [1.0], TypeError, r"`groups`.*'g' is bigint and needs int, got float"),
        ("i", [True], TypeError, r"`groups`.*'i' is int and needs int, got bool"),
        ("d", ["1.0"], TypeError, r"`groups`.*'d' is double and needs float, got str"),
        ("b", [1], TypeError, r"`groups`.*'b' is boolean and needs bool, got int"),
        ("day", [datetime.datetime(2020, 1, 1)], TypeError, r"`groups`.*'day' is date"),
        ("t", [datetime.datetime(2020, 1, 1)], TypeError, r"`groups` values for the timestamp column 't' must be timezone-aware"),
        ("i", [2**31], ValueError, r"`groups` value for `group_by` column 'i' is out of the range of int"),
        ("g", {1: "a"}, TypeError, r"`groups` must be a list of keys or a DataFrame of keys, got a dict"),
        ("g", {1, 2}, TypeError, r"`groups` must be a list of keys .* got a set"),
        ("g", [], ValueError, r"`groups` is empty"),
        ("g", [{"g": 1}], TypeError, r"`groups`.*got dict"),
        (["g", "s"], [(1, "a", 2)], ValueError, r"`groups` entries must be tuples of 2 values"),
        (["g", "s"], [1], ValueError, r"`groups` entries must be tuples of 2 values"),
        (["g", "s"], [(1, 2)], TypeError, r"`groups`.*'s' is string and needs str, got int"),
    ],
)
def test_groups_errors_name_groups_and_run_no_job(spark, typed, group_by, groups, exc, match):
    before = _jobs(spark)
    with pytest.raises(exc, match=match):
        _release(typed, group_by, groups=groups)
    assert _jobs(spark) == before


def test_groups_dataframe_of_other_types_fails_before_any_job(spark, typed):
    keys = spark.createDataFrame([("1",)], "g string")
    before = _jobs(spark)
    with pytest.raises(TypeError, match=r"`groups` DataFrame columns must have the types of the "
                                        r"`group_by` columns \{'g': 'bigint'\}, got \{'g': 'string'\}"):
        _release(typed, "g", groups=keys)
    assert _jobs(spark) == before


def test_job_counter_sees_a_job(spark, typed):
    """Power of the two tests above: a valid call does run a job that the tracker sees."""
    before = _jobs(spark)
    _release(typed, "g", groups=[1])
    assert _jobs(spark) > before


def test_duplicate_listed_keys_are_released_once(spark):
    df, _ = _frame(spark, {"a": (1.0,), "b": (2.0,)}, "g double, x double", rows_per_group=21)
    out = _release(df, "g", groups=[1.0, 2.0, 1, 1.0, NAN, NAN, -0.0, 0.0])
    keys = [_marker(r["g"]) for r in out.collect()]
    assert keys == [0.0, 1.0, 2.0, "nan"]


# --------------------------------------------------------------------------------------------
# Jobs: counted per path, none to read the result

def _logged_path(caplog) -> str:
    lines = [r.getMessage() for r in caplog.records
             if r.name == LOGGER and "released in" in r.getMessage()]
    assert len(lines) == 1, lines
    match = re.search(r"released in [0-9.]+s, path=(.+)$", lines[0])
    assert match, lines[0]
    return match.group(1)


@pytest.mark.parametrize(
    "case, jobs, path",
    [("global", 2, "global"), ("list", 1, "public keys"), ("frame", 2, "public keys"),
     ("select", 1, "partition selection"), ("unit", 1, "partition selection"),
     ("unit_list", 1, "public keys")],
)
def test_info_line_counts_the_jobs_of_each_path(spark, caplog, case, jobs, path):
    df, _ = _frame(spark, {"a": (1, "u1"), "b": (2, "u2")}, "g long, user string, x double",
                   rows_per_group=101)
    kw = {"global": dict(keys=None), "list": dict(groups=[1, 2, 3]),
          "frame": dict(groups=df.select("g")), "select": dict(delta=1e-6),
          "unit": dict(delta=1e-6, privacy_unit="user"),
          "unit_list": dict(groups=[1, 2], privacy_unit="user")}[case]
    keys = kw.pop("keys", "g")
    caplog.set_level(logging.INFO, logger=LOGGER)
    with counting_jobs() as counted:
        _release(df, keys, **kw)
    assert (counted[0], _logged_path(caplog)) == (jobs, path)
    # one INFO line, with nothing but public parameters, the time and the path, in full (no job
    # count: the ungrouped path decides from the data whether it reads a second time)
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.INFO]
    assert len(lines) == 1
    assert re.fullmatch(r"dp_quantiles: column='x' keys=\[('g')?\] m=1 epsilon=1e\+07 "
                        r"mechanism=auto: released in [0-9]+\.[0-9]{2}s, "
                        r"path=[a-z ]+", lines[0]), lines[0]


@pytest.mark.parametrize("kw, nan", [(dict(delta=1e-6), True),
                                     (dict(groups=[None, NAN, 1.0, 2.0]), True),
                                     (dict(groups=[None, 3.0, 1.0, 2.0]), False)])
def test_reading_the_result_runs_no_job_and_sees_one_release(spark, kw, nan):
    keys = {"a": (1.0,), "b": (2.0,), "n": (None,), "k": (NAN if nan else 3.0,)}
    df, _ = _frame(spark, keys, "g double, x double")
    out = dp_quantiles(df, "x", quantiles=[0.25, 0.5], epsilon=1.0, lower=0.0, upper=1000.0,
                       group_by="g", **kw)  # OS entropy: a recomputation would differ
    before = _jobs(spark)
    first = out.collect()
    out.show()
    out.take(3)
    # 3.5 builds a result from Python rows (whose reads run jobs over the same local rows) when it
    # holds a NaN or when Arrow conversions are off
    arrow = spark.conf.get("spark.sql.execution.arrow.pyspark.enabled", "false").lower() == "true"
    if SPARK_VERSION >= (4, 0) or (arrow and not nan):
        assert _jobs(spark) == before  # collect, show, take: read from the driver's local rows
    assert out.count() == len(first) == 8  # count plans an aggregate (small jobs over local rows)
    assert _rows(out.collect()) == _rows(first)
    assert out.toPandas()["value"].tolist() == [r["value"] for r in first]
    ordered = out.orderBy(F.col("g").asc_nulls_first(), "quantile").collect()
    assert [(_marker(r["g"]), r["quantile"]) for r in ordered] == \
        [(_marker(r["g"]), r["quantile"]) for r in first]


@pytest.mark.parametrize("layout", ["wide", "long"])
def test_a_session_without_arrow_conversions_gets_its_release(spark, layout):
    """pyspark 3.5's default session has Arrow conversions off; its ``createDataFrame`` then
    checks each value's exact Python type and refused numpy's floats inside the wide layout's
    arrays. The result is built from Python rows there (on 4.x from the Arrow table either
    way), with the same values."""
    df = spark.createDataFrame([(i % 3, float(i % 97)) for i in range(3000)], "g long, x double")
    key = "spark.sql.execution.arrow.pyspark.enabled"
    kw = dict(quantiles=[0.25, 0.5], epsilon=1e6, lower=0.0, upper=100.0, group_by="g",
              groups=[0, 1, 2], layout=layout, rng=np.random.default_rng(3))
    with_arrow = dp_quantiles(df, "x", **kw).collect()
    before = spark.conf.get(key)
    spark.conf.set(key, "false")
    try:
        kw["rng"] = np.random.default_rng(3)
        without = dp_quantiles(df, "x", **kw).collect()
    finally:
        spark.conf.set(key, before)
    assert len(without) == (3 if layout == "wide" else 6)
    assert [r.asDict() for r in without] == [r.asDict() for r in with_arrow]


# --------------------------------------------------------------------------------------------
# Driver-side order == Spark's orderBy(asc_nulls_first)

def _tricky_table(seed: int) -> pa.Table:
    gen = np.random.default_rng(seed)
    doubles = [None, NAN, -0.0, 0.0, 1.0, -1.0, math.inf, -math.inf, 5e-324, -1e308]
    strings = [None, "", "a", "Z", "é", "e\u0301", "😀", "\uffff", "ab", "a\x00"]
    longs = [None, -(2**63), 2**63 - 1, BIG + 1, BIG + 2, 0, -1]
    n = 400
    return pa.table({
        "d": pa.array([doubles[i] for i in gen.integers(0, len(doubles), n)], pa.float64()),
        "s": pa.array([strings[i] for i in gen.integers(0, len(strings), n)], pa.string()),
        "k": pa.array([longs[i] for i in gen.integers(0, len(longs), n)], pa.int64()),
        "quantile": pa.array(gen.permutation(n) / n, pa.float64()),  # unique: no full ties
    })


def _rows(rows) -> list[tuple]:
    return [tuple("nan" if isinstance(v, float) and math.isnan(v) else
                  (v, math.copysign(1.0, v)) if isinstance(v, float) else v for v in row)
            for row in rows]


@pytest.mark.parametrize("keys", [("d",), ("s",), ("k",), ("d", "s"), ("s", "k", "d")])
def test_driver_order_equals_spark_order_by_asc_nulls_first(spark, keys):
    table = _tricky_table(len(keys))
    schema = T.StructType([T.StructField("d", T.DoubleType()), T.StructField("s", T.StringType()),
                           T.StructField("k", T.LongType()),
                           T.StructField("quantile", T.DoubleType())])
    spark_rows = (create_dataframe(spark, table, schema)
                  .orderBy(*[F.col(k).asc_nulls_first() for k in keys], "quantile").collect())
    ours = spark_order(table, keys).to_pylist()
    columns = ["d", "s", "k", "quantile"]
    assert _rows([tuple(r[c] for c in columns) for r in ours]) == _rows(spark_rows)
    # power: Arrow's own sort (NaN placed with the nulls) is not Spark's order on this data
    if "d" in keys:
        naive = table.sort_by([(k, "ascending", "at_start") for k in keys]
                              + [("quantile", "ascending")]).to_pylist()
        assert _rows([tuple(r[c] for c in columns) for r in naive]) != _rows(spark_rows)


def test_normalise_leaves_other_types_alone():
    ints = pa.array([1, None], pa.int64())
    assert normalise(ints) is ints
    doubles = normalise(pa.array([-0.0, NAN, None], pa.float64())).to_pylist()
    assert math.copysign(1.0, doubles[0]) == 1.0 and math.isnan(doubles[1]) and doubles[2] is None


# --------------------------------------------------------------------------------------------
# Spark Connect: the same job counts and exact keys (own process: Connect needs its own driver)

CONNECT_SCRIPT = textwrap.dedent('''
    import json, logging, math, re, sys
    from pyspark.sql import SparkSession, functions as F
    from dpq_spark import dp_quantiles
    from dpq_spark.spark.quantiles import counting_jobs

    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    log = logging.getLogger("dpq_spark.spark.quantiles")
    log.setLevel(logging.INFO)
    log.addHandler(Keep())
    spark = (SparkSession.builder.master("local[2]").config("spark.api.mode", "connect")
             .config("spark.connect.grpc.binding.port", "0").getOrCreate())
    big = 2**60
    rows = [(k, float(100 * i + j % 100)) for i, k in enumerate([big + 1, big + 2, None])
            for j in range(300)]
    df = spark.createDataFrame(rows, "g long, x double")
    kw = dict(quantiles=[0.5], epsilon=1e7, lower=0.0, upper=1000.0)
    cases = {"global": dict(), "list": dict(group_by="g", groups=[big + 1, big + 2, None]),
             "frame": dict(group_by="g", groups=df.select("g")),
             "select": dict(group_by="g", delta=1e-6)}
    out = {"session": type(spark).__module__}
    for name, extra in cases.items():
        lines.clear()
        with counting_jobs() as counted:
            result = dp_quantiles(df, "x", **kw, **extra).collect()
        done = [m for m in lines if "released in" in m]
        out[name] = {"jobs": counted[0], "lines": len(done),
                     "rows": [[r[0], r["value"]] if "g" in r else [None, r["value"]]
                              for r in result]}
    with open(sys.argv[1], "w") as fh:
        json.dump(out, fh)
    spark.stop()
''')


@pytest.mark.slow
@pytest.mark.spark4
def test_connect_counts_the_same_jobs_and_keeps_keys_exact(tmp_path):
    from cluster import clean_environ

    script = tmp_path / "connect_keys.py"
    script.write_text(CONNECT_SCRIPT)
    result_path = tmp_path / "connect_keys.json"
    env = clean_environ()
    env.update(SPARK_TESTING="1", PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, str(script), str(result_path)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(result_path.read_text())
    assert result["session"].startswith("pyspark.sql.connect")
    assert {k: (v["jobs"], v["lines"]) for k, v in result.items() if k != "session"} == \
        {"global": (2, 1), "list": (1, 1), "frame": (2, 1), "select": (1, 1)}
    for case in ("list", "frame", "select"):
        rows = result[case]["rows"]
        assert [r[0] for r in rows] == [None, BIG + 1, BIG + 2], case  # exact, null first
        assert all(abs(v - m) < TOL for (_, v), m in zip(rows, [249.5, 49.5, 149.5])), case


# --------------------------------------------------------------------------------------------
# The worker-side fold (pure pyarrow/numpy, no Spark)

def _keyed_params(**kw):
    from dpq_spark.spark._release import ReleaseParams

    base = dict(keys=("k", "s"), quantiles=(0.5,), epsilon=1e9, lower=0.0, upper=64.0,
                resolution=64, neighboring="add_remove", mechanism="joint_exp", base_seed=3)
    base.update(kw)
    return ReleaseParams(**base)


def test_keyed_fold_counts_every_row_in_its_group_across_batches_and_merges(monkeypatch):
    from dpq_spark.spark import _release
    from dpq_spark.spark import _fold  # noqa: E402
    from dpq_spark.spark._columns import CELL

    monkeypatch.setattr(_fold, "_COMPACT_ROWS", 700)  # force several merges of the fold
    gen = np.random.default_rng(11)
    n = 6000
    kinds = [(BIG + 1, "a"), (BIG + 2, "a"), (None, "a"), (BIG + 1, None), (None, None)]
    which = gen.integers(0, len(kinds), n)
    cells = (which * 12 + gen.integers(0, 10, n)).astype(np.int64)  # group i in [12 i, 12 i + 10)
    table = pa.table({"k": pa.array([kinds[i][0] for i in which], pa.int64()),
                      "s": pa.array([kinds[i][1] for i in which], pa.string()),
                      CELL: pa.array(cells, pa.int32())})
    batches = table.to_batches(max_chunksize=333)
    out = pa.Table.from_batches(list(_release.release_keyed_partition(iter(batches),
                                                                      _keyed_params())))
    assert out.column("k").type == pa.int64()
    got = {(k, s): v for k, s, v in zip(out.column("k").to_pylist(), out.column("s").to_pylist(),
                                        out.column("value").to_pylist())}
    assert set(got) == set(kinds)
    grid = Grid(0.0, 64.0)  # the cells are indices of the bounds' default grid
    for i, key in enumerate(kinds):
        values = grid.value(cells[which == i])
        lo, hi = np.percentile(values, [45, 55])  # a merged or miscounted group leaves this
        assert lo <= got[key] <= hi, key


def test_keyed_fold_tests_the_unit_count_not_the_row_count():
    from dpq_spark.spark._columns import CELL, UNITS

    rows = 20
    table = pa.table({"k": pa.array([1] * rows + [2] * rows, pa.int64()),
                      "s": pa.array(["x"] * (2 * rows)),
                      CELL: pa.array(list(range(rows)) * 2, pa.int32()),
                      UNITS: pa.array([1] * rows + [1, 1] + [0] * (rows - 2), pa.int32())})
    params = _keyed_params(threshold=10.0, noise_scale=1e-6, extra_columns=(UNITS,))
    out = pa.Table.from_batches(list(_release_keyed(table, params)))
    assert out.column("k").to_pylist() == [1]  # 20 units pass, 2 units (20 rows) do not


def _release_keyed(table, params):
    from dpq_spark.spark._release import release_keyed_partition

    return release_keyed_partition(iter(table.to_batches(max_chunksize=7)), params)


def test_date_timestamp_decimal_binary_and_bool_keys_on_both_paths(spark):
    import decimal

    utc = datetime.timezone.utc
    groups = {0: (datetime.date(2020, 1, 1), datetime.datetime(2020, 1, 1, 12, tzinfo=utc),
                  decimal.Decimal("1.50"), b"\x00\xff", True),
              1: (datetime.date(1969, 12, 31), datetime.datetime(1969, 12, 31, 23, 59, 59, 999999,
                                                                 tzinfo=utc),
                  decimal.Decimal("-2.25"), b"", False),
              2: (None, None, None, None, None)}
    ddl = "day date, ts timestamp, dec decimal(10,2), bin binary, flag boolean, x double"
    df, medians = _frame(spark, groups, ddl, rows_per_group=101)
    names = ["day", "ts", "dec", "bin", "flag"]
    expected = {key: medians[i] for i, key in enumerate(groups.values())}
    for kw in (dict(delta=1e-6), dict(groups=list(groups.values()))):
        out = _release(df, names, **kw)
        got = {tuple(v.astimezone(utc) if isinstance(v, datetime.datetime) else
                     bytes(v) if isinstance(v, (bytes, bytearray)) else v
                     for v in (r[k] for k in names)): r["value"] for r in out.collect()}
        assert set(got) == set(expected), kw
        for key, median in expected.items():
            assert abs(got[key] - median) < TOL, (kw, key)


@pytest.mark.parametrize("dtype, keys", [
    (T.LongType(), [5, -3, 5, 2**62, 0, -3, -(2**63)]),
    (T.IntegerType(), [7, 1, 7, -(2**31), 2**31 - 1]),
    (T.ByteType(), [3, -128, 127, 3]),
    (T.StringType(), ["b", "a", "b", "", "é", "a"]),
])
def test_plain_listed_keys_take_the_vectorised_path_with_the_general_result(dtype, keys):
    """A list of plain ints (integral column) or strs (string column) is checked without a
    Python step per key; the table is the general path's (fed the same keys one at a time
    through an iterator): first occurrences, in order, with the column's Arrow type."""
    from dpq_spark.spark._arguments import check_groups, _plain_keys

    fields = {"g": T.StructField("g", dtype)}
    fast = _plain_keys(keys, "g", dtype)
    assert fast is not None
    general = check_groups(iter(keys), ("g",), fields)
    assert fast.equals(general) and check_groups(keys, ("g",), fields).equals(general)
    # outside its case it steps aside for the general path (which checks and names the error)
    assert _plain_keys(keys + [None], "g", dtype) is None
    assert _plain_keys(iter(keys), "g", dtype) is None
    if isinstance(dtype, T.IntegralType):
        assert _plain_keys(keys + [True], "g", dtype) is None
        bits = {T.LongType: 63, T.IntegerType: 31, T.ByteType: 7}[type(dtype)]
        assert _plain_keys(keys + [2**bits], "g", dtype) is None
        with pytest.raises(ValueError, match="out of the range"):
            check_groups(keys + [2**bits], ("g",), fields)


# --------------------------------------------------------------------------------------------
# layout="wide": the same release, one row per group

@pytest.mark.parametrize("kw", [dict(delta=1e-6), dict(groups=[None, NAN, -0.0, 1.5, 7.0]),
                                dict(groups="frame"), dict(), dict(bounds=False)])
def test_wide_layout_is_the_long_release_one_row_per_group(spark, kw):
    """Same seed, same data: the wide rows hold the long rows' values in quantile order, with
    the keys in the same (Spark) order; a key without rows is answered too; nothing runs when
    the result is read."""
    groups = {"null": (None,), "nan": (NAN,), "zero": (-0.0,), "x": (1.5,)}
    df, _ = _frame(spark, groups, "g double, x double", rows_per_group=51)
    q = [0.1, 0.5, 0.9]
    kw = dict(kw)
    bounds = dict(lower=0.0, upper=1000.0) if kw.pop("bounds", True) else {}
    if kw.get("groups") == "frame":
        kw["groups"] = df.select("g")
    if kw.get("groups") is not None or "delta" in kw:
        kw["group_by"] = "g"
    keys = ["g"] if "group_by" in kw else []

    def release(layout):
        return dp_quantiles(df, "x", quantiles=q, epsilon=1.0, rng=np.random.default_rng(11),
                            layout=layout, **bounds, **kw)

    long_rows = release("long").collect()
    wide = release("wide")
    assert wide.columns == [*keys, "value", "mechanism"]
    assert wide.schema["value"].dataType == T.ArrayType(T.DoubleType(), False)
    assert wide.schema["value"].metadata == {"quantiles": q}
    before = _jobs(spark)
    wide_rows = wide.collect()
    if SPARK_VERSION >= (4, 0):  # 3.5 builds a result holding a NaN key from Python rows
        assert _jobs(spark) == before
    assert len(wide_rows) * len(q) == len(long_rows) > 0
    for i, row in enumerate(wide_rows):
        block = long_rows[len(q) * i: len(q) * (i + 1)]
        assert [r["quantile"] for r in block] == q
        assert _rows([[row[k] for k in keys]]) * len(q) == _rows([[r[k] for k in keys] for r in block])
        # a group flagged bounds_not_found: NaN in the wide array, null in the long rows
        wide_values = [None if v != v else v for v in row["value"]]
        assert wide_values == [r["value"] for r in block]
        assert {row["mechanism"]} == {r["mechanism"] for r in block}


@pytest.mark.parametrize("kw", [dict(groups=[None, NAN, -0.0, 1.5, 7.0]), dict(delta=1e-6)])
def test_large_long_release_is_the_wide_one_exploded(spark, monkeypatch, kw):
    """Past _EXPLODE_ROWS the long layout is Spark's explode of the wide local relation: the
    same rows (keys, quantiles, values, mechanisms, order) and schema as the local long rows of
    the same seeded release, and reading it twice gives the same rows."""
    from dpq_spark.spark import quantiles as qmod

    groups = {"null": (None,), "nan": (NAN,), "zero": (-0.0,), "x": (1.5,)}
    df, _ = _frame(spark, groups, "g double, x double", rows_per_group=51)
    q = [0.1, 0.5, 0.9]

    def release():
        return dp_quantiles(df, "x", quantiles=q, epsilon=1.0, rng=np.random.default_rng(12),
                            lower=0.0, upper=1000.0, group_by="g", **kw)

    local = release()
    monkeypatch.setattr(qmod, "_EXPLODE_ROWS", 0)
    exploded = release()
    assert exploded.schema == local.schema
    want = _rows(local.collect())
    assert _rows(exploded.collect()) == want == _rows(exploded.collect())
    assert len(want) >= 3 * len(q)
    # power: the explode must pair each value with its own quantile
    assert [r["quantile"] for r in exploded.collect()] == q * (len(want) // len(q))


def test_wide_layout_refuses_a_release_not_in_blocks():
    """The reshape checks that every group's quantiles come together and in order."""
    from dpq_spark.spark.quantiles import _wide

    class Req:
        keys, quantiles = ("g",), (0.25, 0.75)

    good = pa.table({"g": [1, 1, 2, 2], "quantile": [0.25, 0.75] * 2, "value": [1.0, 2.0, 3.0, 4.0],
                     "mechanism": ["a", "a", "b", "b"]})
    out = _wide(Req, good)
    assert out.column("value").to_pylist() == [[1.0, 2.0], [3.0, 4.0]]
    assert out.column("g").to_pylist() == [1, 2] and out.column("mechanism").to_pylist() == ["a", "b"]
    for bad in (good.slice(0, 3), good.take([1, 0, 2, 3])):
        with pytest.raises(RuntimeError, match="not in blocks"):
            _wide(Req, bad)


# --------------------------------------------------------------------------------------------
# Plain key lists: a literal lookup (short), a lookup in the packing UDF (longer), else the join

@pytest.mark.parametrize("ddl, keys, unlisted", [("g long", [BIG + 2, 3, -1, 99], BIG + 1),
                                                 ("g string", ["b", "é", "", "zz"], "e"),
                                                 ("g int", [7, 0, 5, 1234], 6),
                                                 ("g short", [7, -3, 5, 1234], 6)])
def test_plain_key_lists_take_a_lookup_with_the_join_release(spark, monkeypatch, ddl, keys,
                                                             unlisted):
    """Plain keys: up to 32 a literal lookup, more a lookup in the packing UDF, no join; the
    same seeded release as the join path (a key with no rows answered, rows of an unlisted key
    and of the null key dropped)."""
    from dpq_spark.spark import _dataflow as flow
    from dpq_spark.spark import quantiles as module

    # keys[3] has no rows; the last group's key and the null key are not listed: dropped
    groups = {i: (k,) for i, k in enumerate(keys[:3] + [unlisted])}
    df, _ = _frame(spark, groups, f"{ddl}, x double", rows_per_group=31)
    extra = spark.createDataFrame([(None, 1.0)], f"{ddl}, x double")
    df = df.unionByName(extra)
    kw = dict(quantiles=[0.25, 0.75], epsilon=1.0, lower=0.0, upper=1000.0, group_by="g",
              groups=keys)

    def release():
        return _rows(dp_quantiles(df, "x", rng=np.random.default_rng(3), **kw).collect())

    calls = []
    real_join, real_literal = flow.attach_key_index, flow.index_by_literals
    real_codes = flow.partitioned_codes
    monkeypatch.setattr(flow, "attach_key_index", lambda *a, **k: calls.append("join") or real_join(*a, **k))
    monkeypatch.setattr(flow, "index_by_literals", lambda *a, **k: calls.append("lit") or real_literal(*a, **k))
    monkeypatch.setattr(flow, "partitioned_codes", lambda *a, **k: (a[4] is not None and calls.append("udf")) or real_codes(*a, **k))
    literal = release()
    monkeypatch.setattr(module, "_LITERAL_KEYS", 0)
    looked_up = release()
    monkeypatch.setattr(module, "_LOOKUP_KEY_BYTES", 0)
    joined = release()
    assert calls == ["lit", "udf", "join"]
    assert literal == joined and looked_up == joined
    assert sorted({r[0] for r in literal}, key=repr) == sorted(set(keys), key=repr)
    # power: each lookup must number keys as the driver does; numbering them from 1 answers
    # the wrong groups
    monkeypatch.setattr(module, "_LITERAL_KEYS", 32)
    monkeypatch.setattr(flow, "index_by_literals", lambda rows, key, values: real_literal(
        rows, key, values[1:] + values[:1]))
    assert release() != joined
    monkeypatch.setattr(module, "_LITERAL_KEYS", 0)
    monkeypatch.setattr(module, "_LOOKUP_KEY_BYTES", 16 << 20)

    def rotated(rows, lower, upper, resolution, lookup, **kw):
        key, data_type, values = lookup
        return real_codes(rows, lower, upper, resolution,
                          (key, data_type, pa.concat_arrays([values[1:], values[:1]])), **kw)
    monkeypatch.setattr(flow, "partitioned_codes", rotated)
    assert release() != joined


def test_buckets_of_groups_release_each_group_once_from_its_own_rows(spark, monkeypatch):
    """With more public keys than 2**PACK_BUCKET_BITS, the packed rows and the shuffle carry
    buckets of 2**shift groups (here the bits lowered to 2: 8 groups a bucket, input in three
    partitions): every key is still released once, from its own rows only, seed for seed as
    with one group a bucket, and in production one row per key with its median."""
    from dpq_spark.spark import _dataflow as flow

    assert [flow.bucket_shift(g) for g in (1, 2**14, 2**14 + 1, 10**6)] == [0, 0, 1, 6]
    groups = {i: (i,) for i in range(30)}  # keys 30 and 31 have no rows
    df, medians = _frame(spark, groups, "g long, x double", rows_per_group=41)
    df = df.repartition(3)
    kw = dict(quantiles=[0.5], epsilon=HUGE, lower=0.0, upper=4000.0, group_by="g",
              groups=list(range(32)))

    def seeded():
        return sorted(_rows(dp_quantiles(df, "x", rng=np.random.default_rng(7), **kw).collect()))

    alone = seeded()
    monkeypatch.setattr(flow, "PACK_BUCKET_BITS", 2)
    assert flow.bucket_shift(32) == 3
    assert seeded() == alone
    out = dp_quantiles(df, "x", **kw).collect()
    assert sorted(r["g"] for r in out) == list(range(32))
    got = {r["g"]: r["value"] for r in out}
    assert all(abs(got[i] - medians[i]) <= 2.5 for i in range(30))  # within the gap: 99 / 40


def test_keys_with_a_null_or_of_doubles_keep_the_join(spark, monkeypatch):
    from dpq_spark.spark import _dataflow as flow
    from dpq_spark.spark import quantiles as module

    df, _ = _frame(spark, {0: (1.0,), 1: (None,)}, "g double, x double", rows_per_group=11)
    dl, _ = _frame(spark, {0: (1,), 1: (None,)}, "g long, x double", rows_per_group=11)
    monkeypatch.setattr(flow, "index_by_literals", None)  # would fail if called
    real_codes, lookups = flow.partitioned_codes, []
    monkeypatch.setattr(flow, "partitioned_codes", lambda *a, **k: lookups.append(a[4]) or real_codes(*a, **k))
    for literal_keys in (32, 0):  # neither the literal lookup nor the UDF's
        monkeypatch.setattr(module, "_LITERAL_KEYS", literal_keys)
        for frame, groups in ((df, [1.0, 2.0]), (dl, [1, None])):
            out = dp_quantiles(frame, "x", quantiles=[0.5], epsilon=1.0, lower=0.0, upper=1000.0,
                               group_by="g", groups=groups)
            assert out.count() == 2
    assert lookups == [None] * 4
