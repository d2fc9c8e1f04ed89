"""A data-independent planner for median-mechanism sessions.

The median mechanism (:class:`~dpq_spark.core.interactive.median_mechanism.MedianMechanism`) needs two
numbers before the first query: the accuracy ``alpha`` (easy answers are verified to within
``T = 2 alpha``) and the cap ``c`` on hard answers. Both fix the noise scales, and a bad pair either
wastes accuracy or ends the session early. :func:`plan_median_session` chooses them from public
quantities only: the domain size ``|X|``, the row count ``n`` (public under swap neighbours, a
public hint or an already released noisy count otherwise), ``epsilon`` and the number of queries
the analyst expects. It never reads the data, so it costs no privacy.

How the plan is made
--------------------
Hard answers come from two sources.

1. **Learning**: a query on which the candidates' median is really wrong. Each such answer at
   least halves the consistent candidate set (the candidates farther than ``alpha`` from the noisy
   answer are dropped), so over exact candidate databases of ``s`` rows there are at most
   ``s log2 |X|`` of them (ALGORITHMS.md section 4). That worst case is far too large to budget
   for (``s`` must be about ``ln(k) / alpha**2``); the planner budgets
   ``learn_per_bit * log2 |X|`` learning answers instead (default 16 per bit of the domain, taken
   from the three workloads of ``benchmarks/bench_planned_sessions.py`` with a margin: at 10,000
   queries 1-D CDF and ranges used about 4 per bit, 2-D rectangles and categorical x numeric
   predicates about 10). The plan reports ``log2 |X|`` so that
   the analyst can compare it with the halving bound for a given candidate size.
2. **Noise**: a query whose median is within ``alpha`` of the truth still fires a test when the
   test noise minus the threshold noise exceeds ``alpha``. With ``Z_t ~ Lap(2 s1)`` and
   ``Z_T ~ Lap(s1)`` (``s1 = sigma(epsilon_1) = 9 c Delta / (4 epsilon_svt)``),
   ``P(Z_t - Z_T >= a) = (4 exp(-a / (2 s1)) - exp(-a / s1)) / 6``. Over ``k`` queries (two tests
   each) the expected number of such fires is at most ``2 k P``; the planner keeps it at most
   ``noise_share * c`` (default a quarter).

So ``c = ceil(c_learn / (1 - noise_share))`` and ``alpha`` is the smallest value meeting the noise
condition for that ``c`` (or the target accuracy, if larger). The plan also states Dwork and Roth's
Theorem 5.14 guarantee for these parameters: every answer before the halt is within
``3 alpha_thm`` with probability at least ``1 - beta``, where
``alpha_thm = max(alpha, 9 c (ln(2k) + ln(4c / beta)) / (epsilon_svt n))``.

The learning allowance is a budget, not a guarantee: a workload that needs more hard answers than
planned (many more query shapes than ranges and rectangles, or a very rough distribution) can
still halt. The plan is printed before any query so the analyst sees this trade-off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpq_spark.core._validation import _is_real, check_epsilon, check_positive_int
from dpq_spark.core.accounting.neighboring import NeighboringRelation

__all__ = ["Plan", "plan_median_session", "noise_fire_probability"]

#: Share of epsilon that the median mechanism spends on the row count under add/remove neighbours.
_COUNT_SHARE = 0.1


@dataclass(frozen=True)
class Plan:
    """A median-mechanism session plan (public; printing it reveals nothing about the data).

    Attributes
    ----------
    accuracy : float
        ``alpha``: the session's easy answers are verified to within ``2 alpha``.
    max_hard_queries : int
        ``c``: the session halts after ``c`` hard answers.
    expected_queries : int
        The number of queries the plan is made for.
    learning_hard_queries : int
        Hard answers budgeted for learning the data (``c_learn``).
    expected_noise_fires : float
        Upper bound on the expected number of hard answers caused by noise alone over
        ``expected_queries`` queries.
    halving_bound_per_row : float
        ``log2 |X|``: the candidate-halving bound on learning hard answers per row of a candidate
        database.
    guaranteed_error : float
        ``3 alpha_thm``: Theorem 5.14's bound on every answer's error before the halt, holding
        with probability ``1 - beta``.
    beta : float
        Failure probability of ``guaranteed_error``.
    test_noise_scale, answer_noise_scale : float
        Laplace scales of each test and of each hard answer (fractions of ``n``).
    laplace_mean_error : float
        Mean absolute error of the alternative, Laplace noise on each of the ``expected_queries``
        queries at the same total epsilon: ``k / (epsilon n)``.
    meets_target : bool or None
        Whether ``accuracy`` is at most the requested target (None without a target).
    n, epsilon, domain_size, neighboring
        The public inputs of the plan.
    """

    accuracy: float
    max_hard_queries: int
    expected_queries: int
    learning_hard_queries: int
    expected_noise_fires: float
    halving_bound_per_row: float
    guaranteed_error: float
    beta: float
    test_noise_scale: float
    answer_noise_scale: float
    laplace_mean_error: float
    meets_target: bool | None
    n: float
    epsilon: float
    domain_size: int
    neighboring: NeighboringRelation

    def __str__(self) -> str:
        lines = [
            "median-mechanism session plan (public inputs only; no data read)",
            f"  domain |X| = {self.domain_size}, n = {self.n:g}, epsilon = {self.epsilon:g} "
            f"({self.neighboring.value}), expected queries = {self.expected_queries}",
            f"  accuracy alpha = {self.accuracy:.4g}  (easy answers verified to within "
            f"T = {2 * self.accuracy:.4g})",
            f"  max_hard_queries c = {self.max_hard_queries}  ({self.learning_hard_queries} for "
            f"learning + room for <= {self.expected_noise_fires:.1f} expected noise fires)",
            f"  noise scales: each test {self.test_noise_scale:.3g}, each hard answer "
            f"{self.answer_noise_scale:.3g}",
            f"  Theorem 5.14: every answer before a halt within {self.guaranteed_error:.3g} "
            f"with probability >= {1 - self.beta:g}",
            f"  Laplace per query at the same epsilon: mean error {self.laplace_mean_error:.3g}",
        ]
        if self.meets_target is not None:
            lines.append(f"  target accuracy met: {'yes' if self.meets_target else 'NO'}")
        return "\n".join(lines)


def noise_fire_probability(alpha: float, threshold_scale: float) -> float:
    """``P(Z_t - Z_T >= alpha)`` for ``Z_t ~ Lap(2 s)``, ``Z_T ~ Lap(s)``, ``s = threshold_scale``.

    The probability that one test fires on a query whose candidate median is within ``alpha`` of
    the truth (so ``g <= alpha`` and ``T - g >= alpha``).
    """
    s = float(threshold_scale)
    a = float(alpha)
    if a <= 0:
        return 1.0
    return (4.0 * math.exp(-a / (2.0 * s)) - math.exp(-a / s)) / 6.0


def _check_share(value, name: str) -> float:
    if not _is_real(value) or not math.isfinite(float(value)) or not 0.0 < float(value) < 1.0:
        raise ValueError(f"`{name}` must be in (0, 1), got {value!r}")
    return float(value)


def plan_median_session(
    domain_size,
    n,
    *,
    epsilon,
    expected_queries,
    target_accuracy=None,
    neighboring="swap",
    beta=0.05,
    learn_per_bit=16.0,
    noise_share=0.25,
) -> Plan:
    """Choose ``accuracy`` and ``max_hard_queries`` for a median-mechanism session, without data.

    Parameters
    ----------
    domain_size : int
        ``|X|``, the number of points of the public domain.
    n : float
        Row count: the public count under swap neighbours, or under add/remove a public hint or
        the session's released noisy count. Never the private count under add/remove.
    epsilon : float
        The session's total budget, finite and > 0.
    expected_queries : int
        ``k``, the number of queries the analyst expects to ask.
    target_accuracy : float, optional
        Desired ``alpha``. If it is larger than the smallest safe ``alpha`` it is used (fewer
        noise fires); if smaller, the plan keeps the safe value and reports ``meets_target=False``.
    neighboring : {"swap", "add_remove"}, optional
        Under add/remove the session spends ``0.1 epsilon`` on the count, so the tests and hard
        answers get ``0.9 epsilon``.
    beta : float, optional
        Failure probability of the stated Theorem 5.14 bound, default 0.05.
    learn_per_bit : float, optional
        Learning hard answers budgeted per bit of ``|X|`` (default 16; see the module notes).
    noise_share : float, optional
        Share of ``c`` reserved for noise-induced hard answers, in (0, 1), default 0.25.

    Returns
    -------
    Plan
        The chosen parameters and what they promise; ``print(plan)`` shows it.

    Raises
    ------
    ValueError
        If an argument breaks its rule.

    Privacy
    -------
    Reads no private data and spends no budget: every input is public (or, for ``n`` under
    add/remove, already released). The session it configures is ``epsilon``-DP as documented
    in :class:`~dpq_spark.core.interactive.median_mechanism.MedianMechanism`.

    Examples
    --------
    >>> plan = plan_median_session(1024, 1_000_000, epsilon=1.0, expected_queries=10_000)
    >>> plan.max_hard_queries, round(plan.accuracy, 4)
    (214, 0.0053)
    """
    d = check_positive_int(domain_size, "domain_size")
    if not _is_real(n) or not math.isfinite(float(n)) or float(n) < 1:
        raise ValueError(f"`n` must be a finite number >= 1, got {n!r}")
    n = float(n)
    eps = check_epsilon(epsilon)
    k = check_positive_int(expected_queries, "expected_queries")
    if target_accuracy is not None:
        target = _check_share(target_accuracy, "target_accuracy")
    relation = NeighboringRelation.parse(neighboring)
    beta = _check_share(beta, "beta")
    noise_share = _check_share(noise_share, "noise_share")
    if not _is_real(learn_per_bit) or not math.isfinite(float(learn_per_bit)) or float(learn_per_bit) <= 0:
        raise ValueError(f"`learn_per_bit` must be finite and > 0, got {learn_per_bit!r}")

    eps_svt = eps * (1.0 - _COUNT_SHARE) if relation is NeighboringRelation.ADD_REMOVE else eps
    bits = max(math.log2(d), 1.0)
    c_learn = max(1, math.ceil(float(learn_per_bit) * bits))
    c = max(2, math.ceil(c_learn / (1.0 - noise_share)))
    delta = 1.0 / n
    s1 = 9.0 * c * delta / (4.0 * eps_svt)          # threshold noise scale sigma(eps_1)
    allowed = noise_share * c / (2.0 * k)           # per-test firing probability allowed
    # smallest alpha with noise_fire_probability(alpha, s1) <= allowed (decreasing in alpha)
    lo, hi = 0.0, s1
    while noise_fire_probability(hi, s1) > allowed:
        lo, hi = hi, 2.0 * hi
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if noise_fire_probability(mid, s1) > allowed:
            lo = mid
        else:
            hi = mid
    alpha = hi
    meets = None
    if target_accuracy is not None:
        meets = target >= alpha
        alpha = max(alpha, target)
    if alpha >= 0.5:
        raise ValueError(
            "no useful plan: the noise needed for `epsilon` and `n` makes the accuracy "
            f"{alpha:.3g} >= 0.5; use more rows, a larger epsilon or fewer expected queries"
        )
    fires = 2.0 * k * noise_fire_probability(alpha, s1)
    thm = max(alpha, 9.0 * c * (math.log(2 * k) + math.log(4 * c / beta)) / (eps_svt * n))
    return Plan(
        accuracy=alpha,
        max_hard_queries=c,
        expected_queries=k,
        learning_hard_queries=c_learn,
        expected_noise_fires=fires,
        halving_bound_per_row=math.log2(d) if d > 1 else 0.0,
        guaranteed_error=min(3.0 * thm, 1.0),
        beta=beta,
        test_noise_scale=2.0 * s1,
        answer_noise_scale=9.0 * c * delta / eps_svt,
        laplace_mean_error=k / (eps * n),
        meets_target=meets,
        n=n,
        epsilon=eps,
        domain_size=d,
        neighboring=relation,
    )
