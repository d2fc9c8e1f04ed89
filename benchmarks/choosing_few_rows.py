"""Fewer than 50 quantiles at small ``n * epsilon``: JointExp or a sized tree? The measurements behind ``auto``'s rule there.

Run from the repository root (core only, no Spark)::

    nice -n 5 .venv/bin/python benchmarks/choosing_few_rows.py            # every case, ~10 minutes on 2 cores
    .venv/bin/python benchmarks/choosing_few_rows.py --quick               # a smoke run
    .venv/bin/python benchmarks/choosing_few_rows.py --summary-from benchmarks/results/choosing_few_rows.txt
                                                     # the summary again from stored ratios, no runs

Below ``s = n * epsilon = 10**3.5``, JointExp's exponential mechanism over the whole of
``[lower, upper]`` puts visible mass on the empty parts of the bounds once m is large for the
rows: its error then runs to tens of times the best (each output of a draw is at least one of m
sequences, and m of them crowd the few points). AggTree on a small tree (``agg_tree_8x3``,
``agg_tree_12x3``) has a noise level set by the tree, not by m. Which one to run is decided from
public numbers only (m and s), so the rule must hold up whatever the data and the bounds are:
for each (m, s) this script measures the mechanisms on eleven data settings and reports, per
mechanism, its worst ratio to the best over them (minimax).

Data settings: N(0, 5), lognormal(2, 1) and U(-15, 15), each with bounds +-30, +-100 and
+-1000 (from 2 to 200 standard deviations of room), and two real columns with bounds +-100: the
Goodreads ``average_rating`` (two decimals, ``data/goodreads_books.csv``) and ``num_pages / 100``
(sampled without replacement). n = 1000 with ``epsilon = s / 1000`` for ``s <= 1000``, else
``n = s`` with epsilon = 1; add/remove neighbours; quantiles ``q_j = j / (m + 1)``. Error: mean
absolute difference from the true quantiles of the clamped data (``inverted_cdf``), averaged
over the repetitions (30; seeds fixed per case). Mechanisms: ``joint_exp``, ``approx_quantiles``,
``agg_tree`` (16**4), ``histogram``, ``agg_tree_8x3``, ``agg_tree_12x3``.

Output: one line per (m, s, data setting) with each mechanism's error divided by the best, then
per (m, s) the worst ratio of each mechanism over the eleven settings and ``auto``'s pick
(:func:`~dpq_spark.core.quantiles.choose.choose_mechanism`) with its worst ratio. Written to
``benchmarks/results/choosing_few_rows.txt`` (``--out`` to change; ``--quick`` prints only).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpq_spark.core.quantiles._pure import get_base_mechanism  # noqa: E402
from dpq_spark.core.quantiles.choose import choose_mechanism  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from _minimax import finish, measure, parser  # noqa: E402
from experiments import load_goodreads  # noqa: E402  (the Goodreads columns as the evaluation reads them)

NAMES = ("joint_exp", "approx_quantiles", "agg_tree", "histogram", "agg_tree_8x3", "agg_tree_12x3")
SHORT = ("JE", "AQ", "16^4", "hist", "8^3", "12^3")
#: (m, s) cases: around the JointExp / tree hand-over at each s
CASES = ((2, 30), (2, 100), (3, 30), (3, 50), (3, 100), (3, 300), (3, 1000), (5, 50), (5, 100),
         (5, 300), (6, 100), (6, 300), (9, 100), (9, 300), (9, 500), (9, 700), (9, 1000), (12, 300),
         (12, 600), (12, 1000), (17, 1000), (17, 2000), (29, 100), (29, 300), (29, 1000),
         (29, 2000), (29, 3000))
SYNTHETIC = tuple((kind, bound) for kind in ("normal", "lognormal", "uniform") for bound in (30.0, 100.0, 1000.0))
REAL = (("ratings", 100.0), ("pages", 100.0))
_POOLS: dict[str, np.ndarray] = {}


def pools() -> dict[str, np.ndarray]:
    if not _POOLS:
        _POOLS.update(load_goodreads())
    return _POOLS


def sample(kind: str, n: int, rep: int) -> np.ndarray:
    gen = np.random.default_rng([5, n, rep, len(kind)])
    if kind == "normal":
        return gen.normal(0.0, 5.0, n)
    if kind == "lognormal":
        return gen.lognormal(2.0, 1.0, n)
    if kind == "uniform":
        return gen.uniform(-15.0, 15.0, n)
    return gen.choice(pools()[kind], size=n, replace=False)


def n_eps(s: float) -> tuple[int, float]:
    return (1000, s / 1000.0) if s <= 1000 else (int(s), 1.0)


def run(args):
    m, s, kind, bound, reps = args
    n, eps = n_eps(s)
    q = np.arange(1, m + 1) / (m + 1)
    err = np.zeros((reps, len(NAMES)))
    for rep in range(reps):
        x = sample(kind, n, rep)
        truth = np.quantile(np.clip(x, -bound, bound), q, method="inverted_cdf")
        for i, name in enumerate(NAMES):
            out = get_base_mechanism(name)(x, q, epsilon=eps, lower=-bound, upper=bound,
                                           rng=np.random.default_rng([9, rep, i, n, m]))
            err[rep, i] = np.abs(np.asarray(out) - truth).mean()
    return args, err.mean(axis=0)


def summary(worst: dict) -> list[str]:
    """Per (m, s): each mechanism's worst ratio and auto's pick under the current rule."""
    lines = ["# worst ratio over the settings per (m, s), and auto's pick",
             "m    s      " + " ".join(f"{k:>6s}" for k in SHORT) + "  auto (worst)"]
    for (m, s), w in worst.items():
        n, eps = n_eps(s)
        pick = choose_mechanism(m, n=n, epsilon=eps)
        mark = f"{SHORT[NAMES.index(pick)]} ({w[NAMES.index(pick)]:.2f})" if pick in NAMES else pick
        lines.append(f"{m:<4d} {s:<6g} " + " ".join(f"{r:6.2f}" for r in w) + f"  {mark}")
    return lines


def worst_from(path: Path) -> dict:
    """The worst ratios per (m, s) from the per-setting lines of a results file."""
    worst: dict[tuple[int, int], np.ndarray] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if line.startswith("#") or len(parts) != 4 + len(NAMES) or not (parts[0].isdigit() and parts[2].isalpha()):
            continue
        key, ratio = (int(parts[0]), int(float(parts[1]))), np.array([float(v) for v in parts[4:]])
        worst[key] = np.maximum(worst.get(key, ratio), ratio)
    return worst


def main(argv=None) -> int:
    ap = parser(__doc__, ROOT / "benchmarks" / "results" / "choosing_few_rows.txt", "3 repetitions of 4 cases, print only")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args(argv)
    if args.summary_from is not None:
        print("\n".join(summary(worst_from(args.summary_from))))
        return 0
    cases = CASES[::7] if args.quick else CASES
    reps = 3 if args.quick else args.reps
    settings = SYNTHETIC + REAL
    started = time.time()
    lines = [f"# benchmarks/choosing_few_rows.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip(),
             f"# {reps} repetitions; error / best error per setting; load average at start {os.getloadavg()[0]:.2f}",
             "m    s      data        bound  " + " ".join(f"{k:>6s}" for k in SHORT)]
    print("\n".join(lines), flush=True)
    jobs = [(m, s, kind, bound, reps) for m, s in cases for kind, bound in settings]
    measured, worst = measure(run, jobs, lambda job: job[:2],
                              lambda job: f"{job[0]:<4d} {job[1]:<6g} {job[2]:<11s} {job[3]:<6g}",
                              processes=args.processes, width=6)
    finish(lines + measured, summary(worst), started, None if args.quick else args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
