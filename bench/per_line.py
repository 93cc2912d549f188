"""CPU cost of the live (per-line) path: µs of CPU per decode line, as `specwatch run` pays it
beside a live server.

A `Pipeline` is built as the daemon builds it (`build_config` of a one-log config with the
defaults of config.example.yaml, `build_alerting`), warmed with `--warm` seconds of log, then fed
`--seconds` seconds of 8 DP ranks writing one healthy decode line a second each, with a tick per
second of log time as the daemon's main loop gives it. Two modes:

- batch: each second's 8 lines in one `LineBatch` (one read), then the tick;
- cold: one line per `LineBatch` (a read per line, as a follower polling 8 lines spread over the
  second mostly gets), with ~`--thrash-mb` MB of memory touched between lines so the CPU caches
  are cold-ish, as between the wake-ups of an idle daemon.

Each prints, over `--runs` runs, the median of (thread CPU time of the median read x reads + the
median tick x ticks) / lines: µs of CPU per decode line, the tick's share included.

Usage: python bench/per_line.py [--runs 5] [--seconds 300] [--warm 900] [--profile batch|cold]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sglang_lines import decode_line  # noqa: E402

from specwatch.alerting import build_alerting  # noqa: E402
from specwatch.config import build_config  # noqa: E402
from specwatch.core.pipeline import Pipeline  # noqa: E402
from specwatch.sources.filestream import LineBatch  # noqa: E402

RANKS = 8
LOG = "/var/log/sglang/server.log"
T0 = 1_780_000_000  # a log second (UTC)


def lines_of(second: int, rng: random.Random) -> list[str]:
    """The 8 ranks' decode lines of one log second: healthy, a little noise."""
    ts = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(T0 + second))
    return [decode_line("0.5.23", ts=ts, rank={"DP": r, "TP": r}, running=8 + rng.randrange(4),
                        accept_len=round(2.75 + rng.uniform(-0.2, 0.2), 2),
                        throughput=round(400 + rng.uniform(-20, 20), 2))[0] for r in range(RANKS)]


def build() -> Pipeline:
    cfg = build_config({"server": "bench", "logs": [{"path": LOG}], "gpu": {"enabled": False}}, for_run=True)
    dispatcher, _ = build_alerting(cfg, state_dir=None)
    return Pipeline(cfg, dispatcher)


class Thrash:
    """Touches `mb` MB between lines: the caches the last line warmed are mostly gone."""

    def __init__(self, mb: int):
        self.buf = bytearray(mb << 20)
        self.objs = [object() for _ in range(mb * 2000)]  # Python objects too (spread over the heap)

    def __call__(self) -> None:
        self.buf[:] = self.buf  # memmove of the whole buffer
        sum(map(id, self.objs))


def run(mode: str, seconds: int, warm: int, thrash: Thrash | None, prof: cProfile.Profile | None = None) -> float:
    """µs of thread CPU time per decode line over `seconds` seconds of log after `warm`."""
    rng = random.Random(7)
    p = build()
    data = [lines_of(s, rng) for s in range(warm + seconds)]
    for s in range(warm):
        p.feed_batch(LineBatch(LOG, 0, 0, lines=data[s]), now=T0 + s + 0.9)
        with p.lock:
            p.tick(T0 + s + 0.95)
    feeds, ticks = [], []  # ns of thread CPU time: each read's, each tick's
    clock = time.thread_time_ns
    for s in range(warm, warm + seconds):
        now = T0 + s
        if mode == "batch":
            batches = [(LineBatch(LOG, 0, 0, lines=data[s]), now + 0.9)]
        else:
            batches = [(LineBatch(LOG, 0, 0, lines=[line]), now + 0.1 * (r + 1)) for r, line in enumerate(data[s])]
        for batch, at in batches:
            if thrash is not None:
                thrash()
            if prof:
                prof.enable()
            c0 = clock()
            p.feed_batch(batch, now=at)
            feeds.append(clock() - c0)
            if prof:
                prof.disable()
        if thrash is not None:
            thrash()
        if prof:
            prof.enable()
        c0 = clock()
        with p.lock:
            p.tick(now + 0.95)
        ticks.append(clock() - c0)
        if prof:
            prof.disable()
    firing = [a for r in p.rules for a in r.firing_alerts()]
    if firing:
        raise RuntimeError(f"healthy lines fired {[a.name for a in firing]}")
    # medians, not means: a read or tick that another process preempted or evicted midway is an outlier
    return (statistics.median(feeds) * len(feeds) + statistics.median(ticks) * len(ticks)) / 1000 / (seconds * RANKS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=300, help="log seconds measured per run")
    ap.add_argument("--warm", type=int, default=900, help="log seconds fed before (windows fill)")
    ap.add_argument("--thrash-mb", type=int, default=8)
    ap.add_argument("--modes", default="batch,cold")
    ap.add_argument("--profile", choices=("batch", "cold"), help="print a cProfile of one run instead")
    a = ap.parse_args()
    if a.profile:
        prof = cProfile.Profile()
        run(a.profile, a.seconds, a.warm, Thrash(a.thrash_mb) if a.profile == "cold" else None, prof)
        pstats.Stats(prof).sort_stats("tottime").print_stats(40)
        return
    for mode in a.modes.split(","):
        thrash = Thrash(a.thrash_mb) if mode == "cold" else None
        us = [run(mode, a.seconds, a.warm, thrash) for _ in range(a.runs)]
        print(f"{mode:6} median {statistics.median(us):6.1f} µs/line  (runs: {', '.join(f'{u:.1f}' for u in us)})")


if __name__ == "__main__":
    main()
