"""The per-group step of ``dp_quantiles``: grid-index (or bucket) counts in, one DP release out.

This runs inside ``mapInArrow`` on the executors (streaming each partition's rows through a
:class:`~dpq_spark.spark._fold.Fold`) and on the driver when there is no grouping or a public key has no rows. With
bounds, JointExp and IndExp get each group's indices on the core's default grid (exact, or for a
partition past the fold budget the represented data of :mod:`dpq_spark.core.quantiles.coarse_bands`),
its rows split over each grid point's fine points as the core splits them
(:func:`~dpq_spark.core.randomness.grid.split_ties`);
ApproxQuantiles and AggTree get coarse cells (ApproxQuantiles picked by auto for up to 2**20
rows each row at a random sub-cell of its cell, :mod:`dpq_spark.core.quantiles.coarse_spread`). For ``mechanism="auto"`` the noisy count and choice
come first (:func:`~dpq_spark.core.quantiles.choose.plan_auto`), so the fold knows which data a spilled
group needs. It imports numpy and pyarrow only (pandas only for the driver's per-group frames),
never pyspark or scipy, so that it pickles by reference and stays cheap to import in a Python
worker (tests/spark/test_worker_imports.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    import pandas as pd

from dpq_spark.core.errors import BoundsNotFoundError
from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.core.quantiles.batch import BATCH_MECHANISMS, FlatGroups, release_many
from dpq_spark.core.quantiles.batch_private_bounds import (
    BOUNDS_NOT_FOUND,  # ``mechanism`` of a bounds-free group whose bounds were not found
    PRIVATE_BOUNDS_MECHANISMS,
    release_many_private_bounds,
)
from dpq_spark.core.randomness.samplers import discrete_laplace
from dpq_spark.core.quantiles.choose import grid_points, plan_auto
from dpq_spark.core.quantiles.coarse_bands import (
    BAND_LOG_TOL,
    COARSE_SHIFT,
    coarse_midpoints,
    coarse_of,
    grid_coarse_shift,
    mechanism_band,
    represent,
)
from dpq_spark.core.quantiles.coarse_spread import spread_in_cells, spreads
from dpq_spark.core.randomness.grid import Grid, jitter_indices, split_ties
from dpq_spark.core.quantiles.approx_quantiles import approx_quantiles_indices
from dpq_spark.core.quantiles.ind_exp import ind_exp_indices
from dpq_spark.core.quantiles.joint_exp import joint_exp_indices
from dpq_spark.spark import _arrow as arrow
from dpq_spark.spark._buckets import bucket_values
from dpq_spark.spark._columns import CELL, COUNT, GID, KEY_HASH, MECHANISM, UNITS
from dpq_spark.spark._heap import trim_heap
from dpq_spark.spark._fold import FOLD_BUDGET, SPILL_SHRINK, Fold, reduce_sorted
from dpq_spark.spark._mechanisms import get_mechanism
from dpq_spark.spark._packing import bucket_pieces

__all__ = ["ReleaseParams", "release_group", "release_counts", "release_values",
           "release_partition", "release_keyed_partition"]




_UINT64 = 1 << 64


@dataclass(frozen=True)
class ReleaseParams:
    """Public, validated parameters of one group's release (pickled to the executors).

    ``epsilon`` is what the mechanism receives for one group, after the split for partition
    selection and the scaling for contribution bounding. ``threshold``/``noise_scale`` are set
    only when keys come from DP partition selection. ``base_seed`` is ``None`` in production
    (fresh OS entropy in every call) and an int only when the caller passed a Generator.
    ``lower = upper = None`` is the bounds-free path: cells are indexes of the public log-scale
    bucket grid (``resolution == BUCKETS``) and the mechanism buys private bounds with
    ``bounds_share`` of ``epsilon`` (``None``: the core's default).
    """

    keys: tuple[str, ...]
    quantiles: tuple[float, ...]
    epsilon: float
    lower: float | None
    upper: float | None
    resolution: int
    neighboring: str
    mechanism: str
    base_seed: int | None = None
    threshold: float | None = None
    noise_scale: float | None = None
    extra_columns: tuple[str, ...] = ()
    key_hashes: tuple[int, ...] | None = None  # public-key path with a seeded rng only
    bounds_share: float | None = None  # bounds-free path only
    fold_budget: int = FOLD_BUDGET  # distinct (group, grid index) pairs before a partition spills
    spill_shrink: float = SPILL_SHRINK  # ... if its coarse counts are at most this fraction
    # The declared grid step (``Grid(lower, upper, granularity)``, ties jittered as in the
    # core); None: the default grid. Without bounds, passed to the mechanism.
    granularity: float | None = None

    @property
    def bounds_free(self) -> bool:
        return self.lower is None


def _group_rng(params: ReleaseParams, key_hash) -> np.random.Generator:
    if params.base_seed is None:
        return resolve_rng(None)
    return np.random.default_rng([params.base_seed, int(key_hash) % _UINT64])


def release_group(pdf: pd.DataFrame, params: ReleaseParams) -> pd.DataFrame:
    """Release the quantiles of one group from its index counts (driver side).

    Parameters
    ----------
    pdf : pandas.DataFrame
        The rows of one group: key columns (absent when ungrouped), ``CELL`` (grid index with
        bounds, bucket without),
        ``COUNT`` (rows in the cell, 0 rows allowed), optionally ``UNITS`` (privacy units first
        seen in the cell) and ``KEY_HASH``.
    params : ReleaseParams
        Public parameters.

    Returns
    -------
    pandas.DataFrame
        Key columns, ``quantile`` and ``value``: one row per quantile, or no rows when partition
        selection drops the group.

    Privacy
    -------
    ``params.epsilon``-DP for the group's rows under ``params.neighboring`` (the mechanism's
    guarantee, as implemented ``(epsilon + eta, delta)``); with partition selection, also the
    Laplace threshold step.
    """
    real = pdf[pdf[COUNT] > 0]
    cells = real[CELL].to_numpy(dtype=np.int64)
    counts = real[COUNT].to_numpy(dtype=np.int64)
    order = np.argsort(cells, kind="stable")
    units = int(real[UNITS].sum()) if UNITS in real.columns else None
    key_hash = pdf[KEY_HASH].iloc[0] if KEY_HASH in pdf.columns and len(pdf) else 0
    keys = {k: pdf[k].iloc[0] for k in params.keys}
    return release_counts(keys, cells[order], counts[order], units, key_hash, params)


def release_counts(keys: dict, cells: np.ndarray, counts: np.ndarray, units, key_hash,
                   params: ReleaseParams) -> pd.DataFrame:
    """Release one group from sorted distinct ``cells`` and their ``counts``.

    ``units`` is the group's count of privacy units for partition selection (``None``: one row
    is one unit, so it is ``counts.sum()``).
    """
    out = release_values(cells, counts, units, key_hash, params)
    if out is None:
        return _frame(keys, params, np.empty(0), params.mechanism)
    return _frame(keys, params, *out)


def release_values(cells: np.ndarray, counts: np.ndarray, units, key_hash,
                   params: ReleaseParams) -> tuple[np.ndarray, str] | None:
    """The released values of one group and the name of the mechanism that ran (for ``"auto"``
    the one it picked), or ``None`` when partition selection drops the group. With bounds,
    ``cells`` are grid indices (:func:`release_fine`); without, bucket indices."""
    if not params.bounds_free:
        return release_fine(cells, counts, units, key_hash, params)
    rng = _group_rng(params, key_hash)
    if params.threshold is not None:
        # integer unit count + exact discrete Laplace noise vs an integer threshold (_selection)
        size = int(counts.sum()) if units is None else int(units)
        if size + discrete_laplace(resolve_rng(rng), params.noise_scale) < params.threshold:
            return None
    mechanism = get_mechanism(params.mechanism)
    # bounds-free: the registry entry buys private bounds first (bounds_share of epsilon)
    extra = {"bounds_share": params.bounds_share} if params.bounds_share is not None else {}
    if params.granularity is not None:
        extra["granularity"] = params.granularity
    try:
        out = mechanism(
            bucket_values(cells),
            np.asarray(params.quantiles, dtype=np.float64),
            epsilon=params.epsilon,
            lower=params.lower,
            upper=params.upper,
            neighboring=params.neighboring,
            counts=counts,
            rng=rng,
            **extra,
        )
    except BoundsNotFoundError:  # too few rows for this group's bounds budget: a flagged row
        return np.full(len(params.quantiles), np.nan), BOUNDS_NOT_FOUND
    name = getattr(out, "mechanism", None) or params.mechanism
    return np.asarray(out, dtype=np.float64), str(name)


_OUTPUT_GROUPS = 512  # groups per yielded output batch
_FREE_ENTRIES = 1 << 19  # bounds-free: (group, bucket) entries released together, at most
_BATCH_GROUPS = 16384  # groups per release_many call (its fixed costs paid once per call)


class Released(NamedTuple):
    """Releases of some groups, in gid order: what the release paths below yield, a block of
    groups at a time (one ``release_many`` call's, or one group's), so that the output batches
    are built with array operations, not a Python step per group (one partition of 500,000
    groups of 10 rows: 0.25-0.28 s of CPU outside ``release_many`` against 0.46-0.53 s with a
    tuple a group)."""

    gids: np.ndarray  # int64, shape (G,)
    values: np.ndarray  # float64, shape (G, m): each group's m values, in the order of quantiles
    names: list  # each group's mechanism


def _one(gid: int, values, name: str) -> Released:
    """One group's release as a block."""
    return Released(np.array([gid], dtype=np.int64),
                    np.asarray(values, dtype=np.float64).reshape(1, -1), [name])


