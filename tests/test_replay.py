"""`specwatch replay`: the daemon's pipeline over recorded logs, from the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sglang_lines import decode_line, eight_rank_two_collapses_log, three_rank_collapse_log, malformed_lines, other_lines, prefill_line, server_args_line
from specwatch.alerts.model import Alert
from specwatch.notifiers.slack import payload_text

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "logs" / "kimi-k25-eagle3-collapse.log"


def replay(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specwatch", "replay", *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_bundled_example_json_summary():
    r = replay(str(EXAMPLE), "--config", "examples/kimi-k25.yaml", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["lines"] == {"total": 2, "decode": 2, "prefill": 0, "other": 0, "malformed": 0, "unrecognized": 0}
    assert list(doc["ranks"]) == ["TP0"]
    tp0 = doc["ranks"]["TP0"]
    assert tp0["decode_batches"] == 2
    assert tp0["accept_length"] == {"last": 1.06, "mean": 1.055, "min": 1.05, "max": 1.06}
    assert tp0["accept_rate_last"] == 0.21
    assert tp0["gen_throughput_last"] == 385.45
    assert tp0["collapsed"] is True
    [alert] = doc["alerts"]
    assert alert["name"] == "AcceptanceCollapse" and alert["status"] == "firing"
    assert alert["rank"] == "TP0" and alert["server"] == "kimi-k25-tp8"
    assert alert["starts_at"].startswith("2026-02-2")  # 16:32:38 in this host's zone, shown in UTC
    # with the log's zone given, the instant is exact whatever the host's zone
    utc = json.loads(replay(str(EXAMPLE), "--config", "examples/kimi-k25.yaml", "--json",
                            "--log-timezone", "Asia/Tokyo").stdout)
    assert utc["alerts"][0]["starts_at"] == "2026-02-23T07:32:38Z"
    assert alert["summary"] == "Speculative decoding collapsed on kimi-k25-tp8 TP0: accept len 1.06"
    assert len(alert["fixes"]) == 5 and alert["fixes"][0].startswith("Run the whole diagnosis")
    assert "specwatch diagnose --draft <draft dir> --target <target dir>" in alert["fixes"][0]
    assert "midlayer" in alert["fixes"][1] and "d2t" in alert["fixes"][4]


def test_bundled_example_default_rules_need_a_third_batch():
    r = replay(str(EXAMPLE), "--json")
    doc = json.loads(r.stdout)
    assert doc["alerts"] == [] and doc["ranks"]["TP0"]["collapsed"] is False


def test_readme_command_prints_payload_and_alert():
    """The README's first command (after install): the Slack message as it reads first (no raw
    JSON), then the report; `--json` carries the Block Kit payload the text was rendered from."""
    r = replay(str(EXAMPLE), "--config", "examples/kimi-k25.yaml", "--slack-dry-run")
    assert r.returncode == 0, r.stderr
    assert "Slack dry run: printed AcceptanceCollapse firing" in r.stderr and "delivered" not in r.stderr
    message, report = r.stdout.split("\nlines: ", 1)
    assert message.splitlines()[:6] == [
        ":rotating_light: AcceptanceCollapse", "=" * 35, "", "Server: kimi-k25-tp8", "Rank: TP0", "accept len: 1.06"]
    assert '"blocks"' not in message and "&lt;" not in message
    assert "`specwatch diagnose --draft <draft dir> --target <target dir>`" in message
    assert "ALERT AcceptanceCollapse on kimi-k25-tp8 TP0: FIRING since 2026-02-23T16:32:38Z (at the end of the log)" in report
    assert "[COLLAPSED]" in report
    j = replay(str(EXAMPLE), "--config", "examples/kimi-k25.yaml", "--slack-dry-run", "--json")
    [payload] = json.loads(j.stdout)["slack_payloads"]
    assert payload["text"] == "[FIRING] AcceptanceCollapse on kimi-k25-tp8 TP0: accept len 1.06"
    assert payload_text(payload) == message + "\n"


def test_multi_rank_log_with_injection_and_malformed_lines(tmp_path):
    """DP0 collapses and recovers, DP1 stays healthy; request logs that quote a collapsed decode
    line move nothing; cut lines are counted as malformed and skipped."""
    v = "0.5.23"
    lines = [server_args_line(ts="2026-03-01 09:59:00", speculative_algorithm="EAGLE3",
                              speculative_draft_model_path="/models/draft-eagle3")[0]]
    lines += other_lines()
    n_other = len(other_lines())
    lines.append(prefill_line(v, ts="2026-03-01 10:00:00", rank={"DP": 0, "TP": 0})[0])
    accepts = [2.9, 1.0, 1.02, 1.01, 1.0, 3.1, 3.0, 2.8]
    for i, a in enumerate(accepts):
        ts = f"2026-03-01 10:00:{10 + i:02d}"
        lines.append(decode_line(v, ts=ts, rank={"DP": 0, "TP": 0}, accept_len=a, throughput=100.0 + i)[0])
        lines.append(decode_line(v, ts=ts, rank={"DP": 1, "TP": 1}, accept_len=2.5)[0])
    bad = malformed_lines()
    lines += bad
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines) + "\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("server: box\n")

    r = replay(str(log), "--config", str(cfg), "--json", "--slack-dry-run")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["lines"] == {"total": len(lines), "decode": 16, "prefill": 1,
                            "other": n_other + 1, "malformed": len(bad), "unrecognized": 0}
    assert set(doc["ranks"]) == {"DP0 TP0", "DP1 TP1"}
    dp0, dp1 = doc["ranks"]["DP0 TP0"], doc["ranks"]["DP1 TP1"]
    assert dp0["decode_batches"] == 8 and dp1["decode_batches"] == 8
    assert dp0["accept_length"]["min"] == 1.0 and dp0["accept_length"]["max"] == 3.1
    assert dp0["accept_length"]["last"] == 2.8 and dp0["gen_throughput_last"] == 107.0
    assert dp0["collapsed"] is False and dp1["collapsed"] is False
    assert dp1["accept_length"] == {"last": 2.5, "mean": 2.5, "min": 2.5, "max": 2.5}
    # The CUDA OOM traceback of other_lines(), stamped two months before the decode lines: it
    # fires and resolves at the first of them.
    errors = [a for a in doc["alerts"] if a["name"] == "ServerLogError"]
    assert [(a["status"], a["evidence"]["kind"]) for a in errors] == [("firing", "cuda_oom"), ("resolved", "cuda_oom")]
    doc["alerts"] = [a for a in doc["alerts"] if a["name"] != "ServerLogError"]
    # DP0 alone collapsed while DP1 stayed healthy: a collapse and a rank disagreement, both resolved
    assert [(a["name"], a["status"], a["rank"]) for a in doc["alerts"]] == [
        ("AcceptanceCollapse", "firing", "DP0 TP0"), ("RankDisagreement", "firing", "DP0 TP0"),
        ("AcceptanceCollapse", "resolved", "DP0 TP0"), ("RankDisagreement", "resolved", "DP0 TP0")]
    firing = doc["alerts"][0]
    assert firing["evidence"]["speculative_draft_model_path"] == "/models/draft-eagle3"
    assert any("/models/draft-eagle3" in f for f in firing["fixes"])
    assert doc["alerts"][1]["evidence"]["mean accept len DP1 TP1"] == "2.50"
    assert doc["servers"]["box"]["server_args"]["speculative_algorithm"] == "EAGLE3"
    # one episode per alert, with its final state: nothing is left "firing" once it resolved
    eps = [(e["name"], e["status"], e["starts_at"], e["ends_at"], e["notifications"])
           for e in doc["episodes"] if e["name"] != "ServerLogError"]
    assert eps == [("AcceptanceCollapse", "resolved", "2026-03-01T10:00:11Z", "2026-03-01T10:00:17Z", 2),
                   ("RankDisagreement", "resolved", "2026-03-01T10:00:11Z", "2026-03-01T10:00:17Z", 2)]
    collapse = doc["episodes"][[e["name"] for e in doc["episodes"]].index("AcceptanceCollapse")]
    # its last firing state: the 4 low batches (the alert fired at the third), less why it resolved
    assert collapse["fixes"] == firing["fixes"] and firing["evidence"]["decode batches at or below threshold"] == "3"
    assert collapse["evidence"] == {**firing["evidence"], "decode batches at or below threshold": "4",
                                    "accept len": "1.00", "gen throughput (token/s)": "104.00"}
    assert collapse["resolved_evidence"]["recovered accept len"] == "2.80"  # the third healthy batch
    # replay sends each change at once; one group per alert name and server (the default); the
    # collapse of DP0 alone is its rank disagreement: that one diagnosis is sent, the collapse muted
    texts = [p["text"] for p in doc["slack_payloads"] if "ServerLogError" not in p["text"]]
    assert texts == [
        "[FIRING] RankDisagreement on box DP0 TP0: accept len, this rank 1.00 1.02 1.01 (was 2.90)",  # its trend's high
        "[RESOLVED] RankDisagreement on box DP0 TP0: resolved after 6s",
    ]


def test_missing_file_is_a_usage_error():
    r = replay("/nonexistent/log.txt")
    assert r.returncode == 2 and "no such file" in r.stderr


def test_version():
    r = subprocess.run([sys.executable, "-m", "specwatch", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("specwatch 0.")


def test_replay_notifies_nobody_unless_asked(tmp_path, slack):
    """Issue #10 item 2: a replay with the daemon's config (Slack and a webhook set) posts
    nothing and says so; `--notify` posts each episode; --notify with a dry run is refused."""
    import yaml

    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"server": "kimi-k25-tp8", "rules": {"collapse": {"min_batches": 2}}, "alerts": {
        "slack": {"webhook_url": slack.url},
        "webhooks": [{"name": "ops", "url": slack.url + "hook"}]}}))
    r = replay(str(EXAMPLE), "--config", str(cfg), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["alerts"][0]["status"] == "firing"
    assert "notifying nobody" in r.stderr and "slack, webhook/ops" in r.stderr and slack.url not in r.stderr
    assert slack.received == []

    r = replay(str(EXAMPLE), "--config", str(cfg), "--notify", "--slack-timeout", "10")
    assert r.returncode == 0, r.stderr
    assert "--notify: sending this log's alerts to slack, webhook/ops" in r.stderr
    assert len(slack.received) == 2  # the Slack message and the webhook's JSON
    assert sorted(b.get("text", "")[:40] for b in slack.received)[1] == \
        "[FIRING] AcceptanceCollapse on kimi-k25-tp8 TP0"[:40]
    # New-user trial: old episodes go under their own identity (a `replay` label, so another
    # fingerprint than the live daemon's same alert), and Slack says it is a replay.
    [hook] = [b for b in slack.received if "alerts" in b]
    [sent] = hook["alerts"]
    assert sent["labels"]["replay"] == EXAMPLE.name
    live = {k: v for k, v in sent["labels"].items() if k != "replay"}
    assert live == {"alertname": "AcceptanceCollapse", "severity": "critical", "server": "kimi-k25-tp8", "rank": "TP0",
                    "engine": "sglang"}
    assert sent["fingerprint"] == Alert(sent["labels"], {}, 0).fingerprint != Alert(live, {}, 0).fingerprint
    [message] = [b for b in slack.received if "blocks" in b]
    assert f"replay of {EXAMPLE.name} · started " in json.dumps(message, ensure_ascii=False)

    assert replay(str(EXAMPLE), "--config", str(cfg), "--notify", "--slack-dry-run").returncode == 2
    r = replay(str(EXAMPLE), "--notify")
    assert r.returncode == 2 and "names no Slack webhook or webhook" in r.stderr


def test_a_gzipped_log_is_read_decompressed(tmp_path):
    """A rotated `server.log.2.gz` replays like the plain file (same report); a corrupt one is
    a clear error, not an empty report."""
    import gzip

    gz = tmp_path / "kimi.log.2.gz"
    gz.write_bytes(gzip.compress(EXAMPLE.read_bytes()))
    plain = json.loads(replay(str(EXAMPLE), "--config", "examples/kimi-k25.yaml", "--json").stdout)
    r = replay(str(gz), "--config", "examples/kimi-k25.yaml", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["lines"] == plain["lines"] == {"total": 2, "decode": 2, "prefill": 0, "other": 0, "malformed": 0, "unrecognized": 0}
    assert doc["alerts"] == plain["alerts"] and doc["alerts"][0]["status"] == "firing"
    bad = tmp_path / "cut.log.gz"
    bad.write_bytes(gz.read_bytes()[:30])
    r = replay(str(bad), "--json")
    assert r.returncode == 2 and "cannot read it" in r.stderr and "Traceback" not in r.stderr


def test_notify_to_a_receiver_that_is_down_waits_once_and_says_nothing_is_kept(tmp_path):
    """`--slack-timeout` bounds the whole wait (two dead receivers: one timeout, not two), and
    the message says the undelivered notifications are not kept."""
    import time

    import yaml

    from procs import free_port

    dead = f"http://127.0.0.1:{free_port()}/"
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"server": "kimi-k25-tp8", "rules": {"collapse": {"min_batches": 2}}, "alerts": {
        "slack": {"webhook_url": dead + "slack"}, "webhooks": [{"name": "ops", "url": dead + "hook"}]}}))
    t0 = time.monotonic()
    r = replay(str(EXAMPLE), "--config", str(cfg), "--notify", "--slack-timeout", "8")
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stderr
    assert "1 slack notification(s) not delivered within 8s and not kept" in r.stderr
    assert "1 webhook/ops notification(s) not delivered within 8s and not kept" in r.stderr
    assert 8 <= took < 16  # one shared 8 s wait (plus start-up); one wait per receiver would be >= 16 s


def test_notify_to_a_receiver_that_rejects_it_fails_and_says_so(tmp_path, slack):
    """A receiver that rejects a notification for good (Slack 403 `invalid_token`, a webhook's
    404) makes the replay fail with one summary line per receiver, like an undelivered one."""
    import yaml

    from slack_endpoint import SlackEndpoint

    hook = SlackEndpoint()
    try:
        slack.script.append((403, {}, "invalid_token"))
        hook.script.append((404, {}, "no such hook"))
        cfg = tmp_path / "config.yaml"
        cfg.write_text(yaml.safe_dump({"server": "kimi-k25-tp8", "rules": {"collapse": {"min_batches": 2}}, "alerts": {
            "slack": {"webhook_url": slack.url}, "webhooks": [{"name": "ops", "url": hook.url}]}}))
        r = replay(str(EXAMPLE), "--config", str(cfg), "--notify", "--slack-timeout", "10")
    finally:
        hook.close()
    assert (len(slack.received), len(hook.received)) == (1, 1)
    assert r.returncode == 1, r.stderr
    assert "1 slack notification(s) rejected by the receiver and dropped" in r.stderr
    assert "1 webhook/ops notification(s) rejected by the receiver and dropped" in r.stderr
    assert "AcceptanceCollapse" in r.stdout  # the report is still printed


def test_report_prints_each_fix_once(tmp_path):
    """Two ranks collapse (8 ranks): the second rank's episodes repeat only the fixes that differ
    (the rank-disagreement grep names its rank); the others are `(as above: name)`."""
    log = tmp_path / "eight.log"
    eight_rank_two_collapses_log(log)
    r = replay(str(log))
    assert r.returncode == 0, r.stderr
    doc = json.loads(replay(str(log), "--json").stdout)
    blocks = {b.split(":", 1)[0]: b for b in r.stdout.rstrip().split("\n\nALERT ")[1:]}
    assert set(blocks) == {f"{name} on eight {rank}" for name in ("AcceptanceCollapse", "RankDisagreement")
                           for rank in ("DP3 TP3", "DP5 TP5")}
    assert blocks["AcceptanceCollapse on eight DP5 TP5"].endswith("what to check: as above")
    [dp3, dp5] = [e["fixes"] for e in doc["episodes"] if e["name"] == "RankDisagreement"]
    assert dp3[0] != dp5[0] and dp3[1:] == dp5[1:] and len(dp5) == 4
    assert f"   1. {dp5[0]}" in blocks["RankDisagreement on eight DP5 TP5"]
    assert blocks["RankDisagreement on eight DP5 TP5"].endswith(
        "   2. (as above: Check the GPU of this rank)\n   3. (as above: PD disaggregation / transfer)\n"
        "   4. (as above: Routing)")
    for fix in {f for e in doc["episodes"] for f in e["fixes"]}:
        assert r.stdout.count(fix) == 1


def test_resolved_slack_message_shows_why_not_the_firing_evidence(tmp_path, slack):
    """DP1 recovers (3-rank log): Slack's resolved message has server, rank and `recovered
    accept len` as fields and the firing evidence only on its "At firing" line; the webhook's
    resolved alert still carries all the evidence, the reason first."""
    import yaml

    log = tmp_path / "three.log"
    three_rank_collapse_log(log)
    # without inhibitions: by default the rank disagreement of DP1 mutes its collapse
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"server": "three", "alerts": {"inhibit_rules": [], "webhooks": [{"name": "ops", "url": slack.url}]}}))
    doc = json.loads(replay(str(log), "--config", str(cfg), "--slack-dry-run", "--json").stdout)
    [resolved] = [p for p in doc["slack_payloads"] if p["text"].startswith("[RESOLVED] AcceptanceCollapse")]
    [fields] = [b["fields"] for b in resolved["blocks"] if "fields" in b]
    assert [f["text"] for f in fields] == ["*Server*\nthree", "*Rank*\nDP1 TP1", "*recovered accept len*\n2.64"]
    [at_firing] = [e["text"] for b in resolved["blocks"] if b["type"] == "context" for e in b["elements"]
                   if e["text"].startswith("*At firing:*")]
    assert at_firing.startswith("*At firing:* accept len: 1.02 · accept rate: ")
    assert replay(str(log), "--config", str(cfg), "--notify", "--slack-timeout", "10").returncode == 0
    [hook] = [b for b in slack.received if b["status"] == "resolved" and
              b["alerts"][0]["labels"]["alertname"] == "AcceptanceCollapse"]
    evidence = hook["alerts"][0]["annotations"]["evidence"].splitlines()
    assert evidence[:2] == ["recovered accept len: 2.64", "accept len: 1.02"]


def test_a_server_wide_collapse_counts_as_one_earlier_episode(tmp_path):
    """New-user trial: 4 ranks collapse together (10:00:10-10:00:19) and recover; DP0 alone
    collapses again at 10:00:40. Its alert counts 1 earlier episode (not 4, one per rank) and,
    since that one recovered by itself, puts the runtime state first."""
    lines = [server_args_line(ts="2026-03-01 09:59:00", speculative_algorithm="EAGLE3")[0]]
    for i in range(60):
        for r in range(4):
            low = 10 <= i < 20 or (r == 0 and 40 <= i < 50)
            lines.append(decode_line("0.5.23", ts=f"2026-03-01 10:00:{i:02d}", rank={"DP": r, "TP": r},
                                     accept_len=1.02 if low else 2.7)[0])
    log = tmp_path / "four.log"
    log.write_text("\n".join(lines) + "\n")
    doc = json.loads(replay(str(log), "--json").stdout)
    collapses = [e for e in doc["episodes"] if e["name"] == "AcceptanceCollapse"]
    assert [(e["rank"], e["starts_at"][11:19]) for e in collapses] == \
        [(f"DP{r} TP{r}", "10:00:10") for r in range(4)] + [("DP0 TP0", "10:00:40")]
    assert all("earlier episodes recovered without a restart" not in e["evidence"] for e in collapses[:4])
    again = collapses[-1]
    assert again["evidence"]["earlier episodes recovered without a restart"] == "1"
    assert again["fixes"][0].startswith("Acceptance recovered by itself 1 time(s) on this server")


def test_json_alerts_carry_severity_labels_and_annotations_as_alertmanager_lists_them(tmp_path):
    """A script tells a page from a note: each alert (and episode) of `--json` has its severity
    and, as Alertmanager's `GET /api/v2/alerts` lists an alert, its labels, annotations and
    fingerprint (the same fingerprint for the firing and the resolved transition)."""
    log = tmp_path / "three.log"
    three_rank_collapse_log(log)
    doc = json.loads(replay(str(log), "--json").stdout)
    by_name = {(a["name"], a["status"]): a for a in doc["alerts"]}
    page, note = by_name[("AcceptanceCollapse", "firing")], by_name[("RankDisagreement", "firing")]
    # both pages: a one-rank collapse's RankDisagreement is critical (it mutes that rank's collapse)
    assert (page["severity"], note["severity"]) == ("critical", "critical")
    assert all(a["severity"] == a["labels"]["severity"] for a in doc["alerts"])
    assert page["labels"] == {"alertname": "AcceptanceCollapse", "severity": "critical", "server": "three",
                              "rank": "DP1 TP1", "engine": "sglang"}
    assert page["annotations"]["summary"] == page["summary"] and "description" in page["annotations"]
    assert page["fingerprint"] == Alert(labels=page["labels"], annotations={}, starts_at=0).fingerprint
    assert by_name[("AcceptanceCollapse", "resolved")]["fingerprint"] == page["fingerprint"]
    [episode] = [e for e in doc["episodes"] if e["name"] == "AcceptanceCollapse"]
    assert episode["severity"] == "critical" and episode["labels"] == page["labels"]


def test_without_a_config_the_server_is_named_after_the_file(tmp_path):
    """No config and no --server: each log replays as the server its file is named after (its
    rotated and gzipped siblings as the same one), not as `replay`; --server still wins."""
    log = tmp_path / "sglang-7.log.1"
    three_rank_collapse_log(log)
    doc = json.loads(replay(str(log), "--json").stdout)
    assert {a["server"] for a in doc["alerts"]} == {"sglang-7"} and doc["alerts"]
    assert "ALERT AcceptanceCollapse on sglang-7 DP1 TP1" in replay(str(log)).stdout
    doc = json.loads(replay(str(log), "--server", "box", "--json").stdout)
    assert {a["server"] for a in doc["alerts"]} == {"box"}


BUGREPORTS = ROOT / "tests" / "data" / "samples" / "bugreport-logs"


def test_an_episode_reads_as_its_last_update_not_as_it_first_fired(tmp_path):
    """BR-47 (a CUDA graph capture failure at every start, 3 starts): the report's episode says the
    crash loop and counts 3 failed starts, with each update notified, not the first start's 1; BR-45
    (a hang on 8 DP ranks, then the scheduler crash): its episode names all 8 ranks and the crash."""
    doc = json.loads(replay(str(BUGREPORTS / "BR-47.log"), "--json").stdout)
    [ep] = doc["episodes"]
    assert ep["status"] == "firing" and ep["notifications"] == 1
    assert ep["summary"].endswith("; crash loop: 3 failed starts with the same settings"), ep["summary"]
    assert ep["annotations"]["summary"] == ep["summary"]
    assert (ep["evidence"]["failed starts with these settings"], ep["evidence"]["errors of this kind"]) == ("3", "3")
    assert ep["updates"] == [{"at": "2026-07-22T15:09:58Z", "note": "crash loop: 2 failed starts with the same settings"},
                             {"at": "2026-07-22T15:15:13Z", "note": "crash loop: 3 failed starts with the same settings"}]
    text = replay(str(BUGREPORTS / "BR-47.log")).stdout
    assert "  update 2026-07-22T15:15:13Z: crash loop: 3 failed starts with the same settings\n" in text

    [ep] = json.loads(replay(str(BUGREPORTS / "BR-45.log"), "--json").stdout)["episodes"]
    ranks = ep["evidence"]["ranks"].split(", ")
    assert ranks == [f"DP{r} TP{r} EP{r}" for r in range(8)] + ["scheduler_0 crashed (exit code -3)"]
    assert ep["evidence"]["errors of this kind"] == "8"
    assert [u["note"].split(":")[0] for u in ep["updates"]] == ["the server exits"]


def test_a_resolved_episode_keeps_its_last_firing_state(tmp_path):
    """BR-47 followed by an hour of healthy serving: the crash loop resolves; its episode still
    counts the 3 failed starts (the resolve's copy, less why it resolved) and says why it resolved."""
    log = tmp_path / "BR-47.log"
    healthy = [decode_line("0.5.23", ts=f"2026-07-22 16:{m:02d}:00", rank={"TP": 0}, accept_len=2.7)[0] for m in range(30)]
    log.write_text((BUGREPORTS / "BR-47.log").read_text() + "\n".join(healthy) + "\n")
    doc = json.loads(replay(str(log), "--json").stdout)
    [ep] = [e for e in doc["episodes"] if e["name"] == "ServerLogError"]
    assert ep["status"] == "resolved" and ep["notifications"] == 2
    assert ep["evidence"]["failed starts with these settings"] == "3"
    assert "no error of this kind for" not in ep["evidence"]
    assert "no error of this kind for" in ep["resolved_evidence"]
    assert ep["summary"].endswith("; crash loop: 3 failed starts with the same settings")
