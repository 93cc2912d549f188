"""Line grammars (issue 11 item 4): presets and regexes rewrite records into SGLang's form; lines
that match no grammar are never decode lines; decode lines in an unknown format are counted as
`unrecognized` and alerted, never silently "other"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_lines import _DECODE_TEXT, decode_line, request_log_lines
from specwatch.config import build_config
from specwatch.core.pipeline import Pipeline
from specwatch.alerts.dispatcher import Dispatcher
from specwatch.core.events import DecodeBatch
from specwatch.sources.filestream import LineBatch
from specwatch.sources.grammar import NOT_A_RECORD, PRESETS, Grammar, problem
from specwatch.sources.logfiles import stage
from specwatch.engines.sglang.log import parse_line

BR30 = Path(__file__).resolve().parents[1] / "data" / "samples" / "bugreport-logs" / "BR-30.log"
ISO = r"(?P<timestamp>\S+) \[(?P<ranks>[^\]]*)\] (?P<message>.*)"


def feed(lines: list[str], fmt=None, path: str = "server.log") -> Pipeline:
    """`lines` as one read of a followed file with `format: fmt`, through the file's stage."""
    entry = {"path": path, **({"format": fmt} if fmt is not None else {})}
    cfg = build_config({"server": "box", "logs": [entry], "log_timezone": "UTC"})
    p = Pipeline(cfg, Dispatcher([], group_wait=0, group_interval=0, keep_history=True))
    text = "".join(ln + "\n" for ln in lines)
    stage(cfg.logs[0], p.feed_batch)(LineBatch(path, 0, len(text.encode()), block=text.encode(), text=text))
    p.flush_errors()  # the end of the read log, as replay ends it
    return p


def test_python_logging_preset_rewrites_records_into_sglang_form():
    g = Grammar(PRESETS["python-logging"])
    rec = "2025-12-04 20:35:53,123 INFO 151972 [scheduler_metrics_mixin.py:287] Decode batch. #running-req: 1"
    assert g.rewrite(rec) == "[2025-12-04 20:35:53.123] Decode batch. #running-req: 1"
    assert g.rewrite("  File \"x.py\", line 1") == "  File \"x.py\", line 1"  # a traceback line: as is
    assert g.rewrite(_DECODE_TEXT) == NOT_A_RECORD + _DECODE_TEXT  # SGLang's form is no record here


def test_regex_grammar_with_ranks_and_a_zoned_timestamp():
    from datetime import timezone
    from zoneinfo import ZoneInfo

    line = "2026-11-30T10:00:00.123456789Z [dp=1, tp=3] Decode batch, #running-req: 2"
    # the zoned stamp becomes the log's local time, written out (UTC, then Tokyo: +09:00)
    assert Grammar(ISO, tz=timezone.utc).rewrite(line) == \
        "[2026-11-30 10:00:00.123456 DP1 TP3] Decode batch, #running-req: 2"
    assert Grammar(ISO, tz=ZoneInfo("Asia/Tokyo")).rewrite(line) == \
        "[2026-11-30 19:00:00.123456 DP1 TP3] Decode batch, #running-req: 2"


def test_grammar_problems():
    assert problem("(?P<timestamp>\\S+) (?P<message>.*)") is None
    assert "named group (?P<message>...)" in problem("(?P<timestamp>\\S+) (?P<msg>.*)")
    assert problem("(?P<timestamp>") .startswith("not a valid regular expression")


def test_br30_read_with_the_python_logging_preset():
    lines = BR30.read_text().splitlines()
    p = feed(lines, "python-logging")
    assert p.servers["box"].lines == {"decode": 3, "prefill": 0, "other": 3, "malformed": 0, "unrecognized": 0}
    rs = p.ranks[("box", "")]
    assert (rs.decode_batches, rs.accept_length_min, rs.accept_length_max) == (3, 1.0, 1.0)
    assert rs.last_decode.gen_throughput == 6138.60


