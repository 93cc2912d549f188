"""The catch-up path: a large read of canonical SGLang lines (`replay`, `run` start-up) in columns.

`Pipeline.feed_batch` hands a read here when it is large and plain: no container prefix, valid
UTF-8, no open traceback, and every batch line in it is the canonical decode or prefill line of
SGLang 0.5.5+ (`sources.sglang_columns.parse`: read in numpy columns, each line only where it
starts, so text inside a request log never counts), with no `server_args` line, no
line the error stage could take and no vLLM line. Any other read takes the per-line path.

The read is cut where the per-line path would tick (a batch line's clock a second past the last
tick). Each rule then `advance`s over a piece as far as it can in aggregate (`Rule.advance`); the
rows it did not take go through its `on_decode` / `on_prefill` one by one, in file and rule order,
with the `Window` the per-line path would have built. Every decision, alert, timestamp and
counter is the per-line path's (tests/test_catchup.py replays logs with episodes both ways), and
so are the ranks' totals and status history wherever an alert reads them (`_RankSync`).
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from bisect import bisect_right
from datetime import datetime

from specwatch.events import DecodeBatch, OtherLine, PrefillBatch
from specwatch.rules.base import alert_key
from specwatch.rules.windows import Window, running_in_window
from specwatch.sources.engines import SGLANG, parse_line
from specwatch.sources.log_errors import maybe_error
from specwatch.sources.vllm_log import maybe_event as vllm_maybe
from specwatch.sources.sglang_log import _CANONICAL_DECODE as _DECODE
from specwatch.sources.sglang_log import _CANONICAL_PREFILL as _PREFILL
from specwatch.sources.sglang_log import canonical_decode, canonical_prefill

MIN_LINES = 256  # smaller reads (a live tail) take the per-line path
RETRIES = 16  # advances in a row that take nothing before a rule waits for the next piece

_INF = math.inf


class Rows:
    """The batch lines of one read of one server, in file order (index: row), as columns.

    Every row: `dec` (decode line?), `clock` (the rules' clock: the follower's `now`, else the
    line's timestamp), `rank` (rank tokens as printed). Decode rows also by decode ordinal (`d_*`,
    `dpos[j]`: the row of decode ordinal j, `dcount[i]`: decode rows before row i): `d_ts`
    (timestamp, s), `d_rank`, `d_running`, `d_queued`, `d_accept`, `d_thr` (token/s), and the
    `Window` flags `d_acc_ok` (`acceptance_valid`), `d_thr_ok` (`throughput_valid`); `d_acc` is
    the accept len where acceptance_valid, else +inf (so `min` over a slice reads the valid ones);
    `d_code`: the rank as a number (first seen, first numbered).

    Each is a list made on first use from the read's numpy columns (`array`): a rule that reads
    the arrays leaves the lists unmade (Python objects per row: CPU, and heap that stays).
    """

    __slots__ = ("server", "tz", "block", "start", "end", "dec", "clock", "rank", "dpos", "dcount", "d_ts", "d_rank",
                 "d_running", "d_queued", "d_accept", "d_thr", "d_acc_ok", "d_thr_ok", "d_acc", "d_gap", "d_prefills",
                 "p_rank", "ppos", "_batches", "d_code", "_arrays", "_names", "_d_names", "_now", "_first_gap")

    def __getattr__(self, name: str):
        """A list column, made from its array on first use."""
        a = self._arrays
        if name == "clock":
            value = a["ts"].tolist() if self._now is None else [self._now] * len(a["dec"])
        elif name in ("rank", "d_rank", "p_rank"):
            value = list(map(self._names.__getitem__, a[name].tolist()))
        elif name == "d_gap":
            value = a["d_gap"].tolist()
            for j in self._first_gap:
                value[j] = None
        elif name in _LISTS:
            value = a["d_running_int" if name == "d_running" else name].tolist()
        else:
            raise AttributeError(name)
        setattr(self, name, value)
        return value

    def batch(self, i: int) -> DecodeBatch | PrefillBatch:
        """Row i as the event the per-line parser makes of it (built once, on demand)."""
        b = self._batches.get(i)
        if b is None:
            line = self.block[self.start[i]:self.end[i]].decode()
            if self.dec[i]:
                b = canonical_decode(_DECODE.match(line).groups(), self.tz)
            else:
                b = canonical_prefill(_PREFILL.match(line).groups(), self.tz)
            self._batches[i] = b
        return b

    def array(self, name: str):
        """Column `name` as a numpy array: decode columns d_ts, d_acc, d_accept, d_running (float),
        d_running_int, d_queued, d_thr, d_code, d_acc_ok, d_thr_ok, d_prefills, d_gap (first gaps: any value, see d_gap);
        row columns dec, ts (the lines' timestamps), rank (codes into the read's rank names),
        dpos, dcount, ppos."""
        return self._arrays[name]

    def first_below(self, limit: float, da: int, db: int, inclusive: bool = False) -> int:
        """The first decode ordinal in [da, db) whose `d_acc` is below `limit` (at or below with
        `inclusive`), else db: a search in the ordinals found once per read and limit."""
        import numpy as np

        key = ("below", limit, inclusive)
        found = self._arrays.get(key)
        if found is None:
            acc = self.array("d_acc")
            found = self._arrays[key] = np.flatnonzero(acc <= limit if inclusive else acc < limit)
        k = int(np.searchsorted(found, da))
        return int(found[k]) if k < len(found) and found[k] < db else db

    def decode(self, j: int) -> DecodeBatch:
        """Decode ordinal j as its event."""
        return self.batch(self.dpos[j])

    def window(self, i: int, config) -> Window:
        """Decode row i classified as `WindowTracker.decode` classified it."""
        j = self.dcount[i]
        b = self.batch(i)
        gap, prefills = self.d_gap[j], self.d_prefills[j]
        return Window(b, running_in_window(b.running_requests, b.draft_tokens) < config.min_running_requests, prefills > config.max_prefill_batches,
                      gap is None or gap > config.max_gap, gap, prefills)

    def decodes(self, a: int, b: int) -> tuple[int, int]:
        """Decode ordinals [da, db) of rows [a, b)."""
        return self.dcount[a], self.dcount[b]

    def prefills(self, a: int, b: int) -> list[int]:
        """The prefill rows among rows [a, b)."""
        return self.ppos[a - self.dcount[a]:b - self.dcount[b]]


def read(block: bytes, server: str, tz, windows, now: float | None, fits=None) -> Rows | None:
    """The read `block` (lines each ending in "\\n") as Rows, classifying its decode lines in
    `windows` (the pipeline's WindowTracker, advanced past the read); None when the read needs
    the per-line path (nothing is changed then): a line holding "batch" that is not a canonical
    batch line (`sglang_columns.parse`), or another line the error stage could take, a
    `server_args` line, or ranks that `fits(names)` (`Pipeline.ranks_fit`) says pass the limit."""
    import numpy as np

    from specwatch import columns
    from specwatch.sources import sglang_columns

    try:
        cols = sglang_columns.parse(block, tz)
    except ValueError:
        return None  # an impossible date: the general parser says why
    if cols is None or not len(cols.dec):
        return None
    other = cols.other
    if b"server_args=" in other or b"]:[E" in other or maybe_error(other.decode()):
        return None
    if fits is not None and not fits(cols.ranks):
        return None
    r = Rows()
    r.server, r.tz, r._batches, r._names, r._now = server, tz, {}, cols.ranks, now
    r.block, r.start, r.end = block, cols.start, cols.end
    dec, ts = cols.dec, cols.ts
    dcount = np.zeros(len(dec) + 1, np.int64)
    np.cumsum(dec, out=dcount[1:])
    drank = cols.rank[dec]
    # d_code: the decode rows' ranks numbered in their first appearance among decode rows
    seen, first = columns.unique_first(drank)
    in_order = seen[np.argsort(first)]
    number = np.empty(len(cols.ranks), np.int64)
    number[in_order] = np.arange(len(seen))
    r._d_names = [cols.ranks[c] for c in in_order.tolist()]  # the ranks by d_code
    r._arrays = {"dec": dec, "ts": ts, "rank": cols.rank, "dpos": np.flatnonzero(dec), "dcount": dcount,
                 "ppos": np.flatnonzero(~dec), "p_rank": cols.rank[~dec], "d_rank": drank, "d_code": number[drank],
                 "d_ts": ts[dec], "d_running_int": cols.running, "d_running": cols.running.astype(float),
                 "d_queued": cols.queued, "d_accept": cols.accept, "d_thr": cols.thr}
    _classify(r, server, cols, windows)
    return r


_LISTS = frozenset(("dec", "dpos", "dcount", "ppos", "d_ts", "d_running", "d_queued", "d_accept", "d_thr", "d_code",
                    "d_prefills", "d_acc_ok", "d_thr_ok", "d_acc"))


def _classify(r: Rows, server: str, cols, tracker) -> None:
    """`WindowTracker.decode` / `.prefill` over the rows in order, per rank in numpy: each decode
    row's gap and prefill count, and the window flags; the tracker ends as after the per-line
    path (its dicts' keys in the same order)."""
    import numpy as np

    cfg = tracker.config
    last, pre = tracker._last, tracker._prefills
    dec, t_all, code, names = cols.dec, cols.ts, cols.rank, cols.ranks  # ranks numbered in first appearance
    dcount = np.concatenate(([0], np.cumsum(dec)))
    nd = int(dcount[-1])
    gaps = np.empty(nd)
    first_gap = []  # decode ordinals whose rank had no earlier decode line: gap None
    prefills = np.zeros(nd, dtype=np.int64)
    new_last, new_pre = [], []  # (row of insertion, key, value): dict order as per line
    order = np.argsort(code, kind="stable")
    bounds = np.searchsorted(code[order], np.arange(len(names) + 1))
    for c, rk in enumerate(names):
        key = (server, rk)
        idx = order[bounds[c]:bounds[c + 1]]
        isdec = dec[idx]
        didx = idx[isdec]
        carried = pre.get(key, 0)
        if len(didx):
            j = dcount[didx]  # decode ordinals
            td = t_all[didx]
            prev = last.get(key)
            gaps[j[1:]] = td[1:] - td[:-1]
            if prev is None:
                first_gap.append(int(j[0]))
                new_last.append((int(didx[0]), key, float(td[-1])))
            else:
                gaps[j[0]] = td[0] - prev
                last[key] = float(td[-1])
            cp = np.cumsum(~isdec)  # prefill lines of the rank up to each of its rows
            at = cp[isdec]
            prefills[j] = np.diff(np.concatenate(([0], at)))
            prefills[j[0]] += carried
            pre.pop(key, None)
            trailing = int(cp[-1] - at[-1])
            if trailing:
                new_pre.append((int(idx[np.flatnonzero(isdec)[-1] + 1]), key, trailing))
        elif key in pre:
            pre[key] = carried + len(idx)
        else:
            new_pre.append((int(idx[0]), key, len(idx)))
    for _, key, v in sorted(new_last):
        last[key] = v
    for _, key, v in sorted(new_pre):
        pre[key] = v
    min_run, max_pre, max_gap = cfg.min_running_requests, cfg.max_prefill_batches, cfg.max_gap
    acc_ok = (cols.running >= min_run) & (prefills <= max_pre)
    thr_ok = acc_ok & (gaps <= max_gap)
    thr_ok[first_gap] = False  # no earlier line: after a gap
    r._first_gap = first_gap
    r._arrays.update(d_gap=gaps, d_prefills=prefills, d_acc_ok=acc_ok, d_thr_ok=thr_ok,
                     d_acc=np.where(acc_ok, cols.accept, np.inf))


_STAMP = re.compile(rb"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
TICK_LINES = 8  # fewer lines a second of log time than this: the read goes per line


def _dense(text: bytes, lines: int) -> bool:
    """The log's clock (its first and last bracket stamps) ticks more than once per TICK_LINES
    lines of the read: the catch-up's work per tick (every rule's `advance`) would cost more
    than the per-line path. Decides only which exact path runs."""
    first = _STAMP.search(text)
    at = text.rfind(b"\n[", 0, len(text) - 1)
    last = _STAMP.match(text, at + 1) if at >= 0 else None
    if first is None or last is None:
        return False
    fmt = "%Y-%m-%d %H:%M:%S"
    try:
        span = (datetime.strptime(last.group(1).decode(), fmt)
                - datetime.strptime(first.group(1).decode(), fmt)).total_seconds()
    except ValueError:
        return False
    return span * TICK_LINES > lines


def _settle(engine) -> None:
    """Rows in columns are SGLang batch lines: the per-line path settles the log's engine at the
    first (`LogEngine`), before any row of the read could be another engine's."""
    if engine.name is None:
        engine.settle(SGLANG)


def _collapsed(collapse, server: str) -> bool:
    """A rank of `server` is collapsed: the rules take its lines one by one (the collapse's
    evidence, the throughput and disagreement of a firing rank), so per line is cheaper."""
    if collapse.active.empty():
        return False
    prefix = alert_key(server, "")
    return any(k.startswith(prefix) for k in collapse.active.keys())


def take(pipeline, server: str, stats, grouper, engine, maybe_event, batch, tz, now: float | None) -> int:
    """One large read (`LineBatch`, valid UTF-8, no container prefix, no traceback open) as
    `Pipeline._feed_lines` would take it; returns how many were other lines. A read with lines
    that need the parser (another batch line form, request text quoting one, `server_args`, an
    error) goes through `_feed_lines` at those lines and in columns between them."""
    if engine.name is None and vllm_maybe(batch.text):  # vLLM lines may settle the engine: the read one by one
        return pipeline._feed_lines(server, stats, grouper, engine, maybe_event, batch.lines, None, None, tz, now)
    block = batch._block if batch._block is not None and batch._lines is None else batch.text.encode()
    # a tick every few lines, or a collapse: per line is cheaper (both paths decide the same)
    if now is None and _dense(block, len(batch)) or _collapsed(pipeline.collapse, server):
        return pipeline._feed_lines(server, stats, grouper, engine, maybe_event, batch.lines, None, None, tz, now)
    fits = lambda names: pipeline.ranks_fit(server, names)  # noqa: E731
    rows = read(block, server, tz, pipeline.windows, now, fits)
    if rows is not None:
        _settle(engine)
        return feed(pipeline, server, stats, rows, len(batch), now)
    lines = batch.lines
    odd, inert = [], set()  # lines for the parser; batch lines it reads as other lines (request text)
    for i, line in enumerate(lines):
        if "server_args=" in line or maybe_error(line):
            odd.append(i)
        elif "batch" in line and not (_DECODE.match(line) or _PREFILL.match(line)):
            if type(parse_line(line, tz=tz)) is OtherLine:  # both engines' grammar: settles nothing
                inert.add(i)
            else:
                odd.append(i)
    def per_line(server, stats, grouper, lines, *args):
        return pipeline._feed_lines(server, stats, grouper, engine, maybe_event, lines, *args)

    if len(odd) * 16 > len(lines):
        return per_line(server, stats, grouper, lines, None, None, tz, now)
    other, i, n = 0, 0, len(lines)
    for j in odd + [n]:
        while i < j and grouper.group is not None:  # a traceback open: its lines one by one
            other += per_line(server, stats, grouper, lines[i:i + 1], None, None, tz, now)
            i += 1
        part = None
        if j - i >= MIN_LINES:  # in columns, less the inert lines (each an OtherLine event, as per line)
            kept = [line for x, line in enumerate(lines[i:j], i) if x not in inert] if inert else lines[i:j]
            part = read(("\n".join(kept) + "\n").encode(), server, tz, pipeline.windows, now, fits)
        if part is not None:
            _settle(engine)
            stats.lines["other"] += j - i - len(kept)
            other += feed(pipeline, server, stats, part, len(kept), now)
        elif j > i:
            other += per_line(server, stats, grouper, lines[i:j], None, None, tz, now)
        if j < n:
            other += per_line(server, stats, grouper, lines[j:j + 1], None, None, tz, now)
        i = j + 1
    return other


def feed(pipeline, server: str, stats, rows: Rows, lines: int, now: float | None) -> int:
    """The pipeline's per-line work (`Pipeline._take`) for every row of `rows`, of a read of
    `lines` lines (caller holds the lock); returns how many were other lines."""
    n = len(rows.array("dec"))
    nd = len(rows.array("dpos"))
    # where the per-line path ticks: after a row whose clock is a second past the last tick
    cuts, last = [], pipeline._last_tick
    if now is None:
        cuts = _cuts(rows.array("ts"), last)
    elif now - last >= 1.0:
        cuts.append(1)
    if not cuts or cuts[-1] != n:
        cuts.append(n)
    decode_rules = pipeline._on_decode
    prefill_rules = set(map(id, pipeline._on_prefill))
    rules = [r for r in pipeline.rules if r in decode_rules or id(r) in prefill_rules]
    a, ci, end = 0, 0, len(cuts) - 1
    clock = rows.clock
    taken: list[tuple[int, list] | None] = [None] * len(rules)
    sync = _RankSync(pipeline, server, rows, taken)
    ticks = _Ticks(pipeline, server, rows, rules)

    def before_handle(alerts: list) -> None:
        ticks.stale = True
        sync.on_handle(alerts)

    pipeline._before_handle = before_handle
    try:
        while ci <= end:
            b = cuts[ci]
            _piece(pipeline, server, rows, rules, prefill_rules, a, b, taken, sync, ticks)
            _stamp(stats, rows, a, b)
            if b < n or (clock[b - 1] - pipeline._last_tick >= 1.0):
                sync.upto = sync.points = b
                ticks.tick(b, clock[b - 1])
            a = b
            ci += 1
            # the next pieces whose rows every rule took and whose ticks are all quiet: at once
            j = ticks.skip(cuts, ci, end, taken)
            if j > ci:
                b = cuts[j - 1]
                _stamp(stats, rows, a, b)
                sync.upto = sync.points = b
                pipeline._last_tick = clock[b - 1]
                a, ci = b, j
        sync.sync(n, n)
    finally:
        pipeline._before_handle = None
    stats.lines["decode"] += nd
    stats.lines["prefill"] += n - nd
    return lines - n


def _cuts(clock, last: float) -> list[int]:
    """The rows after which the per-line path ticks (a row whose clock is a second past the
    last tick's, `last` first): at C speed for whole seconds in order (the log's stamps
    without milliseconds: then every new second ticks), else one row at a time."""
    import numpy as np

    if len(clock) and (clock[1:] >= clock[:-1]).all() and (np.floor(clock) == clock).all():
        first = int(np.argmax(clock - last >= 1.0))
        if not clock[first] - last >= 1.0:
            return []
        later = np.flatnonzero(clock[first + 1:] > clock[first:-1]) + first + 1  # each new whole second
        return [first + 1, *(later + 1).tolist()]
    cuts = []
    for i, c in enumerate(clock.tolist()):
        if c - last >= 1.0:
            cuts.append(i + 1)
            last = c
    return cuts


def _stamp(stats, rows: Rows, a: int, b: int) -> None:
    """The clocks of the last decode and prefill lines of rows [a, b) (`ServerStats.last_line`)."""
    da, db = rows.decodes(a, b)
    clock = rows.clock
    if db > da:
        stats.last_line["decode"] = clock[rows.dpos[db - 1]]
    if (b - a) > (db - da):
        i = b - 1
        while rows.dec[i]:
            i -= 1
        stats.last_line["prefill"] = clock[i]


class _Ticks:
    """The read's ticks, less what they would not change: each rule's `on_tick` is skipped
    where `Rule.quiet_until` says it does nothing (asked when the rule advances, for a rule
    with decode or prefill hooks, else at the start of the read and after its ticks), the
    dispatcher's where `Dispatcher.idle_until` says so. `quiet`: per rule (by id) the last cut
    whose tick it skips. While some file's traceback is open (its end is an event for the
    rules) every tick runs whole and no rule advances past one, as before."""

    def __init__(self, pipeline, server: str, rows: Rows, rules: list) -> None:
        self.p, self.server, self.rows = pipeline, server, rows
        self.rules = pipeline._on_tick
        self.exact = any(g.group is not None for g in pipeline._groupers.values())
        self.hooked = set(map(id, rules))  # learn theirs when they advance (before the first tick)
        self.quiet = {id(r): 0 if id(r) in self.hooked else r.quiet_until(server, rows, 0) for r in self.rules}
        self.stale = True  # an alert was handled since `idle` was read
        self.idle = -math.inf

    def reach(self, rule, a: int, b: int) -> int:
        """The row up to which `rule` may advance from row a (a piece ends at b)."""
        n = len(self.rows.dec)
        x = id(rule)
        if self.exact or x not in self.quiet:
            return n if rule.advance_across_ticks else b
        q = self.quiet[x] = rule.quiet_until(self.server, self.rows, a)
        return n if rule.advance_across_ticks else max(b, q)

    def alerted(self, rule, i: int) -> None:
        """`rule` alerted at row i: its ticks after that run (until it advances again)."""
        q = self.quiet.get(id(rule))
        if q is not None and q > i:
            self.quiet[id(rule)] = i

    def _dispatch_idle(self) -> float:
        if self.stale:
            self.idle, self.stale = self.p.dispatcher.idle_until(), False
        return self.idle

    def tick(self, b: int, now: float) -> None:
        """The tick after rows [0, b), at `now`."""
        p = self.p
        if self.exact:
            p.tick(now)
            return
        due = [r for r in self.rules if self.quiet[id(r)] < b]
        dispatch = now >= self._dispatch_idle()
        if not due and not dispatch:
            p._last_tick = now
            return
        p.tick(now, due, dispatch)
        self.stale = True
        for r in due:
            if id(r) not in self.hooked:
                self.quiet[id(r)] = r.quiet_until(self.server, self.rows, b)

    def skip(self, cuts: list[int], ci: int, end: int, taken: list) -> int:
        """The first piece from cuts[ci] on (before the last, `end`) that needs a row one by
        one (not taken by some rule, or its alerts), a rule's advance, or a tick."""
        if self.exact or ci >= end:
            return ci
        low = min(self.quiet.values(), default=len(self.rows.dec))
        for k, alerts, _ in taken:
            if (k - 1 if alerts else k) < low:
                low = k - 1 if alerts else k
        j = bisect_right(cuts, low, ci, end)
        idle = self._dispatch_idle()
        if j > ci and idle < math.inf:
            clock = self.rows.clock
            j = next((c for c in range(ci, j) if clock[cuts[c] - 1] >= idle), j)
        return j


def _piece(pipeline, server: str, rows: Rows, rules: list, prefill_rules: set, a: int, b: int,
           taken: list, sync: "_RankSync", ticks: _Ticks) -> None:
    """Rows [a, b), between two ticks: each rule advances in aggregate (past b when it may),
    the rows it did not take go through its hooks one by one. `taken`: per rule, (first row
    it did not take, alerts of the row before it, how many advances in a row took nothing). A
    rule advances again after the row it stopped at (drift: a bucket closes), unless
    `RETRIES` advances in a row took nothing (it waits for the next piece then)."""
    low = b
    for x, rule in enumerate(rules):
        t = taken[x]
        if t is None or t[0] <= a:
            t = taken[x] = (*pipeline.rule_faults.call(rule, "advance", server, rows, a, ticks.reach(rule, a, b),
                                                       default=(a, [])), 0)
        k, alerts, _ = t
        first = k - 1 if alerts else k
        if first < low:
            low = first
    if low >= b:
        return
    cfg = pipeline.windows.config
    handle, dec, clock = pipeline._handle, rows.dec, rows.clock
    i = low
    while i < b:
        window = None
        sync.upto, sync.points = i + 1, i  # an alert of row i sees the ranks with row i, points before it
        for x, rule in enumerate(rules):
            k, alerts, misses = taken[x]
            if i < k:  # taken in aggregate; its alerts (if any) are the last taken row's
                if alerts and i == k - 1:
                    handle(alerts, clock[i])
                    ticks.alerted(rule, i)
                continue
            out = None
            if dec[i]:
                if window is None:
                    window = rows.window(i, cfg)
                out = pipeline.rule_faults.call(rule, "on_decode", server, window, clock[i])
            elif id(rule) in prefill_rules:
                out = pipeline.rule_faults.call(rule, "on_prefill", server, rows.batch(i), clock[i])
            if out:
                handle(out, clock[i])
                ticks.alerted(rule, i)
            if i == k and i + 1 < b and misses < RETRIES:  # it stopped at this row: on from the next
                k, alerts = pipeline.rule_faults.call(rule, "advance", server, rows, i + 1, ticks.reach(rule, i + 1, b),
                                                      default=(i + 1, []))
                taken[x] = (k, alerts, 0 if k > i + 1 else misses + 1)
        i += 1
        # on to the next row a rule has to see: one it stopped at, or the row of its alerts
        nxt = b
        for k, alerts, _ in taken:
            if alerts and k - 1 >= i:
                k -= 1
            if k < nxt:
                nxt = k
        if nxt > i:
            i = nxt


class _RankSync:
    """`RankStats` (counts, last decode line, accept len totals) and their status history
    (`AcceptHistory`) brought up to a row of the read, as the per-line path leaves them there:
    lazily, before an alert is handled (`Pipeline._handle` reads them in `_add_trend`) and at the
    end of the read. `upto`: rows [0, upto) are counted; `points`: rows [0, points) took their
    history points (a row's point follows its rules, so at an alert of row i, points = i). A
    point's alert state is the rules' now, less the transitions handed out at or after its row
    (`pending`: those of the alert being handled and of rules that advanced past it)."""

    def __init__(self, pipeline, server: str, rows: Rows, taken: list) -> None:
        import numpy as np

        self.p, self.server, self.rows, self.taken = pipeline, server, rows, taken
        self.upto = self.points = self.done = self.pdone = 0
        ranks = pipeline.ranks
        codes, acc, ts = rows.array("d_code"), rows.array("d_accept"), rows.array("d_ts")
        self.per = []  # per rank code: (rank, decode ordinals, accept lens, running sums, times, counts before)
        for code, rk in enumerate(rows._d_names):
            js = np.flatnonzero(codes == code)
            vals = acc[js]
            rs = ranks.get((server, rk))
            total, count = (rs.accept_length_sum, rs.accept_length_count) if rs is not None else (0.0, 0)
            # one addition at a time, in line order (an accumulate): the same float sums as per line
            sums = np.cumsum(np.concatenate(([total], vals)))[1:]
            t = ts[js]
            self.per.append([rk, js, vals, sums, t, count, bool((t[1:] >= t[:-1]).all()), 0, 0])

    def on_handle(self, alerts: list) -> None:
        self.sync(self.upto, self.points, alerts)

    def sync(self, upto: int, points: int, now_alerts: list = ()) -> None:
        import numpy as np

        from specwatch import columns

        rows, server, ranks = self.rows, self.server, self.p.ranks
        a = self.done
        if upto > a:
            found, first = columns.unique_first(rows.array("rank")[a:upto])
            for code, i in sorted(zip(found.tolist(), first.tolist()), key=lambda e: e[1]):
                if (server, rows._names[code]) not in ranks:  # RankStats made in first-appearance order, as per line
                    self.p._rank(server, rows.batch(a + i))
            db = rows.dcount[upto]
            for e in self.per:
                rk, js, vals, sums, _, count0, _, lo, _ = e[:9]
                hi = int(np.searchsorted(js, db))
                if hi == lo:
                    continue
                rs = ranks[(server, rk)]
                rs.decode_batches += hi - lo
                rs.last_decode = rows.decode(int(js[hi - 1]))
                rs.accept_length_sum = float(sums[hi - 1])
                rs.accept_length_count = count0 + hi
                mn, mx = float(vals[lo:hi].min()), float(vals[lo:hi].max())
                if mn < rs.accept_length_min:
                    rs.accept_length_min = mn
                if mx > rs.accept_length_max:
                    rs.accept_length_max = mx
                e[7] = hi
            dcount = rows.array("dcount")
            prefills = np.bincount(rows.array("p_rank")[a - int(dcount[a]):upto - int(dcount[upto])])
            for code in np.flatnonzero(prefills).tolist():
                ranks[(server, rows._names[code])].prefill_batches += int(prefills[code])
            self.done = upto
        if points > self.pdone:
            self._points(points, now_alerts)
            self.pdone = points

    def _points(self, points: int, now_alerts: list) -> None:
        """History points of the rows before `points`."""
        import numpy as np

        db = self.rows.dcount[points]
        later = [*now_alerts, *(a for t in self.taken if t is not None and t[0] - 1 >= points for a in t[1])]
        pending = list({id(a): a for a in later if "update" not in a.annotations}.values())
        state = self.p.alert_state
        for e in self.per:
            rk, js, vals, sums, t, count0, ordered, _, k = e[:9]
            hi = int(np.searchsorted(js, db))
            if hi == k:
                continue
            h = self.p.ranks[(self.server, rk)].history
            st = None
            if len(e) == 9:  # the rank's columns as Python floats: one search and point per step
                e += [t.tolist(), vals.tolist(), sums.tolist()]
            tl, vl, sl = e[9:]
            while k < hi:
                if h.floor <= tl[k] < h.due:  # no point due (as the per-line path: `AcceptHistory.floor`)
                    if not ordered:
                        k += 1
                        continue
                    k = bisect_left(tl, h.due, k, hi)  # the first line at or after `due` (none before `floor`)
                    if k >= hi:
                        break
                if st is None:
                    st = _state(state, self.server, rk, pending)
                h.add(tl[k], vl[k], sl[k], count0 + k + 1, st)
                k += 1
            e[8] = hi


def _state(state, server: str, rank: str, pending: list) -> int:
    """`AlertState(server, rank)` before the transitions `pending` (already applied to the rules)."""
    now = state(server, rank)
    mine = [a for a in pending if a.labels.get("server") == server and a.labels.get("rank", "") == rank]
    if not mine:
        return now
    from specwatch.status.history import COLLAPSED, OTHER

    collapsed = state._collapse.collapsed(server, rank)
    key = alert_key(server, rank)
    others = [key in r.active for r in state._others]
    for alert in mine:
        if alert.name in state._collapse.alert_names:
            collapsed = not collapsed
        for x, r in enumerate(state._others):
            if alert.name in r.alert_names:
                others[x] = not others[x]
    return (COLLAPSED if collapsed else 0) | (OTHER if any(others) else 0)
