"""The dp_quantiles job: config in, one committed DP release and one ledger record out.

``main(argv)`` is what ``spark-submit jobs/dp_quantiles.py --config conf/x.toml`` and
``dpq-spark run --config conf/x.toml`` call. The stages, in order:

1. load and validate the configuration (flags override the file);
2. refuse early if the output exists and ``output.mode`` is not ``"overwrite"``;
3. open the ledger (never created unless ``ledger.create = true``), remove temporary outputs
   that dead runs of this dataset left behind, and check (read-only) that the budget fits;
4. get the Spark session (the active one, or a plain ``getOrCreate()``; one the job starts
   itself gets the log4j2 configuration ``conf/log4j2.properties``, see
   :mod:`dpq_spark.pipeline.launch`); resolve the input's schema and the public keys *without
   reading data*: the columns must exist, the value column must be numeric (its type in a
   typed source, the type ``input.schema`` declares for CSV) and the key set must not be empty;
5. reserve ε (and δ) in the ledger and mark the reservation spent at once, before any private
   row is read;
6. with ``input.csv.mode = "FAILFAST"`` parse the whole input once (a malformed row fails the
   job here, and the budget stays charged); run :func:`dpq_spark.spark.dp_quantiles`
   (materialised);
7. write the release into a hidden ``.<name>.incomplete-r<record>-<hex>`` directory beside the
   target (its path recorded in the ledger) and rename it into place, so the output exists
   completely or not at all;
8. commit the ledger record with the output location.

``--dry-run`` (:func:`dry_run`) stops after stage 3: it validates the configuration, checks
the output path and the budget in the existing ledger (never creating or changing it), prints
what the run would spend and where it would write, and reads no data and starts no Spark.

A failure or SIGTERM/SIGINT before the reservation is marked spent gives it back (exit 143/130
for the signals): those failures are decided by the configuration, the schema and the ledger
alone. From the mark on the budget stays charged whatever happens (a failure, a signal, the
process dying): whether reading succeeds can depend on the data (a ``FAILFAST`` parse, reader
options such as ``quote``), and a refund would answer that question for free. A session the
job started itself is stopped on every exit path, so its JVM does not outlive the job. Logs name
the stages, their timings and the public parameters; they never contain values, counts or group
sizes, and errors that could carry data (Spark's own) are logged by class name only unless
``--show-errors`` is given.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import json
import logging
import os
import shlex
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, Iterator

from dpq_spark.pipeline.config import (
    OUTPUT_MODES,
    ConfigError,
    JobConfig,
    load_config,
    parse_override,
    quantiles_from_text,
)
from dpq_spark.core.errors import BudgetExceededError, DPQValueError
from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.pipeline.ledger import (
    BudgetUsage, Ledger, LedgerError, is_postgres_url, open_ledger,
)
from dpq_spark.pipeline.ledger.base import sqlite_path
from dpq_spark.pipeline._signals import (
    JobInterrupted, fault_point, signals_raise,
)
from dpq_spark.pipeline.inputs import read_input, read_keys
from dpq_spark.pipeline.launch import get_session, stop_session
from dpq_spark.pipeline.charge import check_unit, reserved, stored_release
from dpq_spark.pipeline.outputs import (
    OutputConflictError, OutputExistsError, append_to_table, clean_stale, output_exists,
    write_release,
)
from dpq_spark.spark._workers import WorkerPythonError, check_workers

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

__all__ = ["main", "run_job", "dry_run", "build_parser", "guarantee", "JobResult",
           "MissingSparkError"]

log = logging.getLogger(__name__)


EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_BUDGET, EXIT_OUTPUT_EXISTS = 0, 1, 2, 3, 4
EXIT_SIGINT, EXIT_SIGTERM = 128 + signal.SIGINT, 128 + signal.SIGTERM
#: A closed standard output (``... | head``): 128 + SIGPIPE, what a shell reports.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")

#: What the Spark extra installs, one line for a user who lacks it.
SPARK_EXTRA = ("pip install 'dpq_spark[spark]' (from a clone of the repository: "
               "pip install -e '.[spark]')")


class MissingSparkError(ImportError):
    """pyspark, pandas or pyarrow is not installed: the job needs the ``spark`` extra
    (raised before the ledger is opened)."""


def _require_spark() -> None:
    try:
        import pandas  # noqa: F401
        import pyarrow  # noqa: F401
        import pyspark.sql  # noqa: F401
    except ImportError as exc:
        missing = (exc.name or "").split(".")[0] or "a Spark dependency"
        raise MissingSparkError(f"the job needs the Spark extra ({missing} is not installed): "
                                f"{SPARK_EXTRA}") from None


@dataclasses.dataclass(frozen=True)
class JobResult:
    """What a successful run produced: where the release is and its ledger record."""

    output: str
    record_id: int
    seconds: float
    epsilon: float = 0.0  # what the run charged
    delta: float = 0.0
    usage: BudgetUsage | None = None  # the dataset's budget after the run


@contextlib.contextmanager
def _stage(name: str) -> Iterator[None]:
    log.info("stage %s: started", name)
    start = time.perf_counter()
    try:
        yield
    except BaseException as exc:
        log.error("stage %s: failed after %.2f s (%s)", name, time.perf_counter() - start,
                  type(exc).__name__)
        raise
    log.info("stage %s: done in %.2f s", name, time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------
# Spark session and input
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def guarantee(cfg: JobConfig) -> str:
    """The privacy guarantee of a release, in words (stored with it and in the docs)."""
    r = cfg.release
    dp = f"({r.epsilon:g}, {r.delta:g})-DP" if r.delta is not None else f"{r.epsilon:g}-DP"
    unit = ("one row" if r.privacy_unit is None else
            f"all rows of one `{r.privacy_unit}` (at most {r.max_rows_per_unit} row(s) per group "
            f"and {r.max_groups_per_unit} group(s) per unit are kept)")
    relation = "adding or removing" if r.neighboring == "add_remove" else "changing"
    if r.lower is None:
        from dpq_spark.core.quantiles.bounds import DEFAULT_BOUNDS_SHARE

        share = DEFAULT_BOUNDS_SHARE if r.bounds_share is None else r.bounds_share
        return (f"{dp} for {relation} {unit} (in each group: private clamping bounds with "
                f"{share:g} of epsilon, then the quantiles with the rest; basic composition), "
                "assuming the quantiles and the group keys were chosen without looking at the data")
    return (f"{dp} for {relation} {unit}, assuming the bounds [{r.lower:g}, {r.upper:g}], the "
            "quantiles and the group keys were chosen without looking at the data")


# ---------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------


def run_job(cfg: JobConfig, *, rng=None) -> JobResult:
    """Run one configured release end to end (see the module docstring for the stages).

    Parameters
    ----------
    cfg : JobConfig
        A validated configuration.
    rng : numpy.random.Generator, optional
        Only for tests; production runs draw fresh OS entropy.

    Returns
    -------
    JobResult

    Raises
    ------
    OutputExistsError
        The output exists and ``output.mode`` is not ``"overwrite"`` (nothing reserved).
    BudgetExceededError
        The ledger refuses the reservation (no data read).
    ConfigError
        A column, its type or the key set does not fit (nothing reserved), or a FAILFAST
        parse failed (the budget stays charged: the input was read).
    LedgerError
        The ledger is missing, unreachable or refuses (nothing reserved).
    JobInterrupted, KeyboardInterrupt
        SIGTERM/SIGINT: a reservation is given back if no private row was read yet.
    OutputConflictError
        The output appeared while the job ran (budget charged, nothing written).
    MissingSparkError
        pyspark, pandas or pyarrow is not installed (nothing opened or reserved).
    WorkerPythonError
        A local session's Python workers would run an interpreter without dpq_spark
        (nothing reserved).

    Privacy
    -------
    The release is ε-DP (or (ε, δ)-DP with partition selection) as stated by
    :func:`dpq_spark.spark.dp_quantiles` and recorded by :func:`guarantee`; the ledger charges
    it against the dataset's cap under basic composition. Nothing data-dependent happens
    outside the mechanism: before the reservation the job reads only public metadata (schemas,
    the CSV header) and the public keys.
    """
    _require_spark()
    started = time.perf_counter()
    params = cfg.public_parameters()
    led = cfg.ledger
    log.info("job %s: public parameters %s", cfg.name, json.dumps(params, sort_keys=True))
    log.info("job %s: output %s (format=%s, mode=%s); ledger %s (dataset %r)", cfg.name,
             cfg.output.where, cfg.output.format, cfg.output.mode, led.name, led.dataset_id)

    ledger = None
    if cfg.release_name is not None:  # a named run released before is returned, not redone
        with _stage("look up the named release"):
            ledger = open_ledger(led.url, create=led.create, password_file=led.password_file)
            before = _released_before(cfg, ledger, params, started)
        if before is not None:
            return before

    with _stage("check output"):
        _refuse_existing_output(cfg)

    with _stage("open ledger"):
        if ledger is None:
            ledger = open_ledger(led.url, create=led.create, password_file=led.password_file)
        clean_stale(ledger, led.dataset_id)
        ledger.check_budget(led.dataset_id, epsilon=cfg.release.epsilon, delta=cfg.release.delta,
                            epsilon_cap=led.epsilon_cap, delta_cap=led.delta_cap,
                            create_dataset=led.create)
        if led.dataset_id in ledger.datasets():  # a budget the job creates counts one row
            check_unit(led.dataset_id, ledger.unit(led.dataset_id), cfg.release.privacy_unit,
                       cfg.release.neighboring, what=f"job {cfg.name!r}")

    spark, started_here = None, False
    try:
        with _stage("start spark"):
            spark, started_here = get_session(cfg.spark_properties)
            check_workers(spark, "the job", grouped=bool(cfg.input.group_by))  # before reserving
        with _stage("check input"):
            data = read_input(spark, cfg.input, cfg.release.privacy_unit)
            keys = read_keys(spark, cfg.groups, data, cfg.input.group_by)
        path, record = _reserve_and_release(cfg, ledger, data, keys, params, rng)
    finally:
        if started_here:
            stop_session(spark)
    seconds = time.perf_counter() - started
    log.info("job %s: release committed as ledger record %d in %.2f s", cfg.name, record, seconds)
    return JobResult(output=path, record_id=record, seconds=seconds, epsilon=cfg.release.epsilon,
                     delta=cfg.release.delta or 0.0, usage=ledger.usage(led.dataset_id))


def _refuse_existing_output(cfg: JobConfig) -> None:
    if cfg.output.path is None:
        return  # a table only: appended to
    if output_exists(cfg.output) and cfg.output.mode != "overwrite":
        raise OutputExistsError(
            f"`output.path` {cfg.output.path!r} already holds a release; set "
            "`output.mode = \"overwrite\"` (or --output-mode overwrite) to replace it, or "
            "write to a new path (e.g. with the {timestamp} placeholder)")


def _released_before(cfg: JobConfig, ledger: Ledger, params: dict, started: float):
    """The committed release of this named run (``job.run_id``) as a :class:`JobResult` that
    charged nothing; None when the run has none. Refused when the name was used with other
    parameters, or was charged and never committed (a fresh draw would be a second answer)."""
    led = cfg.ledger
    record = stored_release(ledger, led.dataset_id, cfg.release_name, params,
                            what=f"run {cfg.run_id!r} of job {cfg.name!r}",
                            rename="give the run another `--run-id`")
    if record is None:
        return None
    log.info("job %s: run %r was released before as ledger record %d; nothing charged", cfg.name,
             cfg.run_id, record.id)
    return JobResult(output=record.output, record_id=record.id,
                     seconds=time.perf_counter() - started, epsilon=0.0, delta=0.0,
                     usage=ledger.usage(led.dataset_id))


def _reserve_and_release(cfg: JobConfig, ledger: Ledger, data, keys, params, rng):
    """Reserve, mark spent, release, write and commit, through the life of a charge that
    every release path shares (:mod:`dpq_spark.pipeline.charge`)."""
    led, r = cfg.ledger, cfg.release
    with contextlib.ExitStack() as charged:
        with _stage("reserve budget"):  # a failure until spending() gives it back
            charge = charged.enter_context(reserved(
                ledger, led.dataset_id, by=f"job {cfg.name}", epsilon=r.epsilon, delta=r.delta,
                epsilon_cap=led.epsilon_cap, delta_cap=led.delta_cap, mechanism=r.mechanism,
                parameters=params, create_dataset=led.create, name=cfg.release_name))
        fault_point("after_reserve")
        # Spent before the first private row is read: from here on whether the job succeeds,
        # fails or is stopped may depend on the data (a FAILFAST parse, Spark's own errors),
        # so no outcome gives the budget back.
        with charge.spending():
            if cfg.input.format == "csv" and cfg.input.csv_mode == "FAILFAST":
                with _stage("parse input (FAILFAST)"):
                    _parse_all(data)
            from dpq_spark.spark import dp_quantiles

            with _stage("release"):
                result = dp_quantiles(
                    data, cfg.input.column, quantiles=list(r.quantiles), epsilon=r.epsilon,
                    lower=r.lower, upper=r.upper, group_by=list(cfg.input.group_by) or None,
                    groups=keys, neighboring=r.neighboring, privacy_unit=r.privacy_unit,
                    max_rows_per_unit=r.max_rows_per_unit,
                    max_groups_per_unit=r.max_groups_per_unit, delta=r.delta,
                    resolution=r.resolution, mechanism=r.mechanism, bounds_share=r.bounds_share,
                    granularity=r.granularity, rng=rng)
            fault_point("after_sample")
            fault_point("after_sample_term")
            created = _dt.datetime.now(_dt.timezone.utc)
            metadata = {
                **params,
                "dataset_id": led.dataset_id,
                "ledger_record": charge.id,
                "guarantee": guarantee(cfg),
                "created_at": created.isoformat(timespec="seconds"),
                "columns": result.columns,
                # the release's random source: the OS CSPRNG (true) unless a test passed a seed
                "cryptographic": resolve_rng(rng).cryptographic,
            }
            written = []
            if cfg.output.path is not None:
                with _stage("write output"):
                    written.append(write_release(result, cfg.output, metadata, record=charge.id,
                                                 on_temp=charge.record_output))
            if cfg.output.table is not None:
                with _stage("append to table"):
                    append_to_table(result, cfg.output.table, {
                        "release_name": cfg.release_name or cfg.name,
                        "released_at": created.replace(tzinfo=None), "dataset_id": led.dataset_id,
                        "ledger_record": charge.id, "epsilon": r.epsilon,
                        "delta": r.delta or 0.0, "privacy_unit": _unit_words(r)})
                written.append(f"table {cfg.output.table}")
            with _stage("commit ledger"):
                charge.commit(" and ".join(written))
    return " and ".join(written), charge.id


def _unit_words(r) -> str:
    """The release's privacy unit in words, e.g. ``"one row (add/remove)"``."""
    relation = "add/remove" if r.neighboring == "add_remove" else "swap"
    unit = "one row" if r.privacy_unit is None else f"all rows of one `{r.privacy_unit}`"
    return f"{unit} ({relation})"


