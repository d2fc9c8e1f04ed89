"""The dp_quantiles job: config in, one committed DP release and one ledger record out.

``main(argv)`` is what ``spark-submit jobs/dp_quantiles.py --config conf/x.toml`` and
``dpq-spark run --config conf/x.toml`` call. The stages, in order:

1. load and validate the configuration (flags override the file);
2. refuse early if the output exists and ``output.mode`` is not ``"overwrite"``;
3. open the ledger (never created unless ``ledger.create = true``), remove temporary outputs
   that dead runs of this dataset left behind, and check (read-only) that the budget fits;
4. get the Spark session (the active one, or a plain ``getOrCreate()``); resolve the input's
   schema and the public keys *without reading data*: the columns must exist, the value column
   must be numeric (typed sources) and the key set must not be empty;
5. reserve ε (and δ) in the ledger; with ``input.csv.mode = "FAILFAST"`` parse the whole input
   once (a malformed row fails the job here, and the reservation is given back);
6. mark the reservation spent, run :func:`dpq_spark.spark.dp_quantiles` (materialised);
7. write the release into a hidden ``.<name>.incomplete-r<record>-<hex>`` directory beside the
   target (its path recorded in the ledger) and rename it into place, so the output exists
   completely or not at all;
8. commit the ledger record with the output location.

A failure or SIGTERM/SIGINT before stage 6 gives the reservation back (exit 143/130 for the
signals); from stage 6 on the budget stays charged, also when the process dies. A session the
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
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Iterator

from dpq_spark.config import (
    OUTPUT_MODES,
    ConfigError,
    GroupsConfig,
    InputConfig,
    JobConfig,
    OutputConfig,
    is_local_path,
    load_config,
    parse_override,
    quantiles_from_text,
)
from dpq_spark.core.errors import BudgetExceededError, DPQValueError
from dpq_spark.ledger import Ledger, LedgerError, open_ledger

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["main", "run_job", "read_csv", "read_input", "read_keys", "write_release", "build_parser", "JobResult", "OutputExistsError", "OutputConflictError", "JobInterrupted", "FAULT_ENV"]

log = logging.getLogger(__name__)

#: Test-only fault injection. The job kills itself with a real signal at a named point:
#: ``after_reserve`` (SIGTERM while reserved), ``after_sample`` (SIGKILL between the release and
#: the write), ``after_sample_term`` (SIGTERM there), ``during_write`` (SIGKILL once Spark has
#: written the temporary directory).
FAULT_ENV = "DPQ_SPARK_FAULT"

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_BUDGET, EXIT_OUTPUT_EXISTS = 0, 1, 2, 3, 4
EXIT_SIGINT, EXIT_SIGTERM = 128 + signal.SIGINT, 128 + signal.SIGTERM

RELEASE_METADATA = "_release.json"
INCOMPLETE = ".incomplete-"


class OutputExistsError(FileExistsError):
    """The output path holds an earlier release and ``output.mode`` is not ``"overwrite"``
    (raised before anything is reserved)."""


class OutputConflictError(RuntimeError):
    """The output path appeared while the job ran: the release was computed (the budget stays
    charged) but not written."""


class JobInterrupted(BaseException):
    """SIGTERM reached the job (a scheduler's cancel). A ``BaseException``, like
    ``KeyboardInterrupt``, so that no ``except Exception`` swallows it."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by signal {signal.Signals(signum).name}")
        self.signum = signum


@dataclasses.dataclass(frozen=True)
class JobResult:
    """What a successful run produced: where the release is and its ledger record."""

    output: str
    record_id: int
    seconds: float


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


_FAULT_SIGNALS = {"after_reserve": signal.SIGTERM, "after_sample": signal.SIGKILL,
                  "after_sample_term": signal.SIGTERM, "during_write": signal.SIGKILL}


