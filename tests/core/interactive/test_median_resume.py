"""Resuming a median-mechanism session from its public state: the candidates and answers are
rebuilt exactly, the released row count is reused, a lost threshold forfeits its round, and the
privacy loss never passes epsilon however often the session is resumed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpq_spark.core.errors import SessionHaltedError
from dpq_spark.core.interactive.median_mechanism import MedianMechanism
from dpq_spark.core.interactive.median_state import MedianState, decode_mask, encode_mask
from dpq_spark.core.interactive.sparse_vector import NumericSparse

D = 30
HIST = np.random.default_rng(7).integers(0, 40, size=D)
QUERIES = [np.arange(D) <= t for t in np.random.default_rng(8).integers(0, D, size=200)]


def session(mode="sampled", neighboring="swap", c=6, seed=5, resume=None, **kw):
    args = dict(epsilon=1.0, accuracy=0.05, max_hard_queries=c, neighboring=neighboring,
                candidates=mode, candidate_size=40 if mode == "sampled" else 3,
                n_candidates=300, rng=np.random.default_rng(seed), resume=resume)
    args.update(kw)
    return MedianMechanism(HIST, **args)


def through_json(mm) -> MedianState:
    return MedianState.from_json(mm.state().to_json())


def ask_until(mm, hard: int, start: int = 0) -> int:
    """Ask queries until ``hard`` hard answers were given; return the next query's index."""
    i = start
    while mm.hard_queries < hard:
        mm.ask(QUERIES[i])
        i += 1
    return i


@pytest.mark.parametrize("mode", ["sampled", "exact"])
@pytest.mark.parametrize("neighboring", ["swap", "add_remove"])
def test_a_resumed_session_has_the_same_public_state(mode, neighboring):
    mm = session(mode, neighboring, c=12, refill_below=0.9)
    i = ask_until(mm, 3)
    for q in QUERIES[i:i + 5]:
        mm.ask(q)
    resumed = session(mode, neighboring, c=12, seed=99, resume=through_json(mm), refill_below=0.9)
    assert resumed.n == mm.n  # add/remove: the released count, never drawn again
    a, b = mm._candidates.counts, resumed._candidates.counts
    assert a.shape == b.shape and (a != b).nnz == 0  # replayed filters and refills
    assert resumed.state().answers == mm.state().answers
    assert resumed.queries_answered == mm.queries_answered
    assert resumed.hard_queries == mm.hard_queries >= 3
    if mode == "sampled":  # the refill ran: the replay drew the same fresh candidates
        assert mm.n_current_candidates == mm.n_candidates


def test_a_lost_threshold_forfeits_its_round_and_nothing_else():
    mm = session()
    ask_until(mm, 2)
    assert not mm.round_open  # right after a hard answer: the next threshold is unused
    clean = session(seed=1, resume=through_json(mm))
    assert clean.hard_queries_left == mm.hard_queries_left == 4 and clean.forfeited_rounds == 0
    assert clean.epsilon_spent == pytest.approx(mm.epsilon_spent)

    ask_until(mm, 2)
    mm.ask(QUERIES[50])  # a test of the third round ran
    assert mm.round_open and mm.hard_queries == 2
    resumed = session(seed=2, resume=through_json(mm))
    assert resumed.forfeited_rounds == 1 and resumed.hard_queries_left == 3
    assert resumed.epsilon_spent == pytest.approx(3 / 6)  # three rounds ended, none open
    assert resumed.epsilon_spent <= resumed.epsilon


def test_resumed_again_and_again_the_session_still_halts_within_epsilon():
    """Each resume after a test forfeits a round: the rounds, and so the privacy loss, stay
    within max_hard_queries (a resume that kept the round would let the session run forever)."""
    thresholds_used: set = set()  # (process, threshold drawn) of every test: the rounds run

    def watched(mm, process):
        query = mm._svt.query

        def counted(value):
            thresholds_used.add((process, mm._svt.threshold_draws))
            return query(value)
        mm._svt.query = counted
        return mm

    mm, i, resumes = watched(session(c=5), 0), 0, 0
    while True:
        try:
            mm.ask(QUERIES[i % len(QUERIES)])
        except SessionHaltedError:
            break
        i += 1
        assert mm.epsilon_spent <= mm.epsilon + 1e-12
        if i % 3 == 0:  # a restart every third query
            resumes += 1
            mm = watched(session(c=5, seed=100 + i, resume=through_json(mm)), resumes)
        assert i < 500, "the session never halted"
    assert mm.halted and mm.hard_queries + mm.forfeited_rounds == 5 and resumes >= 3
    # every threshold a test used is one AboveThreshold round of epsilon_1 / c: at most c
    assert len(thresholds_used) <= 5
    assert mm.epsilon_spent == pytest.approx(1.0)
    halted = session(c=5, resume=through_json(mm))
    assert halted.halted
    with pytest.raises(SessionHaltedError):
        halted.ask(QUERIES[0])


def test_the_state_holds_only_public_things():
    mm = session(neighboring="swap")
    ask_until(mm, 2)
    raw = json.loads(mm.state().to_json())
    assert set(raw) == {"version", "public_seed", "accuracy", "max_hard_queries", "domain_size",
                        "n_released", "hard", "answers", "forfeited_rounds", "round_open"}
    assert raw["n_released"] is None  # under swap the row count is not stored
    released = [a.value for a in mm.state().answers]
    assert [v for _, v in raw["hard"]] == [v for v, k in zip(released, raw["answers"])
                                           if k[2] == "hard"]
    add_remove = session(neighboring="add_remove")
    assert json.loads(add_remove.state().to_json())["n_released"] == add_remove.n


def test_masks_round_trip_and_bad_states_are_refused():
    mask = np.random.default_rng(0).random(1001) < 0.3
    assert np.array_equal(decode_mask(encode_mask(mask), 1001), mask)
    with pytest.raises(ValueError, match="not a median-mechanism session state"):
        MedianState.from_json('{"version": 1}')
    state = json.loads(session().state().to_json())
    state["forfeited_rounds"] = 7
    with pytest.raises(ValueError, match="more rounds"):
        MedianState.from_json(json.dumps(state))
    with pytest.raises(ValueError, match="domain points"):
        MedianMechanism(np.ones(D + 1, dtype=int), epsilon=1.0, accuracy=0.05,
                        max_hard_queries=6, resume=session().state())
    with pytest.raises(TypeError, match="MedianState"):
        session(resume={"public_seed": 1})


def test_the_sparse_vector_resumes_only_before_its_first_query():
    svt = NumericSparse(epsilon=1.0, sensitivity=1, threshold=5, max_above=3,
                        rng=np.random.default_rng(0))
    svt.resume(above_count=1, forfeited_rounds=1, round_open=True)
    assert svt.halted and svt.epsilon_spent == pytest.approx(1.0)
    with pytest.raises(ValueError, match="before its first query"):
        svt.resume(above_count=0, forfeited_rounds=0, round_open=False)
    fresh = NumericSparse(epsilon=1.0, sensitivity=1, threshold=5, max_above=3,
                          rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="exceed"):
        fresh.resume(above_count=3, forfeited_rounds=1, round_open=False)
    with pytest.raises(ValueError, match="forfeited_rounds"):
        fresh.resume(above_count=0, forfeited_rounds=-1, round_open=False)