def _parse_all(data: "DataFrame") -> None:
    """Parse every row once (``input.csv.mode = "FAILFAST"``), turning Spark's parse failure
    into a :class:`ConfigError` that does not echo the offending row. Runs after the
    reservation is marked spent: a failure here depends on the data and stays charged."""
    try:
        data.write.format("noop").mode("overwrite").save()
    except Exception as exc:
        text = f"{type(exc).__name__} {exc}"
        if "FAILFAST" in text or "MALFORMED" in text.upper():
            raise ConfigError("`input.csv.mode` is \"FAILFAST\" and the input has a malformed "
                              "row or a field that does not parse as its declared type "
                              "(details suppressed: they may contain data); nothing was "
                              "released, and the budget stays charged: the input was read") \
                from None
        raise


def dry_run(cfg: JobConfig, *, out=print) -> None:
    """Check a run without running it: print what it would spend and where it would write.

    The same refusals as :func:`run_job` up to its budget check, in the same order: the output
    exists (and ``output.mode`` is not ``"overwrite"``), the ledger or the dataset is missing,
    the charge would pass a cap. The ledger is opened, never created (a SQLite ledger that
    ``ledger.create = true`` would create is reported as such), and nothing is written to it;
    no data is read and no Spark session is started (pyspark need not be installed).

    Parameters
    ----------
    cfg : JobConfig
        A validated configuration.
    out : callable
        Receives each line of the report (default :func:`print`). Lines come as the checks
        pass, so a refused run still shows what it asked for.

    Raises
    ------
    OutputExistsError, LedgerError, BudgetExceededError
        As :func:`run_job` would before reserving.

    Privacy
    -------
    Reads public configuration and the ledger's public totals only; spends nothing.
    """
    r, led = cfg.release, cfg.ledger
    delta = 0.0 if r.delta is None else r.delta
    out(f"dry run of job {cfg.name}: nothing is read, reserved or written")
    out(f"release: epsilon={r.epsilon:g}, delta={delta:g}, {len(r.quantiles)} quantile(s) of "
        f"{cfg.input.column!r}" + (f" per {', '.join(cfg.input.group_by)}"
                                   if cfg.input.group_by else "")
        + f", mechanism {r.mechanism}; guarantee: {guarantee(cfg)}")
    out(f"output: {cfg.output.where} (format {cfg.output.format}, mode {cfg.output.mode})")
    _refuse_existing_output(cfg)
    out(f"ledger: {led.name}, dataset {led.dataset_id!r}")
    shown = False
    if led.create and not is_postgres_url(led.url) and not os.path.exists(sqlite_path(led.url)):
        # `ledger.create` needs `epsilon_cap` (load_config checks): the budget the run creates
        out("the ledger does not exist yet: the run would create it (`ledger.create = true`)")
        before = BudgetUsage(led.dataset_id, 0.0, 0.0, float(led.epsilon_cap),
                             float(led.delta_cap or 0.0))
        out(_budget_line("before", before))
        shown = True
        if r.epsilon > before.epsilon_cap:
            raise BudgetExceededError(r.epsilon, before.epsilon_cap, "epsilon")
        if delta > before.delta_cap:
            raise BudgetExceededError(delta, before.delta_cap, "delta")
    else:
        ledger = open_ledger(led.url, password_file=led.password_file)  # never create=True
        stored = ledger.usage(led.dataset_id)
        if stored.epsilon_cap is not None:  # the caps in force: a configured one only lowers
            before = dataclasses.replace(
                stored, epsilon_cap=_lower(led.epsilon_cap, stored.epsilon_cap),
                delta_cap=_lower(led.delta_cap, stored.delta_cap))
            out(_budget_line("before", before))
            shown = True
        before = ledger.check_budget(led.dataset_id, epsilon=r.epsilon, delta=r.delta,
                                     epsilon_cap=led.epsilon_cap, delta_cap=led.delta_cap,
                                     create_dataset=led.create)
        if stored.epsilon_cap is None:
            out("the dataset has no budget yet: the run would create it (`ledger.create = "
                "true`)")
    if not shown:
        out(_budget_line("before", before))
    after = dataclasses.replace(before, epsilon_spent=before.epsilon_spent + r.epsilon,
                                delta_spent=before.delta_spent + delta)
    out(_budget_line("after", after))
    out("the run would be allowed (its reservation is checked again when it runs)")


