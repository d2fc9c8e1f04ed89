"""dp_quantiles gives JointExp each group's data on the core's own grid (issue 11).

The equality tests replay the release with the core: the same per-group randomness
(``default_rng([base_seed, key_seed(key)])``, where ``base_seed`` is the third 63-bit draw from
the caller's Generator) and the raw values. Spark's grid index equals ``Grid.snap``, so the
core's ``joint_exp`` on the raw values must release the very same numbers. With the fold budget
lowered, groups take the spill path: there the release must be the core's JointExp on the
*represented* data (:mod:`dpq_spark.core.quantiles.coarse_bands`), and the tests check that pruning ran.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("pyspark")
from pyspark.sql import functions as F  # noqa: E402

from dpq_spark import dp_quantiles  # noqa: E402
from dpq_spark.core.quantiles import coarse_bands as cb  # noqa: E402
from dpq_spark.core import joint_exp  # noqa: E402
from dpq_spark.core.randomness.source import resolve_rng  # noqa: E402
from dpq_spark.core.quantiles.choose import auto  # noqa: E402
from dpq_spark.core.randomness.grid import Grid, split_ties  # noqa: E402
from dpq_spark.spark._keys import key_seed  # noqa: E402
from dpq_spark.core.quantiles.ind_exp import ind_exp, ind_exp_indices  # noqa: E402
from dpq_spark.core.quantiles.joint_exp import joint_exp_indices  # noqa: E402
from dpq_spark.spark import _release  # noqa: E402
from dpq_spark.spark import _fold  # noqa: E402
from dpq_spark.spark._dataflow import VALUE, grid_index_column  # noqa: E402

A, B = 0.0, 2e9
GRID = Grid(A, B)
Q = [0.1, 0.5, 0.9]
CELL_S = (B - A) / 2**20  # one 2**20-cell of the old data path: 1,907 s
_C = 1.0 / (2 * 2 * (1 - 0.1))  # epsilon 1, add/remove, smallest quantile gap 0.1


def grouped_data():
    gen = np.random.default_rng(4)
    t0 = 1_234_567_890.0
    lo = np.floor(t0 / CELL_S) * CELL_S  # left edge of one old 1,907 s cell
    return {
        # 1,000 timestamps inside one old cell of [0, 2e9]
        "one_cell": lo + gen.uniform(0, CELL_S, 1000),
        # 600 in that cell, 400 spread over +-1 day
        "cell_and_day": np.concatenate([lo + gen.uniform(0, CELL_S, 600),
                                        t0 + gen.uniform(-86_400, 86_400, 400)]),
        # a cluster with far outliers (some below and above the bounds)
        "outliers": np.concatenate([t0 + gen.normal(0, 3e5, 6000),
                                    gen.uniform(-1e9, 3e9, 30)]),
        "tiny": t0 + gen.uniform(0, 1e6, 3),
    }


def _frame(spark, data):
    pdf = pd.DataFrame({"g": np.repeat(list(data), [v.size for v in data.values()]),
                        "x": np.concatenate(list(data.values()))})
    return spark.createDataFrame(pdf)


def _group_rngs(spark, seed, names):
    """The per-group generators dp_quantiles derives from ``default_rng(seed)``."""
    source = resolve_rng(np.random.default_rng(seed))
    source.seed63(), source.seed63()  # row and group seeds of contribution bounding
    base = source.seed63()
    return lambda name: np.random.default_rng([base, key_seed((name,)) % 2**64]), base


def test_grid_index_in_spark_matches_grid_snap_bit_for_bit(spark):
    gen = np.random.default_rng(1)
    g = GRID.granularity
    x = np.concatenate([gen.uniform(-1e9, 3e9, 3000), (np.arange(200) + 0.5) * g,
                        (np.arange(200) + 0.5) * g + 1e9,
                        np.nextafter((np.arange(50) + 0.5) * g, 0),
                        [A, B, -0.0, g / 2, 1.5 * g, B - g / 2, np.nextafter(B, 0), 1e300, -1e300]])
    df = spark.createDataFrame(pd.DataFrame({VALUE: x}))
    got = df.select(grid_index_column(A, B).alias("k")).toPandas()["k"].to_numpy()
    np.testing.assert_array_equal(got, GRID.snap(x))
    # other bounds (negative lower, a span that is not a power of two)
    a, b = -3.7, 11.3
    y = np.concatenate([gen.uniform(-5, 13, 3000), [a, b, 0.0]])
    df = spark.createDataFrame(pd.DataFrame({VALUE: y}))
    got = df.select(grid_index_column(a, b).alias("k")).toPandas()["k"].to_numpy()
    np.testing.assert_array_equal(got, Grid(a, b).snap(y))


@pytest.mark.parametrize("epsilon, mechanism", [(1.0, "joint_exp"), (0.1, "joint_exp"),
                                                (1.0, "ind_exp")])
def test_release_equals_core_on_raw_values_with_same_seed(spark, epsilon, mechanism):
    data = grouped_data()
    names = [*data, "empty"]
    core = {"joint_exp": joint_exp, "ind_exp": ind_exp}[mechanism]
    out = dp_quantiles(_frame(spark, data), "x", quantiles=Q, epsilon=epsilon, lower=A, upper=B,
                       group_by="g", groups=names, mechanism=mechanism,
                       rng=np.random.default_rng(9)).toPandas()
    rng_of, _ = _group_rngs(spark, 9, names)
    for name in names:
        got = out.loc[out["g"] == name, "value"].to_numpy()
        want = core(data.get(name, np.zeros(0)), Q, epsilon=epsilon, lower=A, upper=B,
                    rng=rng_of(name))
        np.testing.assert_array_equal(got, want, err_msg=name)
    # the comparison can fail: another group's seed gives other numbers
    other = core(data["one_cell"], Q, epsilon=epsilon, lower=A, upper=B, rng=rng_of("tiny"))
    assert not np.array_equal(out.loc[out["g"] == "one_cell", "value"].to_numpy(), other)
    if epsilon == 1.0 and mechanism == "joint_exp":
        truth = np.quantile(data["one_cell"], Q, method="inverted_cdf")
        error = np.abs(out.loc[out["g"] == "one_cell", "value"].to_numpy() - truth)
        assert error.max() < CELL_S / 10  # not the ~6e8 s of midpoints of empty cells


def test_auto_release_equals_core_auto_with_same_seed(spark):
    """mechanism="auto": the fold draws the noisy count, chooses, then runs JointExp on the
    grid indices: the same numbers as the core's ``auto`` on the raw values."""
    data = grouped_data()
    names = list(data)
    out = dp_quantiles(_frame(spark, data), "x", quantiles=Q, epsilon=1.0, lower=A, upper=B,
                       group_by="g", groups=names, rng=np.random.default_rng(5)).toPandas()
    rng_of, _ = _group_rngs(spark, 5, names)
    for name in names:
        part = out[out["g"] == name]
        want = auto(data[name], Q, epsilon=1.0, lower=A, upper=B, rng=rng_of(name))
        assert set(part["mechanism"]) == {want.mechanism}
        if want.mechanism == "joint_exp":
            np.testing.assert_array_equal(part["value"].to_numpy(), np.asarray(want), err_msg=name)


