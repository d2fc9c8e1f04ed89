"""What every privacy ledger backend shares: the records, the usage, the errors, the URL rules
and :class:`Ledger`, whose methods hold the whole budget logic over a few SQL primitives.

The backends (:mod:`~dpq_spark.pipeline.ledger.sqlite`, :mod:`~dpq_spark.pipeline.ledger.postgres`)
supply the connection, the transaction that locks a dataset's budget row and the SQL dialect;
:mod:`dpq_spark.pipeline.ledger` opens the one a URL names.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import datetime as _dt
import getpass
import io
import json
import os
import socket
import urllib.parse
from typing import Any, Callable

from dpq_spark.core.errors import BudgetExceededError, DPQValueError
from dpq_spark.pipeline.ledger.unit import PrivacyUnit

__all__ = ["Ledger", "LedgerRecord", "BudgetUsage", "LedgerError", "COUNTED_STATUSES", "RECORD_COLUMNS",
           "MIGRATIONS", "NAMED_INDEX", "redact_url", "is_postgres_url", "url_has_password",
           "sqlite_path"]

#: Statuses that count towards the cap.
COUNTED_STATUSES = ("reserved", "spent", "committed")

#: Columns of a record, in the order of :class:`LedgerRecord` and of ``ledger export``.
RECORD_COLUMNS = ("id", "dataset_id", "status", "epsilon", "delta", "mechanism", "parameters",
                  "output", "job", "host", "pid", "reserved_at", "updated_at", "note",
                  "cancelled_by", "name")

#: Columns added since the first ledgers were written: ``(table, column, SQL type)``. Opening an
#: older ledger adds the missing ones in place (the backends' ``_migrate``); a missing column
#: reads as NULL: no cancelled_by, no unit (one row), no name, no stored result.
MIGRATIONS = (("releases", "cancelled_by", "TEXT"), ("budgets", "unit", "TEXT"),
              ("releases", "name", "TEXT"), ("releases", "result", "TEXT"))
#: One live (not cancelled) release per name and dataset; the check in :meth:`Ledger.reserve`
#: runs under the budget row's lock, this index is the backstop.
NAMED_INDEX = ("CREATE UNIQUE INDEX IF NOT EXISTS releases_named ON releases (dataset_id, name) "
               "WHERE name IS NOT NULL AND status <> 'cancelled'")

# Sums of many small epsilons are not exact in floating point: 10 x 0.1 must fit a cap of 1.
_SLACK = 1e-9



class LedgerError(DPQValueError):
    """The ledger refuses an operation (missing ledger, unknown record, a cap raised by a
    config, an unreadable database, ...). The message names the ledger (redacted)."""


@dataclasses.dataclass(frozen=True)
class LedgerRecord:
    """One charge against a dataset's budget (a row of the ``releases`` table)."""

    id: int
    dataset_id: str
    status: str
    epsilon: float
    delta: float
    mechanism: str
    parameters: dict[str, Any]
    output: str | None
    job: str | None
    host: str | None
    pid: int | None
    reserved_at: str
    updated_at: str
    note: str | None
    cancelled_by: str | None = None
    name: str | None = None

    def differing_parameters(self, parameters: dict[str, Any]) -> list[str]:
        """The keys whose values differ between the stored parameters and ``parameters``
        (taken in the JSON form the ledger stores), sorted; empty when they are the same."""
        given = json.loads(json.dumps(parameters, sort_keys=True))
        return sorted(k for k in set(given) | set(self.parameters)
                      if given.get(k) != self.parameters.get(k))


@dataclasses.dataclass(frozen=True)
class BudgetUsage:
    """What a dataset has spent (every counted status) against its caps."""

    dataset_id: str
    epsilon_spent: float
    delta_spent: float
    epsilon_cap: float | None
    delta_cap: float | None

    @property
    def epsilon_remaining(self) -> float | None:
        return None if self.epsilon_cap is None else max(0.0, self.epsilon_cap - self.epsilon_spent)

    @property
    def delta_remaining(self) -> float | None:
        return None if self.delta_cap is None else max(0.0, self.delta_cap - self.delta_spent)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def _who() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in the environment (some containers)
        return f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown"


# ---------------------------------------------------------------------------------------------
# URLs
# ---------------------------------------------------------------------------------------------


def is_postgres_url(url: str) -> bool:
    """True for a ``postgresql://`` (or ``postgres://``) URL."""
    return url.startswith(("postgresql://", "postgres://"))


