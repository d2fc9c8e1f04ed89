"""Private bounds that cannot run away: run-away counts and the error against data-range bounds.

    .venv/bin/python benchmarks/bench_bounds.py            # the full run (about 20 minutes on 2 cores)
    .venv/bin/python benchmarks/bench_bounds.py --quick    # a smoke run (under a minute)
    .venv/bin/python benchmarks/bench_bounds.py --update   # also replace benchmarks/results/bench_bounds_*.csv

A *run-away* is a released bound or value more than 100 data spans (``max - min`` of the data)
outside the data. All releases are bounds-free deciles at epsilon = 1 under add/remove (the
default), with the seeded generator ``numpy.random.default_rng([seed, i])`` for release ``i``.

- ``runaway``: for each dataset, ``--releases`` (default 1e5) seeded bounds steps exactly as
  ``joint_exp(x, deciles, epsilon=1)`` runs them (``private_bounds`` at 0.2) and as ``auto`` runs
  them (after its noisy count: ``private_bounds`` at 0.95 * 0.2). A release's values lie inside
  its bounds (JointExp releases grid points of ``[lower, upper]``), so these counts bound the
  releases' run-aways. Also counted: refusals (``BoundsNotFoundError``: too few rows for the
  budget) and the largest distance out, in spans. A fresh dataset every 100 releases (1,000
  datasets for 1e5 releases).
- ``releases``: ``--full`` end-to-end releases per dataset through ``joint_exp`` and ``auto``
  (default 2,000; 200 at n = 1e4), a fresh dataset each: run-aways of the released values,
  refusals.
- ``ratio``: mean absolute error of bounds-free ``joint_exp`` deciles divided by that of
  ``joint_exp`` with the data's own min and max as bounds (not private: the best a user could
  hope for), at n = 500 and 1e5.

Datasets: N(0, 5); Student-t with 2 degrees of freedom (infinite variance); log-normal incomes
(median 45,000, sigma 0.9); Goodreads ``num_pages`` (integral, 0 to 6,576; sampled with
replacement; ``granularity=1``). Output: CSVs under ``out/benchmarks/bench_bounds/`` (with
``--update`` also ``benchmarks/results/bench_bounds_*.csv``) and the tables on stdout.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SCRATCH = REPO / "out" / "benchmarks" / "bench_bounds"
COMMITTED = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO / "benchmarks"))

from dpq_spark.core.errors import BoundsNotFoundError  # noqa: E402
from dpq_spark.core.quantiles.bounds import DEFAULT_BOUNDS_SHARE, private_bounds  # noqa: E402
from dpq_spark.core.quantiles.choose import DEFAULT_COUNT_SHARE, auto  # noqa: E402
from dpq_spark.core.quantiles.mechanisms import get_base_mechanism, joint_exp  # noqa: E402

DECILES = np.arange(1, 10) / 10
EPS = 1.0
SPANS = 100.0
PER_DATASET = 100  # run-away part: seeded bounds steps per fresh dataset


def _pages() -> np.ndarray:
    from experiments import load_goodreads

    return np.round(load_goodreads()["pages"] * 100.0)


def make(name: str, n: int, rng: np.random.Generator, pools: dict) -> np.ndarray:
    if name == "normal":
        return rng.normal(0.0, 5.0, n)
    if name == "t2":
        return rng.standard_t(2, n)
    if name == "income":
        return rng.lognormal(np.log(45_000.0), 0.9, n)
    if name == "pages":
        if "pages" not in pools:
            pools["pages"] = _pages()
        pool = pools["pages"]
        return rng.choice(pool, n, replace=True)
    raise ValueError(name)


def granularity(name: str):
    return 1.0 if name == "pages" else None


def spans_out(lo: float, hi: float, x: np.ndarray) -> float:
    span = max(float(x.max() - x.min()), 1e-300)
    return max(float(x.min()) - lo, hi - float(x.max()), 0.0) / span


def runaway(name, n, path, releases, seed, pools):
    eps_bounds = DEFAULT_BOUNDS_SHARE * EPS * (1.0 if path == "joint_exp" else 1.0 - DEFAULT_COUNT_SHARE)
    data_rng = np.random.default_rng([seed, n, 7])
    ran = refused = 0
    worst = 0.0
    for i in range(releases):
        if i % PER_DATASET == 0:
            x = np.sort(make(name, n, data_rng, pools))
        try:
            b = private_bounds(x, epsilon=eps_bounds, granularity=granularity(name),
                               rng=np.random.default_rng([seed, i]))
        except BoundsNotFoundError:
            refused += 1
            continue
        out = spans_out(b.lower, b.upper, x)
        worst = max(worst, out)
        ran += out > SPANS
    return ran, refused, worst


def full_releases(name, n, reps, seed, pools):
    rows = []
    data_rng = np.random.default_rng([seed, n, 8])
    for path in ("joint_exp", "auto"):
        ran = refused = 0
        worst = 0.0
        for i in range(reps):
            x = make(name, n, data_rng, pools)
            rng = np.random.default_rng([seed, 1_000_000 + i])
            g = {} if granularity(name) is None else {"granularity": granularity(name)}
            try:
                if path == "joint_exp":
                    v = np.asarray(joint_exp(x, DECILES, epsilon=EPS, rng=rng, **g))
                else:
                    v = np.asarray(auto(x, DECILES, epsilon=EPS, rng=rng, **g))
            except BoundsNotFoundError:
                refused += 1
                continue
            out = spans_out(float(v.min()), float(v.max()), x)
            worst = max(worst, out)
            ran += out > SPANS
        rows.append((path, ran, refused, worst))
    return rows


def ratio(name, n, reps, seed, pools, neighboring="add_remove"):
    je = get_base_mechanism("joint_exp")
    data_rng = np.random.default_rng([seed, n, 9])
    rng = np.random.default_rng([seed, n, 10])
    ref, free = [], []
    refused = 0
    for _ in range(reps):
        x = make(name, n, data_rng, pools)
        truth = np.quantile(x, DECILES, method="lower")
        g = {} if granularity(name) is None else {"granularity": granularity(name)}
        try:
            f = np.mean(np.abs(np.asarray(joint_exp(x, DECILES, epsilon=EPS, neighboring=neighboring,
                                                    rng=rng, **g)) - truth))
        except BoundsNotFoundError:
            refused += 1
            continue
        free.append(f)
        ref.append(np.mean(np.abs(je(x, DECILES, epsilon=EPS, lower=float(x.min()),
                                     upper=float(x.max()), neighboring=neighboring, rng=rng, **g)
                                  - truth)))
    return float(np.mean(ref)), float(np.mean(free)), float(np.median(ref)), float(np.median(free)), refused


def _ratio(a: float, b: float) -> float:
    """a / b, with 0 / 0 = 1 (integral data at large n: both releases exact)."""
    return a / b if b > 0 else (1.0 if a == 0 else float("inf"))


def _write(path: Path, header, rows):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: few releases")
    parser.add_argument("--releases", type=int, default=None, help="bounds steps per dataset (1e5)")
    parser.add_argument("--full", type=int, default=None, help="end-to-end releases per dataset (2,000)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions of the ratio at n = 500 (200)")
    parser.add_argument("--seed", type=int, default=20261202)
    parser.add_argument("--cases", nargs="+", default=None, metavar="DATA:N",
                        help="run-away and release cases (default: normal:100 normal:500 normal:10000 "
                             "t2:500 pages:500); the ratio part runs their datasets")
    parser.add_argument("--parts", nargs="+", default=["runaway", "releases", "ratio"],
                        choices=["runaway", "releases", "ratio"])
    parser.add_argument("--neighboring", default="add_remove", choices=["add_remove", "swap"],
                        help="neighbouring relation of the ratio part (the others use add_remove)")
    parser.add_argument("--update", action="store_true",
                        help="also write benchmarks/results/bench_bounds_*.csv (the committed results)")
    parser.add_argument("--out", type=Path, default=SCRATCH)
    args = parser.parse_args(argv)
    releases = args.releases or (300 if args.quick else 100_000)
    full = args.full or (30 if args.quick else 2_000)
    reps = args.reps or (10 if args.quick else 200)
    args.out.mkdir(parents=True, exist_ok=True)
    dirs = [args.out] + ([COMMITTED] if args.update else [])
    pools: dict = {}
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; results in {args.out}",
          flush=True)

    cases = [("normal", 100), ("normal", 500), ("normal", 10_000), ("t2", 500), ("pages", 500)]
    if args.cases:
        cases = [(c.split(":")[0], int(c.split(":")[1])) for c in args.cases]
    if "runaway" in args.parts:
        part_runaway(cases, releases, args, pools, dirs)
    if "releases" in args.parts:
        part_releases(cases, full, args, pools, dirs)
    if "ratio" in args.parts:
        names = list(dict.fromkeys(name for name, _ in cases)) if args.cases else None
        part_ratio(reps, args, pools, dirs, names)
    print(f"\nload average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    return 0


def part_runaway(cases, releases, args, pools, dirs):
    rows = []
    print(f"\nrun-aways (> {SPANS:g} spans) in {releases} seeded bounds steps, epsilon = 1 bounds-free deciles")
    print("| data | n | path | run-aways | refused | largest distance out (spans) | seconds |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for name, n in cases:
        for path in ("joint_exp", "auto"):
            t = time.perf_counter()
            ran, refused, worst = runaway(name, n, path, releases, args.seed, pools)
            dt = time.perf_counter() - t
            rows.append((name, n, path, releases, ran, refused, worst))
            print(f"| {name} | {n} | {path} | {ran} | {refused} | {worst:.3g} | {dt:.0f} |", flush=True)
    for d in dirs:
        _write(d / "bench_bounds_runaway.csv",
               ["dataset", "n", "path", "releases", "runaways", "refused", "max_spans_out"], rows)


def part_releases(cases, full, args, pools, dirs):
    rows = []
    print(f"\nend-to-end releases ({full} per dataset; {max(full // 10, 1)} at n = 1e4)")
    print("| data | n | path | releases | run-aways | refused | largest distance out (spans) |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for name, n in cases:
        k = full if n <= 500 else max(full // 10, 1)
        for path, ran, refused, worst in full_releases(name, n, k, args.seed, pools):
            rows.append((name, n, path, k, ran, refused, worst))
            print(f"| {name} | {n} | {path} | {k} | {ran} | {refused} | {worst:.3g} |", flush=True)
    for d in dirs:
        _write(d / "bench_bounds_releases.csv",
               ["dataset", "n", "path", "releases", "runaways", "refused", "max_spans_out"], rows)


def part_ratio(reps, args, pools, dirs, names=None):
    rows = []
    print(f"\nerror against data-range bounds (deciles, epsilon = 1, {args.neighboring}; {reps} repetitions at n = 500, "
          f"{max(reps // 10, 2)} at 1e5)")
    print("| data | n | MAE, data range | MAE, bounds-free | ratio (mean) | ratio (median) | refused |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for n in (500, 100_000):
        for name in names or ("normal", "t2", "income", "pages"):
            k = reps if n == 500 else max(reps // 10, 2)
            ref, free, mref, mfree, refused = ratio(name, n, k, args.seed, pools, args.neighboring)
            r, mr = _ratio(free, ref), _ratio(mfree, mref)
            rows.append((name, n, k, ref, free, r, mr, refused))
            print(f"| {name} | {n} | {ref:.4g} | {free:.4g} | {r:.2f} | {mr:.2f} | {refused} |", flush=True)
    for d in dirs:
        _write(d / f"bench_bounds_ratio_{args.neighboring}.csv",
               ["dataset", "n", "reps", "mae_data_range", "mae_bounds_free", "ratio_mean",
                "ratio_median", "refused"], rows)


if __name__ == "__main__":
    raise SystemExit(main())
