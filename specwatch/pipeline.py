"""One pipeline for `run` and `replay`: line → event → per-rank state and rules → alerts.

The two commands differ only in where lines come from (followed files vs recorded logs) and in
the clock (wall time vs the log's own timestamps). The per-rank state kept here is what
`metrics.py` renders at scrape time, so the hot path does plain attribute updates only.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from zoneinfo import ZoneInfo
from dataclasses import dataclass, field
from typing import Callable

from specwatch.alerts.dispatcher import Dispatcher
from specwatch.config import Config
from specwatch.events import (
    ApiSample,
    DecodeBatch,
    LogLine,
    MalformedLine,
    OtherLine,
    PrefillBatch,
    ProcessSample,
    ServerArgs,
    ServerInfo,
    ServerProcess,
    ServerRestarted,
    ServerStarted,
)
from specwatch.rules.base import Rule, log_paths_of
from specwatch.rules.collapse import CollapseRule
from specwatch.rules.degradation import DegradationRule
from specwatch.rules.drift import DriftRule
from specwatch.rules.gpu_errors import GpuErrorsRule
from specwatch.rules.gpu_throttle import GpuThrottleRule
from specwatch.rules.log_silent import LogSilentRule
from specwatch.rules.rank_disagreement import RankDisagreementRule
from specwatch.rules.server_state import ServerStateRule, Watching
from specwatch.rules.spec_inactive import SpeculationInactiveRule
from specwatch.rules.spec_missing import SpecMetricsMissingRule
from specwatch.rules.throughput import ThroughputDropRule
from specwatch.sources.sglang_log import parse_line

KINDS = ("decode", "prefill", "other", "malformed")


@dataclass
class RankStats:
    """Everything specwatch knows about one (server, rank) from its batch lines."""

    server: str
    rank: str
    ranks: dict[str, int]
    decode_batches: int = 0
    prefill_batches: int = 0
    last_decode: DecodeBatch | None = None
    last_prefill: PrefillBatch | None = None
    accept_length_sum: float = 0.0
    accept_length_count: int = 0
    accept_length_min: float = math.inf
    accept_length_max: float = -math.inf


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
    last_malformed_reason: str | None = None
    args_by_source: dict[str, dict] = field(default_factory=dict)
    process: ServerProcess | None = None
    process_watched: bool = False
    restarts: int = 0
    api: ApiSample | None = None
    info: ServerInfo | None = None


class Pipeline:
    """Feed lines in; read `servers`, `ranks` and `dispatcher` out.

    `feed` is called from one thread (the followers' or replay's); scrapes read the state from
    another thread under `lock`.
    """

    def __init__(self, config: Config, dispatcher: Dispatcher, *, diagnosis_background: bool = True):
        self.config = config
        self.dispatcher = dispatcher
        self.diagnoser = None
        d = config.diagnosis
        if d.enabled:
            from specwatch.diagnosis import Diagnoser

            self.diagnoser = Diagnoser(draft=d.draft, target=d.target, sglang_root=d.sglang_root,
                                       timeout=d.timeout, background=diagnosis_background)
        self.collapse = CollapseRule(config.collapse, config.windows, diagnoser=self.diagnoser)
        if self.diagnoser is not None and d.draft:  # paths from the config: diagnose now
            for server in sorted({s.server for s in config.logs} or {config.server}):
                self.diagnoser.ensure(server)
        log_paths = log_paths_of(config)
        self.rules: list[Rule] = [
            self.collapse,
            ServerStateRule(config.server_rule, log_paths, Watching.of(config)),
            LogSilentRule(config.log_silent, log_paths),
            GpuErrorsRule(config.gpu_errors),
            GpuThrottleRule(config.gpu_throttle),
            DegradationRule(config.degradation, config.windows, config.collapse),
            DriftRule(config.drift, config.windows, config.collapse),
            SpeculationInactiveRule(config.speculation_inactive),
            SpecMetricsMissingRule(config.spec_metrics_missing),
            ThroughputDropRule(config.throughput_drop, config.windows),
            RankDisagreementRule(config.rank_disagreement, config.windows),
        ]
        self.servers: dict[str, ServerStats] = {}
        self.ranks: dict[tuple[str, str], RankStats] = {}
        self.lock = threading.Lock()
        self._last_tick = -math.inf
        self._map_logs(config)

    def _map_logs(self, config: Config) -> None:
        # Replaced whole, not mutated: feed() on the followers' thread reads them without the lock.
        self._server_of = {src.path: src.server for src in config.logs}
        self._prefix = {src.path: re.compile(src.container_prefix) if src.container_prefix else None
                        for src in config.logs}
        self._tz = {src.path: ZoneInfo(src.timezone) if src.timezone else None for src in config.logs}

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
            for rule in self.rules:
                rule.reconfigure(config)

    def server_for(self, path: str) -> str:
        return self._server_of.get(path) or (self.config.logs[0].server if self.config.logs else "")

    def feed(self, line: LogLine, now: float | None = None) -> object:
        """Process one line. `now` is the clock for alert timing (None: the line's timestamp).

        Returns the parsed event. Never raises on input.
        """
        server = self.server_for(line.path)
        event = parse_line(line.text, container_prefix=self._prefix.get(line.path), tz=self._tz.get(line.path))
        if not line.raw_ok and isinstance(event, (DecodeBatch, PrefillBatch)):
            event = MalformedLine("non-UTF-8 bytes in a batch line", event.timestamp, event.rank)
        with self.lock:
            stats = self.servers.get(server)
            if stats is None:
                stats = self.servers[server] = ServerStats()
            if type(event) is OtherLine:
                stats.lines["other"] += 1
                return event
            if isinstance(event, DecodeBatch):
                stats.lines["decode"] += 1
                rs = self._rank(server, event)
                rs.decode_batches += 1
                rs.last_decode = event
                if event.accept_length is not None:
                    a = event.accept_length
                    rs.accept_length_sum += a
                    rs.accept_length_count += 1
                    if a < rs.accept_length_min:
                        rs.accept_length_min = a
                    if a > rs.accept_length_max:
                        rs.accept_length_max = a
                clock = event.timestamp if now is None else now
                self._apply_rules(server, event, clock)
                if clock - self._last_tick >= 1.0:  # time-based rules need no finer clock
                    self.tick(clock)
            elif isinstance(event, PrefillBatch):
                stats.lines["prefill"] += 1
                rs = self._rank(server, event)
                rs.prefill_batches += 1
                rs.last_prefill = event
                clock = event.timestamp if now is None else now
                self._apply_rules(server, event, clock)
                if clock - self._last_tick >= 1.0:
                    self.tick(clock)
            elif isinstance(event, ServerArgs):
                stats.lines["other"] += 1
                merged = self._merge_args(stats, event)
                if self.diagnoser is not None:  # run the probes ahead of any collapse
                    self.diagnoser.observe(server, merged.args)
                clock = now if now is not None else event.timestamp
                self._apply_rules(server, merged, clock if clock is not None else 0.0)
                if clock is not None and clock - self._last_tick >= 1.0:
                    self.tick(clock)
            else:
                stats.lines["malformed"] += 1
                stats.last_malformed_reason = event.reason
        return event

    def feed_event(self, server: str, event: object, now: float) -> None:
        """An event from a source other than the log (process, HTTP API, GPU); `now` is wall
        time. Records what the metrics show, then runs the rules. Never raises on input."""
        with self.lock:
            stats = self.servers.get(server)
            if stats is None:
                stats = self.servers[server] = ServerStats()
            if isinstance(event, ServerArgs):
                event = self._merge_args(stats, event)
                if self.diagnoser is not None:
                    self.diagnoser.observe(server, event.args)
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
            self._apply_rules(server, event, now)

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

    def tick(self, now: float) -> None:
        """Let time-based rules and alert repeats advance (caller holds `lock`)."""
        self._last_tick = now
        for rule in self.rules:
            for alert in rule.on_tick(now):
                self.dispatcher.handle(alert, now)
        self.dispatcher.tick(now)

    def _apply_rules(self, server: str, event: object, now: float) -> None:
        for rule in self.rules:
            alerts = rule.on_event(server, event, now)
            if alerts:  # rarely: most calls return [] (cheaper to test than to iterate)
                for alert in alerts:
                    self.dispatcher.handle(alert, now)

    def _rank(self, server: str, event: DecodeBatch | PrefillBatch) -> RankStats:
        key = (server, event.rank)
        rs = self.ranks.get(key)
        if rs is None:
            rs = self.ranks[key] = RankStats(server, event.rank, dict(event.ranks))
        return rs

    def to_state(self) -> dict:
        """Rule and alert state (caller holds `lock`)."""
        return {"rules": {r.name: r.to_state() for r in self.rules}, "dispatcher": self.dispatcher.to_state()}

    def load_state(self, state: dict) -> None:
        with self.lock:
            for r in self.rules:
                r.load_state(state.get("rules", {}).get(r.name, {}))
            self.dispatcher.load_state(state.get("dispatcher", {}))
            # One object per firing alert again: the rule's (whose evidence it keeps current),
            # not the dispatcher's own copy from the state file, so repeats show today's numbers.
            for r in self.rules:
                for alert in r.firing_alerts():
                    if alert.fingerprint in self.dispatcher.alerts:
                        self.dispatcher.alerts[alert.fingerprint] = alert
