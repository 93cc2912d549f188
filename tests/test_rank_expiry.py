"""Ranks follow the server: a restart resets the rank set, a rank seen once and never again
expires (`limits.rank_expiry`), and a gone rank leaves the alerts, /metrics and the rules' evidence."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "rules"))
from pipelines import read_log  # noqa: E402
from sglang_lines import decode_line, server_args_line  # noqa: E402
from test_decode_stalled import T0, Box, stamp  # noqa: E402

from specwatch.core.metrics import PipelineCollector  # noqa: E402

V = "0.5.9"
START = datetime(2026, 1, 1, 12, 0, 0)


def at(s: int) -> str:
    return (START + timedelta(seconds=s)).strftime("%Y-%m-%d %H:%M:%S")


def two_then_one(tmp_path, dp1_low_from: int | None, garbage_at: int | None = None) -> Path:
    """10 min of a dp 2 server (DP1 at accept len 1.0 from `dp1_low_from` s), a restart with
    dp 1 at 600 s, then 20 min of DP0 alone (healthy); one line of a `DP9 TP9` rank at `garbage_at`."""
    lines = [server_args_line(ts=at(0), dp_size=2, enable_dp_attention=True, speculative_algorithm="EAGLE3")[0]]
    for s in range(1, 600):
        for dp in (0, 1):
            low = dp == 1 and dp1_low_from is not None and s >= dp1_low_from
            lines.append(decode_line(V, ts=at(s), rank={"DP": dp, "TP": dp}, accept_len=1.0 if low else 3.0)[0])
        if s == garbage_at:
            lines.append(decode_line(V, ts=at(s), rank={"DP": 9, "TP": 9}, accept_len=3.0)[0])
    lines.append(server_args_line(ts=at(600), dp_size=1, speculative_algorithm="EAGLE3")[0])
    for s in range(601, 1800):
        lines.append(decode_line(V, ts=at(s), rank={"DP": 0, "TP": 0}, accept_len=3.0)[0])
        if s == garbage_at:
            lines.append(decode_line(V, ts=at(s), rank={"DP": 9, "TP": 9}, accept_len=3.0)[0])
    path = tmp_path / "server.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_restart_that_drops_a_rank_resolves_its_disagreement_and_forgets_it(tmp_path):
    """DP1 collapsed alone before a restart to dp 1: its RankDisagreement resolves at the
    restart (it stayed firing for the DP1 that no longer exists), and DP1 leaves the ranks."""
    p = read_log(two_then_one(tmp_path, dp1_low_from=300), {"server": "box"})
    restart = (START + timedelta(seconds=600)).timestamp()
    got = {(a.name, a.labels["rank"]): (a.status, a.ends_at) for a in p.dispatcher.history}  # the last of each
    assert got[("RankDisagreement", "DP1 TP1")] == ("resolved", restart)
    assert got[("AcceptanceCollapse", "DP1 TP1")] == ("resolved", restart)
    assert sorted(r for _, r in p.ranks) == ["DP0 TP0"]


def test_a_rank_seen_once_expires_and_leaves_metrics(tmp_path):
    """One garbage line named `DP9 TP9`: once the server printed `limits.rank_expiry` without
    it, the rank is gone from the pipeline's ranks and from /metrics."""
    p = read_log(two_then_one(tmp_path, dp1_low_from=None, garbage_at=100), {"server": "box"})
    assert sorted(r for _, r in p.ranks) == ["DP0 TP0"]
    fams = {f.name: f for f in PipelineCollector(p).collect()}
    assert {s.labels["dp_rank"] for s in fams["specwatch_decode_batches"].samples} == {"0"}
    assert {s.labels["dp_rank"] for s in fams["specwatch_acceptance_collapsed"].samples} == {"0"}


def test_the_expiry_is_configurable(tmp_path):
    """A DP9 line after the restart, 15 min before the log ends: gone by default (10 min), a
    rank still with `limits.rank_expiry: 1h` (DP1 is gone either way: the restart dropped it)."""
    log = two_then_one(tmp_path, dp1_low_from=None, garbage_at=900)
    assert sorted(r for _, r in read_log(log, {"server": "box"}).ranks) == ["DP0 TP0"]
    p = read_log(log, {"server": "box", "limits": {"rank_expiry": "1h"}})
    assert sorted(r for _, r in p.ranks) == ["DP0 TP0", "DP9 TP9"]


def test_a_gone_rank_no_longer_counts_in_a_stall(tmp_path):
    """A stall's evidence sums the running requests of the server's ranks at their last decode
    line: a rank gone 10 minutes (a garbage line's) no longer adds its 32."""
    box = Box(tmp_path, None)
    t = T0
    box.step(t, decode_line(V, ts=stamp(t), rank={"DP": 9, "TP": 9}, accept_len=3.0, running=32)[0])
    while t < T0 + 700:
        t += 5
        box.step(t, decode_line(V, ts=stamp(t), rank={"DP": 0, "TP": 0}, accept_len=3.0, running=32)[0])
    last = t
    while t < last + 150:  # silent: the scheduler hangs
        t += 10
        box.step(t)
    [alert] = [a for a in box.p.dispatcher.history if a.name == "DecodeStalled"]
    assert dict(alert.evidence)["running requests at the last decode line"] == "32"
    assert sorted(r for _, r in box.p.ranks) == ["DP0 TP0"]
