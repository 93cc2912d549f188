"""The daemon under systemd's protocols, with real parts: a `specwatch run` subprocess sends its
sd_notify datagrams to a real AF_UNIX socket given as $NOTIFY_SOCKET, and is reloaded with real
SIGHUPs (valid and invalid configs). Health gating of WATCHDOG=1 is checked on a Daemon run
in-process, where the test can break a thread."""

from __future__ import annotations

import signal
import threading
import time
import urllib.request

import pytest
import yaml

from procs import NotifySocket, SpecwatchProcess, decode_line, free_port, rank_labels, wait_for
from slack_endpoint import SlackEndpoint
from specwatch_daemon import SpecwatchDaemon
from specwatch import daemon as daemon_mod
from specwatch.config import load_run_config
from specwatch.system.sdnotify import Watchdog


@pytest.fixture
def notify_socket(tmp_path):
    s = NotifySocket(tmp_path / "notify.sock")
    yield s
    s.close()


def write_config(path, port, state, logs, extra=""):
    entries = "".join(f"  - path: {p}\n    server: {srv}\n" for p, srv in logs)
    path.write_text(f"logs:\n{entries}follow:\n  poll_interval: 0.2s\nmetrics:\n  listen_port: {port}\n"
                    f"state_dir: {state}\ngpu:\n  enabled: false\n{extra}")


def reload_metrics(m):
    return m[("specwatch_config_reload_success", ())], m[("specwatch_config_last_reload_success_timestamp_seconds", ())]


def one_log_agent(tmp_path, notify_socket, first_accept: float, **env):
    """An agent (not started) following one log that holds one decode line, server "box"."""
    log = tmp_path / "a.log"
    log.write_text(decode_line(first_accept, "10:00:00"))
    port = free_port()
    cfg = tmp_path / "c.yaml"
    write_config(cfg, port, tmp_path / "state", [(log, "box")])
    return SpecwatchProcess(cfg, port, env={"NOTIFY_SOCKET": notify_socket.path, **env}), log, cfg


def test_ready_status_watchdog_stopping(tmp_path, notify_socket):
    p, _, _ = one_log_agent(tmp_path, notify_socket, 2.5, WATCHDOG_USEC="1000000")
    port = p.port
    p.start(wait=False)
    try:
        [(_, ready)] = notify_socket.wait("READY", "1")
        # READY=1 promises a working listener: no retry here.
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "specwatch_build_info" in body
        assert ready["STATUS"].startswith("following 1 log(s)") and f"metrics on port {port}" in ready["STATUS"]
        assert notify_socket.messages[0][1] == ready  # nothing before READY

        # WatchdogSec=1s: a ping every 0.5 s from the main loop (counted, not timed: the
        # receiving thread may take queued datagrams back to back)
        n0, t0 = len(notify_socket.with_key("WATCHDOG", "1")), time.monotonic()
        wait_for(lambda: len(notify_socket.with_key("WATCHDOG", "1")) - n0 >= 3, timeout=30, what="3 more pings")
        n = len(notify_socket.with_key("WATCHDOG", "1")) - n0
        assert n <= (time.monotonic() - t0) / 0.5 + 1, n  # not more often than every 0.5 s
        # routine STATUS updates carry counts
        wait_for(lambda: p.scrape()[("specwatch_decode_batches_total", rank_labels("box"))] == 1, what="line read")
    finally:
        rc = p.stop()
    assert rc == 0, p.output
    last = notify_socket.messages[-1][1]
    assert last["STOPPING"] == "1" and last["STATUS"].startswith("stopping")


def test_watchdog_env():
    assert Watchdog({}).period is None
    assert Watchdog({"WATCHDOG_USEC": "30000000"}).period == 15.0
    assert Watchdog({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}).period is None  # not for us
    assert Watchdog({"WATCHDOG_USEC": "nope"}).period is None
    w = Watchdog({"WATCHDOG_USEC": "2000000"})
    w.ping_if_due(100.0)
    assert not w.ping_if_due(100.5) and w._last == 100.0


