"""dp_quantiles on neighbouring DataFrames: what a gray-box auditor checks (issue 24, item 5).

Each case releases on ``D`` and on ``D'`` = ``D`` without all rows of one privacy unit, with the
same seed (:mod:`tests.spark._neighbours`), and checks, after Cebere et al. ("Re:cord-play",
PETS 2026):

- control flow and public intermediates: the same Spark jobs, the same per-group parameters
  (epsilon after the split and the scaling, threshold, seeds), the same output schema, and under
  public keys the same keys in the same rows; the groups the unit does not touch release the
  very same numbers (identical randomness, untouched data);
- sensitivity: the other units' kept rows are identical, the unit keeps at most
  ``max_rows_per_unit`` rows in at most ``max_groups_per_unit`` groups, so each mechanism's
  input moves by what its epsilon was scaled for;
- the released values: a transcript-ratio test on small cases, through Spark end to end and,
  for many seeds, through the core functions the executors run (proven seed-for-seed equal).

Each check is shown to have power by a deliberately wrong variant that it rejects.
"""

from __future__ import annotations

import dataclasses
import decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

pytest.importorskip("pyspark")
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql import types as T  # noqa: E402

from dpq_spark import dp_quantiles  # noqa: E402
from dpq_spark.spark import _dataflow as flow  # noqa: E402
from dpq_spark.spark import _fold  # noqa: E402
from dpq_spark.spark import _release  # noqa: E402
from dpq_spark.spark import quantiles as Q  # noqa: E402
from dpq_spark.core.errors import BoundsNotFoundError  # noqa: E402
from dpq_spark.spark._columns import UNITS  # noqa: E402
from dpq_spark.spark._keys import key_seed  # noqa: E402

from _neighbours import (kept_of_others, observe, stretch_folds, transcript_bound,  # noqa: E402
                        without_unit)

U = 7  # the privacy unit that one neighbour holds and the other does not
BOUNDS = dict(lower=0.0, upper=10.0)
SCHEMA = T.StructType([T.StructField("user", T.LongType()), T.StructField("row", T.LongType()),
                       T.StructField("g", T.LongType()), T.StructField("h", T.StringType()),
                       T.StructField("x", T.DoubleType()), T.StructField("n", T.LongType()),
                       T.StructField("d", T.DecimalType(10, 2))])


def people() -> pd.DataFrame:
    """60 users in groups 0..5; user U has 9 rows in groups 9, 0, 2 and 5, some outside the
    bounds (clamped) and tied, so that bounding has rows and groups to drop. U's first row is
    the only row of group 9: a listed key that only one neighbour has data for."""
    gen = np.random.default_rng(0)
    rows = []
    for user in range(60):
        if user == U:
            continue
        for _ in range(int(gen.integers(1, 4))):
            rows.append((user, int(gen.integers(0, 6)), float(gen.normal(5, 2))))
    for g, x in [(9, -3.0), (0, 4.25), (0, 4.25), (2, 50.0), (2, 7.5), (2, 7.5), (5, 1.0),
                 (5, 9.75), (5, 6.0)]:
        rows.append((U, g, x))
    pdf = pd.DataFrame(rows, columns=["user", "g", "x"])
    pdf.insert(1, "row", np.arange(len(pdf), dtype=np.int64))
    pdf.insert(3, "h", ["k" + str(g % 2) for g in pdf["g"]])
    pdf["n"] = np.round(pdf["x"]).astype(np.int64)
    pdf["d"] = [decimal.Decimal(f"{x:.2f}") for x in pdf["x"]]
    return pdf


