"""A stand-in SGLang install and launcher for process tests: real processes, real venv.

`make_install` creates a virtual environment (no pip, a second or less) whose site-packages
holds a package named `sglang` with a `launch_server` module and an `sglang-<version>.dist-info`,
plus a `bin/sglang` console script, laid out as pip would. `launch` starts it the way users do,
`python -m sglang.launch_server --model-path ... --speculative-algorithm EAGLE3 ...`, in its own
session. The launcher starts children named the way SGLang's setproctitle names them
(`sglang::scheduler_TP0`, `sglang::detokenizer`: argv[0] of a real Python process), and with
FAKE_SGLANG_HTTP=1 it serves `/server_info`, `/model_info` and `/health` on its `--port`, shaped
like SGLang 0.5.23's (sglang.md §3), with `last_gen_throughput` advancing on every poll (a
server that is decoding), and prints decode lines to stdout unless `--log-level` is warning.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import venv
from pathlib import Path

import psutil

LAUNCH_SERVER = r'''
import json, os, signal, subprocess, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

argv = sys.argv[1:]

def flag(name, default=None):
    for i, tok in enumerate(argv):
        if tok == name and i + 1 < len(argv):
            return argv[i + 1]
        if tok.startswith(name + "="):
            return tok.split("=", 1)[1]
    return default

kids = [
    subprocess.Popen(["sglang::scheduler_TP0", "-c", "import time; time.sleep(3600)"], executable=sys.executable),
    subprocess.Popen(["sglang::detokenizer", "-c", "import time; time.sleep(3600)"], executable=sys.executable),
]

def bye(*_):
    for k in kids:
        k.kill()
    os._exit(0)

signal.signal(signal.SIGTERM, bye)
port = int(flag("--port", "30000"))
level = flag("--log-level", "info")
polls = [0]

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, doc, code=200):
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            return self.reply({})
        if self.path == "/server_info":
            polls[0] += 1
            args = {"model_path": flag("--model-path"), "tp_size": int(flag("--tp-size", "1")), "dp_size": 1,
                    "pp_size": 1, "port": port, "speculative_algorithm": (flag("--speculative-algorithm") or "").upper() or None,
                    "speculative_draft_model_path": flag("--speculative-draft-model-path"),
                    "speculative_num_steps": int(flag("--speculative-num-steps", "3")),
                    "speculative_eagle_topk": int(flag("--speculative-eagle-topk", "1")),
                    "speculative_num_draft_tokens": int(flag("--speculative-num-draft-tokens", "4")),
                    "decode_log_interval": 40, "log_level": level, "disaggregation_mode": "null"}
            state = dict(args, last_gen_throughput=400.0 + polls[0], avg_spec_accept_length=2.75,
                         memory_usage={"weight": 15.1, "kvcache": 52.3, "graph": 1.2, "token_capacity": 411528})
            return self.reply(dict(args, internal_states=[state], version=os.environ.get("FAKE_SGLANG_VERSION", "0.5.6.post2"),
                                   startup_time=START))
        if self.path == "/model_info":
            return self.reply({"model_path": flag("--model-path"), "is_generation": True,
                               "model_type": "llama", "architectures": ["LlamaForCausalLM"]})
        self.reply({"detail": "Not Found"}, 404)

START = time.time()
if os.environ.get("FAKE_SGLANG_HTTP") == "1":
    srv = ThreadingHTTPServer(("127.0.0.1", port), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
i = 0
while True:
    if level == "info" and os.environ.get("FAKE_SGLANG_HTTP") == "1":
        i += 1
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    return subprocess.Popen(argv, stdout=stdout or subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True, env=dict(os.environ, **(env or {})))


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
