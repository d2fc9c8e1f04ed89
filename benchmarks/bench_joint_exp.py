"""Time and peak memory of ``joint_exp`` against its targets and the authors' figures.

Each case runs in a fresh subprocess so that its peak resident memory (``ru_maxrss``) is its own;
the data are generated before the clock starts, and the figure reported is the best of
``--repeat`` calls (memory: the peak over the whole child, data included, and the peak traced by
``tracemalloc`` during the call alone).

    .venv/bin/python benchmarks/bench_joint_exp.py            # all cases
    .venv/bin/python benchmarks/bench_joint_exp.py --quick    # small cases only
    .venv/bin/python benchmarks/bench_joint_exp.py --compare /tmp/old-main   # side by side

``--compare PATH`` times the code of another checkout (e.g. ``git worktree add --detach
/tmp/old-main main``) in the same run, alternating old and new children, and prints the ratio:
on a loaded machine only such side-by-side ratios mean anything.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

# (label, n or distinct values, m, counts total or None, target seconds, target MiB, authors' s, authors' MiB)
CASES = [
    ("n=1e5, m=30", 100_000, 30, None, None, None, 3.1, 905),
    ("n=1e6, m=30", 1_000_000, 30, None, 1.5, 1024, 41.0, 8.4 * 1024),
    ("n=1e5, m=100", 100_000, 100, None, 1.5, None, 47.0, 8.2 * 1024),
    ("n=1e7, m=30", 10_000_000, 30, None, 20.0, None, None, None),
    ("counts: 1e6 distinct, sum 1e9, m=30", 1_000_000, 30, 1_000_000_000, 3.0, None, None, None),
]
QUICK = {"n=1e5, m=30", "n=1e5, m=100"}

CHILD = textwrap.dedent(
    """
    import json, resource, sys, time, tracemalloc
    import numpy as np
    from dpq_spark.core import joint_exp
    n, m, total, repeat = json.loads(sys.argv[1])
    rng = np.random.default_rng(12345)
    x = rng.normal(0.0, 5.0, n)
    counts = None
    if total is not None:
        x = np.sort(rng.uniform(-50.0, 50.0, n))
        counts = rng.multinomial(total, np.full(n, 1.0 / n))
    q = np.arange(1, m + 1) / (m + 1)
    best = float("inf")
    for r in range(repeat):
        if r == repeat - 1:
            tracemalloc.start()
        t0 = time.perf_counter()
        joint_exp(x, q, epsilon=1.0, lower=-100.0, upper=100.0, counts=counts, rng=rng)
        best = min(best, time.perf_counter() - t0)
    traced = tracemalloc.get_traced_memory()[1] / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": best, "traced_mib": traced, "rss_mib": rss}))
    """
)


def run_case(n, m, total, repeat, path=None):
    env = None if path is None else dict(os.environ, PYTHONPATH=path)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps([n, m, total, repeat])],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def fmt(value, unit):
    return "-" if value is None else f"{value:.3g} {unit}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="run only the small cases")
    parser.add_argument("--repeat", type=int, default=3, help="calls per case; the best is kept")
    parser.add_argument("--compare", metavar="PATH", help="also time the checkout at PATH, side by side")
    args = parser.parse_args(argv)
    if args.compare:
        return compare(args)
    header = f"{'case':40} {'time':>9} {'target':>8} {'authors':>8} | {'peak RSS':>10} {'in-call':>10} {'target':>9} {'authors':>9}"
    print(header)
    print("-" * len(header))
    for label, n, m, total, t_target, mem_target, a_s, a_mib in CASES:
        if args.quick and label not in QUICK:
            continue
        res = run_case(n, m, total, 1 if n >= 10_000_000 else args.repeat)
        ok = (t_target is None or res["seconds"] <= t_target) and (
            mem_target is None or res["rss_mib"] <= mem_target
        )
        print(
            f"{label:40} {res['seconds']:8.3f}s {fmt(t_target, 's'):>8} {fmt(a_s, 's'):>8} | "
            f"{res['rss_mib']:7.0f} MiB {res['traced_mib']:6.0f} MiB {fmt(mem_target, 'MiB'):>9} "
            f"{fmt(a_mib, 'MiB'):>9} {'ok' if ok else 'MISSED'}"
        )


def compare(args):
    """Best of three alternating rounds per side; prints old, new and new/old."""
    print(f"{'case':40} {'old':>9} {'new':>9} {'new/old':>8}")
    for label, n, m, total, *_ in CASES:
        if args.quick and label not in QUICK:
            continue
        repeat = 1 if n >= 10_000_000 else args.repeat
        old, new = [], []
        for _ in range(3):
            old.append(run_case(n, m, total, repeat, args.compare)["seconds"])
            new.append(run_case(n, m, total, repeat)["seconds"])
        print(f"{label:40} {min(old):8.3f}s {min(new):8.3f}s {min(new) / min(old):8.2f}", flush=True)


if __name__ == "__main__":
    main()
