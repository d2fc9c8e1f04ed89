"""Reproduce the accuracy and runtime comparisons of Gillenwater, Joseph and Kulesza (ICML 2021),
Figures 3 and 4, on dpq_spark's own mechanisms.

Accuracy: N(0, 5), U(-5, 5), Goodreads ``average_rating`` and Goodreads ``num_pages`` / 100; each
trial draws 1,000 values (without replacement for Goodreads), bounds [-100, 100], epsilon = 1,
delta = 1e-6 where a mechanism needs it, swap neighbours (the paper's setting), quantiles
``q_j = j / (m + 1)``. Error = missed points: for each quantile the number of data points between
the true quantile (numpy "lower" quantile) and the estimate, summed over the m quantiles (the mean
over quantiles is recorded too).

Runtime: seconds per call on N(0, 5) data, against n at m = 30 and against m at n = 1e5. A
mechanism whose call takes longer than ``--time-cap`` seconds is not run at larger n (noted in the
CSV and the summary).

Usage (the full run behind docs/evaluation.md)::

    .venv/bin/python benchmarks/experiments.py            # writes to out/benchmarks/experiments/
    .venv/bin/python benchmarks/experiments.py --update   # replaces the committed results

By default the CSVs and figures go to a scratch directory, ``out/benchmarks/experiments/``
(``results/`` and ``figures/``; printed at the start), so a run never touches the committed
files. ``--update`` writes them where the docs read them instead: ``benchmarks/results/`` and
``docs/figures/``. ``--out`` and ``--figures`` name other directories.

A small configuration for the test suite: ``--quick`` (never with ``--update``). pandas reads the
CSV; matplotlib (the ``plots`` extra) draws the figures and is skipped with a note when missing.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np

from dpq_spark.core.quantiles.mechanisms import MECHANISMS

REPO = Path(__file__).resolve().parents[1]
DATA_CSV = REPO / "data" / "goodreads_books.csv"
BOUNDS = (-100.0, 100.0)
ORDER = ["joint_exp", "app_ind_exp", "ind_exp", "approx_quantiles", "agg_tree", "smooth", "csmooth"]
LABELS = {
    "joint_exp": "JointExp",
    "ind_exp": "IndExp",
    "app_ind_exp": "AppIndExp",
    "smooth": "Smooth",
    "csmooth": "CSmooth",
    "agg_tree": "AggTree",
    "approx_quantiles": "ApproxQuantiles",
}
STYLE = {
    "joint_exp": ("-", "lightseagreen"),
    "ind_exp": ("--", "mediumpurple"),
    "app_ind_exp": ("--", "darkorange"),
    "smooth": ("-.", "cornflowerblue"),
    "csmooth": ("-.", "violet"),
    "agg_tree": (":", "firebrick"),
    "approx_quantiles": (":", "black"),
}
DATASETS = ["gaussian", "uniform", "ratings", "pages"]
# Where --update writes (the files docs/evaluation.md shows), and the default scratch directory.
COMMITTED_RESULTS = REPO / "benchmarks" / "results"
COMMITTED_FIGURES = REPO / "docs" / "figures"
SCRATCH = REPO / "out" / "benchmarks" / "experiments"


def load_goodreads() -> dict[str, np.ndarray]:
    """The two Goodreads columns (the file has a few malformed lines and a ``"  num_pages"`` header)."""
    import pandas as pd

    frame = pd.read_csv(DATA_CSV, on_bad_lines="skip")
    ratings = pd.to_numeric(frame["average_rating"], errors="coerce").dropna().to_numpy(np.float64)
    pages = pd.to_numeric(frame["  num_pages"], errors="coerce").dropna().to_numpy(np.float64) / 100.0
    return {"ratings": ratings, "pages": pages}


def draw(dataset: str, n: int, rng: np.random.Generator, pools: dict[str, np.ndarray]) -> np.ndarray:
    if dataset == "gaussian":
        return rng.normal(0.0, 5.0, size=n)
    if dataset == "uniform":
        return rng.uniform(-5.0, 5.0, size=n)
    return rng.choice(pools[dataset], size=n, replace=False)


def missed_points(sorted_x: np.ndarray, true_q: np.ndarray, est: np.ndarray) -> np.ndarray:
    """Per quantile, the number of points between the true and the estimated quantile."""
    above_true = sorted_x.size - np.searchsorted(sorted_x, true_q, side="right")
    above_est = sorted_x.size - np.searchsorted(sorted_x, est, side="right")
    return np.abs(above_true - above_est)


def call(name: str, x: np.ndarray, qs: np.ndarray, epsilon: float, delta: float, rng) -> np.ndarray:
    extra = {"delta": delta} if name in ("app_ind_exp", "smooth") else {}
    return MECHANISMS[name](
        x, qs, epsilon=epsilon, lower=BOUNDS[0], upper=BOUNDS[1], neighboring="swap", rng=rng, **extra
    )


def accuracy(args, rng, writer, pools) -> None:
    ms = list(range(1, args.max_m + 1)) + [m for m in args.large_m if m > args.max_m]
    for dataset in args.datasets:
        for trial in range(args.trials):
            x = draw(dataset, args.n, rng, pools)
            xs = np.sort(x)
            for m in ms:
                qs = np.arange(1, m + 1) / (m + 1)
                true_q = np.quantile(xs, qs, method="lower")
                for name in args.mechanisms:
                    start = time.perf_counter()
                    est = call(name, x, qs, args.epsilon, args.delta, rng)
                    seconds = time.perf_counter() - start
                    miss = missed_points(xs, true_q, est)
                    writer.writerow(["accuracy", dataset, trial, args.n, m, name, int(miss.sum()), float(miss.mean()), seconds, ""])
        print(f"accuracy: {dataset} done", flush=True)


def runtime(args, rng, writer) -> list[str]:
    notes = []
    slow: set[str] = set()
    for n in args.runtime_n:
        x = rng.normal(0.0, 5.0, size=n)
        qs = np.arange(1, args.runtime_m + 1) / (args.runtime_m + 1)
        for name in args.mechanisms:
            if name in slow:
                writer.writerow(["runtime_n", "gaussian", 0, n, args.runtime_m, name, "", "", "", "skipped: slower than cap at smaller n"])
                continue
            reps = max(1, min(args.reps, int(1e6 // n)))
            times = []
            for rep in range(reps):
                start = time.perf_counter()
                call(name, x, qs, args.epsilon, args.delta, rng)
                times.append(time.perf_counter() - start)
                writer.writerow(["runtime_n", "gaussian", rep, n, args.runtime_m, name, "", "", times[-1], ""])
            if min(times) > args.time_cap:
                slow.add(name)
                notes.append(f"{name}: {min(times):.1f} s at n={n:g} (> cap {args.time_cap:g} s), larger n skipped")
        print(f"runtime: n={n:g} done", flush=True)
    x = rng.normal(0.0, 5.0, size=args.runtime_m_n)
    for m in args.runtime_ms:
        qs = np.arange(1, m + 1) / (m + 1)
        for name in args.mechanisms:
            for rep in range(args.reps):
                start = time.perf_counter()
                call(name, x, qs, args.epsilon, args.delta, rng)
                writer.writerow(["runtime_m", "gaussian", rep, args.runtime_m_n, m, name, "", "", time.perf_counter() - start, ""])
    print("runtime: m sweep done", flush=True)
    return notes


def summarise(trials_csv: Path, runtime_csv: Path | None, show_m: list[int]) -> str:
    import pandas as pd

    lines = []
    acc = pd.read_csv(trials_csv) if trials_csv.exists() else pd.DataFrame()  # --skip-accuracy
    if len(acc):
        table = acc.groupby(["dataset", "m", "mechanism"])["missed_sum"].mean().unstack("mechanism")
        cols = [c for c in ORDER if c in table.columns]
        lines.append("Mean missed points (summed over the m quantiles), by dataset and m:")
        for dataset in [d for d in DATASETS if d in table.index.get_level_values(0)]:
            sub = table.loc[dataset]
            sub = sub.loc[[m for m in show_m if m in sub.index], cols]
            lines.append(f"\n[{dataset}]\n" + sub.round(1).to_string())
    if runtime_csv is not None:
        rt = pd.read_csv(runtime_csv)
        rt = rt[rt["seconds"].notna()]
        for kind, key in (("runtime_n", "n"), ("runtime_m", "m")):
            part = rt[rt["experiment"] == kind]
            if len(part):
                tab = part.groupby([key, "mechanism"])["seconds"].median().unstack("mechanism")
                cols = [c for c in ORDER if c in tab.columns]
                lines.append(f"\nMedian seconds per call ({kind}):\n" + tab[cols].to_string(float_format=lambda v: f"{v:.4g}"))
    return "\n".join(lines)


def plot(trials_csv: Path, runtime_csv: Path | None, fig_dir: Path, max_m: int) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install 'dpq_spark[plots]'): no figures", file=sys.stderr)
        return []
    import pandas as pd

    fig_dir.mkdir(parents=True, exist_ok=True)
    written = []
    acc = pd.read_csv(trials_csv) if trials_csv.exists() else pd.DataFrame({"m": []})
    for suffix, sel in (("", acc["m"] <= max_m), ("_large_m", acc["m"] >= 1)):
        data = acc[sel]
        if not len(data) or (suffix and data["m"].max() <= max_m):
            continue
        mean = data.groupby(["dataset", "m", "mechanism"])["missed_sum"].mean()
        datasets = [d for d in DATASETS if d in data["dataset"].unique()]
        fig, axes = plt.subplots(1, len(datasets), figsize=(4.2 * len(datasets), 3.6), squeeze=False)
        for ax, dataset in zip(axes[0], datasets):
            for name in [c for c in ORDER if c in data["mechanism"].unique()]:
                series = mean.loc[dataset].xs(name, level="mechanism")
                style, color = STYLE[name]
                ax.plot(series.index, series.values, linestyle=style, color=color, label=LABELS[name], linewidth=2)
            ax.set_yscale("log")
            ax.set_title(dataset)
            ax.set_xlabel("# quantiles m")
        axes[0][0].set_ylabel("missed points (sum over quantiles)")
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
        fig.tight_layout(rect=(0, 0.1, 1, 1))
        path = fig_dir / f"error_vs_m{suffix}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    if runtime_csv is not None:
        rt = pd.read_csv(runtime_csv)
        rt = rt[rt["seconds"].notna()]
        for kind, key, label in (("runtime_n", "n", "n (m = 30)"), ("runtime_m", "m", "m (n = 1e5)")):
            part = rt[rt["experiment"] == kind]
            if not len(part):
                continue
            med = part.groupby([key, "mechanism"])["seconds"].median()
            fig, ax = plt.subplots(figsize=(5.5, 4))
            for name in [c for c in ORDER if c in part["mechanism"].unique()]:
                series = med.xs(name, level="mechanism")
                style, color = STYLE[name]
                ax.plot(series.index, series.values, linestyle=style, color=color, marker="o", label=LABELS[name])
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(label)
            ax.set_ylabel("seconds per call (median)")
            ax.legend(fontsize=8)
            fig.tight_layout()
            path = fig_dir / f"time_vs_{key}.png"
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    return written


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a seconds-long configuration (tests)")
    p.add_argument("--seed", type=int, default=20210301)
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--max-m", type=int, default=30)
    p.add_argument("--large-m", type=int, nargs="*", default=[40, 50, 60, 70, 80, 90, 100])
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--datasets", nargs="*", default=DATASETS, choices=DATASETS)
    p.add_argument("--mechanisms", nargs="*", default=ORDER, choices=list(MECHANISMS))
    p.add_argument("--runtime-n", type=float, nargs="*", default=[1e3, 1e4, 1e5, 1e6, 1e7])
    p.add_argument("--runtime-m", type=int, default=30)
    p.add_argument("--runtime-m-n", type=int, default=100_000)
    p.add_argument("--runtime-ms", type=int, nargs="*", default=[1, 2, 5, 10, 20, 30, 50, 100])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--time-cap", type=float, default=60.0)
    p.add_argument("--skip-accuracy", action="store_true")
    p.add_argument("--skip-runtime", action="store_true")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--update", action="store_true",
                   help="write to benchmarks/results and docs/figures (the committed files) "
                        f"instead of the scratch directory {SCRATCH.relative_to(REPO)}")
    p.add_argument("--out", type=Path, default=None,
                   help="directory for the CSVs (default: SCRATCH/results, or the committed one with --update)")
    p.add_argument("--figures", type=Path, default=None,
                   help="directory for the figures (default: SCRATCH/figures, or docs/figures with --update)")
    args = p.parse_args(argv)
    if args.update and args.quick:
        p.error("--update replaces the committed results: not with --quick")
    if args.out is None:
        args.out = COMMITTED_RESULTS if args.update else SCRATCH / "results"
    if args.figures is None:
        args.figures = COMMITTED_FIGURES if args.update else SCRATCH / "figures"
    if args.quick:
        args.trials, args.n, args.max_m, args.large_m = 2, 200, 3, [5]
        args.runtime_n, args.runtime_m_n, args.runtime_ms, args.reps = [1e3, 2e3], 2000, [1, 4], 1
    args.runtime_n = [int(v) for v in args.runtime_n]
    return args


HEADER = ["experiment", "dataset", "trial", "n", "m", "mechanism", "missed_sum", "missed_mean", "seconds", "note"]


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"results: {args.out}")
    if not args.no_plots:
        print(f"figures: {args.figures}")
    if not args.update:
        print("(the committed results are left as they are; --update replaces them)")
    rng = np.random.default_rng(args.seed)  # experiments are reproducible; the library never seeds
    pools = load_goodreads() if any(d in ("ratings", "pages") for d in args.datasets) else {}
    trials_csv = args.out / "accuracy_trials.csv"
    runtime_csv = None if args.skip_runtime else args.out / "runtime.csv"
    notes = []
    if not args.skip_accuracy:
        with open(trials_csv, "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(HEADER)
            accuracy(args, rng, writer, pools)
    if runtime_csv is not None:
        with open(runtime_csv, "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(HEADER)
            notes = runtime(args, rng, writer)
    show = sorted({1, 2, 3, 5, 10, 15, 20, 25, 30, *args.large_m} & set(range(1, 10**6)))
    print(summarise(trials_csv, runtime_csv, show))
    for note in notes:
        print("note:", note)
    if not args.no_plots:
        for path in plot(trials_csv, runtime_csv, args.figures, args.max_m):
            print("figure:", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
