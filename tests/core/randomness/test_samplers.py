"""Exact integer samplers: chi-square against the exact pmf, with power against a wrong scale."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpq_spark.core.randomness import samplers as S
from multinomial import composition_pvalue
from dpq_spark.core.randomness.source import resolve_rng


def source(seed):
    return resolve_rng(np.random.default_rng(seed))


def dlap_cdf(y, scale):
    """Exact ``P(Y <= y)`` of the discrete Laplace with ``P(y) ∝ exp(-|y| / scale)``."""
    q = math.exp(-1.0 / float(scale))
    y = np.asarray(y, dtype=float)
    return np.where(y >= 0, 1.0 - q ** (y + 1) / (1 + q), q ** (-y) / (1 + q))


def geometric_cdf(y, scale):
    q = math.exp(-1.0 / float(scale))
    y = np.asarray(y, dtype=float)
    return np.where(y >= 0, 1.0 - q ** (y + 1), 0.0)


def binned_pvalue(draws, cdf, true_scale, scale, bins=20):
    """Chi-square p-value of ``draws`` against ``cdf(., scale)``, on bins that are integer
    quantile ranges of the true distribution (so every bin is well filled)."""
    lo, hi = int(draws.min()) - 1, int(draws.max()) + 1
    support = np.arange(lo, hi + 1)
    c_true = cdf(support, true_scale)
    cut = np.unique(np.searchsorted(c_true, np.arange(1, bins) / bins))
    edges = support[cut]  # bin j is (edges[j-1], edges[j]]
    upper = np.concatenate([edges, [np.iinfo(np.int64).max]])
    c = np.concatenate([[0.0], cdf(edges, scale), [1.0]])
    expected = np.diff(c) * draws.size
    observed = np.bincount(np.searchsorted(upper, draws, side="left"), minlength=upper.size)
    keep = expected > 0
    assert observed[~keep].sum() == 0
    return stats.chisquare(observed[keep], expected[keep] * observed[keep].sum() / expected[keep].sum()).pvalue


SCALES = [Fraction(1, 3), Fraction(4), S.dlap_scale(1, 0.3), Fraction(1000), 2.5]


@pytest.mark.parametrize("scale", SCALES, ids=str)
def test_discrete_laplace_vector_matches_exact_pmf_and_rejects_20_percent_off(scale):
    draws = S.discrete_laplace(source(1), scale, size=60_000)
    assert draws.dtype == np.int64
    assert binned_pvalue(draws, dlap_cdf, scale, scale) > 1e-3
    for wrong in (float(scale) * 1.2, float(scale) * 0.8):
        assert binned_pvalue(draws, dlap_cdf, scale, wrong) < 1e-6


@pytest.mark.parametrize("scale", [Fraction(1, 3), Fraction(4), S.dlap_scale(1, 0.3),
                                   Fraction(1 << 12), Fraction((1 << 12) + 1), Fraction(10**5)],
                         ids=str)
def test_dlap_many_matches_exact_pmf_on_both_paths_and_rejects_20_percent_off(scale):
    """dlap_many's table path (scales up to TABLE_MAX_SCALE) and its rejection path (above),
    each against the exact law; in one call of 60,000 and in calls of one draw."""
    from dpq_spark.core.randomness.dlap_table import TABLE_MAX_SCALE, dlap_many, dlap_table

    dlap_table.cache_clear()
    src = source(3)
    draws = np.concatenate([dlap_many(src, scale, 60_000),
                            [dlap_many(src, scale, 1)[0] for _ in range(2_000)]])
    assert draws.dtype == np.int64
    assert (dlap_table.cache_info().currsize == 1) == (scale <= TABLE_MAX_SCALE)
    assert binned_pvalue(draws, dlap_cdf, scale, scale) > 1e-3
    for wrong in (float(scale) * 1.2, float(scale) * 0.8):
        assert binned_pvalue(draws, dlap_cdf, scale, wrong) < 1e-6


@pytest.mark.parametrize("scale", [Fraction(1, 3), Fraction(4), Fraction(1000)], ids=str)
def test_discrete_laplace_scalar_matches_exact_pmf_and_rejects_20_percent_off(scale):
    src = source(2)
    draws = np.array([S.discrete_laplace(src, scale) for _ in range(15_000)])
    assert all(isinstance(int(d), int) for d in draws[:5])
    assert binned_pvalue(draws, dlap_cdf, scale, scale) > 1e-3
    for wrong in (float(scale) * 1.2, float(scale) * 0.8):
        assert binned_pvalue(draws, dlap_cdf, scale, wrong) < 1e-6


def test_discrete_laplace_exact_cell_probabilities_at_small_scale():
    # Scale 1/2: P(0) = (1 - q) / (1 + q), q = e^-2; check each of -3..3 cell by cell.
    draws = S.discrete_laplace(source(3), Fraction(1, 2), size=200_000)
    values = np.arange(-3, 4)
    q = math.exp(-2.0)
    pmf = (1 - q) / (1 + q) * q ** np.abs(values)
    counts = np.array([(draws == v).sum() for v in values])
    tail = draws.size - counts.sum()
    obs = np.append(counts, tail)
    exp = np.append(pmf, 1 - pmf.sum()) * draws.size
    assert stats.chisquare(obs, exp).pvalue > 1e-3


@pytest.mark.parametrize("scale", [Fraction(3), Fraction(7, 2)], ids=str)
def test_geometric_matches_exact_pmf_and_rejects_20_percent_off(scale):
    draws = S.geometric(source(4), scale, size=50_000)
    assert draws.min() >= 0
    assert binned_pvalue(draws, geometric_cdf, scale, scale) > 1e-3
    for wrong in (float(scale) * 1.2, float(scale) * 0.8):
        assert binned_pvalue(draws, geometric_cdf, scale, wrong) < 1e-6
    src = source(5)
    scalar = np.array([S.geometric(src, scale) for _ in range(10_000)])
    assert binned_pvalue(scalar, geometric_cdf, scale, scale) > 1e-3
    assert binned_pvalue(scalar, geometric_cdf, scale, float(scale) * 1.2) < 1e-6


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(5, 2)], ids=str)
def test_bernoulli_exp_frequency_and_power(gamma):
    src = source(6)
    n = 20_000
    hits = sum(S.bernoulli_exp(src, gamma) for _ in range(n))
    assert stats.binomtest(hits, n, math.exp(-float(gamma))).pvalue > 1e-3
    if gamma > 0:
        for wrong in (1.2 * float(gamma), 0.8 * float(gamma)):
            assert stats.binomtest(hits, n, math.exp(-wrong)).pvalue < 1e-6


def test_vector_bernoulli_exp_frequency_and_power():
    num = np.array([0, 1, 2, 3, 4, 5, 6, 7] * 5_000, dtype=np.int64)  # gamma = num / 7
    got = S._bern_exp_le1_array(source(7), num, 7)
    for k in range(8):
        hits, n = int(got[num == k].sum()), int((num == k).sum())
        assert stats.binomtest(hits, n, math.exp(-k / 7)).pvalue > 1e-4
        if k >= 3:
            assert stats.binomtest(hits, n, math.exp(-1.25 * k / 7)).pvalue < 1e-4


def test_bernoulli_rational():
    src = source(8)
    hits = sum(S.bernoulli(src, Fraction(3, 7)) for _ in range(20_000))
    assert stats.binomtest(hits, 20_000, 3 / 7).pvalue > 1e-3
    assert stats.binomtest(hits, 20_000, 3 / 7 * 1.2).pvalue < 1e-6
    assert not any(S.bernoulli(src, Fraction(0)) for _ in range(100))
    assert all(S.bernoulli(src, Fraction(1)) for _ in range(100))


def test_huge_numerator_falls_back_to_exact_scalar_path():
    scale = Fraction(2**61 + 1, 2**20)  # t beyond the vectorised int64 range
    draws = S.discrete_laplace(source(9), scale, size=2_000)
    assert draws.dtype == np.int64
    # |Y| is exponential-ish with mean ~ scale: the median of |Y| is ~ scale * ln 2.
    ratio = np.median(np.abs(draws)) / float(scale)
    assert 0.6 < ratio < 0.8


def test_dlap_scale_rounds_up_with_bounded_denominator():
    for sens, eps in [(1, 1.0), (1, 0.3), (2, 0.1), (1, 1e-7), (1, 1000.0), (3, Fraction(2, 7))]:
        exact = Fraction(sens) / Fraction(eps)
        scale = S.dlap_scale(sens, eps)
        assert scale >= exact
        assert scale - exact <= exact * Fraction(1, 2**S.SCALE_PRECISION_BITS)
        den = scale.denominator
        assert den & (den - 1) == 0  # a power of two
        assert den <= 2**S.SCALE_PRECISION_BITS * max(1, exact.denominator) * 2
        eps_got = S.achieved_epsilon(sens, scale)
        assert Fraction(eps_got) >= Fraction(sens) / scale  # stated epsilon never below the truth
        assert eps_got <= float(eps) * (1 + 1e-15)
    assert S.dlap_scale(1, 1.0) == 1
    assert S.dlap_scale(1, 0.5) == 2
    assert S.dlap_scale(1, 1e-7).denominator == 1


def test_float_scale_is_converted_exactly():
    assert S.as_fraction(0.1) == Fraction(3602879701896397, 36028797018963968)
    assert S.as_fraction(np.float64(2.5)) == Fraction(5, 2)


@pytest.mark.parametrize(
    "scale, error, match",
    [
        (0, ValueError, "`scale` must be finite and > 0, got 0"),
        (-1.5, ValueError, "`scale` must be finite and > 0, got -1.5"),
        (float("inf"), ValueError, "`scale` must be finite and > 0, got inf"),
        (float("nan"), ValueError, "`scale` must be finite and > 0, got nan"),
        (True, TypeError, "`scale` must be a positive rational or float"),
        ("2", TypeError, "`scale` must be a positive rational or float, got str"),
    ],
)
def test_discrete_laplace_iv(scale, error, match):
    with pytest.raises(error, match=match):
        S.discrete_laplace(source(0), scale)


def test_other_iv():
    with pytest.raises(ValueError, match="`size` must be >= 0"):
        S.discrete_laplace(source(0), 1, size=-1)
    with pytest.raises(ValueError, match="`gamma` must be >= 0"):
        S.bernoulli_exp(source(0), Fraction(-1, 2))
    with pytest.raises(ValueError, match="`p` must be a rational number in"):
        S.bernoulli(source(0), Fraction(3, 2))
    with pytest.raises(ValueError, match="`epsilon` must be finite and > 0, got -1.0"):
        S.dlap_scale(1, -1.0)
    with pytest.raises(ValueError, match="`sensitivity` must be finite and > 0, got 0"):
        S.dlap_scale(0, 1.0)


def test_memoised_scales_are_the_computed_ones_and_bad_arguments_are_still_refused():
    """dlap_scale and achieved_epsilon are memoised: a repeated call returns what the function
    computes, a bool equal to a cached int is still refused, and an unhashable argument still
    gets the validation error naming it."""
    for sens, eps in [(1, 0.3), (2, Fraction(1, 7)), (10, 1e-7), (1, 0.3)]:
        assert S.dlap_scale(sens, eps) == S.dlap_scale.__wrapped__(sens, eps)
        scale = S.dlap_scale(sens, eps)
        assert S.achieved_epsilon(sens, scale) == S.achieved_epsilon.__wrapped__(sens, scale)
    assert S.dlap_scale(1, 1.0) == 1
    with pytest.raises(TypeError, match="`sensitivity` must be a positive rational or float"):
        S.dlap_scale(True, 1.0)
    with pytest.raises(TypeError, match="`epsilon` must be a positive rational or float, got list"):
        S.dlap_scale(1, [1.0])
    with pytest.raises(ValueError, match="`epsilon` must be finite and > 0, got -1.0"):
        S.dlap_scale(1, -1.0)  # an exception is not remembered as a result either


# ------------------------------------------------------------------------------ buffered source
def test_buffered_bytes_are_the_stream_in_order_and_never_repeated():
    """Small reads are served from a buffer: the bytes are exactly the generator's stream, in
    order (nothing skipped or served twice), and a large read bypasses the buffer."""
    src = resolve_rng(np.random.default_rng(12))
    got = b"".join(src.bytes(k) for k in [1, 7, 8, 100, 3, 393, 1, 511, 2])
    reference = np.random.default_rng(12).bytes(512 * 3)
    assert got[:512] == reference[:512]  # the first buffer, served piece by piece
    assert len(got) == 1026 and got[512:512 + 511] == reference[512:1023]


def test_a_forked_child_never_replays_the_parents_buffer():
    import os

    src = resolve_rng(None)
    src.bytes(1)  # fill the byte buffer
    src.bits(3)  # fill the bit pool
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.write(write_end, src.bytes(32) + src.bits(256).to_bytes(32, "little"))
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read_end, 64)
    parent = src.bytes(32) + src.bits(256).to_bytes(32, "little")
    assert child[:32] != parent[:32] and child[32:] != parent[32:]


# --------------------------------------------------------------------------------------------
# draw_index: exact draws from float64 weights, by its short-list and general paths


@pytest.mark.parametrize("small", [64, 0])  # 0: the general (numpy) path even for short lists
def test_draw_index_is_exactly_proportional_to_the_weights(monkeypatch, small):
    from dpq_spark.core.randomness import grid

    monkeypatch.setattr(grid, "_SMALL", small)
    log_w = np.log([0.9, 0.55, 0.3, 0.26, 0.05, 0.013, 0.6, 1e-9])
    w = np.exp(log_w - log_w.max())
    source = resolve_rng(np.random.default_rng(31))
    runs = 40_000
    hits = np.bincount([grid.draw_index(log_w, source) for _ in range(runs)], minlength=w.size)
    keep = w / w.sum() * runs >= 5
    expected = w[keep] / w[keep].sum() * hits[keep].sum()
    assert stats.chisquare(hits[keep], expected).pvalue > 1e-4
    # power: without the mantissa acceptance the draw follows the levels only (2**-L per weight)
    levels = 2.0 ** np.floor(np.log2(w))
    wrong = levels[keep] / levels[keep].sum() * hits[keep].sum()
    assert stats.chisquare(hits[keep], wrong).pvalue < 1e-6


@pytest.mark.parametrize("depth", [40, 1])  # 1: every weight below 1/2 takes the deep path
def test_draw_index_rows_is_exactly_proportional_per_row(depth):
    from dpq_spark.core.randomness.grid import draw_index_rows

    with np.errstate(divide="ignore"):  # a zero weight: log 0 = -inf
        rows = np.log(np.array([[0.9, 0.55, 0.3, 0.26, 0.05, 0.013, 0.6, 1e-9],
                                [1e-3, 1.0, 1e-3, 0.2, 0.0, 0.7, 0.05, 0.4]]))
    runs = 20_000
    source = resolve_rng(np.random.default_rng(37))
    draws = draw_index_rows(np.repeat(rows, runs, axis=0), source, depth=depth).reshape(runs, 2, order="F")
    for g in range(2):
        w = np.exp(rows[g] - rows[g].max())
        hits = np.bincount(draws[:, g], minlength=w.size)
        keep = w / w.sum() * runs >= 5
        assert hits[~keep].sum() <= 10
        expected = w[keep] / w[keep].sum() * hits[keep].sum()
        assert stats.chisquare(hits[keep], expected).pvalue > 1e-4
        # power: accepting on the levels alone (2**-L per weight) is rejected
        levels = 2.0 ** np.floor(np.log2(np.maximum(w, 1e-300)))
        wrong = levels[keep] / levels[keep].sum() * hits[keep].sum()
        assert stats.chisquare(hits[keep], wrong).pvalue < 1e-6


def test_levels_from_the_bits_are_frexp_s():
    """The level and 53-bit mantissa read from a weight's bits are frexp's, for 1, normal
    weights, subnormal ones (below 2**-1022) and zero."""
    from dpq_spark.core.randomness.grid import _LEVELS, _levels

    gen = np.random.default_rng(3)
    w = np.concatenate([[1.0, 0.5, 0.0, 5e-324, 2.0**-1022, np.nextafter(2.0**-1022, 0)],
                        np.exp(gen.uniform(-745.0, 0.0, 5000))])
    level, f53 = _levels(w)
    mant, expo = np.frexp(w)
    assert np.array_equal(level, np.where(w > 0, 1 - expo, _LEVELS))
    assert np.array_equal(f53, (mant * 2.0**53).astype(np.int64))
    assert (w < 2.0**-1022).sum() > 50  # the subnormal branch is exercised


@pytest.mark.parametrize("S", [17, 64, 1000])
def test_first_above_halving_finds_the_column_a_whole_row_comparison_finds(S):
    """The halving search of long rows returns the first column above u, with runs of equal
    values (zero-weight cells) and u at the edges of units, as the whole-row comparison does."""
    from dpq_spark.core.randomness.grid import _first_above

    gen = np.random.default_rng(S)
    units = gen.integers(0, 2**40, size=(50, S)) * (gen.random((50, S)) < 0.7)
    units[:, -1] += 1  # every row has mass
    cum = np.cumsum(units, axis=1)
    rows = np.repeat(np.arange(50), 40)
    u = (gen.random(rows.size) * cum[rows, -1]).astype(np.int64)
    u[::4] = cum[rows[::4], gen.integers(0, S - 1, size=rows[::4].size)]  # on a cum value
    u[1::4] = 0
    u[2::4] = cum[rows[2::4], -1] - 1
    u = np.minimum(u, cum[rows, -1] - 1)
    want = (cum[rows] <= u[:, None]).sum(axis=1)
    assert np.array_equal(_first_above(cum, rows, u), want)


@pytest.mark.parametrize("depth, width", [(40, None), (40, 2000), (1, None)])
def test_draw_index_segments_draws_what_padded_rows_draw(depth, width):
    """Segments of mixed lengths (1 to 600 weights, zero weights, one segment far below the
    others' scale) laid end to end draw, seed for seed, the indices draw_index_rows draws on the
    same segments padded with -inf (to ``width`` columns: it sets the proposals per round, 2
    a row at 2,000 instead of 4);
    depth 1 sends most candidates through the deep test."""
    from dpq_spark.core.randomness.grid import draw_index_rows, draw_index_segments

    gen = np.random.default_rng(depth + (width or 0))
    lengths = np.concatenate([[1, 2, 600], gen.integers(1, 400, size=200)])
    log_w = gen.normal(0.0, 8.0, int(lengths.sum()))
    log_w[gen.random(log_w.size) < 0.2] = -np.inf
    starts = np.cumsum(lengths) - lengths
    log_w[starts] = np.maximum(log_w[starts], 0.0)  # every segment has mass
    log_w[starts[5]:starts[5] + lengths[5]] -= 900.0
    pad = np.full((lengths.size, width or int(lengths.max())), -np.inf)
    for g, (a, n) in enumerate(zip(starts, lengths)):
        pad[g, :n] = log_w[a:a + n]
    for seed in range(5):
        got = draw_index_segments(log_w, lengths, resolve_rng(np.random.default_rng(seed)),
                                  width=width, depth=depth)
        want = draw_index_rows(pad, resolve_rng(np.random.default_rng(seed)), depth=depth)
        assert np.array_equal(got, want)
        assert np.all(got < lengths) and np.all(np.isfinite(log_w[starts + got]))


def test_draw_index_segments_refuses_segments_that_do_not_add_up():
    from dpq_spark.core.randomness.grid import draw_index_segments

    source = resolve_rng(np.random.default_rng(0))
    with pytest.raises(ValueError, match="segments"):
        draw_index_segments(np.zeros(5), np.array([2, 2]), source)
    with pytest.raises(ValueError, match="segments"):
        draw_index_segments(np.zeros(4), np.array([4, 0]), source)
    with pytest.raises(ValueError, match="segments"):
        draw_index_segments(np.zeros(4), np.array([4]), source, width=3)


def test_draw_index_rows_deep_weights_are_accepted_in_proportion(monkeypatch):
    """With depth 1 the deep path decides most draws; accepting every deep candidate (envelope
    instead of weight) must fail the same check."""
    from dpq_spark.core.randomness import grid

    log_w = np.log(np.array([[1.0, 0.3, 0.1, 0.02, 0.2]]))
    w = np.exp(log_w[0])
    runs = 20_000
    hits = np.bincount(grid.draw_index_rows(np.repeat(log_w, runs, axis=0),
                                            resolve_rng(np.random.default_rng(41)), depth=1),
                       minlength=w.size)
    assert stats.chisquare(hits, w / w.sum() * runs).pvalue > 1e-4
    envelope = np.array([1.0, 0.5, 0.5, 0.5, 0.5])  # deep weights: one unit of 2**-1 each
    assert stats.chisquare(hits, envelope / envelope.sum() * runs).pvalue < 1e-6


@pytest.mark.parametrize("width, k", [(1, 3), (2, 3), (5, 2), (4, 4)])
def test_uniform_multisets_gives_every_multiset_the_same_probability(width, k):
    from itertools import combinations_with_replacement

    from dpq_spark.core.randomness.grid import uniform_multisets

    every = list(combinations_with_replacement(range(width), k))
    runs = 400 * len(every)
    got = uniform_multisets(resolve_rng(np.random.default_rng(43)), np.full(runs, width), k)
    index = {m: i for i, m in enumerate(every)}
    hits = np.bincount([index[tuple(row)] for row in got.tolist()], minlength=len(every))
    assert hits.sum() == runs
    if len(every) > 1:
        assert stats.chisquare(hits).pvalue > 1e-4
        # power: k independent uniform points, sorted, are not uniform over multisets
        iid = np.sort(np.random.default_rng(44).integers(0, width, (runs, k)), axis=1)
        wrong = np.bincount([index[tuple(row)] for row in iid.tolist()], minlength=len(every))
        assert stats.chisquare(wrong).pvalue < 1e-6


def test_draw_index_short_list_path_makes_the_general_paths_draws():
    from dpq_spark.core.randomness import grid

    gen = np.random.default_rng(2)
    for case in range(300):
        log_w = gen.normal(0, float(gen.choice([1.0, 30.0, 800.0])), int(gen.integers(2, 65)))
        draws = []
        for small in (64, 0):
            grid._SMALL, source = small, resolve_rng(np.random.default_rng(case))
            try:
                draws.append([grid.draw_index(log_w, source) for _ in range(4)])
            finally:
                grid._SMALL = 64
        assert draws[0] == draws[1], case


def test_bit_length_is_exact_at_every_power_of_two():
    """below_array's bit widths: Python's int.bit_length at 0, at 2**k - 1, 2**k, 2**k + 1 for
    every k (where float64 rounding crosses a power), at the top of uint64, and at random."""
    from dpq_spark.core.randomness.source import _bit_length

    edges = [0, 2**64 - 1, 2**64 - 2**10, 2**64 - 2**11 - 1]
    edges += [v for k in range(64) for v in (2**k - 1, 2**k, 2**k + 1) if v < 2**64]
    rng = np.random.default_rng(0)
    spread = rng.integers(0, 2**63, 10_000, dtype=np.uint64) >> rng.integers(0, 63, 10_000).astype(np.uint64)
    v = np.concatenate((np.array(edges, dtype=np.uint64), spread))
    assert _bit_length(v).tolist() == [int(x).bit_length() for x in v.tolist()]


@pytest.mark.parametrize("k", [1, 3, 53, 63])
def test_bits_array_is_uniform_on_its_range(k):
    """bits_array(k, n): the top k bits of uniform words: in [0, 2**k), and uniform (the top
    three bits' eight values, and the low bit, equally often); k outside [0, 63] is refused."""
    source = resolve_rng(np.random.default_rng(11))
    x = source.bits_array(k, 40_000)
    assert x.dtype == np.int64 and x.min() >= 0 and int(x.max()) < 2**k
    top = x >> max(k - 3, 0)
    counts = np.bincount(top, minlength=2 ** min(k, 3))
    assert stats.chisquare(counts).pvalue > 1e-4
    assert abs(np.mean(x & 1) - 0.5) < 0.02
    with pytest.raises(ValueError, match="`k` must be in"):
        source.bits_array(64, 1)
    assert source.bits_array(0, 3).tolist() == [0, 0, 0]


# --------------------------------------------------------------------------------------------
# Counts split uniformly


@pytest.mark.parametrize("count", [1, 7, 63, 64, 65, 200, 5000])
def test_binomial_half_matches_the_binomial_pmf_and_rejects_p_off_by_4_percent(count):
    draws = S.binomial_half(source(count), np.full(40_000, count))
    cdf = lambda y, p: stats.binom.cdf(y, count, p)  # noqa: E731
    assert binned_pvalue(draws, cdf, 0.5, 0.5) > 1e-3
    if count >= 200:  # power: the same draws against Binomial(count, 0.5 +- 0.02)
        for wrong in (0.48, 0.52):
            assert binned_pvalue(draws, cdf, 0.5, wrong) < 1e-6


def test_binomial_half_is_the_same_draws_in_chunks(monkeypatch):
    """Whole words are drawn _WORDS_AT_ONCE at a time from one stream: with chunks of 3 words
    (counts that straddle chunks, zeros between) the seeded draws are the same as in one go."""
    counts = np.array([0, 1000, 64, 0, 130, 3, 777, 0, 64 * 7 + 5])
    whole = S.binomial_half(source(9), counts)
    monkeypatch.setattr(S, "_WORDS_AT_ONCE", 3)
    assert np.array_equal(S.binomial_half(source(9), counts), whole)
    assert np.all((whole >= 0) & (whole <= counts)) and whole[0] == whole[3] == whole[7] == 0


def test_uniform_split_is_the_multinomial_of_independent_rows():
    """3 rows into 4 parts: the 20 compositions at their multinomial probabilities; power: the
    same test rejects rows that move together (one uniform part for all three)."""
    src = source(3)
    runs = 20_000
    got = np.zeros((runs, 4), dtype=np.int64)
    for r in range(runs):
        entry, part, w = S.uniform_split(src, [0, 3], 2)
        assert np.all(entry == 1) and np.all(np.diff(part) > 0) and w.sum() == 3
        got[r, part] = w
    assert composition_pvalue(got, 3, 4) > 1e-3
    together = np.zeros((2000, 4), dtype=np.int64)
    together[np.arange(2000), np.random.default_rng(0).integers(0, 4, 2000)] = 3
    assert composition_pvalue(together, 3, 4) < 1e-6


def test_uniform_split_keeps_every_row_and_order():
    counts = np.array([5, 0, 1, 10_000, 2])
    entry, part, w = S.uniform_split(source(4), counts, 4)
    assert np.array_equal(np.bincount(entry, weights=w, minlength=5), counts)
    assert np.all(w > 0) and np.all((part >= 0) & (part < 16))
    assert np.all(np.diff(entry * 16 + part) > 0)  # sorted by entry, then part; no repeats
    big = part[entry == 3]
    assert big.size == 16 and stats.chisquare(w[entry == 3]).pvalue > 1e-4
    assert S.uniform_split(source(4), [7], 0)[1].tolist() == [0]
    with pytest.raises(ValueError, match="`bits`"):
        S.uniform_split(source(4), [1], 17)
