"""Pushing to a real Alertmanager: read back, re-send, silences, HA dedup, Slack end to end."""

from __future__ import annotations

import logging
import time

import pytest

from alertmanager import slack_receiver
from procs import free_port, wait_for
from specwatch.alerts.model import Alert
from specwatch.notifiers.alertmanager import AlertmanagerNotifier
from specwatch_daemon import SpecwatchDaemon


def alert(server="sglang-0", rank="DP0 TP0", status="firing", starts_at=None, ends_at=None, name="AcceptanceCollapse"):
    return Alert(
        labels={"alertname": name, "severity": "critical", "server": server, "rank": rank},
        annotations={"summary": f"Speculative decoding collapsed on {server} {rank}: accept len 1.02",
                     "description": "The target rejects every draft token."},
        starts_at=starts_at if starts_at is not None else time.time() - 60,
        evidence=[("accept len", "1.02"), ("running requests", "32")],
        fixes=["Rename layers.0 to midlayer", "Check set_eagle3_layers_to_capture"],
        status=status, ends_at=ends_at,
    )


def notifier(url, **kw):
    kw.setdefault("backoff_initial", 0.05)
    kw.setdefault("backoff_max", 0.2)
    kw.setdefault("timeout", 2.0)
    return AlertmanagerNotifier(url, **kw)


