"""The public log-scale bucket grid of the bounds-free path (``lower = upper = None``). A value x
with BUCKET_FLOOR <= |x| is written |x| = 2**e * f, 1 <= f < 2, e clamped to
[BUCKET_EMIN, BUCKET_EMAX] (|x| is first clamped to BUCKET_CAP), and falls in mantissa bucket
b = floor((f - 1) * 2**BUCKET_BITS): relative width 2**-20 (about 9.5e-7). Its index is
BUCKET_OFFSET + sign(x) * ((e - BUCKET_EMIN) * 2**BUCKET_BITS + b + 1); |x| < BUCKET_FLOOR
(0 included) has index BUCKET_OFFSET. The index is monotone in x; the Spark side computes it
with built-ins (_dataflow.bucket_column), :func:`bucket_index` is the numpy reference.
"""

from __future__ import annotations

import numpy as np

__all__ = ["BUCKET_BITS", "BUCKET_EMIN", "BUCKET_EMAX", "BUCKET_FLOOR", "BUCKET_CAP",
           "BUCKET_OFFSET", "BUCKETS", "bucket_index", "bucket_values"]

BUCKET_BITS = 20
BUCKET_EMIN = -32
BUCKET_EMAX = 63
BUCKET_FLOOR = 2.0**BUCKET_EMIN  # about 2.3e-10
BUCKET_CAP = float(np.nextafter(2.0**(BUCKET_EMAX + 1), 0.0))  # just below 2**64, about 1.8e19
BUCKET_OFFSET = (BUCKET_EMAX - BUCKET_EMIN + 1) << BUCKET_BITS
BUCKETS = 2 * BUCKET_OFFSET + 1  # indexes 0 .. BUCKETS - 1 (about 2.0e8 < 2**28)


def bucket_index(x) -> np.ndarray:
    """The bucket index of each value (numpy reference of the Spark expression; no NaN)."""
    x = np.asarray(x, dtype=np.float64)
    a = np.minimum(np.abs(x), BUCKET_CAP)
    frac, exp = np.frexp(a)  # a = frac * 2**exp, 0.5 <= frac < 1
    e = np.clip(exp - 1, BUCKET_EMIN, BUCKET_EMAX)
    f = np.ldexp(a, -e)
    b = np.clip(np.floor((f - 1.0) * 2.0**BUCKET_BITS), 0, 2**BUCKET_BITS - 1).astype(np.int64)
    mag = (e.astype(np.int64) - BUCKET_EMIN) * (1 << BUCKET_BITS) + b + 1
    mag = np.where(a >= BUCKET_FLOOR, mag, 0)
    return BUCKET_OFFSET + np.sign(x).astype(np.int64) * mag


def bucket_values(index) -> np.ndarray:
    """The representative value of each bucket: the midpoint of its mantissa interval (0 for
    the zero bucket). Strictly increasing in the index."""
    idx = np.asarray(index, dtype=np.int64) - BUCKET_OFFSET
    mag = np.abs(idx)
    e = (mag - 1) // (1 << BUCKET_BITS) + BUCKET_EMIN
    b = (mag - 1) % (1 << BUCKET_BITS)
    v = np.ldexp(1.0 + (b + 0.5) / 2.0**BUCKET_BITS, e.astype(np.int64))
    return np.where(mag == 0, 0.0, np.sign(idx) * v)
