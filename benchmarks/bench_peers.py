"""dpq_spark's quantiles against other DP libraries' quantiles, on the same data and budget.

The peers are not dependencies of dpq_spark: run the script in venvs of its own (versions used
for ``benchmarks/results/peers.csv`` and ``docs/evaluation.md``, 2 December 2026, Python 3.11)::

    python -m venv /tmp/peers
    /tmp/peers/bin/pip install -e . pipeline-dp==0.3.1 opendp==0.16.0 diffprivlib==0.6.6 \\
        scikit-learn==1.7.2                     # diffprivlib 0.6.6 does not import with sklearn 1.8+
    /tmp/peers/bin/python benchmarks/bench_peers.py --out benchmarks/results/peers.csv

    # Tumult needs numpy < 2 and pyspark 3.5, diffprivlib 0.6.6 needs numpy >= 2: a second venv
    python -m venv /tmp/peers-tumult
    /tmp/peers-tumult/bin/pip install -e . tmlt.analytics==0.21.0      # pulls pyspark 3.5.9, numpy 1.26.4
    PYSPARK_PYTHON=/tmp/peers-tumult/bin/python /tmp/peers-tumult/bin/python \\
        benchmarks/bench_peers.py --only tumult --out benchmarks/results/peers.csv

``--out`` merges: rows of libraries not run this time are kept from the existing file, and the
table is printed from the merged rows. ``--only`` takes library and/or case names (comma
separated); ``--repeat`` sets the repetitions (default 50). Tumult, whose every quantile is a
Spark job of seconds, runs as many repetitions as fit in ``--slow-queries`` quantile queries per
case (default 45: 5 releases of deciles, 2 of 29 or 99 quantiles; at least 2). A library that does not import is reported as "not installed";
``.venv/bin/python benchmarks/bench_peers.py --help`` works without any peer.

Cases (epsilon = 1 for the whole release; quantiles ``q_j = j / (m + 1)``)
------------------------------------------------------------------------

==================  ===============================================================  ===========  ====
case                data                                                             bounds       m
==================  ===============================================================  ===========  ====
``gauss_1k``        N(0, 5), n = 1,000, a fresh sample per repetition                [-100, 100]  9
``ratings``         Goodreads ``average_rating`` (2 decimals), all parseable rows    [0, 5]       9
``ages``            clip(round(N(40, 15)), 0, 100), n = 1e4, fresh per repetition    [0, 100]     9
``ages_29``         the same ages                                                    [0, 100]     29
``ages_free``       the same ages, no bounds given                                   none         9
``gauss_10k_99``    N(0, 5), n = 1e4, fresh per repetition                           [-100, 100]  99
==================  ===============================================================  ===========  ====

The ratings come from ``data/goodreads_books.csv`` read the way ``docs/spark.md`` reads it (all
rows, the ``average_rating`` field converted to a float, rows where it does not parse dropped: a
few rows have an unquoted comma and their field is text), 11,123 values; they are the same in every
repetition, so their spread is the mechanisms' only. Synthetic data are seeded
(``numpy.random.default_rng([20261202, case, repetition])``).

Error: per release, the mean over the m quantiles of ``|released - true|``, the true quantile
being ``numpy.quantile(x, q, method="inverted_cdf")`` (the smallest data point with empirical CDF
>= q, a data point) for every library; the table gives the mean over the repetitions and its
standard error (std / sqrt(reps)).

The libraries, as a new user calls them (documented defaults; same bounds and epsilon)
-------------------------------------------------------------------------------------

``dpq``             ``dpq_spark.auto(x, q, epsilon=1, lower=, upper=, rng=)``: the core's
                    default mechanism, add/remove neighbours, no ``n_hint`` (5% of epsilon buys
                    a noisy count), pure 1-DP. ``ages_free``: no bounds (private bounds with 20%
                    of the rest).
``dpq_granularity`` the same with ``granularity=`` the data's step: 0.01 (ratings), 1 (ages:
                    the releases are integers); not run on the continuous cases.
``pipeline_dp``     PipelineDP 0.3.1 (``python-dp`` 1.1.5 underneath): ``DPEngine`` on the
                    ``LocalBackend``, ``NaiveBudgetAccountant(total_epsilon=1, total_delta=0)``,
                    ``AggregateParams(metrics=[Metrics.PERCENTILE(100 q) ...],
                    noise_kind=LAPLACE, max_partitions_contributed=1,
                    max_contributions_per_partition=1, min_value=, max_value=)``, one public
                    partition, each row its own privacy id: its quantile tree (16-ary, height 4,
                    Laplace noise), all m quantiles from one tree, pure 1-DP. Its randomness is
                    the C++ library's own and cannot be seeded.
``opendp``          OpenDP 0.16.0 (``dp.enable_features("contrib")``):
                    ``vector_domain(atom_domain(T=float, nan=False)), symmetric_distance()``
                    ``>> dp.m.then_private_quantile(dp.max_divergence(), candidates, alpha,
                    scale)`` per quantile, epsilon / m each (sequential composition, as
                    ``dp.Context.compositor(..., split_evenly_over=m)`` does). Deviation: the
                    scale is read off the measurement's own privacy map (``map(1)`` is inversely
                    proportional to the scale) instead of the Context's binary search, which is
                    the same scale but took about 1 s per quantile; every measurement is checked
                    to satisfy ``map(1) <= epsilon / m``. Candidates (OpenDP has no default):
                    the data's grid when it has one (0.01 on [0, 5], 1 on [0, 100]), else a grid
                    of step 0.01 on the bounds (20,001 candidates; ``--opendp-step``). Unseeded
                    (OpenDP's own randomness).
``diffprivlib``     diffprivlib 0.6.6: ``diffprivlib.tools.quantile(x, q, epsilon=1,
                    bounds=(lower, upper), random_state=seed)`` (its default accountant, of
                    unlimited budget: a ``BudgetAccountant(epsilon=1)`` refuses the 9th spend of
                    1/9 for deciles, the sum of the first 8 rounding above 8/9):
                    one exponential mechanism over the intervals between the sorted data per
                    quantile, epsilon / m each (its own split), a uniform point inside the
                    chosen interval.
``tumult``          Tumult Analytics 0.21.0 (pyspark 3.5.9, local[1]):
                    ``Session.from_dataframe(PureDPBudget(1), "data", df,
                    protected_change=AddOneRow())``, then per quantile
                    ``session.evaluate(QueryBuilder("data").quantile(col, q, low, high),
                    PureDPBudget(1 / m))`` (the last one takes the remaining budget, so that
                    float rounding does not refuse it). Every quantile is a Spark job (seconds
                    each), hence ``--slow-queries``. Unseeded.

Without bounds (``ages_free``) every peer is marked "needs bounds": PipelineDP and Tumult's
quantile require them, OpenDP needs a candidate set, and diffprivlib without bounds takes the
data's minimum and maximum (not private; it warns). Tumult has a separate ``get_bounds`` query,
but no default for sharing the budget between it and the quantiles, so it is not run here.
All libraries here use add/remove-one-row neighbours and pure epsilon-DP.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_CSV = os.path.join(ROOT, "data", "goodreads_books.csv")
EPSILON = 1.0
SEED = 20261202

# name: (label, data kind, n, lower, upper, granularity of the data or None, m)
CASES = {
    "gauss_1k": ("N(0, 5), n = 1,000, bounds ±100, deciles", "gauss", 1_000, -100.0, 100.0, None, 9),
    "ratings": ("Goodreads `average_rating`, bounds [0, 5], deciles", "ratings", None, 0.0, 5.0, 0.01, 9),
    "ages": ("ages round(N(40, 15)) in [0, 100], n = 1e4, deciles", "ages", 10_000, 0.0, 100.0, 1.0, 9),
    "ages_29": ("the same ages, 29 quantiles", "ages", 10_000, 0.0, 100.0, 1.0, 29),
    "ages_free": ("the same ages, no bounds, deciles", "ages", 10_000, None, None, 1.0, 9),
    "gauss_10k_99": ("N(0, 5), n = 1e4, bounds ±100, 99 quantiles", "gauss", 10_000, -100.0, 100.0,
                     None, 99),
}
LIBRARIES = ("dpq", "dpq_granularity", "pipeline_dp", "opendp", "diffprivlib", "tumult")
HEADERS = {"dpq": "dpq_spark `auto`", "dpq_granularity": "dpq_spark `auto`, granularity",
           "pipeline_dp": "PipelineDP", "opendp": "OpenDP", "diffprivlib": "diffprivlib",
           "tumult": "Tumult"}
FIELDS = ["case", "library", "version", "status", "reps", "mae", "se", "seconds"]


class Skip(Exception):
    """The library does not run this case (the message is the table's entry)."""


# --- data -----------------------------------------------------------------------------------

def load_ratings() -> np.ndarray:
    """``average_rating`` of every row whose field parses as a finite float (as docs/spark.md)."""
    values = []
    with open(DATA_CSV, newline="", encoding="utf-8") as f:
        rows = csv.reader(f)
        col = next(rows).index("average_rating")
        for row in rows:
            try:
                v = float(row[col])
            except (IndexError, ValueError):
                continue
            if math.isfinite(v):
                values.append(v)
    return np.asarray(values, dtype=np.float64)


def draw(case: str, rep: int, ratings: np.ndarray | None) -> np.ndarray:
    _, kind, n, *_ = CASES[case]
    if kind == "ratings":
        return ratings
    rng = np.random.default_rng([SEED, list(CASES).index(case), rep])
    if kind == "gauss":
        return rng.normal(0.0, 5.0, n)
    return np.clip(np.round(rng.normal(40.0, 15.0, n)), 0.0, 100.0)


# --- the libraries (imported lazily: the script runs without any of them) ------------------

class Library:
    name = ""
    slow = False

    def version(self) -> str | None:
        """The installed version, or None when the library does not import."""
        raise NotImplementedError

    def release(self, x, q, case, rep):
        """The m released values of one release at EPSILON (raise Skip when not applicable)."""
        raise NotImplementedError


class Dpq(Library):
    name = "dpq"

    def __init__(self, with_granularity: bool):
        self.with_granularity = with_granularity
        if with_granularity:
            self.name = "dpq_granularity"

    def version(self):
        import dpq_spark
        return dpq_spark.__version__

    def release(self, x, q, case, rep):
        import dpq_spark
        _, _, _, lower, upper, g, _ = CASES[case]
        extra = {}
        if self.with_granularity:
            if g is None:
                raise Skip("–")
            extra["granularity"] = g
        rng = np.random.default_rng([SEED, list(CASES).index(case), rep, 1 + self.with_granularity])
        return dpq_spark.auto(x, q, epsilon=EPSILON, lower=lower, upper=upper, rng=rng, **extra)


def _installed(module: str, distribution: str) -> str:
    """The distribution's version once the module imports (ImportError otherwise)."""
    import importlib
    from importlib.metadata import version

    importlib.import_module(module)
    return version(distribution)


def _needs_bounds(case):
    if CASES[case][3] is None:
        raise Skip("needs bounds")
    return CASES[case][3], CASES[case][4]


class PipelineDP(Library):
    name = "pipeline_dp"

    def version(self):
        return _installed("pipeline_dp", "pipeline-dp")

    def release(self, x, q, case, rep):
        import pipeline_dp
        lower, upper = _needs_bounds(case)
        accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=EPSILON, total_delta=0.0)
        engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
        params = pipeline_dp.AggregateParams(
            metrics=[pipeline_dp.Metrics.PERCENTILE(100.0 * float(p)) for p in q],
            noise_kind=pipeline_dp.NoiseKind.LAPLACE,
            max_partitions_contributed=1, max_contributions_per_partition=1,
            min_value=lower, max_value=upper)
        extractors = pipeline_dp.DataExtractors(privacy_id_extractor=lambda r: r[0],
                                                partition_extractor=lambda r: 0,
                                                value_extractor=lambda r: r[1])
        result = engine.aggregate(list(enumerate(x.tolist())), params, extractors,
                                  public_partitions=[0])
        accountant.compute_budgets()
        (_, metrics), = list(result)
        out = np.asarray(tuple(metrics), dtype=np.float64)
        if out.size != len(q):
            raise RuntimeError(f"PipelineDP returned {out.size} values for {len(q)} quantiles")
        return out


