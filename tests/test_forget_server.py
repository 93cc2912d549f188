"""Pipeline.forget_server: a server nothing reports on any more (a deleted pod) leaves no state
behind: a rollout names every pod anew, so state kept per server would grow with each."""

from __future__ import annotations

import json

from procs import decode_line
from sglang_lines import prefill_line, server_args_line
from specwatch.alerts.dispatcher import Dispatcher
from specwatch.config import build_config
from specwatch.core.events import LogLine
from specwatch.core.pipeline import Pipeline


def test_a_forgotten_server_leaves_no_state_and_its_alerts_resolve():
    cfg = build_config({"logs": [{"path": "a.log", "server": "pod-a"}, {"path": "b.log", "server": "pod-b"}],
                        "diagnosis": {"enabled": False}})
    p = Pipeline(cfg, Dispatcher([], group_wait=0, group_interval=0, keep_history=True))
    for path in ("a.log", "b.log"):
        p.feed(LogLine(path, server_args_line(ts="2026-03-01 09:59:00", speculative_algorithm="EAGLE3",
                                              speculative_draft_model_path="/m/d")[0]))
        p.feed(LogLine(path, prefill_line("0.5.23", ts="2026-03-01 10:00:00", rank={"DP": 0, "TP": 0})[0]))
    for i in range(40):  # pod-a collapses, pod-b is healthy
        p.feed(LogLine("a.log", decode_line(1.01, f"10:00:{i + 1:02d}", running=50)))
        p.feed(LogLine("b.log", decode_line(2.6, f"10:00:{i + 1:02d}", running=50)))
    state = json.dumps(p.to_state(), default=str)
    assert "pod-a" in state and "pod-b" in state
    assert [(a.name, a.status) for a in p.dispatcher.history] == [("AcceptanceCollapse", "firing")]

    p.forget_server("pod-a", 2e9, "its log is gone")
    assert [(a.name, a.status) for a in p.dispatcher.history][-1] == ("AcceptanceCollapse", "resolved")
    assert dict(p.dispatcher.history[-1].evidence)["resolved because"] == "its log is gone"
    state = json.dumps({k: v for k, v in p.to_state().items() if k != "dispatcher"}, default=str)  # rules, ranks
    assert "pod-b" in state
    leftover = [m.start() for m in __import__("re").finditer("pod-a", state)]
    assert leftover == [], state[max(0, leftover[0] - 200):leftover[0] + 200] if leftover else ""
    assert all(k[0] != "pod-a" for k in p.ranks) and "pod-a" not in p.servers


def test_a_vllm_log_resumed_past_its_config_line_keeps_k_and_the_dp_ranks():
    """After a restart that resumes mid-log, vLLM's settings come from the saved state: a 0.8.4
    line (accept length needs k) still has one, and engine 1 is still `DP1` (a reviewer found
    no accept length and a renamed rank)."""
    from vllm_lines import config_line, spec_line, stats_line

    v = "0.8.4"
    cfg = build_config({"logs": [{"path": "v.log", "server": "vllm-0"}], "diagnosis": {"enabled": False}})

    def pipeline() -> Pipeline:
        return Pipeline(cfg, Dispatcher([], group_wait=0, group_interval=0, keep_history=True))

    def interval(p: Pipeline, ts: str) -> None:
        p.feed(LogLine("v.log", stats_line(v, running=8, waiting=0, gen=500.0, kv=10.0, engine=1, ts=ts)))
        p.feed(LogLine("v.log", spec_line(v, accepted=60, drafted=90, positions=[0.9, 0.6, 0.5], ts=ts)))

    first = pipeline()
    first.feed(LogLine("v.log", config_line(v, k=3, dp=2)))
    interval(first, "03-01 10:00:10")
    state = json.loads(json.dumps(first.to_state()))
    second = pipeline()  # specwatch restarted: the log resumes after the config line
    second.load_state(state)
    interval(second, "03-01 10:00:20")
    for p in (first, second):
        [(key, rs)] = [(k, r) for k, r in p.ranks.items() if r.last_decode is not None]
        assert key == ("vllm-0", "DP1") and rs.last_decode.accept_length == 3.0  # 1 + 3 * 60 / 90
