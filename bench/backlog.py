"""Benchmark: specwatch vs mtail on the same SGLang log backlog, same machine, same run.

Measures, each repeated `--repeats` times (medians reported):
  1. backlog: a daemon starts on a file that already holds N lines and reads it to the end;
     CPU seconds of the process (user+sys, from /proc via psutil) → lines per CPU-second.
     specwatch: `specwatch run` (follower + parser + rules + metrics state).
     mtail:     `mtail --one_shot` with a program that extracts the same decode fields
                (its fastest mode: no tailing; tailing, mtail 3.0.0~rc50 read ~121k lines/s
                against ~163k with --one_shot on a 2-vCPU VM).
  2. idle: CPU used by an idle `specwatch run` over `--idle` seconds, and its RSS.
  3. latency: wall time from appending the third of three collapse lines (stamped 8 s, 4 s and
     0 s ago, as a live server prints them) to a followed file until a local Slack-compatible
     endpoint receives the alert (the default group_wait, 0 s).

Usage: python bench/backlog.py [--lines 200000] [--repeats 3] [--idle 20]
Needs the Debian package `mtail` for the comparison (skipped with a note otherwise).
"""

from __future__ import annotations

import argparse
import json
import itertools
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))  # this checkout's specwatch, not an installed copy
from sglang_lines import mixed_log  # noqa: E402

_RUNS = itertools.count()
_METRICS_ON = re.compile(r"metrics on http://[^/\s]+:(\d+)/metrics")

MTAIL_PROG = r"""
counter decode_batches by rank
gauge accept_length by rank
gauge accept_rate by rank
gauge gen_throughput by rank
gauge running_requests by rank
gauge queued_requests by rank
/^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?)(?P<rank>( [A-Z_]+\d+)*)\] Decode batch[.,]? .*#running-req: (?P<run>\d+), .*accept len: (?P<al>[\d.]+), accept rate: (?P<ar>[\d.]+), .*gen throughput \(token\/s\): (?P<thr>[\d.]+), #queue-req: (?P<q>\d+)/ {
  decode_batches[$rank]++
  accept_length[$rank] = float($al)
  accept_rate[$rank] = float($ar)
  gen_throughput[$rank] = float($thr)
  running_requests[$rank] = int($run)
  queued_requests[$rank] = int($q)
}
"""


def cpu_seconds(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system + getattr(t, "children_user", 0) + getattr(t, "children_system", 0)


def scrape_lines(port: int) -> int:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return -1
    return int(sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
                   if l.startswith("specwatch_log_lines_total{")))


def write_config(tmp: Path, log: Path, slack_url: str | None = None) -> Path:
    """A config for one run, metrics on port 0 (the kernel picks a free one; see start_specwatch)."""
    run = next(_RUNS)
    cfg = tmp / f"config-{run}.yaml"
    text = (f"server: bench\nlogs:\n  - path: {log}\nmetrics:\n  listen_port: 0\n"
            f"state_dir: {tmp / ('state-%d' % run)}\ngpu:\n  enabled: false\n")
    if slack_url:
        text += f"alerts:\n  slack:\n    webhook_url: {slack_url}\n"
    cfg.write_text(text)
    return cfg


def start_specwatch(cfg: Path, path: tuple[str, ...] = ()) -> tuple[subprocess.Popen, int]:
    """Start `specwatch run`; returns it and the metrics port it bound, read from its start-up line
    (`... metrics on http://127.0.0.1:PORT/metrics`). `path`: directories put before the checkout
    on its PYTHONPATH (a measurement's `sitecustomize`)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*path, str(ROOT)]))
    out = cfg.with_suffix(".out")
    with open(out, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "specwatch", "run", "--config", str(cfg)],
                                env=env, stdout=fh, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        m = _METRICS_ON.search(out.read_text(errors="replace"))
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"specwatch did not start: {out.read_text(errors='replace')[-2000:]}")
        time.sleep(0.01)


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def run_specwatch_backlog(tmp: Path, log: Path, n: int) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, RSS bytes) for `specwatch run` to read n lines."""
    t0 = time.monotonic()
    proc, port = start_specwatch(write_config(tmp, log))
    ps = psutil.Process(proc.pid)
    while scrape_lines(port) < n:
        if proc.poll() is not None:
            raise RuntimeError("specwatch exited")
        time.sleep(0.02)
    wall = time.monotonic() - t0
    cpu, rss = cpu_seconds(ps), ps.memory_info().rss
    stop(proc)
    return cpu, wall, rss


