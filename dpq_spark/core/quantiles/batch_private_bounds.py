"""Many groups released without public bounds: each group buys its own private bounds, then
JointExp draws of all groups run together.

:func:`release_many_private_bounds` gives every group what ``auto`` (or the ``joint_exp`` of
:mod:`dpq_spark.core.quantiles.mechanisms`) gives it alone with ``lower = upper = None``: under
``auto`` the noisy count and the choice (:func:`~dpq_spark.core.quantiles.choose.plan_auto`),
then the private bounds (:func:`~dpq_spark.core.quantiles.bounds.private_bounds`, ``bounds_share``
of what is left), then the mechanism inside those bounds with the rest. All from one random
source: auto's noisy counts and choices for all groups as one array
(:func:`~dpq_spark.core.quantiles.choose.plan_auto_many`), then the bounds' gates, their noisy
counts as one array (:func:`~dpq_spark.core.quantiles.bounds.bounds_gate`: most groups of a few
dozen rows stop here, flagged), then the searches of the groups that passed, as arrays over all
of them (:func:`~dpq_spark.core.quantiles.bounds.search_bounds_many`). For one group these are
the very draws of the core, in its order. A group whose mechanism is JointExp is then set
aside: its data snapped to the default grid of its own bounds (``Grid(lower, upper)``, 2**32
steps whatever the bounds), and the set-aside groups are drawn together by
:func:`~dpq_spark.core.quantiles.batch.release_many` on those grid indices. Other mechanisms
run group by group.

Why the JointExp draws can share one call: the sampler reads only grid indices (the grid
values are a fixed map of them applied at the end), and every default grid has the same 2**32
steps and the same tie split. ``release_many`` on ``Grid(0, 2**32)``, whose point k is the
number k, therefore draws index k with the law the core's ``joint_exp`` draws it on
``Grid(lower, upper)``; the group's release is ``Grid(lower, upper).value(k)``. A declared grid
(``granularity``) of N steps, jittered as the core jitters it (the jitter depends on N only),
is drawn the same way on ``Grid(0, N, 1)``: the groups whose grids share a jitter (2**16 for
every N up to 2**36) together, each with its own N
(:func:`~dpq_spark.core.quantiles.batch.joint_exp_index_grids`). Groups are
independent given their data, so drawing each step for all groups before the next, in one call,
changes no group's law (for several groups the draws are not those of the per-group path for
the same seed).
"""

from __future__ import annotations

import numpy as np

from dpq_spark.core.quantiles._pure import get_base_mechanism
from dpq_spark.core.quantiles.batch import (
    BatchRelease,
    FlatGroups,
    joint_exp_index_grids,
    release_many,
)
from dpq_spark.core.quantiles.bounds import (DEFAULT_BOUNDS_SHARE, UNIT, bounds_gate,
                                             search_bounds_many)
from dpq_spark.core.quantiles.choose import plan_auto_many
from dpq_spark.core.randomness.grid import Grid
from dpq_spark.core.accounting.neighboring import NeighboringRelation

__all__ = ["release_many_private_bounds", "BOUNDS_NOT_FOUND", "PRIVATE_BOUNDS_MECHANISMS"]

#: the mechanism name of a group whose private bounds were not found (values NaN)
BOUNDS_NOT_FOUND = "bounds_not_found"
#: the mechanisms :func:`release_many_private_bounds` takes
PRIVATE_BOUNDS_MECHANISMS = ("auto", "joint_exp")
#: set-aside JointExp entries (distinct grid indices) drawn before more are set aside (2**20
#: cost about 20 MiB more peak memory for no speed)
_HELD_ENTRIES = 1 << 19


