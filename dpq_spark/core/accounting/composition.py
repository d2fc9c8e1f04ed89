"""Tight composition of exponential mechanisms (Dong, Durfee and Rogers, ICML 2020).

``m`` non-adaptive runs of an ``eps0``-DP exponential mechanism (each is ``eps0``-bounded-range)
are ``(epsilon, delta(eps0))``-DP with, writing ``p_t = (e^{-t} - e^{-eps0}) / (1 - e^{-eps0})``
and ``t_l = clip((epsilon + (l + 1) eps0) / (m + 1), 0, eps0)``::

    delta(eps0) = max_{l = 0..m} sum_{i = 0..m} C(m, i) p_{t_l}^{m - i} (1 - p_{t_l})^i
                                     * max(e^{m t_l - i eps0} - e^{epsilon}, 0)

(their Theorem 3). :func:`app_ind_exp_epsilon` finds the largest ``eps0`` with
``delta(eps0) <= delta`` by bisection on this formula, evaluated in log space so that it stays
finite for m in the hundreds.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from dpq_spark.core._validation import check_delta, check_epsilon, check_positive_int

__all__ = ["ddr_delta", "app_ind_exp_epsilon"]


def ddr_delta(eps0: float, m: int, epsilon: float) -> float:
    """The ``delta`` of ``m`` composed ``eps0``-DP exponential mechanisms at target ``epsilon``.

    Parameters
    ----------
    eps0 : float
        Per-mechanism epsilon, > 0.
    m : int
        Number of mechanisms, >= 1.
    epsilon : float
        Target overall epsilon, > 0.

    Returns
    -------
    float
        ``delta(eps0)`` of Dong, Durfee and Rogers (2020), Theorem 3 (0 when basic composition
        already gives ``epsilon``).
    """
    from scipy.special import gammaln, logsumexp  # here, not at import: Spark workers never need it

    i = np.arange(m + 1, dtype=np.float64)

    log_binom = gammaln(m + 1) - gammaln(i + 1) - gammaln(m - i + 1)
    best = -np.inf
    for ell in range(m + 1):
        t = min(max((epsilon + (ell + 1) * eps0) / (m + 1), 0.0), eps0)
        # p_t = (e^{-t} - e^{-eps0}) / (1 - e^{-eps0}), in logs.
        log_1m_p = math.log(-math.expm1(-t)) - math.log(-math.expm1(-eps0)) if t > 0 else -math.inf
        # log(e^{-t} - e^{-eps0}) = -t + log(1 - e^{-(eps0 - t)}), exact also for large t.
        log_p = -t + math.log(-math.expm1(-(eps0 - t))) - math.log(-math.expm1(-eps0)) if t < eps0 else -math.inf
        exponent = m * t - i * eps0
        positive = exponent > epsilon
        if not positive.any():
            continue
        # log(e^a - e^eps) = a + log(1 - e^{eps - a}) for a > eps.
        log_gap = exponent[positive] + np.log(-np.expm1(epsilon - exponent[positive]))
        k = i[positive]
        with np.errstate(invalid="ignore"):
            log_terms = (
                log_binom[positive]
                + np.where(m - k > 0, (m - k) * log_p, 0.0)
                + np.where(k > 0, k * log_1m_p, 0.0)
                + log_gap
            )
        best = max(best, float(logsumexp(log_terms)))
    return math.exp(best) if best > -np.inf else 0.0


@functools.lru_cache(maxsize=256)
def _app_ind_exp_epsilon(epsilon: float, delta: float, m: int) -> float:
    lo = epsilon / m  # basic composition: delta(lo) = 0
    if ddr_delta(lo, m, epsilon) > delta:  # pragma: no cover - basic composition is always valid
        return lo
    hi = 2.0 * epsilon
    while ddr_delta(hi, m, epsilon) <= delta:  # delta(eps0) -> 1 as eps0 grows: this ends
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if ddr_delta(mid, m, epsilon) <= delta:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return lo


def app_ind_exp_epsilon(epsilon: float, delta: float, m: int) -> float:
    """Largest per-quantile epsilon for which ``m`` exponential mechanisms are ``(epsilon, delta)``-DP.

    Parameters
    ----------
    epsilon : float
        Overall epsilon, finite and > 0.
    delta : float
        Overall delta, in (0, 1).
    m : int
        Number of exponential mechanisms composed (non-adaptively), >= 1.

    Returns
    -------
    float
        ``eps0 >= epsilon / m`` with ``ddr_delta(eps0, m, epsilon) <= delta`` (bisection to a
        relative 1e-12, returning the side that satisfies the bound).

    Examples
    --------
    >>> round(app_ind_exp_epsilon(1.0, 1e-6, 10), 2)
    0.15
    """
    eps = check_epsilon(epsilon)
    dlt = check_delta(delta)
    mm = check_positive_int(m, "m")
    return _app_ind_exp_epsilon(eps, dlt, mm)
