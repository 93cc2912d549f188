"""`specwatch run` as real subprocesses: one daemon per state_dir, alert transitions in the log,
alert metrics across restarts (issue #10 items 10, 11, 12)."""

from __future__ import annotations

import subprocess
import sys
import time

import yaml

import procs
from procs import decode_line, free_port, popen, rank_labels, wait_for
from specwatch.alerts.model import Alert
from specwatch_daemon import SpecwatchDaemon


def test_second_daemon_on_one_state_dir_exits_1_naming_the_holder(tmp_path):
    log = tmp_path / "sglang.log"
    log.write_text("")
    first = SpecwatchDaemon(tmp_path, log).start()  # /metrics answers: its state_dir is locked
    doc = yaml.safe_load(first.cfg.read_text())
    doc["metrics"]["listen_port"] = free_port()  # only the state_dir is shared
    second_cfg = tmp_path / "second.yaml"
    second_cfg.write_text(yaml.safe_dump(doc))
    r = procs.run([sys.executable, "-m", "specwatch", "run", "--config", str(second_cfg)],
                  capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, r.stderr
    assert f"state directory {first.state} is in use by pid {first.proc.pid}" in r.stderr
    assert "Traceback" not in r.stderr
    assert first.proc.poll() is None  # the first one runs on
    assert (first.state / "specwatch.lock").read_text() == f"{first.proc.pid}\n"

    # kill -9 leaves the file but not the lock: the next daemon starts
    first.proc.kill()
    first.proc.wait()
    again = popen([sys.executable, "-m", "specwatch", "run", "--config", str(second_cfg)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: (first.state / "specwatch.lock").read_text() == f"{again.pid}\n" or again.poll() is not None,
                 what="the restarted daemon's lock")
        assert again.poll() is None
    finally:
        again.terminate()
        assert again.wait(20) == 0


def delivered(slack) -> list[dict]:
    return [b for b, ok in zip(slack.received, slack.answered_ok) if ok]


def test_every_transition_and_delivery_is_logged_without_the_url(tmp_path, slack):
    """Issue #10 item 11: one INFO line when an alert fires, is delivered and resolves; a failed
    attempt is a WARNING with the error and the retry delay; no form of a webhook URL appears,
    not even in a connection error's text (requests puts the path there)."""
    from slack_endpoint import SECRET_PATH

    slack.script.extend([(500, {}, "rollup_error"), (500, {}, "rollup_error")])
    refused_port = free_port()  # bound, not listening: connections are refused
    hook_url = f"http://127.0.0.1:{refused_port}/hooks/ops-t0ken-9f8e7d"
    log = tmp_path / "sglang.log"
    d = SpecwatchDaemon(tmp_path, log, env={"SW_TEST_HOOK": slack.url, "SW_TEST_OPS": hook_url}, alerts={
        "group_wait": "0s", "group_interval": "0s",
        "slack": {"webhook_url_env": "SW_TEST_HOOK", "backoff_initial": "0.1s", "backoff_max": "0.2s"},
        "webhooks": [{"name": "ops", "url_env": "SW_TEST_OPS", "backoff_initial": "0.1s", "backoff_max": "0.2s"}]})
    d.start()
    with open(log, "a") as f:
        f.writelines(decode_line(1.02, f"16:32:4{i}") for i in range(3))
    wait_for(lambda: len(delivered(slack)) == 1, timeout=20, what="the firing message after two 500s")
    with open(log, "a") as f:
        f.writelines(decode_line(2.9, f"16:33:0{i}") for i in range(3))
    wait_for(lambda: len(delivered(slack)) == 2, timeout=20, what="the resolved message")
    wait_for(lambda: "Slack delivered AcceptanceCollapse resolved" in d.output, what="the delivery line")
    rc, out = d.stop()
    assert rc == 0, out
    lines = out.splitlines()

    def one(pattern: str) -> str:
        hits = [ln for ln in lines if pattern in ln]
        assert len(hits) == 1, (pattern, out)
        return hits[0]

    fp = Alert(labels={"alertname": "AcceptanceCollapse", "severity": "critical", "server": "gpu-box-1",
                       "rank": "TP0", "engine": "sglang"}, annotations={}, starts_at=0).fingerprint
    where = f"AcceptanceCollapse on gpu-box-1 TP0 (critical, fingerprint {fp})"
    assert " INFO specwatch.alerts: alert firing: " + where + ": Speculative decoding collapsed on gpu-box-1 TP0: " \
        "accept len 1.02" in one("alert firing:")
    # 16:32:40 (the first low line) to 16:33:02 (the third recovered one)
    assert " INFO specwatch.alerts: alert resolved after 22s: " + where in one("alert resolved")
    fails = [ln for ln in lines if "Slack delivery of AcceptanceCollapse firing on gpu-box-1 TP0 seq=1 failed" in ln]
    assert [ln.split(" WARNING ")[1].split(": ", 1)[1].rsplit(" in ", 1)[0] for ln in fails] == [
        f"Slack delivery of AcceptanceCollapse firing on gpu-box-1 TP0 seq=1 failed (HTTP 500 'rollup_error'); retry {n}"
        for n in (1, 2)]
    assert all(0.05 < float(ln.rsplit(" in ", 1)[1].rstrip("s")) <= 0.2 for ln in fails)  # the delay, in seconds
    assert " INFO specwatch.notifiers.slack: Slack delivered AcceptanceCollapse firing on gpu-box-1 TP0 seq=1" \
        in one("Slack delivered AcceptanceCollapse firing")
    assert " INFO specwatch.notifiers.slack: Slack delivered AcceptanceCollapse resolved on gpu-box-1 TP0 seq=2" \
        in one("Slack delivered AcceptanceCollapse resolved")
    refused = [ln for ln in lines if "webhook delivery of AcceptanceCollapse firing on gpu-box-1 TP0 seq=1 failed" in ln]
    assert refused and all(" WARNING " in ln and "ConnectionError" in ln and "<redacted>" in ln for ln in refused), out
    for secret in (slack.url, SECRET_PATH, "s3cr3tT0ken", hook_url, "/hooks/ops-t0ken-9f8e7d", "ops-t0ken"):
        assert secret not in out


def test_alert_gauges_read_0_and_the_last_decode_line_survives_a_restart(tmp_path):
    """Issue #10 item 12: `specwatch_alerts_firing` reads 0 for every alert the rules can raise
    (not absent); after a restart while a collapse fires, the gauges of the last decode line
    and `specwatch_acceptance_collapsed` (what deploy/prometheus' AcceptanceCollapse reads)
    are there before any new line, with the values and the log timestamp of that line."""
    from specwatch.rules.base import alert_names_of, all_rules

    names = alert_names_of([cls for cls in all_rules()])
    log = tmp_path / "sglang.log"
    log.write_text("")
    d = SpecwatchDaemon(tmp_path, log).start()
    m = d.scrape()
    firing = lambda m: {dict(k[1])["alertname"]: v for k, v in m.items() if k[0] == "specwatch_alerts_firing"}  # noqa: E731
    assert firing(m) == dict.fromkeys(names, 0.0)
    assert len(names) >= 14

    with open(log, "a") as f:
        f.writelines(decode_line(1.02, f"16:32:4{i}", running=50, thr=123.0) for i in range(3))
    lab = rank_labels()
    m = wait_for(lambda: (x := d.scrape()).get(("specwatch_acceptance_collapsed", lab)) == 1 and x, what="the collapse")
    assert firing(m) == {**dict.fromkeys(names, 0.0), "AcceptanceCollapse": 1.0}
    before = {k: v for k, v in m.items() if k[1] == lab and not k[0].endswith(("_total", "_created"))}
    assert before[("specwatch_accept_length", lab)] == 1.02
    assert before[("specwatch_gen_throughput_tokens_per_second", lab)] == 123.0
    assert d.stop()[0] == 0

    d.start()
    m = d.scrape()  # no line read since the restart
    after = {k: v for k, v in m.items() if k[1] == lab and not k[0].endswith(("_total", "_created"))}
    assert after == before
    assert len(after) == 10  # accept length and rate, throughput, running, queued, usage, tokens, graph,
    # timestamp and collapsed
    assert after[("specwatch_last_decode_batch_timestamp_seconds", lab)] == \
        time.mktime(time.strptime("2026-02-23 16:32:42", "%Y-%m-%d %H:%M:%S"))
    assert firing(m)["AcceptanceCollapse"] == 1.0

    with open(log, "a") as f:
        f.writelines(decode_line(2.9, f"16:33:0{i}") for i in range(3))
    m = wait_for(lambda: (x := d.scrape()).get(("specwatch_acceptance_collapsed", lab)) == 0 and x, what="recovery")
    assert firing(m) == dict.fromkeys(names, 0.0)  # 0 again, not absent
    assert m[("specwatch_accept_length", lab)] == 2.9
    assert d.stop()[0] == 0
