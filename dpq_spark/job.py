"""The dp_quantiles job: config in, one committed DP release and one ledger record out.

``main(argv)`` is what ``spark-submit jobs/dp_quantiles.py --config conf/x.toml`` and
``dpq-spark run --config conf/x.toml`` call. The stages, in order:

1. load and validate the configuration (flags override the file);
2. refuse early if the output exists and ``output.mode`` is not ``"overwrite"``;
3. reserve ε (and δ) in the ledger, *before reading any data*;
4. get the Spark session (the active one, or a plain ``getOrCreate()``), read the input and the
   public keys, check the columns;
5. mark the reservation spent, run :func:`dpq_spark.spark.dp_quantiles` (materialised);
6. write the release to a hidden temporary directory beside the target and rename it into place,
   so the output exists completely or not at all;
7. commit the ledger record with the output location.

A failure in stages 3-4 gives the reservation back; from stage 5 on the budget stays charged,
also when the process dies. Logs name the stages, their timings and the public parameters; they
never contain values, counts or group sizes, and errors that could carry data (Spark's own) are
logged by class name only unless ``--show-errors`` is given.
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
import sys
import time
import uuid
from typing import TYPE_CHECKING, Any, Iterator

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
from dpq_spark.ledger import Ledger, LedgerError

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["main", "run_job", "read_csv", "read_input", "read_keys", "write_release", "build_parser", "JobResult", "OutputExistsError", "FAULT_ENV"]

log = logging.getLogger(__name__)

#: Test-only fault injection: set to ``after_sample`` to make the job ``os._exit`` between the
#: release and the write (simulates a crash after noisy values exist).
FAULT_ENV = "DPQ_SPARK_FAULT"
FAULT_EXIT_CODE = 86

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_BUDGET, EXIT_OUTPUT_EXISTS = 0, 1, 2, 3, 4

RELEASE_METADATA = "_release.json"


class OutputExistsError(FileExistsError):
    """The output path holds an earlier release and ``output.mode`` is not ``"overwrite"``."""


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


def _fault_point(name: str) -> None:
    if os.environ.get(FAULT_ENV) == name:
        log.critical("fault injection %s=%s: exiting hard", FAULT_ENV, name)
        logging.shutdown()
        os._exit(FAULT_EXIT_CODE)


# ---------------------------------------------------------------------------------------------
# Spark session and input
# ---------------------------------------------------------------------------------------------


def _get_session(properties_file: str | None) -> "SparkSession":
    """The active session, or a plain ``getOrCreate()``.

    Under spark-submit (or on Databricks) the master and settings come from there. Only when the
    job starts its own JVM (``python jobs/dp_quantiles.py``) does it pass ``job.spark_properties``
    to Spark's launcher as ``--properties-file``, adding ``--master local[*]`` when that file
    names no master, and ``PYSPARK_PYTHON`` defaulting to this interpreter. No Spark setting
    is made in code.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    launched_by_spark = "PYSPARK_GATEWAY_PORT" in os.environ or "SPARK_REMOTE" in os.environ
    if not launched_by_spark and "PYSPARK_SUBMIT_ARGS" not in os.environ:
        args = []
        if not _names_master(properties_file) and "MASTER" not in os.environ:
            args += ["--master", "local[*]"]
        if properties_file:
            args += ["--properties-file", properties_file]
        os.environ["PYSPARK_SUBMIT_ARGS"] = shlex.join(args + ["pyspark-shell"])
        # Local Python workers run the driver's interpreter (where dpq_spark is installed).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return SparkSession.builder.getOrCreate()


def _names_master(properties_file: str | None) -> bool:
    if not properties_file:
        return False
    with open(properties_file, encoding="utf-8") as fh:
        return any(line.split(None, 1)[:1] == ["spark.master"] for line in fh)


