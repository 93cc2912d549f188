"""One incident, one message: `specwatch run` as a real subprocess, posting to a real local Slack
endpoint, with the default alert settings (group_wait set to 1s unless said, group_interval 1m, default inhibit
rules). An 8-rank SGLang server whose ranks collapse together sends one message, not one per
rank; one collapsed rank of 8 sends one message (the rank disagreement), not a collapse message
with checkpoint checks beside a disagreement saying the checkpoint is not the problem."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import os

import pytest

from procs import wait_for
from sglang_lines import decode_line, server_args_line
from specwatch_daemon import SpecwatchDaemon

RANKS = 8
DRAFT = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/llama-3.1-8b-eagle3"}


def _stamps(n: int) -> list[str]:
    """n log stamps one second apart, the last one now (UTC: the daemon reads them as UTC)."""
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(seconds=n)
    return [(start + timedelta(seconds=i)).strftime("%Y-%m-%d %H:%M:%S") for i in range(n)]


def _lines(stamps: list[str], collapsed: set[int]) -> str:
    out = []
    for ts in stamps:
        for r in range(RANKS):
            low = r in collapsed
            out.append(decode_line("0.5.23", ts=ts, rank={"DP": r, "TP": r}, accept_len=1.02 if low else 2.7,
                                   throughput=560.0 if low else 950.0)[0])
    return "\n".join(out) + "\n"


def _run(tmp_path, slack, collapsed: set[int], later: set[int] = frozenset(), alerts: dict | None = None,
         rules: dict | None = None, settle: float = 4.0) -> tuple[list[dict], str]:
    """Start a daemon on an empty log, append 6 healthy seconds of 8 ranks, then 5 seconds in
    which the `collapsed` ranks' accept len is 1.02 (all lines of a second at once); once the
    first message is in, 5 more seconds in which the `later` ranks collapse too. Returns the Slack
    bodies received `settle` seconds after that and the daemon's output."""
    log = tmp_path / "sglang.log"
    log.write_text("")
    # group_wait 1s (the default is 0s: the first rank at once, the others in the one follow-up)
    alerts = {"group_wait": "1s", **(alerts or {"slack": {"webhook_url": slack.url}})}
    if alerts["group_wait"] is None:  # the default (0s)
        del alerts["group_wait"]
    d = SpecwatchDaemon(tmp_path, log, alerts=alerts, rules=rules,
                        extra={"process": {"enabled": False}})
    d.start()
    try:
        stamps = _stamps(16)
        with open(log, "a") as f:
            f.write(server_args_line(ts=stamps[0], **DRAFT)[0] + "\n")
            f.write(_lines(stamps[:6], set()))
        time.sleep(1.0)
        with open(log, "a") as f:
            f.write(_lines(stamps[6:11], collapsed))
        wait_for(lambda: slack.received, timeout=20, what="the first Slack message")
        if later:
            with open(log, "a") as f:
                f.write(_lines(stamps[11:], collapsed | later))
        time.sleep(settle)  # anything more sent per rank, or as a second diagnosis, arrives by now
        got = list(slack.received)
    finally:
        rc, out = d.stop()
    assert rc == 0, out
    return got, out


def test_eight_ranks_collapsing_together_send_one_message(tmp_path, slack):
    got, out = _run(tmp_path, slack, set(range(RANKS)))
    assert len(got) == 1, [b["text"] for b in got]
    [msg] = got
    assert msg["text"].startswith("[FIRING:8] AcceptanceCollapse on gpu-box-1"), msg["text"]
    for r in range(RANKS):
        assert f"DP{r} TP{r}" in str(msg["blocks"])
    # the ranks share their fixes: listed once, the other 7 point at them
    sections = [b["text"]["text"] for b in msg["blocks"] if b["type"] == "section" and "text" in b]
    assert sum(t.startswith("*What to check*\n1. ") for t in sections) == 1
    assert sum(t.startswith("*What to check:* as for gpu-box-1 DP") for t in sections) == RANKS - 1
    assert out.count("alert firing: AcceptanceCollapse") == RANKS  # every alert still logged


