"""An interactive median-mechanism session over a Spark DataFrame.

Spark reads the data once, to build the histogram over a public, discretised domain; every query
afterwards is answered on the driver by :class:`dpq_spark.core.MedianMechanism`. Masks, callables
and the ``cdf``/``between``/``quantile`` shorthands run no Spark job at all; a ``Column``
predicate runs one small job over the domain points (never over the data), and :meth:`ask_many`
evaluates any number of them in a single job.
"""

from __future__ import annotations

import logging
import math
import numbers
import time
from dataclasses import dataclass

import numpy as np

from dpq_spark.core.randomness.source import resolve_rng
from dpq_spark.core._validation import check_bounds, check_positive_int, check_quantiles
from dpq_spark.core.interactive.median_mechanism import MedianAnswer, MedianMechanism

__all__ = ["MedianMechanismSession", "NumericColumn", "CategoricalColumn", "QuantileAnswer"]

logger = logging.getLogger(__name__)

_CELL = "_dpq_cell"
_MAX_DOMAIN = 10_000_000


@dataclass(frozen=True)
class NumericColumn:
    """A numeric column cut into ``bins`` equal-width bins over the public ``[lower, upper]``.

    Values outside the bounds are clamped into the first or last bin; null and NaN go to an
    extra "missing" level. A bin stands for its midpoint when predicates are evaluated.
    """

    lower: float
    upper: float
    bins: int

    def __post_init__(self):
        lower, upper = check_bounds(self.lower, self.upper)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "bins", check_positive_int(self.bins, "bins"))

    @property
    def edges(self) -> np.ndarray:
        """The ``bins + 1`` bin edges."""
        return np.linspace(self.lower, self.upper, self.bins + 1)

    @property
    def midpoints(self) -> np.ndarray:
        """The value each bin stands for."""
        e = self.edges
        return (e[:-1] + e[1:]) / 2.0


@dataclass(frozen=True)
class CategoricalColumn:
    """A column with a public list of values; any other value (and null) is the "missing" level."""

    values: tuple

    def __post_init__(self):
        values = tuple(self.values)
        if not values:
            raise ValueError("a categorical domain needs at least one value")
        if any(v is None for v in values):
            raise ValueError("categorical domain values must not be None (null is its own level)")
        if len(set(values)) != len(values):
            raise ValueError("categorical domain values must be distinct")
        object.__setattr__(self, "values", values)


@dataclass(frozen=True)
class QuantileAnswer:
    """A quantile found by a binary search of CDF queries, each one a query of the session.

    Attributes
    ----------
    value : float
        Midpoint of the first bin whose (noisy or median) CDF reaches ``q`` of the non-missing rows.
    q : float
        The quantile asked for.
    answers : tuple of MedianAnswer
        Every counting query the search asked, in order.
    epsilon_spent : float
        Session privacy loss after the search.
    hard_queries_left : int
        Hard answers left after the search.
    """

    value: float
    q: float
    answers: tuple
    epsilon_spent: float
    hard_queries_left: int


def _parse_domain(domain) -> dict:
    if not isinstance(domain, dict) or not domain:
        raise TypeError("`domain` must be a non-empty dict: column name -> NumericColumn, "
                        "{'lower', 'upper', 'bins'} dict, CategoricalColumn or list of values")
    parsed = {}
    for name, spec in domain.items():
        if not isinstance(name, str):
            raise TypeError(f"`domain` keys must be column names, got {type(name).__name__}")
        if isinstance(spec, (NumericColumn, CategoricalColumn)):
            parsed[name] = spec
        elif isinstance(spec, dict):
            if set(spec) != {"lower", "upper", "bins"}:
                raise ValueError(f"`domain[{name!r}]` as a dict needs exactly 'lower', 'upper', 'bins'")
            parsed[name] = NumericColumn(spec["lower"], spec["upper"], spec["bins"])
        elif isinstance(spec, (list, tuple)):
            parsed[name] = CategoricalColumn(tuple(spec))
        else:
            raise TypeError(f"`domain[{name!r}]` must be a NumericColumn, a bounds dict or a list of values")
    return parsed


def _levels(spec) -> int:
    """Number of levels of a column: its bins or values, plus the missing level."""
    return (spec.bins if isinstance(spec, NumericColumn) else len(spec.values)) + 1


