"""``mechanism="auto"`` (the default) in dp_quantiles: the ``mechanism`` column names what ran,
and the choice follows the public rule (m, epsilon, the group's noisy n), never the values."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

pyspark = pytest.importorskip("pyspark")

from dpq_spark import dp_quantiles  # noqa: E402
from dpq_spark.core.quantiles.choose import DEFAULT_COUNT_SHARE, choose_mechanism  # noqa: E402

N = 2000  # rows per group


def _frame(spark, draw):
    gen = np.random.default_rng(5)
    pdf = pd.DataFrame({"g": np.repeat(["a", "b"], N), "x": draw(gen, 2 * N)})
    return spark.createDataFrame(pdf)


@pytest.fixture(scope="module")
def normal(spark):
    return _frame(spark, lambda gen, n: gen.normal(0.0, 5.0, n)).cache()


@pytest.fixture(scope="module")
def skewed(spark):
    return _frame(spark, lambda gen, n: 1000.0 * gen.lognormal(0.0, 2.0, n)).cache()


def _names(out) -> dict:
    pdf = out.toPandas()
    return {g: sorted(set(part["mechanism"])) for g, part in pdf.groupby("g")}


@pytest.mark.parametrize("m, expected", [(1, "ind_exp"), (9, "joint_exp"), (99, "agg_tree_12x3")])
def test_auto_records_the_rule_per_group(normal, m, expected):
    # the rule at the group's n (the 5% noisy count is within a few rows of N at epsilon = 1)
    assert choose_mechanism(m, n=N, epsilon=1.0 - DEFAULT_COUNT_SHARE) == expected
    q = np.linspace(0.0, 1.0, m + 2)[1:-1]
    out = dp_quantiles(normal, "x", quantiles=q, epsilon=1.0, lower=-50, upper=50, group_by="g",
                       groups=["a", "b", "empty"], rng=np.random.default_rng(m))
    names = _names(out)
    assert names["a"] == names["b"] == [expected]
    # an empty public group is answered too; its noisy count (scale 20) decides for m > 1
    assert len(names["empty"]) == 1
    assert names["empty"][0] in ({"ind_exp", "histogram"} if m == 1 else
                                 {"joint_exp", "approx_quantiles", "agg_tree", "histogram",
                                  "agg_tree_8x3"})
    assert out.count() == 3 * m


def test_auto_choice_does_not_depend_on_values(normal, skewed):
    """Same n, m and epsilon, very different values: the same mechanism for every group. The
    same seed gives both calls the same noisy counts (they depend on n and the seed only), so
    a difference could only come from the values (unseeded, the count's noise moves a group of
    2,000 rows below the 8^3/12^3 boundary at m = 99, 1,875 rows, about once in 250 runs)."""
    for m in (1, 9, 99):
        q = np.linspace(0.0, 1.0, m + 2)[1:-1]
        kwargs = dict(quantiles=q, epsilon=1.0, group_by="g", groups=["a", "b"])
        one = _names(dp_quantiles(normal, "x", lower=-50, upper=50, **kwargs,
                                  rng=np.random.default_rng(m)))
        two = _names(dp_quantiles(skewed, "x", lower=0, upper=1e6, **kwargs,
                                  rng=np.random.default_rng(m)))
        assert one == two


def test_auto_gives_tiny_groups_the_histogram(spark):
    """Groups of 3 rows at epsilon = 1: the noisy count (scale 20) is below 25 / 0.95 rows in
    most draws, and those groups are released by the 16-bin histogram on every path (batched
    with production randomness, one call per group with a seed)."""
    gen = np.random.default_rng(8)
    keys = list(range(400))
    pdf = pd.DataFrame({"g": np.repeat(keys, 3), "x": gen.normal(0.0, 5.0, 3 * len(keys))})
    df = spark.createDataFrame(pdf)
    for rng in (None, np.random.default_rng(3)):
        out = dp_quantiles(df, "x", quantiles=[0.25, 0.5, 0.75], epsilon=1.0, lower=-50,
                           upper=50, group_by="g", groups=keys, rng=rng).toPandas()
        share = (out.groupby("g")["mechanism"].first() == "histogram").mean()
        # P(noisy count < 26.3 | n = 3) = 1 - P(DLap(20) >= 24) ~ 0.85
        assert 0.75 < share < 0.95


def test_explicit_mechanism_is_recorded(normal):
    out = dp_quantiles(normal, "x", quantiles=[0.25, 0.5, 0.75], epsilon=1.0, lower=-50, upper=50,
                       mechanism="approx_quantiles", rng=np.random.default_rng(2))
    assert [r["mechanism"] for r in out.collect()] == ["approx_quantiles"] * 3


def test_auto_under_swap_uses_the_public_n(normal):
    """Ungrouped swap: n is public, nothing is spent on a count, so the choice is exact."""
    q = np.linspace(0.0, 1.0, 31)[1:-1]  # m = 29: ApproxQuantiles at n = 4000, not at half of it
    assert choose_mechanism(29, n=2 * N, epsilon=1.0) == "approx_quantiles"
    assert choose_mechanism(29, n=N, epsilon=1.0) != "approx_quantiles"
    out = dp_quantiles(normal, "x", quantiles=q, epsilon=1.0, lower=-50, upper=50,
                       neighboring="swap", rng=np.random.default_rng(4))
    assert {r["mechanism"] for r in out.collect()} == {"approx_quantiles"}