COMMON = dict(quantiles=[0.25, 0.5, 0.75], epsilon=1.0)
UNIT = dict(privacy_unit="user")
#: Bounds-free groups of about 20 rows find private bounds only at a large epsilon (a group
#: that finds none is refused, decided on a noisy count).
BIG = dict(epsilon=60.0, bounds_share=0.5)
#: name -> (column, dp_quantiles arguments, seeded?). Every path of the release: the three
#: key handlings (literal lookup, join, lookup in the packing UDF), keys as a DataFrame,
#: partition selection, ungrouped, bounds-free, auto, production randomness (batched release).
CASES = {
    "literal keys, R=2 G=2, JointExp, double": (
        "x", dict(BOUNDS, group_by="g", groups=list(range(6)), **UNIT, max_rows_per_unit=2,
                  max_groups_per_unit=2, mechanism="joint_exp"), True),
    "joined keys (two columns), G=2, IndExp, decimal": (
        "d", dict(BOUNDS, group_by=["g", "h"], groups=[(g, f"k{g % 2}") for g in range(6)]
                  + [(9, "k0")], **UNIT, max_groups_per_unit=2, mechanism="ind_exp"), True),
    "keys as a DataFrame, R=3 G=3, ApproxQuantiles, integral": (
        "n", dict(BOUNDS, group_by="g", groups="frame", **UNIT, max_rows_per_unit=3,
                  max_groups_per_unit=3, mechanism="approx_quantiles"), True),
    "looked-up keys, one row is the unit, auto, integral": (  # the row of group 9 goes
        "n", dict(BOUNDS, group_by="g", groups=list(range(40))), True),
    "selected keys (delta), G=2, JointExp": (
        "x", dict(BOUNDS, group_by="g", delta=1e-3, **UNIT, max_groups_per_unit=2,
                  mechanism="joint_exp", quantiles=[0.5], epsilon=4.0), True),
    "selected keys (delta), bounds-free, auto": (
        "x", dict(group_by="g", delta=1e-3, **UNIT, max_groups_per_unit=3, **BIG), True),
    "public keys, bounds-free, R=2, auto": (
        "x", dict(group_by="g", groups=list(range(6)), **UNIT, max_rows_per_unit=2, **BIG),
        True),
    "ungrouped, R=2, ApproxQuantiles": (
        "x", dict(BOUNDS, **UNIT, max_rows_per_unit=2, mechanism="approx_quantiles"), True),
    "ungrouped, R=3, JointExp": ("x", dict(BOUNDS, **UNIT, max_rows_per_unit=3,
                                           mechanism="joint_exp"), True),
    "ungrouped, bounds-free, auto": ("x", dict(**UNIT, max_rows_per_unit=2, **BIG), True),
    "production randomness, literal keys, auto (batched)": (
        "x", dict(BOUNDS, group_by="g", groups=list(range(6)), **UNIT, max_groups_per_unit=3),
        False),
    "production randomness, looked-up keys, JointExp (batched)": (
        "x", dict(BOUNDS, group_by="g", groups=list(range(40)), mechanism="joint_exp"), False),
}


def _arguments(spark, kwargs):
    if kwargs.get("groups") == "frame":
        keys = spark.createDataFrame(pd.DataFrame({"g": np.arange(6, dtype=np.int64)}))
        kwargs = {**kwargs, "groups": keys}
    return {**COMMON, **kwargs}


def _pair(spark, column, kwargs, seed):
    """Observe the release on D and on its neighbour without U (without a privacy unit, the
    neighbour drops U's first row: then one row is the unit)."""
    pdf = people()
    if kwargs.get("privacy_unit"):
        smaller = without_unit(pdf, "user", U)
    else:
        smaller = without_unit(pdf, "row", int(pdf.loc[pdf["user"] == U, "row"].iloc[0]))
    args = _arguments(spark, kwargs)
    return (observe(spark, pdf, column, seed, schema=SCHEMA, **args),
            observe(spark, smaller, column, seed, schema=SCHEMA, **args))


def audit(big, small, kwargs, *, seeded=True, jobs_may_differ=False, unit_id=U):
    """The gray-box checks on one pair (``big`` holds the unit ``unit_id``, ``small`` does
    not)."""
    unit = kwargs.get("privacy_unit")
    r = kwargs.get("max_rows_per_unit", 1) if unit else 1
    g = kwargs.get("max_groups_per_unit", 1) if unit else 1
    # control flow and public intermediates
    if not jobs_may_differ:
        assert big.jobs == small.jobs, "the number of Spark jobs depends on the unit"
    assert big.params == small.params, "the per-group parameters depend on the data"
    assert big.schema == small.schema, "the output schema depends on the data"
    public = kwargs.get("groups") is not None
    if public:
        assert big.keys_out() == small.keys_out(), "released keys or rows depend on the data"
    if not seeded:  # production randomness: bounding's seeds differ from run to run
        return
    # sensitivity: the others' kept rows do not move; the unit's are bounded
    if unit:
        assert kept_of_others(big, unit_id) == small.kept, "bounding changed other units' rows"
        mine = big.unit_rows(unit_id)
        assert len(mine) <= g, f"unit kept in {len(mine)} groups, max_groups_per_unit={g}"
        assert max(mine.values(), default=0) <= r, (
            f"unit kept {max(mine.values())} rows in a group, max_rows_per_unit={r}")
        touched = set(mine)
    else:
        gone, extra = big.kept - small.kept, small.kept - big.kept
        assert not extra and sum(gone.values()) == 1, "one row removed moved other rows"
        touched = {tuple(key[1:-1]) for key in gone}
    data_big, data_small = big.group_data(), small.group_data()
    moved = {key for key in set(data_big) | set(data_small)
             if data_big.get(key) != data_small.get(key)}
    assert moved <= touched and len(moved) <= g
    for key in moved:  # each mechanism's input moves by at most r rows (L1 of its counts)
        a, b = data_big.get(key, {}), data_small.get(key, {})
        assert sum(abs(a.get(c, 0) - b.get(c, 0)) for c in set(a) | set(b)) <= r
    # identical randomness: groups the unit does not touch release the very same numbers,
    # unless the group's partition took the other branch of the fold (spill or not), whose
    # release is the same law but other draws (docs/security.md)
    frozen = _same_fold(big, small)
    values_big, values_small = big.values(), small.values()
    for key in (set(values_big) | set(values_small)) - touched:
        if key in frozen:  # repr: NaN (a refusal) equals NaN, floats compare bit for bit
            assert repr(values_big.get(key)) == repr(values_small.get(key)), (
                f"untouched group {key} released other numbers")
    for observed in (big, small):  # the replay is what the executors ran
        if observed.replayed is not None:
            spark_values = {k: tuple(v for _, v, _ in rows)
                            for k, rows in observed.values().items()}
            assert repr({k: spark_values[k] for k in observed.replayed}) == \
                repr(observed.replayed), "the replay is not what Spark released"


