"""Generic webhook: Alertmanager's version-4 payload, delivered through the shared queue."""

from __future__ import annotations

import copy
import logging

from specwatch.alerts.dispatcher import Dispatcher
from specwatch.alerts.model import Alert, Notification
from specwatch.notifiers.webhook import ZERO_TIME, WebhookNotifier, build_webhook_payload
from slack_endpoint import SECRET_PATH

T0 = 1771864362.0  # 2026-02-23T16:32:42Z


def alert(rank, name="AcceptanceCollapse", status="firing", ends_at=None):
    return Alert(labels={"alertname": name, "severity": "critical", "server": "sglang-0", "rank": rank},
                 annotations={"summary": f"collapsed on {rank}", "description": "all drafts rejected"},
                 starts_at=T0, evidence=[("accept len", "1.00")], fixes=["check the draft"], status=status,
                 ends_at=ends_at)


def hook(url, **kw):
    kw.setdefault("backoff_initial", 0.05)
    kw.setdefault("backoff_max", 0.2)
    kw.setdefault("timeout", 2.0)
    return WebhookNotifier(url, name="webhook/ops", **kw)


def test_group_notification_is_alertmanagers_v4_payload(slack):
    n = hook(slack.url, external_url="http://specwatch.example:9849")
    d = Dispatcher([n], group_by=["alertname"], group_wait=0, group_interval=0)
    a0 = alert("DP0 TP0")
    d.handle(a0, now=T0)
    d.handle(alert("DP1 TP1"), now=T0 + 1)
    r = copy.deepcopy(a0)
    r.status, r.ends_at = "resolved", T0 + 312
    d.handle(r, now=T0 + 312)
    assert n.drain(5) and n.sent_total == 3
    first, second, third = slack.received
    assert first == {
        "version": "4",
        "groupKey": "default:{alertname='AcceptanceCollapse'}",
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "webhook/ops",
        "groupLabels": {"alertname": "AcceptanceCollapse"},
        "commonLabels": {"alertname": "AcceptanceCollapse", "severity": "critical", "server": "sglang-0",
                         "rank": "DP0 TP0"},
        "commonAnnotations": {"summary": "collapsed on DP0 TP0", "description": "all drafts rejected",
                              "evidence": "accept len: 1.00", "fixes": "1. check the draft"},
        "externalURL": "http://specwatch.example:9849",
        "alerts": [{
            "status": "firing",
            "labels": {"alertname": "AcceptanceCollapse", "severity": "critical", "server": "sglang-0",
                       "rank": "DP0 TP0"},
            "annotations": {"summary": "collapsed on DP0 TP0", "description": "all drafts rejected",
                            "evidence": "accept len: 1.00", "fixes": "1. check the draft"},
            "startsAt": "2026-02-23T16:32:42Z",
            "endsAt": ZERO_TIME,
            "generatorURL": "http://specwatch.example:9849",
            "fingerprint": a0.fingerprint,
        }],
    }
    assert [a["labels"]["rank"] for a in second["alerts"]] == ["DP0 TP0", "DP1 TP1"]
    assert second["commonLabels"] == {"alertname": "AcceptanceCollapse", "severity": "critical", "server": "sglang-0"}
    assert second["commonAnnotations"] == {"description": "all drafts rejected", "evidence": "accept len: 1.00",
                                           "fixes": "1. check the draft"}
    assert third["status"] == "firing"  # DP1 still fires
    assert [(a["labels"]["rank"], a["status"], a["endsAt"]) for a in third["alerts"]] == [
        ("DP1 TP1", "firing", ZERO_TIME), ("DP0 TP0", "resolved", "2026-02-23T16:37:54Z")]
    assert slack.paths == [SECRET_PATH] * 3


def test_max_alerts_truncates():
    n = Notification("webhook/ops", "k", {}, [alert(f"DP{i} TP{i}") for i in range(5)])
    p = build_webhook_payload(n, max_alerts=2)
    assert len(p["alerts"]) == 2 and p["truncatedAlerts"] == 3
    assert p["commonLabels"]["server"] == "sglang-0"


def test_retries_5xx_and_429_keeps_a_4xx_once_and_hides_the_url(slack, caplog):
    """5xx and 429 are retried; a 404 is logged once and kept, and sent again once the receiver
    took the next one."""
    slack.script.extend([(503, {}, "busy"), (429, {"Retry-After": "0"}, "slow down"), (200, {}, "{}"),
                         (404, {}, "no such hook"), (204, {}, "")])
    n = hook(slack.url)
    for i in range(3):
        n.notify(Notification("webhook/ops", f"k{i}", {}, [alert(f"DP{i} TP{i}")]))
    with caplog.at_level(logging.DEBUG):
        assert n.drain(5)
    assert [b["groupKey"] for b in slack.received] == ["k0", "k0", "k0", "k1", "k2", "k1"]
    assert n.sent_total == 3 and n.failed_total == {"permanent": 1, "retry": 2} and n.dead_letter_count == 0
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "HTTP 404" in errors[0]
    assert "s3cr3tT0ken" not in caplog.text and "s3cr3tT0ken" not in repr(n)
