"""Signals and fault points of the job: SIGTERM raises, ledger writes hold signals, and the
test-only fault injection that kills the job at a named point."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from typing import Iterator

__all__ = ["FAULT_ENV", "JobInterrupted", "fault_point", "signals_raise", "deferred_signals"]

log = logging.getLogger(__name__)


#: Test-only fault injection. The job kills itself with a real signal at a named point:
#: ``after_reserve`` (SIGTERM while reserved), ``after_sample`` (SIGKILL between the release and
#: the write), ``after_sample_term`` (SIGTERM there), ``during_write`` (SIGKILL once Spark has
#: written the temporary directory).
FAULT_ENV = "DPQ_SPARK_FAULT"


class JobInterrupted(BaseException):
    """SIGTERM reached the job (a scheduler's cancel). A ``BaseException``, like
    ``KeyboardInterrupt``, so that no ``except Exception`` swallows it."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by signal {signal.Signals(signum).name}")
        self.signum = signum


_FAULT_SIGNALS = {"after_reserve": signal.SIGTERM, "after_sample": signal.SIGKILL,
                  "after_sample_term": signal.SIGTERM, "during_write": signal.SIGKILL}


def fault_point(name: str) -> None:
    if os.environ.get(FAULT_ENV) == name:
        sig = _FAULT_SIGNALS[name]
        log.critical("fault injection %s=%s: sending %s to the job", FAULT_ENV, name, sig.name)
        if sig == signal.SIGKILL:
            logging.shutdown()
        os.kill(os.getpid(), sig)
        time.sleep(5)  # the signal is handled (or kills) before this returns


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """While the job runs, SIGTERM raises :class:`JobInterrupted` (SIGINT already raises
    ``KeyboardInterrupt``). Only in the main thread, where Python runs signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise JobInterrupted(signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGTERM and SIGINT while a ledger write runs, so that a signal cannot cut it off
    between the database's answer and the job's bookkeeping; delivered right after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    mask = {signal.SIGTERM, signal.SIGINT}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, mask)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
