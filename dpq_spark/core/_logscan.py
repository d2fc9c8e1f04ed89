"""Segmented log-sum-exp scans: the exact building block of JointExp's Toeplitz steps.

``segmented_logcumsumexp(z, starts)`` returns, for every element, ``log(sum(exp(z[l])))`` over the
elements of its segment up to and including it. Only positive terms are ever added, so no
cancellation can occur: every output has a small *relative* error (a few ulps per level), however
far apart the magnitudes are. This is what lets JointExp keep the tiny entries that an FFT-based
convolution rounds to zero.

Layout: each segment is cut into rows of ``W`` elements; a row is scanned in linear space after
subtracting the row maximum (one ``exp``, one ``cumsum``, one ``log``); rows whose partial sums fall
into the subnormal range (a row spanning more than ~690 nats) are rescanned exactly with
``numpy.logaddexp.accumulate``; row totals are then carried across the rows of a segment by the
same routine, recursively.

With ``independent=True`` the rows are always ``width`` wide and the per-segment small path is
off, so every output depends only on its own segment (bit for bit, whatever the other segments
are): JointExp's batched forward pass relies on this to give each group exactly the numbers it
gets alone.
"""

from __future__ import annotations

import numpy as np

__all__ = ["logaddexp", "segmented_logcumsumexp", "segmented_logcumsumexp_reverse", "segment_ends"]

# Partial sums below this (relative to the row maximum) would be subnormal or lose digits.
_TINY = 1e-280
# Below this many elements (and few segments) a plain per-segment accumulate is faster.
_SMALL = 8192


def logaddexp(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``log(exp(a) + exp(b))`` elementwise, through SIMD ``exp``/``log``.

    ``numpy.logaddexp`` is scalar code, about ten times slower here. The result is
    ``max + log(1 + exp(-|a - b|))``: its absolute error is a few ulps of the result, i.e. the sum
    ``exp(a) + exp(b)`` has a relative error of a few 1e-16, as with ``numpy.logaddexp``.
    """
    top = np.maximum(a, b)
    safe = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return top + np.log(np.exp(a - safe) + np.exp(b - safe))


def segment_ends(starts: np.ndarray, size: int) -> np.ndarray:
    """Index of the last element of each segment, given the sorted segment starts."""
    return np.append(starts[1:], size) - 1


def _row_scan(m: np.ndarray) -> np.ndarray:
    """Inclusive log-cumsum-exp along axis 1 of a 2-d array padded with -inf."""
    row_max = m.max(axis=1)
    row_max[~np.isfinite(row_max)] = 0.0
    e = np.exp(m - row_max[:, None])
    np.cumsum(e, axis=1, out=e)
    finite_row = np.isfinite(m).any(axis=1)
    # A partial sum that underflowed (or came close) loses relative precision: redo those rows.
    bad = finite_row & ((e < _TINY) & np.isfinite(m)).any(axis=1)
    with np.errstate(divide="ignore"):
        out = np.log(e)
    out += row_max[:, None]
    if bad.any():
        out[bad] = np.logaddexp.accumulate(m[bad], axis=1)
    return out


def segmented_logcumsumexp(z: np.ndarray, starts: np.ndarray, width: int = 128,
                           independent: bool = False) -> np.ndarray:
    """Inclusive log-cumsum-exp of ``z`` restarted at every index in ``starts``.

    Parameters
    ----------
    z : numpy.ndarray
        1-d float64 log values; ``-inf`` is allowed.
    starts : numpy.ndarray
        Sorted int64 indices where segments begin; ``starts[0]`` must be 0.
    width : int
        Row width of the blocked layout.
    independent : bool
        Always use rows of ``width`` elements and no small-input path, so that each segment's
        outputs are the same bits whatever the other segments are (default False: a faster
        layout chosen from the whole input).

    Returns
    -------
    numpy.ndarray
        Array like ``z``.
    """
    size = z.shape[0]
    if size == 0:
        return z.copy()
    nseg = starts.shape[0]
    if size <= _SMALL and nseg <= 64 and not independent:
        # Small inputs: numpy's sequential log-add per segment beats the blocked layout's overhead.
        out = np.empty(size)
        for a, b in zip(starts.tolist(), np.append(starts[1:], size).tolist()):
            np.logaddexp.accumulate(z[a:b], out=out[a:b])
        return out
    lengths = np.diff(np.append(starts, size))
    w = int(width) if independent else int(min(width, max(1, -(-size // nseg))))
    rows_per_seg = -(-lengths // w)
    row_base = np.zeros(nseg, dtype=np.int64)
    np.cumsum(rows_per_seg[:-1], out=row_base[1:])
    nrows = int(rows_per_seg.sum())
    seg_of = np.repeat(np.arange(nseg), lengths)
    offset = np.arange(size) - starts[seg_of]
    row = row_base[seg_of] + offset // w
    flat = row * w + offset % w
    m = np.full(nrows * w, -np.inf)
    m[flat] = z
    scanned = _row_scan(m.reshape(nrows, w)).ravel()
    out = scanned[flat]
    if rows_per_seg.max() > 1:
        totals = scanned.reshape(nrows, w)[:, -1]
        inclusive = segmented_logcumsumexp(totals, row_base, width, independent)
        carry = np.empty(nrows)
        carry[0] = -np.inf
        carry[1:] = inclusive[:-1]
        carry[row_base] = -np.inf
        out = logaddexp(out, carry[row])
    return out


def segmented_logcumsumexp_reverse(z: np.ndarray, starts: np.ndarray, width: int = 128,
                                   independent: bool = False) -> np.ndarray:
    """Inclusive suffix version: each element gets the log-sum-exp from itself to its segment's end."""
    size = z.shape[0]
    if size == 0:
        return z.copy()
    rev_starts = (size - 1 - segment_ends(starts, size))[::-1]
    return segmented_logcumsumexp(z[::-1], np.ascontiguousarray(rev_starts), width, independent)[::-1]
