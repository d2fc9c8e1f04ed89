"""Quantiles of many disjoint groups in one call: each group's own mechanism, at small-group cost.

:func:`release_many` releases every group with exactly the distribution of calling the group's
mechanism on that group alone (:func:`dpq_spark.core.auto`, :func:`~dpq_spark.core.joint_exp`,
:func:`~dpq_spark.core.ind_exp`, :func:`~dpq_spark.core.approx_quantiles`,
:func:`~dpq_spark.core.agg_tree` (with its sized trees, :mod:`~dpq_spark.core.quantiles.sized_tree`)
or :func:`~dpq_spark.core.histogram`, with given bounds and the default granularity), all draws
independent. What it saves is work that does not change a distribution:

- *Public arguments once.* ``epsilon``, ``quantiles``, the bounds (and the public
  :class:`~dpq_spark.core.randomness.grid.Grid`), ``neighboring``, the mechanism, AggTree's shape and the
  noise scales are checked and built once per call, not once per group; the private values and
  counts of all groups are checked in one pass.
- *One source of randomness.* One :class:`~dpq_spark.core.randomness.source.RandomSource` for the batch
  (the OS generator in production) instead of one per group. Draws from one uniform source are
  independent whatever their order, so the groups stay independent.
- *Auto's noisy counts in one draw* (one discrete Laplace array for all groups), then the public
  rule (:func:`~dpq_spark.core.quantiles.choose.choose_mechanism`) once per distinct noisy count.
- *AggTree's noise in bulk* (the histogram is AggTree with one level): every group's node counts get their noise from one exact table
  sampler (:mod:`dpq_spark.core.randomness.dlap_table`, 16 random bits a draw), the bottom-up pass of the
  Honaker aggregation runs on all groups of a chunk at once, and its top-down pass and the
  descent run for all groups and quantiles together on the visited nodes' children only (the
  descent reads nothing else), with the same floating-point operations in the same order as
  :func:`~dpq_spark.core.quantiles.agg_tree.honaker_aggregate` and ``_descend``, reproducing
  :func:`numpy.searchsorted`'s binary search step for step (the aggregated counts may be
  negative, so the cumulative sums need not be sorted). The same noise gives the same numbers.
- *JointExp on few cells by enumeration.* A group whose mid-rank cells (those of
  :mod:`dpq_spark.core.quantiles.joint_exp`: the gap before the first point, each point, each gap after a
  tied point) number K, with ``C(K + m - 1, m) <= ENUMERATE_MAX`` nondecreasing cell sequences,
  draws its sequence ``s`` directly with probability proportional to
  ``exp(c u(s)) prod_runs C(w_i + k_i - 1, k_i)`` (``k_i`` outputs in a cell of ``w_i`` grid
  points; ``u`` the JointExp utility on the cells' mid-ranks), with
  :func:`~dpq_spark.core.randomness.grid.draw_index`, then a uniform multiset of grid points in every run
  (:func:`~dpq_spark.core.randomness.grid.uniform_multiset`). This is the exponential mechanism over sorted
  grid tuples that :func:`~dpq_spark.core.joint_exp_indices` samples (each tuple's weight
  ``exp(c u)`` depends on its cells only, and a cell holding k outputs offers ``C(w + k - 1, k)``
  multisets), without band pruning or run truncation. An empty group has one cell (the whole
  grid): a uniform multiset of m grid points. All groups of up to ``_enumerable(m)`` rows are
  enumerated together (padded cells; every sequence's log-weight for all groups with the same
  number of cells at once; one exact draw per group with
  :func:`~dpq_spark.core.randomness.grid.draw_index_rows`; the runs' multisets with
  :func:`~dpq_spark.core.randomness.grid.uniform_multisets`). Larger groups get their cells and
  bands for up to ``_CELL_GROUPS`` groups at once (:func:`_flat_cells`, :func:`_flat_bands`: the
  numbers of the per-group ``_grid_cells`` and ``_bands``, bit for bit); those with few cells
  are enumerated one at a time (:func:`_enumerate_one`), the others
  all go through the core's batched sampler together
  (:func:`~dpq_spark.core.quantiles.joint_exp_many._sample_many`: each group with exactly the distribution the
  core's :func:`~dpq_spark.core.joint_exp_indices` gives it alone).
- *IndExp and ApproxQuantiles* draw for blocks of groups of similar sizes at once (padded rows
  of about ``_BLOCK_POINTS`` points, :func:`_blocks`): IndExp each quantile, ApproxQuantiles each
  node of its recursion (whose shape is public and the same for every group), with the core's
  cells and float64 log-weight expression and exact draws (:func:`_exp_rows`); a group alone in
  its block (a large one) calls the core's sampler on the snapped data, with the core's very
  draws.
- *draw_index* (:mod:`dpq_spark.core.randomness.grid`) draws from short weight lists in plain Python, with
  the same draws as before (this speeds up the per-group core mechanisms too).

Branches on private data. Which path a group takes (batched enumeration, per-group enumeration or
the core's JointExp sampler; batched draws or the core's objects for IndExp and ApproxQuantiles)
depends on its size, which is private; every path samples the same distribution: the batched
IndExp and ApproxQuantiles draws use the core's cells and log-weights and are exact for those
float64 weights, as the core's are. For JointExp both paths sample the exponential mechanism over grid
tuples from float64 weights with exact draws: the enumerated log-weight of a sequence takes at
most ``6 m + 6`` correctly rounded operations (differences, absolute values, logs, sums) on
numbers of magnitude at most ``M = 3 c n + m log(N + m) + 800`` (absolute error below the
``gamma = 16 m 2**-52 M`` of
:mod:`dpq_spark.core.quantiles.joint_exp`, "Guarantee as implemented"), one exact draw
(:func:`draw_index` or :func:`~dpq_spark.core.randomness.grid.draw_index_rows`) picks the sequence and the
multisets are exact, so each output's probability is within ``exp(theta)`` of the exact mechanism's, with the core's ``theta``; the core's sampler is within ``exp(theta)`` of
its band-pruned target, ``2**-60`` in total variation from the exact mechanism. Whichever path a
dataset and its neighbour take, the release is therefore ``(epsilon + eta, delta)``-DP with the
core's ``eta = 2 theta`` and ``delta`` (the guarantee stated for :func:`~dpq_spark.core.joint_exp`).

Seeds. With a seeded ``numpy.random.Generator`` the whole batch is reproducible, but a group's
draws depend on its place in the batch and on the other groups (they share one stream). The
per-key reproducibility of the Spark layer (``_group_rng``) is not kept; production
(``rng=None``) has no seed at all.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import NamedTuple

import numpy as np

from dpq_spark.core.randomness.dlap_table import dlap_table
from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.core.randomness.samplers import dlap_scale
from dpq_spark.core.quantiles._sorted_data import sort_data
from dpq_spark.core.quantiles.coarse_bands import (
    COARSE_SHIFT,
    coarse_midpoints,
    coarse_of,
    grid_coarse_shift,
    mechanism_band,
)
from dpq_spark.core.randomness import grid as _grid_module
from dpq_spark.core.quantiles.coarse_spread import spread_groups, spreads_many
from dpq_spark.core._validation import check_counts, check_epsilon, check_positive_int, check_quantiles, check_values
from dpq_spark.core.quantiles.agg_tree import _MAX_LEAVES, HISTOGRAM_BINS, honaker_variances, leaf_index, node_variance
from dpq_spark.core.quantiles.approx_quantiles import _sample_indices as _approx_sample
from dpq_spark.core.quantiles.approx_quantiles import split_lazily
from dpq_spark.core.quantiles.approx_quantiles import _sensitivity as _approx_sensitivity
from dpq_spark.core.quantiles.approx_quantiles import recursion_depth
from dpq_spark.core.quantiles.choose import DEFAULT_COUNT_SHARE, _check_share, plan_auto_many
from dpq_spark.core.errors import DPQValueError
from dpq_spark.core.randomness.grid import (
    Grid,
    draw_index,
    draw_index_rows,
    jitter_indices,
    round_indices,
    split_entries,
    uniform_multiset,
    uniform_multisets,
)
from dpq_spark.core.quantiles._logscan import lgamma
from dpq_spark.core.quantiles.joint_exp import (_ENVELOPE_NATS, _band_set, _bands, _deviation_bands,
                                                _grid_cells, _tie_rank, _weighted_box_bound)
from dpq_spark.core.quantiles.joint_exp_envelope import Bands, box_ranges, components
from dpq_spark.core.quantiles.joint_exp_many import CELLS_HELD
from dpq_spark.core.quantiles.joint_exp_many import _sample_many as _joint_many
from dpq_spark.core.quantiles.sized_tree import SIZED_TREES
from dpq_spark.core.accounting.neighboring import NeighboringRelation, joint_exp_sensitivity, single_quantile_sensitivity
from dpq_spark.core.quantiles.single_quantile import GridCells

__all__ = ["release_many", "joint_exp_index_grids", "BatchRelease", "FlatGroups",
           "BATCH_MECHANISMS", "ENUMERATE_MAX"]

#: The mechanisms :func:`release_many` runs (``"auto"`` picks among the others).
BATCH_MECHANISMS = ("auto", "joint_exp", "ind_exp", "approx_quantiles", "agg_tree", "histogram",
                    *SIZED_TREES)
#: The trees of fixed shape ``(branching, height)`` (the histogram is a one-level tree).
_FIXED_TREES = {"histogram": (HISTOGRAM_BINS, 1), **SIZED_TREES}
_SPREAD = "approx_quantiles (sub-cells)"  # a group's internal label in release_many only
_SPREAD_ENTRIES = 1 << 17  # entries spread at a time: at most 2**21 points
_SPLIT_ENTRIES = 1 << 18  # entries split over fine points at a time (a group with more: alone)
_JITTER_ROWS = 1 << 18  # rows jittered on a declared grid at a time (a group with more: alone)
_COARSE_MECHANISMS = ("approx_quantiles", "agg_tree", *_FIXED_TREES)  # coarse_cells=True: coarse cells
#: Largest number of JointExp cell sequences sampled by enumeration (m = 9: up to 4 cells, that is
#: up to three distinct points without ties).
ENUMERATE_MAX = 4096
_CHUNK_NODES = 1 << 21  # AggTree: about this many node counts per chunk of groups (16 MiB each)


class FlatGroups(NamedTuple):
    """Many groups in three arrays, as a fold holds them: group ``g`` is ``values[bounds[g]:
    bounds[g + 1]]`` with ``counts`` over the same slice (``None``: one each). ``bounds`` starts
    at 0, never decreases and ends at ``len(values)``. :func:`release_many` checks it with array
    operations only, where a sequence of pairs costs a Python step per group.

    ``whole`` (optional, with ``grid_indices=True`` on the default grid): a boolean mask over
    the values marking entries that stand for a pruned cell's rows in represented data
    (:func:`~dpq_spark.core.quantiles.coarse_bands.represent`); the tie split keeps them whole
    (:func:`~dpq_spark.core.randomness.grid.split_ties`)."""

    values: np.ndarray
    counts: np.ndarray | None
    bounds: np.ndarray
    whole: np.ndarray | None = None


class BatchRelease(NamedTuple):
    """What :func:`release_many` returns.

    Attributes
    ----------
    values : numpy.ndarray
        Shape ``(G, m)``, float64: row g holds group g's m sorted estimates in ``[lower, upper]``.
    mechanisms : list of str
        The mechanism that ran for each group (for ``"auto"``, the one it picked).
    """

    values: np.ndarray
    mechanisms: list


def release_many(groups, quantiles, *, epsilon, lower, upper, neighboring="add_remove",
                 mechanism="auto", rng=None, count_share=DEFAULT_COUNT_SHARE, branching=16,
                 height=4, grid_indices=False, coarse_cells=False, granularity=None) -> BatchRelease:
    """Release the quantiles of many disjoint groups, each with its mechanism's own distribution.

    Parameters
    ----------
    groups : sequence of (values, counts) pairs, or FlatGroups
        One pair per group: ``values`` a 1-d array of floats (grid indices or cell midpoints
        as floats are fine), ``counts`` their non-negative integer multiplicities (same length)
        or None (one each). A group may be empty. Values are clamped to ``[lower, upper]``; NaN
        is an error. :class:`FlatGroups` holds the same in three arrays (no Python step per
        group).
    quantiles : array_like of float
        Strictly increasing, each in (0, 1); the same m for every group.
    epsilon : float
        Each group's budget, finite and > 0.
    lower, upper : float
        Public, finite bounds with ``lower < upper``; releases lie on the grid
        ``Grid(lower, upper, granularity)`` (without ``granularity`` the default grid of 2**32
        steps), as in the per-group core mechanisms.
    neighboring : {"add_remove", "swap"} or NeighboringRelation
    mechanism : {"auto", "joint_exp", "ind_exp", "approx_quantiles", "agg_tree", "histogram", \
"agg_tree_8x3", "agg_tree_12x3", "agg_tree_8x4"}
        ``"auto"`` (default) is :func:`dpq_spark.core.auto` per group: under add/remove a noisy
        count with ``count_share * epsilon``, then the public rule.
    rng : numpy.random.Generator, RandomSource or None
        ``None`` (production): the OS cryptographic generator, one source for the whole batch.
        A seeded generator (tests, experiments) makes the batch reproducible as a whole (module
        notes).
    count_share : float
        Share of epsilon for auto's noisy count (add/remove only), in (0, 1), default 0.05.
    branching, height : int
        AggTree's tree (defaults 16 and 4, as :func:`~dpq_spark.core.agg_tree`). The
        histogram always has its default 16 bins, and the sized trees the shape their names say
        (:mod:`~dpq_spark.core.quantiles.sized_tree`).
    grid_indices : bool
        ``True``: every group's first array holds integer indices ``0..N`` of
        ``Grid(lower, upper)`` (e.g. computed by Spark) instead of values. The grid mechanisms
        use them as the core mechanisms use the snapped values (JointExp, IndExp and
        ApproxQuantiles split each group's rows over the default grid's fine points,
        :func:`~dpq_spark.core.randomness.grid.split_ties`, as the core does); AggTree gets their
        grid values ``Grid.value(k)`` (whose snap is k again), exactly as the core mechanisms
        called on those values.
    coarse_cells : bool
        Only with ``grid_indices=True``: groups whose mechanism is ApproxQuantiles, AggTree or
        the histogram get every index ``k`` moved to its coarse cell's representative index
        (:func:`dpq_spark.core.quantiles.coarse_bands.coarse_midpoints` of ``k >> shift``, the
        shift of :func:`~dpq_spark.core.quantiles.coarse_bands.grid_coarse_shift`: 12 on the
        default grid, 0 on a declared grid of fewer than 2**20 steps), a per-record map of
        public constants, as the Spark layer feeds those mechanisms; on the default grid
        ApproxQuantiles chosen by ``"auto"`` from a public row count of at most 2**20 instead
        gets each row at a random one of its cell's 16 sub-cells
        (:mod:`~dpq_spark.core.quantiles.coarse_spread`, a per-record random map, no privacy
        cost; groups spread a chunk of ``_SPREAD_ENTRIES`` entries at a time). These points are
        not split into fine points (a cell's rows would become up to 256 entries): on the
        default grid ApproxQuantiles then runs on them as they are, as the Spark layer runs it.
        JointExp and IndExp keep the exact indices (split). The choice is made after auto's
        noisy count, per group.
    granularity : float, optional
        The declared step of the grid (public: from the column's type or the user), finite and
        > 0, at most 2**32 steps between the bounds. Each group then gets exactly what the core
        mechanism called with this ``granularity`` gives it alone: ``"auto"`` reads the grid
        (:func:`~dpq_spark.core.quantiles.choose.choose_mechanism`'s ``grid_size`` and
        ``granularity``); JointExp, IndExp and ApproxQuantiles run on one independent per-row
        jitter of the group's grid indices inside their cells
        (:func:`~dpq_spark.core.randomness.grid.jitter_indices`, no privacy cost) and round their
        draws back to the grid; AggTree and the histogram round to the declared grid.

    Returns
    -------
    BatchRelease
        ``values`` of shape ``(G, m)`` and the mechanism name of each group.

    Raises
    ------
    TypeError, ValueError
        For a bad argument, naming it (never echoing private values); raised before any draw.

    Privacy
    -------
    Each group's release is its mechanism's: ``epsilon``-DP (pure) under ``neighboring``, one
    row (one unit of a group's counts) as the unit, with the implementation's ``eta``/``delta``
    of :mod:`dpq_spark.core.quantiles.joint_exp` for the exponential-mechanism samplers (``"auto"``: the
    noisy count and the chosen mechanism compose to ``epsilon``). The groups hold disjoint rows
    and their draws are independent, so by parallel composition the whole batch is
    ``epsilon``-DP when one row lies in at most one group; a unit contributing rows to several
    groups needs the caller's scaling (group privacy), as in ``dp_quantiles``. Assumes the
    bounds, quantiles, epsilon, mechanism and the list of groups (the keys) are public; the
    group sizes are private and never leave a mechanism: auto branches only on its noisy
    count, and the other branches (enumeration or the core's sampler, chunking) sample the same
    distribution.
    """
    eps = check_epsilon(epsilon)
    q = check_quantiles(quantiles)
    grid = Grid(lower, upper, granularity)  # checks `lower`, `upper` and `granularity`
    relation = NeighboringRelation.parse(neighboring)
    if not isinstance(mechanism, str) or mechanism not in BATCH_MECHANISMS:
        allowed = ", ".join(repr(k) for k in BATCH_MECHANISMS)
        raise DPQValueError(f"`mechanism` must be one of {allowed}, got {mechanism!r}")
    share = _check_share(count_share, "count_share")
    b = check_positive_int(branching, "branching", minimum=2)
    h = check_positive_int(height, "height", minimum=1)
    if b**h > _MAX_LEAVES:
        raise DPQValueError(f"`branching`**`height` must be <= 2**24 leaves, got {b}**{h}")
    if not isinstance(grid_indices, bool):
        raise TypeError(f"`grid_indices` must be True or False, got {grid_indices!r}")
    if not isinstance(coarse_cells, bool):
        raise TypeError(f"`coarse_cells` must be True or False, got {coarse_cells!r}")
    if coarse_cells and not grid_indices:
        raise DPQValueError("`coarse_cells` needs grid_indices=True")
    x, counts, bounds = _check_groups(groups, keep_integers=grid_indices)
    whole = groups.whole if isinstance(groups, FlatGroups) else None
    if whole is not None:
        whole = np.asarray(whole)
        if whole.dtype != bool or whole.shape != (x.size,) or not grid_indices:
            raise DPQValueError("`groups` whole must be a boolean mask over the values, with "
                                "grid_indices=True")
    if grid_indices:
        if x.dtype.kind in "iu":  # integer indices (a fold's): no float copy of them
            bad = x.size > 0 and (int(x.min()) < 0 or int(x.max()) > grid.steps)
        else:
            bad = np.any(x != np.floor(x)) or np.any(x < 0) or np.any(x > grid.steps)
        if bad:
            raise DPQValueError(f"`groups` must hold grid indices in [0, {grid.steps}] with grid_indices=True")
        snapped = x.astype(np.int64, copy=False)
        x = None  # their grid values, computed below if a mechanism needs them
    else:
        snapped = None
    source = resolve_rng(rng)

    G, m = bounds.size - 1, int(q.size)
    cum = np.concatenate(([0], np.cumsum(counts)))
    n = cum[bounds[1:]] - cum[bounds[:-1]]  # private: used inside the mechanisms only
    if mechanism == "auto":
        # auto's noisy counts and choices for all groups in one array draw
        names, mech_eps, n_used = plan_auto_many(m, n, epsilon=eps, neighboring=relation,
                                                 source=source, count_share=share,
                                                 grid_size=grid.size, granularity=granularity)
    else:
        names, mech_eps, n_used = [mechanism] * G, eps, None
    values = np.empty((G, m), dtype=np.float64)
    if G == 0:
        return BatchRelease(values, names)
    if snapped is None:
        snapped = grid.snap(x)
    keys = np.array(names, dtype=object)
    if coarse_cells:  # ApproxQuantiles on random sub-cells (coarse_spread)
        keys[spreads_many(keys, granularity is not None, n_used)] = _SPREAD
    # each mechanism's groups, the mechanisms in the order of their first group
    by_name = {name: np.flatnonzero(keys == name) for name in dict.fromkeys(keys.tolist())}
    coarse_x = coarse_k = None
    if coarse_cells and any(name in _COARSE_MECHANISMS for name in by_name):
        shift = grid_coarse_shift(grid.steps, granularity is not None)
        coarse_k = coarse_midpoints(coarse_of(snapped, shift), grid.steps, shift)
        coarse_x = grid.value(coarse_k)
    for name, members in by_name.items():
        members = np.asarray(members, dtype=np.int64)
        coarse = coarse_cells and name in _COARSE_MECHANISMS
        if name == "agg_tree" or name in _FIXED_TREES:
            shape = _FIXED_TREES.get(name, (b, h))
            if x is None and not coarse:
                x = grid.value(snapped)
            values[members] = _agg_trees(coarse_x if coarse else x, counts, bounds, n, members, q,
                                         mech_eps, grid, relation, *shape, source)
            continue
        if name == _SPREAD:
            # each row at a random sub-cell of its cell, as the Spark layer's per-group path
            # (coarse_spread), a chunk of groups at a time (at most 16 points per entry); the
            # sub-cells are the tie split of this path (no fine points, as on Spark)
            for chunk in _chunks(_sizes(bounds, members), members, _SPREAD_ENTRIES):
                k, k_counts, k_bounds = _spread(snapped, counts, bounds, chunk, grid, source)
                values[chunk] = grid.value(_approx_many(
                    k, k_counts, k_bounds, np.arange(chunk.size), q, mech_eps, relation,
                    grid.steps, source))
            continue
        run = {"joint_exp": _joint_exps, "approx_quantiles": _approx_many,
               "ind_exp": _ind_exp_many}[name]
        last = 1 if name == "approx_quantiles" else 0  # ApproxQuantiles takes its last index
        if coarse and grid.jitter == 1:
            # rows at their cells' midpoints, as the Spark layer feeds them: no split
            values[members] = grid.value(run(coarse_k, counts, bounds, members, q, mech_eps,
                                             relation, grid.size - last, source))
            continue
        if grid.jitter > 1:
            # a declared grid: one jitter of the members' rows, as the core, a chunk of groups
            # at a time (the jitter makes one entry per row)
            for chunk in _chunks(n[members], members, _JITTER_ROWS):
                k, k_counts, k_bounds = _jittered(coarse_k if coarse else snapped, counts,
                                                  bounds, chunk, grid, source)
                values[chunk] = grid.release(run(k, k_counts, k_bounds, np.arange(chunk.size),
                                                 q, mech_eps, relation, grid.fine_size - last,
                                                 source))
            continue
        # the default grid: each member's rows split over fine points, as the core, a chunk of
        # groups at a time (the split's arrays are a few times the chunk's entries)
        for chunk in _chunks(_sizes(bounds, members), members, _SPLIT_ENTRIES):
            done, k, k_counts, k_bounds = _split_members(name, snapped, counts, bounds, chunk,
                                                         whole, q, mech_eps, relation, grid,
                                                         source, values)
            chunk = chunk[~done]
            if chunk.size:
                values[chunk] = grid.release(run(k, k_counts, k_bounds, np.arange(chunk.size), q,
                                                 mech_eps, relation, grid.fine_size - last,
                                                 source))
    return BatchRelease(values, names)


def joint_exp_index_grids(groups, steps, quantiles, *, epsilon, neighboring,
                          source) -> np.ndarray:
    """JointExp for many groups, each on its own declared index grid ``Grid(0, N_g, 1)``.

    ``groups`` (a :class:`FlatGroups`) holds each group's grid indices, integers in ``[0,
    N_g]`` with their counts; ``steps`` holds the ``N_g`` (one per group), whose grids must all
    have the same jitter (``Grid.jitter``: 2**16 up to 2**36 steps), more than 1. Returns
    the released grid indices, shape ``(G, m)``, int64: each group's row has the law that
    :func:`release_many` gives it alone (``lower=0``, ``upper=N_g``, ``granularity=1``,
    ``grid_indices=True``, ``mechanism="joint_exp"``), and one group draws the very numbers it
    draws for the same source: the same jitter of each row, then the same JointExp on the
    fine grid of ``N_g J + 1`` points, rounded back. For several groups the steps run for all
    of them at once (groups are independent given their data, so no group's law changes).
    Nothing here is validated beyond the grids' jitter: the caller's values are already
    checked (the private bounds' search and its snap).

    Privacy: as :func:`release_many` for each group on its own data: ``epsilon``-DP under
    ``neighboring`` with one row (one unit of a group's counts) as the unit, and by parallel
    composition for the batch of disjoint groups.
    """
    q = np.asarray(quantiles, dtype=np.float64)
    relation = NeighboringRelation.parse(neighboring)
    k = np.asarray(groups.values, dtype=np.int64)
    counts = np.asarray(groups.counts, dtype=np.int64)
    bounds = np.asarray(groups.bounds, dtype=np.int64)
    steps = np.asarray(steps, dtype=np.int64)
    grids = {s: Grid(0.0, float(s), 1.0) for s in np.unique(steps).tolist()}
    jitters = {grid.jitter for grid in grids.values()}
    if len(jitters) != 1 or jitters == {1} or steps.size != bounds.size - 1:
        raise DPQValueError("joint_exp_index_grids: grids of one jitter (> 1), one per group")
    grid = next(iter(grids.values()))
    jitter = grid.jitter
    cum = np.concatenate(([0], np.cumsum(counts)))
    n = cum[bounds[1:]] - cum[bounds[:-1]]
    out = np.empty((steps.size, q.size), dtype=np.int64)
    members = np.arange(steps.size, dtype=np.int64)
    for chunk in _chunks(n, members, _JITTER_ROWS):  # as release_many: rows jittered at a time
        top = steps[chunk]
        f, f_counts, f_bounds = _jittered(k, counts, bounds, chunk, grid, source, steps=top)
        fine = _joint_exps(f, f_counts, f_bounds, np.arange(chunk.size), q, epsilon, relation,
                           top * jitter + 1, source)  # each grid's fine_size
        out[chunk] = round_indices(fine, jitter, grid, top[:, None])  # each within [0, N_g]
    return out


def _sizes(bounds, members) -> np.ndarray:
    """The number of entries of each group of ``members``."""
    return bounds[members + 1] - bounds[members]


def _chunks(sizes, members, entries: int):
    """``members`` cut into consecutive runs whose ``sizes`` (one per member: its entries, or
    its rows) add up to at most ``entries`` each (a run of one group when that group alone
    holds more): a bound on memory, changing no distribution."""
    start, total = 0, 0
    for i, size in enumerate(sizes.tolist()):
        if total and total + size > entries:
            yield members[start:i]
            start, total = i, 0
        total += size
    if start < members.size:
        yield members[start:]


def _spread(k, counts, bounds, members, grid: Grid, source):
    """The groups ``members``' rows at random sub-cells of their coarse cells
    (:func:`~dpq_spark.core.quantiles.coarse_spread.spread_groups`, the default grid's
    ``COARSE_SHIFT``): ``(grid indices, counts, bounds)`` of the same groups in the same order,
    each group's indices sorted and distinct with their multiplicities."""
    if members.size == bounds.size - 1:  # every group, in order: the rows as they are
        return spread_groups(k, counts, bounds, grid.steps, COARSE_SHIFT, source)
    _, rows = _member_rows(bounds, members)
    sizes = bounds[members + 1] - bounds[members]
    local = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    return spread_groups(k[rows], counts[rows], local, grid.steps, COARSE_SHIFT, source)


def _jittered(k, counts, bounds, members, grid: Grid, source, steps=None):
    """The groups ``members``' grid indices jittered inside their cells, one independent draw per
    row (:func:`~dpq_spark.core.randomness.grid.jitter_indices`, as the core mechanisms do with a
    declared ``granularity``): ``(fine indices, counts, bounds)`` of the same groups in the same
    order (group ``i`` of the result is ``members[i]``), each group's fine indices sorted and
    distinct with their multiplicities. ``steps`` (one per member, optional): each group's own
    number of grid steps, for grids of different sizes with ``grid``'s jitter."""
    local, rows = _member_rows(bounds, members)
    c = counts[rows].astype(np.int64)
    k = k[rows].astype(np.int64)
    f = jitter_indices(k, c, grid.jitter, grid, source,
                       None if steps is None else np.asarray(steps, dtype=np.int64)[local])
    if not _in_group_order(k, local):
        return _by_group(f, np.ones(f.size, dtype=np.int64), np.repeat(local, c), members.size)
    # A group's sorted distinct indices (a fold's) have disjoint cells, in order, so only the
    # rows of one entry need sorting: by the key (entry, offset in its cell's range of fine
    # indices), the offsets below the jitter
    entry = np.repeat(np.arange(c.size, dtype=np.int64), c)
    low = np.maximum(k * grid.jitter - grid.jitter // 2, 0)
    bits = int(grid.jitter).bit_length()
    key = np.sort((entry << bits) + (f - np.repeat(low, c)))
    del entry, f
    new = np.ones(key.size, dtype=bool)
    new[1:] = key[1:] != key[:-1]
    at = np.flatnonzero(new)
    entry = key[at] >> bits
    f = low[entry] + (key[at] & ((1 << bits) - 1))
    f_counts = np.diff(np.append(at, key.size))
    return f, f_counts, np.searchsorted(local[entry], np.arange(members.size + 1)).astype(np.int64)


def _split_members(name, k, counts, bounds, members, whole, q, eps, relation, grid: Grid,
                   source, values):
    """The groups ``members``' data split over fine points as the core splits each group's
    (:func:`~dpq_spark.core.randomness.grid.split_ties`). A group whose split would pass
    ``SPLIT_MAX_ENTRIES`` follows the core's rule too: for JointExp and IndExp only the grid
    points in the mechanism's band are split (``Grid.unsplit``); ApproxQuantiles runs
    :func:`~dpq_spark.core.quantiles.approx_quantiles.split_lazily` on it here, writing its row
    of ``values``. Returns ``(done, fine indices, counts, bounds)``: ``done`` marks the members
    released here, the arrays hold the others in order."""
    kk, c, local, wh = _distinct_members(k, counts, bounds, members, whole)
    big = _splits_many(c, local, members.size, grid)
    done = np.zeros(members.size, dtype=bool)
    if name == "approx_quantiles" and big.any():
        for i in np.flatnonzero(big).tolist():
            at = slice(*np.searchsorted(local, [i, i + 1]))
            values[members[i]] = grid.release(split_lazily(
                kk[at], c[at], grid.tie_bits, grid.fine_size - 1, q, eps, relation, source))
        done = big
        keep = ~big[local]
        kk, c, wh = kk[keep], c[keep], None if wh is None else wh[keep]
        local = np.cumsum(~big)[local[keep]] - 1
    elif wh is None and big.any():
        wh = np.zeros(kk.size, dtype=bool)
        for i in np.flatnonzero(big).tolist():
            at = slice(*np.searchsorted(local, [i, i + 1]))
            wh[at] = ~mechanism_band(name, kk[at], c[at], q, eps, relation, grid.fine_size - 1,
                                     grid.tie_bits)
    return (done, *_split_distinct(kk, c, local, wh, int((~done).sum()), grid, source))


def _distinct_members(k, counts, bounds, members, whole=None):
    """The groups ``members``' data as the core's split sees each group's
    (:func:`_distinct_by_group`): ``(k, counts, group place in members, whole)``."""
    local, rows = _member_rows(bounds, members)
    return _distinct_by_group(k[rows].astype(np.int64, copy=False),
                              counts[rows].astype(np.int64), local,
                              None if whole is None else whole[rows])


def _splits_many(c, local, groups: int, grid: Grid) -> np.ndarray:
    """Per group: whether its split would make more than ``SPLIT_MAX_ENTRIES`` entries
    (:meth:`~dpq_spark.core.randomness.grid.Grid.splits_many`, for all groups at once)."""
    made = np.concatenate(([0], np.cumsum(np.minimum(c, 1 << grid.tie_bits))))
    at = np.searchsorted(local, np.arange(groups + 1))
    return (made[at[1:]] - made[at[:-1]]) > _grid_module.SPLIT_MAX_ENTRIES


def _split_distinct(kk, c, local, wh, groups: int, grid: Grid, source):
    """Groups' sorted distinct indices ``kk`` (rows ``c``, group ``local``) split over their grid
    points' fine points (:func:`~dpq_spark.core.randomness.grid.split_ties`, as the core
    mechanisms do on the default grid; ``wh``, a mask of entries kept whole: represented pruned
    cells, or grid points outside a large group's band): ``(fine indices, counts, bounds)`` as
    :func:`_jittered` returns them."""
    f, w, src = split_entries(kk, c, grid.tie_bits, source, wh)  # the core's draws, in order
    return _by_group(f, w, local[src], groups)


def _in_group_order(v, g) -> bool:
    """Whether ``v`` is strictly increasing within each group of ``g`` (nondecreasing)."""
    return bool(np.all((g[1:] > g[:-1]) | ((g[1:] == g[:-1]) & (v[1:] > v[:-1]))))


def _distinct_by_group(k, c, g, whole=None):
    """Each group's sorted distinct indices with their summed counts, entries of no rows
    dropped, groups in order (``g`` nondecreasing): ``(k, c, g, whole)``, as the core's split
    sees one group's data (a fold's groups are already so, and pass through)."""
    if not _in_group_order(k, g):
        order = np.lexsort((k, g))
        k, c, g = k[order], c[order], g[order]
        new = np.ones(k.size, dtype=bool)
        new[1:] = (g[1:] != g[:-1]) | (k[1:] != k[:-1])
        at = np.flatnonzero(new)
        k, c, g = k[at], np.add.reduceat(c, at), g[at]
        if whole is not None:
            whole = whole[order][at]
    rows = c > 0
    if not rows.all():
        k, c, g = k[rows], c[rows], g[rows]
        whole = None if whole is None else whole[rows]
    return k, c, g, whole


def _by_group(f, w, g, groups: int):
    """Fine indices ``f`` with counts ``w`` of groups ``g`` (in ``0..groups - 1``) as each
    group's sorted distinct indices with their counts, groups in order: ``(f, w, bounds)``."""
    if _in_group_order(f, g):  # the fold's groups: sorted distinct indices, split in order
        return f, w, np.searchsorted(g, np.arange(groups + 1)).astype(np.int64)
    order = np.lexsort((f, g))
    f, w, g = f[order], w[order], g[order]
    new = np.ones(f.size, dtype=bool)
    new[1:] = (g[1:] != g[:-1]) | (f[1:] != f[:-1])
    at = np.flatnonzero(new)
    f_counts = np.add.reduceat(w, at) if at.size else w[at]
    return f[at], f_counts, np.searchsorted(g[at], np.arange(groups + 1)).astype(np.int64)


# --------------------------------------------------------------------------------------------
# Arguments


def _check_groups(groups, keep_integers=False):
    """All groups' values and counts concatenated, and the group boundaries (checked once).
    ``keep_integers``: a :class:`FlatGroups` of 1-d integer values keeps them as they are (grid
    indices, range-checked by the caller) instead of a float64 copy."""
    if isinstance(groups, FlatGroups):
        raw = groups.values
        if (keep_integers and isinstance(raw, np.ndarray) and raw.ndim == 1
                and raw.dtype.kind in "iu"):
            x = raw
        else:
            x = check_values(raw, "groups")
        counts = (np.ones(x.size, dtype=np.int64) if groups.counts is None
                  else check_counts(groups.counts, x.size, "groups' counts"))
        bounds = np.asarray(groups.bounds)
        if (bounds.ndim != 1 or bounds.size == 0 or bounds.dtype.kind not in "iu"
                or bounds[0] != 0 or bounds[-1] != x.size or np.any(np.diff(bounds) < 0)):
            raise DPQValueError("`groups` bounds must be nondecreasing integers from 0 to the "
                                "number of values")
        return x, counts, bounds.astype(np.int64)
    if isinstance(groups, (str, bytes)) or not hasattr(groups, "__len__"):
        raise TypeError("`groups` must be a sequence of (values, counts) pairs")
    xs, cs, sizes = [], [], []
    for pair in groups:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError("`groups` must be a sequence of (values, counts) pairs")
        v = np.asarray(pair[0], dtype=np.float64) if not isinstance(pair[0], np.ndarray) else pair[0]
        if v.ndim != 1:
            raise DPQValueError("`groups` values must be 1-d arrays")
        c = np.ones(v.size, dtype=np.int64) if pair[1] is None else np.asarray(pair[1])
        if c.ndim != 1 or c.size != v.size:
            raise DPQValueError("`groups` counts must be 1-d with the length of their values")
        xs.append(v)
        cs.append(c)
        sizes.append(v.size)
    x = check_values(np.concatenate(xs) if xs else np.zeros(0), "groups")
    counts = check_counts(np.concatenate(cs) if cs else np.zeros(0, dtype=np.int64), x.size,
                          "groups' counts")
    bounds = np.concatenate(([0], np.cumsum(np.asarray(sizes, dtype=np.int64)))).astype(np.int64)
    return x, counts, bounds


# --------------------------------------------------------------------------------------------
# JointExp


@functools.lru_cache(maxsize=512)
def _sequences(K: int, m: int):
    """All nondecreasing sequences of m cells of ``0..K-1`` (shape (S, m)), each output's place
    in its run of equal cells minus one (float64) and ``log`` of its place."""
    seqs = np.array(list(itertools.combinations_with_replacement(range(K), m)), dtype=np.int64)
    seqs = seqs.reshape(-1, m)
    before = np.zeros(seqs.shape, dtype=np.float64)  # outputs before this one in its run
    for j in range(1, m):
        before[:, j] = np.where(seqs[:, j] == seqs[:, j - 1], before[:, j - 1] + 1.0, 0.0)
    return seqs, before, np.log(before + 1.0)


def _enumerate_one(cells, q, c, source) -> np.ndarray:
    """One JointExp draw (m sorted grid indices) for one group's ``cells``
    (:func:`~dpq_spark.core.quantiles.joint_exp._grid_cells`), few enough to enumerate every sequence."""
    start, width, _, pos, n = cells
    m = q.size
    seqs, before, log_place = _sequences(int(width.size), m)
    targets = np.diff(np.concatenate(([0.0], q, [1.0]))) * n
    ranks = pos[seqs]
    gaps = np.diff(ranks, axis=1, prepend=0.0, append=float(n))
    util = -np.abs(gaps - targets).sum(axis=1)
    # log C(w + k - 1, k) of a run = sum over its outputs of log((w + place - 1) / place)
    log_mult = (np.log(width[seqs] + before) - log_place).sum(axis=1)
    seq = seqs[draw_index(c * util + log_mult, source)]
    out = np.empty(m, dtype=np.int64)
    j = 0
    while j < m:  # one uniform multiset of grid points per run of equal cells
        i = int(seq[j])
        run = int(np.searchsorted(seq, i, side="right")) - j
        out[j:j + run] = int(start[i]) + uniform_multiset(source, int(width[i]), run)
        j += run
    return out


@functools.lru_cache(maxsize=64)
def _enumerable(m: int) -> int:
    """The most cells K whose ``C(K + m - 1, m)`` sequences are enumerated (at least 1)."""
    K = 1
    while math.comb(K + m, m) <= ENUMERATE_MAX:
        K += 1
    return K


def _joint_exps(k, counts, bounds, members, q, eps, relation, size, source) -> np.ndarray:
    """JointExp grid indices for the groups ``members`` (shape ``(len(members), m)``), on grids
    of ``size`` points (one number, or one per member).

    Groups with few enough cells to enumerate are drawn together: their cells (those of
    :func:`~dpq_spark.core.quantiles.joint_exp._grid_cells`, computed on padded arrays), the log-weights of
    every sequence (the expression of :func:`_enumerate_one`, on all groups with the same number
    of cells at once), one exact draw per group (:func:`~dpq_spark.core.randomness.grid.draw_index_rows`)
    and the uniform multisets of the runs (:func:`~dpq_spark.core.randomness.grid.uniform_multisets`). Of
    the others, those with few cells are enumerated one at a time (:func:`_enumerate_one`) and
    the rest released together by :func:`~dpq_spark.core.quantiles.joint_exp_many._sample_many`. Every path
    samples the exponential mechanism over grid tuples of the core's
    :func:`~dpq_spark.core.joint_exp_indices` (module docstring, "Branches on private data").
    """
    m, G = q.size, members.size
    c = eps / (2.0 * joint_exp_sensitivity(q, relation))
    sizes = np.broadcast_to(np.asarray(size, dtype=np.int64), (G,))  # each member's grid size
    out = np.empty((G, m), dtype=np.int64)
    # a group with more rows than the cells that can be enumerated: its own cells, below
    pick, pts, mul, d, slow = _distinct_rows(k, counts, bounds, members, _enumerable(m))
    if pick.size:
        done, draws = _enumerate_cells(pts, mul, d, q, c, sizes[pick], source)
        slow = np.sort(np.concatenate([slow, pick[~done]]))
        out[pick[done]] = draws
    many, cells_list, band_list, held = [], [], [], 0
    enumerable = _enumerable(m)
    for chunk, cells_of, band_of in _slow_cells(k, counts, bounds, members, slow, q, c, sizes):
        for i, g in enumerate(chunk.tolist()):
            cells = cells_of(i)
            if cells[1].size <= enumerable:  # C(K + m - 1, m) <= ENUMERATE_MAX
                out[g] = _enumerate_one(cells, q, c, source)
                continue
            many.append(g)
            cells_list.append(cells)
            band_list.append(band_of(i))
            held += cells[1].size
            if held >= CELLS_HELD:  # sample these before building more (groups are independent)
                out[many] = _joint_many(cells_list, q, c, sizes[many], source,
                                        bands=_gather_bands(band_list))
                many, cells_list, band_list, held = [], [], [], 0
    if many:
        out[many] = _joint_many(cells_list, q, c, sizes[many], source,
                                bands=_gather_bands(band_list))
    return out


def _gather_bands(parts: list) -> Bands:
    """The :class:`Bands` of the groups ``parts`` names, in order: each a ``(bands, row)`` of
    :func:`_slow_cells`' ``band_of`` (runs of rows of one chunk's bands taken at once)."""
    runs, rows = [], []
    for i, (bands, row) in enumerate(parts):
        if i and bands is not parts[i - 1][0]:
            runs.append(parts[i - 1][0].take(np.array(rows)))
            rows = []
        rows.append(row)
    runs.append(parts[-1][0].take(np.array(rows)))
    return runs[0] if len(runs) == 1 else Bands.stack(runs)


#: groups whose cells and bands :func:`_slow_cells` builds together (its (G, m, 65) arrays of
#: the reference sequence's candidates: about 10 MiB each at m = 9) ...
_CELL_GROUPS = 2048
#: ... and about this many of their rows at most (the flat arrays' temporaries: a few MiB each)
_CELL_ROWS = 1 << 18


def _slow_cells(k, counts, bounds, members, slow, q, c, grid_sizes):
    """The JointExp cells and bands of the groups ``members[slow]`` (in that order), on grids of
    ``grid_sizes`` points (one per member), chunk by
    chunk: yields ``(chunk, cells_of, band_of)``, ``chunk`` the positions (into ``members``) of
    a run of them, ``cells_of(i)`` the :func:`~dpq_spark.core.quantiles.joint_exp._grid_cells`
    tuple of the chunk's i-th group (views into flat arrays built for the whole chunk by
    :func:`_flat_cells`) and ``band_of(i)`` its bands, ``(bands, row)``: row ``row`` of a
    :class:`Bands` (:func:`_flat_bands`, or ``_bands`` alone). A chunk holds at most ``_CELL_GROUPS`` groups and
    ``_CELL_ROWS`` rows (or one larger group), so memory stays bounded; a group without a
    positive count (one cell, the whole grid) gets its cells from ``_grid_cells``. Chunking
    only groups independent draws, so no distribution changes."""
    if slow.size == 0:
        return
    sizes = bounds[members[slow] + 1] - bounds[members[slow]]
    positive = np.concatenate(([0], np.cumsum(counts > 0)))
    live = positive[bounds[members[slow] + 1]] - positive[bounds[members[slow]]] > 0
    del positive  # as large as the data: not kept while the groups are sampled
    a = 0
    rows = np.cumsum(sizes)
    while a < slow.size:
        # the chunk [a, b): at most _CELL_GROUPS groups and _CELL_ROWS rows (at least one group)
        held = rows[a] - sizes[a]
        b = min(a + _CELL_GROUPS, max(a + 1, int(np.searchsorted(rows, held + _CELL_ROWS,
                                                                 side="right"))))
        chunk = slow[a:b]
        flat = chunk[live[a:b]]
        bands = None
        if flat.size:
            start, width, log_width, pos, n, coff = _flat_cells(k, counts, bounds, members[flat],
                                                                grid_sizes[flat])
            bands = _flat_bands(start, width, log_width, pos, n, coff, q, c, grid_sizes[flat])
        where = np.cumsum(live[a:b]) - 1  # a live group's place among the chunk's live ones

        def cells_of(i, where=where, live=live[a:b], chunk=chunk):
            if not live[i]:
                g = int(members[chunk[i]])
                return _grid_cells(k[bounds[g]:bounds[g + 1]], counts[bounds[g]:bounds[g + 1]],
                                   int(grid_sizes[chunk[i]]))
            j = int(where[i])
            x, y = int(coff[j]), int(coff[j + 1])
            return start[x + j:y + j + 1], width[x:y], log_width[x:y], pos[x:y], int(n[j])

        def band_of(i, where=where, live=live[a:b], chunk=chunk, bands=bands):
            if not live[i]:
                start_i, _, _, pos_i, n_i = cells = cells_of(i)
                lo_i, hi_i, h_i = _bands(*cells, q, c, int(grid_sizes[chunk[i]]))
                return _band_set(start_i, pos_i, n_i, q, c, lo_i, hi_i, h_i), 0
            return bands, int(where[i])

        yield chunk, cells_of, band_of
        a = b


def _member_rows(bounds, members):
    """``(local, rows)``: for every row of the groups ``members`` (in order), its group's place in
    ``members`` and its index into the concatenated values."""
    sizes = bounds[members + 1] - bounds[members]
    local = np.repeat(np.arange(members.size), sizes)
    rows = np.arange(local.size) - np.repeat(np.cumsum(sizes) - sizes, sizes) + np.repeat(bounds[members], sizes)
    return local, rows


def _padded_cells(pts, mul, d, first, stop):
    """The cells of :func:`~dpq_spark.core.quantiles.joint_exp._grid_cells` and ``GridCells.of`` (the gap
    before the first point, each point, the gap after a tied point; mid-ranks), for every row
    at once: row g's data are its first ``d_g`` sorted distinct points ``pts[g]`` with
    multiplicities ``mul[g]``, on grid points ``first_g .. stop_g - 1``. Returns ``(widths,
    starts, ranks, n)``, shape ``(G, 2 D + 1)`` in slot order (gap, then point and gap per
    point); empty slots, and the slots of padding, have width 0."""
    G, D = pts.shape
    col = np.arange(D)[None, :]
    valid = col < d[:, None]
    t = np.where(valid, mul, 0)
    n = t.sum(axis=1)
    below = np.cumsum(t, axis=1) - t
    nxt = np.where(col + 1 < d[:, None], np.roll(pts, -1, axis=1), stop[:, None])
    single = t == 1
    widths = np.zeros((G, 2 * D + 1), dtype=np.int64)
    starts = np.zeros((G, 2 * D + 1), dtype=np.int64)
    ranks = np.zeros((G, 2 * D + 1), dtype=np.float64)
    widths[:, 0] = np.where(d > 0, pts[:, 0], stop) - first
    starts[:, 0] = first
    widths[:, 1::2] = np.where(valid, np.where(single, nxt - pts, 1), 0)
    widths[:, 2::2] = np.where(valid & ~single, nxt - pts - 1, 0)
    starts[:, 1::2], starts[:, 2::2] = pts, pts + 1
    ranks[:, 1::2] = below + (t + 1) / 2.0  # joint_exp._tie_rank
    ranks[:, 2::2] = (below + t).astype(np.float64)
    return widths, starts, ranks, n


def _distinct_rows(k, counts, bounds, members, D):
    """The distinct sorted grid indices and multiplicities (zero counts dropped) of the groups
    of at most ``D`` rows, as padded rows.

    Returns ``(pick, pts, mul, d, rest)``: the positions in ``members`` of those groups, their
    points and multiplicities (shape ``(len(pick), w)``, zero-padded, ``w`` the most points of
    any of them, at most ``D``), their numbers of points,
    and the positions of the other groups (more than ``D`` rows: the callers' per-group path,
    which samples the same distribution).
    """
    sizes = bounds[members + 1] - bounds[members]
    pick, rest = np.flatnonzero(sizes <= D), np.flatnonzero(sizes > D)
    local, rows = _member_rows(bounds, members[pick])
    kk, cc = k[rows], counts[rows]
    live = cc > 0
    local, kk, cc = local[live], kk[live], cc[live]
    order = np.lexsort((kk, local))
    local, kk, cc = local[order], kk[order], cc[order]
    first = np.flatnonzero(np.r_[True, (local[1:] != local[:-1]) | (kk[1:] != kk[:-1])]) if kk.size \
        else np.zeros(0, dtype=np.int64)
    dg, distinct = local[first], kk[first]
    mult = np.add.reduceat(cc, first) if first.size else np.zeros(0, dtype=np.int64)
    d = np.bincount(dg, minlength=pick.size)
    col = np.arange(dg.size) - (np.cumsum(d) - d)[dg]
    # Rows as wide as the most points any of these groups has, not D: a padding slot is a cell
    # of width 0 (weight 0, never drawn, no units of the envelope), so the draws are the same.
    width = max(1, int(d.max(initial=0)))
    pts = np.zeros((pick.size, width), dtype=np.int64)
    mul = np.zeros((pick.size, width), dtype=np.int64)
    pts[dg, col] = distinct
    mul[dg, col] = mult
    return pick, pts, mul, d, rest


def _enumerate_cells(pts, mul, d, q, c, size, source):
    """Cells of groups with ``d`` distinct sorted points ``pts`` (padded rows, multiplicities
    ``mul``) on grids of ``size`` points (one number, or one per row) and, for those that can
    be enumerated, one JointExp draw each. Returns ``(enumerated mask, draws of the enumerated
    rows)``."""
    G, D = pts.shape
    m = q.size
    widths, starts, poss, n = _padded_cells(pts, mul, d, np.zeros(G, dtype=np.int64),
                                            np.broadcast_to(np.asarray(size, np.int64), (G,)))
    keep = widths > 0
    K = keep.sum(axis=1)
    ok = np.array([math.comb(int(x) + m - 1, m) <= ENUMERATE_MAX for x in range(2 * D + 2)])[K]
    order = np.argsort(~keep, axis=1, kind="stable")  # the kept cells first, in order
    width = np.take_along_axis(widths, order, axis=1)
    start = np.take_along_axis(starts, order, axis=1)
    pos = np.take_along_axis(poss, order, axis=1)
    draws = np.empty((int(ok.sum()), m), dtype=np.int64)
    rows_ok = np.flatnonzero(ok)
    targets = np.diff(np.concatenate(([0.0], q, [1.0])))
    for cells in np.unique(K[ok]).tolist():
        which = np.flatnonzero(K[rows_ok] == cells)
        seqs, before, log_place = _sequences(cells, m)
        chunk = max(1, (1 << 22) // (seqs.shape[0] * (m + 1)))
        for lo in range(0, which.size, chunk):
            part = which[lo:lo + chunk]
            g = rows_ok[part]
            wd, st, ps, nn = width[g, :cells], start[g, :cells], pos[g, :cells], n[g].astype(np.float64)
            ranks = ps[:, seqs]
            end = np.broadcast_to(nn[:, None, None], (g.size, seqs.shape[0], 1))
            gaps = np.diff(ranks, axis=2, prepend=0.0, append=end)
            util = -np.abs(gaps - (targets * nn[:, None])[:, None, :]).sum(axis=2)
            log_mult = (np.log(wd[:, seqs] + before) - log_place).sum(axis=2)
            seq = seqs[draw_index_rows(c * util + log_mult, source)]
            draws[part] = _fill_runs(seq, np.take_along_axis(st, seq, axis=1),
                                     np.take_along_axis(wd, seq, axis=1), source)
    return ok, draws


def _fill_runs(seq, start, width, source) -> np.ndarray:
    """Grid points for sorted cell sequences: each run of k equal cells (``start``/``width`` of
    its cell, per output) gets a uniform multiset of k of the cell's points."""
    G, m = seq.shape
    out = start.copy()
    new = np.ones((G, m), dtype=bool)
    new[:, 1:] = seq[:, 1:] != seq[:, :-1]
    heads = np.flatnonzero(new.ravel())
    length = np.diff(np.append(heads, G * m))
    wide = width.ravel()[heads] > 1
    flat = out.ravel()
    for k in np.unique(length[wide]).tolist():
        h = heads[wide & (length == k)]
        points = uniform_multisets(source, width.ravel()[h], k)
        flat[h[:, None] + np.arange(k)[None, :]] += points
    return out


# --------------------------------------------------------------------------------------------
# IndExp


def _ind_exp(data, q, eps, relation, size, source) -> np.ndarray:
    """One IndExp draw: m independent single-quantile draws with ``eps / m`` each, sorted."""
    cells = GridCells.of(data, 0, size)
    each = eps / q.size
    out = [cells.sample(float(v), each, single_quantile_sensitivity(float(v), relation), source)
           for v in q]
    return np.sort(np.array(out, dtype=np.int64))


def _ind_exp_many(k, counts, bounds, members, q, eps, relation, size, source) -> np.ndarray:
    """IndExp grid indices for the groups ``members`` (shape ``(len(members), m)``): each quantile
    drawn for a block of groups at once (:func:`_exp_rows`, ``eps / m`` each; blocks of
    :func:`_blocks`), a lone group by the core's sampler."""
    each = eps / q.size

    def rows(pts, mul, d):
        zeros = np.zeros(d.size, dtype=np.int64)
        stop = np.full(d.size, size, dtype=np.int64)
        draws = [_exp_rows(pts, mul, zeros, d.astype(np.int64), zeros, stop, float(v), each,
                           single_quantile_sensitivity(float(v), relation), source) for v in q]
        return np.sort(np.stack(draws, axis=1), axis=1)

    def one(k_g, c_g):
        return _ind_exp(sort_data(k_g, c_g, 0, size - 1), q, eps, relation, size, source)

    return _blocks(k, counts, bounds, members, q.size, rows, one)


def _approx_many(k, counts, bounds, members, q, eps, relation, top, source) -> np.ndarray:
    """ApproxQuantiles grid indices for the groups ``members`` (shape ``(len(members), m)``): the
    recursion run for a block of groups at once, node by node (:func:`_approx_rows`; blocks of
    :func:`_blocks`), a lone group by the core's sampler."""

    def one(k_g, c_g):
        return _approx_sample(sort_data(k_g, c_g, 0, top), top, q, eps, relation, source)

    return _blocks(k, counts, bounds, members, q.size,
                   lambda pts, mul, d: _approx_rows(pts, mul, d, q, eps, relation, top, source), one)


#: IndExp / ApproxQuantiles: groups drawn together hold about this many padded points (rows
#: times the block's widest group), a few tens of MiB of tables
_BLOCK_POINTS = 1 << 17


def _blocks(k, counts, bounds, members, m, rows, one) -> np.ndarray:
    """Run a single-quantile-draw mechanism for the groups ``members``: ``rows(pts, mul, d)``
    on padded rows (:func:`_distinct_rows`) for blocks of groups of similar sizes (sorted by
    size, each block's groups times its largest size at most ``_BLOCK_POINTS``, or one group),
    ``one(k_g, counts_g)`` for a block of a single group (the core's sampler, so that one large
    group draws what the core draws from the same seed). Padding slots are cells of width 0
    (weight 0, never drawn), so every path samples each group's own law; which block a group
    joins depends on sizes only and changes no distribution."""
    out = np.empty((members.size, m), dtype=np.int64)
    sizes = bounds[members + 1] - bounds[members]
    order = np.argsort(sizes, kind="stable")
    ordered = sizes[order]
    a = 0
    while a < order.size:
        # sizes increase: (j - a + 1) * ordered[j] is the block's load if it ends at j
        ahead = ordered[a:a + _BLOCK_POINTS]  # a block holds at most that many groups
        load = np.arange(1, ahead.size + 1) * np.maximum(ahead, 1)
        b = a + max(1, int(np.searchsorted(load, _BLOCK_POINTS, side="right")))
        block = order[a:b]
        if block.size == 1:
            g = int(block[0])
            lo, hi = int(bounds[members[g]]), int(bounds[members[g] + 1])
            out[g] = one(k[lo:hi], counts[lo:hi])
        else:
            pick, pts, mul, d, _ = _distinct_rows(k, counts, bounds, members[block],
                                                  int(ordered[b - 1]))
            out[block[pick]] = rows(pts, mul, d)
        a = b
    return out


def _approx_rows(pts, mul, d, q, eps, relation, top, source) -> np.ndarray:
    """The recursion of ``approx_quantiles._sample_indices`` for many groups at once.

    The recursion's shape (which quantile each node splits on, its epsilon and sensitivity)
    is public and the same for every group; only the data and the draws differ. So every node
    is one vectorised draw for all groups (:func:`_exp_rows`), each group's sub-problem being a
    range ``[a, b)`` of its padded sorted points and a grid range ``[lo, hi]``, split at its
    draw ``v`` exactly as the core splits it (points below ``v`` left, the others right).
    """
    G = pts.shape[0]
    m = q.size
    eps_level = eps / recursion_depth(m)
    out = np.empty((G, m), dtype=np.int64)
    col = np.arange(pts.shape[1])[None, :]
    stack = [(np.zeros(G, dtype=np.int64), d.astype(np.int64), np.zeros(G, dtype=np.int64),
              np.full(G, top, dtype=np.int64), q, np.arange(m), True)]
    while stack:
        a, b, lo, hi, qs, slots, is_top = stack.pop()
        mid = qs.size // 2
        q_star = float(qs[mid])
        v = _exp_rows(pts, mul, a, b, lo, hi + 1, q_star, eps_level,
                      _approx_sensitivity(q_star, relation, is_top), source)
        out[:, slots[mid]] = v
        inside = (col >= a[:, None]) & (col < b[:, None])
        cut = a + (inside & (pts < v[:, None])).sum(axis=1)
        if mid > 0:
            stack.append((a, cut, lo, v, qs[:mid] / q_star, slots[:mid], False))
        if mid + 1 < qs.size:
            end = cut + (inside & (col >= cut[:, None]) & (pts <= hi[:, None])).sum(axis=1)
            right_q = (qs[mid + 1:] - q_star) / (1.0 - q_star)
            stack.append((cut, end, v, hi, right_q, slots[mid + 1:], False))
    return np.sort(out, axis=1)


def _exp_rows(pts, mul, a, b, first, stop, q, epsilon, sensitivity, source) -> np.ndarray:
    """``GridCells.sample`` of :mod:`dpq_spark.core.quantiles.single_quantile` for every row at once: row g's data are the
    points ``pts[g, a_g:b_g]`` (sorted, distinct, multiplicities ``mul``), its grid points
    ``first_g .. stop_g - 1``; one exponential-mechanism draw of a grid index per row, from the
    same cells and the same log-weight expression, sampled exactly
    (:func:`~dpq_spark.core.randomness.grid.draw_index_rows`, then a uniform point of the cell)."""
    D = pts.shape[1]
    idx = np.minimum(a[:, None] + np.arange(D)[None, :], D - 1)  # row g's points a_g.. first
    widths, starts, ranks, n = _padded_cells(np.take_along_axis(pts, idx, axis=1),
                                             np.take_along_axis(mul, idx, axis=1), b - a,
                                             first, stop)
    scale = epsilon / (2.0 * sensitivity)
    with np.errstate(divide="ignore"):  # empty slots: log 0 = -inf, weight 0
        log_w = np.log(widths.astype(np.float64)) - scale * np.abs(ranks - q * n[:, None])
    r = draw_index_rows(log_w, source)[:, None]
    return (np.take_along_axis(starts, r, axis=1)[:, 0]
            + source.below_array(np.take_along_axis(widths, r, axis=1)[:, 0]))


# --------------------------------------------------------------------------------------------
# AggTree


def _agg_trees(x, counts, bounds, n, members, q, eps, grid, relation, b, h, source) -> np.ndarray:
    """AggTree for the groups ``members``, chunk by chunk: exact histograms, bulk noise, batched
    aggregation and descent. Returns shape ``(len(members), m)``."""
    swap = relation is NeighboringRelation.SWAP
    table = dlap_table(dlap_scale(h * (2 if swap else 1), eps))
    leaves = b**h
    nodes = sum(b**level for level in range(1, h + 1))
    per_chunk = max(1, _CHUNK_NODES // nodes)
    lower, upper = grid.lower, grid.upper
    out = np.empty((members.size, q.size), dtype=np.float64)
    for lo in range(0, members.size, per_chunk):
        chunk = members[lo:lo + per_chunk]
        G = chunk.size
        # Noise for every node of every tree of the chunk, then the exact counts added in place
        # (node counts are whole numbers below 2**53, so float64 sums are exact integers).
        noise = table.sample(source, G * nodes, dtype=np.float64)
        noisy = [None]
        used = 0
        for level in range(1, h + 1):
            noisy.append(noise[used:used + G * b**level].reshape(G, b**level))
            used += G * b**level
        local, rows = _member_rows(bounds, chunk)
        if rows.size:
            # the leaf of each clamped value, as agg_tree's
            leaf = leaf_index(np.clip(x[rows], lower, upper), lower, upper, leaves)
            weight = counts[rows].astype(np.float64)
            for level in range(1, h + 1):  # (bincount: np.add.at's sums, several times faster)
                node = local * b**level + leaf // b ** (h - level)
                noisy[level] += np.bincount(node, weight, G * b**level).reshape(G, b**level)
        est = _post_process(noisy, b, table.scale, n[chunk] if swap else None, q, lower, upper)
        out[lo:lo + G] = grid.value(grid.snap(est))  # rounded to the grid, as agg_tree does
    return out


def _post_process(noisy, b, scale, root, q, lower, upper) -> np.ndarray:
    """AggTree's post-processing of noisy node counts of shape ``(G, b**l)``, with exactly the
    numbers of :func:`~dpq_spark.core.quantiles.agg_tree.agg_tree` per group: Honaker's bottom-up pass on
    every node, then its top-down pass only on the children of the nodes the descent visits
    (the descent reads nothing else), and the descent."""
    est = _aggregate_and_descend(noisy, b, node_variance(scale), root, q, lower, upper)
    return np.sort(np.clip(est, lower, upper), axis=1)


def _aggregate_and_descend(noisy, b, variance, root, q, lower, upper) -> np.ndarray:
    """:func:`~dpq_spark.core.quantiles.agg_tree.honaker_aggregate` then ``_descend`` for every group and
    quantile, the same floating-point operations in the same order on the nodes that matter."""
    height = len(noisy) - 1
    G, m = noisy[height].shape[0], q.size
    var_low, var_high = honaker_variances(b, height, variance, root is not None)
    # Bottom-up (every node), as honaker_aggregate.
    low = [None] * (height + 1)
    low[height] = np.asarray(noisy[height], dtype=np.float64)
    for level in range(height - 1, 0, -1):
        child_sum = low[level + 1].reshape(G, -1, b).sum(axis=-1)
        var_children = b * var_low[level + 1]
        w = var_children / (variance + var_children)
        low[level] = w * noisy[level] + (1.0 - w) * child_sum
    if root is None:
        low[0] = low[1].reshape(G, -1, b).sum(axis=-1)
    else:
        low[0] = np.asarray(root, dtype=np.float64).reshape(G, 1)
    # Top-down along the descent paths only.
    high = np.broadcast_to(low[0][:, :1], (G, m)).copy()  # high of the current node, per path
    node = np.zeros((G, m), dtype=np.int64)
    left = np.full((G, m), float(lower))
    width = np.full((G, m), float(upper) - float(lower))
    share = np.broadcast_to(q, (G, m)).astype(np.float64)
    going = np.ones((G, m), dtype=bool)
    rows = np.arange(G)[:, None]
    for level in range(1, height + 1):
        if level == 1:  # every path is at the root: its children are the same for all m
            kids_low = low[1][:, None, :]  # (G, 1, b), broadcast against (G, m) below
            kids_noisy = np.asarray(noisy[1], dtype=np.float64)[:, None, :]
        else:
            # (G, m, b) flat indices of the children of every path's node
            kids = ((node + rows * b ** (level - 1)) * b)[..., None] + np.arange(b)
            kids_low = low[level].reshape(-1).take(kids)
            kids_noisy = np.asarray(noisy[level], dtype=np.float64).reshape(-1).take(kids)
        if np.isinf(var_high[level - 1]):
            kids_high, final = kids_noisy, kids_low
        else:
            sibling_sum = kids_low.sum(axis=-1, keepdims=True)
            from_above = high[..., None] - (sibling_sum - kids_low)
            var_above = var_high[level - 1] + (b - 1) * var_low[level]
            w_own = var_above / (variance + var_above)
            kids_high = w_own * kids_noisy + (1.0 - w_own) * from_above
            w_low = var_above / (var_low[level] + var_above)
            final = w_low * kids_low + (1.0 - w_low) * from_above
        # The descent step of agg_tree._descend on the children's final estimates.
        cum = np.cumsum(final, axis=-1)
        total = cum[..., -1]
        going &= total > 0
        if not going.any():
            break
        target = share * total
        at = _row_starts(cum.shape, m)
        child = np.minimum(_searchsorted_left(cum, target, at), b - 1)
        at += child  # each path's chosen child, as a flat index
        mine = final.reshape(-1).take(at)
        before = cum.reshape(-1).take(at) - mine
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.minimum(np.maximum((target - before) / mine, 0.0), 1.0)
        share = np.where(going, np.where(mine > 0, ratio, 0.5), share)
        high = np.where(going, kids_high.reshape(-1).take(at), high)
        node = np.where(going, node * b + child, node)
        new_width = width / b
        left = np.where(going, left + child * new_width, left)
        width = np.where(going, new_width, width)
    return left + share * width


def _row_starts(shape: tuple, m: int) -> np.ndarray:
    """For arrays of ``shape`` ``(G, r, b)`` read by m paths per group (``r`` is m, or 1 when
    the m paths share one row): the flat index of each path's row start, shape ``(G, m)``."""
    G, r, b = shape
    return np.arange(G)[:, None] * (r * b) + (np.arange(m) * b if r > 1 else np.zeros(m, np.int64))


def _searchsorted_left(a: np.ndarray, key: np.ndarray, at: np.ndarray) -> np.ndarray:
    """``np.searchsorted(row, key[i], side="left")`` for each path's row of ``a`` (its flat start
    ``at[i]``, :func:`_row_starts`), step for step the binary search numpy runs for one key, also
    on rows that are not sorted: a range of s entries at most halves a step, so the number of
    bits of the row length b is enough steps."""
    b = a.shape[-1]
    flat = a.reshape(-1)
    lo = np.zeros(key.shape, dtype=np.int64)
    hi = np.full(key.shape, b, dtype=np.int64)
    for _ in range(b.bit_length()):
        open_ = lo < hi
        mid = (lo + hi) >> 1
        less = flat.take(at + np.minimum(mid, b - 1)) < key
        lo = np.where(open_ & less, mid + 1, lo)
        hi = np.where(open_ & ~less, mid, hi)
    return lo


# --------------------------------------------------------------------------------------------
# JointExp cells and bands of many groups at once


def _flat_cells(k, counts, bounds, members, size):
    """:func:`~dpq_spark.core.quantiles.joint_exp._grid_cells` of the groups ``members`` (each
    with at least one positive count; grids of ``size`` points, one number or one per member)
    in a few array operations over all of them.

    Returns ``(start, width, log_width, pos, n, coff)``: group g's cells are ``coff[g] :
    coff[g + 1]`` of ``width``, ``log_width`` and ``pos`` and its ``K + 1`` starts (the last one
    its grid's size) are ``coff[g] + g : coff[g + 1] + g + 1`` of ``start``; ``n`` is its number
    of rows.
    Every number is the one ``_grid_cells`` computes for the group alone (the same elementwise
    operations; tested bit for bit).
    """
    local, rows = _member_rows(bounds, members)
    kk, cc = k[rows], counts[rows]
    live = cc > 0
    if not live.all():
        local, kk, cc = local[live], kk[live], cc[live]
    ordered = kk.size < 2 or bool(np.all((local[1:] > local[:-1]) | (kk[1:] > kk[:-1])))
    if ordered:  # sorted and distinct within each group (a fold's groups)
        dg, distinct, mult = local, kk, cc
    else:
        order = np.lexsort((kk, local))
        local, kk, cc = local[order], kk[order], cc[order]
        first = np.flatnonzero(np.r_[True, (local[1:] != local[:-1]) | (kk[1:] != kk[:-1])])
        dg, distinct, mult = local[first], kk[first], np.add.reduceat(cc, first)
    distinct, mult = distinct.astype(np.int64), mult.astype(np.int64)
    G, D = members.size, distinct.size
    d = np.bincount(dg, minlength=G)
    if np.any(d == 0):
        raise AssertionError("_flat_cells: a group without rows")  # callers enumerate those
    gstart = np.cumsum(d) - d
    gend = gstart + d - 1
    n = np.add.reduceat(mult, gstart)
    cm = np.cumsum(mult) - mult
    below = cm - np.repeat(cm[gstart], d)  # #{x < d} within the group
    nxt = np.empty(D, dtype=np.int64)
    nxt[:-1] = distinct[1:]
    nxt[gend] = size
    single = mult == 1
    w_main = np.where(single, nxt - distinct, 1)
    w_gap = np.where(single, 0, nxt - distinct - 1)
    has_gap = w_gap > 0
    lead = distinct[gstart] > 0
    is_first = np.zeros(D, dtype=bool)
    is_first[gstart] = True
    leads_here = is_first & np.repeat(lead, d)
    emit = 1 + has_gap + leads_here
    end = np.cumsum(emit)
    begin = end - emit
    main_at = begin + leads_here
    gap_at = main_at[has_gap] + 1
    total = int(end[-1])
    width = np.empty(total, dtype=np.int64)
    cstart = np.empty(total, dtype=np.int64)
    pos = np.empty(total, dtype=np.float64)
    lead_at = begin[gstart[lead]]
    width[lead_at], cstart[lead_at], pos[lead_at] = distinct[gstart[lead]], 0, 0.0
    width[main_at], cstart[main_at] = w_main, distinct
    pos[main_at] = below + _tie_rank(mult.astype(np.float64))
    width[gap_at], cstart[gap_at] = w_gap[has_gap], distinct[has_gap] + 1
    pos[gap_at] = (below[has_gap] + mult[has_gap]).astype(np.float64)
    coff = np.zeros(G + 1, dtype=np.int64)
    coff[1:] = end[gend]
    K = np.diff(coff)
    start = np.empty(total + G, dtype=np.int64)
    start[np.arange(total) + np.repeat(np.arange(G), K)] = cstart
    start[coff[1:] + np.arange(G)] = size
    return start, width, np.log(width.astype(np.float64)), pos, n, coff


#: entries of :class:`_GroupSearch`'s look-up table at most (8 bytes each), else it searches
_SEARCH_TABLE = 1 << 21


class _GroupSearch:
    """``np.searchsorted(pos[coff[g]:coff[g + 1]], x[g], side)`` for every row g of an ``x`` of
    shape ``(G, ...)``, for all groups at once, exactly; the keys built once for many searches.

    Cell positions are mid-ranks, multiples of 1/2: ``p <= x`` iff ``2 p <= floor(2 x)`` and
    ``p < x`` iff ``2 p <= ceil(2 x) - 1``, comparisons of integers (``2 x`` and its floor are
    exact in float64). Each group's doubled positions are shifted into a disjoint int64 range
    and its queries, clipped to the range, counted there: the same indices as the per-group
    float search. The count is a look-up in a table of all groups' keys when that table has at
    most ``_SEARCH_TABLE`` entries, else a search.
    """

    def __init__(self, pos, coff):
        self.coff = coff
        two = (2.0 * pos).astype(np.int64)
        self.top = int(two.max(initial=0))
        span = self.top + 3  # group g's keys lie in [g span, g span + top], its queries within 1
        self.shift = np.arange(coff.size - 1, dtype=np.int64) * span
        self.keys = two + np.repeat(self.shift, np.diff(coff))
        self.table = None
        if self.keys.size and span * (coff.size - 1) < _SEARCH_TABLE:
            # table[t + 1] = the number of keys <= t (all groups'), t = -1 .. G span - 1
            marks = np.zeros(span * (coff.size - 1) + 1, dtype=np.int64)
            marks[self.keys + 1] = 1
            self.table = np.cumsum(marks)

    def __call__(self, x, side):
        per_row = (-1,) + (1,) * (x.ndim - 1)
        doubled = np.floor(2.0 * x) if side == "right" else np.ceil(2.0 * x) - 1.0
        query = (np.clip(doubled, -1.0, self.top + 1.0).astype(np.int64)
                 + self.shift.reshape(per_row))
        below = (self.table[query + 1] if self.table is not None  # keys <= query, all groups'
                 else np.searchsorted(self.keys, query.ravel(), side="right").reshape(x.shape))
        return below - self.coff[:-1].reshape(per_row)


def _flat_bands(start, width, log_width, pos, n, coff, q, c, size) -> Bands:
    """:func:`~dpq_spark.core.quantiles.joint_exp._bands` of every group of :func:`_flat_cells`
    (grids of ``size`` points, one number or one per group) at once, with what their envelopes
    need (:class:`~dpq_spark.core.quantiles.joint_exp_envelope.Bands`): the same integers and
    half-widths as ``_bands`` gives each group alone (the same float64 operations in the same
    order; sums over a group's m or m + 1 terms are row reductions of contiguous rows, which
    numpy adds as it adds the 1-d array; tested on many groups)."""
    m = q.size
    G = n.size
    K = np.diff(coff)
    base = coff[:-1, None]
    nf = n.astype(np.float64)
    cum_target = q[None, :] * n[:, None]  # P_j, per group
    in_groups = _GroupSearch(pos, coff)
    # Lower bound 1: the reference sequence.
    centre = in_groups(cum_target, "right") - 1
    span = np.arange(-32, 33)
    cand = np.minimum(np.maximum(centre[:, :, None] + span[None, None, :], 0), (K - 1)[:, None, None])
    at = cand + base[:, :, None]
    score = log_width[at] - 2.0 * c * np.abs(pos[at] - cum_target[:, :, None])
    best = np.argmax(score, axis=2)
    ref = np.maximum.accumulate(np.take_along_axis(cand, best[:, :, None], axis=2)[:, :, 0],
                                axis=1)
    log_z_low = _flat_sequence_weight(ref + base, width, log_width, pos, nf, q, c)
    # Lower bound 2: boxes, where every group's boxes exist and beat bound 1.
    box = _flat_boxes(start, pos, n, coff, q, c, in_groups)
    log_z_low = np.where(np.isfinite(box) & (box > log_z_low), box, log_z_low)
    j = np.arange(1, m + 1)
    # per group, the numbers _bands computes with math.log on its own size
    sizes, at = np.unique(np.broadcast_to(np.asarray(size, np.int64), (G,)), return_inverse=True)
    log_sm = np.array([math.log(s + m) for s in sizes.tolist()])[at]
    log_s = np.array([math.log(s) for s in sizes.tolist()])[at]
    log_volume = (m - 1) * log_sm[:, None] - lgamma(j)[None, :] - lgamma(m - j + 1)[None, :]
    slack = (log_volume + log_s[:, None] + math.log(m) - _ENVELOPE_NATS
             - log_z_low[:, None])
    half = np.maximum(slack, 0.0) / (2.0 * c)
    log_z_new = np.maximum(log_z_low,
                           _weighted_box_bound(log_width, pos, n, coff, q, c, in_groups))
    lo, hi, h = _deviation_bands(start, n, coff, q, c, in_groups, log_sm, log_z_new,
                                 half.max(axis=1), ref)
    sbase = (coff[:-1] + np.arange(G))[:, None]  # group g's starts begin at coff[g] + g
    # the envelopes' boxes, of the groups with tuples outside their bands (the others have none)
    L = components(m)
    g_lo = np.zeros((G, m, L), dtype=np.int64)
    g_hi = np.zeros((G, m, L), dtype=np.int64)
    out = np.flatnonzero(np.isfinite(h))
    if out.size == G:
        g_lo, g_hi = box_ranges(h, start, sbase[:, 0], n, q, c, in_groups)
    elif out.size:
        def search(x, side):  # the rows of x are the groups `out`
            full = np.zeros((G,) + x.shape[1:])
            full[out] = x
            return in_groups(full, side)[out]
        g_lo[out], g_hi[out] = box_ranges(h[out], start, sbase[out, 0], n[out], q, c, search)
    return Bands(lo, hi, h, g_lo, g_hi, start[lo + sbase], start[hi + sbase])


def _flat_sequence_weight(seq, width, log_width, pos, n, q, c) -> np.ndarray:
    """``joint_exp._log_sequence_weight`` of one nondecreasing sequence of global cells per
    row of ``seq``: the utility summed per row, and the multiset counts added output by output
    in the order the per-group loop adds them (a run's log width, then one step per further
    output)."""
    G, m = seq.shape
    ranks = np.concatenate([np.zeros((G, 1)), pos[seq], n[:, None]], axis=1)
    targets = np.diff(np.concatenate(([0.0], q, [1.0])))[None, :] * n[:, None]
    util = -np.ascontiguousarray(np.abs(np.diff(ranks, axis=1) - targets)).sum(axis=1)
    w = width[seq].astype(np.float64)
    log_k = np.array([math.log(v) for v in range(1, m + 1)])  # math.log(k), as _log_run_step
    log_mult = np.zeros(G)
    place = np.zeros(G, dtype=np.int64)  # outputs before this one in its run
    for j in range(m):
        if j:
            place = np.where(seq[:, j] == seq[:, j - 1], place + 1, 0)
        step = np.log(w[:, j] + place.astype(np.float64)) - log_k[place]
        log_mult = log_mult + np.where(place == 0, log_width[seq[:, j]], step)
    return c * util + log_mult


def _flat_boxes(start, pos, n, coff, q, c, in_groups):
    """``joint_exp._box_lower_bound`` of every group: the log bound, ``-inf`` where the group
    has none."""
    G = n.size
    K = np.diff(coff)
    nf = n.astype(np.float64)
    cum = q[None, :] * n[:, None]
    gaps = np.diff(np.concatenate([np.zeros((G, 1)), cum, nf[:, None]], axis=1), axis=1)
    h_max = np.minimum(gaps[:, :-1], gaps[:, 1:]) / 2.0
    ok = np.all(h_max >= 1.0, axis=1)
    if not ok.any():
        return np.full(G, -np.inf)
    tops = np.ceil(np.log2(np.where(ok, h_max.max(axis=1), 1.0))).astype(np.int64)
    L = int(tops.max()) + 1
    grid = 2.0 ** np.arange(0, L)
    h = np.minimum(grid[None, None, :], h_max[:, :, None])
    left = in_groups(cum[:, :, None] - h, "left")
    right = in_groups(cum[:, :, None] + h, "left")
    valid = (right > left) & (np.arange(L)[None, None, :] <= tops[:, None, None])
    Kb = K[:, None, None]
    lc = np.minimum(left, Kb - 1)
    rc = np.minimum(np.maximum(right - 1, 0), Kb - 1)
    base = coff[:-1, None, None]
    dist = np.maximum(np.abs(pos[lc + base] - cum[:, :, None]),
                      np.abs(pos[rc + base] - cum[:, :, None]))
    sbase = base + np.arange(G)[:, None, None]  # group g's starts begin at coff[g] + g
    with np.errstate(divide="ignore"):
        length = np.log((start[np.minimum(right, Kb) + sbase]
                         - start[lc + sbase]).astype(np.float64))
    score = np.where(valid, length - 2.0 * c * dist, -np.inf)
    best = np.argmax(score, axis=2)
    chosen = np.take_along_axis(score, best[:, :, None], axis=2)[:, :, 0]
    fine = ok & np.all(np.isfinite(chosen), axis=1)
    return np.where(fine, np.ascontiguousarray(chosen).sum(axis=1), -np.inf)