def read_csv(spark: "SparkSession", path: str, *, mode: str = "DROPMALFORMED",
             options: dict[str, Any] | None = None) -> "DataFrame":
    """Read a CSV file with every column as a string and header names stripped of spaces.

    Parameters
    ----------
    spark : SparkSession
    path : str
        The file or directory.
    mode : {"DROPMALFORMED", "PERMISSIVE", "FAILFAST"}
        Spark's CSV parse mode. With ``"DROPMALFORMED"`` (the default) rows whose number of
        fields differs from the header are dropped, e.g. the four Goodreads rows with an
        unquoted comma.
    options : dict, optional
        Further Spark CSV reader options (``header`` defaults to true).

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
    schema = T.StructType([T.StructField(n, T.StringType()) for n in header])
    df = spark.read.schema(schema).options(**options, mode=mode).csv(path).toDF(*names)
    if mode.upper() == "DROPMALFORMED":
        every_column = F.concat_ws(",", *[F.col(f"`{n}`") for n in names])
        df = df.where(F.length(every_column) >= 0)
    return df


def read_input(spark: "SparkSession", inp: InputConfig,
               privacy_unit: str | None = None) -> "DataFrame":
    """The private input with the group columns and ``column`` coerced to double.

    Values that are not numbers become null (``try_cast``) and are dropped by ``dp_quantiles``.

    Raises
    ------
    ConfigError
        If ``input.column``, a group column or the privacy-unit column is not in the input.
    """
    from dpq_spark.spark._compat import try_cast

    if inp.format == "table":
        df = spark.table(inp.table)
    elif inp.format == "parquet":
        df = spark.read.parquet(inp.path)
    else:
        df = read_csv(spark, inp.path, mode=inp.csv_mode, options=inp.csv_options)
    wanted = [(inp.column, "input.column")] + [(g, "input.group_by") for g in inp.group_by]
    if privacy_unit is not None:
        wanted.append((privacy_unit, "release.privacy_unit"))
    for name, key in wanted:
        if name not in df.columns:
            raise ConfigError(f"`{key}` names column {name!r}, which is not in the input; "
                              f"columns are {df.columns}")
    unit = [privacy_unit] if privacy_unit is not None else []
    return df.select(*inp.group_by, *unit, try_cast(inp.column, "double").alias(inp.column))


def read_keys(spark: "SparkSession", groups: GroupsConfig | None, data: "DataFrame",
              group_by: tuple[str, ...]) -> "DataFrame | None":
    """The public group keys as a DataFrame with the input's group column types."""
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
    return keys.select(*[try_cast(c, types[c]).alias(c) for c in group_by]).distinct()


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def output_exists(out: OutputConfig) -> bool:
    """True when a local output path already exists (remote paths are checked by Spark)."""
    return is_local_path(out.path) and os.path.exists(out.path)


