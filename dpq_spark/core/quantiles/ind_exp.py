"""IndExp and AppIndExp: one single-quantile exponential mechanism per quantile.

IndExp splits ``epsilon`` evenly (basic composition, pure DP). AppIndExp gives each quantile the
largest ``eps0`` that the tight composition bound of Dong, Durfee and Rogers (2020) allows for a
target ``(epsilon, delta)``. Both are the baselines of Gillenwater, Joseph and Kulesza (2021).
"""

from __future__ import annotations

import functools

import numpy as np

from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.core.quantiles._request import QuantileRequest, validate_index_request, validate_request
from dpq_spark.core.quantiles._sorted_data import sort_data
from dpq_spark.core._validation import check_delta
from dpq_spark.core.accounting.composition import app_ind_exp_epsilon
from dpq_spark.core.accounting.neighboring import NeighboringRelation, single_quantile_sensitivity
from dpq_spark.core.quantiles.coarse_bands import mechanism_band
from dpq_spark.core.randomness.grid import Grid
from dpq_spark.core.quantiles.single_quantile import GridCells

__all__ = ["ind_exp", "app_ind_exp", "ind_exp_indices"]


def _independent(request: QuantileRequest, x, c, eps_each: float, rng, granularity) -> np.ndarray:
    grid = Grid(request.lower, request.upper, granularity)
    source = resolve_rng(rng)
    f, f_counts = grid.fine_indices(x, c, source, band=functools.partial(
        mechanism_band, "ind_exp", quantiles=request.quantiles, epsilon=eps_each * request.quantiles.size,
        neighboring=request.neighboring, steps=grid.fine_size - 1, shift=grid.tie_bits))
    out = _sample_indices(f, f_counts, grid.fine_size, request.quantiles, eps_each,
                          request.neighboring, source)
    return grid.release(out)


def _sample_indices(k, counts, size, quantiles, eps_each, relation, source) -> np.ndarray:
    cells = GridCells.of(sort_data(k, counts, 0, size - 1), 0, size)
    out = [
        cells.sample(float(q), eps_each, single_quantile_sensitivity(float(q), relation), source)
        for q in quantiles
    ]
    return np.sort(np.array(out, dtype=np.int64))


def ind_exp_indices(k, counts, grid_size: int, quantiles, *, epsilon: float,
                    neighboring: str | NeighboringRelation = "add_remove", rng=None) -> np.ndarray:
    """IndExp on grid indices: the draws of :func:`ind_exp` (``epsilon / m`` per quantile),
    integers in and out.

    ``k`` are grid indices in ``[0, grid_size)`` with multiplicities ``counts`` (None: one
    each); ``ind_exp(values, ...)`` is this on the split ``Grid.snap(values)``
    (:func:`~dpq_spark.core.randomness.grid.split_ties`) with ``grid_size = Grid.fine_size``
    followed by ``Grid.release``, the same draws for the same ``rng``.

    Privacy
    -------
    As :func:`ind_exp`: ``epsilon``-DP by basic composition (as implemented ``(epsilon + m eta,
    m delta)``), one unit of ``counts`` the unit of privacy; ``grid_size`` and ``quantiles``
    public.
    """
    idx, c_arr, size, q, eps, relation = validate_index_request(
        k, counts, grid_size, quantiles, epsilon=epsilon, neighboring=neighboring)
    return _sample_indices(idx, c_arr, size, q, eps / q.size, relation, resolve_rng(rng))


