"""Lines stamped out of order, and a rule that raises: no input stops a read.

A single-rank log whose stamps step back two seconds after every third line (a bucket boundary of
the drift rule between them) once made the drift rule fit a line through buckets at one time and
raise, and the rest of each read was dropped: `replay` and `run` counted 24 of 41 lines and
missed the collapse among the dropped ones. Now every line counts, the collapse fires, and a rule
that raises loses only its own result for that line (`specwatch_rule_errors_total`, one log line).
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import yaml

from procs import rank_labels, wait_for
from sglang_lines import decode_line, server_args_line
from specwatch_daemon import SpecwatchDaemon

ROOT = Path(__file__).resolve().parents[1]
RANK = rank_labels(tp="")  # a single-GPU log: no rank tokens


def out_of_order_lines(at: datetime = datetime(2026, 1, 1, 10), repeats: int = 10,
                       collapse_from: int = 6) -> list[str]:
    """A server_args line, then `repeats` times: 3 decode lines stamped 1 s after `at` and one
    1 s before it (10:00:01 and 09:59:59 by default); accept len 1.00 (collapsed) from repeat
    `collapse_from` on, 2.80 before."""
    fmt = lambda t: t.strftime("%Y-%m-%d %H:%M:%S")  # noqa: E731
    args = server_args_line(ts=fmt(at - timedelta(seconds=60)))
    lines = [args if isinstance(args, str) else args[0]]
    after, before = fmt(at + timedelta(seconds=1)), fmt(at - timedelta(seconds=1))
    for i in range(repeats):
        acc = 1.0 if i >= collapse_from else 2.8
        for stamp in (after, after, after, before):
            lines.append(decode_line("0.5.23", ts=stamp, accept_len=acc, running=8)[0])
    return lines


def test_replay_counts_every_line_and_finds_the_collapse_among_them(tmp_path):
    log = tmp_path / "sglang.log"
    lines = out_of_order_lines()
    log.write_text("".join(ln + "\n" for ln in lines))
    assert len(lines) == 41
    cfg = tmp_path / "specwatch.yaml"
    cfg.write_text(yaml.safe_dump({"server": "box", "log_timezone": "UTC", "logs": [{"path": str(log)}],
                                   "diagnosis": {"enabled": False}}))
    r = subprocess.run([sys.executable, "-m", "specwatch", "replay", str(log), "--config", str(cfg), "--json"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["lines"]["total"] == 41 and doc["lines"]["decode"] == 40, doc["lines"]
    assert [(a["name"], a["status"]) for a in doc["episodes"]] == [("AcceptanceCollapse", "firing")]
    assert "Traceback" not in r.stderr and "failed" not in r.stderr, r.stderr


def test_run_counts_every_line_and_finds_the_collapse_among_them(tmp_path):
    """The daemon reads the first half as its start-up backlog and the rest as live reads."""
    log = tmp_path / "sglang.log"
    # the last 10-minute boundary (the drift rule's bucket) before now: the stamps step back across it
    at = datetime.fromtimestamp(math.floor(time.time() / 600) * 600, timezone.utc).replace(tzinfo=None)
    lines = out_of_order_lines(at)
    log.write_text("".join(ln + "\n" for ln in lines[:21]))
    d = SpecwatchDaemon(tmp_path, log, env={"TZ": "UTC"}, extra={"diagnosis": {"enabled": False}})
    try:
        d.start()
        lines_total = lambda: sum(v for (name, labels), v in d.scrape().items()  # noqa: E731
                                  if name == "specwatch_log_lines_total")
        wait_for(lambda: lines_total() == 21, what="the backlog's 21 lines")
        with log.open("a") as f:
            for i in range(21, 41, 4):
                f.writelines(ln + "\n" for ln in lines[i:i + 4])
                f.flush()
                time.sleep(0.25)
        wait_for(lambda: lines_total() == 41, what="all 41 lines")
        m = d.scrape()
        assert m[("specwatch_decode_batches_total", RANK)] == 40
        wait_for(lambda: d.scrape().get(("specwatch_acceptance_collapsed", RANK)) == 1, what="the collapse")
        assert not [k for k in d.scrape() if k[0] == "specwatch_rule_errors_total"]
    finally:
        d.stop()
    assert "Traceback" not in d.output, d.output
    assert not [ln for ln in d.output.splitlines() if " WARNING " in ln and "clock" in ln], d.output


def test_drift_counts_a_line_stamped_before_its_open_bucket_in_that_bucket():
    """A read per line and one read of all lines: the same buckets, indexes only grow."""
    from specwatch.config import build_config
    from specwatch.alerts.dispatcher import Dispatcher
    from specwatch.core.pipeline import Pipeline
    from specwatch.sources.filestream import LineBatch

    lines = out_of_order_lines(repeats=80, collapse_from=10 ** 6)[1:]  # 320 healthy decode lines
    results = []
    for per_read in (1, len(lines)):
        cfg = build_config({"server": "box", "log_timezone": "UTC", "logs": [{"path": "s.log"}],
                            "diagnosis": {"enabled": False}})
        p = Pipeline(cfg, Dispatcher([], group_wait=0, group_interval=0, keep_history=True))
        for i in range(0, len(lines), per_read):
            text = "".join(ln + "\n" for ln in lines[i:i + per_read])
            p.feed_batch(LineBatch("s.log", 0, len(text.encode()), block=text.encode(), text=text))
        p.flush_errors()
        drift = next(r for r in p.rules if r.name == "drift")
        results.append((p.servers["box"].lines["decode"], drift._buckets[("box", "")], dict(p.rule_faults.counts)))
    per_line, columns = results
    assert per_line[0] == columns[0] == 320
    idx = math.floor(datetime(2026, 1, 1, 10, tzinfo=timezone.utc).timestamp() / 600)
    # one bucket, opened at 10:00:01: every 09:59:59 line (the bucket before) joins it
    [(index, total, count)] = per_line[1]
    assert (index, count) == (idx, 320) and abs(total - 2.8 * 320) < 1e-6
    assert columns[1] == per_line[1]
    assert per_line[2] == columns[2] == {}


class _Raising:
    """A rule with a bug: it raises on every decode line and every tick (registered like any rule
    through Pipeline's `extra_rules`)."""

    name = "raising"
    alert_names = ()

    def on_lines(self, server, ranks, emit):
        raise ZeroDivisionError("a bug in a rule")

    def on_tick(self, now):
        raise KeyError("another bug")


def test_a_rule_that_raises_loses_its_own_result_only(caplog):
    from specwatch.rules.base import Rule

    from specwatch.config import build_config
    from specwatch.alerts.dispatcher import Dispatcher
    from specwatch.core.pipeline import Pipeline
    from specwatch.sources.filestream import LineBatch
    from specwatch.core.metrics import PipelineCollector

    rule = type("RaisingRule", (_Raising, Rule), {})()
    cfg = build_config({"server": "box", "log_timezone": "UTC", "logs": [{"path": "s.log"}],
                        "diagnosis": {"enabled": False}})
    p = Pipeline(cfg, Dispatcher([], group_wait=0, group_interval=0, keep_history=True), extra_rules=(rule,))
    lines = [decode_line("0.5.23", ts=f"2026-01-01 10:00:{s:02d}", accept_len=2.8 if s < 10 else 1.0,
                         running=8)[0] for s in range(20)]
    text = "".join(ln + "\n" for ln in lines)
    with caplog.at_level(logging.ERROR, logger="specwatch.core.pipeline"):
        p.feed_batch(LineBatch("s.log", 0, len(text.encode()), block=text.encode(), text=text))
    assert p.servers["box"].lines["decode"] == 20
    assert [(a.name, a.status) for a in p.dispatcher.history] == [("AcceptanceCollapse", "firing")]
    assert p.rule_faults.counts["raising"] >= 20  # every line, and the ticks
    logged = [r for r in caplog.records if "rule raising failed" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info[0] is ZeroDivisionError  # once a minute at most
    fams = {f.name: f for f in PipelineCollector(p).collect()}
    [sample] = fams["specwatch_rule_errors"].samples[:1]
    assert sample.labels == {"rule": "raising"} and sample.value == p.rule_faults.counts["raising"]


def test_rule_failures_are_logged_once_a_minute_with_the_count_between(caplog):
    from specwatch.core.rulefaults import LOG_EVERY, RuleFaults

    clock = [1000.0]
    faults = RuleFaults(clock=lambda: clock[0])
    rule = _Raising()
    with caplog.at_level(logging.ERROR, logger="specwatch.core.pipeline"):
        for i in range(50):  # 50 failures over 100 s
            faults.failed(rule, "on_lines", ValueError(f"bad {i}"))
            clock[0] += 2.0
    messages = [r.getMessage() for r in caplog.records]
    assert faults.counts == {"raising": 50}
    assert len(messages) == 2, messages
    assert messages[0].startswith("rule raising failed in on_lines") and caplog.records[0].exc_info
    # the second line: the failures since the first (30 of them, at 2 s apart), the last one named
    assert messages[1] == f"rule raising failed {int(LOG_EVERY / 2)} more times (last in on_lines: ValueError: bad 30)"
