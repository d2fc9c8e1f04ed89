"""DP partition selection by thresholded Laplace counts of privacy units (no pyspark here).

When group keys are not public, a key is released only if its count of privacy units, plus
Laplace noise, clears a threshold. This is the "Laplace thresholding" used by Google's DP
libraries and PipelineDP (Korolova et al. 2009; Wilson et al. 2020, section 3.3).

Derivation. Each unit touches at most ``G`` keys and adds at most 1 to each key's unit count, so
the vector of counts has L1 sensitivity ``G``; Laplace noise of scale ``b = G / epsilon`` makes
the noisy counts of keys present in both neighbours ``epsilon``-DP. A key present only in the
larger neighbour has count exactly 1 there; it is released with probability
``P(1 + Lap(b) >= tau) = exp(-(tau - 1) / b) / 2``. Setting that to
``delta_key = 1 - (1 - delta)**(1 / G)`` for each of the at most ``G`` new keys bounds the
probability that any of them appears by ``delta``, which gives ``(epsilon, delta)``-DP.
"""

from __future__ import annotations

import math

__all__ = ["laplace_scale", "selection_threshold"]


def laplace_scale(epsilon: float, max_groups_per_unit: int) -> float:
    """Scale ``b = G / epsilon`` of the Laplace noise added to each key's count of units."""
    return max_groups_per_unit / epsilon


def selection_threshold(epsilon: float, delta: float, max_groups_per_unit: int) -> float:
    """Threshold ``tau`` that a noisy unit count must reach for its key to be released.

    ``tau = 1 + b * ln(1 / (2 delta_key))`` with ``b = G / epsilon`` and
    ``delta_key = 1 - (1 - delta)**(1 / G)``; see the module docstring.
    """
    g = max_groups_per_unit
    delta_key = -math.expm1(math.log1p(-delta) / g)
    return 1.0 + laplace_scale(epsilon, g) * math.log(1.0 / (2.0 * delta_key))
