"""Tied doubles on the default grid: the split of ties against the grid itself, side by side.

Usage::

    .venv/bin/python benchmarks/bench_ties.py             # core, about 2 minutes
    .venv/bin/python benchmarks/bench_ties.py --spark     # also dp_quantiles on a local[2] session
    .venv/bin/python benchmarks/bench_ties.py --quick     # a smoke run

Without ``granularity`` the mechanisms that read ranks (JointExp, IndExp, ApproxQuantiles) run
on 2**8 fine points per default-grid point, each row at a uniform one of its own point's
(``Grid.tie_bits``; :func:`dpq_spark.core.randomness.grid.split_ties`). This script measures
what that buys and costs through the public functions: every case runs once with the split
(what ships) and once with ``TIE_BITS = 0`` (the mechanism on the grid itself, as before the
split), with the same seeds.

Each accuracy row: the data, epsilon, the function (``auto`` prints the mechanism it picked),
the mean absolute error of the released values against the clamped data's true quantiles
(``numpy.quantile(method="inverted_cdf")``) over ``--reps`` seeded releases, for both, and
their ratio. The time rows: the median wall time of one release on continuous data of 1e5 to
1e7 values (JointExp, deciles), with and without the split. ``--spark`` adds ``dp_quantiles``
grouped by 20 keys (1 row of keys per group, public keys, deciles, seeded), whose per-group
releases must equal the core's on the same data, seed for seed (checked, not timed; the
Python workers always split, so Spark has no "grid" column).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import contextmanager

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dpq_spark.core.quantiles.mechanisms import approx_quantiles, auto, ind_exp, joint_exp  # noqa: E402
from dpq_spark.core.randomness import grid as grid_module  # noqa: E402

DECILES = np.arange(1, 10) / 10
QUARTILES = np.array([0.25, 0.5, 0.75])


@contextmanager
def split_off():
    """The grid itself: ``TIE_BITS = 0`` for the duration (the Spark layer's cached grids are
    dropped around it)."""
    saved = grid_module.TIE_BITS
    _clear_spark_grids()
    grid_module.TIE_BITS = 0
    try:
        yield
    finally:
        grid_module.TIE_BITS = saved
        _clear_spark_grids()


def _clear_spark_grids():
    mod = sys.modules.get("dpq_spark.spark._release")
    if mod is not None:
        mod._grid_of.cache_clear()


def cases(quick: bool):
    g = np.random.default_rng(7)
    out = []
    n = 5000
    out.append(("5e3, 80% zeros, rest 1..100", np.where(g.random(n) < 0.8, 0.0,
                g.integers(1, 101, n).astype(float)), -100.0, 100.0))
    n = 10_000
    out.append(("1e4, 30% at the upper bound", np.where(g.random(n) < 0.3, 100.0,
                g.uniform(0, 100, n)), 0.0, 100.0))
    n = 500
    out.append(("500, 50% zeros, rest lognormal(3, 1)", np.where(g.random(n) < 0.5, 0.0,
                g.lognormal(3, 1, n)), 0.0, 1000.0))
    out.append(("1e4, ages round(N(40, 15)) as doubles",
                np.clip(np.round(g.normal(40, 15, 10_000)), 0, 100), 0.0, 100.0))
    out.append(("1e3, N(0, 5)", g.normal(0, 5, 1000), -100.0, 100.0))
    if not quick:
        out.append(("100, N(0, 5)", g.normal(0, 5, 100), -100.0, 100.0))
        out.append(("1e5, N(0, 5)", g.normal(0, 5, 100_000), -100.0, 100.0))
    return out


def error(run, x, q, lo, hi, eps, reps):
    truth = np.quantile(np.clip(x, lo, hi), q, method="inverted_cdf")
    errs, name = [], run.__name__
    for r in range(reps):
        out = run(x, q, epsilon=eps, lower=lo, upper=hi, rng=np.random.default_rng([r, 17]))
        name = getattr(out, "mechanism", None) or name
        errs.append(float(np.mean(np.abs(np.asarray(out) - truth))))
    return float(np.mean(errs)), float(np.std(errs) / np.sqrt(reps)), name


def accuracy(args) -> None:
    reps = args.reps or (5 if args.quick else 50)
    epsilons = [1.0] if args.quick else [0.1, 1.0, 10.0]
    runs = [(auto, DECILES), (auto, QUARTILES), (joint_exp, DECILES), (ind_exp, DECILES),
            (approx_quantiles, QUARTILES)]
    print(f"# mean absolute error (± standard error) over {reps} seeded releases; "
          "split = what ships, grid = TIE_BITS 0")
    print("data | eps | function | m | split | grid | grid / split")
    for label, x, lo, hi in cases(args.quick):
        for eps in epsilons:
            for run, q in runs:
                a, sa, name = error(run, x, q, lo, hi, eps, reps)
                with split_off():
                    b, sb, name_b = error(run, x, q, lo, hi, eps, reps)
                pick = name if name == name_b else f"{name} / {name_b}"
                ratio = b / a if a > 0 else float("inf")
                print(f"{label} | {eps:g} | {run.__name__} ({pick}) | {q.size} | "
                      f"{a:.3g} ± {sa:.2g} | {b:.3g} ± {sb:.2g} | {ratio:.3g}", flush=True)


def timing(args) -> None:
    sizes = [10**5, 10**6] if args.quick else [10**5, 10**6, 10**7]
    print("# median wall time of one joint_exp release (deciles, eps = 1, N(0, 5) in ±100)")
    print("n | split | grid | split / grid")
    for n in sizes:
        x = np.random.default_rng(n).normal(0, 5, n)
        t = []
        for off in (False, True):
            times = []
            for r in range(3):
                with (split_off() if off else _nothing()):
                    t0 = time.perf_counter()
                    joint_exp(x, DECILES, epsilon=1.0, lower=-100, upper=100,
                              rng=np.random.default_rng(r))
                    times.append(time.perf_counter() - t0)
            t.append(float(np.median(times)))
        print(f"{n:.0e} | {t[0]:.3f} s | {t[1]:.3f} s | {t[0] / t[1]:.2f}", flush=True)


@contextmanager
def _nothing():
    yield


def spark_check(args) -> None:
    """dp_quantiles on tied doubles, grouped: each group's release is the core's (seeded)."""
    import pandas as pd
    from pyspark.sql import SparkSession

    from dpq_spark import dp_quantiles
    from dpq_spark.core.randomness.source import resolve_rng
    from dpq_spark.spark._keys import key_seed

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers run this interpreter
    spark = (SparkSession.builder.master("local[2]").appName("bench_ties")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    label, x, lo, hi = cases(True)[0]
    gen = np.random.default_rng(3)
    groups = {f"g{i:02d}": x[gen.choice(x.size, 500, replace=False)] for i in range(20)}
    pdf = pd.DataFrame({"g": np.repeat(list(groups), 500), "x": np.concatenate(list(groups.values()))})
    df = spark.createDataFrame(pdf)
    source = resolve_rng(np.random.default_rng(11))
    source.seed63(), source.seed63()
    base = source.seed63()
    print("# dp_quantiles, grouped by 20 keys of 500 rows each (" + label + "), deciles, eps = 1")
    out = dp_quantiles(df, "x", quantiles=list(DECILES), epsilon=1.0, lower=lo, upper=hi,
                       group_by="g", groups=list(groups), mechanism="joint_exp",
                       rng=np.random.default_rng(11)).toPandas()
    errs, same = [], 0
    for name, data in groups.items():
        got = out.loc[out["g"] == name, "value"].to_numpy()
        want = joint_exp(data, DECILES, epsilon=1.0, lower=lo, upper=hi,
                         rng=np.random.default_rng([base, key_seed((name,)) % 2**64]))
        same += int(np.array_equal(got, want))
        errs.append(float(np.mean(np.abs(got - truth_of(data)))))
    with split_off():
        plain = [float(np.mean(np.abs(joint_exp(data, DECILES, epsilon=1.0, lower=lo, upper=hi,
                                                 rng=np.random.default_rng([base, key_seed((name,)) % 2**64]))
                                       - truth_of(data)))) for name, data in groups.items()]
    print(f"mean absolute error {np.mean(errs):.3g} (the core without the split, same seeds: "
          f"{np.mean(plain):.3g}); equal to the core's joint_exp seed for seed: "
          f"{same} of {len(groups)} groups", flush=True)
    spark.stop()


def truth_of(data):
    return np.quantile(data, DECILES, method="inverted_cdf")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few cases and repetitions")
    parser.add_argument("--reps", type=int, default=None, help="seeded releases per cell")
    parser.add_argument("--spark", action="store_true", help="also dp_quantiles on local[2]")
    parser.add_argument("--no-timing", action="store_true", help="skip the time rows")
    args = parser.parse_args(argv)
    print(f"# load average before: {os.getloadavg()[0]:.2f}")
    accuracy(args)
    if not args.no_timing:
        timing(args)
    if args.spark:
        spark_check(args)
    print(f"# load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
