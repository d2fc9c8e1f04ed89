"""What a tiny group costs: the per-group path against ``release_many``.

Run from the repository root (numpy only, no Spark)::

    .venv/bin/python benchmarks/bench_small_groups.py            # 1e4 groups per case
    .venv/bin/python benchmarks/bench_small_groups.py --quick    # a smoke run (200 groups)

For groups of 0, 2 and 10 rows (values uniform on [-50, 50], bounds [-50, 50]), deciles (m = 9),
epsilon = 1, add/remove, ``rng=None`` (the OS generator, as in production), and for
``mechanism="auto"`` and each mechanism it can pick, it prints the cost per group of

- *per group*: ``dpq_spark.spark._release.release_values`` once per group, as the Spark layer's
  packed loop calls it today (one ``RandomSource``, validation, ``Grid`` per group);
- *batch*: one ``dpq_spark.core.quantiles.batch.release_many`` call for all the groups.

The per-group path is timed on a sample of the groups (``--sample``, default 300; AggTree costs
~35 ms a group there) and reported per group. Timings are wall-clock medians of ``--repeats``;
on a shared, loaded machine only ratios within one run mean much, and the run prints the load
average so that a quoted figure can say how loaded the machine was.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpq_spark.core.quantiles.batch import release_many  # noqa: E402

MECHANISMS = ("auto", "histogram", "agg_tree_8x3", "agg_tree", "approx_quantiles", "joint_exp", "ind_exp")
LOWER, UPPER = -50.0, 50.0
QUANTILES = tuple(np.arange(1, 10) / 10)


def _groups(count: int, size: int, seed: int):
    rng = np.random.default_rng(seed)
    return [(np.sort(rng.uniform(LOWER, UPPER, size)), np.ones(size, dtype=np.int64)) for _ in range(count)]


def _per_group(groups, mechanism: str) -> float:
    from dpq_spark.core.randomness.grid import Grid
    from dpq_spark.spark._release import ReleaseParams, release_values

    grid = Grid(LOWER, UPPER)  # the packed loop receives grid indices, not values
    groups = [(grid.snap(values), counts) for values, counts in groups]
    params = ReleaseParams(keys=(), quantiles=QUANTILES, epsilon=1.0, lower=LOWER, upper=UPPER,
                           resolution=2**20, neighboring="add_remove", mechanism=mechanism)
    start = time.perf_counter()
    for values, counts in groups:
        release_values(values, counts, None, 0, params)
    return (time.perf_counter() - start) / len(groups)


def _batch(groups, mechanism: str) -> float:
    start = time.perf_counter()
    release_many(groups, QUANTILES, epsilon=1.0, lower=LOWER, upper=UPPER, mechanism=mechanism)
    return (time.perf_counter() - start) / len(groups)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--sample", type=int, default=300, help="groups timed on the per-group path")
    parser.add_argument("--sizes", type=int, nargs="+", default=[0, 2, 10])
    parser.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="200 groups, 30 per-group, 1 repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.groups, args.sample, args.repeats = 200, 30, 1
    print(f"load average before: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})")
    print(f"{'rows':>4} {'mechanism':<17} {'per group (us)':>15} {'batch (us)':>11} {'speed-up':>9}")
    for size in args.sizes:
        groups = _groups(args.groups, size, seed=size)
        for mechanism in args.mechanisms:
            _batch(groups[:5], mechanism)  # warm-up: imports, cached tables
            _per_group(groups[:2], mechanism)
            old = float(np.median([_per_group(groups[:args.sample], mechanism) for _ in range(args.repeats)]))
            new = float(np.median([_batch(groups, mechanism) for _ in range(args.repeats)]))
            print(f"{size:>4} {mechanism:<17} {old * 1e6:>15.0f} {new * 1e6:>11.0f} {old / new:>8.1f}x",
                  flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
