"""What exact sampling from a cryptographic source costs.

Run from the repository root (numpy only, no Spark)::

    .venv/bin/python benchmarks/bench_randomness.py
    .venv/bin/python benchmarks/bench_randomness.py --old /tmp/old-main   # + easy-query before/after

Parts:

1. Raw bits: ``RandomSource.words`` from the OS (``os.urandom``) and from a seeded numpy
   ``Generator`` (``Generator.bytes``), and one ``below`` (exact uniform integer) each.
2. Noise: discrete Laplace at scale ~4, one draw at a time (pure Python) and 1e5 at once
   (vectorised), from both sources, against numpy's float ``Generator.laplace`` (what dpq_spark
   used before exact noise).
3. The median mechanism's easy query (two noisy tests per query), this checkout against an old
   one given by ``--old`` (e.g. ``git worktree add /tmp/old-main main``), each in its own
   subprocess, interleaved, the same configurations, ``rng=None`` (production) and a seeded
   generator.

Timings are medians of repeats. On a shared, loaded machine only the ratios within one run mean
much; say so when quoting them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def bits_and_noise(repeats: int) -> None:
    from dpq_spark.core.randomness.source import resolve_rng
    from dpq_spark.core.randomness.samplers import discrete_laplace, dlap_scale

    sources = {"os.urandom": lambda: resolve_rng(None),
               "seeded numpy": lambda: resolve_rng(np.random.default_rng(0))}
    print("| what | source | per draw |")
    print("|---|---|---:|")
    for name, make in sources.items():
        src = make()
        t = _median_time(lambda: src.words(1_000_000), repeats) / 1_000_000
        print(f"| uniform 64-bit word (batch of 1e6) | {name} | {1e9 * t:.1f} ns |")
    for name, make in sources.items():
        src = make()
        t = _median_time(lambda: [src.below(1000) for _ in range(10_000)], repeats) / 10_000
        print(f"| `below(1000)`, one at a time | {name} | {1e6 * t:.2f} us |")
    scale = dlap_scale(1, 0.25)  # 4
    gen = np.random.default_rng(0)
    t_np1 = _median_time(lambda: [gen.laplace(0.0, 4.0) for _ in range(10_000)], repeats) / 10_000
    t_npv = _median_time(lambda: gen.laplace(0.0, 4.0, size=100_000), repeats) / 100_000
    print(f"| float Laplace (numpy, before), one at a time | seeded numpy | {1e6 * t_np1:.2f} us |")
    for name, make in sources.items():
        src = make()
        t = _median_time(lambda: [discrete_laplace(src, scale) for _ in range(10_000)], repeats) / 10_000
        print(f"| discrete Laplace scale 4, one at a time | {name} | {1e6 * t:.2f} us "
              f"({t / t_np1:.1f}x numpy) |")
    print(f"| float Laplace (numpy, before), 1e5 at once | seeded numpy | {1e9 * t_npv:.1f} ns |")
    for name, make in sources.items():
        src = make()
        t = _median_time(lambda: discrete_laplace(src, scale, size=100_000), repeats)
        print(f"| discrete Laplace scale 4, 1e5 at once | {name} | {1e9 * t / 1e5:.1f} ns "
              f"({t:.3f} s per 1e5; {t / 1e5 / t_npv:.1f}x numpy) |")
    src = resolve_rng(None)
    for s in (Fraction(1, 3), Fraction(1000), dlap_scale(2 * 100 * 1000, 8 / 9)):
        t = _median_time(lambda: discrete_laplace(src, s, size=100_000), repeats)
        print(f"| discrete Laplace scale {float(s):.4g}, 1e5 at once | os.urandom | "
              f"{t:.3f} s per 1e5 |")


# ------------------------------------------------------------------------------------------
_EASY_CHILD = r"""
import json, sys, time
import numpy as np
from dpq_spark.core.interactive.median_mechanism import AnswerKind, MedianMechanism
cfg = json.loads(sys.argv[1])
rng = np.random.default_rng(cfg["seed"])
out = {}
for domain, count, size in cfg["grid"]:
    for mode in ("os", "seeded"):
        hist = rng.integers(0, 100, size=domain)
        mech = MedianMechanism(hist, epsilon=1.0, accuracy=0.5, max_hard_queries=1,
                               candidate_size=size, n_candidates=count,
                               rng=None if mode == "os" else np.random.default_rng(1))
        masks = [rng.random(domain) < rng.random() for _ in range(cfg["queries"])]
        mech.ask(masks[0])
        times = []
        for m in masks:
            t0 = time.perf_counter()
            a = mech.ask(m)
            times.append(time.perf_counter() - t0)
            assert a.kind is AnswerKind.EASY
        out[f"{domain}/{count}/{size}/{mode}"] = float(np.median(times))
print(json.dumps(out))
"""


def easy_query(old: str | None, rounds: int, queries: int) -> None:
    grid = [(1_000, 1_000, 100), (10_000, 10_000, 100), (10_000, 2_000, 1_000)]
    cfg = json.dumps({"grid": grid, "queries": queries, "seed": 7})
    trees = {"new": str(ROOT)} | ({"old": old} if old else {})
    results: dict[str, list[dict]] = {k: [] for k in trees}
    for _ in range(rounds):  # interleave old and new so that load drifts hit both alike
        for label, tree in trees.items():
            env = dict(os.environ, PYTHONPATH=tree)
            run = subprocess.run([sys.executable, "-c", _EASY_CHILD, cfg], env=env, cwd=tree,
                                 capture_output=True, text=True, check=True)
            results[label].append(json.loads(run.stdout))
    print()
    print("Median mechanism, one easy query (median over queries, then over rounds), ms")
    print("| |X| / N / k | rng | " + " | ".join(trees) + (" | new/old |" if old else " |"))
    print("|---|---|" + "---:|" * (len(trees) + (1 if old else 0)))
    for key in results["new"][0]:
        domain_count_size, mode = key.rsplit("/", 1)
        med = {label: float(np.median([r[key] for r in runs])) for label, runs in results.items()}
        row = " | ".join(f"{1e3 * med[label]:.3f}" for label in trees)
        ratio = f" | {med['new'] / med['old']:.2f} |" if old else " |"
        print(f"| {domain_count_size} | {mode} | {row}{ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", default=None, help="an old checkout to compare the easy query with")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    bits_and_noise(args.repeats)
    easy_query(args.old, args.rounds, args.queries)
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
