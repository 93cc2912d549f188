"""`specwatch run` as a real subprocess for tests: config from a dict, output to a file."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout=15.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


class SpecwatchDaemon:
    """One daemon with its own state dir under `tmp_path/name`, following `log`.

    alerts: the `alerts:` section; rules: the `rules:` section; env: extra environment.
    `output()` is everything it printed so far.
    """

    def __init__(self, tmp_path: Path, log: Path, *, name: str = "specwatch", server: str = "gpu-box-1",
                 alerts: dict | None = None, rules: dict | None = None, env: dict | None = None):
        self.dir = Path(tmp_path) / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.state = self.dir / "state"
        self.cfg = self.dir / "config.yaml"
        doc = {"server": server, "logs": [{"path": str(log)}], "follow": {"poll_interval": "0.2s"},
               "metrics": {"listen_port": self.port}, "state_dir": str(self.state), "gpu": {"enabled": False},
               "alerts": alerts or {}}
        if rules:
            doc["rules"] = rules
        self.cfg.write_text(yaml.safe_dump(doc))
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.out_path = self.dir / "output.log"
        self.proc = None

    def start(self) -> "SpecwatchDaemon":
        with open(self.out_path, "a") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "specwatch", "run", "--config", str(self.cfg)],
                                         env=self.env, stdout=out, stderr=subprocess.STDOUT)
        wait_for(self._up, what="/metrics to answer")
        return self

    def _up(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"daemon exited: {self.output()}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/", timeout=1).read()
            return True
        except OSError:
            return False

    def output(self) -> str:
        return self.out_path.read_text() if self.out_path.exists() else ""

    def scrape(self) -> dict[tuple[str, tuple], float]:
        return scrape(self.port)

    def stop(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=20)
        return self.proc.returncode, self.output()
