"""JointExp for many groups at once: the sampler of :mod:`dpq_spark.core.quantiles.joint_exp`, batched.

:func:`_sample_many` releases G groups (the same ``q``, ``c`` and grid; any sizes) in one pass
with numpy calls per step for the whole batch, for callers that release many groups together
(:func:`dpq_spark.core.quantiles.batch.release_many`, the Spark fold's spilled JointExp groups). Each
group's bands come from :func:`~dpq_spark.core.quantiles.joint_exp._bands` on its own cells; step j's
tables hold every group's band j in one flat array; the Toeplitz blocks never cross a group and
the carry restarts at each group; the scans are segment-local
(:func:`~dpq_spark.core.quantiles._logscan.segmented_scans`: a segment's numbers depend on that segment
alone); the run truncation is decided cell by cell and the normalising shifts are per group.
Every float64 number of a group's forward tables is therefore the one it gets in a batch of
one, bit for bit (tested). The backward pass runs on all groups' rows together with
:func:`~dpq_spark.core.randomness.grid.draw_index_rows` on padded rows (exact for the same float64 weights
as :func:`~dpq_spark.core.randomness.grid.draw_index`; it consumes randomness in another order) and
:func:`~dpq_spark.core.randomness.grid.uniform_multisets`.

The distribution is the one of :mod:`dpq_spark.core.quantiles.joint_exp` (its module docstring: the target,
the band pruning, the run truncation and "Guarantee as implemented"), group by group; tested
against brute force with groups interleaved in one call. The forward pass computes the same
quantities by a different float64 order (segment-local scans, per-cell truncation), so the
rounding analysis (iii) applies with one more term: a scan's linear-space partial sum over a row
of at most 512 positive terms has relative error below ``2**-44``, less than one operation's
``2**-52 M`` as ``M >= 800``. Each group's release is thus ``(epsilon + eta, delta)``-DP with the
``eta`` and ``delta`` stated there, and the groups' draws are independent.

Why two implementations: this one is about 2x faster per group for hundreds of groups of 1e4
rows (``benchmarks/bench_joint_exp_many.py``) but about 2x slower for one group at a time (more
numpy calls per step), so :func:`~dpq_spark.core.quantiles.joint_exp.joint_exp` keeps its own.
"""

from __future__ import annotations

import math

import numpy as np

from dpq_spark.core.quantiles._logscan import logaddexp, segment_ends, segmented_scans
from dpq_spark.core.randomness.grid import draw_index, draw_index_rows, uniform_multiset, uniform_multisets
from dpq_spark.core.quantiles.joint_exp import (
    _LOG_RUN_TOL,
    _add_causal,
    _add_window,
    _bands,
    _log_run_step,
)

__all__: list[str] = []


