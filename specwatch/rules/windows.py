"""Which decode lines are fair samples: a helper the acceptance and throughput rules share.

A `Decode batch` line summarises the decode rounds since the rank's previous one (every
`--decode-log-interval`, 40 by default, rounds; sglang.md §1.4). It says nothing about the draft
when no request was running (idle DP ranks print such lines under DP attention), and its numbers
have not converged when the window was dominated by prefill: more prefill batches of the rank
than decode rounds since the previous decode line (a maintainer's warning, bugreports.md App. A).
Its `gen throughput` also counts idle and prefill time in the window, so throughput is only
compared on windows that follow the previous decode line closely.

Each rule owns a `WindowTracker` (rules see every event themselves; this keeps them independent).
Five rules classify every decode line, so the newest `Window` is memoised: a tracker whose own
state gives the same gap and prefill count for the same line object, under the same config,
takes the Window another tracker built instead of building its own (same inputs, same Window).
"""

from __future__ import annotations

from specwatch.config import WindowConfig
from specwatch.events import DecodeBatch, PrefillBatch


class Window:
    """One decode line and what the window behind it was like. Read-only: rules share it.

    idle: fewer running requests than `min_running_requests`. prefill_dominated: more prefill
    lines of this rank than `max_prefill_batches` since its previous decode line. after_gap: no
    previous decode line of the rank within `max_gap` seconds. gap: seconds since the rank's
    previous decode line (None for its first).

    acceptance_valid: the accept len of this line describes the draft under load.
    throughput_valid: the gen throughput of this line describes steady decoding.
    (Plain attributes computed once, not properties: several rules read them for every line.)
    """

    __slots__ = ("batch", "idle", "prefill_dominated", "after_gap", "gap", "prefill_batches",
                 "acceptance_valid", "throughput_valid")

    def __init__(self, batch: DecodeBatch, idle: bool, prefill_dominated: bool, after_gap: bool,
                 gap: float | None, prefill_batches: int):
        self.batch = batch
        self.idle = idle
        self.prefill_dominated = prefill_dominated
        self.after_gap = after_gap
        self.gap = gap
        self.prefill_batches = prefill_batches
        loaded = not idle and not prefill_dominated
        self.acceptance_valid = loaded and batch.accept_length is not None
        self.throughput_valid = loaded and not after_gap and batch.gen_throughput is not None

    def __repr__(self) -> str:
        return (f"Window(rank={self.batch.rank!r}, idle={self.idle}, prefill_dominated={self.prefill_dominated}, "
                f"after_gap={self.after_gap}, gap={self.gap}, prefill_batches={self.prefill_batches})")

    def why_not(self) -> str:
        return ", ".join(n for n, on in (("idle", self.idle), ("prefill-dominated", self.prefill_dominated),
                                         ("after a gap", self.after_gap)) if on) or "valid"


# The newest Window built: (batch, gap, prefill count, config, Window). One immutable tuple,
# replaced whole, so a tracker never reads half of one.
_newest: tuple = (None, None, None, None, None)


class WindowTracker:
    """Classifies decode lines per (server, rank). Times: the batch timestamps (seconds)."""

    def __init__(self, config: WindowConfig):
        self.config = config
        self._last: dict[tuple[str, str], float] = {}
        self._prefills: dict[tuple[str, str], int] = {}

    def observe(self, server: str, event: object) -> Window | None:
        """Feed any event; returns a Window for a decode line, else None."""
        global _newest
        cls = type(event)
        if cls is not DecodeBatch:  # (exact type first: the cheap test for nearly every line)
            if cls is PrefillBatch or isinstance(event, PrefillBatch):
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
        memo = _newest
        if memo[0] is event and memo[3] is cfg and memo[1] == gap and memo[2] == prefills:
            return memo[4]  # another rule's tracker classified this line from the same inputs
        w = Window(event, event.running_requests < cfg.min_running_requests, prefills > cfg.max_prefill_batches,
                   gap is None or gap > cfg.max_gap, gap, prefills)
        _newest = (event, gap, prefills, cfg, w)
        return w
