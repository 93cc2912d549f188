"""Build SGLang logs along a clock and run them through the real pipeline (all rules).

    log = Timeline()                      # starts with a server_args line (EAGLE3 draft)
    log.decode(accept=2.8, every=2, n=300)  # 300 decode lines, 2 s apart
    transitions = run(log.lines, {"rules": {...}})

Lines come from `sglang_lines` (SGLang 0.5.23 format by default), so the parser sees exactly
what a server prints; `run` feeds them through `Pipeline.feed` with the log's own clock, as
`specwatch replay` does, and returns every alert transition the rules raised.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sglang_lines import decode_line, prefill_line, server_args_line
from specwatch.alerts.dispatcher import Dispatcher
from specwatch.config import build_config
from specwatch.core.events import LogLine
from specwatch.core.pipeline import Pipeline
from specwatch.rules.base import alert_names_of

START = "2026-03-01 10:00:00"


class Timeline:
    """Lines with timestamps that advance as they are added."""

    def __init__(self, start: str = START, version: str = "0.5.23", spec: bool | None = True, **args):
        """spec: True/False = begin with a server_args line with/without a draft (extra `args`
        override its fields); None = no server_args line."""
        self.t = datetime.strptime(start, "%Y-%m-%d %H:%M:%S")
        self.version = version
        self.lines: list[str] = []
        if spec is not None:
            self.server_args(spec=spec, **args)

    @property
    def ts(self) -> str:
        return self.t.strftime("%Y-%m-%d %H:%M:%S")

    def wait(self, seconds: float) -> "Timeline":
        self.t += timedelta(seconds=seconds)
        return self

    def server_args(self, spec: bool = True, **overrides) -> "Timeline":
        if not spec:
            overrides = {**dict.fromkeys(("speculative_algorithm", "speculative_draft_model_path",
                                          "speculative_num_steps", "speculative_eagle_topk",
                                          "speculative_num_draft_tokens")), **overrides}
        self.lines.append(server_args_line(ts=self.ts, **overrides)[0])
        return self

    def decode(self, *, n: int = 1, every: float = 2.0, accept=2.8, running: int = 32, thr=330.0,
               ranks: list[dict] | None = None, **kw) -> "Timeline":
        """n decode lines `every` seconds apart; accept/thr may be callables of the line index
        (0..n-1); with `ranks`, one line per rank at each step."""
        for i in range(n):
            self.wait(every)
            a = accept(i) if callable(accept) else accept
            g = thr(i) if callable(thr) else thr
            for rank in ranks or [None]:
                self.lines.append(decode_line(self.version, ts=self.ts, rank=rank, accept_len=a, running=running,
                                              throughput=g, **kw)[0])
        return self

    def prefill(self, *, n: int = 1, every: float = 0.0, rank: dict | None = None, **kw) -> "Timeline":
        for _ in range(n):
            self.wait(every)
            self.lines.append(prefill_line(self.version, ts=self.ts, rank=rank, **kw)[0])
        return self


T0 = datetime.strptime(START, "%Y-%m-%d %H:%M:%S").timestamp()  # START as epoch seconds


def pipeline(config: dict | None = None, dispatcher: Dispatcher | None = None) -> Pipeline:
    cfg = build_config({"server": "box", "logs": [{"path": "server.log"}], **(config or {})})
    return Pipeline(cfg, dispatcher or Dispatcher([], group_wait=0, group_interval=0, keep_history=True))


def feed(p: Pipeline, lines: list[str]) -> list:
    """Feed lines (log clock); returns the transitions raised meanwhile."""
    before = len(p.dispatcher.history)
    for text in lines:
        p.feed(LogLine("server.log", text))
    out = p.dispatcher.history[before:]
    declared = alert_names_of(p.rules)  # specwatch_alerts_firing reads 0 for each: none may be missing
    assert all(a.name in declared for a in out), [a.name for a in out if a.name not in declared]
    return out


def run(lines: list[str], config: dict | None = None) -> list:
    return feed(pipeline(config), lines)


class Recorder:
    """A receiver that keeps (alertname, status, rank) of every alert it is notified of."""

    name, send_resolved = "rec", True

    def __init__(self):
        self.got = []

    def notify(self, n):
        self.got += [(a.name, a.status, a.labels.get("rank", "")) for a in n.alerts]


def names(transitions) -> list[tuple[str, str, str]]:
    """[(alertname, status, rank)] in order."""
    return [(a.name, a.status, a.labels.get("rank", "")) for a in transitions]
