"""The one place where dpq_spark obtains randomness.

Every sampling function takes ``rng: numpy.random.Generator | None`` (SciPy SPEC 7) and resolves it
here, once. ``None`` means a fresh generator seeded from OS entropy on every call; seeds are for
tests only. Keeping this in one function lets a cryptographic source replace it later.
"""

from __future__ import annotations

import numpy as np

__all__ = ["resolve_rng"]


def resolve_rng(rng: np.random.Generator | None) -> np.random.Generator:
    """Return ``rng`` itself, or a new OS-entropy-seeded generator when it is ``None``.

    Raises
    ------
    TypeError
        If ``rng`` is neither ``None`` nor a ``numpy.random.Generator`` (a legacy
        ``RandomState`` or an int seed is refused on purpose: no implicit seeding).
    """
    if rng is None:
        return np.random.default_rng()
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"`rng` must be a numpy.random.Generator or None, got {type(rng).__name__}"
        )
    return rng
