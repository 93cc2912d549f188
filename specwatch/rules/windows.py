"""Which decode lines are fair samples: a helper the acceptance and throughput rules share.

A `Decode batch` line summarises the decode rounds since the rank's previous one (every
`--decode-log-interval`, 40 by default, rounds; sglang.md §1.4). It says nothing about the draft
when no request was running (idle DP ranks print such lines under DP attention), and its numbers
have not converged when the window was dominated by prefill: more prefill batches of the rank
than decode rounds since the previous decode line (a maintainer's warning, bugreports.md App. A).
Its `gen throughput` also counts idle and prefill time in the window, so throughput is only
compared on windows that follow the previous decode line closely.

Each rule owns a `WindowTracker` (rules see every event themselves; this keeps them independent).
"""

from __future__ import annotations

from dataclasses import dataclass

from specwatch.config import WindowConfig
from specwatch.events import DecodeBatch, PrefillBatch


@dataclass(slots=True)  # not frozen: built for every decode line by each rule, so kept cheap
class Window:
    """One decode line and what the window behind it was like.

    idle: fewer running requests than `min_running_requests`. prefill_dominated: more prefill
    lines of this rank than `max_prefill_batches` since its previous decode line. after_gap: no
    previous decode line of the rank within `max_gap` seconds. gap: seconds since the rank's
    previous decode line (None for its first).
    """

    batch: DecodeBatch
    idle: bool
    prefill_dominated: bool
    after_gap: bool
    gap: float | None
    prefill_batches: int

    @property
    def acceptance_valid(self) -> bool:
        """The accept len of this line describes the draft under load."""
        return self.batch.accept_length is not None and not self.idle and not self.prefill_dominated

    @property
    def throughput_valid(self) -> bool:
        """The gen throughput of this line describes steady decoding."""
        return (self.batch.gen_throughput is not None and not self.idle and not self.prefill_dominated
                and not self.after_gap)

    def why_not(self) -> str:
        return ", ".join(n for n, on in (("idle", self.idle), ("prefill-dominated", self.prefill_dominated),
                                         ("after a gap", self.after_gap)) if on) or "valid"


class WindowTracker:
    """Classifies decode lines per (server, rank). Times: the batch timestamps (seconds)."""

    def __init__(self, config: WindowConfig):
        self.config = config
        self._last: dict[tuple[str, str], float] = {}
        self._prefills: dict[tuple[str, str], int] = {}

    def observe(self, server: str, event: object) -> Window | None:
        """Feed any event; returns a Window for a decode line, else None."""
        if isinstance(event, PrefillBatch):
            key = (server, event.rank)
            self._prefills[key] = self._prefills.get(key, 0) + 1
            return None
        if not isinstance(event, DecodeBatch):
            return None
        key = (server, event.rank)
        prev = self._last.get(key)
        gap = None if prev is None else event.timestamp - prev
        prefills = self._prefills.pop(key, 0)
        self._last[key] = event.timestamp
        cfg = self.config
        return Window(
            batch=event,
            idle=event.running_requests < cfg.min_running_requests,
            prefill_dominated=prefills > cfg.max_prefill_batches,
            after_gap=gap is None or gap > cfg.max_gap,
            gap=gap,
            prefill_batches=prefills,
        )
