"""Exact samplers on the integers, drawn from the uniform bits of a :class:`RandomSource`.

Nothing here computes a probability in floating point to decide a draw. Every decision compares a
uniform random integer with an exact integer threshold, so the output distribution is exactly the
one stated (given uniform input bits), and a released integer is attainable under any dataset
(no float rounding gaps: Mironov, CCS 2012).

- :func:`bernoulli` -- Bernoulli(p) for a rational ``p``;
- :func:`bernoulli_exp` -- Bernoulli(exp(-gamma)) for a rational ``gamma >= 0``;
- :func:`discrete_laplace` -- ``P(y) ∝ exp(-|y| / scale)`` on the integers;
- :func:`geometric` -- ``P(k) ∝ exp(-k / scale)`` on ``k = 0, 1, ...``;
- :func:`binomial_half` -- Binomial(c, 1/2), the number of ones among c uniform bits;
- :func:`uniform_split` -- c rows each sent to an independent uniform one of ``2**bits`` parts
  (a multinomial with equal cells, by halving);
- :func:`dlap_scale` / :func:`achieved_epsilon` -- the rational scale for a sensitivity and an
  epsilon (rounded *up*: more noise is always safe) and the epsilon that scale actually gives.

Scalars are sampled in pure Python integers. Arrays (``size=...``) use a vectorised version of the
same algorithms: rejection loops over masks, where every still-undecided entry draws a fresh
uniform 64-bit word per step and compares it, as an integer, with its exact threshold. Entries
whose integers would leave ``int64`` (astronomically rare) finish in the scalar path.

References
----------
C. Canonne, G. Kamath and T. Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS
2020: Algorithm 1 (Bernoulli(exp(-gamma))) and Algorithm 2 (discrete Laplace).
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from numbers import Rational

import numpy as np

from dpq_spark.core.randomness.source import RandomSource

__all__ = [
    "bernoulli",
    "bernoulli_exp",
    "discrete_laplace",
    "geometric",
    "dlap_scale",
    "achieved_epsilon",
    "as_fraction",
    "SCALE_PRECISION_BITS",
    "binomial_half",
    "uniform_split",
]

#: :func:`dlap_scale` rounds ``sensitivity / epsilon`` up to a multiple of ``2**-k`` with ``k``
#: chosen so that the relative increase is below ``2**-SCALE_PRECISION_BITS``.
SCALE_PRECISION_BITS = 20

# Vectorised loops keep every integer below this (uniform bounds t * K, values U + t * V).
_INT_LIMIT = 1 << 62


# --------------------------------------------------------------------------------------------
# Rationals
# --------------------------------------------------------------------------------------------

def as_fraction(value, name: str = "scale") -> Fraction:
    """``value`` as an exact :class:`~fractions.Fraction`, finite and > 0.

    A float is converted exactly (its binary value, e.g. ``0.1`` becomes
    ``3602879701896397/36028797018963968``), never rounded to a nearby decimal.
    """
    if type(value) is Fraction and value > 0:  # the hot path of the scalar samplers
        return value
    if isinstance(value, bool):
        raise TypeError(f"`{name}` must be a positive rational or float, got {value!r}")
    if isinstance(value, Rational):
        frac = Fraction(value)
    elif isinstance(value, (float, np.floating)):
        if not math.isfinite(float(value)):
            raise ValueError(f"`{name}` must be finite and > 0, got {value!r}")
        frac = Fraction(float(value))
    elif isinstance(value, np.integer):
        frac = Fraction(int(value))
    else:
        raise TypeError(f"`{name}` must be a positive rational or float, got {type(value).__name__}")
    if frac <= 0:
        raise ValueError(f"`{name}` must be finite and > 0, got {value!r}")
    return frac


def _cached(fn):
    """``fn`` memoised on its (hashable) arguments, by type as well as value (``1``, ``1.0`` and
    ``True`` are three keys: ``True`` must still be refused). Exceptions are not cached, and
    unhashable arguments go to ``fn`` itself (whose validation names them)."""
    memo = functools.lru_cache(maxsize=1024, typed=True)(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            hash((args, tuple(kwargs.items())))
        except TypeError:
            return fn(*args, **kwargs)
        return memo(*args, **kwargs)
    return call


@_cached
def dlap_scale(sensitivity, epsilon) -> Fraction:
    """The discrete-Laplace scale for a query of ``sensitivity`` at ``epsilon``, rounded up.

    Returns the smallest multiple of ``2**-k`` that is ``>= sensitivity / epsilon`` (computed
    exactly from the binary values of the arguments), with ``k >= 0`` the smallest integer making
    ``2**-k`` at most ``2**-SCALE_PRECISION_BITS`` of the scale. So the scale is at most
    ``1 + 2**-20`` times ``sensitivity / epsilon`` (and an integer once that is ``>= 2**20``), its
    denominator is a power of two, and the epsilon achieved (:func:`achieved_epsilon`) is at most
    the one asked for.

    Parameters
    ----------
    sensitivity : int, Fraction or float
        The sensitivity of the (integer-valued) query, > 0.
    epsilon : int, Fraction or float
        Privacy parameter, finite and > 0.
    """
    sens = as_fraction(sensitivity, "sensitivity")
    eps = as_fraction(epsilon, "epsilon")
    exact = sens / eps
    # k: smallest k >= 0 with exact * 2**k >= 2**SCALE_PRECISION_BITS.
    lead = exact.numerator.bit_length() - exact.denominator.bit_length()  # log2(exact) +- 1
    k = max(0, SCALE_PRECISION_BITS - lead + 1)
    while k > 0 and exact * (1 << (k - 1)) >= (1 << SCALE_PRECISION_BITS):
        k -= 1
    den = 1 << k
    num = -((-exact.numerator * den) // exact.denominator)  # ceil(exact * den)
    return Fraction(num, den)


@_cached
def achieved_epsilon(sensitivity, scale) -> float:
    """The epsilon that discrete Laplace noise of ``scale`` gives a query of ``sensitivity``.

    ``sensitivity / scale``, computed exactly and rounded *up* to a float (so a stated epsilon is
    never below the true one).
    """
    exact = as_fraction(sensitivity, "sensitivity") / as_fraction(scale, "scale")
    return _float_up(exact)


def _float_up(x: Fraction) -> float:
    f = float(x)
    if Fraction(f) < x:
        f = math.nextafter(f, math.inf)
    return f


# --------------------------------------------------------------------------------------------
# Scalars (Python integers)
# --------------------------------------------------------------------------------------------

def bernoulli(source: RandomSource, p) -> bool:
    """One Bernoulli(``p``) draw for a rational ``p`` in ``[0, 1]``: ``U < a`` for ``U`` uniform
    in ``[0, b)``, ``p = a / b``."""
    p = Fraction(p) if isinstance(p, Rational) else None
    if p is None or not 0 <= p <= 1:
        raise ValueError("`p` must be a rational number in [0, 1]")
    return source.below(p.denominator) < p.numerator


def bernoulli_exp(source: RandomSource, gamma) -> bool:
    """One Bernoulli(exp(-``gamma``)) draw for a rational ``gamma >= 0`` (CKS 2020, Algorithm 1).

    ``gamma`` may be an int, a :class:`~fractions.Fraction` or a float (converted exactly).
    """
    if isinstance(gamma, bool):
        raise TypeError("`gamma` must be a rational number >= 0")
    g = Fraction(float(gamma)) if isinstance(gamma, (float, np.floating)) else Fraction(gamma)
    if g < 0:
        raise ValueError(f"`gamma` must be >= 0, got {gamma!r}")
    return _bern_exp(source, g.numerator, g.denominator)


def _bern_exp_le1(source: RandomSource, num: int, den: int, k: int = 1) -> bool:
    """Bernoulli(exp(-num/den)) for ``0 <= num <= den``, starting the loop at ``K = k``.

    K = 1; while Bernoulli(gamma / K): K += 1; return K odd. (P(K odd) = exp(-gamma).)
    """
    while source.below(den * k) < num:
        k += 1
    return k % 2 == 1


def _bern_exp(source: RandomSource, num: int, den: int) -> bool:
    """Bernoulli(exp(-num/den)) for any ``num >= 0``, ``den >= 1``."""
    whole, rest = divmod(num, den)
    for _ in range(whole):
        if not _bern_exp_le1(source, 1, 1):
            return False
    return _bern_exp_le1(source, rest, den)


def _geometric_x(source: RandomSource, t: int) -> int:
    """``X >= 0`` with ``P(X = x) ∝ exp(-x / t)`` (the core of CKS Algorithm 2)."""
    while True:
        u = source.below(t)
        if _bern_exp_le1(source, u, t):
            break
    v = 0
    while _bern_exp_le1(source, 1, 1):
        v += 1
    return u + t * v


def _dlap_scalar(source: RandomSource, t: int, s: int) -> int:
    """One draw of ``P(y) ∝ exp(-|y| s / t)`` (CKS 2020, Algorithm 2)."""
    while True:
        y = _geometric_x(source, t) // s
        negative = source.bits(1) == 1
        if negative and y == 0:
            continue
        return -y if negative else y


# --------------------------------------------------------------------------------------------
# Arrays (vectorised, still exact)
# --------------------------------------------------------------------------------------------

def _uniform_below(source: RandomSource, bound: int, n: int) -> np.ndarray:
    """``n`` uniform integers in ``[0, bound)`` (``int64``), ``1 <= bound <= 2**62``, by rejection."""
    if bound == 1:
        return np.zeros(n, dtype=np.int64)
    mask = np.uint64((1 << (bound - 1).bit_length()) - 1)
    ubound = np.uint64(bound)
    out = source.words(n) & mask
    bad = np.flatnonzero(out >= ubound)
    while bad.size:
        redo = source.words(bad.size) & mask
        out[bad] = redo
        bad = bad[redo >= ubound]
    return out.astype(np.int64)


def _bern_exp_le1_array(source: RandomSource, num: np.ndarray, den: int) -> np.ndarray:
    """Bernoulli(exp(-num[i]/den)) for each ``0 <= num[i] <= den`` (vectorised Algorithm 1).

    All undecided entries share the same loop counter ``K``, so each step is one draw of uniform
    integers in ``[0, den * K)`` compared with ``num``.
    """
    n = num.size
    result = np.empty(n, dtype=bool)
    active = np.arange(n)
    k = 1
    while active.size:
        if den * k > _INT_LIMIT:  # never in practice (needs ~K! draws); finish exactly in Python
            for i in active:
                result[i] = _bern_exp_le1(source, int(num[i]), den, k)
            break
        go_on = _uniform_below(source, den * k, active.size) < num[active]
        result[active[~go_on]] = k % 2 == 1
        active = active[go_on]
        k += 1
    return result


def _geometric_x_array(source: RandomSource, t: int, n: int) -> np.ndarray:
    """``n`` independent draws of ``X`` (see :func:`_geometric_x`), as Python-exact ``int64``."""
    u = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        cand = _uniform_below(source, t, todo.size)
        ok = _bern_exp_le1_array(source, cand, t)
        u[todo[ok]] = cand[ok]
        todo = todo[~ok]
    v = np.zeros(n, dtype=np.int64)
    active = np.arange(n)
    while active.size:
        more = _bern_exp_le1_array(source, np.ones(active.size, dtype=np.int64), 1)
        active = active[more]
        v[active] += 1
    if int(v.max(initial=0)) * t + t > _INT_LIMIT:
        return np.array([int(a) + t * int(b) for a, b in zip(u, v)], dtype=object)
    return u + t * v


def _dlap_array(source: RandomSource, t: int, s: int, n: int) -> np.ndarray:
    out = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        y = _geometric_x_array(source, t, todo.size) // s
        negative = (source.words(todo.size) & np.uint64(1)).astype(bool)
        retry = negative & (y == 0)
        keep = ~retry
        out[todo[keep]] = np.where(negative, -y, y)[keep].astype(np.int64)
        todo = todo[retry]
    return out


def _size(size) -> int | tuple | None:
    if size is None:
        return None
    shape = (int(size),) if np.ndim(size) == 0 else tuple(int(s) for s in size)
    if any(s < 0 for s in shape):
        raise ValueError(f"`size` must be >= 0, got {size!r}")
    return shape


# --------------------------------------------------------------------------------------------
# Public samplers
# --------------------------------------------------------------------------------------------

def discrete_laplace(source: RandomSource, scale, size=None):
    """Discrete Laplace noise: ``P(y) = (1 - q) / (1 + q) * q**|y|``, ``q = exp(-1 / scale)``.

    Parameters
    ----------
    source : RandomSource
        Where the bits come from (see :func:`dpq_spark.core.randomness.source.resolve_rng`).
    scale : Fraction, int or float
        The scale ``t / s`` (> 0). A float is converted exactly to the rational it stores; use
        :func:`dlap_scale` to get a scale from a sensitivity and an epsilon.
    size : int or tuple of int, optional
        ``None`` (default) returns one Python ``int``; otherwise an ``int64`` array of that shape.

    Notes
    -----
    Canonne, Kamath and Steinke's Algorithm 2: ``X = U + t V`` with ``U`` uniform on
    ``[0, t)`` kept with probability ``exp(-U / t)`` and ``V`` geometric with ratio ``exp(-1)``
    (so ``P(X = x) ∝ exp(-x / t)``); ``Y = floor(X / s)``; a uniform sign, retried on "negative
    zero". Expected cost: a few dozen uniform words per draw, independent of the scale.

    Privacy
    -------
    Adding it to an integer-valued query of sensitivity ``Delta`` is
    ``Delta / scale``-DP (:func:`achieved_epsilon`), exactly: the output pmf ratio between inputs
    ``x`` and ``x'`` is ``exp((|y - x'| - |y - x|) / scale) <= exp(|x - x'| / scale)`` for every
    integer ``y``, and every integer is attainable from both.
    """
    frac = as_fraction(scale, "scale")
    t, s = frac.numerator, frac.denominator
    shape = _size(size)
    if shape is None:
        return _dlap_scalar(source, t, s)
    n = int(np.prod(shape))
    if t > _INT_LIMIT // 4:
        return np.array([_dlap_scalar(source, t, s) for _ in range(n)], dtype=np.int64).reshape(shape)
    return _dlap_array(source, t, s, n).reshape(shape)


def geometric(source: RandomSource, scale, size=None):
    """Geometric noise on ``k = 0, 1, 2, ...``: ``P(k) = (1 - q) q**k``, ``q = exp(-1 / scale)``.

    Same arguments as :func:`discrete_laplace` (``floor(X / s)`` without the sign).
    """
    frac = as_fraction(scale, "scale")
    t, s = frac.numerator, frac.denominator
    shape = _size(size)
    if shape is None:
        return _geometric_x(source, t) // s
    n = int(np.prod(shape))
    if t > _INT_LIMIT // 4:
        return np.array([_geometric_x(source, t) // s for _ in range(n)], dtype=np.int64).reshape(shape)
    return (_geometric_x_array(source, t, n) // s).astype(np.int64).reshape(shape)


# --------------------------------------------------------------------------------------------
# Counts split uniformly
# --------------------------------------------------------------------------------------------

_ONES = np.array([bin(b).count("1") for b in range(256)], dtype=np.int64)  # popcount of a byte
_WORDS_AT_ONCE = 1 << 20  # random 64-bit words held at a time (8 MiB) by binomial_half


def _popcounts(words: np.ndarray) -> np.ndarray:
    """Set bits of each uint64 word (``int64``); numpy 1.x has no ``bitwise_count``: a byte table."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(words).astype(np.int64)
    return _ONES[words.view(np.uint8)].reshape(-1, 8).sum(axis=1)


def binomial_half(source: RandomSource, counts) -> np.ndarray:
    """Independent Binomial(``counts[i]``, 1/2) draws (``int64``), exactly: the number of ones
    among ``counts[i]`` uniform random bits (``counts[i] // 64`` whole words, then the low
    ``counts[i] % 64`` bits of one more). Costs ``sum(counts) / 64 + len(counts)`` random words,
    drawn ``_WORDS_AT_ONCE`` at a time whatever the counts."""
    c = np.asarray(counts, dtype=np.int64)
    if c.ndim != 1 or (c.size and int(c.min()) < 0):
        raise ValueError("`counts` must be a 1-d array of non-negative integers")
    rem = (c & 63).astype(np.uint64)
    out = _popcounts(source.words(c.size) & ((np.uint64(1) << rem) - np.uint64(1)))
    full = c >> 6
    end = np.cumsum(full)  # entry i owns words [end[i] - full[i], end[i]) of one long stream
    total = int(end[-1]) if c.size else 0
    for start in range(0, total, _WORDS_AT_ONCE):
        stop = min(start + _WORDS_AT_ONCE, total)
        ones = np.concatenate(([0], np.cumsum(_popcounts(source.words(stop - start)))))
        a = int(np.searchsorted(end, start, side="right"))  # entries whose words meet the chunk
        b = int(np.searchsorted(end, stop, side="left")) + 1
        hi = np.minimum(end[a:b], stop) - start
        lo = np.maximum(end[a:b] - full[a:b], start) - start
        out[a:b] += ones[np.maximum(hi, lo)] - ones[lo]
    return out


def uniform_split(source: RandomSource, counts, bits: int):
    """Send each of the ``counts[i]`` rows of entry ``i`` to an independent, uniform part in
    ``[0, 2**bits)``, exactly; return the non-empty ``(entry, part, count)``, sorted by entry
    then part (``int64`` arrays).

    An entry of one row draws its part directly (``bits`` uniform bits). Larger entries split
    by halving: a node's rows go to its lower half with one fair coin each, so the lower count
    is Binomial(rows, 1/2) (:func:`binomial_half`), then each half is split again, ``bits``
    times. The coins of different rows are independent, so every row's part is uniform and
    independent of the others': the counts are Multinomial(``counts[i]``, equal cells).
    Memory: at most ``min(sum(counts), 2**bits * len(counts))`` triples.
    """
    if not isinstance(bits, (int, np.integer)) or not 0 <= bits <= 16:
        raise ValueError(f"`bits` must be an integer in [0, 16], got {bits!r}")
    bits = int(bits)
    c = np.asarray(counts, dtype=np.int64)
    if c.ndim != 1 or (c.size and int(c.min()) < 0):
        raise ValueError("`counts` must be a 1-d array of non-negative integers")
    entry = np.flatnonzero(c)
    w = c[entry]
    alone = np.flatnonzero(w == 1)  # places in `entry` of one-row entries
    part_alone = _uniform_bits(source, bits, alone.size)
    if alone.size == entry.size:
        return entry, part_alone, w
    many = np.flatnonzero(w > 1)
    node, part, nw = np.arange(many.size), np.zeros(many.size, dtype=np.int64), w[many]
    for _ in range(bits):
        low = binomial_half(source, nw)
        pairs = np.empty((nw.size, 2), dtype=np.int64)
        pairs[:, 0], pairs[:, 1] = low, nw - low
        keep = (pairs > 0).ravel()
        node = np.repeat(node, 2)[keep]
        part = (2 * np.repeat(part, 2) + np.tile(np.array([0, 1]), nw.size))[keep]
        nw = pairs.ravel()[keep]
    # merge: every entry's outputs in entry order (one for a one-row entry)
    outputs = np.ones(entry.size, dtype=np.int64)
    outputs[many] = np.bincount(node, minlength=many.size)
    first = np.cumsum(outputs) - outputs
    out_entry = np.repeat(entry, outputs)
    out_part = np.empty(out_entry.size, dtype=np.int64)
    out_w = np.ones(out_entry.size, dtype=np.int64)
    out_part[first[alone]] = part_alone
    run = np.arange(node.size) - np.repeat(np.cumsum(outputs[many]) - outputs[many], outputs[many])
    at = first[many][node] + run
    out_part[at], out_w[at] = part, nw
    return out_entry, out_part, out_w


def _uniform_bits(source: RandomSource, bits: int, size: int) -> np.ndarray:
    """``size`` uniform integers in ``[0, 2**bits)``, ``bits <= 16``, from one or two random
    bytes each (``int64``; exact: 2**bits divides 2**8 or 2**16)."""
    if bits == 0 or size == 0:
        return np.zeros(size, dtype=np.int64)
    if bits <= 8:
        raw = np.frombuffer(source.bytes(size), dtype=np.uint8)
    else:
        raw = np.frombuffer(source.bytes(2 * size), dtype="<u2")
    return (raw & ((1 << bits) - 1)).astype(np.int64)
