"""JointExp outside its bands: the rejection step that makes the banded sampler exact.

The forward pass of :mod:`~dpq_spark.core.quantiles.joint_exp` runs over bands: output k keeps
the cells whose rank lies within ``h`` of its target ``P_k`` (and a reference cell). The tuples
with every output inside its band form the set ``N``; the forward pass gives their mass ``Z_N``
and the backward pass samples ``p`` restricted to ``N``. This module handles the rest, so that
the draw follows ``p`` over *all* sorted tuples, with nothing pruned.

The envelope. A tuple outside ``N`` has some output farther than ``h`` from its target, so its
largest deviation ``D = max_k |rho(o_k) - P_k|`` exceeds ``h`` and ``p(o) = exp(c u(o)) <=
exp(-2 c D)`` (the path ``0, d_1, .., d_m, 0`` goes to ``d_k`` and back). With
``M_l = h + (2**l - 1) / (2 c)`` (``l = 0..L``, ``2**L >= 45 m + 11`` as in the deviation
bound of :func:`~dpq_spark.core.quantiles.joint_exp._deviation_log_mass`), write ``box_l``
for the ordered m-tuples of grid points whose k-th point lies in a cell of rank within
``M_{l+1}`` of ``P_k``, for every k. The measure

    E(x) = sum_{l < L, x in box_l} exp(-2 c M_l)  +  exp(-2 c M_L)

on ordered tuples dominates ``p`` outside ``N``: if ``D <= M_L``, the smallest l with
``D <= M_{l+1}`` has ``D > M_l`` (for l = 0 because ``D > h``), so ``p <= exp(-2 c M_l)`` and
the tuple is in ``box_l``; if ``D > M_L``, the last term alone dominates. Its total mass is

    B = sum_{l < L} exp(-2 c M_l) |box_l|  +  exp(-2 c M_L) S**m,

``|box_l|`` the product over k of the grid points of output k's cells, S the grid size.

The draw, one round: choose "inside" or "outside" with probabilities ``Z_N : B`` (an exact
draw, :func:`~dpq_spark.core.randomness.grid.draw_index_rows`). Inside: the banded backward
pass gives ``o`` with probability ``p(o) / Z_N``. Outside: a component with probability
``exp(-2 c M_l) |box_l| / B`` (or the last one), a uniform ordered tuple ``x`` of it (uniform
grid points, exact), and ``x`` is kept with probability ``p(x) / E(x)`` if it is sorted and
outside ``N`` (else the round starts again). A round returns a sorted tuple ``o`` in ``N`` with
probability ``Z_N / (Z_N + B) * p(o) / Z_N`` and one outside ``N`` with probability
``B / (Z_N + B) * E(o) / B * p(o) / E(o)``: both ``p(o) / (Z_N + B)``, so the tuple a draw
returns has probability exactly ``p(o) / Z`` (the rounds are independent). The bands only set
the cost: a round goes outside with probability ``B / (Z_N + B)``, and the band choice
(:func:`~dpq_spark.core.quantiles.joint_exp._bands`) keeps the deviation bound (``B`` with
``C(S + m - 1, m)`` in place of ``S**m``) below ``exp(-2)`` of a lower bound on ``Z``.

Privacy. The law of a draw is JointExp's, ``p / Z``, whatever the bands are, so the bands may
be chosen from the data: that choice changes the running time, not the released tuple. The
guarantee is the one stated in :mod:`~dpq_spark.core.quantiles.joint_exp` ("Guarantee as
implemented"), for the neighbouring relation and unit of privacy its caller chose.

Floating point: ``Z_N`` is the forward pass's, with its error (``gamma`` of the module
docstrings); ``B``, ``E`` and ``p`` are float64 sums, logs and exps of numbers of magnitude at
most ``M`` (a few roundings each), and the keep test draws exactly with the float64 weight
``min(1, p(x) / E(x))`` (the minimum only moves ratios that rounding pushed past 1). Every
probability above is thus within a factor ``exp(theta)`` of its exact value, with the
``theta`` of the modules' "Guarantee as implemented".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from dpq_spark.core.randomness.grid import draw_index_rows

__all__: list[str] = []


def components(m: int) -> int:
    """``L``: the envelope's boxes ``l = 0..L-1`` (its last component is the whole grid)."""
    return math.ceil(math.log2(45 * m + 11))