def _fault_point(name: str) -> None:
    if os.environ.get(FAULT_ENV) == name:
        sig = _FAULT_SIGNALS[name]
        log.critical("fault injection %s=%s: sending %s to the job", FAULT_ENV, name, sig.name)
        if sig == signal.SIGKILL:
            logging.shutdown()
        os.kill(os.getpid(), sig)
        time.sleep(5)  # the signal is handled (or kills) before this returns


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """While the job runs, SIGTERM raises :class:`JobInterrupted` (SIGINT already raises
    ``KeyboardInterrupt``). Only in the main thread, where Python runs signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise JobInterrupted(signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def _deferred_signals() -> Iterator[None]:
    """Hold SIGTERM and SIGINT while a ledger write runs, so that a signal cannot cut it off
    between the database's answer and the job's bookkeeping; delivered right after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    mask = {signal.SIGTERM, signal.SIGINT}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, mask)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


# ---------------------------------------------------------------------------------------------
# Spark session and input
# ---------------------------------------------------------------------------------------------


def _get_session(properties_file: str | None) -> "tuple[SparkSession, bool]":
    """The active session, or a plain ``getOrCreate()``; and whether the job started its JVM
    (then the job stops the session on every exit path; a session owned by spark-submit,
    Spark Connect or Databricks is never stopped).

    Under spark-submit (or on Databricks) the master and settings come from there. Only when the
    job starts its own JVM (``python jobs/dp_quantiles.py``) does it pass ``job.spark_properties``
    to Spark's launcher as ``--properties-file``, adding ``--master local[*]`` when that file
    names no master, and ``PYSPARK_PYTHON`` defaulting to this interpreter. No Spark setting
    is made in code.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    launched_by_spark = any(v in os.environ for v in (
        "PYSPARK_GATEWAY_PORT", "SPARK_REMOTE", "DATABRICKS_RUNTIME_VERSION"))
    if launched_by_spark:  # spark-submit, Connect or Databricks own the session: never stop it
        return SparkSession.builder.getOrCreate(), False
    if "PYSPARK_SUBMIT_ARGS" not in os.environ:
        args = []
        if not _names_master(properties_file) and "MASTER" not in os.environ:
            args += ["--master", "local[*]"]
        if properties_file:
            args += ["--properties-file", properties_file]
        os.environ["PYSPARK_SUBMIT_ARGS"] = shlex.join(args + ["pyspark-shell"])
        # Local Python workers run the driver's interpreter (where dpq_spark is installed).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return SparkSession.builder.getOrCreate(), True


def _stop_session(spark: "SparkSession") -> None:
    """Stop a session the job started (its local JVM with it); never raise from here."""
    try:
        spark.stop()
        log.info("spark session stopped")
    except Exception as exc:  # pragma: no cover - best effort on the way out
        log.warning("stopping the spark session failed (%s)", type(exc).__name__)


def _names_master(properties_file: str | None) -> bool:
    if not properties_file:
        return False
    with open(properties_file, encoding="utf-8") as fh:
        return any(line.split(None, 1)[:1] == ["spark.master"] for line in fh)


def read_csv(spark: "SparkSession", path: str, *, mode: str = "DROPMALFORMED",
             options: dict[str, Any] | None = None,
             numeric: tuple[str, ...] = ()) -> "DataFrame":
    """Read a CSV file with every column as a string (``numeric`` ones as double) and header
    names stripped of spaces.

    Parameters
    ----------
    spark : SparkSession
    path : str
        The file or directory.
    mode : {"DROPMALFORMED", "PERMISSIVE", "FAILFAST"}
        Spark's CSV parse mode. With ``"DROPMALFORMED"`` (the default) rows whose number of
        fields differs from the header, or whose ``numeric`` fields are not numbers, are
        dropped, e.g. the four Goodreads rows with an unquoted comma; ``"FAILFAST"`` fails on
        them (when the data is read); ``"PERMISSIVE"`` keeps them with nulls.
    options : dict, optional
        Further Spark CSV reader options (``header`` defaults to true).
    numeric : tuple of str
        Columns (stripped names) read as double.

    Notes
    -----
    Spark's CSV column pruning parses only the columns a query selects, and then cannot see
    that a row has too many fields. A filter that reads every column (always true:
    ``length(concat_ws(...)) >= 0``) keeps the full parse without caching anything.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    options = {"header": True, **(options or {})}
    header = spark.read.options(**options).csv(path).columns
    names = [c.strip() for c in header]
    if len(set(names)) != len(names):
        raise ConfigError(f"the CSV header of {path!r} repeats a column name: {names}")
    schema = T.StructType([
        T.StructField(h, T.DoubleType() if n in numeric else T.StringType())
        for h, n in zip(header, names)])
    df = spark.read.schema(schema).options(**options, mode=mode).csv(path).toDF(*names)
    if mode.upper() in ("DROPMALFORMED", "FAILFAST"):
        every_column = F.concat_ws(",", *[F.col(f"`{n}`").cast("string") for n in names])
        df = df.where(F.length(every_column) >= 0)
    return df


