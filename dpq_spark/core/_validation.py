"""Argument validation shared by every mechanism.

Each checker raises ``ValueError`` (or ``TypeError`` for a wrong type) whose message names the
argument, states the rule and echoes the offending *public* value. Checkers that look at private
data (``values``, ``counts``) never echo it. All of this runs before any sampling or spending.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = [
    "check_epsilon",
    "check_delta",
    "check_bounds",
    "check_quantiles",
    "check_values",
    "check_counts",
    "check_positive_int",
    "check_grid_indices",
    "check_granularity",
]


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def check_epsilon(epsilon, name: str = "epsilon") -> float:
    """Return ``epsilon`` as a float; it must be finite and > 0."""
    if not _is_real(epsilon):
        raise TypeError(f"`{name}` must be a real number, got {type(epsilon).__name__}")
    eps = float(epsilon)
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"`{name}` must be finite and > 0, got {epsilon!r}")
    return eps


def check_delta(delta, name: str = "delta") -> float:
    """Return ``delta`` as a float; it must lie in (0, 1)."""
    if not _is_real(delta):
        raise TypeError(f"`{name}` must be a real number, got {type(delta).__name__}")
    d = float(delta)
    if not (0.0 < d < 1.0):
        raise ValueError(f"`{name}` must be in (0, 1), got {delta!r}")
    return d


def check_bounds(lower, upper, names: tuple[str, str] = ("lower", "upper")) -> tuple[float, float]:
    """Return ``(lower, upper)`` as floats; both finite and ``lower < upper``."""
    out = []
    for value, name in zip((lower, upper), names):
        if not _is_real(value):
            raise TypeError(f"`{name}` must be a real number, got {type(value).__name__}")
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"`{name}` must be finite, got {value!r}")
        out.append(v)
    if not out[0] < out[1]:
        raise ValueError(
            f"`{names[0]}` must be < `{names[1]}`, got {names[0]}={lower!r}, {names[1]}={upper!r}"
        )
    if not math.isfinite(out[1] - out[0]):
        raise ValueError(
            f"`{names[1]} - {names[0]}` must be finite, got {names[0]}={lower!r}, {names[1]}={upper!r}"
        )
    return out[0], out[1]


def check_quantiles(quantiles, name: str = "quantiles") -> np.ndarray:
    """Return ``quantiles`` as a 1-d float64 array: non-empty, each in (0, 1), strictly increasing."""
    if isinstance(quantiles, (str, bytes)):
        raise TypeError(f"`{name}` must be a sequence of numbers, got a string")
    try:
        q = np.asarray(quantiles, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"`{name}` must be a sequence of numbers") from None
    if q.ndim == 0:
        q = q.reshape(1)
    if q.ndim != 1 or q.size == 0:
        raise ValueError(f"`{name}` must be a non-empty 1-d sequence, got shape {q.shape}")
    if not np.all(np.isfinite(q)) or np.any(q <= 0.0) or np.any(q >= 1.0):
        raise ValueError(f"`{name}` must each be in the open interval (0, 1), got {q.tolist()}")
    if np.any(np.diff(q) <= 0.0):
        raise ValueError(f"`{name}` must be strictly increasing, got {q.tolist()}")
    return q


def check_values(values, name: str = "values") -> np.ndarray:
    """Return private ``values`` as a 1-d float64 array. NaN is an error; ±inf is allowed (it is
    clamped later). The message never echoes the data."""
    try:
        x = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"`{name}` must be an array-like of real numbers") from None
    if x.ndim == 0:
        x = x.reshape(1)
    if x.ndim != 1:
        raise ValueError(f"`{name}` must be 1-d, got {x.ndim} dimensions")
    if np.isnan(x).any():
        raise ValueError(f"`{name}` must not contain NaN (drop or impute missing values first)")
    return x


def check_counts(counts, size: int, name: str = "counts") -> np.ndarray:
    """Return multiplicities as a 1-d int64 array of length ``size``, each a non-negative integer."""
    try:
        raw = np.asarray(counts)
    except (TypeError, ValueError):
        raise TypeError(f"`{name}` must be an array-like of non-negative integers") from None
    if raw.ndim == 0:
        raw = raw.reshape(1)
    if raw.ndim != 1 or raw.shape[0] != size:
        raise ValueError(f"`{name}` must be 1-d with the same length as `values` ({size}), got shape {raw.shape}")
    if raw.dtype.kind in "iu":
        c = raw.astype(np.int64)
    elif raw.dtype.kind == "f" or raw.dtype.kind == "b" or raw.size == 0:
        f = raw.astype(np.float64)
        if not np.all(np.isfinite(f)) or np.any(f != np.floor(f)):
            raise ValueError(f"`{name}` must hold whole numbers")
        if np.any(np.abs(f) > 2.0**62):
            raise ValueError(f"`{name}` must each be < 2**62")
        c = f.astype(np.int64)
    else:
        raise TypeError(f"`{name}` must be an array-like of non-negative integers, got dtype {raw.dtype}")
    if np.any(c < 0):
        raise ValueError(f"`{name}` must be non-negative")
    # Ranks are float64 in the samplers: exact only below 2**53 (9e15 rows).
    if c.size and float(np.sum(c, dtype=np.float64)) > 2.0**53:
        raise ValueError(f"`{name}` must sum to at most 2**53")
    return c


def check_positive_int(value, name: str, minimum: int = 1) -> int:
    """Return ``value`` as an int ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an integer, got {type(value).__name__}")
    if int(value) < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {value!r}")
    return int(value)


def check_grid_indices(k, size: int, name: str = "k") -> np.ndarray:
    """Return private grid indices as a 1-d int64 array, each an integer in ``[0, size)``. The
    message never echoes the data."""
    try:
        raw = np.asarray(k)
    except (TypeError, ValueError):
        raise TypeError(f"`{name}` must be an array-like of integers") from None
    if raw.ndim == 0:
        raw = raw.reshape(1)
    if raw.ndim != 1:
        raise ValueError(f"`{name}` must be 1-d, got {raw.ndim} dimensions")
    if raw.dtype.kind not in "iu" and raw.size:
        raise TypeError(f"`{name}` must hold integers, got dtype {raw.dtype}")
    idx = raw.astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= size):
        raise ValueError(f"`{name}` must lie in [0, grid_size) = [0, {size})")
    return idx


def check_granularity(granularity, name: str = "granularity") -> float:
    """Return ``granularity`` as a float; it must be finite and > 0."""
    if isinstance(granularity, bool) or not _is_real(granularity):
        raise TypeError(f"`{name}` must be a real number, got {type(granularity).__name__}")
    g = float(granularity)
    if not (math.isfinite(g) and g > 0.0):
        raise ValueError(f"`{name}` must be finite and > 0, got {granularity!r}")
    return g
