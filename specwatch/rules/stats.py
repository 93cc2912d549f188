"""Rolling statistics for the baseline rules: a recent window and a learned baseline.

`Recent` sums the samples of the last `span` seconds in time buckets (memory bounded by the span,
not by the line rate) and hands back the buckets that age out, so a rule can feed them into its
`Baseline` only when they were healthy: a degradation never teaches the baseline that it is normal. `Baseline` keeps per-bucket sums (a bounded number of
buckets, so memory and state size stay small over days) and reports their weighted mean.
Times are seconds (the batches' timestamps).
"""

from __future__ import annotations

import base64
import math
import sys
from array import array
from collections import deque


MAX_BUCKETS = 600  # time buckets a `Recent` window holds at most (a 600 s window: 1 s buckets)


def bucket_width(span: float) -> float:
    """Seconds per time bucket of a `span`-second window: 1 s (log stamps are whole seconds), wider
    for windows over `MAX_BUCKETS` seconds, never wider than the span itself."""
    return min(span, max(1.0, span / MAX_BUCKETS)) if span > 0 else 1.0


def _pack(a: array) -> str:
    """float64 column → base64 of its little-endian bytes (exact, and no float to format)."""
    if sys.byteorder != "little":
        a = array("d", a)
        a.byteswap()
    return base64.b64encode(a).decode("ascii")


def _unpack(s: str) -> array:
    a = array("d", base64.b64decode(s))
    if sys.byteorder != "little":
        a.byteswap()
    return a