class MedianMechanismSession:
    """Interactive counting queries over a DataFrame, answered by the median mechanism.

    Parameters
    ----------
    df : pyspark.sql.DataFrame
        The private data; one row is one privacy unit. Read once, by one aggregation.
    domain : dict
        The public universe ``X``: column name -> :class:`NumericColumn` (or a dict with
        ``lower``, ``upper``, ``bins``) or :class:`CategoricalColumn` (or a list of values).
        Every column also gets a "missing" level (null, NaN, or a value not in the list), so no
        row is dropped. ``X`` is the product of the columns' levels (at most 1e7 points).
    epsilon : float
        Privacy budget of the whole session.
    accuracy : float, optional
        ``alpha``: easy answers are verified to within about ``2 alpha`` (threshold ``T = 2 alpha``).
        For experts; or pass ``expected_queries``.
    max_hard_queries : int, optional
        ``c``: the session halts after ``c`` hard answers. For experts; or pass
        ``expected_queries``.
    neighboring : {"swap", "add_remove"}, optional
        ``"swap"`` (default): ``n`` public. ``"add_remove"``: ``n`` released first with
        ``0.1 epsilon``.
    candidates, candidate_size, n_candidates, prior, refill_below, after_halt
        Passed to :class:`~dpq_spark.core.MedianMechanism` (``prior`` is a weight per domain
        point, in the order of :attr:`domain_points`).
    rng : numpy.random.Generator or None, optional
        Source of randomness; ``None`` (production) is the OS cryptographic generator. A seeded
        generator is for tests only.
    expected_queries, target_accuracy, n_hint : optional
        A planned session: ``accuracy`` and ``max_hard_queries`` are chosen from public inputs by
        :func:`dpq_spark.core.interactive.planner.plan_median_session`; the plan is ``session.mechanism.plan``.
    resume : MedianState, optional
        Continue a session from its public state (:meth:`state`) with the same arguments over
        the same data (see :class:`~dpq_spark.core.MedianMechanism`). A
        :class:`~dpq_spark.BudgetSession` does this by name, with its ledger.
    recorder : optional
        An object told about the session's progress, for a ledger: ``opening_round()`` is
        called before a query that starts a round of the sparse vector (its first private
        test), ``answered(answer)`` after every answer. An exception from either stops the
        query (before its test, or after its answer).

    Raises
    ------
    ValueError, TypeError
        If an argument breaks its rule or a domain column is missing from ``df``; raised before
        Spark reads any data.

    Notes
    -----
    Data movement: one ``groupBy`` of a computed cell index (a shuffle of at most ``|X|`` partial
    counts per partition) and a collect of the at most ``|X|`` aggregated counts to the driver.
    The histogram is materialised once; the DataFrame is not referenced afterwards. Queries are
    answered on the driver in milliseconds: masks and callables over :attr:`domain_points` and the
    shorthands need no Spark job, a ``Column`` predicate needs one small job over the
    ``|X|`` domain points (use :meth:`ask_many` to evaluate many predicates in one job).

    Privacy
    -------
    ``epsilon``-DP (pure) for the whole session, whatever the number and choice of queries, under
    ``neighboring`` with one row of ``df`` as the unit of privacy; see
    :class:`~dpq_spark.core.MedianMechanism` for the accounting (NumericSparse, Dwork and Roth
    Theorem 3.27). The domain, the bins and the candidates must not be chosen by looking at the
    data. Under swap the row count ``n`` is treated as public. All noise is discrete Laplace on
    integer counts, sampled exactly on the driver (scales rounded up, so the epsilon achieved is
    at most ``epsilon``); hard answers are fixed functions of the noisy integers.

    Examples
    --------
    >>> session = MedianMechanismSession(  # doctest: +SKIP
    ...     df, domain={"rating": NumericColumn(0.0, 5.0, 50)}, epsilon=1.0,
    ...     accuracy=0.01, max_hard_queries=50)
    >>> session.cdf("rating", 4.0).value  # doctest: +SKIP
    0.72
    """

    def __init__(
        self,
        df,
        *,
        domain,
        epsilon,
        accuracy=None,
        max_hard_queries=None,
        neighboring="swap",
        candidates="auto",
        candidate_size=1000,
        n_candidates=2000,
        prior=None,
        refill_below=0.5,
        after_halt="raise",
        rng=None,
        expected_queries=None,
        target_accuracy=None,
        n_hint=None,
        resume=None,
        recorder=None,
    ):
        options = dict(
            epsilon=epsilon, accuracy=accuracy, max_hard_queries=max_hard_queries,
            neighboring=neighboring, candidates=candidates, candidate_size=candidate_size,
            n_candidates=n_candidates, prior=prior, refill_below=refill_below, after_halt=after_halt,
            expected_queries=expected_queries, target_accuracy=target_accuracy, n_hint=n_hint,
        )
        self.domain, self._levels = self.check_arguments(df, domain=domain, **options)
        size = self.domain_size = math.prod(self._levels)
        generator = resolve_rng(rng)
        self._recorder = recorder
        self._spark = df.sparkSession
        self._codes = self._code_arrays()
        self._domain_df = None
        self._points = None

        started = time.perf_counter()
        histogram = self._histogram(df)
        logger.info("median session: histogram over %d domain points built in %.2fs",
                    size, time.perf_counter() - started)
        self.mechanism = MedianMechanism(histogram, rng=generator, resume=resume, **options)
        del histogram

    @staticmethod
    def check_arguments(df, *, domain, **options) -> tuple[dict, list]:
        """Validate a session's arguments against ``df``'s schema (no Spark job); return the
        parsed domain and each column's number of levels.

        Raises
        ------
        ValueError, TypeError
            An argument breaks its rule, or a domain column is missing from ``df`` or has the
            wrong type.
        """
        parsed = _parse_domain(domain)
        missing = [c for c in parsed if c not in df.columns]
        if missing:
            raise ValueError(f"`domain` columns {missing} are not columns of `df`")
        _check_column_types(df.schema, parsed)
        levels = [_levels(spec) for spec in parsed.values()]
        size = math.prod(levels)
        if size > _MAX_DOMAIN:
            raise ValueError(f"`domain` has {size} points; at most {_MAX_DOMAIN} are supported")
        MedianMechanism.check_options(size, **options)
        return parsed, levels

    def state(self):
        """The session's public state (:class:`~dpq_spark.core.interactive.median_state.MedianState`),
        to resume it in another process."""
        return self.mechanism.state()

    def _ask(self, mask: np.ndarray) -> MedianAnswer:
        """Every query ends here: tell the recorder, then the mechanism answers."""
        recorder = self._recorder
        if recorder is not None and not self.mechanism.halted and not self.mechanism.round_open:
            recorder.opening_round()
        answer = self.mechanism.ask(mask)
        if recorder is not None:
            recorder.answered(answer)
        return answer

    # ---------------------------------------------------------------------------- the one job
    def _cell_expression(self):
        from pyspark.sql import functions as F

        from dpq_spark.spark._compat import try_cast

        cell = F.lit(0).cast("long")
        for (name, spec), levels in zip(self.domain.items(), self._levels):
            col = F.col(name)
            if isinstance(spec, NumericColumn):
                # try_cast: an unparsable value becomes missing instead of an error that could
                # quote it (ANSI mode)
                x = try_cast(name, "double")
                width = (spec.upper - spec.lower) / spec.bins
                clamped = F.least(F.greatest(x, F.lit(spec.lower)), F.lit(spec.upper))
                code = F.least(F.floor((clamped - F.lit(spec.lower)) / F.lit(width)), F.lit(spec.bins - 1))
                code = F.when(x.isNull() | F.isnan(x), F.lit(spec.bins)).otherwise(code.cast("long"))
            else:
                pairs = []
                for i, value in enumerate(spec.values):
                    pairs += [F.lit(value), F.lit(i)]
                code = F.coalesce(F.try_element_at(F.create_map(*pairs), col), F.lit(len(spec.values)))
            cell = cell * F.lit(levels) + code.cast("long")
        return cell

    def _histogram(self, df) -> np.ndarray:
        rows = df.select(self._cell_expression().alias(_CELL)).groupBy(_CELL).count().collect()
        histogram = np.zeros(self.domain_size, dtype=np.int64)
        for row in rows:
            histogram[int(row[0])] = int(row[1])
        return histogram

    # ---------------------------------------------------------------------------- domain points
    def _code_arrays(self) -> dict:
        """Per domain point and column, the level index (row-major, last column fastest)."""
        grids = np.indices(self._levels).reshape(len(self._levels), -1)
        return dict(zip(self.domain, grids))

    @property
    def domain_points(self):
        """A pandas DataFrame of the domain points, one row per point in histogram order.

        Numeric columns hold the bin midpoints, categorical ones the values; the missing level
        is ``None``/NaN. Callables passed to :meth:`ask` receive this frame (built once; do not
        modify it).
        """
        if self._points is not None:
            return self._points
        import pandas as pd

        data = {}
        for name, spec in self.domain.items():
            codes = self._codes[name]
            if isinstance(spec, NumericColumn):
                reps = np.append(spec.midpoints, np.nan)
                data[name] = reps[codes]
            else:
                reps = np.array(list(spec.values) + [None], dtype=object)
                data[name] = reps[codes]
        self._points = pd.DataFrame(data)
        return self._points

    def _domain_frame(self):
        """The domain points as a small local Spark DataFrame (built once, never the data)."""
        if self._domain_df is None:
            from pyspark.sql import types as T

            points = self.domain_points
            fields = [T.StructField(_CELL, T.LongType(), False)]
            columns = [list(range(self.domain_size))]
            for name, spec in self.domain.items():
                if isinstance(spec, NumericColumn):
                    fields.append(T.StructField(name, T.DoubleType(), True))
                    columns.append([None if math.isnan(v) else float(v) for v in points[name]])
                else:
                    fields.append(T.StructField(name, _value_type(spec.values), True))
                    columns.append(list(points[name]))
            rows = list(zip(*columns))
            self._domain_df = self._spark.createDataFrame(rows, schema=T.StructType(fields))
        return self._domain_df

    def _column_masks(self, predicates) -> list:
        """Evaluate Column predicates on the domain points in one Spark job (null counts as False)."""
        from pyspark.sql import functions as F

        frame = self._domain_frame()
        selected = [F.col(_CELL)] + [
            F.coalesce(p.cast("boolean"), F.lit(False)).alias(f"_q{i}") for i, p in enumerate(predicates)
        ]
        rows = frame.select(*selected).collect()
        masks = [np.zeros(self.domain_size, dtype=bool) for _ in predicates]
        for row in rows:
            for i in range(len(predicates)):
                masks[i][row[0]] = bool(row[i + 1])
        return masks

    def _to_mask(self, query) -> np.ndarray:
        if _is_column(query):
            return self._column_masks([query])[0]
        if callable(query):
            result = query(self.domain_points)
            return self.mechanism.as_mask(np.asarray(result))
        return self.mechanism.as_mask(query)

    # ---------------------------------------------------------------------------- queries
    def ask(self, query) -> MedianAnswer:
        """Answer one counting query: the fraction of rows whose domain point satisfies it.

        Parameters
        ----------
        query : pyspark.sql.Column, array-like of bool, or callable
            A ``Column`` predicate over the domain columns (evaluated on the domain points, one
            small Spark job), a boolean mask over :attr:`domain_points`, or a callable taking the
            :attr:`domain_points` pandas frame and returning such a mask.

        Returns
        -------
        MedianAnswer

        Raises
        ------
        SessionHaltedError
            After ``max_hard_queries`` hard answers, unless ``after_halt="candidate_median"``.

        Privacy
        -------
        Covered by the session's ``epsilon``-DP guarantee.
        """
        return self._ask(self._to_mask(query))

    def ask_many(self, queries) -> list:
        """Answer several queries in order; all ``Column`` predicates are evaluated in one job.

        Privacy
        -------
        Covered by the session's ``epsilon``-DP guarantee (same as asking them one by one).
        """
        queries = list(queries)
        columns = [i for i, q in enumerate(queries) if _is_column(q)]
        evaluated = dict(zip(columns, self._column_masks([queries[i] for i in columns]))) if columns else {}
        masks = [evaluated[i] if i in evaluated else self._to_mask(q) for i, q in enumerate(queries)]
        return [self._ask(m) for m in masks]

    def _numeric(self, column: str) -> NumericColumn:
        spec = self.domain.get(column)
        if not isinstance(spec, NumericColumn):
            raise ValueError(f"`column` must name a numeric domain column, got {column!r}")
        return spec

    def _bin_mask(self, column: str, keep_bins: np.ndarray) -> np.ndarray:
        return keep_bins[self._codes[column]]

    def cdf(self, column: str, t) -> MedianAnswer:
        """Fraction of rows whose ``column`` bin midpoint is ``<= t`` (missing values count as not)."""
        spec = self._numeric(column)
        t = _check_real(t, "t")
        keep = np.append(spec.midpoints <= t, False)
        return self._ask(self._bin_mask(column, keep))

    def between(self, column: str, a, b) -> MedianAnswer:
        """Fraction of rows whose ``column`` bin midpoint lies in ``[a, b]``."""
        spec = self._numeric(column)
        a, b = _check_real(a, "a"), _check_real(b, "b")
        if a > b:
            raise ValueError(f"`a` must be <= `b`, got a={a!r}, b={b!r}")
        mid = spec.midpoints
        keep = np.append((mid >= a) & (mid <= b), False)
        return self._ask(self._bin_mask(column, keep))

    def quantile(self, column: str, q) -> QuantileAnswer:
        """The ``q``-quantile of ``column`` among its non-missing rows, by binary search.

        Asks the non-missing fraction ``m`` once, then about ``log2(bins)`` CDF queries
        ``#(bin <= i) / n`` to find the first bin ``i`` whose answer reaches ``q * m``. Every step
        is a counting query of the session (usually easy once the CDF has been learned).

        Privacy
        -------
        Covered by the session's ``epsilon``-DP guarantee: it only asks counting queries.
        """
        spec = self._numeric(column)
        q = float(check_quantiles([q], "q")[0])
        answers = []
        present = np.append(np.ones(spec.bins, dtype=bool), False)
        answers.append(self._ask(self._bin_mask(column, present)))
        target = q * answers[-1].value
        lo, hi = 0, spec.bins - 1
        while lo < hi:
            mid = (lo + hi) // 2
            keep = np.append(np.arange(spec.bins) <= mid, False)
            answers.append(self._ask(self._bin_mask(column, keep)))
            if answers[-1].value >= target:
                hi = mid
            else:
                lo = mid + 1
        last = answers[-1]
        return QuantileAnswer(float(spec.midpoints[lo]), q, tuple(answers), last.epsilon_spent,
                              last.hard_queries_left)

    # ---------------------------------------------------------------------------- state
    @property
    def epsilon(self) -> float:
        """The session's total budget."""
        return self.mechanism.epsilon

    @property
    def epsilon_spent(self) -> float:
        """Privacy loss of the transcript so far (reaches ``epsilon`` at the halt)."""
        return self.mechanism.epsilon_spent

    @property
    def hard_queries_left(self) -> int:
        """Hard answers left before the halt."""
        return self.mechanism.hard_queries_left

    @property
    def halted(self) -> bool:
        """True once ``max_hard_queries`` hard answers have been given."""
        return self.mechanism.halted

    @property
    def n(self) -> int:
        """The public row count (exact under swap, the released noisy count under add/remove)."""
        return self.mechanism.n