def _lower(configured: float | None, stored: float) -> float:
    return stored if configured is None else min(float(configured), stored)


def _budget_line(when: str, usage: BudgetUsage) -> str:
    line = (f"budget {when} this run: epsilon left {_g(usage.epsilon_remaining)} of cap "
            f"{_g(usage.epsilon_cap)}")
    if usage.delta_cap or usage.delta_spent:
        line += f", delta left {_g(usage.delta_remaining)} of cap {_g(usage.delta_cap)}"
    return line


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def build_parser(prog: str = "dp_quantiles") -> argparse.ArgumentParser:
    """The job's command line: ``--config`` plus flags that override single config keys."""
    p = argparse.ArgumentParser(
        prog=prog, description="Release DP quantiles of a column, per public group, as configured "
        "in a TOML file; flags override the file.")
    p.add_argument("--config", required=True, help="the job's TOML file (see conf/)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override any key, value in TOML syntax (repeatable)")
    flags = [
        ("--input", "input", "path", str), ("--column", "input", "column", str),
        ("--epsilon", "release", "epsilon", float), ("--delta", "release", "delta", float),
        ("--lower", "release", "lower", float), ("--upper", "release", "upper", float),
        ("--quantiles", "release", "quantiles", quantiles_from_text),
        ("--output", "output", "path", str), ("--output-format", "output", "format", str),
        ("--ledger", "ledger", "url", str), ("--dataset-id", "ledger", "dataset_id", str),
        ("--run-id", "job", "run_id", str),
    ]
    for flag, section, key, kind in flags:
        p.add_argument(flag, dest=f"{section}.{key}", type=kind, default=None,
                       help=f"override {section}.{key}")
    p.add_argument("--output-mode", dest="output.mode", choices=OUTPUT_MODES, default=None,
                   help="override output.mode ('overwrite' replaces an earlier release)")
    p.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS,
                   metavar="LEVEL", help=f"Python logging level: {', '.join(LOG_LEVELS)} "
                   "(any case; default INFO)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the config, the output path and the budget, print what the run "
                   "would spend and where it would write, and stop: no data is read, no Spark "
                   "session started, nothing reserved or written")
    p.add_argument("--show-errors", action="store_true",
                   help="print full tracebacks of unexpected errors (they may contain data)")
    return p


