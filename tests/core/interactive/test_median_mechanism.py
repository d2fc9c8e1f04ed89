"""Tests of the median mechanism and its sparse vector accounting (numpy only, fixed seeds)."""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from scipy import sparse, stats

import dpq_spark.core.interactive.median_mechanism as mm_module
import dpq_spark.core.interactive.sparse_vector as svt_module
from dpq_spark.core.randomness.samplers import discrete_laplace, dlap_scale
from dpq_spark.core.errors import SessionHaltedError
from dpq_spark.core.interactive.median_mechanism import AnswerKind, MedianMechanism
from dpq_spark.core.interactive.sparse_vector import NumericSparse


@pytest.fixture
def noise_scales(monkeypatch):
    """Record the scale of every discrete Laplace draw of the session (the real sampler runs)."""
    scales = []

    def recording(source, scale, size=None):
        scales.append(scale)
        return discrete_laplace(source, scale, size)

    monkeypatch.setattr(svt_module, "discrete_laplace", recording)
    monkeypatch.setattr(mm_module, "discrete_laplace", recording)
    return scales


def dlap_cdf(y, scale):
    """Exact ``P(Y <= y)`` of the discrete Laplace with ``P(y) ∝ exp(-|y| / scale)``."""
    q = math.exp(-1.0 / float(scale))
    y = np.asarray(y, dtype=float)
    return np.where(y >= 0, 1.0 - q ** (y + 1) / (1 + q), q ** (-y) / (1 + q))


class Poison:
    """Stands in for the private histogram: any use of it fails the test."""

    def _fail(self, *args, **kwargs):
        raise AssertionError("the private histogram was read after the halt")

    __array__ = __matmul__ = __rmatmul__ = __getitem__ = __len__ = __iter__ = _fail
    __mul__ = __rmul__ = __float__ = sum = _fail

    def __getattr__(self, name):
        self._fail()


