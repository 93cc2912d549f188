"""Rolling statistics for the baseline rules: a recent window and a learned baseline.

`Recent` holds the samples of the last `span` seconds and hands back the ones that age out, so
a rule can feed them into its `Baseline` only when they were healthy: a degradation never
teaches the baseline that it is normal. `Baseline` keeps per-bucket sums (a bounded number of
buckets, so memory and state size stay small over days) and reports their weighted mean.
Times are seconds (the batches' timestamps).
"""

from __future__ import annotations

import base64
import math
import sys
from array import array
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import chain


class Pairs:
    """Samples (t, value), oldest first, in two `array('d')` columns: 16 bytes a sample where a
    deque of tuples takes ~100 (a tuple and two floats), for windows of thousands of lines.
    Readers use it as that deque (`len`, `[i]`, iteration: (t, value) tuples of floats); `Recent`
    appends to the columns and `drop`s the oldest."""

    __slots__ = ("t", "v", "head")

    def __init__(self, pairs: Iterable[tuple[float, float]] = ()):
        flat = array("d", chain.from_iterable(pairs))  # t0, v0, t1, v1, ...
        self.t, self.v, self.head = flat[0::2], flat[1::2], 0

    def drop(self, k: int) -> None:
        """Forget the oldest `k` samples (at most all)."""
        h, ts = self.head + k, self.t
        if h >= len(ts):
            del ts[:], self.v[:]
            h = 0
        elif h >= 256 and 2 * h >= len(ts):  # the dropped front goes once it is half: O(1) amortized
            del ts[:h], self.v[:h]
            h = 0
        self.head = h

    def __len__(self) -> int:
        return len(self.t) - self.head

    def __getitem__(self, i: int) -> tuple[float, float]:
        n = len(self.t) - self.head
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("Pairs index out of range")
        i += self.head
        return self.t[i], self.v[i]

    def __iter__(self) -> Iterator[tuple[float, float]]:
        h = self.head
        return zip(self.t[h:], self.v[h:])  # copies: safe against changes while iterating

    def __repr__(self) -> str:
        return f"Pairs({list(self)!r})"


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
    """Samples (t, value) of the last `span` seconds, oldest first, with their running sum
    (`mean` is O(1): the rules call it on every decode line). `samples`: a `Pairs` (the catch-up
    in columns builds one from its arrays: `columns.set_recent`); a deque of (t, value) tuples
    set here serves as the store as it is."""

    __slots__ = ("span", "_pairs", "_sum")

    def __init__(self, span: float):
        self.span = span
        self._pairs: Pairs | deque = Pairs()
        self._sum = 0.0

    @property
    def samples(self) -> Pairs | deque:
        return self._pairs

    @samples.setter
    def samples(self, pairs: Iterable[tuple[float, float]]) -> None:
        self._pairs = pairs if isinstance(pairs, (Pairs, deque)) else Pairs(pairs)

    def add(self, t: float, value: float) -> list[tuple[float, float]]:
        """Add a sample; returns the samples that fell out of the window (oldest first)."""
        p = self._pairs
        if type(p) is Pairs:
            ts = p.t
            ts.append(t)
            p.v.append(value)
            oldest = ts[p.head]
        else:
            p.append((t, value))
            oldest = p[0][0]
        self._sum += value
        limit = t - self.span
        if oldest > limit:
            return []  # nothing aged out (prune's test): no call, no list to build
        if type(p) is Pairs:  # a steady window: one sample in, one out (prune's result, inline)
            h = p.head
            if ts[h + 1] > limit:  # ts[h + 1] exists: this sample's t is > limit
                v = p.v[h]
                self._sum -= v
                if h < 255 or 2 * h + 2 < len(ts):  # `drop(1)` when it does not compact
                    p.head = h + 1
                else:
                    p.drop(1)
                return [(oldest, v)]
        return self.prune(t)

    def prune(self, t: float) -> list[tuple[float, float]]:
        """Drop the samples older than `span` before `t`; returns them (oldest first)."""
        p = self._pairs
        limit = t - self.span
        if type(p) is Pairs:
            ts, h = p.t, p.head
            k, n = h, len(ts)
            while k < n and ts[k] <= limit:
                k += 1
            out = list(zip(ts[h:k], p.v[h:k]))
            if k > h:
                p.drop(k - h)
        else:
            out = []
            while p and p[0][0] <= limit:
                out.append(p.popleft())
        for _, v in out:  # one by one, oldest first: the same float sum either way
            self._sum -= v
        if not p:
            self._sum = 0.0  # no drift of float error across idle spells
        return out

    @property
    def sum(self) -> float:
        return self._sum

    def __len__(self) -> int:
        return len(self._pairs)

    def mean(self) -> float | None:
        return self._sum / len(self._pairs) if self._pairs else None

    def to_state(self) -> dict:
        """The samples as {"t": ..., "v": ...}: base64 of float64 little-endian columns."""
        p = self._pairs if type(self._pairs) is Pairs else Pairs(self._pairs)
        return {"t": _pack(p.t[p.head:]), "v": _pack(p.v[p.head:])}

    def load_state(self, state: dict | list) -> None:
        """Add the samples of `to_state()` (or a list of (t, value) pairs: earlier versions) in order."""
        pairs = zip(_unpack(state["t"]), _unpack(state["v"])) if isinstance(state, dict) else state
        for t, v in pairs:
            self.add(t, v)


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

    def add(self, t: float, value: float) -> None:
        idx = math.floor(t / self.bucket)
        self._sum += value
        self.count += 1
        buckets = self.buckets
        if buckets and buckets[-1][0] == idx:
            last = buckets[-1]
            last[1] += value
            last[2] += 1
            return
        buckets.append([idx, value, 1])
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
        self.count = sum(b[2] for b in self.buckets)
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