def _fine_release(run, k, w, q, rng, whole=None):
    """What the fine path releases on a group's sorted distinct grid indices ``k``, ``w``: the
    tie split of the default grid (``whole``: the represented data's pruned cells' entries, kept
    whole), the index sampler on the fine grid, each output's grid point."""
    source = resolve_rng(rng)
    f, fw = split_ties(k, w, GRID.tie_bits, source, whole)
    return GRID.value(run(f, fw, GRID.fine_size, q, epsilon=1.0, rng=source) >> GRID.tie_bits)


def _pruned(k, cells, keep, shift):
    return ~np.isin(cb.coarse_of(k, shift), cells[keep])


def _represented(x, mechanism="joint_exp", shift=cb.COARSE_SHIFT):
    """The represented data of a spilled group (cells ``k >> shift``), computed here from the
    raw values (epsilon 1, add/remove, Q). IndExp's band: the union over quantiles of m = 1
    bands at half the single-quantile c = (1/3) / (2 max(q, 1 - q))."""
    k = GRID.snap(x)
    fine_k, fine_w = np.unique(k, return_counts=True)
    cells, counts = np.unique(cb.coarse_of(k, shift), return_counts=True)
    if mechanism == "joint_exp":
        keep = cb.reachable(cells, counts, Q, 1.0 / (2 * 2 * (1 - 0.1)), GRID.steps, shift=shift)
    else:
        keep = np.zeros(cells.size, dtype=bool)
        for q in Q:
            keep |= cb.reachable(cells, counts, [q], (1 / 3) / (2 * max(q, 1 - q)) / 2,
                                 GRID.steps, shift=shift)
    kept = np.isin(cb.coarse_of(fine_k, shift), cells[keep])
    k, w = cb.represent(fine_k[kept], fine_w[kept], cells, counts, keep, shift)
    return (k, w), keep, _pruned(k, cells, keep, shift)


