"""Soak: does the daemon's memory plateau? (issue 10 item 23)

Runs `specwatch run` beside a live fake SGLang server whose 8 DP ranks each append one decode line
a second (bench/budgets.py's idle set-up: process and API sources on, GPU off) for --seconds,
samples the daemon's RSS every --every seconds, and fits a line to the last half of the samples.
It plateaus when that slope is at most --max-slope MB/hour.

What fills by design: in the first `degradation.window` (600 s by default) the rules' recent
windows (8 ranks x 600 decode lines, ~0.8 MB of Python objects), so a run shorter than ~20 minutes
cannot show the plateau (the default is one hour); after that only the learned baselines (300 s
buckets up to their 24 h `baseline_window`, ~15 KB an hour) and drift's buckets (4 h).

Usage: python bench/soak.py [--seconds 3600] [--every 10] [--others 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
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


def soak(seconds: float, every: float, others: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="specwatch-soak-"))
    try:
        with budgets.live_daemon(tmp, others) as (daemon, port):
            ps = psutil.Process(daemon.pid)
            lines0 = budgets.backlog.scrape_lines(port)
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
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    half = [p for p in samples if p[0] >= samples[-1][0] / 2]
    rss = [v for _, v in samples]
    return {
        "seconds": round(samples[-1][0]), "samples": len(samples), "log_lines_read": read,
        "rss_mb_start": round(rss[0], 2), "rss_mb_end": round(rss[-1], 2), "rss_mb_max": round(max(rss), 2),
        "slope_mb_per_h_all": round(slope_per_hour(samples), 3),
        "slope_mb_per_h_last_half": round(slope_per_hour(half), 3) if len(half) > 1 else None,
        "rss_mb": [round(v, 2) for v in rss],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3600, help="how long to run (a short value to try it)")
    ap.add_argument("--every", type=float, default=10, help="seconds between RSS samples")
    ap.add_argument("--others", type=int, default=0, help="`sleep` processes beside the server")
    ap.add_argument("--max-slope", type=float, default=0.5, help="MB/hour over the last half that still counts as a plateau")
    ap.add_argument("--json", action="store_true", help="print the result as JSON (with every sample)")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("bench/soak.py: terminated"))  # clean up as on Ctrl-C
    res = soak(a.seconds, a.every, a.others)
    last = res["slope_mb_per_h_last_half"]
    res["plateau"] = last is not None and last <= a.max_slope
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"{res['seconds']} s, {res['log_lines_read']} lines: RSS {res['rss_mb_start']} -> {res['rss_mb_end']} MB "
              f"(max {res['rss_mb_max']}), slope {res['slope_mb_per_h_all']} MB/h overall, "
              f"{last} MB/h over the last half: {'plateau' if res['plateau'] else 'STILL GROWING'} "
              f"(limit {a.max_slope} MB/h)")
    return 0 if res["plateau"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
