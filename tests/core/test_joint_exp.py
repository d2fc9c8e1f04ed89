"""JointExp: argument validation, invariants, exactness against brute force, robustness."""

from __future__ import annotations

import importlib
import itertools
import math
import warnings

import numpy as np
import pytest
from scipy.stats import chisquare

from dpq_spark.core import NeighboringRelation, joint_exp
from dpq_spark.core.privacy import joint_exp_sensitivity

J = importlib.import_module("dpq_spark.core.joint_exp")

Q3 = [0.25, 0.5, 0.75]


def call(**overrides):
    kwargs = dict(values=[1.0, 2.0, 3.0], quantiles=Q3, epsilon=1.0, lower=0.0, upper=10.0)
    kwargs.update(overrides)
    values = kwargs.pop("values")
    quantiles = kwargs.pop("quantiles")
    return joint_exp(values, quantiles, **kwargs, rng=np.random.default_rng(0))


# ------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "overrides, error, match",
    [
        (dict(epsilon=0.0), ValueError, r"`epsilon` must be finite and > 0, got 0.0"),
        (dict(epsilon=-1.0), ValueError, r"`epsilon` must be finite and > 0, got -1.0"),
        (dict(epsilon=math.inf), ValueError, r"`epsilon` must be finite and > 0"),
        (dict(epsilon=math.nan), ValueError, r"`epsilon` must be finite and > 0"),
        (dict(epsilon="1"), TypeError, r"`epsilon` must be a real number"),
        (dict(lower=5.0, upper=1.0), ValueError, r"`lower` must be < `upper`"),
        (dict(lower=1.0, upper=1.0), ValueError, r"`lower` must be < `upper`"),
        (dict(lower=-math.inf), ValueError, r"`lower` must be finite"),
        (dict(upper=math.nan), ValueError, r"`upper` must be finite"),
        (dict(lower=-1e308, upper=1e308), ValueError, r"`upper - lower` must be finite"),
        (dict(quantiles=[]), ValueError, r"`quantiles` must be a non-empty 1-d sequence"),
        (dict(quantiles=[0.0, 0.5]), ValueError, r"`quantiles` must each be in the open interval \(0, 1\)"),
        (dict(quantiles=[0.5, 1.0]), ValueError, r"`quantiles` must each be in the open interval \(0, 1\)"),
        (dict(quantiles=[0.5, 0.25]), ValueError, r"`quantiles` must be strictly increasing"),
        (dict(quantiles=[0.5, 0.5]), ValueError, r"`quantiles` must be strictly increasing"),
        (dict(quantiles="0.5"), TypeError, r"`quantiles` must be a sequence of numbers"),
        (dict(values=[1.0, math.nan]), ValueError, r"`values` must not contain NaN"),
        (dict(values=[[1.0, 2.0]]), ValueError, r"`values` must be 1-d"),
        (dict(values=["a"]), TypeError, r"`values` must be an array-like of real numbers"),
        (dict(counts=[1, 2]), ValueError, r"`counts` must be 1-d with the same length as `values`"),
        (dict(counts=[1, -2, 3]), ValueError, r"`counts` must be non-negative"),
        (dict(counts=[1.5, 2, 3]), ValueError, r"`counts` must hold whole numbers"),
        (dict(counts=[2**53, 2, 1]), ValueError, r"`counts` must sum to at most 2\*\*53"),
        (dict(neighboring="replace"), ValueError, r"`neighboring` must be one of 'add_remove', 'swap'"),
    ],
)
def test_invalid_arguments_are_refused(overrides, error, match):
    with pytest.raises(error, match=match):
        call(**overrides)


def test_rng_must_be_a_generator():
    with pytest.raises(TypeError, match=r"`rng` must be a numpy.random.Generator, a RandomSource or None, got int"):
        joint_exp([1.0], [0.5], epsilon=1.0, lower=0.0, upper=1.0, rng=7)


def test_error_messages_do_not_echo_private_values():
    with pytest.raises(ValueError) as info:
        call(values=[123456.789, math.nan])
    assert "123456" not in str(info.value)


# ------------------------------------------------------------------------------- invariants


@pytest.mark.parametrize("n", [0, 1, 5, 1000])
@pytest.mark.parametrize("m", [1, 3, 12])
def test_output_is_sorted_float64_within_bounds(n, m):
    rng = np.random.default_rng(n * 31 + m)
    x = rng.normal(0.0, 5.0, n)
    q = np.arange(1, m + 1) / (m + 1)
    out = joint_exp(x, q, epsilon=1.0, lower=-10.0, upper=10.0, rng=rng)
    assert out.dtype == np.float64 and out.shape == (m,)
    assert np.all(np.diff(out) >= 0)
    assert np.all((out >= -10.0) & (out <= 10.0))


