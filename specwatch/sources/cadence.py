"""How soon the followers' thread reads a busy log again: soon enough that the line completing
a collapse is read as it comes, and no sooner.

A round (every followed file read, its lines through the rules, the after-poll hook) costs
about as much as a few dozen decode lines with cold caches (docs/idle-cost.md), so a log that
keeps changing is not read at each change. After a round that read lines the next one comes
`next_round()` seconds later:

* `fast` for `ARM_SECONDS` after a read that held a line that may start a collapse (SGLang's
  `accept len: X` at most `rules.collapse.max_accept_length`: `engines.low_accept_in`): the rest
  of that rank's run is read as it is written (a vLLM log's spec-decoding lines come one per
  stats interval, 10 s: a busy vLLM log's next one is read at its pace, a quiet one's at once);
* otherwise the time the log's busiest rank takes to print `rules.collapse.min_batches` - 1
  decode lines (a collapse needs that many more low lines after its first: a round then falls
  inside any run before it ends, and sees its first line), within [`fast`, `slow`].

So a busy log of 8 ranks each printing a line a second is read every `slow` seconds, one of
8 ranks at 20 lines a second every `fast`; a log with nothing new waits on inotify and is read
at its next change (`FollowerGroup`). A rank's pace is its lines of `accept len: ` over the
time since the last round, divided among the ranks its `[... DP0 TP0] Decode batch` prefixes
name (SGLang's `scheduler.py` logging prefix, 0.4.6-0.5.23; one rank when none is named: a
`format:` grammar's lines).
"""

from __future__ import annotations

import math
import re
import time

from specwatch.engines import low_accept_in
from specwatch.sources.filestream import LineBatch

ARM_SECONDS = 5.0  # seconds of `fast` rounds after a line that may start a collapse
# A read larger than this is a backlog's (the follower reads what is new, a live log's rounds a
# few KiB): it tells nothing of the log's pace, and scanning it would slow the catch-up.
LIVE_BYTES = 256 << 10
# the rank tokens of a decode line's prefix, `[2026-01-01 12:00:00.123 DP0 TP0] Decode batch`
_RANKS = re.compile(rb"\d\d:\d\d:\d\d(?:[.,]\d{1,6})?((?: [A-Z][A-Z_]*\d+)*)\] Decode batch")
_DECODE = b"accept len: "
RANKS_EVERY = 10.0  # seconds between counts of a log's ranks (they change with a restart only)


class ReadCadence:
    """`saw(batch)` for each read's `LineBatch` (on the followers' thread, before the rules see
    it), `next_round()` after each round that read lines: seconds until the next.

    min_batches, at_most: `rules.collapse.min_batches` and `max_accept_length`. fast, slow:
    seconds, the bounds (`fast` <= `slow`); settable (a reload). `now`: a monotonic clock.
    """

    def __init__(self, *, min_batches: int, at_most: float, fast: float, slow: float, now=time.monotonic):
        self.min_batches, self.at_most, self.fast, self.slow = min_batches, at_most, fast, slow
        self.clock = now  # settable (tests)
        self._armed_until = -1.0
        self._since = now()  # the last round's end
        self._lines: dict[str, int] = {}  # path -> decode lines since the last round
        self._ranks: dict[str, tuple[int, float]] = {}  # path -> (ranks its lines name, counted at)
        self.armed_total = 0  # reads that held a line that may start a collapse

    def saw(self, batch: LineBatch) -> None:
        """A read handed these lines to the rules."""
        if batch.end - batch.start > LIVE_BYTES:
            return
        data = batch.data
        n = data.count(_DECODE)
        if n:
            if low_accept_in(data, self.at_most):
                self._armed_until = self.clock() + ARM_SECONDS
                self.armed_total += 1
            path = batch.path
            self._lines[path] = self._lines.get(path, 0) + n
            at = self._ranks.get(path, (0, -math.inf))[1]
            now = self.clock()
            if now - at >= RANKS_EVERY:
                self._ranks[path] = (max(1, len(set(_RANKS.findall(data)))), now)

    def next_round(self) -> float:
        """Seconds from the round that just ended to the next one (see the module docstring)."""
        now = self.clock()
        span, self._since = now - self._since, now
        lines, self._lines = self._lines, {}
        if now < self._armed_until:
            return self.fast
        wait = self.slow
        runs = max(1, self.min_batches - 1)
        for path, n in lines.items():
            wait = min(wait, runs * span * self._ranks[path][0] / n)
        return max(self.fast, wait)
