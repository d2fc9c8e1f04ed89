"""The per-group step of ``dp_quantiles``: a group's grid counts in, one DP release out.

Runs on the driver after Spark has reduced each group to counts (see ``quantiles.py``). It
imports numpy only (no pyspark, pandas or pyarrow), so it is testable without Spark.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
from dataclasses import dataclass

import numpy as np

from dpq_spark.core import _coarse_bands as bands
from dpq_spark.core._random import resolve_rng
from dpq_spark.core.privacy import NeighboringRelation, joint_exp_sensitivity
from dpq_spark.spark._mechanisms import get_mechanism

__all__ = ["CELL", "COUNT", "FINE", "GID", "UNITS", "ReleaseParams", "key_seed", "group_rng",
           "passes_selection", "release_values", "mechanism_input", "keep_cells", "cell_values"]

# Internal column names (the "__dpq_" prefix is reserved).
CELL = "__dpq_cell"  # coarse cell (JointExp) or cell of the `resolution` grid (other mechanisms)
FINE = "__dpq_fine"  # fine grid index, 0 .. 2**32
GID = "__dpq_gid"  # index of the group in the driver's key table
COUNT = "__dpq_count"
UNITS = "__dpq_units"

_UINT64 = 1 << 64


@dataclass(frozen=True)
class ReleaseParams:
    """Public, validated parameters of one group's release.

    ``epsilon`` is what the mechanism receives for one group, after the split for partition
    selection and the scaling for contribution bounding. ``threshold``/``noise_scale`` are set
    only when keys come from DP partition selection. ``base_seed`` is ``None`` in production
    (fresh OS entropy for every group) and an int only when the caller passed a Generator.
    """

    quantiles: tuple[float, ...]
    epsilon: float
    lower: float
    upper: float
    resolution: int
    neighboring: str
    mechanism: str
    base_seed: int | None = None
    threshold: float | None = None
    noise_scale: float | None = None

    @property
    def fine(self) -> bool:
        """JointExp runs on the fine grid (exact data); other mechanisms on ``resolution`` cells."""
        return self.mechanism == "joint_exp"

    @property
    def c(self) -> float:
        """JointExp's ``epsilon / (2 Delta)``."""
        relation = NeighboringRelation.parse(self.neighboring)
        q = np.asarray(self.quantiles, dtype=np.float64)
        return self.epsilon / (2.0 * joint_exp_sensitivity(q, relation))


