"""Peak memory and time of one Python worker releasing one partition of many groups.

Each case is G groups of R rows of N(0, 5) data (bounds [-100, 100], or with ``--no-bounds``
none: each group buys private bounds on the log-scale buckets; deciles, epsilon 1, add/remove,
public keys), one partition holding every group. The rows are first packed as the map side
packs them (``dpq_spark.spark._packing.pack_partition``) and written to an Arrow IPC stream file
(once per case, in a scratch directory), sorted by bucket in batches of at most 10,000 packed
rows, as Spark hands the partition to the worker (the shuffle's output is sorted by bucket); a
tree whose release does not read buckets in order (no ``_packing.bucket_pieces``: its plan had
no such sort) reads them as they were packed instead. Then, in a fresh child process per
measurement, so that its peak RSS is that case's alone, the child imports what a Spark worker
imports (numpy, pandas, pyarrow, dpq_spark), streams the file's record batches into the reduce
side's body, ``dpq_spark.spark._release.release_partition`` (the very function ``mapInArrow``
calls), and consumes its output batches. The child reports:

* its peak RSS (``VmHWM`` of ``/proc/self/status``, the whole process: interpreter, libraries,
  the arriving data and the release),
* the wall time of the ``release_partition`` loop, and its CPU time per group (less sensitive
  to other processes' load),
* with ``--tracemalloc``, the peak of the allocations tracemalloc traces (numpy's included),
  which slows the run down; its times are then not comparable.

``--workers N`` starts N children at once on the same partition, as an executor with N cores
runs N Python workers side by side (Spark's ``local[2]`` runs two): they share the memory bus
and the last-level cache, which a lone child has to itself. A measurement is then its slowest
child's times and its largest peak RSS.

``--baseline PATH`` also runs a copy of the package (a directory holding ``dpq_spark``, or a
git revision extracted with ``git archive``), alternating old and new children, so that both
columns are measured under the same load. The load average is printed with the table.
Run it under ``nice`` on a shared machine:

    nice -n 10 .venv/bin/python benchmarks/bench_worker_memory.py
    nice -n 10 .venv/bin/python benchmarks/bench_worker_memory.py --cases 500x10000 --mechanism joint_exp
    nice -n 10 .venv/bin/python benchmarks/bench_worker_memory.py --baseline HEAD --repeat 3
    nice -n 10 .venv/bin/python benchmarks/bench_worker_memory.py --no-bounds --cases 8000x1000
    .venv/bin/python benchmarks/bench_worker_memory.py --cases 5000x1000 --workers 2 --repeat 5
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
DEFAULT_CASES = "500x10000,20000x100,100000x10,50x100000"

# Writes the packed partition of one case (run with the tree under test: the packing is part of
# the map side, not measured).
PREPARE = textwrap.dedent("""
    import sys
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    from dpq_spark.core.randomness.grid import Grid
    from dpq_spark.spark._buckets import BUCKETS, bucket_index
    from dpq_spark.spark._packing import pack_partition
    G, R, path, free = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
    gen = np.random.default_rng(1)
    x = gen.normal(0.0, 5.0, G * R)
    span = BUCKETS if free else 1 << 33  # code = gid * span + bucket, or + grid index
    cells = bucket_index(x) if free else Grid(-100.0, 100.0).snap(x)
    codes = np.repeat(np.arange(G, dtype=np.int64), R) * span + cells.astype(np.int64)
    del x, cells
    gen.shuffle(codes)  # rows arrive in any order on the map side
    batches = (pa.RecordBatch.from_arrays([pa.array(codes[i:i + 10_000])], names=["code"])
               for i in range(0, codes.size, 10_000))
    table = pa.Table.from_batches(list(pack_partition(batches, span=span)))
    with pa.ipc.new_stream(path + ".packed", table.schema) as writer:  # as packed
        writer.write_table(table)
    table = table.take(pc.sort_indices(table, [(table.schema.names[0], "ascending")]))
    with pa.ipc.new_stream(path, table.schema) as writer:  # as the sorted shuffle hands it
        for batch in table.combine_chunks().to_batches(max_chunksize=10_000):
            writer.write_batch(batch)
