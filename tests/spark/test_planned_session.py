"""A planned MedianMechanismSession: the plan comes from public inputs before any query."""

from __future__ import annotations

import numpy as np
import pytest

pyspark = pytest.importorskip("pyspark")

from dpq_spark.core.interactive.planner import plan_median_session  # noqa: E402
from dpq_spark.spark import CategoricalColumn, MedianMechanismSession, NumericColumn  # noqa: E402


def test_planned_session_uses_the_plan(spark):
    rng = np.random.default_rng(5)
    rows = [(float(x), str(c)) for x, c in zip(rng.normal(5, 2, 4000), rng.choice(list("abc"), 4000))]
    df = spark.createDataFrame(rows, "x double, c string")
    domain = {"x": NumericColumn(lower=0.0, upper=10.0, bins=20), "c": CategoricalColumn(("a", "b", "c"))}
    session = MedianMechanismSession(df, domain=domain, epsilon=5.0, expected_queries=50,
                                     candidate_size=50, n_candidates=200, rng=np.random.default_rng(1))
    plan = session.mechanism.plan
    assert plan == plan_median_session(session.domain_size, 4000, epsilon=5.0, expected_queries=50)
    assert session.mechanism.accuracy == plan.accuracy
    assert session.mechanism.max_hard_queries == plan.max_hard_queries
    answer = session.cdf("x", 5.0)
    assert 0.0 <= answer.value <= 1.0
    with pytest.raises(ValueError, match="either `expected_queries`"):
        MedianMechanismSession(df, domain=domain, epsilon=1.0, accuracy=0.1, expected_queries=5)