def test_push_is_read_back_with_labels_annotations_and_times(alertmanager):
    am = alertmanager()
    n = notifier(am.url, resend_delay=30)
    a = alert()
    assert n.sync([a], time.time(), changed=True)
    assert n.drain(5) and n.sent_total == 1
    [got] = am.alerts()
    assert got["labels"] == {"alertname": "AcceptanceCollapse", "severity": "critical", "server": "sglang-0",
                             "rank": "DP0 TP0"}
    assert got["annotations"] == {
        "summary": "Speculative decoding collapsed on sglang-0 DP0 TP0: accept len 1.02",
        "description": "The target rejects every draft token.",
        "evidence": "accept len: 1.02\nrunning requests: 32",
        "fixes": "1. Rename layers.0 to midlayer\n2. Check set_eagle3_layers_to_capture",
    }
    assert got["status"]["state"] == "active"
    assert got["startsAt"].startswith(time.strftime("%Y-%m-%dT%H:%M", time.gmtime(a.starts_at)))
    # a firing alert is valid for 4 × resend_delay: Alertmanager resolves it if we vanish
    ends = time.mktime(time.strptime(got["endsAt"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    assert 110 <= ends - time.time() <= 121


def test_resend_schedule_and_resolved_retention(alertmanager):
    am = alertmanager()
    n = notifier(am.url, resend_delay=60, resolved_retention=900)
    a = alert()
    assert n.sync([a], 1000.0, changed=True)
    assert not n.sync([a], 1059.0, changed=False)  # not due yet
    assert n.sync([a], 1060.0, changed=False)  # re-sent every resend_delay
    n.drain(5)
    assert n.sent_total == 1  # the second snapshot replaced the unsent first one
    assert [x["labels"]["server"] for x in am.alerts()] == ["sglang-0"]
    resolved = alert(status="resolved", ends_at=time.time() - 1)
    assert n.sync([resolved], 1100.0, changed=True)
    n.drain(5)
    assert am.alerts() == []  # Alertmanager lists only unresolved alerts
    assert n.sync([resolved], 1100.0 + 899, changed=True)  # still sent within the retention
    assert n._pending[0]["data"]["alerts"][0]["status"] == "resolved"
    n.drain(5)
    assert n.sync([resolved], resolved.ends_at + 900, changed=True)
    assert n._pending[0]["data"]["alerts"] == []  # dropped after the retention


def test_400_is_permanent_and_logged_once(alertmanager, caplog):
    am = alertmanager()
    n = notifier(am.url)
    bad = alert()
    bad.labels["bad-label"] = "x"  # not a valid label name: Alertmanager answers 400
    n.sync([bad], time.time(), changed=True)
    with caplog.at_level(logging.WARNING):
        assert n.drain(5)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "HTTP 400" in errors[0].getMessage()
    assert n.failed_total == {"permanent": 1, "retry": 0} and n.queue_depth == 0
    n.sync([alert(server="ok")], time.time(), changed=True)  # the next snapshot goes through
    assert n.drain(5) and n.sent_total == 1
    assert [x["labels"]["server"] for x in am.alerts()] == ["ok"]


def test_outage_then_restart_delivers_the_newest_snapshot_once(alertmanager, tmp_path):
    port = free_port()
    qp = tmp_path / "am-queue.json"
    url = f"http://127.0.0.1:{port}"
    n1 = notifier(url, queue_path=qp)
    n1.sync([alert(server="a")], 1000.0, changed=True)
    n1.start()
    assert wait_for(lambda: n1.failed_total["retry"] >= 2, what="failed attempts")
    n1.sync([alert(server="a"), alert(server="b")], 1001.0, changed=True)  # coalesced while down
    # (if it arrived during an attempt, that failed attempt's item is dropped as superseded)
    assert wait_for(lambda: n1.queue_depth == 1, what="one snapshot queued")
    assert n1.stop(5)
    am = alertmanager(port=port)
    n2 = notifier(url, queue_path=qp)  # specwatch restarted
    assert n2.queue_depth == 1
    assert n2.drain(5) and n2.sent_total == 1
    assert sorted(x["labels"]["server"] for x in am.alerts()) == ["a", "b"]
    assert notifier(url, queue_path=qp).queue_depth == 0  # nothing left to send twice


def test_silence_in_alertmanager_suppresses_the_notification(alertmanager, slack):
    am = alertmanager(slack_receiver(slack.url), group_by=["alertname"])
    sid = am.silence(["server=sglang-1"])
    n = notifier(am.url)
    n.sync([alert(server="sglang-1"), alert(server="sglang-2")], time.time(), changed=True)
    assert n.drain(5)
    wait_for(lambda: slack.received, timeout=10, what="Alertmanager's Slack message")
    state = {x["labels"]["server"]: x["status"] for x in am.alerts()}
    assert state["sglang-1"] == {"state": "suppressed", "silencedBy": [sid], "inhibitedBy": []}
    assert state["sglang-2"]["state"] == "active"
    [msg] = slack.received
    text = msg["attachments"][0]["text"]
    assert "sglang-2 DP0 TP0: Speculative decoding collapsed on sglang-2 DP0 TP0" in text
    assert "sglang-1" not in text  # one group, but the silenced alert is left out of it


def collapse_lines(ts0: int, n: int, accept: float) -> str:
    return "".join(
        f"[2026-02-23 16:{(ts0 + i) // 60:02d}:{(ts0 + i) % 60:02d} DP0 TP0] Decode batch, #running-req: 32, "
        f"#token: 2268, token usage: 0.02, accept len: {accept:.2f}, accept rate: 0.01, cuda graph: True, "
        f"gen throughput (token/s): 120.00, #queue-req: 0\n" for i in range(n))


def test_two_specwatch_instances_and_two_alertmanagers_end_to_end(alertmanager, slack, tmp_path):
    """An HA pair of Alertmanagers (not clustered) and two specwatch daemons following the same log:
    each Alertmanager holds one alert; the Slack receiver gets one firing and one resolved message."""
    am_a = alertmanager(slack_receiver(slack.url))
    am_b = alertmanager()
    log = tmp_path / "sglang.log"
    log.write_text("")
    alerts = {"alertmanager": {"urls": [am_a.url, am_b.url], "resend_delay": "1s", "backoff_initial": "0.1s",
                               "backoff_max": "0.5s"}}
    daemons = [SpecwatchDaemon(tmp_path, log, name=f"sw{i}", server="gpu-box-1", alerts=alerts).start()
               for i in range(2)]
    try:
        with open(log, "a") as f:
            f.write(collapse_lines(0, 3, 1.01))
        for am in (am_a, am_b):
            wait_for(lambda am=am: am.alerts(), timeout=20, what="the pushed alert")
        time.sleep(2.5)  # both instances re-send (resend_delay 1s) several times meanwhile
        for am in (am_a, am_b):
            [got] = am.alerts()
            assert got["labels"] == {"alertname": "AcceptanceCollapse", "severity": "critical",
                                     "server": "gpu-box-1", "rank": "DP0 TP0", "engine": "sglang"}
            assert got["annotations"]["summary"] == "Speculative decoding collapsed on gpu-box-1 DP0 TP0: accept len 1.01"
            assert "midlayer" in got["annotations"]["fixes"]
        firing = wait_for(lambda: slack.received, timeout=10, what="the firing Slack message")
        assert firing[0]["attachments"][0]["title"] == "[FIRING] AcceptanceCollapse"
        with open(log, "a") as f:
            f.write(collapse_lines(10, 3, 2.9))
        wait_for(lambda: not am_a.alerts() and not am_b.alerts(), timeout=20, what="the resolve")
        wait_for(lambda: len(slack.received) == 2, timeout=10, what="the resolved Slack message")
        assert slack.received[1]["attachments"][0]["title"] == "[RESOLVED] AcceptanceCollapse"
        for d in daemons:
            m = d.scrape()
            assert m[("specwatch_notification_queue_depth", (("notifier", f"alertmanager/127.0.0.1:{am_a.port}"),))] == 0
            assert m[("specwatch_notifications_sent_total", (("notifier", f"alertmanager/127.0.0.1:{am_b.port}"),))] >= 2
    finally:
        for d in daemons:
            rc, out = d.stop()
            assert rc == 0, out
    assert len(slack.received) == 2


@pytest.mark.parametrize("bad", ["ftp://am:9093", ""])
def test_bad_url(bad):
    with pytest.raises(ValueError):
        AlertmanagerNotifier(bad)