def always_hard(c, *, epsilon=1.0, n=1_000_000, rng=None, after_halt="raise", neighboring="swap"):
    """Truth 0.5 on the query, a single candidate answering 0 on it: every test fires."""
    hist = np.array([n // 2, n - n // 2])
    cand = np.array([[10, 0]])
    return MedianMechanism(
        hist, epsilon=epsilon, accuracy=0.01, max_hard_queries=c, candidates=cand,
        rng=rng if rng is not None else np.random.default_rng(0), after_halt=after_halt,
        neighboring=neighboring,
    )


QUERY = np.array([False, True])


# ------------------------------------------------------------------------------ noise scales
def test_noise_scales_match_formulas_swap():
    eps, c, n = 0.9, 5, 1000
    mm = MedianMechanism(np.full(10, 100), epsilon=eps, accuracy=0.05, max_hard_queries=c,
                         candidate_size=20, rng=np.random.default_rng(1))
    sigma = lambda e: 2 * c * (1 / n) / e  # noqa: E731
    assert mm.n == n
    assert mm.threshold == pytest.approx(0.1)
    assert mm.threshold_noise_scale == pytest.approx(sigma(8 * eps / 9))
    assert mm.test_noise_scale == pytest.approx(2 * sigma(8 * eps / 9))
    assert mm.answer_noise_scale == pytest.approx(sigma(2 * eps / 9))


def test_noise_scales_match_formulas_add_remove():
    eps, c = 2.0, 4
    mm = MedianMechanism(np.full(10, 100), epsilon=eps, accuracy=0.05, max_hard_queries=c,
                         neighboring="add_remove", candidate_size=20, rng=np.random.default_rng(2))
    assert mm.count_epsilon == pytest.approx(0.1 * eps)
    assert mm.n != 1000 or True  # n_hat is noisy; its value is whatever was released
    eps_svt = 0.9 * eps
    assert mm.threshold_noise_scale == pytest.approx(2 * c / mm.n / (8 * eps_svt / 9))
    assert mm.answer_noise_scale == pytest.approx(2 * c / mm.n / (2 * eps_svt / 9))
    assert mm.epsilon_spent == pytest.approx(0.1 * eps)


def test_every_noise_draw_uses_the_formula_scale(noise_scales):
    c, n, k = 3, 1_000_000, 10  # the single candidate database has k = 10 rows
    mm = always_hard(c, n=n)
    # integer units of 1 / (n k): sensitivity k, sigma(e) = 2 c k / e rounded up
    s1 = dlap_scale(2 * c * k, 8 * 1.0 / 9)
    s2 = dlap_scale(2 * c * k, 2 * 1.0 / 9)
    assert s1 >= Fraction(2 * c * k) / Fraction(8 / 9) and s2 >= Fraction(2 * c * k) / Fraction(2 / 9)
    assert noise_scales == [s1]  # the first noisy threshold
    mm.ask(QUERY)  # hard: test noise, answer noise, threshold redraw
    assert noise_scales == [s1, 2 * s1, s2, s1]
    mm.ask(QUERY)
    mm.ask(QUERY)  # the c-th hard answer: no threshold is drawn after it
    assert noise_scales == [s1, 2 * s1, s2, s1, 2 * s1, s2, s1, 2 * s1, s2]
    assert mm.threshold_noise_scale == float(s1 / (n * k))
    assert mm.achieved_epsilon <= 1.0 and mm.achieved_epsilon == pytest.approx(1.0, rel=1e-5)


def test_add_remove_releases_n_with_its_share_first(noise_scales):
    mm = MedianMechanism(np.full(4, 25), epsilon=1.0, accuracy=0.1, max_hard_queries=2,
                         neighboring="add_remove", candidate_size=3, rng=np.random.default_rng(4))
    assert noise_scales[0] == dlap_scale(1, 0.1) == 10
    assert isinstance(mm.n, int) and mm.n >= 1


def test_hard_answer_noise_is_discrete_laplace_with_the_formula_scale():
    c, n, k = 2000, 1_000_000, 10
    mm = always_hard(c, rng=np.random.default_rng(5))
    units = n * k
    values = np.array([mm.ask(QUERY).value for _ in range(c)])
    noise = np.rint(values * units).astype(np.int64) - units // 2  # the integer noise, recovered
    # every value is a point of the 1/(n k) grid: an integer divided by n k, rounded once
    assert all(v == (int(z) + units // 2) / units for v, z in zip(values, noise))
    scale = mm._svt.answer_noise_scale
    assert float(scale) == pytest.approx(9 * c * k / 1.0, rel=1e-5)
    edges = np.unique(np.quantile(noise, np.linspace(0, 1, 21)[1:-1]).astype(np.int64))
    observed = np.bincount(np.searchsorted(edges, noise, side="left"), minlength=edges.size + 1)

    def pvalue(s):
        cdf = np.concatenate([[0.0], dlap_cdf(edges, s), [1.0]])
        return stats.chisquare(observed, np.diff(cdf) * c).pvalue

    assert pvalue(scale) > 1e-3
    for wrong in (0.7, 1.3):
        assert pvalue(float(scale) * wrong) < 1e-6


# ------------------------------------------------------------------------------ halting
def test_halts_exactly_after_c_hard_answers():
    c = 7
    mm = always_hard(c)
    for i in range(c):
        assert not mm.halted
        answer = mm.ask(QUERY)
        assert answer.kind is AnswerKind.HARD
        assert answer.hard_queries_left == c - 1 - i
        assert answer.epsilon_spent == pytest.approx((i + 1) / c)
    assert mm.halted and mm.hard_queries_left == 0
    assert mm.epsilon_spent == pytest.approx(1.0)
    with pytest.raises(SessionHaltedError, match="max_hard_queries=7"):
        mm.ask(QUERY)


def test_after_the_halt_the_histogram_is_never_read():
    mm = always_hard(2, after_halt="candidate_median")
    mm.ask(QUERY)
    mm.ask(QUERY)
    assert mm.halted
    mm._histogram = Poison()
    for _ in range(3):
        answer = mm.ask(QUERY)
        assert answer.kind is AnswerKind.UNVERIFIED
        assert answer.value == 0.0  # the single candidate's answer
        assert answer.epsilon_spent == pytest.approx(1.0)
        assert answer.hard_queries_left == 0
    strict = always_hard(1)
    strict.ask(QUERY)
    strict._histogram = Poison()
    with pytest.raises(SessionHaltedError):
        strict.ask(QUERY)


def test_poison_would_be_noticed_before_the_halt():
    mm = always_hard(2)
    mm._histogram = Poison()
    with pytest.raises(AssertionError, match="histogram was read"):
        mm.ask(QUERY)


# ------------------------------------------------------------------------------ SVT details
def test_threshold_is_redrawn_only_after_an_above_threshold_answer():
    svt = NumericSparse(epsilon=1.0, sensitivity=1000, threshold=500_000, max_above=3,
                        rng=np.random.default_rng(6))
    assert svt.threshold_draws == 1
    before = svt._noisy_threshold
    for _ in range(50):
        assert svt.query(0) is None
    assert svt.threshold_draws == 1 and svt._noisy_threshold == before
    assert isinstance(svt.query(10**7), int)
    assert svt.threshold_draws == 2 and svt._noisy_threshold != before
    assert svt.query(10**7) is not None
    assert svt.query(10**7) is not None
    assert svt.halted and svt.threshold_draws == 3
    with pytest.raises(SessionHaltedError):
        svt.query(0)


def test_epsilon_spent_counts_rounds():
    svt = NumericSparse(epsilon=0.9, sensitivity=1000, threshold=500_000, max_above=3,
                        rng=np.random.default_rng(7))
    assert svt.epsilon_spent == 0.0
    svt.query(0)  # an open round costs its test share
    assert svt.epsilon_spent == pytest.approx(0.8 / 3)
    svt.query(0)
    assert svt.epsilon_spent == pytest.approx(0.8 / 3)
    svt.query(10**7)  # a closed round costs epsilon / c
    assert svt.epsilon_spent == pytest.approx(0.3)


def test_easy_answers_at_huge_epsilon_are_within_threshold():
    rng = np.random.default_rng(8)
    hist = rng.integers(0, 50, size=30)
    mm = MedianMechanism(hist, epsilon=1e6, accuracy=0.02, max_hard_queries=50, candidate_size=200,
                         n_candidates=500, rng=rng)
    idx = np.arange(30)
    for _ in range(100):
        a, b = np.sort(rng.integers(0, 30, size=2))
        mask = (idx >= a) & (idx <= b)
        answer = mm.ask(mask)
        truth = hist[mask].sum() / hist.sum()
        bound = 0.04 + 1e-3 if answer.kind is AnswerKind.EASY else 1e-3
        assert abs(answer.value - truth) <= bound


def test_exact_candidates_are_all_multisets():
    mm = MedianMechanism(np.array([1, 2, 3]), epsilon=1.0, accuracy=0.1, max_hard_queries=2,
                         candidates="exact", candidate_size=2, rng=np.random.default_rng(9))
    counts = mm._candidates.counts.toarray()
    assert counts.shape == (6, 3)
    assert np.all(counts.sum(axis=1) == 2)
    assert len({tuple(r) for r in counts}) == 6
    assert mm.candidate_mode == "exact"


def test_callable_query_and_privacy_independent_of_candidates():
    hist = np.array([5, 5, 5, 5])
    mm = MedianMechanism(hist, epsilon=1.0, accuracy=0.1, max_hard_queries=3, candidate_size=4,
                         n_candidates=10, rng=np.random.default_rng(10))
    answer = mm.ask(lambda idx: idx < 2)
    assert answer.index == 0 and 0.0 <= answer.value <= 1.0
    # the noise scales depend only on epsilon, c and n, never on the candidates (up to the
    # rounding up of the integer-unit scale, below 2**-20 relative, which depends on the public K)
    other = MedianMechanism(hist, epsilon=1.0, accuracy=0.1, max_hard_queries=3,
                            candidates=np.eye(4) * 3, rng=np.random.default_rng(11))
    assert other.test_noise_scale == pytest.approx(mm.test_noise_scale, rel=2**-19)
    assert other.answer_noise_scale == pytest.approx(mm.answer_noise_scale, rel=2**-19)


# ------------------------------------------------------------------------------ repeated workload
def test_repeating_a_workload_makes_hard_queries_vanish():
    rng = np.random.default_rng(12)
    d, n = 100, 200_000
    x = np.clip(rng.normal(40, 12, size=n), 0, d - 1).astype(int)
    hist = np.bincount(x, minlength=d)
    idx = np.arange(d)
    workload = []
    for i in range(300):
        a, b = np.sort(rng.integers(0, d, size=2))
        workload.append(idx <= b if i % 2 else (idx >= a) & (idx <= b))
    mm = MedianMechanism(hist, epsilon=1.0, accuracy=0.01, max_hard_queries=100, candidate_size=500,
                         n_candidates=500, rng=np.random.default_rng(13))
    hard = []
    for _ in range(2):
        hard.append(sum(mm.ask(q).kind is AnswerKind.HARD for q in workload))
    assert hard[0] >= 10
    assert hard[1] <= hard[0] // 4


# ------------------------------------------------------------------------------ privacy tests
class NoTestNoise(NumericSparse):
    """Broken: the test compares the exact query value with the noisy threshold."""

    def _test_noise(self):
        return 0


class ThresholdRedrawnPerQuery(NumericSparse):
    """Broken: a fresh noisy threshold for every test, not only after an above-threshold answer."""

    def query(self, value):
        self._noisy_threshold = self._draw_threshold()
        return super().query(value)


def tail_events(counts, length):
    """Add the events "no hard answer before position j": unions of transcripts, so DP bounds them too."""
    events = dict(counts)
    for j in range(1, length + 1):
        events[("no hard before", j)] = sum(v for key, v in counts.items() if key[0] == "none" or key[0] >= j)
    return events


def max_log_ratio_lower_bound(counts_a, counts_b, runs, alpha=1e-3):
    """Largest lower confidence bound on ``|log P_D(S) - log P_D'(S)|`` over the events ``S``.

    Clopper-Pearson intervals, Bonferroni over the events and both directions (family level
    ``alpha``). A mechanism that is epsilon-DP exceeds epsilon with probability at most alpha.
    """
    keys = sorted(set(counts_a) | set(counts_b), key=str)
    level = alpha / (2 * len(keys))
    worst = -np.inf
    for key in keys:
        a, b = counts_a.get(key, 0), counts_b.get(key, 0)
        lo_a = stats.beta.ppf(level, a, runs - a + 1) if a > 0 else 0.0
        hi_a = stats.beta.ppf(1 - level, a + 1, runs - a) if a < runs else 1.0
        lo_b = stats.beta.ppf(level, b, runs - b + 1) if b > 0 else 0.0
        hi_b = stats.beta.ppf(1 - level, b + 1, runs - b) if b < runs else 1.0
        with np.errstate(divide="ignore"):
            worst = max(worst, np.log(lo_a) - np.log(hi_b), np.log(lo_b) - np.log(hi_a))
    return worst


# Whole sessions of the median mechanism. Two neighbouring datasets over X = {0, 1, 2} (swap: one
# row moves from 0 to 1), one public candidate database, and a workload of fourteen queries
# A = [x == 1] then B = [x == 0]. Under D the tests see g_A = T - Delta and g_B = T; under D'
# the shifts are reversed. The transcript is the position of the hard answer (if any) and a coarse
# bin of its value; easy answers are the candidate's fixed answers. Without test noise,
# "easy A ... then hard B" needs T_hat in (g_A, g_B]: likely under D, impossible under D'.
MM_EPS = 3.0
HIST_D = np.array([40, 40, 20])
HIST_D_PRIME = np.array([39, 41, 20])
CANDIDATE = sparse.csr_array(np.array([[200.0, 210.0, 590.0]]))
WORKLOAD = [np.array([False, True, False])] * 14 + [np.array([True, False, False])]


def session_transcripts(hist, runs, rng):
    counts = Counter()
    for _ in range(runs):
        mech = MedianMechanism(hist, epsilon=MM_EPS, accuracy=0.1, max_hard_queries=1,
                               candidates=CANDIDATE, rng=rng)
        transcript = ("none",)
        for query in WORKLOAD:
            answer = mech.ask(query)
            if answer.kind is AnswerKind.HARD:
                transcript = (answer.index, int(np.searchsorted([0.3, 0.4, 0.5], answer.value)))
                break
        counts[transcript] += 1
    return tail_events(counts, len(WORKLOAD))


@pytest.mark.slow
@pytest.mark.parametrize(
    "variant, runs, private",
    [(NumericSparse, 5_000, True), (NoTestNoise, 3_000, False)],
    ids=["correct", "no-test-noise"],
)
def test_session_transcripts_stay_within_e_epsilon(monkeypatch, variant, runs, private):
    monkeypatch.setattr(mm_module, "NumericSparse", variant)
    counts_d = session_transcripts(HIST_D, runs, np.random.default_rng(100))
    counts_d_prime = session_transcripts(HIST_D_PRIME, runs, np.random.default_rng(101))
    bound = max_log_ratio_lower_bound(counts_d, counts_d_prime, runs)
    assert bool(bound <= MM_EPS) == private


# The same test on the sparse vector stream, the only part that reads data (OnlineIC touches D
# only through it), with enough runs to expose the threshold redrawn per test: its leak is slow
# (each easy answer leaks a little), so the workload is 22 near-threshold queries moving in the
# same direction and then one moving the other way, at epsilon = 4 where 150,000 runs resolve it.
# Integer queries (units of 1/5): sensitivity 5, values -7 and -2 (i.e. -1.4 and -0.4).
SVT_EPS = 4.0
SVT_SENSITIVITY = 5
SVT_VALUES_D = [-7] * 22 + [-2]
SVT_VALUES_D_PRIME = [-2] * 22 + [-7]


def stream_transcripts(values, runs, rng, variant):
    counts = Counter()
    for _ in range(runs):
        svt = variant(epsilon=SVT_EPS, sensitivity=SVT_SENSITIVITY, threshold=0, max_above=1, rng=rng)
        transcript = ("none",)
        for i, value in enumerate(values):
            out = svt.query(value)
            if out is not None:
                transcript = (i, int(out > value))
                break
        counts[transcript] += 1
    return tail_events(counts, len(values))


@pytest.mark.slow
@pytest.mark.parametrize(
    "variant, runs, private",
    [(NumericSparse, 150_000, True), (NoTestNoise, 20_000, False), (ThresholdRedrawnPerQuery, 150_000, False)],
    ids=["correct", "no-test-noise", "threshold-redrawn-per-test"],
)
def test_sparse_vector_transcripts_stay_within_e_epsilon(variant, runs, private):
    counts_d = stream_transcripts(SVT_VALUES_D, runs, np.random.default_rng(200), variant)
    counts_d_prime = stream_transcripts(SVT_VALUES_D_PRIME, runs, np.random.default_rng(201), variant)
    bound = max_log_ratio_lower_bound(counts_d, counts_d_prime, runs)
    assert bool(bound <= SVT_EPS) == private


# ------------------------------------------------------------------------------ validation
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"epsilon": -1.0}, ValueError, r"`epsilon` must be finite and > 0, got -1.0"),
        ({"accuracy": 1.5}, ValueError, r"`accuracy` must be in \(0, 1\), got 1.5"),
        ({"max_hard_queries": 0}, ValueError, r"`max_hard_queries` must be >= 1, got 0"),
        ({"neighboring": "replace"}, ValueError, r"`neighboring` must be one of"),
        ({"candidates": "all"}, ValueError, r"`candidates` must be one of"),
        ({"candidates": np.ones((2, 5))}, ValueError, r"`candidates` must have shape \(N >= 1, 4\)"),
        ({"candidates": np.array([[1, 0, 0, 0], [2, 0, 0, 0]])}, ValueError, r"common, positive size"),
        ({"candidate_size": 0}, ValueError, r"`candidate_size` must be >= 1"),
        ({"n_candidates": 1.5}, TypeError, r"`n_candidates` must be an integer"),
        ({"prior": [1, 2]}, ValueError, r"`prior` must have shape \(4,\)"),
        ({"prior": [1, -1, 0, 0]}, ValueError, r"`prior` must hold finite, non-negative"),
        ({"refill_below": 1.0}, ValueError, r"`refill_below` must be in \[0, 1\)"),
        ({"after_halt": "ignore"}, ValueError, r"`after_halt` must be one of"),
        ({"rng": 42}, TypeError, r"`rng` must be a numpy.random.Generator"),
        ({"candidates": "exact", "candidate_size": 400}, ValueError, r"at most 1e6 databases"),
    ],
)
def test_argument_validation(kwargs, error, match):
    args = {"epsilon": 1.0, "accuracy": 0.1, "max_hard_queries": 3, "candidate_size": 5,
            "n_candidates": 10, "rng": np.random.default_rng(0)}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        MedianMechanism(np.array([1, 2, 3, 4]), **args)


def test_histogram_validation_never_echoes_counts():
    with pytest.raises(ValueError, match="`histogram` must be non-negative") as info:
        MedianMechanism(np.array([5, -12345]), epsilon=1.0, accuracy=0.1, max_hard_queries=1)
    assert "12345" not in str(info.value)
    with pytest.raises(ValueError, match="`histogram` must be a non-empty 1-d array"):
        MedianMechanism(np.ones((2, 2)), epsilon=1.0, accuracy=0.1, max_hard_queries=1)
    with pytest.raises(ValueError, match="at least one row under swap"):
        MedianMechanism(np.zeros(3), epsilon=1.0, accuracy=0.1, max_hard_queries=1, candidate_size=2)


def test_query_validation():
    mm = MedianMechanism(np.array([1, 2, 3]), epsilon=1.0, accuracy=0.1, max_hard_queries=1,
                         candidate_size=2, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"`query` must be a mask of shape \(3,\), got \(2,\)"):
        mm.ask([True, False])
    with pytest.raises(ValueError, match=r"`query` must hold booleans \(or 0/1\)"):
        mm.ask([0.5, 1, 0])
    assert mm.queries_answered == 0 and mm.epsilon_spent == 0.0
