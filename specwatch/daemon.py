"""`specwatch run`: lifecycle of the daemon — threads, signals, state, HTTP listener.

Threads: the follower group (reads lines and feeds the pipeline; after a round it flushes due
alert groups and, at most once a second, ticks the time-based rules, which re-sends to
Alertmanager; a busy log is read again as soon as a collapse could need it, and soon after a
line that may start one: `sources/cadence.py`), the HTTP server (scrapes; it sleeps until a
connection comes), one delivery thread per notifier, one thread per source (process scan, each
HTTP API, NVML sampling and XID events; each hands its events to the pipeline), and the main
thread, which waits on an Event for signals and wakes every `MAIN_EVERY` seconds for health and
sd_notify (`ALONE_EVERY` without systemd; and to tick when the followers poll less often than
once a second). Nothing spins: idle CPU is the followers' poll (a stat per file per poll
interval, and a busy log's rounds at its cadence), one scan of /proc every `process.interval`,
one HTTP GET per `server_api.interval`, one per `server_metrics[].interval`, plus these wake-ups
(each costs: README "Performance").

State (`<state_dir>/state.db`, `specwatch.system.storage.StateStore`): file offsets, the rule/alert
state, the line counters and each notifier's queue, committed in one transaction by the
followers' thread after a poll round that queued or delivered a notification (at once: an alert
transition is durable before it is sent), and otherwise at most every `STATE_EVERY` seconds
when lines were read or a tick changed the rule state (a commit costs a few ms: one per poll
round tripled the idle cost; a commit that costs more than `STATE_SHARE` of a core over that
time, a large state, waits longer, up to `QUIET_EVERY`). A restart — after kill -9 too —
resumes after the last line committed with the counters and rule state of that moment (ticks
alone: `QUIET_EVERY`), so it reads again the lines of at most one such interval, counts no line twice and neither re-fires nor forgets an alert. The `state.json` and `<name>-queue.json` of earlier versions are read once and renamed
`*.migrated`. Beside it: the silences (`silences.json`, re-read when `specwatch silence`
changes it).

Under systemd (`Type=notify`, deploy/specwatch.service) it speaks sd_notify itself: READY=1 once
/metrics listens and the followers run, STATUS= lines, WATCHDOG=1 from the main loop only while
`health()` finds nothing wrong, RELOADING=1 … READY=1 around a reload, STOPPING=1.

SIGHUP reloads the config file. A file that does not validate is refused whole: the running
config stays, the problems are logged and `specwatch_config_reload_success` drops to 0. A valid
one applies at once what can change live — `logs` (followers added and removed; a new path is
read from its start, like at first start), each log's `server` and `container_prefix` (for lines
read from then on), `rules.*` thresholds, and all of `alerts.*`: routes, timers, inhibit
rules, runbook and external URLs, and the notifiers (Slack, webhooks, Alertmanager), rebuilt on
the same on-disk queues, so nothing pending is lost. Firing alerts, the notification log and
silences carry over: a reload re-sends nothing already sent. It logs a warning for each setting
that needs a restart (`metrics.*`, `state_dir`, `follow.*`, `gpu.*`, `process`, `server_api`,
`server_metrics`, `diagnosis`), which keeps its running value until then.

SIGUSR1 (sent by `specwatch notifications retry`) puts the notifications receivers refused back
in their queues; each tick raises or resolves SpecwatchNotificationsFailing from those dead
letters (`specwatch.notifiers.failing`). A stop on a full state_dir spends the store's reserve
of space on its last commit (`StateStore.hold_reserve`).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client import ProcessCollector as OwnProcessCollector

from specwatch import __version__
from specwatch.alerting import build_alerting
from specwatch.config import Config, ConfigError, LogSource, ProcessTies, load_run_config, source_servers
from specwatch.system.exposition import Exposition
from specwatch.system.listener import listener_app, not_found, serve_pooled, serve_quietly, stop_serving
from specwatch.core.metrics import FollowerCollector, PipelineCollector, SelfCollector, ServerCollector
from specwatch.notifiers import dead_letter, failing
from specwatch.notifiers.queue import QueuedNotifier
from specwatch.core.pipeline import Pipeline
from specwatch.system.sdnotify import Watchdog, monotonic_usec, notify
from specwatch.sources.cadence import ReadCadence
from specwatch.sources.stream import LineStream, open_stream
from specwatch.sources.follow import FollowerGroup
from specwatch.sources.log_health import LogHealth
from specwatch.sources.logfiles import LogSet
from specwatch.status.view import StatusView
from specwatch.status.web import status_app
from specwatch.system.storage import STATE_DB, StateDirLocked, StateStore, lock_state_dir, private_dir, read_json

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

log = logging.getLogger("specwatch.daemon")

MISSING_WARN_EVERY = 600.0
STATE_EVERY = 5.0  # seconds between commits of line progress (notifications commit at once)
QUIET_EVERY = 60.0  # ... and of what ticks alone changed (an idle daemon builds no state document)
# Line progress waits longer than STATE_EVERY when a commit would take more than this share of a
# core (the state of many ranks' windows is large: docs/idle-cost.md).
STATE_SHARE = 5e-5
RETRY_EVERY = 1.0  # seconds between retries of a failed state write (disk full)
DRAIN_AT_STOP = 5.0  # seconds a stop with an unwritable state_dir spends delivering what is queued
LOCK_WAIT = 5.0  # seconds the main loop waits for the pipeline lock before calling it wedged
STATUS_EVERY = 10.0  # seconds between STATUS= updates while nothing else changes
TICK_EVERY = 1.0  # seconds between ticks of the time-based rules (on the followers' thread when it polls as often)
# A busy log's rounds (sources/cadence.py) come at least every `follow.poll_interval` / READ_SPAN
# and at most READ_SPAN intervals apart (a round runs the rules with cold caches: docs/idle-cost.md)
READ_SPAN = 3
MAIN_EVERY = 5.0  # seconds between the main loop's health checks when the followers' thread ticks
ALONE_EVERY = 15.0  # ... without systemd (no NOTIFY_SOCKET): only the log hears of health


# Settings read once at start; a reload that changes them warns and keeps the running value.
RESTART_ONLY = ("listen_address", "listen_port", "state_dir", "follow", "gpu", "process", "server_apis",
                "server_metrics", "diagnosis")
# The settings `build_alerting` reads: a reload that changes any rebuilds the notifiers and routes.
ALERTING = ("group_by", "group_wait", "group_interval", "repeat_interval", "inhibit_rules", "runbook_url",
            "external_url", "slack", "webhooks", "alertmanager", "routes")


def give_back_memory() -> None:
    """The memory a start-up backlog's reads freed, back to the OS: glibc keeps freed heap pages
    for reuse (`malloc_trim(3)` returns them); a no-op without glibc."""
    import ctypes
    import gc

    gc.collect()
    try:
        libc = ctypes.CDLL(None)
        if hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    except OSError:
        pass


def known_servers(cfg: Config) -> set[str]:
    """Every server a source of `cfg` reports on (`config.source_servers`), and the default
    `server` (GPU alerts carry it)."""
    return source_servers(cfg) | {cfg.server}

class Daemon:
    def __init__(self, config: Config):
        self.config = config
        self.state_dir = Path(config.state_dir)
        self.state_path = self.state_dir / "state.json"
        self._stop = threading.Event()
        self._config_lock = threading.Lock()  # config and logset: reload (main) vs glob rescan (followers)
        self._wake = threading.Event()  # signals wake the main loop at once
        self._reload_requested = False
        self._retry_requested = False  # SIGUSR1: `specwatch notifications retry`
        self.notifiers: dict[str, QueuedNotifier] = {}
        self.httpd: WSGIServer | None = None
        self._http_thread: threading.Thread | None = None
        self._progress = time.monotonic()  # last line or poll round of the followers' thread
        self._ticked = -TICK_EVERY  # monotonic time of the last tick (either thread)
        self._lock_stuck = False
        self.reload_success = True
        self._backlog = False  # a start-up backlog is being read
        self.last_reload_success = time.time()  # start-up counts, as for Prometheus' own metric

    # --- wiring ---
    def _make_follower(self, src: LogSource, checkpoint=None) -> LineStream:
        return open_stream(src, self._on_lines, max_line_bytes=self.config.follow.max_line_bytes,
                           checkpoint=checkpoint)

    def _rescan(self) -> None:
        """Follow the files a `logs[].path` glob matches now (pods and containers that appeared),
        stop following those whose directory is gone (on the followers' thread)."""
        self._last_scan = time.monotonic()
        with self._config_lock:  # a reload (main thread) swaps config and logset too
            old, new = self.config, self.logset.apply(self.config)
            old_paths, new_paths = {s.path for s in old.logs}, {s.path for s in new.logs}
            if old_paths == new_paths:
                return
            gone = sorted(old_paths - new_paths)
            self.followers.update(add=[self._make_follower(s) for s in new.logs if s.path not in old_paths],
                                  remove=gone)
            self.config = new
            self.pipeline.reconfigure(new)
            if self.process is not None:
                self.process.tie(ProcessTies.of(new))
            for path in gone:
                log.info("logs: stopped following %s (gone: its pod, container or file was deleted)", path)
            self._forget_gone(old, new, "its log is gone: the pod or container was deleted")

    def _forget_gone(self, old: Config, new: Config, why: str) -> None:
        """Servers `old` followed logs of and no source of `new` reports on: forgotten, their
        firing alerts resolved with `why` (`Pipeline.forget_server`)."""
        for server in sorted({s.server for s in old.logs} - known_servers(new)):
            self.pipeline.forget_server(server, time.time(), why)

    def _build(self) -> None:
        self.logset = LogSet(self.config.logs)  # globs → files (the config keeps one entry per file)
        self._last_scan = time.monotonic()
        cfg = self.config = self.logset.apply(self.config)
        private_dir(self.state_dir)  # 0700: alert texts and receiver names are the daemon's
        self._lock_fd = lock_state_dir(self.state_dir)  # before any read: one daemon per state_dir
        self.store = StateStore(self.state_dir)
        self.store.hold_reserve()  # space for the last commit of a stop should the disk fill up
        self.dispatcher, self.notifiers = build_alerting(cfg, state_dir=self.state_dir, store=self.store)
        self.pipeline = Pipeline(cfg, self.dispatcher)
        state = self.store.load()
        legacy = state is None and self.state_path.exists()  # state.json of an earlier version
        if state is None:
            state = read_json(self.state_path, {})
        self.pipeline.load_state(state.get("pipeline", {}))
        for server in sorted(self.pipeline.servers_with_alerts() - known_servers(cfg)):
            # a server no source names any more (a deleted pod's files, a removed log): its
            # restored alerts could never resolve
            log.info("server %s: no source reports on it any more; its firing alerts resolve", server)
            self.pipeline.forget_server(server, time.time(), "no configured source reports on this server any more")
        offsets = state.get("offsets", {})
        # A log read from its first line (first start, or a file new to the config) holds history,
        # not news: its episodes that ended before the end of that backlog are not notified. A log
        # resumed from its saved offset holds only what came after: every episode there is news
        # (the daemon was down or killed meanwhile), and goes out.
        self._fresh_backlog = any(offsets.get(s.path) is None for s in cfg.logs)
        # Until a new log file's history is read, the state document stays the previous one (no
        # offset for it): a daemon killed midway starts again from its first line, as history,
        # instead of taking the rest for news. Queued notifications are saved meanwhile. (A
        # journal resumes by cursor, and its first turn may not end before a stop.)
        self._backlog = True  # until the start-up backlog is read (`give_back_memory` then)
        self.cadence = self._pace(cfg)
        self.followers = FollowerGroup(
            [self._make_follower(s, offsets.get(s.path)) for s in cfg.logs],
            poll_interval=cfg.follow.poll_interval, use_watchdog=cfg.follow.watchdog, inotify=cfg.follow.inotify,
            after_poll=self._after_poll, due=self._next_flush, cadence=self.cadence.next_round,
        )
        self._history_unsaved = not legacy and any(offsets.get(p) is None and f.first_read_is_history
                                                   for p, f in self.followers.followers.items())
        self._saved_doc: str | None = None  # the state document last committed
        self._commit_cpu = 0.0  # CPU seconds of the last commit
        self._fed = False  # lines read since the last commit
        self.commit()  # the migrated files, and the first offsets
        if legacy and self.store.ok:
            os.replace(self.state_path, self.state_path.with_name(self.state_path.name + ".migrated"))
        self._missing_since: dict[str, list] = {}  # path -> [absent since, last warned] (monotonic)
        self.log_health = LogHealth(self._emit, self.pipeline.server_for)  # SourceHealth events
        self.registry = CollectorRegistry()
        OwnProcessCollector(registry=self.registry)  # specwatch's own process_* (CPU, RSS, fds)
        self.registry.register(PipelineCollector(self.pipeline))
        self.registry.register(FollowerCollector(lambda: dict(self.followers.followers)))  # a copy: a rescan may change it meanwhile
        self._stream_collectors: set = set()
        self._register_stream_metrics()
        self.registry.register(SelfCollector(self.pipeline, lambda: dict(self.notifiers),  # a copy: a reload may change it meanwhile
                                             reload_status=lambda: (self.reload_success, self.last_reload_success),
                                             store=self.store))
        self.registry.register(ServerCollector(self.pipeline))
        self.sources: list = []
        self.process = None
        if cfg.process.enabled:
            from specwatch.sources.process import ProcessCollector, ProcessSource

            self.process = ProcessSource(self._emit, server=cfg.server, interval=cfg.process.interval,
                                         servers=cfg.process.servers, match=cfg.process.match,
                                         ties=ProcessTies.of(cfg), log_ports=self.pipeline.log_ports)
            self.sources.append(self.process)
            self.registry.register(ProcessCollector(self.process))
        if cfg.server_apis:
            from specwatch.sources.server_api import ServerApiCollector, ServerApiSource

            apis = [ServerApiSource(a.url or "", self._emit, server=a.server or "", api_key=a.api_key, interval=a.interval,
                                    health_interval=a.health_interval, timeout=a.timeout,
                                    backoff_max=a.backoff_max) for a in cfg.server_apis]
            self.sources += apis
            self.registry.register(ServerApiCollector(apis))
        if cfg.server_metrics:
            from specwatch.sources.server_metrics import ServerMetricsCollector, ServerMetricsSource

            scrapes = [ServerMetricsSource(m.url, self._emit, server=m.server or "", interval=m.interval, timeout=m.timeout,
                                           backoff_max=m.backoff_max) for m in cfg.server_metrics]
            self.sources += scrapes
            self.registry.register(ServerMetricsCollector(scrapes))
        self.gpu = None
        if cfg.gpu.enabled:
            from specwatch.sources.nvml import GpuCollector, GpuSampler

            # GPU facts are per box: the default server name
            self.gpu = GpuSampler(emit=lambda sample: self._emit(self.config.server, sample, sample.timestamp),
                                  interval=cfg.gpu.interval,
                                  process_pids=self.process.pids if self.process else None)
            self.registry.register(GpuCollector(self.gpu))

    def _register_stream_metrics(self) -> None:
        """The families of each kind of log stream followed (a journal's specwatch_journal_*),
        once a stream of that kind is (at start or by a reload)."""
        for f in self.followers.followers.values():
            make = type(f).collector
            if make is not None and make not in self._stream_collectors:
                self._stream_collectors.add(make)
                self.registry.register(make(lambda: self.followers.followers))

    def _emit(self, server: str, event: object, now: float) -> None:
        self.pipeline.feed_event(server, event, now)

    def _on_lines(self, batch) -> None:
        self._progress = time.monotonic()
        self._fed = True
        self.cadence.saw(batch)
        self.pipeline.feed_batch(batch, now=time.time())

    def _app(self):
        """The WSGI app served (specwatch/system/listener.py): the registry at `/metrics`, `/-/healthy`,
        `/-/ready`, the status page at `/` and `/api/status` (specwatch/status/), 404 elsewhere."""
        view = StatusView(self.pipeline, sources=lambda: [*self.followers.followers.values(), *self.sources,
                                                          *self.notifiers.values()],
                          gpu=lambda: self.gpu, gpu_enabled=lambda: self.config.gpu.enabled)
        return listener_app(Exposition(self.registry), status_app(view, not_found), ready=self.not_ready)

    def not_ready(self) -> str | None:
        """None once the start-up backlog is read and every source's thread runs (`/-/ready` 200),
        else why not (its 503 body). A monitored server that is down does not make specwatch
        unready: saying so is its job."""
        if not self.followers.polled or self.followers.catching_up:
            return "reading the start-up backlog of the logs"
        if (problem := self.health()) is not None:
            return problem
        stopped = [s.name for s in self.sources if not s.running]
        return f"source thread(s) not running: {', '.join(stopped)}" if stopped else None

    def _warn_missing_logs(self) -> None:
        """A followed file that stays absent or unreadable is said in the log, not only in
        specwatch_log_file_open 0: once after five poll intervals (at least 2 s), then every
        MISSING_WARN_EVERY seconds."""
        now = time.monotonic()
        after = max(2.0, 5 * self.config.follow.poll_interval)
        for path, f in self.followers.followers.items():
            if f.is_open or f.warns_when_closed:  # a journal source says why itself
                self._missing_since.pop(path, None)
                continue
            since, warned = self._missing_since.setdefault(path, [now, None])
            if now - since >= after and (warned is None or now - warned >= MISSING_WARN_EVERY):
                self._missing_since[path][1] = now
                why = f.why_closed()
                log.warning("log file %s %s (for %.0fs): check logs[].path and that SGLang writes there; "
                            "it is read from its first line once it appears", path, why, now - since)

    def _after_poll(self) -> None:
        self._progress = time.monotonic()
        if self.logset.patterns and time.monotonic() - self._last_scan >= self.config.follow.rescan_interval:
            self._rescan()
        self._warn_missing_logs()
        self.log_health.check(dict(self.followers.followers), time.time())
        if self._backlog and not self.followers.catching_up:
            self._backlog = False
            give_back_memory()
        with self.pipeline.lock:
            if self.dispatcher.paused and not (self.followers.catching_up or self.followers.updating):
                # the backlog (and any log a reload added) is read: notify from now
                self.dispatcher.resume(time.time())
                self._history_unsaved = False
                self._tick()
            elif self._tick_due():  # here, not in a wake-up of its own
                self._tick()
            else:  # a group_wait ending now goes out within a poll interval, not at the next tick
                self.dispatcher.flush_due(time.time())
        # On the followers' thread between poll rounds: offsets and rule state agree.
        since = time.monotonic() - self._last_save
        every = min(QUIET_EVERY, max(STATE_EVERY, self._commit_cpu / STATE_SHARE)) if self._fed else QUIET_EVERY
        if (any(n.has_changes for n in list(self.notifiers.values()))
                or since >= every
                or not self.store.ok and since >= RETRY_EVERY):
            self.commit()

    def _pace(self, cfg: Config, cadence: ReadCadence | None = None) -> ReadCadence:
        """The busy-log cadence's settings from `cfg` (sources/cadence.py): rounds between
        `follow.poll_interval` / READ_SPAN (at least 0.05 s) and READ_SPAN intervals apart,
        and no longer apart than one interval when an API poll's `log_silent` intervals in a row
        could pass within two of those spans: decode lines read that late would look missing. A
        line that may start a collapse: SGLang's accept length at most
        `rules.collapse.max_accept_length` (a `format:` grammar rewrites a line's prefix only, its
        message keeps `accept len: X`). Returns `cadence` set to them, or a new one."""
        every = cfg.follow.poll_interval
        slow = READ_SPAN * every
        if any(a.interval * cfg.log_silent.intervals <= 2 * slow for a in cfg.server_apis):
            slow = every
        fast = min(slow, max(0.05, every / READ_SPAN))  # at most 20 rounds a second
        c = cfg.collapse
        if cadence is None:
            return ReadCadence(min_batches=c.min_batches, at_most=c.max_accept_length, fast=fast, slow=slow)
        cadence.min_batches, cadence.at_most, cadence.fast, cadence.slow = c.min_batches, c.max_accept_length, fast, slow
        return cadence

    def _next_flush(self) -> float | None:
        """`time.monotonic()` of the dispatcher's next group timer: the followers' thread, which
        may read a busy log only every few poll intervals, flushes then (a group_wait ending
        between two reads)."""
        with self.pipeline.lock:
            t = self.dispatcher.next_flush()
        return None if t is None else time.monotonic() + t - time.time()

    def _tick_due(self) -> bool:
        """TICK_EVERY passed since the last tick, this daemon's or the one the pipeline gives
        itself while it reads lines (`Pipeline.last_tick`, the lines' wall clock; a clock set
        back makes a tick due). Caller holds the pipeline lock."""
        since = time.time() - self.pipeline.last_tick
        return time.monotonic() - self._ticked >= TICK_EVERY and not 0 <= since < TICK_EVERY

    def _tick(self) -> None:
        """Let time-based rules advance, and raise or resolve SpecwatchNotificationsFailing from
        the notifiers' dead letters (caller holds the pipeline lock)."""
        self._ticked = time.monotonic()
        now = time.time()
        self.pipeline.tick(now)
        for alert in failing.check(self.notifiers, list(self.dispatcher.active.values()), self.config.server, now):
            self.dispatcher.handle(alert, now)

    def commit(self, final: bool = False) -> bool:
        """Offsets, rule state, counters and the notifiers' queued items in one transaction
        (`StateStore.commit`); the state document only when it changed. Called on the followers'
        thread between poll rounds (or while it is not running), so offsets and pipeline describe
        the same lines. Returns False when the write failed (counted and warned by the store;
        the next call writes everything still pending)."""
        self._last_save = time.monotonic()
        cpu = time.thread_time()
        notifiers = list(self.notifiers.values())
        with self.pipeline.lock, self.store.lock:
            self._fed = False
            doc = self._saved_doc if self._history_unsaved else json.dumps(
                {"version": 2, "offsets": self.followers.checkpoints(), "pipeline": self.pipeline.to_state()},
                sort_keys=True)
            changes = [n.changes() for n in notifiers]
            ok = True
            if doc != self._saved_doc or any(put or delete for put, delete in changes):
                ok = self.store.commit(None if doc == self._saved_doc else doc,
                                       [p for put, _ in changes for p in put],
                                       [d for _, delete in changes for d in delete], final=final)
            if ok:
                self._saved_doc = doc
            for n, (put, delete) in zip(notifiers, changes):
                n.committed(ok, put, delete)
                if ok:
                    n.migrated()
        self._commit_cpu = time.thread_time() - cpu
        return ok

    # --- health (gates WATCHDOG=1) ---
    @property
    def wedged_after(self) -> float:
        """Seconds without a line or a finished poll round after which the followers count as
        wedged. Rounds end every poll_interval when idle, at least every READ_SPAN of them on a
        busy log, and a long catch-up emits lines."""
        return max(10 * self.config.follow.poll_interval, 5.0)

    def health(self) -> str | None:
        """None when healthy, else what is wrong (sent as STATUS=, and no WATCHDOG=1)."""
        t = self.followers.thread
        if t is None or not t.is_alive():
            return "log follower thread is not running"
        idle = time.monotonic() - self._progress
        if idle > self.wedged_after:
            return f"log followers made no progress for {idle:.0f}s"
        if self._lock_stuck:
            return f"pipeline lock held for more than {LOCK_WAIT:g}s"
        if self._http_thread is None or not self._http_thread.is_alive():
            return "metrics listener thread is not running"
        return None

    def status_text(self) -> str:
        with self.pipeline.lock:
            lines = sum(sum(st.lines.values()) for st in self.pipeline.servers.values())
            firing = len(self.dispatcher.active)
        port = self.httpd.server_address[1] if self.httpd else self.config.listen_port
        return (f"following {len(self.config.logs)} log(s), {lines} line(s) read, {firing} alert(s) firing, "
                f"metrics on port {port}" + ("" if self.reload_success else "; last reload FAILED"))

    # --- reload (SIGHUP) ---
    def _request(self, reload: bool) -> None:
        if reload:
            self._reload_requested = True
        else:
            self._stop.set()
        self._wake.set()

    def _request_retry(self) -> None:
        self._retry_requested = True
        self._wake.set()

    def _retry_dead_letters(self) -> None:
        """SIGUSR1 from `specwatch notifications retry`: its request names the receivers."""
        receivers = dead_letter.take_request(self.state_dir)
        if receivers is None:
            log.warning("SIGUSR1 without a retry request in %s: nothing to do (use `specwatch notifications retry`)",
                        self.state_dir)
            return
        for name, n in list(self.notifiers.items()):
            if not receivers or name in receivers:
                n.retry_dead("specwatch notifications retry")

    def reload(self) -> bool:
        """Re-read the config file and apply it (see the module docstring). Returns success."""
        path = self.config.source_path
        notify(f"RELOADING=1\nMONOTONIC_USEC={monotonic_usec()}\nSTATUS=reloading {path}")
        try:
            if path is None:
                raise ValueError("the config was not read from a file")
            new = load_run_config(path)
        except Exception as e:  # a ConfigError; anything else (a bug) must not end the daemon either
            problems = e.problems if isinstance(e, ConfigError) else [f"{type(e).__name__}: {str(e)[:200]}"]
            self.reload_success = False
            log.error("config reload from %s refused, the running config stays: %s", path, "; ".join(problems))
            notify(f"READY=1\nSTATUS=reload of {path} FAILED ({len(problems)} problem(s), see the log); "
                   "running the previous config")
            return False
        with self._config_lock:  # the followers' thread rescans globs with config and logset
            return self._apply_reload(new, path)

    def _apply_reload(self, new: Config, path: str) -> bool:
        self.logset = LogSet(new.logs)
        new = self.logset.apply(new)
        old = self.config
        kept = {}
        for key in RESTART_ONLY:
            if getattr(new, key) != getattr(old, key):
                log.warning("config reload: %s changed; it takes effect after a restart", key)
                kept[key] = getattr(old, key)
        new = dataclasses.replace(new, **kept)

        old_paths = [s.path for s in old.logs]
        new_paths = [s.path for s in new.logs]
        self.config = new
        failed = None
        if any(getattr(new, k) != getattr(old, k) for k in ALERTING):
            try:
                self._swap_alerting(new)
            except Exception:  # validated above, so unexpected: keep the daemon, report it
                log.exception("config reload: applying alerts.* failed")
                failed = "alerts.*"
                self.pipeline.reconfigure(new)  # rules and logs still apply
                for n in self.notifiers.values():  # the old ones, or the new ones if swapped
                    n.start()
        else:
            self.pipeline.reconfigure(new)  # rules and logs; the routing stays as it is
        if self.process is not None:  # the servers of the followed logs are configured servers
            self.process.tie(ProcessTies.of(new))
        self._pace(new, self.cadence)  # rules.log_silent.intervals and rules.collapse may have changed
        added = [s for s in new.logs if s.path not in old_paths]
        with self.pipeline.lock:  # _after_poll sees both or neither: no resume before they are followed
            if added:  # read from their first line: their history is not news (as at a first start)
                self.dispatcher.paused = True  # until a poll round has read them
            self.followers.update(add=[self._make_follower(s) for s in added],
                                  remove=[p for p in old_paths if p not in new_paths])
        self._register_stream_metrics()
        self._forget_gone(old, new, "its log is no longer in the config (reloaded)")
        if failed:
            self.reload_success = False
            notify(f"READY=1\nSTATUS=reload applied except {failed} (see the log)")
            return False
        self.reload_success = True
        self.last_reload_success = time.time()
        log.info("config reloaded from %s: %d log(s)%s", path, len(new.logs),
                 "".join(f", +{p}" for p in new_paths if p not in old_paths)
                 + "".join(f", -{p}" for p in old_paths if p not in new_paths))
        notify(f"READY=1\nSTATUS={self.status_text()}")
        return True

    def _swap_alerting(self, new: Config) -> None:
        """New alerting settings: stop the notifiers (their queues stay on disk), then, under the
        pipeline lock, build the new ones on the same queue files and hand the dispatcher the new
        routes (`Pipeline.reconfigure`), so every notification lands in exactly one of them and
        each file holds both's pending items. Firing alerts and the notification log stay."""
        old = self.notifiers
        for n in old.values():
            n.stop(timeout=0)  # ask them all first: they wind down in parallel
        for n in old.values():
            if not n.stop(timeout=n.timeout + 1.0):
                log.warning("%s delivery still in flight during reload; a message may be sent twice", n.name)

        def build():
            dispatcher, notifiers = build_alerting(new, state_dir=self.state_dir, store=self.store)
            for name, n in notifiers.items():  # counters continue across the swap
                o = old.get(name)
                if o is not None:
                    n.take_queue(o)
                    n.sent_total, n.failed_total = o.sent_total, dict(o.failed_total)
                    n.last_success_timestamp = o.last_success_timestamp
            self.notifiers = notifiers
            return dispatcher

        self.pipeline.reconfigure(new, routing=build)
        for n in self.notifiers.values():
            n.start()
        for name, n in old.items():
            if name not in self.notifiers and n.queue_depth:
                log.warning("%s removed from the config: %d notification(s) stay queued in %s until it is set again",
                            name, n.queue_depth, self.store.path)
        log.info("notifiers: %s", ", ".join(self.notifiers) or "none (alerts only in /metrics)")

    # --- lifecycle ---
    def run(self) -> int:
        if threading.current_thread() is threading.main_thread():
            # Installed first: a SIGHUP during start-up must not kill the daemon (default action).
            signal.signal(signal.SIGTERM, lambda *_: self._request(reload=False))
            signal.signal(signal.SIGINT, lambda *_: self._request(reload=False))
            signal.signal(signal.SIGHUP, lambda *_: self._request(reload=True))
            signal.signal(signal.SIGUSR1, lambda *_: self._request_retry())
        try:
            self._build()
        except StateDirLocked as e:  # exit 1: a conflict at run time, not a config error (2)
            log.error("cannot start: %s; stop it or give this one another state_dir", e)
            return 1
        except OSError as e:  # state_dir not creatable/writable, a queue file unreadable, ...
            log.error("cannot start: %s: %s (check state_dir and its permissions)",
                      getattr(e, "filename", None) or self.state_dir, e.strerror or e)
            return 1
        except sqlite3.Error as e:  # state.db cannot be opened or created (full disk, not a database)
            log.error("cannot start: %s: %s (check state_dir, its free space and permissions)",
                      self.state_dir / STATE_DB, e)
            return 1
        cfg = self.config
        try:  # prometheus_client's threaded WSGI server (IPv4 or IPv6 by address, requests not logged)
            self.httpd, self._http_thread = start_http_server(cfg.listen_port, cfg.listen_address, self.registry)
        except OSError as e:
            log.error("cannot listen on %s:%s: %s (set metrics.listen_address / metrics.listen_port)",
                      cfg.listen_address, cfg.listen_port, e.strerror or e)
            return 1
        self.httpd.set_app(self._app())  # in place of the library's app, which serves metrics at every path
        serve_pooled(self.httpd)  # no thread started per connection
        self._http_thread = serve_quietly(self.httpd, self._http_thread)  # no 0.5 s select timer
        for n in self.notifiers.values():
            n.start()
        if self.notifiers:  # the notifiers' HTTP client, imported now rather than by the first alert
            threading.Thread(target=importlib.import_module, args=("requests",), name="specwatch-preload",
                             daemon=True).start()
        self._progress = time.monotonic()
        self.dispatcher.paused = self._fresh_backlog  # until the first poll round has read the backlog
        self.followers.start()
        for src in self.sources:
            src.start()
        if self.gpu is not None:
            self.gpu.start()
        port = self.httpd.server_address[1]
        log.info("specwatch %s: following %d log(s), metrics on http://%s:%d/metrics",
                 __version__, len(cfg.logs), cfg.listen_address, port)
        log.info("notifiers: %s", ", ".join(self.notifiers) or "none (alerts only in /metrics)")
        status = self.status_text()
        notify(f"READY=1\nSTATUS={status}")
        self._main_loop(status)
        notify("STOPPING=1\nSTATUS=stopping: saving state")
        log.info("stopping")
        self.followers.stop(timeout=5.0)
        for src in self.sources:
            src.stop(timeout=5.0)
        if self.gpu is not None:
            self.gpu.stop(timeout=2.0)
        if self._history_unsaved and self.followers.polled and not self.followers.catching_up:
            self._history_unsaved = False  # the backlog was read (stopped before the round's end)
        if not self.commit(final=True):
            pending = sum(n.queue_depth for n in self.notifiers.values())
            log.error("stopping with state_dir unwritable: what was read since the last saved state is read "
                      "again at the next start; delivering %d queued notification(s) for up to %.0fs",
                      pending, DRAIN_AT_STOP)
            for n in self.notifiers.values():
                n.drain(timeout=DRAIN_AT_STOP / max(1, len(self.notifiers)))
        for n in self.notifiers.values():
            n.stop(timeout=5.0)
        self.store.close()
        stop_serving(self.httpd, self._http_thread)
        os.close(self._lock_fd)  # the state_dir is free for the next daemon
        return 0

    def _main_loop(self, last_status: str) -> None:
        """Signals, reloads, health, sd_notify, and ticks only when the followers' thread does not
        (it ticks after its poll rounds when they come at least every TICK_EVERY seconds): every
        wake-up of a thread costs (README "Performance")."""
        watchdog = Watchdog()
        every = MAIN_EVERY if os.environ.get("NOTIFY_SOCKET") else ALONE_EVERY  # STATUS= has a reader
        wait = TICK_EVERY if self.config.follow.poll_interval > TICK_EVERY else every
        if watchdog.period is not None:
            wait = min(wait, watchdog.period / 2)
        problem, status_at = None, time.monotonic()
        while not self._stop.is_set():
            self._wake.wait(wait)
            self._wake.clear()
            if self._stop.is_set():
                break
            if self._reload_requested:
                self._reload_requested = False
                self.reload()
            if self._retry_requested:
                self._retry_requested = False
                self._retry_dead_letters()
            # A bounded wait: a wedged pipeline shows up in health() instead of hanging here.
            if self.pipeline.lock.acquire(timeout=LOCK_WAIT):
                try:
                    if self._tick_due():  # the followers' thread did not
                        self._tick()
                finally:
                    self.pipeline.lock.release()
                self._lock_stuck = False
            else:
                self._lock_stuck = True
            now = time.monotonic()
            found = self.health()
            if found != problem:
                if found:
                    log.error("unhealthy, no watchdog pings until it recovers: %s", found)
                else:
                    log.info("healthy again")
                problem = found
            if problem is None:
                watchdog.ping_if_due(now)
            status = f"unhealthy: {problem}" if problem else self.status_text()
            # Problems and recoveries at once; routine counts at most every STATUS_EVERY.
            if status != last_status and (problem or last_status.startswith("unhealthy")
                                           or now - status_at >= STATUS_EVERY):
                notify(f"STATUS={status}")
                last_status, status_at = status, now
