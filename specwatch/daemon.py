"""`specwatch run`: lifecycle of the daemon — threads, signals, state, HTTP listener.

Threads: the follower group (reads lines and feeds the pipeline), the HTTP server (scrapes), one
delivery thread per notifier, one thread per source (process scan, each HTTP API, NVML sampling
and XID events), and the main thread, which waits on an Event and wakes once a second to feed
new GPU cycles to the rules, flush due alert groups, re-send to Alertmanager and, every
`STATE_EVERY` seconds, to persist state. Nothing spins: idle CPU is the followers' poll (one
stat per file per poll interval), one scan of /proc every `process.interval`, one HTTP GET per
`server_api.interval`, plus these wake-ups.

State (`<state_dir>/state.json`, written atomically): file offsets and the rule/alert state, so
a restart resumes after the last line read and neither re-fires nor forgets a firing alert.
Beside it: one delivery queue per notifier (`<name>-queue.json`) and the silences
(`silences.json`, re-read when `specwatch silence` changes it).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from specwatch import __version__
from specwatch.alerting import build_alerting
from specwatch.config import Config
from specwatch.metrics import FollowerCollector, PipelineCollector, SelfCollector, ServerCollector
from specwatch.pipeline import Pipeline
from specwatch.sources.follow import Follower, FollowerGroup
from specwatch.storage import read_json, write_json_atomic

log = logging.getLogger("specwatch.daemon")

STATE_EVERY = 10.0  # seconds between state snapshots (also written on stop)

_LANDING = """<!doctype html><html><head><title>specwatch</title></head><body>
<h1>specwatch {version}</h1><p>Speculative-decoding monitor for SGLang.</p>
<ul><li><a href="/metrics">/metrics</a></li></ul>
<p>Following: {logs}</p><p>Firing alerts: {firing}</p></body></html>"""


def sd_notify(message: str) -> bool:
    """Send one sd_notify(3) datagram to $NOTIFY_SOCKET; False when not run by systemd."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            s.sendall(message.encode())
        return True
    except OSError as e:
        log.warning("sd_notify failed: %s", e)
        return False


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args) -> None:  # scrapes every 15 s would flood the journal
        pass