def _branches(observed) -> dict:
    """Each key's fold branch (spilled or not: that of its stretch)."""
    return {key: spilled for spilled, _, keys, _ in observed.folds for key in keys}


def _same_fold(big, small) -> set:
    """Keys whose stretch took the same fold branch in both releases (all keys when there is
    no fold to replay)."""
    if big.folds is None:
        return set(big.values()) | set(small.values())
    a, b = _branches(big), _branches(small)
    return {key for key in a.keys() & b.keys() if a[key] == b[key]}


@pytest.mark.parametrize("case", list(CASES))
def test_neighbours_differ_only_where_noise_protects(spark, case):
    column, kwargs, seeded = CASES[case]
    big, small = _pair(spark, column, kwargs, 11 if seeded else None)
    # The ungrouped path with JointExp reads a further pass when the band it computes from the
    # fine data reaches a cell it did not read: documented (docs/security.md), not logged.
    audit(big, small, kwargs, seeded=seeded,
          jobs_may_differ=case == "ungrouped, R=3, JointExp")
    if case == "ungrouped, R=3, JointExp":
        assert {big.jobs, small.jobs} <= {2, 3}


def _no_bounding(rows, keys, max_rows, max_groups, row_seed, group_seed):
    """A broken bounding step: keeps every row of every unit (epsilon still scaled for R, G)."""
    return rows.withColumn(UNITS, F.lit(1))


@pytest.mark.parametrize("extra_rows,extra_groups,message", [
    (1, 0, "unit kept 3 rows in a group, max_rows_per_unit=2"),
    (0, 1, "unit kept in 3 groups, max_groups_per_unit=2"),
])
def test_audit_rejects_bounding_off_by_one(spark, monkeypatch, extra_rows, extra_groups,
                                           message):
    """Power of the sensitivity checks: bounding that keeps one row (or one group) more per
    unit than epsilon was scaled for. (Skipping bounding altogether fails the transcript
    tests below.)"""
    column, kwargs, _ = CASES["literal keys, R=2 G=2, JointExp, double"]
    real = flow.bound_contributions

    def loose(rows, keys, max_rows, max_groups, row_seed, group_seed):
        return real(rows, keys, max_rows + extra_rows, max_groups + extra_groups, row_seed,
                    group_seed)

    monkeypatch.setattr(flow, "bound_contributions", loose)
    big, small = _pair(spark, column, kwargs, 11)
    with pytest.raises(AssertionError, match=message):
        audit(big, small, kwargs)


def test_audit_rejects_keys_taken_from_the_data(spark, monkeypatch):
    """Power of the key check: a variant that answers only the listed keys that have rows."""
    column, kwargs, _ = CASES["literal keys, R=2 G=2, JointExp, double"]
    kwargs = {**kwargs, "groups": list(range(6)) + [77]}
    real = Q._public_keys

    def present_only(req):
        table = real(req)
        present = {r[0] for r in req.df.select("g").distinct().collect()}
        return table.filter(pa.array(np.isin(table.column("g").to_numpy(), list(present))))

    monkeypatch.setattr(Q, "_public_keys", present_only)
    pdf = people()
    pdf.loc[pdf["user"] == U, "g"] = 77  # the unit alone holds key 77
    args = _arguments(spark, kwargs)
    big = observe(spark, pdf, column, 11, schema=SCHEMA, **args)
    small = observe(spark, without_unit(pdf, "user", U), column, 11, schema=SCHEMA, **args)
    with pytest.raises(AssertionError, match="released keys or rows depend on the data"):
        audit(big, small, kwargs)