def redact_url(url: str) -> str:
    """``url`` without its password (``user:***@host``; a ``password=`` parameter is dropped).
    Safe for logs and messages."""
    if not is_postgres_url(url):
        return url
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        netloc = f"{userinfo}@{host}"
    query = urllib.parse.urlencode([(k, "***" if k.lower() == "password" else v)
                                    for k, v in urllib.parse.parse_qsl(parts.query)])
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def url_has_password(url: str) -> bool:
    """True when a PostgreSQL URL carries a password (not allowed in a config file)."""
    if not is_postgres_url(url):
        return False
    parts = urllib.parse.urlsplit(url)
    return parts.password is not None or any(
        k.lower() == "password" for k, _ in urllib.parse.parse_qsl(parts.query))


def sqlite_path(url: str) -> str:
    """The file of a ``sqlite:///ABS/PATH`` URL or of a plain path (made absolute)."""
    if url.startswith("sqlite:"):
        rest = url[len("sqlite:"):]
        if not rest.startswith("///"):
            raise LedgerError(f"ledger {url}: a SQLite URL is sqlite:///ABSOLUTE/PATH")
        url = "/" + rest.lstrip("/")
    return os.path.abspath(os.path.expanduser(url))


# ---------------------------------------------------------------------------------------------
# The ledger (backend-neutral logic; the backends supply connections and a few SQL words)
# ---------------------------------------------------------------------------------------------


