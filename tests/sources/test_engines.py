"""The engine of each log (specwatch/sources/engines.py): both grammars until a line of one is
read, then that engine's alone, through the real pipeline and Follower (`replay_files`)."""

from __future__ import annotations

from pathlib import Path

import sglang_lines
import vllm_lines
from specwatch.alerts.dispatcher import Dispatcher
from specwatch.config import build_config
from specwatch.events import DecodeBatch, OtherLine
from specwatch.pipeline import Pipeline
from specwatch.replay import replay_files
from specwatch.sources import engines, sglang_log, vllm_log

V = "0.33.0"
SG_DECODE = sglang_lines.decode_line("0.5.23", ts="2026-03-01 10:00:00", accept_len=2.8, running=4)[0]
VLLM_LINES = [vllm_lines.stats_line(V, running=4, waiting=0, gen=300.0, kv=5.0, ts="03-01 10:00:10"),
              vllm_lines.spec_line(V, accepted=60, drafted=90, positions=[0.8, 0.7, 0.5], ts="03-01 10:00:10")]
ACCESS = '[2026-03-01 10:00:01] INFO:     127.0.0.1:40052 - "POST /generate HTTP/1.1" 200 OK'


def replay(tmp_path: Path, lines: list[str], **log) -> tuple[Pipeline, str]:
    path = tmp_path / "server.log"
    path.write_text("\n".join(lines) + "\n")
    cfg = build_config({"server": "box", "logs": [{"path": str(path), **log}]})
    p = Pipeline(cfg, Dispatcher([], group_wait=0, group_interval=0))
    replay_files(p, [str(path)], 1 << 20)
    return p, str(path)


def test_an_sglang_log_runs_sglangs_checks_alone_once_a_line_is_read():
    e = engines.LogEngine()
    assert e.name is None and e.maybe_event is engines.maybe_event  # not known: both engines' checks
    assert type(e.parse_line(ACCESS)) is OtherLine and e.name is None  # an access line proves nothing
    assert type(e.parse_line(SG_DECODE)) is DecodeBatch
    assert e.name == "sglang" and e.maybe_event is sglang_log.maybe_event and e.parse_line is sglang_log.parse_line
    assert not e.maybe_event(VLLM_LINES[1])  # vLLM's checks no longer run on this log
    v = engines.LogEngine()
    assert isinstance(v.parse_line(VLLM_LINES[0]), vllm_log.VllmStats)
    assert v.name == "vllm" and v.maybe_event is vllm_log.maybe_event and not v.maybe_event(SG_DECODE)
    assert engines.LogEngine("sglang").maybe_event is sglang_log.maybe_event


def test_each_log_keeps_the_engine_its_first_line_showed(tmp_path):
    """A vLLM line in an SGLang log, and an SGLang line in a vLLM log, are other lines: the pipeline
    does not run the other engine's checks once the log's engine is known."""
    p, path = replay(tmp_path, [ACCESS, SG_DECODE] + VLLM_LINES)
    assert p.servers["box"].lines["decode"] == 1 and p.servers["box"].lines["other"] == 3
    assert p._engines[path].name == "sglang"
    p, path = replay(tmp_path, [ACCESS] + VLLM_LINES + [SG_DECODE])
    assert p.servers["box"].lines["decode"] == 1 and p.ranks[("box", "")].last_decode.engine == "vllm"
    assert p._engines[path].name == "vllm"


def test_a_log_whose_engine_is_not_known_yet_reads_either(tmp_path):
    """BR-04's tracebacks prove no engine (a vLLM log without stats lines yet): its first stats
    line is still read as vLLM's; a `format:` grammar makes the log SGLang's from the start."""
    br04 = (Path(__file__).resolve().parents[1] / "data" / "samples" / "bugreport-logs" / "BR-04.log")
    p, path = replay(tmp_path, br04.read_text().splitlines() + VLLM_LINES)
    assert p._engines[path].name == "vllm" and p.servers["box"].lines["decode"] == 1
    p, path = replay(tmp_path, [ACCESS], format="sglang")
    assert p._engines[path].name == "sglang"
