"""The privacy ledger: a SQLite record of the budget every release spends on a dataset.

Scheduled jobs re-run and each run spends budget on the same people, so every release is charged
against a per-dataset cap under basic (sequential) composition: the epsilons add up, and so do
the deltas. The life of one charge:

``reserved``
    Taken before the job reads any data, inside one ``BEGIN IMMEDIATE`` transaction that sums
    what is already charged and refuses with :class:`~dpq_spark.core.errors.BudgetExceededError`
    when the cap would be passed. Two jobs started together are serialised by SQLite's write
    lock, so they cannot both take the last of the budget.
``spent``
    Set just before the mechanism runs: from here on noisy values may exist.
``committed``
    The output is written; the record carries its location.
``cancelled``
    The job failed *before* any noisy value existed and gave the budget back. Only a job that
    is still alive and knows it never sampled may cancel; a job that dies (killed, out of
    memory) leaves its record ``reserved`` or ``spent``, and both keep counting: the ledger
    errs on the side of privacy.

Every status but ``cancelled`` counts towards the cap. The cap of a dataset is stored the first
time the dataset is seen; a configuration may ask for a *lower* cap, but raising it needs an
explicit :meth:`Ledger.set_cap` (``dpq-spark ledger set-cap``), so that a careless config file
cannot quietly grant more budget.

The ledger stores public parameters only, never data, counts or results.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import socket
import sqlite3
from typing import Any

from dpq_spark.core.errors import BudgetExceededError, DPQValueError

__all__ = ["Ledger", "LedgerRecord", "BudgetUsage", "LedgerError", "COUNTED_STATUSES"]

#: Statuses that count towards the cap.
COUNTED_STATUSES = ("reserved", "spent", "committed")

# Sums of many small epsilons are not exact in floating point: 10 x 0.1 must fit a cap of 1.
_SLACK = 1e-9

_SCHEMA = """
CREATE TABLE IF NOT EXISTS budgets (
    dataset_id  TEXT PRIMARY KEY,
    epsilon_cap REAL NOT NULL,
    delta_cap   REAL NOT NULL,
    updated_at  TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS releases (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    dataset_id  TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('reserved', 'spent', 'committed', 'cancelled')),
    epsilon     REAL NOT NULL,
    delta       REAL NOT NULL,
    mechanism   TEXT NOT NULL,
    parameters  TEXT NOT NULL,
    output      TEXT,
    job         TEXT,
    host        TEXT,
    pid         INTEGER,
    reserved_at TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    note        TEXT
);
CREATE INDEX IF NOT EXISTS releases_by_dataset ON releases (dataset_id, status);
"""


class LedgerError(DPQValueError):
    """The ledger refuses an operation (unknown record, a cap raised by a config, ...)."""


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
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class Ledger:
    """A privacy ledger in one SQLite file (created on first use, with its directory).

    Parameters
    ----------
    path : str
        The SQLite file. Keep it on a local or otherwise lock-respecting file system (SQLite
        locking is unreliable on some network file systems).
    timeout : float
        Seconds to wait for another job's transaction before giving up.

    Notes
    -----
    Each method opens its own short-lived connection, so a ``Ledger`` may be shared by threads
    and processes alike; concurrency is SQLite's file locking.
    """

    def __init__(self, path: str, *, timeout: float = 60.0):
        self.path = os.path.abspath(path)
        self.timeout = float(timeout)
        parent = os.path.dirname(self.path)
        os.makedirs(parent, exist_ok=True)
        with self._connect() as conn:
            conn.executescript(_SCHEMA)

    # -- plumbing ------------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        conn.row_factory = sqlite3.Row
        return conn

    def _write(self, fn):
        """Run ``fn(conn)`` inside ``BEGIN IMMEDIATE`` ... ``COMMIT`` (rolled back on error)."""
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result
        finally:
            conn.close()

    @staticmethod
    def _spent(conn: sqlite3.Connection, dataset_id: str) -> tuple[float, float]:
        marks = ",".join("?" * len(COUNTED_STATUSES))
        row = conn.execute(
            f"SELECT COALESCE(SUM(epsilon), 0), COALESCE(SUM(delta), 0) FROM releases "
            f"WHERE dataset_id = ? AND status IN ({marks})",
            (dataset_id, *COUNTED_STATUSES),
        ).fetchone()
        return float(row[0]), float(row[1])

    # -- the budget ----------------------------------------------------------------------------

    def reserve(self, dataset_id: str, *, epsilon: float, delta: float | None = None,
                epsilon_cap: float, delta_cap: float = 0.0, mechanism: str,
                parameters: dict[str, Any] | None = None, job: str | None = None) -> int:
        """Reserve ``epsilon`` (and ``delta``) for one release of ``dataset_id``.

        Parameters
        ----------
        dataset_id : str
            The dataset the budget is of (the people it protects).
        epsilon, delta : float
            What the release will spend (``delta=None`` means 0).
        epsilon_cap, delta_cap : float
            The caps the caller's configuration states. On first use they become the dataset's
            caps; later they may only lower the effective cap, never raise it.
        mechanism : str
            Name of the mechanism, e.g. ``"joint_exp"``.
        parameters : dict, optional
            Public parameters of the release (JSON-serialisable), stored with the record.
        job : str, optional
            Name of the job that reserves.

        Returns
        -------
        int
            The record id; pass it to :meth:`mark_spent`, :meth:`commit` or :meth:`cancel`.

        Raises
        ------
        BudgetExceededError
            If the charge would pass a cap. Nothing is recorded.
        LedgerError
            If ``epsilon_cap`` or ``delta_cap`` is above the dataset's stored cap.
        """
        delta = 0.0 if delta is None else float(delta)
        epsilon = float(epsilon)
        params = json.dumps(parameters or {}, sort_keys=True)

        def txn(conn: sqlite3.Connection) -> int:
            row = conn.execute("SELECT epsilon_cap, delta_cap FROM budgets WHERE dataset_id = ?",
                               (dataset_id,)).fetchone()
            if row is None:
                conn.execute("INSERT INTO budgets VALUES (?, ?, ?, ?)",
                             (dataset_id, float(epsilon_cap), float(delta_cap), _now()))
                eps_cap, del_cap = float(epsilon_cap), float(delta_cap)
            else:
                for asked, stored, what in ((epsilon_cap, row[0], "epsilon_cap"),
                                            (delta_cap, row[1], "delta_cap")):
                    if asked > stored + _SLACK:
                        raise LedgerError(
                            f"the configured {what}={asked:g} for dataset {dataset_id!r} is above "
                            f"the ledger's {what}={stored:g}; raise it explicitly with "
                            f"`dpq-spark ledger set-cap` if that is intended"
                        )
                eps_cap, del_cap = min(epsilon_cap, row[0]), min(delta_cap, row[1])
            eps_spent, del_spent = self._spent(conn, dataset_id)
            if eps_spent + epsilon > eps_cap + _SLACK:
                raise BudgetExceededError(epsilon, max(0.0, eps_cap - eps_spent), "epsilon")
            if delta > 0 and del_spent + delta > del_cap + _SLACK * del_cap:
                raise BudgetExceededError(delta, max(0.0, del_cap - del_spent), "delta")
            now = _now()
            cur = conn.execute(
                "INSERT INTO releases (dataset_id, status, epsilon, delta, mechanism, parameters,"
                " job, host, pid, reserved_at, updated_at) VALUES (?, 'reserved', ?, ?, ?, ?, ?, ?,"
                " ?, ?, ?)",
                (dataset_id, epsilon, delta, mechanism, params, job, socket.gethostname(),
                 os.getpid(), now, now),
            )
            return int(cur.lastrowid)

        return self._write(txn)

    def _move(self, record_id: int, allowed_from: tuple[str, ...], to: str, *,
              output: str | None = None, note: str | None = None) -> None:
        def txn(conn: sqlite3.Connection) -> None:
            row = conn.execute("SELECT status FROM releases WHERE id = ?", (record_id,)).fetchone()
            if row is None:
                raise LedgerError(f"no ledger record with id {record_id}")
            if row[0] not in allowed_from:
                raise LedgerError(f"ledger record {record_id} is {row[0]!r}; cannot become {to!r}")
            conn.execute(
                "UPDATE releases SET status = ?, updated_at = ?, output = COALESCE(?, output),"
                " note = COALESCE(?, note) WHERE id = ?",
                (to, _now(), output, note, record_id),
            )

        self._write(txn)

    def mark_spent(self, record_id: int) -> None:
        """Mark a reservation as spent: the mechanism is about to run. It can no longer be
        cancelled."""
        self._move(record_id, ("reserved",), "spent")

    def commit(self, record_id: int, output: str) -> None:
        """Turn a spent reservation into a committed release written to ``output``."""
        self._move(record_id, ("spent",), "committed", output=output)

    def cancel(self, record_id: int, reason: str | None = None) -> None:
        """Give a reservation back. Allowed only while it is ``reserved`` (no noisy value can
        exist yet); ``reason`` must not contain private data."""
        self._move(record_id, ("reserved",), "cancelled", note=reason)

    def note(self, record_id: int, text: str) -> None:
        """Attach a public note (e.g. why a spent job failed) without changing the status."""
        def txn(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE releases SET note = ?, updated_at = ? WHERE id = ?",
                         (text, _now(), record_id))

        self._write(txn)

    def set_cap(self, dataset_id: str, *, epsilon_cap: float, delta_cap: float = 0.0) -> None:
        """Set a dataset's caps explicitly (the only way to raise them)."""
        if not (epsilon_cap > 0 and epsilon_cap != float("inf")):
            raise LedgerError(f"`epsilon_cap` must be finite and > 0, got {epsilon_cap!r}")
        if not (0.0 <= delta_cap < 1.0):
            raise LedgerError(f"`delta_cap` must be in [0, 1), got {delta_cap!r}")

        def txn(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO budgets VALUES (?, ?, ?, ?) ON CONFLICT (dataset_id) DO UPDATE SET "
                "epsilon_cap = excluded.epsilon_cap, delta_cap = excluded.delta_cap, "
                "updated_at = excluded.updated_at",
                (dataset_id, float(epsilon_cap), float(delta_cap), _now()),
            )

        self._write(txn)

    # -- reading -------------------------------------------------------------------------------

    def records(self, dataset_id: str | None = None) -> list[LedgerRecord]:
        """All records of ``dataset_id`` (of every dataset when ``None``), oldest first."""
        conn = self._connect()
        try:
            if dataset_id is None:
                rows = conn.execute("SELECT * FROM releases ORDER BY id").fetchall()
            else:
                rows = conn.execute("SELECT * FROM releases WHERE dataset_id = ? ORDER BY id",
                                    (dataset_id,)).fetchall()
        finally:
            conn.close()
        return [
            LedgerRecord(**{**dict(r), "parameters": json.loads(r["parameters"])}) for r in rows
        ]

    def usage(self, dataset_id: str) -> BudgetUsage:
        """The budget ``dataset_id`` has spent, and its stored caps (``None`` if never seen)."""
        conn = self._connect()
        try:
            eps, delta = self._spent(conn, dataset_id)
            row = conn.execute("SELECT epsilon_cap, delta_cap FROM budgets WHERE dataset_id = ?",
                               (dataset_id,)).fetchone()
        finally:
            conn.close()
        caps = (None, None) if row is None else (float(row[0]), float(row[1]))
        return BudgetUsage(dataset_id, eps, delta, *caps)