@pytest.mark.parametrize("mechanism", ["joint_exp", "ind_exp"])
def test_spill_path_releases_core_on_represented_data(spark, monkeypatch, mechanism):
    """Fold budget lowered to 64 pairs: every partition spills. The release is the core's
    JointExp on the represented data, and the outlier group has pruned cells (so the
    represented data differs from the fine data and the spill re-read was selective)."""
    monkeypatch.setattr(_fold, "FOLD_BUDGET", 64)
    monkeypatch.setattr(_fold, "SPILL_SHRINK", 1.0)  # spill whatever the spread
    data = grouped_data()
    names = [*data, "empty"]
    out = dp_quantiles(_frame(spark, data), "x", quantiles=Q, epsilon=1.0, lower=A, upper=B,
                       group_by="g", groups=names, mechanism=mechanism,
                       rng=np.random.default_rng(11)).toPandas()
    rng_of, _ = _group_rngs(spark, 11, names)
    run = {"joint_exp": joint_exp_indices, "ind_exp": ind_exp_indices}[mechanism]
    pruned_somewhere = False
    for name in names:
        x = data.get(name, np.zeros(0))
        (k, w), keep, whole = _represented(x, mechanism)
        pruned_somewhere |= not keep.all()
        want = _fine_release(run, k, w, Q, rng_of(name), whole)
        np.testing.assert_array_equal(out.loc[out["g"] == name, "value"].to_numpy(), want,
                                      err_msg=name)
    assert pruned_somewhere
    truth = np.quantile(data["outliers"], Q, method="inverted_cdf")
    assert np.abs(out.loc[out["g"] == "outliers", "value"].to_numpy() - truth).max() < 5e4


@pytest.mark.parametrize("keyed", [False, True])
def test_sorted_runs_release_the_core_on_each_groups_exact_data(spark, monkeypatch, keyed):
    """Fold budget lowered to 40 pairs with spread values (each row in its own coarse cell, so
    a coarse spill would save nothing): every partition writes sorted runs and releases its
    groups slice by slice as the merge completes them. Each group's release is the core's
    JointExp on its exact grid indices with its own seed, as with the default budget; with keys
    from the data (partition selection) the same fold runs."""
    monkeypatch.setattr(_fold, "FOLD_BUDGET", 40)
    gen = np.random.default_rng(9)
    data = {f"g{i:02d}": gen.uniform(A, B, int(n)) for i, n in enumerate(gen.integers(5, 60, 30))}
    names = list(data)
    kw = dict(delta=1e-9, epsilon=50.0) if keyed else dict(groups=names, epsilon=1.0)
    out = dp_quantiles(_frame(spark, data), "x", quantiles=Q, lower=A, upper=B, group_by="g",
                       mechanism="joint_exp", rng=np.random.default_rng(3), **kw).toPandas()
    if keyed:  # selection spends half: the quantiles get epsilon 25; keys seeded differently
        for name in set(out["g"]):
            got = out.loc[out["g"] == name, "value"].to_numpy()
            rank = np.searchsorted(np.sort(data[name]), got)  # rows below each release
            assert np.abs(rank - np.asarray(Q) * data[name].size).max() <= 3, name
        assert len(set(out["g"])) >= 20
        return
    rng_of, _ = _group_rngs(spark, 3, names)
    for name in names:
        k, w = np.unique(GRID.snap(data[name]), return_counts=True)
        want = _fine_release(joint_exp_indices, k, w, Q, rng_of(name))
        np.testing.assert_array_equal(out.loc[out["g"] == name, "value"].to_numpy(), want,
                                      err_msg=name)