class Recent:
    """The samples (t, value) of the last `span` seconds as time buckets: per `width`-second bucket
    (`bucket_width(span)`) its start time, sample count and value sum, oldest first, in `array`
    columns, with the window's running `sum` and `count` (samples; `len()` too), so `mean` is O(1): the
    rules read them at every evaluation. Memory is at most `MAX_BUCKETS` + 1 buckets (24 bytes each) whatever the line rate.

    A bucket ages out whole once its start is `span` or more before the newest time: for stamps in
    whole seconds (SGLang's `%H:%M:%S`) exactly the samples a window of samples would drop; finer
    stamps age up to one bucket early. A sample older than the newest bucket (the log's clock
    stepped back) joins the newest bucket. `oldest`: the oldest bucket's start (inf when empty),
    so `oldest > t - span` says that nothing ages out at `t` without a call."""

    __slots__ = ("span", "width", "oldest", "sum", "count", "_t", "_n", "_s", "_head")

    def __init__(self, span: float):
        self.span = span
        self.width = bucket_width(span)
        self._clear()

    def _clear(self) -> None:
        self._t, self._n, self._s = array("d"), array("q"), array("d")  # start s, samples, value sum
        self._head = 0
        self.sum = 0.0
        self.count = 0
        self.oldest = math.inf

    def resize(self, span: float) -> None:
        """A new span (config reload): the buckets kept, merged into the new width's if it changed."""
        self.span = span
        width = bucket_width(span)
        if width != self.width:
            old = self.buckets
            self.width = width
            self._clear()
            for start, n, total in old:
                self._put(start, n, total)

    @property
    def buckets(self) -> list[tuple[float, int, float]]:
        """(start s, samples, value sum) of each bucket, oldest first."""
        h = self._head
        return list(zip(self._t[h:], self._n[h:], self._s[h:]))

    def _put(self, t: float, n: int, total: float) -> None:
        start = (t // self.width) * self.width
        ts = self._t
        if self.count and start <= ts[-1]:
            self._n[-1] += n
            self._s[-1] += total
        else:
            ts.append(start)
            self._n.append(n)
            self._s.append(total)
            if not self.count:
                self.oldest = start
        self.sum += total
        self.count += n

    def add(self, t: float, value: float, n: int = 1) -> list[tuple[float, float, int]]:
        """Add `n` samples at `t` whose values sum to `value` (the lines of one timestamp at once:
        the same buckets as one call per sample, the sums rounded once instead of per sample);
        returns the buckets that fell out of the window (oldest first), each as (start s, value
        sum, samples)."""
        start = (t // self.width) * self.width  # `_put`, inline: every evaluation of several rules
        ts = self._t
        if self.count and start <= ts[-1]:
            self._n[-1] += n
            self._s[-1] += value
        else:
            ts.append(start)
            self._n.append(n)
            self._s.append(value)
            if not self.count:
                self.oldest = start
        self.sum += value
        self.count += n
        limit = t - self.span
        if self.oldest > limit:
            return []  # nothing aged out (prune's test): no call, no list to build
        h = self._head
        # one bucket out and the next stays, no compaction due: prune's result, inline (ts[h + 1]
        # exists: the bucket of t is newer than the limit)
        if ts[h + 1] > limit and (h < 63 or 2 * h + 2 < len(ts)):
            start, total, n = ts[h], self._s[h], self._n[h]
            self.sum -= total
            self.count -= n
            self._head = h + 1
            self.oldest = ts[h + 1]
            return [(start, total, n)]
        return self.prune(t)

    def prune(self, t: float) -> list[tuple[float, float, int]]:
        """Drop the buckets that start `span` or more before `t`; returns them as `add` does."""
        limit = t - self.span
        if self.oldest > limit:
            return []
        ts, sums, counts, h = self._t, self._s, self._n, self._head
        n = len(ts)
        out = []
        while h < n and ts[h] <= limit:
            out.append((ts[h], sums[h], counts[h]))
            self.sum -= sums[h]
            self.count -= counts[h]
            h += 1
        if h == n:  # empty: no drift of float error across idle spells
            self._clear()
            return out
        if h >= 64 and 2 * h >= n:  # the dropped front goes once it is half: O(1) amortized
            del ts[:h], counts[:h], sums[:h]
            h = 0
        self._head = h
        self.oldest = ts[h]
        return out

    def __len__(self) -> int:
        """Samples in the window."""
        return self.count

    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None

    def to_state(self) -> dict:
        """The buckets as {"t": starts, "s": sums, "n": counts}: base64 of float64 little-endian
        columns (counts as floats); "sum": the running sum, "width": seconds per bucket."""
        h = self._head
        return {"t": _pack(self._t[h:]), "s": _pack(self._s[h:]), "n": _pack(array("d", self._n[h:])),
                "sum": self.sum, "width": self.width}

    def load_state(self, state: dict | list) -> None:
        """Add what `to_state()` saved; or the samples of earlier versions ({"t", "v"} columns, or
        a list of (t, value) pairs), in order."""
        if isinstance(state, dict) and "s" in state:
            fresh = not self.count
            for t, total, n in zip(_unpack(state["t"]), _unpack(state["s"]), _unpack(state["n"])):
                self._put(t, int(n), total)
            if fresh and self.count and state.get("width") == self.width:
                self.sum = float(state.get("sum", self.sum))  # the same sum as before, bit for bit
            return
        pairs = zip(_unpack(state["t"]), _unpack(state["v"])) if isinstance(state, dict) else state
        for t, v in pairs:
            self._put(t, 1, v)


class Baseline:
    """Weighted mean of the newest `span / bucket` time buckets that received samples.

    Buckets that received no sample (idle hours) do not count, so the baseline spans the last
    `span` seconds of activity, not of wall time. Totals are kept, so `mean` and `count` are O(1).
    """

    __slots__ = ("bucket", "max_buckets", "buckets", "_sum", "count")

    def __init__(self, bucket: float, span: float):
        self.bucket = bucket
        self.max_buckets = max(1, math.ceil(span / bucket))
        self.buckets: deque[list[float]] = deque()  # [bucket index, sum, count]
        self._sum = 0.0
        self.count = 0

    def add(self, t: float, value: float, n: int = 1) -> None:
        """Add `n` samples at `t` whose values sum to `value` (a bucket aged out of a `Recent`)."""
        idx = math.floor(t / self.bucket)
        self._sum += value
        self.count += n
        buckets = self.buckets
        if buckets and buckets[-1][0] == idx:
            last = buckets[-1]
            last[1] += value
            last[2] += n
            return
        buckets.append([idx, value, n])
        self._trim()

    def resize(self, span: float) -> None:
        """A new `span` (config reload): keep the newest buckets that fit."""
        self.max_buckets = max(1, math.ceil(span / self.bucket))
        self._trim()

    def _trim(self) -> None:
        while len(self.buckets) > self.max_buckets:
            _, s, n = self.buckets.popleft()
            self._sum -= s
            self.count -= int(n)

    def mean(self) -> float | None:
        return self._sum / self.count if self.count else None

    def to_state(self) -> list:
        return [list(b) for b in self.buckets]

    def load_state(self, state: list) -> None:
        self.buckets = deque([float(i), float(s), int(n)] for i, s, n in state)
        self._sum = sum(b[1] for b in self.buckets)
        self.count = sum(int(b[2]) for b in self.buckets)
        self._trim()


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares line through (xs, ys) → (slope, intercept, r²). Needs 2+ distinct xs;
    r² is 0 for a flat series. Raises ValueError otherwise."""
    n = len(xs)
    if n < 2:
        raise ValueError("need at least two points")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("xs are all equal")
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    syy = sum((y - my) ** 2 for y in ys)
    slope = sxy / sxx
    r2 = (sxy * sxy) / (sxx * syy) if syy else 0.0
    return slope, my - slope * mx, r2


def drop_transition(ratio: float, t: float, low_since: float | None, firing: bool, *, max_drop: float,
                    recover_drop: float, hold: float) -> tuple[str | None, float | None]:
    """One step of a "below baseline for a while" alert → (action, new low_since).

    ratio: current / baseline. Below `1 - max_drop` starts (or continues) the pending time, and
    after `hold` seconds the action is "fire". At or above `1 - recover_drop` a firing alert
    gets "resolve". In between, the pending time restarts and a firing alert stays firing.
    """
    if ratio < 1 - max_drop:
        since = t if low_since is None else low_since
        return ("fire" if not firing and t - since >= hold else None), since
    if firing and ratio >= 1 - recover_drop:
        return "resolve", None
    return None, None