class OpenDP(Library):
    name = "opendp"

    def __init__(self, step: float = 0.01):
        self.step = step  # the candidates' step on data without a grid of their own
        self._cache = {}

    def version(self):
        return _installed("opendp", "opendp")

    def _measurements(self, case, q):
        if case not in self._cache:
            import opendp.prelude as dp
            dp.enable_features("contrib")
            lower, upper = _needs_bounds(case)
            step = CASES[case][5] or self.step
            k = int(round((upper - lower) / step))
            candidates = [float(v) for v in np.round(lower + step * np.arange(k + 1), 10)]
            space = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.symmetric_distance()
            share = EPSILON / len(q)
            measurements = []
            for alpha in q:
                def build(scale, alpha=float(alpha)):
                    return space >> dp.m.then_private_quantile(dp.max_divergence(), candidates,
                                                               alpha, scale)
                scale = build(1.0).map(1) / share  # epsilon is proportional to 1 / scale
                m = build(scale)
                while m.map(1) > share:  # float rounding: widen until the map is within budget
                    scale *= 1.0 + 1e-12
                    m = build(scale)
                measurements.append(m)
            self._cache[case] = measurements
        return self._cache[case]

    def release(self, x, q, case, rep):
        data = x.tolist()
        return np.asarray([m(data) for m in self._measurements(case, q)], dtype=np.float64)