def release_many_private_bounds(groups, quantiles, *, epsilon, neighboring="add_remove",
                                mechanism="auto", bounds_share=None, granularity=None,
                                source) -> BatchRelease:
    """Release the quantiles of many disjoint groups, each buying its own private bounds.

    Parameters
    ----------
    groups : FlatGroups
        Each group's values (floats, sorted, no NaN) and their integer counts (a group may
        hold none).
    quantiles : numpy.ndarray
        The m validated quantiles, the same for every group.
    epsilon : float
        Each group's budget (validated).
    neighboring : {"add_remove", "swap"} or NeighboringRelation
    mechanism : {"auto", "joint_exp"}
    bounds_share : float, optional
        The share of the quantile step's epsilon spent on the bounds (default
        :data:`~dpq_spark.core.quantiles.bounds.DEFAULT_BOUNDS_SHARE`).
    granularity : float, optional
        The declared step of the data (validated), as the core mechanisms take it: each group's
        grid is then ``Grid(lower, upper, granularity)`` on its own bounds, whose points are
        indexed alike whenever they number alike (the set-aside groups are drawn on their own
        ``Grid(0, N, 1)``, together whatever their N).
    source : RandomSource
        The randomness (production: the OS generator).

    Returns
    -------
    BatchRelease
        ``values`` of shape ``(G, m)`` (NaN for a group flagged ``bounds_not_found``) and each
        group's mechanism name (``auto``'s pick, or ``"bounds_not_found"``).

    Privacy
    -------
    Each group's release is that of ``auto`` (or of ``joint_exp``) with ``lower = upper =
    None`` on its data alone: ``epsilon``-DP (pure, with the ``eta``/``delta`` of the
    exponential-mechanism samplers) under ``neighboring``, one row (one unit of a group's
    counts) as the unit, by basic composition of auto's noisy count (``auto``, add/remove
    only), the private bounds and the mechanism. A group that the bounds' gate flags spends
    the count's and the bounds' shares and releases only the flag. The groups hold disjoint
    rows, so by parallel composition the batch is ``epsilon``-DP for a row.
    """
    relation = NeighboringRelation.parse(neighboring)
    share = DEFAULT_BOUNDS_SHARE if bounds_share is None else float(bounds_share)
    q = np.asarray(quantiles, dtype=np.float64)
    x = np.asarray(groups.values, dtype=np.float64)
    counts = np.asarray(groups.counts, dtype=np.int64)
    bounds = np.asarray(groups.bounds)
    G, m = bounds.size - 1, q.size
    values = np.full((G, m), np.nan)
    names = [BOUNDS_NOT_FOUND] * G
    extra = {} if granularity is None else {"granularity": granularity}
    unit = UNIT if granularity is None else float(granularity)
    running = np.concatenate(([0], np.cumsum(counts)))
    totals = running[bounds[1:]] - running[bounds[:-1]]
    # auto's noisy counts and choices, then the bounds' gates: each an array over all groups
    # (for one group the very draws of auto, with_private_bounds and private_bounds)
    if mechanism == "auto":
        picked, rest, _ = plan_auto_many(m, totals, epsilon=epsilon, neighboring=relation,
                                         source=source, bounds_missing=True, bounds_share=share,
                                         granularity=granularity)
    else:
        picked, rest = [mechanism] * G, float(epsilon)
    gate = bounds_gate(totals, epsilon=share * rest, neighboring=relation, source=source)
    held = _Held(q, relation, source, values, declared=granularity is not None)
    # the rest of with_private_bounds's two steps: the searches of the bounds (share * rest) of
    # every group that passed its gate, then each one's mechanism inside them at
    # (1 - share) * rest
    passed = np.flatnonzero(gate.passed)
    sizes = np.diff(bounds)  # each group's distinct values
    rows = np.repeat(gate.passed, sizes)
    lower, upper, _, _ = search_bounds_many(
        x[rows], counts[rows], np.concatenate(([0], np.cumsum(sizes[passed]))),
        eps_sides=gate.eps_sides, n_public=gate.n_public[passed], unit=unit, source=source)
    for g, lo, hi in zip(passed.tolist(), lower.tolist(), upper.tolist()):
        a, b = int(bounds[g]), int(bounds[g + 1])
        v, c = x[a:b], counts[a:b]
        name = picked[g]
        names[g] = name
        grid = Grid(lo, hi, granularity)
        if name == "joint_exp" and grid.steps >= 1:  # drawn later with the held groups
            held.add(g, grid, v, c, (1.0 - share) * rest)
            continue
        # another mechanism, or a declared grid of one point: drawn here, as the core draws it
        values[g] = get_base_mechanism(name)(v, q, epsilon=(1.0 - share) * rest,
                                             lower=lo, upper=hi,
                                             neighboring=relation, counts=c, rng=source, **extra)
    held.draw()
    return BatchRelease(values, names)


class _Held:
    """JointExp groups set aside with their grids: ``add`` one, ``draw`` them all into
    ``values``: the default grids (2**32 steps each) by one ``release_many`` per epsilon on
    ``Grid(0, 2**32)``; declared grids by one
    :func:`~dpq_spark.core.quantiles.batch.joint_exp_index_grids` per epsilon and jitter (each
    group on its own ``Grid(0, N, 1)``), or by one ``release_many`` per epsilon and N on
    ``Grid(0, N, 1)`` for the grids too large to jitter."""

    def __init__(self, q, relation, source, values, declared: bool):
        self.q, self.relation, self.source, self.values = q, relation, source, values
        self.declared = declared
        self.index = {"granularity": 1.0} if declared else {}  # the index grid's step: 1
        # (epsilon, grid steps, None) or, declared grids drawn together, (epsilon, None, jitter)
        self.groups: dict[tuple, list] = {}
        self.entries = 0

    def add(self, g: int, grid: Grid, v, c, epsilon: float) -> None:
        k = grid.snap(v).astype(np.int64)  # sorted as v is; values clamped to a bound tie
        at = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
        k, c = (k, c) if at.size == k.size else (k[at], np.add.reduceat(c, at))
        if self.declared and grid.jitter > 1:
            key = (epsilon, None, grid.jitter)  # grids of any size, one jitter
        else:
            key = (epsilon, grid.steps, None)  # every default grid has 2**32 steps
        self.groups.setdefault(key, []).append((g, grid, k, c))
        self.entries += k.size
        if self.entries >= _HELD_ENTRIES:
            self.draw()

    def draw(self) -> None:
        for (epsilon, steps, _), held in self.groups.items():
            sizes = [k.size for _, _, k, _ in held]
            flat = FlatGroups(np.concatenate([k for _, _, k, _ in held]).astype(np.int64),
                              np.concatenate([c for _, _, _, c in held]).astype(np.int64),
                              np.concatenate(([0], np.cumsum(sizes))).astype(np.int64))
            if steps is None:
                k = joint_exp_index_grids(flat, [grid.steps for _, grid, _, _ in held], self.q,
                                          epsilon=epsilon, neighboring=self.relation,
                                          source=self.source)
            else:
                k = release_many(flat, self.q, epsilon=epsilon, lower=0.0, upper=float(steps),
                                 neighboring=self.relation, mechanism="joint_exp",
                                 grid_indices=True, rng=self.source, **self.index).values
            for (g, grid, _, _), row in zip(held, k):
                self.values[g] = grid.value(row.astype(np.int64))
        self.groups.clear()
        self.entries = 0
