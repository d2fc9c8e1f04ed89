"""Benchmarks of ``dp_quantiles`` beside Spark's own ``percentile_approx``.

Run standalone; it starts its own local session with default memory settings (or
``--driver-memory``)::

    .venv/bin/python benchmarks/bench_spark.py                 # every case, full size
    .venv/bin/python benchmarks/bench_spark.py --quick         # small sizes (a smoke run)
    .venv/bin/python benchmarks/bench_spark.py --only small,keys --connect   # on Spark Connect
    .venv/bin/python benchmarks/bench_spark.py --only global --driver-memory 4g  # bigger local driver
    .venv/bin/python benchmarks/bench_spark.py --only many --many-groups 1000,10000,100000
    .venv/bin/python benchmarks/bench_spark.py --only many --many-groups 10000 --stages  # where the time goes
    .venv/bin/python benchmarks/bench_spark.py --only many --many-type int --many-groups 10000
    .venv/bin/python benchmarks/bench_spark.py --profile-worker 20000:100   # no Spark: cProfile

Cases (targets in brackets):

accuracy   bounds 1e4x wider than the data's spread, 1e6 rows, 10 groups, deciles, eps = 1:
           mean absolute error of dp_quantiles and of core ``joint_exp`` on each group's raw
           values, over all the timed releases (``--repeat`` + 1) and as many core releases of
           each group [dp within 1.2x of core]
small      1e5 rows, 10 groups, deciles, warm [<= percentile_approx + 0.5 s]
groups     1e7 rows, 1,000 groups, deciles [<= 1.0x percentile_approx]
global     1e8 rows, no grouping, 99 percentiles [<= 0.5x percentile_approx]
skew       one group of 5e7 rows beside 1,000 groups of 1,000 rows: completes with default
           memory; the peak resident memory (VmHWM) of every Python worker process of this
           session is read from /proc while it runs (classic sessions on Linux only), and the
           largest is printed, with the driver's own peak
keys       1e5 public keys, 2 rows each, deciles [<= 3x percentile_approx]; timed with
           collect() and, as "keys/pd", with toPandas() (the default long release has 9e5 rows,
           one per key and decile, against percentile_approx's 1e5 rows of arrays); as
           "keys/long" and "keys/long/pd" the same against percentile_approx exploded to the
           same 9e5 rows (posexplode); and as "keys/wide" and "keys/wide/pd" with
           layout="wide" (1e5 rows of arrays, percentile_approx's own shape)
timestamps 1,000 timestamps in one 1,907 s cell of bounds [0, 2e9], and 600 in one cell + 400
           over +-1 day, deciles and quartiles: error of dp_quantiles (``auto``) and of the
           core's ``joint_exp`` and ``auto`` on the raw values [within 2x; quartiles within a
           cell]
many       1e7 rows of N(0, 5) in G equal groups (``--many-groups``, default 1e3, 1e4, 1e5 and
           1e6; ``--many-rows 1e8`` for the larger table), written to Parquet once per G and read
           back (not cached), deciles, eps = 1, bounds +-100, public keys, ``layout="wide"``,
           ``toPandas()``: after one warm-up call of each, the best of two alternating calls
           of each side (``--repeat`` changes two), and the peak resident memory of the Python
           workers during the timed dp_quantiles calls (VmHWM reset through
           ``/proc/PID/clear_refs`` before them; Linux, classic sessions); ``--many-type int``
           or ``decimal`` stores the column as tenths in an int (bounds +-1000) or as
           decimal(10,2), whose declared grids tie the values; ``--many-private-bounds``
           gives no bounds (each group buys its own) [<= 1.0x
           percentile_approx, worker peak < 512 MiB]; with ``--stages`` one more call of each
           side prints its Spark stages (tasks, wall and task times, JVM CPU, shuffle bytes,
           the slowest task) and the call's time outside them

The accuracy cases print percentile_approx's error on the same data too (not private; for
scale). ``--quick`` divides the sizes by 100 (at least 1,000 rows).

Each timing is the wall time of a call that returns the result on the driver
(``dp_quantiles(...).collect()`` and ``groupBy().agg(percentile_approx).collect()``) on the same
cached DataFrame, after one warm-up call of each on that DataFrame: ``--repeat`` calls of each
(default 3), alternating dp_quantiles and percentile_approx, and the medians are compared (one
call's time swings by tens of percent on a small shared machine). Timings on a loaded machine
mean little: say so when quoting them.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import threading
import time

import numpy as np

DECILES = [i / 10 for i in range(1, 10)]
QUARTILES = [0.25, 0.5, 0.75]
PERCENTILES = [i / 100 for i in range(1, 100)]


def _session(connect: bool, driver_memory: str | None = None, ui: bool = False):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("dpq_spark-bench")
    builder = builder.remote("local[2]") if connect else builder.master("local[2]")
    if driver_memory is not None:  # the local driver JVM is started here, so this applies
        builder = builder.config("spark.driver.memory", driver_memory)
    spark = (builder.config("spark.ui.enabled", "true" if ui else "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .getOrCreate())
    if not connect:
        spark.sparkContext.setLogLevel("ERROR")
    return spark


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


REPEATS = 3  # timed calls of each side (--repeat), interleaved; medians are compared


def _side_by_side(name, df, dp_call, approx_call):
    """Warm both up on ``df``, then time ``REPEATS`` calls of each, alternating; print the
    medians, their ratio and difference, and with several calls the range of each side."""
    dp_call(df)
    approx_call(df)
    dps, aps = [], []
    for _ in range(REPEATS):
        t_dp, out = _timed(lambda: dp_call(df))
        t_ap, _ = _timed(lambda: approx_call(df))
        dps.append(t_dp)
        aps.append(t_ap)
    t_dp, t_ap = float(np.median(dps)), float(np.median(aps))
    spread = (f"   (of {REPEATS}: {min(dps):.2f}-{max(dps):.2f} s, {min(aps):.2f}-{max(aps):.2f} s)"
              if REPEATS > 1 else "")
    print(f"{name:<11} dp_quantiles {t_dp:8.2f} s   percentile_approx {t_ap:8.2f} s   "
          f"ratio {t_dp / t_ap:5.2f}   difference {t_dp - t_ap:+6.2f} s{spread}", flush=True)
    return out


def _approx(F, quantiles, keys=(), fetch="collect", long=False):
    """percentile_approx's call; ``long=True``: exploded to one row per key and quantile (the
    shape of dp_quantiles' default long layout)."""
    def call(df):
        agg = F.percentile_approx("x", quantiles).alias("p")
        out = df.groupBy(*keys).agg(agg) if keys else df.agg(agg)
        if long:
            out = out.select(*keys, F.posexplode("p").alias("i", "value"))
        return getattr(out, fetch)()
    return call