@pytest.mark.parametrize("group_wait", ["1s", None])
def test_one_collapsed_rank_of_eight_sends_one_message_with_one_diagnosis(tmp_path, slack, group_wait):
    """At group_wait 1s and at the default 0s: the collapse and the rank disagreement of one line
    are handed over together, so the default inhibition holds before either is sent."""
    got, out = _run(tmp_path, slack, {3}, alerts={"group_wait": group_wait, "slack": {"webhook_url": slack.url}})
    assert len(got) == 1, [b["text"] for b in got]
    [msg] = got
    assert msg["text"].startswith("[FIRING] RankDisagreement on gpu-box-1 DP3 TP3"), msg["text"]
    body = str(msg["blocks"])
    assert "The draft checkpoint is not the problem" in body, body
    assert "specwatch diagnose --draft" not in body  # no checkpoint checks beside it
    # the collapse alert still fires (metrics, log, Alertmanager push), it is only not notified
    assert "alert firing: AcceptanceCollapse on gpu-box-1 DP3 TP3" in out


JOINING = {"rules": {"rank_disagreement": {"enabled": False}}}  # 4 then 8 ranks: one collapse incident


def test_ranks_joining_an_open_incident_go_out_in_one_follow_up(tmp_path, slack):
    """4 ranks collapse, then the other 4 while the incident is open: one more message (the
    group's next group_interval tick) listing all 8, not one per joining rank."""
    got, _ = _run(tmp_path, slack, {0, 1, 2, 3}, later={4, 5, 6, 7}, settle=10.0,  # two group_intervals and more: a loaded box
                  alerts={"group_interval": "4s", "slack": {"webhook_url": slack.url}}, **JOINING)
    assert [b["text"].split(" on ")[0] for b in got] == ["[FIRING:4] AcceptanceCollapse", "[FIRING:8] AcceptanceCollapse"]


def test_with_a_bot_token_joining_ranks_edit_the_incident_message(tmp_path, slack):
    """A bot token: the incident is one Slack message, posted with chat.postMessage and edited with
    chat.update (its channel and ts) as the other 4 ranks join, at once; the token goes only into
    the Authorization header, never into the log."""
    token = "xoxb-17-s3cr3t-b0t"
    got, out = _run(tmp_path, slack, {0, 1, 2, 3}, later={4, 5, 6, 7}, settle=3.0,
                    alerts={"slack": {"bot_token": token, "api_url": slack.api_url, "channel": "#oncall"}}, **JOINING)
    assert [p.rsplit("/", 1)[1] for p in slack.paths] == ["chat.postMessage", "chat.update"]
    first, edit = got
    assert first["channel"] == "#oncall" and first["text"].startswith("[FIRING:4] AcceptanceCollapse")
    assert (edit["channel"], edit["ts"]) == ("C0SPEC", "1.000100")  # what chat.postMessage answered
    assert edit["text"].startswith("[FIRING:8] AcceptanceCollapse")
    assert slack.auth == [f"Bearer {token}"] * 2 and token not in out


def test_at_the_default_group_wait_eight_ranks_collapsing_in_one_second_send_one_message(tmp_path, slack):
    """group_wait left at its default (0s: a single collapse goes out within the read that
    brought it): 8 ranks whose third low line is in the same second, read together, send one
    message naming all 8, not DP0 alone with `[FIRING:8]` a group_interval later. Each second of
    the log is written with one write, as a server's logger flushes it."""
    log = tmp_path / "sglang.log"
    log.write_text("")
    d = SpecwatchDaemon(tmp_path, log, alerts={"slack": {"webhook_url": slack.url}},
                        extra={"process": {"enabled": False}})
    d.start()
    try:
        stamps = _stamps(12)
        with open(log, "a") as f:
            f.write(server_args_line(ts=stamps[0], **DRAFT)[0] + "\n" + _lines(stamps[:6], set()))
        time.sleep(1.0)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND)
        try:
            for ts in stamps[6:]:
                os.write(fd, _lines([ts], set(range(RANKS))).encode())
                time.sleep(0.3)
        finally:
            os.close(fd)
        wait_for(lambda: slack.received, timeout=20, what="the first Slack message")
        time.sleep(4.0)  # a second message (the rest of the ranks, one per rank) arrives by now
        got = list(slack.received)
    finally:
        rc, out = d.stop()
    assert rc == 0, out
    assert len(got) == 1, [b["text"] for b in got]
    [msg] = got
    assert msg["text"].startswith("[FIRING:8] AcceptanceCollapse on gpu-box-1: DP0 TP0 accept len 1.02; DP1 TP1"), msg["text"]
    for r in range(RANKS):
        assert f"DP{r} TP{r} accept len 1.02" in msg["text"]
    assert out.count("alert firing: AcceptanceCollapse") == RANKS
