"""Pipeline.forget_server: a server nothing reports on any more (a deleted pod) leaves no state
behind: a rollout names every pod anew, so state kept per server would grow with each."""

from __future__ import annotations

import json

from procs import decode_line
from sglang_lines import prefill_line, server_args_line
from specwatch.alerts.dispatcher import Dispatcher
from specwatch.config import build_config
from specwatch.events import LogLine
from specwatch.pipeline import Pipeline


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
    assert all(k[0] != "pod-a" for k in p.windows._last)