def case_accuracy(spark, F, dp_quantiles, joint_exp, size):
    rows, groups = size(1_000_000), 10
    gen = np.random.default_rng(0)
    per = rows // groups
    data = {g: gen.normal(100.0 * g, 1.0, per) for g in range(groups)}  # spread ~10
    import pandas as pd

    pdf = pd.DataFrame({"g": np.repeat(list(data), per), "x": np.concatenate(list(data.values()))})
    df = spark.createDataFrame(pdf).cache()
    df.count()
    lower, upper = -50_000.0, 50_000.0  # 1e4 x the spread
    outs = []  # every release of the timed calls (and the warm-up): the errors are averaged

    def dp_call(d):
        outs.append(dp_quantiles(d, "x", quantiles=DECILES, epsilon=1.0, lower=lower,
                                 upper=upper, group_by="g", groups=list(data)).toPandas())
        return outs[-1]

    _side_by_side("accuracy", df, dp_call, _approx(F, DECILES, ["g"]))
    approx = {r["g"]: np.asarray(r["p"]) for r in _approx(F, DECILES, ["g"])(df)}
    err_dp, err_core, err_ap = [], [], []
    for g, x in data.items():
        truth = np.quantile(x, DECILES, method="inverted_cdf")
        for out in outs:  # as many core releases of each group as dp_quantiles releases
            err_dp.append(np.abs(out.loc[out["g"] == g, "value"].to_numpy() - truth))
            core = joint_exp(x, DECILES, epsilon=1.0, lower=lower, upper=upper)
            err_core.append(np.abs(core - truth))
        err_ap.append(np.abs(approx[g] - truth))
    dp, core = float(np.mean(err_dp)), float(np.mean(err_core))
    print(f"accuracy    {rows:.0e} rows, {groups} groups, {len(outs)} releases of each: MAE "
          f"dp_quantiles {dp:.4f}, core joint_exp {core:.4f}, ratio {dp / core:.2f} (target "
          f"<= 1.2); percentile_approx {float(np.mean(err_ap)):.4f} (not private)", flush=True)
    df.unpersist()