def test_spill_path_on_partition_selection(spark, monkeypatch):
    """Keys from the data (mapInPandas): the same fold, spilled."""
    monkeypatch.setattr(_fold, "FOLD_BUDGET", 16)
    monkeypatch.setattr(_fold, "SPILL_SHRINK", 1.0)  # spill whatever the spread
    data = grouped_data()
    out = dp_quantiles(_frame(spark, data), "x", quantiles=Q, epsilon=4.0, lower=A, upper=B,
                       group_by="g", delta=1e-6, mechanism="joint_exp",
                       rng=np.random.default_rng(2)).toPandas()
    assert set(out["g"]) == {"one_cell", "cell_and_day", "outliers"}  # "tiny" is below threshold
    for name in ["one_cell", "outliers"]:
        truth = np.quantile(data[name], Q, method="inverted_cdf")
        assert np.abs(out.loc[out["g"] == name, "value"].to_numpy() - truth).max() < 5e4, name


@pytest.mark.parametrize("raw_rows, first_guess", [(1 << 22, True), (0, True), (1 << 22, False)])
def test_global_release_equals_core_on_represented_data(spark, monkeypatch, raw_rows,
                                                        first_guess):
    """No group_by: pass 1 (coarse counts), pass 2 (grid indices of reachable cells, collected
    raw or counted in Spark: the same release). With the first guess replaced by one cell,
    settle needs more passes (counted here) and the release is the same."""
    from dpq_spark.spark import quantiles

    monkeypatch.setattr(quantiles, "_RAW_PASS2_ROWS", raw_rows)
    reads = []
    if not first_guess:
        def settle(band, fetch, first):
            def counted(mask):
                reads.append(int(mask.sum()))
                return fetch(mask)
            return cb.settle(band, counted, _one_cell(first))
        monkeypatch.setattr(quantiles, "settle", settle)
    x = grouped_data()["outliers"]
    df = spark.createDataFrame(pd.DataFrame({"x": x}))
    out = dp_quantiles(df, "x", quantiles=Q, epsilon=1.0, lower=A, upper=B,
                       mechanism="joint_exp", rng=np.random.default_rng(3)).toPandas()
    _, base = _group_rngs(spark, 3, [])
    (k, w), keep, whole = _global_represented(x, Q, _C, guess=(lambda f: f) if first_guess
                                              else _one_cell)
    assert not keep.all()
    assert first_guess or (len(reads) >= 2 and sum(reads) == keep.sum())
    want = _fine_release(joint_exp_indices, k, w, Q, np.random.default_rng([base, 0]), whole)
    np.testing.assert_array_equal(out["value"].to_numpy(), want)
    # a small global group keeps every cell: then auto's JointExp (4 quantiles at s = 1,000) is
    # the core on the raw values
    small, q4 = grouped_data()["one_cell"], [0.1, 0.3, 0.7, 0.9]
    out = dp_quantiles(spark.createDataFrame(pd.DataFrame({"x": small})), "x", quantiles=q4,
                       epsilon=1.0, lower=A, upper=B, rng=np.random.default_rng(3)).toPandas()
    want = auto(small, q4, epsilon=1.0, lower=A, upper=B, rng=np.random.default_rng([base, 0]))
    assert out["mechanism"].iloc[0] == want.mechanism == "joint_exp"
    np.testing.assert_array_equal(out["value"].to_numpy(), np.asarray(want))


def _one_cell(first):
    """A poor first guess for settle: the first cell of ``first`` alone."""
    one = np.zeros(first.size, dtype=bool)
    one[np.flatnonzero(first)[0]] = True
    return one