def _joined(blocks: list) -> Released:
    if len(blocks) == 1:
        return blocks[0]
    return Released(np.concatenate([b.gids for b in blocks]),
                    np.concatenate([b.values for b in blocks]),
                    [name for b in blocks for name in b.names])


def output_blocks(released, size: int = _OUTPUT_GROUPS):
    """The blocks of ``released`` (an iterable of :class:`Released`) re-cut into blocks of
    ``size`` groups, in order (the last may hold fewer); a block's groups are copied once."""
    held, rows = [], 0
    for block in released:
        at, n = 0, len(block.gids)
        while at < n:
            take = min(size - rows, n - at)
            held.append(Released(block.gids[at:at + take], block.values[at:at + take],
                                 block.names[at:at + take]))
            rows += take
            at += take
            if rows == size:
                yield _joined(held)
                held, rows = [], 0
    if rows:
        yield _joined(held)


def _grid(params: ReleaseParams) -> Grid:
    return _grid_of(params.lower, params.upper, params.granularity)


@functools.lru_cache(maxsize=8)
def _grid_of(lower: float, upper: float, granularity: float | None = None) -> Grid:
    return Grid(lower, upper, granularity)


def coarse_shift(params: ReleaseParams) -> int:
    """The cells ``k >> shift`` the coarse-cell mechanisms see: ``COARSE_SHIFT`` on the default
    grid; on a declared grid of N steps the shift that leaves at most 2**20 cells (0, the grid
    itself, up to N = 2**20 - 1). Public: a function of the grid."""
    return grid_coarse_shift(_grid(params).steps, params.granularity is not None)


