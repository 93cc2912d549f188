"""Text inside a request log is never an engine event.

SGLang's `--log-requests` writes each request as one record, `[ts] Receive: obj=...` /
`[ts] Finish: obj=..., out=...` (or a JSON event) with the user's text inside
(`RequestLogger`, sglang/srt/utils/request_logger.py@0.5.23, formatter `[%(asctime)s] %(message)s`
of sglang/srt/utils/log_utils.py@0.5.23); vLLM writes `Received request ...` / `Generated
response ...: output: '...'` after its own header (vllm/entrypoints/serve/utils/request_logger.py
@0.33.0). A prompt quoting SGLang's `Health check failed. Server couldn't get a response …` line
once counted as a failed health check (DecodeStalled fired, and the shipped Prometheus rule reads
the same counter), and an indented copy of a decode line raised SGLangLogUnrecognized. Engine
events are read at the start of a record's message only: as `replay` and as `run` read them (the chunk scanner and the general parser)
and in the daemon alike.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest

from procs import wait_for
from sglang_lines import decode_line
from specwatch_daemon import SpecwatchDaemon

HEALTH = ("Health check failed. Server couldn't get a response from detokenizer for last 20 seconds. "
          "tic start time: 12:00:10. last_heartbeat time: 12:00:00")
RID = "6f1c2a9e0b3d4c5f8a7e9d0c1b2a3f4e"


def quoting(stamp: str, real_decode: str) -> list[str]:
    """Request logs and continuation lines that quote the health-check line and a decode line."""
    prompt = f"My server logged: [{stamp}] {HEALTH}. What does it mean?"
    return [
        f"[{stamp}] Receive: obj=GenerateReqInput(text={prompt!r}, rid='{RID}', stream=False)",
        f"[{stamp}] Receive: obj=GenerateReqInput(text={HEALTH!r}, rid='{RID}', stream=False)",
        f"[{stamp}] Finish: obj=GenerateReqInput(text={prompt!r}, rid='{RID}'), "
        f"out={{'text': {HEALTH!r}, 'meta_info': {{'id': '{RID}', 'completion_tokens': 12}}}}",
        f"[{stamp}] " + json.dumps({"timestamp": "2026-01-01T12:00:10.1", "event": "request.received",
                                    "rid": RID, "obj": {"text": HEALTH}}, ensure_ascii=False),
        f"(APIServer pid=7) INFO 01-01 12:00:10 [logger.py:39] Received request cmpl-1: prompt: {HEALTH!r}, "
        "params: SamplingParams(n=1), lora_request: None.",
        f"(APIServer pid=7) INFO 01-01 12:00:10 [logger.py:60] Generated response cmpl-1: output: {HEALTH!r}, "
        "finish_reason: stop",
        "    " + HEALTH,  # continuation lines of a multi-line dump: no record starts there
        "  " + f"[{stamp}] {HEALTH}",
        HEALTH,
        "    " + real_decode,
        "\t" + real_decode,
    ]


def _feed(lines: list[str], columns: bool, fmt: str | None = None):
    """`lines` as one read of a followed file (`format: fmt`), through the file's stage."""
    from specwatch.alerts.dispatcher import Dispatcher
    from specwatch.config import build_config
    from specwatch.core.pipeline import Pipeline
    from specwatch.sources.filestream import LineBatch
    from specwatch.sources.logfiles import stage

    entry = {"path": "s.log", **({"format": fmt} if fmt else {})}
    cfg = build_config({"server": "box", "log_timezone": "UTC", "logs": [entry], "diagnosis": {"enabled": False}})
    p = Pipeline(cfg, Dispatcher([], group_wait=0, group_interval=0, keep_history=True))
    text = "".join(ln + "\n" for ln in lines)
    on_lines = stage(cfg.logs[0], (lambda b: p.feed_batch(b, time.time())) if columns else p.feed_batch)
    if columns:  # as `run` reads a backlog: with a wall clock, the engine settled by an earlier read
        head, text = text.split("\n", 1)
        on_lines(LineBatch("s.log", 0, len(head) + 1, block=(head + "\n").encode(), text=head + "\n"))
    on_lines(LineBatch("s.log", 0, len(text.encode()), block=text.encode(), text=text))
    p.flush_errors()
    return p


