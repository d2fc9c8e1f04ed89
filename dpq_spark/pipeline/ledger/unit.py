"""The privacy unit of a dataset: whose privacy its budget counts, and under which relation.

A ledger's sums are sums of one unit's privacy losses, so a dataset's budget has one unit,
recorded when the budget is created (``dpq-spark ledger init --privacy-unit user_id``):

- one row (``column=None``), or every row of one value of ``column`` (a user, a household);
- ``max_rows_per_unit`` and ``max_groups_per_unit``: the contribution bounds a release applies
  by default (each release may choose its own: ``dp_quantiles`` scales its epsilon for them, so
  the guarantee per unit holds whatever they are);
- ``neighboring``: ``"add_remove"`` (a unit's rows added or removed) or ``"swap"`` (changed).

A release may protect the same unit, or a coarser one that contains it (a release that is
epsilon-DP per user is epsilon-DP per row, since a row belongs to one user): :meth:`PrivacyUnit.admits`.
It may not protect less: a per-row release charged to a per-user budget would understate what a
user with many rows loses.
"""

from __future__ import annotations

import dataclasses
import json

__all__ = ["PrivacyUnit", "ROW"]

NEIGHBORING = ("add_remove", "swap")


@dataclasses.dataclass(frozen=True)
class PrivacyUnit:
    """Whose privacy a dataset's budget protects (see the module notes).

    Parameters
    ----------
    column : str or None
        ``None``: one row. Else the column whose value identifies one unit (``"user_id"``).
    max_rows_per_unit, max_groups_per_unit : int
        Default contribution bounds of a release (only with a ``column``).
    neighboring : {"add_remove", "swap"}
        The neighbouring relation of every release charged to the budget.
    """

    column: str | None = None
    max_rows_per_unit: int = 1
    max_groups_per_unit: int = 1
    neighboring: str = "add_remove"

    def __post_init__(self):
        if self.column is not None and (not isinstance(self.column, str) or not self.column):
            raise ValueError(f"`privacy_unit` must be a column name or None, got {self.column!r}")
        for name in ("max_rows_per_unit", "max_groups_per_unit"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be an integer >= 1, got {value!r}")
        if self.column is None and (self.max_rows_per_unit, self.max_groups_per_unit) != (1, 1):
            raise ValueError("contribution bounds (`max_rows_per_unit`, `max_groups_per_unit`) "
                             "need a `privacy_unit` column")
        if self.neighboring not in NEIGHBORING:
            raise ValueError(f"`neighboring` must be one of {NEIGHBORING}, got "
                             f"{self.neighboring!r}")

    def describe(self) -> str:
        """The unit in words, e.g. ``"one row (add/remove)"``."""
        relation = "add/remove" if self.neighboring == "add_remove" else "swap"
        if self.column is None:
            return f"one row ({relation})"
        return (f"all rows of one `{self.column}` ({relation}; by default at most "
                f"{self.max_rows_per_unit} row(s) per group and {self.max_groups_per_unit} "
                "group(s) per unit kept)")

    def admits(self, column: str | None, neighboring: str) -> bool:
        """Whether a release protecting ``column`` (None: a row) under ``neighboring`` may be
        charged to this budget: the same relation, and the same unit or one that contains it
        (a per-``column`` release on a per-row budget)."""
        if neighboring != self.neighboring:
            return False
        return column == self.column or self.column is None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> "PrivacyUnit":
        """The stored unit; a budget created before units were recorded has ``None``, read as
        one row under add/remove (what every release then assumed unless it said otherwise)."""
        if text is None:
            return ROW
        return cls(**json.loads(text))


#: One row under add/remove: the unit of a budget that records no other.
ROW = PrivacyUnit()
