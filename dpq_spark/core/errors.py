"""Exception classes of dpq_spark.

All subclass a builtin so that callers can catch ``ValueError`` or ``RuntimeError`` as usual.
Messages name the offending argument and echo only public values, never private data.
"""

from __future__ import annotations

__all__ = ["DPQValueError", "BudgetExceededError", "SessionHaltedError", "BoundsNotFoundError"]


class DPQValueError(ValueError):
    """An argument breaks a documented rule; nothing was sampled or spent."""


class BudgetExceededError(RuntimeError):
    """A release would spend more privacy budget than is left.

    Parameters
    ----------
    requested : float
        The budget the release asked for.
    remaining : float
        The budget that is left.
    what : str
        What the budget is of, e.g. ``"epsilon"``.
    """

    def __init__(self, requested: float, remaining: float, what: str = "epsilon"):
        self.requested = float(requested)
        self.remaining = float(remaining)
        super().__init__(
            f"privacy budget exceeded: the release asks for {what}={requested:g} "
            f"but only {what}={remaining:g} is left"
        )


class SessionHaltedError(RuntimeError):
    """An interactive session has used all of its hard queries and answers no more."""


class BoundsNotFoundError(RuntimeError):
    """Private bounds were not released: the data is too small for the bounds budget.

    Raised by :func:`dpq_spark.core.private_bounds` (and every mechanism called without bounds)
    when its gate finds fewer rows than the search needs (``min_rows``), judged from ``n`` when
    it is public (swap), from ``n_hint``, or from a noisy count that was paid for. The budget of
    that count is spent; nothing else is released. The message states the rule and the budget,
    never a count of rows. Per-group callers (Spark) catch it and flag that group.

    Attributes
    ----------
    epsilon : float
        The bounds budget of the call.
    min_rows : int
        The public number of rows the gate asks for at that budget.
    judged_by : str
        What the gate read: ``"the noisy row count"``, ``"n_hint"`` or ``"n (public under swap)"``.
    """

    def __init__(self, *, epsilon: float, min_rows: int, judged_by: str):
        self.epsilon = float(epsilon)
        self.min_rows = int(min_rows)
        self.judged_by = str(judged_by)
        super().__init__(
            f"private bounds not found: at a bounds budget of epsilon={self.epsilon:g} the "
            f"search needs about {self.min_rows} rows, and {self.judged_by} is below that; "
            f"pass `lower` and `upper`, more epsilon, or a larger `bounds_share`"
        )