def _start_group(n: int, units, key_hash, params: ReleaseParams):
    """Partition selection, then the choice of mechanism, for one group (bounded path).

    Returns ``(source, name, epsilon, n_used)`` for the mechanism step (``n_used``: auto's
    public row count, None for a named mechanism), or ``None`` when partition selection drops
    the group. Draws in the order of the core: the selection noise, then (for
    ``"auto"``) the noisy count of :func:`~dpq_spark.core.quantiles.choose.plan_auto`; the same source then
    feeds the mechanism."""
    source = resolve_rng(_group_rng(params, key_hash))
    if params.threshold is not None:
        size = n if units is None else int(units)
        if size + discrete_laplace(source, params.noise_scale) < params.threshold:
            return None
    if params.mechanism != "auto":
        return source, params.mechanism, params.epsilon, None
    grid_size = None if params.bounds_free else grid_points(params.lower, params.upper, params.granularity)
    name, rest, n_used = plan_auto(len(params.quantiles), n, epsilon=params.epsilon,
                              neighboring=params.neighboring, source=source, grid_size=grid_size,
                              granularity=params.granularity)
    return source, name, rest, n_used


#: Mechanisms that get the group's grid indices (exact, or the represented data of a spilled
#: group, built from their bands); the others get coarse cells.
FINE_MECHANISMS = ("joint_exp", "ind_exp")


def _run_fine(name, k, counts, source, epsilon, params: ReleaseParams, whole=None) -> np.ndarray:
    """JointExp or IndExp on a group's sorted distinct grid indices (exact, or represented data
    whose pruned cells' entries ``whole`` marks), released as grid values: the same draws as
    the core's ``joint_exp``/``ind_exp`` on values with these indices (with represented data,
    on those).

    On the default grid the rows are split over fine points as the core splits them
    (:func:`~dpq_spark.core.randomness.grid.split_ties`). When that would make more than
    ``SPLIT_MAX_ENTRIES`` entries (many indices with many tied rows each), only the indices
    inside the mechanism's band are split (``Grid.unsplit``, the core's rule; each grid point a
    cell of its fine points), the others kept whole: the release is then within total variation
    2**-59 of splitting them all, as for a spilled group, so this size-dependent branch reveals
    nothing beyond that ``delta``."""
    grid = _grid(params)
    run = joint_exp_indices if name == "joint_exp" else ind_exp_indices
    q = np.asarray(params.quantiles, dtype=np.float64)
    if grid.jitter > 1:  # a declared grid: the core's per-row jitter of ties, same draws
        f = jitter_indices(k, counts, grid.jitter, grid, source)
        out = run(f, None, grid.fine_size, q, epsilon=epsilon, neighboring=params.neighboring,
                  rng=source)
        return grid.release(out)
    counts = np.asarray(counts, dtype=np.int64)
    if whole is None:  # exact data: the core's rule, same draws
        whole = grid.unsplit(k, counts, functools.partial(
            band_keep, name, epsilon=epsilon, params=params, shift=grid.tie_bits,
            steps=grid.fine_size - 1))
    f, w = split_ties(k, counts, grid.tie_bits, source, whole)
    out = run(f, w, grid.fine_size, q, epsilon=epsilon, neighboring=params.neighboring,
              rng=source)
    return grid.release(out)


