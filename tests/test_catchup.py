"""The catch-up path (`specwatch.catchup`, large reads in columns) decides exactly as the per-line
path: the same alert transitions (every field), the same rule and window state, the same counters.

Logs with episodes of every decode rule (collapse of all ranks, one rank collapsed, degradation,
throughput drop, slow drift, idle ranks, prefill-dominated windows, gaps, a time step back) are
fed through `Pipeline.feed_batch` twice: once with the catch-up path off (every line through
`parse_line` and the rules' hooks) and once on, with reads of several sizes, in replay (the
lines' clock) and in `run` (the follower's clock).
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections import deque
from datetime import datetime, timedelta

import pytest

from specwatch import catchup
from specwatch.alerting import build_alerting
from specwatch.config import LogSource, build_config
from specwatch.pipeline import Pipeline
from specwatch.rules.stats import Recent
from specwatch.sources.filestream import Follower

RULES = {
    "collapse": {"min_batches": 3},
    "degradation": {"window": "60s", "for": "60s", "min_window_batches": 10, "baseline_window": "2h",
                    "min_baseline_batches": 50},
    "throughput_drop": {"window": "30s", "for": "30s", "baseline_window": "2h", "min_baseline_batches": 30},
    "drift": {"window": "1h", "bucket": "60s", "min_buckets": 6, "restart_gap": "5m",
              "min_decline_per_hour": 0.02, "min_total_decline": 0.03, "min_falling_fraction": 0.6},
    "windows": {"max_gap": "20s"},
    "spec_metrics_missing": {"window": "60s"},
}


ARGS = ("server_args=ServerArgs(model_path='/models/m', speculative_algorithm='EAGLE3', "
        "speculative_draft_model_path='/models/d', speculative_num_steps=3, tp_size=8, dp_size=8)")


def scenario(path, seed: int = 3, ms: bool = False, hostile: bool = False, silent: bool = False,
             start: datetime = datetime(2026, 3, 1, 10, 0, 0)) -> int:
    """A 40-minute log of 8 DP ranks with one episode of each kind; returns its line count.
    ms: milliseconds in the stamps and SGLang 0.5.11+'s prefill line (`#pending-token`).
    hostile: also lines the parser must read one by one: server_args (at the start, and a
    restart at 34 min), request text quoting a decode line, a traceback.
    silent: restart gaps (drift's restart_gap: 5 min): DP4 silent over 5-11 min, and 8 more
    minutes, every rank collapsed, with no line at all over 40-46.2; no decode line over 12-15
    min (prefill lines go on: SpecMetricsMissing) and a failed health check at 12.5 min
    (DecodeStalled)."""
    rnd = random.Random(seed)
    t = start
    lines = [f"[{t:%Y-%m-%d %H:%M:%S}] {ARGS}"] if hostile else []
    stepped = restarted = crashed = unhealthy = False
    while t - start < timedelta(minutes=48 if silent else 40):
        t += timedelta(milliseconds=rnd.randint(5, 60))
        m = (t - start).total_seconds() / 60
        if 27.0 < m < 27.5 or silent and 40 < m < 46.2:
            continue  # a gap: every rank's next window is after_gap
        if 33.0 < m and not stepped:
            t -= timedelta(seconds=2)  # the clock steps back once
            stepped = True
        stamp = t.strftime("%Y-%m-%d %H:%M:%S") + (f".{t.microsecond // 1000:03d}" if ms else "")
        dp = rnd.randint(0, 7)
        if silent and dp == 4 and 5 < m < 11:
            continue
        if silent and m > 12.5 and not unhealthy:
            lines.append(f"[{stamp}] Health check failed. Server couldn't get a response from detokenizer for "
                         f"last 20 seconds. tic start time: {t:%H:%M:%S}. last_heartbeat time: {t:%H:%M:%S}")
            unhealthy = True
        if hostile and rnd.random() < 0.0005:  # request text quoting a collapsed decode line
            lines.append(f"[{stamp}] Receive: obj=GenerateReqInput(text='see [{stamp} DP0 TP0] Decode batch, "
                         "#running-req: 9, #token: 1200, token usage: 0.01, accept len: 1.00, accept rate: 0.00, "
                         "cuda graph: True, gen throughput (token/s): 80.00, #queue-req: 0')")
        if hostile and m > 34 and not restarted:
            lines.append(f"[{stamp}] {ARGS}")
            restarted = True
        if hostile and m > 12 and not crashed:
            lines += [f"[{stamp} DP2 TP2] Scheduler hit an exception: Traceback (most recent call last):",
                      '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2790, in run_scheduler_process',
                      "    scheduler.event_loop_overlap()",
                      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."]
            crashed = True
        r = rnd.random()
        if r < 0.55 and not (silent and 12 < m < 15):
            al = 2.4 + rnd.random() * 0.8 - (m - 3) * 0.02 * (m > 3 and m < 14)  # drift over 3-14 min
            thr = 400 + rnd.random() * 800
            running = rnd.randint(1, 64)
            if 16 < m < 18.5 or silent and m > 39:
                al = 1.0 + rnd.random() * 0.06  # every rank collapsed
            elif 20 < m < 22 and dp == 3:
                al = 1.02  # one rank collapsed
            elif 23 < m < 26:
                al = 1.8 + rnd.random() * 0.2  # degraded
            if 29 < m < 31:
                thr *= 0.3  # throughput drop
            if 35 < m < 36 and dp == 5:
                running = 0  # an idle rank
            if hostile and 38 < m < 38.5 and dp == 6:
                al = 3.9 + rnd.random() * 0.1  # at the ceiling (steps 3 + 1) after a steady state
            line = (f"[{stamp} DP{dp} TP{dp}] Decode batch, #running-req: {running}, #token: {rnd.randint(100, 90000)}, "
                    f"token usage: {rnd.random():.2f}, accept len: {al:.2f}, accept rate: {(al - 1) / 3:.2f}, "
                    f"cuda graph: True, gen throughput (token/s): {thr:.2f}, #queue-req: {rnd.randint(0, 5)}")
        elif r < 0.75:
            line = f'[{stamp}] INFO:     127.0.0.1:{rnd.randint(30000, 60000)} - "POST /v1/chat/completions HTTP/1.1" 200 OK'
        else:
            n = 45 if 37 < m < 37.05 else 1  # a burst of prefill lines: prefill-dominated windows
            pending = f"#pending-token: {rnd.randint(0, 900)}, " if ms else ""  # SGLang 0.5.11+
            for _ in range(n):
                lines.append(f"[{stamp} DP{dp} TP{dp}] Prefill batch, #new-seq: 1, #new-token: {rnd.randint(10, 4000)}, "
                             f"#cached-token: {rnd.randint(0, 4000)}, token usage: {rnd.random():.2f}, "
                             f"#running-req: {rnd.randint(0, 64)}, #queue-req: 0, {pending}cuda graph: True, "
                             f"input throughput (token/s): {rnd.random() * 9000:.2f}")
            continue
        lines.append(line)
    path.write_text("\n".join(lines) + "\n")
    return len(lines)


SKIP = {"config", "last_lines", "log_paths", "path_exists", "diagnoser"}  # references to what the rule was given


def dump(x, seen=()):
    """Everything a rule holds, exactly: floats by repr, containers in order, objects by their
    attributes (a config or callable it was given aside); a numpy scalar shows as such."""
    if type(x) is float:
        return ["float", repr(x)]
    if x is None or type(x) in (str, int, bool):
        return x
    if id(x) in seen:
        return "<cycle>"
    seen = seen + (id(x),)
    if isinstance(x, dict):
        return ["dict", [[dump(k, seen), dump(v, seen)] for k, v in x.items()]]
    if isinstance(x, Recent):  # a window: its buckets, floats by repr
        return ["Recent", dump(x.span), dump(x.sum), [[repr(t), n, repr(v)] for t, n, v in x.buckets]]
    if isinstance(x, (list, tuple, deque)):
        return [type(x).__name__, [dump(v, seen) for v in x]]
    names = list(getattr(x, "__dict__", {})) or [n for c in type(x).__mro__ for n in getattr(c, "__slots__", ())]
    if names and not callable(x):
        return [type(x).__name__, {n: dump(getattr(x, n, None), seen) for n in names
                                   if n not in SKIP and not n.endswith("_for") and not callable(getattr(x, n, None))}]
    return [type(x).__module__ + "." + type(x).__name__, repr(x)]


def run(path, *, fast: bool, chunk: int, clock: bool, monkeypatch, then=None) -> dict:
    """`path` read through a pipeline (fast: the catch-up path on), then the log `then` of a
    second server ("b") if given; everything the pipeline and its rules hold at the end."""
    monkeypatch.setattr(catchup, "MIN_LINES", 256 if fast else 10 ** 12)
    columns = []  # rows taken in columns (catchup.feed)
    feed_rows = catchup.feed
    monkeypatch.setattr(catchup, "feed", lambda p_, s_, st, rows, *a: columns.append(len(rows.dec)) or feed_rows(p_, s_, st, rows, *a))
    cfg = build_config({"rules": RULES}, for_run=False)
    cfg.logs.append(LogSource(path=str(path), server=cfg.server))
    if then is not None:
        cfg.logs.append(LogSource(path=str(then), server="b"))
    dispatcher, _ = build_alerting(cfg, state_dir=None, replay=True, notify=False, slack_dry_run=None)
    p = Pipeline(cfg, dispatcher, diagnosis_background=False)
    next(r for r in p.rules if r.name == "metrics_crosscheck").watching = True  # as with /metrics configured: log lines kept
    now = [1.78e9]

    def feed(batch):
        if clock:
            now[0] += 0.7  # the follower's clock: one stamp per read
            p.feed_batch(batch, now=now[0])
        else:
            p.feed_batch(batch)

    for log in [path] + ([then] if then is not None else []):
        f = Follower(str(log), on_lines=feed, max_line_bytes=1 << 20, read_chunk_bytes=chunk)
        while f.poll():
            pass
        f.finish()
    p.flush_errors()
    return {
        "alerts": [a.to_dict() for a in dispatcher.history],
        "state": json.loads(json.dumps(p.to_state(), default=str)),
        "servers": {s: dataclasses.asdict(st) for s, st in p.servers.items()},
        "ranks": {f"{k}": {**dataclasses.asdict(rs), "history": dump(rs.history)} for k, rs in p.ranks.items()},
        "windows": [list(p.windows._last.items()), list(p.windows._prefills.items())],
        "rules": {r.name: dump(r) for r in p.rules},
        "errors": {s: dict(st.errors) for s, st in p.servers.items()},
    } | ({"columns": sum(columns)} if fast else {})


@pytest.mark.parametrize("chunk,clock,ms,hostile,silent", [
    (1 << 20, False, False, False, False), (1 << 16, False, True, False, False), (1 << 18, True, False, False, False),
    (1 << 20, False, False, True, False), (1 << 18, True, True, True, False), (1 << 20, False, False, False, True),
    (1 << 18, True, False, False, True)])
def test_catchup_decides_as_per_line(tmp_path, monkeypatch, chunk, clock, ms, hostile, silent):
    log = tmp_path / "server.log"
    n = scenario(log, ms=ms, hostile=hostile, silent=silent)
    slow = run(log, fast=False, chunk=chunk, clock=clock, monkeypatch=monkeypatch)
    fast = run(log, fast=True, chunk=chunk, clock=clock, monkeypatch=monkeypatch)
    names = sorted({(a["labels"]["alertname"], a["status"]) for a in slow["alerts"]})
    if not clock:  # the log's own clock: every episode is there
        for name in ("AcceptanceCollapse", "RankDisagreement", "AcceptanceDegradation", "ThroughputDrop",
                     "AcceptanceDrift"):
            assert (name, "firing") in names, names
            assert (name, "resolved") in names or name == "AcceptanceDrift", names
        assert (("AcceptanceNearCeiling", "firing") in names) == hostile, names
        for name in ("SpecMetricsMissing", "DecodeStalled"):
            assert {(name, "firing"), (name, "resolved")} <= set(names) or not silent, names
    assert sum(sum(st["lines"].values()) for st in slow["servers"].values()) == n
    assert fast["columns"] > n // 2, fast["columns"]
    for key in slow:
        assert fast[key] == slow[key], key


def test_catchup_ticks_another_servers_rules_as_per_line(tmp_path, monkeypatch):
    """Ticks of one server's read reach the rules' state of another: server A's log ends with
    12 prefill lines after its last decode line, 30 s before B's log starts; 30 s into B's
    first read its ticks prune A's pending prefill times (spec_metrics_missing's window: 60 s)
    to the newest."""
    first, then = tmp_path / "a.log", tmp_path / "b.log"
    scenario(first, start=datetime(2026, 3, 1, 9, 19, 30))
    last = first.read_text().splitlines()[-1][1:20]
    with first.open("a") as f:
        for i in range(12):
            f.write(f"[{last} DP{i % 8} TP{i % 8}] Prefill batch, #new-seq: 1, #new-token: 90, #cached-token: 0, "
                    "token usage: 0.10, #running-req: 3, #queue-req: 0, cuda graph: True, "
                    "input throughput (token/s): 900.00\n")
    scenario(then, seed=5)
    slow = run(first, fast=False, chunk=1 << 20, clock=False, monkeypatch=monkeypatch, then=then)
    fast = run(first, fast=True, chunk=1 << 20, clock=False, monkeypatch=monkeypatch, then=then)
    [a] = [s for s in slow["servers"] if s != "b"]
    pending = dict((k, v) for k, v in slow["rules"]["spec_metrics_missing"][1]["_prefills"][1])
    assert pending[a] == ["deque", [["float", repr(datetime.strptime(last, "%Y-%m-%d %H:%M:%S").timestamp())]]]
    for key in slow:
        assert fast[key] == slow[key], key


def test_numpy_only_for_a_large_read(tmp_path):
    """The daemon tailing a live log never loads numpy (its RSS budget); a large read does."""
    import subprocess
    import sys

    log = tmp_path / "server.log"
    scenario(log)
    code = f"""