def test_default_rng_is_fresh_entropy():
    x = np.arange(100.0)
    a = joint_exp(x, Q3, epsilon=1.0, lower=0.0, upper=100.0)
    b = joint_exp(x, Q3, epsilon=1.0, lower=0.0, upper=100.0)
    assert not np.array_equal(a, b)


def test_seeded_generator_reproduces():
    x = np.arange(100.0)
    a = joint_exp(x, Q3, epsilon=1.0, lower=0.0, upper=100.0, rng=np.random.default_rng(5))
    b = joint_exp(x, Q3, epsilon=1.0, lower=0.0, upper=100.0, rng=np.random.default_rng(5))
    np.testing.assert_array_equal(a, b)


def test_large_epsilon_recovers_the_quantiles():
    x = np.random.default_rng(1).normal(0.0, 5.0, 10_000)
    q = np.arange(1, 10) / 10
    out = joint_exp(x, q, epsilon=1e3, lower=-100.0, upper=100.0, rng=np.random.default_rng(2))
    xs = np.sort(x)
    idx = np.floor(q * x.size).astype(int)
    assert np.all(out >= xs[idx - 1]) and np.all(out <= xs[idx + 1])


def test_swap_is_the_single_quantile_mechanism_at_full_epsilon():
    # m = 1, swap: P(interval i) ∝ w_i exp(-(eps/2) |i - q n|) (ALGORITHMS.md section 1).
    x = np.sort(np.random.default_rng(3).uniform(0.0, 1.0, 8))
    eps, q = 1.2, 0.4
    c = eps / (2 * joint_exp_sensitivity(np.array([q]), NeighboringRelation.SWAP))
    _, ranks = J._sample_many(x, None, np.array([q]), c, 0.0, 1.0, np.random.default_rng(4), 20_000)
    w = np.diff(np.concatenate(([0.0], x, [1.0])))
    p = w * np.exp(-(eps / 2) * np.abs(np.arange(9) - q * 8))
    p /= p.sum()
    observed = np.bincount(ranks[:, 0], minlength=9)
    assert chisquare(observed, p * observed.sum()).pvalue > 1e-3


# ------------------------------------------------------------------------------- exactness


def brute_force(x, q, c, lower, upper):
    """P(s) ∝ exp(c u(s)) prod_j |I_{i_j}| / prod_i count_s(i)!, enumerated over all sequences."""
    xs = np.sort(np.clip(np.asarray(x, dtype=float), lower, upper))
    n, m = xs.size, len(q)
    widths = np.diff(np.concatenate(([lower], xs, [upper])))
    targets = np.diff(np.concatenate(([0.0], q, [1.0]))) * n
    weights = {}
    for s in itertools.combinations_with_replacement(range(n + 1), m):
        volume = np.prod(widths[list(s)])
        if volume == 0.0:
            continue
        utility = -np.abs(np.diff(np.concatenate(([0], s, [n]))) - targets).sum()
        repeats = np.prod([math.factorial(k) for k in np.unique(s, return_counts=True)[1]])
        weights[s] = math.exp(c * utility) * volume / repeats
    total = sum(weights.values())
    return {s: w / total for s, w in weights.items()}


def chi_square_pvalue(samples, probs):
    observed = {}
    for s in map(tuple, samples):
        observed[s] = observed.get(s, 0) + 1
    assert set(observed) <= set(probs), "sampled a sequence of probability zero"
    keys = list(probs)
    obs = np.array([observed.get(s, 0) for s in keys], dtype=float)
    exp = np.array([probs[s] for s in keys]) * len(samples)
    if len(keys) == 1:
        return 1.0
    # Pool cells with small expectations so that the chi-square approximation holds.
    order = np.argsort(exp)
    small = exp[order] < 5
    if small.sum() >= 1:
        pooled_obs = np.append(obs[order][~small], obs[order][small].sum())
        pooled_exp = np.append(exp[order][~small], exp[order][small].sum())
        obs, exp = pooled_obs, pooled_exp
    return chisquare(obs, exp).pvalue