class Ledger:
    """A privacy ledger; use :func:`open_ledger` or :func:`init_ledger` to get one.

    Each method opens its own short-lived connection and runs in one database transaction, so a
    ``Ledger`` may be shared by threads and processes alike; concurrency control is the
    database's own (no application-side locks).

    Attributes
    ----------
    name : str
        The ledger's redacted URL (SQLite: the file path), used in every message.
    """

    name: str
    #: SQL that locks a dataset's budget row for the rest of the transaction.
    _LOCK_BUDGET = "SELECT epsilon_cap, delta_cap FROM budgets WHERE dataset_id = ?"

    # -- backend hooks ---------------------------------------------------------------------

    def _transaction(self) -> contextlib.AbstractContextManager:  # pragma: no cover - abstract
        """Context manager yielding a connection inside one write transaction."""
        raise NotImplementedError

    def _reading(self) -> contextlib.AbstractContextManager:  # pragma: no cover - abstract
        """Context manager yielding a connection for reads."""
        raise NotImplementedError

    def _exec(self, conn, sql: str, params: tuple = ()):  # pragma: no cover - abstract
        raise NotImplementedError

    # -- plumbing --------------------------------------------------------------------------

    def _error(self, message: str) -> LedgerError:
        return LedgerError(f"ledger {self.name}: {message}")

    def _write(self, fn: Callable[[Any], Any]):
        with self._transaction() as conn:
            return fn(conn)

    def _spent(self, conn, dataset_id: str) -> tuple[float, float]:
        marks = ",".join("?" * len(COUNTED_STATUSES))
        row = self._exec(
            conn,
            f"SELECT COALESCE(SUM(epsilon), 0), COALESCE(SUM(delta), 0) FROM releases "
            f"WHERE dataset_id = ? AND status IN ({marks})",
            (dataset_id, *COUNTED_STATUSES),
        ).fetchone()
        return float(row[0]), float(row[1])

    def _lock_budget(self, conn, dataset_id: str):
        return self._exec(conn, self._LOCK_BUDGET, (dataset_id,)).fetchone()

    def _missing_dataset(self, dataset_id: str) -> LedgerError:
        return self._error(
            f"has no budget for dataset {dataset_id!r}; create it with `dpq-spark ledger init "
            f"{self.name} --dataset {dataset_id} --epsilon-cap N` (or set `ledger.create = true` "
            "in the job config for its first run)")

    # -- the budget ------------------------------------------------------------------------

    def create_dataset(self, dataset_id: str, *, epsilon_cap: float, delta_cap: float = 0.0,
                       unit: PrivacyUnit | None = None) -> bool:
        """Store a new dataset's caps and privacy unit (default: one row, add/remove); returns
        False (and changes nothing) if it exists."""
        _check_caps(epsilon_cap, delta_cap)
        stored_unit = None if unit is None else unit.to_json()

        def txn(conn) -> bool:
            cur = self._exec(
                conn, "INSERT INTO budgets (dataset_id, epsilon_cap, delta_cap, updated_at, unit) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (dataset_id) DO NOTHING RETURNING dataset_id",
                (dataset_id, float(epsilon_cap), float(delta_cap), _now(), stored_unit))
            return cur.fetchone() is not None

        return self._write(txn)

    def reserve(self, dataset_id: str, *, epsilon: float, delta: float | None = None,
                epsilon_cap: float | None = None, delta_cap: float | None = None,
                mechanism: str, parameters: dict[str, Any] | None = None, job: str | None = None,
                create_dataset: bool = False, name: str | None = None) -> int:
        """Reserve ``epsilon`` (and ``delta``) for one release of ``dataset_id``.

        Parameters
        ----------
        dataset_id : str
            The dataset the budget is of (the people it protects).
        epsilon, delta : float
            What the release will spend (``delta=None`` means 0).
        epsilon_cap, delta_cap : float, optional
            The caps the caller's configuration states, if any. They may only lower the
            dataset's stored caps, never raise them; a cap not given is the stored one.
        mechanism : str
            Name of the mechanism, e.g. ``"joint_exp"``.
        parameters : dict, optional
            Public parameters of the release (JSON-serialisable), stored with the record.
        job : str, optional
            Name of the job that reserves.
        create_dataset : bool
            Store ``epsilon_cap``/``delta_cap`` as the dataset's caps if the ledger does not know
            the dataset yet (default False: an unknown dataset is an error). Needs
            ``epsilon_cap``; a missing ``delta_cap`` is then 0.
        name : str, optional
            The release's name: at most one live (not cancelled) record of the dataset has it
            (see :meth:`named`).

        Returns
        -------
        int
            The record id; pass it to :meth:`mark_spent`, :meth:`commit` or :meth:`cancel`.

        Raises
        ------
        BudgetExceededError
            If the charge would pass a cap. Nothing is recorded.
        LedgerError
            If the dataset is unknown (and ``create_dataset`` is false), ``epsilon_cap`` or
            ``delta_cap`` is above the dataset's stored cap, or a live record already has
            ``name``.
        """
        delta = 0.0 if delta is None else float(delta)
        epsilon = float(epsilon)
        params = json.dumps(parameters or {}, sort_keys=True)

        def txn(conn) -> int:
            row = self._lock_budget(conn, dataset_id)
            if row is None:
                if not create_dataset:
                    raise self._missing_dataset(dataset_id)
                if epsilon_cap is None:
                    raise LedgerError("creating a dataset's budget needs `epsilon_cap`")
                new_delta_cap = 0.0 if delta_cap is None else delta_cap
                _check_caps(epsilon_cap, new_delta_cap)
                self._exec(conn, "INSERT INTO budgets (dataset_id, epsilon_cap, delta_cap, "
                           "updated_at) VALUES (?, ?, ?, ?) ON CONFLICT (dataset_id) DO NOTHING",
                           (dataset_id, float(epsilon_cap), float(new_delta_cap), _now()))
                row = self._lock_budget(conn, dataset_id)
            eps_cap, del_cap = self._caps_in_force(dataset_id, row, epsilon_cap, delta_cap)
            if name is not None:
                taken = self._named_row(conn, dataset_id, name)
                if taken is not None:
                    raise self._error(f"dataset {dataset_id!r} already has a release named "
                                      f"{name!r} (record {taken[0]}, {taken[2]})")
            eps_spent, del_spent = self._spent(conn, dataset_id)
            if eps_spent + epsilon > eps_cap + _SLACK:
                raise BudgetExceededError(epsilon, max(0.0, eps_cap - eps_spent), "epsilon")
            if delta > 0 and del_spent + delta > del_cap + _SLACK * del_cap:
                raise BudgetExceededError(delta, max(0.0, del_cap - del_spent), "delta")
            now = _now()
            cur = self._exec(
                conn,
                "INSERT INTO releases (dataset_id, status, epsilon, delta, mechanism, parameters,"
                " job, host, pid, reserved_at, updated_at, name) VALUES (?, 'reserved', ?, ?, ?,"
                " ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (dataset_id, epsilon, delta, mechanism, params, job, socket.gethostname(),
                 os.getpid(), now, now, name),
            )
            return int(cur.fetchone()[0])

        return self._write(txn)

    def check_budget(self, dataset_id: str, *, epsilon: float, delta: float | None = None,
                     epsilon_cap: float | None = None, delta_cap: float | None = None,
                     create_dataset: bool = False) -> BudgetUsage:
        """Refuse early (without reserving) when the charge would not fit now.

        A read-only pre-check so that a job can stop before it starts Spark: the same refusals
        as :meth:`reserve` (unknown dataset, a configured cap above the stored one, a charge
        past a cap). Only :meth:`reserve` is authoritative (another job may spend in between).

        Returns
        -------
        BudgetUsage
            The dataset's spent totals and the caps in force (the lower of the configured and
            the stored ones); for a dataset ``create_dataset`` would create, the configured
            caps and nothing spent.
        """
        usage = self.usage(dataset_id)
        if usage.epsilon_cap is None:
            if not create_dataset:
                raise self._missing_dataset(dataset_id)
            if epsilon_cap is None:
                raise LedgerError("creating a dataset's budget needs `epsilon_cap`")
            return BudgetUsage(dataset_id, 0.0, 0.0, float(epsilon_cap),
                               0.0 if delta_cap is None else float(delta_cap))
        eps_cap, del_cap = self._caps_in_force(
            dataset_id, (usage.epsilon_cap, usage.delta_cap), epsilon_cap, delta_cap)
        if usage.epsilon_spent + float(epsilon) > eps_cap + _SLACK:
            raise BudgetExceededError(epsilon, max(0.0, eps_cap - usage.epsilon_spent), "epsilon")
        delta = 0.0 if delta is None else float(delta)
        if delta > 0 and usage.delta_spent + delta > del_cap + _SLACK * del_cap:
            raise BudgetExceededError(delta, max(0.0, del_cap - usage.delta_spent), "delta")
        return BudgetUsage(dataset_id, usage.epsilon_spent, usage.delta_spent, eps_cap, del_cap)

    def _caps_in_force(self, dataset_id: str, stored, epsilon_cap, delta_cap) -> tuple[float, float]:
        """The lower of the configured and the stored caps; a configured cap above the stored
        one is refused (only :meth:`set_cap` raises a cap)."""
        caps = []
        for asked, have, what in ((epsilon_cap, stored[0], "epsilon_cap"),
                                  (delta_cap, stored[1], "delta_cap")):
            have = float(have)
            if asked is not None and asked > have + _SLACK:
                raise self._error(
                    f"the configured {what}={asked:g} for dataset {dataset_id!r} is above "
                    f"the ledger's {what}={have:g}; raise it explicitly with "
                    "`dpq-spark ledger set-cap` if that is intended")
            caps.append(have if asked is None else min(float(asked), have))
        return caps[0], caps[1]

    def _move(self, record_id: int, allowed_from: tuple[str, ...], to: str, *,
              output: str | None = None, note: str | None = None,
              cancelled_by: str | None = None, result: str | None = None) -> None:
        def txn(conn) -> None:
            row = self._exec(conn, "SELECT status FROM releases WHERE id = ?",
                             (record_id,)).fetchone()
            if row is None:
                raise self._error(f"no ledger record with id {record_id}")
            if row[0] not in allowed_from:
                raise self._error(f"ledger record {record_id} is {row[0]!r}; cannot become {to!r}")
            self._exec(
                conn,
                "UPDATE releases SET status = ?, updated_at = ?, output = COALESCE(?, output),"
                " note = COALESCE(?, note), cancelled_by = COALESCE(?, cancelled_by),"
                " result = COALESCE(?, result) WHERE id = ?",
                (to, _now(), output, note, cancelled_by, result, record_id),
            )

        self._write(txn)

    def mark_spent(self, record_id: int) -> None:
        """Mark a reservation as spent: the mechanism is about to run. It can no longer be
        cancelled."""
        self._move(record_id, ("reserved",), "spent")

    def record_output(self, record_id: int, path: str) -> None:
        """Record where a ``spent`` release is being written (a temporary path, before
        :meth:`commit`), so that a run that dies while writing leaves a findable trace."""
        self._move(record_id, ("spent",), "spent", output=path)

    def record_state(self, record_id: int, state: str) -> None:
        """Store the public state of a ``spent`` release that is still running (an
        interactive session's answers so far), replacing the last one; :meth:`result` reads
        it."""
        self._move(record_id, ("spent",), "spent", result=state)

    def commit(self, record_id: int, output: str, *, result: str | None = None) -> None:
        """Turn a spent reservation into a committed release written to ``output``.

        ``result``: the released values as text (public: they are the release), stored so that
        a named release asked again is returned as it was (:meth:`result`)."""
        self._move(record_id, ("spent",), "committed", output=output, result=result)

    def cancel(self, record_id: int, reason: str | None = None, *, by: str | None = None) -> None:
        """Give a reservation back; allowed only while it is ``reserved``.

        Parameters
        ----------
        record_id : int
        reason : str, optional
            Why (stored in the record's note); must not contain private data.
        by : str, optional
            Who cancels (stored in ``cancelled_by``; default: the OS user).

        Notes
        -----
        A job cancels its own reservation when it fails before sampling. An operator cancels a
        *stale* reservation (``dpq-spark ledger cancel ID --force``) only when the job that made
        it is known to be dead: a live job that has not marked it spent yet would still run.
        """
        self._move(record_id, ("reserved",), "cancelled", note=reason,
                   cancelled_by=by or _who())

    def note(self, record_id: int, text: str) -> None:
        """Attach a public note (e.g. why a spent job failed) without changing the status."""
        def txn(conn) -> None:
            self._exec(conn, "UPDATE releases SET note = ?, updated_at = ? WHERE id = ?",
                       (text, _now(), record_id))

        self._write(txn)

    def set_cap(self, dataset_id: str, *, epsilon_cap: float | None = None,
                delta_cap: float | None = None, force: bool = False) -> BudgetUsage:
        """Change an existing dataset's caps (the only way to raise them); never creates one.

        Parameters
        ----------
        dataset_id : str
            A dataset that :func:`~dpq_spark.pipeline.ledger.init_ledger` created.
        epsilon_cap, delta_cap : float, optional
            The new caps; a cap not given keeps its stored value. At least one is required.
        force : bool
            Allow a cap below what the dataset has already spent (no release fits afterwards).

        Returns
        -------
        BudgetUsage
            The dataset's spent totals and its new caps.

        Raises
        ------
        LedgerError
            If the dataset has no budget (a mistyped id never starts a fresh one), no cap is
            given, a cap is invalid, or a cap is below the spent total and ``force`` is false
            (the message says what is spent).
        """
        if epsilon_cap is None and delta_cap is None:
            raise LedgerError("give `epsilon_cap`, `delta_cap` or both")

        def txn(conn) -> BudgetUsage:
            stored = self._lock_budget(conn, dataset_id)  # (epsilon_cap, delta_cap)
            if stored is None:
                raise self._missing_dataset(dataset_id)
            eps_cap = float(stored[0]) if epsilon_cap is None else epsilon_cap
            dlt_cap = float(stored[1]) if delta_cap is None else delta_cap
            _check_caps(eps_cap, dlt_cap)
            eps, delta = self._spent(conn, dataset_id)
            below = []
            if eps_cap < eps - _SLACK:
                below.append(f"epsilon_cap={eps_cap:g} is below the epsilon already spent "
                             f"({eps:g})")
            if dlt_cap < delta - _SLACK:
                below.append(f"delta_cap={dlt_cap:g} is below the delta already spent ({delta:g})")
            if below and not force:
                raise self._error(f"dataset {dataset_id!r}: " + "; ".join(below)
                                  + "; no release would fit (pass force to set it anyway)")
            self._exec(conn, "UPDATE budgets SET epsilon_cap = ?, delta_cap = ?, updated_at = ? "
                       "WHERE dataset_id = ?", (float(eps_cap), float(dlt_cap), _now(), dataset_id))
            return BudgetUsage(dataset_id, eps, delta, float(eps_cap), float(dlt_cap))

        return self._write(txn)

    # -- reading ---------------------------------------------------------------------------

    def get(self, record_id: int) -> LedgerRecord:
        """One record by id."""
        with self._reading() as conn:
            row = self._exec(conn, f"SELECT {', '.join(RECORD_COLUMNS)} FROM releases "
                             "WHERE id = ?", (record_id,)).fetchone()
        if row is None:
            raise self._error(f"no ledger record with id {record_id}")
        return _record(row)

    def _named_row(self, conn, dataset_id: str, name: str):
        return self._exec(conn, "SELECT id, name, status FROM releases WHERE dataset_id = ? AND "
                          "name = ? AND status <> 'cancelled'", (dataset_id, name)).fetchone()

    def named(self, dataset_id: str, name: str) -> LedgerRecord | None:
        """The live (not cancelled) record of ``dataset_id`` called ``name``, if any."""
        with self._reading() as conn:
            row = self._named_row(conn, dataset_id, name)
        return None if row is None else self.get(int(row[0]))

    def result(self, record_id: int) -> str | None:
        """The released values a committed record stored, or the last state a running one
        recorded (:meth:`record_state`); ``None`` if it stored none."""
        with self._reading() as conn:
            row = self._exec(conn, "SELECT result FROM releases WHERE id = ?",
                             (record_id,)).fetchone()
        if row is None:
            raise self._error(f"no ledger record with id {record_id}")
        return row[0]

    def unit(self, dataset_id: str) -> PrivacyUnit:
        """The privacy unit of ``dataset_id``'s budget (one row when none was recorded)."""
        with self._reading() as conn:
            row = self._exec(conn, "SELECT unit FROM budgets WHERE dataset_id = ?",
                             (dataset_id,)).fetchone()
        if row is None:
            raise self._missing_dataset(dataset_id)
        return PrivacyUnit.from_json(row[0])

    def records(self, dataset_id: str | None = None) -> list[LedgerRecord]:
        """All records of ``dataset_id`` (of every dataset when ``None``), oldest first."""
        cols = ", ".join(RECORD_COLUMNS)
        with self._reading() as conn:
            if dataset_id is None:
                rows = self._exec(conn, f"SELECT {cols} FROM releases ORDER BY id").fetchall()
            else:
                rows = self._exec(conn, f"SELECT {cols} FROM releases WHERE dataset_id = ? "
                                  "ORDER BY id", (dataset_id,)).fetchall()
        return [_record(r) for r in rows]

    def datasets(self) -> list[str]:
        """The dataset ids with a budget in this ledger."""
        with self._reading() as conn:
            rows = self._exec(conn, "SELECT dataset_id FROM budgets ORDER BY dataset_id").fetchall()
        return [r[0] for r in rows]

    def usage(self, dataset_id: str) -> BudgetUsage:
        """The budget ``dataset_id`` has spent, and its stored caps (``None`` if unknown)."""
        with self._reading() as conn:
            eps, delta = self._spent(conn, dataset_id)
            row = self._exec(conn, "SELECT epsilon_cap, delta_cap FROM budgets WHERE "
                             "dataset_id = ?", (dataset_id,)).fetchone()
        caps = (None, None) if row is None else (float(row[0]), float(row[1]))
        return BudgetUsage(dataset_id, eps, delta, *caps)

    def export(self, format: str = "json", dataset_id: str | None = None) -> str:
        """The records (of one dataset, or all) as CSV or JSON text, for an audit.

        JSON is ``{"ledger": NAME, "exported_at": ..., "budgets": [...], "records": [...]}``;
        CSV has one row per record with the columns of :class:`LedgerRecord` (``parameters``
        as a JSON string). Only public parameters are stored, so the export holds no data.
        """
        if format not in ("csv", "json"):
            raise self._error(f"`format` must be 'csv' or 'json', got {format!r}")
        records = self.records(dataset_id)
        if format == "json":
            ids = [dataset_id] if dataset_id is not None else self.datasets()
            budgets = []
            for d in ids:
                u = self.usage(d)
                budgets.append({**dataclasses.asdict(u), "epsilon_remaining": u.epsilon_remaining,
                                "delta_remaining": u.delta_remaining,
                                "privacy_unit": dataclasses.asdict(self.unit(d))})
            return json.dumps({"ledger": self.name, "exported_at": _now(), "budgets": budgets,
                               "records": [dataclasses.asdict(r) for r in records]},
                              indent=2, sort_keys=False)
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(RECORD_COLUMNS)
        for r in records:
            row = dataclasses.asdict(r)
            row["parameters"] = json.dumps(row["parameters"], sort_keys=True)
            writer.writerow(["" if row[c] is None else row[c] for c in RECORD_COLUMNS])
        return buf.getvalue()


def _record(row) -> LedgerRecord:
    values = dict(zip(RECORD_COLUMNS, tuple(row)))
    values["parameters"] = json.loads(values["parameters"])
    values["epsilon"], values["delta"] = float(values["epsilon"]), float(values["delta"])
    return LedgerRecord(**values)


def _check_caps(epsilon_cap: float, delta_cap: float) -> None:
    if isinstance(epsilon_cap, bool) or not isinstance(epsilon_cap, (int, float)) or not (
            0 < epsilon_cap < float("inf")):
        raise LedgerError(f"`epsilon_cap` must be finite and > 0, got {epsilon_cap!r}")
    if isinstance(delta_cap, bool) or not isinstance(delta_cap, (int, float)) or not (
            0.0 <= delta_cap < 1.0):
        raise LedgerError(f"`delta_cap` must be in [0, 1), got {delta_cap!r}")