def ind_exp(
    values,
    quantiles,
    *,
    epsilon: float,
    lower: float,
    upper: float,
    neighboring: str | NeighboringRelation = "add_remove",
    counts=None,
    granularity: float | None = None,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Estimate m quantiles with m independent exponential mechanisms, ``epsilon / m`` each.

    Parameters
    ----------
    values : array_like of float
        The private data, 1-d. Values outside ``[lower, upper]`` are clamped; NaN is an error.
    quantiles : array_like of float
        Strictly increasing quantiles in (0, 1).
    epsilon : float
        Total privacy budget, finite and > 0.
    lower, upper : float
        Public bounds with ``lower < upper``.
    neighboring : {"add_remove", "swap"} or NeighboringRelation, default "add_remove"
        Which datasets are neighbours.
    counts : array_like of int, optional
        Multiplicity of each entry of ``values``: the same distribution as
        ``np.repeat(values, counts)``, computed without expanding.
    granularity : float, optional
        Step of the public output grid; default ``(upper - lower) / 2**32`` (see
        :class:`~dpq_spark.core.randomness.grid.Grid`; extra error at most half a step). Giving it declares
        the data's resolution: ties are jittered inside their grid cell once, before the m
        draws (:mod:`dpq_spark.core.quantiles.single_quantile`), at a cost of O(sum of counts) with
        ``counts``. Without it, each default-grid point is split into 256 fine points and every
        row sent to a uniform one of its own point's, once, before the m draws
        (:func:`~dpq_spark.core.randomness.grid.split_ties`; module docstring of
        :mod:`dpq_spark.core.quantiles.joint_exp`, "Ties on the default grid"), so quantiles
        inside a block of tied doubles are released as the tied value.
    rng : numpy.random.Generator, optional
        Source of randomness; ``None`` draws fresh OS entropy.

    Returns
    -------
    numpy.ndarray
        m estimates, sorted, float64, in ``[lower, upper]``.

    Raises
    ------
    ValueError
        If an argument breaks its rule (the message names it).
    TypeError
        If an argument has the wrong type.

    Notes
    -----
    Quantile ``q`` is the grid point k drawn with probability proportional to
    ``exp(-(epsilon / m) |rho(k) - q n| / (2 Delta_q))`` (``rho`` the mid-rank) with
    ``Delta_q = 1`` (swap) or ``max(q, 1 - q)`` (add/remove) (Smith 2011); see
    :mod:`dpq_spark.core.quantiles.single_quantile`. Time O(n log n + m n).

    Privacy
    -------
    ``epsilon``-differential privacy (pure), by basic composition of m ``epsilon/m``-DP
    mechanisms, for the chosen neighbouring relation; one row (one unit of multiplicity) is the
    unit of privacy. Assumes ``lower``, ``upper``, ``granularity`` and ``quantiles`` are chosen
    without looking at the data. As implemented (float64 weights, exact draws): each draw is
    ``(epsilon / m + eta, delta)``-DP with ``eta``, ``delta`` of :mod:`dpq_spark.core.quantiles.joint_exp`
    for m = 1, so the whole is ``(epsilon + m eta, m delta)``-DP. With ``granularity`` given,
    the m draws share one per-row jitter of the data; for every fixed jitter the m draws compose
    as above, so the mixture keeps the guarantee (:mod:`dpq_spark.core.randomness.grid`); the
    default grid's split of ties is the same kind of mixture. Past 2**22 split entries only the
    grid points inside the union of the m draws' bands are split (``delta`` then grows by
    ``(1 + exp(epsilon + m eta)) 2**-59``).

    Examples
    --------
    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=1000)
    >>> ind_exp(x, [0.25, 0.5, 0.75], epsilon=1.0, lower=-10, upper=10,
    ...         rng=np.random.default_rng(1)).shape
    (3,)
    """
    request, x, c = validate_request(
        values, quantiles, epsilon=epsilon, lower=lower, upper=upper, neighboring=neighboring, counts=counts
    )
    return _independent(request, x, c, request.epsilon / request.m, rng, granularity)


def app_ind_exp(
    values,
    quantiles,
    *,
    epsilon: float,
    lower: float,
    upper: float,
    neighboring: str | NeighboringRelation = "add_remove",
    counts=None,
    granularity: float | None = None,
    rng: np.random.Generator | None = None,
    delta: float = 1e-6,
) -> np.ndarray:
    """Estimate m quantiles with independent exponential mechanisms under tight composition.

    Each quantile gets ``eps0 = app_ind_exp_epsilon(epsilon, delta, m)``, the largest
    per-mechanism epsilon for which the bound of Dong, Durfee and Rogers (2020, Theorem 3) gives
    ``(epsilon, delta)``-DP overall. At ``epsilon = 1``, ``delta = 1e-6``: ``eps0`` is about 1.00,
    0.233, 0.155 and 0.087 for m = 1, 5, 10 and 30 (the paper's 0.01-grid gives 1.0, 0.23, 0.15,
    0.083).

    Parameters
    ----------
    values, quantiles, epsilon, lower, upper, neighboring, counts, granularity, rng
        As in :func:`ind_exp`.
    delta : float, default 1e-6
        The overall delta, in (0, 1).

    Returns
    -------
    numpy.ndarray
        m estimates, sorted, float64, in ``[lower, upper]``.

    Raises
    ------
    ValueError
        If an argument breaks its rule (the message names it).
    TypeError
        If an argument has the wrong type.

    Notes
    -----
    The per-quantile draws are those of :func:`ind_exp` with ``eps0`` in place of
    ``epsilon / m``. The composition is non-adaptive (all m mechanisms are fixed in advance), as
    Theorem 3 requires.

    Privacy
    -------
    ``(epsilon, delta)``-differential privacy (approximate, not pure) for the chosen neighbouring
    relation; one row (one unit of multiplicity) is the unit of privacy. Each single draw is
    ``eps0``-DP. Assumes ``lower``, ``upper``, ``granularity`` and ``quantiles`` are chosen
    without looking at the data. With ``granularity`` given, the draws share one per-row jitter
    of the data, which keeps the guarantee (:func:`ind_exp`, :mod:`dpq_spark.core.randomness.grid`).

    Examples
    --------
    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=1000)
    >>> app_ind_exp(x, [0.5], epsilon=1.0, lower=-10, upper=10,
    ...             rng=np.random.default_rng(1)).shape
    (1,)
    """
    dlt = check_delta(delta)
    request, x, c = validate_request(
        values, quantiles, epsilon=epsilon, lower=lower, upper=upper, neighboring=neighboring, counts=counts
    )
    eps0 = app_ind_exp_epsilon(request.epsilon, dlt, request.m)
    return _independent(request, x, c, eps0, rng, granularity)
