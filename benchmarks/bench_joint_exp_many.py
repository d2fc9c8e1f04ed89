"""CPU time of JointExp on many groups: ``release_many`` as a Spark worker calls it.

Each case is G groups of R rows of N(0, 5) data (bounds [-100, 100], deciles, epsilon 1 unless
``--epsilon``, add/remove), held as a fold holds them (sorted distinct grid indices with counts, one
``FlatGroups``), released by ``dpq_spark.core.quantiles.batch.release_many`` with
``mechanism="joint_exp"``, ``grid_indices=True`` and ``rng=None`` (the OS generator, as in
production). Each measurement runs in a fresh child process and reports ``time.process_time()``
(CPU time, not wall time) per group of the release call alone (data built before), and the
child's peak RSS; the best of ``--repeat``. ``--baseline REV`` also times the code of git
revision REV of this repository (extracted with ``git archive``) in the same run, alternating old
and new children, so the figures are side by side on the same machine load; the load average is
printed with the table:

    .venv/bin/python benchmarks/bench_joint_exp_many.py --baseline aa7f532
    .venv/bin/python benchmarks/bench_joint_exp_many.py --cases 4000x100 --repeat 5
    .venv/bin/python benchmarks/bench_joint_exp_many.py --cases 20x16000 --epsilon 0.1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = textwrap.dedent("""
    import json, resource, sys, time
    import numpy as np
    from dpq_spark.core.quantiles.batch import FlatGroups, release_many
    from dpq_spark.core.randomness.grid import Grid
    G, R, eps = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    grid = Grid(-100.0, 100.0)
    x = np.random.default_rng(1).normal(0.0, 5.0, G * R)
    codes = np.repeat(np.arange(G, dtype=np.int64), R) * (1 << 33) + grid.snap(x).astype(np.int64)
    u, counts = np.unique(codes, return_counts=True)
    g = u >> 33
    groups = FlatGroups(u - (g << 33), counts.astype(np.int64),
                        np.searchsorted(g, np.arange(G + 1)).astype(np.int64))
    del x, codes, u, g
    t = time.process_time()
    out = release_many(groups, np.arange(1, 10) / 10, epsilon=eps, lower=-100.0, upper=100.0,
                       mechanism="joint_exp", grid_indices=True)
    cpu = time.process_time() - t
    assert out.values.shape == (G, 9) and np.all(np.diff(out.values, axis=1) >= 0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps([cpu / G * 1e6, rss]))
""")


def _child(path: str, groups: int, rows: int, epsilon: float) -> list:
    env = dict(os.environ, PYTHONPATH=path)
    args = [str(groups), str(rows), repr(epsilon)]
    out = subprocess.run(["nice", "-n", "5", sys.executable, "-c", CHILD, *args],
                         env=env, cwd=path, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="4000x100,800x1000,500x10000",
                        help="comma-separated GROUPSxROWS (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (best kept)")
    parser.add_argument("--baseline", help="a git revision to time side by side")
    parser.add_argument("--epsilon", type=float, default=1.0,
                        help="epsilon of every release (default: %(default)s)")
    args = parser.parse_args()
    cases = [tuple(int(v) for v in case.split("x")) for case in args.cases.split(",")]
    trees = {"this tree": ROOT}
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline:
            archive = subprocess.run(["git", "-C", ROOT, "archive", args.baseline, "dpq_spark"],
                                     capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            trees = {f"baseline {args.baseline}": tmp, **trees}
        best: dict = {}
        for _ in range(args.repeat):
            for groups, rows in cases:
                for label, path in trees.items():  # alternate old and new
                    cpu, rss = _child(path, groups, rows, args.epsilon)
                    key = (groups, rows, label)
                    old = best.get(key, (float("inf"), 0.0))
                    best[key] = (min(old[0], cpu), max(old[1], rss))
        print(f"release_many, mechanism='joint_exp', epsilon {args.epsilon:g}, CPU us per group (best of {args.repeat}), "
              f"peak RSS of the child (max); load average {os.getloadavg()[0]:.1f} at the end")
        print(f"{'groups x rows':<16}" + "".join(f"{k:>34}" for k in trees))
        for groups, rows in cases:
            cells = [f"{best[(groups, rows, k)][0]:>10.0f} us  {best[(groups, rows, k)][1]:>6.0f} MiB RSS"
                     for k in trees]
            print(f"{f'{groups:,} x {rows:,}':<16}" + "".join(f"{c:>34}" for c in cells))


if __name__ == "__main__":
    main()