def test_audit_notices_other_randomness_in_untouched_groups(spark):
    """Power of the frozen-groups check: the neighbour released with another seed, with the
    bounding's rows and the parameters made equal so that only that check can see it."""
    column, kwargs, _ = CASES["literal keys, R=2 G=2, JointExp, double"]
    big, _ = _pair(spark, column, kwargs, 11)
    pdf = without_unit(people(), "user", U)
    small = observe(spark, pdf, column, 12, schema=SCHEMA, folds=False,
                    **_arguments(spark, kwargs))
    small.params, small.kept, big.folds = big.params, kept_of_others(big, U), None
    with pytest.raises(AssertionError, match="untouched group .* released other numbers"):
        audit(big, small, kwargs)


def test_a_spill_decision_differs_between_neighbours_and_nothing_else(spark, monkeypatch):
    """The fold's spill is decided from a stretch's data: at a budget where a stretch of D's
    spills and D''s does not (found by replaying the partitions Spark shuffled at every budget
    up to their size), the decisions differ, only in partitions that hold the unit
    (documented: time, memory and disk, docs/security.md), and every other check still holds;
    the replayed folds are the executors' (their releases match)."""
    column, kwargs, _ = CASES["literal keys, R=2 G=2, JointExp, double"]
    monkeypatch.setattr(_fold, "SPILL_SHRINK", 1.0)  # spill whenever past the budget
    big, small = _pair(spark, column, kwargs, 11)

    def differing(budget):
        a, b = ({key: spilled for spilled, _, keys, _ in
                 stretch_folds(o.partitions, dataclasses.replace(o.params, fold_budget=budget),
                               o.key_of) for key in keys} for o in (big, small))
        return {key for key in a.keys() & b.keys() if a[key] != b[key]}

    top = max(held for _, held, _, _ in big.folds)
    budget = next((b for b in range(1, top + 1) if differing(b)), None)
    assert budget, "no budget at which the unit moves a spill decision: no boundary to test"
    monkeypatch.setattr(_fold, "FOLD_BUDGET", budget)  # a stretch of D spills, D''s does not
    big, small = _pair(spark, column, kwargs, 11)
    touched = set(big.unit_rows(U))
    a, b = _branches(big), _branches(small)
    differ = {key for key in a.keys() & b.keys() if a[key] != b[key]}
    partition = {key: everyone for _, _, keys, everyone in big.folds for key in keys}
    assert differ and all(partition[key] & touched for key in differ)
    assert any(spilled for spilled, _, _, _ in big.folds)
    audit(big, small, kwargs)


def transcript_frame(copies: int, unit_rows: int, with_unit: bool,
                     others: int = 20) -> pd.DataFrame:
    """``copies`` groups, each ``others`` one-row units evenly in [1, 4.8] and (``with_unit``)
    one unit (``group * 1000 + 999``) with ``unit_rows`` rows at 9.5. Every unit's rows are
    equal, so bounding keeps the same multiset whatever its seeds: only the mechanisms'
    randomness moves the release."""
    values = np.linspace(1.0, 4.8, others)
    parts = []
    for g in range(copies):
        users = g * 1000 + np.arange(others)
        parts.append(pd.DataFrame({"user": users, "g": g, "x": values}))
        if with_unit:
            parts.append(pd.DataFrame({"user": g * 1000 + 999, "g": g,
                                       "x": np.full(unit_rows, 9.5)}))
    pdf = pd.concat(parts, ignore_index=True)
    return pdf.astype({"user": np.int64, "g": np.int64, "x": np.float64})


TRANSCRIPT = dict(quantiles=[0.5], epsilon=1.0, group_by="g", privacy_unit="user")
EDGES = np.arange(0.0, 10.5, 1.0)  # ten bins of [0, 10]; a bounds-free value outside goes
ALPHA = 1e-3                       # to the first or last