def _half_widths(h: np.ndarray, m: int, c: float) -> np.ndarray:
    """``M_l = h + (2**l - 1) / (2 c)``, ``l = 0..L``, per group (``h = inf`` read as 0)."""
    steps = (2.0 ** np.arange(components(m) + 1) - 1.0) / (2.0 * c)
    return np.where(np.isfinite(h), h, 0.0)[:, None] + steps[None, :]


def box_ranges(h, start, first, n, q, c, search) -> tuple[np.ndarray, np.ndarray]:
    """``(g_lo, g_hi)``, shape ``(G, m, L)``: box l of output k of each group is the grid points
    ``[g_lo, g_hi)``, those of the cells of rank within ``M_{l+1}`` of ``P_k``. Group g's cell
    starts are ``start[first[g]:]``; ``search(x, side)`` is ``np.searchsorted(pos_g, x[g],
    side)`` for every row g of ``x``, as in
    :func:`~dpq_spark.core.quantiles.joint_exp._deviation_bands`."""
    M = _half_widths(np.asarray(h, dtype=np.float64), q.size, c)
    cum = q[None, :] * n[:, None].astype(np.float64)
    within = M[:, None, 1:]  # (G, 1, L)
    lo = search(cum[:, :, None] - within, "left")
    hi = search(cum[:, :, None] + within, "right")
    base = first[:, None, None]
    return start[lo + base], start[hi + base]


@dataclass(frozen=True)
class Bands:
    """The sampler's bands of G groups and what their envelope needs, per group: ``lo``/``hi``
    (shape (G, m), local cells: band k is ``[lo, hi)``), the half-width ``h`` (``inf`` when
    the bands hold every cell), the boxes' grid points ``g_lo``/``g_hi`` (shape (G, m, L),
    :func:`box_ranges`) and the bands' grid points ``b_lo``/``b_hi`` (shape (G, m))."""

    lo: np.ndarray
    hi: np.ndarray
    h: np.ndarray
    g_lo: np.ndarray
    g_hi: np.ndarray
    b_lo: np.ndarray
    b_hi: np.ndarray

    def take(self, idx) -> "Bands":
        """The bands of the groups ``idx`` (an index array or a slice)."""
        return Bands(*(getattr(self, f.name)[idx] for f in fields(self)))

    @staticmethod
    def stack(parts: list) -> "Bands":
        """One :class:`Bands` of the groups of ``parts`` (each of one or more groups), in order."""
        return Bands(*(np.concatenate([getattr(b, f.name) for b in parts]) for f in fields(Bands)))


class Envelope:
    """The envelope of G groups' tuples outside their bands (module docstring).

    ``bands`` as :class:`Bands` (a group with ``h = inf`` has nothing outside its bands:
    ``B = 0``), ``n`` and ``size`` each group's rows and grid size.
    """

    def __init__(self, bands: Bands, n, size, q, c):
        h, g_lo, g_hi, b_lo, b_hi = bands.h, bands.g_lo, bands.g_hi, bands.b_lo, bands.b_hi
        G, m = len(h), q.size
        L = components(m)
        self.m, self.L, self.c = m, L, c
        self.g_lo, self.g_hi, self.b_lo, self.b_hi = g_lo, g_hi, b_lo, b_hi
        self.size = np.broadcast_to(np.asarray(size, dtype=np.int64), (G,))
        self.P = q[None, :] * np.asarray(n, dtype=np.float64)[:, None]
        h = np.asarray(h, dtype=np.float64)
        finite = np.isfinite(h)
        self.log_a = -2.0 * c * _half_widths(h, m, c)  # each component's weight per tuple
        with np.errstate(divide="ignore"):
            log_box = np.log((g_hi - g_lo).astype(np.float64)).sum(axis=1)  # (G, L)
        tail = self.log_a[:, L] + m * np.log(self.size.astype(np.float64))
        self.log_w = np.concatenate([self.log_a[:, :L] + log_box, tail[:, None]], axis=1)
        self.log_w[~finite] = -np.inf
        self.log_b = _logsumexp_rows(self.log_w)


