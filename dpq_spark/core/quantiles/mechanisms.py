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
``histogram``         pure ``epsilon``-DP          add_remove, swap    ``bins=16``
``agg_tree_8x3``      pure ``epsilon``-DP          add_remove, swap    (none)
``agg_tree_12x3``     pure ``epsilon``-DP          add_remove, swap    (none)
``agg_tree_8x4``      pure ``epsilon``-DP          add_remove, swap    (none)
``approx_quantiles``  pure ``epsilon``-DP          add_remove, swap    (none)
``auto``              pure ``epsilon``-DP          add_remove, swap    ``n_hint``, ``count_share``
====================  ===========================  ==================  =========================

``agg_tree_8x3``, ``agg_tree_12x3`` and ``agg_tree_8x4`` (:mod:`dpq_spark.core.quantiles.sized_tree`)
are AggTree on an 8-ary tree of height 3, a 12-ary tree of height 3 and an 8-ary tree of height
4, the trees ``auto`` runs for many quantiles at moderate ``n * epsilon``.

``auto`` (:mod:`dpq_spark.core.quantiles.choose`) picks one of the eight pure mechanisms from ``m``, ``n``
and ``epsilon`` and returns a :class:`~dpq_spark.core.quantiles.release.QuantileRelease` whose
``.mechanism`` names it. In the eight pure entries and ``auto``, ``lower`` and ``upper`` are
optional: a missing bound is released privately first with ``bounds_share`` of epsilon (default
0.2; :mod:`dpq_spark.core.quantiles.bounds`), and the result is then a ``QuantileRelease`` carrying the
bounds used.

``GUARANTEES`` maps each name to ``"pure"``, ``"approx"`` or ``"zcdp"`` so that a caller can refuse
a mechanism whose guarantee is not the one it promises its users (``epsilon`` means a different
thing under zCDP). Smooth and CSmooth are swap-neighbour mechanisms in the paper; their smooth-sensitivity bound
also holds for add/remove neighbours (see :mod:`dpq_spark.core.quantiles.smooth_sensitivity`).

``FLOAT_SAFE`` says whether a mechanism's releases are fixed functions of integers sampled
exactly from uniform random bits, so that its guarantee survives floating point
(Mironov, CCS 2012): ``agg_tree`` (and its sized trees) adds exact discrete Laplace noise to integer counts. Smooth,
CSmooth and AppIndExp, the ``(epsilon, delta)`` and zCDP baselines kept for the paper's
experiments, add continuous float noise and are *not* float-safe: their guarantee holds for the
real-number mechanism only, and a released float may be impossible under a neighbouring dataset.
Use them for experiments, not for releases.
"""

from __future__ import annotations

from typing import Callable

from dpq_spark.core.quantiles._pure import _BASE, get_base_mechanism
from dpq_spark.core.quantiles.bounds import with_private_bounds
from dpq_spark.core.quantiles.choose import auto
from dpq_spark.core.quantiles.ind_exp import app_ind_exp
from dpq_spark.core.quantiles.smooth import csmooth, smooth

__all__ = ["MECHANISMS", "GUARANTEES", "FLOAT_SAFE", "get_mechanism", "get_base_mechanism", "auto",
           "joint_exp", "ind_exp", "agg_tree", "histogram", "approx_quantiles", "agg_tree_8x3",
           "agg_tree_12x3", "agg_tree_8x4"]

# The pure mechanisms as the package offers them: ``lower``/``upper`` optional, a missing bound released
# privately first with ``bounds_share`` of epsilon (dpq_spark.core.quantiles.bounds). With both bounds given
# they are the base mechanisms exactly.
joint_exp = with_private_bounds(_BASE["joint_exp"])
ind_exp = with_private_bounds(_BASE["ind_exp"])
agg_tree = with_private_bounds(_BASE["agg_tree"])
histogram = with_private_bounds(_BASE["histogram"])
approx_quantiles = with_private_bounds(_BASE["approx_quantiles"])
agg_tree_8x3 = with_private_bounds(_BASE["agg_tree_8x3"])
agg_tree_12x3 = with_private_bounds(_BASE["agg_tree_12x3"])
agg_tree_8x4 = with_private_bounds(_BASE["agg_tree_8x4"])

MECHANISMS: dict[str, Callable] = {
    "auto": auto,
    "joint_exp": joint_exp,
    "ind_exp": ind_exp,
    "app_ind_exp": app_ind_exp,
    "smooth": smooth,
    "csmooth": csmooth,
    "agg_tree": agg_tree,
    "histogram": histogram,
    "approx_quantiles": approx_quantiles,
    "agg_tree_8x3": agg_tree_8x3,
    "agg_tree_12x3": agg_tree_12x3,
    "agg_tree_8x4": agg_tree_8x4,
}

GUARANTEES: dict[str, str] = {
    "auto": "pure",
    "joint_exp": "pure",
    "ind_exp": "pure",
    "app_ind_exp": "approx",
    "smooth": "approx",
    "csmooth": "zcdp",
    "agg_tree": "pure",
    "histogram": "pure",
    "approx_quantiles": "pure",
    "agg_tree_8x3": "pure",
    "agg_tree_12x3": "pure",
    "agg_tree_8x4": "pure",
}

#: True when every released number is a fixed function of exactly sampled integers (no float
#: noise or float uniform decides an output): the grid mechanisms release grid points drawn
#: exactly (joint_exp.py, single_quantile.py, grid.py), AggTree (any shape) and the histogram add exact
#: discrete Laplace.
FLOAT_SAFE: dict[str, bool] = {
    "auto": True,  # every mechanism it may pick is float-safe
    "joint_exp": True,
    "ind_exp": True,
    "app_ind_exp": False,
    "smooth": False,
    "csmooth": False,
    "agg_tree": True,
    "histogram": True,
    "approx_quantiles": True,
    "agg_tree_8x3": True,
    "agg_tree_12x3": True,
    "agg_tree_8x4": True,
}


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
