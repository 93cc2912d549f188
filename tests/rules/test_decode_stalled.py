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
from specwatch.core.pipeline import Pipeline  # noqa: E402
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
    assert "SGLang's `--watchdog-timeout` (300 s by default) crashes" in alert.fixes[2]
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


# --- the plain-file setup: the log alone (no server_api, no health check either way) ---


def replayed(tmp_path: Path, lines: list[str], rules: dict | None = None) -> list:
    from test_log_error_rule import replay

    p = replay(tmp_path, lines, rules)
    return [a for a in p.dispatcher.history if a.name == ALERT_NAME]


def decoding(t0: float, n: int, running: int = 32) -> list[str]:
    return [decode_line("0.5.23", ts=stamp(t0 + 5 * i), accept_len=2.1, running=running)[0] for i in range(n)]


def test_log_only_stall_fires_after_silent_for_with_the_last_decode_line_and_what_arrives(tmp_path):
    """No API source, the log silent for 2.5 min after decode lines with 32 running (ticks of the
    Follower's clock): DecodeStalled at `silent_for` (2m by default), naming the last decode line."""
    box = Box(tmp_path, None)
    box.now = last = T0 + 15  # the Follower's clock when it reads them
    box.write(*decoding(T0 + 5, 3))
    for t in range(int(last) + 10, int(last) + 151, 10):  # 2.5 min: no line at all, only the clock
        box.step(t)
    [(status, at)] = box.stalled()
    assert status == "firing" and at == last + 120
    [alert] = [a for a in box.p.dispatcher.history if a.name == ALERT_NAME]
    ev = dict(alert.evidence)
    assert ev["running requests at the last decode line"] == "32"
    assert ev["last decode line"].startswith("2026-03-01T") and "Decode batch, #running-req: 32, #queue-req: 0, accept len: 2.10" in ev["last decode line"]
    assert ev["still arriving"] == "nothing: the log is silent" and ev["health check"].startswith("none seen")
    assert alert.labels["severity"] == "critical"


def test_a_decode_line_stamped_before_the_last_one_or_far_off_the_clock_does_not_resolve_it(tmp_path):
    """While stalled, a decode line stamped an hour ago, or in 2030 (pasted into the log), is no
    progress: the alert stays firing (it flapped to Slack: resolved, then firing again); the
    next line of the batch decoding on resolves it."""
    box = Box(tmp_path, None)
    box.now = last = T0 + 15
    box.write(*decoding(T0 + 5, 3))
    for t in range(int(last) + 10, int(last) + 131, 10):
        box.step(t)
    [(status, at)] = box.stalled()
    assert status == "firing" and at == last + 120
    t = last + 130
    for stamped in (t - 3600, datetime(2030, 1, 1, 12, 0, 0).timestamp(), last - 5):
        t += 10
        box.step(t, decode_line("0.5.23", ts=stamp(stamped), accept_len=2.1, running=32)[0])
        t += 30
        box.step(t)
        assert box.stalled() == [("firing", at)], stamped
    t += 10
    box.step(t, decode_line("0.5.23", ts=stamp(t), accept_len=2.1, running=32)[0])
    assert box.stalled() == [("firing", at), ("resolved", t)]


def test_log_only_stall_with_access_lines_still_arriving_names_them(tmp_path):
    box = Box(tmp_path, None)
    box.now = last = T0 + 15
    box.write(*decoding(T0 + 5, 3))
    for t in range(int(last) + 10, int(last) + 151, 10):
        box.step(t, access(t, "/v1/chat/completions"))
    [(status, at)] = box.stalled()
    assert status == "firing" and at == last + 120
    [alert] = [a for a in box.p.dispatcher.history if a.name == ALERT_NAME]
    assert dict(alert.evidence)["still arriving"].startswith("other lines until ")


