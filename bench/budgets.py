"""Issue 9's budgets, each measured against a peer or a limit on this machine, in one run.

1. backlog: lines per CPU-second (user+sys of the whole process, medians of --repeats paired runs)
   of `specwatch replay --json FILE`, of `specwatch run` catching up on a FILE that already holds
   the whole log (CPU until /metrics counts every line; start-up included, and reported on its own
   from a run on an empty file), and of `mtail --one_shot --progs bench/sglang.mtail --logs FILE`.
   Budget: specwatch >= 4x mtail, replay's peak RSS <= 50 MB. Files: `bench/gen_sglang_log.py FILE MB`
   for each of --mb (default 50 and 200), healthy and with `--collapse-at 0.5` (every rank collapsed
   from the middle: an incident log), and bench/backlog.py's
   mixed_log (--mixed-lines). Beside them, the floor of the chunk-scanner design: start-up plus
   `CANONICAL_LINES` over the file with nothing done per match (SCAN_FLOOR).
2. idle: `specwatch run` (process and API sources on, GPU off) beside a live fake SGLang server
   (tests/fake_sglang.py: real processes, SGLang's HTTP API), 8 DP ranks each appending one decode
   line a second to the followed log, among --others `sleep` processes, over --idle-seconds; the
   server tied to its config by its server_api URL (`--tie api`, the default config) or by
   `process.servers` (`--tie port`). Budget: <= 0.1 % of one core, RSS <= 45 MB (without a GPU).
   /metrics is scraped as Prometheus does every --scrape-every seconds (15; 0: not at all). Also each thread's share (`threads_pct_of_core`).
3. latency: collapse line appended -> Slack POST received, p50 and p99: on a quiet log
   (bench/backlog.py's alert_latency, max(--repeats, 5) runs) and over --collapses whole-server
   collapses on a busy log (8 ranks x --busy-rate decode lines a second, each line its own write).
   Budget: p50 <= 0.25 s, p99 <= 1 s.

Usage: python bench/budgets.py [--mb 50,200] [--repeats 3] [--idle-seconds 600] [--parts backlog,idle,latency]
       [--tie api|port] [--collapses 30] [--busy-rate 20]
Needs the Debian package `mtail` for the backlog part. Prints a table, then the figures as JSON.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import psutil

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import backlog  # noqa: E402  (also puts tests/ on sys.path)
import fake_sglang  # noqa: E402
from procs import free_port, scrape  # noqa: E402
from sglang_lines import decode_line, mixed_log  # noqa: E402

MTAIL_PROG = BENCH / "sglang.mtail"
BACKLOG_RATIO, REPLAY_RSS_MB, IDLE_CPU_PCT, IDLE_RSS_MB = 4.0, 50.0, 0.1, 45.0
LATENCY_P50_S, LATENCY_P99_S = 0.25, 1.0
RANKS = 8


def median(xs) -> float:
    return statistics.median(list(xs))


# --- backlog -------------------------------------------------------------------------------------

def timed(argv: list[str], out: Path) -> tuple[float, float]:
    """Run argv to completion, stdout to `out`: (CPU seconds of the process and its children, wall s);
    its peak RSS (MB) in `timed.rss_mb`."""
    t0 = time.monotonic()
    with open(out, "wb") as f:
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.DEVNULL,
                             env=dict(os.environ, PYTHONPATH=str(BENCH.parent)))
        _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise RuntimeError(f"{' '.join(argv)} exited with {p.returncode}")
    timed.rss_mb = ru.ru_maxrss / 1024  # KiB on Linux
    return ru.ru_utime + ru.ru_stime, time.monotonic() - t0


def replay(log: Path, out: Path, n: int) -> tuple[float, float, float]:
    """(CPU s, wall s, peak RSS MB) of `specwatch replay --json LOG`."""
    cpu, wall = timed([sys.executable, "-m", "specwatch", "replay", "--json", str(log)], out)
    total = json.loads(out.read_text())["lines"]["total"]
    if total != n:
        raise RuntimeError(f"specwatch replay read {total} lines of {n}")
    return cpu, wall, timed.rss_mb


def mtail(log: Path, out: Path) -> tuple[float, float, int]:
    """(CPU s, wall s, decode lines the program matched)."""
    cpu, wall = timed(["mtail", "--one_shot", "--progs", str(MTAIL_PROG), "--logs", str(log)], out)
    doc = json.loads(out.read_text())
    matched = sum(v["Value"]["Value"] for m in doc.get("sglang_decode_batches_total", [])
                  for v in m.get("LabelValues", []))
    return cpu, wall, int(matched)


# The least any reader built on specwatch's chunk scanner can cost: the interpreter, specwatch's
# imports, and `CANONICAL_LINES` over the file in replay's reads, with nothing done per match.
SCAN_FLOOR = """
import sys
import specwatch.cli, specwatch.replay, specwatch.core.pipeline
from specwatch.engines.sglang.log import CANONICAL_LINES
from specwatch.sources.filestream import READ_BYTES
n = 0
with open(sys.argv[1], encoding="utf-8", errors="replace") as f:
    rest = ""
    while chunk := f.read(READ_BYTES):
        text = rest + chunk
        cut = text.rfind("\\n") + 1
        text, rest = text[:cut], text[cut:]
        for m in CANONICAL_LINES.finditer(text):
            m.groups()
            n += 1
