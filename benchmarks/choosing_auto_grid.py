"""Which quantile mechanism wins, by m, n * epsilon and the data's public grid: the table behind ``"auto"``.

Run from the repository root (core only, no Spark)::

    .venv/bin/python benchmarks/choosing_auto_grid.py --quick     # a smoke run: a few cases, few repetitions
    .venv/bin/python benchmarks/choosing_auto_grid.py             # the whole grid of cases
    .venv/bin/python benchmarks/choosing_auto_grid.py --from-csv out/benchmarks/choosing_auto_grid/errors.csv
                                                                  # the ratio table again, no new runs
    .venv/bin/python benchmarks/choosing_auto_grid.py --only continuous --ms 99,199 --update --merge
                                                                  # some cases again, the others kept

The grid of cases (every combination, bounds given):

data        ``continuous``: N(0, 5), bounds [-100, 100], no granularity (the default grid of 2**32
            steps); ``decimal``: round(clip(N(3.8, 0.8), 0, 5), 2), bounds [0, 5], granularity 0.01
            (G = 501 grid points); ``integral``: clip(round(N(40, 15)), 0, 100), bounds [0, 100],
            granularity 1 (G = 101); ``wide_integral``: clip(round(N(4000, 1500)), 0, 1e4), bounds
            [0, 1e4], granularity 1 (G = 10,001)
m           1, 3, 9, 29, 99, 199 quantiles, evenly spaced: ``q_j = j / (m + 1)``
n epsilon   10, 100, 1e3, 1e4, 1e5, 1e6, 1e7 as (n, epsilon) = (1e3, 0.01), (1e3, 0.1), (1e3, 1),
            (1e4, 1), (1e4, 10), (1e5, 10), (1e5, 100): n stops at 1e5 to keep the run affordable,
            so the two largest sizes use a large epsilon
mechanism   ``joint_exp``, ``ind_exp``, ``approx_quantiles``, ``agg_tree``, ``histogram``,
            ``agg_tree_8x3``, ``agg_tree_8x4``, ``agg_tree_12x3`` (their defaults, add/remove neighbours,
            ``granularity`` passed when the data has one)

Each repetition draws a fresh dataset (seed = repetition) and one release per mechanism (seeded
generator); the error is the mean over the m quantiles of ``|released - true|``, the true quantile
being ``numpy.quantile(x, q, method="inverted_cdf")`` (a data point). The table gives the mean over
the repetitions and its standard error. Repetitions per m: 80, 60, 40, 24, 12, 8 (``--reps-scale``
multiplies them).

``auto``'s column is the error of the mechanism
:func:`~dpq_spark.core.quantiles.choose.choose_mechanism` picks for the case's public inputs: with
``n_hint = n`` (or under swap) :func:`~dpq_spark.core.quantiles.choose.auto` runs exactly that
mechanism with the same draws (``tests/core/quantiles/test_auto_grid.py`` checks it), so it is
read from the table rather than run again. The script prints, per case, the best mechanism, auto's
pick and the ratio of auto's error to the best one's, and writes ``errors.csv`` (every mechanism)
and ``ratios.csv`` to ``out/benchmarks/choosing_auto_grid/`` (``--update``: to
``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from dpq_spark.core.quantiles._pure import get_base_mechanism  # noqa: E402
from dpq_spark.core.quantiles.choose import choose_mechanism, grid_points  # noqa: E402

MECHANISMS = ("joint_exp", "ind_exp", "approx_quantiles", "agg_tree", "histogram",
              "agg_tree_8x3", "agg_tree_8x4", "agg_tree_12x3")  # appended: earlier seeds unchanged
MS = (1, 3, 9, 29, 99, 199)
REPS = {1: 80, 3: 60, 9: 40, 29: 24, 99: 12, 199: 8}
SIZES = ((1_000, 0.01), (1_000, 0.1), (1_000, 1.0), (10_000, 1.0), (10_000, 10.0),
         (100_000, 10.0), (100_000, 100.0))
DATA = {  # name: (lower, upper, granularity)
    "continuous": (-100.0, 100.0, None),
    "decimal": (0.0, 5.0, 0.01),
    "integral": (0.0, 100.0, 1.0),
    "wide_integral": (0.0, 10_000.0, 1.0),
}


def draw(kind: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, n, len(kind)])
    if kind == "continuous":
        return rng.normal(0.0, 5.0, n)
    if kind == "decimal":
        return np.round(np.clip(rng.normal(3.8, 0.8, n), 0.0, 5.0), 2)
    if kind == "integral":
        return np.clip(np.round(rng.normal(40.0, 15.0, n)), 0.0, 100.0)
    return np.clip(np.round(rng.normal(4_000.0, 1_500.0, n)), 0.0, 10_000.0)


def measure(kind, m, n, eps, reps):
    """Mean absolute error (mean, standard error) of every mechanism on one case."""
    lower, upper, g = DATA[kind]
    q = np.arange(1, m + 1) / (m + 1)
    extra = {} if g is None else {"granularity": g}
    errs = {name: [] for name in MECHANISMS}
    for rep in range(reps):
        x = draw(kind, n, rep)
        true = np.quantile(x, q, method="inverted_cdf")
        values, counts = np.unique(x, return_counts=True)  # same release as on x, faster
        for k, name in enumerate(MECHANISMS):
            rng = np.random.default_rng([rep, m, n, k, 7])
            out = get_base_mechanism(name)(values, q, epsilon=eps, lower=lower, upper=upper,
                                           counts=counts, rng=rng, **extra)
            err = np.abs(np.asarray(out) - true)
            err[err < 1e-9 * (upper - lower)] = 0.0  # float64 rounding of equal grid points
            errs[name].append(float(np.mean(err)))
    return {name: (float(np.mean(e)), float(np.std(e, ddof=1) / math.sqrt(len(e))))
            for name, e in errs.items()}


def ratio_rows(rows):
    """Per case: best mechanism, auto's pick (the current rule) and auto's error over the best."""
    cases = {}
    for r in rows:
        span = DATA[r["data"]][1] - DATA[r["data"]][0]
        mae = float(r["mae"])
        mae = 0.0 if mae < 1e-9 * span else mae  # float64 rounding only: the exact grid points
        cases.setdefault((r["data"], int(r["m"]), int(r["n"]), float(r["epsilon"])), {})[r["mechanism"]] = (
            mae, float(r["se"]))
    out = []
    order = sorted(cases.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] * kv[0][3]))
    for (kind, m, n, eps), errs in order:
        lower, upper, g = DATA[kind]
        best = min(errs, key=lambda k: errs[k][0])
        pick = choose_mechanism(m, n=n, epsilon=eps, grid_size=grid_points(lower, upper, g),
                                granularity=g)
        out.append({"data": kind, "m": m, "n": n, "epsilon": eps, "size": n * eps, "best": best,
                    "best_mae": errs[best][0], "best_se": errs[best][1], "auto": pick,
                    "auto_mae": errs[pick][0], "auto_se": errs[pick][1],
                    "ratio": errs[pick][0] / errs[best][0] if errs[best][0] > 0 else
                    (1.0 if errs[pick][0] == 0 else math.inf),
                    # worse by more than twice the standard error of the difference
                    "significant": errs[pick][0] - errs[best][0]
                    > 2 * math.hypot(errs[pick][1], errs[best][1])})
    return out


def write_csv(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def score(ratios, tolerance=1.15):
    """The cases where auto is within ``tolerance`` times the best, and those where it is worse
    by more than that and by more than two standard errors."""
    within = sum(r["ratio"] <= tolerance for r in ratios)
    return within, [r for r in ratios if r["ratio"] > tolerance and r["significant"]]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="m in {1, 9, 99}, n epsilon in {100, 1e4, 1e6}, a quarter of the repetitions")
    parser.add_argument("--reps-scale", type=float, default=1.0)
    parser.add_argument("--only", default=",".join(DATA), help="comma-separated data kinds")
    parser.add_argument("--ms", default=None, help="comma-separated m (default: all of the grid)")
    parser.add_argument("--from-csv", default=None, help="recompute the ratios from an errors.csv")
    parser.add_argument("--update", action="store_true", help="write to benchmarks/results/")
    parser.add_argument("--merge", action="store_true",
                        help="with --update: keep the stored cases this run does not measure")
    parser.add_argument("--out", default=os.path.join(ROOT, "out", "benchmarks", "choosing_auto_grid"),
                        help="output folder (without --update)")
    args = parser.parse_args(argv)
    out_dir = os.path.join(ROOT, "benchmarks", "results") if args.update else args.out
    prefix = "choosing_auto_grid_" if args.update else ""

    if args.from_csv:
        with open(args.from_csv) as f:
            rows = list(csv.DictReader(f))
    else:
        ms, sizes, scale = MS, SIZES, args.reps_scale
        if args.quick:
            ms, sizes, scale = (1, 9, 99), (SIZES[1], SIZES[3], SIZES[5]), scale / 4
        if args.ms:
            ms = tuple(int(v) for v in args.ms.split(","))
        rows, kept = [], []
        if args.merge:  # the stored cases outside this run's grid stay as they were measured
            with open(os.path.join(out_dir, prefix + "errors.csv")) as f:
                kept = list(csv.DictReader(f))
            mine = {(kind, str(m), str(n), str(eps)) for kind in args.only.split(",")
                    for n, eps in sizes for m in ms}
            kept = [r for r in kept if (r["data"], r["m"], r["n"], r["epsilon"]) not in mine]
        for kind in args.only.split(","):
            for n, eps in sizes:
                for m in ms:
                    t = time.perf_counter()
                    reps = max(3, round(next(r for k, r in REPS.items() if m <= k or k == 199) * scale))
                    for name, (mae, se) in measure(kind, m, n, eps, reps).items():
                        rows.append({"data": kind, "m": m, "n": n, "epsilon": eps, "mechanism": name,
                                     "reps": reps, "mae": f"{mae:.6g}", "se": f"{se:.3g}"})
                    print(f"{kind:10s} m={m:3d} n={n:6d} eps={eps:g}: {time.perf_counter() - t:.1f} s",
                          file=sys.stderr, flush=True)
                    write_csv(os.path.join(out_dir, prefix + "errors.csv"), kept + rows)
        rows = kept + rows
    ratios = ratio_rows(rows)
    if not args.from_csv or args.update:
        write_csv(os.path.join(out_dir, prefix + "ratios.csv"),
                  [{k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()} for r in ratios])
    print("| data | m | n epsilon | best (MAE +- se) | auto's pick (MAE +- se) | ratio |")
    print("|---|---:|---:|---|---|---:|")
    for r in ratios:
        mark = " *" if r["significant"] else ""
        print(f"| {r['data']} | {r['m']} | {r['size']:g} "
              f"| {r['best']} {r['best_mae']:.3g} +- {r['best_se']:.2g} "
              f"| {r['auto']} {r['auto_mae']:.3g} +- {r['auto_se']:.2g} | {r['ratio']:.2f}{mark} |")
    within, worse = score(ratios)
    print(f"\nauto within 1.15x of the best on {within} of {len(ratios)} cases; beyond it by more than "
          f"two standard errors (*) on {len(worse)}: "
          + ", ".join(f"{r['data']} m={r['m']} s={r['size']:g} ({r['ratio']:.2f})" for r in worse))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
