"""A stand-in SGLang install and launcher for process tests: real processes, real venv.

`make_install` creates a virtual environment (no pip, a second or less) whose site-packages
holds a package named `sglang` with a `launch_server` module and an `sglang-<version>.dist-info`,
plus a `bin/sglang` console script, laid out as pip would. `launch` starts it the way users do,
`python -m sglang.launch_server --model-path ... --speculative-algorithm EAGLE3 ...`, in its own
session. The launcher starts children named the way SGLang's setproctitle names them
(`sglang::scheduler_TP0`, `sglang::detokenizer`: argv[0] of a real Python process), and with
FAKE_SGLANG_HTTP=1 it serves the SGLang 0.5.23 HTTP API of tests/sglang_http.py on its `--port`
with its own flags, `last_gen_throughput` advancing on every poll (a server that is decoding),
and prints decode lines to stdout unless `--log-level` is warning.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
import venv
from pathlib import Path

import psutil

from procs import popen

LAUNCH_SERVER = r'''
import ctypes, os, signal, subprocess, sys, time

argv = sys.argv[1:]

def flag(name, default=None):
    for i, tok in enumerate(argv):
        if tok == name and i + 1 < len(argv):
            return argv[i + 1]
        if tok.startswith(name + "="):
            return tok.split("=", 1)[1]
    return default

die = lambda: ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG: end with the launcher
kids = [
    subprocess.Popen(["sglang::scheduler_TP0", "-c", "import time; time.sleep(3600)"], executable=sys.executable, preexec_fn=die),
    subprocess.Popen(["sglang::detokenizer", "-c", "import time; time.sleep(3600)"], executable=sys.executable, preexec_fn=die),
]

def bye(*_):
    for k in kids:
        k.kill()
    os._exit(0)

signal.signal(signal.SIGTERM, bye)
level = flag("--log-level", "info")
http = os.environ.get("FAKE_SGLANG_HTTP") == "1"
if http:
    sys.path.insert(0, os.environ["FAKE_SGLANG_TESTS"])
    from sglang_http import SGLangHTTP

    srv = SGLangHTTP("0.5.23", port=int(flag("--port", "30000")), advancing=True)
    srv.accept_lifetime = 2.75
    srv.args.update(model_path=flag("--model-path"), port=srv.port, log_level=level,
                    speculative_algorithm=(flag("--speculative-algorithm") or "").upper() or None,
                    speculative_draft_model_path=flag("--speculative-draft-model-path"),
                    speculative_num_steps=int(flag("--speculative-num-steps", "3")),
                    speculative_eagle_topk=int(flag("--speculative-eagle-topk", "1")),
                    speculative_num_draft_tokens=int(flag("--speculative-num-draft-tokens", "4")))
while True:
    if http and level == "info":
        ts = time.strftime("%Y-%m-%d %H:%M:%S")
        print(f"[{ts}] Decode batch, #running-req: 8, #token: 2268, token usage: 0.02, accept len: 2.75, "
              f"accept rate: 0.44, cuda graph: True, gen throughput (token/s): 401.00, #queue-req: 0", flush=True)
    time.sleep(0.2)
'''

CONSOLE_SCRIPT = """#!{python}
import runpy, sys
if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        sys.argv = [sys.argv[0]] + sys.argv[2:]
    runpy.run_module("sglang.launch_server", run_name="__main__")
"""


def make_install(root: Path, version: str = "0.5.6.post2") -> Path:
    """A venv at `root` with a fake `sglang` (dist-info version `version`). Returns bin/python."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    py = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = root / "lib" / py / "site-packages"
    pkg = site / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(LAUNCH_SERVER)
    dist = site / f"sglang-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    (dist / "RECORD").write_text("")
    python = root / "bin" / "python"
    script = root / "bin" / "sglang"
    script.write_text(CONSOLE_SCRIPT.format(python=python))
    script.chmod(0o755)
    return python


def launch(argv: list[str], *, stdout=None, env: dict | None = None) -> subprocess.Popen:
    """Start a launcher in its own session (so `stop` can end it and its children)."""
    env = dict(os.environ, FAKE_SGLANG_TESTS=str(Path(__file__).resolve().parent), **(env or {}))
    return popen(argv, stdout=stdout or subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
                 env=env)


def wait_children(proc: subprocess.Popen, n: int = 2, timeout: float = 10.0) -> list[psutil.Process]:
    """Wait until the launcher has `n` children whose argv[0] starts with `sglang::`."""
    deadline = time.monotonic() + timeout
    while True:
        kids = [c for c in psutil.Process(proc.pid).children()
                if (c.cmdline() or [""])[0].startswith("sglang::")]
        if len(kids) >= n:
            return kids
        assert proc.poll() is None, "fake launcher exited"
        assert time.monotonic() < deadline, "fake launcher did not start its children"
        time.sleep(0.02)


def stop(proc: subprocess.Popen) -> None:
    """Kill the launcher's whole session and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


class Launcher:
    """Starts launchers for one test and kills them all at its end (the `sglang_procs` fixture)."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(self, argv: list[str], *, stdout=None, env: dict | None = None, children: int = 2) -> subprocess.Popen:
        """Launch; wait until its `children` SGLang-named children run (0: do not wait)."""
        p = launch(argv, stdout=stdout, env=env)
        self.started.append(p)
        if children:
            wait_children(p, children)
        return p

    def start_teed(self, argv: list[str], log: Path, *, env: dict | None = None,
                   children: int = 2) -> tuple[subprocess.Popen, int]:
        """`sh -c 'ARGV 2>&1 | tee -a LOG'`, the README's plain-file setup, through a real shell
        pipe: (the shell, the launcher's pid) once the launcher's `children` SGLang-named (or
        vLLM-named) children run. The launcher is the shell's child; `tee` (its sibling) holds
        the log, not the launcher."""
        p = launch(["sh", "-c", f"{shlex.join(argv)} 2>&1 | tee -a {shlex.quote(str(log))}"], env=env)
        self.started.append(p)
        deadline = time.monotonic() + 10.0
        target = os.path.realpath(log)
        while True:
            assert p.poll() is None, "the shell pipeline exited"
            try:
                kids = psutil.Process(p.pid).children()
                # `tee` holds the log open: what ties the launcher to it (a scan before is too early)
                teed = any(f.path == target for k in kids for f in k.open_files())
                for c in kids:
                    if teed and c.cmdline() == argv and sum((k.cmdline() or [""])[0].startswith(("sglang::", "VLLM::"))
                                                            for k in c.children()) >= children:
                        return p, c.pid
            except psutil.Error:
                pass
            assert time.monotonic() < deadline, "the teed launcher did not start its children"
            time.sleep(0.02)

    def stop_all(self) -> None:
        for p in self.started:
            stop(p)
