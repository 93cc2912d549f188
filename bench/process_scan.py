"""Benchmark: CPU of the process source's scan among many unrelated processes.

Starts `--procs` `sleep` processes (what a GPU box's hundreds of workers look like to the scan),
runs `ProcessSource` on its own thread at `--interval` for `--seconds`, and reports the CPU
seconds this process spent (user+sys, psutil) as a share of one core, and the mean wall time
of one scan. One warm-up scan runs first (it reads every new process once).

Usage: python bench/process_scan.py [--procs 1000] [--seconds 60] [--interval 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specwatch.sources.process import ProcessSource  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=5.0)
    a = ap.parse_args()
    sleeps = [subprocess.Popen(["sleep", "3600"]) for _ in range(a.procs)]
    try:
        src = ProcessSource(lambda *_: None, server="bench", interval=a.interval)
        src.poll(time.time())  # warm-up: every process is new once
        me = psutil.Process()
        t0, c0, n0 = time.monotonic(), sum(me.cpu_times()[:2]), src.scans_total
        src.start()
        time.sleep(a.seconds)
        src.stop(timeout=5)
        wall, cpu = time.monotonic() - t0, sum(me.cpu_times()[:2]) - c0
        scans = src.scans_total - n0
        total = len(psutil.pids())
        print(f"{total} processes on the box, {scans} scans in {wall:.0f} s at interval {a.interval:g} s: "
              f"{cpu:.3f} CPU-s = {100 * cpu / wall:.3f} % of a core; last scan "
              f"{1000 * (src.last_scan_duration or 0):.2f} ms")
    finally:
        for p in sleeps:
            p.kill()
        for p in sleeps:
            p.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
