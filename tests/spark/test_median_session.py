"""Tests of MedianMechanismSession: the one histogram job, query forms and shorthands."""

from __future__ import annotations

import numpy as np
import pytest

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import functions as F  # noqa: E402

from dpq_spark.core.errors import SessionHaltedError  # noqa: E402
from dpq_spark.core.interactive.median_mechanism import AnswerKind  # noqa: E402
from dpq_spark.spark import CategoricalColumn, MedianMechanismSession, NumericColumn  # noqa: E402

X_VALUES = [0.5, 1.5, 1.7, 9.9, -3.0, 42.0, None, float("nan"), 5.0, 5.0]
G_VALUES = ["a", "b", "a", "c", "zzz", None, "a", "b", "b", "c"]
DOMAIN = {"x": NumericColumn(0.0, 10.0, 5), "g": CategoricalColumn(("a", "b", "c"))}


def expected_histogram():
    """The histogram by hand: x bins of width 2 (clamped; null/NaN -> level 5), g levels (other -> 3)."""
    hist = np.zeros((6, 4), dtype=int)
    for x, g in zip(X_VALUES, G_VALUES):
        if x is None or np.isnan(x):
            xi = 5
        else:
            xi = min(int(np.floor((min(max(x, 0.0), 10.0)) / 2.0)), 4)
        gi = {"a": 0, "b": 1, "c": 2}.get(g, 3)
        hist[xi, gi] += 1
    return hist.ravel()


@pytest.fixture(scope="module")
def small_df(spark):
    return spark.createDataFrame(list(zip(X_VALUES, G_VALUES)), "x double, g string")


@pytest.fixture(scope="module")
def exact_session(small_df):
    """A session at a huge epsilon: answers are (almost) exact, which makes routing checkable."""
    return MedianMechanismSession(
        small_df, domain=DOMAIN, epsilon=1e9, accuracy=0.01, max_hard_queries=1000,
        candidate_size=50, n_candidates=200, rng=np.random.default_rng(0),
    )


def test_histogram_is_built_once_with_clamping_and_missing_levels(exact_session):
    assert exact_session.domain_size == 24
    np.testing.assert_array_equal(exact_session.mechanism._histogram, expected_histogram())
    assert exact_session.n == len(X_VALUES)


def test_domain_points_follow_histogram_order(exact_session):
    points = exact_session.domain_points
    assert list(points.columns) == ["x", "g"]
    assert points.shape == (24, 2)
    assert points.iloc[0].tolist() == [1.0, "a"]
    assert points.iloc[3]["g"] is None and np.isnan(points.iloc[20]["x"])


def test_column_callable_and_mask_queries_agree(exact_session):
    column = (F.col("x") <= 4.0) & (F.col("g") == "a")
    from_column = exact_session._to_mask(column)
    from_callable = exact_session._to_mask(lambda d: ((d["x"] <= 4.0) & (d["g"] == "a")).to_numpy())
    np.testing.assert_array_equal(from_column, from_callable)
    assert from_column.sum() == 2  # bins [0, 2) and [2, 4) with g == "a"
    answer = exact_session.ask(column)
    truth = expected_histogram()[from_column].sum() / len(X_VALUES)
    assert answer.value == pytest.approx(truth, abs=0.03)


def test_ask_many_evaluates_columns_together(exact_session):
    queries = [F.col("g") == "b", F.col("x") > 8.0, lambda d: d["g"].isna().to_numpy()]
    answers = exact_session.ask_many(queries)
    hist = expected_histogram().reshape(6, 4)
    truths = [hist[:, 1].sum() / 10, hist[4, :].sum() / 10, hist[:, 3].sum() / 10]
    assert [a.index for a in answers] == sorted(a.index for a in answers)
    for answer, truth in zip(answers, truths):
        assert answer.value == pytest.approx(truth, abs=0.03)


def test_shorthands(exact_session):
    hist = expected_histogram().reshape(6, 4)
    assert exact_session.cdf("x", 3.0).value == pytest.approx(hist[:2].sum() / 10, abs=0.03)
    assert exact_session.between("x", 2.0, 6.0).value == pytest.approx(hist[1:3].sum() / 10, abs=0.03)
    # non-missing x per bin: 4, 0, 2, 0, 2 (8 of 10 rows)
    low = exact_session.quantile("x", 0.45)
    assert low.value == 1.0
    assert len(low.answers) == 1 + 3  # the non-missing fraction, then ceil(log2(5)) CDF queries
    assert exact_session.quantile("x", 0.6).value == 5.0
    with pytest.raises(ValueError, match="`column` must name a numeric domain column"):
        exact_session.cdf("g", 1.0)
    with pytest.raises(ValueError, match="`a` must be <= `b`"):
        exact_session.between("x", 3.0, 1.0)


