"""`specwatch run` on a log whose clock is hours off the host's (a container in another zone,
`logs[].timezone` unset): alerts still go out at once, resolve only on the log's recovery, with
durations that are never negative, and the offset is said loudly (log line and metric)."""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone

import pytest

from procs import decode_line, rank_labels, wait_for
from specwatch_daemon import SpecwatchDaemon

TP0 = rank_labels()


def _write(log, shift: float, accepts: dict[str, float]) -> float:
    """One decode line per rank, stamped now + shift; returns time.monotonic() of the write."""
    stamp = datetime.fromtimestamp(time.time() + shift, timezone.utc)
    with log.open("a") as f:
        f.writelines(decode_line(a, stamp.strftime("%H:%M:%S"), rank=r, day=stamp.strftime("%Y-%m-%d"))
                     for r, a in accepts.items())
    return time.monotonic()


def _collapsed(d) -> float | None:
    return d.scrape().get(("specwatch_acceptance_collapsed", TP0))


@pytest.mark.parametrize("hours", [5, -5])
def test_a_log_hours_off_the_host_clock_alerts_at_once_and_says_so(tmp_path, slack, hours):
    shift = hours * 3600.0
    log = tmp_path / "sglang.log"
    log.write_text("")
    d = SpecwatchDaemon(tmp_path, log, env={"SW_HOOK": slack.url, "TZ": "UTC"}, alerts={
        "group_wait": "1s", "group_interval": "1s", "slack": {"webhook_url_env": "SW_HOOK"}})
    try:
        d.start()
        for _ in range(2):  # both ranks healthy, the log's clock learned
            _write(log, shift, {"TP0": 2.9, "TP1": 2.9})
            time.sleep(0.3)
        fired_at = None
        for i in range(3):  # TP0 collapses at its third low line
            fired_at = _write(log, shift, {"TP0": 1.02, "TP1": 2.9})
            time.sleep(0.3)
        wait_for(lambda: slack.received, timeout=10, what="the firing message")
        delay = slack.times[0] - fired_at
        assert delay < 2.0, f"the collapse went out {delay:.1f}s after its line"
        assert "RankDisagreement" in slack.received[0]["text"] and "RESOLVED" not in slack.received[0]["text"]
        for _ in range(12):  # still collapsed for 4 s of wall (and log) time: nothing resolves
            _write(log, shift, {"TP0": 1.02, "TP1": 2.9})
            time.sleep(0.33)
        assert _collapsed(d) == 1
        last = d.scrape()[("specwatch_last_decode_batch_timestamp_seconds", TP0)]
        assert abs(last - time.time()) < 60, "the log's time is read onto the wall clock"
        collapse_msgs = [b["text"] for b in slack.received if "RankDisagreement" in b["text"]]
        assert len(collapse_msgs) == 1, collapse_msgs
        for _ in range(3):  # the log says it recovered
            _write(log, shift, {"TP0": 2.9, "TP1": 2.9})
            time.sleep(0.3)
        wait_for(lambda: _collapsed(d) == 0, timeout=10, what="the recovery")
        wait_for(lambda: any("RESOLVED" in b["text"] and "RankDisagreement" in b["text"] for b in slack.received),
                 timeout=10, what="the resolved message")
        texts = " ".join(b["text"] for b in slack.received)
        durations = [int(s) for s in re.findall(r"[Rr]esolved after \*?(\d+)s", texts)]
        assert durations and all(4 <= s <= 15 for s in durations), texts
        logged = [int(s) for s in re.findall(r"alert resolved after (-?\d+)s", d.output)]
        assert logged and all(4 <= s <= 15 for s in logged), d.output
        offset = d.scrape()[("specwatch_log_clock_offset_seconds", (("server", "gpu-box-1"),))]
        assert abs(offset - shift) < 60
        warnings = [ln for ln in d.output.splitlines() if " WARNING " in ln and "clock" in ln]
        assert len(warnings) == 1, warnings
        assert str(log) in warnings[0] and f"{hours:+d}h" in warnings[0]
        assert "logs[].timezone" in warnings[0] and "log_timezone" in warnings[0]
    finally:
        d.stop()


def test_old_lines_read_after_a_restart_are_not_a_clock_offset(tmp_path):
    """A daemon resumed from its saved offset reads lines written 30 minutes ago (it was down, the
    server idle since): their stamps are behind the wall clock but not the file's mtime, so no
    offset is learned, no warning, and the log is read in its configured zone."""
    import os

    log = tmp_path / "sglang.log"
    _write(log, 0, {"TP0": 2.9})
    d = SpecwatchDaemon(tmp_path, log, env={"TZ": "UTC"})
    d.start()
    try:
        wait_for(lambda: d.scrape().get(("specwatch_decode_batches_total", TP0)) == 1, what="the first line")
    finally:
        d.stop()
    _write(log, -1800, {"TP0": 2.9, "TP1": 2.9})  # written then; the daemon was down
    then = time.time() - 1800
    os.utime(log, (then, then))
    d = SpecwatchDaemon(tmp_path, log, env={"TZ": "UTC"})
    d.start()
    try:
        wait_for(lambda: d.scrape().get(("specwatch_decode_batches_total", TP0)) == 2, what="the old lines")
        _write(log, 0, {"TP0": 2.9})  # and a fresh one
        wait_for(lambda: d.scrape().get(("specwatch_decode_batches_total", TP0)) == 3, what="the new line")
        assert d.scrape().get(("specwatch_log_clock_offset_seconds", (("server", "gpu-box-1"),)), 0) == 0
        last = d.scrape()[("specwatch_last_decode_batch_timestamp_seconds", TP0)]
        assert abs(last - time.time()) < 60
    finally:
        d.stop()
    assert not [ln for ln in d.output.splitlines() if " WARNING " in ln and "clock" in ln], d.output


