"""Accept length of one rank over the last hour, for the status page's chart.

A ring buffer of at most `POINTS` points, at most one per `STEP` seconds of log time: the
pipeline offers each decode line's timestamp (one comparison per line) and a point is taken only
when `due`. A point's value is the mean accept length of the lines since the previous point,
computed from the rank's running sum and count (`pipeline.RankStats`), so lines between points
cost nothing and a dip shorter than `STEP` still pulls the mean down. Memory: ~120 bytes a
point, ~45 KB a rank for the hour. Log time, not wall time: the alerts' `starts_at`/`ends_at`
are log times too, so firing episodes line up with the curve.
"""

from __future__ import annotations

import math
from collections import deque

STEP = 10.0  # seconds of log time between points
SPAN = 3600.0  # seconds the buffer covers
POINTS = int(SPAN / STEP)


class AcceptHistory:
    """Points (timestamp s since the epoch, mean accept length, collapsed) of one rank, oldest
    first. `collapsed`: the collapse rule's state for the rank when the point was taken."""

    __slots__ = ("points", "due", "_sum", "_count")

    def __init__(self) -> None:
        self.points: deque[tuple[float, float, bool]] = deque(maxlen=POINTS)
        self.due = -math.inf  # a line at or after this log time takes a point
        self._sum = 0.0
        self._count = 0

    def add(self, timestamp: float, accept_length: float, total: float, count: int, collapsed: bool) -> None:
        """Take a point at `timestamp` (the caller checked `timestamp >= due`). `total`/`count`:
        the rank's running sum and count of accept lengths, this line included. The first point
        is the line's own value (the running totals may hold lines from before a restart). Time
        going back (the log restarted with older stamps) starts the buffer again."""
        points = self.points
        if points and timestamp < points[-1][0]:
            points.clear()
        n = count - self._count
        value = accept_length if self.due == -math.inf or n <= 0 else (total - self._sum) / n
        points.append((timestamp, value, collapsed))
        self._sum, self._count = total, count
        self.due = timestamp + STEP

    def pending(self, total: float, count: int) -> float | None:
        """Mean accept length of the lines read since the last point (None: none)."""
        n = count - self._count
        return (total - self._sum) / n if n > 0 and self.due != -math.inf else None
