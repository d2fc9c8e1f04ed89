"""What ApproxQuantiles' random sub-cells cost on Spark's coarse cells, and what they buy.

Run from the repository root (numpy only, no Spark)::

    .venv/bin/python benchmarks/bench_coarse_spread.py
    .venv/bin/python benchmarks/bench_coarse_spread.py --quick    # a smoke run

``release_many(..., mechanism="auto", grid_indices=True, coarse_cells=True)`` is how the Spark
layer releases a partition's groups. On the default grid, when ``auto`` picks ApproxQuantiles
for a group whose noisy count is at most 2**20, it gives every row a random one of its coarse
cell's 16 sub-cells (``dpq_spark.core.quantiles.coarse_spread``). This script times that against
the same call with one sub-cell per cell (``bits=0``: every row at its cell's middle), side by
side, alternating, best of ``--repeats``, on groups of N(0, 5) in bounds +-100 (quartiles,
epsilon = max(1, 1000 / rows), where ``auto`` picks ApproxQuantiles for every group) and on the
same values rounded to integers (ties), and prints the mean absolute error of both on a group of
1,000 timestamps inside one coarse cell of bounds [0, 2e9] and on 5,000 doubles that are 0 with
probability 0.8 and otherwise whole numbers in [1, 100] (bounds +-100), beside the core's
``approx_quantiles`` on the raw values. ``--accuracy-only`` skips the timings. ``--big`` also
runs one group of 1e8 rows over all 2**20 cells of bounds +-100 through the per-group path
(``dpq_spark.spark._release._run_coarse``) with and without the sub-cells: its time and the peak
of numpy's allocations (tracemalloc), which is why a group whose public count exceeds 2**20
keeps the cells' middles. Prints the load average.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpq_spark.core.quantiles import batch  # noqa: E402
from dpq_spark.core.quantiles.approx_quantiles import approx_quantiles  # noqa: E402
from dpq_spark.core.quantiles.batch import FlatGroups, release_many  # noqa: E402
from dpq_spark.core.quantiles.coarse_spread import spread_groups  # noqa: E402
from dpq_spark.core.randomness.grid import Grid  # noqa: E402

QUARTILES = (0.25, 0.5, 0.75)
SPREAD = spread_groups
ONE_POINT = functools.partial(spread_groups, bits=0)


def _groups(grid, groups, rows, ties, seed=0):
    x = np.random.default_rng(seed).normal(0, 5, (groups, rows))
    if ties:
        x = np.round(x)
    k = np.sort(grid.snap(x), axis=1)
    flat, counts, bounds = [], [], [0]
    for row in k:  # distinct indices with their counts, as a fold holds them
        u, c = np.unique(row, return_counts=True)
        flat.append(u)
        counts.append(c)
        bounds.append(bounds[-1] + u.size)
    return FlatGroups(np.concatenate(flat), np.concatenate(counts), np.array(bounds))


def _release(groups, lower, upper, rng=None, epsilon=1.0):
    out = release_many(groups, QUARTILES, epsilon=epsilon, lower=lower, upper=upper,
                       mechanism="auto", grid_indices=True, coarse_cells=True, rng=rng)
    if set(out.mechanisms) != {"approx_quantiles"}:
        raise SystemExit(f"auto picked {sorted(set(out.mechanisms))}, not ApproxQuantiles alone")
    return out


def _timed(groups, spread, repeats, epsilon):
    batch.spread_groups = spread
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        _release(groups, -100.0, 100.0, epsilon=epsilon)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sizes / 100")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--accuracy-only", action="store_true", help="skip the timings")
    parser.add_argument("--big", action="store_true", help="also one group of 1e8 rows")
    args = parser.parse_args(argv)
    scale = 100 if args.quick else 1
    grid = Grid(-100.0, 100.0)
    print(f"load average {os.getloadavg()[0]:.2f}; best of {args.repeats}, alternating")
    if not args.accuracy_only:
        print(f"{'case':<34}{'16 sub-cells':>14}{'cell middle':>14}{'ratio':>8}")
    for groups, rows in () if args.accuracy_only else ((1_000, 10_000), (10_000, 1_000),
                                                        (100_000, 100)):
        for ties in (False, True):
            data = _groups(grid, groups // scale, rows, ties)
            spread = one = float("inf")
            eps = max(1.0, 1000.0 / rows)
            for _ in range(args.repeats):
                spread = min(spread, _timed(data, SPREAD, 1, eps))
                one = min(one, _timed(data, ONE_POINT, 1, eps))
            label = f"{groups // scale:,} x {rows:,}{' integers' if ties else ''}, eps {eps:g}"
            print(f"{label:<34}{spread:>12.2f} s{one:>12.2f} s{spread / one:>7.2f}x", flush=True)
    # accuracy: 1,000 timestamps inside one coarse cell (1,907 s) of [0, 2e9]; tied doubles
    wide = Grid(0.0, 2e9)
    left = wide.value(np.array([891_000 << 12]))[0]
    gen = np.random.default_rng(1)
    cases = {
        "1,000 timestamps in one cell": (left + gen.uniform(0, 600, 1000), 0.0, 2e9),
        "5,000 doubles, 80% zeros": (np.where(gen.random(5000) < 0.8, 0.0,
                                              gen.integers(1, 101, 5000).astype(float)),
                                     -100.0, 100.0),
    }
    for name, (x, lower, upper) in cases.items():
        k, c = np.unique(Grid(lower, upper).snap(x), return_counts=True)
        one_group = FlatGroups(k, c, np.array([0, k.size]))
        truth = np.quantile(x, QUARTILES)
        for label, spread in (("16 sub-cells", SPREAD), ("cell middle", ONE_POINT)):
            batch.spread_groups = spread
            err = [np.abs(_release(one_group, lower, upper, np.random.default_rng(r)).values[0]
                          - truth).mean() for r in range(50)]
            print(f"{name}, {label}: mean absolute error {np.mean(err):.4g} "
                  f"(quartiles, 50 seeded releases)")
        core = [np.abs(approx_quantiles(x, QUARTILES, epsilon=1.0, lower=lower, upper=upper,
                                        rng=np.random.default_rng(r)) - truth).mean()
                for r in range(50)]
        print(f"{name}, core approx_quantiles on the raw values: mean absolute error "
              f"{np.mean(core):.4g}")
    batch.spread_groups = SPREAD
    if args.big:
        _big()


def _big() -> None:
    import tracemalloc

    from dpq_spark.core.randomness.source import resolve_rng
    from dpq_spark.spark._release import ReleaseParams, _run_coarse

    cells = np.arange(1 << 20, dtype=np.int64)
    counts = np.full(cells.size, 95, dtype=np.int64)  # about 1e8 rows
    params = ReleaseParams(keys=(), quantiles=QUARTILES, epsilon=1.0, lower=-100.0, upper=100.0,
                           resolution=0, neighboring="add_remove", mechanism="auto")
    for label, n_used in (("16 sub-cells", 1 << 20), ("cell middle", None)):
        tracemalloc.start()
        start = time.perf_counter()
        _run_coarse("approx_quantiles", cells, counts, resolve_rng(None), 1.0, params,
                    n_used=n_used)
        took = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"1e8 rows over 2**20 cells, one group, {label}: {took:.2f} s, peak numpy "
              f"allocations {peak / 2**20:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
