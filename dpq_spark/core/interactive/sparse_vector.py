"""The sparse vector technique with numeric answers (NumericSparse, pure epsilon-DP).

This is the only part of the median mechanism that looks at private data: every test and every
numeric answer goes through :class:`NumericSparse`, so the privacy guarantee does not depend on how
the caller chooses its queries (the candidate databases of the median mechanism, for instance).

The queries are integer-valued with an integer sensitivity, and every noise is discrete Laplace
sampled exactly (:mod:`dpq_spark.core.randomness.samplers`): callers put fractions in integer units (the
median mechanism multiplies by the public denominator ``n * candidate_size``) and compute fractions
from the noisy integers afterwards. Then every output is attainable under every dataset, and no
float rounding can tell neighbours apart (Mironov, CCS 2012).

References
----------
C. Dwork and A. Roth, *The Algorithmic Foundations of Differential Privacy*, 2014, Section 3.6:
Algorithm 2 (Sparse), Algorithm 3 (NumericSparse) and Theorem 3.27.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction

from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.core.randomness.samplers import achieved_epsilon, discrete_laplace, dlap_scale
from dpq_spark.core._validation import _is_real, check_epsilon, check_positive_int
from dpq_spark.core.errors import SessionHaltedError

__all__ = ["NumericSparse", "TEST_SHARE", "ANSWER_SHARE"]

#: Share of epsilon that parameterises the noisy threshold tests (Dwork and Roth's epsilon_1).
TEST_SHARE = 8.0 / 9.0
#: Share of epsilon that parameterises the numeric answers (Dwork and Roth's epsilon_2).
ANSWER_SHARE = 2.0 / 9.0


class NumericSparse:
    """Answer a stream of integer queries: ``None`` while below a noisy threshold, a noisy integer
    above it.

    Parameters
    ----------
    epsilon : float
        Privacy budget of the whole stream, finite and > 0.
    sensitivity : int
        Sensitivity ``Delta`` (a positive integer) of every query passed to :meth:`query`.
    threshold : real number
        The public threshold ``T`` (any finite real, e.g. a ``Fraction``; only ``ceil(T)`` matters
        since the noisy query values are integers).
    max_above : int
        The cap ``c`` on above-threshold answers; the stream halts after the ``c``-th one.
    rng : numpy.random.Generator, RandomSource or None, optional
        Source of randomness; ``None`` (production) is the OS cryptographic generator, a seeded
        generator is for tests only.

    Raises
    ------
    ValueError, TypeError
        If an argument breaks its rule (nothing is sampled).

    Notes
    -----
    Dwork and Roth's Algorithm 3 with ``delta = 0`` on the integers:

    - ``epsilon_1 = 8 epsilon / 9`` (tests), ``epsilon_2 = 2 epsilon / 9`` (numeric answers);
    - scales ``b_1 = dlap_scale(2 c Delta, epsilon_1)`` and ``b_2 = dlap_scale(2 c Delta,
      epsilon_2)``, i.e. ``sigma(e) = 2 c Delta / e`` rounded *up* to a rational (relative excess
      below ``2**-20``);
    - noisy threshold ``T_hat = ceil(T) + DLap(b_1)``, drawn at the start and redrawn only after
      each above-threshold answer;
    - query ``g`` (an integer): it is above when ``g + DLap(2 b_1) >= T_hat``; then the answer is
      ``g + DLap(b_2)``, otherwise ``None``;
    - after ``c`` above-threshold answers the stream halts.

    Why the proof of Theorem 3.27 holds with discrete Laplace and integer queries: the proof of
    AboveThreshold (Dwork and Roth, Theorem 3.23) couples the runs on neighbours ``D`` and ``D'``
    by shifting the threshold noise by ``Delta`` and the noise of the one above-threshold query by
    ``2 Delta``, and uses only (i) monotonicity (if ``g(D) + nu < T_hat`` then ``g(D') + nu <
    T_hat + Delta``) and (ii) that shifting a noise by ``k`` changes its density by at most
    ``exp(k / b)``. With integer queries, an integer ``Delta`` and noise on the integers, the
    shifts map integers to integers one-to-one, and the discrete Laplace pmf satisfies
    ``P(y) <= exp(k / b) P(y + k)`` for every integer ``y`` and ``k``, so each step holds with sums
    in place of integrals. The numeric answers are discrete Laplace releases of an integer query of
    sensitivity ``Delta``. Rounding the scales up only lowers each part's epsilon:
    :attr:`achieved_epsilon` is ``epsilon_1' + epsilon_2' / 2 <= epsilon`` with
    ``epsilon_i' = 2 c Delta / b_i``.

    Each of the ``c`` rounds (the tests up to and including one above-threshold answer) costs
    ``epsilon_1 / c`` for any number of tests, and each numeric answer ``epsilon_2 / (2 c)``; after
    ``h`` above-threshold answers the privacy loss so far is at most ``h epsilon / c``, plus
    ``epsilon_1 / c`` once a test of the next round has run: that is :attr:`epsilon_spent`.

    A round may also end without an above-threshold answer (:meth:`forfeit_round`), when its
    noisy threshold is lost (a session resumed in another process: the threshold is a secret and
    is never stored). The next round draws a fresh threshold; the forfeited one counts as one of
    the ``c`` rounds, at the full ``epsilon / c`` (its tests, and an answer that may have been
    drawn and never released), so the stream's loss stays at most ``epsilon``.

    Privacy
    -------
    ``epsilon``-DP (pure) for the whole, adaptively chosen stream of any length, provided every
    query is an integer with sensitivity at most ``sensitivity`` under the neighbouring relation of
    the caller and ``threshold``, ``max_above`` and the queries depend only on public information
    and on earlier outputs of this object. Exact: the noise is sampled on the integers from uniform
    bits, with no floating-point step.
    """

    def __init__(self, *, epsilon, sensitivity, threshold, max_above, rng=None):
        self.epsilon = check_epsilon(epsilon)
        if isinstance(sensitivity, bool) or not isinstance(sensitivity, numbers.Integral) or sensitivity < 1:
            raise ValueError(f"`sensitivity` must be an integer >= 1, got {sensitivity!r}")
        self.sensitivity = int(sensitivity)
        if not _is_real(threshold) or not math.isfinite(float(threshold)):
            raise ValueError(f"`threshold` must be a finite real number, got {threshold!r}")
        exact_threshold = threshold if isinstance(threshold, numbers.Rational) else float(threshold)
        self.threshold = Fraction(exact_threshold)
        self.max_above = check_positive_int(max_above, "max_above")
        self._rng = resolve_rng(rng)
        c, delta = self.max_above, self.sensitivity
        self.test_epsilon = TEST_SHARE * self.epsilon
        self.answer_epsilon = ANSWER_SHARE * self.epsilon
        self.threshold_noise_scale = dlap_scale(2 * c * delta, self.test_epsilon)
        self.test_noise_scale = 2 * self.threshold_noise_scale
        self.answer_noise_scale = dlap_scale(2 * c * delta, self.answer_epsilon)
        self.achieved_epsilon = (achieved_epsilon(2 * c * delta, self.threshold_noise_scale)
                                 + achieved_epsilon(2 * c * delta, self.answer_noise_scale) / 2)
        self._threshold_int = math.ceil(self.threshold)
        self.above_count = 0
        self.forfeited_rounds = 0
        self.threshold_draws = 0
        self._round_open = False
        self._noisy_threshold = self._draw_threshold()

    def _draw_threshold(self) -> int:
        self.threshold_draws += 1
        return self._threshold_int + discrete_laplace(self._rng, self.threshold_noise_scale)

    def _test_noise(self) -> int:
        return discrete_laplace(self._rng, self.test_noise_scale)

    def _answer_noise(self) -> int:
        return discrete_laplace(self._rng, self.answer_noise_scale)

    @property
    def rounds_used(self) -> int:
        """Rounds ended so far: above-threshold answers and forfeited rounds."""
        return self.above_count + self.forfeited_rounds

    @property
    def halted(self) -> bool:
        """True once ``max_above`` rounds have ended (above-threshold answers or forfeits)."""
        return self.rounds_used >= self.max_above

    @property
    def above_left(self) -> int:
        """How many above-threshold answers are left before the stream halts."""
        return self.max_above - self.rounds_used

    @property
    def round_open(self) -> bool:
        """True once a test of the current round has run (its threshold has been used)."""
        return self._round_open

    @property
    def epsilon_spent(self) -> float:
        """Upper bound on the privacy loss of the outputs so far (at most ``epsilon``)."""
        spent = self.rounds_used * self.epsilon / self.max_above
        if self._round_open:
            spent += self.test_epsilon / self.max_above
        return min(spent, self.epsilon)

    def resume(self, *, above_count: int, forfeited_rounds: int, round_open: bool) -> None:
        """Continue a stream another object ran, from its public counters, before any query.

        ``round_open``: the other object had run a test of its current round, whose threshold
        is lost; that round is forfeited (:meth:`forfeit_round`). This object's threshold, drawn
        when it was made, starts the next round.

        Raises
        ------
        ValueError
            A counter is negative or the counters exceed ``max_above``; or a query has run.
        """
        for name, value in (("above_count", above_count), ("forfeited_rounds", forfeited_rounds)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"`{name}` must be an integer >= 0, got {value!r}")
        if above_count + forfeited_rounds > self.max_above:
            raise ValueError("`above_count` + `forfeited_rounds` exceed `max_above`")
        if self.rounds_used or self._round_open:
            raise ValueError("a stream can be resumed only before its first query")
        self.above_count = int(above_count)
        self.forfeited_rounds = int(forfeited_rounds)
        if round_open and not self.halted:
            self.forfeited_rounds += 1  # the threshold drawn at construction is still unused

    def forfeit_round(self) -> None:
        """End the current round without an above-threshold answer; the next one draws a fresh
        threshold. It counts as one of the ``max_above`` rounds (see the class notes)."""
        if self.halted:
            raise SessionHaltedError("the sparse vector stream has halted")
        self.forfeited_rounds += 1
        self._round_open = False
        if not self.halted:
            self._noisy_threshold = self._draw_threshold()

    def query(self, value: int) -> int | None:
        """Test one integer query value; return ``None`` (below) or ``value`` plus noise (above).

        Parameters
        ----------
        value : int
            The query evaluated on the private data (sensitivity at most ``sensitivity``).

        Returns
        -------
        int or None
            ``None`` when the noisy value stays below the noisy threshold, otherwise
            ``value + DLap(b_2)``.

        Raises
        ------
        SessionHaltedError
            If the stream has already given ``max_above`` above-threshold answers.
        TypeError
            If ``value`` is not an integer (nothing is drawn).
        """
        if self.halted:
            raise SessionHaltedError(
                f"the sparse vector stream has given all max_above={self.max_above} "
                "above-threshold answers and answers no more"
            )
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"`value` must be an integer, got {type(value).__name__}")
        value = int(value)
        self._round_open = True
        if value + self._test_noise() < self._noisy_threshold:
            return None
        answer = value + self._answer_noise()
        self.above_count += 1
        self._round_open = False
        if not self.halted:
            self._noisy_threshold = self._draw_threshold()
        return answer
