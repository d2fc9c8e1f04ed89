"""The privacy ledger on both backends (SQLite file, real PostgreSQL server): opening, life
cycle, refusal, caps, operator cancel, export, errors that name the ledger, and races."""

from __future__ import annotations

import csv
import io
import json
import multiprocessing as mp
import os
import time

import pytest

from dpq_spark.core.errors import BudgetExceededError
from dpq_spark.pipeline.ledger import LedgerError, SQLiteLedger, init_ledger, open_ledger, redact_url


def reserve(ledger, eps=1.0, cap=3.0, **kw):
    return ledger.reserve("books", epsilon=eps, epsilon_cap=cap, mechanism="joint_exp",
                          parameters={"quantiles": [0.5]}, job="t", **kw)


@pytest.fixture
def ledger(ledger_url):
    return init_ledger(ledger_url, dataset_id="books", epsilon_cap=3.0, delta_cap=1.5e-6)


def test_life_cycle_and_usage(ledger):
    a = reserve(ledger)
    ledger.mark_spent(a)
    ledger.commit(a, "/out/a")
    b = reserve(ledger)
    ledger.cancel(b, "failed before sampling: ValueError", by="job t")
    recs = ledger.records("books")
    assert [(r.status, r.output) for r in recs] == [("committed", "/out/a"), ("cancelled", None)]
    assert recs[0].parameters == {"quantiles": [0.5]} and recs[0].mechanism == "joint_exp"
    assert recs[1].cancelled_by == "job t" and recs[1].note.startswith("failed before")
    usage = ledger.usage("books")
    assert usage.epsilon_spent == 1.0 and usage.epsilon_cap == 3.0 and usage.epsilon_remaining == 2.0
    assert ledger.get(a).output == "/out/a"


def test_refuses_over_cap_and_records_nothing(ledger):
    reserve(ledger, eps=2.0)
    with pytest.raises(BudgetExceededError, match=r"asks for epsilon=2 but only epsilon=1 is left"):
        reserve(ledger, eps=2.0)
    assert len(ledger.records("books")) == 1
    reserve(ledger, eps=1.0)  # exactly the rest still fits
    with pytest.raises(BudgetExceededError):
        reserve(ledger, eps=1e-6)
    with pytest.raises(BudgetExceededError):  # the read-only pre-check agrees
        ledger.check_budget("books", epsilon=1e-6, epsilon_cap=3.0)


def test_many_small_charges_fit_their_cap(ledger_url):
    ledger = init_ledger(ledger_url, dataset_id="books", epsilon_cap=1.0)
    for _ in range(10):
        reserve(ledger, eps=0.1, cap=1.0)  # 10 x 0.1 is not exactly 1.0 in floating point
    with pytest.raises(BudgetExceededError):
        reserve(ledger, eps=0.1, cap=1.0)


def test_reserved_and_spent_count_cancelled_does_not(ledger):
    a = reserve(ledger)            # a job that died while reading: stays reserved, counts
    b = reserve(ledger)
    ledger.mark_spent(b)           # a job that died after sampling: counts
    c = reserve(ledger)
    ledger.cancel(c)               # a job that failed before sampling: given back
    assert ledger.usage("books").epsilon_spent == 2.0
    with pytest.raises(LedgerError, match="is 'spent'; cannot become 'cancelled'"):
        ledger.cancel(b)
    with pytest.raises(LedgerError, match="is 'reserved'; cannot become 'committed'"):
        ledger.commit(a, "/x")
    with pytest.raises(LedgerError, match=f"ledger {ledger.name}: no ledger record with id 99"):
        ledger.mark_spent(99)
    # the operator releases the stale reservation of a dead job: recorded who and why
    ledger.cancel(a, "job known dead: cluster terminated", by="alice")
    rec = ledger.get(a)
    assert (rec.status, rec.cancelled_by, rec.note) == ("cancelled", "alice",
                                                       "job known dead: cluster terminated")
    assert ledger.usage("books").epsilon_spent == 1.0


def test_delta_is_capped(ledger_url):
    ledger = init_ledger(ledger_url, dataset_id="books", epsilon_cap=3.0, delta_cap=1.5e-6)
    reserve(ledger, delta=1e-6, delta_cap=1.5e-6)
    with pytest.raises(BudgetExceededError, match="delta"):
        reserve(ledger, delta=1e-6, delta_cap=1.5e-6)
    ledger.create_dataset("x", epsilon_cap=5)
    with pytest.raises(BudgetExceededError, match="delta"):  # no delta cap
        ledger.reserve("x", epsilon=1, delta=1e-9, epsilon_cap=5, mechanism="joint_exp")


def test_config_cannot_raise_the_stored_cap(ledger_url):
    ledger = init_ledger(ledger_url, dataset_id="books", epsilon_cap=2.0)
    reserve(ledger, cap=2.0)
    with pytest.raises(LedgerError, match=r"epsilon_cap=5 .* above the ledger's epsilon_cap=2"):
        reserve(ledger, cap=5.0)
    with pytest.raises(BudgetExceededError):  # a lower configured cap applies
        reserve(ledger, cap=1.5)
    ledger.set_cap("books", epsilon_cap=5.0)
    reserve(ledger, cap=5.0)
    assert ledger.usage("books").epsilon_cap == 5.0