def test_sighup_reload_applies_logs_rules_and_slack(tmp_path, notify_socket, slack):
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text(decode_line(2.5, "10:00:00"))
    b.write_text("")
    port = free_port()
    cfg = tmp_path / "c.yaml"
    write_config(cfg, port, tmp_path / "state", [(a, "box-a")])
    p = SpecwatchProcess(cfg, port, env={"NOTIFY_SOCKET": notify_socket.path}).start()
    try:
        notify_socket.wait("READY", "1")
        ok, started = reload_metrics(p.scrape())
        assert ok == 1 and abs(started - time.time()) < 30

        # New file: follow b instead of a, collapse at accept len <= 1.5 after one batch,
        # Slack on, and a port change (restart-only: warned, old port kept).
        write_config(cfg, free_port(), tmp_path / "state", [(b, "box-b")],
                     "rules:\n  collapse:\n    max_accept_length: 1.5\n    min_batches: 1\n"
                     "    recover_accept_length: 2.0\n"
                     f"alerts:\n  slack:\n    webhook_url: {slack.url}\n    backoff_initial: 0.1s\n")
        p.signal(signal.SIGHUP)
        notify_socket.wait("RELOADING", "1")
        t_ready, again = notify_socket.wait("READY", "1", count=2)[1]
        reloading = notify_socket.with_key("RELOADING", "1")[0]
        assert reloading[0] <= t_ready and int(reloading[1]["MONOTONIC_USEC"]) > 0
        assert again["STATUS"].startswith("following 1 log(s)")

        m = p.scrape()  # still on the old port
        ok, reloaded = reload_metrics(m)
        assert ok == 1 and reloaded > started
        assert ("specwatch_log_file_open", (("path", str(b)),)) in m
        assert ("specwatch_log_file_open", (("path", str(a)),)) not in m
        assert "listen_port changed; it takes effect after a restart" in p.output

        # 1.30 is no collapse under the old rule (1.10, three batches); it is under the new one.
        with open(b, "a") as f:
            f.write(decode_line(1.30, "10:01:00"))
        m = wait_for(lambda: (x := p.scrape()).get(("specwatch_decode_batches_total", rank_labels("box-b"))) == 1 and x,
                     what="b's line read")
        assert m[("specwatch_acceptance_collapsed", rank_labels("box-b"))] == 1
        [msg] = wait_for(lambda: [x for x, ok in zip(slack.received, slack.answered_ok) if ok], what="Slack message")
        assert msg["text"].startswith("[FIRING] AcceptanceCollapse on box-b TP0")
        # box-a left the config: forgotten (its series gone), and a's lines are no longer read
        # (a line read would bring the series back)
        assert ("specwatch_decode_batches_total", rank_labels("box-a")) not in p.scrape()
        with open(a, "a") as f:
            f.write(decode_line(2.5, "10:01:01"))
        time.sleep(0.6)
        assert ("specwatch_decode_batches_total", rank_labels("box-a")) not in p.scrape()
    finally:
        assert p.stop() == 0, p.output


def test_sighup_reload_rebuilds_routes_and_notifiers_and_resends_nothing(tmp_path, slack):
    """alerts.* change live: a new webhook and route, Slack rebuilt on its queue file. A receiver
    that was told already (Slack, known by name) is not told again; a new one (the webhook, on
    the default route too) gets what fires; counters carry over; new alerts take the new route."""
    hook = SlackEndpoint()  # any 200 is a delivered webhook
    log = tmp_path / "a.log"
    log.write_text("")
    alerts = {"group_by": ["..."], "group_wait": "0s", "group_interval": "0s",
              "slack": {"webhook_url": slack.url, "backoff_initial": "0.1s"}}
    d = SpecwatchDaemon(tmp_path, log, alerts=alerts, rules={"collapse": {"min_batches": 1}}).start()
    try:
        with open(log, "a") as f:
            f.write(decode_line(1.02, "10:00:00", rank="TP0"))
        wait_for(lambda: len(slack.received) == 1, what="TP0's collapse in Slack")
        doc = yaml.safe_load(d.cfg.read_text())
        doc["alerts"]["slack"]["backoff_initial"] = "0.2s"
        doc["alerts"]["webhooks"] = [{"name": "ops", "url": hook.url}]
        doc["alerts"]["routes"] = [{"name": "tp1", "matchers": ["rank=TP1"], "webhooks": ["ops"]}]
        d.cfg.write_text(yaml.safe_dump(doc))
        d.signal(signal.SIGHUP)
        wait_for(lambda: len(hook.received) == 1, what="the firing TP0 at the new webhook (default route)")
        assert [a["labels"]["rank"] for a in hook.received[0]["alerts"]] == ["TP0"]
        m = d.scrape()
        assert m[("specwatch_config_reload_success", ())] == 1
        assert m[("specwatch_notifications_sent_total", (("notifier", "slack"),))] == 1  # carried over
        with open(log, "a") as f:
            f.write(decode_line(1.02, "10:00:02", rank="TP1"))
        wait_for(lambda: len(hook.received) == 2, what="TP1's collapse at the webhook")
        assert [a["labels"]["rank"] for a in hook.received[1]["alerts"]] == ["TP1"]
        time.sleep(1.0)
        assert len(slack.received) == 1  # TP0 not re-sent, TP1 routed away from Slack
        assert len(hook.received) == 2
        assert d.saved()[1] == {}  # both queues delivered and their rows deleted
    finally:
        rc, out = d.stop()
        hook.close()
    assert rc == 0, out
    assert "notifiers: webhook/ops, slack" in out


