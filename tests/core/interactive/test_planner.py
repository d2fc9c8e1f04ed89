"""The median-mechanism planner: validation, its noise formula, and planned sessions that neither
halt nor lose to Laplace per query on three workloads (fixed seeds)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from dpq_spark.core.errors import SessionHaltedError
from dpq_spark.core.interactive.median_mechanism import MedianMechanism
from dpq_spark.core.interactive.planner import Plan, noise_fire_probability, plan_median_session

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_planned_sessions.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_planned_sessions", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(domain_size=0), "`domain_size`"),
        (dict(n=0.5), "`n` must be a finite number >= 1"),
        (dict(epsilon=-1.0), "`epsilon` must be finite and > 0"),
        (dict(expected_queries=0), "`expected_queries`"),
        (dict(target_accuracy=1.5), "`target_accuracy` must be in \\(0, 1\\)"),
        (dict(beta=0.0), "`beta` must be in \\(0, 1\\)"),
        (dict(noise_share=1.0), "`noise_share` must be in \\(0, 1\\)"),
        (dict(learn_per_bit=-2), "`learn_per_bit` must be finite and > 0"),
        (dict(neighboring="nope"), "neighboring"),
        (dict(n=50.0), "no useful plan"),
    ],
)
def test_plan_iv(kwargs, match):
    args = dict(domain_size=1024, n=1e6, epsilon=1.0, expected_queries=10_000) | kwargs
    with pytest.raises(ValueError, match=match):
        plan_median_session(args.pop("domain_size"), args.pop("n"), **args)


def test_session_refuses_plan_and_explicit_parameters_together():
    hist = np.array([5, 5, 5])
    with pytest.raises(ValueError, match="either `expected_queries`"):
        MedianMechanism(hist, epsilon=1.0, accuracy=0.1, expected_queries=10)
    with pytest.raises(ValueError, match="need `expected_queries`"):
        MedianMechanism(hist, epsilon=1.0, accuracy=0.1, max_hard_queries=3, n_hint=100)
    with pytest.raises(ValueError, match="`accuracy`"):
        MedianMechanism(hist, epsilon=1.0, max_hard_queries=3)


# --------------------------------------------------------------------------- the plan
def test_noise_fire_probability_matches_simulation():
    # P(Lap(2s) - Lap(s) >= a) against 400,000 draws; the swapped scales (Lap(s) - Lap(2s) has
    # the same law by symmetry, so use a wrong formula instead: one Laplace of scale 2s) must fail.
    rng = np.random.default_rng(7)
    s, draws = 1.0, 400_000
    z = rng.laplace(0, 2 * s, draws) - rng.laplace(0, s, draws)
    for a in (1.0, 3.0, 6.0):
        p = noise_fire_probability(a, s)
        emp = float(np.mean(z >= a))
        se = np.sqrt(p * (1 - p) / draws)
        assert abs(emp - p) < 5 * se
        wrong = 0.5 * np.exp(-a / (2 * s))
        assert abs(emp - wrong) > 5 * se


def test_plan_is_public_and_consistent():
    plan = plan_median_session(1024, 1e6, epsilon=1.0, expected_queries=10_000)
    assert isinstance(plan, Plan)
    assert plan.expected_noise_fires <= 0.25 * plan.max_hard_queries + 1e-9
    assert plan.learning_hard_queries + plan.expected_noise_fires <= plan.max_hard_queries
    # more queries or a smaller n must cost accuracy; a larger epsilon must buy it
    assert plan_median_session(1024, 1e6, epsilon=1.0, expected_queries=100_000).accuracy > plan.accuracy
    assert plan_median_session(1024, 1e5, epsilon=1.0, expected_queries=10_000).accuracy > plan.accuracy
    assert plan_median_session(1024, 1e6, epsilon=2.0, expected_queries=10_000).accuracy < plan.accuracy
    loose = plan_median_session(1024, 1e6, epsilon=1.0, expected_queries=10_000, target_accuracy=0.02)
    assert loose.accuracy == 0.02 and loose.meets_target
    tight = plan_median_session(1024, 1e6, epsilon=1.0, expected_queries=10_000, target_accuracy=1e-4)
    assert tight.accuracy == plan.accuracy and tight.meets_target is False
    assert "max_hard_queries c = " in str(plan)


def test_planned_session_depends_on_public_inputs_only():
    rng = np.random.default_rng(3)
    a = rng.multinomial(10_000, np.full(50, 0.02))
    b = np.zeros(50, dtype=np.int64)
    b[0] = 10_000
    pa = MedianMechanism(a, epsilon=1.0, expected_queries=500, candidate_size=50, n_candidates=100,
                         rng=np.random.default_rng(0)).plan
    pb = MedianMechanism(b, epsilon=1.0, expected_queries=500, candidate_size=50, n_candidates=100,
                         rng=np.random.default_rng(1)).plan
    assert pa == pb
    # under add/remove the public hint, not the data, sets the plan
    pc = MedianMechanism(a, epsilon=1.0, expected_queries=500, neighboring="add_remove", n_hint=20_000,
                         candidate_size=50, n_candidates=100, rng=np.random.default_rng(2)).plan
    assert pc == plan_median_session(50, 20_000, epsilon=1.0, expected_queries=500,
                                     neighboring="add_remove")


# --------------------------------------------------------------------------- the three workloads
@pytest.mark.parametrize("workload", ["1d", "2d", "cat_num"])
def test_planned_session_runs_10000_queries_and_beats_laplace(workload):
    bench = _bench()
    result = bench.run(workload, rows=1_000_000, k=10_000, epsilon=1.0, seed=11, candidate_size=300,
                       n_candidates=600, verbose=False)
    assert not result["halted"] and result["unverified"] == 0
    assert result["mm_mean"] < result["lap_mean"] / 2


def test_unplanned_documented_defaults_halt_on_rectangles():
    # power of the "no halt" check: the old defaults (c = 100, accuracy = 0.003) halt on the
    # 2-D rectangle workload well before 10,000 queries (issue 12).
    bench = _bench()
    rng = np.random.default_rng(11)
    hist = bench.histogram("2d", 1_000_000, rng)
    qs = bench.queries("2d", 10_000, rng)
    mech = MedianMechanism(hist, epsilon=1.0, accuracy=0.003, max_hard_queries=100, candidate_size=300,
                           n_candidates=600, rng=np.random.default_rng(12))
    with pytest.raises(SessionHaltedError):
        for q in qs:
            mech.ask(q)
    assert mech.queries_answered < 10_000
