"""The life of one charge against a dataset's budget: one code path for the session and the job.

::

    with reserved(ledger, dataset, by=..., epsilon=..., ...) as charge:   # BudgetExceededError
        ...                       # public work only: a failure here gives the budget back
        with charge.spending():   # marked spent: from here on the charge stays
            ...                   # read the data, release
            charge.commit(output, result=...)

and :func:`stored_release`, which finds a named release that was made before (a re-run returns
it instead of drawing again). Ledger writes hold SIGTERM and SIGINT, so a signal cannot cut one
off between the database's answer and the caller's bookkeeping.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

from dpq_spark.core.errors import DPQValueError
from dpq_spark.pipeline._signals import deferred_signals
from dpq_spark.pipeline.ledger import Ledger, LedgerError, LedgerRecord
from dpq_spark.pipeline.ledger.unit import NEIGHBORING, PrivacyUnit

__all__ = ["Charge", "check_unit", "reserved", "stored_release"]

log = logging.getLogger(__name__)


class Charge:
    """One reservation in a ledger, moved through its life by the code that releases."""

    def __init__(self, ledger: Ledger, record: int, by: str, *, status: str = "reserved"):
        self.ledger, self.id, self.by, self.status = ledger, record, by, status

    @contextlib.contextmanager
    def spending(self) -> Iterator["Charge"]:
        """Mark the reservation spent, then run the block: a failure in it keeps the charge
        (whether a release fails can depend on the data) and notes why in the record."""
        with deferred_signals():
            self.ledger.mark_spent(self.id)
        self.status = "spent"
        log.info("ledger record %d spent: from here on the budget stays charged", self.id)
        try:
            yield self
        except BaseException as exc:
            if self.status != "committed":
                with deferred_signals():
                    self.ledger.note(self.id, f"failed after reading the input: "
                                     f"{type(exc).__name__}; budget stays charged")
                log.error("ledger record %d stays charged: the release failed after it started",
                          self.id)
            raise

    def record_output(self, path: str) -> None:
        """Record where the spent release is being written (before :meth:`commit`)."""
        with deferred_signals():
            self.ledger.record_output(self.id, path)

    def record_state(self, state: str) -> None:
        """Store the public state of a spent release still running (an interactive session)."""
        with deferred_signals():
            self.ledger.record_state(self.id, state)

    def commit(self, output: str, *, result: str | None = None) -> None:
        """Commit the spent release, written to ``output``; ``result``: its public values."""
        with deferred_signals():
            self.ledger.commit(self.id, output, result=result)
        self.status = "committed"


@contextlib.contextmanager
def reserved(ledger: Ledger, dataset_id: str, *, by: str, **reservation) -> Iterator[Charge]:
    """Reserve a release's budget (``reservation``: the arguments of :meth:`Ledger.reserve`
    other than ``job``) and run the block; a failure before :meth:`Charge.spending` gives the
    reservation back.

    Raises
    ------
    BudgetExceededError
        The release would pass a cap (nothing is recorded).
    """
    with deferred_signals():
        record = ledger.reserve(dataset_id, job=by, **reservation)
    log.info("ledger record %d reserved", record)
    charge = Charge(ledger, record, by)
    try:
        yield charge
    except BaseException as exc:
        if charge.status == "reserved":
            with deferred_signals():
                ledger.cancel(record, reason=f"failed before reading the input: "
                              f"{type(exc).__name__}", by=by)
            log.info("ledger record %d cancelled: no private row was read", record)
        raise


def check_unit(dataset_id: str, unit: PrivacyUnit, column: str | None, neighboring,
               *, what: str = "this release") -> None:
    """Refuse a release that protects less than the dataset's unit (``column``: the release's
    privacy unit column, None for one row), naming both units.

    Raises
    ------
    DPQValueError
        The relation differs, or the release protects one row of a per-column budget.
    """
    relation = str(getattr(neighboring, "value", neighboring))
    if unit.admits(column, relation):
        return
    asked = (PrivacyUnit(column=column, neighboring=relation).describe()
             if relation in NEIGHBORING else f"neighboring={relation!r}")
    raise DPQValueError(f"{what} protects {asked}, but dataset {dataset_id!r}'s budget counts "
                        f"{unit.describe()}: a release charged to it must protect that unit (or "
                        "one containing it)")


def stored_release(ledger: Ledger, dataset_id: str, name: str, parameters: dict, *,
                   what: str, rename: str,
                   usable: tuple[str, ...] = ("committed",)) -> LedgerRecord | None:
    """The committed release of ``dataset_id`` called ``name`` made with ``parameters``, or
    ``None`` when there is none. ``usable``: the statuses it may have (an interactive session
    that is still running, ``"spent"``, can be resumed).

    ``what`` names the release in messages (``"run '2026-12-01' of job 'nightly'"``),
    ``rename`` says how to choose another name.

    Raises
    ------
    DPQValueError
        A release of that name exists with other parameters.
    LedgerError
        It was charged and never committed (running, or failed): a fresh draw would be a
        second answer under the same name.
    """
    record = ledger.named(dataset_id, name)
    if record is None:
        return None
    differ = record.differing_parameters(parameters)
    if differ:
        raise DPQValueError(f"{what} was released before (ledger record {record.id}) with other "
                            f"parameters ({', '.join(differ)} differ); {rename}")
    if record.status not in usable:
        raise LedgerError(f"{what} (ledger record {record.id}) is {record.status!r}: it was "
                          "charged but never committed (it may still be running, or it failed); "
                          f"releasing it again would draw a second answer ({rename})")
    return record
