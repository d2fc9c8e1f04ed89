"""Smooth and CSmooth: order statistics plus noise scaled to their smooth sensitivity.

Smooth (Nissim, Raskhodnikova and Smith 2007) adds Laplace noise, ``(epsilon/m, delta/m)``-DP per
quantile. CSmooth (Bun and Steinke 2019) adds Laplace-log-normal noise, ``(epsilon^2/m)/2``-zCDP per
quantile, ``epsilon^2/2``-zCDP overall. Both are the paper's baselines and, as in the paper, are
defined for swap neighbours (public n): the order-statistic index ``floor((n - 1) q)`` moves with
n, and the smooth-sensitivity bound used here is the swap one.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from scipy.optimize import brentq

from dpq_spark.core._random import resolve_rng
from dpq_spark.core._request import QuantileRequest, validate_request
from dpq_spark.core._sorted_data import SortedData, sort_data
from dpq_spark.core._validation import check_delta
from dpq_spark.core.errors import DPQValueError
from dpq_spark.core.privacy import NeighboringRelation
from dpq_spark.core.smooth_sensitivity import log_smooth_sensitivity, order_statistic_index

__all__ = ["smooth", "csmooth", "csmooth_parameters"]


def _require_swap(request: QuantileRequest, name: str) -> None:
    if request.neighboring is not NeighboringRelation.SWAP:
        raise DPQValueError(
            f"`neighboring` must be 'swap' for {name} (its smooth-sensitivity bound assumes a public n), "
            f"got {request.neighboring.value!r}"
        )


def _sorted_nonempty(request: QuantileRequest, x, c, name: str) -> SortedData:
    data = sort_data(x, c, request.lower, request.upper)
    if data.n == 0:
        # n is public under swap, the only relation these mechanisms accept.
        raise DPQValueError(f"`values` must hold at least one point for {name}")
    return data


def smooth(
    values,
    quantiles,
    *,
    epsilon: float,
    lower: float,
    upper: float,
    neighboring: str | NeighboringRelation = "add_remove",
    counts=None,
    rng: np.random.Generator | None = None,
    delta: float = 1e-6,
) -> np.ndarray:
    """Estimate m quantiles as order statistics plus smooth-sensitivity Laplace noise.

    Parameters
    ----------
    values : array_like of float
        The private data, 1-d, at least one point. Values outside ``[lower, upper]`` are clamped.
    quantiles : array_like of float
        Strictly increasing quantiles in (0, 1).
    epsilon : float
        Total privacy budget, finite and > 0.
    lower, upper : float
        Public bounds with ``lower < upper``.
    neighboring : {"swap"} or NeighboringRelation
        Must be ``"swap"`` (the default ``"add_remove"`` is refused; see Notes).
    counts : array_like of int, optional
        Multiplicity of each entry of ``values`` (exactly ``np.repeat(values, counts)``).
    rng : numpy.random.Generator, optional
        Source of randomness; ``None`` draws fresh OS entropy.
    delta : float, default 1e-6
        Total delta, in (0, 1).

    Returns
    -------
    numpy.ndarray
        m estimates, clipped to ``[lower, upper]`` and sorted (float64).

    Raises
    ------
    ValueError
        If an argument breaks its rule, if ``neighboring`` is not ``"swap"``, or if there is no
        data point (n is public under swap).
    TypeError
        If an argument has the wrong type.

    Notes
    -----
    With ``eps' = epsilon / m``, ``delta' = delta / m`` and ``beta = eps' / (2 ln(2 / delta'))``,
    quantile ``q`` releases ``x_(k) + S_beta * Lap(1) * 2 / eps'`` with ``k = floor((n - 1) q)``
    and ``S_beta`` the beta-smooth sensitivity of ``x_(k)`` (Nissim, Raskhodnikova and Smith
    2007, Lemmas 2.6 and 2.9); see :mod:`dpq_spark.core.smooth_sensitivity`. Add/remove
    neighbours would need a different sensitivity bound and are not implemented.

    Privacy
    -------
    ``(epsilon, delta)``-differential privacy under swap neighbours (n public), one row (one unit
    of multiplicity) being the unit of privacy: each quantile is ``(epsilon/m, delta/m)``-DP and
    basic composition adds them up. Assumes ``lower``, ``upper`` and ``quantiles`` are chosen
    without looking at the data.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=1000)
    >>> smooth(x, [0.5], epsilon=1.0, lower=-10, upper=10, neighboring="swap",
    ...        rng=np.random.default_rng(1)).shape
    (1,)
    """
    dlt = check_delta(delta)
    request, x, c = validate_request(
        values, quantiles, epsilon=epsilon, lower=lower, upper=upper, neighboring=neighboring, counts=counts
    )
    _require_swap(request, "smooth")
    gen = resolve_rng(rng)
    data = _sorted_nonempty(request, x, c, "smooth")
    eps_each = request.epsilon / request.m
    beta = eps_each / (2.0 * math.log(2.0 * request.m / dlt))
    out = np.empty(request.m)
    for idx, q in enumerate(request.quantiles):
        k = order_statistic_index(data.n, float(q))
        sens = math.exp(log_smooth_sensitivity(data, k, beta, request.lower, request.upper))
        out[idx] = data.order_statistic(k) + sens * gen.laplace() * 2.0 / eps_each
    return np.sort(np.clip(out, request.lower, request.upper))


def csmooth_parameters(epsilon_each: float, t: float | None = None) -> tuple[float, float, float]:
    """Return ``(t, sigma, s)`` of the Laplace-log-normal mechanism (Bun and Steinke 2019, 3.1.1).

    ``sigma`` is the positive root of ``(5 eps / t) sigma^3 - 5 sigma^2 - 1 = 0`` and
    ``s = exp(-1.5 sigma^2) (eps - t / sigma)``, which is > 0 for every ``t > 0``.

    When ``t`` is None it is fixed without data: ``t = eps / (2 sqrt(5))``, which gives
    ``sigma = 1 / sqrt(5)``. This minimises the noise standard deviation
    ``S_t e^{sigma^2} sqrt(2) / s`` when the t-smooth sensitivity behaves like ``1 / t`` (data
    locally spread evenly); it depends on nothing but ``eps``.
    """
    eps = float(epsilon_each)
    if t is None:
        t = eps / (2.0 * math.sqrt(5.0))
    t = float(t)
    sigma = brentq(lambda s: (5.0 * eps / t) * s**3 - 5.0 * s**2 - 1.0, 1e-12, 1e6 + 10.0 * t / eps, xtol=1e-15)
    s = math.exp(-1.5 * sigma**2) * (eps - t / sigma)
    return t, sigma, s


def _check_t(t, m: int) -> np.ndarray | None:
    if t is None:
        return None
    if isinstance(t, numbers.Real) and not isinstance(t, bool):
        arr = np.full(m, float(t))
    else:
        try:
            arr = np.asarray(t, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError("`t` must be None, a number or a sequence of numbers") from None
        if arr.shape != (m,):
            raise DPQValueError(f"`t` must be a number or have one entry per quantile ({m}), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise DPQValueError(f"`t` must be finite and > 0, got {np.asarray(t).tolist()!r}")
    return arr


def csmooth(
    values,
    quantiles,
    *,
    epsilon: float,
    lower: float,
    upper: float,
    neighboring: str | NeighboringRelation = "add_remove",
    counts=None,
    rng: np.random.Generator | None = None,
    t=None,
) -> np.ndarray:
    """Estimate m quantiles as order statistics plus Laplace-log-normal smooth-sensitivity noise.

    Parameters
    ----------
    values : array_like of float
        The private data, 1-d, at least one point. Values outside ``[lower, upper]`` are clamped.
    quantiles : array_like of float
        Strictly increasing quantiles in (0, 1).
    epsilon : float
        Finite and > 0; the release is ``epsilon**2 / 2``-zCDP.
    lower, upper : float
        Public bounds with ``lower < upper``.
    neighboring : {"swap"} or NeighboringRelation
        Must be ``"swap"`` (the default ``"add_remove"`` is refused).
    counts : array_like of int, optional
        Multiplicity of each entry of ``values`` (exactly ``np.repeat(values, counts)``).
    rng : numpy.random.Generator, optional
        Source of randomness; ``None`` draws fresh OS entropy.
    t : float or array_like of float, optional
        Smoothing parameter, one for all quantiles or one per quantile, each finite and > 0. It
        must not depend on the data. Default: ``eps' / (2 sqrt(5))`` with ``eps' = epsilon /
        sqrt(m)`` (see :func:`csmooth_parameters`).

    Returns
    -------
    numpy.ndarray
        m estimates, clipped to ``[lower, upper]`` and sorted (float64).

    Raises
    ------
    ValueError
        If an argument breaks its rule, if ``neighboring`` is not ``"swap"``, or if there is no
        data point.
    TypeError
        If an argument has the wrong type.

    Notes
    -----
    Quantile ``q`` releases ``x_(k) + (S_t / s) * Lap(1) * exp(sigma N(0, 1))`` with
    ``k = floor((n - 1) q)``, ``S_t`` the t-smooth sensitivity of ``x_(k)`` and ``(sigma, s)`` from
    :func:`csmooth_parameters` at ``eps' = epsilon / sqrt(m)`` (Bun and Steinke 2019, Section
    3.1). The paper tuned t on N(0, 1) samples; the default here is a closed-form rule that
    needs no data at all.

    Privacy
    -------
    ``epsilon**2 / 2``-zero-concentrated DP (zCDP, Bun and Steinke 2016) under swap neighbours (n
    public), one row (one unit of multiplicity) being the unit of privacy: each quantile is
    ``eps'**2 / 2``-zCDP and m of them add up. This is not pure or ``(epsilon, delta)``-DP as
    stated; convert with ``rho + 2 sqrt(rho ln(1/delta))`` if needed. Assumes ``lower``,
    ``upper``, ``quantiles`` and ``t`` are chosen without looking at the data.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=1000)
    >>> csmooth(x, [0.5], epsilon=1.0, lower=-10, upper=10, neighboring="swap",
    ...         rng=np.random.default_rng(1)).shape
    (1,)
    """
    request, x, c = validate_request(
        values, quantiles, epsilon=epsilon, lower=lower, upper=upper, neighboring=neighboring, counts=counts
    )
    ts = _check_t(t, request.m)
    _require_swap(request, "csmooth")
    gen = resolve_rng(rng)
    data = _sorted_nonempty(request, x, c, "csmooth")
    eps_each = request.epsilon / math.sqrt(request.m)
    out = np.empty(request.m)
    for idx, q in enumerate(request.quantiles):
        t_q, sigma, s = csmooth_parameters(eps_each, None if ts is None else float(ts[idx]))
        k = order_statistic_index(data.n, float(q))
        log_sens = log_smooth_sensitivity(data, k, t_q, request.lower, request.upper)
        z = gen.laplace() * math.exp(sigma * gen.standard_normal())
        out[idx] = data.order_statistic(k) + math.copysign(math.exp(log_sens - math.log(s)) * abs(z), z)
    return np.sort(np.clip(out, request.lower, request.upper))
