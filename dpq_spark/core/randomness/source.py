"""The one place where dpq_spark obtains randomness.

Every sampling function takes ``rng`` and resolves it here, once, into a :class:`RandomSource`:
uniform random bytes, and exact integer draws made from them (never a float uniform).

- ``rng=None`` (production): bytes straight from the operating system's cryptographic generator
  (``os.urandom``: ``getrandom(2)`` on Linux, ChaCha20-based). Nothing is seeded, nothing can be
  predicted or replayed.
- ``rng=numpy.random.Generator(...)``: bytes from that generator (``Generator.bytes``). For tests
  and reproducible experiments only: a seeded PCG64 stream is predictable by whoever knows the
  seed, and is not a cryptographic generator.
- ``rng=RandomSource``: used as it is.

Samplers build everything from :meth:`RandomSource.below` and :meth:`RandomSource.below_array`
(uniform integers in ``[0, bound)`` by rejection, exact for any bound) and
:meth:`RandomSource.words` (uniform 64-bit words). Randomness that protects nothing (the order in
which public candidate databases are generated, for instance) may come from
:meth:`RandomSource.public_generator`, a numpy generator seeded from the source.
"""

from __future__ import annotations

import os
import weakref
from typing import Callable

import numpy as np

__all__ = ["RandomSource", "resolve_rng"]

_UINT64 = np.uint64