def _global_represented(x, q, c, grid=GRID, guess=lambda first: first):
    """The represented data of the ungrouped path, from the raw values: cells ``k >> 16``,
    JointExp's band from the fine data read (coarse_bands.settle, first guess from rows spread
    evenly, passed through ``guess``)."""
    from dpq_spark.spark.quantiles import GLOBAL_SHIFT as shift
    from dpq_spark.spark.quantiles import guess_log_tol

    k = grid.snap(x)
    cells, counts = np.unique(cb.coarse_of(k, shift), return_counts=True)

    def band(fine, log_tol=cb.BAND_LOG_TOL):
        return cb.reachable(cells, counts, q, c, grid.steps, log_tol, shift, fine)

    def fetch(mask):
        return np.unique(k[np.isin(cb.coarse_of(k, shift), cells[mask])], return_counts=True)

    first = guess(band(cb.spread_evenly(cells, counts, q, shift=shift), guess_log_tol(len(q))))
    keep, fk, fw = cb.settle(band, fetch, first)
    rk, rw = cb.represent(fk, fw, cells, counts, keep, shift)
    return (rk, rw), keep, _pruned(rk, cells, keep, shift)


@pytest.mark.parametrize("budget", [_fold.FOLD_BUDGET, 8])
def test_other_mechanisms_see_coarse_cells(spark, monkeypatch, budget):
    """ApproxQuantiles (and AggTree) run on the coarse cells' fixed representative grid points
    (a per-record map of public constants), the same whether or not the fold spilled: the
    release is the core's recursion on those points as they are (no split into fine points:
    the cells are this path's resolution) with the same seed."""
    from dpq_spark.core.quantiles.approx_quantiles import approx_quantiles_indices

    monkeypatch.setattr(_fold, "FOLD_BUDGET", budget)
    monkeypatch.setattr(_fold, "SPILL_SHRINK", 1.0)  # spill whatever the spread
    data = grouped_data()
    names = list(data)
    out = dp_quantiles(_frame(spark, data), "x", quantiles=Q, epsilon=1.0, lower=A, upper=B,
                       group_by="g", groups=names, mechanism="approx_quantiles",
                       rng=np.random.default_rng(6)).toPandas()
    rng_of, _ = _group_rngs(spark, 6, names)
    for name in names:
        cells, counts = np.unique(cb.coarse_of(GRID.snap(data[name])), return_counts=True)
        want = GRID.value(approx_quantiles_indices(cb.coarse_midpoints(cells), counts, GRID.size,
                                                   Q, epsilon=1.0, rng=rng_of(name)))
        np.testing.assert_array_equal(out.loc[out["g"] == name, "value"].to_numpy(), want)
        assert set(out.loc[out["g"] == name, "mechanism"]) == {"approx_quantiles"}


@pytest.mark.parametrize("seed", [None, 3])
def test_approx_quantiles_of_rows_in_one_cell_stay_in_the_cell(spark, seed):
    """``auto``'s quartiles of 1,000 rows (ApproxQuantiles here), grouped (production: the batch
    path; seeded: per group) and ungrouped: rows sharing one coarse cell are released inside
    it, because each row sits at a random sub-cell of it (auto's public row count is below
    SPREAD_MAX_ROWS). With every row at the cell's midpoint, which a named ApproxQuantiles still
    gets, the first split leaves a side empty: the quartiles of the ``one_cell`` group come out
    1e8 away."""
    quartiles = [0.25, 0.5, 0.75]
    data = grouped_data()
    rng = None if seed is None else np.random.default_rng(seed)
    out = dp_quantiles(_frame(spark, data), "x", quantiles=quartiles, epsilon=1.0, lower=A,
                       upper=B, group_by="g", groups=list(data), rng=rng).toPandas()
    whole = spark.createDataFrame(pd.DataFrame({"x": data["one_cell"]}))
    alone = dp_quantiles(whole, "x", quantiles=quartiles, epsilon=1.0, lower=A, upper=B,
                         rng=rng).toPandas()
    for got in (out.loc[out["g"] == "one_cell"], alone):
        assert set(got["mechanism"]) == {"approx_quantiles"}
        error = np.abs(got["value"].to_numpy() - np.quantile(data["one_cell"], quartiles))
        assert np.all(error < CELL_S), error


