"""The quantile mechanisms by name, for the Spark layer and the experiments.

Every entry has the signature
``f(values, quantiles, *, epsilon, lower, upper, neighboring="add_remove", counts=None, rng=None,
**extra) -> numpy.ndarray`` (m sorted float64 estimates in ``[lower, upper]``); ``counts`` gives
integer multiplicities with exactly the distribution of ``np.repeat(values, counts)``.

====================  ===========================  ==================  =========================
name                  guarantee                    neighbouring        extra keyword arguments
====================  ===========================  ==================  =========================
``joint_exp``         pure ``epsilon``-DP          add_remove, swap    (none)
``ind_exp``           pure ``epsilon``-DP          add_remove, swap    (none)
``app_ind_exp``       ``(epsilon, delta)``-DP      add_remove, swap    ``delta=1e-6``
``smooth``            ``(epsilon, delta)``-DP      add_remove, swap    ``delta=1e-6``
``csmooth``           ``epsilon**2/2``-zCDP        add_remove, swap    ``t=None``
``agg_tree``          pure ``epsilon``-DP          add_remove, swap    ``branching=16, height=4``
``approx_quantiles``  pure ``epsilon``-DP          add_remove, swap    (none)
``auto``              pure ``epsilon``-DP          add_remove, swap    ``n_hint``, ``count_share``
====================  ===========================  ==================  =========================

``auto`` (:mod:`dpq_spark.core.choose`) picks one of the four pure mechanisms from ``m``, ``n``
and ``epsilon`` and returns a :class:`~dpq_spark.core.choose.QuantileRelease` whose
``.mechanism`` names it. In the four pure entries and ``auto``, ``lower`` and ``upper`` are
optional: a missing bound is released privately first with ``bounds_share`` of epsilon (default
0.2; :mod:`dpq_spark.core.bounds`), and the result is then a ``QuantileRelease`` carrying the
bounds used.

``GUARANTEES`` maps each name to ``"pure"``, ``"approx"`` or ``"zcdp"`` so that a caller can refuse
a mechanism whose guarantee is not the one it promises its users (``epsilon`` means a different
thing under zCDP). Smooth and CSmooth are swap-neighbour mechanisms in the paper; their smooth-sensitivity bound
also holds for add/remove neighbours (see :mod:`dpq_spark.core.smooth_sensitivity`).
"""

from __future__ import annotations

from typing import Callable

from dpq_spark.core.agg_tree import agg_tree as _base_agg_tree
from dpq_spark.core.approx_quantiles import approx_quantiles as _base_approx_quantiles
from dpq_spark.core.ind_exp import ind_exp as _base_ind_exp
from dpq_spark.core.joint_exp import joint_exp as _base_joint_exp
from dpq_spark.core.bounds import with_private_bounds
from dpq_spark.core.choose import auto
from dpq_spark.core.ind_exp import app_ind_exp
from dpq_spark.core.smooth import csmooth, smooth

__all__ = ["MECHANISMS", "GUARANTEES", "get_mechanism", "get_base_mechanism", "auto",
           "joint_exp", "ind_exp", "agg_tree", "approx_quantiles"]

# The pure mechanisms as their modules define them (``lower``/``upper`` required) ...
_BASE: dict[str, Callable] = {
    "joint_exp": _base_joint_exp,
    "ind_exp": _base_ind_exp,
    "agg_tree": _base_agg_tree,
    "approx_quantiles": _base_approx_quantiles,
}
# ... and as the package offers them: ``lower``/``upper`` optional, a missing bound released
# privately first with ``bounds_share`` of epsilon (dpq_spark.core.bounds). With both bounds given
# they are the base mechanisms exactly.
joint_exp = with_private_bounds(_BASE["joint_exp"])
ind_exp = with_private_bounds(_BASE["ind_exp"])
agg_tree = with_private_bounds(_BASE["agg_tree"])
approx_quantiles = with_private_bounds(_BASE["approx_quantiles"])

MECHANISMS: dict[str, Callable] = {
    "auto": auto,
    "joint_exp": joint_exp,
    "ind_exp": ind_exp,
    "app_ind_exp": app_ind_exp,
    "smooth": smooth,
    "csmooth": csmooth,
    "agg_tree": agg_tree,
    "approx_quantiles": approx_quantiles,
}

GUARANTEES: dict[str, str] = {
    "auto": "pure",
    "joint_exp": "pure",
    "ind_exp": "pure",
    "app_ind_exp": "approx",
    "smooth": "approx",
    "csmooth": "zcdp",
    "agg_tree": "pure",
    "approx_quantiles": "pure",
}

def get_base_mechanism(name: str) -> Callable:
    """The pure mechanism ``name`` as its module defines it (bounds required)."""
    return _BASE[name]


def get_mechanism(name: str) -> Callable:
    """Return the mechanism registered as ``name``.

    Raises
    ------
    ValueError
        If ``name`` is not registered; the message lists the registered names.
    """
    try:
        return MECHANISMS[name]
    except (KeyError, TypeError):
        allowed = ", ".join(repr(k) for k in MECHANISMS)
        raise ValueError(f"`mechanism` must be one of {allowed}, got {name!r}") from None
