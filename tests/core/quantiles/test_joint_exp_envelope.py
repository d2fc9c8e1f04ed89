"""JointExp outside its bands: the envelope's rounds keep the law exact whatever the bands.

The bands only set the cost (``joint_exp_envelope``'s module docstring): with ``_ENVELOPE_NATS``
at -20 the bands shrink to the reference cells, most rounds go outside them, and the draws must
still follow the brute-force law over every sorted tuple. Wrong variants of the envelope (a
proposal inside the bands kept, the outside mass under-counted) must fail the same tests.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from dpq_spark.core.randomness.grid import Grid
from dpq_spark.core.randomness.source import resolve_rng
from test_joint_exp import CASES, brute_force, c_of, chi_square_pvalue  # the single-group oracles

J = importlib.import_module("dpq_spark.core.quantiles.joint_exp")
JM = importlib.import_module("dpq_spark.core.quantiles.joint_exp_many")
E = importlib.import_module("dpq_spark.core.quantiles.joint_exp_envelope")

NARROW = -20.0  # the envelope may weigh e**20 times the normaliser's lower bound: h = 0
DRAWS = 12_000


def _many(name, seed, draws=DRAWS):
    idx, size, q, eps = CASES[name]
    c = c_of(q, eps)
    cells = J._grid_cells(np.asarray(idx, dtype=np.int64), None, size)
    got = JM._sample_many([cells], np.asarray(q), c, size, resolve_rng(np.random.default_rng(seed)),
                          rows=np.zeros(draws, dtype=np.int64))
    return got, brute_force(idx, size, q, c)


@pytest.mark.parametrize("name", ["distinct", "ties", "on_the_bounds", "all_equal", "m_exceeds_n"])
def test_narrow_bands_keep_the_law(name, monkeypatch):
    monkeypatch.setattr(J, "_ENVELOPE_NATS", NARROW)
    idx, size, q, eps = CASES[name]
    cells = J._grid_cells(np.asarray(idx, dtype=np.int64), None, size)
    lo, hi, h = J._bands(*cells, np.asarray(q), c_of(q, eps), size)
    assert np.isfinite(h) and (hi - lo).sum() < len(q) * cells[3].size, "bands must leave cells out"
    got, law = _many(name, seed=21)
    assert chi_square_pvalue(got, law) > 1e-3


def test_narrow_bands_keep_the_law_of_interleaved_groups(monkeypatch):
    """Three groups of different grids and quantile counts' data in one batch, their rows
    interleaved: each group's envelope, bands and ranks are its own."""
    monkeypatch.setattr(J, "_ENVELOPE_NATS", NARROW)
    names = ["distinct", "on_the_bounds", "ties"]
    q = np.asarray(CASES["distinct"][2])
    eps = 2.0
    c = c_of(q, eps)
    size = 9
    cells = [J._grid_cells(np.asarray(CASES[nm][0], dtype=np.int64), None, size) for nm in names]
    rows = np.tile(np.arange(3, dtype=np.int64), 8000)
    got = JM._sample_many(cells, q, c, size, resolve_rng(np.random.default_rng(24)), rows=rows)
    for g, nm in enumerate(names):
        law = brute_force(CASES[nm][0], size, q.tolist(), c)
        assert chi_square_pvalue(got[rows == g], law) > 1e-3, nm


def test_narrow_bands_keep_the_law_in_the_single_group_sampler(monkeypatch):
    monkeypatch.setattr(J, "_ENVELOPE_NATS", NARROW)
    idx, size, q, eps = CASES["on_the_bounds"]
    c = c_of(q, eps)
    got = J._sample_indices(np.asarray(idx, dtype=np.int64), None, np.asarray(q), c, size,
                            resolve_rng(np.random.default_rng(22)), 3000)
    assert chi_square_pvalue(got, brute_force(idx, size, q, c)) > 1e-3