def _grouped(spark, F, rows, groups):
    return spark.range(rows).select((F.col("id") % groups).alias("g"),
                                    (F.randn(7) * 5).alias("x")).cache()


def case_small(spark, F, dp_quantiles, size):
    rows, groups = size(100_000), 10
    df = _grouped(spark, F, rows, groups)
    df.count()
    _side_by_side("small", df, lambda d: dp_quantiles(
        d, "x", quantiles=DECILES, epsilon=1.0, lower=-50, upper=50, group_by="g",
        groups=list(range(groups))).collect(), _approx(F, DECILES, ["g"]))
    df.unpersist()


def case_groups(spark, F, dp_quantiles, size):
    rows, groups = size(10_000_000), 1000
    df = _grouped(spark, F, rows, groups)
    df.count()
    _side_by_side("groups", df, lambda d: dp_quantiles(
        d, "x", quantiles=DECILES, epsilon=1.0, lower=-50, upper=50, group_by="g",
        groups=list(range(groups))).collect(), _approx(F, DECILES, ["g"]))
    df.unpersist()


def case_global(spark, F, dp_quantiles, size):
    rows = size(100_000_000)
    df = spark.range(rows).select((F.randn(3) * 5).alias("x"))  # generated, not cached
    _side_by_side("global", df, lambda d: dp_quantiles(
        d, "x", quantiles=PERCENTILES, epsilon=1.0, lower=-50, upper=50).collect(),
        _approx(F, PERCENTILES))


class _WorkerPeak:
    """Polls /proc for Python worker processes descended from this driver and keeps the
    largest VmHWM (peak resident set) seen. Linux and classic local sessions only."""

    def __init__(self, every: float = 0.5):
        self.peak_kib = 0
        self.seen = 0
        self._workers: set = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @staticmethod
    def _status(pid):
        try:
            with open(f"/proc/{pid}/status") as fh:
                return dict(line.split(":", 1) for line in fh if ":" in line)
        except OSError:
            return None

    def _descends_from_us(self, status, parents):
        me = os.getpid()
        ppid = int(status.get("PPid", "0").strip() or 0)
        for _ in range(8):  # worker -> daemon -> JVM -> this driver
            if ppid == me:
                return True
            if ppid <= 1:
                return False
            ppid = parents.get(ppid, 0)
        return False

    def reset(self):
        """Forget the peaks so far: reset every known worker's VmHWM to its current RSS
        (``/proc/PID/clear_refs``, Linux 4.0+) and start the maximum again."""
        for pid in list(self._workers):
            try:
                with open(f"/proc/{pid}/clear_refs", "w") as fh:
                    fh.write("5")
            except OSError:
                self._workers.discard(pid)
        self.peak_kib = 0

    def _run(self, every):
        workers = self._workers
        while not self._stop.is_set():
            parents, statuses = {}, {}
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    st = self._status(entry)
                    if st:
                        parents[int(entry)] = int(st.get("PPid", "0").strip() or 0)
                        statuses[int(entry)] = st
            for pid, st in statuses.items():
                if not st.get("Name", "").strip().startswith("python"):
                    continue
                if pid == os.getpid() or not self._descends_from_us(st, parents):
                    continue
                workers.add(pid)
                hwm = st.get("VmHWM", "0 kB").split()[0]
                self.peak_kib = max(self.peak_kib, int(hwm))
            self.seen = len(workers)
            self._stop.wait(every)


