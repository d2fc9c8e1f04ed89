"""One to fifteen quantiles: IndExp, JointExp, ApproxQuantiles or the histogram? The measurements behind ``auto``'s rule there.

Run from the repository root (core only, no Spark)::

    nice -n 5 .venv/bin/python benchmarks/choosing_small_m.py            # every case, ~15 minutes on 2 cores
    .venv/bin/python benchmarks/choosing_small_m.py --quick               # a smoke run
    .venv/bin/python benchmarks/choosing_small_m.py --summary-from benchmarks/results/choosing_small_m.txt

Few quantiles is the commonest request (a median, quartiles, a 90th percentile), and the
mechanisms trade places there as ``s = n * epsilon`` grows:

- one quantile at a few rows' worth of budget: IndExp's single exponential-mechanism draw
  spreads over the empty parts of wide bounds, a 16-bin noisy histogram does not;
- ``m + 1`` a power of two (3, 7, 15 quantiles): ApproxQuantiles' tree of medians is balanced,
  and from ``s`` of about 1000 it beats JointExp on continuous data;
- on integral data, a few quantiles at small ``s``: the histogram's 16 bins beat the finer
  mechanisms until ``s`` reaches about 25 rows per quantile; above it JointExp, which lands on the
  exact integers, beats ApproxQuantiles except at m = 3.

The choice is made from public numbers only (m, s, the declared grid), so it must hold up over
data and bounds: for each case the script measures every mechanism on several data settings and
reports its worst ratio to the best over them (minimax), beside ``auto``'s pick
(:func:`~dpq_spark.core.quantiles.choose.choose_mechanism`).

Continuous settings (no granularity): the eleven of ``benchmarks/choosing_few_rows.py`` (N(0, 5),
lognormal(2, 1) and U(-15, 15), each with bounds +-30, +-100 and +-1000, and the Goodreads
``average_rating`` and ``num_pages / 100`` with bounds +-100). Integral settings (granularity 1):
ages ``round(N(40, 15))`` clipped to [0, 100] with bounds [0, 100] and with bounds [-500, 500],
``round(lognormal(2, 1))`` and Poisson(3), both clipped to [0, 100], uniform integers on
[0, 100], and the Goodreads ``num_pages`` clipped to [0, 5000] with bounds [0, 5000].
n = 1000 with ``epsilon = s / 1000`` for ``s <= 1000``, else ``n = s`` with ``epsilon = 1``;
add/remove neighbours; quantiles ``q_j = j / (m + 1)``; error: mean absolute difference from the
true quantiles of the clamped data (``inverted_cdf``), over the repetitions (seeds fixed per case).

Output: one line per (kind, m, s, setting) with each mechanism's error over the best, then per
(kind, m, s) each mechanism's worst ratio and auto's pick with its worst ratio. Written to
``benchmarks/results/choosing_small_m.txt`` (``--out`` to change; ``--quick`` prints only).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _minimax import finish, measure, parser  # noqa: E402
from choosing_few_rows import REAL, SYNTHETIC, n_eps, pools, sample  # noqa: E402
from dpq_spark.core.quantiles._pure import get_base_mechanism  # noqa: E402
from dpq_spark.core.quantiles.choose import choose_mechanism, grid_points  # noqa: E402

NAMES = ("ind_exp", "joint_exp", "approx_quantiles", "histogram")
SHORT = ("IE", "JE", "AQ", "hist")
#: (kind, m, s, repetitions): around each hand-over of the rule
CASES = (tuple(("continuous", 1, s, 300) for s in (5, 10, 15, 20, 25, 35))
         + tuple(("continuous", m, s, 100) for m in (3, 7, 15) for s in (300, 562, 1000, 3000, 10_000))
         + tuple(("continuous", m, s, 100) for m in (2, 5) for s in (1000, 3000, 10_000))
         + tuple(("integral", m, s, 100) for m in (2, 3, 5)
                 for s in (30, 50, 100, 200, 316, 1000, 3000, 10_000)))
#: integral settings: (name, lower, upper)
INTEGRAL = (("ages", 0.0, 100.0), ("ages", -500.0, 500.0), ("skewed", 0.0, 100.0),
            ("poisson", 0.0, 100.0), ("uniform", 0.0, 100.0), ("pages", 0.0, 5000.0))


def integral_sample(kind: str, n: int, rep: int) -> np.ndarray:
    gen = np.random.default_rng([6, n, rep, len(kind)])
    if kind == "ages":
        return np.clip(np.round(gen.normal(40.0, 15.0, n)), 0.0, 100.0)
    if kind == "skewed":
        return np.clip(np.round(gen.lognormal(2.0, 1.0, n)), 0.0, 100.0)
    if kind == "poisson":
        return np.minimum(gen.poisson(3.0, n).astype(np.float64), 100.0)
    if kind == "uniform":
        return gen.integers(0, 101, n).astype(np.float64)
    pages = np.round(pools()["pages"] * 100.0)
    return np.clip(gen.choice(pages, size=n, replace=False), 0.0, 5000.0)


def run(job):
    kind, m, s, setting, lower, upper, reps = job
    n, eps = n_eps(s)
    q = np.arange(1, m + 1) / (m + 1)
    extra = {"granularity": 1.0} if kind == "integral" else {}
    err = np.zeros((reps, len(NAMES)))
    for rep in range(reps):
        x = integral_sample(setting, n, rep) if kind == "integral" else sample(setting, n, rep)
        truth = np.quantile(np.clip(x, lower, upper), q, method="inverted_cdf")
        for i, name in enumerate(NAMES):
            out = get_base_mechanism(name)(x, q, epsilon=eps, lower=lower, upper=upper,
                                           rng=np.random.default_rng([11, rep, i, n, m]), **extra)
            e = np.abs(np.asarray(out) - truth)
            e[e < 1e-9 * (upper - lower)] = 0.0  # float64 rounding of equal grid points
            err[rep, i] = e.mean()
    return job, err.mean(axis=0)


def pick(kind: str, m: int, s: float) -> str:
    n, eps = n_eps(s)
    if kind == "integral":  # bounds [0, 100]: G = 101 (the other integral grids are typed too)
        return choose_mechanism(m, n=n, epsilon=eps, grid_size=grid_points(0.0, 100.0, 1.0), granularity=1.0)
    return choose_mechanism(m, n=n, epsilon=eps)


def summary(worst: dict) -> list[str]:
    lines = ["# worst ratio over the settings per (kind, m, s), and auto's pick",
             "kind        m    s      " + " ".join(f"{k:>7s}" for k in SHORT) + "  auto (worst)"]
    for (kind, m, s), w in worst.items():
        choice = pick(kind, m, s)
        mark = f"{SHORT[NAMES.index(choice)]} ({w[NAMES.index(choice)]:.2f})" if choice in NAMES else choice
        lines.append(f"{kind:<11s} {m:<4d} {s:<6g} " + " ".join(f"{r:7.2f}" for r in w) + f"  {mark}")
    return lines


def worst_from(path: Path) -> dict:
    worst: dict = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if line.startswith("#") or len(parts) != 6 + len(NAMES) or parts[0] not in ("continuous", "integral"):
            continue
        key = (parts[0], int(parts[1]), int(float(parts[2])))
        ratio = np.array([float(v) for v in parts[6:]])
        worst[key] = np.maximum(worst.get(key, ratio), ratio)
    return worst


def main(argv=None) -> int:
    ap = parser(__doc__, ROOT / "benchmarks" / "results" / "choosing_small_m.txt", "3 repetitions of a few cases, print only")
    args = ap.parse_args(argv)
    if args.summary_from is not None:
        print("\n".join(summary(worst_from(args.summary_from))))
        return 0
    cases = CASES[::9] if args.quick else CASES
    continuous = tuple((name, -b, b) for name, b in SYNTHETIC + REAL)
    jobs = [(kind, m, s, name, lo, hi, 3 if args.quick else reps)
            for kind, m, s, reps in cases for name, lo, hi in (INTEGRAL if kind == "integral" else continuous)]
    started = time.time()
    lines = [f"# benchmarks/choosing_small_m.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip(),
             f"# error / best error per setting; load average at start {os.getloadavg()[0]:.2f}",
             "kind        m    s      data        lower  upper  " + " ".join(f"{k:>7s}" for k in SHORT)]
    print("\n".join(lines), flush=True)
    measured, worst = measure(run, jobs, lambda job: job[:3],
                              lambda job: f"{job[0]:<11s} {job[1]:<4d} {job[2]:<6g} {job[3]:<11s} "
                                          f"{job[4]:<6g} {job[5]:<6g}",
                              processes=args.processes, width=7)
    finish(lines + measured, summary(worst), started, None if args.quick else args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