class Diffprivlib(Library):
    name = "diffprivlib"

    def version(self):
        return _installed("diffprivlib", "diffprivlib")

    def release(self, x, q, case, rep):
        from diffprivlib.tools import quantile
        lower, upper = _needs_bounds(case)
        seed = int(np.random.default_rng([SEED, list(CASES).index(case), rep, 3]).integers(2**31))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a privacy-leak warning must not pass silently
            return np.asarray(quantile(x, q, epsilon=EPSILON, bounds=(lower, upper),
                                       random_state=seed), dtype=np.float64)


class Tumult(Library):
    name = "tumult"
    slow = True

    def __init__(self):
        self._spark = None

    def version(self):
        return _installed("tmlt.analytics", "tmlt.analytics")

    def _session(self):
        if self._spark is None:
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            from pyspark.sql import SparkSession
            self._spark = (SparkSession.builder.master("local[1]")
                           .config("spark.ui.enabled", "false")
                           .config("spark.ui.showConsoleProgress", "false")
                           .config("spark.sql.shuffle.partitions", "1").getOrCreate())
            self._spark.sparkContext.setLogLevel("ERROR")  # the benchmark's own session only
        return self._spark

    def release(self, x, q, case, rep):
        from tmlt.analytics import AddOneRow, PureDPBudget, QueryBuilder, Session
        lower, upper = _needs_bounds(case)
        spark = self._session()
        df = spark.createDataFrame([(float(v),) for v in x], "x double").coalesce(1)
        session = Session.from_dataframe(privacy_budget=PureDPBudget(EPSILON), source_id="data",
                                         dataframe=df, protected_change=AddOneRow())
        out = []
        for j, p in enumerate(q):
            budget = (session.remaining_privacy_budget if j == len(q) - 1
                      else PureDPBudget(EPSILON / len(q)))
            query = QueryBuilder("data").quantile("x", float(p), lower, upper)
            out.append(session.evaluate(query, budget).collect()[0][0])
        return np.asarray(out, dtype=np.float64)