def test_contribution_bounding_keeps_the_same_rows_whatever_the_row_order(spark):
    """The ungrouped path evaluates the bounded rows twice (coarse counts, then grid indices of
    reachable cells): both must see the same multiset. Row choice is keyed by a hash of (seed,
    unit, key, value), not by the rows' order; a row-order-dependent choice (rand(seed), what
    this replaced) differs between the two orders below."""
    from dpq_spark.spark import _dataflow as flow

    gen = np.random.default_rng(0)
    pdf = pd.DataFrame({"u": gen.integers(0, 30, 3000).astype(str), "g": "a",
                        "x": gen.normal(0, 1, 3000)})
    rows = spark.createDataFrame(pdf).select("g", F.col("x").alias(VALUE),
                                             F.col("u").alias(flow.UNIT))
    shuffled = rows.orderBy(F.rand(1)).repartition(5)

    def kept(frame, order_dependent=False):
        if order_dependent:  # the old choice, for power: rows ranked by rand(seed)
            from pyspark.sql import Window
            w = Window.partitionBy(flow.UNIT, "g").orderBy(F.rand(7))
            out = frame.withColumn("r", F.row_number().over(w)).where("r <= 3")
        else:
            out = flow.bound_contributions(frame, ("g",), 3, 1, row_seed=7, group_seed=8)
        return sorted(map(tuple, out.select(flow.UNIT, VALUE).toPandas().to_numpy().tolist()))

    assert kept(rows) == kept(shuffled)
    assert kept(rows, True) != kept(shuffled, True)


def _narrow_band(half):
    """A deliberately wrong band_keep for power: keep only the cells whose rank range meets
    ``[P_j - half, P_j + half]`` (the right band is hundreds of ranks wide here)."""
    def band_keep(name, cells, counts, epsilon, params, shift, fine=None, log_tol=None):
        hi = np.cumsum(counts).astype(float)
        lo = hi - counts
        target = np.asarray(params.quantiles) * hi[-1]
        return ((lo[:, None] <= target[None, :] + half)
                & (hi[:, None] >= target[None, :] - half)).any(axis=1)
    return band_keep


@pytest.fixture
def no_tie_split(monkeypatch):
    """The default grid without its split of ties (TIE_BITS = 0: JointExp on the grid itself),
    with the Spark layer's cached grids dropped before and after."""
    from dpq_spark.core.randomness import grid as grid_module

    _release._grid_of.cache_clear()
    monkeypatch.setattr(grid_module, "TIE_BITS", 0)
    yield
    monkeypatch.undo()
    _release._grid_of.cache_clear()


@pytest.mark.parametrize("wrong", [False, True])
def test_global_release_is_the_core_joint_exp_on_the_raw_values(spark, monkeypatch, wrong,
                                                                no_tie_split):
    """No group_by, data over some 2,500 coarse cells of 65,536 grid points, the band prunes
    most of them: each seeded release equals the core's ``joint_exp`` on the raw values with
    the same generator (the pruned cells carry mass below 2**-60, so the draws line up). Power:
    a band of +-10 ranks (too narrow: it prunes cells JointExp does reach) changes the draws.
    The tie split is off here (on the driver, where this path samples): with it, the split
    draws one part per entry, and the core splits the pruned cells' rows too, so the draws no
    longer line up although the laws agree to 2**-59 (the split path is replayed on the
    represented data by the tests above)."""
    from dpq_spark.spark import quantiles

    shift = quantiles.GLOBAL_SHIFT
    gen = np.random.default_rng(21)
    x = np.concatenate([gen.normal(0, 1, 20_000), gen.uniform(-60, 60, 20)])
    lo, hi = -50.0, 50.0
    grid = Grid(lo, hi)
    cells, counts = np.unique(cb.coarse_of(grid.snap(x), shift), return_counts=True)
    keep = cb.reachable(cells, counts, Q, 1.0 / (2 * 2 * (1 - 0.1)), grid.steps, shift=shift)
    assert cells.size > 1000 and 0 < keep.sum() < cells.size / 10
    if wrong:
        monkeypatch.setattr(_release, "band_keep", _narrow_band(10))
    df = spark.createDataFrame(pd.DataFrame({"x": x}))
    same = []
    for seed in range(4):
        out = dp_quantiles(df, "x", quantiles=Q, epsilon=1.0, lower=lo, upper=hi,
                           mechanism="joint_exp", rng=np.random.default_rng(seed)).toPandas()
        _, base = _group_rngs(spark, seed, [])
        want = joint_exp(x, Q, epsilon=1.0, lower=lo, upper=hi,
                         rng=np.random.default_rng([base, 0]))
        same.append(np.array_equal(out["value"].to_numpy(), want))
    assert all(same) if not wrong else not any(same)