def _kernel_sums_many(src_pos, src_log, src_off, rec_pos, rec_off, t, c, hi=None):
    """:func:`~dpq_spark.core.quantiles.joint_exp._kernel_sums` for G groups at once, flat: group g has the sources
    ``src_off[g]:src_off[g + 1]``, the receivers ``rec_off[g]:rec_off[g + 1]`` (each sorted by
    position) and the target ``t[g]``; a receiver sums over its own group's sources only.

    Blocks of ``0.75 t[g]`` never cross a group boundary, the carry restarts at every group, and
    the scans are segment-local (:func:`~dpq_spark.core.quantiles._logscan.segmented_scans`), so every
    output is the same float64 number as for its group alone. ``hi``, if given, is each
    receiver's global index of the first source not strictly left of it (a caller that knows
    it from the cells' order passes it; it is searched otherwise).
    """
    out = np.full(rec_pos.size, -np.inf)
    if src_pos.size == 0 or rec_pos.size == 0:
        return out
    groups = np.arange(t.size)
    src_len, rec_len = np.diff(src_off), np.diff(rec_off)
    rg, sg = np.repeat(groups, rec_len), np.repeat(groups, src_len)
    T = rec_pos - np.repeat(t, rec_len)  # a source at p adds exp(-c (T - p)) if p <= T, else exp(-c (p - T))
    lo, found = _search_groups(src_pos, src_len, T, rec_pos, rec_len, hi is None)
    hi = found if hi is None else hi
    lo = np.minimum(lo, hi)  # only when t = 0 (n = 0): a source must lie strictly left
    tau = np.repeat(np.where(t > 0, 0.75 * t, 1.0), src_len)  # t = 0 only when n = 0: no window then
    block = np.floor(src_pos / tau)
    new = np.ones(src_pos.size, dtype=bool)
    new[1:] = (block[1:] != block[:-1]) | (sg[1:] != sg[:-1])
    starts = np.flatnonzero(new)
    nseg = starts.size
    seg = np.repeat(np.arange(nseg), np.diff(np.append(starts, src_pos.size)))
    base = block[starts] * tau[starts]
    local = src_pos - base[seg]  # in [0, tau) up to rounding
    z_plus = src_log + c * local
    z_minus = src_log - c * local
    pre_plus, pre_minus, suf_minus = segmented_scans(z_plus, z_minus, starts)
    ends = segment_ends(starts, src_pos.size)
    tot_plus = pre_plus[ends]
    tot_minus = pre_minus[ends]

    # Decayed sum of the sources of the group's earlier segments, taken at each segment's base:
    # carry[s] = log sum_{i' in segments < s of its group} exp(src_log[i'] - c (base[s] - p_{i'})).
    # Computed for all groups in lockstep, segment rank r of every group at once (r is at most
    # a band's span over 0.75 t plus one, a few dozen), with the elementwise operations of
    # _logaddexp_scalar: each group's carries are the same numbers whatever the batch.
    carry = np.full(nseg, -np.inf)
    first_seg = np.ones(nseg, dtype=bool)
    first_seg[1:] = sg[starts[1:]] != sg[starts[:-1]]
    heads = np.flatnonzero(first_seg)
    rank = np.arange(nseg) - np.repeat(heads, np.diff(np.append(heads, nseg)))
    by_rank = np.argsort(rank, kind="stable")
    per_rank = np.bincount(rank)
    at = int(per_rank[0])
    for r in range(1, per_rank.size):
        s = by_rank[at:at + per_rank[r]]
        at += int(per_rank[r])
        a, b = carry[s - 1], tot_plus[s - 1]
        top = np.maximum(a, b)
        with np.errstate(invalid="ignore"):  # both -inf: the sum is -inf (as the scalar)
            prev = np.where(top == -np.inf, -np.inf, top + np.log1p(np.exp(-np.abs(a - b))))
        carry[s] = prev - c * (base[s] - base[s - 1])

    # Causal part.
    has_causal = lo > np.repeat(src_off[:-1], rec_len)
    _add_causal(out, has_causal, lo, seg, T, base, carry, pre_plus, c)
    _add_window(out, lo, hi, seg, starts, ends, base, T, pre_minus, suf_minus, tot_minus, src_pos,
                src_log, c)
    return out


