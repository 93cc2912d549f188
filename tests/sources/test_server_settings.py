"""Server settings from a launch command line and from a real /server_info endpoint."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from specwatch.probes.base import ServerSettings
from specwatch.sources.server_settings import from_cmdline, from_server_info


def test_command_line_flags_aliases_and_prefixes():
    argv = ["python3", "-m", "sglang.launch_server", "--model", "/m/Kimi-K2.5", "--speculative-algo", "nextn",
            "--speculative-draft-model", "/m/k25-eagle3", "--speculative-num-steps=5", "--speculative-eagle-topk", "1",
            "--tp", "8", "--context-length", "131072"]
    args = from_cmdline(argv)
    assert args == {"model_path": "/m/Kimi-K2.5", "speculative_algorithm": "NEXTN",
                    "speculative_draft_model_path": "/m/k25-eagle3", "speculative_num_steps": 5,
                    "speculative_eagle_topk": 1, "context_length": 131072}
    # ambiguous prefix (draft-model-path, draft-window-size, ...): argparse refuses it, so do we
    assert "speculative_draft_model_path" not in from_cmdline(["--speculative-draft", "/x"])
    s = ServerSettings.from_server_args(args)
    assert s.algorithm == "EAGLE" and s.num_steps == 5 and s.context_length == 131072  # NEXTN resolves to EAGLE


def test_server_info_endpoint_with_fallback_path():
    body = {"model_path": "/m/t", "speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "version": "0.5.4"}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 — an old server: only /get_server_info
            code, data = (200, json.dumps(body).encode()) if self.path == "/get_server_info" else (404, b"{}")
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        args = from_server_info(f"http://127.0.0.1:{srv.server_address[1]}")
    finally:
        srv.shutdown()
    assert args == body
    assert ServerSettings.from_server_args(args).algorithm == "EAGLE3"
