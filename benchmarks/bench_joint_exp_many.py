"""CPU time of JointExp on many groups: the per-group path against the batched sampler.

Two workloads, the groups case of the Spark benchmark (groups of 1e4 rows of normal(0, 5) data,
bounds [-50, 50], deciles, epsilon 1):

* ``je``: ``--groups`` groups of distinct grid indices with counts, released one group at a time
  (``joint_exp_indices``, what every group cost before) and, when the code has it, all together by
  ``joint_exp_many._sample_many`` (cells included). CPU ms per group.
* ``part``: one Spark partition's worth, 500 groups x 1e4 rows through
  ``dpq_spark.spark._release.release_partition`` (fold, spill, bands, release). CPU seconds.

Each measurement runs in a fresh child process and reports ``time.process_time()`` (CPU time,
not wall time), the best of ``--repeat``. ``--baseline REV`` also times the code of git revision
REV of this repository (extracted with ``git archive``) in the same run, alternating old and new
children, so the figures are side by side on the same machine load:

    .venv/bin/python benchmarks/bench_joint_exp_many.py --baseline 384b59c
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
    import json, sys, time
    import numpy as np
    from dpq_spark.core.randomness.grid import Grid
    what, groups = sys.argv[1], int(sys.argv[2])
    grid = Grid(-50.0, 50.0)
    q = np.arange(1, 10) / 10
    rng = np.random.default_rng(1)
    if what in ("je_one", "je_many"):
        from dpq_spark.core import joint_exp as _unused  # noqa: F401
        J = sys.modules["dpq_spark.core.quantiles.joint_exp"]
        from dpq_spark.core.accounting.neighboring import NeighboringRelation, joint_exp_sensitivity
        from dpq_spark.core.randomness.source import resolve_rng
        data = [np.unique(grid.snap(rng.normal(0.0, 5.0, 10_000)).astype(np.int64), return_counts=True)
                for _ in range(groups)]
        t = time.process_time()
        if what == "je_one":
            for k, w in data:
                J.joint_exp_indices(k, w, grid.size, q, epsilon=1.0)
        else:
            c = 1.0 / (2.0 * joint_exp_sensitivity(q, NeighboringRelation.parse("add_remove")))
            from dpq_spark.core.quantiles.joint_exp_many import _sample_many
            cells = [J._grid_cells(k, w, grid.size) for k, w in data]
            _sample_many(cells, q, c, grid.size, resolve_rng(None))
        print(json.dumps((time.process_time() - t) / groups * 1e3))
    else:
        import pyarrow as pa
        from dpq_spark.spark import _release as R
        from dpq_spark.spark import _columns  # noqa: E402
        gid = np.tile(np.arange(groups, dtype=np.int64) * 2, 10_000)  # interleaved like hash partitions
        x = rng.normal(0.0, 5.0, groups * 10_000)
        codes = gid * (1 << 33) + grid.snap(x).astype(np.int64)
        batches = [pa.RecordBatch.from_arrays([pa.array(codes[i:i + 10_000])], names=[_columns.CODE])
                   for i in range(0, codes.size, 10_000)]
        params = R.ReleaseParams(keys=("g",), quantiles=tuple(q), epsilon=1.0, lower=-50.0,
                                 upper=50.0, resolution=2**20, neighboring="add_remove",
                                 mechanism="auto", extra_columns=(_columns.CODE,))
        t = time.process_time()
        rows = sum(len(b) for b in R.release_partition(iter(batches), params))
        assert rows == groups * q.size
        print(json.dumps(time.process_time() - t))
""")


def _child(path: str, what: str, groups: int) -> float:
    env = dict(os.environ, PYTHONPATH=path)
    out = subprocess.run([sys.executable, "-c", CHILD, what, str(groups)], env=env, cwd=path,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _has_many(path: str) -> bool:
    return os.path.exists(os.path.join(path, "dpq_spark", "core", "joint_exp_many.py"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=500, help="groups in the je workload")
    parser.add_argument("--repeat", type=int, default=2, help="runs per figure (best kept)")
    parser.add_argument("--baseline", help="a git revision to time side by side")
    parser.add_argument("--skip-part", action="store_true", help="only the je workload")
    args = parser.parse_args()
    trees = {"this tree": ROOT}
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline:
            archive = subprocess.run(["git", "-C", ROOT, "archive", args.baseline, "dpq_spark"],
                                     capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            trees = {f"baseline {args.baseline}": tmp, **trees}
        jobs = [("je_one", args.groups, "ms/group"), ("je_many", args.groups, "ms/group")]
        if not args.skip_part:
            jobs.append(("part", 500, "s"))
        best: dict = {}
        for _ in range(args.repeat):
            for what, groups, _unit in jobs:
                for label, path in trees.items():  # alternate old and new
                    if what == "je_many" and not _has_many(path):
                        continue
                    got = _child(path, what, groups)
                    key = (what, label)
                    best[key] = min(best.get(key, got), got)
        names = {"je_one": f"JointExp one group at a time, {args.groups} groups",
                 "je_many": f"JointExp batched (_sample_many), {args.groups} groups",
                 "part": "one partition, 500 groups x 1e4 rows (release_partition)"}
        width = max(len(v) for v in names.values())
        print(f"{'CPU time (best of ' + str(args.repeat) + ')':<{width}}  " + "  ".join(f"{k:>22}" for k in trees))
        for what, _groups, unit in jobs:
            cells = [f"{best[(what, k)]:>17.2f} {unit:<4}" if (what, k) in best else f"{'-':>22}" for k in trees]
            print(f"{names[what]:<{width}}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