def read_input(spark: "SparkSession", inp: InputConfig,
               privacy_unit: str | None = None) -> "DataFrame":
    """The private input with the group columns and ``column`` as double, lazily (only the
    schema is resolved: for CSV the header line, for Parquet the footers, for a table the
    catalog).

    A typed source (Parquet, table) must have a numeric ``column``; CSV fields have no type, so
    the column is parsed as double and a field that is not a number makes its row malformed
    (dropped under ``"DROPMALFORMED"``, a failure under ``"FAILFAST"``).

    Raises
    ------
    ConfigError
        If ``input.column``, a group column or the privacy-unit column is not in the input, or
        ``input.column`` is not numeric.
    """
    from pyspark.sql import types as T

    from dpq_spark.spark._compat import try_cast

    if inp.format == "table":
        df = spark.table(inp.table)
    elif inp.format == "parquet":
        df = spark.read.parquet(inp.path)
    else:
        df = read_csv(spark, inp.path, mode=inp.csv_mode, options=inp.csv_options,
                      numeric=(inp.column,))
    wanted = [(inp.column, "input.column")] + [(g, "input.group_by") for g in inp.group_by]
    if privacy_unit is not None:
        wanted.append((privacy_unit, "release.privacy_unit"))
    for name, key in wanted:
        if name not in df.columns:
            raise ConfigError(f"`{key}` names column {name!r}, which is not in the input; "
                              f"columns are {df.columns}")
    kind = df.schema[inp.column].dataType
    if not isinstance(kind, T.NumericType):
        raise ConfigError(f"`input.column` {inp.column!r} has type {kind.simpleString()} in the "
                          "input; the release needs a numeric column (cast it in a view or "
                          "table first)")
    unit = [privacy_unit] if privacy_unit is not None else []
    return df.select(*inp.group_by, *unit, try_cast(inp.column, "double").alias(inp.column))


def read_keys(spark: "SparkSession", groups: GroupsConfig | None, data: "DataFrame",
              group_by: tuple[str, ...]) -> "DataFrame | None":
    """The public group keys as a DataFrame with the input's group column types.

    The keys are public, so the job may look at them: an empty key set (e.g. a key file with a
    header and no rows) is refused before any budget is reserved.
    """
    from dpq_spark.spark._compat import try_cast

    if groups is None:
        return None
    if groups.keys is not None:
        keys = spark.createDataFrame([list(k) for k in groups.keys], schema=list(group_by))
    elif groups.path is not None:
        reader = spark.read.option("header", True) if groups.format == "csv" else spark.read
        keys = reader.format(groups.format).load(groups.path)
        keys = keys.toDF(*[c.strip() for c in keys.columns])
    else:
        keys = spark.table(groups.table)
    missing = [c for c in group_by if c not in keys.columns]
    if missing:
        raise ConfigError(f"the public keys lack the group column(s) {missing}; "
                          f"their columns are {keys.columns}")
    types = {f.name: f.dataType for f in data.schema.fields}
    keys = keys.select(*[try_cast(c, types[c]).alias(c) for c in group_by]).distinct()
    if not keys.take(1):
        where = ("`groups.path` " + repr(groups.path) if groups.path is not None
                 else f"`groups.table` {groups.table!r}")
        raise ConfigError(f"the public keys in {where} are empty: there is nothing to release")
    return keys


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def output_exists(out: OutputConfig) -> bool:
    """True when a local output path already exists (remote paths are checked by Spark)."""
    return is_local_path(out.path) and os.path.exists(out.path)


