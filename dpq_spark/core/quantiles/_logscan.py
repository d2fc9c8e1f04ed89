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

import math

import numpy as np

__all__ = ["lgamma", "logaddexp", "segmented_logcumsumexp", "segmented_logcumsumexp_reverse",
           "segmented_scans", "segment_ends"]

# Partial sums below this (relative to the row maximum) would be subnormal or lose digits.
_TINY = 1e-280
# Below this many elements (and few segments) a plain per-segment accumulate is faster.
_SMALL = 8192
# segmented_scans: the narrowest row (a segment of at most `width` elements is one row of the
# smallest power of two, at least this, that holds it)
_NARROW = 8


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


def _row_scans_both(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inclusive prefix and suffix log-cumsum-exp along axis 1 of a 2-d array padded with -inf,
    from one ``exp`` (as :func:`_row_scan`, with the same exact redo of rows that underflow)."""
    row_max = m.max(axis=1)
    row_max[~np.isfinite(row_max)] = 0.0
    e = np.exp(m - row_max[:, None])
    pre = np.cumsum(e, axis=1)
    suf = np.cumsum(e[:, ::-1], axis=1)[:, ::-1]
    finite = np.isfinite(m)
    finite_row = finite.any(axis=1)
    bad_pre = finite_row & ((pre < _TINY) & finite).any(axis=1)
    bad_suf = finite_row & ((suf < _TINY) & finite).any(axis=1)
    with np.errstate(divide="ignore"):
        pre = np.log(pre, out=pre)
        suf = np.log(suf)
    pre += row_max[:, None]
    suf += row_max[:, None]
    if bad_pre.any():
        pre[bad_pre] = np.logaddexp.accumulate(m[bad_pre], axis=1)
    if bad_suf.any():
        suf[bad_suf] = np.logaddexp.accumulate(m[bad_suf][:, ::-1], axis=1)[:, ::-1]
    return pre, suf


def segmented_scans(z_plus: np.ndarray, z_minus: np.ndarray, starts: np.ndarray,
                    width: int = 512) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three scans of a JointExp Toeplitz step in one layout: the inclusive prefix
    log-cumsum-exp of ``z_plus``, and the inclusive prefix and suffix ones of ``z_minus``,
    restarted at every index in ``starts`` (sorted, ``starts[0] == 0``).

    Each segment is cut into rows of ``width`` elements, or, if it has at most ``width``, is one
    row as wide as the smallest power of two (at least 8) that holds it (so short segments are
    not padded to ``width``: a row's padding is ``-inf``, whose ``exp`` adds exact zeros, so a
    one-row segment gets the same bits in any row at least its length); the three scans share that layout and one ``exp`` serves both scans of ``z_minus``. Rows are
    scanned in linear space after subtracting the row maximum (rows whose partial sums would
    underflow are redone exactly with :func:`numpy.logaddexp.accumulate`), and row totals are
    carried across the rows of a segment by :func:`segmented_logcumsumexp` with
    ``independent=True``. Every output depends only on its own segment, bit for bit: the layout
    of a segment is a function of its length alone.
    """
    size = z_plus.shape[0]
    if size == 0:
        return z_plus.copy(), z_minus.copy(), z_minus.copy()
    lengths = np.diff(np.append(starts, size))
    fit = np.left_shift(1, np.ceil(np.log2(np.maximum(lengths, _NARROW))).astype(np.int64))
    row_width = np.where(lengths <= int(width), np.minimum(fit, int(width)), int(width))
    kinds = np.unique(row_width)
    if kinds.size == 1:
        return _scans_of_width(z_plus, z_minus, starts, int(kinds[0]))
    outs = (np.empty(size), np.empty(size), np.empty(size))
    for w in kinds.tolist():
        segs = np.flatnonzero(row_width == w)
        n = lengths[segs]
        sub_starts = np.cumsum(n) - n
        idx = np.arange(int(n.sum())) + np.repeat(starts[segs] - sub_starts, n)
        for out, got in zip(outs, _scans_of_width(z_plus[idx], z_minus[idx], sub_starts, w)):
            out[idx] = got
    return outs


def _scans_of_width(z_plus: np.ndarray, z_minus: np.ndarray, starts: np.ndarray,
                    width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`segmented_scans` with rows of ``width`` elements for every segment."""
    size = z_plus.shape[0]
    if size == 0:
        return z_plus.copy(), z_minus.copy(), z_minus.copy()
    w = int(width)
    nseg = starts.shape[0]
    lengths = np.diff(np.append(starts, size))
    rows_per_seg = -(-lengths // w)
    row_base = np.zeros(nseg, dtype=np.int64)
    np.cumsum(rows_per_seg[:-1], out=row_base[1:])
    nrows = int(rows_per_seg.sum())
    offset = np.arange(size) - np.repeat(starts, lengths)
    row = np.repeat(row_base, lengths) + offset // w
    flat = row * w + offset % w
    grid = np.full((2, nrows * w), -np.inf)
    grid[0, flat] = z_plus
    grid[1, flat] = z_minus
    pre, suf = _row_scans_both(grid.reshape(2 * nrows, w))  # rows of z_plus, then of z_minus
    pre_plus, pre_minus = pre[:nrows].ravel(), pre[nrows:].ravel()
    suf_minus = suf[nrows:].ravel()  # (the suffixes of z_plus are not used)
    out_pp, out_pm, out_sm = pre_plus[flat], pre_minus[flat], suf_minus[flat]
    if rows_per_seg.max() > 1:
        last_row = row_base + rows_per_seg - 1
        for out, scanned, forward in ((out_pp, pre_plus, True), (out_pm, pre_minus, True),
                                      (out_sm, suf_minus, False)):
            carry = np.empty(nrows)
            if forward:  # the rows before, in the segment
                totals = scanned.reshape(nrows, w)[:, -1]
                inclusive = segmented_logcumsumexp(totals, row_base, w, independent=True)
                carry[1:] = inclusive[:-1]
                carry[row_base] = -np.inf
            else:  # the rows after, in the segment
                totals = scanned.reshape(nrows, w)[:, 0]
                inclusive = segmented_logcumsumexp_reverse(totals, row_base, w, independent=True)
                carry[:-1] = inclusive[1:]
                carry[last_row] = -np.inf
            out[:] = logaddexp(out, carry[row])
    return out_pp, out_pm, out_sm


def lgamma(x) -> np.ndarray:
    """``log |Gamma(x)|`` elementwise (``math.lgamma``), for the few values the band bounds need;
    without scipy, whose import costs a Spark Python worker about 0.4 s."""
    values = np.asarray(x, dtype=np.float64)
    return np.array([math.lgamma(v) for v in values.ravel().tolist()],
                    dtype=np.float64).reshape(values.shape)