def test_silent_for_is_configurable_and_a_passed_health_check_holds_it(tmp_path, srv):
    box = Box(tmp_path, None, {"decode_stalled": {"silent_for": "5m"}})
    box.now = T0 + 15
    box.write(*decoding(T0 + 5, 3))
    for t in range(int(T0) + 25, int(T0) + 15 + 151, 10):
        box.step(t)
    assert box.stalled() == []
    for t in range(int(T0) + 175, int(T0) + 15 + 301, 10):
        box.step(t)
    assert [s for s, _ in box.stalled()] == ["firing"]
    # /health answering 200 since the last decode line: the scheduler answers, nothing fires
    (tmp_path / "b").mkdir()
    box = Box(tmp_path / "b", srv)
    box.now = T0 + 15
    box.write(*decoding(T0 + 5, 3))
    for t in range(int(T0) + 25, int(T0) + 15 + 600, 10):
        box.step(t)
    assert box.stalled() == []


def test_replay_fires_at_the_line_that_shows_the_gap(tmp_path):
    """A recorded log: 32 running, 2.5 min without a decode line, then the same batch decoding
    again: the stall is in the replay's history, fired and resolved."""
    lines = decoding(T0, 4) + [access(T0 + 20 + 10 * i) for i in range(15)] + decoding(T0 + 15 + 150, 2)
    fired = replayed(tmp_path, lines)
    assert [(a.status, dict(a.evidence)["no decode line for"]) for a in fired] == [("firing", "150s"), ("resolved", "150s")]
    assert replayed(tmp_path, decoding(T0, 4) + decoding(T0 + 15 + 100, 2)) == []  # under silent_for: nothing
    assert replayed(tmp_path, decoding(T0, 4, running=0) + decoding(T0 + 15 + 150, 2)) == []  # nothing was running
    # longer than silent_for + the watchdog timeout (300 s): not the same batch resuming (spliced lines)
    assert replayed(tmp_path, decoding(T0, 4) + decoding(T0 + 15 + 421, 2)) == []
    # traffic that stopped and came back: the first line after the gap is a prefill line whose
    # batch is empty (the burst drained), not the same batch decoding on
    resumed = (f"[{stamp(T0 + 15 + 600)}] Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, "
               "token usage: 0.00, #running-req: 0, #queue-req: 0, input throughput (token/s): 0.00")
    assert replayed(tmp_path, decoding(T0, 4) + [resumed] + decoding(T0 + 15 + 605, 2)) == []
    # a restart that ends the silence: the hang that led to it, as the live clock saw it during
    # the gap (fired, then resolved by the restart)
    restart = f"[{stamp(T0 + 15 + 200)}] server_args=ServerArgs(model_path='/m', speculative_algorithm='EAGLE3', tp_size=1)"
    fired = replayed(tmp_path, decoding(T0, 4) + [restart] + decoding(T0 + 15 + 205, 2))
    assert [(a.status, dict(a.evidence)["no decode line for"]) for a in fired] == [("firing", "200s"), ("resolved", "200s")]
    assert dict(fired[1].evidence)["server"] == "the server restarted (new server_args line)"
    assert replayed(tmp_path, decoding(T0, 4) + [restart.replace(stamp(T0 + 215), stamp(T0 + 115))]) == []  # under silent_for
    assert replayed(tmp_path, decoding(T0, 4, running=0) + [restart]) == []  # nothing was running


def test_log_only_silence_after_a_draining_batch_is_a_warning_not_a_page(tmp_path):
    """A burst that drains (32, 20, 8 running) and then nothing: SGLang logs every
    --decode-log-interval rounds, so the last line shows requests that may well have finished.
    The log alone cannot tell that from a wedge: a warning, not a page; a steady batch pages."""
    box = Box(tmp_path, None)
    box.now = last = T0 + 15
    box.write(*[decode_line("0.5.23", ts=stamp(T0 + 5 * (i + 1)), accept_len=2.1, running=r)[0]
                for i, r in enumerate((32, 20, 8))])
    for t in range(int(last) + 10, int(last) + 151, 10):
        box.step(t)
    [(status, at)] = box.stalled()
    assert status == "firing" and at == last + 120
    [alert] = [a for a in box.p.dispatcher.history if a.name == ALERT_NAME]
    assert alert.labels["severity"] == "warning"
    assert dict(alert.evidence)["running requests at the last decode line"] == "8"


