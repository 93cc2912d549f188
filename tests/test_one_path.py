"""`run` and `replay` decide the same on any log: one decision path, whatever the reads.

Random SGLang logs (DP/TP ranks, healthy accept lengths, collapses to ~1.0 of every rank or of
some, degraded spells, idle ranks, gaps, prefill-only spells, a wedged scheduler whose HTTP
server still logs requests, a restart by a new `server_args` line, a traceback, a failed health
check, malformed and undecodable lines) are read through public entries only:

- as `replay` reads them: `specwatch.replay.replay_files`, the function `specwatch replay` calls
  (whole-file reads, the lines' own clock);
- as `run` follows a log being written: the file grows by appends cut at random byte offsets,
  a `Follower` built as the daemon builds one (`stage` of the log's source, the daemon's read
  size) polls after each append and hands each read to `Pipeline.feed_batch` with the
  daemon's clock, `now`: the wall time of a daemon that reads each second's lines within that
  second (the file's mtime says the same, as the daemon's log clock checks);
- with the lines' clock again, in reads cut anywhere (a log replayed while it is written):
  large reads and small ones in turn.

Both must hand out the same alerts (name, every label, status, starts/ends to the second) and
count the same lines. The daemon's own ticks are left out: while lines come each second the
pipeline ticks on them (at most once a second of their clock), the same in both; the daemon ticks
by itself only when no batch line comes, where a replay has no clock (`DecodeStalled` then fires
in `run` during the silence, in `replay` at the line that ends it: which clock ticks, by design).
vLLM logs (no year in their stamps) are read the same two ways.
"""

from __future__ import annotations

import os
import random
import re
from datetime import datetime, timedelta

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from specwatch.alerting import build_alerting
from specwatch.config import LogSource, build_config
from specwatch.core.pipeline import Pipeline
from specwatch.replay import replay_files, summary
from specwatch.sources.filestream import Follower
from specwatch.sources.logfiles import stage

# Windows short enough for every decode rule to decide within a few minutes of log.
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
MAX_LINE_BYTES = 1 << 20
RUN_READ_BYTES = 1 << 20  # the daemon's reads of a log below its large-backlog size (daemon.py)
START = datetime(2026, 3, 1, 10, 0, 0)
NOT_UTF8 = "<not-utf-8>"  # replaced by bytes that do not decode

# One spell of the log: what its decode lines say, for how long, how many lines a second.
KINDS = ("healthy", "collapse_all", "collapse_some", "degraded", "throughput_drop", "idle", "prefill_only",
         "stalled", "gap", "long_gap", "restart", "traceback", "health_failed", "malformed", "ceiling")
spells = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(1, 90), st.integers(1, 30)), min_size=1, max_size=8)


def server_args(dp: int) -> str:
    """The `server_args=ServerArgs(...)` line SGLang prints at start (sglang/srt/server_args.py
    0.5.x), EAGLE3 with 3 steps (accept length ceiling 4)."""
    return ("server_args=ServerArgs(model_path='/models/m', speculative_algorithm='EAGLE3', "
            f"speculative_draft_model_path='/models/d', speculative_num_steps=3, speculative_eagle_topk=1, "
            f"speculative_num_draft_tokens=4, tp_size={dp}, dp_size={dp})")