import sys
from specwatch.alerting import build_alerting
from specwatch.config import LogSource, build_config
from specwatch.pipeline import Pipeline
from specwatch.sources.filestream import Follower
cfg = build_config({{}})
cfg.logs.append(LogSource(path={str(log)!r}, server=cfg.server))
p = Pipeline(cfg, build_alerting(cfg, state_dir=None, replay=True, notify=False, slack_dry_run=None)[0])
f = Follower({str(log)!r}, on_lines=p.feed_batch, max_line_bytes=1 << 20, read_chunk_bytes=int(sys.argv[1]))
f.poll()
print("numpy" in sys.modules, sum(p.servers[cfg.server].lines.values()))
"""
    small = subprocess.run([sys.executable, "-c", code, "8192"], capture_output=True, text=True, check=True)
    large = subprocess.run([sys.executable, "-c", code, str(1 << 20)], capture_output=True, text=True, check=True)
    assert small.stdout.split()[0] == "False" and int(small.stdout.split()[1]) > 0, small.stdout + small.stderr
    assert large.stdout.split()[0] == "True", large.stdout + large.stderr


def test_a_daemon_restarting_on_a_small_backlog_keeps_numpy_out(tmp_path):
    """`run` on a start-up backlog under daemon.COLUMNS_MIN_BYTES reads per line, so numpy (+14 MB
    RSS, never unloaded) stays out of a daemon that restarts after minutes down; `replay` of the
    same file reads in columns (test above)."""
    from procs import rank_labels, wait_for
    from specwatch.daemon import COLUMNS_MIN_BYTES
    from specwatch_daemon import SpecwatchDaemon

    log = tmp_path / "server.log"
    n = scenario(log)
    assert 1 << 20 < log.stat().st_size < COLUMNS_MIN_BYTES  # reads of >= 256 lines, a small backlog
    d = SpecwatchDaemon(tmp_path, log, server="box")
    d.start()
    try:
        wait_for(lambda: sum(v for (name, k), v in d.scrape().items() if name == "specwatch_log_lines_total") == n,
                 timeout=60, what="the backlog read")
        maps = open(f"/proc/{d.proc.pid}/maps").read()
        assert "numpy" not in maps and "_multiarray" not in maps
    finally:
        rc, out = d.stop()
    assert rc == 0, out


def vllm_log(path) -> int:
    """A vLLM 0.10.2 log of 700 ten-second intervals whose third draft position stops accepting
    after 300 (DraftTooLong), with access lines between; returns its line count."""
    from vllm_lines import config_line, spec_line, stats_line

    t0 = datetime(2026, 3, 1, 10, 0, 0)
    lines = [config_line("0.10.2", k=3)]
    for i in range(700):
        ts = f"{t0 + timedelta(seconds=10 * i):%m-%d %H:%M:%S}"
        third = 0.3 if i < 300 else 0.0
        lines.append(stats_line("0.10.2", running=8, waiting=0, gen=900.0 + i % 7, kv=12.0, ts=ts))
        lines.append(spec_line("0.10.2", accepted=400 + (i % 5), drafted=900, positions=[0.6, 0.4, third], ts=ts))
        lines.append(f'INFO:     127.0.0.1:{40000 + i} - "POST /v1/chat/completions HTTP/1.1" 200 OK')
    path.write_text("\n".join(lines) + "\n")
    return len(lines)


def unrecognized_log(path) -> int:
    """The scenario's log with a decode line in a format specwatch does not read every 400 lines
    (`kind="unrecognized"`); returns its line count."""
    n = scenario(path)
    lines = path.read_text().splitlines()
    for i in range(0, len(lines), 400):
        lines[i] = lines[i][1:20] + " INFO Decode batch, #running-req: 3, accept len: 2.10"
    path.write_text("\n".join(lines) + "\n")
    return n


@pytest.mark.parametrize("clock", [False, True])
@pytest.mark.parametrize("make,expect", [(vllm_log, "DraftTooLong"), (unrecognized_log, "SGLangLogUnrecognized")])
def test_catchup_reads_vllm_and_unrecognized_lines_as_per_line(tmp_path, monkeypatch, make, expect, clock):
    """A read with vLLM lines (paired in `VllmAssembler`) or decode lines of another format goes
    per line where it must: the same alerts, counters and rule state both ways."""
    log = tmp_path / "server.log"
    n = make(log)
    slow = run(log, fast=False, chunk=1 << 18, clock=clock, monkeypatch=monkeypatch)
    fast = run(log, fast=True, chunk=1 << 18, clock=clock, monkeypatch=monkeypatch)
    assert sum(sum(st["lines"].values()) for st in slow["servers"].values()) == n
    assert (expect, "firing") in {(a["labels"]["alertname"], a["status"]) for a in slow["alerts"]}
    assert (fast["columns"] > n // 2) == (make is unrecognized_log), fast["columns"]  # vLLM: none in columns
    for key in slow:
        assert fast[key] == slow[key], key


def test_heap_release_returns_freed_memory_to_the_os():
    """`heap.release` (run after a start-up backlog read in columns) gives back the heap a
    catch-up freed: 150 MB of 1 KiB objects freed around small live ones stays in RSS until then,
    and while `heap.hold()` holds, 4 MiB blocks freed stay too."""
    import subprocess
    import sys

    code = """
