"""A Slack-compatible incoming-webhook endpoint on 127.0.0.1 for tests (a real HTTP server)."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET_PATH = "/services/T0SPEC/B0WATCH/s3cr3tT0ken"


class SlackEndpoint:
    """A real HTTP server on 127.0.0.1 standing in for a Slack incoming webhook.

    Scriptable: answers with `script` entries in order, then 200 `ok`. Requests to
    `<url>/api/chat.postMessage` and `/api/chat.update` (`api_url`) are answered as Slack's Web API
    does: `{"ok": true, "channel": ..., "ts": ...}`, a new `ts` per posted message."""

    def __init__(self, port: int = 0):
        self.script: deque[tuple[int, dict, str]] = deque()
        self.received: list[dict] = []  # JSON bodies of every request, answered or not
        self.answered_ok: list[bool] = []  # per request: answered 200 `ok` (= delivered)
        self.paths: list[str] = []
        self.times: list[float] = []  # time.monotonic() of each request
        self.auth: list[str | None] = []  # the Authorization header of each request
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with fake.lock:
                    doc = json.loads(body)
                    fake.received.append(doc)
                    fake.paths.append(self.path)
                    fake.times.append(time.monotonic())
                    fake.auth.append(self.headers.get("Authorization"))
                    status, headers, text = fake.script.popleft() if fake.script else (200, {}, "ok")
                    if text == "ok" and self.path.endswith(("/chat.postMessage", "/chat.update")):
                        posted = self.path.endswith("/chat.postMessage")
                        text = json.dumps({"ok": True, "channel": "C0SPEC" if posted else doc.get("channel"),
                                           "ts": f"{len(fake.received)}.000100" if posted else doc.get("ts")})
                    fake.answered_ok.append(status == 200 and (text == "ok" or '"ok": true' in text))
                data = text.encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}{SECRET_PATH}"
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def delivered_texts(self) -> list[str]:
        with self.lock:
            return [b["text"] for b in self.received]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