print(n)
"""


def scan_floor(log: Path, out: Path) -> tuple[float, float]:
    """(CPU s, wall s) of SCAN_FLOOR on LOG."""
    return timed([sys.executable, "-c", SCAN_FLOOR, str(log)], out)


def catch_up(tmp: Path, log: Path, n: int) -> tuple[float, float, float, float]:
    """`specwatch run` on a file holding n lines: (CPU s, wall s, RSS MB) when /metrics counts all n,
    and RSS MB 2 s later.

    Polls every 0.2 s (a scrape costs the daemon CPU); the catch-up is long next to that."""
    tmp.mkdir()  # its own state dir: no checkpoint of an earlier run
    proc, port = backlog.start_specwatch(backlog.write_config(tmp, log))
    try:
        ps = psutil.Process(proc.pid)
        t0 = time.monotonic()
        while backlog.scrape_lines(port) < n:
            if proc.poll() is not None:
                raise RuntimeError(f"specwatch run exited with {proc.returncode} during catch-up")
            time.sleep(0.2)
        cpu, wall, rss = backlog.cpu_seconds(ps), time.monotonic() - t0, ps.memory_info().rss / 2**20
        time.sleep(2)  # the round that read the backlog ends, and hands the freed heap back
        return cpu, wall, rss, ps.memory_info().rss / 2**20
    finally:
        backlog.stop(proc)


def bench_file(tmp: Path, log: Path, repeats: int) -> dict:
    """Paired runs of the three readers on one file (interleaved so drift hits all alike)."""
    n = sum(1 for _ in open(log, "rb"))
    decode = sum(1 for line in open(log, "rb") if b"] Decode batch" in line)
    out = tmp / "out"
    runs: dict[str, list] = {"replay": [], "run": [], "mtail": [], "scan_floor": []}
    for i in range(repeats):
        runs["scan_floor"].append(scan_floor(log, out))
        runs["replay"].append(replay(log, out, n))
        runs["run"].append(catch_up(tmp / f"{log.stem}-run{i}", log, n))
        runs["mtail"].append(mtail(log, out))
        print(f"  {log.name} #{i + 1}: replay {runs['replay'][-1][0]:.2f}, run {runs['run'][-1][0]:.2f}, "
              f"mtail {runs['mtail'][-1][0]:.2f} CPU-s", file=sys.stderr)
    res: dict = {"file": log.name, "lines": n, "decode_lines": decode, "mb": round(log.stat().st_size / 2**20, 1),
                 "mtail_matched_decode_lines": runs["mtail"][0][2]}
    for name, rs in runs.items():
        cpu = median(r[0] for r in rs)
        res[name] = {"cpu_s": round(cpu, 3), "wall_s": round(median(r[1] for r in rs), 3),
                     "lines_per_cpu_s": round(n / cpu), "cpu_s_runs": [round(r[0], 3) for r in rs]}
    res["replay"]["rss_mb"] = round(max(r[2] for r in runs["replay"]), 1)
    res["run"]["rss_mb"] = round(max(r[2] for r in runs["run"]), 1)
    res["run"]["rss_after_mb"] = round(max(r[3] for r in runs["run"]), 1)
    for name in ("replay", "run", "scan_floor"):
        res[name]["x_mtail"] = round(res["mtail"]["cpu_s"] / res[name]["cpu_s"], 2)
    return res


def start_up(tmp: Path, repeats: int) -> dict:
    empty = tmp / "empty.log"
    empty.write_text("")
    rs = [catch_up(tmp / f"empty-run{i}", empty, 0) for i in range(repeats)]
    return {"cpu_s": round(median(r[0] for r in rs), 3), "wall_s": round(median(r[1] for r in rs), 3),
            "rss_mb": round(median(r[2] for r in rs), 1)}


# --- idle beside a live server -------------------------------------------------------------------

def write_ranks(log: Path, stop: threading.Event, rate: float = 1.0, vary: bool = False) -> None:
    """8 DP ranks, each `rate` decode lines a second: at 1 a second spread over the second as separate
    processes print; above that each rank's lines of a tenth of a second written together. `vary`
    (at 1 a second): each line's accept length and running requests drawn anew, as a server's move."""
    if rate > 1:
        return _write_busy(log, stop, rate)
    rnd = random.Random(7)
    with open(log, "a", buffering=1) as f:
        tick = time.monotonic()
        while not stop.is_set():
            for r in range(RANKS):
                stop.wait(max(0.0, tick + r / RANKS - time.monotonic()))
                ts = time.strftime("%Y-%m-%d %H:%M:%S")
                running, accept = (rnd.randint(1, 64), round(rnd.uniform(2.2, 3.4), 2)) if vary else (8, 2.75)
                f.write(decode_line("0.5.23", ts=ts, rank={"DP": r, "TP": r}, running=running,
                                    accept_len=accept)[0] + "\n")
            tick += 1.0


def _write_busy(log: Path, stop: threading.Event, rate: float) -> None:
    stamp = "2000-01-01 00:00:00"
    lines = [decode_line("0.5.23", ts=stamp, rank={"DP": r, "TP": r}, running=8, accept_len=2.75)[0] + "\n"
             for r in range(RANKS)]
    with open(log, "a") as f:
        tick, owed = time.monotonic(), 0.0
        while not stop.wait(max(0.0, tick - time.monotonic())):
            tick += 0.1
            owed += rate * 0.1
            k, owed = int(owed), owed - int(owed)
            ts = time.strftime("%Y-%m-%d %H:%M:%S")
            f.write("".join(line.replace(stamp, ts) for line in lines) * k)
            f.flush()


# Loaded by the measured daemon only (a `sitecustomize` on its PYTHONPATH): each thread's kernel
# name (`/proc/self/task/TID/comm`, 15 bytes: proc(5)) set to the end of its Python name, so /proc
# tells the threads apart. No import beyond `threading`: the RSS figure stays the daemon's.
NAME_THREADS = """\
import threading
_inner = threading.Thread._bootstrap_inner
def _named(self):
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
            f.write(self.name.removeprefix("specwatch-")[:15])
    except OSError:
        pass
    _inner(self)
