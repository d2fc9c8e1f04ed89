"""Median-mechanism sessions through a BudgetSession: the whole epsilon charged when the
session opens, every answer recorded, a resume by name that rebuilds the public state and
charges nothing, a halt that holds across resumes, and refusals that charge nothing.
Run on SQLite and on the real PostgreSQL server the suite starts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("pyspark")

from dpq_spark import BudgetSession, PrivacyUnit  # noqa: E402
from dpq_spark.core.errors import BudgetExceededError, DPQValueError, SessionHaltedError  # noqa: E402
from dpq_spark.core.interactive.median_state import MedianState  # noqa: E402
from dpq_spark.pipeline.ledger import init_ledger, open_ledger  # noqa: E402

DOMAIN = {"rating": {"lower": 0.0, "upper": 5.0, "bins": 20}}
CUTS = np.linspace(0.1, 4.9, 40)


@pytest.fixture(scope="module")
def books(spark):
    gen = np.random.default_rng(3)
    pdf = pd.DataFrame({"user": np.arange(2000) % 400,
                        "rating": np.round(np.clip(gen.normal(3.8, 0.8, 2000), 0, 5), 2)})
    return spark.createDataFrame(pdf).cache()


def open_median(budget, seed, **kw):
    args = dict(domain=DOMAIN, epsilon=1.0, accuracy=0.03, max_hard_queries=5,
                candidate_size=60, n_candidates=400, name="ratings session",
                rng=np.random.default_rng(seed))
    args.update(kw)
    return budget.median_session(**args)


def stored_state(ledger_url, name="ratings session") -> MedianState:
    ledger = open_ledger(ledger_url)
    return MedianState.from_json(ledger.result(ledger.named("books", name).id))


def test_a_session_is_charged_once_and_resumed_by_name_with_its_public_state(books, ledger_url):
    init_ledger(ledger_url, dataset_id="books", epsilon_cap=3.0)
    budget = BudgetSession(books, ledger=ledger_url, dataset="books")
    mm = open_median(budget, seed=1)
    assert budget.remaining.epsilon == pytest.approx(2.0)  # the whole epsilon, up front
    answers = [mm.cdf("rating", t) for t in CUTS[:12]]
    assert mm.mechanism.hard_queries >= 1 and not mm.halted
    state = stored_state(ledger_url)
    assert [a.value for a in state.answers] == [a.value for a in answers]  # every answer
    assert [a.kind for a in state.answers] == [a.kind.value for a in answers]
    assert state.n_released == mm.n  # add/remove: the released count, reused on resume

    # a kernel restart: a new BudgetSession on the same ledger resumes the session by name
    again = BudgetSession(books, ledger=ledger_url, dataset="books")
    resumed = open_median(again, seed=2)
    assert again.remaining.epsilon == pytest.approx(2.0)  # nothing charged
    assert resumed.n == mm.n and resumed.state().answers == mm.state().answers
    a, b = mm.mechanism._candidates.counts, resumed.mechanism._candidates.counts
    assert a.shape == b.shape and (a != b).nnz == 0
    forfeit = 1 if mm.mechanism.round_open else 0  # a test ran since the last hard answer
    assert resumed.hard_queries_left == mm.hard_queries_left - forfeit

    # it goes on until the halt, which holds across a further resume
    for t in CUTS[12:]:
        try:
            resumed.between("rating", 0.0, t)
        except SessionHaltedError:
            break
    else:
        while not resumed.halted:
            resumed.cdf("rating", float(np.random.default_rng(0).uniform(0, 5)))
    assert resumed.halted
    record = open_ledger(ledger_url).named("books", "ratings session")
    assert record.status == "committed" and record.epsilon == 1.0
    after = open_median(BudgetSession(books, ledger=ledger_url, dataset="books"), seed=3)
    assert after.halted
    with pytest.raises(SessionHaltedError):
        after.cdf("rating", 2.0)
    assert [r.status for r in open_ledger(ledger_url).records("books")] == ["committed"]


def test_a_resume_right_after_a_hard_answer_forfeits_nothing(books, ledger_url):
    init_ledger(ledger_url, dataset_id="books", epsilon_cap=3.0)
    budget = BudgetSession(books, ledger=ledger_url, dataset="books")
    mm = open_median(budget, seed=4, accuracy=0.01)
    for t in CUTS:
        if mm.cdf("rating", t).kind == "hard":
            break
    assert not mm.mechanism.round_open and stored_state(ledger_url).round_open is False
    resumed = open_median(BudgetSession(books, ledger=ledger_url, dataset="books"), seed=5,
                          accuracy=0.01)
    assert resumed.hard_queries_left == mm.hard_queries_left
    seen = []  # what the ledger holds when the mechanism runs the query's private test
    ask = resumed.mechanism.ask
    resumed.mechanism.ask = lambda mask: (seen.append(stored_state(ledger_url)), ask(mask))[1]
    resumed.cdf("rating", 1.0)
    assert seen[0].round_open is True and seen[0].answers == mm.state().answers


def test_refusals_charge_nothing(books, ledger_url):
    init_ledger(ledger_url, dataset_id="books", epsilon_cap=1.5)
    budget = BudgetSession(books, ledger=ledger_url, dataset="books")
    open_median(budget, seed=6)
    with pytest.raises(DPQValueError, match="other parameters.*epsilon"):
        open_median(budget, seed=6, epsilon=0.5)
    with pytest.raises(BudgetExceededError):
        open_median(budget, seed=6, name="another")
    with pytest.raises(ValueError, match="bins"):
        open_median(budget, seed=6, name="bad", domain={"rating": {"lower": 0, "upper": 5,
                                                                  "bins": 0}})
    with pytest.raises(DPQValueError, match="one row.*swap"):
        open_median(budget, seed=6, name="swap", neighboring="swap")
    init_ledger(ledger_url, dataset_id="users", epsilon_cap=5.0,
                unit=PrivacyUnit(column="user", max_rows_per_unit=5))
    per_user = BudgetSession(books, ledger=ledger_url, dataset="users")
    with pytest.raises(DPQValueError, match="one row.*all rows of one `user`"):
        open_median(per_user, seed=6)
    records = open_ledger(ledger_url).records()
    assert [(r.dataset_id, r.status) for r in records] == [("books", "spent")]
