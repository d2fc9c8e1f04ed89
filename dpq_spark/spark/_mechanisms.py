"""Look up a quantile mechanism of ``dpq_spark.core`` by name (no pyspark here).

The names come from the core's registry (:data:`dpq_spark.core.quantiles.mechanisms.MECHANISMS`,
name -> callable with the signature of :func:`dpq_spark.core.joint_exp`). Only mechanisms whose
registered guarantee (``GUARANTEES``) is pure epsilon-DP are offered: ``dp_quantiles`` promises
pure DP and scales epsilon by group privacy and composition, which an ``(epsilon, delta)`` or
zCDP mechanism would not honour.
"""

from __future__ import annotations

import functools
from typing import Callable

from dpq_spark.core.quantiles.mechanisms import GUARANTEES, MECHANISMS

__all__ = ["available_mechanisms", "get_mechanism"]


@functools.lru_cache(maxsize=1)  # the registry is fixed at import; looked up once per group
def available_mechanisms() -> dict[str, Callable]:
    """Return the mechanisms that ``dp_quantiles`` accepts, by name (``joint_exp`` first)."""
    found: dict[str, Callable] = {"joint_exp": MECHANISMS["joint_exp"]}
    found.update({name: fn for name, fn in MECHANISMS.items() if GUARANTEES[name] == "pure"})
    return found


def get_mechanism(name, argument: str = "mechanism") -> Callable:
    """Return the mechanism called ``name``; raise ``ValueError`` naming ``argument`` if unknown."""
    known = available_mechanisms()
    if not isinstance(name, str) or name not in known:  # (a copy is never handed out)
        allowed = ", ".join(repr(k) for k in sorted(known))
        raise ValueError(f"`{argument}` must be one of {allowed}, got {name!r}")
    return known[name]
