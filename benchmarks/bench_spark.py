"""Benchmarks of ``dp_quantiles`` against Spark's own ``percentile_approx`` (issue 3).

Run standalone (it starts its own local session with default memory settings)::

    .venv/bin/python benchmarks/bench_spark.py            # all four, full size
    .venv/bin/python benchmarks/bench_spark.py --only a,d --scale 0.1

(a) 1e7 rows, 1,000 groups, 9 deciles: dp_quantiles vs groupBy().agg(percentile_approx), same
    cached data, one session; ratio printed (target <= 1.5).
(b) 1e8 rows from spark.range, no grouping, 99 percentiles vs a global percentile_approx
    (target <= 1.5).
(c) skew: one group of 5e7 rows beside 1,000 groups of 1,000 rows, default local memory.
(d) accuracy: 1e4 rows per group of N(0, 5), eps = 1, mean absolute error of the 9 deciles
    against each group's exact deciles (target <= 0.1).

Each timing is the wall time of one action that collects the result to the driver; the data is
cached and counted first so both sides read the same in-memory rows. The first timed query of a
pair is preceded by a warm-up on a small slice so JIT and worker start-up are not charged to it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

DECILES = [i / 10 for i in range(1, 10)]
PERCENTILES = [i / 100 for i in range(1, 100)]


def _session(master: str):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(master).appName("dpq_spark-bench")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def _warm_up(spark, dp_quantiles, F):
    small = spark.range(20000).select((F.col("id") % 10).alias("g"), F.randn(1).alias("x"))
    small.groupBy("g").agg(F.percentile_approx("x", DECILES)).collect()
    dp_quantiles(small, "x", quantiles=DECILES, epsilon=1.0, lower=-5, upper=5, group_by="g",
                 groups=list(range(10))).collect()


def bench_grouped(spark, F, dp_quantiles, rows: int, n_groups: int):
    df = spark.range(rows).select((F.col("id") % n_groups).alias("g"),
                                  (F.randn(7) * 5).alias("x")).cache()
    df.count()
    t_pa, _ = _timed(lambda: df.groupBy("g").agg(F.percentile_approx("x", DECILES).alias("p")).collect())
    t_dp, _ = _timed(lambda: dp_quantiles(df, "x", quantiles=DECILES, epsilon=1.0, lower=-50.0,
                                          upper=50.0, group_by="g",
                                          groups=list(range(n_groups))).collect())
    df.unpersist()
    return t_pa, t_dp


def bench_global(spark, F, dp_quantiles, rows: int):
    df = spark.range(rows).select(F.col("id").cast("double").alias("x")).cache()
    df.count()
    t_pa, _ = _timed(lambda: df.agg(F.percentile_approx("x", PERCENTILES)).collect())
    t_dp, _ = _timed(lambda: dp_quantiles(df, "x", quantiles=PERCENTILES, epsilon=1.0, lower=0.0,
                                          upper=float(rows)).collect())
    df.unpersist()
    return t_pa, t_dp


def bench_skew(spark, F, dp_quantiles, big: int, n_small: int, small_rows: int):
    small_total = n_small * small_rows
    df = spark.range(big + small_total).select(
        F.when(F.col("id") < big, F.lit(-1)).otherwise(F.col("id") % n_small).alias("g"),
        (F.randn(11) * 5).alias("x"))
    t_dp, out = _timed(lambda: dp_quantiles(df, "x", quantiles=DECILES, epsilon=1.0, lower=-50.0,
                                            upper=50.0, group_by="g",
                                            groups=[-1] + list(range(n_small))).collect())
    return t_dp, len(out)


def bench_accuracy(spark, F, dp_quantiles, n_groups: int, per_group: int, seed: int = 2026):
    gen = np.random.default_rng(seed)
    x = gen.normal(0.0, 5.0, size=(n_groups, per_group))
    import pandas as pd

    pdf = pd.DataFrame({"g": np.repeat(np.arange(n_groups), per_group), "x": x.ravel()})
    df = spark.createDataFrame(pdf)
    out = dp_quantiles(df, "x", quantiles=DECILES, epsilon=1.0, lower=-50.0, upper=50.0,
                       group_by="g", groups=list(range(n_groups))).toPandas()
    est = out.sort_values(["g", "quantile"])["value"].to_numpy().reshape(n_groups, len(DECILES))
    exact = np.quantile(x, DECILES, axis=1, method="inverted_cdf").T
    return float(np.mean(np.abs(est - exact)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="a,b,c,d", help="comma list of a,b,c,d")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the row counts")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    which = set(args.only.split(","))
    spark = _session(args.master)
    from pyspark.sql import functions as F

    from dpq_spark import dp_quantiles

    s = args.scale
    _warm_up(spark, dp_quantiles, F)
    lines = [f"{'benchmark':<58} {'percentile_approx':>17} {'dp_quantiles':>12} {'ratio':>6}"]
    if "a" in which:
        rows = int(1e7 * s)
        t_pa, t_dp = bench_grouped(spark, F, dp_quantiles, rows, 1000)
        lines.append(f"{f'(a) {rows:.0e} rows, 1000 groups, 9 deciles':<58} {t_pa:>16.1f}s "
                     f"{t_dp:>11.1f}s {t_dp / t_pa:>6.2f}")
        print(lines[-1], flush=True)
    if "b" in which:
        rows = int(1e8 * s)
        t_pa, t_dp = bench_global(spark, F, dp_quantiles, rows)
        lines.append(f"{f'(b) {rows:.0e} rows (spark.range), global, 99 percentiles':<58} "
                     f"{t_pa:>16.1f}s {t_dp:>11.1f}s {t_dp / t_pa:>6.2f}")
        print(lines[-1], flush=True)
    if "c" in which:
        big = int(5e7 * s)
        t_dp, n_out = bench_skew(spark, F, dp_quantiles, big, 1000, 1000)
        lines.append(f"{f'(c) skew: 1 group of {big:.0e} + 1000 groups of 1000 rows':<58} "
                     f"{'-':>17} {t_dp:>11.1f}s {'-':>6}  ({n_out} rows out)")
        print(lines[-1], flush=True)
    if "d" in which:
        n_groups = max(1, int(100 * min(s, 1.0)))
        mae = bench_accuracy(spark, F, dp_quantiles, n_groups, 10_000)
        lines.append(f"(d) accuracy: {n_groups} groups x 1e4 rows N(0,5), eps=1, 9 deciles: "
                     f"mean abs error {mae:.4f} (target <= 0.1)")
        print(lines[-1], flush=True)
    print("\n".join(lines))
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
