"""SlackNotifier with a bot token against a real HTTP server on 127.0.0.1 answering as Slack's Web
API does (chat.postMessage, chat.update): one message per incident, edited in place."""

from __future__ import annotations

import copy

from specwatch.alerts.model import RESOLVED, Alert, Notification
from specwatch.config import ConfigError, build_config
from specwatch.notifiers.slack import SlackNotifier

T0 = 1771864362.0


def collapse(rank: str) -> Alert:
    return Alert(labels={"alertname": "AcceptanceCollapse", "severity": "critical", "server": "s", "rank": rank},
                 annotations={"summary": f"collapsed on {rank}"}, starts_at=T0)


def group(*alerts: Alert) -> Notification:
    return Notification("slack", "default:{alertname='AcceptanceCollapse',server='s'}",
                        {"alertname": "AcceptanceCollapse", "server": "s"}, list(alerts))


def bot(slack) -> SlackNotifier:
    return SlackNotifier(slack.api_url + "/chat.postMessage", bot_token="xoxb-1-t0k3n", channel="#oncall",
                         backoff_initial=0.05, backoff_max=0.1)


def test_an_incident_is_one_message_edited_until_it_resolves_then_the_next_posts_anew(slack):
    n = bot(slack)
    n.start()
    try:
        a, b = collapse("DP0"), collapse("DP1")
        n.notify(group(a))
        n.notify(group(a, b))  # a rank joins: edit
        n.notify(group(a, b))  # a repeat (nothing new): a new message, so it notifies again
        gone = copy.deepcopy(a)
        gone.status, gone.ends_at = RESOLVED, T0 + 60
        n.notify(group(b, gone))  # one rank recovered: edited
        gone_b = copy.deepcopy(b)
        gone_b.status, gone_b.ends_at = RESOLVED, T0 + 60
        n.notify(group(gone_b))  # resolved: the open message edited to say so
        n.notify(group(collapse("DP2")))  # the next incident: a new message
        assert n.drain(10)
    finally:
        n.stop()
    methods = [p.rsplit("/", 1)[1] for p in slack.paths]
    assert methods == ["chat.postMessage", "chat.update", "chat.postMessage", "chat.update", "chat.update",
                       "chat.postMessage"]
    assert slack.received[1]["ts"] == "1.000100" and [r["ts"] for r in slack.received[3:5]] == ["3.000100"] * 2
    assert all(r["channel"] in ("#oncall", "C0SPEC") for r in slack.received)
    assert slack.received[4]["text"].startswith("[RESOLVED")


def test_an_edit_of_a_deleted_message_posts_it_again(slack):
    slack.script.extend([(200, {}, "ok"), (200, {}, '{"ok": false, "error": "message_not_found"}')])
    n = bot(slack)
    n.start()
    try:
        n.notify(group(collapse("DP0")))
        n.notify(group(collapse("DP0"), collapse("DP1")))
        assert n.drain(10)
    finally:
        n.stop()
    assert [p.rsplit("/", 1)[1] for p in slack.paths] == ["chat.postMessage", "chat.update", "chat.postMessage"]
    assert slack.received[2]["text"].startswith("[FIRING:2]") and n.dead_letter_count == 0


def test_bot_token_needs_a_channel_and_excludes_a_webhook():
    import pytest

    with pytest.raises(ConfigError) as e:
        build_config({"alerts": {"slack": {"bot_token": "xoxb-1"}}})
    assert any(p.startswith("alerts.slack.channel: missing: a bot_token posts with chat.postMessage")
               for p in e.value.problems), e.value.problems
    with pytest.raises(ConfigError) as e:
        build_config({"alerts": {"slack": {"bot_token": "xoxb-1", "channel": "#x", "webhook_url": "https://h/x"}}})
    assert any(p.startswith("alerts.slack.bot_token: give a bot_token or a webhook_url, not both")
               for p in e.value.problems)
    cfg = build_config({"alerts": {"slack": {"bot_token": "xoxb-1", "channel": "#x"}}})
    assert cfg.slack.webhook_url == "https://slack.com/api/chat.postMessage" and "xoxb" not in repr(cfg.slack)
