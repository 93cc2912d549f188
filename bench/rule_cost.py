"""CPU cost of each rule's batch-line hook: µs of CPU per decode line over a replayed log.

The log is replayed once as `specwatch replay` reads it (`replay.replay_files`, the defaults of
config.example.yaml or `--config`), with one extra rule that records what every evaluation hands
to `Rule.on_lines` (each rank's pending entries). Then each rule is built fresh and fed that
recording alone (its `on_lines`), `--runs` times. Printed: the least process CPU time of the runs, per decode line. Other events
(`server_args`, GPU samples, /metrics scrapes) are not replayed into the timed rules: a rule
that waits for one (gpu_throttle) shows the cost of waiting.

Usage: python bench/rule_cost.py LOG [--rules throughput_drop,degradation] [--runs 3] [--config CFG]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specwatch.alerting import build_alerting  # noqa: E402
from specwatch.config import LogSource, load_config  # noqa: E402
from specwatch.core.pipeline import Pipeline  # noqa: E402
from specwatch.replay import replay_files  # noqa: E402
from specwatch.rules.base import Rule, RuleContext, all_rules, log_paths_of, overrides  # noqa: E402


class Recorder(Rule):
    """Keeps (server, [(rank summary, its pending entries)]) of every evaluation."""

    name = "rule_cost_recorder"

    def __init__(self) -> None:
        self.calls: list[tuple[str, list]] = []

    def on_lines(self, server, ranks, emit):
        self.calls.append((server, [(rs, list(rs.pending)) for rs in ranks]))
        return []


def record(log: str, config: str | None):
    cfg = load_config(config or str(Path(__file__).resolve().parent.parent / "config.example.yaml"), for_run=False)
    cfg.logs = [LogSource(path=log, server=cfg.server)]
    dispatcher, _ = build_alerting(cfg, state_dir=None, replay=True, notify=False, slack_dry_run=None)
    rec = Recorder()
    p = Pipeline(cfg, dispatcher, diagnosis_background=False, extra_rules=(rec,))
    replay_files(p, [log], 1 << 20)
    return cfg, rec.calls


def cost(cls, cfg, calls: list, runs: int) -> float:
    """Least CPU seconds of `runs` passes of a fresh rule's `on_lines` over the recording."""
    ctx = RuleContext(log_paths_of(cfg))
    best = float("inf")
    for _ in range(runs):
        rule = cls.build(cfg, ctx)
        t0 = time.process_time()
        for server, ranks in calls:
            for rs, pending in ranks:
                rs.pending = pending
            rule.on_lines(server, [rs for rs, _ in ranks], lambda alerts, entry: None)
        best = min(best, time.process_time() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log")
    ap.add_argument("--rules", help="comma-separated rule names (default: every rule that reads batch lines)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--config")
    a = ap.parse_args()
    cfg, calls = record(a.log, a.config)
    n = sum(len(pending) for _, ranks in calls for _, pending in ranks)
    wanted = set(a.rules.split(",")) if a.rules else None
    print(f"{a.log}: {n} decode lines, {len(calls)} evaluations")
    for cls in all_rules():
        rule = cls.build(cfg, RuleContext(log_paths_of(cfg)))
        if wanted is not None and cls.name not in wanted:
            continue
        if not overrides(rule, "on_lines"):
            continue
        seconds = cost(cls, cfg, calls, a.runs)
        print(f"  {cls.name:24s} {seconds:7.3f} CPU-s  {seconds / max(n, 1) * 1e6:6.2f} µs/line")


if __name__ == "__main__":
    main()
