"""The public state of a median-mechanism session, to resume it in another process.

Everything here is public: the released answers, the hard queries' masks (chosen by the
analyst), the released row count under add/remove neighbours, the session's parameters and the
seed of its *public* generator (which draws candidate databases from the prior and the released
answers only). Replaying the hard answers from that seed rebuilds the candidates exactly.

What is never stored: the histogram, the true row count, and the sparse vector's noisy
threshold (a secret). A resumed session draws a fresh threshold; when the lost one had been used
by a test (``round_open``), its round is forfeited: it counts as one of the session's
``max_hard_queries`` rounds (see :meth:`~dpq_spark.core.interactive.sparse_vector.NumericSparse.forfeit_round`),
so the session's privacy loss stays at most its epsilon and the resume costs one hard answer.
"""

from __future__ import annotations

import base64
import json
import math
import zlib
from dataclasses import dataclass

import numpy as np

__all__ = ["MedianState", "RecordedAnswer", "decode_mask", "encode_mask"]

_VERSION = 1


@dataclass(frozen=True)
class RecordedAnswer:
    """One released answer: its position in the session, value and kind (``"easy"``,
    ``"hard"`` or ``"unverified"``)."""

    index: int
    value: float
    kind: str


@dataclass(frozen=True)
class MedianState:
    """What a session has released, enough to continue it (see the module notes).

    Attributes
    ----------
    public_seed : int
        Seed (256 bits) of the session's public generator.
    accuracy, max_hard_queries : float, int
        The session's parameters as used (after planning).
    n_released : int or None
        The released noisy row count under add/remove neighbours (``None`` under swap, where
        the row count is public and read from the data).
    hard : tuple of (str, float)
        The hard answers in order: the query's mask over the domain (:func:`encode_mask`) and
        the released value.
    answers : tuple of RecordedAnswer
        Every answer released, in order.
    forfeited_rounds : int
        Rounds of the sparse vector ended without a hard answer (earlier resumes).
    round_open : bool
        A test of the current round had run when the state was taken: its threshold is lost.
    """

    public_seed: int
    accuracy: float
    max_hard_queries: int
    domain_size: int
    n_released: int | None = None
    hard: tuple = ()
    answers: tuple = ()
    forfeited_rounds: int = 0
    round_open: bool = False

    @property
    def queries_answered(self) -> int:
        return len(self.answers)

    @property
    def halted(self) -> bool:
        return len(self.hard) + self.forfeited_rounds >= self.max_hard_queries

    def to_json(self) -> str:
        """The state as JSON text (masks packed, compressed and base64-encoded)."""
        return json.dumps({
            "version": _VERSION,
            "public_seed": str(self.public_seed),
            "accuracy": self.accuracy,
            "max_hard_queries": self.max_hard_queries,
            "domain_size": self.domain_size,
            "n_released": self.n_released,
            "hard": [[mask, value] for mask, value in self.hard],
            "answers": [[a.index, a.value, a.kind] for a in self.answers],
            "forfeited_rounds": self.forfeited_rounds,
            "round_open": self.round_open,
        }, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "MedianState":
        """Parse :meth:`to_json`'s text.

        Raises
        ------
        ValueError
            The text is not a state this version wrote.
        """
        try:
            raw = json.loads(text)
            if raw.get("version") != _VERSION:
                raise ValueError(f"unknown state version {raw.get('version')!r}")
            d = int(raw["domain_size"])
            state = cls(
                public_seed=int(raw["public_seed"]),
                accuracy=float(raw["accuracy"]),
                max_hard_queries=int(raw["max_hard_queries"]),
                domain_size=d,
                n_released=None if raw["n_released"] is None else int(raw["n_released"]),
                hard=tuple((str(m), float(v)) for m, v in raw["hard"]),
                answers=tuple(RecordedAnswer(int(i), float(v), str(k))
                              for i, v, k in raw["answers"]),
                forfeited_rounds=int(raw["forfeited_rounds"]),
                round_open=bool(raw["round_open"]),
            )
            for mask, _ in state.hard:
                decode_mask(mask, d)
        except (KeyError, TypeError, ValueError, zlib.error) as exc:
            raise ValueError(f"not a median-mechanism session state: {exc}") from None
        if not (0 < state.accuracy < 1 and math.isfinite(state.accuracy)):
            raise ValueError("not a median-mechanism session state: bad accuracy")
        if len(state.hard) + state.forfeited_rounds > state.max_hard_queries:
            raise ValueError("not a median-mechanism session state: more rounds than allowed")
        return state


def encode_mask(mask: np.ndarray) -> str:
    """A boolean mask as text: its bits packed, compressed and base64-encoded."""
    return base64.b64encode(zlib.compress(np.packbits(mask).tobytes(), 6)).decode()


def decode_mask(text: str, size: int) -> np.ndarray:
    """The mask of ``size`` booleans :func:`encode_mask` made."""
    bits = np.frombuffer(zlib.decompress(base64.b64decode(text)), dtype=np.uint8)
    mask = np.unpackbits(bits)[:size].astype(bool)
    if mask.shape != (size,):
        raise ValueError("a stored mask has the wrong size")
    return mask
