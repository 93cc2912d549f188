"""A receiver that refuses notifications (Slack's 404 `no_service`): the real daemon keeps them
(dead letter in state.db, /metrics, the status page, `specwatch notifications`), sends them again
when the receiver takes one, its URL changes or on `notifications retry`, and says so through the
other receivers (SpecwatchNotificationsFailing). Real Slack-compatible endpoints, real processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from procs import decode_line, wait_for
from slack_endpoint import SlackEndpoint
from specwatch_daemon import SpecwatchDaemon

ROOT = Path(__file__).resolve().parents[1]
FAST = {"group_wait": "0s", "group_interval": "0s"}
NO_SERVICE = (404, {}, "no_service")


def ok_texts(endpoint) -> list[str]:
    """The `text` of every message the endpoint accepted, in order."""
    return [b["text"] for b, ok in zip(endpoint.received, endpoint.answered_ok) if ok]


def hook_alerts(hook) -> list[tuple[str, str, str]]:
    """(alertname, status, receiver label) of every alert the webhook endpoint received."""
    return [(a["labels"]["alertname"], a["status"], a["labels"].get("receiver", ""))
            for b in hook.received for a in b["alerts"]]


def dead(d, name="slack"):
    return d.scrape().get(("specwatch_notifications_dead_letter", (("notifier", name),)))


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specwatch", "notifications", *args], capture_output=True,
                          text=True, timeout=30, cwd=ROOT)


def collapse(log, minute: int) -> None:
    with open(log, "a") as f:
        f.write("".join(decode_line(1.01, f"16:{minute:02d}:0{i}", running=50) for i in range(3)))


def refused_once(tmp_path, slack, **backoff) -> SpecwatchDaemon:
    """A daemon whose Slack answers 404 once, then 200; a collapse written to its log."""
    slack.script.append(NO_SERVICE)
    log = tmp_path / "sglang.log"
    log.write_text("")
    d = SpecwatchDaemon(tmp_path, log, alerts={**FAST, "slack": {"webhook_url": slack.url, **backoff}}).start()
    collapse(log, 32)
    return d


def test_a_404_is_kept_alerted_elsewhere_survives_a_restart_and_goes_to_the_new_url(tmp_path, slack):
    hook, new_slack = SlackEndpoint(), SlackEndpoint()
    try:
        slack.script.extend([NO_SERVICE] * 50)  # the webhook was revoked: every POST is refused
        log = tmp_path / "sglang.log"
        log.write_text("")
        alerts = {**FAST, "slack": {"webhook_url": slack.url, "backoff_initial": "60s", "backoff_max": "60s"},
                  "webhooks": [{"name": "ops", "url": hook.url}]}
        d = SpecwatchDaemon(tmp_path, log, alerts=alerts).start()
        collapse(log, 32)
        wait_for(lambda: dead(d) == 1, what="the refused FIRING in the dead letter")
        wait_for(lambda: ("SpecwatchNotificationsFailing", "firing", "slack") in hook_alerts(hook),
                 what="the failure alerted through the webhook")
        [failing] = [a for b in hook.received for a in b["alerts"]
                     if a["labels"]["alertname"] == "SpecwatchNotificationsFailing"]
        assert failing["labels"]["severity"] == "critical"
        assert "HTTP 404" in failing["annotations"]["summary"] and "slack" in failing["annotations"]["summary"]
        assert ("AcceptanceCollapse", "firing", "") in hook_alerts(hook)
        assert len(slack.received) == 1  # the alert about Slack is not sent to Slack
        assert "refused AcceptanceCollapse firing" in d.output and "kept in the dead letter" in d.output
        assert "dropped" not in d.output

        status = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{d.port}/api/status", timeout=5).read())
        [row] = [s for s in status["sources"] if s["kind"] == "notifier" and s["name"] == "slack"]
        assert row["ok"] is False and "HTTP 404" in row["state"] and row["counters"]["dead_letter"] == 1
        assert any(a["alertname"] == "SpecwatchNotificationsFailing" for a in status["alerts"])

        listed = cli("list", "--config", str(d.cfg), "--json")
        assert listed.returncode == 0, listed.stderr
        [item] = [i for i in json.loads(listed.stdout) if i["receiver"] == "slack"]
        assert item["state"] == "refused" and item["status"] == 404 and "no_service" in item["detail"]
        assert item["alerts"] == "AcceptanceCollapse firing on gpu-box-1 TP0"
        assert "Refused at" in cli("list", "--config", str(d.cfg)).stdout

        rc, out = d.stop()
        assert rc == 0, out
        d.start()  # kept across a restart; the failure alert is not sent again
        wait_for(lambda: dead(d) == 1, what="the dead letter after the restart")
        assert "refused by the receiver in a previous run" in d.output
        time.sleep(1.5)
        assert hook_alerts(hook).count(("SpecwatchNotificationsFailing", "firing", "slack")) == 1

        doc = yaml.safe_load(d.cfg.read_text())  # a new webhook URL: what was refused goes there
        doc["alerts"]["slack"]["webhook_url"] = new_slack.url
        d.cfg.write_text(yaml.safe_dump(doc))
        d.signal(signal.SIGHUP)
        wait_for(lambda: ok_texts(new_slack) == ["[FIRING] AcceptanceCollapse on gpu-box-1 TP0: accept len 1.01"],
                 what="the refused FIRING at the new URL")
        wait_for(lambda: dead(d) == 0, what="an empty dead letter")
        wait_for(lambda: ("SpecwatchNotificationsFailing", "resolved", "slack") in hook_alerts(hook),
                 what="the failure alert resolved")
        assert len(slack.received) == 1
        rc, out = d.stop()
        assert rc == 0, out
        assert "Traceback" not in out
    finally:
        hook.close()
        new_slack.close()


def test_a_404_then_200_is_delivered_by_the_probe_retry(tmp_path, slack):
    """The receiver answers again (404, then 200): the kept FIRING is sent by the probe retry
    after backoff_initial, with nothing else queued."""
    d = refused_once(tmp_path, slack, backoff_initial="0.5s", backoff_max="1s")
    wait_for(lambda: ok_texts(slack) == ["[FIRING] AcceptanceCollapse on gpu-box-1 TP0: accept len 1.01"],
             what="the FIRING delivered by the probe retry")
    assert [ok for ok in slack.answered_ok] == [False, True]
    assert 0.4 <= slack.times[1] - slack.times[0] < 3.0
    wait_for(lambda: dead(d) == 0, what="an empty dead letter")
    rc, out = d.stop()
    assert rc == 0, out


def test_notifications_retry_sends_the_dead_letter_of_a_running_daemon(tmp_path, slack):
    d = refused_once(tmp_path, slack, backoff_initial="300s", backoff_max="300s")
    wait_for(lambda: dead(d) == 1, what="the refused FIRING in the dead letter")
    r = cli("retry", "slack", "--config", str(d.cfg))
    assert r.returncode == 0 and "asked the daemon" in r.stdout, r.stderr
    wait_for(lambda: len(ok_texts(slack)) == 1, what="the FIRING sent again on request")
    assert "1 refused notification(s) back in the queue (specwatch notifications retry)" in d.output
    rc, out = d.stop()
    assert rc == 0, out
    # nothing refused any more: `retry` says so and asks no one; a receiver with nothing refused
    # (a typo) is an error that names the ones that have some
    assert cli("retry", "--config", str(d.cfg)).stdout == "no refused notification to send again\n"
    r = cli("retry", "nosuch", "--config", str(d.cfg))
    assert r.returncode == 1 and "no refused notification for nosuch (refused: none;" in r.stderr, r.stderr
