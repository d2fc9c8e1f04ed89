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
from dpq_spark.spark._selection import laplace_scale, selection_threshold  # noqa: E402


def _params(**kw):
    base = dict(keys=("k1", "k2"), quantiles=(0.5,), epsilon=1.0, lower=0.0, upper=1.0,
                resolution=64, neighboring="add_remove", mechanism="joint_exp",
                integral_keys=(True, False))
    base.update(kw)
    return ReleaseParams(**base)


@pytest.fixture
def recorded(monkeypatch):
    """Replace the mechanism by one that records what it was given."""
    calls = []

    def fake(values, quantiles, *, epsilon, lower, upper, neighboring, counts, rng):
        calls.append((np.asarray(values).copy(), np.asarray(counts).copy()))
        return np.full(len(quantiles), float(np.sum(counts)))

    monkeypatch.setattr(_release, "get_mechanism", lambda name: fake)
    monkeypatch.setattr(_release, "_COMPACT_ROWS", 700)  # force several merges
    return calls


def test_partition_counts_match_pandas_across_batches_and_merges(recorded):
    gen = np.random.default_rng(0)
    n = 5000
    k1 = gen.choice([1.0, 2.0, np.nan], n)  # an int key that pandas turned into float + NaN
    k2 = gen.choice(["a", "b"], n)
    cells = gen.integers(0, 64, n)
    pdf = pd.DataFrame({"k1": k1, "k2": k2, CELL: cells})
    batches = [pdf.iloc[i:i + 333] for i in range(0, n, 333)]
    out = pd.concat(list(_release.release_partition(iter(batches), _params())), ignore_index=True)

    truth = pdf.groupby(["k1", "k2"], dropna=False).size()
    assert len(out) == len(truth) == len(recorded)
    got = {(None if r.k1 is None else r.k1, r.k2): r.value for r in out.itertuples()}
    for (a, b), size in truth.items():
        key = (None if np.isnan(a) else int(a), b)
        assert got[key] == size  # every row counted once, null keys kept as a group
    assert all(isinstance(k[0], (int, type(None))) for k in got)  # ints restored, NaN -> None
    for values, counts in recorded:
        assert np.all(np.diff(values) > 0) and counts.min() >= 1  # sorted distinct cells


def test_units_and_key_hash_are_carried(recorded):
    pdf = pd.DataFrame({"k1": [1, 1, 2], "k2": ["a", "a", "b"], CELL: [3, 3, 5],
                        UNITS: [1, 0, 1], KEY_HASH: [11, 11, 22]})
    params = _params(threshold=-math.inf, noise_scale=1.0, extra_columns=(UNITS, KEY_HASH),
                     base_seed=5)
    out = pd.concat(list(_release.release_partition(iter([pdf]), params)))
    assert sorted(out["value"]) == [1.0, 2.0]


def test_partition_selection_drops_a_group_below_the_threshold(recorded):
    pdf = pd.DataFrame({"k1": [1] * 5, "k2": ["a"] * 5, CELL: [1, 2, 3, 4, 5]})
    params = _params(threshold=1e9, noise_scale=1.0)
    assert pd.concat(list(_release.release_partition(iter([pdf]), params))).empty
    assert recorded == []


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


def test_packed_codes_are_counted_per_key_index(recorded):
    """Public-key path: one int64 code = key index * resolution + cell per row."""
    gen = np.random.default_rng(3)
    gids = gen.integers(0, 7, 4000)
    cells = gen.integers(0, 64, 4000)
    codes = gids * 64 + cells
    batches = [pd.DataFrame({_release.CODE: codes[i:i + 450]}) for i in range(0, 4000, 450)]
    params = _params(keys=("g",), integral_keys=(True,), extra_columns=(_release.CODE,))
    out = pd.concat(list(_release.release_partition(iter(batches), params)), ignore_index=True)
    assert list(out.columns) == [_release.GID, "quantile", "value", "mechanism"]
    assert set(out["mechanism"]) == {"joint_exp"}  # the recording mechanism has no name: params'
    expected = pd.Series(gids).value_counts().sort_index()
    assert out[_release.GID].tolist() == expected.index.tolist()
    assert out["value"].tolist() == expected.astype(float).tolist()