def _search_groups(src_pos, src_len, T, rec_pos, rec_len, want_hi=True):
    """Per group (``src_len`` sources, ``rec_len`` receivers, in order): the global indices
    ``searchsorted(src, T, "right")`` and ``searchsorted(src, rec_pos, "left")`` of
    :func:`numpy.searchsorted` on the group's own sorted sources, for all groups in one call.

    Positions are half-integers (mid-ranks), so ``p <= T`` iff ``2 p <= floor(2 T)`` and
    ``p < r`` iff ``2 p < 2 r``, all integers: each group's keys are shifted into its own
    disjoint integer range and one search over everything gives the same indices exactly
    (the group's queries are clipped into its range). Other positions: one search per group.
    The second result is None unless ``want_hi``.
    """
    if src_len.size == 1:  # one group: the search itself
        return (np.searchsorted(src_pos, T, side="right"),
                np.searchsorted(src_pos, rec_pos, side="left") if want_hi else None)
    two_src, two_rec = 2.0 * src_pos, 2.0 * rec_pos
    size = src_len.sum() + rec_len.sum()
    top = float(max(np.abs(two_src).max(initial=0.0), np.abs(two_rec).max(initial=0.0)))
    if (top * (src_len.size + 1) * 4 < 2.0**52 and np.array_equal(two_src, np.floor(two_src))
            and np.array_equal(two_rec, np.floor(two_rec)) and size):
        span = 2.0 * top + 4.0  # group g's keys lie in [g span - top, g span + top]
        shift = np.arange(src_len.size) * span
        keys = two_src + np.repeat(shift, src_len)
        rec_shift = np.repeat(shift, rec_len)
        below = np.clip(np.floor(2.0 * T), -top - 1.0, top + 1.0) + rec_shift
        return (np.searchsorted(keys, below, side="right"),
                np.searchsorted(keys, two_rec + rec_shift, side="left") if want_hi else None)
    lo = np.empty(T.size, dtype=np.int64)
    hi = np.empty(T.size, dtype=np.int64)
    a = ra = 0
    for ns, nr in zip(src_len.tolist(), rec_len.tolist()):
        src = src_pos[a:a + ns]
        lo[ra:ra + nr] = np.searchsorted(src, T[ra:ra + nr], side="right") + a
        hi[ra:ra + nr] = np.searchsorted(src, rec_pos[ra:ra + nr], side="left") + a
        a, ra = a + ns, ra + nr
    return lo, hi


# --------------------------------------------------------------------------------------------
# Forward pass


