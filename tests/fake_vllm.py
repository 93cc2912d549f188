"""A stand-in vLLM for process and API tests: real processes, a real venv, real HTTP on 127.0.0.1.

`VllmHTTP` answers like vLLM's OpenAI server (0.8.5-0.33.0): `/health` (200, or `health_status`),
`/version` `{"version": …}`, `/v1/models` `{"object": "list", "data": [{"id", "root",
"max_model_len", …}]}`; every other path 404 (`/server_info` exists only in vLLM's dev mode).
`make_install` creates a venv whose site-packages holds `vllm/entrypoints/openai/api_server.py`
and `vllm-<version>.dist-info`, plus a `bin/vllm` console script (`vllm serve MODEL …`). The
launcher starts an engine-core child named as vLLM's setproctitle names it (`VLLM::EngineCore_DP0`)
and, with FAKE_VLLM_HTTP=1, serves the API above on its `--port`.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
import sys


class VllmHTTP:
    def __init__(self, version: str = "0.33.0", *, model: str = "/models/llama", served: str | None = None,
                 port: int = 0, health_status: int = 200):
        self.version, self.model, self.served = version, model, served or model
        self.health_status = health_status
        self.hits: dict[str, int] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.hits[self.path] = outer.hits.get(self.path, 0) + 1
                if self.path == "/health":
                    return self._send(outer.health_status, b"")
                if self.path == "/version":
                    return self._send(200, json.dumps({"version": outer.version}).encode())
                if self.path == "/v1/models":
                    doc = {"object": "list", "data": [{"id": outer.served, "object": "model", "created": 1,
                                                       "owned_by": "vllm", "root": outer.model, "parent": None,
                                                       "max_model_len": 32768, "permission": []}]}
                    return self._send(200, json.dumps(doc).encode())
                return self._send(404, b'{"detail":"Not Found"}')

            def _send(self, status, body):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "VllmHTTP":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


API_SERVER = r'''
import os, signal, subprocess, sys, time

argv = sys.argv[1:]
kid = subprocess.Popen(["VLLM::EngineCore_DP0", "-c", "import time; time.sleep(3600)"], executable=sys.executable)

def bye(*_):
    kid.kill()
    os._exit(0)

signal.signal(signal.SIGTERM, bye)
if os.environ.get("FAKE_VLLM_HTTP") == "1":
    sys.path.insert(0, os.environ["FAKE_VLLM_TESTS"])
    from fake_vllm import VllmHTTP
    port = int(argv[argv.index("--port") + 1]) if "--port" in argv else 8000
    VllmHTTP(port=port).__enter__()
while True:
    time.sleep(1)
'''

def make_install(root: Path, version: str = "0.33.0") -> Path:
    """A venv at `root` (tests/fake_sglang.py's, with its stand-in sglang beside) with a fake
    `vllm` (dist-info version `version`) and its `bin/vllm` console script. Returns bin/python."""
    import fake_sglang  # not at import time: the launcher imports this module without psutil

    python = fake_sglang.make_install(root)
    site = python.parent.parent / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    pkg = site / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (site / "vllm", site / "vllm" / "entrypoints", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(API_SERVER)
    dist = site / f"vllm-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    script = python.parent / "vllm"
    script.write_text(fake_sglang.CONSOLE_SCRIPT.format(python=python).replace(
        "sglang.launch_server", "vllm.entrypoints.openai.api_server"))
    script.chmod(0o755)
    return python