class RandomSource:
    """Uniform random bytes and exact uniform integers drawn from them.

    Parameters
    ----------
    read_bytes : callable
        ``read_bytes(k)`` returns ``k`` independent, uniformly random bytes.
    cryptographic : bool
        Whether ``read_bytes`` is a cryptographic generator (stated in the job's release
        metadata, so a release made with a test seed is recognisable).
    name : str
        Short description for logs (never a seed).
    """

    __slots__ = ("_read", "cryptographic", "name", "_buffer", "_pos", "_pool",
                 "_pool_bits", "__weakref__")

    #: Small reads are served from a buffer of this many bytes, refilled from ``read_bytes``: one
    #: system call (or one numpy call) per 512 bytes instead of one per draw. Buffered bytes are
    #: never served twice, and every live source drops its buffer in a forked child
    #: (``os.register_at_fork``; PySpark forks its Python workers), so a child never replays its
    #: parent's bytes.
    BUFFER_BYTES = 512
    #: :meth:`bits` serves small requests from a pool of this many bits taken from the buffer
    #: (each bit used once; leftover bits are discarded at a refill, never reused).
    POOL_BITS = 512

    def __init__(self, read_bytes: Callable[[int], bytes], *, cryptographic: bool, name: str):
        self._read = read_bytes
        self.cryptographic = bool(cryptographic)
        self.name = name
        self._buffer = b""
        self._pos = 0
        self._pool = 0
        self._pool_bits = 0
        _LIVE_SOURCES.add(self)

    def _forget(self) -> None:
        """Drop the buffered bytes and bits (called in a forked child: never replay the parent's)."""
        self._buffer, self._pos, self._pool, self._pool_bits = b"", 0, 0, 0

    def bytes(self, k: int) -> bytes:
        """``k`` uniformly random bytes."""
        k = int(k)
        if k <= 0:
            return b""
        if k >= self.BUFFER_BYTES:
            return self._read(k)
        end = self._pos + k
        if end > len(self._buffer):
            self._buffer, self._pos, end = self._read(self.BUFFER_BYTES), 0, k
        out = self._buffer[self._pos:end]
        self._pos = end
        return out

    def words(self, size: int) -> np.ndarray:
        """``size`` independent uniform 64-bit words (``uint64``)."""
        return np.frombuffer(self.bytes(8 * int(size)), dtype="<u8").astype(_UINT64, copy=False)

    def bits(self, k: int) -> int:
        """A uniform integer in ``[0, 2**k)`` (Python int, any ``k >= 0``)."""
        if k <= 0:
            return 0
        if k > self.POOL_BITS:
            raw = int.from_bytes(self.bytes((k + 7) // 8), "little")
            return raw & ((1 << k) - 1)
        if self._pool_bits < k:
            self._pool = int.from_bytes(self.bytes(self.POOL_BITS // 8), "little")
            self._pool_bits = self.POOL_BITS
        out = self._pool & ((1 << k) - 1)
        self._pool >>= k
        self._pool_bits -= k
        return out

    def below(self, bound: int) -> int:
        """A uniform integer in ``[0, bound)``, exactly, for any integer ``bound >= 1``.

        Rejection from ``ceil(log2 bound)`` random bits: each try succeeds with probability
        above 1/2, and the accepted value is uniform (no modulo bias, no float).
        """
        bound = int(bound)
        if bound < 1:
            raise ValueError(f"`bound` must be >= 1, got {bound}")
        if bound == 1:
            return 0
        k = (bound - 1).bit_length()
        if k > self.POOL_BITS:
            while True:
                r = self.bits(k)
                if r < bound:
                    return r
        mask = (1 << k) - 1
        while True:  # bits(k), inlined: this is the samplers' inner loop
            if self._pool_bits < k:
                self._pool = int.from_bytes(self.bytes(self.POOL_BITS // 8), "little")
                self._pool_bits = self.POOL_BITS
            r = self._pool & mask
            self._pool >>= k
            self._pool_bits -= k
            if r < bound:
                return r

    def below_array(self, bounds) -> np.ndarray:
        """Independent uniform integers in ``[0, bounds[i])``, exactly (``int64``).

        ``bounds`` are integers in ``[1, 2**63]``. Vectorised rejection: every entry draws from its
        own bit width until it is accepted.
        """
        b = np.asarray(bounds)
        if b.size == 0:
            return np.zeros(b.shape, dtype=np.int64)
        b = b.astype(np.uint64)
        if np.any(b < 1) or np.any(b > np.uint64(2**63)):
            raise ValueError("`bounds` must be integers in [1, 2**63]")
        flat = b.ravel()
        width = _bit_length(flat - np.uint64(1))
        mask = np.where(width >= 64, np.uint64(2**64 - 1),
                        (np.uint64(1) << np.minimum(width, 63).astype(np.uint64)) - np.uint64(1))
        out = np.empty(flat.size, dtype=np.uint64)
        todo = np.arange(flat.size)
        while todo.size:
            r = self.words(todo.size) & mask[todo]
            ok = r < flat[todo]
            out[todo[ok]] = r[ok]
            todo = todo[~ok]
        return out.astype(np.int64).reshape(b.shape)

    def bits_array(self, k: int, size: int) -> np.ndarray:
        """``size`` independent uniform integers in ``[0, 2**k)``, ``0 <= k <= 63`` (``int64``):
        the top ``k`` bits of uniform 64-bit words, exact with no rejection."""
        if not 0 <= k <= 63:
            raise ValueError(f"`k` must be in [0, 63], got {k}")
        if k == 0:
            return np.zeros(int(size), dtype=np.int64)
        return (self.words(size) >> np.uint64(64 - k)).astype(np.int64)

    def public_generator(self) -> np.random.Generator:
        """A numpy generator seeded with 256 bits from this source, for public randomness only.

        Use it where the randomness protects nothing (generating public candidate databases,
        shuffling public work); never for noise or for a released value.
        """
        seed = int.from_bytes(self.bytes(32), "little")
        return np.random.default_rng(seed)

    def seed63(self) -> int:
        """A uniform integer in ``[0, 2**63)``, e.g. a seed handed to Spark's ``rand``/``xxhash64``."""
        return self.bits(63)


# Every live source, so that a forked child (PySpark forks its Python workers) drops the buffers
# it inherited instead of serving the parent's random bytes a second time.
_LIVE_SOURCES: "weakref.WeakSet[RandomSource]" = weakref.WeakSet()


def _forget_all_buffers() -> None:
    for source in list(_LIVE_SOURCES):
        source._forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_all_buffers)


def _bit_length(v: np.ndarray) -> np.ndarray:
    """Exact bit length of each ``uint64`` in ``v`` (0 for 0).

    ``float(v)`` lies in ``[2**(L-1), 2**L]`` for the bit length ``L`` (rounding may reach the
    power above), so frexp's exponent is ``L`` or ``L + 1``; a shift tells which, exactly.
    """
    v = np.asarray(v, dtype=np.uint64)
    e = np.minimum(np.frexp(v.astype(np.float64))[1], 64).astype(np.uint64)
    over = (v >> np.maximum(e, np.uint64(1)) - np.uint64(1)) == 0
    return (e - (over & (e > 0))).astype(np.int64)


def _os_source() -> RandomSource:
    return RandomSource(os.urandom, cryptographic=True, name="os.urandom")


def resolve_rng(rng: "RandomSource | np.random.Generator | None") -> RandomSource:
    """Resolve ``rng`` into the :class:`RandomSource` a sampler draws from.

    ``None`` gives the operating system's cryptographic generator (the production default). A
    ``numpy.random.Generator`` is wrapped (tests and reproducible experiments only: it is not
    cryptographic). A ``RandomSource`` is returned as it is.

    Raises
    ------
    TypeError
        If ``rng`` is none of these (a legacy ``RandomState`` or an int seed is refused on
        purpose: no implicit seeding).
    """
    if rng is None:
        return _os_source()
    if isinstance(rng, RandomSource):
        return rng
    if isinstance(rng, np.random.Generator):
        return RandomSource(rng.bytes, cryptographic=False, name="numpy.random.Generator")
    raise TypeError(
        f"`rng` must be a numpy.random.Generator, a RandomSource or None, got {type(rng).__name__}"
    )