def make_libraries(opendp_step: float = 0.01):
    return {"dpq": Dpq(False), "dpq_granularity": Dpq(True), "pipeline_dp": PipelineDP(),
            "opendp": OpenDP(opendp_step), "diffprivlib": Diffprivlib(), "tumult": Tumult()}


# --- the run --------------------------------------------------------------------------------

def run(cases, libraries, repeat, slow_queries):
    """One row per (case, library). Libraries alternate inside each repetition."""
    ratings = load_ratings() if any(CASES[c][1] == "ratings" for c in cases) else None
    rows = []
    versions = {}
    for name, lib in libraries.items():
        try:
            versions[name] = lib.version()
        except ImportError:
            versions[name] = None
    for case in cases:
        m = CASES[case][6]
        q = np.arange(1, m + 1) / (m + 1)
        errs = {name: [] for name in libraries}
        secs = {name: 0.0 for name in libraries}
        status = {name: "ok" if versions[name] else "not installed" for name in libraries}
        reps = {name: min(repeat, max(2, slow_queries // m)) if lib.slow else repeat
                for name, lib in libraries.items()}
        for rep in range(repeat):
            x = draw(case, rep, ratings)
            true = np.quantile(x, q, method="inverted_cdf")
            for name, lib in libraries.items():
                if status[name] != "ok" or rep >= reps[name]:
                    continue
                start = time.perf_counter()
                try:
                    out = np.asarray(lib.release(x, q, case, rep), dtype=np.float64)
                except Skip as skip:
                    status[name] = str(skip)
                    continue
                secs[name] += time.perf_counter() - start
                errs[name].append(float(np.mean(np.abs(out - true))))
        for name in libraries:
            e = errs[name]
            ok = status[name] == "ok" and e
            rows.append({
                "case": case, "library": name, "version": versions[name] or "",
                "status": status[name], "reps": len(e),
                "mae": f"{np.mean(e):.6g}" if ok else "",
                "se": f"{np.std(e, ddof=1) / math.sqrt(len(e)):.3g}" if ok and len(e) > 1 else "",
                "seconds": f"{secs[name] / len(e):.3g}" if ok else "",
            })
            print(f"{case:13s} {name:16s} {rows[-1]['status']:14s} reps {len(e):3d} "
                  f"mae {rows[-1]['mae']:>10s} ± {rows[-1]['se']:>8s}  {rows[-1]['seconds']:>7s} s"
                  f"  (load {os.getloadavg()[0]:.2f})", flush=True)
    return rows


def _fmt(value: float) -> str:
    return f"{value:.2g}" if value < 0.01 else (f"{value:.3f}" if value < 1 else f"{value:.3g}")


def table(rows, repeat) -> str:
    """The Markdown table: one line per case, ``mean ± standard error`` per library."""
    by = {(r["case"], r["library"]): r for r in rows}
    libs = [lib for lib in LIBRARIES if any(r["library"] == lib for r in rows)]
    lines = ["| data | " + " | ".join(HEADERS[lib] for lib in libs) + " |",
             "|---|" + "---:|" * len(libs)]
    for case in CASES:
        if not any(r["case"] == case for r in rows):
            continue
        cells = []
        for lib in libs:
            r = by.get((case, lib))
            if r is None:
                cells.append("not run")
            elif r["status"] != "ok":
                cells.append(r["status"])
            else:
                cell = _fmt(float(r["mae"]))
                if r["se"]:
                    cell += f" ± {_fmt(float(r['se']))}"
                if int(r["reps"]) != repeat:
                    cell += f" ({r['reps']} reps)"
                cells.append(cell)
        lines.append(f"| {CASES[case][0]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Peers are imported lazily; see the module docstring for the venvs and versions.")
    parser.add_argument("--repeat", type=int, default=50, help="repetitions per case (default 50)")
    parser.add_argument("--slow-queries", type=int, default=45,
                        help="Tumult's quantile queries per case (one Spark job each; default 45, "
                             "at least 2 releases)")
    parser.add_argument("--only", default="",
                        help=f"comma-separated libraries ({', '.join(LIBRARIES)}) and/or cases "
                             f"({', '.join(CASES)}); default all")
    parser.add_argument("--opendp-step", type=float, default=0.01,
                        help="step of OpenDP's candidates on data without a grid (default 0.01)")
    parser.add_argument("--out", default=None,
                        help="CSV to write; rows of libraries not run are kept from an existing file")
    args = parser.parse_args(argv)
    if not 0 < args.opendp_step <= 1:
        parser.error("--opendp-step must be in (0, 1]")
    if args.repeat < 1 or args.slow_queries < 1:
        parser.error("--repeat and --slow-queries must be >= 1")
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in LIBRARIES and s not in CASES]
    if unknown:
        parser.error(f"--only: unknown names {unknown}; libraries {list(LIBRARIES)}, cases {list(CASES)}")
    libs = [s for s in only if s in LIBRARIES] or list(LIBRARIES)
    cases = [s for s in only if s in CASES] or list(CASES)
    libraries = {name: lib for name, lib in make_libraries(args.opendp_step).items() if name in libs}

    sys.path.insert(0, ROOT)
    print(f"epsilon {EPSILON}, {args.repeat} repetitions (Tumult: {args.slow_queries} queries); "
          f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}", flush=True)
    started = time.time()
    rows = run(cases, libraries, args.repeat, args.slow_queries)
    print(f"done in {time.time() - started:.0f} s; load average {os.getloadavg()[0]:.2f} "
          f"{os.getloadavg()[1]:.2f}", flush=True)

    if args.out:
        if os.path.exists(args.out):
            with open(args.out, newline="") as f:
                ran = {(r["case"], r["library"]) for r in rows}
                kept = [r for r in csv.DictReader(f) if (r["case"], r["library"]) not in ran]
            rows = kept + rows
        rows.sort(key=lambda r: (list(CASES).index(r["case"]), LIBRARIES.index(r["library"])))
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {args.out}")
    print()
    print(table(rows, args.repeat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
