"""DecodeStalled through the real pipeline: a log file read by the real Follower (the daemon's
batch path, with its wall clock), the real HTTP API source against a local SGLang-shaped server
whose `/health` fails, and the metrics. BR-37's wedge (requests running, no decode progress,
`/health` failing, HTTP access lines still arriving) must fire; an idle server after a burst must
not."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ has no __init__.py
from sglang_http import SGLangHTTP  # noqa: E402
from sglang_lines import decode_line  # noqa: E402
from test_log_error_rule import scrape  # noqa: E402

from specwatch.alerts.dispatcher import Dispatcher  # noqa: E402
from specwatch.config import build_config  # noqa: E402
from specwatch.pipeline import Pipeline  # noqa: E402
from specwatch.rules.decode_stalled import ALERT_NAME  # noqa: E402
from specwatch.sources.filestream import Follower  # noqa: E402
from specwatch.sources.server_api import ServerApiSource  # noqa: E402

T0 = datetime(2026, 3, 1, 10, 0, 0).timestamp()
HEALTH_FAILED = ("Health check failed. Server couldn't get a response from detokenizer for last 20 seconds. "
                 "tic start time: {t}. last_heartbeat time: 10:00:20")


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


class Box:
    """A followed log, the pipeline fed by the Follower at a wall clock the test sets, and
    optionally the API source against `SGLangHTTP`."""

    def __init__(self, tmp_path: Path, api: SGLangHTTP | None, rules: dict | None = None):
        self.log = tmp_path / "server.log"
        self.log.write_text("")
        cfg = build_config({"server": "box", "logs": [{"path": str(self.log), "server": "sglang-a"}],
                            "rules": rules or {}})
        self.p = Pipeline(cfg, Dispatcher([], group_wait=0, group_interval=0, keep_history=True))
        self.now = T0
        self.follower = Follower(str(self.log), on_lines=lambda b: self.p.feed_batch(b, now=self.now))
        self.api = ServerApiSource(api.url, self.p.feed_event, server="sglang-a", timeout=1.0) if api else None

    def write(self, *lines: str) -> None:
        with open(self.log, "a") as f:
            f.write("".join(line + "\n" for line in lines))
        while self.follower.poll():
            pass

    def step(self, t: float, *lines: str) -> None:
        """At wall time t: the lines the server wrote, an API poll, a tick."""
        self.now = t
        self.write(*lines)
        if self.api is not None:
            self.api.poll(t)
        with self.p.lock:
            self.p.tick(t)

    def stalled(self) -> list[tuple[str, float]]:
        return [(a.status, a.ends_at or a.starts_at) for a in self.p.dispatcher.history if a.name == ALERT_NAME]


def access(t: float, path: str = "/generate", status: str = "200 OK", verb: str = "POST") -> str:
    return f'[{stamp(t)}] INFO:     10.0.0.7:51234 - "{verb} {path} HTTP/1.1" {status}'


def busy(box: Box, until: float) -> float:
    """Decode lines with 3 running requests every 5 s up to `until`; returns the last time."""
    t = box.now
    while t + 5 <= until:
        t += 5
        box.step(t, decode_line("0.5.23", ts=stamp(t), accept_len=2.8, running=3, queued=1)[0])
    return t


@pytest.fixture
def srv():
    s = SGLangHTTP("0.5.23")
    yield s
    s.close()


def test_br37_wedge_fires_within_the_hold_and_resolves_at_the_next_decode_line(tmp_path, srv):
    box = Box(tmp_path, srv)
    last = busy(box, T0 + 60)
    srv.health_status = 503  # the scheduler hangs: /health's one-token generation times out
    t = last
    while t < last + 15 * 60:
        t += 10
        box.step(t, access(t), access(t, "/health", "503 Service Unavailable", "GET"))
        if box.stalled():
            break
    [(status, at)] = box.stalled()
    assert status == "firing" and last + 120 <= at <= last + 130  # `for` 2m after the last decode line
    [alert] = [a for a in box.p.dispatcher.history if a.name == ALERT_NAME]
    ev = dict(alert.evidence)
    assert ev["running requests at the last decode line"] == "3" and ev["queued requests at the last decode line"] == "1"
    assert ev["health check"].startswith("/health answered 503")
    assert "the HTTP API answers" in ev["server alive"] and "other log lines until" in ev["server alive"]
    assert alert.labels["severity"] == "critical" and "py-spy dump" in alert.fixes[0]
    # the freshness of each kind of line, as Prometheus sees it: access lines arrive, decode lines do not
    m = scrape(box.p)
    fresh = {dict(k[1])["kind"]: v for k, v in m.items() if k[0] == "specwatch_server_log_last_line_timestamp_seconds"}
    assert fresh["decode"] == last and fresh["other"] == t
    # it moves again
    srv.health_status = 200
    box.step(t + 5, decode_line("0.5.23", ts=stamp(t + 5), accept_len=2.8, running=3)[0])
    assert box.stalled() == [("firing", at), ("resolved", t + 5)]


def test_log_only_wedge_fires_on_sglangs_health_check_failure_lines(tmp_path):
    """No API source: a load balancer's health probe makes SGLang log the failure."""
    box = Box(tmp_path, None)
    last = busy(box, T0 + 30)
    for i in range(1, 30):
        t = last + 10 * i
        lines = [access(t, "/health", "503 Service Unavailable", "GET")]
        if i % 3 == 0:  # each failed probe waits 20 s for the scheduler, then logs
            lines.insert(0, f"[{stamp(t)}] " + HEALTH_FAILED.format(t=stamp(t - 20)[11:]))
        box.step(t, *lines)
    [(status, at)] = box.stalled()
    assert status == "firing" and at == last + 120
    [alert] = [a for a in box.p.dispatcher.history if a.name == ALERT_NAME]
    assert dict(alert.evidence)["health check"].startswith("log: [")
    assert box.p.servers["sglang-a"].errors["health_check"] == 9


def test_quiet_when_idle_after_a_burst_and_when_slow_but_moving(tmp_path, srv):
    """The last decode line of a burst shows running requests (SGLang prints every 40 rounds,
    not when the batch drains); /health answers, access lines keep coming: idle, not wedged."""
    box = Box(tmp_path, srv)
    last = busy(box, T0 + 60)
    for t in range(int(last) + 10, int(last) + 15 * 60, 10):
        box.step(t, access(t, "/health", "200 OK", "GET"))
    assert box.stalled() == []
    # /health failing while decode lines keep coming (a slow probe): not a stall either
    srv.health_status = 503
    busy(box, box.now + 600)
    assert box.stalled() == []


def test_a_restart_or_a_stopped_server_ends_it(tmp_path, srv):
    box = Box(tmp_path, srv)
    last = busy(box, T0 + 20)
    srv.health_status = 503
    box.step(last + 130, access(last + 130))
    assert [s for s, _ in box.stalled()] == ["firing"]
    t = last + 140
    box.step(t, f"[{stamp(t)}] server_args=ServerArgs(model_path='/m', speculative_algorithm='EAGLE3', tp_size=1)")
    assert [s for s, _ in box.stalled()] == ["firing", "resolved"]
    box.step(t + 600, access(t + 600))  # no decode line since the restart: nothing was running
    assert [s for s, _ in box.stalled()] == ["firing", "resolved"]