def write_release(result: "DataFrame", out: OutputConfig, metadata: dict[str, Any]) -> str:
    """Write the (small, materialised) release once, completely or not at all.

    Local paths: Spark writes one file into a hidden temporary directory beside the target,
    ``_release.json`` is added, and the directory is renamed into place (an atomic rename on a
    POSIX file system). With ``mode="overwrite"`` an earlier release is moved aside first and
    deleted after the rename. Remote URIs (s3a://, abfss://, dbfs:/ ...) are written by Spark's
    committer with mode ``error``/``overwrite``; there the ``_SUCCESS`` marker tells a
    complete release, and the metadata lives in the ledger only.
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
    tmp = os.path.join(parent, f".{base}.tmp-{uuid.uuid4().hex}")
    try:
        single.write.format(out.format).options(**writer_opts).mode("error").save(tmp)
        with open(os.path.join(tmp, RELEASE_METADATA), "w", encoding="utf-8") as fh:
            json.dump(metadata, fh, indent=2, sort_keys=True)
        if os.path.exists(final):
            if out.mode != "overwrite":
                raise OutputExistsError(f"`output.path` {final!r} appeared while the job ran; "
                                        "the release was not written")
            old = os.path.join(parent, f".{base}.old-{uuid.uuid4().hex}")
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def guarantee(cfg: JobConfig) -> str:
    """The privacy guarantee of a release, in words (stored with it and in the docs)."""
    r = cfg.release
    dp = f"({r.epsilon:g}, {r.delta:g})-DP" if r.delta is not None else f"{r.epsilon:g}-DP"
    unit = ("one row" if r.privacy_unit is None else
            f"all rows of one `{r.privacy_unit}` (at most {r.max_rows_per_unit} row(s) per group "
            f"and {r.max_groups_per_unit} group(s) per unit are kept)")
    relation = "adding or removing" if r.neighboring == "add_remove" else "changing"
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
        The ledger refuses the reservation (nothing read).
    ConfigError
        A column or key table does not match the input (reservation given back).

    Privacy
    -------
    The release is ε-DP (or (ε, δ)-DP with partition selection) as stated by
    :func:`dpq_spark.spark.dp_quantiles` and recorded by :func:`guarantee`; the ledger charges
    it against the dataset's cap under basic composition.
    """
    started = time.perf_counter()
    params = cfg.public_parameters()
    log.info("job %s: public parameters %s", cfg.name, json.dumps(params, sort_keys=True))
    log.info("job %s: output %s (format=%s, mode=%s); ledger %s (dataset %r)", cfg.name,
             cfg.output.path, cfg.output.format, cfg.output.mode, cfg.ledger.path,
             cfg.ledger.dataset_id)

    with _stage("check output"):
        if output_exists(cfg.output) and cfg.output.mode != "overwrite":
            raise OutputExistsError(
                f"`output.path` {cfg.output.path!r} already holds a release; set "
                "`output.mode = \"overwrite\"` (or --output-mode overwrite) to replace it, or "
                "write to a new path (e.g. with the {timestamp} placeholder)")

    ledger = Ledger(cfg.ledger.path)
    with _stage("reserve budget"):
        record = ledger.reserve(
            cfg.ledger.dataset_id, epsilon=cfg.release.epsilon, delta=cfg.release.delta,
            epsilon_cap=cfg.ledger.epsilon_cap, delta_cap=cfg.ledger.delta_cap,
            mechanism=cfg.release.mechanism, parameters=params, job=cfg.name)
    log.info("ledger record %d reserved", record)

    try:
        with _stage("start spark"):
            spark = _get_session(cfg.spark_properties)
        with _stage("read input"):
            data = read_input(spark, cfg.input, cfg.release.privacy_unit)
            keys = read_keys(spark, cfg.groups, data, cfg.input.group_by)
    except BaseException as exc:
        ledger.cancel(record, reason=f"failed before sampling: {type(exc).__name__}")
        log.info("ledger record %d cancelled: no noisy value was computed", record)
        raise

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
                delta=r.delta, resolution=r.resolution, mechanism=r.mechanism, rng=rng)
        _fault_point("after_sample")
        metadata = {
            **params,
            "dataset_id": cfg.ledger.dataset_id,
            "ledger_record": record,
            "guarantee": guarantee(cfg),
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "columns": result.columns,
        }
        with _stage("write output"):
            path = write_release(result, cfg.output, metadata)
        with _stage("commit ledger"):
            ledger.commit(record, path)
    except BaseException as exc:
        ledger.note(record, f"failed after sampling: {type(exc).__name__}; budget stays charged")
        log.error("ledger record %d stays charged: the job failed after sampling", record)
        raise
    seconds = time.perf_counter() - started
    log.info("job %s: release committed as ledger record %d in %.2f s", cfg.name, record, seconds)
    return JobResult(output=path, record_id=record, seconds=seconds)


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
        ("--ledger", "ledger", "path", str), ("--dataset-id", "ledger", "dataset_id", str),
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
        logging.basicConfig(level=level.upper(), stream=sys.stderr,
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
        The exit code: 0 released, 2 configuration error, 3 budget exceeded, 4 output exists,
        1 any other failure. The output path is printed on success.

    Privacy
    -------
    See :func:`run_job`: one release with the configured guarantee, charged to the ledger
    before any data is read.
    """
    args = build_parser(prog).parse_args(argv)
    _configure_logging(args.log_level)
    try:
        cfg = load_config(args.config, _overrides(args))
        result = run_job(cfg)
    except (ConfigError, LedgerError) as exc:
        log.error("configuration error: %s", exc)
        print(f"dpq-spark: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except BudgetExceededError as exc:
        log.error("ledger refused the release: %s", exc)
        print(f"dpq-spark: {exc} (see `dpq-spark ledger show`)", file=sys.stderr)
        return EXIT_BUDGET
    except OutputExistsError as exc:
        log.error("%s", exc)
        print(f"dpq-spark: {exc}", file=sys.stderr)
        return EXIT_OUTPUT_EXISTS
    except DPQValueError as exc:  # our own messages never echo data
        log.error("invalid release parameters: %s", exc)
        print(f"dpq-spark: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except Exception as exc:
        if args.show_errors:
            raise
        log.error("job failed with %s; details suppressed because they may contain data "
                  "(rerun with --show-errors)", type(exc).__name__)
        return EXIT_FAILED
    print(f"Release written to {result.output}")
    print(f"Ledger record {result.record_id}: dpq-spark ledger show --ledger {cfg.ledger.path} "
          f"--dataset {cfg.ledger.dataset_id}")
    return EXIT_OK