def test_a_backlog_hours_ahead_is_read_shifted_from_its_first_line(tmp_path, slack):
    """The daemon starts on a log that already holds lines stamped 5 h ahead: the offset is
    measured before the first line is read, so the backlog and the new lines are on one clock
    (the last decode time is now, not 5 h ahead, from the start), and a collapse goes out at once."""
    log = tmp_path / "sglang.log"
    for _ in range(3):
        _write(log, 5 * 3600, {"TP0": 2.9, "TP1": 2.9})
    d = SpecwatchDaemon(tmp_path, log, env={"SW_HOOK": slack.url, "TZ": "UTC"}, alerts={
        "group_wait": "1s", "group_interval": "1s", "slack": {"webhook_url_env": "SW_HOOK"}})
    try:
        d.start()
        wait_for(lambda: d.scrape().get(("specwatch_decode_batches_total", TP0)) == 3, what="the backlog")
        assert abs(d.scrape()[("specwatch_last_decode_batch_timestamp_seconds", TP0)] - time.time()) < 60
        for _ in range(3):
            fired_at = _write(log, 5 * 3600, {"TP0": 1.02, "TP1": 2.9})
            time.sleep(0.3)
        wait_for(lambda: slack.received, timeout=10, what="the firing message")
        assert slack.times[0] - fired_at < 2.0
        assert "RankDisagreement" in slack.received[0]["text"]
    finally:
        d.stop()
    assert len([ln for ln in d.output.splitlines() if " WARNING " in ln and "clock" in ln]) == 1, d.output


def test_an_idle_log_then_an_unstamped_line_is_not_an_offset(tmp_path):
    """The last stamped line is 400 s old and an unstamped uvicorn line came after it (the file's
    mtime is now): not a zone (not whole quarter hours off), so nothing is shifted or warned."""
    log = tmp_path / "sglang.log"
    _write(log, -400, {"TP0": 2.9})
    with log.open("a") as f:
        f.write('INFO:     127.0.0.1:40000 - "GET /health HTTP/1.1" 200 OK\n')
    d = SpecwatchDaemon(tmp_path, log, env={"TZ": "UTC"})
    try:
        d.start()
        wait_for(lambda: d.scrape().get(("specwatch_decode_batches_total", TP0)) == 1, what="the line")
        assert d.scrape().get(("specwatch_log_clock_offset_seconds", (("server", "gpu-box-1"),)), 0) == 0
        assert abs(d.scrape()[("specwatch_last_decode_batch_timestamp_seconds", TP0)] - (time.time() - 400)) < 30
    finally:
        d.stop()
    assert not [ln for ln in d.output.splitlines() if " WARNING " in ln and "clock" in ln], d.output


# The unstamped traceback of BR-47 (lines 17-20: a second exception printed without SGLang's
# stamp), from tests/data/samples/bugreport-logs/BR-47.log.
_UNSTAMPED_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/model_executor/cuda_graph_runner.py", line 480, in capture\n'
    "    raise Exception(\n"
    "Exception: Capture cuda graph failed: CUDA error: operation failed due to a previous error during capture\n")


def test_an_hour_idle_then_an_unstamped_traceback_is_not_a_zone(tmp_path):
    """The last decode line is 60 minutes old, a traceback without stamps is written now (the
    file's mtime), then the daemon starts: an idle hour, not a zone an hour west. Nothing is
    shifted or warned, and a line written afterwards is read at its own time, not an hour ahead."""
    log = tmp_path / "sglang.log"
    _write(log, -3600, {"TP0": 2.9})
    with log.open("a") as f:
        f.write(_UNSTAMPED_TRACEBACK)
    d = SpecwatchDaemon(tmp_path, log, env={"TZ": "UTC"}, extra={"diagnosis": {"enabled": False}})
    try:
        d.start()
        wait_for(lambda: d.scrape().get(("specwatch_decode_batches_total", TP0)) == 1, what="the old line")
        assert abs(d.scrape()[("specwatch_last_decode_batch_timestamp_seconds", TP0)] - (time.time() - 3600)) < 30
        _write(log, 0, {"TP0": 2.9})  # the server serves again
        wait_for(lambda: d.scrape().get(("specwatch_decode_batches_total", TP0)) == 2, what="the new line")
        last = d.scrape()[("specwatch_last_decode_batch_timestamp_seconds", TP0)]
        assert last <= time.time() + 2, f"a line read {last - time.time():.0f}s in the future"
        assert abs(last - time.time()) < 30
        assert d.scrape().get(("specwatch_log_clock_offset_seconds", (("server", "gpu-box-1"),)), 0) == 0
    finally:
        d.stop()
    assert not [ln for ln in d.output.splitlines() if " WARNING " in ln and "clock" in ln], d.output
