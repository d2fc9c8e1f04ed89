"""The SQLite backend of the privacy ledger: one file on one machine (``sqlite:///PATH``)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import urllib.parse
from typing import Iterator

from dpq_spark.pipeline.ledger.base import MIGRATIONS, NAMED_INDEX, Ledger, sqlite_path

__all__ = ["SQLiteLedger"]

_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS budgets (
    dataset_id  TEXT PRIMARY KEY,
    epsilon_cap REAL NOT NULL,
    delta_cap   REAL NOT NULL,
    updated_at  TEXT NOT NULL,
    unit        TEXT
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
    note        TEXT,
    cancelled_by TEXT,
    name        TEXT,
    result      TEXT
);
CREATE INDEX IF NOT EXISTS releases_by_dataset ON releases (dataset_id, status);
"""


class SQLiteLedger(Ledger):
    """A ledger in one SQLite file (one machine). Use :func:`open_ledger`.

    Parameters
    ----------
    path : str
        The SQLite file. Keep it on a local disk (SQLite locking is unreliable on network and
        FUSE file systems).
    create : bool
        Create the file (and its directory) and the tables when missing. Default False: a
        missing file is an error that names it.
    timeout : float
        Seconds to wait for another job's transaction before giving up.
    """

    def __init__(self, path: str, *, create: bool = False, timeout: float = 60.0):
        self.path = sqlite_path(path)
        self.name = self.path
        self.timeout = float(timeout)
        if not os.path.exists(self.path):
            if not create:
                raise self._error(
                    "does not exist; create it with `dpq-spark ledger init` (or set "
                    "`ledger.create = true` in the job config for its first run)")
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
        if create:
            with self._guard():
                conn = self._connect(create=True)
                try:
                    conn.executescript(_SQLITE_SCHEMA)
                finally:
                    conn.close()
        with self._guard():  # an existing file must be a ledger (and is upgraded if older)
            conn = self._connect()
            try:
                tables = {r[0] for r in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table'")}
                if not {"budgets", "releases"} <= tables:
                    raise self._error("is not a dpq_spark ledger (no `budgets`/`releases` "
                                      "tables); `dpq-spark ledger init` creates one")
                self._migrate(conn)
            finally:
                conn.close()

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        """Add the columns and the index an older ledger lacks, in one transaction."""
        missing = [(t, c, kind) for t, c, kind in MIGRATIONS
                   if c not in {r[1] for r in conn.execute(f"PRAGMA table_info({t})")}]
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        if not missing and "releases_named" in indexes:
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            for table, column, kind in missing:
                if column not in {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            conn.execute(NAMED_INDEX)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _connect(self, create: bool = False) -> sqlite3.Connection:
        mode = "rwc" if create else "rw"
        uri = "file:" + urllib.parse.quote(self.path) + f"?mode={mode}"
        return sqlite3.connect(uri, uri=True, timeout=self.timeout, isolation_level=None)

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise self._error(f"{type(exc).__name__}: {exc}") from None

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._guard():
            conn = self._connect()
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            finally:
                conn.close()

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        with self._guard():
            conn = self._connect()
            try:
                yield conn
            finally:
                conn.close()

    def _exec(self, conn, sql: str, params: tuple = ()):
        return conn.execute(sql, params)
