"""The Python side of dp_quantiles without Spark: streaming counts and the selection threshold."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("pandas")

from dpq_spark.core._random import resolve_rng  # noqa: E402
from dpq_spark.core._samplers import discrete_laplace  # noqa: E402
from dpq_spark.spark import _release  # noqa: E402
from dpq_spark.spark._release import CELL, KEY_HASH, UNITS, ReleaseParams  # noqa: E402
from dpq_spark.core.grid import Grid  # noqa: E402
from dpq_spark.spark._selection import laplace_scale, selection_threshold  # noqa: E402


def _params(**kw):
    base = dict(keys=("k1", "k2"), quantiles=(0.5,), epsilon=1.0, lower=0.0, upper=1.0,
                resolution=64, neighboring="add_remove", mechanism="joint_exp",
                integral_keys=(True, False))
    base.update(kw)
    return ReleaseParams(**base)


GRID = Grid(0.0, 1.0)  # the grid of _params(): indices 0 .. 2**32


def _released(out, key):
    return {key(r): r.value for r in out.itertuples()}


@pytest.mark.parametrize("budget, ties", [(1 << 22, False), (40, False), (40, True)])
def test_fold_counts_exactly_within_budget_and_spills_past_it(monkeypatch, budget, ties):
    """Exact counts per (group, grid index) across batches and merges; past the budget, exact
    counts per (group, coarse cell) and the spill file gives back exact fine counts of the
    coarse cells asked for (chunks of raw codes, or of pairs when values are tied)."""
    monkeypatch.setattr(_release, "_COMPACT_ROWS", 700)  # force several merges
    gen = np.random.default_rng(0)
    gids = gen.integers(0, 5, 6000)
    k = np.where(gen.random(6000) < 0.5, gen.integers(0, 2**32 + 1, 6000),
                 2**31 + gen.integers(0, 3 * 4096, 6000))
    if ties:  # 60 distinct values: every spilled chunk is stored as (code, count) pairs
        k = np.sort(np.unique(k))[:60][gen.integers(0, 60, 6000)]
    codes = (gids << 33) + k
    fold = _release.Fold(budget)
    try:
        for i in range(0, codes.size, 333):
            fold.add(codes[i:i + 333])
        fold.finish()
        want_codes, want_counts = np.unique(codes, return_counts=True)
        index, counts = fold.arrays()
        gid_list, starts, ends = fold.groups()
        assert gid_list.tolist() == [0, 1, 2, 3, 4]
        assert fold.spilled == (budget < want_codes.size)
        if not fold.spilled:
            assert index.tolist() == (want_codes - ((want_codes >> 33) << 33)).tolist()
            assert counts.tolist() == want_counts.tolist()
            return
        coarse = (gids << 21) + (k >> 12)
        c_codes, c_counts = np.unique(coarse, return_counts=True)
        assert counts.tolist() == c_counts.tolist()
        assert index.tolist() == (c_codes - ((c_codes >> 21) << 21)).tolist()
        wanted = np.sort(c_codes[::3])
        got_codes, got_counts = fold.fine_counts(wanted)
        sel = np.isin(coarse, wanted)
        e_codes, e_counts = np.unique(codes[sel], return_counts=True)
        assert got_codes.tolist() == e_codes.tolist()
        assert got_counts.tolist() == e_counts.tolist()
    finally:
        fold.close()


def test_partition_keys_restored_across_batches(monkeypatch):
    """Keys from the data: every group is released once with its own rows (each group's rows
    sit on one grid point, which a huge epsilon releases), null keys kept as a group, ints
    restored."""
    monkeypatch.setattr(_release, "_COMPACT_ROWS", 700)
    gen = np.random.default_rng(0)
    n = 5000
    k1 = gen.choice([1.0, 2.0, np.nan], n)  # an int key that pandas turned into float + NaN
    k2 = gen.choice(["a", "b"], n)
    point = {(a, b): 1000 * (i + 1) for i, (a, b) in
             enumerate([(x, y) for x in (1.0, 2.0, "nan") for y in ("a", "b")])}
    cells = [point[("nan" if np.isnan(a) else a, b)] for a, b in zip(k1, k2)]
    pdf = pd.DataFrame({"k1": k1, "k2": k2, CELL: cells})
    batches = [pdf.iloc[i:i + 333] for i in range(0, n, 333)]
    out = pd.concat(list(_release.release_partition(iter(batches), _params(epsilon=1e4))),
                    ignore_index=True)
    got = _released(out, lambda r: (r.k1, r.k2))
    assert len(got) == len(out) == 6
    for (a, b), k in point.items():
        key = (None if a == "nan" else int(a), b)
        assert got[key] == GRID.value(k)
    assert all(isinstance(k[0], (int, type(None))) for k in got)  # ints restored, NaN -> None


def test_units_and_key_hash_are_carried():
    pdf = pd.DataFrame({"k1": [1] * 200 + [2] * 200, "k2": ["a"] * 200 + ["b"] * 200,
                        CELL: [3] * 200 + [5] * 200, UNITS: [1, 0] * 200,
                        KEY_HASH: [11] * 200 + [22] * 200})
    params = _params(threshold=-math.inf, noise_scale=1.0, extra_columns=(UNITS, KEY_HASH),
                     base_seed=5, epsilon=1e4)
    out = pd.concat(list(_release.release_partition(iter([pdf]), params)))
    assert sorted(out["value"]) == [GRID.value(3), GRID.value(5)]


def test_partition_selection_drops_a_group_below_the_threshold():
    pdf = pd.DataFrame({"k1": [1] * 5, "k2": ["a"] * 5, CELL: [1, 2, 3, 4, 5]})
    params = _params(threshold=1e9, noise_scale=1.0)
    assert sum(len(f) for f in _release.release_partition(iter([pdf]), params)) == 0
    params = _params(threshold=-1e9, noise_scale=1.0)  # and a low threshold keeps it
    assert sum(len(f) for f in _release.release_partition(iter([pdf]), params)) == 1


def test_cell_values_are_midpoints_inside_bounds():
    p = _params(lower=-1.0, upper=1.0, resolution=4)
    assert _release.cell_values(np.arange(4), p).tolist() == [-0.75, -0.25, 0.25, 0.75]


def dlap_tail(k, scale):
    """Exact ``P(Y >= k)`` for the discrete Laplace of ``scale`` and an integer ``k >= 1``."""
    q = math.exp(-1.0 / float(scale))
    return q**k / (1 + q)


def test_selection_threshold_formula():
    assert laplace_scale(0.5, 3) == 6
    for eps, delta, g in [(1.0, 1e-6, 1), (2.0, 1e-5, 4), (0.3, 1e-9, 7), (5.0, 0.05, 2)]:
        tau = selection_threshold(eps, delta, g)
        b = laplace_scale(eps, g)
        assert isinstance(tau, int) and b >= Fraction(g) / Fraction(eps)
        dk = -math.expm1(math.log1p(-delta) / g)
        # the smallest integer threshold whose one-unit release probability is <= delta_key
        assert dlap_tail(tau - 1, b) <= dk
        assert tau - 1 == 1 or dlap_tail(tau - 2, b) > dk
    # near the continuous threshold 1 + b ln(1 / (2 delta_key)), slightly above it
    cont = 1 + math.log(1 / 2e-6)
    assert cont <= selection_threshold(1.0, 1e-6, 1) <= cont + 2


@pytest.mark.parametrize("groups", [1, 3])
def test_new_key_released_with_probability_at_most_delta(groups):
    """Monte Carlo with the exact sampler: a key with one unit passes w.p. P(Y >= tau - 1) (exact
    formula); G such keys: any w.p. <= delta. A threshold that ignores G (the scale of one key)
    lets far more through."""
    eps, delta, draws = 1.0, 0.05, 300_000
    src = resolve_rng(np.random.default_rng(7))
    tau = selection_threshold(eps, delta, groups)
    b = laplace_scale(eps, groups)
    noise = discrete_laplace(src, b, size=(draws, groups))
    expected = 1 - (1 - dlap_tail(tau - 1, b)) ** groups
    assert expected <= delta
    any_released = np.mean(np.any(1 + noise >= tau, axis=1))
    se = math.sqrt(expected * (1 - expected) / draws)
    assert abs(any_released - expected) < 5 * se
    assert any_released < delta + 3 * se
    if groups > 1:  # power: the one-key threshold lets far more than delta through
        wrong = selection_threshold(eps / groups, delta, 1)
        assert np.mean(np.any(1 + noise >= wrong, axis=1)) > delta + 10 * se


@pytest.mark.parametrize("budget", [1 << 22, 4])
def test_packed_codes_are_released_per_key_index(monkeypatch, budget):
    """Public-key path: one int64 code = key index * 2**33 + grid index per row; spilled or
    not, each key index is released from its own rows."""
    monkeypatch.setattr(_release, "_COMPACT_ROWS", 700)
    gen = np.random.default_rng(3)
    gids = gen.integers(0, 7, 4000)
    k = 5000 * (gids + 1) + gen.integers(0, 3, 4000)  # each group within a few grid points
    codes = (gids << 33) + k
    batches = [pd.DataFrame({_release.CODE: codes[i:i + 450]}) for i in range(0, 4000, 450)]
    params = _params(keys=("g",), integral_keys=(True,), extra_columns=(_release.CODE,),
                     epsilon=1e4, fold_budget=budget)
    out = pd.concat(list(_release.release_partition(iter(batches), params)), ignore_index=True)
    assert list(out.columns) == [_release.GID, "quantile", "value", "mechanism"]
    assert set(out["mechanism"]) == {"joint_exp"}
    assert out[_release.GID].tolist() == list(range(7))
    for g, value in zip(out[_release.GID], out["value"]):
        assert GRID.value(np.median(k[gids == g])) == value