def case_skew(spark, F, dp_quantiles, size):
    big, small, per = size(50_000_000), 1000, 1000
    heavy = spark.range(big).select(F.lit(-1).cast("long").alias("g"), (F.randn(5) * 5).alias("x"))
    light = spark.range(small * per).select((F.col("id") % small).alias("g"),
                                            (F.randn(6) * 5).alias("x"))
    df = heavy.unionByName(light)
    with _WorkerPeak() as peak:
        t, _ = _timed(lambda: dp_quantiles(
            df, "x", quantiles=DECILES, epsilon=1.0, lower=-50, upper=50, group_by="g",
            groups=[-1, *range(small)]).collect())
    t_ap, _ = _timed(lambda: _approx(F, DECILES, ["g"])(df))
    driver = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    worker = f"{peak.peak_kib / 1024:.0f} MiB over {peak.seen} worker(s)" if peak.seen else \
        "not measured (no worker process seen: Connect or not Linux)"
    print(f"skew        {big:.0e} rows in one group + {small} x {per}: dp_quantiles {t:.2f} s, "
          f"percentile_approx {t_ap:.2f} s; peak Python worker RSS {worker}; driver "
          f"{driver:.0f} MiB", flush=True)


def case_keys(spark, F, dp_quantiles, size):
    groups = size(100_000)
    df = spark.range(2 * groups).select((F.col("id") % groups).alias("g"),
                                        (F.randn(8) * 5).alias("x")).cache()
    df.count()
    def release(d, layout="long"):
        return dp_quantiles(d, "x", quantiles=DECILES, epsilon=1.0, lower=-50, upper=50,
                            group_by="g", groups=list(range(groups)), layout=layout)

    # The default (long) release has one row per (key, decile): 9e5 rows, whose collect() into
    # Python Row objects costs seconds by itself, against 1e5 rows (one array each) for
    # percentile_approx; layout="wide" has percentile_approx's shape. So the case is timed with
    # collect() and with toPandas() (Arrow), for both layouts.
    _side_by_side("keys", df, lambda d: release(d).collect(), _approx(F, DECILES, ["g"]))
    _side_by_side("keys/pd", df, lambda d: release(d).toPandas(),
                  _approx(F, DECILES, ["g"], fetch="toPandas"))
    # The same two long releases against percentile_approx exploded to the same 9e5 rows.
    _side_by_side("keys/long", df, lambda d: release(d).collect(),
                  _approx(F, DECILES, ["g"], long=True))
    _side_by_side("keys/long/pd", df, lambda d: release(d).toPandas(),
                  _approx(F, DECILES, ["g"], fetch="toPandas", long=True))
    _side_by_side("keys/wide", df, lambda d: release(d, "wide").collect(),
                  _approx(F, DECILES, ["g"]))
    _side_by_side("keys/wide/pd", df, lambda d: release(d, "wide").toPandas(),
                  _approx(F, DECILES, ["g"], fetch="toPandas"))
    df.unpersist()


def case_timestamps(spark, F, dp_quantiles, joint_exp, size, repeats=20):
    import pandas as pd

    from dpq_spark.core import auto

    lower, upper = 0.0, 2e9
    step = (upper - lower) / 2**32
    base = 1.3e9
    gen = np.random.default_rng(2)
    cases = {
        "1,000 in one cell": base + gen.uniform(0, 1907, 1000),
        "600 in a cell + 400 over +-1 day": np.concatenate(
            [base + gen.uniform(0, 1907, 600), base + gen.uniform(-86_400, 86_400, 400)]),
    }
    # deciles: auto runs JointExp (on exact grid indices); quartiles: ApproxQuantiles (on
    # coarse cells, each row at a random sub-cell)
    for label, q in (("deciles", DECILES), ("quartiles", QUARTILES)):
        for name, x in cases.items():
            df = spark.createDataFrame(pd.DataFrame({"x": x})).cache()
            df.count()
            truth = np.quantile(x, q, method="inverted_cdf")
            picked = set()
            dp = []
            for _ in range(repeats):
                rows = dp_quantiles(df, "x", quantiles=q, epsilon=1.0, lower=lower,
                                    upper=upper).collect()
                picked |= {r["mechanism"] for r in rows}
                dp.append(np.abs(np.array([r["value"] for r in rows]) - truth).mean())
            core = {fn.__name__: [np.abs(fn(x, q, epsilon=1.0, lower=lower, upper=upper)
                                         - truth).mean() for _ in range(repeats)]
                    for fn in (joint_exp, auto)}
            approx = np.abs(np.asarray(_approx(F, q)(df)[0]["p"]) - truth).mean()
            print(f"timestamps  {label}, {name}: mean abs error dp_quantiles "
                  f"{np.median(dp):.2f} s ({', '.join(sorted(picked))}), core joint_exp "
                  f"{np.median(core['joint_exp']):.2f} s, core auto {np.median(core['auto']):.2f} s "
                  f"(medians of {repeats}; grid step {step:.3f} s); percentile_approx "
                  f"{approx:.2f} s (not private)", flush=True)
            df.unpersist()