def test_under_a_python_logging_grammar_too():
    """SGLang run with `SGLANG_LOGGING_CONFIG_PATH` (`format: python-logging`): the request records
    and the continuation lines (marked as no record by the grammar) count as nothing; the
    health-check record does."""
    def rec(level: str, where: str, msg: str) -> str:
        return f"2026-01-01 12:00:10,100 {level} 42 [{where}] {msg}"

    real = decode_line("0.5.23", ts="2026-01-01 12:00:09", accept_len=2.8)[0]
    requests = [ln.split("] ", 1)[1] for ln in quoting("2026-01-01 12:00:10", real)[:4]]
    lines = [rec("INFO", "request_logger.py:116", m) for m in requests] + quoting("2026-01-01 12:00:10", real)[6:]
    lines.append(f"[2026-01-01 12:00:10] {HEALTH}")  # SGLang's own form is no record of this grammar
    p = _feed(lines, False, "python-logging")
    st = p.servers["box"]
    assert (st.lines["unrecognized"], st.errors["health_check"]) == (0, 0), (st.lines, st.errors)
    p = _feed(lines + [rec("ERROR", "http_server.py:793", HEALTH)], False, "python-logging")
    assert p.servers["box"].errors["health_check"] == 1


@pytest.mark.parametrize("columns", [False, True], ids=["replay", "run"])
def test_request_text_is_no_event_and_the_real_line_still_is(columns):
    real = [decode_line("0.5.23", ts=f"2026-01-01 12:{m:02d}:{s:02d}", accept_len=2.8)[0]
            for m in range(10) for s in range(60)]  # 600 decode lines: 256+ on each side go in columns
    injected = quoting("2026-01-01 12:05:00", real[0])
    lines = real[:300] + injected + real[300:]
    p = _feed(lines, columns)
    st = p.servers["box"]
    assert st.lines["decode"] == 600 and st.lines["unrecognized"] == 0, st.lines
    assert sum(st.lines.values()) == len(lines)
    assert st.errors["health_check"] == 0, st.errors
    assert [a.name for a in p.dispatcher.history] == []
    # SGLang's own record of a failed health check (`health_generate`, http_server.py@0.5.23) still counts
    p = _feed(lines + [f"[2026-01-01 12:10:00] {HEALTH}", f"[2026-01-01 12:10:01.123] {HEALTH}"], columns)
    assert p.servers["box"].errors["health_check"] == 2


def _now_lines(*accepts: float, running: int = 8) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return "".join(decode_line("0.5.23", ts=stamp, accept_len=a, running=running)[0] + "\n" for a in accepts)


def test_a_prompt_quoting_a_failed_health_check_stalls_nothing_in_the_daemon(tmp_path):
    """DecodeStalled with `for: 5s`: requests running, the log goes quiet after a request quoting
    the health-check line and an indented decode line; nothing fires in 8 s. SGLang's own
    health-check line then fires it (the same daemon, so the quiet part could have fired)."""
    log = tmp_path / "sglang.log"
    log.write_text("")
    d = SpecwatchDaemon(tmp_path, log, env={"TZ": "UTC"}, rules={"decode_stalled": {"for": "5s"}},
                        extra={"diagnosis": {"enabled": False}})
    errors = ("specwatch_log_errors_total", (("kind", "health_check"), ("server", "gpu-box-1")))
    try:
        d.start()
        with log.open("a") as f:
            f.write(_now_lines(2.8, 2.8))
        wait_for(lambda: d.scrape().get(("specwatch_log_lines_total", (("kind", "decode"), ("server", "gpu-box-1"))))
                 == 2, what="the decode lines")
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        injected = quoting(stamp, _now_lines(2.8).rstrip("\n"))
        with log.open("a") as f:
            f.writelines(ln + "\n" for ln in injected)
        wait_for(lambda: sum(v for (n, lb), v in d.scrape().items() if n == "specwatch_log_lines_total")
                 == 2 + len(injected), what="the request lines")
        time.sleep(8)
        assert d.scrape().get(errors) == 0
        assert "alert firing" not in d.output, d.output
        with log.open("a") as f:
            f.write(f"[{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M:%S')}] {HEALTH}\n")
        wait_for(lambda: d.scrape().get(errors) == 1, what="the real health-check line")
        wait_for(lambda: "alert firing: DecodeStalled" in d.output, timeout=15, what="DecodeStalled")
    finally:
        d.stop()
    assert "SGLangLogUnrecognized" not in d.output
