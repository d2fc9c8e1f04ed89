"""What the job writes: the release, atomically (a hidden temporary directory renamed into
place), its metadata file, and the clean-up of temporary outputs that dead runs left behind."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import uuid
from typing import TYPE_CHECKING, Any, Callable

from dpq_spark.pipeline._signals import deferred_signals, fault_point
from dpq_spark.pipeline.config import OutputConfig, is_local_path
from dpq_spark.pipeline.ledger import Ledger

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

__all__ = ["RELEASE_METADATA", "RELEASE_FILE", "INCOMPLETE", "OutputExistsError",
           "OutputConflictError", "output_exists", "write_release", "append_to_table",
           "clean_stale"]

log = logging.getLogger(__name__)


RELEASE_METADATA = "_release.json"

#: The one data file of a local release directory, by format: ``pandas.read_csv(path +
#: "/release.csv")`` reads a CSV release.
RELEASE_FILE = {"csv": "release.csv", "json": "release.json", "parquet": "release.parquet"}

#: The columns a release appended to a table carries besides its own (``output.table``).
TABLE_COLUMNS = ("release_name", "released_at", "dataset_id", "ledger_record", "epsilon",
                 "delta", "privacy_unit")


INCOMPLETE = ".incomplete-"


class OutputExistsError(FileExistsError):
    """The output path holds an earlier release and ``output.mode`` is not ``"overwrite"``
    (raised before anything is reserved)."""


class OutputConflictError(RuntimeError):
    """The output path appeared while the job ran: the release was computed (the budget stays
    charged) but not written."""


def output_exists(out: OutputConfig) -> bool:
    """True when a local output path already exists (remote paths are checked by Spark)."""
    return is_local_path(out.path) and os.path.exists(out.path)


def write_release(result: "DataFrame", out: OutputConfig, metadata: dict[str, Any], *,
                  record: int | None = None,
                  on_temp: "Callable[[str], None] | None" = None) -> str:
    """Write the (small, materialised) release once, completely or not at all.

    Local paths: Spark writes one file into a hidden ``.<name>.incomplete-r<record>-<hex>``
    directory beside the target (``on_temp`` is told its path first, so that the ledger can
    record it); the file is named ``release.csv`` (``.parquet``, ``.json``: see
    :data:`RELEASE_FILE`) and Spark's checksum and marker files are removed, ``_release.json``
    is added, and the directory is renamed into place (an atomic
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
        _one_named_file(tmp, RELEASE_FILE[out.format])
        fault_point("during_write")
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


def _one_named_file(directory: str, name: str) -> None:
    """Rename the one part file Spark wrote in ``directory`` to ``name``; drop the rest
    (``_SUCCESS``, ``.crc`` checksums): the directory's rename marks it complete."""
    parts = [f for f in os.listdir(directory) if f.startswith("part-")]
    if len(parts) != 1:
        raise RuntimeError(f"expected one part file in {directory!r}, found {len(parts)}")
    os.rename(os.path.join(directory, parts[0]), os.path.join(directory, name))
    for f in os.listdir(directory):
        if f != name:
            os.remove(os.path.join(directory, f))


def append_to_table(result: "DataFrame", table: str, metadata: dict[str, Any]) -> None:
    """Append the release to the table ``table`` (created on the first run), each row with
    the columns of :data:`TABLE_COLUMNS`: the release's name, time, dataset, ledger record,
    epsilon, delta and privacy unit.

    The table is written with ``saveAsTable`` in the session's default format
    (``spark.sql.sources.default``: Delta on Databricks, Parquet on plain Spark) unless it
    exists, when its own format is used. One call appends one release; the job calls it once
    per committed run (a retried run returns the stored release and appends nothing).
    """
    from pyspark.sql import functions as F

    extra = [F.lit(metadata.get(c)).cast(t).alias(c) for c, t in (
        ("release_name", "string"), ("released_at", "timestamp"), ("dataset_id", "string"),
        ("ledger_record", "long"), ("epsilon", "double"), ("delta", "double"),
        ("privacy_unit", "string"))]
    rows = result.select(*[F.col(f"`{c}`") for c in result.columns], *extra)
    rows.write.mode("append").saveAsTable(table)


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
        with deferred_signals():
            ledger.note(rec.id, "the job died while writing; its incomplete output was removed by "
                        "a later run; budget stays charged")
        log.warning("removed the incomplete output of dead ledger record %d: %s", rec.id, path)
        removed.append(path)
    return removed
