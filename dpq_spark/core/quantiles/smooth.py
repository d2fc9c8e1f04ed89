"""Smooth and CSmooth: order statistics plus noise scaled to their smooth sensitivity.

Smooth (Nissim, Raskhodnikova and Smith 2007) adds Laplace noise, ``(epsilon/m, delta/m)``-DP per
quantile. CSmooth (Bun and Steinke 2019) adds Laplace-log-normal noise, ``(epsilon^2/m)/2``-zCDP per
quantile, ``epsilon^2/2``-zCDP overall. Both are the paper's baselines. The paper uses swap
neighbours (public n); under add/remove neighbours the order-statistic index ``floor((n - 1) q)``
moves with n, and the same smooth-sensitivity bound still holds (proof sketch in
:mod:`dpq_spark.core.quantiles.smooth_sensitivity`).

Not float-safe: both sample continuous noise in float64 (numpy's Laplace and normal draws), so
their guarantees hold for the real-number mechanisms only; a released float can be impossible
under a neighbouring dataset (Mironov, CCS 2012). They are kept as the paper's baselines
(``FLOAT_SAFE`` in :mod:`dpq_spark.core.quantiles.mechanisms` is False); ``dp_quantiles`` refuses them.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.core.quantiles._request import QuantileRequest, validate_request
from dpq_spark.core.quantiles._sorted_data import SortedData, sort_data
from dpq_spark.core._validation import check_delta
from dpq_spark.core.errors import DPQValueError
from dpq_spark.core.accounting.neighboring import NeighboringRelation
from dpq_spark.core.quantiles.smooth_sensitivity import (
    log_smooth_sensitivity,
    order_statistic_at,
    order_statistic_index,
)

__all__ = ["smooth", "csmooth", "csmooth_parameters"]


def _continuous_noise(rng) -> np.random.Generator:
    """A numpy generator for these two mechanisms' float noise, seeded with 256 bits of ``rng``.

    The one place outside the exact samplers where float noise is drawn: Smooth and CSmooth are
    not float-safe by design (module docstring), so their noise comes from numpy's float
    samplers, keyed from the resolved source (the OS CSPRNG unless a test passes a seed).
    """
    return resolve_rng(rng).public_generator()


def _sorted(request: QuantileRequest, x, c, name: str) -> SortedData:
    data = sort_data(x, c, request.lower, request.upper)
    if data.n == 0 and request.neighboring is NeighboringRelation.SWAP:
        # n is public under swap; under add/remove an empty dataset is handled like any other.
        raise DPQValueError(f"`values` must hold at least one point for {name} with neighboring='swap'")
    return data


def _log_sensitivity(request: QuantileRequest, data: SortedData, k: int, beta: float) -> float:
    # One bound for both relations (see dpq_spark.core.quantiles.smooth_sensitivity).
    return log_smooth_sensitivity(data, k, beta, request.lower, request.upper)


def _order_statistic(request: QuantileRequest, data: SortedData, k: int) -> float:
    return float(order_statistic_at(data, k, request.lower, request.upper))


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
        The private data, 1-d (at least one point under swap). Values outside ``[lower, upper]``
        are clamped; NaN is an error.
    quantiles : array_like of float
        Strictly increasing quantiles in (0, 1).
    epsilon : float
        Total privacy budget, finite and > 0.
    lower, upper : float
        Public bounds with ``lower < upper``.
    neighboring : {"add_remove", "swap"} or NeighboringRelation, default "add_remove"
        Which datasets are neighbours; "swap" is the paper's setting.
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
        If an argument breaks its rule, or under swap if there is no data point (n is public
        there).
    TypeError
        If an argument has the wrong type.

    Notes
    -----
    With ``eps' = epsilon / m``, ``delta' = delta / m`` and ``beta = eps' / (2 ln(2 / delta'))``,
    quantile ``q`` releases ``x_(k) + S_beta * Lap(1) * 2 / eps'`` with ``k = floor((n - 1) q)``
    and ``S_beta`` the beta-smooth sensitivity of ``x_(k)`` (Nissim, Raskhodnikova and Smith
    2007, Lemmas 2.6 and 2.9); see :mod:`dpq_spark.core.quantiles.smooth_sensitivity`, which also
    shows the bound valid for add/remove neighbours. Under add/remove an empty dataset releases
    ``lower`` plus noise (``x_(-1) = lower``).

    Privacy
    -------
    ``(epsilon, delta)``-differential privacy for the chosen neighbouring relation, one row (one
    unit of multiplicity) being the unit of privacy: each quantile is ``(epsilon/m, delta/m)``-DP and
    basic composition adds them up. Assumes ``lower``, ``upper`` and ``quantiles`` are chosen
    without looking at the data. Holds for the real-number mechanism; the float64 Laplace sampler
    is not float-safe (see the module docstring): for experiments, not releases.

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
    gen = _continuous_noise(rng)
    data = _sorted(request, x, c, "smooth")
    eps_each = request.epsilon / request.m
    beta = eps_each / (2.0 * math.log(2.0 * request.m / dlt))
    out = np.empty(request.m)
    for idx, q in enumerate(request.quantiles):
        k = order_statistic_index(data.n, float(q))
        sens = math.exp(_log_sensitivity(request, data, k, beta))
        out[idx] = _order_statistic(request, data, k) + sens * gen.laplace() * 2.0 / eps_each
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
    from scipy.optimize import brentq  # here, not at import: Spark workers never need it

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
        The private data, 1-d (at least one point under swap). Values outside ``[lower, upper]``
        are clamped; NaN is an error.
    quantiles : array_like of float
        Strictly increasing quantiles in (0, 1).
    epsilon : float
        Finite and > 0; the release is ``epsilon**2 / 2``-zCDP.
    lower, upper : float
        Public bounds with ``lower < upper``.
    neighboring : {"add_remove", "swap"} or NeighboringRelation, default "add_remove"
        Which datasets are neighbours; "swap" is the paper's setting.
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
        If an argument breaks its rule, or under swap if there is no data point.
    TypeError
        If an argument has the wrong type.

    Notes
    -----
    Quantile ``q`` releases ``x_(k) + (S_t / s) * Lap(1) * exp(sigma N(0, 1))`` with
    ``k = floor((n - 1) q)``, ``S_t`` the t-smooth sensitivity of ``x_(k)`` and ``(sigma, s)`` from
    :func:`csmooth_parameters` at ``eps' = epsilon / sqrt(m)`` (Bun and Steinke 2019, Section
    3.1). The paper tuned t on N(0, 1) samples; the default here is a closed-form rule that
    needs no data at all. The t-smooth bound holds for both neighbouring relations.

    Privacy
    -------
    ``epsilon**2 / 2``-zero-concentrated DP (zCDP, Bun and Steinke 2016) for the chosen
    neighbouring relation, one row (one unit of multiplicity) being the unit of privacy: each
    quantile is ``eps'**2 / 2``-zCDP and m of them add up. This is not pure or
    ``(epsilon, delta)``-DP as stated; convert with ``rho + 2 sqrt(rho ln(1/delta))`` if needed.
    Assumes ``lower``, ``upper``, ``quantiles`` and ``t`` are chosen without looking at the data.
    Holds for the real-number mechanism; the float64 sampler is not float-safe (see the module
    docstring): for experiments, not releases.

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
    gen = _continuous_noise(rng)
    data = _sorted(request, x, c, "csmooth")
    eps_each = request.epsilon / math.sqrt(request.m)
    out = np.empty(request.m)
    for idx, q in enumerate(request.quantiles):
        t_q, sigma, s = csmooth_parameters(eps_each, None if ts is None else float(ts[idx]))
        k = order_statistic_index(data.n, float(q))
        log_sens = _log_sensitivity(request, data, k, t_q)
        z = gen.laplace() * math.exp(sigma * gen.standard_normal())
        out[idx] = _order_statistic(request, data, k) + math.copysign(math.exp(log_sens - math.log(s)) * abs(z), z)
    return np.sort(np.clip(out, request.lower, request.upper))
