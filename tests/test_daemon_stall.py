"""`specwatch run` as a real subprocess, the README's plain-file setup (a followed file, no
`server_api`), with its live clock: a decode stall fires from the log alone, both when no line
comes at all and when HTTP access lines keep coming, and the status page shows it; BR-45's hung
schedulers page by the watchdog line."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from procs import decode_line, wait_for
from specwatch_daemon import SpecwatchDaemon

SILENT = 3.0  # rules.decode_stalled.silent_for here: seconds, to keep the test short
BR45 = Path(__file__).resolve().parent / "data" / "samples" / "bugreport-logs" / "BR-45.log"


def now_stamp() -> tuple[str, str]:
    t = time.localtime()
    return time.strftime("%Y-%m-%d", t), time.strftime("%H:%M:%S", t)


def status(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=10) as r:
        return json.loads(r.read())


def page(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
        return r.read().decode()


def start(tmp_path: Path, slack) -> tuple[SpecwatchDaemon, Path]:
    log = tmp_path / "server.log"
    log.write_text("")
    d = SpecwatchDaemon(tmp_path, log, env={"SW_TEST_HOOK": slack.url},
                        rules={"decode_stalled": {"silent_for": f"{SILENT}s"}},
                        alerts={"group_wait": "0s", "group_interval": "0s", "slack": {"webhook_url_env": "SW_TEST_HOOK"}})
    d.start()
    return d, log


def busy(log: Path, n: int = 3) -> float:
    """Decode lines with 32 running requests (as `tee -a` appends them); returns when the last was written."""
    for _ in range(n):
        day, clock = now_stamp()
        with open(log, "a") as f:
            f.write(decode_line(1.9, clock, day=day, running=32))
        time.sleep(0.3)
    return time.monotonic()


def stalled(slack) -> list[dict]:
    return [m for m in slack.received if "DecodeStalled" in m["text"]]


def test_a_silent_log_with_requests_running_fires_from_the_ticks_and_turns_the_page_red(tmp_path, slack):
    d, log = start(tmp_path, slack)
    try:
        last = busy(log)
        wait_for(lambda: stalled(slack), timeout=20, what="DecodeStalled with no line at all")
        waited = time.monotonic() - last
        assert SILENT - 0.5 <= waited <= SILENT + 6, waited  # bounded: `silent_for` and a tick or two
        body = json.dumps(stalled(slack)[0], ensure_ascii=False)
        assert "showed 32 running request(s)" in body and "#running-req: 32" in body, body  # the last decode line, named
        assert "nothing: the log is silent" in body
        s = status(d.port)
        [a] = [a for a in s["alerts"] if a["alertname"] == "DecodeStalled"]
        assert a["severity"] == "critical" and a["server"] == "gpu-box-1"
        html = page(d.port)
        assert 'class="alert critical"' in html and "None firing." not in html
        # decoding again resolves it
        busy(log, 1)
        wait_for(lambda: not [a for a in status(d.port)["alerts"] if a["alertname"] == "DecodeStalled"],
                 timeout=15, what="DecodeStalled resolved by a decode line")
    finally:
        rc, out = d.stop()
    assert rc == 0 and "alert firing: DecodeStalled" in out, out


def test_access_lines_arriving_without_decode_lines_is_a_stall_naming_them(tmp_path, slack):
    d, log = start(tmp_path, slack)
    try:
        busy(log)
        deadline = time.monotonic() + 20
        while not stalled(slack) and time.monotonic() < deadline:
            day, clock = now_stamp()
            with open(log, "a") as f:
                f.write(f'[{day} {clock}] INFO:     10.0.0.7:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n')
            time.sleep(0.4)
        assert stalled(slack), "DecodeStalled while access lines arrive"
        body = json.dumps(stalled(slack)[0], ensure_ascii=False)
        assert "other lines until" in body and "#running-req: 32" in body
    finally:
        d.stop()


def test_br45_hung_schedulers_page_critical_by_the_watchdog_line(tmp_path, slack):
    """BR-45 (sgl-project/sglang#29144) written live: the watchdog lines page at once (critical),
    naming EAGLE + DP attention, before the launcher's crash line is even written."""
    d, log = start(tmp_path, slack)
    lines = [t for t in BR45.read_text().splitlines() if not t.startswith("#")]
    watchdog = next(i for i, t in enumerate(lines) if "watchdog timeout" in t)
    try:
        with open(log, "a") as f:
            f.write("\n".join(lines[:watchdog + 1]) + "\n")
        wait_for(lambda: [m for m in slack.received if "ServerLogError" in m["text"]], timeout=20,
                 what="the watchdog's alert")
        [m] = [m for m in slack.received if "ServerLogError" in m["text"]]
        body = json.dumps(m, ensure_ascii=False)
        assert "hung scheduler (watchdog timeout)" in body and "EAGLE + DP attention" in body
        assert "sgl-project/sglang#29144" in body
        [a] = [a for a in status(d.port)["alerts"] if a["alertname"] == "ServerLogError"]
        assert a["severity"] == "critical"
        with open(log, "a") as f:
            f.write("\n".join(lines[watchdog + 1:]) + "\n")
        wait_for(lambda: "scheduler_0 crashed (exit code -3)" in json.dumps(status(d.port)), timeout=15,
                 what="the crash line in the watchdog alert's evidence")
        # the same alert once more, marked with the crash (an update, not a second alert)
        wait_for(lambda: len([m for m in slack.received if "ServerLogError" in m["text"]]) == 2, timeout=15,
                 what="the watchdog alert's update")
        update = json.dumps([m for m in slack.received if "ServerLogError" in m["text"]][1], ensure_ascii=False)
        assert "the server exits" in update and "Subprocess scheduler_0 crashed with exit code -3" in update
        assert len([a for a in status(d.port)["alerts"] if a["alertname"] == "ServerLogError"]) == 1
    finally:
        d.stop()
