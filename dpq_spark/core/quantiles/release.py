"""The released quantiles with the public description of how they were released."""

from __future__ import annotations

import numpy as np

__all__ = ["QuantileRelease"]


class QuantileRelease(np.ndarray):
    """The released quantiles (a float64 array) and how they were released.

    Attributes
    ----------
    mechanism : str
        The mechanism that ran (``"joint_exp"``, ...).
    lower, upper : float
        The clamping bounds the mechanism used.
    bounds : str
        ``"given"`` (by the user) or ``"private"`` (released first, see
        :mod:`dpq_spark.core.quantiles.bounds`).
    epsilon : float
        The whole budget of the release (bounds, count and quantiles).
    n_used : float or None
        The row count the chooser used (public, hinted or released); None if no choice was made.
    """

    def __new__(cls, values, *, mechanism, lower, upper, bounds, epsilon, n_used=None):
        obj = np.asarray(values, dtype=np.float64).view(cls)
        obj.mechanism = mechanism
        obj.lower = float(lower)
        obj.upper = float(upper)
        obj.bounds = bounds
        obj.epsilon = float(epsilon)
        obj.n_used = n_used
        return obj

    def __array_finalize__(self, obj):
        for name in ("mechanism", "lower", "upper", "bounds", "epsilon", "n_used"):
            setattr(self, name, getattr(obj, name, None))

    @property
    def info(self) -> dict:
        """The release's public description as a dict (for metadata columns and logs)."""
        return {"mechanism": self.mechanism, "lower": self.lower, "upper": self.upper,
                "bounds": self.bounds, "epsilon": self.epsilon, "n_used": self.n_used}
