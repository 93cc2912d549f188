"""The engine of each log (specwatch/engines/__init__.py): both grammars until a line of one is
read, then that engine's alone, through the real pipeline and Follower (`replay_files`)."""

from __future__ import annotations

from pathlib import Path

import pytest

import sglang_lines
import vllm_lines
from specwatch import engines
from specwatch.alerts.dispatcher import Dispatcher
from specwatch.config import build_config
from specwatch.engines.sglang import log as sglang_log
from specwatch.engines.vllm import log as vllm_log
from specwatch.core.events import DecodeBatch, OtherLine
from specwatch.core.pipeline import Pipeline
from specwatch.replay import replay_files

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


# --- low_accept_in: the followers' peek between rounds (sources/follow.py) -----------------------

def _sample_lines() -> list[str]:
    from procs import SAMPLES
    files = [SAMPLES / "sglang-public-lines.txt", SAMPLES / "kimi-k25-eagle3-collapse.log",
             *sorted((SAMPLES / "bugreport-logs").glob("*.log"))]
    return [line for f in files for line in f.read_text(errors="replace").splitlines()]


def test_low_accept_in_flags_every_real_decode_line_at_or_below_the_threshold():
    """A peek that missed a collapse line would hold it back a poll interval: every sample line
    the grammar reads as a decode batch with accept len <= t says True, each alone and among others."""
    lines = _sample_lines()
    decodes = [(line, e.accept_length) for line in lines
               if type(e := sglang_log.parse_line(line)) is DecodeBatch and e.accept_length is not None]
    assert len(decodes) > 50 and min(a for _, a in decodes) <= 1.05 and max(a for _, a in decodes) >= 2.5
    for t in (1.0, 1.1, 1.5, 2.0):
        low = [(line, a) for line, a in decodes if a <= t]
        assert low, t
        for line, a in decodes:
            assert engines.low_accept_in((line + "\n").encode(), t) == (a <= t), (t, line)
        healthy = "\n".join(line for line, a in decodes if a > t).encode()
        assert not engines.low_accept_in(healthy, t)
        assert engines.low_accept_in(healthy + b"\n" + low[0][0].encode() + b"\n", t)


def test_low_accept_in_other_lines_envelopes_and_vllm():
    low = sglang_lines.decode_line("0.5.23", ts="2026-03-01 10:00:00", accept_len=1.04, running=4)[0]
    assert not engines.low_accept_in(f"{ACCESS}\n{SG_DECODE}\n".encode(), 1.1)
    assert not engines.low_accept_in(b"", 1.1)
    assert engines.low_accept_in(low.encode(), 1.1) and not engines.low_accept_in(low.encode(), 1.0)
    # Docker's JSON envelope and CRI's prefix leave `accept len: X` as it is
    docker = '{"log":"%s\\n","stream":"stderr","time":"2026-03-01T10:00:00.1Z"}\n' % low.replace('"', '\\"')
    assert engines.low_accept_in(docker.encode(), 1.1)
    assert engines.low_accept_in(f"2026-03-01T10:00:00.1Z stderr F {low}\n".encode(), 1.1)
    # 0.5.18+ DSpark lines: `block accept len` too
    assert engines.low_accept_in(SG_DECODE.replace("#queue-req", "block accept len: 1.00, #queue-req").encode(), 1.1)
    # a vLLM spec line is never held back, whatever it says (its 0.8.5 form prints length - 1)
    assert engines.low_accept_in((VLLM_LINES[1] + "\n").encode(), 1.1)
    assert not engines.low_accept_in((VLLM_LINES[0] + "\n").encode(), 1.1)


def test_low_accept_in_flags_every_vllm_spec_line_form():
    """Review: every vLLM spec-decoding form the grammar reads (vllm_lines.VERSIONS) is urgent,
    as the docstring says ("any vLLM spec line"): V0 `Speculative metrics:` and V1 0.8.3-0.8.4
    print no `Mean acceptance length`."""
    missed = []
    for v in vllm_lines.VERSIONS:
        if vllm_lines.is_v0(v):
            line = vllm_lines.v0_spec_line(v, k=5, accepted=1, draft=50, emitted=11)
        else:
            line = vllm_lines.spec_line(v, accepted=1, drafted=90, positions=[0.01, 0.0, 0.0])
        assert isinstance(vllm_log.parse_line(line), (vllm_log.VllmSpecDecoding, vllm_log.VllmV0Spec)), line
        if not engines.low_accept_in((line + "\n").encode(), 1.1):
            missed.append(v)
    assert missed == [], missed


def test_the_registry_names_each_engine_once_with_its_grammar():
    assert engines.NAMES == (engines.SGLANG, engines.VLLM)
    for name in engines.NAMES:
        log = engines.LogEngine(name)
        assert log.name == name
        assert (log.maybe_event, log.parse_line) == tuple(engines.GRAMMARS[name])
    with pytest.raises(ValueError):
        engines.LogEngine("tgi")
