"""Many quantiles (m = 50, 99, 199): the sized AggTrees against the other pure mechanisms.

Usage::

    nice -n 5 .venv/bin/python benchmarks/bench_many_quantiles.py            # the full grid
    .venv/bin/python benchmarks/bench_many_quantiles.py --quick               # a smoke run
    .venv/bin/python benchmarks/bench_many_quantiles.py --bounds 1000 --trees-only
    .venv/bin/python benchmarks/bench_many_quantiles.py --bounds 1000 --trees-only \
        --sizes 10000:0.5623,10000:1,10000:1.3335,10000:1.7783     # other (n, epsilon) cases

For each case (m in {50, 99, 199}; n in {1e3, 1e4, 1e5, 1e6}; epsilon in {0.1, 1, 10}), data
N(0, 5) with bounds +-100 (``--bounds``), add/remove neighbours, every mechanism runs on the same
datasets with the same seeds: ``agg_tree_8x3``, ``agg_tree_12x3``, ``agg_tree_8x4``, ``agg_tree`` (16**4),
``joint_exp`` and ``approx_quantiles``. The error of a release is the mean absolute difference
between its m values and the true quantiles (``numpy.quantile(x, q, method="inverted_cdf")``,
data points); the table gives its mean over the repetitions and the standard error of that
mean. Repetitions: 50 for n <= 1e4, 20 for n = 1e5, 10 for n = 1e6 (``--reps-scale`` scales
them). "auto today" is the mechanism the rule before the sized trees picked (AggTree for
m >= 54 at ``316 <= n * epsilon < 10**6.5``, JointExp or ApproxQuantiles for m = 50), "auto" the
mechanism :func:`dpq_spark.core.quantiles.choose.choose_mechanism` picks now; both with a public
``n_hint = n``, so that they are exactly the named mechanism at the full epsilon (checked on the
main case by running ``auto`` itself). The main case (m = 99, n = 1e4, epsilon = 1) also runs
``auto`` without ``n_hint`` (5% of epsilon on a noisy count), against AggTree at 95% of epsilon
(what the rule before picked there).

Results: ``benchmarks/results/many_quantiles.txt`` (``--out`` to change; ``--quick`` prints only).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpq_spark.core.quantiles.choose import DEFAULT_COUNT_SHARE, auto, choose_mechanism  # noqa: E402
from dpq_spark.core.quantiles.mechanisms import get_base_mechanism  # noqa: E402

NAMES = ("agg_tree_8x3", "agg_tree_12x3", "agg_tree_8x4", "agg_tree", "joint_exp", "approx_quantiles")
TREES = ("agg_tree_8x3", "agg_tree_12x3", "agg_tree_8x4", "agg_tree")
SHORT = {"agg_tree_8x3": "8^3", "agg_tree_12x3": "12^3", "agg_tree_8x4": "8^4", "agg_tree": "16^4", "joint_exp": "JE",
         "approx_quantiles": "AQ"}
MS = (50, 99, 199)
NS = (1_000, 10_000, 100_000, 1_000_000)
EPSILONS = (0.1, 1.0, 10.0)
MAIN = (99, 10_000, 1.0)


def old_rule(m: int, size: float) -> str:
    """The continuous rule for m >= 50 before the sized trees (choose.py, 2 December 2026)."""
    if size < 25:
        return "histogram"
    if size < 10**2.5:
        factor = (max(size, 1.0) / 1000.0) ** 0.4
        if m <= max(2.0, 35.0 * factor):
            return "joint_exp"
        return "approx_quantiles" if m <= max(2.0, 55.0 * factor) else "agg_tree"
    if m <= 53:
        return "joint_exp" if size < 10**3.5 else "approx_quantiles"
    return "agg_tree" if size < 10**6.5 else "approx_quantiles"


def reps_for(n: int, scale: float) -> int:
    base = 50 if n <= 10_000 else (20 if n <= 100_000 else 10)
    return max(2, int(round(base * scale)))


def seed_of(*parts) -> np.random.SeedSequence:
    return np.random.SeedSequence([int(p) for p in parts])


def run_case(m, n, eps, reps, bound, names):
    q = np.arange(1, m + 1) / (m + 1)
    errs = {name: [] for name in names}
    for rep in range(reps):
        x = np.random.default_rng(seed_of(1, n, rep)).normal(0.0, 5.0, n)
        truth = np.quantile(x, q, method="inverted_cdf")
        for name in names:
            rng = np.random.default_rng(seed_of(2, n, m, round(eps * 100), rep))
            est = get_base_mechanism(name)(x, q, epsilon=eps, lower=-bound, upper=bound, rng=rng)
            errs[name].append(float(np.mean(np.abs(np.asarray(est) - truth))))
    return {name: np.asarray(v) for name, v in errs.items()}


def check_auto(m, n, eps, bound, reps=3):
    """``auto`` with ``n_hint = n`` is the chosen mechanism draw for draw (the table's premise)."""
    q = np.arange(1, m + 1) / (m + 1)
    name = choose_mechanism(m, n=n, epsilon=eps)
    for rep in range(reps):
        x = np.random.default_rng(seed_of(1, n, rep)).normal(0.0, 5.0, n)
        a = auto(x, q, epsilon=eps, lower=-bound, upper=bound, n_hint=n,
                 rng=np.random.default_rng(seed_of(2, n, m, round(eps * 100), rep)))
        b = get_base_mechanism(name)(x, q, epsilon=eps, lower=-bound, upper=bound,
                                     rng=np.random.default_rng(seed_of(2, n, m, round(eps * 100), rep)))
        assert a.mechanism == name and np.array_equal(np.asarray(a), b), (m, n, eps)
    return name


def main_case_without_hint(reps, bound):
    """The main case as a user runs it: auto spends 5% of epsilon on a noisy count."""
    m, n, eps = MAIN
    q = np.arange(1, m + 1) / (m + 1)
    new, old, picked = [], [], set()
    for rep in range(reps):
        x = np.random.default_rng(seed_of(1, n, rep)).normal(0.0, 5.0, n)
        truth = np.quantile(x, q, method="inverted_cdf")
        r = auto(x, q, epsilon=eps, lower=-bound, upper=bound,
                 rng=np.random.default_rng(seed_of(3, rep)))
        picked.add(r.mechanism)
        new.append(float(np.mean(np.abs(np.asarray(r) - truth))))
        before = get_base_mechanism("agg_tree")(x, q, epsilon=(1 - DEFAULT_COUNT_SHARE) * eps,
                                                lower=-bound, upper=bound,
                                                rng=np.random.default_rng(seed_of(3, rep)))
        old.append(float(np.mean(np.abs(np.asarray(before) - truth))))
    return np.asarray(new), np.asarray(old), picked


def fmt(v: np.ndarray) -> str:
    return f"{v.mean():.3g} ± {v.std(ddof=1) / np.sqrt(v.size):.2g}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two repetitions, m = 99 only, print only")
    ap.add_argument("--reps-scale", type=float, default=1.0)
    ap.add_argument("--bounds", type=float, default=100.0, help="bounds +-B (default 100)")
    ap.add_argument("--trees-only", action="store_true", help="only the four AggTrees")
    ap.add_argument("--m", type=int, nargs="+", default=list(MS), help="numbers of quantiles")
    ap.add_argument("--sizes", default=None,
                    help="comma-separated n:epsilon cases instead of the grid (e.g. 10000:1.3335)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "many_quantiles.txt")
    args = ap.parse_args(argv)
    names = TREES if args.trees_only else NAMES
    ms = (99,) if args.quick else tuple(args.m)
    scale = 0.04 if args.quick else args.reps_scale
    started = time.time()
    lines = [f"# benchmarks/bench_many_quantiles.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip(),
             f"# N(0, 5), bounds +-{args.bounds:g}, add/remove; mean absolute error ± standard error "
             "over the repetitions; same data and seeds for every mechanism",
             f"# load average at start: {os.getloadavg()[0]:.2f}"]
    header = "m    n        eps   reps  " + "  ".join(f"{SHORT[k]:>16s}" for k in names)
    if not args.trees_only:
        header += "  auto today -> auto now (ratio)"
    lines.append(header)
    print("\n".join(lines), flush=True)
    if args.sizes:
        cases = [(int(float(c.split(":")[0])), float(c.split(":")[1])) for c in args.sizes.split(",")]
    else:
        cases = [(n, eps) for n in NS for eps in EPSILONS]
    for m in ms:
        for n, eps in cases:
            reps = reps_for(n, scale)
            errs = run_case(m, n, eps, reps, args.bounds, names)
            row = f"{m:<4d} {n:<8d} {eps:<5g} {reps:<5d} " + "  ".join(f"{fmt(errs[k]):>16s}" for k in names)
            if not args.trees_only:
                before, now = old_rule(m, n * eps), choose_mechanism(m, n=n, epsilon=eps)
                e_before = errs[before].mean() if before in errs else float("nan")
                row += (f"  {SHORT.get(before, before)} -> {SHORT.get(now, now)} "
                        f"({errs[now].mean() / e_before:.2f})")
            lines.append(row)
            print(row, f"[{time.time() - started:.0f}s, load {os.getloadavg()[0]:.2f}]", flush=True)
    if not args.quick and not args.trees_only and MAIN[0] in ms:
        m, n, eps = MAIN
        picked = check_auto(m, n, eps, args.bounds)
        reps = reps_for(n, scale)
        new, old, names_seen = main_case_without_hint(reps, args.bounds)
        lines.append(f"# main case, auto with n_hint is {picked} draw for draw (checked on 3 seeds)")
        lines.append(f"# main case without n_hint (5% of epsilon on the count), {reps} reps: auto now "
                     f"({'/'.join(sorted(names_seen))}) {fmt(new)}; auto today (agg_tree at 0.95 epsilon) "
                     f"{fmt(old)}; ratio {new.mean() / old.mean():.2f}")
        print("\n".join(lines[-2:]), flush=True)
    lines.append(f"# {time.strftime('%Y-%m-%d')}, {time.time() - started:.0f} s, load average at end "
                 f"{os.getloadavg()[0]:.2f}")
    if not args.quick:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        mode = "a" if args.out.exists() and args.trees_only else "w"
        with open(args.out, mode) as fh:
            fh.write("\n".join(lines) + "\n\n")
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