def pruned_entries(k, cells, keep, shift: int = COARSE_SHIFT) -> np.ndarray:
    """Mask over represented data ``k`` (:func:`~dpq_spark.core.quantiles.coarse_bands.represent`):
    the entries of pruned cells (``cells[~keep]``, ``k >> shift``), which the tie split keeps
    whole."""
    return ~np.isin(np.asarray(k, dtype=np.int64) >> shift, np.asarray(cells)[keep])


def band_keep(name, cells, counts, epsilon, params: ReleaseParams,
              shift: int = COARSE_SHIFT, fine=None, log_tol: float = BAND_LOG_TOL,
              steps: int | None = None) -> np.ndarray:
    """The coarse cells (``k >> shift``) a spilled group must bring at full precision for
    mechanism ``name`` (``fine``: all the data of some cells, for a tighter band; ``log_tol``
    larger than the default only for a guess; ``steps``: the last index of the grid the cells
    cut, the grid's N by default, the fine grid's for :func:`_run_fine`; see
    :func:`~dpq_spark.core.quantiles.coarse_bands.reachable`): the band of
    :func:`~dpq_spark.core.quantiles.coarse_bands.mechanism_band` (JointExp, or the union of
    IndExp's m single-quantile bands), which also holds on the tie split's fine points.
    """
    if _grid(params).jitter > 1:
        # A declared grid: the mechanism runs on jittered fine indices, one per row, so pruning
        # saves no memory; every cell is kept and the release is the core's on the grid data.
        return np.ones(len(cells), dtype=bool)
    return mechanism_band(name, cells, counts, params.quantiles, epsilon, params.neighboring,
                          _grid(params).steps if steps is None else steps, shift, fine, log_tol)


def _run_coarse(name, cells, counts, source, epsilon, params: ReleaseParams,
                shift: int = COARSE_SHIFT, n_used=None) -> np.ndarray:
    """A mechanism other than JointExp on coarse cells ``k >> shift``, each row at its cell's
    fixed representative grid point (a per-record map of public constants), or for
    ApproxQuantiles on the default grid with auto's public row count ``n_used`` at most
    ``SPREAD_MAX_ROWS`` at a random sub-cell's midpoint
    (:func:`~dpq_spark.core.quantiles.coarse_spread.spread_in_cells`, a per-record random map);
    on a declared grid the mechanism gets its ``granularity`` (:func:`coarse_shift`: shift 0 is
    the grid itself)."""
    grid = _grid(params)
    extra = {} if params.granularity is None else {"granularity": params.granularity}
    if name == params.mechanism:
        mechanism = get_mechanism(name)
    else:  # picked by auto: the pure mechanism, bounds given
        from dpq_spark.core.quantiles.mechanisms import get_base_mechanism

        mechanism = get_base_mechanism(name)
    if spreads(name, params.granularity is not None, n_used):
        # each row at a random sub-cell of its cell: ApproxQuantiles' splits then divide a cell
        # that holds many rows instead of leaving one side empty (no privacy cost)
        k, counts = spread_in_cells(cells, counts, grid.steps, shift, source)
    else:
        k = coarse_midpoints(cells, grid.steps, shift)
    q = np.asarray(params.quantiles, dtype=np.float64)
    if name == "approx_quantiles" and grid.tie_bits:
        # the default grid: the recursion on the cells' points as they are (the sub-cells are
        # this path's split of ties; fine points per row would cost up to 2**8 entries a cell)
        return grid.value(approx_quantiles_indices(k, counts, grid.size, q, epsilon=epsilon,
                                                   neighboring=params.neighboring, rng=source))
    out = mechanism(grid.value(k), q, epsilon=epsilon, lower=params.lower, upper=params.upper,
                    neighboring=params.neighboring, counts=counts, rng=source, **extra)
    return np.asarray(out, dtype=np.float64)


def _to_coarse(k, counts, shift: int = COARSE_SHIFT):
    return reduce_sorted(coarse_of(k, shift), np.asarray(counts, dtype=np.int64))