MANY_GROUPS = (1_000, 10_000, 100_000, 1_000_000)
MANY_REPEATS = 2  # many: timed calls of each side (the best is kept); --repeat sets it
STAGES = False  # many: --stages, one more call of each side with Spark's stage metrics


def _stage_report(spark, name: str, call) -> None:
    """Run ``call`` once and print the Spark stages it ran, from the UI's REST API
    (``/api/v1/applications/<id>/stages``): tasks, the stage's wall time, the sum of its
    tasks' run times and JVM CPU, shuffle bytes and the slowest task; then the call's wall time
    outside those stages (the driver's own work, job scheduling, reading the result)."""
    import datetime
    import json
    import urllib.request

    base = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{spark.sparkContext.applicationId}"

    def stages():
        with urllib.request.urlopen(base + "/stages") as r:
            return json.load(r)

    def when(text):
        return datetime.datetime.strptime(text.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")

    seen = {s["stageId"] for s in stages()}
    wall = _timed(call)[0]
    time.sleep(1.0)  # the listener's last updates
    inside = 0.0
    for s in sorted(stages(), key=lambda s: s["stageId"]):
        if s["stageId"] in seen or s["status"] != "COMPLETE":
            continue
        took = (when(s["completionTime"]) - when(s["submissionTime"])).total_seconds()
        inside += took
        with urllib.request.urlopen(f"{base}/stages/{s['stageId']}/{s['attemptId']}/taskList"
                                    "?length=100000") as r:
            slowest = max(t["duration"] for t in json.load(r)) / 1e3
        print(f"  stages    {name:18s} stage {s['stageId']:3d}: {s['numTasks']:4d} tasks, "
              f"{took:6.2f} s wall, tasks {s['executorRunTime'] / 1e3:6.2f} s (JVM CPU "
              f"{s['executorCpuTime'] / 1e9:5.2f} s), slowest {slowest:5.2f} s, shuffle read/write "
              f"{s['shuffleReadBytes'] / 1e6:6.1f}/{s['shuffleWriteBytes'] / 1e6:6.1f} MB", flush=True)
    print(f"  stages    {name:18s} call {wall:6.2f} s, of it {wall - inside:5.2f} s outside the "
          f"stages (driver, scheduling, the result's read)", flush=True)


#: many: --many-type, the column's Spark type: how N(0, 5) is stored, and the public bounds
MANY_TYPES = {
    "double": (lambda x: x, (-100, 100)),
    "int": (lambda x: (x * 10).cast("int"), (-1000, 1000)),  # tenths as integers (ties)
    "decimal": (lambda x: x.cast("decimal(10,2)"), (-100, 100)),  # two decimals
}


def case_many(spark, F, dp_quantiles, size, groups_list=MANY_GROUPS, rows=10_000_000,
              column="double", private_bounds=False):
    """The many-groups table: ``rows`` rows of N(0, 5) in G equal groups, from Parquet, as a
    ``column`` column (``MANY_TYPES``); ``private_bounds``: no bounds given (each group buys
    its own)."""
    store, (lower, upper) = MANY_TYPES[column]
    if private_bounds:
        lower = upper = None
    import shutil
    import tempfile

    rows = size(rows)
    where = tempfile.mkdtemp(prefix="dpq_bench_many_")
    try:
        for groups in groups_list:
            path = os.path.join(where, f"g{groups}")
            (spark.range(rows).select((F.col("id") % groups).alias("g"),
                                      store(F.randn(11) * 5).alias("x"))
             .write.mode("overwrite").parquet(path))
            df = spark.read.parquet(path)
            keys = list(range(groups))

            def dp_call(d):
                return dp_quantiles(d, "x", quantiles=DECILES, epsilon=1.0, lower=lower,
                                    upper=upper, group_by="g", groups=keys,
                                    layout="wide").toPandas()

            approx_call = _approx(F, DECILES, ["g"], fetch="toPandas")
            with _WorkerPeak(every=0.2) as peak:
                dp_call(df)
                approx_call(df)
                peak.reset()
                dps, aps = [], []
                for _ in range(MANY_REPEATS):
                    dps.append(_timed(lambda: dp_call(df))[0])
                    aps.append(_timed(lambda: approx_call(df))[0])
            if STAGES:
                _stage_report(spark, "dp_quantiles", lambda: dp_call(df))
                _stage_report(spark, "percentile_approx", lambda: approx_call(df))
            worker = (f"{peak.peak_kib / 1024:.0f} MiB" if peak.seen else
                      "not measured (Connect or not Linux)")
            t_dp, t_ap = min(dps), min(aps)
            kind = ", ".join(([] if column == "double" else [column])
                             + (["no bounds"] if private_bounds else []))
            kind = f" ({kind})" if kind else ""
            print(f"many{kind:<10} {rows:.0e} rows, {groups:>9,} groups of {rows // groups:>6,}: "
                  f"dp_quantiles {t_dp:8.2f} s   percentile_approx {t_ap:8.2f} s   ratio "
                  f"{t_dp / t_ap:5.2f}   (best of {len(dps)}; all {', '.join(f'{t:.1f}' for t in dps)}"
                  f" / {', '.join(f'{t:.1f}' for t in aps)} s); peak Python worker RSS "
                  f"{worker}; load average {os.getloadavg()[0]:.1f}", flush=True)
            shutil.rmtree(path, ignore_errors=True)
    finally:
        shutil.rmtree(where, ignore_errors=True)


CASES = ("accuracy", "small", "groups", "global", "skew", "keys", "timestamps", "many")


def profile_worker(groups: int, rows: int, top: int = 14) -> None:
    """Profile the Python workers' part of a public-key release outside Spark: ``groups``
    groups of ``rows`` N(0, 5) rows (bounds +-100, deciles, eps = 1, auto), packed as the map
    side packs them (``_packing.pack_partition``) and released by the reduce side's body
    (``_release.release_partition``) under cProfile, in one process (one partition holding
    every group, sorted by bucket as the shuffle hands it over). Prints the CPU time per group
    and the functions with the most cumulative time."""
    import cProfile
    import pstats

    import pyarrow as pa
    import pyarrow.compute as pc

    from dpq_spark.core.randomness.grid import Grid
    from dpq_spark.spark._columns import BUCKET
    from dpq_spark.spark._packing import pack_partition
    from dpq_spark.spark._release import ReleaseParams, release_partition

    gen = np.random.default_rng(1)
    codes = (np.repeat(np.arange(groups, dtype=np.int64), rows) * (1 << 33)
             + Grid(-100.0, 100.0).snap(gen.normal(0.0, 5.0, groups * rows)))
    gen.shuffle(codes)
    batches = [pa.RecordBatch.from_arrays([pa.array(codes[i:i + 10_000])], names=["code"])
               for i in range(0, codes.size, 10_000)]
    packed = pa.Table.from_batches(list(pack_partition(iter(batches), span=1 << 33)))
    # as the shuffle hands a partition to the worker: sorted by bucket
    packed = packed.take(pc.sort_indices(packed, [(BUCKET, "ascending")]))
    packed = packed.combine_chunks().to_batches(max_chunksize=10_000)
    params = ReleaseParams(keys=("g",), quantiles=tuple(DECILES), epsilon=1.0, lower=-100.0,
                           upper=100.0, resolution=1 << 20, neighboring="add_remove",
                           mechanism="auto")
    profile = cProfile.Profile()
    cpu = time.process_time()
    profile.enable()
    for _ in release_partition(iter(packed), params):
        pass
    profile.disable()
    cpu = time.process_time() - cpu
    print(f"profile     {groups:,} groups of {rows:,} rows in one partition: {cpu:.2f} s of CPU "
          f"under cProfile, {cpu / groups * 1e6:.0f} us a group", flush=True)
    pstats.Stats(profile).sort_stats("cumulative").print_stats(top)


def main(argv=None) -> None:
    global REPEATS, MANY_REPEATS, STAGES
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(CASES), help="comma-separated cases")
    parser.add_argument("--quick", action="store_true", help="sizes / 100 (a smoke run)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="timed calls of each side, alternating (medians compared; "
                             f"default {REPEATS})")
    parser.add_argument("--connect", action="store_true", help="Spark Connect (local server)")
    parser.add_argument("--driver-memory", default=None,
                        help="spark.driver.memory of the local session, e.g. 4g (default: "
                             "Spark's, 1g)")
    parser.add_argument("--many-groups", default=",".join(str(g) for g in MANY_GROUPS),
                        help="many: comma-separated group counts (default "
                             f"{','.join(str(g) for g in MANY_GROUPS)})")
    parser.add_argument("--many-type", default="double", choices=sorted(MANY_TYPES),
                        help="many: the column's type (int: tenths as integers, bounds +-1000; "
                             "decimal: decimal(10,2); default double)")
    parser.add_argument("--many-private-bounds", action="store_true",
                        help="many: no bounds given (each group buys private bounds)")
    parser.add_argument("--many-rows", type=float, default=1e7,
                        help="many: rows in all (default 1e7; 1e8 for the larger table)")
    parser.add_argument("--stages", action="store_true",
                        help="many: one more call of each side, printing its Spark stages "
                             "(tasks, wall, task and JVM CPU time, shuffle bytes; classic only)")
    parser.add_argument("--profile-worker", default=None, metavar="GROUPS:ROWS",
                        help="no Spark: profile the Python workers' release of GROUPS groups of "
                             "ROWS rows in one process (e.g. 20000:100) and exit")
    args = parser.parse_args(argv)
    if args.profile_worker is not None:
        try:
            groups, rows = (int(float(v)) for v in args.profile_worker.split(":"))
        except ValueError:
            parser.error(f"--profile-worker must be GROUPS:ROWS, got {args.profile_worker!r}")
        profile_worker(groups, rows)
        return
    if args.stages and args.connect:
        parser.error("--stages reads the classic session's UI: not with --connect")
    STAGES = args.stages
    if args.repeat is not None and args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.repeat is not None:
        REPEATS = MANY_REPEATS = args.repeat
    chosen = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = set(chosen) - set(CASES)
    if unknown:
        parser.error(f"unknown case(s) {sorted(unknown)}; choose from {', '.join(CASES)}")

    try:
        many_groups = tuple(int(float(g)) for g in args.many_groups.split(",") if g.strip())
    except ValueError:
        parser.error(f"--many-groups must be comma-separated integers, got {args.many_groups!r}")
    if not many_groups or min(many_groups) < 1:
        parser.error("--many-groups must list at least one group count >= 1")

    def size(n: int) -> int:
        return max(n // 100, 1000) if args.quick else n

    spark = _session(args.connect, args.driver_memory, ui=args.stages)
    from pyspark.sql import functions as F

    from dpq_spark import dp_quantiles
    from dpq_spark.core import joint_exp

    print(f"# bench_spark: {'Connect' if args.connect else 'classic'} local[2], "
          f"{'quick' if args.quick else 'full'} sizes, driver memory "
          f"{args.driver_memory or 'default'}, load average {os.getloadavg()[0]:.1f}",
          flush=True)
    for case in chosen:
        fn = globals()[f"case_{case}"]
        if case in ("accuracy", "timestamps"):
            fn(spark, F, dp_quantiles, joint_exp, size)
        elif case == "many":
            fn(spark, F, dp_quantiles, size, groups_list=many_groups, rows=int(args.many_rows),
               column=args.many_type, private_bounds=args.many_private_bounds)
        else:
            fn(spark, F, dp_quantiles, size)
    spark.stop()


if __name__ == "__main__":
    main()
