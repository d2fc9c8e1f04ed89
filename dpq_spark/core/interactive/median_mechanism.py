"""The median mechanism: an interactive session of counting queries over a histogram.

An analyst asks counting queries (predicates over a public finite domain ``X``) one at a time.
The session keeps a public set of candidate databases; a query on which the candidates' median
is already close to the truth is *easy* and answered from public state, the others are *hard* and
answered with discrete Laplace noise on integer counts (sampled exactly, no floating point).
Only the easy/hard tests and the hard answers touch the private histogram, and all of them go
through :class:`~dpq_spark.core.interactive.sparse_vector.NumericSparse`.

References
----------
A. Roth and T. Roughgarden, "Interactive Privacy via the Median Mechanism", STOC 2010.
C. Dwork and A. Roth, *The Algorithmic Foundations of Differential Privacy*, 2014, Algorithm 3
(NumericSparse), Algorithm 11 (OnlineIC), Theorems 3.27, 5.13 and 5.14.
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from scipy import sparse

from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.core.randomness.samplers import achieved_epsilon, discrete_laplace, dlap_scale
from dpq_spark.core._validation import _is_real, check_counts, check_epsilon, check_positive_int
from dpq_spark.core.errors import SessionHaltedError
from dpq_spark.core.interactive.median_state import (
    MedianState, RecordedAnswer, decode_mask, encode_mask,
)
from dpq_spark.core.interactive.planner import plan_median_session
from dpq_spark.core.accounting.neighboring import NeighboringRelation
from dpq_spark.core.interactive.sparse_vector import NumericSparse

__all__ = ["AnswerKind", "MedianAnswer", "MedianMechanism"]

#: Share of epsilon that releases the row count first under add/remove neighbours.
COUNT_SHARE = 0.1
_AFTER_HALT = ("raise", "candidate_median")
_CANDIDATE_MODES = ("auto", "exact", "sampled")


class AnswerKind(str, enum.Enum):
    """How an answer was produced.

    ``EASY``: the candidates' median, which passed the noisy test (no data access beyond the test).
    ``HARD``: the true answer plus discrete Laplace noise (in units of ``1 / (n K)``).
    ``UNVERIFIED``: the candidates' median after the session halted; no test ran, nothing about
    the data is known about its accuracy.
    """

    EASY = "easy"
    HARD = "hard"
    UNVERIFIED = "unverified"


@dataclass(frozen=True)
class MedianAnswer:
    """One answer of a median-mechanism session.

    Attributes
    ----------
    value : float
        The released fraction of rows satisfying the query, in ``[0, 1]``.
    kind : AnswerKind
        ``"easy"``, ``"hard"`` or ``"unverified"``.
    epsilon_spent : float
        Privacy loss of the session's transcript so far, this answer included (at most the
        session's epsilon).
    hard_queries_left : int
        Hard answers left before the session halts.
    index : int
        0-based position of the query in the session.
    """

    value: float
    kind: AnswerKind
    epsilon_spent: float
    hard_queries_left: int
    index: int

    @property
    def is_easy(self) -> bool:
        """True for an easy answer (the candidates' median, verified by the noisy test)."""
        return self.kind is AnswerKind.EASY


class _Candidates:
    """Public candidate databases of ``size`` rows each, stored as a sparse count matrix."""

    def __init__(self, counts: sparse.csr_array, size: int):
        self.counts = counts
        self.size = size
        self._last_answers: np.ndarray | None = None

    def __len__(self) -> int:
        return self.counts.shape[0]

    def answers(self, mask: np.ndarray) -> np.ndarray:
        out = self.counts @ mask
        out /= self.size
        return out

    def keep(self, rows: np.ndarray) -> None:
        self.counts = self.counts[rows]

    def add(self, other: sparse.csr_array) -> None:
        self.counts = sparse.vstack([self.counts, other], format="csr")


def _lower_median(values: np.ndarray) -> float:
    k = (values.shape[0] - 1) // 2
    return float(np.partition(values, k)[k])


def _counts_from_indices(indices: np.ndarray, domain_size: int) -> sparse.csr_array:
    """Row ``r`` lists the ``size`` domain indices of candidate ``r`` (repeats allowed).

    Stored as CSR with one unit entry per row of the candidate database, so that a query's
    answers over all candidates are one sparse matrix-vector product (repeated column indices
    add up, no sorting needed).
    """
    rows, size = indices.shape
    itype = np.int32 if rows * size < 2**31 and domain_size < 2**31 else np.int64
    data = np.ones(rows * size, dtype=np.float64)
    indptr = np.arange(0, rows * size + 1, size, dtype=itype)
    return sparse.csr_array((data, indices.ravel().astype(itype), indptr), shape=(rows, domain_size))


def _exact_candidates(domain_size: int, size: int) -> sparse.csr_array:
    combos = np.fromiter(
        itertools.chain.from_iterable(itertools.combinations_with_replacement(range(domain_size), size)),
        dtype=np.int64,
    ).reshape(-1, size)
    return _counts_from_indices(combos, domain_size)


def _sample_candidates(prior: np.ndarray, size: int, count: int, rng: np.random.Generator) -> sparse.csr_array:
    """``count`` databases of ``size`` i.i.d. rows from ``prior``.

    Draws the total multiplicities of all ``count * size`` rows (multinomial) and shuffles them
    into databases: the same distribution as i.i.d. draws, without a per-draw search.
    """
    totals = rng.multinomial(count * size, prior)
    indices = np.repeat(np.arange(prior.shape[0], dtype=np.int32), totals)
    rng.shuffle(indices)
    return _counts_from_indices(indices.reshape(count, size), prior.shape[0])


class _PublicFit:
    """A distribution over X fitted to the released hard answers, for refilling the candidates.

    Starts at the public prior and projects, constraint by constraint, onto
    ``{P : P(mask_j) = answer_j}`` (iterative proportional fitting, i.e. the maximum-entropy
    distribution relative to the prior that matches the released answers). It reads only the
    prior and released answers: public information.
    """

    def __init__(self, prior: np.ndarray, passes: int = 2):
        self.p = prior.copy()
        self.passes = passes
        self.masks: list[np.ndarray] = []
        self.targets: list[float] = []

    def add(self, mask: np.ndarray, answer: float) -> None:
        self.masks.append(mask)
        self.targets.append(min(max(answer, 1e-9), 1.0 - 1e-9))
        for _ in range(self.passes):
            for m, a in zip(self.masks, self.targets):
                inside = float(self.p[m].sum())
                if not 0.0 < inside < 1.0:
                    continue
                self.p[m] *= a / inside
                self.p[~m] *= (1.0 - a) / (1.0 - inside)
        self.p /= self.p.sum()


def _check_histogram(histogram) -> np.ndarray:
    try:
        raw = np.asarray(histogram)
    except (TypeError, ValueError):
        raise TypeError("`histogram` must be an array-like of non-negative integers") from None
    if raw.ndim != 1 or raw.shape[0] < 1:
        raise ValueError(f"`histogram` must be a non-empty 1-d array, got shape {raw.shape}")
    return check_counts(raw, raw.shape[0], "histogram").astype(np.float64)


def _check_prior(prior, domain_size: int) -> np.ndarray:
    if prior is None:
        return np.full(domain_size, 1.0 / domain_size)
    try:
        p = np.asarray(prior, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError("`prior` must be an array-like of non-negative weights") from None
    if p.shape != (domain_size,):
        raise ValueError(f"`prior` must have shape ({domain_size},), got {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
        raise ValueError("`prior` must hold finite, non-negative weights with a positive sum")
    return p / p.sum()


def _check_fraction(value, name: str, *, low_open: bool = True) -> float:
    if not _is_real(value) or not math.isfinite(float(value)):
        raise ValueError(f"`{name}` must be a finite real number, got {value!r}")
    v = float(value)
    if not (0.0 < v < 1.0 if low_open else 0.0 <= v < 1.0):
        raise ValueError(f"`{name}` must be in {'(0, 1)' if low_open else '[0, 1)'}, got {value!r}")
    return v


class MedianMechanism:
    """Interactive counting queries over a private histogram, answered by the median mechanism.

    Parameters
    ----------
    histogram : array-like of int, shape (d,)
        Private row counts over a public finite domain ``X = {0, ..., d - 1}``.
    epsilon : float
        Privacy budget of the whole session, finite and > 0.
    accuracy : float, optional
        ``alpha`` in (0, 1), for experts (or pass ``expected_queries``): a query is easy when the candidates' median is (by a noisy test)
        within ``T = 2 alpha`` of the true fraction; after a hard answer the candidates farther
        than ``alpha`` from it are dropped.
    max_hard_queries : int, optional
        ``c``, for experts (or pass ``expected_queries``): the session halts after ``c`` hard
        answers. It fixes the noise scales, so it is chosen before the session starts.
    neighboring : {"swap", "add_remove"}, optional
        ``"swap"`` (default): ``n`` is public and each answer is a fraction of ``n`` rows.
        ``"add_remove"``: ``n_hat = max(1, n + DLap(1 / (0.1 epsilon)))`` (discrete Laplace, exact)
        is released first; answers are counts divided by ``n_hat``.
    candidates : {"auto", "exact", "sampled"} or array-like of shape (N, d), optional
        ``"exact"``: all size-``candidate_size`` databases over ``X`` (multisets).
        ``"sampled"``: ``n_candidates`` databases of ``candidate_size`` rows drawn from ``prior``,
        refilled after hard answers (see Notes). ``"auto"`` (default) is exact when that set has
        at most ``n_candidates`` members. An array gives public candidate databases as row
        counts (equal row sums); it is not refilled.
    candidate_size : int, optional
        Rows per candidate database, default 1000. Easy answers are multiples of
        ``1 / candidate_size``.
    n_candidates : int, optional
        Target number of sampled candidates, default 2000.
    prior : array-like of shape (d,), optional
        Public weights the candidates are sampled from; uniform by default.
    refill_below : float, optional
        Refill the sampled candidates when fewer than ``refill_below * n_candidates`` survive a
        hard answer, default 0.5.
    after_halt : {"raise", "candidate_median"}, optional
        After ``c`` hard answers: raise :class:`SessionHaltedError` (default), or answer with the
        candidates' median marked ``"unverified"`` at no privacy cost.
    rng : numpy.random.Generator, RandomSource or None, optional
        Source of randomness; ``None`` (production) is the OS cryptographic generator. A seeded
        generator is for tests and reproducible experiments only.
    expected_queries : int, optional
        Plan the session instead of passing ``accuracy`` and ``max_hard_queries``:
        :func:`~dpq_spark.core.interactive.planner.plan_median_session` chooses both from ``|X|``, ``n``
        (public under swap; under add/remove ``n_hint`` or the released ``n_hat``), ``epsilon``
        and this number. The plan is :attr:`plan` (print it); it reads no data.
    target_accuracy : float, optional
        Desired accuracy for the planner (see :func:`~dpq_spark.core.interactive.planner.plan_median_session`).
    n_hint : float, optional
        Public guess of the row count for the planner under add/remove neighbours.
    resume : MedianState, optional
        Continue a session from its public state (:meth:`state`, taken in this or another
        process) instead of starting one. The other arguments must be those the session was
        started with, and ``histogram`` the same data. The candidates are rebuilt by replaying
        the hard answers from the stored public seed; the released row count is reused (never
        drawn again); the sparse vector draws a fresh threshold, and if the lost one had been
        used (``state.round_open``) its round is forfeited: one hard answer fewer, no extra
        privacy loss.

    Raises
    ------
    ValueError, TypeError
        If an argument breaks its rule; nothing is sampled or spent.

    Notes
    -----
    Integer units. With ``K`` rows per candidate database and ``L = n K`` (``n`` the public or
    released row count, an integer), the true answer ``count / n`` is the integer ``count * K``
    in units of ``1 / L`` and a candidate median ``c_m / K`` is the integer ``c_m * n``; so every
    test value below is an integer with sensitivity ``K`` (one row changes ``count`` by at most 1),
    the noise is discrete Laplace sampled exactly on the integers, and a hard answer is the
    released fraction ``(count * K + noise) / L`` (clipped to ``[0, 1]``), computed from the noisy
    integer afterwards. The threshold ``2 alpha`` becomes ``ceil(2 alpha L)``. The scales below
    are in fraction units (divide the integer scales by ``L``).

    This is Dwork and Roth's OnlineIC (Algorithm 11) with the candidates' median as the current
    hypothesis, driving NumericSparse (Algorithm 3, ``delta = 0``) with budget
    ``epsilon_svt = epsilon`` (swap) or ``0.9 epsilon`` (add/remove) and sensitivity
    ``Delta = 1 / n`` (swap) or ``1 / n_hat`` (add/remove). With ``epsilon_1 = 8 epsilon_svt / 9``,
    ``epsilon_2 = 2 epsilon_svt / 9`` and ``sigma(e) = 2 c Delta / e``, for each query ``f`` with
    candidate median ``m``:

    1. test ``g_1 = f(D) - m``, then (if it did not fire) ``g_2 = m - f(D)``; a test fires when
       ``g + DLap(2 sigma(epsilon_1)) >= T_hat``, where ``T_hat = 2 alpha + DLap(sigma(epsilon_1))``
       is redrawn only after a hard answer;
    2. no test fires: answer ``m`` (easy); a test fires: answer ``f(D) + DLap(sigma(epsilon_2))``
       (hard), clipped to ``[0, 1]``, then drop the candidates farther than ``alpha`` from it;
    3. after ``c`` hard answers, halt.

    Accounting: each of the ``c`` rounds of tests is an AboveThreshold instance costing
    ``epsilon_1 / c`` however many tests it runs, and each hard answer (scale
    ``sigma(epsilon_2) = 9 c Delta / epsilon_svt``) costs ``epsilon_svt / (9 c)``, so the session
    costs ``epsilon_1 + epsilon_2 / 2 = epsilon_svt`` (Theorem 3.27). :attr:`epsilon_spent`
    reports ``count_epsilon + h epsilon_svt / c`` after ``h`` hard answers, plus
    ``epsilon_1 / c`` once a test of the next round has run; it reaches ``epsilon`` at the halt.

    Refill (sampled candidates only): every hard answer is also recorded in a public
    distribution over ``X``, the maximum-entropy distribution relative to ``prior`` matching the
    released hard answers (fitted by iterative proportional fitting). When fewer than
    ``refill_below * n_candidates`` candidates survive a hard answer, fresh candidates drawn from
    that distribution top the set up to ``n_candidates``. If no candidate survives (exact or
    given candidates), the ones closest to the hard answer are kept.

    Accuracy (Dwork and Roth, Theorem 5.14): with ``k`` queries, every answer is within
    ``3 alpha`` of the truth with probability ``>= 1 - beta`` when
    ``alpha >= 9 c (ln(2k) + ln(4c / beta)) / (epsilon n)``, as long as the session has not halted.
    The median mechanism's original constants (Roth and Roughgarden 2010) need astronomically
    large ``n``; they are not used.

    Privacy
    -------
    ``epsilon``-DP (pure) for the whole session, however many queries are asked and however
    they are chosen (adaptively), under the chosen neighbouring relation with one row of the
    histogram as the unit of privacy. Swap treats ``n`` as public. Add/remove spends
    ``0.1 epsilon`` on ``n_hat`` and ``0.9 epsilon`` on NumericSparse (Theorem 3.27, with Theorem
    5.13 for the session). Every noise scale is rounded *up* to a rational, so the epsilon actually
    achieved (:attr:`achieved_epsilon`) is at most ``epsilon`` (by a relative ``2**-20`` at most).
    All noise is discrete Laplace sampled exactly from the random source's bits, and every
    released hard answer is a fixed function of a noisy integer, so the guarantee is not undone by
    floating point (Mironov 2012). The candidates, the prior and the refill use only public information
    and released answers, so privacy never depends on them; only accuracy does. After the halt
    the histogram is never read again.

    Examples
    --------
    >>> import numpy as np
    >>> hist = np.array([300, 500, 200])
    >>> mm = MedianMechanism(hist, epsilon=1.0, accuracy=0.05, max_hard_queries=5,
    ...                      candidate_size=20, rng=np.random.default_rng(0))
    >>> answer = mm.ask(np.array([True, True, False]))
    >>> answer.kind in ("easy", "hard"), 0.0 <= answer.value <= 1.0
    (True, True)
    """

    def __init__(
        self,
        histogram,
        *,
        epsilon,
        accuracy=None,
        max_hard_queries=None,
        neighboring="swap",
        candidates="auto",
        candidate_size=1000,
        n_candidates=2000,
        prior=None,
        refill_below=0.5,
        after_halt="raise",
        rng=None,
        expected_queries=None,
        target_accuracy=None,
        n_hint=None,
        resume=None,
    ):
        # Validate every argument before touching the data or drawing noise.
        hist = _check_histogram(histogram)
        if resume is not None:
            if not isinstance(resume, MedianState):
                raise TypeError(f"`resume` must be a MedianState, got {type(resume).__name__}")
            if resume.domain_size != hist.shape[0]:
                raise ValueError(f"`resume` is a session over {resume.domain_size} domain points, "
                                 f"not {hist.shape[0]}")
        options = self.check_options(
            hist.shape[0], epsilon=epsilon, accuracy=accuracy, max_hard_queries=max_hard_queries,
            neighboring=neighboring, candidates=candidates, candidate_size=candidate_size,
            n_candidates=n_candidates, prior=prior, refill_below=refill_below, after_halt=after_halt,
            expected_queries=expected_queries, target_accuracy=target_accuracy, n_hint=n_hint,
        )
        self.domain_size = d = hist.shape[0]
        self.epsilon = options["epsilon"]
        self.accuracy = options["accuracy"]
        self.max_hard_queries = options["max_hard_queries"]
        self.neighboring = options["neighboring"]
        self.candidate_size = options["candidate_size"]
        self.n_candidates = options["n_candidates"]
        self.refill_below = options["refill_below"]
        self.after_halt = options["after_halt"]
        self.candidate_mode = mode = options["mode"]
        self._prior = options["prior"]
        given = options["given"]
        self._rng = resolve_rng(rng)
        # Candidate databases are public (prior and released answers only): a numpy generator
        # seeded from the source draws them; it never touches noise. Its seed is public state.
        self.public_seed = (int.from_bytes(self._rng.bytes(32), "little") if resume is None
                            else resume.public_seed)
        self._public_rng = np.random.default_rng(self.public_seed)

        # Public candidates (no data involved).
        if mode == "exact":
            self._candidates = _Candidates(_exact_candidates(d, self.candidate_size), self.candidate_size)
        elif mode == "sampled":
            self._candidates = _Candidates(
                _sample_candidates(self._prior, self.candidate_size, self.n_candidates, self._public_rng),
                self.candidate_size,
            )
        else:
            self._candidates = _Candidates(given[0], given[1])
        self._fit = _PublicFit(self._prior) if mode == "sampled" else None

        # The data enters here: n (public under swap, released with discrete Laplace noise
        # otherwise). Counts are whole numbers below 2**53 (check_counts), so int() is exact.
        n_true = int(hist.sum())
        if self.neighboring is NeighboringRelation.SWAP:
            if n_true < 1:
                raise ValueError("`histogram` must count at least one row under swap neighbours")
            self.count_epsilon = 0.0
            self.count_noise_scale = None
            self.n = n_true
        else:
            self.count_epsilon = COUNT_SHARE * self.epsilon
            self.count_noise_scale = dlap_scale(1, self.count_epsilon)
            if resume is None:
                self.n = max(1, n_true + discrete_laplace(self._rng, self.count_noise_scale))
            elif resume.n_released is None or resume.n_released < 1:
                raise ValueError("`resume` holds no released row count (add_remove needs one)")
            else:
                self.n = resume.n_released  # released before: never drawn again
        self.plan = None
        if options["expected_queries"] is not None:
            # planned session (dpq_spark.core.interactive.planner): public inputs only, before any query
            n_plan = self.n
            if self.neighboring is not NeighboringRelation.SWAP and options["n_hint"] is not None:
                n_plan = options["n_hint"]
            self.plan = plan_median_session(
                d, n_plan, epsilon=self.epsilon,
                expected_queries=options["expected_queries"], target_accuracy=target_accuracy,
                neighboring=self.neighboring,
            )
            self.accuracy = self.plan.accuracy
            self.max_hard_queries = self.plan.max_hard_queries
        if resume is not None:  # the parameters the session ran with (its noise scales)
            self.accuracy = resume.accuracy
            self.max_hard_queries = resume.max_hard_queries
        self._histogram = hist
        self._units = self.n * self._candidates.size  # L: answers are integers in units of 1/L
        self._svt = NumericSparse(
            epsilon=self.epsilon - self.count_epsilon,
            sensitivity=self._candidates.size,
            threshold=2 * Fraction(self.accuracy) * self._units,
            max_above=self.max_hard_queries,
            rng=self._rng,
        )
        self.queries_answered = 0
        self._hard: list[tuple[str, float]] = []  # (encoded mask, value) of each hard answer
        self._answers: list[RecordedAnswer] = []
        if resume is not None:
            self._replay(resume)

    def _replay(self, state: MedianState) -> None:
        """Rebuild the public state of a resumed session (no private data is read)."""
        for text, value in state.hard:
            mask = decode_mask(text, self.domain_size)
            maskf = mask.astype(np.float64)
            cand = (self._candidates.counts @ maskf) / self._candidates.size
            self._update(mask, cand, value)
            self._hard.append((text, value))
        self._svt.resume(above_count=len(state.hard), forfeited_rounds=state.forfeited_rounds,
                         round_open=state.round_open)
        self._answers = list(state.answers)
        self.queries_answered = len(state.answers)

    def state(self) -> MedianState:
        """The session's public state now, to resume it later (:class:`MedianState`)."""
        released = None if self.neighboring is NeighboringRelation.SWAP else self.n
        return MedianState(
            public_seed=self.public_seed, accuracy=self.accuracy,
            max_hard_queries=self.max_hard_queries, domain_size=self.domain_size,
            n_released=released, hard=tuple(self._hard), answers=tuple(self._answers),
            forfeited_rounds=self._svt.forfeited_rounds, round_open=self._svt.round_open)

    @property
    def round_open(self) -> bool:
        """True once a test of the current round has run: a state taken now forfeits that
        round when it is resumed. The next query opens a round when this is False."""
        return self._svt.round_open

    @property
    def forfeited_rounds(self) -> int:
        """Rounds ended without a hard answer by resumes (each costs one hard answer)."""
        return self._svt.forfeited_rounds

    @classmethod
    def check_options(
        cls,
        domain_size: int,
        *,
        epsilon,
        accuracy,
        max_hard_queries,
        neighboring="swap",
        candidates="auto",
        candidate_size=1000,
        n_candidates=2000,
        prior=None,
        refill_below=0.5,
        after_halt="raise",
        expected_queries=None,
        target_accuracy=None,
        n_hint=None,
    ) -> dict:
        """Validate the public arguments for a domain of ``domain_size`` points; return them parsed.

        Used by the constructor and by callers (the Spark session) that must fail before they
        read any data. Raises ``ValueError``/``TypeError`` naming the argument.
        """
        d = check_positive_int(domain_size, "domain_size")
        planned = expected_queries is not None
        if planned and (accuracy is not None or max_hard_queries is not None):
            raise ValueError(
                "pass either `expected_queries` (planned session) or `accuracy` and "
                "`max_hard_queries`, not both"
            )
        if not planned and (target_accuracy is not None or n_hint is not None):
            raise ValueError("`target_accuracy` and `n_hint` need `expected_queries`")
        out = {
            "epsilon": check_epsilon(epsilon),
            "accuracy": None if planned else _check_fraction(accuracy, "accuracy"),
            "max_hard_queries": None if planned else check_positive_int(max_hard_queries, "max_hard_queries"),
            "neighboring": NeighboringRelation.parse(neighboring),
            "candidate_size": check_positive_int(candidate_size, "candidate_size"),
            "n_candidates": check_positive_int(n_candidates, "n_candidates"),
            "refill_below": _check_fraction(refill_below, "refill_below", low_open=False),
        }
        if not isinstance(after_halt, str) or after_halt not in _AFTER_HALT:
            raise ValueError(f"`after_halt` must be one of {_AFTER_HALT}, got {after_halt!r}")
        out["after_halt"] = after_halt
        out["expected_queries"] = out["n_hint"] = None
        if planned:
            out["expected_queries"] = check_positive_int(expected_queries, "expected_queries")
            if n_hint is not None and (not _is_real(n_hint) or not math.isfinite(float(n_hint))
                                       or float(n_hint) < 1):
                raise ValueError(f"`n_hint` must be a finite number >= 1, got {n_hint!r}")
            out["n_hint"] = None if n_hint is None else float(n_hint)
            # a plan for a huge n checks target_accuracy and the other public inputs (no data)
            plan_median_session(d, 1e12, epsilon=out["epsilon"],
                                expected_queries=out["expected_queries"],
                                target_accuracy=target_accuracy, neighboring=out["neighboring"])
        out["prior"] = _check_prior(prior, d)
        k = out["candidate_size"]
        given = None
        if isinstance(candidates, str):
            if candidates not in _CANDIDATE_MODES:
                raise ValueError(
                    f"`candidates` must be one of {_CANDIDATE_MODES} or a 2-d count array, got {candidates!r}"
                )
            mode = candidates
            if mode == "auto":
                mode = "exact" if math.comb(d + k - 1, k) <= out["n_candidates"] else "sampled"
        else:
            given = cls._check_given_candidates(candidates, d)
            mode = "given"
        if mode == "exact" and math.comb(d + k - 1, k) > 1_000_000:
            raise ValueError(
                "`candidates`='exact' needs at most 1e6 databases; got domain size "
                f"{d} and candidate_size {k}: use 'sampled'"
            )
        out["mode"], out["given"] = mode, given
        return out

    @staticmethod
    def _check_given_candidates(candidates, d):
        if isinstance(candidates, sparse.csr_array) and candidates.dtype == np.float64:
            counts = candidates  # never modified in place: updates build new matrices
        elif sparse.issparse(candidates):
            counts = sparse.csr_array(candidates, dtype=np.float64)
        else:
            try:
                arr = np.asarray(candidates, dtype=np.float64)
            except (TypeError, ValueError):
                raise TypeError("`candidates` must be a mode string or a 2-d array of counts") from None
            if arr.ndim != 2:
                raise ValueError(f"`candidates` must be 2-d (databases x domain), got shape {arr.shape}")
            counts = sparse.csr_array(arr)
        if counts.shape[1] != d or counts.shape[0] < 1:
            raise ValueError(f"`candidates` must have shape (N >= 1, {d}), got {counts.shape}")
        data = counts.data
        if not np.all(np.isfinite(data)) or np.any(data < 0) or np.any(data != np.floor(data)):
            raise ValueError("`candidates` must hold non-negative whole counts")
        sizes = np.bincount(np.repeat(np.arange(counts.shape[0]), np.diff(counts.indptr)),
                            weights=data, minlength=counts.shape[0])
        if sizes[0] < 1 or np.any(sizes != sizes[0]):
            raise ValueError("`candidates` must be databases of one common, positive size")
        return counts, int(sizes[0])

    # ----------------------------------------------------------------------------------------
    @property
    def halted(self) -> bool:
        """True once ``max_hard_queries`` hard answers have been given."""
        return self._svt.halted

    @property
    def hard_queries_left(self) -> int:
        """Hard answers left before the session halts."""
        return self._svt.above_left

    @property
    def hard_queries(self) -> int:
        """Hard answers given so far."""
        return self._svt.above_count

    @property
    def epsilon_spent(self) -> float:
        """Privacy loss of the transcript so far; reaches ``epsilon`` at the halt."""
        return min(self.count_epsilon + self._svt.epsilon_spent, self.epsilon)

    @property
    def achieved_epsilon(self) -> float:
        """The epsilon the rounded-up noise scales actually give (``<= epsilon``)."""
        count = 0.0 if self.count_noise_scale is None else achieved_epsilon(1, self.count_noise_scale)
        return count + self._svt.achieved_epsilon

    @property
    def threshold(self) -> float:
        """The public threshold ``T = 2 * accuracy``."""
        return 2.0 * self.accuracy

    @property
    def threshold_noise_scale(self) -> float:
        """Discrete Laplace scale of the noisy threshold, ``sigma(epsilon_1)``, in fraction units."""
        return float(self._svt.threshold_noise_scale / self._units)

    @property
    def test_noise_scale(self) -> float:
        """Discrete Laplace scale of the noise added to each test, ``2 sigma(epsilon_1)``, in
        fraction units."""
        return float(self._svt.test_noise_scale / self._units)

    @property
    def answer_noise_scale(self) -> float:
        """Discrete Laplace scale of the noise on hard answers, ``sigma(epsilon_2)``, in fraction
        units."""
        return float(self._svt.answer_noise_scale / self._units)

    @property
    def n_current_candidates(self) -> int:
        """How many candidate databases the public state holds now."""
        return len(self._candidates)

    # ----------------------------------------------------------------------------------------
    def as_mask(self, query) -> np.ndarray:
        """Turn a query (boolean mask, 0/1 array or callable over domain indices) into a mask.

        Raises
        ------
        ValueError, TypeError
            If the query is not a predicate over the ``d`` domain points.
        """
        if callable(query):
            query = query(np.arange(self.domain_size))
        try:
            raw = np.asarray(query)
        except (TypeError, ValueError):
            raise TypeError("`query` must be a boolean mask over the domain or a callable") from None
        if raw.shape != (self.domain_size,):
            raise ValueError(f"`query` must be a mask of shape ({self.domain_size},), got {raw.shape}")
        if raw.dtype == bool:
            return raw
        if raw.dtype.kind in "iuf" and np.all((raw == 0) | (raw == 1)):
            return raw.astype(bool)
        raise ValueError("`query` must hold booleans (or 0/1)")

    def ask(self, query) -> MedianAnswer:
        """Answer one counting query: the fraction of rows whose domain point satisfies it.

        Parameters
        ----------
        query : array-like of bool, shape (d,), or callable
            A predicate over the domain: a mask, or a function of the domain indices
            ``numpy.arange(d)`` returning one.

        Returns
        -------
        MedianAnswer
            The value and how it was obtained, with the budget state after it.

        Raises
        ------
        SessionHaltedError
            If the session has halted and ``after_halt="raise"``.
        ValueError, TypeError
            If ``query`` is not a predicate over the domain (nothing is read or spent).

        Privacy
        -------
        Part of the session's ``epsilon``-DP guarantee (see the class); a single query adds no
        budget beyond it.
        """
        mask = self.as_mask(query)
        index = self.queries_answered
        if self.halted:
            if self.after_halt == "raise":
                raise SessionHaltedError(
                    f"the session has given all max_hard_queries={self.max_hard_queries} hard "
                    "answers and answers no more; start a session with a new budget, or pass "
                    "after_halt='candidate_median' for unverified answers"
                )
            value = _lower_median(self._candidates.answers(mask.astype(np.float64)))
            return self._answered(MedianAnswer(value, AnswerKind.UNVERIFIED, self.epsilon_spent,
                                               0, index))

        maskf = mask.astype(np.float64)
        cand_counts = self._candidates.counts @ maskf  # whole numbers (public)
        cand = cand_counts / self._candidates.size
        median_count = int(_lower_median(cand_counts))
        median = median_count / self._candidates.size
        # In units of 1/L (L = n K): the candidates' median and the true answer as integers.
        median_units = median_count * self.n
        # the only private read (a masked sum: a BLAS dot can stall on busy multi-threaded hosts)
        true_units = int(self._histogram[mask].sum()) * self._candidates.size
        above = self._svt.query(true_units - median_units)
        if above is not None:
            noisy_units = median_units + above
        else:
            above = self._svt.query(median_units - true_units)
            noisy_units = None if above is None else median_units - above
        if noisy_units is None:
            return self._answered(MedianAnswer(median, AnswerKind.EASY, self.epsilon_spent,
                                               self.hard_queries_left, index))
        value = min(max(noisy_units, 0), self._units) / self._units  # exact int / int, rounded once
        self._update(mask, cand, value)
        self._hard.append((encode_mask(mask), value))
        return self._answered(MedianAnswer(value, AnswerKind.HARD, self.epsilon_spent,
                                           self.hard_queries_left, index))

    def _answered(self, answer: MedianAnswer) -> MedianAnswer:
        self.queries_answered += 1
        self._answers.append(RecordedAnswer(answer.index, answer.value, answer.kind.value))
        return answer

    def _update(self, mask: np.ndarray, cand: np.ndarray, value: float) -> None:
        """Public update after a hard answer: filter, record, refill (no private data)."""
        distance = np.abs(cand - value)
        keep = distance <= self.accuracy
        if not keep.any():
            keep = distance <= distance.min()
        if not keep.all():
            self._candidates.keep(np.flatnonzero(keep))
        if self._fit is None:
            return
        self._fit.add(mask, value)
        missing = self.n_candidates - len(self._candidates)
        if len(self._candidates) < self.refill_below * self.n_candidates and missing > 0:
            fresh = _sample_candidates(self._fit.p, self.candidate_size, missing, self._public_rng)
            self._candidates.add(fresh)
