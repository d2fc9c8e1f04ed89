"""Planned median-mechanism sessions on three workloads, against Laplace per query.

Run from the repository root (numpy/scipy only, no Spark)::

    .venv/bin/python benchmarks/bench_planned_sessions.py               # ~2-4 minutes
    .venv/bin/python benchmarks/bench_planned_sessions.py --queries 2000 --rows 100000

Each session is created with ``expected_queries=K`` only: the planner
(:func:`dpq_spark.core.interactive.planner.plan_median_session`) picks ``accuracy`` and ``max_hard_queries``
from |X|, n, epsilon and K, and the plan is printed before the first query. Workloads (public
synthetic data, epsilon = 1, swap neighbours, n public):

1. ``1d``: 1,000 bins; half CDF queries ``x <= t``, half ranges ``a <= x <= b``;
2. ``2d``: a 32 x 32 grid; random axis-aligned rectangles;
3. ``cat_num``: 8 categories x 128 numeric bins; a random set of categories and a numeric range.

Laplace per query answers each of the K queries with ``Lap(K / (n epsilon))`` (same total epsilon
by basic composition), clipped to [0, 1]. Errors are absolute fractions of the rows.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dpq_spark.core.interactive.median_mechanism import MedianMechanism

WORKLOADS = ("1d", "2d", "cat_num")


def histogram(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """A public synthetic dataset of ``n`` rows over the workload's domain, as counts."""
    if name == "1d":
        bins = 1000
        parts = [rng.normal(0.3 * bins, 0.06 * bins, int(0.6 * n)),
                 rng.normal(0.7 * bins, 0.04 * bins, int(0.3 * n))]
        parts.append(rng.uniform(0, bins, n - sum(len(p) for p in parts)))
        x = np.clip(np.concatenate(parts), 0, bins - 1).astype(np.int64)
        return np.bincount(x, minlength=bins)
    if name == "2d":
        side = 32
        half = n // 2
        a = rng.multivariate_normal([10, 12], [[16, 10], [10, 16]], half)
        b = rng.multivariate_normal([22, 20], [[9, -4], [-4, 25]], n - half)
        xy = np.clip(np.concatenate([a, b]), 0, side - 1).astype(np.int64)
        return np.bincount(xy[:, 0] * side + xy[:, 1], minlength=side * side)
    if name == "cat_num":
        cats, bins = 8, 128
        weights = np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02])
        cat = rng.choice(cats, size=n, p=weights)
        centre = 20 + 12 * cat
        num = np.clip(rng.gamma(3.0, 6.0, n) + centre - 18, 0, bins - 1).astype(np.int64)
        return np.bincount(cat * bins + num, minlength=cats * bins)
    raise ValueError(f"`name` must be one of {WORKLOADS}, got {name!r}")


def queries(name: str, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``k`` random public predicates (boolean masks) of the workload."""
    out = []
    if name == "1d":
        idx = np.arange(1000)
        for i in range(k):
            a, b = np.sort(rng.integers(0, 1000, size=2))
            out.append(idx <= b if i % 2 == 0 else (idx >= a) & (idx <= b))
    elif name == "2d":
        x, y = np.divmod(np.arange(1024), 32)
        for _ in range(k):
            x0, x1 = np.sort(rng.integers(0, 32, size=2))
            y0, y1 = np.sort(rng.integers(0, 32, size=2))
            out.append((x >= x0) & (x <= x1) & (y >= y0) & (y <= y1))
    elif name == "cat_num":
        cat, num = np.divmod(np.arange(8 * 128), 128)
        for _ in range(k):
            chosen = rng.random(8) < 0.4
            if not chosen.any():
                chosen[rng.integers(0, 8)] = True
            a, b = np.sort(rng.integers(0, 128, size=2))
            out.append(chosen[cat] & (num >= a) & (num <= b))
    else:
        raise ValueError(f"`name` must be one of {WORKLOADS}, got {name!r}")
    return out


def run(name: str, *, rows: int, k: int, epsilon: float, seed: int, candidate_size: int = 1000,
        n_candidates: int = 2000, verbose: bool = True) -> dict:
    """One planned session of ``k`` queries and the Laplace baseline; returns the summary."""
    rng = np.random.default_rng(seed)
    hist = histogram(name, rows, rng)
    qs = queries(name, k, rng)
    truth = np.array([hist[q].sum() for q in qs]) / rows
    mech = MedianMechanism(hist, epsilon=epsilon, expected_queries=k, candidate_size=candidate_size,
                           n_candidates=n_candidates, after_halt="candidate_median",
                           rng=np.random.default_rng(seed + 1))
    if verbose:
        print(f"== workload {name}")
        print(mech.plan)
    started = time.perf_counter()
    answers = [mech.ask(q) for q in qs]
    seconds = time.perf_counter() - started
    values = np.array([a.value for a in answers])
    kinds = np.array([a.kind.value for a in answers])
    mm_err = np.abs(values - truth)
    lap_rng = np.random.default_rng(seed + 2)
    lap = np.clip(truth + lap_rng.laplace(0.0, k / (rows * epsilon), size=k), 0.0, 1.0)
    lap_err = np.abs(lap - truth)
    out = {
        "workload": name, "domain_size": hist.size, "queries": k,
        "accuracy": mech.accuracy, "max_hard_queries": mech.max_hard_queries,
        "hard": int((kinds == "hard").sum()), "unverified": int((kinds == "unverified").sum()),
        "halted": bool(mech.halted), "mm_mean": float(mm_err.mean()), "mm_max": float(mm_err.max()),
        "lap_mean": float(lap_err.mean()), "lap_max": float(lap_err.max()), "seconds": seconds,
    }
    if verbose:
        print(f"  {k} queries in {seconds:.1f}s: {out['hard']} hard of c={out['max_hard_queries']}, "
              f"{out['unverified']} unverified, halted={out['halted']}")
        print(f"  mean error: median mechanism {out['mm_mean']:.5f}, Laplace {out['lap_mean']:.5f} "
              f"({out['lap_mean'] / out['mm_mean']:.1f}x); max error {out['mm_max']:.4f} vs "
              f"{out['lap_max']:.4f}\n")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=20261130)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    args = parser.parse_args(argv)
    results = [run(w, rows=args.rows, k=args.queries, epsilon=args.epsilon, seed=args.seed + 10 * i)
               for i, w in enumerate(args.workloads)]
    print("| workload | |X| | alpha | c | hard used | halted | MM mean err | Laplace mean err | ratio | MM max | Laplace max |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['workload']} | {r['domain_size']} | {r['accuracy']:.4f} | {r['max_hard_queries']} | "
              f"{r['hard']} | {r['halted']} | {r['mm_mean']:.5f} | {r['lap_mean']:.5f} | "
              f"{r['lap_mean'] / r['mm_mean']:.1f}x | {r['mm_max']:.4f} | {r['lap_max']:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