def _overrides(args: argparse.Namespace) -> list[tuple[str, str, Any]]:
    out = [parse_override(text) for text in args.set]
    for dest, value in vars(args).items():
        if "." in dest and value is not None:
            section, key = dest.split(".")
            out.append((section, key, value))
    return out


def _configure_logging(level: str) -> None:
    root = logging.getLogger()
    if not root.handlers:  # an application (the job) may add a handler; the library never does
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("dpq_spark").setLevel(level.upper())


def _cli_command() -> str:
    """How to call ``dpq-spark`` from here: the plain name when this interpreter's script is
    the one on ``PATH``, else the script beside this interpreter (a venv that is not
    activated: ``.venv/bin/dpq-spark``)."""
    import shutil

    beside = os.path.join(os.path.dirname(sys.executable), "dpq-spark")
    on_path = shutil.which("dpq-spark")
    if not os.path.exists(beside) or (
            on_path is not None and os.path.abspath(on_path) == os.path.abspath(beside)):
        return "dpq-spark"
    relative = os.path.relpath(beside)
    return shlex.quote(beside if relative.startswith(os.pardir) else relative)


def main(argv: list[str] | None = None, *, prog: str = "dp_quantiles") -> int:
    """Run the job from the command line.

    Parameters
    ----------
    argv : list of str, optional
        The arguments (default ``sys.argv[1:]``): ``--config FILE`` and override flags.
    prog : str
        Program name shown in ``--help``.

    Returns
    -------
    int
        The exit code: 0 released (with ``--dry-run``: the run would be allowed); 2
        configuration or ledger error, a missing Spark extra, or local Python workers without
        dpq_spark (nothing reserved, or the reservation given back), or a ``FAILFAST`` parse
        failure (charged: the input was read); 3 budget exceeded (nothing
        reserved); 4 output exists (nothing reserved); 141 standard output closed by its
        reader (``| head``; quietly); 143 SIGTERM and 130 SIGINT (the reservation is given
        back if no private row was read yet, else it stays charged); 1 any other failure
        (charged if it came after the input was read: ``dpq-spark ledger show`` tells). The output path is printed on success; each
        error is reported once, through the ``dpq_spark.pipeline.job`` logger (stderr by default).

    Privacy
    -------
    See :func:`run_job`: one release with the configured guarantee, charged to the ledger
    before any data is read.
    """
    try:
        code = _main(argv, prog)
        sys.stdout.flush()  # a closed pipe shows here, inside the try, not at interpreter exit
    except BrokenPipeError:
        return stdout_closed()
    return code