def test_specwatch_replay_reports_the_hang_a_restart_ended(tmp_path):
    """tests/data/gap_restart.log (a new user's reproduction): 30 decode lines with 32 running,
    3 minutes of nothing, a new `server_args` line, 10 decode lines. `specwatch replay` named no
    alert; the live daemon fired DecodeStalled during the gap."""
    import subprocess

    data = Path(__file__).resolve().parents[1] / "data" / "gap_restart.log"
    r = subprocess.run([sys.executable, "-m", "specwatch", "replay", str(data)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "ALERT DecodeStalled on gap_restart" in r.stdout and "no decode line for 181s" in r.stdout
    assert "alerts: none" not in r.stdout


def test_ranks_read_in_one_second_count_in_file_order(tmp_path):
    """Two DP ranks write in the same second, then 150 s of nothing, then a decode line (a
    replay: one evaluation holds that second's lines). What each rank's last line said counts
    in the order the lines were written, across ranks: a prefill line showing a rank's batch
    empty after its decode line says the burst drained; before it, it says nothing about the
    batch after it. The server's last decode line is the last one written, whichever rank."""
    dp = [{"DP": 0, "TP": 0}, {"DP": 1, "TP": 1}]

    def dec(t: float, rank: int, running: int) -> str:
        return decode_line("0.5.23", ts=stamp(t), rank=dp[rank], accept_len=2.1, running=running)[0]

    def pre(t: float, rank: int) -> str:
        return (f"[{stamp(t)} DP{rank} TP{rank}] Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, "
                "token usage: 0.00, #running-req: 0, #queue-req: 0, input throughput (token/s): 0.00")

    t, later = T0 + 20, T0 + 170
    before = [dec(T0 + 10, 0, 4), dec(T0 + 10, 1, 8)]
    drained = [dec(t, 0, 4), dec(t, 1, 6), pre(t, 0), pre(t, 1)]
    assert replayed(tmp_path, before + drained + [dec(later, 0, 1)]) == []
    running = [pre(t, 0), dec(t, 0, 4), dec(t, 1, 6)]
    fired, resolved = replayed(tmp_path, before + running + [dec(later, 0, 1)])
    ev = dict(fired.evidence)
    assert (fired.starts_at, resolved.ends_at) == (later, later)
    assert ev["running requests at the last decode line"] == "10"
    assert ev["ranks"] == "DP0 TP0: 4 running, DP1 TP1: 6 running"
    assert ev["last decode line"].endswith("DP1 TP1: Decode batch, #running-req: 6, #queue-req: 0, accept len: 2.10, "
                                           "gen throughput (token/s): 400.57")
    assert fired.labels["severity"] == "warning"  # DP1's batch shrank (8 → 6) at the last line
    # DP0's line written last (after a prefill line, so not shrinking): the same lines page
    fired, _ = replayed(tmp_path, before + [pre(t, 0), dec(t, 1, 6), dec(t, 0, 4), dec(later, 0, 1)])
    assert fired.labels["severity"] == "critical"
    assert "DP0 TP0: Decode batch, #running-req: 4" in dict(fired.evidence)["last decode line"]
    # live: the same lines in one read, then only the clock (the ticks fire at silent_for)
    for i, (lines, severity) in enumerate([(drained, None), (running, "warning"),
                                           ([pre(t, 0), dec(t, 1, 6), dec(t, 0, 4)], "critical")]):
        (tmp_path / str(i)).mkdir()
        box = Box(tmp_path / str(i), None)
        box.now = t + 1
        box.write(*before, *lines)
        for at in range(int(t) + 11, int(t) + 152, 10):
            box.step(at)
        got = [a.labels["severity"] for a in box.p.dispatcher.history if a.name == ALERT_NAME]
        assert got == ([] if severity is None else [severity]), i