class _Forward:
    """The forward tables of G groups over their bands: ``A_j`` (k = 1 slices), prefix maxima for
    runs, and the run sums ``S_j``, every step's bands of all groups in one flat array.

    Group g owns the cells ``coff[g]:coff[g + 1]`` of the concatenated ``width``, ``log_width``
    and ``pos``; its band j is its local cells ``lo[g, j-1]:hi[g, j-1]`` (never empty). Step j's
    tables hold the groups' bands j one after another, group g's at ``off[j-1, g]``. Every
    number is computed elementwise from its own group's data (per-group scalars broadcast, scans
    restarted per group), so a group's tables are the same bits in any batch, alone included.
    """

    def __init__(self, width, log_width, pos, coff, n, q, c, lo, hi):
        self.width = np.asarray(width, dtype=np.float64)  # integer counts of grid points
        self.log_width, self.pos, self.q, self.c = log_width, pos, q, c
        self.n = np.asarray(n, dtype=np.float64)
        self.G, self.m = self.n.size, q.size
        self.cum_target = self.n[:, None] * q[None, :]  # P_j, shape (G, m)
        self.targets = np.diff(np.concatenate(([0.0], q, [1.0])))[None, :] * self.n[:, None]
        self.first = coff[:-1, None] + lo  # global first cell of each band, shape (G, m)
        self.length = hi - lo
        if not np.all(self.length > 0):
            raise AssertionError("JointExp band without cells")  # cannot happen: ref is kept
        self.off = np.zeros((self.m, self.G + 1), dtype=np.int64)
        np.cumsum(self.length.T, axis=1, out=self.off[:, 1:])
        self.base = np.concatenate(([0], np.cumsum(self.off[:, -1])))  # step j at base[j-1]
        self.gid = [np.repeat(np.arange(self.G), self.length[:, j]) for j in range(self.m)]
        self.cells = [np.arange(self.off[j, -1]) + self._rep(j + 1, self.first[:, j] - self.off[j, :-1])
                      for j in range(self.m)]
        self.A: list[np.ndarray] = []  # A_j on the bands j, stored minus nu[:, j-1]
        self.G_max: list[np.ndarray] = []  # max_{j'<=j} (A_j' - Lambda_j') on the bands j, true scale
        self.S: list[np.ndarray] = []  # S_j minus its group's nu (kept for the backward pass)
        self.nu = np.zeros((self.G, self.m))

    def _rep(self, j: int, per_group: np.ndarray) -> np.ndarray:
        """A per-group array spread over the cells of the bands j (1-based)."""
        return np.repeat(per_group, self.length[:, j - 1])

    def _in_band(self, j: int, jp: int):
        """``(idx, inside)`` for every cell of the bands j: its place in step jp's table, and
        whether it lies in its group's band jp at all (``idx`` is 0 where not)."""
        rel = np.arange(self.off[j - 1, -1]) + self._rep(
            j, self.first[:, j - 1] - self.first[:, jp - 1] - self.off[j - 1, :-1])
        inside = (rel >= 0) & (rel < self._rep(j, self.length[:, jp - 1]))
        return np.where(inside, rel + self._rep(j, self.off[jp - 1, :-1]), 0), inside

    def run(self) -> None:
        # every step's A and S in one array each (step j at base[j-1]); the lists hold views
        self.A_all = np.empty(int(self.base[-1]))
        self.S_all = np.empty(int(self.base[-1]))
        for j in range(1, self.m + 1):
            cells = self.cells[j - 1]
            L = self.log_width[cells]
            p = self.pos[cells]
            if j == 1:
                A = L - self.c * np.abs(p - self._rep(1, self.targets[:, 0]))
                nu_a = np.zeros(self.G)
            else:
                # positions increase with the cell: the sources left of a cell are the cells before it
                hi = np.clip(cells - self._rep(j, self.first[:, j - 2]), 0, self._rep(j, self.length[:, j - 2]))
                hi += self._rep(j, self.off[j - 2, :-1])
                A = L + _kernel_sums_many(self.pos[self.cells[j - 2]], self.S[-1], self.off[j - 2],
                                          p, self.off[j - 1], self.targets[:, j - 1], self.c, hi)
                nu_a = self.nu[:, j - 2]
            self._store(j, A, nu_a)
            self.nu[:, j - 1] = nu_a
            S = self.run_sums(j)
            shift = np.maximum.reduceat(S, self.off[j - 1, :-1])
            if not np.all(np.isfinite(shift)):  # cannot happen: the reference sequence has mass
                raise FloatingPointError("JointExp forward pass lost all mass")
            shift_rep = self._rep(j, shift)
            self.A[-1] -= shift_rep
            self.nu[:, j - 1] = nu_a + shift
            self.S.append(self.S_all[self.base[j - 1]:self.base[j]])
            np.subtract(S, shift_rep, out=self.S[-1])

    def _store(self, j: int, A: np.ndarray, nu_a: np.ndarray) -> None:
        cells = self.cells[j - 1]
        G = A + self._rep(j, nu_a) - self._log_lambda(j, cells)
        if j > 1:
            idx, inside = self._in_band(j, j - 1)
            G[inside] = np.maximum(G[inside], self.G_max[-1][idx[inside]])
        self.A.append(self.A_all[self.base[j - 1]:self.base[j]])
        self.A[-1][:] = A
        self.G_max.append(G)

    def _log_lambda(self, j: int, cells: np.ndarray) -> np.ndarray:
        """Lambda_j(i) = sum_{t<=j} log(phi_t(0) w_i) = -c P_j + j log w_i, on the bands j."""
        return self._rep(j, -self.c * self.cum_target[:, j - 1]) + j * self.log_width[cells]

    def _index(self, jp: np.ndarray, cells: np.ndarray, gid: np.ndarray):
        """``(idx, inside)``: where global cell ``cells`` of group ``gid`` sits in the tables of
        step ``jp`` (1-based, per element) counted over all steps (``base``), and whether it lies
        in that band at all (``idx`` is 0 where not)."""
        rel = cells - self.first[gid, jp - 1]
        inside = (rel >= 0) & (rel < self.length[gid, jp - 1])
        idx = np.where(inside, self.base[jp - 1] + self.off[jp - 1, gid] + rel, 0)
        return idx, inside

    def run_sums(self, j: int) -> np.ndarray:
        """S_j = log sum_k alpha(j, i, k) on the bands j, minus nu_j (the scale of the stored A_j).

        A run of k outputs in cell i (w grid points) carries ``C(w + k - 1, k) = w R_k(w)``
        multisets, ``log R_k(w) = sum_{t=2..k} log((w + t - 1) / t)``. Run lengths are added
        while an upper bound on all longer runs is not below ``2**-72`` of the sum so far, cell
        by cell: with ``rho_k(w) = log R_k(w) - (k - 1) log w`` nonincreasing in k (for w >= 1),
        the terms with run start <= jp are each at most ``exp(G_max_jp + Lambda_j + rho_k(w))``,
        so the j - k + 1 of them sum to at most that times j - k + 1. A cell stops at its first
        k whose bound is below that (the rule depends on the cell's own numbers only).
        """
        cells, gid = self.cells[j - 1], self.gid[j - 1]
        acc = self.A[j - 1].copy()
        if j == 1:
            return acc
        scale = self._rep(j, self.nu[:, j - 1])
        L = self.log_width[cells]
        W = self.width[cells]
        lam_j = self._log_lambda(j, cells) - scale
        full = True  # every cell of the bands still sums (then no subsetting)
        active = np.arange(acc.size)  # the cells still summing
        act_L, act_W, act_lam, act_scale, act_acc = L, W, lam_j, scale, acc
        log_r = np.zeros(acc.size)  # log R_k(w) on the active cells
        for k in range(2, j + 1):
            jp = j - k + 1  # the run of k outputs starts at output jp
            log_count = math.log(j - k + 1)
            log_r += _log_run_step(act_W, k)
            if full:
                idx, inside = self._in_band(j, jp)
            else:
                idx, inside = self._index(np.full(active.size, jp), cells[active], gid[active])
                idx = np.where(inside, idx - self.base[jp - 1], 0)
            bound = np.where(inside, self.G_max[jp - 1][idx], -np.inf) + log_count + act_lam + log_r - (k - 1) * act_L
            keep = bound >= act_acc - _LOG_RUN_TOL
            if not keep.all():
                full = False
                active, log_r, idx, inside = active[keep], log_r[keep], idx[keep], inside[keep]
                act_L, act_W, act_lam, act_scale = act_L[keep], act_W[keep], act_lam[keep], act_scale[keep]
                if active.size == 0:
                    break
            # the run's first output: A_jp at its true scale, times prod phi_t(0), minus nu_j
            if full:
                nu_p, P_j, P_p = (self._rep(j, a) for a in (self.nu[:, jp - 1], self.cum_target[:, j - 1],
                                                            self.cum_target[:, jp - 1]))
            else:
                g = gid[active]
                nu_p, P_j, P_p = self.nu[g, jp - 1], self.cum_target[g, j - 1], self.cum_target[g, jp - 1]
            offset = nu_p + (-self.c * (P_j - P_p) - act_scale)
            term = np.where(inside, self.A[jp - 1][idx] + offset, -np.inf) + log_r
            act_acc = logaddexp(acc[active] if not full else acc, term)
            acc[active] = act_acc
        return acc

    def run_terms(self, j: np.ndarray, i: np.ndarray, g: np.ndarray) -> np.ndarray:
        """log alpha(j, i, k) for k = 1..j (true scale minus nu_j), one row per (step ``j``,
        global cell ``i``, group ``g``); -inf where k > j or the run's first output is outside
        its band. Shape ``(len(j), max(j))``."""
        K = int(j.max())
        k = np.arange(1, K + 1)
        # log R_k(w) = sum_{t=2..k} log((w + t - 1) / t), summed left to right
        steps = np.zeros((j.size, K))
        if K > 1:
            steps[:, 1:] = np.log(self.width[i][:, None] + (k[1:] - 1.0)) - np.array([math.log(t) for t in range(2, K + 1)])
        log_r = np.cumsum(steps, axis=1)
        valid = k[None, :] <= j[:, None]
        jp = np.where(valid, j[:, None] - k[None, :] + 1, 1)  # the run's first output
        gg = np.broadcast_to(g[:, None], jp.shape).ravel()
        idx, inside = self._index(jp.ravel(), np.broadcast_to(i[:, None], jp.shape).ravel(), gg)
        ok = valid.ravel() & inside
        jj = np.broadcast_to(j[:, None], jp.shape).ravel()[ok]
        g_ok, jp_ok = gg[ok], jp.ravel()[ok]
        A_true = self.A_all[idx[ok]] + self.nu[g_ok, jp_ok - 1]
        terms = np.full(jp.size, -np.inf)
        terms[ok] = (A_true - self.nu[g_ok, jj - 1] - self.c * (self.cum_target[g_ok, jj - 1]
                                                                - self.cum_target[g_ok, jp_ok - 1])
                     + log_r.ravel()[ok])
        return terms.reshape(jp.shape)