def _core_runs(observed, key, seeds):
    """The released median of group ``key`` for ``seeds`` base seeds, by the function the
    executors run for one group (``release_values``) on the data Spark handed them."""
    data = observed.group_data().get(key, {})
    k = np.array(sorted(data), dtype=np.int64)
    c = np.array([data[x] for x in k], dtype=np.int64)
    out = np.empty(len(seeds))
    for i, s in enumerate(seeds):
        params = dataclasses.replace(observed.params, base_seed=int(s))
        try:
            out[i] = _release.release_values(k, c, None, key_seed(key), params)[0][0]
        except BoundsNotFoundError:  # bounds-free: the private bounds refused (an output too)
            out[i] = np.nan
    return out


@pytest.mark.parametrize("mechanism,bounds,epsilon,others,unit_rows,seeds", [
    ("joint_exp", BOUNDS, 1.0, 20, 30, 1000),
    ("auto", BOUNDS, 1.0, 20, 30, 1000),
    ("auto", {}, 2.0, 200, 300, 400),  # bounds-free: private bounds need more rows
])
def test_transcript_ratio_is_within_epsilon_and_fails_without_bounding(
        spark, monkeypatch, mechanism, bounds, epsilon, others, unit_rows, seeds):
    """Many seeded runs on each neighbour (one unit of ``unit_rows`` rows at 9.5,
    max_rows_per_unit=1): the binned output laws' log-ratio stays below epsilon, and with
    bounding switched off (all the unit's rows reach the mechanism at the same epsilon) the
    test rejects it. A bounds-free run that refuses (no private bounds found) is an output
    of its own.

    The runs go through ``release_values``, the executors' per-group code, on the data the
    Spark plan kept; that this is seed for seed what Spark releases is checked first."""
    args = dict(TRANSCRIPT, mechanism=mechanism, groups=[0], epsilon=epsilon, **bounds)
    big = observe(spark, transcript_frame(1, unit_rows, True, others), "x", 5, folds=False,
                  **args)
    small = observe(spark, transcript_frame(1, unit_rows, False, others), "x", 5, folds=False,
                    **args)
    audit(big, small, args, unit_id=999)
    for observed in (big, small):  # seed for seed: the core run is Spark's release
        assert _core_runs(observed, (0,), [observed.params.base_seed])[0] == \
            observed.rows[0][-2]
    seeds = np.arange(seeds) + 1000
    with_unit, without = _core_runs(big, (0,), seeds), _core_runs(small, (0,), seeds)
    bound = transcript_bound(with_unit, without, EDGES, ALPHA)
    assert bound <= epsilon, f"log-ratio lower bound {bound:.3f} > epsilon {epsilon}"
    monkeypatch.setattr(flow, "bound_contributions", _no_bounding)
    broken = observe(spark, transcript_frame(1, unit_rows, True, others), "x", 5, folds=False,
                     **args)
    assert sum(broken.group_data()[(0,)].values()) == others + unit_rows  # all rows kept
    bound = transcript_bound(_core_runs(broken, (0,), seeds), without, EDGES, ALPHA)
    assert bound > epsilon, f"the unbounded variant passed: lower bound {bound:.3f}"


COPIES = 800  # groups of one release: independent replicas of the per-group law


def test_transcript_ratio_through_spark_end_to_end(spark, monkeypatch):
    """Spark end to end: one seeded release over COPIES groups, each a copy of the small
    neighbour case, samples the per-group law COPIES times (every group draws from its own
    per-key seed; the groups share no unit). The group-0 release is seed for seed the one of
    the two-DataFrame case, the binned log-ratio stays below epsilon, and the variant without
    contribution bounding is rejected."""
    args = dict(TRANSCRIPT, mechanism="joint_exp", groups=list(range(COPIES)), **BOUNDS)

    def medians(with_unit, seed=5):
        pdf = transcript_frame(COPIES, 30, with_unit)
        out = dp_quantiles(spark.createDataFrame(pdf), "x", rng=np.random.default_rng(seed),
                           **args).toPandas()
        assert out["g"].tolist() == list(range(COPIES))
        return out["value"].to_numpy()

    with_unit, without = medians(True), medians(False)
    one = observe(spark, transcript_frame(1, 30, True), "x", 5, folds=False,
                  **{**args, "groups": [0]})
    assert one.rows[0][-2] == with_unit[0]  # group 0 is the neighbour pair's release
    bound = transcript_bound(with_unit, without, EDGES, ALPHA)
    assert bound <= 1.0, f"log-ratio lower bound {bound:.3f} > epsilon 1"
    monkeypatch.setattr(flow, "bound_contributions", _no_bounding)
    bound = transcript_bound(medians(True), without, EDGES, ALPHA)
    assert bound > 1.0, f"the unbounded variant passed: lower bound {bound:.3f}"