def make_log(seed: int, ranks: int, rank_form: str, ms: bool, plan: list[tuple[str, int, int]]) -> bytes:
    """A log of `plan`'s spells after 3 healthy minutes (a baseline for the windowed rules), in
    SGLang's line forms: the canonical decode line of 0.5.5+ and prefill line of 0.5.10+
    (`#pending-token` of 0.5.11+ with `ms`), the uvicorn access line, `server_args`.
    rank_form: "dp" (`DP0 TP0`), "tp" (`TP0`: TP ranks each print) or "" (no rank: one GPU)."""
    rnd = random.Random(seed)
    names = [f"DP{i} TP{i}" if rank_form == "dp" else f"TP{i}" for i in range(ranks)] if rank_form else [""]
    out: list[str] = []
    t = START
    first = True

    def stamp() -> str:
        return t.strftime("%Y-%m-%d %H:%M:%S") + (f".{t.microsecond // 1000:03d}" if ms else "")

    def decode(rank: str, al: float, thr: float, running: int) -> str:
        head = f"[{stamp()} {rank}]" if rank else f"[{stamp()}]"
        return (f"{head} Decode batch, #running-req: {running}, #token: {rnd.randint(100, 90000)}, "
                f"token usage: {rnd.random():.2f}, accept len: {al:.2f}, accept rate: {(al - 1) / 3:.2f}, "
                f"cuda graph: True, gen throughput (token/s): {thr:.2f}, #queue-req: {rnd.randint(0, 5)}")

    def prefill(rank: str) -> str:
        head = f"[{stamp()} {rank}]" if rank else f"[{stamp()}]"
        pending = f"#pending-token: {rnd.randint(0, 900)}, " if ms else ""
        return (f"{head} Prefill batch, #new-seq: 1, #new-token: {rnd.randint(10, 4000)}, "
                f"#cached-token: {rnd.randint(0, 4000)}, token usage: {rnd.random():.2f}, "
                f"#running-req: {rnd.randint(0, 64)}, #queue-req: 0, {pending}cuda graph: True, "
                f"input throughput (token/s): {rnd.random() * 9000:.2f}")

    out.append(f"[{stamp()}] {server_args(max(ranks, 1))}")
    for kind, seconds, rate in [("healthy", 180, 20)] + plan:
        if kind in ("gap", "long_gap"):  # nothing written: every rank's next window is after a gap
            t += timedelta(seconds=seconds * 2 if kind == "gap" else 300 + seconds * 4)  # long: past drift's restart_gap
            continue
        if kind == "restart":
            t += timedelta(seconds=rnd.randint(1, 40))
            out.append(f"[{stamp()}] {server_args(max(ranks, 1))}")
        elif kind == "traceback":
            rank = rnd.choice(names)
            head = f"[{stamp()} {rank}]" if rank else f"[{stamp()}]"
            out += [f"{head} Scheduler hit an exception: Traceback (most recent call last):",
                    '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2790, in run_scheduler_process',
                    "    scheduler.event_loop_overlap()",
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."]
        elif kind == "health_failed":
            out.append(f"[{stamp()}] Health check failed. Server couldn't get a response from detokenizer for "
                       f"last 20 seconds. tic start time: {t:%H:%M:%S}. last_heartbeat time: {t:%H:%M:%S}")
        if kind == "stalled":  # the scheduler wedged: no batch line, the HTTP server still logs requests
            end = t + timedelta(seconds=seconds * 2)
            while t < end:
                t += timedelta(milliseconds=rnd.randint(1, max(2, 2000 // rate)))
                out.append(f'[{stamp()}] INFO:     127.0.0.1:{rnd.randint(30000, 60000)} - '
                           '"POST /v1/chat/completions HTTP/1.1" 200 OK')
            continue
        some = set(rnd.sample(names, max(1, len(names) // 2)))
        end = t + timedelta(seconds=seconds)
        while t < end:
            t += timedelta(milliseconds=rnd.randint(1, max(2, 2000 // rate)))
            rank = rnd.choice(names)
            r = rnd.random()
            if r < 0.2:
                out.append(f'[{stamp()}] INFO:     127.0.0.1:{rnd.randint(30000, 60000)} - '
                           '"POST /v1/chat/completions HTTP/1.1" 200 OK')
            elif r < 0.35 or kind == "prefill_only":
                out.append(prefill(rank))
            elif kind == "malformed" and r < 0.45:
                line = decode(rank, 2.5, 900.0, 8)
                out.append(line[:rnd.randint(line.index("Decode"), len(line) - 12)])  # a write cut short
            else:
                al, thr, running = 2.4 + rnd.random() * 0.8, 400 + rnd.random() * 800, rnd.randint(1, 64)
                if kind == "collapse_all" or kind == "collapse_some" and rank in some:
                    al = 1.0 + rnd.random() * 0.06
                elif kind == "degraded":
                    al = 1.8 + rnd.random() * 0.2
                elif kind == "throughput_drop":
                    thr *= 0.3
                elif kind == "idle" and rank in some:
                    running = 0
                elif kind == "ceiling" and rank in some:
                    al = 3.9 + rnd.random() * 0.1
                out.append(decode(rank, al, thr, running))
        if first and kind == "malformed":  # bytes that are not UTF-8, once
            out.append(f"[{stamp()}] INFO: request text {NOT_UTF8}")
            first = False
    return ("\n".join(out) + "\n").encode().replace(NOT_UTF8.encode(), b"\xff\xfe")


# vLLM prints no year (`%m-%d %H:%M:%S`, vllm/logger.py): its log starts two days before today,
# so that replay (the year of the host's clock) and run (the year of the daemon's) agree.
VLLM_START = (datetime.now() - timedelta(days=2)).replace(hour=10, minute=0, second=0, microsecond=0)
VLLM_KINDS = ("healthy", "collapse", "draft_too_long", "idle", "gap", "restart", "malformed")
vllm_spells = st.lists(st.tuples(st.sampled_from(VLLM_KINDS), st.integers(10, 300)), min_size=1, max_size=6)


def make_vllm_log(seed: int, plan: list[tuple[str, int]]) -> bytes:
    """A vLLM 0.10.2 log (tests/vllm_lines.py's line forms: the engine-config line, the stats and
    `SpecDecoding metrics` lines every 10 s, uvicorn's access lines without a stamp) of `plan`'s
    spells after 5 healthy minutes; 3 draft tokens."""
    from vllm_lines import config_line, spec_line, stats_line

    rnd = random.Random(seed)
    t = VLLM_START
    out = [config_line("0.10.2", k=3, ts=f"{t:%m-%d %H:%M:%S}")]
    for kind, seconds in [("healthy", 300)] + plan:
        if kind == "gap":
            t += timedelta(seconds=seconds)
            continue
        if kind == "restart":
            t += timedelta(seconds=rnd.randint(5, 60))
            out.append(config_line("0.10.2", k=3, ts=f"{t:%m-%d %H:%M:%S}"))
        for _ in range(max(1, seconds // 10)):
            t += timedelta(seconds=10)
            ts = f"{t:%m-%d %H:%M:%S}"
            running = 0 if kind == "idle" else rnd.randint(1, 32)
            out.append(stats_line("0.10.2", running=running, waiting=rnd.randint(0, 3),
                                  gen=0.0 if kind == "idle" else 300 + rnd.random() * 900, kv=rnd.random() * 60, ts=ts))
            if kind != "idle":
                drafted = 3 * rnd.randint(100, 400)
                positions = [0.5 + rnd.random() * 0.3, 0.3 + rnd.random() * 0.2, 0.1 + rnd.random() * 0.2]
                if kind == "collapse":
                    positions = [rnd.random() * 0.02, 0.0, 0.0]
                elif kind == "draft_too_long":
                    positions[2] = 0.0
                accepted = int(drafted / 3 * sum(positions))
                line = spec_line("0.10.2", accepted=accepted, drafted=drafted, positions=positions, ts=ts)
                if kind == "malformed" and rnd.random() < 0.3:
                    line = line[:rnd.randint(line.index("SpecDecoding"), len(line) - 5)]  # a write cut short
                out.append(line)
            for _ in range(rnd.randint(0, 3)):
                out.append(f'INFO:     127.0.0.1:{rnd.randint(30000, 60000)} - "POST /v1/chat/completions HTTP/1.1" 200 OK')
    return ("\n".join(out) + "\n").encode()


def _config(path: str):
    cfg = build_config({"server": "s", "rules": RULES}, for_run=False)
    cfg.logs.append(LogSource(path=path, server="s"))
    return cfg


def _pipeline(path: str) -> Pipeline:
    cfg = _config(path)
    dispatcher, _ = build_alerting(cfg, state_dir=None, replay=True, notify=False, slack_dry_run=None)
    return Pipeline(cfg, dispatcher, diagnosis_background=False)


_VLLM_STAMP = re.compile(rb"(?:\([^)]*\) )?[A-Z]+ (\d\d-\d\d \d\d:\d\d:\d\d) ")


def _stamp(line: bytes) -> float | None:
    """The epoch seconds of a line's stamp read in local time (as the log is), else None: SGLang's
    bracket stamp, or vLLM's header (the year of VLLM_START)."""
    m = _VLLM_STAMP.match(line)
    if m is not None:
        return datetime.strptime(f"{VLLM_START.year}-{m.group(1).decode()}", "%Y-%m-%d %H:%M:%S").timestamp()
    if line[:1] != b"[" or len(line) < 20:
        return None
    try:
        t = datetime.strptime(line[1:20].decode(), "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    frac = line[20:24]
    return t.timestamp() + (int(frac[1:]) / 1000 if frac[:1] == b"." and frac[1:].isdigit() else 0.0)


def decisions(p: Pipeline) -> dict:
    """What the pipeline decided, as `replay --json` reports it: alert episodes and transitions
    (name, labels, status, starts/ends cut to the second), sorted; the line counts."""
    doc = summary(p, list(p.dispatcher.history))

    def norm(a: dict) -> tuple:
        cut = lambda s: (s or "")[:19]  # noqa: E731 — RFC 3339 to the second; "" while firing
        return (a["name"], tuple(sorted(a["labels"].items())), a["status"], cut(a["starts_at"]), cut(a["ends_at"]))

    return {"episodes": sorted(map(norm, doc["episodes"])), "alerts": sorted(map(norm, doc["alerts"])),
            "lines": doc["lines"]}


def as_replay(tmp, data: bytes) -> dict:
    path = str(tmp / "replay" / "server.log")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    p = _pipeline(path)
    replay_files(p, [path], MAX_LINE_BYTES)
    return decisions(p)


def reads(data: bytes, rnd: random.Random, extra: int) -> list[tuple[int, float]]:
    """Where `run`'s reads end (byte offsets, cut anywhere) and each read's clock: a daemon that
    reads each second's lines within that second (a read's complete lines share one stamp;
    lines without a stamp go with the line before), plus `extra` cuts at random offsets."""
    ends, clocks, at, clock = [], [], 0, None
    for line in data.splitlines(keepends=True):
        ts = _stamp(line)
        if ts is not None and clock is not None and ts != clock:
            ends.append(at + rnd.randrange(len(line)))  # within the first line of the next second
            clocks.append(clock)
        clock = ts if ts is not None else clock
        at += len(line)
    ends.append(len(data))
    clocks.append(clock)
    cuts = sorted(set(ends) | {rnd.randrange(1, len(data)) for _ in range(extra)})
    out, i = [], 0
    for c in cuts:
        while ends[i] < c:
            i += 1
        out.append((c, clocks[i]))  # the clock of the second whose lines the read completes
    return out


def as_run(tmp, data: bytes, cuts: list[tuple[int, float | None]], name: str = "run") -> dict:
    """`data` written to a file in pieces ending at each cut's offset, each piece read at once by a
    Follower as the daemon's, and handed to `feed_batch` with the cut's clock (None: the lines')."""
    path = str(tmp / name / "server.log")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").close()
    p = _pipeline(path)
    src = p.config.logs[0]
    clock: list[float | None] = [None]
    follower = Follower(path, on_lines=stage(src, lambda batch: p.feed_batch(batch, now=clock[0]), MAX_LINE_BYTES),
                        max_line_bytes=MAX_LINE_BYTES, read_chunk_bytes=RUN_READ_BYTES)
    done = 0
    with open(path, "ab", buffering=0) as f:
        for end, now in cuts:
            f.write(data[done:end])
            done = end
            if now is not None:
                os.utime(path, (now, now))  # the file's mtime: the daemon's log clock reads it
            clock[0] = now
            follower.poll()
    follower.close()
    p.flush_errors()
    return decisions(p)


LOGS = dict(seed=st.integers(0, 2 ** 32 - 1), ranks=st.integers(1, 8), rank_form=st.sampled_from(["dp", "tp", ""]),
            ms=st.booleans(), plan=spells)
SETTINGS = settings(max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def _log(tmp_path_factory, seed, ranks, rank_form, ms, plan) -> tuple:
    tmp = tmp_path_factory.mktemp("log")
    data = make_log(seed, ranks if rank_form else 1, rank_form, ms, plan)
    return tmp, data, as_replay(tmp, data)


@SETTINGS
# A traceback at 10:03:00 ended by a line (or a tick) of the next second: both date ServerLogError
# by the traceback's own stamp, not by the read or tick that ended it (10:03:01).
@example(seed=2, ranks=1, rank_form="", ms=False, plan=[("traceback", 1, 1)], extra=0)
@example(seed=12, ranks=1, rank_form="dp", ms=False, plan=[("traceback", 1, 2)], extra=0)
# The last decode line at 10:02:59 (12 running, fewer than the line before), then only access
# lines for 2 min 40 s, then a decode line at 10:05:40 that ends the stall: `run` dates the
# access lines (the read's clock) and pages (DecodeStalled critical: lines still arriving);
# `replay` dates only batch lines and warns (the batch may have drained).
@example(seed=18, ranks=1, rank_form="", ms=False, plan=[("stalled", 80, 2), ("healthy", 2, 10)], extra=0)
@given(**LOGS, extra=st.integers(0, 400))
def test_run_and_replay_decide_the_same(tmp_path_factory, seed, ranks, rank_form, ms, plan, extra):
    tmp, data, replayed = _log(tmp_path_factory, seed, ranks, rank_form, ms, plan)
    assert as_run(tmp, data, reads(data, random.Random(seed), extra)) == replayed


@SETTINGS
@given(**LOGS, pieces=st.integers(1, 12))
def test_replay_decides_the_same_in_reads_of_any_size(tmp_path_factory, seed, ranks, rank_form, ms, plan, pieces):
    """The lines' clock over reads cut anywhere (a log replayed while it is written): large
    reads and small ones in turn."""
    tmp, data, replayed = _log(tmp_path_factory, seed, ranks, rank_form, ms, plan)
    rnd = random.Random(seed)
    cuts = sorted({rnd.randrange(1, len(data)) for _ in range(pieces)} | {len(data)})
    assert as_run(tmp, data, [(c, None) for c in cuts], "pieces") == replayed


@SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), plan=vllm_spells, extra=st.integers(0, 100), pieces=st.integers(1, 6))
def test_run_and_replay_decide_the_same_on_vllm(tmp_path_factory, seed, plan, extra, pieces):
    tmp = tmp_path_factory.mktemp("log")
    data = make_vllm_log(seed, plan)
    replayed = as_replay(tmp, data)
    rnd = random.Random(seed)
    assert as_run(tmp, data, reads(data, rnd, extra)) == replayed
    cuts = sorted({rnd.randrange(1, len(data)) for _ in range(pieces)} | {len(data)})
    assert as_run(tmp, data, [(c, None) for c in cuts], "pieces") == replayed
