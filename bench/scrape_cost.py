"""What one /metrics scrape costs `specwatch run`, in CPU seconds of the daemon's process.

The daemon is bench/budgets.py's idle setup: `specwatch run` (process and API sources on, GPU
off) beside a live fake SGLang server (tests/fake_sglang.py) whose 8 DP ranks each append
`--rate` decode lines a second to the followed log, their accept length and running requests
varying from line to line. Once it is past start-up it is scraped `--scrapes` times, `--pause`
seconds apart (the default 1 s: every rank printed a line between two scrapes, as within a
Prometheus interval), each scrape as Prometheus makes it (a new connection, its `Accept` header
preferring OpenMetrics, `Accept-Encoding: gzip`).

CPU per scrape: the process's CPU over the scrapes (user + sys, /proc/PID/stat, through psutil)
less that of its long-lived threads but the listener's (`/proc/PID/task/TID/schedstat`, threads
told apart by budgets.py's thread names): what is left is the listener's and those that answered
the connections (a thread each before, pool workers now). As a cross-check, the process's CPU over `--quiet` seconds
without a scrape gives its idle rate, and (CPU over the scrapes - idle rate x their wall time) /
scrapes is the other estimate. The share of a core a scrape every `--every` seconds adds is the
CPU per scrape over `--every`.

Usage: python bench/scrape_cost.py [--scrapes 120] [--pause 1] [--quiet 30] [--rate 1] [--every 15] [--json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import backlog  # noqa: E402  (also puts tests/ on sys.path)
import budgets  # noqa: E402

# What Prometheus 2.42 sends (scrape/scrape.go, scrapeAcceptHeader; gzip unless disabled).
LISTENER = "http"  # the listener's threads (`specwatch-http`, `-http-worker_N`) as budgets.NAME_THREADS names them
ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
          "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def scrape_once(port: int) -> bytes:
    """One scrape of /metrics as Prometheus makes it; the body, decompressed."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                 headers={"Accept": ACCEPT, "Accept-Encoding": "gzip",
                                          "X-Prometheus-Scrape-Timeout-Seconds": "10"})
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read()
        if r.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    return body


def measure(scrapes: int, pause: float, quiet: float, rate: float, every: float) -> dict:
    with tempfile.TemporaryDirectory() as d, budgets.live_daemon(Path(d), 0, rate=rate, vary=True) as (daemon, port):
        time.sleep(10)  # past start-up: first scans, polls and the diagnosis of the server's settings
        ps = psutil.Process(daemon.pid)
        cpu0, t0 = backlog.cpu_seconds(ps), time.monotonic()
        time.sleep(quiet)
        idle_rate = (backlog.cpu_seconds(ps) - cpu0) / (time.monotonic() - t0)
        body = scrape_once(port)  # not counted: the first one may import what later ones reuse
        cpu0, threads0, t0 = backlog.cpu_seconds(ps), budgets.thread_cpu(daemon.pid), time.monotonic()
        for _ in range(scrapes):
            time.sleep(pause)
            body = scrape_once(port)
        wall = time.monotonic() - t0
        used = backlog.cpu_seconds(ps) - cpu0
        others = sum(t - threads0.get(name, 0.0) for name, t in budgets.thread_cpu(daemon.pid).items()
                     if not name.startswith(LISTENER))
        series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        per, per_idle = (used - others) / scrapes, (used - idle_rate * wall) / scrapes
        return {"scrapes": scrapes, "pause_s": pause, "rate_per_rank": rate,
                "idle_pct_of_core": round(100 * idle_rate, 4), "cpu_s_per_scrape": round(per, 6),
                "cpu_s_per_scrape_by_idle_rate": round(per_idle, 6), "every_s": every,
                "pct_of_core_at_every": round(100 * per / every, 4), "series": series, "body_bytes": len(body)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scrapes", type=int, default=120)
    ap.add_argument("--pause", type=float, default=1.0, help="seconds between two scrapes")
    ap.add_argument("--quiet", type=float, default=30.0, help="seconds of idle CPU measured first")
    ap.add_argument("--rate", type=float, default=1.0, help="decode lines a second per rank")
    ap.add_argument("--every", type=float, default=15.0, help="scrape interval the share is given for, s")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res = measure(a.scrapes, a.pause, a.quiet, a.rate, a.every)
    if a.json:
        print(json.dumps(res))
        return
    print(f"{res['scrapes']} scrapes of {res['series']} series ({res['body_bytes']:,} bytes): "
          f"{1000 * res['cpu_s_per_scrape']:.3f} ms CPU a scrape "
          f"({1000 * res['cpu_s_per_scrape_by_idle_rate']:.3f} ms by the idle rate); "
          f"a scrape every {a.every:g} s adds {res['pct_of_core_at_every']:.4f} % of a core "
          f"(idle without scrapes: {res['idle_pct_of_core']:.4f} %)")


if __name__ == "__main__":
    main()
