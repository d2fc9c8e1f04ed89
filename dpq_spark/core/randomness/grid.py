"""The public grid every quantile release lands on, and exact draws on it.

A :class:`Grid` on ``[a, b] = [lower, upper]`` with step ``g`` (``granularity``) has the points
``a + k g`` for ``k = 0..N``, ``N = floor((b - a) / g)`` computed exactly on the rationals the
float64 inputs stand for, except that a ratio within a relative ``2**-40`` of an integer is
rounded to it (``Grid(0, 5, 0.01)`` has N = 500 although the double 0.01 is a little above 1/100;
its last point ``min(b, a + N g)`` is then b). A value is clamped to ``[a, b]`` and snapped to

    k = clip(floor((x - a) / g + 0.5), 0, N)

evaluated in IEEE float64 (one subtraction, one division, one addition, one floor: every step
correctly rounded, so the JVM, Spark's built-ins and numpy give the same k bit for bit). The map is
applied to each record on its own, so it costs no privacy. A released number is always
``value(k) = min(b, a + k g)`` (float64, a fixed function of the integer k).

Extra error from the grid: a value moves by at most ``g / 2`` (plus float64 rounding of the
formula), except in the last partial step ``(a + N g, b]`` when ``(b - a) / g`` is not an integer,
where it moves by less than ``g``. The default ``g = (b - a) / 2**32`` makes this ``1.2e-10`` of
the bounds' span.

Ties: jitter inside a declared resolution. When the caller passes ``granularity`` explicitly, it
declares the public resolution of the data and of the releases (0.01 for two-decimal ratings, 1
for integer ages), and values sit in large tie blocks on that grid. A mechanism then runs on a
finer internal grid of step ``g / S`` (``S = Grid.jitter``, ``2**16``, halved while
``N S > 2**52``): each record's index k is moved, independently of every other record, to a
uniform *fine index* in ``[k S - S/2, k S + S/2)`` intersected with ``[0, N S]``
(:func:`jitter_indices`, exact integer draws), the mechanism draws fine indices, and each is
rounded back to ``floor((f + S/2) / S)`` (:func:`round_indices`, the k whose fine cell holds f)
before :meth:`Grid.value`. The t copies of a tied value v spread over v's fine cell, so an output
whose rank falls anywhere inside v's block (its edges included) lies in v's cell and is released
as v. The rule depends only on the arguments: jitter iff ``granularity`` is given and
``N <= 2**51``.

Ties on the default grid: split each point. Without ``granularity`` no resolution was declared,
but a double column still holds blocks of ties (80% zeros, values clamped at a bound, whole
numbers stored as doubles). The mechanisms that read ranks (JointExp, IndExp, ApproxQuantiles
and the single quantile) then run on ``2**TIE_BITS`` (256) fine points per grid point: a record
with index k goes, independently of every other record, to a uniform fine index of
``[k 2**b, (k + 1) 2**b)`` (``b = Grid.tie_bits``), the mechanism draws fine indices, and each is
released as the grid point ``f >> b`` holds (:func:`split_ties`; :meth:`Grid.release`). A block
of t tied records becomes up to ``min(t, 256)`` blocks spread over its point's fine points, so
a quantile whose rank falls inside the block, near its edges too, is released as the tied value
instead of in the gap beside it. Every grid point has the same number of fine points, so on
data without ties the only change is where, inside a data point's own grid step, the cells of
the mechanism begin (a cell of w grid points now spans between ``256 (w - 1) + 1`` and
``256 (w + 1) - 1`` fine points; on the default grid w is typically thousands). The fine indices are
drawn as a multinomial per distinct index (:func:`~dpq_spark.core.randomness.samplers.uniform_split`),
so the mechanism holds at most ``min(n, 256 D)`` entries for D distinct indices, never one per
row. ``Grid.tie_bits`` is ``TIE_BITS`` on the default grid and 0 on a declared one (which has
the jitter instead): the rule depends only on the arguments.

Privacy of the jitter (and of the split, word for word). Write ``J`` for the jitter and ``A`` for the mechanism on fine indices,
(epsilon + eta, delta)-DP for add/remove or swap of one record. Neighbours share all records but
one (x added or removed; or x swapped for x'). Fix the fine indices j of the shared records and
y (y') of the odd one: ``j`` and ``j + y`` (``j + y`` and ``j + y'``) are neighbouring fine
datasets, so ``P[A(j + y) in E] <= e^(epsilon + eta) P[A(j) in E] + delta`` and the other
directions likewise. The jitters are independent of each other, so averaging these inequalities
over y, y' and then j gives the same inequality for ``A(J(D))`` against ``A(J(D'))``. Hence the
jittered mechanism has the guarantee, neighbouring relation and unit of the mechanism on the
grid, and it would keep it even if every jitter were published. Rounding is post-processing.

:func:`draw_index` draws an index with probability exactly proportional to given float64 weights
(no float uniform, no cumulative sum), and :func:`uniform_multiset` a uniform multiset of grid
points, both from exact integer draws of a :class:`~dpq_spark.core.randomness.source.RandomSource`.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from dpq_spark.core._validation import check_bounds, check_granularity
from dpq_spark.core.randomness.samplers import uniform_split

__all__ = [
    "Grid",
    "MAX_GRID_STEPS",
    "draw_index",
    "draw_index_rows",
    "draw_index_segments",
    "uniform_multisets",
    "jitter_indices",
    "round_indices",
    "split_ties",
    "split_entries",
    "TIE_BITS",
    "SPLIT_MAX_ENTRIES",
    "uniform_multiset",
]

MAX_GRID_STEPS = 2**52  # N <= 2**52: indices, ranks and grid weights stay exact in float64
_DEFAULT_STEPS = 2**32
_JITTER_SCALE = 2**16  # S: fine points per declared grid step (a power of two; tests lower it)
#: b: the default grid's points are split into 2**TIE_BITS fine points each (module docstring):
#: at 8, deciles of tied doubles were as good as at 12 or 16 bits, at a third of their time
#: (benchmarks/bench_tie_split.py)
TIE_BITS = 8
#: The most entries the split may make (``sum(min(count, 2**TIE_BITS))``) before a mechanism
#: with a band splits only the grid points its band reaches (:meth:`Grid.fine_indices`)
SPLIT_MAX_ENTRIES = 1 << 22


class Grid:
    """A public grid ``a + k g``, ``k = 0..N``, on ``[lower, upper]``.

    Parameters
    ----------
    lower, upper : float
        Public, finite bounds with ``lower < upper``.
    granularity : float, optional
        The step g, finite and > 0, with ``(upper - lower) / g <= 2**52``. Default
        ``(upper - lower) / 2**32`` (float64). Given explicitly, it declares the data's
        resolution and switches on the jitter of ties (``jitter > 1``, module docstring).

    Attributes
    ----------
    lower, upper, granularity : float
    steps : int
        ``N = floor((upper - lower) / granularity)``, exact (a ratio within ``2**-40`` of an
        integer counts as that integer).
    size : int
        ``N + 1``, the number of grid points.
    jitter : int
        S, fine points per step for ties (module docstring): ``2**16`` (fewer when ``N`` is
        large) when ``granularity`` is given, 1 (no jitter) for the default grid.
    tie_bits : int
        b, the default grid's split of each point into ``2**b`` fine points (module docstring):
        ``TIE_BITS`` without ``granularity``, 0 with it.
    fine_size : int
        The number of points of the fine grid the mechanisms sample on: ``N S + 1`` on a
        declared grid, ``(N + 1) 2**b`` on the default grid.

    Raises
    ------
    TypeError, ValueError
        For a bad argument, naming it.

    Examples
    --------
    >>> g = Grid(0.0, 5.0, 0.01)
    >>> g.size, int(g.snap(3.576)), float(g.value(358))
    (501, 358, 3.58)
    """

    __slots__ = ("lower", "upper", "granularity", "steps", "size", "jitter", "tie_bits",
                 "fine_size")

    def __init__(self, lower, upper, granularity=None):
        a, b = check_bounds(lower, upper)
        if granularity is None:
            g = (b - a) / _DEFAULT_STEPS
        else:
            g = check_granularity(granularity)
        if not (g > 0.0 and math.isfinite(g)):  # default on a tiny span: subnormal underflow
            raise ValueError(f"`granularity` must be finite and > 0, got {granularity!r}")
        ratio = (Fraction(b) - Fraction(a)) / Fraction(g)  # exact
        steps = math.floor(ratio)
        nearest = round(ratio)
        if abs(ratio - nearest) <= ratio * Fraction(1, 2**40):
            steps = nearest  # a decimal step (0.01 is not a double) still reaches `upper`
        if steps > MAX_GRID_STEPS:
            raise ValueError(
                f"`granularity` must give at most 2**52 steps on [lower, upper], got {granularity!r}"
            )
        self.lower, self.upper, self.granularity = a, b, g
        self.steps = int(steps)
        self.size = self.steps + 1
        jitter = 1
        if granularity is not None:  # a declared resolution: jitter ties inside it
            jitter = _JITTER_SCALE
            while jitter > 1 and self.steps * jitter > MAX_GRID_STEPS:
                jitter //= 2
            if jitter < 2:
                jitter = 1
        self.jitter = int(jitter)
        self.tie_bits = TIE_BITS if granularity is None else 0
        self.fine_size = (self.size << self.tie_bits if self.tie_bits
                          else self.steps * self.jitter + 1)

    def __repr__(self) -> str:
        return f"Grid(lower={self.lower!r}, upper={self.upper!r}, granularity={self.granularity!r})"

    def snap(self, x) -> np.ndarray:
        """Grid index of each value: ``clip(floor((clamp(x) - a) / g + 0.5), 0, N)`` (int64)."""
        x = np.clip(np.asarray(x, dtype=np.float64), self.lower, self.upper)
        k = np.floor((x - self.lower) / self.granularity + 0.5)
        return np.clip(k, 0, self.steps).astype(np.int64)

    def value(self, k) -> np.ndarray:
        """The float64 value of grid index ``k``: ``min(b, a + k g)``, a fixed function of k."""
        k = np.asarray(k, dtype=np.int64)
        return np.minimum(self.upper, self.lower + k.astype(np.float64) * self.granularity)

    def fine_indices(self, x, counts, source, band=None) -> tuple[np.ndarray, np.ndarray | None]:
        """The private values as indices of the fine grid: snapped, then jittered or split.

        Returns ``(f, counts)`` for a mechanism on ``fine_size`` points. On a declared grid, one
        jittered fine index per row (``counts`` expanded) and ``None``; on the default grid, the
        sorted distinct fine indices of :func:`split_ties` and their counts (at most
        ``min(sum of counts, 2**b D)`` entries for D distinct indices). ``band(k, counts)``, a
        mechanism's mask of the grid points it can reach
        (:func:`~dpq_spark.core.quantiles.coarse_bands.mechanism_band`), bounds that: when the
        split would make more than ``SPLIT_MAX_ENTRIES`` entries, the points outside the band
        stay whole (:func:`split_ties`), which changes the mechanism's release by less than
        ``2**-59`` in total variation.
        """
        if self.tie_bits:
            k, counts = self.distinct(x, counts)
            return split_ties(k, counts, self.tie_bits, source, self.unsplit(k, counts, band))
        k = self.snap(x)
        if self.jitter == 1:
            return k, counts
        return jitter_indices(k, counts, self.jitter, self, source), None

    def distinct(self, x, counts) -> tuple[np.ndarray, np.ndarray]:
        """The sorted distinct grid indices of values ``x`` and their rows (``counts``: the
        values' multiplicities, or None), indices of no rows dropped."""
        return _distinct(self.snap(x), counts)

    def unsplit(self, k, counts, band=None):
        """The mask of sorted distinct grid indices ``k`` (with ``counts``) that the tie split
        keeps whole: None (split them all) unless ``band`` is given and the split would make more
        than ``SPLIT_MAX_ENTRIES`` entries; then the points outside ``band(k, counts)``."""
        if band is None or not self.splits_many(counts):
            return None
        return ~np.asarray(band(k, counts), dtype=bool)

    def splits_many(self, counts) -> bool:
        """Whether splitting indices with these ``counts`` would make more than
        ``SPLIT_MAX_ENTRIES`` entries (``sum(min(count, 2**tie_bits))``; False off the default
        grid)."""
        if not self.tie_bits:
            return False
        return int(np.minimum(counts, 1 << self.tie_bits).sum()) > SPLIT_MAX_ENTRIES

    def release(self, f) -> np.ndarray:
        """The float64 values released for fine indices ``f``: the grid point each lies in."""
        if self.tie_bits:
            return self.value(np.asarray(f, dtype=np.int64) >> self.tie_bits)
        return self.value(round_indices(f, self.jitter, self))


def _distinct(k, counts):
    """Sorted distinct indices of ``k`` and their rows (``counts``: multiplicities, or None)."""
    k = np.asarray(k, dtype=np.int64)
    if counts is None:
        return np.unique(k, return_counts=True)
    u, inverse = np.unique(k, return_inverse=True)
    w = np.bincount(inverse, weights=counts, minlength=u.size).astype(np.int64)
    return u[w > 0], w[w > 0]


def split_ties(k, counts, bits: int, source, whole=None) -> tuple[np.ndarray, np.ndarray]:
    """Split each grid point into ``2**bits`` fine points, and each record to a uniform one.

    ``k``: sorted distinct grid indices with ``counts`` rows (> 0). Each row of index k goes,
    independently, to a uniform fine index of ``[k 2**bits, (k + 1) 2**bits)``, drawn as a
    multinomial per index (:func:`~dpq_spark.core.randomness.samplers.uniform_split`). Returns
    the sorted distinct fine indices and their counts (at most ``min(sum(counts), 2**bits
    len(k))`` entries). ``whole``, a mask over ``k``: those entries stand for rows kept together
    on purpose (a pruned cell of represented data, :mod:`dpq_spark.core.quantiles.coarse_bands`)
    and stay whole at their first fine point ``k 2**bits``. A per-record random map: no privacy
    cost (module docstring).
    """
    k = np.asarray(k, dtype=np.int64)
    f, w, src = split_entries(k, counts, bits, source, whole)
    if src.size and np.any(np.diff(src) < 0):  # whole entries come last: put them in place
        order = np.argsort(f, kind="stable")  # distinct: whole entries hold their index alone
        f, w = f[order], w[order]
    return f, w


def split_entries(k, counts, bits: int, source, whole=None):
    """The draws of :func:`split_ties`, unsorted: ``(f, w, src)``, each output's fine index,
    rows and the index into ``k`` of the entry it came from. The split entries come first, in
    entry then part order (sorted when ``k`` is), then the ``whole`` ones at ``k 2**bits``.
    Shared by :func:`split_ties` and the batched split of many groups, so that both make the
    same draws in the same order."""
    k = np.asarray(k, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    if whole is None or not np.any(whole):
        entry, part, w = uniform_split(source, counts, bits)
        return (k[entry] << bits) + part, w, entry
    whole = np.asarray(whole, dtype=bool)
    cut = np.flatnonzero(~whole)
    entry, part, w = uniform_split(source, counts[cut], bits)
    kept = np.flatnonzero(whole)
    src = np.concatenate([cut[entry], kept])
    f = np.concatenate([(k[cut[entry]] << bits) + part, k[kept] << bits])
    return f, np.concatenate([w, counts[kept]]), src


def jitter_indices(k, counts, jitter: int, grid: Grid, source, steps=None) -> np.ndarray:
    """Move each record's grid index to a uniform fine index inside its own cell.

    Record with index k goes to a uniform integer of ``[k S - S/2, k S + S/2)`` intersected
    with ``[0, N S]`` (``S = jitter``, even, or 1 for no jitter; ``N = grid.steps``, or
    ``steps``, one per entry of ``k``, for records of grids of different sizes and the same
    jitter), drawn exactly and independently per record. With ``counts``, each of the
    ``counts[i]`` copies of ``k[i]`` gets its own draw: the result has ``sum(counts)`` entries,
    so this costs O(sum of counts) time and memory. Per-record and independent, it costs no
    privacy (module docstring). Returns int64 fine indices in ``[0, N S]``.
    """
    k = np.asarray(k, dtype=np.int64)
    if counts is not None:
        k = np.repeat(k, np.asarray(counts, dtype=np.int64))
        if steps is not None:
            steps = np.repeat(np.asarray(steps, dtype=np.int64), np.asarray(counts, np.int64))
    if jitter == 1:
        return k.copy()
    half = jitter // 2
    top = (grid.steps if steps is None else np.asarray(steps, dtype=np.int64)) * jitter
    lo = np.maximum(k * jitter - half, 0)
    hi = np.minimum(k * jitter + half - 1, top)  # inclusive
    return lo + source.below_array(hi - lo + 1)


def round_indices(f, jitter: int, grid: Grid, steps=None) -> np.ndarray:
    """Grid index of each fine index: ``clip(floor((f + S/2) / S), 0, N)``, the inverse cell map
    of :func:`jitter_indices` (post-processing; public). ``steps`` (optional, broadcast against
    ``f``) gives each entry its own ``N``, as in :func:`jitter_indices`."""
    f = np.asarray(f, dtype=np.int64)
    if jitter == 1:
        return f.copy()
    top = grid.steps if steps is None else np.asarray(steps, dtype=np.int64)
    return np.clip((f + jitter // 2) // jitter, 0, top)


# --------------------------------------------------------------------------------------------
# Exact draws

_LEVELS = 1100  # float64 weights in (0, 1] have frexp exponents in [-1073, 1]
_SMALL = 64  # up to this many weights, draw_index runs in plain Python (same draws, faster)


def draw_index(log_w: np.ndarray, source) -> int:
    """An index ``r`` drawn with probability exactly ``w_r / sum(w)``, ``w = exp(log_w - max)``.

    The weights ``w_r`` are the float64 numbers computed here (each within 1 ulp of the real
    ``exp``; those below 2**-1074 of the largest are 0). They are sampled exactly by rejection:
    write ``w_r = f_r 2**-L_r`` with ``f_r`` in [1/2, 1) (53-bit mantissa); choose a level L with
    probability proportional to ``count_L 2**-L`` (exact integer arithmetic), a uniform index of
    that level, and accept it with probability ``f_r`` (a 53-bit integer comparison); else start
    again. Each round accepts with probability at least 1/2.
    """
    log_w = np.asarray(log_w, dtype=np.float64)
    top = float(np.max(log_w))
    if log_w.size == 1:
        return 0
    w = np.exp(log_w - top)
    if w.size <= _SMALL:
        return _draw_small(w.tolist(), source)
    mant, expo = np.frexp(w)
    level = np.where(w > 0.0, 1 - expo, _LEVELS)
    per_level = np.bincount(level, minlength=_LEVELS + 1)[:_LEVELS]
    used = np.flatnonzero(per_level).tolist()
    return _draw_by_levels(used, per_level[used].tolist(),
                           lambda L: np.flatnonzero(level == L),
                           lambda r: int(mant[r] * 2.0**53), source)


def _draw_small(w: list, source) -> int:
    """:func:`draw_index` on a short list of weights in Python: the same levels, the same random
    draws in the same order, so the same result (no numpy call per step)."""
    levels: dict[int, list[int]] = {}
    for r, x in enumerate(w):
        if x > 0.0:
            levels.setdefault(1 - math.frexp(x)[1], []).append(r)
    used = sorted(levels)
    return _draw_by_levels(used, [len(levels[L]) for L in used], levels.__getitem__,
                           lambda r: int(math.frexp(w[r])[0] * 2.0**53), source)


def _draw_by_levels(used: list, sizes: list, members_of, mantissa_of, source) -> int:
    """The rejection loop of :func:`draw_index`: ``used`` levels L (increasing) holding ``sizes``
    weights each; ``members_of(L)`` their indices (increasing), ``mantissa_of(r)`` the 53-bit
    integer mantissa of weight r. Level L carries ``size_L * 2**(deepest - L)`` units of
    ``2**-deepest``; a uniform unit picks the level, a uniform member the index, and a 53-bit
    comparison accepts it with probability ``f_r``."""
    deepest = used[-1]
    units = [size << (deepest - L) for L, size in zip(used, sizes)]
    total = sum(units)
    while True:
        u = source.below(total)
        for L, size in zip(used, units):
            if u < size:
                break
            u -= size
        members = members_of(L)
        r = int(members[source.below(len(members))])
        if source.below(2**53) < mantissa_of(r):
            return r


#: draw_index_rows: weights below 2**-_ROW_DEPTH of a row's largest share one envelope unit
_ROW_DEPTH = 40
#: draw_index_rows: at most this many proposals per row and round, and about this many cells
#: compared per round (proposals times row length)
_PROPOSALS, _ROUND_CELLS = 4, 1 << 20


def draw_index_rows(log_w: np.ndarray, source, depth: int = _ROW_DEPTH) -> np.ndarray:
    """:func:`draw_index` for every row of a 2-d array at once (int64, one index per row).

    Row g gives index r with probability exactly ``w_gr / sum_r w_gr``, ``w = exp(log_w -
    rowmax)`` (the float64 numbers computed here), by the same kind of rejection as
    :func:`draw_index`, run on all rows together: write ``w = f 2**(1 - L)`` (``f`` in [1/2, 1),
    level ``L >= 0``). A weight of level ``L <= depth`` has the envelope ``2**-L`` and is
    accepted with probability ``f`` (a 53-bit integer comparison); a deeper one has the envelope
    ``2**-depth`` and is accepted with probability ``f 2**(depth - L)`` (an exact comparison on
    Python integers; such weights hold at most ``S 2**-depth`` of the envelope, so this is rare).
    Envelopes are whole multiples of ``2**-depth``, summed exactly in int64 (at most ``S 2**depth``
    units, ``S`` the row length: ``S <= 2**(62 - depth)``), a uniform unit picks the candidate,
    and every round accepts at least half of the envelope's mass. The draws differ from
    :func:`draw_index`'s; the distribution is the same.
    """
    log_w = np.asarray(log_w, dtype=np.float64)
    if log_w.ndim != 2:
        raise ValueError("`log_w` must be 2-d")
    G, S = log_w.shape
    if S > 1 << (62 - depth):
        raise ValueError(f"rows of at most 2**{62 - depth} weights, got {S}")
    if S == 1 or G == 0:
        return np.zeros(G, dtype=np.int64)
    w = np.exp(log_w - log_w.max(axis=1, keepdims=True))
    env = _Envelope(w.ravel(), depth)
    cum = np.cumsum(env.units.reshape(G, S), axis=1)

    def pick(rows, u):
        r = _first_above(cum, rows, u)
        return r, rows * S + r

    return env.rounds(cum[:, -1], pick, S, source)


def draw_index_segments(log_w: np.ndarray, lengths: np.ndarray, source, width: int | None = None,
                        depth: int = _ROW_DEPTH) -> np.ndarray:
    """:func:`draw_index_rows` on rows of different lengths laid end to end, without padding.

    Segment g is ``log_w[o_g : o_g + lengths[g]]`` (``o_g`` the sum of the lengths before it;
    every length at least 1, every segment with a finite entry); the result is each segment's
    drawn index within it (int64). For the same state of ``source`` it draws exactly what
    :func:`draw_index_rows` draws on the segments padded with ``-inf`` to ``width`` columns
    (default: the longest segment): the same envelope units, the same proposals per round
    (``width`` sets their number, as the padded row length does), the same candidate (the
    first entry whose running sum of units exceeds the uniform unit, found here by one search
    of the running sum over all segments) and the same acceptance tests, in the same order.
    The running sum is exact int64: at most ``2**(62 - depth)`` weights in all.
    """
    log_w = np.asarray(log_w, dtype=np.float64)
    n = np.asarray(lengths, dtype=np.int64)
    G = n.size
    S = int(n.max(initial=1)) if width is None else int(width)
    if log_w.ndim != 1 or log_w.size != int(n.sum()) or (G and (n.min() < 1 or S < n.max())):
        raise ValueError("`log_w` must be 1-d and hold the segments of `lengths` (each >= 1 and"
                         " at most `width`)")
    if log_w.size > 1 << (62 - depth):
        raise ValueError(f"at most 2**{62 - depth} weights in all, got {log_w.size}")
    if S == 1 or G == 0:
        return np.zeros(G, dtype=np.int64)
    starts = np.cumsum(n) - n
    w = np.exp(log_w - np.repeat(np.maximum.reduceat(log_w, starts), n))
    env = _Envelope(w, depth)
    cum = np.cumsum(env.units)
    ends = cum[starts + n - 1]
    base = ends - np.diff(ends, prepend=0)  # the running sum before each segment

    def pick(rows, u):
        at = np.searchsorted(cum, base[rows] + u, side="right")
        return at - starts[rows], at

    return env.rounds(ends - base, pick, S, source)


class _Envelope:
    """The rejection envelope of :func:`draw_index_rows` over weights ``w`` in [0, 1] (flat):
    each weight's level, 53-bit mantissa and envelope units, and the rounds of proposals."""

    def __init__(self, w: np.ndarray, depth: int):
        self.depth = depth
        self.level, self.f53 = _levels(w)
        self.shallow = self.level <= depth
        self.units = np.where(self.shallow, np.left_shift(1, depth - np.minimum(self.level, depth)),
                              (w > 0.0).astype(np.int64))

    def rounds(self, total: np.ndarray, pick, S: int, source) -> np.ndarray:
        """One accepted index per row: ``total`` is each row's envelope units, ``pick(rows,
        u)`` the column and flat position of the unit ``u`` of each proposal's row; ``S`` (the
        row length) sets the proposals per round."""
        G = total.size
        out = np.empty(G, dtype=np.int64)
        todo = np.arange(G)
        depth, level, f53 = self.depth, self.level, self.f53
        while todo.size:
            # K proposals per row in one round: each is accepted with probability >= 1/2, and
            # the first accepted one of an i.i.d. sequence is what rejection returns one at a
            # time (the later ones are independent of it and discarded), so this is the same
            # law in fewer rounds
            T = todo.size
            K = int(min(_PROPOSALS, max(1, _ROUND_CELLS // (T * S))))
            rows = np.repeat(todo, K)
            u = source.below_array(total[rows])
            r, at = pick(rows, u)  # the unit's weight
            accept = np.zeros(rows.size, dtype=bool)
            near = self.shallow[at]
            if near.any():
                coin = source.bits_array(53, int(near.sum()))
                accept[near] = coin < f53[at[near]]
            for i in np.flatnonzero(~near).tolist():  # a deep weight: f 2**(depth - L)
                x = int(at[i])
                accept[i] = source.below(1 << (53 + int(level[x]) - depth)) < int(f53[x])
            accept, r = accept.reshape(T, K), r.reshape(T, K)
            done = accept.any(axis=1)
            first = accept.argmax(axis=1)
            out[todo[done]] = r[done, first[done]]
            todo = todo[~done]
        return out


def _levels(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``L = 1 - e`` and ``f 2**53`` (int64) of ``frexp(w) = (f, e)`` for weights in [0, 1], read
    from the float64 bits: a normal ``w`` with biased exponent ``E`` and fraction ``F`` is
    ``(2**52 + F) 2**(E - 1075)``, so ``L = 1023 - E`` and ``f 2**53 = 2**52 + F``. Zeros get
    ``L = _LEVELS`` (they carry no weight) and the rare subnormals go through ``frexp``."""
    bits = w.view(np.int64)
    biased = bits >> 52  # the sign bit is 0
    level = 1023 - biased
    f53 = (bits & ((1 << 52) - 1)) | (1 << 52)
    low = biased == 0
    if low.any():
        mant, expo = np.frexp(w[low])
        level[low] = np.where(w[low] > 0.0, 1 - expo.astype(np.int64), _LEVELS)
        f53[low] = (mant * 2.0**53).astype(np.int64)
    return level, f53


def _first_above(cum: np.ndarray, rows: np.ndarray, u: np.ndarray) -> np.ndarray:
    """For each ``i``, the first column of row ``rows[i]`` of ``cum`` (non-decreasing rows) whose
    value exceeds ``u[i]`` (``u[i]`` below the row's last value): the number of entries at most
    ``u[i]``. Short rows compare whole rows; longer ones are searched by halving, all rows in
    lockstep (exact integer comparisons either way, so the same column)."""
    S = cum.shape[1]
    if S <= _SCAN_COLUMNS:
        return (cum[rows] <= u[:, None]).sum(axis=1)
    flat = cum.ravel()
    base = rows * S
    lo = np.zeros(rows.size, dtype=np.int64)  # the answer lies in [lo, hi]
    hi = np.full(rows.size, S - 1, dtype=np.int64)
    for _ in range(int(S - 1).bit_length()):
        mid = (lo + hi) >> 1
        right = flat[base + mid] <= u
        lo = np.where(right, mid + 1, lo)
        hi = np.where(right, hi, mid)
    return lo


#: rows of at most this many weights are compared whole by :func:`_first_above` (cheaper than
#: its halving steps there)
_SCAN_COLUMNS = 16


def uniform_multisets(source, widths, k: int) -> np.ndarray:
    """:func:`uniform_multiset` for many widths at once: row i is a uniform multiset of ``k``
    points of ``{0, .., widths[i] - 1}``, sorted (shape ``(len(widths), k)``, int64), by the
    same stars-and-bars construction with Floyd's algorithm run on all rows together."""
    widths = np.asarray(widths, dtype=np.int64)
    top = widths + (k - 1)
    chosen = np.empty((widths.size, k), dtype=np.int64)
    for step in range(k):
        j = top - k + step
        t = source.below_array(j + 1)
        taken = (chosen[:, :step] == t[:, None]).any(axis=1)
        chosen[:, step] = np.where(taken, j, t)
    return np.sort(chosen, axis=1) - np.arange(k, dtype=np.int64)


def uniform_multiset(source, width: int, k: int) -> np.ndarray:
    """A uniform multiset of ``k`` points of ``{0, .., width - 1}``, sorted (int64).

    Stars and bars: a uniform k-subset of ``{0, .., width + k - 2}`` (Floyd's algorithm, exact
    integer draws), sorted, minus ``0, 1, .., k - 1``. Each of the ``C(width + k - 1, k)``
    multisets has the same probability.
    """
    top = int(width) + int(k) - 1
    chosen: set[int] = set()
    for j in range(top - k, top):
        t = source.below(j + 1)
        chosen.add(j if t in chosen else t)
    return np.array(sorted(chosen), dtype=np.int64) - np.arange(k, dtype=np.int64)
