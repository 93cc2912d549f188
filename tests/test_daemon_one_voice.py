"""One incident, one message: `specwatch run` as a real subprocess, posting to a real local Slack
endpoint, with the default alert settings (group_wait 1s, group_interval 1m, default inhibit
rules). An 8-rank SGLang server whose ranks collapse together sends one message, not one per
rank; one collapsed rank of 8 sends one message (the rank disagreement), not a collapse message
with checkpoint checks beside a disagreement saying the checkpoint is not the problem."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

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


def _run(tmp_path, slack, collapsed: set[int]) -> tuple[list[dict], str]:
    """Start a daemon on an empty log, append 6 healthy seconds of 8 ranks, then 5 seconds in
    which the `collapsed` ranks' accept len is 1.02 (all lines of a second at once); returns the
    Slack bodies received within 4 s of the first and the daemon's output."""
    log = tmp_path / "sglang.log"
    log.write_text("")
    d = SpecwatchDaemon(tmp_path, log, alerts={"slack": {"webhook_url": slack.url}},
                        extra={"process": {"enabled": False}})
    d.start()
    try:
        stamps = _stamps(11)
        with open(log, "a") as f:
            f.write(server_args_line(ts=stamps[0], **DRAFT)[0] + "\n")
            f.write(_lines(stamps[:6], set()))
        time.sleep(1.0)
        with open(log, "a") as f:
            f.write(_lines(stamps[6:], collapsed))
        wait_for(lambda: slack.received, timeout=20, what="the first Slack message")
        time.sleep(4.0)  # anything more sent per rank, or as a second diagnosis, arrives by now
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
    assert out.count("alert firing: AcceptanceCollapse") == RANKS  # every alert still logged


def test_one_collapsed_rank_of_eight_sends_one_message_with_one_diagnosis(tmp_path, slack):
    got, out = _run(tmp_path, slack, {3})
    assert len(got) == 1, [b["text"] for b in got]
    [msg] = got
    assert msg["text"].startswith("[FIRING] RankDisagreement on gpu-box-1 DP3 TP3"), msg["text"]
    body = str(msg["blocks"])
    assert "The draft checkpoint is not the problem" in body, body
    assert "specwatch diagnose --draft" not in body  # no checkpoint checks beside it
    # the collapse alert still fires (metrics, log, Alertmanager push), it is only not notified
    assert "alert firing: AcceptanceCollapse on gpu-box-1 DP3 TP3" in out