def test_a_ledger_is_opened_never_created(ledger_url):
    with pytest.raises(LedgerError, match=r"ledger .*(does not exist|has no dpq_spark ledger "
                                          r"tables).*dpq-spark ledger init"):
        open_ledger(ledger_url)
    if ledger_url.startswith("sqlite"):
        assert not os.path.exists(ledger_url[len("sqlite://"):])  # no empty file left behind
    ledger = open_ledger(ledger_url, create=True)
    with pytest.raises(LedgerError, match=r"has no budget for dataset 'books'.*ledger init"):
        reserve(ledger)           # an unknown (e.g. mistyped) dataset is not a fresh budget
    with pytest.raises(LedgerError, match=r"has no budget for dataset 'books'"):
        ledger.check_budget("books", epsilon=1.0, epsilon_cap=3.0)
    reserve(ledger, create_dataset=True)  # a config's first run may create it, if it says so
    assert open_ledger(ledger_url).usage("books").epsilon_cap == 3.0
    init_ledger(ledger_url, dataset_id="books", epsilon_cap=3.0)  # same caps: a no-op
    with pytest.raises(LedgerError, match="already has epsilon_cap=3.*set-cap"):
        init_ledger(ledger_url, dataset_id="books", epsilon_cap=4.0)


def test_export_csv_and_json(ledger):
    a = reserve(ledger)
    ledger.mark_spent(a)
    ledger.commit(a, "/out/a")
    reserve(ledger, eps=0.5)
    rows = list(csv.DictReader(io.StringIO(ledger.export("csv"))))
    assert [(r["id"], r["status"], r["epsilon"]) for r in rows] == [
        (str(a), "committed", "1.0"), (str(a + 1), "reserved", "0.5")]
    assert json.loads(rows[0]["parameters"]) == {"quantiles": [0.5]}
    doc = json.loads(ledger.export("json", dataset_id="books"))
    assert doc["ledger"] == ledger.name and "password" not in doc["ledger"]
    assert doc["budgets"][0]["epsilon_spent"] == 1.5 and len(doc["records"]) == 2
    with pytest.raises(LedgerError, match="`format` must be 'csv' or 'json'"):
        ledger.export("xml")


def test_corrupt_and_foreign_sqlite_files_are_named(tmp_path):
    bad = tmp_path / "corrupt.sqlite"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(LedgerError, match=f"ledger {bad}: DatabaseError: file is not a database"):
        open_ledger(str(bad))
    import sqlite3

    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(LedgerError, match=f"ledger {other}: is not a dpq_spark ledger"):
        open_ledger(f"sqlite://{other}")
    with pytest.raises(LedgerError, match="unsupported URL scheme"):
        open_ledger("mysql://u:secret@h/db")


def test_postgres_credentials_never_in_messages(postgres, pg_url):
    assert redact_url("postgresql://u:s3cret@h:5/db?password=x&sslmode=require") == \
        "postgresql://u:***@h:5/db?password=%2A%2A%2A&sslmode=require"
    wrong = pg_url.replace("://dpq@", f"://dpq:{postgres.password}X@")
    with pytest.raises(LedgerError) as err:
        open_ledger(wrong)
    text = str(err.value)
    assert "password authentication failed" in text and postgres.password not in text
    assert text.startswith("ledger postgresql://dpq:***@127.0.0.1:")
    # a password file instead of the environment
    pwfile = postgres.dir + "/../dpq-pw-test"
    with open(pwfile, "w") as fh:
        fh.write(postgres.password + "\n")
    try:
        old = os.environ.pop("PGPASSWORD")
        try:
            with pytest.raises(LedgerError, match="password"):
                open_ledger(pg_url, create=True)  # no password anywhere: refused by the server
            assert open_ledger(pg_url, create=True, password_file=pwfile).datasets() == []
        finally:
            os.environ["PGPASSWORD"] = old
    finally:
        os.remove(pwfile)


# --- races ---------------------------------------------------------------------------------------


def _slow(cls):
    """Widen the window between checking the budget and recording the charge."""

    class Slow(cls):
        def _spent(self, conn, dataset_id):
            out = super()._spent(conn, dataset_id)
            time.sleep(0.3)
            return out

    return Slow


def _unlocked(cls):
    """A deliberately wrong ledger: no row lock / write transaction around check and insert."""

    class Unlocked(_slow(cls)):
        _LOCK_BUDGET = "SELECT epsilon_cap, delta_cap FROM budgets WHERE dataset_id = ?"

        def _write(self, fn):
            conn = self._connect()  # SQLite: isolation_level=None, i.e. autocommit
            try:
                if not isinstance(getattr(conn, "autocommit", True), bool) or \
                        hasattr(conn, "pgconn"):
                    conn.autocommit = True  # PostgreSQL: every statement on its own
                return fn(conn)
            finally:
                conn.close()

    return Unlocked


