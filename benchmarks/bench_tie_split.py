"""Would splitting each grid point into fine points fix JointExp and IndExp on tied doubles?

Usage::

    .venv/bin/python benchmarks/bench_tie_split.py            # the whole grid (about 2 minutes)
    .venv/bin/python benchmarks/bench_tie_split.py --quick    # a smoke run

The design study behind ``Grid.tie_bits``: the shipped default grid splits every point into
``2**8`` fine points (``b = 8`` below), the size this table picked; ``bench_ties.py`` measures
the shipped path through the public functions. On the grid itself (``b = 0``) JointExp and
IndExp see a tied value as one grid point at its mid-rank. A double column
with a block of ties (80% zeros, values clamped at a bound, whole numbers stored as doubles)
then releases quantiles near the block's edges into the gap beside it, which can be as wide as
the bounds. A declared ``granularity`` cures this with a per-row jitter on a fine grid, at a
cost of one entry per row.

The variant measured here keeps the default grid's points and cuts each into ``2**b`` fine
points: every row goes, independently of the others, to a uniform fine point of its own grid
point (``f = (k << b) + u``, drawn as a multinomial per distinct index by
:func:`~dpq_spark.core.randomness.samplers.uniform_split`, so an index of ``t`` rows becomes at
most ``min(t, 2**b)`` entries), the mechanism runs on the ``(N + 1) 2**b`` fine points, and each
output is rounded back with ``f >> b``. The split is a per-record random map (no privacy cost,
the argument of the jitter in :mod:`dpq_spark.core.randomness.grid`), and the rounding is
post-processing, so the release stays on the default grid with no extra error on continuous
data. ``b = 0`` is the mechanism on the grid itself.

Each row prints, for one data set, epsilon and mechanism, the mean absolute error of deciles
against the clamped data's true deciles (``inverted_cdf``) over ``--reps`` seeded releases, for
every ``b``, with the mean time of a release.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpq_spark.core.quantiles.ind_exp import ind_exp_indices  # noqa: E402
from dpq_spark.core.quantiles.joint_exp import joint_exp_indices  # noqa: E402
from dpq_spark.core.randomness.grid import Grid  # noqa: E402
from dpq_spark.core.randomness.samplers import uniform_split  # noqa: E402
from dpq_spark.core.randomness.source import resolve_rng  # noqa: E402

MECHANISMS = {"joint_exp": joint_exp_indices, "ind_exp": ind_exp_indices}


def release(k, counts, grid: Grid, q, eps, bits: int, run, source) -> np.ndarray:
    """One release on sorted distinct grid indices ``k`` with ``counts``, split into ``2**bits``
    fine points a grid point (``bits = 0``: the grid itself); returns grid indices."""
    if bits == 0:
        return run(k, counts, grid.size, q, epsilon=eps, rng=source)
    entry, part, w = uniform_split(source, counts, bits)
    f = (k[entry] << bits) + part
    return run(f, w, grid.size << bits, q, epsilon=eps, rng=source) >> bits


def cases(quick: bool):
    g = np.random.default_rng(7)
    out = []

    def add(name, x, lo, hi):
        out.append((name, np.asarray(x, dtype=np.float64), lo, hi))

    n = 5000
    add("5e3, 80% zeros, rest 1..100, [-100, 100]",
        np.where(g.random(n) < 0.8, 0.0, g.integers(1, 101, n)), -100, 100)
    n = 500
    add("500, 50% zeros, rest lognormal(3, 1), [0, 1000]",
        np.where(g.random(n) < 0.5, 0.0, g.lognormal(3, 1, n)), 0, 1000)
    add("100, whole numbers of N(0, 5), [-100, 100]", np.round(g.normal(0, 5, 100)), -100, 100)
    n = 10_000
    add("1e4, 30% at the upper bound, [0, 100]",
        np.where(g.random(n) < 0.3, 100.0, g.uniform(0, 100, n)), 0, 100)
    add("1e4, ages round(N(40, 15)) as doubles, [0, 100]",
        np.clip(np.round(g.normal(40, 15, n)), 0, 100), 0, 100)
    add("100, N(0, 5), [-100, 100]", g.normal(0, 5, 100), -100, 100)
    add("1e3, N(0, 5), [-100, 100]", g.normal(0, 5, 1000), -100, 100)
    if not quick:
        add("1e5, N(0, 5), [-100, 100]", g.normal(0, 5, 10**5), -100, 100)
        add("1e6, ages as doubles, [0, 100]",
            np.clip(np.round(g.normal(40, 15, 10**6)), 0, 100), 0, 100)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few cases and repetitions")
    parser.add_argument("--reps", type=int, default=None, help="seeded releases per cell")
    parser.add_argument("--bits", default="0,4,8,12,16", help="comma-separated b values")
    args = parser.parse_args(argv)
    reps = args.reps or (4 if args.quick else 30)
    bits = [int(b) for b in args.bits.split(",")]
    epsilons = [1.0] if args.quick else [0.1, 1.0, 10.0]
    q = np.arange(1, 10) / 10
    print(f"# deciles, mean absolute error over {reps} seeded releases (mean ms a release)")
    print("data | eps | mechanism | " + " | ".join(f"b={b}" for b in bits))
    for name, x, lo, hi in cases(args.quick):
        grid = Grid(lo, hi)
        k, counts = np.unique(grid.snap(x), return_counts=True)
        truth = np.quantile(np.clip(x, lo, hi), q, method="inverted_cdf")
        for eps in epsilons:
            for mech, run in MECHANISMS.items():
                cells = []
                for b in bits:
                    errs, t0 = [], time.perf_counter()
                    for r in range(reps):
                        source = resolve_rng(np.random.default_rng([r, b]))
                        out = grid.value(release(k, counts, grid, q, eps, b, run, source))
                        errs.append(np.mean(np.abs(out - truth)))
                    ms = (time.perf_counter() - t0) / reps * 1e3
                    cells.append(f"{np.mean(errs):.3g} ({ms:.0f})")
                print(f"{name} | {eps:g} | {mech} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