def test_quantile_on_larger_data(spark):
    df = spark.range(20_000).select((F.col("id") % 1000 / 10.0).alias("v"))
    session = MedianMechanismSession(
        df, domain={"v": {"lower": 0.0, "upper": 100.0, "bins": 100}}, epsilon=1.0,
        accuracy=0.01, max_hard_queries=30, candidate_size=400, n_candidates=400,
        rng=np.random.default_rng(1),
    )
    for q, truth in [(0.25, 25.0), (0.5, 50.0), (0.9, 90.0)]:
        assert abs(session.quantile("v", q).value - truth) <= 3.0
    assert 0 < session.epsilon_spent <= 1.0


def test_arguments_are_checked_before_spark_reads_data(spark):
    poisoned = spark.range(3).select(F.raise_error(F.lit("the data was read")).cast("double").alias("x"))
    base = dict(domain={"x": NumericColumn(0.0, 1.0, 4)}, epsilon=1.0, accuracy=0.1, max_hard_queries=2)
    for change, error, match in [
        ({"epsilon": 0.0}, ValueError, "`epsilon` must be finite and > 0"),
        ({"accuracy": 2.0}, ValueError, "`accuracy` must be in"),
        ({"domain": {"y": NumericColumn(0.0, 1.0, 4)}}, ValueError, r"`domain` columns \['y'\]"),
        ({"domain": {"x": {"lower": 0.0, "upper": 1.0}}}, ValueError, "needs exactly 'lower', 'upper', 'bins'"),
        ({"domain": {"x": 3}}, TypeError, "must be a NumericColumn"),
        ({"domain": {"x": {"lower": 1.0, "upper": 0.0, "bins": 3}}}, ValueError, "`lower` must be < `upper`"),
        ({"rng": 7}, TypeError, "`rng` must be a numpy.random.Generator"),
    ]:
        with pytest.raises(error, match=match):
            MedianMechanismSession(poisoned, **{**base, **change})
    with pytest.raises(TypeError, match="values are bigint but column 'g' is string"):
        MedianMechanismSession(spark.createDataFrame([("a",)], "g string"), domain={"g": [1, 2]},
                               epsilon=1.0, accuracy=0.1, max_hard_queries=2)
    with pytest.raises(ValueError, match="categorical domain values must be distinct"):
        CategoricalColumn(("a", "a"))


def test_halt_and_unverified_answers(spark, small_df):
    session = MedianMechanismSession(
        small_df, domain=DOMAIN, epsilon=50.0, accuracy=0.001, max_hard_queries=1,
        candidates=np.eye(24)[[23]] * 5, after_halt="candidate_median",
        rng=np.random.default_rng(2),
    )
    # the candidate answers 0; the truth is 0.3: hard (epsilon 50 on 10 rows: the test noise has
    # scale 0.009, so the gap of 0.3 fires a test with probability above 1 - 1e-14)
    first = session.ask(F.col("g") == "a")
    assert first.kind is AnswerKind.HARD and session.halted
    later = session.cdf("x", 5.0)
    assert later.kind is AnswerKind.UNVERIFIED and later.epsilon_spent == pytest.approx(50.0)
    strict = MedianMechanismSession(
        small_df, domain=DOMAIN, epsilon=50.0, accuracy=0.001, max_hard_queries=1,
        candidates=np.eye(24)[[23]] * 5, rng=np.random.default_rng(3),
    )
    strict.ask(F.col("g") == "a")
    with pytest.raises(SessionHaltedError):
        strict.quantile("x", 0.5)


def test_unparsable_numeric_strings_go_to_the_missing_level(spark):
    df = spark.createDataFrame([("1.5",), ("oops",), (None,), ("7",)], "s string")
    session = MedianMechanismSession(
        df, domain={"s": NumericColumn(0.0, 10.0, 2)}, epsilon=1e9, accuracy=0.01,
        max_hard_queries=10, candidate_size=10, n_candidates=20, rng=np.random.default_rng(5),
    )
    np.testing.assert_array_equal(session.mechanism._histogram, [1, 1, 2])


def test_add_remove_releases_a_noisy_count(small_df):
    session = MedianMechanismSession(
        small_df, domain=DOMAIN, epsilon=1.0, accuracy=0.1, max_hard_queries=3,
        neighboring="add_remove", candidate_size=20, n_candidates=50, rng=np.random.default_rng(4),
    )
    assert session.n >= 1 and session.n == round(session.n)
    assert session.epsilon_spent == pytest.approx(0.1)
