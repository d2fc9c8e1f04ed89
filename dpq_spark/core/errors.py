"""Exception classes of dpq_spark.

All subclass a builtin so that callers can catch ``ValueError`` or ``RuntimeError`` as usual.
Messages name the offending argument and echo only public values, never private data.
"""

from __future__ import annotations

__all__ = ["DPQValueError", "BudgetExceededError", "SessionHaltedError"]


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