def run_mtail_backlog(tmp: Path, log: Path) -> tuple[float, float]:
    progs = tmp / "progs"
    progs.mkdir(exist_ok=True)
    (progs / "sglang.mtail").write_text(MTAIL_PROG)
    t0 = time.monotonic()
    before = os.times()
    subprocess.run(["mtail", "--one_shot", "--one_shot_format", "prometheus", "--progs", str(progs),
                    "--logs", str(log), "--logtostderr"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return cpu, time.monotonic() - t0


def idle_and_rss(tmp: Path, seconds: float) -> tuple[float, int]:
    log = tmp / "idle.log"
    log.write_text("")
    proc, port = start_specwatch(write_config(tmp, log))
    ps = psutil.Process(proc.pid)
    while scrape_lines(port) < 0:
        time.sleep(0.05)
    time.sleep(1.0)  # past start-up
    c0 = cpu_seconds(ps)
    time.sleep(seconds)
    cpu = cpu_seconds(ps) - c0
    rss = ps.memory_info().rss
    stop(proc)
    return cpu / seconds, rss


class _Slack(BaseHTTPRequestHandler):
    got: list[float] = []

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        _Slack.got.append(time.monotonic())
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *a):
        pass


def alert_latency(tmp: Path, repeats: int, busy: bool = False) -> list[float]:
    """Seconds from a collapse line appended to the log to its Slack POST, one per run. `busy`: 7
    other ranks write a healthy decode line each, 8 lines a second in all, as beside a live server
    (the follower reads a busy log at most once per `follow.poll_interval`)."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Slack)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/services/T/B/x"
    out = []
    for i in range(repeats):
        log = tmp / f"lat-{i}.log"
        log.write_text("")
        proc, port = start_specwatch(write_config(tmp, log, url))
        while scrape_lines(port) < 0:
            time.sleep(0.05)
        time.sleep(0.5)
        _Slack.got.clear()

        def line(ago: float, rank: str = "TP0", accept: float = 1.05) -> str:  # local time, as SGLang stamps
            ts = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - ago))
            return (f"[{ts} {rank}] Decode batch, #running-req: 32, #token: 2268, token usage: 0.02, "
                    f"accept len: {accept:.2f}, accept rate: 0.21, cuda graph: False, gen throughput (token/s): 400.57, "
                    f"#queue-req: 0\n")

        done = threading.Event()

        def others() -> None:  # the other ranks' healthy lines, one every 1/8 s
            k = 0
            while not done.wait(0.125):
                with open(log, "a") as f:
                    f.write(line(0, f"TP{1 + k % 7}", 2.5))
                k += 1

        writer = threading.Thread(target=others, daemon=True)
        if busy:
            writer.start()

        with open(log, "a") as f:  # two low lines of the last decode-log intervals...
            f.write(line(8) + line(4))
        # a live server's line lands at any phase of the follower's poll: no sleep in step with it
        time.sleep(0.5 + random.random())
        t0 = time.monotonic()
        with open(log, "a") as f:  # ...and the third, which makes it a collapse
            f.write(line(0))
        while not _Slack.got and time.monotonic() - t0 < 10:
            time.sleep(0.002)
        out.append((_Slack.got[0] - t0) if _Slack.got else float("inf"))
        done.set()
        if busy:
            writer.join()
        stop(proc)
    srv.shutdown()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--idle", type=float, default=20.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="specwatch-bench-"))
    try:
        log = tmp / "backlog.log"
        with open(log, "w") as f:
            for line in mixed_log("0.5.23", a.lines, ranks=2, collapse_after=a.lines // 2):
                f.write(line + "\n")
        n = sum(1 for _ in open(log, "rb"))
        decode = sum(1 for l in open(log, "rb") if b"] Decode batch" in l)
        res: dict = {"lines": n, "decode_lines": decode, "bytes": log.stat().st_size}
        sw = [run_specwatch_backlog(tmp, log, n) for _ in range(a.repeats)]
        sw_cpu = statistics.median(c for c, _, _ in sw)
        res["specwatch"] = {"cpu_s_median": round(sw_cpu, 3), "wall_s_median": round(statistics.median(w for _, w, _ in sw), 3),
                            "lines_per_cpu_s": round(n / sw_cpu), "rss_mb_after_backlog": round(max(r for *_, r in sw) / 2**20, 1)}
        if shutil.which("mtail"):
            mt = [run_mtail_backlog(tmp, log) for _ in range(a.repeats)]
            mt_cpu = statistics.median(c for c, _ in mt)
            res["mtail_one_shot"] = {"cpu_s_median": round(mt_cpu, 3), "wall_s_median": round(statistics.median(w for _, w in mt), 3),
                                     "lines_per_cpu_s": round(n / mt_cpu)}
            res["ratio_specwatch_over_mtail_lines_per_cpu_s"] = round(mt_cpu / sw_cpu, 2)
        else:
            res["mtail_one_shot"] = "not installed (apt-get install mtail)"
        idle, rss = idle_and_rss(tmp, a.idle)
        res["idle"] = {"cpu_percent": round(idle * 100, 3), "rss_mb": round(rss / 2**20, 1), "seconds": a.idle}
        lat = alert_latency(tmp, a.repeats)
        res["collapse_line_to_slack_s"] = {"median": round(statistics.median(lat), 3), "max": round(max(lat), 3)}
        print(json.dumps(res, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
