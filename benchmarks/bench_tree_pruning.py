"""Does zeroing the tree's empty-looking nodes lower AggTree's error? A measured "no, not as a default".

Usage::

    nice -n 5 .venv/bin/python benchmarks/bench_tree_pruning.py           # m = 199, the whole grid
    .venv/bin/python benchmarks/bench_tree_pruning.py --ms 50,199          # both m
    .venv/bin/python benchmarks/bench_tree_pruning.py --quick              # a smoke run

When the bounds are much wider than the data, most first-level nodes of AggTree's tree are
empty, and their noise still enters every quantile's cumulative count. Two post-processings of
the Honaker-aggregated counts are compared with the plain descent (all of them post-processing:
the privacy of the release does not change):

``hard3L1``  a first-level node whose estimate is below 3 noise standard deviations is set to 0
             (its subtree drops out of the descent)
``softL1``   every first-level estimate ``y`` is multiplied by the posterior probability that the
             node is not empty, under a spike at 0 (Laplace noise of the level's aggregated
             variance) and a uniform slab on ``[0, n_hat]``, prior 1/2 each
``softL2``   the same on the first two levels
``softAll``  the same on every level
``softL1p9`` ``softL1`` with prior 0.9 on "empty"

Grid: data N(0, 5), lognormal(2, 1) (heavy right tail) and U(-90, 90); n in {1e3, 1e4, 1e5};
epsilon in {0.1, 1, 10}; bounds +-100 and +-1000; the tree ``auto`` sizes for ``n * epsilon``
(8**3 below 10**3.25, 8**4 below 10**4.75, else 16**4); add/remove neighbours; 60 repetitions
for n <= 1e4, 20 above. The error of a release is the mean absolute difference between its m
values and the true quantiles of the clamped data (``inverted_cdf``). Each row prints the plain
descent's error and every variant's error divided by it; the last lines give the geometric mean
and the largest ratio of each variant over the grid.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from multiprocessing import Pool
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpq_spark.core.quantiles._sorted_data import sort_data  # noqa: E402
from dpq_spark.core.quantiles.agg_tree import (  # noqa: E402
    _descend,
    honaker_aggregate,
    honaker_variances,
    node_variance,
    noisy_levels,
)
from dpq_spark.core.randomness.samplers import dlap_scale  # noqa: E402
from dpq_spark.core.randomness.source import resolve_rng  # noqa: E402

VARIANTS = ("hard3L1", "softL1", "softL2", "softAll", "softL1p9")


def tree_shape(n: int, eps: float) -> tuple[int, int]:
    size = n * eps
    return (8, 3) if size < 10**3.25 else ((8, 4) if size < 10**4.75 else (16, 4))


def sample(kind: str, n: int, rep: int) -> np.ndarray:
    gen = np.random.default_rng([1, n, rep, {"normal": 0, "lognormal": 1, "uniform": 2}[kind]])
    if kind == "normal":
        return gen.normal(0.0, 5.0, n)
    if kind == "lognormal":
        return gen.lognormal(2.0, 1.0, n)
    return gen.uniform(-90.0, 90.0, n)


def noisy_tree(x, bound, branching, height, eps, rng):
    """AggTree's aggregated tree (the same counts, noise and aggregation as ``agg_tree``)."""
    scale = dlap_scale(height, eps)
    noisy = noisy_levels(sort_data(x, None, -bound, bound), -bound, bound, branching, height, scale, rng)
    variance = node_variance(scale)
    return honaker_aggregate(noisy, branching, variance, None), variance


def final_variances(variance: float, branching: int, height: int) -> np.ndarray:
    """Variance of the aggregated estimate per level (root unobserved), as honaker_aggregate."""
    low, high = honaker_variances(branching, height, variance, False)
    out = np.zeros(height + 1)
    out[1] = low[1]  # the root is unobserved: level 1 has its subtree estimate only
    for level in range(2, height + 1):
        above = high[level - 1] + (branching - 1) * low[level]
        out[level] = low[level] * above / (low[level] + above)
    return out


def hard(tree, branching, threshold):
    out = [a.copy() for a in tree]
    out[1][out[1] < threshold] = 0.0
    for level in range(2, len(out)):
        out[level][np.repeat(out[level - 1] == 0.0, branching)] = 0.0
    return out


def soft(tree, branching, variance, levels, prior_empty=0.5):
    fin = final_variances(variance, branching, len(tree) - 1)
    total = max(float(tree[0].sum()), 1.0)
    out = [a.copy() for a in tree]
    for level in range(1, min(levels, len(tree) - 1) + 1):
        s = math.sqrt(fin[level] / 2.0)
        y = tree[level]
        log_spike = -np.abs(y) / s - math.log(2.0 * s)
        log_odds = -math.log(total) - log_spike + math.log((1.0 - prior_empty) / prior_empty)
        p_empty = 1.0 / (1.0 + np.exp(np.minimum(log_odds, 700.0)))
        out[level] = (1.0 - p_empty) * np.maximum(y, 0.0)
    return out


def run_case(args):
    kind, m, n, eps, bound, reps = args
    b, h = tree_shape(n, eps)
    qs = np.arange(1, m + 1) / (m + 1)
    errs = np.zeros((reps, 1 + len(VARIANTS)))
    for rep in range(reps):
        x = sample(kind, n, rep)
        truth = np.quantile(np.clip(x, -bound, bound), qs, method="inverted_cdf")
        tree, var = noisy_tree(x, bound, b, h, eps, resolve_rng(np.random.default_rng([2, n, rep])))
        trees = [tree, hard(tree, b, 3.0 * math.sqrt(var)), soft(tree, b, var, 1), soft(tree, b, var, 2),
                 soft(tree, b, var, h), soft(tree, b, var, 1, 0.9)]
        for k, t in enumerate(trees):
            est = np.sort([_descend(t, b, -bound, bound, float(q)) for q in qs])
            errs[rep, k] = np.mean(np.abs(est - truth))
    return args, (b, h), errs.mean(axis=0)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ms", default="199", help="comma-separated m (default 199)")
    parser.add_argument("--quick", action="store_true", help="a few cases, 4 repetitions")
    parser.add_argument("--processes", type=int, default=2)
    a = parser.parse_args(argv)
    ms = [int(v) for v in a.ms.split(",")]
    grid = itertools.product(("normal", "lognormal", "uniform"), ms, (1_000, 10_000, 100_000),
                             (0.1, 1.0, 10.0), (100, 1000))
    cases = [(k, m, n, e, bd, 4 if a.quick else (60 if n <= 10_000 else 20)) for k, m, n, e, bd in grid]
    if a.quick:
        cases = cases[::9]
    print("data m n epsilon bound tree descent |", " ".join(VARIANTS))
    ratios = []
    with Pool(a.processes) as pool:
        for (kind, m, n, eps, bound, _), (b, h), mu in pool.imap(run_case, cases):
            r = mu[1:] / mu[0]
            ratios.append(r)
            print(kind, m, n, eps, bound, f"{b}^{h}", f"{mu[0]:.4g} |", " ".join(f"{v:.2f}" for v in r), flush=True)
    ratios = np.array(ratios)
    print("geometric mean |", " ".join(f"{v:.3f}" for v in np.exp(np.log(ratios).mean(axis=0))))
    print("largest ratio  |", " ".join(f"{v:.2f}" for v in ratios.max(axis=0)))


if __name__ == "__main__":
    main()
