"""DP partition selection by thresholded discrete-Laplace counts of privacy units (no pyspark).

When group keys are not public, a key is released only if its count of privacy units, plus
discrete Laplace noise sampled exactly on the integers, clears a threshold. This is the
"Laplace thresholding" of Google's DP libraries and PipelineDP (Korolova et al. 2009; Wilson et
al. 2020, section 3.3), moved to the integers so that no floating-point artefact of the noise can
reveal a key (Mironov, CCS 2012).

Derivation. Each unit touches at most ``G`` keys and adds at most 1 to each key's unit count, so
the vector of (integer) counts has L1 sensitivity ``G``; discrete Laplace noise
``DLap(b)``, ``P(y) ∝ q**|y|`` with ``q = exp(-1 / b)`` and ``b = dlap_scale(G, epsilon) >=
G / epsilon``, makes the noisy counts of keys present in both neighbours ``epsilon``-DP
(a shift by an integer ``k`` changes each pmf by at most ``exp(|k| / b)``). A key present only
in the larger neighbour has count exactly 1 there; it is released when ``1 + Y >= tau``. For an
integer ``tau = 1 + k`` with ``k >= 1``,

    P(Y >= k) = sum_{y >= k} (1 - q) / (1 + q) * q**y = q**k / (1 + q),

and ``q**k / (1 + q) <= delta_key`` holds exactly when ``k >= b * ln(1 / ((1 + q) delta_key))``.
So ``tau = 1 + max(1, ceil(b * ln(1 / ((1 + q) delta_key))))``, where
``delta_key = 1 - (1 - delta)**(1 / G)`` for each of the at most ``G`` new keys bounds the
probability that any of them appears by ``delta``: ``(epsilon, delta)``-DP. (The continuous
Laplace threshold was ``1 + b ln(1 / (2 delta_key))``; ``1 + q < 2`` makes the discrete one
slightly higher.) The logarithm is evaluated in floating point; ``k`` is rounded up after adding a
relative margin of ``1e-9``, far above float64's error, and a larger ``k`` only lowers the
probability, so the bound holds despite rounding.
"""

from __future__ import annotations

import math
from fractions import Fraction

from dpq_spark.core.randomness.samplers import dlap_scale

__all__ = ["laplace_scale", "selection_threshold"]

_MARGIN = 1e-9


def laplace_scale(epsilon: float, max_groups_per_unit: int) -> Fraction:
    """Scale ``b`` of the discrete Laplace noise on each key's count of units: ``G / epsilon``
    rounded up to a rational (:func:`dpq_spark.core.randomness.samplers.dlap_scale`)."""
    return dlap_scale(max_groups_per_unit, epsilon)


def selection_threshold(epsilon: float, delta: float, max_groups_per_unit: int) -> int:
    """Integer threshold ``tau`` that a noisy unit count must reach for its key to be released.

    ``tau = 1 + max(1, ceil(b ln(1 / ((1 + q) delta_key))))`` with ``b = laplace_scale(epsilon,
    G)``, ``q = exp(-1 / b)`` and ``delta_key = 1 - (1 - delta)**(1 / G)``; see the module
    docstring.
    """
    g = max_groups_per_unit
    b = float(laplace_scale(epsilon, g))
    delta_key = -math.expm1(math.log1p(-delta) / g)
    q = math.exp(-1.0 / b)
    k = b * math.log(1.0 / ((1.0 + q) * delta_key))
    return 1 + max(1, math.ceil(k + _MARGIN * max(1.0, abs(k))))
