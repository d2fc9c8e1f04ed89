"""The SQLite privacy ledger: reservation, refusal, life cycle, caps and concurrency."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

from dpq_spark.core.errors import BudgetExceededError
from dpq_spark.ledger import Ledger, LedgerError


def reserve(ledger, eps=1.0, cap=3.0, **kw):
    return ledger.reserve("books", epsilon=eps, epsilon_cap=cap, mechanism="joint_exp",
                          parameters={"quantiles": [0.5]}, job="t", **kw)


def test_life_cycle_and_usage(tmp_path):
    ledger = Ledger(str(tmp_path / "sub" / "l.sqlite"))  # creates the directory
    a = reserve(ledger)
    ledger.mark_spent(a)
    ledger.commit(a, "/out/a")
    b = reserve(ledger)
    ledger.cancel(b, "failed before sampling: ValueError")
    recs = ledger.records("books")
    assert [(r.status, r.output) for r in recs] == [("committed", "/out/a"), ("cancelled", None)]
    assert recs[0].parameters == {"quantiles": [0.5]} and recs[0].mechanism == "joint_exp"
    usage = ledger.usage("books")
    assert usage.epsilon_spent == 1.0 and usage.epsilon_cap == 3.0 and usage.epsilon_remaining == 2.0


def test_refuses_over_cap_and_records_nothing(tmp_path):
    ledger = Ledger(str(tmp_path / "l.sqlite"))
    reserve(ledger, eps=2.0)
    with pytest.raises(BudgetExceededError, match=r"asks for epsilon=2 but only epsilon=1 is left"):
        reserve(ledger, eps=2.0)
    assert len(ledger.records("books")) == 1
    reserve(ledger, eps=1.0)  # exactly the rest still fits
    with pytest.raises(BudgetExceededError):
        reserve(ledger, eps=1e-6)


def test_many_small_charges_fit_their_cap(tmp_path):
    ledger = Ledger(str(tmp_path / "l.sqlite"))
    for _ in range(10):
        reserve(ledger, eps=0.1, cap=1.0)  # 10 x 0.1 is not exactly 1.0 in floating point
    with pytest.raises(BudgetExceededError):
        reserve(ledger, eps=0.1, cap=1.0)


def test_reserved_and_spent_count_cancelled_does_not(tmp_path):
    ledger = Ledger(str(tmp_path / "l.sqlite"))
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
    with pytest.raises(LedgerError, match="no ledger record with id 99"):
        ledger.mark_spent(99)


def test_delta_is_capped(tmp_path):
    ledger = Ledger(str(tmp_path / "l.sqlite"))
    reserve(ledger, delta=1e-6, delta_cap=1.5e-6)
    with pytest.raises(BudgetExceededError, match="delta"):
        reserve(ledger, delta=1e-6, delta_cap=1.5e-6)
    with pytest.raises(BudgetExceededError, match="delta"):
        Ledger(str(tmp_path / "m.sqlite")).reserve("x", epsilon=1, delta=1e-9, epsilon_cap=5,
                                                   mechanism="joint_exp")  # no delta cap


def test_config_cannot_raise_the_stored_cap(tmp_path):
    ledger = Ledger(str(tmp_path / "l.sqlite"))
    reserve(ledger, cap=2.0)
    with pytest.raises(LedgerError, match=r"epsilon_cap=5 .* above the ledger's epsilon_cap=2"):
        reserve(ledger, cap=5.0)
    with pytest.raises(BudgetExceededError):  # a lower configured cap applies
        reserve(ledger, cap=1.5)
    ledger.set_cap("books", epsilon_cap=5.0)
    reserve(ledger, cap=5.0)
    assert ledger.usage("books").epsilon_cap == 5.0


class _SlowLedger(Ledger):
    """Widens the window between checking the budget and recording the charge."""

    @staticmethod
    def _spent(conn, dataset_id):
        out = Ledger._spent(conn, dataset_id)
        time.sleep(0.2)
        return out


class _UnlockedLedger(_SlowLedger):
    """A deliberately wrong ledger: check and insert without one write transaction."""

    def _write(self, fn):
        conn = self._connect()
        try:
            return fn(conn)  # autocommit: every statement on its own
        finally:
            conn.close()


def _race(cls, path, barrier, results):
    ledger = cls(path)
    barrier.wait()
    try:
        ledger.reserve("books", epsilon=1.0, epsilon_cap=3.0, mechanism="joint_exp")
        results.put("ok")
    except BudgetExceededError:
        results.put("refused")


def _run_race(cls, path, n=4):
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(cls, path, barrier, results)) for _ in range(n)]
    for p in procs:
        p.start()
    outcomes = sorted(results.get(timeout=120) for _ in range(n))
    for p in procs:
        p.join(timeout=60)
    return outcomes


@pytest.mark.parametrize("cls", [_SlowLedger])
def test_concurrent_jobs_cannot_both_take_the_last_budget(tmp_path, cls):
    path = str(tmp_path / "l.sqlite")
    ledger = Ledger(path)
    reserve(ledger, eps=2.0)  # 1.0 left: exactly one of the racers may have it
    assert _run_race(cls, path) == ["ok", "refused", "refused", "refused"]
    assert ledger.usage("books").epsilon_spent == 3.0


def test_race_test_catches_an_unlocked_ledger(tmp_path):
    """Power: without BEGIN IMMEDIATE, several racers see the last budget and all take it."""
    path = str(tmp_path / "l.sqlite")
    reserve(Ledger(path), eps=2.0)
    assert _run_race(_UnlockedLedger, path).count("ok") > 1
    assert Ledger(path).usage("books").epsilon_spent > 3.0