def key_seed(key: tuple) -> int:
    """A stable 64-bit number for a group key (seeded test runs only): the same key gives the
    same number on every path, session and machine. Python ints, floats (NaN included),
    strings, bytes, dates and None each print distinctly under ``repr`` with their type."""
    text = repr(tuple((type(v).__name__, v) for v in key)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def group_rng(params: ReleaseParams, seed: int):
    """The group's randomness: OS entropy in production, ``default_rng([base_seed, seed])``
    when the caller passed a Generator (tests)."""
    if params.base_seed is None:
        return resolve_rng(None)
    return resolve_rng(np.random.default_rng([params.base_seed, int(seed) % _UINT64]))


def passes_selection(size: int, rng, params: ReleaseParams) -> bool:
    """DP partition selection: the group's count of units plus Laplace noise against the
    threshold."""
    return not size + rng.laplace(0.0, params.noise_scale) < params.threshold


def keep_cells(cells: np.ndarray, counts: np.ndarray, params: ReleaseParams) -> np.ndarray:
    """The coarse cells of one group whose fine counts the mechanism needs (see
    :mod:`dpq_spark.core._coarse_bands`)."""
    return bands.reachable(cells, counts, np.asarray(params.quantiles), params.c,
                           params.lower, params.upper)


def cell_values(cells: np.ndarray, params: ReleaseParams) -> np.ndarray:
    """Midpoints of ``resolution`` grid cells (mechanisms other than JointExp)."""
    width = (params.upper - params.lower) / params.resolution
    values = params.lower + (np.asarray(cells, dtype=np.float64) + 0.5) * width
    return np.clip(values, params.lower, params.upper)


def mechanism_input(points: np.ndarray, params: ReleaseParams) -> np.ndarray:
    """The values the mechanism sees for grid ``points``. GRID-SPECIFIC: once the core runs on
    its public grid, JointExp takes the fine indices themselves (``joint_exp_indices``)."""
    if params.fine:
        return bands.fine_values(points, params.lower, params.upper)
    return cell_values(points, params)


def release_values(points: np.ndarray, counts: np.ndarray, rng, params: ReleaseParams) -> np.ndarray:
    """The released values of one group from its sorted distinct grid ``points`` and counts.

    Small JointExp groups (see :func:`small_joint_exp`) are sampled by enumeration, with the
    same distribution as the core's sampler at a cost of microseconds.
    """
    if params.fine:
        values = mechanism_input(points, params)
        out = small_joint_exp(values, np.asarray(counts, dtype=np.int64), params, rng)
        if out is not None:
            return out
    mechanism = get_mechanism(params.mechanism)
    out = mechanism(
        mechanism_input(points, params),
        np.asarray(params.quantiles, dtype=np.float64),
        epsilon=params.epsilon,
        lower=params.lower,
        upper=params.upper,
        neighboring=params.neighboring,
        counts=np.asarray(counts, dtype=np.int64),
        rng=rng,
    )
    return np.asarray(out, dtype=np.float64)


_ENUMERATE_MAX = 4096  # largest number of interval sequences sampled by enumeration


@functools.lru_cache(maxsize=256)
def _sequences(K: int, m: int) -> np.ndarray:
    """All nondecreasing sequences of m interval indices in ``0 .. K-1``, shape (S, m)."""
    return np.array(list(itertools.combinations_with_replacement(range(K), m)),
                    dtype=np.int64).reshape(-1, m)


def small_joint_exp(values: np.ndarray, counts: np.ndarray, params: ReleaseParams, rng):
    """JointExp by enumeration for a group with few distinct values, else ``None``.

    The intervals are those of the core (``[a, v_1), [v_1, v_2), ..., [v_d, b]`` for the
    distinct values strictly inside the bounds; points on a bound add no interval), each with
    rank ``p_i`` = number of points ``<= `` its left edge. Every nondecreasing sequence ``s`` of
    m intervals has weight ``exp(c u(s)) prod_i w_i^{k_i} / k_i!`` (``k_i`` outputs in interval
    i), ``u(s) = -sum_{j=1}^{m+1} |p_{s_j} - p_{s_{j-1}} - t_j|``; one sequence is drawn in
    proportion, then one uniform point per output inside its interval, sorted: the
    distribution the core samples (its Notes), here without truncation. An empty group (one
    interval, ``u = 0``) gives m sorted uniform points on ``[a, b]``.
    """
    a, b = params.lower, params.upper
    keep = counts > 0
    values, counts = values[keep], counts[keep]
    n = int(counts.sum())
    inside = (values > a) & (values < b)
    K = int(inside.sum()) + 1
    m = len(params.quantiles)
    if math.comb(K + m - 1, m) > _ENUMERATE_MAX:
        return None
    edges = np.concatenate(([a], values[inside], [b]))
    pos = np.empty(K)
    pos[0] = counts[values == a].sum() if n else 0
    pos[1:] = pos[0] + np.cumsum(counts[inside])
    q = np.asarray(params.quantiles, dtype=np.float64)
    targets = np.diff(np.concatenate(([0.0], q, [1.0]))) * n
    seqs = _sequences(K, m)
    ranks = np.concatenate([np.zeros((seqs.shape[0], 1)), pos[seqs],
                            np.full((seqs.shape[0], 1), float(n))], axis=1)
    util = -np.abs(np.diff(ranks, axis=1) - targets[None, :]).sum(axis=1)
    log_w = np.log(np.diff(edges))
    # log prod k_i! = sum over outputs of log(its place within its run of equal intervals)
    place = np.ones(seqs.shape[0])
    log_fact = np.zeros(seqs.shape[0])
    for j in range(1, m):
        place = np.where(seqs[:, j] == seqs[:, j - 1], place + 1.0, 1.0)
        log_fact += np.log(place)
    score = params.c * util + log_w[seqs].sum(axis=1) - log_fact
    weights = np.exp(score - score.max())
    cdf = np.cumsum(weights)
    chosen = seqs[int(np.searchsorted(cdf, _uniform(rng, 1)[0] * cdf[-1], side="right").clip(0, len(cdf) - 1))]
    lo, hi = edges[chosen], edges[chosen + 1]
    return np.clip(np.sort(lo + _uniform(rng, m) * (hi - lo)), a, b)


def _uniform(rng, size: int) -> np.ndarray:
    """``size`` uniform numbers in [0, 1) from 53 exact random bits each."""
    return (rng.words(size) >> np.uint64(11)).astype(np.float64) * 2.0**-53