def stdout_closed() -> int:
    """After a ``BrokenPipeError`` on standard output: Python's recipe (the ``signal`` module's
    "Note on SIGPIPE") sends what is left to devnull, so that the flush at interpreter exit
    does not fail again; returns :data:`EXIT_BROKEN_PIPE`, with no message."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_BROKEN_PIPE


def _main(argv: list[str] | None, prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    _configure_logging(args.log_level)
    cfg = None
    try:
        with signals_raise():
            cfg = load_config(args.config, _overrides(args))
            if args.dry_run:
                dry_run(cfg)
                return EXIT_OK
            result = run_job(cfg)
    except (ConfigError, LedgerError) as exc:
        log.error("configuration error: %s", exc)
        return EXIT_CONFIG
    except BudgetExceededError as exc:
        log.error("ledger refused the release: %s (see `%s ledger show`)", exc, _cli_command())
        return EXIT_BUDGET
    except (MissingSparkError, WorkerPythonError) as exc:  # one line that says how to fix it
        log.error("%s", exc)
        return EXIT_CONFIG
    except OutputExistsError as exc:
        log.error("%s", exc)
        return EXIT_OUTPUT_EXISTS
    except OutputConflictError as exc:
        log.error("%s", exc)
        return EXIT_FAILED
    except DPQValueError as exc:  # our own messages never echo data
        log.error("invalid release parameters: %s", exc)
        return EXIT_CONFIG
    except JobInterrupted as exc:
        log.error("job %s", exc)
        return 128 + exc.signum
    except KeyboardInterrupt:
        log.error("job interrupted (SIGINT)")
        return EXIT_SIGINT
    except BrokenPipeError:
        raise  # the dry run's reader closed stdout: main() ends quietly
    except Exception as exc:
        if args.show_errors:
            raise
        log.error("job failed with %s; details suppressed because they may contain data "
                  "(rerun with --show-errors)", type(exc).__name__)
        return EXIT_FAILED
    print(f"Release written to {result.output}")
    if result.usage is not None:
        u = result.usage
        delta = (f", delta {result.delta:g} (left {u.delta_remaining:g} of {u.delta_cap:g})"
                 if result.delta else "")
        if result.epsilon == 0.0:
            print(f"Nothing spent: run {cfg.run_id!r} was released before (ledger record "
                  f"{result.record_id}); {u.epsilon_remaining:g} of {u.epsilon_cap:g} left")
        else:
            print(f"Spent epsilon {result.epsilon:g} of dataset {cfg.ledger.dataset_id!r}: "
                  f"{u.epsilon_remaining:g} of {u.epsilon_cap:g} left{delta}")
    print(f"Ledger record {result.record_id}: {_cli_command()} ledger show --ledger "
          f"{shlex.quote(cfg.ledger.name)} --dataset {shlex.quote(cfg.ledger.dataset_id)}")
    return EXIT_OK