def release_fine(k, counts, units, key_hash, params: ReleaseParams):
    """Release one group (bounded path) from its sorted distinct grid indices ``k`` and
    ``counts``. Returns ``(values, mechanism name)`` or ``None`` (dropped by selection)."""
    k = np.asarray(k, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    started = _start_group(int(counts.sum()), units, key_hash, params)
    if started is None:
        return None
    source, name, eps, n_used = started
    if name in FINE_MECHANISMS:
        return _run_fine(name, k, counts, source, eps, params), name
    shift = coarse_shift(params)
    return (_run_coarse(name, *_to_coarse(k, counts, shift), source, eps, params, shift, n_used),
            name)


def _release_fold(fold: Fold, params: ReleaseParams, units_of, hash_of):
    """Release every group of a finished fold: :class:`Released` blocks in gid order (dropped
    groups left out), a slice of whole groups at a time (:meth:`Fold.slices`), so that the
    groups of a fold with sorted runs are released as the merge completes them."""
    if fold.spilled:
        yield from _release_spilled(fold, params, units_of, hash_of)
        return
    slices = fold.slices()
    while (part := next(slices, None)) is not None:
        gids, starts, ends = part.groups()
        index, counts = part.arrays()
        if _batchable(params):
            yield from _release_batch(gids, starts, ends, index, counts, params)
        else:
            for gid, a, b in zip(gids.tolist(), starts, ends):
                got = release_fine(index[a:b], counts[a:b], units_of(gid), hash_of(gid), params)
                if got is not None:
                    yield _one(gid, *got)
        # this slice's arrays are not kept while the fold cuts the next one
        del part, gids, starts, ends, index, counts


def _release_spilled(fold: Fold, params: ReleaseParams, units_of, hash_of):
    """:func:`_release_fold` of a fold spilled to coarse counts: a list of at most one
    :class:`Released` block. Never on a declared grid (:func:`new_fold`)."""
    if params.granularity is not None:
        raise RuntimeError("dp_quantiles: a fold spilled on a declared grid (a bug: please "
                           "report it)")
    gids, starts, ends = fold.groups()
    index, counts = fold.arrays()
    out = []
    # Spilled: choose per group from exact coarse counts; JointExp/IndExp groups get their
    # reachable cells' fine counts from the spill file (one pass over it), the others coarse
    # cells. With production randomness the JointExp groups of one epsilon are then released
    # together (_joint_exp_many); seeded runs keep one _run_fine per group (per-key draws).
    pending = []
    wanted = []
    for gid, a, b in zip(gids.tolist(), starts, ends):
        cells, ccounts = index[a:b], counts[a:b]
        started = _start_group(int(ccounts.sum()), units_of(gid), hash_of(gid), params)
        if started is None:
            continue
        source, name, eps, n_used = started
        if name not in FINE_MECHANISMS:
            out.append((gid, _run_coarse(name, cells, ccounts, source, eps, params,
                                         n_used=n_used), name))
            continue
        keep = band_keep(name, cells, ccounts, eps, params)
        pending.append((gid, cells, ccounts, keep, source, eps, name, n_used))
        wanted.append((gid << Fold._COARSE_SHIFT) + cells[keep])
    if pending:
        codes, fine = fold.fine_counts(np.sort(np.concatenate(wanted)))
        fgid = codes >> Fold.SHIFT
        together: dict[float, list] = {}  # production JointExp groups, by epsilon
        for gid, cells, ccounts, keep, source, eps, name, n_used in pending:
            a, b = np.searchsorted(fgid, [gid, gid + 1])
            k, w = represent(codes[a:b] - (gid << Fold.SHIFT), fine[a:b], cells, ccounts, keep)
            whole = pruned_entries(k, cells, keep)
            if name == "joint_exp" and params.base_seed is None:
                together.setdefault(eps, []).append((gid, k, w, whole))
                continue
            out.append((gid, _run_fine(name, k, w, source, eps, params, whole), name))
        for eps, groups in together.items():
            values = _joint_exp_many([g[1:] for g in groups], eps, params)
            out += [(g[0], row, "joint_exp") for g, row in zip(groups, values)]
        out.sort(key=lambda t: t[0])
    if not out:
        return []
    return [Released(np.array([g for g, _, _ in out], dtype=np.int64),
                     np.array([v for _, v, _ in out], dtype=np.float64),
                     [name for _, _, name in out])]


def _joint_exp_many(groups, epsilon, params: ReleaseParams) -> np.ndarray:
    """JointExp for many groups of represented data (grid indices, counts and the mask of
    pruned cells' entries each) with fresh OS entropy, by
    :func:`~dpq_spark.core.quantiles.batch.release_many` (its ``"joint_exp"`` path: enumeration for the
    smallest groups, :func:`~dpq_spark.core.quantiles.joint_exp_many._sample_many` about ``CELLS_HELD``
    cells at a time for the others): each group's row has the distribution :func:`_run_fine`
    gives it, released as grid values. Production randomness only; seeded runs keep
    :func:`_run_fine` per group (per-key draws)."""
    sizes = [len(k) for k, _, _ in groups]
    flat = FlatGroups(np.concatenate([k for k, _, _ in groups]).astype(np.int64),
                      np.concatenate([w for _, w, _ in groups]).astype(np.int64),
                      np.concatenate(([0], np.cumsum(sizes))).astype(np.int64),
                      np.concatenate([p for _, _, p in groups]).astype(bool))
    return release_many(flat, params.quantiles, epsilon=epsilon, lower=params.lower,
                        upper=params.upper, neighboring=params.neighboring,
                        mechanism="joint_exp", grid_indices=True,
                        granularity=params.granularity).values


def _free_batchable(params: ReleaseParams) -> bool:
    """Whether bounds-free groups can be released together: production randomness, no
    partition selection, ``auto`` or ``joint_exp``."""
    return (params.bounds_free and params.base_seed is None and params.threshold is None
            and params.mechanism in PRIVATE_BOUNDS_MECHANISMS)


def _batchable(params: ReleaseParams) -> bool:
    """Whether groups can be released together by :func:`dpq_spark.core.quantiles.batch.release_many`:
    public parameters only (production randomness, no partition selection, a mechanism it
    covers, bounds given; the default or a declared grid)."""
    return (params.base_seed is None and params.threshold is None and not params.bounds_free
            and params.mechanism in BATCH_MECHANISMS)


def _release_batch(gids, starts, ends, index, counts, params: ReleaseParams):
    """Release the groups of an unspilled fold in batches of ``_BATCH_GROUPS``: each group
    with exactly the distribution :func:`release_fine` gives it (the noisy count and choice of
    ``"auto"``, JointExp/IndExp on the exact grid indices, ApproxQuantiles/AggTree on coarse
    cells), at a per-group cost of tens of microseconds instead of milliseconds. A generator of
    :class:`Released` blocks, one a batch: one batch's releases are alive at a time, not a
    slice's."""
    q = np.asarray(params.quantiles, dtype=np.float64)
    gids = np.asarray(gids, dtype=np.int64)
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    if not np.array_equal(starts[1:], ends[:-1]):
        raise RuntimeError("dp_quantiles: the fold's groups are not contiguous (a bug: please "
                           "report it)")
    for lo in range(0, len(gids), _BATCH_GROUPS):
        hi = min(lo + _BATCH_GROUPS, len(gids))
        # the fold's groups are contiguous and in order: one slice of its arrays
        a, b = int(starts[lo]), int(ends[hi - 1])
        groups = FlatGroups(index[a:b], counts[a:b], np.append(starts[lo:hi], b) - a)
        got = release_many(groups, q, epsilon=params.epsilon, lower=params.lower,
                           upper=params.upper, neighboring=params.neighboring,
                           mechanism=params.mechanism, grid_indices=True, coarse_cells=True,
                           granularity=params.granularity)
        yield Released(gids[lo:hi], got.values, list(got.mechanisms))


def new_fold(params: ReleaseParams, budget: int | None = None) -> Fold:
    """The :class:`Fold` of a stretch of a public-key partition (:func:`stretch_fold`) or of a
    whole partition with partition selection, with ``budget`` distinct codes (default
    ``params.fold_budget``). With bounds its codes are
    ``gid * 2**33 + k``; without, ``gid * resolution + bucket``. It spills to coarse counts only
    on the default grid with bounds: on a declared grid every mechanism reads each group's
    whole grid data (:func:`band_keep` keeps every cell), and without bounds the bounds' search
    reads each group's buckets, so a spill would bring all of the fold's counts back at once;
    past its budget the fold writes sorted runs instead, and its groups are released a slice
    at a time."""
    budget = params.fold_budget if budget is None else budget
    if params.bounds_free:
        return Fold(budget, 0.0, span=params.resolution)
    return Fold(budget, params.spill_shrink if params.granularity is None else 0.0)


def _with_fold(body, batches, params: ReleaseParams):
    """Run a partition body with its :class:`Fold` (its files deleted when the body ends, also
    when the task fails). When the body ends the freed memory goes back to the OS
    (:func:`trim_heap`)."""
    sink = new_fold(params)
    try:
        yield from body(batches, params, sink)
    finally:
        sink.close()
        del sink
        trim_heap()  # the worker is reused: its next task starts from a small resident set


def _release_sink(fold: Fold, params: ReleaseParams, units_of, hash_of):
    """Release every group a finished partition put in ``fold``: :class:`Released` blocks in
    gid order, as an iterable."""
    fold.finish()
    if not params.bounds_free:
        return _release_fold(fold, params, units_of, hash_of)
    return _release_slices(fold, params, units_of, hash_of)


def _release_slices(fold: Fold, params: ReleaseParams, units_of, hash_of):
    """Bounds-free: release the fold's groups a slice of whole groups at a time
    (:meth:`Fold.slices`), each by :func:`_release_buckets`."""
    slices = fold.slices()
    while (part := next(slices, None)) is not None:
        yield from _release_buckets(part, params, units_of, hash_of)
        del part  # this slice's arrays are not kept while the fold cuts the next one


def release_partition(batches, params: ReleaseParams):
    """``mapInArrow`` body of the public-key path: release each group of one partition (Arrow
    record batches out, one row per group: ``GID``, ``value`` as a list of the m released
    values in the order of the quantiles, ``MECHANISM``; one row a group rather than m keeps
    Spark's row conversions of the output, and of its collection, m times smaller).

    The input is the packed rows of :func:`~dpq_spark.spark._packing.pack_partition`: each
    holds codes of one bucket of groups (key index * 2**33 + grid index, or key index *
    resolution + bucket without bounds), hash partitioned by bucket, so every group is whole
    in one partition, and sorted by bucket within it. The output carries ``GID`` instead of the
    key columns (the driver maps it back to the key). The rows are released a stretch of whole
    buckets at a time (:func:`_release_stretches`), each through a :class:`Fold`: with bounds,
    exact counts per distinct grid index within ``params.fold_budget`` pairs, else a spill file
    and coarse counts, or sorted runs (see :mod:`dpq_spark.core.quantiles.coarse_bands` for why
    the release is unchanged to within total variation 2**-59); without bounds, counts per
    (group, bucket), at most ``BUCKETS`` per group (past its budget the fold writes sorted
    runs, never coarse counts). When the partition ends the worker's freed memory goes back to
    the OS (:func:`trim_heap`).
    """
    try:
        yield from _release_partition(batches, params)
    finally:
        trim_heap()  # the worker is reused: its next task starts from a small resident set


def stretch_fold(params: ReleaseParams) -> Fold:
    """The fold of one stretch of whole buckets (:func:`_release_stretches`). A stretch ends
    with the bucket that reaches ``params.fold_budget`` codes, so it holds up to one bucket
    more: its fold's budget is twice that, and it spills or writes a sorted run only for a
    bucket larger than the budget (a fold of the budget itself would write almost every
    stretch to local disk and read it back). Stretches of half the budget would need no margin,
    but each stretch's groups are released in calls of their own, with fixed costs: on 5,000
    groups of 1,000 rows they ran 0.6% more instructions (callgrind)."""
    return new_fold(params, 2 * params.fold_budget)


def _release_stretches(batches, params: ReleaseParams, units_of, hash_of):
    """Release a partition's packed rows (sorted by bucket) a stretch of whole buckets at a
    time (:func:`~dpq_spark.spark._packing.bucket_pieces`, ``params.fold_budget`` codes and
    at most one bucket more each): each stretch goes through a fold of its own
    (:func:`stretch_fold`), whose groups are released when the stretch ends and then
    forgotten (its files deleted), so a worker holds one stretch's counts however many groups
    its partition has. A stretch changes no group's release: every group is whole in one."""
    fold = stretch_fold(params)
    try:
        for codes, counts, whole in bucket_pieces(batches, params.fold_budget):
            if codes.size:
                fold.add(codes, counts)
            if whole:
                yield from _release_sink(fold, params, units_of, hash_of)
                fold.close()
                fold = stretch_fold(params)
        yield from _release_sink(fold, params, units_of, hash_of)
    finally:
        fold.close()


def _release_partition(batches, params: ReleaseParams):
    if params.key_hashes is not None:
        def hash_of(gid):
            return params.key_hashes[gid]
    else:
        def hash_of(gid):
            return 0

    def units_of(gid):
        return None

    m = len(params.quantiles)
    for part in output_blocks(_release_stretches(batches, params, units_of, hash_of)):
        g = len(part.gids)
        values = arrow.numeric(part.values, pa.float64())
        yield pa.RecordBatch.from_arrays(
            [arrow.numeric(part.gids, pa.int64()),
             pa.ListArray.from_arrays(arrow.numeric(np.arange(0, m * g + 1, m), pa.int32()),
                                      values),
             arrow.strings(part.names)],
            names=[GID, "value", MECHANISM])


def _release_buckets(part: Fold, params: ReleaseParams, units_of, hash_of):
    """Bounds-free path: release each group of an unspilled fold of ``gid * resolution +
    bucket`` codes (a slice of whole groups) from its (bucket, count) pairs, each as
    :func:`release_values` releases it; with production randomness and public keys, by
    :func:`~dpq_spark.core.quantiles.batch_private_bounds.release_many_private_bounds` (the
    JointExp draws of many groups together). Yields :class:`Released` blocks as the groups are
    released, so that only the groups of the current chunk are held, not the slice's."""
    gids, starts, ends = part.groups()
    cells, counts = part.arrays()  # each code's bucket, and its count
    edges = np.append(starts, ends[-1:])  # group i is edges[i]:edges[i + 1]
    if _free_batchable(params):
        source = resolve_rng(None)
        a = 0
        while a < gids.size:  # whole groups of about _FREE_ENTRIES buckets at a time
            b = max(a + 1, int(np.searchsorted(edges, edges[a] + _FREE_ENTRIES, side="right")) - 1)
            x, y = int(edges[a]), int(edges[b])
            got = release_many_private_bounds(
                FlatGroups(bucket_values(cells[x:y]), counts[x:y], edges[a:b + 1] - x),
                np.asarray(params.quantiles, dtype=np.float64), epsilon=params.epsilon,
                neighboring=params.neighboring, mechanism=params.mechanism,
                bounds_share=params.bounds_share, granularity=params.granularity, source=source)
            yield Released(gids[a:b], got.values, list(got.mechanisms))
            a = b
        return
    for gid, x, y in zip(gids.tolist(), starts.tolist(), ends.tolist()):
        got = release_values(cells[x:y], counts[x:y], units_of(gid), hash_of(gid), params)
        if got is not None:
            yield _one(gid, *got)


def _frame(keys: dict, params: ReleaseParams, values: np.ndarray, mechanism: str) -> pd.DataFrame:
    import pandas as pd  # here, not at import: the Arrow paths of a Spark worker never need it

    m = len(values)
    data = {k: pd.Series([v] * m) for k, v in keys.items()}
    data["quantile"] = np.asarray(params.quantiles[:m], dtype=np.float64)
    data["value"] = values
    data[MECHANISM] = pd.Series([mechanism] * m, dtype=object)
    return pd.DataFrame(data)


def release_keyed_partition(batches, params: ReleaseParams):
    """``mapInArrow`` body for keys from partition selection: Arrow batches in and out.

    Each input row is one kept data row: the key columns, ``CELL`` (grid index with bounds,
    bucket without) and, with a privacy unit, ``UNITS``. Keys are numbered with
    :class:`dpq_spark.spark._keys.KeyIndex` (pyarrow, never pandas: null and NaN are distinct
    keys, int64 keys stay exact), and the rows go through the same :class:`Fold` as the
    public-key path (``local gid * 2**33 + k``; without bounds ``local gid * resolution +
    bucket``).
    Each group is released or dropped by the partition-selection threshold; the output batches
    carry the key columns as the same Arrow arrays the keys came in, ``quantile``, ``value`` and
    ``MECHANISM``.
    """
    yield from _with_fold(_release_keyed, batches, params)


def _release_keyed(batches, params: ReleaseParams, sink):
    from dpq_spark.spark._keys import KeyIndex, key_seed

    index = KeyIndex(params.keys)
    span = sink.span  # code = gid * span + index
    with_units = UNITS in params.extra_columns
    units = np.zeros(0, dtype=np.int64)
    for batch in batches:
        if batch.num_rows == 0:
            continue
        gids = index.gids([batch.column(k) for k in params.keys])
        cells = arrow.to_numpy(batch.column(CELL)).astype(np.int64, copy=False)
        sink.add(gids * span + cells)
        if with_units:
            weights = arrow.to_numpy(batch.column(UNITS)).astype(np.float64)
            add = np.bincount(gids, weights=weights, minlength=index.size).astype(np.int64)
            units = np.concatenate([units, np.zeros(len(add) - len(units), dtype=np.int64)]) + add
    units_of = (lambda gid: int(units[gid])) if with_units else (lambda gid: None)
    if params.base_seed is not None:  # seeded runs (tests): a per-key seed
        def hash_of(gid):
            return key_seed(index.values[gid])
    else:
        def hash_of(gid):
            return 0
    keys = None
    q = np.asarray(params.quantiles, dtype=np.float64)
    for part in output_blocks(_release_sink(sink, params, units_of, hash_of)):
        if keys is None:
            keys = index.table()
        g, m = part.values.shape
        picked = keys.take(arrow.numeric(np.repeat(part.gids, m), pa.int64()))
        arrays = [picked.column(k).combine_chunks() for k in params.keys]
        arrays += [arrow.numeric(np.tile(q[:m], g), pa.float64()),
                   arrow.numeric(part.values, pa.float64()),
                   arrow.strings(part.names).take(arrow.numeric(np.repeat(np.arange(g), m),
                                                                pa.int64()))]
        yield pa.RecordBatch.from_arrays(arrays, names=[*params.keys, "quantile", "value",
                                                        MECHANISM])