CASES = {
    "distinct": ([0.1, 0.5, 0.7, 0.9], [0.3, 0.6], 2.0, (0.0, 1.0)),
    "duplicates": ([0.2, 0.2, 0.5, 0.5, 0.5, 0.8], [0.25, 0.5, 0.75], 3.0, (0.0, 1.0)),
    "on_and_outside_bounds": ([-1.0, 0.0, 0.3, 1.0, 2.0, 0.6], [0.2, 0.8], 1.5, (0.0, 1.0)),
    "empty": ([], [0.3, 0.6], 1.0, (0.0, 1.0)),
    "m_exceeds_n": ([0.5], [0.2, 0.4, 0.6], 0.5, (0.0, 1.0)),
    "all_equal": ([0.4, 0.4, 0.4], [0.3, 0.5, 0.7], 1.0, (0.0, 1.0)),
}
N_SAMPLES = 12_000


def draw(x, q, c, bounds, seed, sampler=None):
    sample = sampler or J._sample_many
    _, ranks = sample(np.asarray(x, dtype=float), None, np.asarray(q), c, *bounds, np.random.default_rng(seed), N_SAMPLES)
    return ranks


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("neighboring", ["add_remove", "swap"])
def test_interval_sequences_match_brute_force(name, neighboring):
    x, q, eps, bounds = CASES[name]
    c = eps / (2 * joint_exp_sensitivity(np.array(q), NeighboringRelation(neighboring)))
    probs = brute_force(x, q, c, *bounds)
    assert chi_square_pvalue(draw(x, q, c, bounds, seed=11), probs) > 1e-3


def test_chi_square_rejects_epsilon_times_1_3():
    x, q, eps, bounds = CASES["distinct"]
    c = eps / (2 * joint_exp_sensitivity(np.array(q), NeighboringRelation.ADD_REMOVE))
    probs = brute_force(x, q, c, *bounds)
    assert chi_square_pvalue(draw(x, q, 1.3 * c, bounds, seed=12), probs) < 1e-6


def test_chi_square_rejects_a_sampler_without_the_factorial(monkeypatch):
    x, q, eps, bounds = CASES["m_exceeds_n"]
    c = eps / (2 * joint_exp_sensitivity(np.array(q), NeighboringRelation.ADD_REMOVE))
    probs = brute_force(x, q, c, *bounds)
    monkeypatch.setattr(J, "_log_run_volume", lambda k: 0.0)
    assert chi_square_pvalue(draw(x, q, c, bounds, seed=13), probs) < 1e-6


def test_counts_give_exactly_the_repeated_array():
    rng = np.random.default_rng(7)
    values = rng.normal(0.0, 3.0, 50)
    counts = rng.integers(0, 5, 50)
    q = np.array([0.1, 0.5, 0.9])
    for seed in range(20):
        a = joint_exp(np.repeat(values, counts), q, epsilon=1.0, lower=-10, upper=10, rng=np.random.default_rng(seed))
        b = joint_exp(values, q, epsilon=1.0, lower=-10, upper=10, counts=counts, rng=np.random.default_rng(seed))
        np.testing.assert_array_equal(a, b)


def test_counts_match_brute_force_of_the_repeated_array():
    values, counts = np.array([0.7, 0.2, 0.5]), np.array([1, 2, 0])
    q = np.array([0.3, 0.7])
    c = 2.0 / (2 * joint_exp_sensitivity(q, NeighboringRelation.ADD_REMOVE))
    probs = brute_force(np.repeat(values, counts), q, c, 0.0, 1.0)
    _, ranks = J._sample_many(values, counts, q, c, 0.0, 1.0, np.random.default_rng(3), N_SAMPLES)
    assert chi_square_pvalue(ranks, probs) > 1e-3


@pytest.mark.parametrize("eps, lower_bound", [(1.0, "boxes"), (0.2, "boxes"), (1.0, "reference")])
def test_band_pruning_keeps_the_normaliser(eps, lower_bound, monkeypatch):
    # With pruning on, the forward pass must reach the same log normaliser as with full bands,
    # whichever lower bound of the normaliser sets the bands.
    if lower_bound == "reference":
        monkeypatch.setattr(J, "_box_lower_bound", lambda *args: None)
    x = np.random.default_rng(8).normal(0.0, 5.0, 3000)
    q = np.arange(1, 6) / 6
    c = eps / (2 * joint_exp_sensitivity(q, NeighboringRelation.ADD_REMOVE))
    edges, log_width, pos, n = J._cells(x, None, -100.0, 100.0)
    lo, hi = J._bands(edges, log_width, pos, n, q, c, -100.0, 100.0)
    assert (hi - lo).max() < pos.size // 2, "the test needs a case where pruning happens"

    def log_z(lo, hi):
        fw = J._Forward(log_width, pos, n, q, c, lo, hi)
        fw.run()
        band = fw._band(q.size)
        last = fw.S_last - c * np.abs(n - pos[band] - fw.targets[-1]) + fw.nu[-1]
        return np.logaddexp.reduce(last)

    full = log_z(np.zeros_like(lo), np.full_like(hi, pos.size))
    assert abs(log_z(lo, hi) - full) <= 1e-12 * abs(full)