def _race(kind, url, barrier, results):
    from dpq_spark.pipeline.ledger import Ledger, open_ledger

    base = type(open_ledger(url))
    cls = {"locked": _slow, "unlocked": _unlocked}[kind](base)
    ledger = cls.__new__(cls)
    ledger.__dict__.update(open_ledger(url).__dict__)
    assert isinstance(ledger, Ledger)
    from dpq_spark.pipeline.charge import reserved

    barrier.wait()
    try:  # the life of a charge that sessions and jobs share
        with reserved(ledger, "books", by="racer", epsilon=1.0, epsilon_cap=10.0,
                      mechanism="joint_exp") as charge, charge.spending():
            charge.commit("nowhere")
        results.put("ok")
    except BudgetExceededError:
        results.put("refused")


def _run_race(kind, url, n):
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(kind, url, barrier, results)) for _ in range(n)]
    for p in procs:
        p.start()
    outcomes = sorted(results.get(timeout=180) for _ in range(n))
    for p in procs:
        p.join(timeout=60)
    return outcomes


@pytest.mark.slow
@pytest.mark.parametrize("n", [8])
def test_racing_jobs_never_pass_the_cap(ledger_url, n):
    """8 processes race for 2 units of budget left through the life of a charge that sessions
    and jobs share: exactly 2 get it, on both backends."""
    ledger = init_ledger(ledger_url, dataset_id="books", epsilon_cap=10.0)
    for _ in range(8):
        reserve(ledger, eps=1.0, cap=10.0)  # 2.0 left
    assert _run_race("locked", ledger_url, n) == ["ok"] * 2 + ["refused"] * (n - 2)
    assert ledger.usage("books").epsilon_spent == 10.0


@pytest.mark.slow
def test_race_test_catches_a_ledger_without_the_lock(ledger_url):
    """Power: without the row lock / write transaction, several racers take the last budget."""
    ledger = init_ledger(ledger_url, dataset_id="books", epsilon_cap=10.0)
    for _ in range(8):
        reserve(ledger, eps=1.0, cap=10.0)
    assert _run_race("unlocked", ledger_url, 8).count("ok") > 2
    assert ledger.usage("books").epsilon_spent > 10.0


def test_sqlite_ledger_class_is_the_plain_path_backend(tmp_path):
    ledger = SQLiteLedger(str(tmp_path / "sub" / "l.sqlite"), create=True)  # makes the dir
    assert ledger.name == str(tmp_path / "sub" / "l.sqlite")
    assert type(open_ledger(str(tmp_path / "sub" / "l.sqlite"))) is SQLiteLedger


def test_set_cap_never_creates_a_budget(ledger_url):
    """A mistyped dataset id is refused: only `init` starts a budget."""
    ledger = init_ledger(ledger_url, dataset_id="books", epsilon_cap=2.0)
    with pytest.raises(LedgerError, match=r"has no budget for dataset 'bokos'.*ledger init"):
        ledger.set_cap("bokos", epsilon_cap=5.0)
    assert ledger.datasets() == ["books"]
    assert ledger.usage("bokos").epsilon_cap is None


def test_set_cap_keeps_the_caps_not_given(ledger_url):
    ledger = init_ledger(ledger_url, dataset_id="books", epsilon_cap=2.0, delta_cap=1e-6)
    usage = ledger.set_cap("books", epsilon_cap=3.0)
    assert (usage.epsilon_cap, usage.delta_cap) == (3.0, 1e-6)
    assert ledger.set_cap("books", delta_cap=1e-5).epsilon_cap == 3.0
    assert (ledger.usage("books").epsilon_cap, ledger.usage("books").delta_cap) == (3.0, 1e-5)
    with pytest.raises(LedgerError, match="give `epsilon_cap`, `delta_cap` or both"):
        ledger.set_cap("books")


def test_set_cap_below_the_spent_total_is_refused_unless_forced(ledger_url):
    ledger = init_ledger(ledger_url, dataset_id="books", epsilon_cap=2.0)
    reserve(ledger, eps=1.5, cap=2.0)
    with pytest.raises(LedgerError, match=r"epsilon_cap=1 is below the epsilon already spent "
                                          r"\(1\.5\).*force"):
        ledger.set_cap("books", epsilon_cap=1.0)
    assert ledger.usage("books").epsilon_cap == 2.0  # unchanged
    assert ledger.set_cap("books", epsilon_cap=1.5).epsilon_cap == 1.5  # exactly the spent total
    usage = ledger.set_cap("books", epsilon_cap=1.0, force=True)
    assert (usage.epsilon_cap, usage.epsilon_spent) == (1.0, 1.5)
    with pytest.raises(BudgetExceededError):
        reserve(ledger, eps=0.1, cap=1.0)
