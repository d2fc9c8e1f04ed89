"""JointExp for many groups at once: the sampler of :mod:`dpq_spark.core.quantiles.joint_exp`, batched.

:func:`_sample_many` releases G groups (the same ``q``, ``c`` and grid; any sizes) in one pass
with numpy calls per step for the whole batch, for callers that release many groups together
(:func:`dpq_spark.core.quantiles.batch.release_many`, the Spark fold's spilled JointExp groups).
Each group's bands come from :func:`~dpq_spark.core.quantiles.joint_exp._bands` on its own cells.
Two forward passes compute the same tables, and a group's own data decide which one it takes:

* *Dense* (:class:`_Dense`), for a group whose bands together span at most ``_DENSE_WIDTH``
  cells and whose every step fits the span guard (N(0, 5) deciles: groups of up to about 3,800
  rows at epsilon 1, 400 at epsilon 10; at 0.1 the width is the limit): one row per group,
  every step an elementwise array operation over all rows, on the columns of bands j - 1 and j
  only; the Toeplitz sums in linear space (prefix sums, and in-block prefix and suffix sums of
  ``exp`` of the sources under the group's own scale for that step, no difference of sums), the
  run sums over every run length at once. Range guards (at every step, ``c`` times the span of
  the ranks the step reads plus its target at most 350, checked before the pass; every source
  within ``exp(-300)`` of its group's largest, checked during it) keep every factor and partial
  sum a normal float64 number; a group they refuse goes through the flat pass.
* *Flat* (:class:`_Forward`), for the others: step j's tables hold every group's band j in one
  flat array; the Toeplitz blocks never cross a group and the carry restarts at each group; the
  scans are segment-local (:func:`~dpq_spark.core.quantiles._logscan.segmented_scans`).

In both, every number of a group's forward tables depends on that group alone, so it is the
same in any batch as in a batch of one (tested, bit for bit). The backward pass runs on all
groups' rows together with :func:`~dpq_spark.core.randomness.grid.draw_index_rows` and
:func:`~dpq_spark.core.randomness.grid.draw_index_segments` (exact for the same float64 weights as :func:`~dpq_spark.core.randomness.grid.draw_index`;
it consumes randomness in another order) and
:func:`~dpq_spark.core.randomness.grid.uniform_multisets`.

The distribution is the one of :mod:`dpq_spark.core.quantiles.joint_exp` (its module docstring:
the target, the bands and their envelope, and "Guarantee as implemented"), group by group: rows
whose group has tuples outside its bands first go through the envelope's rounds
(:func:`~dpq_spark.core.quantiles.joint_exp_envelope.draw_outside`, all rows at once), and the
rows that choose the bands are drawn from the tables. Tested against brute force with groups
interleaved in one call (also with bands forced down to the reference cells, where most rounds
leave them), and the dense tables against the flat ones (within 1e-10; they differ by about
1e-13). Two differences in the float analysis:

(ii) No run truncation: both passes add every run length whose first output lies in its band
(the batched run sums, :meth:`_Forward.run_sums`), so the ``m 2**-72`` term of (ii) is 0 here
(a smaller error than the single-group sampler's; its bound still holds).

(iii) Rounding. Flat pass: as in :mod:`~dpq_spark.core.quantiles.joint_exp`, plus a scan's
linear-space partial sum over a row of at most 512 positive terms (relative error below
``2**-44``, less than one operation's ``2**-52 M`` as ``M >= 800``). Dense pass, per step and
log weight: each source, ``exp(S_{j-1})`` up to its scale, taken as the previous step's
linear-space run sum (its error is the source's own, carried) times ``exp(H - shift)`` with
``|H - shift| <= 650`` (relative error ``<= 652 * 2**-52``, the product included); at most three
factors ``exp(c r)``, ``1 / exp(c r)``, ``exp(+-c t)`` (``r`` a rank minus the smallest the step
reads, exact) with arguments at most 350 in magnitude (relative error ``<= 352 * 2**-52``
each); a sum of at most ``_DENSE_WIDTH = 16,384`` positive terms (prefix, in-block prefix and
suffix sums, each added in order: relative ``<= 16384 * 2**-53``); at most six more roundings
on either path to the sum (products, a quotient, additions of positive numbers); then one
``log`` and one addition.
Before the ``log`` that is a relative error below ``(1714 + 8192) 2**-52``, an absolute one
below ``12.4 * 2**-52 M`` after it as ``M >= 800``: with the ``log`` and the addition, fewer
than 14 of the 16 operations counted below. With the
guards no number is subnormal, so these relative bounds hold for every entry, the smallest
included. Both passes' run sums are ``H + log(sum_k exp(x_k - H))`` over at most m terms, each
``x_k`` a few additions of numbers of magnitude at most ``M`` (the dense pass keeps
``exp(x_k - H)`` in linear space: the stored ``exp`` of an earlier ``A``, itself
``exp(A - H') exp(H' - shift')`` with both arguments at most 650 in magnitude, times a
per-row factor and ``R_k``, each within ``2**-52 M`` relative), ``log R_k`` a sum of at most m
logs (dense: ``R_k`` a product of at most ``m - 1`` ratios, relative error below
``m 2**-52``). Counting, per step, 16 operations on magnitude ``M`` for the kernel sums and
``m`` for the run sum, every log weight's absolute error is at most
``gamma_many = m (m + 16) 2**-52 M`` (first-order, not machine-checked), in place of
joint_exp's ``16 m 2**-52 M``; then ``theta = (4 m + 4) (gamma_many + 2**-52)`` and
``eta = 2 theta``, ``delta`` unchanged. Examples (epsilon 1, default grid): n = 1e6, m = 9
(c = 0.28, ``M = 8.3e5``): ``gamma_many = 4.2e-8``, ``eta = 3.4e-6``; n = 1e6, m = 30:
``eta = 5.9e-5``; the dense pass only runs where every step has ``c t_j <= 350``: for deciles
``c n <= 3,500`` (``M <= 11,500``: ``eta <= 4.6e-8`` there). Each group's release is thus
``(epsilon + eta, delta)``-DP with those ``eta`` and ``delta``, and the groups' draws are
independent.

Why two implementations of JointExp: this module is several times faster per group for many
groups (``benchmarks/bench_joint_exp_many.py``) but slower for one group at a time (more numpy
calls per step), so :func:`~dpq_spark.core.quantiles.joint_exp.joint_exp` keeps its own.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from dpq_spark.core.quantiles._logscan import segment_ends, segmented_scans
from dpq_spark.core.randomness.grid import (draw_index, draw_index_rows, draw_index_segments,
                                             uniform_multiset, uniform_multisets)
from dpq_spark.core.quantiles.joint_exp import (
    _add_causal,
    _add_window,
    _band_set,
    _bands,
)
from dpq_spark.core.quantiles.joint_exp_envelope import Bands, Envelope, draw_outside, log_totals

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
    sg = np.repeat(groups, src_len)
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
        self.targets = _targets(q, self.n)
        self.first = coff[:-1, None] + lo  # global first cell of each band, shape (G, m)
        self.length = hi - lo
        if not np.all(self.length > 0):
            raise AssertionError("JointExp band without cells")  # cannot happen: ref is kept
        self.off = np.zeros((self.m, self.G + 1), dtype=np.int64)
        np.cumsum(self.length.T, axis=1, out=self.off[:, 1:])
        self.base = np.concatenate(([0], np.cumsum(self.off[:, -1])))  # step j at base[j-1]
        self.A: list[np.ndarray] = []  # A_j on the bands j, stored minus nu[:, j-1]
        self.S: list[np.ndarray] = []  # S_j minus its group's nu (kept for the backward pass)
        self.nu = np.zeros((self.G, self.m))

    def _rep(self, j: int, per_group: np.ndarray) -> np.ndarray:
        """A per-group array spread over the cells of the bands j (1-based)."""
        return np.repeat(per_group, self.length[:, j - 1])

    # The group and the global cell of every entry of a step's tables are built when a step
    # needs them, not kept for all m steps (16 bytes a band cell: a sixth of a batch's memory).

    def gid(self, j: int) -> np.ndarray:
        """The group of each entry of the tables of the bands j (1-based)."""
        return self._rep(j, np.arange(self.G))

    def cells(self, j: int) -> np.ndarray:
        """The global cell of each entry of the tables of the bands j (1-based)."""
        return np.arange(self.off[j - 1, -1]) + self._rep(j, self.first[:, j - 1] - self.off[j - 1, :-1])

    def run(self) -> None:
        # every step's A and S in one array each (step j at base[j-1]); the lists hold views
        self.A_all = np.empty(int(self.base[-1]))
        self.S_all = np.empty(int(self.base[-1]))
        self._run_tables()
        before = None  # the cells of the bands j - 1
        for j in range(1, self.m + 1):
            cells = self.cells(j)
            L = self.log_width[cells]
            p = self.pos[cells]
            A = self.A_all[self.base[j - 1]:self.base[j]]
            if j == 1:
                np.subtract(L, self.c * np.abs(p - self._rep(1, self.targets[:, 0])), out=A)
                nu_a = np.zeros(self.G)
            else:
                # positions increase with the cell: the sources left of a cell are the cells before it
                hi = np.clip(cells - self._rep(j, self.first[:, j - 2]), 0, self._rep(j, self.length[:, j - 2]))
                hi += self._rep(j, self.off[j - 2, :-1])
                np.add(L, _kernel_sums_many(self.pos[before], self.S[-1], self.off[j - 2],
                                            p, self.off[j - 1], self.targets[:, j - 1], self.c, hi), out=A)
                nu_a = self.nu[:, j - 2]
            self.A.append(A)
            self.nu[:, j - 1] = nu_a
            S = self.run_sums(j, cells)
            shift = np.maximum.reduceat(S, self.off[j - 1, :-1])
            if not np.all(np.isfinite(shift)):  # cannot happen: the reference sequence has mass
                raise FloatingPointError("JointExp forward pass lost all mass")
            shift_rep = self._rep(j, shift)
            A -= shift_rep
            self.nu[:, j - 1] = nu_a + shift
            self.S.append(self.S_all[self.base[j - 1]:self.base[j]])
            np.subtract(S, shift_rep, out=self.S[-1])
            before = cells

    def _run_tables(self) -> None:
        """``log R_k(w)`` (k = 1..m, a row per cell) on the cells that lie in two bands or more
        of their group (the only ones a run of two outputs or more can use), summed left to
        right as in :meth:`run_terms`; ``self.r_row`` maps a global cell to its row (valid on
        those cells only)."""
        lo, hi = self.first, self.first + self.length  # (G, m), global cells
        # per group, the hull of the pairwise intersections of its bands
        a = np.maximum(lo[:, :, None], lo[:, None, :])
        b = np.minimum(hi[:, :, None], hi[:, None, :])
        pair = (b > a) & ~np.eye(self.m, dtype=bool)[None]
        big = np.iinfo(np.int64).max
        ra = np.where(pair, a, big).min(axis=(1, 2))
        rb = np.where(pair, b, -1).max(axis=(1, 2))
        rows = np.maximum(rb - ra, 0)
        ra = np.where(rows > 0, ra, 0)
        toff = np.concatenate(([0], np.cumsum(rows)))
        self.r_shift = toff[:-1] - ra  # row of global cell x of group g: x + r_shift[g]
        cells = np.arange(int(toff[-1])) + np.repeat(ra - toff[:-1], rows)
        table = np.zeros((cells.size, self.m))
        if self.m > 1 and cells.size:
            k = np.arange(2, self.m + 1, dtype=np.float64)
            table[:, 1:] = np.log(self.width[cells][:, None] + (k - 1.0)) - np.log(k)
            np.cumsum(table, axis=1, out=table)
        self.log_r = table.ravel()

    def _index(self, jp: np.ndarray, cells: np.ndarray, gid: np.ndarray):
        """``(idx, inside)``: where global cell ``cells`` of group ``gid`` sits in the tables of
        step ``jp`` (1-based, per element) counted over all steps (``base``), and whether it lies
        in that band at all (``idx`` is 0 where not)."""
        rel = cells - self.first[gid, jp - 1]
        inside = (rel >= 0) & (rel < self.length[gid, jp - 1])
        idx = np.where(inside, self.base[jp - 1] + self.off[jp - 1, gid] + rel, 0)
        return idx, inside

    def run_sums(self, j: int, cells: np.ndarray) -> np.ndarray:
        """S_j = log sum_k alpha(j, i, k) on the bands j, minus nu_j (the scale of the stored A_j).

        A run of k outputs in cell i (w grid points) carries ``C(w + k - 1, k) = w R_k(w)``
        multisets, ``log R_k(w) = sum_{t=2..k} log((w + t - 1) / t)``; the run's first output
        jp = j - k + 1 must lie in band jp. Every such run length is summed (no truncation): the
        cells of band j that lie in band jp form one range per group (the two bands'
        intersection), so the terms of all k are gathered range by range into a table of one
        row per cell, and each row is summed as ``max + log(sum(exp(term - max)))``. ``cells``:
        :meth:`cells` of step j.
        """
        A = self.A[j - 1]
        if j == 1:
            return A.copy()
        Fj, Lj = self.first[:, j - 1], self.length[:, j - 1]
        Fp, Lp = self.first[:, :j - 1], self.length[:, :j - 1]  # bands jp = 1..j-1
        s = np.maximum(Fj[:, None], Fp)  # band j ∩ band jp, global cells: [s, e)
        ell = np.maximum(np.minimum((Fj + Lj)[:, None], Fp + Lp) - s, 0)
        used = np.flatnonzero(ell.any(axis=0))
        if used.size == 0:
            return A.copy()
        kmax = j - int(used[0]) # the longest run with a term: it starts at output used[0] + 1
        nu, P, m = self.nu, self.cum_target, self.m
        table = np.full((A.size, kmax), -np.inf)
        table[:, 0] = A
        rows = None
        for jp in used[used >= j - kmax].tolist():
            jp += 1
            k = j - jp + 1
            offset = (nu[:, jp - 1] - nu[:, j - 1]) - self.c * (P[:, j - 1] - P[:, jp - 1])
            if np.array_equal(ell[:, jp - 1], Lj) and np.array_equal(Fp[:, jp - 1], Fj):
                # band jp is band j for every group: the two tables are aligned
                if rows is None:
                    rows = (cells + self._rep(j, self.r_shift)) * m
                table[:, k - 1] = self.A[jp - 1] + self._rep(j, offset) + self.log_r[rows + (k - 1)]
                continue
            el = ell[:, jp - 1]
            x = np.arange(int(el.sum())) + np.repeat(s[:, jp - 1] - (np.cumsum(el) - el), el)  # global cell
            dest = x + np.repeat(self.off[j - 1, :-1] - Fj, el)
            src = x + np.repeat(self.base[jp - 1] + self.off[jp - 1, :-1] - Fp[:, jp - 1], el)
            row = (x + np.repeat(self.r_shift, el)) * m + (k - 1)
            table[dest, k - 1] = self.A_all[src] + np.repeat(offset, el) + self.log_r[row]
        top = table.max(axis=1)
        top[~np.isfinite(top)] = 0.0
        table -= top[:, None]
        np.exp(table, out=table)
        # the run lengths added one after another: kmax depends on the batch (its widest
        # overlap of bands), and a row sum over more columns may round differently even when
        # the extra terms are 0, while adding 0 in order changes nothing
        total = table[:, 0].copy()
        for k in range(1, kmax):
            total += table[:, k]
        with np.errstate(divide="ignore"):
            return np.log(total) + top

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
        Each group's ``_grid_cells(idx, counts, size)``; all groups share ``q`` and ``c``
        (their numbers of rows differ).
    q : numpy.ndarray
        The m validated quantiles.
    c : float
        ``epsilon / (2 Delta)``.
    size : int or numpy.ndarray
        The number of grid points: one for all groups, or one per group.
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
    draws every row's cells with :func:`~dpq_spark.core.randomness.grid.draw_index_segments`
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
    sizes = np.broadcast_to(np.asarray(size, dtype=np.int64), (G,))
    if bands is None:
        parts = []
        for g, cells in enumerate(cells_list):
            start, width, log_width, pos, n = cells
            lo_g, hi_g, h_g = _bands(*cells, q, c, int(sizes[g]))
            parts.append(_band_set(start, pos, n, q, c, lo_g, hi_g, h_g))
        bands = Bands.stack(parts)
    lo, hi = bands.lo, bands.hi
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
        return _sample_batch(cells_list, bands, q, c, sizes, source, rows, out)
    for x, y in zip(edges[:-1], edges[1:]):
        mine = np.flatnonzero((rows >= x) & (rows < y))
        if mine.size:
            out[mine] = _sample_batch(cells_list[x:y], bands.take(slice(x, y)), q, c,
                                      sizes[x:y], source, rows[mine] - x,
                                      np.empty((mine.size, m), dtype=np.int64))
    return out


#: band cells (summed over the m steps) of the groups one forward pass holds; about 90 bytes
#: each across the tables. Not smaller: each batch pays the backward pass's rounds of draws, so
#: 2**19 made 1e5 groups of 10 rows about 1.1x slower, 2**18 about 1.3x
#: (benchmarks/bench_worker_memory.py)
_BATCH_CELLS = 1 << 20

#: cells (of :func:`~dpq_spark.core.quantiles.joint_exp._grid_cells`, four 8-byte arrays each) that a
#: caller builds for many groups before sampling them and building the next ones: 16 MiB, and
#: as much again for their hulls' copy in :func:`_sample_set` (2**21 cost a worker of 500 groups
#: x 1e4 rows about 100 MiB more peak RSS, for no speed)
CELLS_HELD = 1 << 19


def _sample_batch(cells_list, bands, q, c, sizes, source, rows, out) -> np.ndarray:
    """:func:`_sample_many` for one batch of groups, their ``bands`` computed (``sizes``: each
    group's grid size).

    Groups whose bands span at most ``_DENSE_WIDTH`` cells get their forward tables from
    :class:`_Dense` (at most ``_DENSE_ELEMENTS`` cells times m at a time, :func:`_dense_tables`)
    if their steps fit its span guard (:func:`_span_fits`, checked before the pass) and its
    source guard holds during the pass, the others from :class:`_Forward`; each set's rows are
    drawn from its own tables, all of them at once. Which set a group joins depends on its own
    data only, and both give it the same law (module docstring)."""
    union = bands.hi.max(axis=1) - bands.lo.min(axis=1)
    dense = union <= _DENSE_WIDTH
    if not dense.any():
        return _sample_set(cells_list, bands, q, c, sizes, source, rows, out, False)[0]
    members = np.flatnonzero(dense)
    if members.size == len(cells_list):
        out, ok = _sample_set(cells_list, bands, q, c, sizes, source, rows, out, True)
    else:  # (the rows of refused groups are drawn below)
        ok = _sample_subset(cells_list, bands, q, c, sizes, source, rows, out, members, True)
    flat = np.sort(np.concatenate([np.flatnonzero(~dense), members[~ok]]))
    if flat.size:  # the rows of these groups were not drawn above
        _sample_subset(cells_list, bands, q, c, sizes, source, rows, out, flat, False)
    return out


def _sample_subset(cells_list, bands, q, c, sizes, source, rows, out, groups, dense):
    """:func:`_sample_set` for the groups ``groups`` (sorted indices into ``cells_list``): their
    entries of ``rows`` are drawn into ``out``; returns their ``ok`` (all true when they have
    no rows: nothing is computed)."""
    mine = np.flatnonzero(np.isin(rows, groups))
    if mine.size == 0:
        return np.ones(groups.size, dtype=bool)
    got, ok = _sample_set([cells_list[g] for g in groups.tolist()], bands.take(groups), q, c,
                          sizes[groups], source, np.searchsorted(groups, rows[mine]),
                          np.empty((mine.size, q.size), dtype=np.int64), dense)
    out[mine] = got
    return ok


def _sample_set(cells_list, bands, q, c, sizes, source, rows, out, dense):
    """The forward tables of these groups (:class:`_Dense` if ``dense``, else :class:`_Forward`)
    and the draws of ``rows``; returns ``(out, ok)``, ``ok`` the groups whose tables were made
    (all of them for :class:`_Forward`; rows of the others are left undrawn). Groups that do
    not fit the dense span guard are left out of the dense pass (refused without it)."""
    m = q.size
    G = len(cells_list)
    lo, hi = bands.lo, bands.hi
    # only the cells some band keeps, [a_g, b_g) of each group, are concatenated
    a, b = lo.min(axis=1), hi.max(axis=1)
    coff = np.zeros(G + 1, dtype=np.int64)
    np.cumsum(b - a, out=coff[1:])
    used = [slice(int(x), int(y)) for x, y in zip(a.tolist(), b.tolist())]
    pos = np.concatenate([cl[3][u] for cl, u in zip(cells_list, used)])
    n = np.array([cl[4] for cl in cells_list], dtype=np.float64)
    if dense:  # the span guard first: a group it refuses stays out of the dense pass
        fits = _span_fits(pos, coff[:-1, None] + lo - a[:, None], coff[:-1, None] + hi - a[:, None],
                          _targets(q, n), c)
        if not fits.all():
            ok = np.zeros(G, dtype=bool)
            if fits.any():
                keep = np.flatnonzero(fits)
                ok[keep] = _sample_subset(cells_list, bands, q, c, sizes, source, rows, out, keep,
                                          True)
            return out, ok
    start, width, log_width = (np.concatenate([cl[t][u] for cl, u in zip(cells_list, used)])
                               for t in range(3))
    fw = _Forward(width, log_width, pos, coff, n, q, c, lo - a[:, None], hi - a[:, None])
    draw = functools.partial(_draw_all, fw, start, width, cells_list, bands, sizes, source)
    if dense:
        ok = _dense_tables(fw, coff)
        keep = np.flatnonzero(ok[rows])
        if keep.size < rows.size:
            if keep.size:
                out[keep] = draw(rows[keep], np.empty((keep.size, m), dtype=np.int64))
            return out, ok
    else:
        fw.run()
        ok = np.ones(G, dtype=bool)
    return draw(rows, out), ok


def _draw_all(fw, start, width, cells_list, bands, sizes, source, rows, out) -> np.ndarray:
    """One draw per entry of ``rows`` from finished forward tables, all tuples: each row's
    rounds first choose between its group's bands and the tuples outside them
    (:func:`~dpq_spark.core.quantiles.joint_exp_envelope.draw_outside`, only for groups with
    tuples outside their bands), then the rows that chose the bands are drawn from the tables
    (:func:`_draw_rows`)."""
    if not np.isfinite(bands.h[rows]).any():
        return _draw_rows(fw, start, width, rows, source, out)
    m = fw.m
    log_w_last = _last_weights(fw)
    with np.errstate(over="ignore", invalid="ignore"):  # groups refused by the dense pass: unread
        log_zn = fw.nu[:, m - 1] + log_totals(log_w_last, fw.off[m - 1, :-1], fw.length[:, m - 1])
    env = Envelope(bands, fw.n, sizes, fw.q, fw.c)

    def ranks(g, x):  # mid-ranks of grid points, from each group's own cells
        got = np.empty(x.shape)
        for r, gr in enumerate(g.tolist()):
            st, ps = cells_list[gr][0], cells_list[gr][3]
            got[r] = ps[np.searchsorted(st, x[r], side="right") - 1]
        return got

    inside, outside = draw_outside(env, rows, log_zn, ranks, source)
    if inside.all():
        return _draw_rows(fw, start, width, rows, source, out, log_w_last)
    out[~inside] = outside[~inside]
    take = np.flatnonzero(inside)
    if take.size:
        out[take] = _draw_rows(fw, start, width, rows[take], source,
                               np.empty((take.size, m), dtype=np.int64), log_w_last)
    return out


def _dense_tables(fw: _Forward, coff: np.ndarray) -> np.ndarray:
    """``fw``'s tables from :class:`_Dense`, run on consecutive chunks of its groups of at most
    ``_DENSE_ELEMENTS`` cells times steps each (one group at least: rows short enough to stay
    in cache), each chunk's tables copied into ``fw``'s flat ones; returns each group's ``ok``.
    Every number of a group is the same as in a chunk of its own (:class:`_Dense`), so the
    chunks change no table; drawing the rows of all chunks from ``fw`` at once pays the
    backward pass's fixed costs once."""
    G, m = fw.G, fw.m
    load = np.cumsum(np.diff(coff) * m)
    if load[-1] <= _DENSE_ELEMENTS or G == 1:
        return _Dense(fw, coff).run()
    fw.A_all = np.empty(int(fw.base[-1]))
    fw.S_all = np.empty(int(fw.base[-1]))
    ok = np.empty(G, dtype=bool)
    lo = fw.first - coff[:-1, None]  # each group's bands in its own cells
    a = 0
    while a < G:
        b = max(a + 1, int(np.searchsorted(load, load[a] - (coff[a + 1] - coff[a]) * m
                                           + _DENSE_ELEMENTS, side="right")))
        x, y = int(coff[a]), int(coff[b])
        sub = _Forward(fw.width[x:y], fw.log_width[x:y], fw.pos[x:y], coff[a:b + 1] - x, fw.n[a:b],
                       fw.q, fw.c, lo[a:b], lo[a:b] + fw.length[a:b])
        ok[a:b] = _Dense(sub, coff[a:b + 1] - x).run()
        for j in range(m):  # step j + 1's tables: the groups' bands in order
            into = slice(int(fw.base[j] + fw.off[j, a]), int(fw.base[j] + fw.off[j, b]))
            fw.A_all[into] = sub.A_all[sub.base[j]:sub.base[j + 1]]
            fw.S_all[into] = sub.S_all[sub.base[j]:sub.base[j + 1]]
        fw.nu[a:b] = sub.nu
        a = b
    fw.A = [fw.A_all[fw.base[j]:fw.base[j + 1]] for j in range(m)]
    fw.S = [fw.S_all[fw.base[j]:fw.base[j + 1]] for j in range(m)]
    return ok


def _last_weights(fw) -> np.ndarray:
    """The log weights of the last output's cells, every group's band m (true scale minus
    ``nu[:, m - 1]``): its run sums and the kernel to the end of the data."""
    m, gid = fw.m, fw.gid(fw.m)
    return fw.S[m - 1] - fw.c * np.abs(fw.n[gid] - fw.pos[fw.cells(m)] - fw.targets[gid, m])


def _draw_rows(fw, start, width, rows, source, out, log_w_last=None) -> np.ndarray:
    """One draw per entry of ``rows`` (groups of ``fw``) from finished forward tables: the last
    output's cell, the cells backwards by runs (:func:`_backward`), the grid points of every run.
    ``log_w_last``: :func:`_last_weights`, when the caller has them."""
    m = fw.m
    if log_w_last is None:
        log_w_last = _last_weights(fw)
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


#: groups whose bands together span at most this many cells are offered to the dense path
#: (:class:`_Dense`), which takes those whose every step fits the span guard (:func:`_span_fits`,
#: checked before the pass: a group refused after it would pay for both passes). CPU per group,
#: N(0, 5) deciles, bounds +-100, dense against flat (best of 3,
#: 2 December 2026, load about 2): epsilon 1, 1,000 rows 0.45 against 0.99 ms, 3,000 rows 0.89
#: against 1.13 ms, 3,800 rows 0.87 against 1.26 ms; epsilon 0.1, 4,000 rows 2.6 against 10.1 ms,
#: 16,000 rows 4.2 against 10.0 ms; epsilon 10, 300 rows 0.10 against 0.14 ms. Not larger: the
#: dense rounding bound counts a sum of up to this many terms (module docstring, (iii))
_DENSE_WIDTH = 16384
#: cells times steps of the groups one dense pass holds: its peak is about 20-60 bytes each
#: (tracemalloc; groups of 3,000 to 100 rows at m = 9: rows of W cells, R_k for the run lengths
#: the bands allow, exp A_j on each step's columns; 80-90 bytes when every step was padded to W)
_DENSE_ELEMENTS = 1 << 20
#: the dense path's range guards, in nats: every source within _DENSE_SOURCES of its group's
#: largest, and at every step c (span of the ranks it reads + its target) at most _DENSE_SPAN;
#: else the flat path
_DENSE_SOURCES = 300.0
_DENSE_SPAN = 350.0
_MIN_SOURCE = math.exp(-_DENSE_SOURCES)
#: a row looks up its window starts in a table of its ranks when they number at most this many
#: times its cells (else one search over all rows)
_RANK_TABLE = 4


def _cumulate(pre: np.ndarray, suf: np.ndarray) -> None:
    """In place: the cumulative sums of ``pre`` down its columns (row i becomes the sum of rows
    0..i, added in order) and of ``suf`` up its columns (row i: rows i..end). The numbers of
    ``np.cumsum`` along axis 0; for short columns and many of them, one addition of whole rows
    a step runs faster than ``cumsum``'s elementwise loop."""
    if pre.shape[1] < _CUMULATE_ROW:
        np.cumsum(pre, axis=0, out=pre)
        np.cumsum(suf[::-1], axis=0, out=suf[::-1])
        return
    for i in range(1, pre.shape[0]):
        np.add(pre[i - 1], pre[i], out=pre[i])
    for i in range(pre.shape[0] - 2, -1, -1):
        np.add(suf[i + 1], suf[i], out=suf[i])


#: :func:`_cumulate` adds whole rows from this many columns (blocks) on
_CUMULATE_ROW = 128


def _step_cells(lo, hi):
    """The cells step j = 2..m reads or writes (bands j - 1 and j): each group's first and last,
    shape ``(G, m - 1)``, in the coordinates of ``lo`` and ``hi`` (bands ``[lo, hi)``)."""
    return np.minimum(lo[:, 1:], lo[:, :-1]), np.maximum(hi[:, 1:], hi[:, :-1]) - 1


def _span_fits(pos, first, end, targets, c):
    """Each group's span guard: at every step j >= 2, ``c`` times the span of the ranks it
    reads (bands j - 1 and j: cells ``[first, end)`` of ``pos``, shape ``(G, m)``) plus its
    target ``t_j`` is at most ``_DENSE_SPAN``, so the factors ``exp(+-c (p - p_0))`` (``p_0``
    the smallest of those ranks) and ``exp(+-c t_j)`` of that step are at most
    ``exp(_DENSE_SPAN)``. Reads only the group's own ranks and bands."""
    a, b = _step_cells(first, end)
    return (c * (pos[b] - pos[a] + targets[:, 1:-1]) <= _DENSE_SPAN).all(axis=1)


def _targets(q, n):
    """The gap targets ``t_j = (q_j - q_{j-1}) n``, j = 1..m+1, one row per group."""
    return np.diff(np.concatenate(([0.0], q, [1.0])))[None, :] * np.asarray(n, dtype=np.float64)[:, None]


class _Dense:
    """The forward tables of :class:`_Forward` for groups whose bands span few cells, computed
    on one row per group (its cells ``[a_g, b_g)``, padded to the widest row) and written into
    ``fw``'s flat tables, for the backward pass of :func:`_draw_rows`.

    Step j works on the columns of bands j - 1 and j only (a slice common to the rows: outside
    a row's own bands its sources are exact zeros and its receivers are not read, so no number
    of a row depends on the slice). A step's kernel sums are linear-space sums: with
    ``e = exp(S_{j-1})`` (at most 1: the group's largest is 0; kept from the previous step's
    run sum in linear space, never the ``exp`` of its ``log``), ``r = p - p_0`` (``p_0`` the
    smallest rank of the row's bands j - 1 and j), ``u = e exp(c r)`` and ``v = e exp(-c r)``,

    * causal part (``p' <= T = p - t``): ``exp(-c (T - p_0)) * cumsum(u)`` read at the last
      such source (a prefix sum of positive terms);
    * window part (``T < p' < p``): ``exp(c (T - p_0))`` times the sum of ``v`` over the
      window, which lies in at most three consecutive blocks of ranks of length ``0.75 t``
      (as :func:`~dpq_spark.core.quantiles.joint_exp._add_window`): the suffix of its first
      block, at most one whole block, the prefix of its last block; the in-block prefix and
      suffix sums are cumulative sums down an array that holds each block as a column of its
      own (:meth:`_blocks`). No difference of sums is ever taken.

    The run sums add every run length (no truncation): for each k, ``A_{j-k+1} + offset +
    log R_k(w)`` over band j (``-inf`` outside band ``j - k + 1``), summed as
    ``max + log(sum(exp(term - max)))``, the max over the run lengths the row's own bands
    allow. Every number of a row depends on its own group alone (elementwise operations, scans
    along the row; padding and other rows' columns add exact zeros).

    Range guards: a group is refused (``ok`` false; the caller uses :class:`_Forward`) unless
    it passes :func:`_span_fits` and, at every step, each finite source is within
    ``_DENSE_SOURCES`` of the group's largest. Then every factor and partial sum above lies in
    ``[exp(-700), exp(360)]``: normal float64 numbers, so each keeps its relative precision
    (module docstring, the rounding bound of the dense path).
    """

    def __init__(self, fw: _Forward, coff: np.ndarray):
        self.fw = fw
        G = fw.G
        rows_len = np.diff(coff)
        self.W = W = int(rows_len.max())
        self.col = np.arange(W)
        self.valid = self.col[None, :] < rows_len[:, None]
        self.flat = np.repeat(np.arange(G) * W - coff[:-1], rows_len) + np.arange(int(coff[-1]))
        self.coff = coff

    def _pad(self, values, fill):
        out = np.full(self.fw.G * self.W, fill, dtype=np.float64)
        out[self.flat] = values
        return out.reshape(self.fw.G, self.W)

    @staticmethod
    def _tau(t):
        """The blocks' length ``0.75 t`` (``t`` the targets, one per group) to 40 bits, and its
        bytes as a key: the same blocks serve any t' with t' / 2 < 0.75 t < t', and the
        rounding makes a row's blocks its own whatever the others' targets."""
        mant, expo = np.frexp(np.where(t > 0, 0.75 * t, 1.0))
        tau = np.ldexp(np.round(np.ldexp(mant, 40)), expo - 40)
        return tau, tau.tobytes()

    def _window(self, j, r0, r1):
        """Step j's window on its receivers' columns ``[r0, r1)``: each cell's first window
        source ``lo`` (the number of cells of rank ``<= p - t``, at most the cell's own index)
        and, as flat indices into the step's sums (padded to ``W + 1`` columns), the pieces
        that make its window (:meth:`_window_pieces`), with the blocks' scan masks. The steps
        whose targets are the same floats read slices of one table, computed once on the union
        of their columns (each number as the step alone would compute it: the table depends on
        the targets only)."""
        c0, table, steps = self.windows[self.fw.targets[:, j - 1].tobytes()]
        return {name: a[:, r0 - c0:r1 - c0] for name, a in table.items()}, steps

    def _windows(self):
        """The tables of :meth:`_window` for steps 2..m, one per distinct vector of targets (the
        same float for every group: equal bytes), each on the union of the receivers' columns
        of the steps that have it."""
        first, end = self.first, self.end
        spans = {}
        for j in range(2, self.fw.m + 1):
            t = self.fw.targets[:, j - 1]
            r0, r1 = int(first[:, j - 1].min()), int(end[:, j - 1].max())
            key = t.tobytes()
            c0, c1, _ = spans.get(key, (r0, r1, t))
            spans[key] = (min(c0, r0), max(c1, r1), t)
        self.windows = {key: (c0, *self._window_pieces(t, c0, c1)) for key, (c0, c1, t) in spans.items()}

    def _window_pieces(self, t, r0, r1):
        """For targets ``t`` (one per group), on the columns ``[r0, r1)``: ``lo``, the index of
        the causal sum read (``at_lo``) and of the window's three pieces (:meth:`_blocks`): the
        suffix of lo's block (``suf_at``, into the suffix sums), the prefix of the block of
        ``i - 1`` (``pre_at``) and the one whole block between (``mid_at``, into the prefix
        sums), all as flat indices into the blocks' layout of :meth:`_blocks`; a piece the
        window does not take reads an exact zero (the layout's column of zeros). Returns them and
        the layout."""
        G = self.fw.G
        cols = self.col[r0:r1]
        # p' <= T iff 2 p' <= floor(2 T) (the 2 p' are integers): read in each row's table of
        # the number of cells with 2 p' <= x, x = -1..2 n_g
        query = np.floor(self.two_p[:, r0:r1] - 2.0 * t[:, None])
        np.maximum(query, -1.0, out=query)
        np.minimum(query, self.two_top, out=query)
        if self.count_le is not None:
            lo = self.count_le.take(query.astype(np.int64) + self.le_row)
        else:
            lo = np.searchsorted(self.keys, (query + self.key_row).ravel(), side="right")
            lo = lo.reshape(G, r1 - r0) - self.w_row
        lo = np.minimum(lo, cols)
        tau, key = self._tau(t)
        if key not in self.blocks:
            self.blocks[key] = self._blocks(tau)
        bs, be, layout = self.blocks[key]
        slot, shape, _ = layout
        zero = shape[1] - 2  # the column of zeros
        sf = np.zeros((G, r1 - r0), dtype=np.int64)  # block start of the cell before each receiver
        sf[:, r0 == 0:] = bs[:, max(r0 - 1, 0):r1 - 1]
        be_lo = be.take(lo + self.w_row)
        nonempty = lo < cols
        before = slot[:, max(r0 - 1, 0):r1 - 1]  # the slot of the cell before each receiver
        if r0 == 0:
            before = np.concatenate((np.full((G, 1), zero), before), axis=1)
        # window [lo, i): within one block it is the prefix of the block of i - 1 (lo = sf) or a
        # suffix of lo's block (lo > sf); else that suffix, the prefix and at most one whole block
        return dict(lo=lo, at_lo=lo + self.w1_row,
                    suf_at=np.where(nonempty & (lo != sf), slot.take(lo + self.w_row), zero),
                    pre_at=np.where(nonempty & (lo <= sf), before, zero),  # prefix at i - 1
                    mid_at=np.where(nonempty & (lo < sf) & (be_lo < sf - 1),  # prefix at sf - 1
                                    slot.take(np.maximum(sf - 1, 0) + self.w_row), zero)), layout

    def _blocks(self, tau):
        """Blocks of ranks ``[b tau, (b + 1) tau)`` (``tau`` per group, ``0.75 t``): each cell's
        block start and end (columns) and the blocks' layout for their scans: ``(slot, shape,
        place)``, ``slot`` each cell's place in a ``shape`` array holding one block a column
        (its cells from row 0, zeros after), the padding columns all at one slot of the last
        column; the column before it stays zero (the exact zero a piece the window does not
        take reads). Blocks as columns: their sums run as one addition of whole rows per place
        in a block. Row g's b-th block is column ``b G + g`` (``place[g, c]`` is b for cell c,
        the last block's for the padding after the row's cells), so the blocks that meet a
        range of cells of every row are one range of columns (:meth:`_kernel` scans only
        those)."""
        G, W, col, valid = self.fw.G, self.W, self.col, self.valid
        block = np.where(valid, np.floor(np.where(valid, self.P, 0.0) / tau[:, None]), -1.0 - col[None, :])
        head = np.ones((G, W), dtype=bool)
        head[:, 1:] = block[:, 1:] != block[:, :-1]
        tail = np.ones((G, W), dtype=bool)
        tail[:, :-1] = head[:, 1:]
        bs = np.maximum.accumulate(np.where(head, col, 0), axis=1)
        be = (W - 1) - np.maximum.accumulate(np.where(tail, W - 1 - col, 0)[:, ::-1], axis=1)[:, ::-1]
        width = int((be - bs).max()) + 1
        place = np.cumsum(head & valid, axis=1) - 1  # each cell's block, counted in its row
        blocks = (int(place.max()) + 1) * G if place.size else 0
        number = place * G + np.arange(G)[:, None]
        slot = np.where(valid, (col - bs) * (blocks + 2) + number, blocks + 1)
        return bs, be, (slot, (width, blocks + 2), place)

    def run(self) -> np.ndarray:
        """Fill ``fw``'s tables; returns each group's ``ok`` (its range guards held). A refused
        group's numbers may overflow (silenced here): its rows are not read."""
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            return self._run()

    def _setup(self) -> np.ndarray:
        """The padded rows, the rank tables, the steps' geometry and the tables of ``R_k``;
        returns the guards that do not depend on the pass (:func:`_span_fits`, ``log R_k``)."""
        fw = self.fw
        G, m, c, W = fw.G, fw.m, fw.c, self.W
        valid = self.valid
        self.P = P = self._pad(fw.pos, np.inf)
        self.L = self._pad(fw.log_width, -np.inf)
        w = self._pad(fw.width, 1.0)
        # each row's count of cells with 2 p <= x, for x = -1 .. 2 max n (the first column: x = -1)
        self.two_p = np.where(valid, 2.0 * P, 0.0)
        self.two_top = float(2.0 * fw.n.max()) + 1.0
        top = int(self.two_top) + 2
        if top <= _RANK_TABLE * W + 16:  # ranks about as many as cells: a table per row
            hits = np.zeros((G, top), dtype=np.int64)
            hits.ravel()[((np.arange(G) * top)[:, None] + self.two_p.astype(np.int64) + 1)[valid]] = 1
            self.count_le = np.cumsum(hits, axis=1)
        else:  # many ties: a search over all rows (keys shifted into disjoint ranges)
            self.count_le = None
        self.blocks = {}
        self.w_row, self.w1_row = (np.arange(G) * W)[:, None], (np.arange(G) * (W + 1))[:, None]
        if self.count_le is not None:
            self.le_row = (np.arange(G) * top + 1)[:, None]  # column 0 of row g: x = -1
        else:
            # row g's keys lie in [g span, g span + two_top + 1], span = two_top + 8
            self.key_row = (np.arange(G) * (self.two_top + 8.0))[:, None]
            self.keys = (np.where(valid, self.two_p, self.two_top + 1.0) + self.key_row).ravel()
        self.first = first = fw.first - self.coff[:-1, None]  # band j: columns [first, end)
        self.end = end = first + fw.length
        rows = np.arange(G)[:, None]
        a, b = _step_cells(first, end)
        self.p0 = P[rows, a]  # step j's r = p - p0 (column j - 2)
        self.span = P[rows, b] - self.p0
        ok = _span_fits(fw.pos, fw.first, fw.first + fw.length, fw.targets, c)
        # which bands of each row overlap: a run of k outputs ending at j needs bands j - k + 1..j
        self.overlap = (np.minimum(end[:, :, None], end[:, None, :])
                        > np.maximum(first[:, :, None], first[:, None, :]))  # (G, m, m)
        j_, jp_ = np.nonzero(self.overlap.any(axis=0))
        kmax = int((j_ - jp_).max(initial=0)) + 1
        row_kmax = (np.arange(m)[None, :, None] - np.arange(m)[None, None, :]) * self.overlap
        row_kmax = row_kmax.reshape(G, -1).max(axis=1) + 1
        # R_k(w) = C(w + k - 1, k) / w = R_{k-1}(w) (w + k - 1) / k, in linear space, only the
        # run lengths some row's bands allow (a refused row's may overflow: it is not read)
        self.R = R = np.ones((kmax, G, W))
        for k in range(2, kmax + 1):
            np.multiply(R[k - 2], (w + (k - 1.0)) / k, out=R[k - 1])
        self.top_r = np.log(R.max(axis=2)).T  # (G, kmax): the largest log R_k of each row
        ok &= self.top_r[np.arange(G), row_kmax - 1] <= _DENSE_SOURCES
        self._windows()
        return ok

    def _kernel(self, j, e_prev, at, ok):
        """Step j's kernel sums on its receivers' columns, from ``e_prev`` (``exp`` of S_{j-1}
        minus its scale, on the columns from ``at``); updates the source guard in ``ok``."""
        fw, c = self.fw, self.fw.c
        first, end = self.first, self.end
        r0, r1 = int(first[:, j - 1].min()), int(end[:, j - 1].max())  # the receivers' columns
        st, layout = self._window(j, r0, r1)
        rows = np.arange(fw.G)
        s0 = int(min(first[:, j - 2].min(), st["lo"][rows, first[:, j - 1] - r0].min()))
        e0 = int(max(end[:, j - 2].max(), r1))  # every source and window start lies in [s0, e0)
        e = self.e[:, s0:e0]
        e.fill(0.0)
        src = e[:, at - s0:at - s0 + e_prev.shape[1]]
        src[...] = e_prev
        ok &= np.where(src > 0.0, src, 1.0).min(axis=1) >= _MIN_SOURCE
        x = np.subtract(self.P[:, s0:e0], self.p0[:, j - 2, None])
        np.maximum(x, 0.0, out=x)
        np.minimum(x, self.span[:, j - 2, None], out=x)
        x *= c
        Ep = np.exp(x)
        Em = np.reciprocal(Ep, out=x)  # exp(-c r), r >= 0: Ep is at least 1
        causal = self.causal
        causal[:, s0] = 0.0
        np.cumsum(np.multiply(e, Ep, out=self.tmp[:, s0:e0]), axis=1, out=causal[:, s0 + 1:e0 + 1])
        # the in-block prefix and suffix sums of v: each block a column of its own (zeros after
        # its cells, and at every cell outside [s0, e0), whose v is 0), summed down the columns
        # in order (the numbers of a cumulative sum; a row at a time is about 3x faster)
        slot, shape, place = layout
        pre = np.zeros(shape)
        pre.ravel()[slot[:, s0:e0]] = np.multiply(e, Em, out=self.tmp[:, s0:e0])
        # only the blocks that meet cells [min(s0, r0 - 1), e0) of some row are read (the
        # window's pieces lie in [lo, i), lo >= s0, i < r1 <= e0); they are one range of
        # columns; the others, and the column of zeros, are left as they are
        a = max(min(s0, r0 - 1), 0)
        G = fw.G
        cols = slice(int(place[:, a].min()) * G, (int(place[:, e0 - 1].max()) + 1) * G)
        suf = np.zeros(shape)
        suf[:, cols] = pre[:, cols]
        _cumulate(pre[:, cols], suf[:, cols])
        ect = np.exp(c * fw.targets[:, j - 1])[:, None]
        part = causal.take(st["at_lo"]) * Em[:, r0 - s0:r1 - s0]
        part *= ect
        win = suf.take(st["suf_at"])
        win += pre.take(st["pre_at"])
        win += pre.take(st["mid_at"])
        win *= Ep[:, r0 - s0:r1 - s0]
        win /= ect
        part += win
        return part

    def _run_sum(self, j, a, band, r0, ok):
        """``(S_j, low, exp(A_j - H), exp(S_j - H), H)``: S_j minus nu_{j-1} on band j (columns
        from ``r0``), each row's smallest finite A_j, and the scale H with the two linear
        tables under it, from A_j there (``a``) and the stored exp of the earlier A: the sum
        over k of A_{j-k+1} R_k prod phi(0), in linear space under a per-row scale H (every term
        <= 1), H and the guards seeing only the run lengths the row's own bands allow (a row's
        other terms get the factor 0); guard: every term >= exp(-_DENSE_SOURCES - 350)."""
        fw, c = self.fw, self.fw.c
        nu, cum = fw.nu, fw.cum_target
        fin = np.isfinite(a)
        a_top = np.where(fin, a, -np.inf).max(axis=1)
        a_low = np.where(fin, a, np.inf).min(axis=1)
        terms = []  # (k, offset, which rows use it)
        for jp in range(j - 1, 0, -1):
            if self.any_overlap[j - 1, jp - 1]:
                off = (nu[:, jp - 1] - nu[:, j - 1]) - c * (cum[:, j - 1] - cum[:, jp - 1])
                terms.append((j - jp + 1, off, self.overlap[:, j - 1, jp - 1]))
        H = np.max([a_top] + [np.where(use, off + self.top_r[:, k - 1], -np.inf)
                              for k, off, use in terms], axis=0)  # the row's largest term
        H = np.where(np.isfinite(H), H, 0.0)
        low = np.min([a_low] + [np.where(use, self.a_min[:, j - k] + off, np.inf)
                                for k, off, use in terms], axis=0)
        ok &= low - H >= -_DENSE_SOURCES - _DENSE_SPAN
        lin_a = np.exp(a - H[:, None])
        total = lin_a.copy()
        r1 = r0 + a.shape[1]
        for k, off, use in terms:
            q0, lin = self.a_lin[j - k]  # exp A_{j-k+1} on the columns from q0, 0 outside its band
            x0, x1 = max(r0, q0), min(r1, q0 + lin.shape[1])
            if x1 > x0:  # elsewhere band j - k + 1 of no row meets band j: the terms are 0
                scale = np.exp(np.where(use, off - H, -np.inf))[:, None]
                total[:, x0 - r0:x1 - r0] += lin[:, x0 - q0:x1 - q0] * scale * self.R[k - 1, :, x0:x1]
        total[~band] = 0.0  # so log(total) is -inf outside band j (H is finite)
        return np.log(total) + H[:, None], a_low, lin_a, total, H

    def _run(self) -> np.ndarray:
        fw = self.fw
        G, m, c, W = fw.G, fw.m, fw.c, self.W
        ok = self._setup()
        P, L, first, end = self.P, self.L, self.first, self.end
        # A_j and S_j go to fw's flat tables at the end of step j; only the exp of every A_j
        # (the run sums of later steps read it) and S_{j-1} (the sources of step j) are kept
        fw.A_all = np.empty(int(fw.base[-1]))
        fw.S_all = np.empty(int(fw.base[-1]))
        self.e = np.empty((G, W))
        self.causal = np.zeros((G, W + 1))
        self.tmp = np.empty((G, W))
        self.a_lin = []  # per step: (r0, exp(log A_j minus nu_j) on its receivers' columns)
        self.a_min = np.zeros((G, m))  # the smallest finite entry of each A_j row
        self.any_overlap = self.overlap.any(axis=0)
        nu = fw.nu  # filled in place
        e_prev, at = None, 0  # exp(S_{j-1} minus nu_{j-1}) on the columns from `at`
        for j in range(1, m + 1):
            r0, r1 = int(first[:, j - 1].min()), int(end[:, j - 1].max())
            col = self.col[r0:r1]
            band = (col >= first[:, j - 1, None]) & (col < end[:, j - 1, None])
            if j == 1:
                a = np.where(band, L[:, r0:r1] - c * np.abs(P[:, r0:r1] - fw.targets[:, :1]), -np.inf)
                nu_a = np.zeros(G)
            else:
                a = np.where(band, L[:, r0:r1] + np.log(self._kernel(j, e_prev, at, ok)), -np.inf)
                nu_a = nu[:, j - 2]
            nu[:, j - 1] = nu_a
            s, a_low, lin_a, total, H = self._run_sum(j, a, band, r0, ok)
            shift = s.max(axis=1)
            lost = ~np.isfinite(shift)
            if lost.any():  # cannot happen (the reference sequence has mass): refused, not raised
                ok &= ~lost
                shift[lost] = 0.0
            a -= shift[:, None]
            s -= shift[:, None]
            # exp(A_j - shift) and exp(S_j - shift) from the linear tables under H: one product
            # each instead of an exp of a log (H - shift is at most 650 in magnitude)
            rescale = np.exp(H - shift)[:, None]
            self.a_lin.append((r0, np.multiply(lin_a, rescale, out=lin_a)))
            self.a_min[:, j - 1] = a_low - shift
            e_prev, at = np.multiply(total, rescale, out=total), r0
            nu[:, j - 1] = nu_a + shift
            # band j of every group, in the flat tables' order (groups, then cells)
            part = slice(int(fw.base[j - 1]), int(fw.base[j]))
            fw.A_all[part] = a[band]
            fw.S_all[part] = s[band]
            fw.A.append(fw.A_all[part])
            fw.S.append(fw.S_all[part])
        return ok


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
        k = _run_lengths(fw, jj, ii, g, source)
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
        # entry e of segment s is cell first[s] + e, S at at[s] + e: per-segment values are
        # repeated, not gathered per entry; the same floats, in the same order, as
        # S_all[at + e] - c |(pos[ii] - pos[first + e]) - target|
        offsets = np.cumsum(stop) - stop
        e = np.arange(int(offsets[-1] + stop[-1])) - np.repeat(offsets, stop)
        d = np.repeat(fw.pos[ii], stop) - fw.pos[e + np.repeat(first, stop)]
        d -= np.repeat(fw.targets[g, jj], stop)
        log_w = S_all[e + np.repeat(at, stop)] - fw.c * np.abs(d)
        i[todo] = first + _draw_segments(log_w, offsets, stop, source)
    return cell_of


def _run_lengths(fw: _Forward, j, i, g, source) -> np.ndarray:
    """The length k of the run of equal cells that ends at output ``j`` in cell ``i`` (group
    ``g``), drawn for every row from :meth:`_Forward.run_terms`. A row whose cell lies in none
    of its group's bands 1..j-1 can only end a run of one (every longer run's first output
    would lie outside its band, a weight of exactly 0), so it gets k = 1 without a draw, and
    only the others are drawn. With one row it is drawn (a draw of one weight), so that one
    group consumes randomness as the single-group sampler does (see :func:`_draw_padded`)."""
    k = np.ones(j.size, dtype=np.int64)
    if j.size == 1:
        return k + _draw_padded(fw.run_terms(j, i, g), source)
    jp = np.broadcast_to(np.arange(1, fw.m + 1), (j.size, fw.m))  # every band, row by row
    _, inside = fw._index(jp.ravel(), np.repeat(i, fw.m), np.repeat(g, fw.m))
    some = np.flatnonzero((inside.reshape(jp.shape) & (jp < j[:, None])).any(axis=1))
    if some.size:
        k[some] += _draw_padded(fw.run_terms(j[some], i[some], g[some]), source)
    return k


#: rows of at most this many weights go through draw_index_rows (int64 envelope units)
_ROW_CELLS = 1 << 22
#: a block of segments holds at most this many weights, counted as padded to its longest
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
    ``exp(log_w - max)`` of :func:`~dpq_spark.core.randomness.grid.draw_index_segments` (blocks
    of segments of similar lengths, drawn as draw_index_rows would draw them padded into rows)
    or, for very long segments, of :func:`~dpq_spark.core.randomness.grid.draw_index`."""
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
        segments = log_w[np.arange(int(n.sum())) + np.repeat(at[block] - (np.cumsum(n) - n), n)]
        out[block] = draw_index_segments(segments, n, source)  # in the block's order
        a = b
    return out

