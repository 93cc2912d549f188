"""Real processes and sockets the tests drive: `specwatch run` subprocesses, a systemd-style
notify socket, polling helpers. Shared by the daemon, systemd and Prometheus tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from specwatch.system.childproc import die_with_parent

SAMPLES = Path(__file__).resolve().parent / "data" / "samples"


_reserved: list[socket.socket] = []


def free_port() -> int:
    """A TCP port on 127.0.0.1 that no other process or test can take: it stays bound here (not
    listening: connections are refused, as to a receiver that is down) until `release_ports()`.

    The kernel never hands a bound port to another bind(0) or outgoing connection, and the server a
    test starts on it can still bind it: both sockets set SO_REUSEADDR and only the server listens
    (Python's http.server and wsgiref, Go's net.Listen for Prometheus and Alertmanager all set it).
    Bind-close-return let another process take the port in between (issue 9 item 10).
    """
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    _reserved.append(s)
    return s.getsockname()[1]


def release_ports(keep: int = 0) -> None:
    """Close the reservations of `free_port()` but the first `keep` (conftest: after each test)."""
    while len(_reserved) > keep:
        _reserved.pop().close()


def popen(argv, **kw) -> subprocess.Popen:
    """`subprocess.Popen` of a child that is SIGKILLed when the test process (the calling thread)
    ends, however it ends: a killed or timed-out test run leaves no daemon behind (a
    parent-death signal, specwatch/system/childproc.py; the pid is the command's)."""
    proc = subprocess.Popen(wrapped := die_with_parent(argv, signal.SIGKILL), **kw)
    # The wrapper sets the signal, then execs argv: until then /proc shows the wrapper's command
    # line (which names argv), and a process scan started at once would see that process.
    if wrapped != list(argv):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
                    now = f.read().split(b"\0")[:-1]
                # empty: inside an exec (the wrapper's own too: Popen returns once its
                # close-on-exec pipe closes, before the kernel sets the new command line)
                if now and now != [os.fsencode(a) for a in wrapped]:
                    break  # exec'd
            except OSError:
                break
            time.sleep(0.002)
    return proc


def popen_at(pid: int, start, tries: int = 50) -> subprocess.Popen | None:
    """`start()` (a Popen) made to run as process `pid`, a free pid: the pid namespace's last pid
    set to the one before (`/proc/sys/kernel/ns_last_pid`, proc(5): root only), then the fork. A
    process forking in between gets it: that child is killed and the next try made. None when
    the file cannot be written or no try won."""
    for _ in range(tries):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(pid - 1))
        except OSError:
            return None
        proc = start()
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


def run(argv, **kw) -> subprocess.CompletedProcess:
    """`subprocess.run` whose child dies with the test process (see `popen`)."""
    return subprocess.run(die_with_parent(argv, signal.SIGKILL), **kw)


def wait_for(pred, timeout=15.0, what="condition", interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """/metrics as {(sample name, sorted label items): value}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def terminate(proc: subprocess.Popen | None, timeout: float = 10) -> None:
    """SIGTERM a helper server (Prometheus, Alertmanager), SIGKILL it after `timeout` s."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def rank_labels(server="gpu-box-1", tp="0", dp=""):
    return tuple(sorted({"server": server, "dp_rank": dp, "tp_rank": tp, "pp_rank": "", "ep_rank": "", "engine": "sglang"}.items()))


def decode_line(accept: float, ts: str, rank: str = "TP0", running: int = 32, thr: float = 400.57,
                day: str = "2026-02-23") -> str:
    return (f"[{day} {ts} {rank}] Decode batch, #running-req: {running}, #token: 2268, token usage: 0.02, "
            f"accept len: {accept:.2f}, accept rate: 0.21, cuda graph: False, "
            f"gen throughput (token/s): {thr:.2f}, #queue-req: 0\n")


class SpecwatchProcess:
    """`python -m specwatch run --config CFG` (or another argv) with its output in a file."""

    def __init__(self, config: Path, port: int, env: dict[str, str] | None = None,
                 argv: list[str] | None = None, host: str = "127.0.0.1"):
        self.config = config
        self.port = port
        self.host = host  # its metrics.listen_address
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.argv = argv or [sys.executable, "-m", "specwatch", "run", "--config", str(config)]
        self.out_path = config.with_name(config.stem + f".{port}.out")
        self.proc: subprocess.Popen | None = None

    def start(self, wait: bool = True) -> "SpecwatchProcess":
        out = open(self.out_path, "a")
        self.proc = popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, text=True)
        out.close()
        if wait:
            wait_for(self._up, what=f"/metrics on port {self.port}")
        return self

    @property
    def output(self) -> str:
        return self.out_path.read_text()

    def _up(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"specwatch exited {self.proc.returncode}: {self.output}")
        try:
            urllib.request.urlopen(f"http://{self.host}:{self.port}/", timeout=1).read()
            return True
        except OSError:
            return False

    def scrape(self):
        return scrape(self.port)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"specwatch did not stop within {timeout}s: {self.output}") from None


class NotifySocket:
    """An AF_UNIX datagram socket standing where systemd's $NOTIFY_SOCKET would: collects every
    message as (monotonic time, {KEY: value})."""

    def __init__(self, path: Path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._recv, daemon=True)
        self._thread.start()

    def _recv(self) -> None:
        while not self._closed:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().split("\n") if line)
            self.messages.append((time.monotonic(), fields))

    def with_key(self, key: str, value: str | None = None) -> list[tuple[float, dict[str, str]]]:
        return [(t, m) for t, m in list(self.messages) if key in m and (value is None or m[key] == value)]

    def wait(self, key: str, value: str | None = None, count: int = 1, timeout: float = 15.0):
        return wait_for(lambda: len(m := self.with_key(key, value)) >= count and m, timeout,
                        what=f"{count} notify message(s) with {key}={value or '*'}; got {self.messages}")

    def close(self) -> None:
        self._closed = True
        self._thread.join(2)
        self.sock.close()
