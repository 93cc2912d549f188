"""SlackNotifier against a real HTTP server on 127.0.0.1 standing in for the Slack webhook."""

from __future__ import annotations

import io
import json
import logging
import time

import pytest

from specwatch.alerts.model import RESOLVED, Alert, Notification
from specwatch.notifiers.slack import SlackNotifier, build_notification_payload, build_payload, escape_mrkdwn
from procs import free_port
from slack_endpoint import SECRET_PATH, SlackEndpoint

T0 = 1771864362.0  # 2026-02-23T16:32:42Z


def make_alert(n: int = 1, **kw) -> Alert:
    d = dict(
        labels={"alertname": "AcceptanceCollapse", "severity": "critical", "server": f"sglang-{n}", "rank": "DP0 TP0"},
        annotations={
            "summary": "accept len 1.05 on sglang-0 DP0 TP0",
            "description": "The draft model's tokens are all being rejected.",
        },
        starts_at=T0,
        evidence=[("accept len", "1.05"), ("accept rate", "0.01"), ("running requests", "12"), ("since", "16:32:42")],
        fixes=["Check that the draft model matches the target model", "Check --speculative-algorithm", "Lower --speculative-num-steps"],
    )
    d.update(kw)
    return Alert(**d)


def wait_for(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def notifier(url, **kw) -> SlackNotifier:
    kw.setdefault("backoff_initial", 0.05)
    kw.setdefault("backoff_max", 0.2)
    kw.setdefault("timeout", 2.0)
    return SlackNotifier(url, **kw)


# -- payload ---------------------------------------------------------------------------------


def test_firing_payload_structure():
    p = build_payload(make_alert(0))
    assert p["text"] == "[FIRING] AcceptanceCollapse on sglang-0 DP0 TP0: accept len 1.05"
    blocks = p["blocks"]
    assert [b["type"] for b in blocks] == ["header", "section", "section", "section", "context"]
    assert blocks[0]["text"] == {"type": "plain_text", "text": ":rotating_light: AcceptanceCollapse", "emoji": True}
    assert [f["text"] for f in blocks[1]["fields"]] == [
        "*Server*\nsglang-0",
        "*Rank*\nDP0 TP0",
        "*accept len*\n1.05",
        "*accept rate*\n0.01",
        "*running requests*\n12",
        "*since*\n16:32:42",
    ]
    assert blocks[2]["text"]["text"] == "The draft model's tokens are all being rejected."
    assert blocks[3]["text"]["text"] == (
        "*What to check*\n"
        "1. Check that the draft model matches the target model\n"
        "2. Check --speculative-algorithm\n"
        "3. Lower --speculative-num-steps"
    )
    assert blocks[4]["elements"][0]["text"] == (
        "started 2026-02-23T16:32:42Z · severity critical · fingerprint " + make_alert(0).fingerprint
    )
    assert "channel" not in p
    assert build_payload(make_alert(0), channel="#alerts")["channel"] == "#alerts"


def test_resolved_payload_and_single_rank():
    """A resolved alert shows why it resolved as fields; what it fired with is history, on an
    "At firing" line (its first 4 pairs)."""
    a = make_alert(0, status=RESOLVED, ends_at=T0 + 312)
    a.evidence.append(("decode batches at or below threshold", "48"))
    a.resolved_with(("recovered accept len", "2.88"), first=True)
    a.labels["rank"] = ""
    p = build_payload(a)
    assert p["text"] == "[RESOLVED] AcceptanceCollapse on sglang-0: resolved after 5m 12s"
    blocks = p["blocks"]
    assert [b["type"] for b in blocks] == ["header", "section", "section", "context", "context"]
    assert blocks[0]["text"]["text"] == ":white_check_mark: AcceptanceCollapse resolved"
    assert blocks[1]["text"]["text"] == (
        "Resolved after *5m 12s* (firing since 2026-02-23T16:32:42Z, ended 2026-02-23T16:37:54Z)."
    )
    assert [f["text"] for f in blocks[2]["fields"]] == ["*Server*\nsglang-0", "*Rank*\n(single rank)",
                                                         "*recovered accept len*\n2.88"]
    assert blocks[3]["elements"][0]["text"] == (
        "*At firing:* accept len: 1.05 · accept rate: 0.01 · running requests: 12 · since: 16:32:42 · …")
    assert "What to check" not in json.dumps(p)
    # in a group, a resolved alert shows only why it resolved
    group = build_notification_payload(Notification("slack", "k", {}, [make_alert(1), a]))
    fields = [[f["text"] for f in b["fields"]] for b in group["blocks"] if "fields" in b]
    assert fields[1] == ["*recovered accept len*\n2.88"] and len(fields[0]) == 4
    # resolved by an older version (no `why_resolved`): all of it is history
    old = Alert.from_dict({k: v for k, v in a.to_dict().items() if k != "why_resolved"})
    assert [f["text"] for f in build_payload(old)["blocks"][2]["fields"]] == ["*Server*\nsglang-0", "*Rank*\n(single rank)"]


def test_update_payload_says_so():
    a = Alert(labels={"alertname": "AcceptanceCollapse", "server": "s", "rank": "TP0", "severity": "critical"},
              annotations={"summary": "x", "description": "d", "update": "specwatch diagnose: 3 error(s)"},
              starts_at=1_700_000_000.0, evidence=[("accept len", "1.02")], fixes=["[error] fc_bypass: fc is skipped"])
    p = build_payload(a)
    assert p["text"].startswith("[UPDATE] AcceptanceCollapse on s TP0")
    assert p["blocks"][0]["text"]["text"].endswith("AcceptanceCollapse (update)")
    texts = [b.get("text", {}).get("text", "") for b in p["blocks"] if b["type"] == "section"]
    assert "*Update:* specwatch diagnose: 3 error(s)" in texts
    assert any("1. [error] fc_bypass: fc is skipped" in t for t in texts)


def test_update_in_a_group_payload_marks_that_alert():
    def make(rank, **ann):
        return Alert(labels={"alertname": "AcceptanceCollapse", "server": "s", "rank": rank},
                     annotations={"summary": f"collapsed {rank}", **ann}, starts_at=1_700_000_000.0)

    n = Notification("slack", "g", {}, [make("TP0"), make("TP1", update="specwatch diagnose: 1 error(s)")])
    p = build_notification_payload(n)
    assert p["text"].startswith("[UPDATE] [FIRING:2] AcceptanceCollapse on s")
    lines = [b["text"]["text"] for b in p["blocks"] if b["type"] == "section" and "text" in b]
    assert "(update)" not in lines[0] and "*Update:*" not in lines[0]
    assert "_(update)_\n*Update:* specwatch diagnose: 1 error(s)\ncollapsed TP1" in lines[1]
    assert not build_notification_payload(Notification("slack", "g", {}, [make("TP0"), make("TP1")]))["text"].startswith("[UPDATE]")


def test_hostile_text_is_escaped():
    a = make_alert(
        0,
        labels={"alertname": "AcceptanceCollapse", "server": "<!channel>", "rank": "<@U123>"},
        annotations={"description": "R&D says *bold* _it_ ~s~ `code` but spec_len stays"},
        evidence=[("accept len", "<http://evil|click>")],
        fixes=["<!here> & run `rm`"],
    )
    p = build_payload(a)
    fields = [f["text"] for f in p["blocks"][1]["fields"]]
    assert fields == ["*Server*\n&lt;!channel&gt;", "*Rank*\n&lt;@U123&gt;", "*accept len*\n&lt;http://evil|click&gt;"]
    # description and fixes: code spans stay Slack code spans (commands stay copyable), the
    # rest shows as typed (values from logs sit in it: no formatting, mention or link can form)
    assert p["blocks"][2]["text"]["text"] == "R&amp;D says ∗bold∗ ＿it＿ ∼s∼ `code` but spec_len stays"
    assert p["blocks"][3]["text"]["text"] == "*What to check*\n1. &lt;!here&gt; &amp; run `rm`"
    assert escape_mrkdwn("*bold* `code`") == "∗bold∗ ˋcodeˋ"  # log-derived text: no formatting
    assert p["text"] == "[FIRING] AcceptanceCollapse on &lt;!channel&gt; &lt;@U123&gt;: accept len &lt;http://evil|click&gt;"
    # No raw angle bracket survives anywhere a mention or link could form.
    assert "<" not in json.dumps(p, ensure_ascii=False)
    assert escape_mrkdwn("a&b<c>") == "a&amp;b&lt;c&gt;"


def test_limits_are_respected():
    a = make_alert(
        0,
        labels={"alertname": "X" * 400, "server": "s", "rank": ""},
        annotations={"description": "&" * 2000},  # 10,000 chars once escaped
        evidence=[(f"e{i}", "v") for i in range(1000)],
        fixes=["fix " * 100] * 50,
    )
    p = build_payload(a)
    assert len(p["blocks"]) == 50
    assert len(p["blocks"][0]["text"]["text"]) == 150
    for b in p["blocks"]:
        if b["type"] == "section" and "text" in b:
            assert len(b["text"]["text"]) <= 3000
        for f in b.get("fields", []):
            assert len(f["text"]) <= 2000
        assert len(b.get("fields", [])) <= 10
    desc = p["blocks"][-3]["text"]["text"]
    assert desc.endswith("&amp;…") and desc.count("&amp;") == 599  # never cut inside an entity
    assert p["blocks"][-2]["text"]["text"].endswith("…")
    assert p["blocks"][-4]["fields"][-1]["text"] == "_543 more evidence items not shown_"


# -- delivery --------------------------------------------------------------------------------


def test_retries_5xx_then_delivers_once(slack):
    slack.script.extend([(500, {}, "rollup_error"), (503, {}, "")])
    n = notifier(slack.url)
    n.notify(make_alert(1))
    assert n.queue_depth == 1
    assert n.drain(5) is True
    assert len(slack.received) == 3  # two failed attempts + one success
    assert slack.received[0] == slack.received[2]
    assert slack.paths == [SECRET_PATH] * 3
    assert n.sent_total == 1
    assert n.failed_total == {"permanent": 0, "retry": 2}
    assert n.queue_depth == 0
    assert n.last_success_timestamp == pytest.approx(time.time(), abs=5)
    # backoff grows: second wait ≥ 0.9 × 0.1 s
    assert slack.times[2] - slack.times[1] >= 0.09


def test_background_thread_delivers_in_order(slack):
    n = notifier(slack.url)
    n.start()
    try:
        seqs = [n.notify(make_alert(i)) for i in range(5)]
        assert seqs == [1, 2, 3, 4, 5]
        assert wait_for(lambda: n.sent_total == 5)
    finally:
        assert n.stop(5)
    assert [b["text"].split(" on ")[1].split(":")[0] for b in slack.received] == [
        f"sglang-{i} DP0 TP0" for i in range(5)
    ]


def test_notify_takes_a_snapshot(slack):
    n = notifier(slack.url)
    a = make_alert(1)
    n.notify(a)
    a.labels["server"] = "changed"
    assert n.drain(5)
    assert slack.received[0]["blocks"][1]["fields"][0]["text"] == "*Server*\nsglang-1"


def test_429_honours_retry_after_without_burning_backoff(slack):
    slack.script.append((429, {"Retry-After": "1"}, "rate_limited"))
    n = notifier(slack.url, backoff_initial=5.0, backoff_max=10.0)  # a backoff would blow the drain
    n.notify(make_alert(1))
    assert n.drain(4) is True
    assert len(slack.received) == 2
    assert slack.times[1] - slack.times[0] >= 0.95
    assert n.sent_total == 1
    assert n.failed_total == {"permanent": 0, "retry": 1}
    assert n._failures == 0


def test_429_without_retry_after_backs_off_exponentially(slack):
    """New-user trial: 429s without `Retry-After` were retried every backoff_initial; they back
    off like any retryable failure (×2 each, capped at backoff_max)."""
    slack.script.extend([(429, {}, "rate_limited")] * 3)
    n = notifier(slack.url, backoff_initial=0.2, backoff_max=0.5)
    n.notify(make_alert(1))
    assert n.drain(10) is True
    gaps = [b - a for a, b in zip(slack.times, slack.times[1:])]
    assert len(slack.received) == 4 and n.failed_total == {"permanent": 0, "retry": 3}
    assert 0.18 <= gaps[0] < 0.35 and 0.36 <= gaps[1] < 0.6 and 0.45 <= gaps[2] < 0.7  # 0.2, 0.4, 0.5 (cap)
    assert n._failures == 0  # delivered: the next failure starts at backoff_initial again


@pytest.mark.parametrize("status,body", [(400, "invalid_payload"), (410, "channel_is_archived"), (200, "no_service")])
def test_refused_notification_is_kept_next_delivered_then_it_is_retried(slack, caplog, status, body):
    """A refusal is logged once (ERROR) and kept in the dead letter, not dropped; the next
    notification goes on, and once the receiver takes it the refused one is sent again."""
    slack.script.append((status, {}, body))
    n = notifier(slack.url)
    n.notify(make_alert(1))
    n.notify(make_alert(2))
    with caplog.at_level(logging.DEBUG):
        assert n.drain(5) is True
    assert [m["text"].split(" DP")[0] for m in slack.received] == [
        "[FIRING] AcceptanceCollapse on sglang-1", "[FIRING] AcceptanceCollapse on sglang-2",
        "[FIRING] AcceptanceCollapse on sglang-1"]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert errors[0].name == "specwatch.notifiers.slack"
    assert f"HTTP {status}" in errors[0].getMessage() and body in errors[0].getMessage()
    assert "kept in the dead letter" in errors[0].getMessage()
    assert n.failed_total == {"permanent": 1, "retry": 0}
    assert n.sent_total == 2 and n.dead_letter_count == 0
    assert "s3cr3tT0ken" not in caplog.text


def test_connection_refused_is_retried_until_server_appears(caplog):
    port = free_port()
    url = f"http://127.0.0.1:{port}{SECRET_PATH}"
    n = notifier(url)
    n.notify(make_alert(1))
    with caplog.at_level(logging.DEBUG):
        n.start()
        try:
            assert wait_for(lambda: n.failed_total["retry"] >= 2)
            assert n.queue_depth == 1
            server = SlackEndpoint(port)
            try:
                assert wait_for(lambda: n.sent_total == 1)
                assert server.delivered_texts() == ["[FIRING] AcceptanceCollapse on sglang-1 DP0 TP0: accept len 1.05"]
            finally:
                server.close()
        finally:
            n.stop(5)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings and "ConnectionError" in warnings[0]
    # The URL, its path and the token appear in no log line (ours or urllib3's) nor in repr.
    for secret in (url, SECRET_PATH, "s3cr3tT0ken"):
        assert secret not in caplog.text
        assert secret not in repr(n)
    assert "<redacted>" in warnings[0]
    assert "webhook_url=<redacted>" in repr(n)


def test_urllib3_debug_line_is_redacted(slack, caplog):
    n = notifier(slack.url)
    n.notify(make_alert(1))
    with caplog.at_level(logging.DEBUG):
        assert n.drain(5)
    urllib3_lines = [r.getMessage() for r in caplog.records if r.name.startswith("urllib3")]
    assert any('"POST <redacted> HTTP/1.1" 200' in m for m in urllib3_lines)
    assert "s3cr3tT0ken" not in caplog.text


def test_bad_url_error_hides_url():
    with pytest.raises(ValueError) as ei:
        SlackNotifier("hooks.slack.com/services/T/B/s3cr3tT0ken")
    assert "s3cr3tT0ken" not in str(ei.value)


def test_durable_queue_survives_restart(tmp_path):
    qp = tmp_path / "q" / "slack-queue.json"
    dead = f"http://127.0.0.1:{free_port()}{SECRET_PATH}"
    n1 = notifier(dead, queue_path=qp)
    for i in range(3):
        n1.notify(make_alert(i))
    n1.start()
    assert wait_for(lambda: n1.failed_total["retry"] >= 1)
    assert n1.stop(5)
    on_disk = json.loads(qp.read_text())
    assert [it["seq"] for it in on_disk["pending"]] == [1, 2, 3]
    assert [it["data"]["alerts"][0]["labels"]["server"] for it in on_disk["pending"]] == ["sglang-0", "sglang-1", "sglang-2"]
    assert list(qp.parent.iterdir()) == [qp]  # no temp files left behind

    server = SlackEndpoint()
    try:
        n2 = notifier(server.url, queue_path=qp)
        assert n2.queue_depth == 3
        assert n2.drain(5) is True
        assert [t.split(" on ")[1].split(" ")[0] for t in server.delivered_texts()] == ["sglang-0", "sglang-1", "sglang-2"]
        assert json.loads(qp.read_text())["pending"] == []
        assert n2.notify(make_alert(9)) == 4  # sequence numbers continue across restarts
        assert n2.drain(5)
        # A third process on the same file finds nothing to resend: exactly once.
        n3 = notifier(server.url, queue_path=qp)
        assert n3.queue_depth == 0 and n3.drain(1)
        assert len(server.received) == 4
    finally:
        server.close()


def test_corrupt_queue_file_is_moved_aside(tmp_path, caplog):
    qp = tmp_path / "slack-queue.json"
    qp.write_text("{not json")
    n = notifier("http://127.0.0.1:9/x", queue_path=qp)
    assert n.queue_depth == 0
    assert len([p for p in tmp_path.iterdir() if ".corrupt-" in p.name]) == 1
    assert any(r.levelno == logging.ERROR for r in caplog.records)


def test_dry_run_prints_json_and_sends_nothing(slack):
    out = io.StringIO()
    n = notifier(slack.url, dry_run=out, dry_run_json=True)
    n.notify(make_alert(1))
    assert n.drain(2) is True
    text = out.getvalue()
    assert text.startswith('{\n  "text": "[FIRING] AcceptanceCollapse on sglang-1 DP0 TP0: accept len 1.05"')
    assert json.loads(text) == build_payload(make_alert(1))
    assert slack.received == []
    assert n.sent_total == 1


def test_dry_run_prints_the_message_as_it_reads(slack):
    """Without dry_run_json: header, fields as `name: value`, sections, context; entities shown
    as characters, mrkdwn (code spans, look-alikes) as Slack receives it."""
    out = io.StringIO()
    alert = make_alert(1)
    alert.fixes = ["Check `<draft dir>/config.json` & the `d2t` map"]
    n = notifier(slack.url, dry_run=out)
    n.notify(alert)
    assert n.drain(2) is True
    lines = out.getvalue().splitlines()
    assert lines[:5] == [":rotating_light: AcceptanceCollapse", "=" * 35, "", "Server: sglang-1", "Rank: DP0 TP0"]
    assert "accept len: 1.05" in lines
    assert "1. Check `<draft dir>/config.json` & the `d2t` map" in lines
    assert lines[-2].startswith("started 2026-02-23T16:32:42Z · severity critical · fingerprint ")
    assert slack.received == [] and n.sent_total == 1


# -- group notifications ---------------------------------------------------------------------


def test_group_payload_lists_firing_then_resolved():
    from specwatch.alerts.model import Notification
    from specwatch.notifiers.slack import build_notification_payload

    fired = make_alert(1)
    done = make_alert(2, status=RESOLVED, ends_at=T0 + 312)
    done.labels["alertname"] = "ThroughputDrop"
    done.resolved_with(("recovered to baseline", "98%"))
    p = build_notification_payload(Notification("slack", "k", {}, [done, fired]), channel="#gpu")
    assert p["text"] == "[FIRING:1] AcceptanceCollapse: sglang-1 DP0 TP0 accept len 1.05 (+1 resolved)"
    assert p["channel"] == "#gpu"
    b = p["blocks"]
    assert b[0]["text"]["text"] == ":rotating_light: 2 alerts: 1 firing, 1 resolved"
    assert [x["type"] for x in b] == ["header", "divider", "section", "section", "section", "divider", "section", "section"]
    assert b[2]["text"]["text"] == (":rotating_light: *AcceptanceCollapse* on sglang-1 DP0 TP0\n"
                                    "accept len 1.05 on sglang-0 DP0 TP0")
    assert b[4]["text"]["text"].startswith("*What to check*\n1. Check that the draft model matches")
    assert b[6]["text"]["text"] == ":white_check_mark: *ThroughputDrop* on sglang-2 DP0 TP0: resolved after 5m 12s"
    assert [f["text"] for f in b[7]["fields"]] == ["*recovered to baseline*\n98%"]  # not its firing evidence
    # one alert: exactly the single-alert layout
    assert build_notification_payload(Notification("slack", "k", {}, [fired])) == build_payload(fired)


def test_group_payload_respects_the_block_cap():
    from specwatch.alerts.model import Notification
    from specwatch.notifiers.slack import build_notification_payload

    many = [make_alert(i) for i in range(30)]
    p = build_notification_payload(Notification("slack", "k", {}, many))
    assert len(p["blocks"]) <= 50
    assert p["blocks"][-1]["elements"][0]["text"] == "_18 more alerts not shown_"  # 12 shown × 4 blocks
    assert p["text"].startswith("[FIRING:30] AcceptanceCollapse: sglang-0 DP0 TP0 accept len 1.05; sglang-1 DP0 TP0 ")
    assert len(p["text"]) <= 300


def test_any_2xx_without_an_error_code_is_delivered_once(slack):
    """A proxy answering 200 `{"ok":true}` or 204: accepted, never re-posted."""
    slack.script.extend([(200, {}, '{"ok":true}'), (204, {}, "")])
    n = SlackNotifier(slack.url, backoff_initial=0.05)
    n.notify(make_alert(0))
    n.notify(make_alert(1))
    assert n.drain(timeout=10)
    assert len(slack.received) == 2 and n.sent_total == 2


def test_unbounded_retry_after_is_capped():
    from specwatch.notifiers.http import RETRY_AFTER_MAX, retry_after

    assert retry_after("inf") == RETRY_AFTER_MAX and retry_after("1e12") == RETRY_AFTER_MAX
    assert retry_after("nan") is None and retry_after("2") == 2.0 and retry_after("-5") == 0.0


def test_collapse_message_carries_the_ranks_sparkline():
    """Issue 12 item 3: the rank's last accept lengths as a sparkline from the 1.0 floor, first →
    last, and the server's lowest/highest rank; a rank name from a log stays literal."""
    from specwatch.notifiers.slack import sparkline

    assert sparkline([2.9, 2.8, 2.85, 2.5, 1.6, 1.05, 1.02, 1.0]) == "███▇▃▁▁▁"
    assert sparkline([1.0, 1.0, 1.0]) == "▁▁▁" and sparkline([]) == ""
    assert sparkline([1.0, 2.0, 3.0, 4.0, 5.0]) == "▁▃▅▆█"
    alert = make_alert(1, annotations={
        "summary": "accept len 1.05", "description": "rejected",
        "accept_length_recent": "2.90 2.80 2.85 2.50 1.60 1.05 1.02 1.00",
        "accept_length_ranks": "lowest DP0 TP0 1.00, highest DP1 TP1 <b>2.95</b>"})
    p = build_payload(alert)
    [trend] = [b["text"]["text"] for b in p["blocks"] if b["type"] == "section" and "text" in b
               and b["text"]["text"].startswith("*accept len, recent")]
    assert trend == ("*accept len, recent trend*\n`███▇▃▁▁▁` 2.90 → 1.00\n"
                     "lowest DP0 TP0 1.00, highest DP1 TP1 &lt;b&gt;2.95&lt;/b&gt;")
    assert [b["type"] for b in p["blocks"]][:3] == ["header", "section", "section"]  # fields, then the trend
    # a group notification shows it under the alert's line; no annotation, no trend
    from specwatch.alerts.model import Notification
    from specwatch.notifiers.slack import build_notification_payload

    g = build_notification_payload(Notification(receiver="slack", group_key="k", group_labels={},
                                                alerts=[alert, make_alert(2)]))
    texts = [b["text"]["text"] for b in g["blocks"] if b["type"] == "section" and "text" in b]
    assert sum("`███▇▃▁▁▁` 2.90 → 1.00" in t for t in texts) == 1
    assert not any("accept len, recent" in b["text"]["text"] for b in build_payload(make_alert(2))["blocks"]
                   if b["type"] == "section" and "text" in b)


def test_group_fallback_names_each_rank_and_value_and_never_ends_in_a_resolve():
    """What a phone shows of a grouped message: the firing ranks with their values; the ranks that
    already recovered are only counted after them, so the banner never reads as a resolve."""
    from specwatch.alerts.model import Notification
    from specwatch.notifiers.slack import build_notification_payload

    def collapse(rank, value, **kw):
        a = Alert(labels={"alertname": "AcceptanceCollapse", "server": "sglang-0", "rank": rank, "severity": "critical"},
                  annotations={"summary": f"collapsed {rank}"}, starts_at=T0, evidence=[("accept len", value)], **kw)
        return a

    n = Notification("slack", "g", {"server": "sglang-0"}, [collapse("DP3 TP3", "1.02"), collapse("DP5 TP5", "1.04")])
    assert build_notification_payload(n)["text"] == \
        "[FIRING:2] AcceptanceCollapse on sglang-0: DP3 TP3 accept len 1.02; DP5 TP5 accept len 1.04"
    done = collapse("DP3 TP3", "1.02", status=RESOLVED, ends_at=T0 + 42)
    text = build_notification_payload(Notification("slack", "g", {"server": "sglang-0"}, [done, collapse("DP5 TP5", "1.04")]))["text"]
    assert text == "[FIRING:1] AcceptanceCollapse on sglang-0: DP5 TP5 accept len 1.04 (+1 resolved)"


def test_a_raw_value_that_could_format_is_shown_in_code_as_typed():
    from specwatch.notifiers.slack import literal

    assert literal("1.05") == "1.05" and literal("spec_len 2*3") == "spec_len 2*3"  # nothing formats: as is
    assert literal("in __init__") == "`in __init__`"
    assert literal("specwatch_gpu_* <x>") == "`specwatch_gpu_* &lt;x&gt;`"
    assert literal('File "a.py", line 3, in __init__\n  raise X(`y`)') == '```File "a.py", line 3, in __init__\n  raise X(`y`)```'
    a = Alert(labels={"alertname": "ServerLogError", "server": "s"}, annotations={"summary": "hung scheduler in `x_*`"},
              starts_at=0, evidence=[("kind", "watchdog_timeout"), ("last lines", "in __init__")])
    p = build_payload(a)
    assert p["text"] == "[FIRING] ServerLogError on s: hung scheduler in `x_*`"  # the summary, not `kind ...`
    assert "*last lines*\n`in __init__`" in [f["text"] for b in p["blocks"] for f in b.get("fields", [])]
    a.annotations["update"] = "crash loop: 3 failed starts"
    assert build_payload(a)["text"] == "[UPDATE] ServerLogError on s: crash loop: 3 failed starts"
