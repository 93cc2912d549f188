"""The daemon's delivery end to end: durable queues across an outage and a restart, silences
added by the CLI while it runs, delivery metrics."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from slack_endpoint import SECRET_PATH, SlackEndpoint
from procs import free_port, wait_for
from specwatch_daemon import SpecwatchDaemon


def decode(ts: str, rank: str, accept: float) -> str:
    return (f"[2026-02-23 {ts} {rank}] Decode batch, #running-req: 32, #token: 2268, token usage: 0.02, "
            f"accept len: {accept:.2f}, accept rate: 0.21, cuda graph: True, "
            f"gen throughput (token/s): 400.57, #queue-req: 0\n")


def write(log, lines):
    with open(log, "a") as f:
        f.write("".join(lines))


def delivered(endpoint) -> list[dict]:
    return [b for b, ok in zip(endpoint.received, endpoint.answered_ok) if ok]


def metric(d, name, **labels):
    return d.scrape().get((name, tuple(sorted(labels.items()))))


def test_outage_and_restart_deliver_everything_exactly_once_in_order(tmp_path):
    slack_port, hook_port = free_port(), free_port()
    log = tmp_path / "sglang.log"
    log.write_text("")
    alerts = {
        "group_wait": "0s", "group_interval": "0s",
        "slack": {"webhook_url": f"http://127.0.0.1:{slack_port}{SECRET_PATH}", "backoff_initial": "0.1s",
                  "backoff_max": "0.5s"},
        "webhooks": [{"name": "ops", "url": f"http://127.0.0.1:{hook_port}/hook", "backoff_initial": "0.1s",
                      "backoff_max": "0.5s"}],
    }
    d = SpecwatchDaemon(tmp_path, log, alerts=alerts).start()
    write(log, [decode(f"16:32:4{i}", "TP0", 1.02) for i in range(3)])  # collapse: firing
    for n in ("slack", "webhook/ops"):
        wait_for(lambda n=n: (metric(d, "specwatch_notifications_failed_total", notifier=n, reason="retry") or 0) >= 2,
                 what=f"{n} retries while its receiver is down")
        assert metric(d, "specwatch_notification_queue_depth", notifier=n) == 1
    rc, out = d.stop()
    assert rc == 0, out
    assert SECRET_PATH not in out  # the Slack URL is a secret, even in retry warnings
    _, queued = d.saved()
    assert [[it["alerts"][0]["status"] for it in items] for items in (queued["slack"], queued["webhook/ops"])] == [
        ["firing"], ["firing"]]

    write(log, [decode(f"16:33:0{i}", "TP0", 2.9) for i in range(3)])  # recovered while specwatch was down
    d.start()
    for n in ("slack", "webhook/ops"):
        wait_for(lambda n=n: metric(d, "specwatch_notification_queue_depth", notifier=n) == 2,
                 what=f"the resolve queued behind the firing for {n}")
    slack, hook = SlackEndpoint(slack_port), SlackEndpoint(hook_port)
    try:
        wait_for(lambda: len(delivered(slack)) == 2 and len(delivered(hook)) == 2, timeout=20,
                 what="both receivers to get both notifications")
        assert [b["text"].split(":")[0] for b in delivered(slack)] == [
            "[FIRING] AcceptanceCollapse on gpu-box-1 TP0", "[RESOLVED] AcceptanceCollapse on gpu-box-1 TP0"]
        assert [b["status"] for b in delivered(hook)] == ["firing", "resolved"]
        assert metric(d, "specwatch_notifications_sent_total", notifier="slack") == 2
        assert metric(d, "specwatch_notification_queue_depth", notifier="webhook/ops") == 0
        assert metric(d, "specwatch_notification_last_success_timestamp_seconds", notifier="slack") > time.time() - 60
        rc, out = d.stop()
        assert rc == 0, out
        d.start()  # a third run: nothing is sent again
        write(log, [decode("16:34:00", "TP0", 3.0)])
        wait_for(lambda: metric(d, "specwatch_decode_batches_total", server="gpu-box-1", dp_rank="", tp_rank="0",
                                pp_rank="", ep_rank="", engine="sglang") == 7, what="the new line (after the 6 counted before)")
        time.sleep(1.5)  # two dispatcher ticks
        assert len(slack.received) == 2 and len(hook.received) == 2
    finally:
        d.stop()
        slack.close()
        hook.close()


def silence(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specwatch", "silence", *args], capture_output=True, text=True,
                          timeout=30)


def test_silence_added_by_the_cli_is_honoured_without_restart(tmp_path, slack):
    log = tmp_path / "sglang.log"
    log.write_text("")
    d = SpecwatchDaemon(tmp_path, log, alerts={
        "group_by": ["..."], "group_wait": "0s", "group_interval": "0s",
        "slack": {"webhook_url": slack.url}}).start()
    try:
        r = silence("add", "--match", "alertname=AcceptanceCollapse", "--match", "rank=TP1", "--for", "2h",
                    "--comment", "TP1 draft being retrained", "--config", str(d.cfg))
        assert r.returncode == 0, r.stderr
        sid = r.stdout.strip()
        listed = json.loads(silence("list", "--json", "--state-dir", str(d.state)).stdout)
        assert [(s["id"], s["matchers"], s["state"], s["comment"]) for s in listed] == [
            (sid, ['alertname="AcceptanceCollapse"', 'rank="TP1"'], "active", "TP1 draft being retrained")]
        write(log, [decode(f"16:32:4{i}", rank, 1.0) for i in range(3) for rank in ("TP0", "TP1")])
        wait_for(lambda: delivered(slack), what="the TP0 alert")
        time.sleep(1.5)  # two ticks: TP1 stays muted
        assert [b["text"] for b in slack.received] == ["[FIRING] AcceptanceCollapse on gpu-box-1 TP0: accept len 1.00"]
        assert metric(d, "specwatch_alerts_firing", alertname="AcceptanceCollapse") == 2  # muted, not forgotten
        assert metric(d, "specwatch_silences", state="active") == 1
        r = silence("expire", sid[:8], "--state-dir", str(d.state))
        assert r.returncode == 0 and r.stdout.strip() == f"expired {sid}"
        wait_for(lambda: len(slack.received) == 2, what="the TP1 alert once the silence expired")
        assert slack.received[1]["text"] == "[FIRING] AcceptanceCollapse on gpu-box-1 TP1: accept len 1.00"
        assert (metric(d, "specwatch_silences", state="active"), metric(d, "specwatch_silences", state="expired")) == (0, 1)
        assert silence("list", "--json", "--state-dir", str(d.state)).stdout.strip() == "[]"
        expired = json.loads(silence("list", "--expired", "--json", "--state-dir", str(d.state)).stdout)
        assert [s["state"] for s in expired] == ["expired"]
    finally:
        rc, out = d.stop()
    assert rc == 0, out


def test_silence_cli_usage_errors(tmp_path):
    r = silence("add", "--match", "alertname", "--for", "1h", "--comment", "x", "--state-dir", str(tmp_path))
    assert r.returncode == 2 and "is not a matcher" in r.stderr
    r = silence("add", "--match", "alertname=X", "--for", "soon", "--comment", "x", "--state-dir", str(tmp_path))
    assert r.returncode == 2 and "--for: 'soon' is not a positive duration" in r.stderr
    r = silence("expire", "0000", "--state-dir", str(tmp_path))
    assert r.returncode == 2 and "no silence with ID '0000'" in r.stderr
    r = silence("list", "--state-dir", str(tmp_path))
    assert r.returncode == 0 and r.stdout.split() == ["ID", "Matchers", "Starts", "Ends", "State", "Created", "by",
                                                      "Comment"]


def test_sequence_numbers_go_on_after_a_restart(tmp_path, slack):
    """Each notification's number (its `seq=` in the log, its Seq in `specwatch notifications
    list`) is never handed out twice: the second run's collapse is seq=3 after the first run's
    firing (1) and resolve (2), though nothing was left queued to number from."""
    log = tmp_path / "sglang.log"
    log.write_text("")
    alerts = {"group_wait": "0s", "group_interval": "0s", "slack": {"webhook_url": slack.url}}
    d = SpecwatchDaemon(tmp_path, log, alerts=alerts).start()
    try:
        write(log, [decode(f"16:32:4{i}", "TP0", 1.02) for i in range(3)])
        wait_for(lambda: len(delivered(slack)) == 1, what="the firing")
        write(log, [decode(f"16:32:5{i}", "TP0", 2.9) for i in range(3)])
        wait_for(lambda: len(delivered(slack)) == 2, what="the resolve")
        wait_for(lambda: "seq=2" in d.output, what="the resolve's delivery logged")
    finally:
        rc, out = d.stop()
    assert rc == 0, out
    assert d.saved()[1] == {}  # nothing queued: the numbers are not in the outbox
    d.start()
    try:
        write(log, [decode(f"16:33:0{i}", "TP0", 1.02) for i in range(3)])  # a new episode
        wait_for(lambda: len(delivered(slack)) == 3, what="the second run's firing")
        wait_for(lambda: "Slack delivered AcceptanceCollapse firing on gpu-box-1 TP0 seq=3" in d.output,
                 what="its delivery logged with the next number")
    finally:
        rc, out = d.stop()
    assert rc == 0, out
    assert [ln.rsplit("seq=", 1)[1] for ln in out.splitlines() if " Slack delivered " in ln] == ["1", "2", "3"]
