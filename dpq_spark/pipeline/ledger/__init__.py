"""The privacy ledger: a database record of the budget every release spends on a dataset.

Scheduled jobs re-run and each run spends budget on the same people, so every release is charged
against a per-dataset cap under basic (sequential) composition: the epsilons add up, and so do
the deltas. A ledger lives at a URL:

``sqlite:///ABSOLUTE/PATH`` (or a plain file path)
    One SQLite file, for one machine (``make run``, a single driver). SQLite's file locking is
    unreliable on network and FUSE mounts (NFS, DBFS, Volumes): never share a file there.
``postgresql://user@host:5432/db``
    A shared PostgreSQL server (Databricks Lakebase, Amazon RDS, Cloud SQL, a team's own), for
    jobs on many machines. The password never goes in the URL stored in a config: it comes from
    the environment (``PGPASSWORD``, ``PGPASSFILE`` and the other libpq variables) or from a file
    named by ``password_file``. Needs the ``postgres`` extra (psycopg 3).

The life of one charge:

``reserved``
    Taken inside one database transaction that first locks the dataset's budget row (SQLite:
    ``BEGIN IMMEDIATE``, the database write lock; PostgreSQL: ``SELECT ... FOR UPDATE`` on the
    row), then sums what is already charged and refuses with
    :class:`~dpq_spark.core.errors.BudgetExceededError` when the cap would be passed. Two jobs
    that race for the last of the budget, on one machine or on many, are serialised by the
    database and cannot both take it.
``spent``
    Set just before the mechanism runs: from here on noisy values may exist.
``committed``
    The output is written; the record carries its location.
``cancelled``
    The budget was given back: the job failed (or was stopped) *before* any noisy value existed,
    or an operator cancelled a reservation whose job is known dead (``dpq-spark ledger cancel``,
    which records who and why). Only a ``reserved`` record can be cancelled.

Every status but ``cancelled`` counts towards the cap. A ledger, and a dataset's budget in it,
is *opened, never created* by default: :func:`init_ledger` (``dpq-spark ledger init``) creates
them, and a job creates them only when its config says ``ledger.create = true``. A mistyped path
or dataset id therefore fails instead of starting a fresh, full budget. A configuration may ask
for a *lower* cap than the stored one, but raising it needs an explicit :meth:`Ledger.set_cap`.

The ledger stores public parameters only, never data, counts or group sizes; a named release
also stores its released values (public: they are the release), so that asking for it again
returns it as it was. Error messages name
the ledger by its redacted URL (:func:`redact_url`: no password).
"""

from __future__ import annotations

from dpq_spark.pipeline.ledger.base import (
    COUNTED_STATUSES, BudgetUsage, Ledger, LedgerError, LedgerRecord, _check_caps, is_postgres_url,
    redact_url,
)
from dpq_spark.pipeline.ledger.postgres import PostgresLedger
from dpq_spark.pipeline.ledger.sqlite import SQLiteLedger
from dpq_spark.pipeline.ledger.unit import ROW, PrivacyUnit

__all__ = [
    "Ledger",
    "PrivacyUnit",
    "SQLiteLedger",
    "LedgerRecord",
    "BudgetUsage",
    "LedgerError",
    "COUNTED_STATUSES",
    "open_ledger",
    "init_ledger",
    "redact_url",
    "is_postgres_url",
]


def open_ledger(url: str, *, create: bool = False, password_file: str | None = None,
                timeout: float = 60.0) -> Ledger:
    """Open the ledger at ``url``; never creates one unless ``create=True``.

    Parameters
    ----------
    url : str
        ``sqlite:///ABSOLUTE/PATH``, a plain file path, or ``postgresql://user@host/db``
        (without a password: see the module docstring).
    create : bool
        Create the ledger's tables (and a SQLite file) when missing.
    password_file : str, optional
        A file whose first line is the PostgreSQL password (else libpq's environment).
    timeout : float
        Seconds to wait for a lock (SQLite) or a connection (PostgreSQL).

    Returns
    -------
    Ledger

    Raises
    ------
    LedgerError
        The ledger does not exist (and ``create`` is false), cannot be reached, or is not a
        dpq_spark ledger. The message names the ledger, never the password.

    Examples
    --------
    >>> ledger = open_ledger("postgresql://dpq@db.example.com/privacy")   # doctest: +SKIP
    >>> ledger.usage("analytics.sessions").epsilon_remaining               # doctest: +SKIP
    >>> ledger.cancel(42, "job run 1234 was killed by the scheduler")      # doctest: +SKIP
    """
    if not isinstance(url, str) or not url.strip():
        raise LedgerError(f"the ledger URL must be a non-empty string, got {url!r}")
    if is_postgres_url(url):
        return PostgresLedger(url, create=create, password_file=password_file, timeout=timeout)
    if "://" in url and not url.startswith("sqlite:"):
        raise LedgerError(f"ledger {redact_url(url)}: unsupported URL scheme; use "
                          "sqlite:///PATH or postgresql://...")
    return SQLiteLedger(url, create=create, timeout=timeout)


def init_ledger(url: str, *, dataset_id: str | None = None, epsilon_cap: float | None = None,
                delta_cap: float = 0.0, password_file: str | None = None,
                unit: PrivacyUnit | None = None) -> Ledger:
    """Create a ledger (if missing) and, when ``dataset_id`` is given, the dataset's budget.

    Parameters
    ----------
    url : str
        Where the ledger lives (see :func:`open_ledger`).
    dataset_id : str, optional
        The dataset whose budget to create.
    epsilon_cap, delta_cap : float
        Its caps (``epsilon_cap`` is required with ``dataset_id``).
    password_file : str, optional
        For a PostgreSQL ledger.
    unit : PrivacyUnit, optional
        Whose privacy the budget counts (default: one row under add/remove). Every release
        charged to it must protect this unit (or one containing it).

    Raises
    ------
    LedgerError
        If the dataset already has a budget with other caps (use :meth:`Ledger.set_cap`) or
        another privacy unit.
    """
    if dataset_id is not None and epsilon_cap is None:
        raise LedgerError("`epsilon_cap` is required with `dataset_id`")
    if epsilon_cap is not None:
        _check_caps(epsilon_cap, delta_cap)
    ledger = open_ledger(url, create=True, password_file=password_file)
    if dataset_id is not None and not ledger.create_dataset(
            dataset_id, epsilon_cap=epsilon_cap, delta_cap=delta_cap, unit=unit):
        usage = ledger.usage(dataset_id)
        if (usage.epsilon_cap, usage.delta_cap) != (float(epsilon_cap), float(delta_cap)):
            raise ledger._error(
                f"dataset {dataset_id!r} already has epsilon_cap={usage.epsilon_cap:g}, "
                f"delta_cap={usage.delta_cap:g}; change caps with `dpq-spark ledger set-cap`")
        stored = ledger.unit(dataset_id)
        if stored != (unit or ROW):
            raise ledger._error(
                f"dataset {dataset_id!r} already has the privacy unit {stored.describe()}, not "
                f"{(unit or ROW).describe()}; a budget keeps the unit it was created with")
    return ledger