def write_release(result: "DataFrame", out: OutputConfig, metadata: dict[str, Any], *,
                  record: int | None = None,
                  on_temp: "Callable[[str], None] | None" = None) -> str:
    """Write the (small, materialised) release once, completely or not at all.

    Local paths: Spark writes one file into a hidden ``.<name>.incomplete-r<record>-<hex>``
    directory beside the target (``on_temp`` is told its path first, so that the ledger can
    record it), ``_release.json`` is added, and the directory is renamed into place (an atomic
    rename on a POSIX file system). Until then its name says it is incomplete; a run killed
    meanwhile leaves it for the next run of the dataset to remove (see :func:`clean_stale`).
    With ``mode="overwrite"`` an earlier release is moved aside first and deleted after the
    rename. Remote URIs (s3a://, abfss://, dbfs:/ ...) are written by Spark's committer with
    mode ``error``/``overwrite``; there the ``_SUCCESS`` marker tells a complete release, and
    the metadata lives in the ledger only.

    Raises
    ------
    OutputConflictError
        The target appeared while the job ran and ``out.mode`` is not ``"overwrite"``.
    """
    writer_opts = {"header": True} if out.format == "csv" else {}
    single = result.coalesce(1)
    if not is_local_path(out.path):
        mode = "overwrite" if out.mode == "overwrite" else "error"
        single.write.format(out.format).options(**writer_opts).mode(mode).save(out.path)
        return out.path
    final = out.path
    parent, base = os.path.split(final.rstrip(os.sep))
    os.makedirs(parent, exist_ok=True)
    tag = f"r{record}-" if record is not None else ""
    tmp = os.path.join(parent, f".{base}{INCOMPLETE}{tag}{uuid.uuid4().hex[:12]}")
    if on_temp is not None:
        on_temp(tmp)
    try:
        single.write.format(out.format).options(**writer_opts).mode("error").save(tmp)
        _fault_point("during_write")
        with open(os.path.join(tmp, RELEASE_METADATA), "w", encoding="utf-8") as fh:
            json.dump(metadata, fh, indent=2, sort_keys=True)
        if os.path.exists(final):
            if out.mode != "overwrite":
                raise OutputConflictError(
                    f"`output.path` {final!r} appeared while the job ran; the release was not "
                    "written and its budget stays charged")
            old = os.path.join(parent, f".{base}.old-{uuid.uuid4().hex[:12]}")
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(ledger: Ledger, dataset_id: str) -> list[str]:
    """Remove temporary outputs that dead runs of ``dataset_id`` left behind.

    A run records its ``.incomplete-`` directory in its ``spent`` ledger record before Spark
    writes it. When that record is still ``spent`` (never committed), the directory still
    exists, and the process that wrote it is gone (same host, pid no longer alive), the
    directory is deleted and the record gets a note; the budget stays charged. A directory
    of a run on another host is left alone (its liveness cannot be known) and logged.

    Returns
    -------
    list of str
        The directories removed.
    """
    removed, here = [], socket.gethostname()
    for rec in ledger.records(dataset_id):
        path = rec.output
        if rec.status != "spent" or not path or INCOMPLETE not in os.path.basename(path):
            continue
        if not os.path.isdir(path):
            continue
        if rec.host != here or rec.pid is None:
            log.warning("ledger record %d left %s on host %s; not removed from here", rec.id,
                        path, rec.host)
            continue
        if rec.pid == os.getpid() or _pid_alive(rec.pid):
            continue
        shutil.rmtree(path, ignore_errors=True)
        with _deferred_signals():
            ledger.note(rec.id, "the job died while writing; its incomplete output was removed by "
                        "a later run; budget stays charged")
        log.warning("removed the incomplete output of dead ledger record %d: %s", rec.id, path)
        removed.append(path)
    return removed