def _keep_inside_proposals(monkeypatch):
    """Wrong: a proposal inside the bands is kept (it is the bands' to draw)."""
    real = E.Envelope.__init__

    def init(self, *args, **kwargs):
        real(self, *args, **kwargs)
        self.b_hi = self.b_lo  # every proposal looks outside the bands
    monkeypatch.setattr(E.Envelope, "__init__", init)


def _undercount_outside(monkeypatch):
    """Wrong: the outside mass B counted e times too small."""
    real = E.Envelope.__init__

    def init(self, *args, **kwargs):
        real(self, *args, **kwargs)
        self.log_b = self.log_b - 1.0
    monkeypatch.setattr(E.Envelope, "__init__", init)


@pytest.mark.parametrize("wrong", [_keep_inside_proposals, _undercount_outside])
def test_a_wrong_envelope_is_caught(wrong, monkeypatch):
    monkeypatch.setattr(J, "_ENVELOPE_NATS", NARROW)
    wrong(monkeypatch)
    got, law = _many("distinct", seed=23)
    assert chi_square_pvalue(got, law) < 1e-6


def _deciles(seed, draws, monkeypatch=None):
    """Draws of one N(0, 5) group of 1,000 rows (deciles, epsilon 1, the default grid): the first
    output's rank, a discrete statistic of the whole law."""
    grid = Grid(-100.0, 100.0)
    x = np.random.default_rng(5).normal(0.0, 5.0, 1000)
    q = np.arange(1, 10) / 10
    cells = J._grid_cells(np.sort(grid.snap(x)), None, grid.size)
    got = JM._sample_many([cells], q, c_of(q, 1.0), grid.size,
                          resolve_rng(np.random.default_rng(seed)),
                          rows=np.zeros(draws, dtype=np.int64))
    start, pos = cells[0], cells[3]
    return pos[np.searchsorted(start, got[:, 0], side="right") - 1]


def _all_cells(monkeypatch):
    """Bands over every cell: no tuple outside them (the sampler without the envelope)."""
    real = J._bands

    def full(start, width, log_width, pos, n, q, c, size):
        lo, hi, h = real(start, width, log_width, pos, n, q, c, size)
        return np.zeros_like(lo), np.full_like(hi, pos.size), np.inf
    monkeypatch.setattr(J, "_bands", full)
    monkeypatch.setattr(JM, "_bands", full)


def _two_sample_pvalue(a, b):
    edges = np.unique(np.quantile(np.concatenate([a, b]), np.linspace(0, 1, 21)))
    table = np.stack([np.histogram(a, edges)[0], np.histogram(b, edges)[0]])
    return chi2_contingency(table[:, table.sum(axis=0) > 0]).pvalue


def _prune_without_rounds(monkeypatch):
    """Wrong: bands of half-width 0 and no round ever outside them (pruning, not sampling)."""
    monkeypatch.setattr(J, "_ENVELOPE_NATS", -40.0)

    def inside_only(env, rows, log_zn, ranks, source):
        return np.ones(rows.size, dtype=bool), np.zeros((rows.size, env.m), dtype=np.int64)
    monkeypatch.setattr(JM, "draw_outside", inside_only)


@pytest.mark.parametrize("wrong, expect", [(None, "same"), (_prune_without_rounds, "differs")])
def test_default_bands_draw_what_full_bands_draw(wrong, expect, monkeypatch):
    """At 1,000 rows the default bands keep about half the cells of full ones, and about one
    round in ten goes outside them (where, at this size, almost every proposal is turned down:
    the tuples outside weigh about 2**-45); the first output's rank has the law of the sampler
    over all cells. Power: bands pruned to the reference cells without the envelope's rounds
    (the outside tuples' law is checked exactly on small grids above)."""
    with monkeypatch.context() as patch:
        _all_cells(patch)
        full = _deciles(31, 20_000)
    if wrong is not None:
        wrong(monkeypatch)
    banded = _deciles(32, 20_000)
    p = _two_sample_pvalue(full, banded)
    assert p > 1e-3 if expect == "same" else p < 1e-6
