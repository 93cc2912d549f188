"""Wiring from the config: per-route Slack channels and webhooks, shared queues, replay mode."""

from __future__ import annotations

from specwatch.alerting import build_alerting
from specwatch.alerts.model import Alert
from specwatch.config import build_config
from slack_endpoint import SlackEndpoint


def alert(name, severity, rank="TP0"):
    return Alert(labels={"alertname": name, "severity": severity, "server": "box", "rank": rank},
                 annotations={"summary": name}, starts_at=1000.0, evidence=[("accept len", "1.00")])


def test_routes_send_to_their_own_channel_and_webhook(slack, tmp_path):
    other = SlackEndpoint()
    try:
        cfg = build_config({"alerts": {
            "group_by": ["..."], "group_wait": "0s", "group_interval": "0s",
            "slack": {"webhook_url": slack.url, "channel": "#gpu"},
            "routes": [
                {"name": "critical", "matchers": ["severity=critical"], "slack": {"channel": "#oncall"}},
                {"name": "infra", "matchers": ["alertname=~Throughput.*"], "slack": {"webhook_url": other.url}},
                {"name": "same", "matchers": ["alertname=Same"], "slack": {"channel": "#oncall"}},
            ]}})
        d, notifiers = build_alerting(cfg, state_dir=tmp_path)
        assert sorted(notifiers) == ["slack", "slack/critical", "slack/infra"]  # `same` shares `critical`'s queue
        assert notifiers["slack/critical"].queue_path == tmp_path / "slack_critical-queue.json"
        d.handle(alert("AcceptanceCollapse", "critical"), now=2000)
        d.handle(alert("ThroughputDrop", "warning", rank="TP1"), now=2000)  # TP0: inhibited by the collapse
        d.handle(alert("AcceptanceDrift", "warning"), now=2000)
        d.handle(alert("Same", "warning"), now=2000)
        for n in notifiers.values():
            assert n.drain(5)
        assert sorted((b["channel"], b["text"].split(" on ")[0]) for b in slack.received) == [
            ("#gpu", "[FIRING] AcceptanceDrift"), ("#oncall", "[FIRING] AcceptanceCollapse"),
            ("#oncall", "[FIRING] Same")]
        assert [(b["channel"], b["text"].split(" on ")[0]) for b in other.received] == [
            ("#gpu", "[FIRING] ThroughputDrop")]  # another webhook, alerts.slack's channel kept
    finally:
        other.close()


def test_replay_sends_at_once_and_never_pushes():
    cfg = build_config({"alerts": {"alertmanager": {"urls": ["http://127.0.0.1:9"]},
                                   "routes": [{"matchers": ["severity=critical"], "group_wait": "1m"}]}})
    d, notifiers = build_alerting(cfg, state_dir=None, replay=True)
    assert notifiers == {} and d.pushers == [] and d.silences is None and d.keep_history
    assert (d.default_route.group_wait, d.default_route.group_interval) == (0.0, 0.0)
    assert d.routes[0].group_wait == 0.0
    d2, notifiers2 = build_alerting(cfg, state_dir=None)
    assert list(notifiers2) == ["alertmanager/127.0.0.1:9"] and d2.routes[0].group_wait == 60
    assert d2.default_route.group_wait == 0  # the daemon's default (Alertmanager: 30s)


def test_default_timers_send_a_resolve_within_a_minute():
    """With the shipped defaults a collapse goes out at once (group_wait 0s), however long ago
    its first low line was, and its resolve at the group's next tick, at most group_interval (1m)
    later."""
    from specwatch.alerts.model import Alert

    d, _ = build_alerting(build_config({}), state_dir=None)
    got = []
    rcv = type("Rec", (), {"name": "rec", "send_resolved": True, "notify": lambda self, n: got.append(n)})()
    d.default_route.receivers = [rcv]
    a = Alert(labels={"alertname": "AcceptanceCollapse", "server": "s", "rank": "TP0"}, annotations={},
              starts_at=100.0)
    d.handle(a, now=103.0)
    assert [n.status for n in got] == ["firing"]
    r = Alert.from_dict(a.to_dict())
    r.status, r.ends_at = "resolved", 103.5
    d.handle(r, now=103.5)
    d.tick(162.9)
    assert len(got) == 1
    d.tick(163.0)
    assert [n.status for n in got] == ["firing", "resolved"]
