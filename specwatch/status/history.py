"""Accept length of one rank over the last hour, for the status page's chart.

A ring buffer of at most `POINTS` points, at most one per `STEP` seconds of log time: the
pipeline offers each decode line's timestamp (one comparison per line) and a point is taken only
when `due`. A point's value is the mean accept length of the lines since the previous point,
computed from the rank's running sum and count (`rules/summary.RankSummary`), so lines between points
cost nothing and a dip shorter than `STEP` still pulls the mean down. Memory: ~120 bytes a
point, ~45 KB a rank for the hour. Log time, not wall time: the alerts' `starts_at`/`ends_at`
are log times too, so firing episodes line up with the curve. Ranks read from an engine's
/metrics (`Pipeline.scraped`) take their points the same way, at the scrapes' wall time.

Each point carries the rank's alert state then (`AlertState`): the collapse and the other
per-rank acceptance alerts (`OTHER_ALERTS`) are shaded apart on the chart.
"""

from __future__ import annotations

import math
from collections import deque

from specwatch.rules.base import alert_key

STEP = 10.0  # seconds of log time between points
BACK_STEP = 60.0  # a line this far before the newest point: the log's clock went back (see `add`)
SPAN = 3600.0  # seconds the buffer covers
POINTS = int(SPAN / STEP)
COLLAPSED, OTHER = 1, 2  # bits of a point's alert state
OTHER_ALERTS = frozenset({"RankDisagreement", "AcceptanceDegradation"})  # per-rank acceptance alerts


class AlertState:
    """`state(server, rank)`: COLLAPSED while the collapse rule holds the rank collapsed, | OTHER
    while a rule of `OTHER_ALERTS` fires on it (its `active` alerts, keyed `alert_key(server,
    rank)`). A few dict lookups, asked once per point."""

    def __init__(self, rules) -> None:
        self._collapse = next(r for r in rules if "AcceptanceCollapse" in r.alert_names)
        self._others = [r for r in rules if OTHER_ALERTS & set(r.alert_names) and hasattr(r, "active")]

    def before(self, state: int, transitions: list, ts: float) -> int:
        """`state` (a rank's, now) as it was at log time `ts`, from the rank's `transitions`
        since then: a bit set now is off at `ts` if its alert fired after `ts`; one that fired and
        resolved meanwhile is on at `ts` within its [starts_at, ends_at)."""
        for bit in (COLLAPSED, OTHER):
            mine = [a for a in transitions if "update" not in a.annotations
                    and (a.name in self._collapse.alert_names) == (bit == COLLAPSED)
                    and (bit == COLLAPSED or a.name in OTHER_ALERTS)]
            if not mine:
                continue
            on = bool(state & bit) and not any(a.ends_at is None and ts < a.starts_at for a in mine)
            if any(a.ends_at is not None and a.starts_at <= ts < a.ends_at for a in mine):
                on = True
            state = state | bit if on else state & ~bit
        return state

    def __call__(self, server: str, rank: str) -> int:
        state = COLLAPSED if self._collapse.collapsed(server, rank) else 0
        key = alert_key(server, rank)
        return state | OTHER if any(key in r.active for r in self._others) else state


class AcceptHistory:
    """Points (timestamp s since the epoch, mean accept length, alert state) of one rank, oldest
    first. alert state: `AlertState` of the rank when the point was taken (0: none firing)."""

    __slots__ = ("points", "due", "floor", "_sum", "_count")

    def __init__(self) -> None:
        self.points: deque[tuple[float, float, int]] = deque(maxlen=POINTS)
        self.due = -math.inf  # a line at or after this log time takes a point
        self.floor = -math.inf  # ... and so does one before this (`BACK_STEP` before the newest point)
        self._sum = 0.0
        self._count = 0

    def add(self, timestamp: float, accept_length: float, total: float, count: int, state: int) -> None:
        """Take a point at `timestamp` (the caller checked `not floor <= timestamp < due`). `total`/`count`:
        the rank's running sum and count of accept lengths, this line included. The first point
        is the line's own value (the running totals may hold lines from before a restart). Time
        going back (the caller offers a line before `floor`: the log restarted with older stamps,
        or its clock came back from an excursion ahead) drops the points after `timestamp`, so
        the chart follows the log's present; lines a little out of order (after `floor`) take
        no point."""
        points = self.points
        while points and timestamp < points[-1][0]:
            points.pop()
        n = count - self._count
        value = accept_length if self.due == -math.inf or n <= 0 else (total - self._sum) / n
        points.append((timestamp, value, state))
        self._sum, self._count = total, count
        self.due = timestamp + STEP
        self.floor = timestamp - BACK_STEP

    def pending(self, total: float, count: int) -> float | None:
        """Mean accept length of the lines read since the last point (None: none)."""
        n = count - self._count
        return (total - self._sum) / n if n > 0 and self.due != -math.inf else None