def draw_outside(env: Envelope, rows: np.ndarray, log_zn: np.ndarray, ranks,
                 source) -> tuple[np.ndarray, np.ndarray]:
    """The rounds of the module docstring for every entry of ``rows`` (a group each): returns
    ``(inside, out)``; ``inside[r]`` says that row r's round chose the bands (its tuple is then
    the banded backward pass's to draw), else ``out[r]`` is its accepted tuple (sorted grid
    indices). ``log_zn`` is each group's log mass inside its bands (the forward pass's, true
    scale); ``ranks(g, x)`` the mid-ranks of grid points ``x`` (shape (C, m)) of groups ``g``.
    Rows of groups with ``B = 0`` go inside without a draw."""
    m, L, c = env.m, env.L, env.c
    R = rows.size
    inside = np.ones(R, dtype=bool)
    out = np.zeros((R, m), dtype=np.int64)
    todo = np.flatnonzero(np.isfinite(env.log_b[rows]))
    while todo.size:
        g = rows[todo]
        pick = draw_index_rows(np.stack([log_zn[g], env.log_b[g]], axis=1), source)
        todo, g = todo[pick == 1], g[pick == 1]
        if todo.size == 0:
            break
        comp = draw_index_rows(env.log_w[g], source)
        box = comp < L
        at = np.minimum(comp, L - 1)[:, None, None]
        lo = np.where(box[:, None], np.take_along_axis(env.g_lo[g], at, axis=2)[:, :, 0], 0)
        hi = np.where(box[:, None], np.take_along_axis(env.g_hi[g], at, axis=2)[:, :, 0],
                      env.size[g][:, None])
        x = lo + source.below_array(hi - lo)
        in_bands = np.all((x >= env.b_lo[g]) & (x < env.b_hi[g]), axis=1)
        ordered = np.all(x[:, 1:] >= x[:, :-1], axis=1)
        cand = np.flatnonzero(ordered & ~in_bands)
        keep = np.zeros(todo.size, dtype=bool)
        if cand.size:
            gc, xc = g[cand], x[cand]
            d = ranks(gc, xc) - env.P[gc]
            z = np.zeros((cand.size, 1))
            u = -np.abs(np.diff(np.concatenate([z, d, z], axis=1), axis=1)).sum(axis=1)
            in_box = np.all((xc[:, :, None] >= env.g_lo[gc]) & (xc[:, :, None] < env.g_hi[gc]),
                            axis=1)  # (C, L)
            terms = np.concatenate([np.where(in_box, env.log_a[gc, :L], -np.inf),
                                    env.log_a[gc, L:]], axis=1)
            log_e = _logsumexp_rows(terms)
            ratio = np.minimum(c * u - log_e, 0.0)  # log(p / E), at most 0 (module docstring)
            with np.errstate(divide="ignore"):
                no = np.log(-np.expm1(ratio))  # log(1 - p / E); -inf when p = E
            keep[cand] = draw_index_rows(np.stack([ratio, no], axis=1), source) == 0
        took = todo[keep]
        inside[took] = False
        out[took] = x[keep]
        todo = todo[~keep]
    return inside, out


def _logsumexp_rows(x: np.ndarray) -> np.ndarray:
    """``log sum exp`` of each row of ``x``, as ``max + log(sum(exp(x - max)))``; ``-inf`` for a
    row without a finite entry."""
    top = x.max(axis=1)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return top + np.log(np.exp(x - top[:, None]).sum(axis=1))


def log_totals(log_w: np.ndarray, at: np.ndarray, length: np.ndarray) -> np.ndarray:
    """``log sum exp`` of each segment ``log_w[at[g] : at[g] + length[g]]`` (each non-empty,
    with a finite entry), as ``max + log(sum(exp(x - max)))``."""
    top = np.maximum.reduceat(log_w, at)
    return top + np.log(np.add.reduceat(np.exp(log_w - np.repeat(top, length)), at))