""")


def _input_of(tree: str, path: str) -> str:
    """The file a tree reads: sorted by bucket, or as packed for a tree that has no
    ``bucket_pieces`` (its plan did not sort the shuffle's output)."""
    with open(os.path.join(tree, "dpq_spark", "spark", "_packing.py")) as f:
        return path if "def bucket_pieces" in f.read() else path + ".packed"

# One measurement: the worker's imports, the stream read batch by batch, the release.
CHILD = textwrap.dedent("""
    import json, sys, time
    import numpy as np, pandas, pyarrow as pa
    import dpq_spark
    from dpq_spark.spark._buckets import BUCKETS
    from dpq_spark.spark._release import ReleaseParams, release_partition
    path, mechanism, G, traced = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
    free = sys.argv[5] == "1"
    bounds = dict(lower=None, upper=None, resolution=BUCKETS) if free else dict(
        lower=-100.0, upper=100.0, resolution=1 << 20)
    params = ReleaseParams(keys=("g",), quantiles=tuple(np.arange(1, 10) / 10), epsilon=1.0,
                           neighboring="add_remove", mechanism=mechanism, **bounds)
    if traced:
        import tracemalloc
        tracemalloc.start()
    with pa.OSFile(path, "rb") as f:
        reader = pa.ipc.open_stream(f)
        t, cpu = time.perf_counter(), time.process_time()
        released = 0
        for out in release_partition(iter(reader), params):
            released += out.num_rows
        wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    assert released == G, "every group released once"
    peak_traced = tracemalloc.get_traced_memory()[1] / 2**20 if traced else None
    with open("/proc/self/status") as status:
        hwm = next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))
    print(json.dumps({"wall": wall, "cpu": cpu, "rss": hwm / 1024.0, "traced": peak_traced}))
""")


def _run(path: str, code: str, *args) -> str:
    return _run_together(1, path, code, *args)[0]


def _run_together(workers: int, path: str, code: str, *args) -> list:
    """The last line each of ``workers`` children running ``code`` at once printed."""
    env = dict(os.environ, PYTHONPATH=path)
    children = [subprocess.Popen([sys.executable, "-c", code, *map(str, args)], env=env,
                                 cwd=path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for _ in range(workers)]
    lines = []
    for child in children:
        out, err = child.communicate()
        if child.returncode:
            raise RuntimeError(f"child failed:\n{err}")
        out = out.strip().splitlines()
        lines.append(out[-1] if out else "")
    return lines


def _slowest(lines: list) -> dict:
    """One measurement of children run together: the slowest child's times, the largest RSS."""
    runs = [json.loads(line) for line in lines]
    slow = max(runs, key=lambda r: r["wall"])
    return {**slow, "rss": max(r["rss"] for r in runs)}


def _trees(baseline: str | None, tmp: str) -> dict:
    """The package copies to measure, by label: this tree, and the baseline if given."""
    trees = {"this tree": ROOT}
    if baseline is None:
        return trees
    if os.path.isdir(os.path.join(baseline, "dpq_spark")):
        return {f"baseline {baseline}": baseline, **trees}
    archive = subprocess.run(["git", "-C", ROOT, "archive", baseline, "dpq_spark"],
                             capture_output=True, check=True).stdout
    os.makedirs(tmp, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
    return {f"baseline {baseline}": tmp, **trees}


def _parse_cases(text: str) -> list:
    try:
        return [tuple(int(float(v)) for v in case.split("x")) for case in text.split(",")]
    except ValueError:
        raise SystemExit(f"--cases must be GROUPSxROWS,..., got {text!r}") from None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Peak RSS is VmHWM of the child (whole process); times are the wall seconds of "
               "release_partition over the whole partition and its CPU microseconds per group.")
    parser.add_argument("--cases", default=DEFAULT_CASES,
                        help="comma-separated GROUPSxROWS, one partition each; 1e4 is accepted "
                             "(default: %(default)s)")
    parser.add_argument("--mechanism", default="auto",
                        help="comma-separated mechanisms of ReleaseParams (default: %(default)s; "
                             "e.g. auto,joint_exp)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="children per case and tree, alternating trees (best time, "
                             "largest RSS kept; default %(default)s)")
    parser.add_argument("--baseline", help="a directory holding dpq_spark, or a git revision, "
                                           "measured side by side")
    parser.add_argument("--no-bounds", action="store_true",
                        help="no bounds: each group buys private bounds (mechanism auto or "
                             "joint_exp)")
    parser.add_argument("--workers", type=int, default=1,
                        help="children run at once on the partition, as an executor's Python "
                             "workers (the slowest child's times; default %(default)s)")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="also report tracemalloc's peak (slower: times not comparable)")
    args = parser.parse_args()
    if args.workers < 1:
        raise SystemExit(f"--workers must be at least 1, got {args.workers}")
    cases = _parse_cases(args.cases)
    mechanisms = args.mechanism.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        trees = _trees(args.baseline, os.path.join(tmp, "baseline"))
        files = {}
        for groups, rows in cases:
            files[groups, rows] = os.path.join(tmp, f"{groups}x{rows}.arrow")
            _run(ROOT, PREPARE, groups, rows, files[groups, rows], int(args.no_bounds))
        best: dict = {}
        for _ in range(args.repeat):
            for groups, rows in cases:
                for mech in mechanisms:
                    for label, path in trees.items():  # alternate old and new
                        got = _slowest(_run_together(
                            args.workers, path, CHILD, _input_of(path, files[groups, rows]),
                            mech, groups,
                            int(args.tracemalloc), int(args.no_bounds)))
                        old = best.setdefault((groups, rows, mech, label), got)
                        old["wall"] = min(old["wall"], got["wall"])
                        old["cpu"] = min(old["cpu"], got["cpu"])
                        old["rss"] = max(old["rss"], got["rss"])
    bounds = "no bounds" if args.no_bounds else "bounds +-100"
    together = (f"; {args.workers} workers at once, each figure the slowest's"
                if args.workers > 1 else "")
    print(f"release_partition of one partition (deciles, eps 1, {bounds}, N(0, 5){together}); "
          f"best wall time and CPU time per group of {args.repeat}, largest peak RSS (VmHWM); "
          f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())} at the end")
    header = f"{'groups x rows':<18}{'mechanism':<11}"
    for label in trees:
        header += f" | {label[:34]:<34}"
    print(header)
    for groups, rows in cases:
        for mech in mechanisms:
            line = f"{f'{groups:,} x {rows:,}':<18}{mech:<11}"
            for label in trees:
                r = best[groups, rows, mech, label]
                cell = f"{r['rss']:6.0f} MiB {r['wall']:6.2f} s {r['cpu'] / groups * 1e6:7.0f} us/g cpu"
                if r["traced"] is not None:
                    cell += f" tm {r['traced']:4.0f}"
                line += f" | {cell:<34}"
            print(line)


if __name__ == "__main__":
    main()
