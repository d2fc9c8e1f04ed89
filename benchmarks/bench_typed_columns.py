"""Accuracy of ``dp_quantiles`` on typed columns: the schema's grid against the default grid.

Run standalone (it starts its own local[2] session)::

    .venv/bin/python benchmarks/bench_typed_columns.py              # 50 repetitions per case
    .venv/bin/python benchmarks/bench_typed_columns.py --reps 5     # a smoke run

Cases (deciles, epsilon = 1, ungrouped, ``mechanism="auto"``, production randomness):

ages     round(N(40, 15)) clipped to [0, 100], n = 1e4, bounds [0, 100]: the column as ``int``
         (the integers' grid, from the schema) and cast to ``double`` (the default grid of
         2**32 steps: what an integral column got before it had a grid of its own)
ratings  Goodreads ``average_rating`` (2 decimals) from data/goodreads_books.csv, bounds
         [0, 5]: read as ``decimal(3, 2)`` (grid 0.01, from the schema), as ``double`` (the
         default grid) and as ``double`` with ``granularity=0.01``
free     the ages without bounds (private bounds with 0.2 of epsilon): with ``granularity=1``
         (given: without bounds the type's step is not used) and without (as ``double``)

The error is the mean absolute error of the released values against the true quantiles
(``numpy.quantile(method="inverted_cdf")``: a data point), averaged over the quantiles and the
repetitions. It prints the table and writes it as CSV to
``out/benchmarks/typed_columns/errors.csv`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DECILES = [j / 10 for j in range(1, 10)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--only", default="ages,ratings,free",
                        help="comma-separated cases (default: all)")
    parser.add_argument("--out", default=os.path.join(ROOT, "out", "benchmarks", "typed_columns"))
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from dpq_spark import dp_quantiles

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")  # the benchmark's own session only

    ages = np.clip(np.round(np.random.default_rng(2026).normal(40, 15, 10_000)), 0, 100)
    ages_df = spark.createDataFrame([(int(a),) for a in ages], "age int").cache()
    books = spark.read.csv(os.path.join(ROOT, "data", "goodreads_books.csv"), header=True)
    ratings = books.select(F.expr("try_cast(average_rating AS decimal(3, 2))").alias("r")) \
        .where(F.col("r").isNotNull()).cache()
    truth_ratings = np.array([float(r[0]) for r in ratings.collect()])

    cases = [
        ("ages", "int (schema grid 1)", ages_df, "age", {}, 0.0, 100.0, ages),
        ("ages", "double (default grid)",
         ages_df.select(F.col("age").cast("double").alias("age")), "age", {}, 0.0, 100.0, ages),
        ("ratings", "decimal(3,2) (schema grid 0.01)", ratings, "r", {}, 0.0, 5.0,
         truth_ratings),
        ("ratings", "double (default grid)", ratings.select(F.col("r").cast("double").alias("r")),
         "r", {}, 0.0, 5.0, truth_ratings),
        ("ratings", "double, granularity=0.01",
         ratings.select(F.col("r").cast("double").alias("r")), "r", {"granularity": 0.01},
         0.0, 5.0, truth_ratings),
        ("free", "int, granularity=1, no bounds", ages_df, "age", {"granularity": 1.0}, None,
         None, ages),
        ("free", "double, no bounds", ages_df.select(F.col("age").cast("double").alias("age")),
         "age", {}, None, None, ages),
    ]
    cases = [c for c in cases if c[0] in args.only.split(",")]
    rows = []
    for data, how, df, column, extra, lo, hi, raw in cases:
        truth = np.quantile(raw, DECILES, method="inverted_cdf")
        errors, names = [], set()
        for _ in range(args.reps):
            out = dp_quantiles(df, column, quantiles=DECILES, epsilon=1.0, lower=lo, upper=hi,
                               **extra).toPandas()
            errors.append(np.abs(out["value"].to_numpy() - truth).mean())
            names |= set(out["mechanism"])
        rows.append((data, how, len(raw), float(np.mean(errors)),
                     float(np.std(errors) / np.sqrt(len(errors))), "/".join(sorted(names))))
        print(f"{data:8s} {how:34s} n={len(raw):6d} MAE {rows[-1][3]:.5f} "
              f"(+- {rows[-1][4]:.5f})  {rows[-1][5]}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "errors.csv")
    with open(path, "w") as f:
        f.write("data,column,n,mean_abs_error,std_error,mechanism\n")
        for row in rows:
            f.write(f"{row[0]},\"{row[1]}\",{row[2]},{row[3]:.6g},{row[4]:.3g},{row[5]}\n")
    print(f"written to {path} ({args.reps} repetitions per case)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
