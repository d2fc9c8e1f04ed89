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
        Whether ``read_bytes`` is a cryptographic generator (stated in release metadata and
        checked by callers that insist on one).
    name : str
        Short description for logs (never a seed).
    """

    __slots__ = ("_read", "cryptographic", "name", "_legacy", "_buffer", "_pos", "_pid")

    #: Small reads are served from a buffer of this many bytes, refilled from ``read_bytes``: one
    #: system call (or one numpy call) per 512 bytes instead of one per draw. Buffered bytes are
    #: never served twice, and the buffer is dropped in a forked child (PySpark forks its Python
    #: workers), so a child never replays its parent's bytes.
    BUFFER_BYTES = 512

    def __init__(self, read_bytes: Callable[[int], bytes], *, cryptographic: bool, name: str):
        self._read = read_bytes
        self.cryptographic = bool(cryptographic)
        self.name = name
        self._legacy = None
        self._buffer = b""
        self._pos = 0
        self._pid = os.getpid()

    def __getattr__(self, attr):
        # TRANSITIONAL (issue 9): lets call sites not yet moved to exact integer sampling keep
        # using numpy.random.Generator methods. To be deleted once no sampler uses it.
        if attr.startswith("_"):
            raise AttributeError(attr)
        if self._legacy is None:
            self._legacy = self.public_generator()
        return getattr(self._legacy, attr)

    def __repr__(self) -> str:
        return f"RandomSource({self.name})"

    def bytes(self, k: int) -> bytes:
        """``k`` uniformly random bytes."""
        k = int(k)
        if k <= 0:
            return b""
        if k >= self.BUFFER_BYTES:
            return self._read(k)
        pid = os.getpid()
        if pid != self._pid:  # forked: never reuse the parent's buffered bytes
            self._buffer, self._pos, self._pid = b"", 0, pid
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
        raw = int.from_bytes(self.bytes((k + 7) // 8), "little")
        return raw & ((1 << k) - 1)

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
        while True:
            r = self.bits(k)
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


def _bit_length(v: np.ndarray) -> np.ndarray:
    """Exact bit length of each ``uint64`` in ``v`` (0 for 0), by binary search on shifts."""
    v = v.astype(np.uint64, copy=True)
    width = np.zeros(v.size, dtype=np.int64)
    for shift in (32, 16, 8, 4, 2, 1):
        big = (v >> np.uint64(shift)) > 0
        width += shift * big
        v = np.where(big, v >> np.uint64(shift), v)
    return width + (v > 0)


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