def test_sighup_invalid_config_keeps_the_old_one(tmp_path, notify_socket):
    p, log, cfg = one_log_agent(tmp_path, notify_socket, 1.05)
    good = cfg.read_text()
    p.start()
    try:
        notify_socket.wait("READY", "1")
        _, started = reload_metrics(p.scrape())

        cfg.write_text(good + "rules:\n  collapse:\n    min_batches: zero\n")
        p.signal(signal.SIGHUP)
        [_, (_, ready)] = notify_socket.wait("READY", "1", count=2)
        assert "FAILED" in ready["STATUS"] and "previous config" in ready["STATUS"]
        m = p.scrape()
        assert reload_metrics(m) == (0, started)
        assert "config reload from" in p.output and "rules.collapse.min_batches: must be an integer" in p.output

        # The old config keeps working: the default rule (three batches <= 1.10) fires.
        with open(log, "a") as f:
            f.write(decode_line(1.05, "10:00:01") + decode_line(1.05, "10:00:02"))
        wait_for(lambda: p.scrape().get(("specwatch_acceptance_collapsed", rank_labels("box"))) == 1,
                 what="collapse under the old rules")

        cfg.write_text("logs: [")  # not even YAML
        p.signal(signal.SIGHUP)
        notify_socket.wait("READY", "1", count=3)
        assert "not valid YAML" in p.output and p.proc.poll() is None

        cfg.write_text(good)
        p.signal(signal.SIGHUP)
        notify_socket.wait("READY", "1", count=4)
        ok, ts = reload_metrics(p.scrape())
        assert ok == 1 and ts > started
    finally:
        assert p.stop() == 0, p.output


@pytest.fixture
def inprocess(tmp_path, notify_socket, monkeypatch):
    """A Daemon running its real main loop on a thread (signals are the main thread's)."""
    monkeypatch.setenv("NOTIFY_SOCKET", notify_socket.path)
    monkeypatch.setenv("WATCHDOG_USEC", "400000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.setattr(daemon_mod, "LOCK_WAIT", 0.3)
    log = tmp_path / "a.log"
    log.write_text("")
    cfg = tmp_path / "c.yaml"
    write_config(cfg, 0, tmp_path / "state", [(log, "box")])
    d = daemon_mod.Daemon(load_run_config(cfg))
    result = []
    t = threading.Thread(target=lambda: result.append(d.run()), daemon=True)
    t.start()
    notify_socket.wait("READY", "1")
    yield d
    d._request(reload=False)
    t.join(15)
    assert result == [0]


def pings(sock) -> int:
    return len(sock.with_key("WATCHDOG", "1"))


def no_pings_once_unhealthy(sock, status: str) -> int:
    """Wait for the STATUS=unhealthy message, then check that no ping follows it for five
    watchdog periods. Datagrams arrive in order, so every earlier ping is counted already."""
    sock.wait("STATUS", status)
    n = pings(sock)
    time.sleep(1.0)
    assert pings(sock) == n
    return n


def test_watchdog_stops_when_the_follower_thread_dies(inprocess, notify_socket):
    d = inprocess
    assert d.health() is None
    notify_socket.wait("WATCHDOG", "1", count=3)
    d.followers.stop()
    no_pings_once_unhealthy(notify_socket, "unhealthy: log follower thread is not running")


def test_watchdog_stops_while_the_pipeline_is_wedged_and_resumes(inprocess, notify_socket):
    d = inprocess
    with d.pipeline.lock:  # what a stuck rule or scrape would do
        n = no_pings_once_unhealthy(notify_socket, "unhealthy: pipeline lock held for more than 0.3s")
    wait_for(lambda: pings(notify_socket) > n, what="pings after recovery")
    assert d.health() is None


def test_health_reports_followers_without_progress(inprocess):
    d = inprocess
    d._progress -= d.wedged_after + 100  # as if no line nor poll round for that long
    problem = d.health()
    assert problem is not None and problem.startswith("log followers made no progress for")
    wait_for(lambda: d.health() is None, what="the next poll round to count as progress")