def guarantee(cfg: JobConfig) -> str:
    """The privacy guarantee of a release, in words (stored with it and in the docs)."""
    r = cfg.release
    dp = f"({r.epsilon:g}, {r.delta:g})-DP" if r.delta is not None else f"{r.epsilon:g}-DP"
    unit = ("one row" if r.privacy_unit is None else
            f"all rows of one `{r.privacy_unit}` (at most {r.max_rows_per_unit} row(s) per group "
            f"and {r.max_groups_per_unit} group(s) per unit are kept)")
    relation = "adding or removing" if r.neighboring == "add_remove" else "changing"
    if r.lower is None:
        from dpq_spark.core.bounds import DEFAULT_BOUNDS_SHARE

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
        parse failed (reservation given back).
    LedgerError
        The ledger is missing, unreachable or refuses (nothing reserved).
    JobInterrupted, KeyboardInterrupt
        SIGTERM/SIGINT: a reservation is given back if nothing was sampled yet.
    OutputConflictError
        The output appeared while the job ran (budget charged, nothing written).

    Privacy
    -------
    The release is ε-DP (or (ε, δ)-DP with partition selection) as stated by
    :func:`dpq_spark.spark.dp_quantiles` and recorded by :func:`guarantee`; the ledger charges
    it against the dataset's cap under basic composition. Nothing data-dependent happens
    outside the mechanism: before the reservation the job reads only public metadata (schemas,
    the CSV header) and the public keys.
    """
    started = time.perf_counter()
    params = cfg.public_parameters()
    led = cfg.ledger
    log.info("job %s: public parameters %s", cfg.name, json.dumps(params, sort_keys=True))
    log.info("job %s: output %s (format=%s, mode=%s); ledger %s (dataset %r)", cfg.name,
             cfg.output.path, cfg.output.format, cfg.output.mode, led.name, led.dataset_id)

    with _stage("check output"):
        if output_exists(cfg.output) and cfg.output.mode != "overwrite":
            raise OutputExistsError(
                f"`output.path` {cfg.output.path!r} already holds a release; set "
                "`output.mode = \"overwrite\"` (or --output-mode overwrite) to replace it, or "
                "write to a new path (e.g. with the {timestamp} placeholder)")

    with _stage("open ledger"):
        ledger = open_ledger(led.url, create=led.create, password_file=led.password_file)
        clean_stale(ledger, led.dataset_id)
        ledger.check_budget(led.dataset_id, epsilon=cfg.release.epsilon, delta=cfg.release.delta,
                            epsilon_cap=led.epsilon_cap, delta_cap=led.delta_cap,
                            create_dataset=led.create)

    spark, started_here = None, False
    try:
        with _stage("start spark"):
            spark, started_here = _get_session(cfg.spark_properties)
        with _stage("check input"):
            data = read_input(spark, cfg.input, cfg.release.privacy_unit)
            keys = read_keys(spark, cfg.groups, data, cfg.input.group_by)
        path, record = _reserve_and_release(cfg, ledger, data, keys, params, rng)
    finally:
        if started_here:
            _stop_session(spark)
    seconds = time.perf_counter() - started
    log.info("job %s: release committed as ledger record %d in %.2f s", cfg.name, record, seconds)
    return JobResult(output=path, record_id=record, seconds=seconds)


def _reserve_and_release(cfg: JobConfig, ledger: Ledger, data, keys, params, rng):
    led, record = cfg.ledger, None
    try:
        with _stage("reserve budget"), _deferred_signals():
            record = ledger.reserve(
                led.dataset_id, epsilon=cfg.release.epsilon, delta=cfg.release.delta,
                epsilon_cap=led.epsilon_cap, delta_cap=led.delta_cap,
                mechanism=cfg.release.mechanism, parameters=params, job=cfg.name,
                create_dataset=led.create)
        log.info("ledger record %d reserved", record)
        _fault_point("after_reserve")
        if cfg.input.format == "csv" and cfg.input.csv_mode == "FAILFAST":
            with _stage("parse input (FAILFAST)"):
                _parse_all(data)
    except BaseException as exc:
        if record is not None:
            with _deferred_signals():
                ledger.cancel(record, reason=f"failed before sampling: {type(exc).__name__}",
                              by=f"job {cfg.name}")
            log.info("ledger record %d cancelled: no noisy value was computed", record)
        raise

    with _deferred_signals():
        ledger.mark_spent(record)
    log.info("ledger record %d spent: from here on the budget stays charged", record)
    try:
        from dpq_spark.spark import dp_quantiles

        r = cfg.release
        with _stage("release"):
            result = dp_quantiles(
                data, cfg.input.column, quantiles=list(r.quantiles), epsilon=r.epsilon,
                lower=r.lower, upper=r.upper, group_by=list(cfg.input.group_by) or None,
                groups=keys, neighboring=r.neighboring, privacy_unit=r.privacy_unit,
                max_rows_per_unit=r.max_rows_per_unit, max_groups_per_unit=r.max_groups_per_unit,
                delta=r.delta, resolution=r.resolution, mechanism=r.mechanism,
                bounds_share=r.bounds_share, rng=rng)
        _fault_point("after_sample")
        _fault_point("after_sample_term")
        metadata = {
            **params,
            "dataset_id": led.dataset_id,
            "ledger_record": record,
            "guarantee": guarantee(cfg),
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "columns": result.columns,
        }

        def on_temp(tmp: str) -> None:
            with _deferred_signals():
                ledger.record_output(record, tmp)

        with _stage("write output"):
            path = write_release(result, cfg.output, metadata, record=record, on_temp=on_temp)
        with _stage("commit ledger"), _deferred_signals():
            ledger.commit(record, path)
    except BaseException as exc:
        with _deferred_signals():
            ledger.note(record, f"failed after sampling: {type(exc).__name__}; budget stays "
                        "charged")
        log.error("ledger record %d stays charged: the job failed after sampling", record)
        raise
    return path, record


def _parse_all(data: "DataFrame") -> None:
    """Parse every row once (``input.csv.mode = "FAILFAST"``), turning Spark's parse failure
    into a :class:`ConfigError` that does not echo the offending row."""
    try:
        data.write.format("noop").mode("overwrite").save()
    except Exception as exc:
        text = f"{type(exc).__name__} {exc}"
        if "FAILFAST" in text or "MALFORMED" in text.upper():
            raise ConfigError("`input.csv.mode` is \"FAILFAST\" and the input has a malformed "
                              "row or a non-numeric `input.column` value (details suppressed: "
                              "they may contain data); nothing was released") from None
        raise


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
    ]
    for flag, section, key, kind in flags:
        p.add_argument(flag, dest=f"{section}.{key}", type=kind, default=None,
                       help=f"override {section}.{key}")
    p.add_argument("--output-mode", dest="output.mode", choices=OUTPUT_MODES, default=None,
                   help="override output.mode ('overwrite' replaces an earlier release)")
    p.add_argument("--log-level", default="INFO", help="Python logging level (default INFO)")
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
        The exit code: 0 released; 2 configuration or ledger error (nothing reserved, or the
        reservation given back); 3 budget exceeded (nothing reserved); 4 output exists (nothing
        reserved); 143 SIGTERM and 130 SIGINT (the reservation is given back if nothing was
        sampled, else it stays charged); 1 any other failure (charged if it came after
        sampling: ``dpq-spark ledger show`` tells). The output path is printed on success; each
        error is reported once, through the ``dpq_spark.job`` logger (stderr by default).

    Privacy
    -------
    See :func:`run_job`: one release with the configured guarantee, charged to the ledger
    before any data is read.
    """
    args = build_parser(prog).parse_args(argv)
    _configure_logging(args.log_level)
    cfg = None
    try:
        with _signals_raise():
            cfg = load_config(args.config, _overrides(args))
            result = run_job(cfg)
    except (ConfigError, LedgerError) as exc:
        log.error("configuration error: %s", exc)
        return EXIT_CONFIG
    except BudgetExceededError as exc:
        log.error("ledger refused the release: %s (see `dpq-spark ledger show`)", exc)
        return EXIT_BUDGET
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
    except Exception as exc:
        if args.show_errors:
            raise
        log.error("job failed with %s; details suppressed because they may contain data "
                  "(rerun with --show-errors)", type(exc).__name__)
        return EXIT_FAILED
    print(f"Release written to {result.output}")
    print(f"Ledger record {result.record_id}: dpq-spark ledger show --ledger "
          f"{shlex.quote(cfg.ledger.name)} --dataset {shlex.quote(cfg.ledger.dataset_id)}")
    return EXIT_OK