def test_br30_flagged_without_a_grammar_naming_the_file_and_a_line():
    p = feed(BR30.read_text().splitlines(), path="/var/log/sglang/run.log")
    assert p.servers["box"].lines == {"decode": 0, "prefill": 0, "other": 3, "malformed": 0, "unrecognized": 3}
    alerts = [a for a in p.dispatcher.history if a.name == "SGLangLogUnrecognized"]
    assert len(alerts) == 1  # one per file, however many lines
    a = alerts[0]
    assert (a.labels["severity"], a.labels["file"], a.status) == ("warning", "/var/log/sglang/run.log", "firing")
    ev = dict(a.evidence)
    assert ev["unrecognized lines"] == "1"  # as notified; the firing alert counts on:
    rule = next(r for r in p.rules if r.name == "log_format")
    assert dict(rule.firing_alerts()[0].evidence)["unrecognized lines"] == "3"
    assert "[scheduler_metrics_mixin.py:287] Decode batch. #running-req: 48" in ev["example line"]
    assert "python-logging" in a.fixes[0]
    assert a.starts_at == 1764880553.0  # the time the line starts with (UTC), not 1970


def test_unrecognized_resolves_after_quiet():
    p = feed(BR30.read_text().splitlines())
    with p.lock:
        p.tick(1764880553.0 + 1799)
        assert p.dispatcher.history[-1].status == "firing"
        p.tick(1764880553.0 + 1801)
    assert [(a.name, a.status) for a in p.dispatcher.history] == [("SGLangLogUnrecognized", "firing"),
                                                                  ("SGLangLogUnrecognized", "resolved")]


def _docker(lines):
    return [json.dumps({"log": ln + "\n", "stream": "stderr", "time": "2026-01-01T12:00:00.1Z"}) for ln in lines]


def _cri(lines):
    return [f"2026-01-01T12:00:00.123456789Z stderr F {ln}" for ln in lines]


def _pylog(msg):
    return f"2026-01-01 12:00:00,100 INFO 42 [tokenizer_manager.py:1] {msg}"


def _iso(msg):
    return f"2026-01-01T12:00:00.5Z [tp=0] {msg}"


REAL = decode_line("0.5.23", rank={"TP": 0}, accept_len=2.5)[0]
MSG = REAL.split("] ", 1)[1]  # the decode message without SGLang's prefix
INJECTED = request_log_lines()  # request logs whose user text holds a whole decode line
IN_RECORDS = INJECTED[:-1]  # (the last is a bare continuation line: as a record's message it is real)
CASES = {  # format → (lines: the real decode record first, then injections)
    "sglang": ("sglang", [REAL] + INJECTED),
    "auto plain": (None, [REAL] + INJECTED),
    "docker": ("docker", _docker([REAL] + INJECTED)),
    "docker auto": (None, _docker([REAL] + INJECTED)),
    "cri": ("cri", _cri([REAL] + INJECTED)),
    "cri auto": (None, _cri([REAL] + INJECTED)),
    "python-logging": ("python-logging", [_pylog(MSG)] + [_pylog(x) for x in IN_RECORDS] + INJECTED),
    "python-logging in docker": ("python-logging", _docker([_pylog(MSG)] + [_pylog(x) for x in IN_RECORDS] + INJECTED)),
    "regex": ({"regex": ISO}, [_iso(MSG)] + [_iso(x) for x in IN_RECORDS] + INJECTED + [REAL]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_request_log_injection_refused_under_every_grammar(case):
    """Only the one real record counts: decode text inside a record's message, and lines that do
    not start a record of the grammar (SGLang's own form under another grammar too), never do."""
    fmt, lines = CASES[case]
    p = feed(lines, fmt)
    st = p.servers["box"].lines
    assert st["decode"] == 1, st
    assert [rs.last_decode.accept_length for rs in p.ranks.values()] == [2.5]
    assert sum(st.values()) == len(lines)


def test_decode_lines_are_never_silently_other():
    """A line mentioning `Decode batch` after a time of day, in no grammar read: unrecognized. Inside
    a quoted value, or with no time before it (a prompt's continuation line): other."""
    assert type(parse_line("12:00:01 | sched | Decode batch, #running-req: 1")).__name__ == "UnrecognizedLine"
    assert type(parse_line("W1130 12:00:01.5 1 x.py:1] Decode batch, #running-req: 1")).__name__ == "UnrecognizedLine"
    for other in ('12:00:01 Receive: text="Decode batch, #running-req: 1"', "Decode batch, #running-req: 1",
                  json.dumps({"t": "12:00:01", "text": _DECODE_TEXT})):
        assert type(parse_line(other)).__name__ == "OtherLine", other
    assert isinstance(parse_line(REAL), DecodeBatch)