import psutil
from specwatch import heap
p = psutil.Process()
big = [bytes(1000) + bytes([i % 256]) for i in range(150_000)]
keep = big[::500]  # live objects all over the heap: nothing is freed at its top
del big
before = p.memory_info().rss
rc = heap.release()
print(rc, (before - p.memory_info().rss) >> 20)
held = heap.hold()
start = p.memory_info().rss
blocks = [b"x" * (4 << 20) for _ in range(20)]
del blocks
kept = p.memory_info().rss - start
heap.release()
print(held, kept >> 20, (start + kept - p.memory_info().rss) >> 20)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "1" and int(out[1]) >= 100, out
    assert out[2] == "True" and int(out[3]) >= 60 and int(out[4]) >= 60, out  # 80 MB kept, then handed back


def test_unique_first_is_numpy_unique():
    """`columns.unique_first` gives what `np.unique(..., return_index=True)` gives, codes over 64
    and floats included (those go to numpy)."""
    import numpy as np

    from specwatch.columns import unique_first

    rnd = np.random.default_rng(1)
    for top in (1, 2, 8, 64, 65, 300):
        for n in (0, 1, 5, 1000):
            codes = rnd.integers(0, top, n)
            for c in (codes, codes.astype(float)):
                got, want = unique_first(c), np.unique(c, return_index=True)
                assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()


def test_windows_left_by_the_catchup_are_bucket_sums(tmp_path, monkeypatch):
    """Every rule window after a catch-up holds at most one time bucket a second of its span
    (`stats.Recent`), however many lines the read had."""
    import gc

    from specwatch.rules.stats import Recent

    log = tmp_path / "server.log"
    scenario(log)
    run(log, fast=True, chunk=1 << 20, clock=False, monkeypatch=monkeypatch)
    windows = [o for o in gc.get_objects() if type(o) is Recent and len(o)]
    assert windows and all(len(w.buckets) <= w.span / w.width + 1 for w in windows)
    assert any(len(w) > len(w.buckets) for w in windows)  # lines summed, not kept


def test_a_catchup_read_leaves_the_heap_as_it_is(tmp_path, monkeypatch):
    """Only `replay` and the daemon's start-up backlog hold freed memory in the heap
    (`heap.hold`); a large read later in the daemon's life does not turn it back on."""
    from specwatch import heap

    heap.release()
    log = tmp_path / "server.log"
    scenario(log)
    assert run(log, fast=True, chunk=1 << 20, clock=True, monkeypatch=monkeypatch)["columns"] > 0
    assert heap._held is False