def _is_column(query) -> bool:
    from dpq_spark.spark._compat import is_column

    return is_column(query)


def _check_real(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ValueError(f"`{name}` must be a finite real number, got {value!r}")
    return float(value)


def _check_column_types(schema, domain) -> None:
    """Categorical values must have the column's type family (checked on the schema, no job)."""
    from pyspark.sql import types as T

    for name, spec in domain.items():
        if not isinstance(spec, CategoricalColumn):
            continue
        column_type = schema[name].dataType
        value_type = _value_type(spec.values)
        families = [
            (T.StringType, T.StringType),
            (T.BooleanType, T.BooleanType),
            (T.LongType, T.IntegralType),
            (T.DoubleType, T.NumericType),
        ]
        ok = any(isinstance(value_type, v) and isinstance(column_type, c) for v, c in families)
        if not ok:
            raise TypeError(
                f"`domain[{name!r}]` values are {value_type.simpleString()} but column {name!r} "
                f"is {column_type.simpleString()}"
            )


def _value_type(values):
    from pyspark.sql import types as T

    if all(isinstance(v, bool) for v in values):
        return T.BooleanType()
    if all(isinstance(v, numbers.Integral) for v in values):
        return T.LongType()
    if all(isinstance(v, numbers.Real) for v in values):
        return T.DoubleType()
    if all(isinstance(v, str) for v in values):
        return T.StringType()
    raise TypeError("categorical domain values must all be str, int, float or bool")