def _sample_many(cells_list, q, c, size, source, rows=None, bands=None) -> np.ndarray:
    """JointExp for many groups in one pass: one draw per group (or per entry of ``rows``).

    Parameters
    ----------
    cells_list : sequence of tuple
        Each group's ``_grid_cells(idx, counts, size)``; all groups share ``q``, ``c`` and the
        grid ``size`` (their numbers of rows differ).
    q : numpy.ndarray
        The m validated quantiles.
    c : float
        ``epsilon / (2 Delta)``.
    size : int
        The number of grid points.
    source : RandomSource
        The randomness (exact integer draws only).
    rows : numpy.ndarray of int, optional
        The group of each output row (default: one row per group, in order); a group may
        appear many times (independent draws from one forward pass).
    bands : tuple of numpy.ndarray, optional
        ``(lo, hi)``, shape ``(G, m)``: every group's :func:`_bands`, when the caller has them
        (:func:`dpq_spark.core.quantiles.batch._flat_bands` computes the same integers for many
        groups at once); computed here otherwise.

    Returns
    -------
    numpy.ndarray
        Sorted grid indices, shape ``(len(rows), m)``, int64.

    Notes
    -----
    Each row has the distribution :func:`~dpq_spark.core.quantiles.joint_exp._sample_cells` gives its
    group alone (module docstring): bands come from :func:`_bands` per group, and the forward
    tables (:class:`_Forward`) are the same float64 numbers in any batch, a batch of one
    included. The backward pass
    draws every row's cells with :func:`~dpq_spark.core.randomness.grid.draw_index_rows` on padded rows
    (exact for the same float64 weights; it consumes randomness in another order than per-group
    :func:`~dpq_spark.core.randomness.grid.draw_index` would) and each run's grid points with
    :func:`~dpq_spark.core.randomness.grid.uniform_multisets`. Rows are independent given the data.

    Privacy
    -------
    As :func:`joint_exp_indices` for each group separately (its own data, the module's
    "Guarantee as implemented"); groups are disjoint data, so parallel composition applies.
    """
    m = q.size
    G = len(cells_list)
    rows = np.arange(G, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    out = np.empty((rows.size, m), dtype=np.int64)
    if rows.size == 0:
        return out
    if bands is not None:
        lo, hi = (np.asarray(b, dtype=np.int64).reshape(G, m) for b in bands)
    else:
        lo = np.empty((G, m), dtype=np.int64)
        hi = np.empty((G, m), dtype=np.int64)
        for g, cells in enumerate(cells_list):
            lo[g], hi[g] = _bands(*cells, q, c, size)
    # The forward tables hold every band cell of every step: batches of at most _BATCH_CELLS of
    # them (a group with more is a batch alone), one after the other. Groups are independent,
    # so this changes no group's distribution.
    cost = np.maximum(hi - lo, 0).sum(axis=1)
    edges = [0]
    total = 0
    for g, w in enumerate(cost.tolist()):
        if total and total + w > _BATCH_CELLS:
            edges.append(g)
            total = 0
        total += w
    edges.append(G)
    if len(edges) == 2:
        return _sample_batch(cells_list, lo, hi, q, c, size, source, rows, out)
    for x, y in zip(edges[:-1], edges[1:]):
        mine = np.flatnonzero((rows >= x) & (rows < y))
        if mine.size:
            out[mine] = _sample_batch(cells_list[x:y], lo[x:y], hi[x:y], q, c, size, source,
                                      rows[mine] - x, np.empty((mine.size, m), dtype=np.int64))
    return out


#: band cells (summed over the m steps) of the groups one forward pass holds; about 100 bytes
#: each across the tables
_BATCH_CELLS = 1 << 20

#: cells (of :func:`~dpq_spark.core.quantiles.joint_exp._grid_cells`, four 8-byte arrays each) that a
#: caller builds for many groups before sampling them and building the next ones
CELLS_HELD = 1 << 21


def _sample_batch(cells_list, lo, hi, q, c, size, source, rows, out) -> np.ndarray:
    """:func:`_sample_many` for one batch of groups, their bands ``lo``/``hi`` computed."""
    m = q.size
    G = len(cells_list)
    # only the cells some band keeps, [a_g, b_g) of each group, are concatenated
    a, b = lo.min(axis=1), hi.max(axis=1)
    lo, hi = lo - a[:, None], hi - a[:, None]
    coff = np.zeros(G + 1, dtype=np.int64)
    np.cumsum(b - a, out=coff[1:])
    used = [slice(int(x), int(y)) for x, y in zip(a.tolist(), b.tolist())]
    start, width, log_width, pos = (np.concatenate([cl[t][u] for cl, u in zip(cells_list, used)])
                                    for t in range(4))
    n = np.array([cl[4] for cl in cells_list], dtype=np.float64)
    fw = _Forward(width, log_width, pos, coff, n, q, c, lo, hi)
    fw.run()
    last = fw.cells[m - 1]
    log_w_last = fw.S[m - 1] - c * np.abs(fw.n[fw.gid[m - 1]] - fw.pos[last] - fw.targets[fw.gid[m - 1], m])
    i = fw.first[rows, m - 1] + _draw_segments(log_w_last, fw.off[m - 1, rows], fw.length[rows, m - 1], source)
    cell_of = _backward(fw, rows, i, source)
    # runs of equal cells: one uniform multiset of grid points each, drawn per run length
    new = np.ones(cell_of.shape, dtype=bool)
    new[:, 1:] = cell_of[:, 1:] != cell_of[:, :-1]
    flat = np.flatnonzero(new)
    run = np.diff(np.append(flat, cell_of.size))  # a row's first run starts a new one
    r, s = np.divmod(flat, m)
    if rows.size == 1:  # one row: run by run, as draw_index does below (see _draw_padded)
        for j, k in zip(s.tolist(), run.tolist()):
            i = int(cell_of[0, j])
            out[0, j:j + k] = int(start[i]) + uniform_multiset(source, int(width[i]), k)
        return out
    for k in np.unique(run).tolist():
        sel = run == k
        cells = cell_of[r[sel], s[sel]]
        pts = uniform_multisets(source, width[cells], k)
        out[r[sel][:, None], s[sel][:, None] + np.arange(k)] = start[cells][:, None] + pts
    return out


def _backward(fw: _Forward, rows: np.ndarray, i: np.ndarray, source) -> np.ndarray:
    """Given the global cell ``i`` of output m of every row (group ``rows``), draw the cells of
    all outputs, backwards by runs, for all rows at once. Shape ``(len(rows), m)``."""
    m = fw.m
    cell_of = np.empty((rows.size, m), dtype=np.int64)
    cols = np.arange(m)
    todo = np.arange(rows.size)
    j = np.full(rows.size, m)
    i = i.copy()
    S_all = fw.S_all
    while todo.size:
        g, jj, ii = rows[todo], j[todo], i[todo]
        k = 1 + _draw_padded(fw.run_terms(jj, ii, g), source)
        run = (cols >= (jj - k)[:, None]) & (cols < jj[:, None])
        cell_of[todo] = np.where(run, ii[:, None], cell_of[todo])
        jj = jj - k
        more = jj > 0
        todo, g, jj, ii = todo[more], g[more], jj[more], ii[more]
        if todo.size == 0:
            break
        j[todo] = jj
        # predecessors lie strictly left of cell i, in band jj
        first = fw.first[g, jj - 1]
        stop = np.minimum(first + fw.length[g, jj - 1], ii) - first
        at = fw.base[jj - 1] + fw.off[jj - 1, g]
        seg_rows = np.repeat(np.arange(todo.size), stop)
        r = np.arange(seg_rows.size) - np.repeat(np.cumsum(stop) - stop, stop)
        log_w = S_all[at[seg_rows] + r] - fw.c * np.abs(
            fw.pos[ii[seg_rows]] - fw.pos[first[seg_rows] + r] - fw.targets[g[seg_rows], jj[seg_rows]])
        i[todo] = first + _draw_segments(log_w, np.cumsum(stop) - stop, stop, source)
    return cell_of


#: rows of at most this many weights go through draw_index_rows (int64 envelope units)
_ROW_CELLS = 1 << 22
#: a padded block of rows holds at most this many weights
_BLOCK_CELLS = 1 << 21


def _draw_padded(log_w: np.ndarray, source) -> np.ndarray:
    """One exact draw per row of a 2-d array of log-weights (-inf: weight 0).

    A single row goes through :func:`~dpq_spark.core.randomness.grid.draw_index` (so do single segments
    in :func:`_draw_segments`, and a single row's runs get
    :func:`~dpq_spark.core.randomness.grid.uniform_multiset` in order): one group's draw then consumes
    randomness in the order of :mod:`dpq_spark.core.quantiles.joint_exp`'s own sampler, so a seeded
    ``release_many`` of one large group draws what :func:`~dpq_spark.core.joint_exp_indices`
    draws (tested on 300 cases)."""
    if log_w.shape[0] == 1:
        return np.array([draw_index(log_w[0], source)], dtype=np.int64)
    if log_w.shape[1] <= _ROW_CELLS:
        return draw_index_rows(log_w, source)
    return np.array([draw_index(row, source) for row in log_w], dtype=np.int64)


def _draw_segments(log_w: np.ndarray, at: np.ndarray, length: np.ndarray, source) -> np.ndarray:
    """One exact draw per segment ``log_w[at[r] : at[r] + length[r]]`` (each non-empty): the
    index within the segment, with probability exactly ``w / sum(w)`` for the float64 weights
    ``exp(log_w - max)`` of :func:`~dpq_spark.core.randomness.grid.draw_index_rows` (segments of similar
    lengths padded into blocks of rows) or, for very long segments, of
    :func:`~dpq_spark.core.randomness.grid.draw_index`."""
    out = np.empty(length.size, dtype=np.int64)
    if length.size == 1:  # see _draw_padded
        out[0] = draw_index(log_w[int(at[0]):int(at[0]) + int(length[0])], source)
        return out
    order = np.argsort(length, kind="stable")
    lengths = length[order].tolist()
    a = 0
    while a < order.size:
        if lengths[a] > _ROW_CELLS:
            r = int(order[a])
            out[r] = draw_index(log_w[int(at[r]):int(at[r]) + int(length[r])], source)
            a += 1
            continue
        b = a + 1  # lengths increase: the block's width is its last row's length
        while b < order.size and lengths[b] <= _ROW_CELLS and (b + 1 - a) * lengths[b] <= _BLOCK_CELLS:
            b += 1
        block = order[a:b]
        n = length[block]
        pad = np.full((block.size, int(n.max())), -np.inf)
        row = np.repeat(np.arange(block.size), n)
        col = np.arange(row.size) - np.repeat(np.cumsum(n) - n, n)
        pad[row, col] = log_w[at[block][row] + col]
        out[block] = draw_index_rows(pad, source)
        a = b
    return out