@pytest.mark.parametrize("mechanism", ["approx_quantiles", "agg_tree"])
def test_global_other_mechanisms_see_4096_point_cells(spark, mechanism):
    """Ungrouped ApproxQuantiles/AggTree get rows per cell ``k >> 12`` (a second pass after the
    choice), as on the grouped path: the release is the core mechanism on those cells'
    midpoints with the same seed. For ApproxQuantiles it is not the one on the pass-1 cells
    ``k >> 16`` (AggTree's 2**16 leaves put both inputs' points in the same leaves here)."""
    from dpq_spark.core.quantiles.approx_quantiles import approx_quantiles_indices
    from dpq_spark.core.quantiles.mechanisms import get_mechanism
    from dpq_spark.spark import quantiles

    x = grouped_data()["outliers"]
    out = dp_quantiles(spark.createDataFrame(pd.DataFrame({"x": x})), "x", quantiles=Q,
                       epsilon=1.0, lower=A, upper=B, mechanism=mechanism,
                       rng=np.random.default_rng(5)).toPandas()
    _, base = _group_rngs(spark, 5, [])
    got = out["value"].to_numpy()

    def core(shift):
        cells, counts = np.unique(cb.coarse_of(GRID.snap(x), shift), return_counts=True)
        points = cb.coarse_midpoints(cells, GRID.steps, shift)
        rng = np.random.default_rng([base, 0])
        if mechanism == "approx_quantiles":  # the recursion on the cells' points as they are
            return GRID.value(approx_quantiles_indices(points, counts, GRID.size, Q, epsilon=1.0,
                                                       rng=rng))
        return get_mechanism(mechanism)(GRID.value(points), Q, epsilon=1.0, lower=A, upper=B,
                                        counts=counts, rng=rng)

    np.testing.assert_array_equal(got, core(cb.COARSE_SHIFT))
    if mechanism == "approx_quantiles":
        assert not np.array_equal(got, core(quantiles.GLOBAL_SHIFT))


@pytest.mark.parametrize("isin_cells", [4096, 0])
def test_global_many_kept_cells(spark, monkeypatch, isin_cells):
    """20 quantiles of a spread-out sample: pass 2 filters the kept coarse cells (isin, or
    with the limit at 0 a broadcast semi join); the release is the core's JointExp on the
    represented data at the global shift either way."""
    from dpq_spark.spark import _dataflow as flow

    monkeypatch.setattr(flow, "ISIN_CELLS", isin_cells)
    gen = np.random.default_rng(12)
    x = np.concatenate([1e9 + gen.normal(0, 2e7, 200_000), gen.uniform(0, 2e9, 50)])
    q = [0.025 + 0.05 * i for i in range(20)]
    out = dp_quantiles(spark.createDataFrame(pd.DataFrame({"x": x})), "x", quantiles=q,
                       epsilon=1.0, lower=A, upper=B, mechanism="joint_exp",
                       rng=np.random.default_rng(4)).toPandas()
    _, base = _group_rngs(spark, 4, [])
    (yk, yw), keep, whole = _global_represented(x, q, 1.0 / (2 * 2 * (1 - 0.025)))
    runs = np.flatnonzero(np.diff(np.r_[0, keep.astype(np.int8), 0])).size // 2
    assert not keep.all() and runs >= 10
    want = _fine_release(joint_exp_indices, yk, yw, q, np.random.default_rng([base, 0]), whole)
    np.testing.assert_array_equal(out["value"].to_numpy(), want)


