"""Soak: does the daemon's memory plateau, at any line rate?

Runs `specwatch run` beside a live fake SGLang server whose 8 DP ranks each append one decode line
a second (bench/budgets.py's idle set-up: process and API sources on, GPU off) for --seconds,
samples the daemon's RSS every --every seconds, and fits a line to the last half of the samples.
It plateaus when that slope is at most --max-slope MB/hour.

What fills by design: in the first `degradation.window` (600 s by default) the rules' recent
windows (one 1 s bucket of 24 bytes per second and window, whatever the line rate: under 0.2 MB for
8 ranks), so a run shorter than ~20 minutes cannot show the plateau (the default is one hour);
after that only the learned baselines (300 s buckets up to their 24 h `baseline_window`, ~15 KB an
hour) and drift's buckets (4 h).

Under load (--rate: decode lines a second per rank, --scrape-every: /metrics read meanwhile, as
Prometheus does) the rules' windows stay the same size: they hold per-second sums, not lines, so
RSS is bounded whatever the rate (budget: --max-rss, 60 MB).

--cardinality N instead writes a log of N distinct ranks (`DPn TPn`, 3 decode lines each), lets
`specwatch run` read it, and reports the /metrics size, its scrape time and the daemon's RSS, and
`specwatch replay`'s peak RSS on the same file: label sets are capped per server
(`limits.max_ranks_per_server`), the rest summed into rank="other".

Usage: python bench/soak.py [--seconds 3600] [--every 10] [--others 0] [--rate 1] [--scrape-every 0] [--json]
       python bench/soak.py --cardinality 2000 [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import budgets  # noqa: E402


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) points, in MB per hour."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return 3600 * sum((t - mt) * (v - mv) for t, v in points) / var if var else 0.0


def scrape_loop(port: int, every: float, stop: threading.Event, sizes: list[int]) -> None:
    """Read /metrics every `every` seconds until `stop`, as Prometheus does; its sizes to `sizes`."""
    while not stop.wait(every):
        try:
            sizes.append(len(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()))
        except OSError:
            pass


def soak(seconds: float, every: float, others: int, rate: float = 1.0, scrape_every: float = 0.0) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="specwatch-soak-"))
    stop, sizes = threading.Event(), []
    try:
        with budgets.live_daemon(tmp, others, rate) as (daemon, port):
            ps = psutil.Process(daemon.pid)
            lines0 = budgets.backlog.scrape_lines(port)
            if scrape_every:
                threading.Thread(target=scrape_loop, args=(port, scrape_every, stop, sizes), daemon=True).start()
            t0 = time.monotonic()
            samples: list[tuple[float, float]] = []
            while True:
                samples.append((time.monotonic() - t0, ps.memory_info().rss / 2**20))
                print(f"{samples[-1][0]:7.0f} s  RSS {samples[-1][1]:6.2f} MB", file=sys.stderr, flush=True)
                left = t0 + seconds - time.monotonic()
                if left <= 0:
                    break
                time.sleep(min(every, left))
            read = budgets.backlog.scrape_lines(port) - lines0
            stop.set()
    finally:
        stop.set()
        shutil.rmtree(tmp, ignore_errors=True)
    half = [p for p in samples if p[0] >= samples[-1][0] / 2]
    rss = [v for _, v in samples]
    return {
        "seconds": round(samples[-1][0]), "samples": len(samples), "log_lines_read": read,
        "rate_per_rank": rate, "scrapes": len(sizes), "metrics_bytes_max": max(sizes, default=None),
        "rss_mb_start": round(rss[0], 2), "rss_mb_end": round(rss[-1], 2), "rss_mb_max": round(max(rss), 2),
        "slope_mb_per_h_all": round(slope_per_hour(samples), 3),
        "slope_mb_per_h_last_half": round(slope_per_hour(half), 3) if len(half) > 1 else None,
        "rss_mb": [round(v, 2) for v in rss],
    }


def cardinality(n: int) -> dict:
    """`specwatch run` and `specwatch replay` on a log of n distinct ranks, 3 decode lines each."""
    tmp = Path(tempfile.mkdtemp(prefix="specwatch-cardinality-"))
    log = tmp / "ranks.log"
    with open(log, "w") as f:
        for k in range(3):
            ts = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - 3 + k))
            for r in range(n):
                f.write(budgets.decode_line("0.5.23", ts=ts, rank={"DP": r, "TP": r}, running=8, accept_len=2.75)[0] + "\n")
    proc = None
    try:
        proc, port = budgets.backlog.start_specwatch(budgets.backlog.write_config(tmp, log))
        budgets.wait_until(lambda: budgets.backlog.scrape_lines(port) >= 3 * n, 300, "specwatch to read the log")
        times, size = [], 0
        for _ in range(5):
            t0 = time.monotonic()
            size = len(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read())
            times.append(time.monotonic() - t0)
        rss = psutil.Process(proc.pid).memory_info().rss / 2**20
        budgets.backlog.stop(proc)
        proc = None
        with open(tmp / "replay.json", "wb") as out:
            p = subprocess.Popen([sys.executable, "-m", "specwatch", "replay", "--json", str(log)], stdout=out,
                                 stderr=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=str(budgets.BENCH.parent)))
            _, status, ru = os.wait4(p.pid, 0)
        if os.waitstatus_to_exitcode(status):
            raise RuntimeError(f"specwatch replay exited with {os.waitstatus_to_exitcode(status)}")
        return {"ranks": n, "lines": 3 * n, "metrics_bytes": size, "scrape_s_median": round(statistics.median(times), 3),
                "run_rss_mb": round(rss, 1), "replay_peak_rss_mb": round(ru.ru_maxrss / 1024, 1)}
    finally:
        if proc is not None:
            budgets.backlog.stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3600, help="how long to run (a short value to try it)")
    ap.add_argument("--every", type=float, default=10, help="seconds between RSS samples")
    ap.add_argument("--others", type=int, default=0, help="`sleep` processes beside the server")
    ap.add_argument("--max-slope", type=float, default=0.5, help="MB/hour over the last half that still counts as a plateau")
    ap.add_argument("--rate", type=float, default=1, help="decode lines a second per rank (8 ranks)")
    ap.add_argument("--scrape-every", type=float, default=0, help="seconds between /metrics reads (0: none)")
    ap.add_argument("--max-rss", type=float, default=60, help="MB the daemon's RSS may reach")
    ap.add_argument("--cardinality", type=int, default=0, help="instead: a log of this many distinct ranks")
    ap.add_argument("--json", action="store_true", help="print the result as JSON (with every sample)")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("bench/soak.py: terminated"))  # clean up as on Ctrl-C
    if a.cardinality:
        res = cardinality(a.cardinality)
        print(json.dumps(res, indent=2) if a.json else
              f"{res['ranks']} ranks, {res['lines']} lines: /metrics {res['metrics_bytes']:,} bytes, scrape "
              f"{res['scrape_s_median']} s (median of 5), run RSS {res['run_rss_mb']} MB, "
              f"replay peak RSS {res['replay_peak_rss_mb']} MB")
        return 0
    res = soak(a.seconds, a.every, a.others, a.rate, a.scrape_every)
    last = res["slope_mb_per_h_last_half"]
    res["plateau"] = last is not None and last <= a.max_slope
    res["within_rss"] = res["rss_mb_max"] <= a.max_rss
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"{res['seconds']} s, {res['log_lines_read']} lines: RSS {res['rss_mb_start']} -> {res['rss_mb_end']} MB "
              f"(max {res['rss_mb_max']}), slope {res['slope_mb_per_h_all']} MB/h overall, "
              f"{last} MB/h over the last half: {'plateau' if res['plateau'] else 'STILL GROWING'} "
              f"(limit {a.max_slope} MB/h); max RSS {'ok' if res['within_rss'] else 'OVER'} (limit {a.max_rss:g} MB)")
    return 0 if res["plateau"] and res["within_rss"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
