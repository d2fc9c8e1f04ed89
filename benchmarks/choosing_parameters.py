"""Figures and tables for docs/choosing_parameters.md (numpy only, a few minutes on 2 cores).

    .venv/bin/python benchmarks/choosing_parameters.py                  # all parts
    .venv/bin/python benchmarks/choosing_parameters.py --part bounds_free --reps 10
    .venv/bin/python benchmarks/choosing_parameters.py --update         # replace docs/img/

Figures and CSVs go to a scratch directory, ``out/benchmarks/choosing_parameters/`` (printed),
unless ``--update`` is given: then to ``docs/img/``, the committed files the page shows.
``--out DIR`` names another directory.

Parts (deciles unless said otherwise; mean absolute error of the released values, averaged over
quantiles and repetitions; fixed seed):

- ``epsilon``: JointExp, 1,000 N(0, 5) values, bounds +-100, epsilon from 0.05 to 10.
- ``m``: mean missed points against m for the four pure mechanisms, read from
  ``benchmarks/results/accuracy_trials.csv`` (docs/evaluation.md's run: n = 1000, epsilon = 1).
- ``crossover``: missed points of JointExp, ApproxQuantiles and AggTree at m = 20..80 for three
  values of n * epsilon (the check behind ``mechanism="auto"``).
- ``looseness``: JointExp, 30 quantiles of 1,000 N(0, 5) values, epsilon = 1, bounds +-B for B from 20 to 1e6,
  against bounds-free (private bounds, 20% of epsilon).
- ``bounds_free``: bounds-free deciles against the data's own range as bounds, at epsilon = 1 and
  n = 500 and 1e5, swap neighbours (n public, the paper's setting), on N(0, 5), Goodreads ``average_rating`` (sampled with replacement to 1e5) and
  log-normal incomes (median 45,000, sigma 0.9: a public description of US household incomes; no
  download).
- ``tiny``: few rows. For n = 5..50 N(0, 5) values, epsilon = 0.95 (auto's share after its
  count), m = 2..99 and bounds +-10, +-50, +-5e4: the mean absolute error and mean missed points
  of the 16-bin ``histogram`` divided by those of the mechanism the rule picked before the
  histogram existed (the check behind ``mechanism="auto"``'s ``n * epsilon < 25`` rule).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "docs" / "img"  # what docs/choosing_parameters.md shows; written with --update
SCRATCH = REPO / "out" / "benchmarks" / "choosing_parameters"
sys.path.insert(0, str(REPO / "benchmarks"))

from dpq_spark.core.quantiles.mechanisms import MECHANISMS, get_base_mechanism  # noqa: E402

DECILES = np.arange(1, 10) / 10
PARTS = ("epsilon", "m", "crossover", "looseness", "bounds_free", "tiny")


def _ratings() -> np.ndarray:
    from experiments import load_goodreads

    return load_goodreads()["ratings"]


def dataset(name: str, n: int, rng: np.random.Generator, pools: dict) -> np.ndarray:
    if name == "normal":
        return rng.normal(0.0, 5.0, n)
    if name == "ratings":
        pool = pools.setdefault("ratings", _ratings())
        return rng.choice(pool, n, replace=n > pool.size)
    if name == "income":
        return rng.lognormal(np.log(45_000.0), 0.9, n)
    raise ValueError(name)


def mae(est, x, q) -> float:
    return float(np.mean(np.abs(np.asarray(est) - np.quantile(x, q, method="lower"))))


def part_epsilon(rng, reps, out):
    je = get_base_mechanism("joint_exp")
    rows = []
    for eps in (0.05, 0.1, 0.3, 1.0, 3.0, 10.0):
        errs = []
        for _ in range(reps):
            x = rng.normal(0, 5, 1000)
            errs.append(mae(je(x, DECILES, epsilon=eps, lower=-100, upper=100, rng=rng), x, DECILES))
        rows.append((eps, np.mean(errs)))
        print(f"epsilon {eps}: MAE {np.mean(errs):.4g}", flush=True)
    _plot(out / "choose_error_vs_epsilon.png", [r[0] for r in rows], {"JointExp, deciles": [r[1] for r in rows]},
          "epsilon", "mean absolute error", "N(0, 5), n = 1000, bounds +-100", logx=True)
    return rows


def part_m(out):
    import pandas as pd

    a = pd.read_csv(REPO / "benchmarks" / "results" / "accuracy_trials.csv")
    names = ["joint_exp", "ind_exp", "approx_quantiles", "agg_tree"]
    a = a[a.mechanism.isin(names)]
    g = a.groupby(["m", "dataset", "mechanism"]).missed_mean.mean().unstack("mechanism")
    gm = np.exp(np.log(g.clip(lower=1e-9)).groupby("m").mean())
    _plot(out / "choose_error_vs_m.png", list(gm.index), {k: list(gm[k]) for k in names},
          "m (number of quantiles)", "missed points per quantile (geometric mean of 4 datasets)",
          "n = 1000, epsilon = 1 (docs/evaluation.md's run)", logy=True)
    return gm


def part_crossover(rng, reps):
    rows = []
    for n, eps in ((1000, 0.25), (1000, 1.0), (10_000, 1.0)):
        for m in (20, 30, 40, 50, 60, 80):
            q = np.arange(1, m + 1) / (m + 1)
            res = {}
            for name in ("joint_exp", "approx_quantiles", "agg_tree"):
                mech = get_base_mechanism(name)
                missed = []
                for _ in range(reps):
                    x = np.sort(rng.normal(0, 5, n))
                    est = mech(x, q, epsilon=eps, lower=-100, upper=100, neighboring="swap", rng=rng)
                    true = np.quantile(x, q, method="lower")
                    missed.append(np.abs(np.searchsorted(x, est) - np.searchsorted(x, true)).sum())
                res[name] = float(np.mean(missed))
            best = min(res, key=res.get)
            rows.append((n * eps, m, res, best))
            print(f"n*eps={n * eps:g} m={m}: " + ", ".join(f"{k} {v:.0f}" for k, v in res.items())
                  + f" -> {best}", flush=True)
    return rows


def _rule_without_histogram(m, n, epsilon):
    """``choose_mechanism`` as it was before the histogram rule (``m > 1``)."""
    from dpq_spark.core.quantiles import choose

    factor = (max(float(n), 1.0) * epsilon / choose._REF) ** choose._POWER
    if m <= max(2.0, choose._M1 * factor):
        return "joint_exp"
    if m <= max(2.0, choose._M2 * factor):
        return "approx_quantiles"
    return "agg_tree"


def part_tiny(rng, reps, out):
    rows = []
    eps = 0.95
    histogram = get_base_mechanism("histogram")
    for m in (2, 3, 5, 9, 19, 49, 99):
        q = np.arange(1, m + 1) / (m + 1)
        for n in (5, 10, 20, 30, 50):
            before = _rule_without_histogram(m, n, eps)
            mech = get_base_mechanism(before)
            line = []
            for bound in (10.0, 50.0, 5e4):
                err = np.zeros(4)
                for _ in range(reps):
                    x = np.sort(rng.normal(0, 5, n))
                    truth = np.quantile(x, q, method="inverted_cdf")
                    target = np.floor(q * n)
                    for i, f in enumerate((mech, histogram)):
                        est = np.asarray(f(x, q, epsilon=eps, lower=-bound, upper=bound, rng=rng))
                        err[2 * i] += np.abs(est - truth).mean()
                        err[2 * i + 1] += np.abs(np.searchsorted(x, est) - target).mean()
                mae, missed = err[2] / err[0], err[3] / err[1]
                rows.append((m, n, before, bound, mae, missed))
                line.append(f"+-{bound:g}: MAE {mae:.2f}x, missed {missed:.2f}x")
            print(f"m={m} n={n} (was {before}): histogram / was  " + " | ".join(line), flush=True)
    with open(out / "choose_tiny.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["m", "n", "previous_choice", "bound", "mae_ratio", "missed_ratio"])
        w.writerows(rows)
    return rows


def part_looseness(rng, reps, out, m=30):
    je = get_base_mechanism("joint_exp")
    free = MECHANISMS["joint_exp"]
    q = np.arange(1, m + 1) / (m + 1)
    widths = (20.0, 100.0, 1e3, 1e4, 1e5, 1e6)
    bounded, free_err = [], []
    for b in widths:
        errs = []
        for _ in range(reps):
            x = rng.normal(0, 5, 1000)
            errs.append(mae(je(x, q, epsilon=1.0, lower=-b, upper=b, rng=rng), x, q))
        bounded.append(float(np.mean(errs)))
    f = []
    for _ in range(reps):
        x = rng.normal(0, 5, 1000)
        f.append(mae(free(x, q, epsilon=1.0, rng=rng), x, q))
    free_err = [float(np.mean(f))] * len(widths)
    for b, e in zip(widths, bounded):
        print(f"bounds +-{b:g}: MAE {e:.4g}", flush=True)
    print(f"bounds-free: MAE {free_err[0]:.4g}", flush=True)
    _plot(out / "choose_error_vs_looseness.png", list(widths),
          {"bounds +-B": bounded, "bounds-free (20% of epsilon on bounds)": free_err},
          "B", "mean absolute error", f"JointExp, {m} quantiles, N(0, 5), n = 1000, epsilon = 1",
          logx=True, logy=True)
    return list(zip(widths, bounded)), free_err[0]


def part_bounds_free(rng, reps, out, pools):
    je = get_base_mechanism("joint_exp")
    free = MECHANISMS["joint_exp"]
    rows = []
    for n, r in ((500, reps), (100_000, max(3, reps // 4))):
        for name in ("normal", "ratings", "income"):
            e_range, e_free = [], []
            for _ in range(r):
                x = dataset(name, n, rng, pools)
                e_range.append(mae(je(x, DECILES, epsilon=1.0, lower=x.min(), upper=x.max(),
                                      neighboring="swap", rng=rng), x, DECILES))
                e_free.append(mae(free(x, DECILES, epsilon=1.0, neighboring="swap", rng=rng), x, DECILES))
            row = (name, n, r, float(np.mean(e_range)), float(np.mean(e_free)),
                   float(np.median(e_range)), float(np.median(e_free)))
            rows.append(row)
            print(f"{name} n={n} ({r} reps): mean MAE data range {row[3]:.4g}, bounds-free {row[4]:.4g}, "
                  f"ratio {row[4] / row[3]:.2f}; median ratio {row[6] / row[5]:.2f}", flush=True)
    labels = [f"{r[0]}\nn={r[1]:g}" for r in rows]
    _bars(out / "choose_bounds_free.png", labels, [min(r[4] / r[3], 5.0) for r in rows])
    return rows


def _plot(path, x, series, xlabel, ylabel, title, logx=False, logy=False):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, y in series.items():
        ax.plot(x, y, marker="o", label=label)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bars(path, labels, ratios):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(range(len(ratios)), ratios)
    ax.axhline(1.5, color="red", linestyle="--", label="1.5x target")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks(range(len(ratios)), labels, fontsize=8)
    ax.set_ylabel("mean MAE ratio, bounds-free / data range (capped at 5)")
    ax.set_title("JointExp deciles, epsilon = 1 (bounds-free: 20% of epsilon on private bounds)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=20261130)
    parser.add_argument("--update", action="store_true",
                        help="write to docs/img (the committed figures) instead of the scratch directory")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"output directory (default: {SCRATCH.relative_to(REPO)}, or docs/img with --update)")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = COMMITTED if args.update else SCRATCH
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"figures and tables: {args.out}")
    if not args.update:
        print("(docs/img is left as it is; --update replaces it)")
    rng = np.random.default_rng(args.seed)
    pools: dict = {}
    results = {}
    if "epsilon" in args.part:
        results["epsilon"] = part_epsilon(rng, args.reps, args.out)
    if "m" in args.part:
        results["m"] = part_m(args.out)
    if "crossover" in args.part:
        results["crossover"] = part_crossover(rng, max(3, args.reps // 4))
    if "looseness" in args.part:
        results["looseness"] = part_looseness(rng, args.reps, args.out)
    if "tiny" in args.part:
        results["tiny"] = part_tiny(rng, max(20, args.reps * 6), args.out)
    if "bounds_free" in args.part:
        rows = part_bounds_free(rng, args.reps, args.out, pools)
        with open(args.out / "choose_bounds_free.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["dataset", "n", "reps", "mae_data_range", "mae_bounds_free",
                        "median_mae_data_range", "median_mae_bounds_free"])
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