threading.Thread._bootstrap_inner = _named
"""


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of each live thread of `pid`, by kernel name (`/proc/PID/task/TID/schedstat`,
    first field: nanoseconds on a CPU), threads of one name summed."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            ns = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
        out[name] = out.get(name, 0.0) + ns / 1e9
    return out


def wait_until(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def sample(port: int, name: str) -> float | None:
    try:
        return scrape(port).get((name, (("server", "bench"),)))
    except OSError:
        return None


@contextlib.contextmanager
def live_daemon(tmp: Path, others: int, rate: float = 1.0, tie: str = "api",
                vary: bool = False) -> Iterator[tuple[subprocess.Popen, int]]:
    """`specwatch run` (process and API sources on, GPU off) beside a live fake SGLang server whose
    8 DP ranks each append `rate` decode lines a second, among `others` `sleep` processes; yields
    (daemon, metrics port) once it sees the server and is past start-up. Stops everything after.
    vary: `write_ranks`' varying values.
    tie: how the process scan knows the server: "api" (the default config, `process.servers`
    empty: by its `server_api` URL's port), "port" (`process.servers: {PORT: bench}`)."""
    sleepers: list[subprocess.Popen] = []
    server = daemon = None
    stop = threading.Event()
    writer = threading.Thread(target=write_ranks, args=(tmp / "sglang.log", stop, rate, vary), daemon=True)
    try:
        for _ in range(others):  # appended one by one: a failed start still cleans up the others
            sleepers.append(subprocess.Popen(["sleep", "infinity"]))
        python = fake_sglang.make_install(tmp / "sglang-venv", "0.5.23")
        sglang_port = free_port()
        server = fake_sglang.launch(
            [str(python), "-m", "sglang.launch_server", "--model-path", "/models/meta-llama/Llama-3.1-8B-Instruct",
             "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/models/eagle3-llama3.1-8b",
             "--port", str(sglang_port)], env={"FAKE_SGLANG_HTTP": "1"})
        fake_sglang.wait_children(server)
        wait_until(lambda: _answers(f"http://127.0.0.1:{sglang_port}/health"), 30, "the fake SGLang API")
        writer.start()
        cfg = tmp / "idle.yaml"
        cfg.write_text(f"server: bench\nlogs:\n  - path: {tmp / 'sglang.log'}\nmetrics:\n  listen_port: 0\n"
                       f"state_dir: {tmp / 'idle-state'}\ngpu:\n  enabled: false\n"
                       + (f"process:\n  servers: {{{sglang_port}: bench}}\n" if tie == "port" else "") +
                       f"server_api:\n  url: http://127.0.0.1:{sglang_port}\n")
        names = tmp / "name-threads"
        names.mkdir(exist_ok=True)
        (names / "sitecustomize.py").write_text(NAME_THREADS)
        daemon, port = backlog.start_specwatch(cfg, path=(str(names),))
        wait_until(lambda: sample(port, "specwatch_server_up") == 1 and sample(port, "specwatch_server_api_up") == 1,
                   60, "specwatch to see the server (process scan and API)")
        yield daemon, port
    finally:
        stop.set()
        if daemon:
            backlog.stop(daemon)
        if server:
            fake_sglang.stop(server)
        for p in sleepers:
            p.kill()
            p.wait()


PROM_ACCEPT = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"


def _scraper(port: int, every: float, stop: threading.Event) -> None:
    """GET /metrics as Prometheus does (its Accept header, gzip) every `every` seconds."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                 headers={"Accept": PROM_ACCEPT, "Accept-Encoding": "gzip"})
    while not stop.wait(every):
        with contextlib.suppress(OSError), urllib.request.urlopen(req, timeout=10) as r:
            r.read()


def idle(tmp: Path, seconds: float, others: int, tie: str = "api", scrape_every: float = 15.0) -> dict:
    with live_daemon(tmp, others, tie=tie) as (daemon, port):
        stop = threading.Event()
        if scrape_every > 0:  # the idle budget counts a scrape at Prometheus' usual 15 s
            threading.Thread(target=_scraper, args=(port, scrape_every, stop), daemon=True).start()
        lines0 = backlog.scrape_lines(port)
        time.sleep(10)  # past start-up: first scans, polls and the diagnosis of the server's settings
        ps = psutil.Process(daemon.pid)
        cpu0, t0, rss, threads0 = backlog.cpu_seconds(ps), time.monotonic(), [], thread_cpu(daemon.pid)
        while (left := t0 + seconds - time.monotonic()) > 0:
            time.sleep(min(5.0, left))
            rss.append(ps.memory_info().rss / 2**20)
        cpu, wall = backlog.cpu_seconds(ps) - cpu0, time.monotonic() - t0
        stop.set()
        threads = {name: round(100 * (t - threads0.get(name, 0.0)) / wall, 4)
                   for name, t in sorted(thread_cpu(daemon.pid).items())}
        processes = len(psutil.pids())  # the bench's and any other load's
        read = backlog.scrape_lines(port) - lines0
        up = sample(port, "specwatch_server_up"), sample(port, "specwatch_server_api_up")
        if up != (1, 1) or read < RANKS * seconds * 0.9:
            raise RuntimeError(f"specwatch did not keep up with the server: up/api_up {up}, {read} lines read")
        return {"seconds": round(wall), "others": others, "tie": tie, "scrape_every_s": scrape_every, "processes_on_box": processes, "cpu_pct_of_core": round(100 * cpu / wall, 3),
                "rss_mb": round(rss[-1], 1), "rss_mb_max": round(max(rss), 1), "log_lines_read": read,
                "threads_pct_of_core": threads}


class _Slack(backlog._Slack):
    """A Slack-compatible endpoint keeping the arrival time of each POST that names the collapse."""

    got: list[float] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if b"AcceptanceCollapse" in body:
            _Slack.got.append(time.monotonic())
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


def collapse_latency(tmp: Path, runs: int, rate: float) -> list[float]:
    """Seconds from the line that makes a collapse appended to the log to the Slack POST of the
    AcceptanceCollapse alert, one per run (a fresh daemon each: no history, no group_interval
    between runs). 8 ranks each write `rate` decode lines a second, each line on its own `write`
    (as separate rank processes print), evenly spread; after 2-3 s of healthy lines every rank's
    turn low (accept len 1.05: the whole server collapses, as in an incident log; one rank alone
    is a RankDisagreement, which mutes its collapse), and rank 0's `rules.collapse.min_batches`-th
    low line (3, the default), the first to complete a run, is the one timed: at 20 lines a second
    a run takes 0.1 s, so its first line cannot be the only one read in time."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Slack)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/services/T/B/x"
    out = []
    try:
        for i in range(runs):
            log = tmp / f"busy-{i}.log"
            log.write_text("")
            proc, port = backlog.start_specwatch(backlog.write_config(tmp, log, url))
            try:
                wait_until(lambda: backlog.scrape_lines(port) >= 0, 30, "specwatch's /metrics")
                _Slack.got.clear()
                fired: list[float] = []
                stop = threading.Event()
                writer = threading.Thread(target=_write_collapse, args=(log, rate, 2 + random.random(), fired, stop),
                                          daemon=True)
                writer.start()
                wait_until(lambda: bool(fired), 30, "the collapse line")
                deadline = fired[0] + 10
                while not _Slack.got and time.monotonic() < deadline:
                    time.sleep(0.002)
                out.append(_Slack.got[0] - fired[0] if _Slack.got else math.inf)
                stop.set()
                writer.join()
            finally:
                backlog.stop(proc)
            print(f"  busy collapse #{i + 1}: {out[-1]:.3f} s", file=sys.stderr)
    finally:
        srv.shutdown()
    return out


def _write_collapse(log: Path, rate: float, healthy_s: float, fired: list[float], stop: threading.Event,
                    low_run: int = 3) -> None:
    """8 ranks' decode lines at `rate` a second each, one line per write, evenly spread; every
    rank's lines low after `healthy_s` seconds; `fired` gets the monotonic time just before rank
    0's `low_run`-th low line was written. Runs until `stop`."""
    step = 1.0 / (rate * RANKS)
    t0 = time.monotonic()
    k = lows = 0
    with open(log, "a") as f:
        while not stop.is_set():
            due = t0 + k * step
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
            rank = k % RANKS
            low = (k - rank) * step >= healthy_s  # from a round of ranks on: rank 0's run is the first
            line = decode_line("0.5.23", ts=time.strftime("%Y-%m-%d %H:%M:%S"), rank={"DP": rank, "TP": rank},
                               running=32, accept_len=1.05 if low else 2.75)[0] + "\n"
            if low and rank == 0:
                lows += 1
                if lows == low_run:
                    fired.append(time.monotonic())
            f.write(line)
            f.flush()
            k += 1


def percentile(xs: list[float], q: float) -> float:
    """The q-th percentile (0-100) of xs, interpolated between the closest ranks (numpy's default)."""
    xs = sorted(xs)
    at = (len(xs) - 1) * q / 100
    lo = math.floor(at)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (at - lo)


def _answers(url: str) -> bool:
    try:
        return urllib.request.urlopen(url, timeout=1).status == 200
    except OSError:
        return False


# --- report --------------------------------------------------------------------------------------

def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def table(res: dict) -> str:
    rows = []
    for key in [k for k in res if k.startswith(("healthy-", "incident-"))] + ["mixed_log"]:
        if key in res:
            f = res[key]
            rows.append(f"backlog {f['file']}, medians of {res['repeats']}: {f['lines']:,} lines ({f['decode_lines']:,} decode), {f['mb']} MB; "
                        f"mtail matched {f['mtail_matched_decode_lines']:,} decode lines")
            rows.append(f"  {'':28}{'CPU-s':>8}{'wall-s':>8}{'lines/CPU-s':>13}{'x mtail':>9}")
            for name, label in (("replay", "specwatch replay --json"), ("run", "specwatch run catch-up"),
                                ("mtail", "mtail --one_shot"), ("scan_floor", "floor: start-up + scan only")):
                r = f[name]
                x = r.get("x_mtail")
                budget = f"  {verdict(x >= BACKLOG_RATIO)} (>= {BACKLOG_RATIO:g}x)" if x and name != "scan_floor" else ""
                rows.append(f"  {label:28}{r['cpu_s']:8.2f}{r['wall_s']:8.2f}{r['lines_per_cpu_s']:13,}"
                            + (f"{x:9.2f}{budget}" if x else ""))
            rows.append(f"  replay peak RSS {f['replay']['rss_mb']} MB {verdict(f['replay']['rss_mb'] <= REPLAY_RSS_MB)} "
                        f"(<= {REPLAY_RSS_MB:g} MB); run RSS: {f['run']['rss_mb']} MB when caught up, "
                        f"{f['run']['rss_after_mb']} MB 2 s later")
    if "start_up" in res:
        s = res["start_up"]
        rows.append(f"specwatch run start-up (empty file): {s['cpu_s']:.2f} CPU-s, {s['wall_s']:.2f} s, RSS {s['rss_mb']} MB")
    if "idle" in res:
        i = res["idle"]
        rows.append(f"idle beside a server (tied by {i['tie']}), 8 ranks x 1 line/s, a scrape every {i.get('scrape_every_s', 0):g} s, {i['others']} other processes "
                    f"({i['processes_on_box']} on the box), {i['seconds']} s: "
                    f"{i['cpu_pct_of_core']:.3f} % of a core {verdict(i['cpu_pct_of_core'] <= IDLE_CPU_PCT)} "
                    f"(<= {IDLE_CPU_PCT} %), RSS {i['rss_mb']} MB (max {i['rss_mb_max']}) "
                    f"{verdict(i['rss_mb_max'] <= IDLE_RSS_MB)} (<= {IDLE_RSS_MB:g} MB)")
    for key in ("latency", "latency_busy"):
        if key in res:
            lat = res[key]
            ok = lat["p50_s"] <= LATENCY_P50_S and lat["p99_s"] <= LATENCY_P99_S
            rows.append(f"collapse line -> Slack POST, {lat['log']}, {lat['runs']} collapses: p50 {lat['p50_s']:.3f} s, "
                        f"p99 {lat['p99_s']:.3f} s (max {lat['max_s']:.3f}) {verdict(ok)} "
                        f"(p50 <= {LATENCY_P50_S} s, p99 <= {LATENCY_P99_S:g} s)")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", default="50,200", help="sizes of the gen_sglang_log.py files (MB, comma-separated): "
                                                   "each healthy and with every rank collapsed from its middle")
    ap.add_argument("--mixed-lines", type=int, default=200_000, help="lines of bench/backlog.py's mixed_log file")
    ap.add_argument("--repeats", type=int, default=3, help="paired runs per measurement (medians reported)")
    ap.add_argument("--idle-seconds", type=float, default=600)
    ap.add_argument("--scrape-every", type=float, default=15.0,
                    help="seconds between /metrics scrapes during the idle part (0: none)")
    ap.add_argument("--others", type=int, default=1000, help="`sleep` processes beside the server when idle")
    ap.add_argument("--parts", default="backlog,idle,latency", help="comma-separated subset to run")
    ap.add_argument("--tie", choices=("api", "port"), default="api",
                    help="idle: the server tied by its server_api URL (the default config) or by process.servers")
    ap.add_argument("--collapses", type=int, default=30, help="collapses timed on the busy log (one daemon each)")
    ap.add_argument("--busy-rate", type=float, default=20.0, help="decode lines a second of each rank on the busy log")
    a = ap.parse_args()
    parts = set(a.parts.split(","))
    if unknown := parts - {"backlog", "idle", "latency"}:
        ap.error(f"unknown part(s) {', '.join(sorted(unknown))}")
    if "backlog" in parts and not shutil.which("mtail"):
        print("bench/budgets.py: `mtail` is not on PATH: the backlog budget is a ratio against it "
              "(Debian/Ubuntu: apt-get install mtail), or leave it out: --parts idle,latency", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("bench/budgets.py: terminated"))  # clean up as on Ctrl-C
    res: dict = {"cpus": os.cpu_count(), "repeats": a.repeats}
    # bytecode as `pip install` leaves it: without it (PYTHONDONTWRITEBYTECODE, a read-only checkout)
    # every start compiles all of specwatch's modules again (about 0.12 CPU-s)
    compileall.compile_dir(str(BENCH.parent / "specwatch"), quiet=1)
    tmp = Path(tempfile.mkdtemp(prefix="specwatch-budgets-"))
    try:
        if "backlog" in parts:
            for mb in a.mb.split(","):
                for kind, extra in (("healthy", []), ("incident", ["--collapse-at", "0.5"])):
                    gen = tmp / f"{kind}-{mb}.log"
                    subprocess.run([sys.executable, str(BENCH / "gen_sglang_log.py"), str(gen), mb, *extra],
                                   check=True, stdout=subprocess.DEVNULL)
                    res[f"{kind}-{mb}"] = bench_file(tmp, gen, a.repeats)
                    gen.unlink()
            mixed = tmp / "mixed.log"
            with open(mixed, "w") as f:  # as bench/backlog.py writes it
                f.writelines(line + "\n" for line in
                             mixed_log("0.5.23", a.mixed_lines, ranks=2, collapse_after=a.mixed_lines // 2))
            res["mixed_log"] = bench_file(tmp, mixed, a.repeats)
            res["start_up"] = start_up(tmp, a.repeats)
        if "idle" in parts:
            res["idle"] = idle(tmp, a.idle_seconds, a.others, a.tie, a.scrape_every)
        if "latency" in parts:
            quiet = backlog.alert_latency(tmp, max(a.repeats, 5))
            busy = collapse_latency(tmp, a.collapses, a.busy_rate)
            for key, lat, where in (("latency", quiet, "a quiet log"),
                                    ("latency_busy", busy, f"a busy log, {RANKS} ranks x {a.busy_rate:g} lines/s")):
                res[key] = {"log": where, "p50_s": round(median(lat), 3), "p99_s": round(percentile(lat, 99), 3),
                            "max_s": round(max(lat), 3), "runs": len(lat), "runs_s": [round(x, 3) for x in lat]}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(res))
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
