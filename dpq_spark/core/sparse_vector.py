"""The sparse vector technique with numeric answers (NumericSparse, pure epsilon-DP).

This is the only part of the median mechanism that looks at private data: every test and every
numeric answer goes through :class:`NumericSparse`, so the privacy guarantee does not depend on how
the caller chooses its queries (the candidate databases of the median mechanism, for instance).

References
----------
C. Dwork and A. Roth, *The Algorithmic Foundations of Differential Privacy*, 2014, Section 3.6:
Algorithm 2 (Sparse), Algorithm 3 (NumericSparse) and Theorem 3.27.
"""

from __future__ import annotations

import math

import numpy as np

from dpq_spark.core._random import resolve_rng
from dpq_spark.core._validation import _is_real, check_epsilon, check_positive_int
from dpq_spark.core.errors import SessionHaltedError

__all__ = ["NumericSparse", "TEST_SHARE", "ANSWER_SHARE"]

#: Share of epsilon that parameterises the noisy threshold tests (Dwork and Roth's epsilon_1).
TEST_SHARE = 8.0 / 9.0
#: Share of epsilon that parameterises the numeric answers (Dwork and Roth's epsilon_2).
ANSWER_SHARE = 2.0 / 9.0


class NumericSparse:
    """Answer a stream of queries: ``None`` while below a noisy threshold, a noisy value above it.

    Parameters
    ----------
    epsilon : float
        Privacy budget of the whole stream, finite and > 0.
    sensitivity : float
        Sensitivity ``Delta`` of every query that will be passed to :meth:`query`, finite and > 0.
    threshold : float
        The public threshold ``T``.
    max_above : int
        The cap ``c`` on above-threshold answers; the stream halts after the ``c``-th one.
    rng : numpy.random.Generator or None, optional
        Source of randomness; ``None`` draws fresh OS entropy.

    Raises
    ------
    ValueError, TypeError
        If an argument breaks its rule (nothing is sampled).

    Notes
    -----
    Dwork and Roth's Algorithm 3 with ``delta = 0``:

    - ``epsilon_1 = 8 epsilon / 9`` (tests), ``epsilon_2 = 2 epsilon / 9`` (numeric answers),
      ``sigma(e) = 2 c Delta / e``;
    - noisy threshold ``T_hat = T + Lap(sigma(epsilon_1))``, drawn at the start and redrawn only
      after each above-threshold answer;
    - query ``g``: it is above when ``g + Lap(2 sigma(epsilon_1)) >= T_hat``; then the answer is
      ``g + Lap(sigma(epsilon_2))``, otherwise ``None``;
    - after ``c`` above-threshold answers the stream halts.

    Each of the ``c`` rounds (the tests up to and including one above-threshold answer) is an
    AboveThreshold instance that is ``epsilon_1 / c``-DP for any number of tests (threshold noise
    ``2 Delta / (epsilon_1 / c)``, test noise ``4 Delta / (epsilon_1 / c)``), and each numeric
    answer is a Laplace release with scale ``Delta / (epsilon / (9 c))``. By composition the stream
    is ``epsilon_1 + epsilon_2 / 2 = epsilon``-DP (Theorem 3.27), and after ``h`` above-threshold
    answers the privacy loss so far is at most ``h epsilon / c``, plus ``epsilon_1 / c`` once a test
    of the next round has run: that is :attr:`epsilon_spent`.

    Privacy
    -------
    ``epsilon``-DP (pure) for the whole, adaptively chosen stream of any length, provided every
    query has sensitivity at most ``sensitivity`` under the neighbouring relation of the caller and
    ``threshold``, ``max_above`` and the queries depend only on public information and on earlier
    outputs of this object.
    """

    def __init__(self, *, epsilon, sensitivity, threshold, max_above, rng=None):
        self.epsilon = check_epsilon(epsilon)
        self.sensitivity = check_epsilon(sensitivity, "sensitivity")
        if not _is_real(threshold) or not math.isfinite(float(threshold)):
            raise ValueError(f"`threshold` must be a finite real number, got {threshold!r}")
        self.threshold = float(threshold)
        self.max_above = check_positive_int(max_above, "max_above")
        self._rng = resolve_rng(rng)
        c, delta = self.max_above, self.sensitivity
        self.test_epsilon = TEST_SHARE * self.epsilon
        self.answer_epsilon = ANSWER_SHARE * self.epsilon
        self.threshold_noise_scale = 2.0 * c * delta / self.test_epsilon
        self.test_noise_scale = 2.0 * self.threshold_noise_scale
        self.answer_noise_scale = 2.0 * c * delta / self.answer_epsilon
        self.above_count = 0
        self.threshold_draws = 0
        self._round_open = False
        self._noisy_threshold = self._draw_threshold()

    def _draw_threshold(self) -> float:
        self.threshold_draws += 1
        return self.threshold + float(self._rng.laplace(0.0, self.threshold_noise_scale))

    @property
    def halted(self) -> bool:
        """True once ``max_above`` above-threshold answers have been given."""
        return self.above_count >= self.max_above

    @property
    def above_left(self) -> int:
        """How many above-threshold answers are left before the stream halts."""
        return self.max_above - self.above_count

    @property
    def epsilon_spent(self) -> float:
        """Upper bound on the privacy loss of the outputs so far (at most ``epsilon``)."""
        spent = self.above_count * self.epsilon / self.max_above
        if self._round_open:
            spent += self.test_epsilon / self.max_above
        return min(spent, self.epsilon)

    def query(self, value: float) -> float | None:
        """Test one query value; return ``None`` (below) or ``value`` plus Laplace noise (above).

        Parameters
        ----------
        value : float
            The query evaluated on the private data (sensitivity at most ``sensitivity``).

        Returns
        -------
        float or None
            ``None`` when the noisy value stays below the noisy threshold, otherwise
            ``value + Lap(sigma(epsilon_2))``.

        Raises
        ------
        SessionHaltedError
            If the stream has already given ``max_above`` above-threshold answers.
        """
        if self.halted:
            raise SessionHaltedError(
                f"the sparse vector stream has given all max_above={self.max_above} "
                "above-threshold answers and answers no more"
            )
        self._round_open = True
        if value + self._rng.laplace(0.0, self.test_noise_scale) < self._noisy_threshold:
            return None
        answer = float(value + self._rng.laplace(0.0, self.answer_noise_scale))
        self.above_count += 1
        self._round_open = False
        if not self.halted:
            self._noisy_threshold = self._draw_threshold()
        return answer
