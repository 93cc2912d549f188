"""One pipeline for `run` and `replay`: read → batch lines → summary → rules → alerts.

The two commands differ only in where lines come from (followed files vs recorded logs) and in
the clock (wall time vs the log's own timestamps). A read's canonical SGLang lines are found by
one compiled pattern, every other line by the general parser; both hand batch lines to one
summariser, which classifies each line once (`rules/windows.py`) into its rank's pending entries;
each evaluation hands those to every rule's `on_lines` (docs/one-path.md). The rules are those
registered in `specwatch.rules` (one file each); each is called only for the hooks it has. The
per-rank state kept here is what `metrics.py` renders at scrape time.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
import os
import re
import threading
import time
from datetime import tzinfo
from zoneinfo import ZoneInfo
from dataclasses import dataclass, field
from typing import Callable

from specwatch.core.logclock import LogClocks, last_line
from specwatch.core.rulefaults import RuleFaults
from specwatch.alerts.dispatcher import Dispatcher
from specwatch.alerts.model import FIRING, Alert
from specwatch.config import Config
from specwatch.core.events import (
    ApiSample,
    DecodeBatch,
    LogError,
    LogLine,
    MalformedLine,
    MetricsSample,
    OtherLine,
    PrefillBatch,
    ProcessSample,
    ServerArgs,
    ServerInfo,
    ServerProcess,
    ServerRestarted,
    ServerStarted,
    UnrecognizedLine,
)
from specwatch.rules.base import (Rule, RuleContext, alert_key, all_rules, forget_keys, is_restart_event, log_paths_of,
                                  overrides)
from specwatch.rules.collapse import CollapseRule
from specwatch.rules.server_metrics import metrics_windows
# OTHER_RANK sums the batch lines of a server's ranks beyond `limits.max_ranks_per_server`
# (`Pipeline._rank`): one label set on /metrics and one rank in the rules for all of them; it has
# no rank tokens (`RankSummary.ranks` {}).
from specwatch.rules.summary import (AFTER_GAP, IDLE, OTHER_RANK, PREFILL_DOMINATED, VALID_ACCEPT,
                                     VALID_THROUGHPUT, RankSummary)
from specwatch.sources.filestream import LineBatch
from specwatch.sources.log_errors import KINDS as ERROR_KINDS
from specwatch.sources.log_errors import ErrorGrouper, maybe_error
from specwatch.engines import SGLANG, VLLM, LogEngine
from specwatch.engines.sglang.log import (bracket_prefix, strip_container_prefix,
                                         timestamp_of)
from specwatch.engines.sglang.log import CANONICAL_LINES, rank_numbers
from specwatch.engines.vllm.log import VllmAssembler, VllmLine
from specwatch.status.history import AlertState

_OTHER = OtherLine()

KINDS = ("decode", "prefill", "other", "malformed", "unrecognized")

log = logging.getLogger(__name__)

# A traceback ends at the next line or after a quiet spell (sources/log_errors.py): dated by its
# own stamp when that is at most this many seconds before the read or tick that ended it.
ERROR_STAMP_SLACK = 60.0
RANK_EXPIRY_EVERY = 10.0  # seconds of the clock between two looks for gone ranks
# Batch lines summarised at most before an evaluation, whatever the clock does (a log whose
# stamps went back ticks no second until they pass the newest again): pending lines stay few.
EVALUATE_LINES = 4096


# Alerts about one rank's acceptance that carry its trend (`Pipeline._add_trend`).
TREND_ALERTS = frozenset({"AcceptanceCollapse", "RankDisagreement"})
TREND_KEY = "accept_length_recent"
TREND_POINTS = 24
# a saved last decode line: its fields, shallow (dataclasses.asdict deep-copies: most of a state commit)
_DECODE_FIELDS = tuple(f.name for f in dataclasses.fields(DecodeBatch))


@dataclass
class ServerStats:
    """Per server: log line counts, its settings, and what the process and API sources saw.

    server_args: the settings from every source merged, newest source last (`args_by_source`
    keeps each one; a restart clears them). process: the last ProcessSample's process (None:
    not running); process_watched: the process source reports on this server. api: the last
    ApiSample; info: the last successful /server_info.
    """

    lines: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    server_args: ServerArgs | None = None
    args_by_source: dict[str, dict] = field(default_factory=dict)
    process: ServerProcess | None = None
    process_watched: bool = False
    restarts: int = 0
    api: ApiSample | None = None
    info: ServerInfo | None = None
    metrics: MetricsSample | None = None  # the last scrape of the engine's /metrics
    # replay: the last other lines read (their text; `Pipeline._last_lines` dates the last one
    # by its stamp when a rule asks), and their file's zone
    other_text: str | None = None
    other_tz: tzinfo | None = None
    # Error stage: LogError events by kind; the clock of the last line of each kind (KINDS + "error").
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ERROR_KINDS, 0))
    last_line: dict[str, float] = field(default_factory=dict)
    engine: str | None = None  # "sglang" or "vllm" as its process, API or /metrics last showed (`engine_seen`)


def engine_seen(event: object) -> str | None:
    """The engine ("sglang", "vllm") an event of the process, HTTP API or /metrics source shows
    its server runs (`ServerProcess.engine`, the API's or command line's `engine` setting,
    `MetricsSample.engine`), else None."""
    if isinstance(event, ProcessSample):
        return event.process.engine if event.process is not None else None
    if isinstance(event, ApiSample):
        return str(event.info.args.get("engine") or SGLANG) if event.info is not None else None
    if isinstance(event, MetricsSample):
        return event.engine
    if isinstance(event, ServerArgs) and event.args.get("engine"):
        return str(event.args["engine"])
    return None


def _snapshot(alert: Alert) -> Alert:
    """A firing alert as it is now (its evidence and annotations copied: a resolve adds to them)."""
    snap = copy.copy(alert)
    snap.evidence, snap.annotations = list(alert.evidence), dict(alert.annotations)
    return snap


class Pipeline:
    """Feed lines in; read `servers`, `ranks` and `dispatcher` out.

    `feed` is called from one thread (the followers' or replay's); scrapes read the state from
    another thread under `lock`.
    """

    def __init__(self, config: Config, dispatcher: Dispatcher, *, diagnosis_background: bool = True,
                 extra_rules: tuple[Rule, ...] = ()):
        self.config = config
        self.dispatcher = dispatcher
        self.diagnoser = None
        d = config.diagnosis
        if d.enabled:
            from specwatch.diagnosis import Diagnoser

            self.diagnoser = Diagnoser(draft=d.draft, target=d.target, sglang_root=d.sglang_root, vllm_root=d.vllm_root,
                                       timeout=d.timeout, background=diagnosis_background)
        if self.diagnoser is not None and d.draft:  # paths from the config: diagnose now
            for server in sorted({s.server for s in config.logs} or {config.server}):
                self.diagnoser.ensure(server)
        ctx = RuleContext(log_paths_of(config), self.diagnoser, self._last_lines)
        self.rules: list[Rule] = [cls.build(config, ctx) for cls in all_rules()] + list(extra_rules)
        self.collapse: CollapseRule = next(r for r in self.rules if isinstance(r, CollapseRule))  # metrics, replay
        # Each hook calls only the rules that have it (most rules ignore most events).
        self._on_event = [(r, overrides(r, "on_restart")) for r in self.rules
                          if overrides(r, "on_event") or overrides(r, "on_restart")]
        self._starts: dict[str, float] = {}  # server → timestamp of its last server_args log line
        # server → [clock of its last restart, clock a rank was first seen after it (None: not yet)]
        self._restarts: dict[str, list] = {}
        self._expiry_due = -math.inf  # the clock of the next look for gone ranks (`_expire_ranks`)
        self._on_tick = [r for r in self.rules if overrides(r, "on_tick")]
        self._wcfg = config.windows  # what makes a decode line a usable sample (rules/windows.py)
        self._on_lines = [r for r in self.rules if overrides(r, "on_lines")]
        self._tokens: dict[str, dict[str, RankSummary]] = {}  # server → rank token as read → its summary
        self._dirty: list[RankSummary] = []  # the ranks with pending lines, first first
        self._handed: list[Alert] | None = None  # during an evaluation: its transitions
        self._seq = 0  # batch lines summarised: each pending entry's place in file order
        self._evaluated = 0  # _seq at the last evaluation
        self._emitted: list[tuple] = []  # (seq, clock, alert, its firing snapshot) of this evaluation
        self.servers: dict[str, ServerStats] = {}
        self.ranks: dict[tuple[str, str], RankSummary] = {}
        self.rank_overflow: dict[str, int] = {}  # server → batch lines summed into OTHER_RANK
        self._full: set[str] = set()  # servers at limits.max_ranks_per_server: a new rank is OTHER_RANK
        self.scraped: dict[tuple[str, str], RankSummary] = {}  # ranks read from /metrics (`_take_scraped`)
        self.alert_state = AlertState(self.rules)  # a chart point's alert state (status page)
        self.lock = threading.Lock()
        self.rule_faults = RuleFaults()  # a rule that raises: counted, logged, its line's result dropped
        self._last_tick = -math.inf
        self._due_tick: float | None = None  # a live read's clock whose tick waits for its evaluation (`_decide`)
        self._groupers: dict[str, ErrorGrouper] = {}  # path → its traceback grouping (error stage)
        self._engines: dict[str, LogEngine] = {}  # path → its engine's grammar (specwatch/engines/__init__.py)
        self._vllm: dict[str, VllmAssembler] = {}  # server → its vLLM lines into decode batches
        self._path = ""  # the file being fed
        self._map_logs(config)

    def _map_logs(self, config: Config) -> None:
        # Replaced whole, not mutated: feed() on the followers' thread reads them without the lock.
        self._server_of = {src.path: src.server for src in config.logs}
        self._prefix = {src.path: re.compile(src.container_prefix) if src.container_prefix else None
                        for src in config.logs}
        self._tz: dict[str, tzinfo | None] = {src.path: ZoneInfo(src.timezone) if src.timezone else None for src in config.logs}
        self.clocks = LogClocks()  # re-learned under the new zones
        # `format: sglang`, or a grammar that rewrites lines into SGLang's form: the log is SGLang's
        self._sglang_form = {src.path for src in config.logs if src.grammar or src.envelope == "plain"}

    def reconfigure(self, config: Config, routing: Callable[[], Dispatcher] | None = None,
                    now: float | None = None) -> None:
        """A reloaded config: log → server mapping, container prefixes, time zones, rule
        thresholds and, with `routing`, the alert routing. `routing` builds a dispatcher from the
        new config (with its notifiers); it is called under the lock, before anything changes,
        so no alert reaches a notifier while they are swapped, and the current dispatcher adopts
        its routes, receivers, timers and inhibit rules (`Dispatcher.adopt`). Per-rank state,
        firing alerts and what was notified are kept. `now`: wall time (default: the clock)."""
        with self.lock:
            new_routing = routing() if routing is not None else None
            self.config = config
            self._map_logs(config)
            if new_routing is not None:
                self.dispatcher.adopt(new_routing, time.time() if now is None else now)
            self.evaluate()
            self._wcfg = config.windows
            self._full.clear()  # the limit may have changed: counted again at the next new rank
            for rule in self.rules:
                rule.reconfigure(config)

    def server_for(self, path: str) -> str:
        return self._server_of.get(path) or (self.config.logs[0].server if self.config.logs else "")

    def feed(self, line: LogLine, now: float | None = None) -> object:
        """Process one line. `now` is the clock for alert timing (None: the line's timestamp).

        Returns the parsed event. Never raises on input.
        """
        server = self.server_for(line.path)
        self._path = line.path  # names the file of an unrecognized line
        text = line.text
        prefix, tz = self._prefix.get(line.path), self._tz.get(line.path)
        engine = self._engine(line.path)
        event = self._parse(engine, text, line.raw_ok, prefix, tz) if engine.maybe_event(text) else _OTHER
        with self.lock:
            stats = self._stats(server)
            self._take(server, stats, event, now)
            grouper = self._grouper(line.path)
            if grouper.group is not None or type(event) is OtherLine and maybe_error(line.text):
                self._errors(server, stats, grouper, line.text, prefix, tz, now)
            if now is not None and type(event) in (OtherLine, ServerArgs):
                stats.last_line["other"] = now
            self._decide()  # one line: decided at it
        return event

    def feed_batch(self, batch: LineBatch, now: float | None = None) -> None:
        """The lines of one read (`Follower(on_lines=...)`), as `feed` would take them one by
        one, under one lock: `run` (`now`: the read's wall time) and `replay` (None: the lines'
        stamps). A live read ends with an evaluation (its collapse line is decided now), and all
        it hands the dispatcher goes out together (`Dispatcher.together`: 8 ranks collapsing,
        8 ranks' watchdog lines, one message); a replay's reads do not (where a read ends says
        nothing: the next line's tick decides). Never raises on input."""
        path = self._path = batch.path
        server = self.server_for(path)
        prefix, tz = self._prefix.get(path), self._tz.get(path)
        if now is not None and path not in self.clocks.offsets:  # the daemon's first read of it
            self.clocks.learn(path, server, tz)
        elif now is not None:  # a live read: its stamps still on the learned offset?
            self.clocks.follow(path, server, tz, last_line(batch), now)
        tz = self.clocks.zone(path, tz)
        raw_ok = batch.raw_ok
        engine = self._engine(path)
        with self.lock, self.dispatcher.together() if now is not None else contextlib.nullcontext():
            stats = self._stats(server)
            grouper = self._grouper(path)
            if prefix is None and raw_ok is None and engine.name != VLLM:
                other = self._scan(server, stats, grouper, engine, batch.text, tz, now)
            else:
                other = self._feed_lines(server, stats, grouper, engine, engine.maybe_event, batch.lines, raw_ok,
                                         prefix, tz, now)
            stats.lines["other"] += other
            if other and now is not None:  # the follower's clock: one stamp per read
                stats.last_line["other"] = now
            if now is not None:
                self._decide()
                self._collapse_evidence()

    def _decide(self) -> None:
        """The evaluation at the end of a live read (or line), then the tick that came due at its
        clock while it was read (`_summarise`)."""
        self.evaluate()
        if self._due_tick is not None:
            clock, self._due_tick = self._due_tick, None
            self.tick(clock)

    def _collapse_evidence(self) -> None:
        """Firing collapses' evidence up to their rank's last line (rebuilt lazily between
        reads: `CollapseRule.on_lines`): after each live read, and at the end of a replay."""
        self.collapse.firing_alerts()

    def _scan(self, server: str, stats: ServerStats, grouper: ErrorGrouper, engine: LogEngine, text: str, tz,
              now: float | None) -> int:
        """A read's text through the chunk scanner: its canonical SGLang batch lines
        (`CANONICAL_LINES`, found at C speed) to the summariser as records, the lines between them
        through `_feed_lines` where one may be an event (a batch line of another form, request
        text, `server_args`, an error; vLLM's lines while the engine is unknown), else counted as
        other lines. The same events as `_feed_lines` line by line; returns the other lines."""
        other = pos = 0
        records: list[tuple] = []
        add = records.append
        stamps: dict[str, float] = {}
        maybe = engine.maybe_event
        for m in CANONICAL_LINES.finditer(text):
            start = m.start()
            if start > pos or grouper.group is not None:
                gap = text[pos:start]
                if grouper.group is None and not maybe(gap) and not maybe_error(gap) and "]:[E" not in gap:
                    other += gap.count("\n")  # access log lines and the like: nothing to parse
                    if now is None:  # replay: dated by their own stamps if a rule asks (`_last_lines`)
                        add((0.0, None, None, 0, None, None, None, gap))
                else:
                    if records:
                        self._summarise(server, stats, records, now, tz)
                        records.clear()
                    if grouper.group is not None:  # an open traceback takes every line until it ends
                        return other + self._feed_lines(server, stats, grouper, engine, engine.maybe_event,
                                                        text[pos:-1].split("\n"), None, None, tz, now)
                    other += self._between(server, stats, grouper, engine, gap, tz, now)
                    if engine.name == VLLM:  # a vLLM log after all: its lines are no SGLang events
                        return other + self._feed_lines(server, stats, grouper, engine, engine.maybe_event,
                                                        text[start:-1].split("\n"), None, None, tz, now)
                    maybe = engine.maybe_event
            pos = m.end() + 1
            g = m.groups()
            ts = stamps.get(g[0]) if g[1] is None else None
            if ts is None:
                try:
                    ts = timestamp_of(g[0], g[1], tz)
                except ValueError:  # an impossible date: the general parser says why
                    if records:
                        self._summarise(server, stats, records, now, tz)
                        records.clear()
                    other += self._feed_lines(server, stats, grouper, engine, engine.maybe_event,
                                              [m.group(0)], None, None, tz, now)
                    continue
                if g[1] is None:
                    stamps[g[0]] = ts
            if g[3] is not None:
                add((ts, g[2], int(g[3]), int(g[10]), float(g[6]), float(g[9]), None, g))
            else:
                add((ts, g[2], None, 0, None, None, None, g))
        if records:
            self._summarise(server, stats, records, now, tz)
        if engine.name is None and pos:
            engine.settle("sglang")
        if pos < len(text):
            other += self._between(server, stats, grouper, engine, text[pos:], tz, now)
        return other

    def _between(self, server: str, stats: ServerStats, grouper: ErrorGrouper, engine: LogEngine, gap: str, tz,
                 now: float | None) -> int:
        """Whole lines between two canonical batch lines (`_scan`): the other lines among them."""
        if grouper.group is None and not engine.maybe_event(gap) and not maybe_error(gap) and "]:[E" not in gap:
            if now is None:  # replay: dated by their own stamps if a rule asks (`_last_lines`)
                stats.other_text, stats.other_tz = gap, tz
            return gap.count("\n")  # access log lines and the like: nothing to parse
        return self._feed_lines(server, stats, grouper, engine, engine.maybe_event, gap[:-1].split("\n"), None, None,
                                tz, now)

    def _feed_lines(self, server: str, stats: ServerStats, grouper: ErrorGrouper, engine: LogEngine,
                    maybe_event: Callable[[str], bool], lines: list[str], raw_ok: list[bool] | None,
                    prefix: re.Pattern | None, tz, now: float | None) -> int:
        """Lines one by one (caller holds `lock`; `maybe_event`: the engine's check when the read
        began); returns how many were other lines (the caller counts and stamps them)."""
        parse, take = self._parse, self._take
        other = 0
        for i, text in enumerate(lines):
            if not maybe_event(text):
                other += 1  # most non-batch lines: no parse, no event
                if now is None:
                    stats.other_text, stats.other_tz = text, tz
                if grouper.group is not None or maybe_error(text):
                    self._errors(server, stats, grouper, text, prefix, tz, now)
                continue
            event = parse(engine, text, raw_ok is None or raw_ok[i], prefix, tz)
            take(server, stats, event, now)
            if grouper.group is not None or type(event) is OtherLine and maybe_error(text):
                self._errors(server, stats, grouper, text, prefix, tz, now)
        return other

    # --- error stage: tracebacks grouped per file into LogError events (rules/log_errors.py) ---

    def _grouper(self, path: str) -> ErrorGrouper:
        g = self._groupers.get(path)
        if g is None:
            g = self._groupers[path] = ErrorGrouper(path, self._engine(path))
        return g

    def _engine(self, path: str) -> LogEngine:
        e = self._engines.get(path)
        if e is None:
            e = self._engines[path] = LogEngine("sglang" if path in self._sglang_form else None)
        return e

    def _errors(self, server: str, stats: ServerStats, grouper: ErrorGrouper, text: str,
                prefix: re.Pattern | None, tz, now: float | None) -> None:
        """One non-batch line (or any line while a group is open) through `grouper` (caller
        holds `lock`)."""
        if prefix is not None or text[:1] not in ("[", " ", ""):
            text = strip_container_prefix(text, prefix)
        dated = self._last_tick if now is None and self._last_tick > -math.inf else None  # a replay's clock: the year of a glog stamp
        for event in grouper.line(text, now, tz, dated):
            self._take_error(server, stats, event, now)

    def _take_error(self, server: str, stats: ServerStats, event: LogError, now: float | None) -> None:
        stats.errors[event.kind] = stats.errors.get(event.kind, 0) + 1
        clock = now if now is not None else event.timestamp
        ts, off = event.timestamp, self.clocks.offsets.get(event.path)
        if now is not None and ts is not None and 0 <= now - ts <= ERROR_STAMP_SLACK and not off:
            # dated by its own stamp where the stamps are the clock (a replay, or a live file whose
            # stamps follow the wall clock): not by the read or tick that ended its traceback
            clock = ts
        if clock is None:
            clock = self._last_tick if self._last_tick > -math.inf else 0.0
        stats.last_line["error"] = clock
        self._apply_rules(server, event, clock)

    def _expire_errors(self, now: float, flush: bool = False) -> None:
        for path, grouper in self._groupers.items():
            if grouper.group is not None:
                events = grouper.flush() if flush else grouper.expire(now)
                server = self.server_for(path)
                for event in events:
                    self._take_error(server, self._stats(server), event, now)

    def flush_errors(self) -> None:
        """Decide on every line read and end every open traceback (the end of a recorded log)."""
        with self.lock:
            self.evaluate()
            self._collapse_evidence()
            self._expire_errors(self._last_tick if self._last_tick > -math.inf else 0.0, flush=True)

    def _last_lines(self, server: str) -> dict[str, float]:
        """Clock of the last line of each kind from `server`'s logs (for rules; under `lock`)."""
        st = self.servers.get(server)
        if st is None:
            return {}
        if st.other_text is not None:  # replay: the last other line, by its own stamp
            text = st.other_text
            st.other_text = None
            at = text.rfind("\n[", 0, len(text) - 1)
            ts = bracket_prefix(text[at + 1:] if at >= 0 else text, st.other_tz)[0]
            if ts is not None and ts > st.last_line.get("other", -math.inf):
                st.last_line["other"] = ts
        return st.last_line

    @staticmethod
    def _parse(engine: LogEngine, text: str, raw_ok: bool, prefix: re.Pattern | None, tz) -> object:
        """A line that `engine.maybe_event` let through → its event (a batch line with non-UTF-8
        bytes is malformed)."""
        event = engine.parse_line(text, container_prefix=prefix, tz=tz)
        if not raw_ok and isinstance(event, (DecodeBatch, PrefillBatch)):
            event = MalformedLine("non-UTF-8 bytes in a batch line", event.timestamp, event.rank)
        return event

    def _stats(self, server: str) -> ServerStats:
        stats = self.servers.get(server)
        if stats is None:
            stats = self.servers[server] = ServerStats()
        return stats

    # --- the summariser: each batch line once (rules/summary.py) ---

    def _summarise(self, server: str, stats: ServerStats, records: list[tuple], now: float | None, tz=None) -> None:
        """Batch lines of `server`, either parser's, into their ranks' summaries (caller holds
        `lock`). A record: (ts, rank token, running, queued, accept, throughput, drafted, src):
        a decode line, or a prefill line when running is None (src: its event, or a canonical
        line's groups, whose rank token has its leading space); rank token None: other lines of a
        replay (src: their text, dated by the file's zone `tz` if a rule asks). Per line only what needs the line:
        its window (`rules/windows.py`, inline) and its pending entry; the rank's counters are
        summed at the evaluation. The evaluation and tick due at a line's clock run there."""
        ranks = self._tokens.get(server)
        if ranks is None:
            ranks = self._tokens[server] = {}
        cfg = self._wcfg
        min_running, max_prefills, max_gap = cfg.min_running_requests, cfg.max_prefill_batches, cfg.max_gap
        dirty = self._dirty
        seq = self._seq
        decodes = prefills = 0
        # a replay's clock is each line's stamp, set at the line before any use; a kind's last
        # clock is read only once a line of it was counted (`_count`)
        clock = -math.inf if now is None else now
        last_decode = last_prefill = -math.inf
        for ts, token, running, queued, accept, thr, drafted, src in records:
            rs = ranks.get(token)
            if rs is None:
                if token is None:
                    stats.other_text, stats.other_tz = src, tz
                    continue
                rs = self._rank_of(server, token, src)
            if now is None:
                clock = ts
            seq += 1
            if running is None:  # a prefill line
                prefills += 1
                last_prefill = clock
                rs.prefills += 1
                if not rs.pending and not rs.pending_prefills:
                    dirty.append(rs)
                rs.pending_prefills.append((ts, clock, seq, src))
            else:
                decodes += 1
                last_decode = clock
                prev = rs.last_ts
                rs.last_ts = ts
                flags = 0
                if (max(running, 1) if drafted else running) < min_running:  # `running_in_window`
                    flags = IDLE
                if rs.prefills:
                    if rs.prefills > max_prefills:
                        flags |= PREFILL_DOMINATED
                    rs.prefills = 0
                if prev is None or ts - prev > max_gap:
                    flags |= AFTER_GAP
                if not flags & (IDLE | PREFILL_DOMINATED):
                    if accept is not None:
                        flags |= VALID_ACCEPT
                    if thr is not None and not flags & AFTER_GAP:
                        flags |= VALID_THROUGHPUT
                entry = (ts, clock, accept, running, queued, thr, flags, src, seq)
                pending = rs.pending
                if not pending and not rs.pending_prefills:
                    dirty.append(rs)
                pending.append(entry)
                rs._last, rs._last_batch = entry, None
            due = clock - self._last_tick >= 1.0
            if due and now is not None:
                # a live read's lines share its clock: the tick due at its first line runs after
                # the read's one evaluation (`_decide`), not after an evaluation of that line alone
                self._due_tick = clock
                due = False
            if due or seq - self._evaluated >= EVALUATE_LINES:
                self._count(stats, decodes, prefills, last_decode, last_prefill)
                decodes = prefills = 0
                last_decode = last_prefill = -math.inf
                self._seq = seq
                self.evaluate()
                if due:  # time-based rules need no finer clock
                    self.tick(clock)
        self._seq = seq
        self._count(stats, decodes, prefills, last_decode, last_prefill)

    @staticmethod
    def _count(stats: ServerStats, decodes: int, prefills: int, last_decode: float, last_prefill: float) -> None:
        lines = stats.lines
        if decodes:
            lines["decode"] += decodes
            stats.last_line["decode"] = last_decode
        if prefills:
            lines["prefill"] += prefills
            stats.last_line["prefill"] = last_prefill

    def _rank_of(self, server: str, token: str, src) -> RankSummary:
        """The summary of the rank a batch line names (`token`: a canonical line's rank group,
        with its leading space, or an event's rank), kept by token unless summed into OTHER_RANK
        (each such line is counted: `_rank`)."""
        rank = token[1:] if type(src) is tuple else token
        rs = self.ranks.get((server, rank))
        if rs is None:
            rs = self._rank(server, rank, src)
        if rs.rank == rank:
            self._tokens[server][token] = rs
        return rs

    def evaluate(self) -> None:
        """The rules read every line summarised since the last evaluation (caller holds `lock`):
        each rule's `on_lines` the pending lines of each rank of a server (docs/one-path.md)."""
        if not self._dirty:
            return
        self._evaluated = self._seq
        dirty = self._dirty[:]
        self._dirty.clear()  # in place: the summariser's loop holds it
        handed = self._handed = []  # the transitions of this evaluation (`_points`)
        clock = -math.inf
        for rs in dirty:  # the ranks' counters, summed here once
            pending = rs.pending
            if pending:
                rs.sum0, rs.count0 = rs.accept_length_sum, rs.accept_length_count
                accepts = [e[2] for e in pending if e[2] is not None]
                if accepts:  # `sum` adds left to right: the same float sum as one line at a time
                    rs.accept_length_sum = sum(accepts, rs.accept_length_sum)
                    rs.accept_length_count += len(accepts)
                    rs.accept_length_min = min(rs.accept_length_min, min(accepts))
                    rs.accept_length_max = max(rs.accept_length_max, max(accepts))
                rs.decode_batches += len(pending)
                clock = max(clock, pending[-1][1])
                rs.seen = pending[-1][1]
            if rs.pending_prefills:
                rs.prefill_batches += len(rs.pending_prefills)
                clock = max(clock, rs.pending_prefills[-1][1])
                if rs.seen is None or rs.pending_prefills[-1][1] > rs.seen:
                    rs.seen = rs.pending_prefills[-1][1]
        if self._on_lines:
            by_server: dict[str, list[RankSummary]] = {}
            for rs in dirty:
                by_server.setdefault(rs.server, []).append(rs)
            emit = self._emit
            for server, ranks in by_server.items():
                for rule in self._on_lines:
                    try:
                        alerts = rule.on_lines(server, ranks, emit)
                    except Exception as e:  # that rule, those lines: the read goes on
                        self.rule_faults.failed(rule, "on_lines", e)
                        continue
                    if alerts:
                        self._emitted.extend((math.inf, clock, a, None) for a in alerts)
            if self._emitted:  # one batch: ranks that collapse in one read share a message
                with self.dispatcher.together():
                    self._hand_over()
        self._handed = None
        for rs in dirty:
            if rs.pending:
                self._points(rs, handed)
                rs.pending.clear()
            rs.pending_prefills.clear()

    def _points(self, rs: RankSummary, handed: list[Alert]) -> None:
        """The status chart's points among a rank's pending lines (`AcceptHistory`: one per STEP
        s), each with the rank's alert state at its line: the state after the evaluation, less
        the transitions of this evaluation that came after the line (`handed`, by their
        starts_at / ends_at)."""
        h = rs.history
        pending = rs.pending
        if len(pending) == 1:
            if h.floor <= pending[0][0] < h.due:
                return
        elif h.floor <= min(e[0] for e in pending) and max(e[0] for e in pending) < h.due:
            return  # no point due among them (the common case)
        total, count = rs.sum0, rs.count0
        state = None
        mine = [a for a in handed if a.labels.get("rank", "") == rs.rank and a.labels.get("server") == rs.server]
        for entry in pending:
            a = entry[2]
            if a is None:
                continue
            total += a  # in line order, as `add_accept` summed them
            count += 1
            ts = entry[0]
            if not h.floor <= ts < h.due:  # one point per STEP s, or time went back
                if state is None:
                    state = self.alert_state(rs.server, rs.rank)
                h.add(ts, a, total, count, self.alert_state.before(state, mine, ts) if mine else state)

    def _emit(self, alerts: list[Alert], entry: tuple) -> None:
        """`on_lines`' transitions at the line of pending `entry` (its clock at [1], its seq
        last): kept until the evaluation ends, a firing one as it is now (it may resolve later in
        the same evaluation: one object)."""
        for a in alerts:
            self._emitted.append((entry[-1], entry[1], a, _snapshot(a) if a.status == FIRING else None))

    def _hand_over(self) -> None:
        """The evaluation's transitions to the dispatcher, line by line in file order (those of
        one line together, in rule order: an alert that mutes another of its line is there
        before either is sent)."""
        emitted = self._emitted
        if not emitted:
            return
        self._emitted = []
        emitted.sort(key=lambda x: x[0])  # stable: rule order within a line
        last = {id(a): i for i, (_, _, a, _) in enumerate(emitted)}
        group: list[Alert] = []
        for i, (seq, clock, alert, snapshot) in enumerate(emitted):
            group.append(snapshot if snapshot is not None and last[id(alert)] != i else alert)
            if i + 1 == len(emitted) or emitted[i + 1][0] != seq:
                self._handle(group, clock)
                group = []

    def _take(self, server: str, stats: ServerStats, event: object, now: float | None) -> None:
        """One parsed line of `server` (caller holds `lock`)."""
        if type(event) is DecodeBatch:
            self._summarise(server, stats, [(event.timestamp, event.rank, event.running_requests, event.queued_requests,
                                             event.accept_length, event.gen_throughput, event.draft_tokens, event)], now)
        elif type(event) is PrefillBatch:
            self._summarise(server, stats, [(event.timestamp, event.rank, None, 0, None, None, None, event)], now)
        elif isinstance(event, ServerArgs):
            stats.lines["other"] += 1
            merged = self._merge_args(stats, event)
            if self.diagnoser is not None:  # run the probes ahead of any collapse
                self.diagnoser.observe(server, merged.args)
            clock = now if now is not None else event.timestamp
            self._apply_rules(server, merged, clock if clock is not None else 0.0)
            if clock is not None and clock - self._last_tick >= 1.0:
                self.tick(clock)
        elif isinstance(event, MalformedLine):
            stats.lines["malformed"] += 1
            clock = now if now is not None else event.timestamp
            if clock is not None:
                stats.last_line["malformed"] = clock
        elif type(event) is UnrecognizedLine:  # counted and alerted (log_format), never "other"
            stats.lines["unrecognized"] += 1
            clock = now if now is not None else event.timestamp or max(self._last_tick, 0.0)
            self._apply_rules(server, UnrecognizedLine(event.text, self._path, event.timestamp), clock)
        elif isinstance(event, VllmLine):  # vLLM: the assembler pairs stats and spec lines into decode batches
            asm = self._vllm.get(server)
            if asm is None:  # resuming past the engine-config line: the saved settings say k and DP
                asm = self._vllm[server] = VllmAssembler().configure(self.collapse.settings(server))
            out = asm.take(event)
            if not out:
                stats.lines["other"] += 1
            for e in out:
                self._take(server, stats, e, now)
        else:
            stats.lines["other"] += 1

    def feed_event(self, server: str, event: object, now: float) -> None:
        """An event from a source other than the log (process, HTTP API, GPU); `now` is wall
        time. Records what the metrics show, then runs the rules. Never raises on input."""
        with self.lock:
            stats = self._stats(server)
            stats.engine = engine_seen(event) or stats.engine
            if isinstance(event, ServerArgs):
                event = self._merge_args(stats, event)
                if self.diagnoser is not None:
                    self.diagnoser.observe(server, event.args)
            elif isinstance(event, ProcessSample) and event.process is None and not event.expected:
                del self.servers[server]  # an unconfigured server that exited is forgotten (sources/process.py)
            elif isinstance(event, ProcessSample):
                stats.process = event.process
                stats.process_watched = event.process is not None or event.expected
                proc = event.process
                if self.diagnoser is not None and proc is not None and proc.sglang_location and event.expected:
                    site = os.path.join(proc.fs_root, proc.sglang_location.lstrip("/"))
                    self.diagnoser.observe_install(server, site)
            elif isinstance(event, ServerRestarted) or (isinstance(event, ServerStarted) and not event.first_seen):
                if isinstance(event, ServerRestarted):
                    stats.restarts += 1
                stats.args_by_source.clear()  # the settings of the old process no longer hold
            elif isinstance(event, ApiSample):
                stats.api = event
                if event.info is not None:
                    stats.info = event.info
            elif isinstance(event, MetricsSample):
                stats.metrics = event
                self._take_scraped(server, event)
            self._apply_rules(server, event, now)

    def _take_scraped(self, server: str, sample: MetricsSample) -> None:
        """Each fresh rank sample of a scrape as a decode line of a rank in `scraped` (the status
        page's ranks and charts from /metrics; the log's ranks stay in `ranks`). Under `lock`."""
        for _, window in metrics_windows(sample, self.config.windows):
            b = window.batch
            rs = self.scraped.get((server, b.rank))
            if rs is None:
                rs = self.scraped[(server, b.rank)] = RankSummary(server, b.rank, dict(b.ranks))
            rs.decode_batches += 1
            rs.last_decode = b
            accept = b.accept_length
            assert accept is not None  # metrics_windows yields the ranks with one
            rs.add_accept(accept)
            if not rs.history.floor <= b.timestamp < rs.history.due:
                rs.history.add(b.timestamp, accept, rs.accept_length_sum, rs.accept_length_count,
                               self.alert_state(server, b.rank))

    @staticmethod
    def _merge_args(stats: ServerStats, event: ServerArgs) -> ServerArgs:
        """Merge settings from the command line (as typed: first), then the log line and
        /server_info (resolved values), the newer of those two last."""
        stats.args_by_source.pop(event.source, None)
        stats.args_by_source[event.source] = dict(event.args)
        merged: dict[str, object] = dict(stats.args_by_source.get("cmdline", {}))
        for source, args in stats.args_by_source.items():
            if source != "cmdline":
                merged.update(args)
        stats.server_args = ServerArgs(event.timestamp, merged, event.source)
        return stats.server_args

    @property
    def last_tick(self) -> float:
        """The clock of the last tick (the caller's wall time, a replayed line's stamp; -inf)."""
        return self._last_tick

    def tick(self, now: float) -> None:
        """Let time-based rules and alert repeats advance to `now` (seconds; caller holds `lock`)."""
        self.evaluate()
        self._last_tick = now
        if self._groupers:
            self._expire_errors(now)
        if now >= self._expiry_due:
            self._expiry_due = now + RANK_EXPIRY_EVERY
            self._expire_ranks(now)
        for rule in self._on_tick:
            alerts = self.rule_faults.call(rule, "on_tick", now)
            if alerts:  # rarely
                self._handle(alerts, now)
        self.dispatcher.tick(now)

    def _expire_ranks(self, now: float) -> None:
        """Forget the ranks that are gone (caller holds `lock`): a rank whose server printed batch
        lines for `limits.rank_expiry` without it (one garbage line's rank), and after a restart
        each rank of the old process that the new one has not printed within
        `rules.windows.max_gap` of its first line (a DP rank the restart dropped). A server that
        went quiet keeps its ranks (the stall and silence rules speak of them)."""
        by_server: dict[str, list[tuple[float, RankSummary]]] = {}  # (when last seen, rank)
        for rs in self.ranks.values():
            if rs.seen is None:
                rs.seen = now  # restored from the saved state: its clock starts now
            by_server.setdefault(rs.server, []).append((rs.seen, rs))
        expiry, max_gap = self.config.limits.rank_expiry, self.config.windows.max_gap
        for server, ranks in by_server.items():
            latest = max(seen for seen, _ in ranks)
            gone = [rs for seen, rs in ranks if latest - seen > expiry]
            restart = self._restarts.get(server)
            if restart is not None:
                if restart[1] is None and latest >= restart[0]:
                    restart[1] = now  # the new process prints
                if restart[1] is not None:
                    if latest - restart[1] > max_gap:
                        gone += [rs for seen, rs in ranks if seen < restart[0] and rs not in gone]
                        del self._restarts[server]
            for rs in gone:
                self._forget_rank(rs, now)

    def _forget_rank(self, rs: RankSummary, now: float) -> None:
        why = "the rank is gone: no batch line from it while the server printed others"
        log.info("server %s: rank %s forgotten (%s)", rs.server or "(default)", rs.rank, why)
        akey = alert_key(rs.server, rs.rank)
        for rule in self.rules:
            active = getattr(rule, "active", None)
            if active is not None:  # the rank's alerts: keyed alert_key(server, rank, ...)
                for key in [k for k in active.keys() if k == akey or k.startswith(akey + "|")]:
                    self._handle(active.resolve(key, now, ("resolved because", why)), now)
            self._handle(self.rule_faults.call(rule, "forget_rank", rs.server, rs.rank, now, why, default=()), now)
        del self.ranks[rs.key]
        tokens = self._tokens.get(rs.server, {})
        for token in [t for t, r in tokens.items() if r is rs]:
            del tokens[token]
        self._full.discard(rs.server)

    def _apply_rules(self, server: str, event: object, now: float) -> None:
        self.evaluate()  # the lines before the event first
        why = self._restarted(server, event)
        at = getattr(event, "timestamp", None) or now
        if why:
            self._restarts[server] = [now, None]
        for rule, restarts in self._on_event:
            if why and restarts:
                self._handle(self.rule_faults.call(rule, "on_restart", server, at, why, default=()), now)
            alerts = self.rule_faults.call(rule, "on_event", server, event, now)
            if alerts:  # rarely: most calls return [] (cheaper to test than to iterate)
                self._handle(alerts, now)

    def _restarted(self, server: str, event: object) -> str | None:
        """Why `event` says the server restarted, else None: the one decision every rule's
        `on_restart` gets. A `server_args` log line is a (re)start; it is a restart when the
        server printed an earlier one or lines before it. Settings from the HTTP API or the
        command line are re-sent whenever specwatch starts or a poll sees them change: they prove
        nothing. The process source says so itself (`ServerRestarted`, or `ServerStarted` after
        the server was down)."""
        if isinstance(event, ServerArgs):
            if event.source != "log" or event.timestamp is None:
                return None
            old = self._starts.get(server)
            self._starts[server] = event.timestamp
            if old is not None and old != event.timestamp or old is None and any(k[0] == server for k in self.ranks):
                return "the server restarted (new server_args line)"
            return None
        return "the server process restarted" if is_restart_event(event) else None

    def forget_server(self, server: str, now: float, why: str) -> None:
        """A server nothing reports on any more (its log's directory is gone: a deleted pod or
        container): each rule forgets it as at a restart, every alert of the server still firing
        resolves with `why` in its evidence, and its counts and ranks leave /metrics and the
        status page. A rollout names every new pod anew, so without this each fixed collapse
        would stay firing (and be repeated) for good."""
        with self.lock:
            self.evaluate()
            for rule in self.rules:
                alerts = rule.on_restart(server, now, why) if overrides(rule, "on_restart") else []
                active = getattr(rule, "active", None)
                if active is not None:
                    alerts += active.resolve_server(server, now, ("resolved because", why))
                self._handle(alerts, now)
            for rule in self.rules:
                rule.forget(server)
            forget_keys((self.ranks, self.scraped, self.servers, self._starts, self._vllm, self._tokens), server)
            self._full.discard(server)

    def log_ports(self) -> dict[int, str]:
        """{port: server} for each followed log's server: the `port` of its log's `server_args`
        line, else of its last settings (kept across specwatch restarts). The process source
        ties a launcher with that `--port` to the log's server where it cannot read the
        launcher's fds (another user's process)."""
        with self.lock:
            out: dict[int, str] = {}
            for server in sorted({s.server for s in self.config.logs}):
                st = self.servers.get(server)
                port = (st.args_by_source.get("log", {}) if st else {}).get("port")
                if not isinstance(port, int):
                    port = self.collapse.settings(server).get("port")
                if isinstance(port, int):
                    out.setdefault(port, server)
            return out

    def servers_with_alerts(self) -> set[str]:
        """The `server` labels of the alerts the rules hold firing (restored ones included)."""
        with self.lock:
            return {a.labels.get("server", "") for r in self.rules for a in r.firing_alerts()}

    def _handle(self, alerts: list, now: float) -> None:
        if self._handed is not None:
            self._handed += alerts
        for alert in alerts:
            if "engine" not in alert.labels:
                self._label_engine(alert)
            if alert.name in TREND_ALERTS and alert.status == FIRING and TREND_KEY not in alert.annotations:
                self._add_trend(alert)
            self.dispatcher.handle(alert, now, flush=False)
        # Flushed once all are in: an alert that mutes another of the same line (a rank
        # disagreement its rank's collapse) is there before either is sent, even at group_wait 0.
        self.dispatcher.flush_due(now)

    def engine_of(self, server: str) -> str:
        """The engine `server` was seen to run: "vllm" or "sglang", from its process, HTTP API or
        /metrics (`ServerStats.engine`), else from the grammar its followed logs were read with
        (or the header of their error lines: `ErrorGrouper.engine`).
        One nothing was seen of (the box of a GPU alert, a declared server never seen) gets the
        engine the servers seen all run. "sglang" until any of them said."""
        seen = self._engine_seen(server)
        if seen is None:
            engines = {e for s in self.servers if (e := self._engine_seen(s))}
            engines.update(e.name for e in self._engines.values() if e.name)
            seen = engines.pop() if len(engines) == 1 else None
        return seen or SGLANG

    def _engine_seen(self, server: str) -> str | None:
        st = self.servers.get(server)
        if st is not None and st.engine:
            return st.engine
        logs = [(path, e.name) for path, e in self._engines.items()] + [(p, g.engine) for p, g in self._groupers.items()]
        return next((name for path, name in logs if name and self.server_for(path) == server), None)

    def _label_engine(self, alert: Alert) -> None:
        """Give a rule's alert its server's `engine` label before the dispatcher first sees it
        (the label is part of its identity: the same object keeps it through updates and its
        resolve). An alert the dispatcher holds firing without one (restored from a state saved
        before the label existed) keeps its labels until it resolves."""
        held = self.dispatcher.alerts.get(alert.fingerprint)
        if held is None or (held is not alert and held.status != FIRING):
            alert.labels["engine"] = self.engine_of(alert.labels.get("server", ""))

    def _add_trend(self, alert: Alert) -> None:
        """Annotate a rank's acceptance alert, when it first fires, with the rank's recent accept
        length (`accept_length_recent`: the status history's 10 s means, the mean since its
        last point, then the accept len of the rank's last line, the one that fired; oldest first,
        space-separated) and the server's lowest and highest rank by
        their last decode line (`accept_length_ranks`): Slack draws them as a sparkline."""
        server, rank = alert.labels.get("server", ""), alert.labels.get("rank", "")
        rs = self.ranks.get((server, rank))
        if rs is None:
            return
        values = [v for _, v, _ in rs.history.points]
        last = rs.last_decode.accept_length if rs.last_decode is not None else None
        if last is None:
            pending = rs.history.pending(rs.accept_length_sum, rs.accept_length_count)
        else:  # the rank's last line (the one that fired) is the last point, out of the pending mean
            pending = rs.history.pending(rs.accept_length_sum - last, rs.accept_length_count - 1)
        if pending is not None:
            values.append(pending)
        if last is not None:
            values.append(last)
        if values:
            alert.annotations[TREND_KEY] = " ".join(f"{v:.2f}" for v in values[-TREND_POINTS:])
        peers = sorted((r.last_decode.accept_length, r.rank) for r in self.ranks.values()
                       if r.server == server and r.last_decode is not None and r.last_decode.accept_length is not None)
        if len(peers) > 1:
            (lo, lo_rank), (hi, hi_rank) = peers[0], peers[-1]
            alert.annotations["accept_length_ranks"] = f"lowest {lo_rank} {lo:.2f}, highest {hi_rank} {hi:.2f}"

    def _rank(self, server: str, rank: str, src) -> RankSummary:
        """The summary of a new rank of a batch line (`src`: its event, or a canonical line's
        groups). A new rank past `limits.max_ranks_per_server` of the server is OTHER_RANK (its
        lines are counted in `rank_overflow`, the first warned about): rules and /metrics see
        its lines as that rank's."""
        limit = self.config.limits.max_ranks_per_server
        if server not in self._full and sum(1 for s, r in self.ranks if s == server and r != OTHER_RANK) >= limit:
            self._full.add(server)
        if server in self._full and rank != OTHER_RANK:
            n = self.rank_overflow.get(server, 0)
            if not n:
                log.warning("server %s: more than %d distinct ranks in its logs (limits.max_ranks_per_server): "
                            "lines of %r and any further rank are summed into rank %r "
                            "(specwatch_rank_overflow_lines_total)", server or "(default)", limit, rank, OTHER_RANK)
            self.rank_overflow[server] = n + 1
            rs = self.ranks.get((server, OTHER_RANK))
            if rs is None:
                rs = self.ranks[(server, OTHER_RANK)] = RankSummary(server, OTHER_RANK, {})
            return rs
        ranks = dict(src.ranks) if type(src) is not tuple else dict(rank_numbers(rank))
        rs = self.ranks[(server, rank)] = RankSummary(server, rank, ranks)
        return rs

    def to_state(self) -> dict:
        """Rule and alert state, and each rank's last decode line (caller holds `lock`)."""
        return {"rules": {r.name: r.to_state() for r in self.rules}, "dispatcher": self.dispatcher.to_state(),
                "last_decode": [{"server": rs.server, "rank": rs.rank, "ranks": rs.ranks,
                                 "batch": {f: getattr(rs.last_decode, f) for f in _DECODE_FIELDS}}
                                for rs in self.ranks.values() if rs.last_decode is not None],
                "starts": dict(self._starts), "counters": self._counters()}

    def _counters(self) -> dict:
        """The line, error and batch counters, saved with the offsets they count up to (a restart neither loses nor recounts them)."""
        finite = lambda v: v if math.isfinite(v) else None  # noqa: E731
        return {"lines": {server: dict(st.lines) for server, st in self.servers.items()},
                "errors": {server: dict(st.errors) for server, st in self.servers.items()},
                "ranks": [[rs.server, rs.rank, rs.ranks, rs.decode_batches, rs.prefill_batches, rs.accept_length_sum,
                           rs.accept_length_count, finite(rs.accept_length_min), finite(rs.accept_length_max)]
                          for rs in self.ranks.values()]}

    def _load_counters(self, saved: dict, servers: set[str]) -> None:
        for server, lines in (saved.get("lines") or {}).items():
            if server in servers:
                self._stats(server).lines.update({k: int(v) for k, v in lines.items() if k in KINDS})
        for server, errors in (saved.get("errors") or {}).items():
            if server in servers:
                self._stats(server).errors.update({k: int(v) for k, v in errors.items() if k in ERROR_KINDS})
        for entry in saved.get("ranks") or []:
            try:
                server, rank, ranks, dec, pre, total, count, lo, hi = entry
                if server not in servers:
                    continue
                rs = self.ranks.get((server, rank)) or RankSummary(server, rank,
                                                                   {str(k): int(v) for k, v in ranks.items()})
                rs.decode_batches, rs.prefill_batches = int(dec), int(pre)
                rs.accept_length_sum, rs.accept_length_count = float(total), int(count)
                rs.accept_length_min = math.inf if lo is None else float(lo)
                rs.accept_length_max = -math.inf if hi is None else float(hi)
                self.ranks[(server, rank)] = rs
            except (TypeError, ValueError, AttributeError):
                continue

    def load_state(self, state: dict) -> None:
        """Restore `to_state`. Each rank's last decode line comes back (for the gauges of the
        last line: a restart does not blank `specwatch_accept_length` while an alert built on it
        fires; `specwatch_last_decode_batch_timestamp_seconds` keeps its age) for the servers of
        the configured logs only, with the line and batch counters (which go on from the saved
        values: they count the lines before the saved offsets). An entry that does not read is
        skipped."""
        servers = {src.server for src in self.config.logs} or {self.config.server}
        names = {f.name for f in dataclasses.fields(DecodeBatch)}
        with self.lock:
            for d in state.get("last_decode", []):
                try:
                    if d["server"] not in servers:
                        continue
                    batch = DecodeBatch(**{k: v for k, v in d["batch"].items() if k in names})
                    key = (str(d["server"]), str(d["rank"]))
                    rs = self.ranks[key] = RankSummary(key[0], key[1], {str(k): int(v) for k, v in d["ranks"].items()})
                    rs.last_decode = batch
                except (KeyError, TypeError, ValueError, AttributeError):
                    continue
            self._load_counters(state.get("counters") or {}, servers)
            rules = state.get("rules", {})
            for r in self.rules:
                r.load_state(rules.get(r.name, {}))
            # State of 0.1.0 kept the last start per rule (`args.stamp`).
            for saved in [state.get("starts") or {}] + [s.get("args", {}).get("stamp") or {} for s in rules.values()]:
                for server, ts in saved.items():
                    if ts is not None:
                        self._starts.setdefault(server, ts)
            self.dispatcher.load_state(state.get("dispatcher", {}))
            # One object per firing alert again: the rule's (whose evidence it keeps current),
            # not the dispatcher's own copy from the state file, so repeats show today's numbers.
            for r in self.rules:
                for alert in r.firing_alerts():
                    if alert.fingerprint in self.dispatcher.alerts:
                        self.dispatcher.alerts[alert.fingerprint] = alert