def test_band_pruning_with_a_wrong_bound_is_caught(monkeypatch):
    # Power of the test above: bands cut by a bound 200 nats too optimistic lose mass.
    monkeypatch.setattr(J, "_LOG_BAND_TOL", J._LOG_BAND_TOL - 200.0)
    x = np.random.default_rng(8).normal(0.0, 5.0, 3000)
    q = np.arange(1, 6) / 6
    c = 1.0 / (2 * joint_exp_sensitivity(q, NeighboringRelation.ADD_REMOVE))
    edges, log_width, pos, n = J._cells(x, None, -100.0, 100.0)
    lo, hi = J._bands(edges, log_width, pos, n, q, c, -100.0, 100.0)
    fw = J._Forward(log_width, pos, n, q, c, lo, hi)
    fw.run()
    full = J._Forward(log_width, pos, n, q, c, np.zeros_like(lo), np.full_like(hi, pos.size))
    full.run()

    def log_z(fw):
        band = fw._band(q.size)
        return np.logaddexp.reduce(fw.S_last - c * np.abs(n - pos[band] - fw.targets[-1]) + fw.nu[-1])

    assert abs(log_z(fw) - log_z(full)) > 1e-9 * abs(log_z(full))


def test_kernel_sums_match_direct_sums():
    rng = np.random.default_rng(9)
    src_pos = np.sort(rng.choice(5000, 400, replace=False)).astype(float)
    rec_pos = np.sort(rng.choice(5000, 300, replace=False)).astype(float)
    src_log = rng.normal(0.0, 30.0, 400)
    for t, c in [(37.5, 0.3), (800.0, 0.01), (0.4, 2.0), (4999.0, 0.05)]:
        got = J._kernel_sums(src_pos, src_log, rec_pos, t, c)
        for i in range(0, 300, 7):
            left = src_pos < rec_pos[i]
            want = np.logaddexp.reduce(src_log[left] - c * np.abs(rec_pos[i] - src_pos[left] - t)) if left.any() else -np.inf
            assert got[i] == pytest.approx(want, rel=1e-12, abs=1e-9)


# ------------------------------------------------------------------------------- robustness


@pytest.mark.parametrize(
    "n, m, eps",
    [
        (1_000_000, 30, 1.0),
        (100_000, 200, 1e3),
        (100_000, 200, 1.0),
        (10_000, 30, 1e-3),
        (1_000, 200, 1e-3),
        (0, 200, 1.0),
    ],
)
def test_no_nan_inf_or_warning(n, m, eps):
    rng = np.random.default_rng(n + m)
    x = rng.normal(0.0, 5.0, n)
    q = np.arange(1, m + 1) / (m + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = joint_exp(x, q, epsilon=eps, lower=-100.0, upper=100.0, rng=rng)
    assert np.all(np.isfinite(out)) and np.all(np.diff(out) >= 0)


@pytest.mark.slow
def test_ten_million_rows():
    rng = np.random.default_rng(10)
    x = rng.normal(0.0, 5.0, 10_000_000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = joint_exp(x, np.arange(1, 31) / 31, epsilon=1.0, lower=-100.0, upper=100.0, rng=rng)
    assert np.all(np.isfinite(out))
    assert np.abs(out - np.quantile(x, np.arange(1, 31) / 31)).max() < 0.01


@pytest.mark.parametrize(
    "values, counts",
    [
        (np.random.default_rng(0).integers(0, 10, 1_000_000).astype(float), None),  # heavy duplicates
        (np.full(100_000, 3.0), None),  # all equal
        (np.concatenate([np.full(500, -1e9), np.full(500, np.inf)]), None),  # all outside
        (np.full(10, -np.inf), None),
        (np.arange(1_000_000, dtype=float) / 1e4, np.full(1_000_000, 1000)),  # 1e9 rows as counts
    ],
)
@pytest.mark.parametrize("eps", [1e-3, 1.0, 1e3])
def test_degenerate_data(values, counts, eps):
    q = np.arange(1, 31) / 31
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = joint_exp(values, q, epsilon=eps, lower=-100.0, upper=100.0, counts=counts, rng=np.random.default_rng(1))
    assert np.all(np.isfinite(out)) and np.all(np.diff(out) >= 0)
    assert out.min() >= -100.0 and out.max() <= 100.0