def test_too_many_public_keys_for_the_packed_code_is_refused(spark, monkeypatch):
    """Codes are GID * 2**33 + k in an int64: more than 2**30 keys would overflow. The limit is
    lowered here to 2 keys to show the error (it names `groups`, echoes no data)."""
    from dpq_spark.spark import _dataflow as flow

    monkeypatch.setattr(flow, "MAX_PACKED_KEYS", 2)
    df = spark.createDataFrame(pd.DataFrame({"g": ["a", "b", "c"], "x": [1.0, 2.0, 3.0]}))
    with pytest.raises(ValueError, match=r"`groups` must hold at most 2\*\*30 keys"):
        dp_quantiles(df, "x", quantiles=[0.5], epsilon=1.0, lower=0, upper=10, group_by="g",
                     groups=["a", "b", "c"])
    out = dp_quantiles(df, "x", quantiles=[0.5], epsilon=1.0, lower=0, upper=10, group_by="g",
                       groups=["a", "b"])  # within the (lowered) limit: released
    assert out.count() == 2


def test_global_input_that_changes_between_passes_is_refused(spark):
    """The ungrouped path reads its input twice; a column that draws new values on each read
    (a nondeterministic UDF) gives pass 2 other counts than pass 1, and the release stops
    with an error that names `df` (and echoes no data) instead of mixing the two reads. The
    same values from a deterministic column go through."""
    import random

    fresh = F.udf(lambda i: random.random() * 10, "double").asNondeterministic()
    df = spark.range(20_000).select(fresh("id").alias("x"))
    with pytest.raises(RuntimeError, match="`df` gave different rows in the two passes"):
        dp_quantiles(df, "x", quantiles=[0.5], epsilon=1.0, lower=0.0, upper=10.0,
                     mechanism="joint_exp").collect()
    fixed = spark.range(20_000).select((F.rand(5) * 10).alias("x"))
    assert dp_quantiles(fixed, "x", quantiles=[0.5], epsilon=1.0, lower=0.0, upper=10.0,
                        mechanism="joint_exp").count() == 1


def _zeros(n, seed):
    gen = np.random.default_rng(seed)
    return np.where(gen.random(n) < 0.8, 0.0, gen.integers(1, 101, n).astype(float))


DECILES = [j / 10 for j in range(1, 10)]


def test_tied_doubles_grouped_release_the_tied_value(spark):
    """A double column that is 0 in 80% of the rows (no granularity: the default grid), grouped,
    production randomness (the batched path) and seeded (per group): the deciles inside the
    block of zeros come out as 0 in nearly every group, because JointExp splits the tie over
    its grid point's fine points (without the split they land in the gaps beside it: the
    ungrouped test below shows that, and the core's tests measure it)."""
    data = {f"g{i}": _zeros(2000, i) for i in range(12)}
    for rng in (None, np.random.default_rng(8)):
        out = dp_quantiles(_frame(spark, data), "x", quantiles=DECILES, epsilon=1.0, lower=-100.0,
                           upper=100.0, group_by="g", groups=list(data), mechanism="joint_exp",
                           rng=rng).toPandas()
        inner = out[out["quantile"].between(0.15, 0.65)]  # deciles 2 to 6: well inside the zeros
        assert (inner["value"] == 0.0).mean() >= 0.9


@pytest.mark.parametrize("split", [True, False])
def test_tied_doubles_ungrouped_release_the_tied_value(spark, monkeypatch, split):
    """Ungrouped (the driver samples, so the split can be switched off here for power): deciles
    2 to 6 of 5,000 doubles, 80% zeros, in [-100, 100] at epsilon 1 are exactly 0 in 9 of 10
    releases with the split, and far from it without."""
    from dpq_spark.core.randomness import grid as grid_module

    _release._grid_of.cache_clear()
    if not split:
        monkeypatch.setattr(grid_module, "TIE_BITS", 0)
    try:
        x = _zeros(5000, 1)
        df = spark.createDataFrame(pd.DataFrame({"x": x}))
        errs = []
        for seed in range(10):
            out = dp_quantiles(df, "x", quantiles=DECILES, epsilon=1.0, lower=-100.0, upper=100.0,
                               mechanism="joint_exp", rng=np.random.default_rng(seed)).toPandas()
            inner = out[out["quantile"].between(0.15, 0.65)]["value"].to_numpy()
            errs.append(np.abs(inner).max())
    finally:
        monkeypatch.undo()
        _release._grid_of.cache_clear()
    if split:
        assert np.mean(np.array(errs) == 0.0) >= 0.9
    else:
        assert np.median(errs) > 1.0