class Daemon:
    def __init__(self, config: Config):
        self.config = config
        self.state_dir = Path(config.state_dir)
        self.state_path = self.state_dir / "state.json"
        self._stop = threading.Event()
        self.notifiers: dict[str, object] = {}
        self.httpd = None

    # --- wiring ---
    def _build(self) -> None:
        cfg = self.config
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.dispatcher, self.notifiers = build_alerting(cfg, state_dir=self.state_dir)
        self.pipeline = Pipeline(cfg, self.dispatcher)
        state = read_json(self.state_path, {})
        self.pipeline.load_state(state.get("pipeline", {}))
        offsets = state.get("offsets", {})
        self.followers = FollowerGroup(
            [Follower(s.path, self._on_line, max_line_bytes=cfg.follow.max_line_bytes,
                      checkpoint=offsets.get(s.path)) for s in cfg.logs],
            poll_interval=cfg.follow.poll_interval, use_watchdog=cfg.follow.watchdog,
            after_poll=self._maybe_save,
        )
        self._last_save = time.monotonic()
        self.registry = CollectorRegistry()
        self.registry.register(PipelineCollector(self.pipeline))
        self.registry.register(FollowerCollector(lambda: self.followers.followers))
        self.registry.register(SelfCollector(self.pipeline, lambda: self.notifiers))
        self.registry.register(ServerCollector(self.pipeline))
        self.sources: list = []
        self.process = None
        if cfg.process.enabled:
            from specwatch.sources.process import ProcessCollector, ProcessSource

            self.process = ProcessSource(self._emit, server=cfg.server, interval=cfg.process.interval,
                                         servers=cfg.process.servers, match=cfg.process.match)
            self.sources.append(self.process)
            self.registry.register(ProcessCollector(self.process))
        if cfg.server_apis:
            from specwatch.sources.server_api import ServerApiCollector, ServerApiSource

            apis = [ServerApiSource(a.url, self._emit, server=a.server, api_key=a.api_key, interval=a.interval,
                                    health_interval=a.health_interval, timeout=a.timeout,
                                    backoff_max=a.backoff_max) for a in cfg.server_apis]
            self.sources += apis
            self.registry.register(ServerApiCollector(apis))
        self.gpu = self.gpu_events = None
        if cfg.gpu.enabled:
            from specwatch.sources.gpu_events import GpuEvents
            from specwatch.sources.nvml import GpuCollector

            self.gpu = GpuCollector(interval=cfg.gpu.interval,
                                    process_pids=self.process.pids if self.process else None)
            self.gpu_events = GpuEvents(self.gpu)
            self.registry.register(self.gpu)

    def _emit(self, server: str, event: object, now: float) -> None:
        self.pipeline.feed_event(server, event, now)

    def _on_line(self, line) -> None:
        self.pipeline.feed(line, now=time.time())

    def _app(self):
        metrics_app = make_wsgi_app(self.registry)

        def app(environ, start_response):
            if environ.get("PATH_INFO", "/") in ("/", ""):
                body = _LANDING.format(
                    version=__version__,
                    logs=", ".join(s.path for s in self.config.logs),
                    firing=len(self.dispatcher.active),
                ).encode()
                start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
                return [body]
            return metrics_app(environ, start_response)

        return app

    def _maybe_save(self) -> None:
        # On the followers' thread between poll rounds: offsets and rule state agree.
        if time.monotonic() - self._last_save >= STATE_EVERY:
            self.save_state()
            self._last_save = time.monotonic()

    def save_state(self) -> None:
        """Offsets and rule state in one atomic write. Called on the followers' thread (or after
        it stopped), so no line is half-processed and both describe the same set of lines."""
        with self.pipeline.lock:
            doc = {"version": 1, "offsets": self.followers.checkpoints(),
                   "pipeline": self.pipeline.to_state()}
        write_json_atomic(self.state_path, doc)

    # --- lifecycle ---
    def run(self) -> int:
        self._build()
        cfg = self.config
        try:
            self.httpd = make_server(cfg.listen_address, cfg.listen_port, self._app(),
                                     server_class=_ThreadingWSGIServer, handler_class=_QuietHandler)
        except OSError as e:
            log.error("cannot listen on %s:%s: %s (set metrics.listen_port)", cfg.listen_address, cfg.listen_port, e.strerror)
            return 1
        threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True).start()
        for n in self.notifiers.values():
            n.start()
        self.followers.start()
        for src in self.sources:
            src.start()
        if self.gpu is not None:
            self.gpu.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        port = self.httpd.server_address[1]
        log.info("specwatch %s: following %d log(s), metrics on http://%s:%d/metrics",
                 __version__, len(cfg.logs), cfg.listen_address, port)
        log.info("notifiers: %s", ", ".join(self.notifiers) or "none (alerts only in /metrics)")
        sd_notify(f"READY=1\nSTATUS=following {len(cfg.logs)} log(s), metrics on port {port}")
        while not self._stop.wait(1.0):
            now = time.time()
            if self.gpu_events is not None:
                sample = self.gpu_events.poll(now)
                if sample is not None:  # GPU facts are per box: the default server name
                    self.pipeline.feed_event(cfg.server, sample, now)
            with self.pipeline.lock:
                self.pipeline.tick(now)
        sd_notify("STOPPING=1")
        log.info("stopping")
        self.followers.stop(timeout=5.0)
        for src in self.sources:
            src.stop(timeout=5.0)
        if self.gpu is not None:
            self.gpu.stop(timeout=2.0)
        self.save_state()
        for n in self.notifiers.values():
            n.stop(timeout=5.0)
        self.httpd.shutdown()
        return 0
