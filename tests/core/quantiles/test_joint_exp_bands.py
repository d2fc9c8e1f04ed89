"""JointExp's band bounds against exact masses: the weighted boxes never exceed the normaliser
and the deviation bound never falls below the mass it bounds (that bands cut with them keep the
normaliser is tested in test_joint_exp.py, beside the union bound's bands).

The exact masses enumerate every sorted tuple of grid points of small cases (ties, gaps, one to
three outputs) with the utility written from its definition, independently of the cells.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dpq_spark.core.quantiles import joint_exp as J


def mid_rank(x, size):
    """rho(k) for every grid point k: #{x < k} + (t + 1) / 2 with t copies at k (0 if none)."""
    x = np.sort(np.asarray(x))
    below = np.searchsorted(x, np.arange(size), side="left")
    ties = np.searchsorted(x, np.arange(size), side="right") - below
    return below + np.where(ties > 0, (ties + 1) / 2.0, 0.0)


def exact_masses(x, size, q, c):
    """For every sorted m-tuple of the grid: its log weight c u(o) and max_k |rho(o_k) - P_k|."""
    n, m = len(x), q.size
    rho = mid_rank(x, size)
    targets = np.diff(np.concatenate(([0.0], q, [1.0]))) * n
    tuples = np.array(list(itertools.combinations_with_replacement(range(size), m)))
    ranks = np.concatenate([np.zeros((len(tuples), 1)), rho[tuples], np.full((len(tuples), 1), n)],
                           axis=1)
    log_w = -c * np.abs(np.diff(ranks, axis=1) - targets).sum(axis=1)
    dev = np.abs(rho[tuples] - q * n).max(axis=1)
    return log_w, dev


def small_case(seed):
    gen = np.random.default_rng(seed)
    size = int(gen.integers(8, 30))
    m = int(gen.integers(1, 4))
    n = int(gen.integers(2, 13))
    x = gen.integers(0, size, n)
    if gen.random() < 0.5:  # a block of ties
        x[: n // 2] = x[0]
    q = np.sort(gen.choice(np.arange(1, 20), m, replace=False)) / 20.0
    c = float(gen.choice([0.05, 0.3, 1.0, 3.0]))
    return x, size, q, c


def flat_one(x, size):
    """One group's cells as the flat arrays of the band helpers, and its search."""
    start, width, log_width, pos, n = J._grid_cells(np.sort(x), None, size)

    def search(v, side):
        return np.searchsorted(pos, v, side=side)

    return start, log_width, pos, np.array([n]), np.array([0, pos.size]), search


@pytest.mark.parametrize("seed", range(40))
def test_weighted_boxes_are_below_the_normaliser(seed):
    x, size, q, c = small_case(seed)
    log_w, _ = exact_masses(x, size, q, c)
    log_z = np.logaddexp.reduce(log_w)
    start, log_width, pos, n, coff, search = flat_one(x, size)
    bound = J._weighted_box_bound(log_width, pos, n, coff, q, c, search)[0]
    assert bound <= log_z + 1e-12


@pytest.mark.parametrize("seed", range(40))
def test_deviation_bound_is_above_the_mass_it_bounds(seed):
    x, size, q, c = small_case(seed)
    log_w, dev = exact_masses(x, size, q, c)
    start, log_width, pos, n, coff, search = flat_one(x, size)
    log_sm = np.array([math.log(size + q.size)])
    for h in np.arange(0.0, len(x) + 1.0, 0.25):
        beyond = dev > h
        if not beyond.any():
            continue
        exact = np.logaddexp.reduce(log_w[beyond])
        bound = J._deviation_log_mass(np.array([h]), start, n, coff, q, c, search, log_sm)[0]
        assert bound >= exact - 1e-12, (h, bound, exact)


def test_the_bounds_are_not_vacuous():
    # Power of the two tests above: where the boxes are near the normaliser and the deviation
    # bound near the mass beyond h, a bound off by a factor exp(1) would fail them.
    gaps = []
    for seed in range(40):
        x, size, q, c = small_case(seed)
        log_w, dev = exact_masses(x, size, q, c)
        start, log_width, pos, n, coff, search = flat_one(x, size)
        box = J._weighted_box_bound(log_width, pos, n, coff, q, c, search)[0]
        gaps.append(np.logaddexp.reduce(log_w) - box)
        h = np.array([0.0])
        log_sm = np.array([math.log(size + q.size)])
        if (dev > 0).any():
            dev_bound = J._deviation_log_mass(h, start, n, coff, q, c, search, log_sm)[0]
            gaps.append(dev_bound - np.logaddexp.reduce(log_w[dev > 0]))
    assert min(gaps) < 1.0


@pytest.mark.parametrize("wrong", ["decay", "outputs"])
def test_a_wrong_deviation_bound_is_caught(wrong, monkeypatch):
    # A bound decaying as exp(-4 c M), or counting one output fewer, falls below an exact mass.
    real = J._deviation_log_mass

    def decay(h, start, n, coff, q, c, search, log_sm):
        return real(h, start, n, coff, q, 2.0 * c, search, log_sm)

    def outputs(h, start, n, coff, q, c, search, log_sm):
        return real(h, start, n, coff, q, c, search, log_sm) - math.log(float(start[coff[1]]))

    monkeypatch.setattr(J, "_deviation_log_mass", decay if wrong == "decay" else outputs)
    with pytest.raises(AssertionError):
        for seed in range(40):
            test_deviation_bound_is_above_the_mass_it_bounds(seed)


def test_a_wrong_box_bound_is_caught(monkeypatch):
    # Boxes decaying as exp(-c |d|) instead of exp(-2 c |d|) exceed a normaliser.
    real = J._weighted_box_bound
    monkeypatch.setattr(J, "_weighted_box_bound",
                        lambda lw, pos, n, coff, q, c, search: real(lw, pos, n, coff, q, c / 2, search))
    with pytest.raises(AssertionError):
        for seed in range(40):
            test_weighted_boxes_are_below_the_normaliser(seed)
