"""Benchmark of the median mechanism: accuracy against Laplace-per-query, and query latency.

Run from the repository root (numpy/scipy only, no Spark)::

    .venv/bin/python benchmarks/bench_median_mechanism.py            # both parts, ~2-3 minutes
    .venv/bin/python benchmarks/bench_median_mechanism.py --part latency
    .venv/bin/python benchmarks/bench_median_mechanism.py --plot docs/median_mechanism_accuracy.png

Accuracy: 1e6 synthetic rows over a 1,000-bin domain, a workload of 20,000 random queries (half
CDF ``x <= t``, half range ``a <= x <= b``) at epsilon = 1 (swap, n public). One median-mechanism
session answers the whole workload; its parameters (c, accuracy, candidates) do not depend on the
number of queries, so its answers to the first K queries are exactly what a session asked only K
queries would have released. Laplace-per-query answers each of the K queries with
``Lap(K / (n epsilon))`` (the same total epsilon by basic composition), clipped to [0, 1].

Latency: the time of one easy ``ask`` (mask check, one sparse matrix-vector product over the
candidates, a median by ``np.partition``, the two noisy tests) for N candidates of size k over a
domain of |X| points.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dpq_spark.core.interactive.median_mechanism import AnswerKind, MedianMechanism


def synthetic_histogram(n: int, bins: int, rng: np.random.Generator) -> np.ndarray:
    """A public synthetic dataset: a mixture of two bumps and a uniform floor, binned."""
    parts = [
        rng.normal(0.3 * bins, 0.06 * bins, int(0.6 * n)),
        rng.normal(0.7 * bins, 0.04 * bins, int(0.3 * n)),
    ]
    parts.append(rng.uniform(0, bins, n - sum(len(p) for p in parts)))
    x = np.clip(np.concatenate(parts), 0, bins - 1).astype(np.int64)
    return np.bincount(x, minlength=bins)


def workload(k: int, bins: int, rng: np.random.Generator) -> list:
    idx = np.arange(bins)
    queries = []
    for i in range(k):
        a, b = np.sort(rng.integers(0, bins, size=2))
        queries.append(idx <= b if i % 2 == 0 else (idx >= a) & (idx <= b))
    return queries


def accuracy(args) -> dict:
    rng = np.random.default_rng(args.seed)
    hist = synthetic_histogram(args.rows, args.bins, rng)
    queries = workload(max(args.queries), args.bins, rng)
    truth = np.array([hist[q].sum() for q in queries]) / args.rows
    mech = MedianMechanism(
        hist, epsilon=args.epsilon, accuracy=args.accuracy, max_hard_queries=args.max_hard,
        candidate_size=args.candidate_size, n_candidates=args.n_candidates,
        after_halt="candidate_median", rng=np.random.default_rng(args.seed + 1),
    )
    print(f"median mechanism: epsilon={args.epsilon}, c={args.max_hard}, accuracy={args.accuracy} "
          f"(T={2 * args.accuracy}), {args.n_candidates} sampled candidates of {args.candidate_size} rows")
    print(f"  noise scales: threshold {mech.threshold_noise_scale:.2e}, test {mech.test_noise_scale:.2e}, "
          f"hard answer {mech.answer_noise_scale:.2e}")
    started = time.perf_counter()
    answers = [mech.ask(q) for q in queries]
    elapsed = time.perf_counter() - started
    values = np.array([a.value for a in answers])
    kinds = np.array([a.kind.value for a in answers])
    mm_err = np.abs(values - truth)
    print(f"  {len(queries)} queries in {elapsed:.1f}s ({1e3 * elapsed / len(queries):.2f} ms/query), "
          f"{int((kinds == 'hard').sum())} hard, {int((kinds == 'unverified').sum())} unverified, "
          f"epsilon spent {mech.epsilon_spent:.3f}")
    lap_rng = np.random.default_rng(args.seed + 2)
    rows = []
    print()
    print("| queries K | MM mean err | MM max err | MM hard | Laplace mean err | Laplace max err | winner (max / mean) |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for k in args.queries:
        lap_means, lap_maxes = [], []
        for _ in range(args.laplace_repeats):
            noisy = np.clip(truth[:k] + lap_rng.laplace(0.0, k / (args.rows * args.epsilon), size=k), 0, 1)
            err = np.abs(noisy - truth[:k])
            lap_means.append(err.mean())
            lap_maxes.append(err.max())
        row = dict(k=k, mm_mean=mm_err[:k].mean(), mm_max=mm_err[:k].max(),
                   mm_hard=int((kinds[:k] == "hard").sum()), lap_mean=float(np.mean(lap_means)),
                   lap_max=float(np.mean(lap_maxes)))
        rows.append(row)
        win_max = "MM" if row["mm_max"] < row["lap_max"] else "Laplace"
        win_mean = "MM" if row["mm_mean"] < row["lap_mean"] else "Laplace"
        print(f"| {k} | {row['mm_mean']:.5f} | {row['mm_max']:.5f} | {row['mm_hard']} | "
              f"{row['lap_mean']:.5f} | {row['lap_max']:.5f} | {win_max} / {win_mean} |")
    print(f"(Laplace errors: mean over {args.laplace_repeats} repetitions)")
    return {"rows": rows, "kinds": kinds}


def latency(args) -> None:
    print()
    print("Latency of one easy query (median of timed asks; includes the two noisy tests)")
    print("| |X| | candidates N | size k | nnz = N k | ms/query |")
    print("|---:|---:|---:|---:|---:|")
    rng = np.random.default_rng(args.seed)
    grid = [(10_000, 10_000, 100), (10_000, 1_000, 100), (10_000, 30_000, 100), (10_000, 10_000, 10),
            (10_000, 10_000, 1_000), (1_000, 10_000, 100), (100_000, 10_000, 100)]
    for domain, count, size in grid:
        hist = rng.integers(0, 100, size=domain)
        mech = MedianMechanism(hist, epsilon=1.0, accuracy=0.5, max_hard_queries=1,
                               candidate_size=size, n_candidates=count, rng=np.random.default_rng(1))
        masks = [rng.random(domain) < rng.random() for _ in range(args.latency_queries)]
        mech.ask(masks[0])  # warm up
        times = []
        for m in masks:
            started = time.perf_counter()
            answer = mech.ask(m)
            times.append(time.perf_counter() - started)
            assert answer.kind is AnswerKind.EASY  # T = 1: every test stays below the threshold
        print(f"| {domain} | {count} | {size} | {count * size:.0e} | {1e3 * np.median(times):.2f} |")


def plot(result, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    k = [r["k"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(k, [r["mm_max"] for r in rows], "o-", color="C0", label="median mechanism, max")
    ax.plot(k, [r["mm_mean"] for r in rows], "o--", color="C0", label="median mechanism, mean")
    ax.plot(k, [r["lap_max"] for r in rows], "s-", color="C1", label="Laplace per query, max")
    ax.plot(k, [r["lap_mean"] for r in rows], "s--", color="C1", label="Laplace per query, mean")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("number of queries K (total epsilon = 1)")
    ax.set_ylabel("absolute error (fraction of rows)")
    ax.set_title(f"1e6 rows, {args.bins} bins, CDF and range queries")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)
    print(f"wrote {args.plot}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=["all", "accuracy", "latency"], default="all")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--bins", type=int, default=1_000)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--queries", type=int, nargs="+", default=[100, 300, 1_000, 2_000, 3_000, 10_000, 20_000])
    parser.add_argument("--max-hard", type=int, default=100)
    parser.add_argument("--accuracy", type=float, default=0.003)
    parser.add_argument("--candidate-size", type=int, default=1_000)
    parser.add_argument("--n-candidates", type=int, default=2_000)
    parser.add_argument("--laplace-repeats", type=int, default=20)
    parser.add_argument("--latency-queries", type=int, default=200)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--plot", default=None, help="write an error-vs-queries PNG here")
    args = parser.parse_args()
    if args.part in ("all", "accuracy"):
        result = accuracy(args)
        if args.plot:
            plot(result, args)
    if args.part in ("all", "latency"):
        latency(args)


if __name__ == "__main__":
    main()
