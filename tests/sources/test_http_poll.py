"""PollClient against real sockets on 127.0.0.1: a direct GET without requests loaded, the query,
no redirect followed, each failure's kind, and a proxy from the environment (through requests)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from specwatch.sources.http_poll import PollClient, PollError


class _Handler(BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None]] = []

    def do_GET(self):
        self.seen.append((self.path, self.headers.get("Authorization")))
        moved = self.path.endswith("/moved")  # a redirect, else the path it was asked for
        body = b"" if moved else f"got {self.path}".encode()
        self.send_response(302 if moved else 200)
        headers = {"Content-Length": str(len(body)), **({"Location": "/elsewhere"} if moved else {})}
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    log_message = lambda self, *a: None  # noqa: E731  (quiet)


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _Handler.seen = []
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def no_proxy_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: the urllib3 path, not requests
    monkeypatch.delenv("NETRC", raising=False)
    for k in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(k, raising=False)


def test_get_with_query_headers_and_no_redirect(server, no_proxy_env):
    c = PollClient()
    assert c.get(server + "/metrics", timeout=2, params={"name[]": ["a:b", "c"]}, headers={"Authorization": "Bearer k"}) \
        == (200, b"got /metrics?name%5B%5D=a%3Ab&name%5B%5D=c")
    assert c.get(server + "/moved", timeout=2) == (302, b"")  # the redirect is the answer
    assert c.get(server + "/m?a=1#top", timeout=2, params={"b": 2})[1] == b"got /m?a=1&b=2"  # before the fragment
    assert _Handler.seen == [("/metrics?name%5B%5D=a%3Ab&name%5B%5D=c", "Bearer k"), ("/moved", None), ("/m?a=1&b=2", None)]


def test_failures_have_a_kind_and_say_whether_anything_answered(no_proxy_env):
    c = PollClient()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(PollError) as e:
        c.get(f"http://127.0.0.1:{port}/x", timeout=1)
    assert (e.value.kind, e.value.reachable) == ("connection_error", False)

    with socket.socket() as s:  # accepts, never answers
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(PollError) as e:
            c.get(f"http://127.0.0.1:{s.getsockname()[1]}/x", timeout=0.2)
    assert (e.value.kind, e.value.reachable) == ("timeout", True)

    with socket.socket() as s:  # closes without a word
        s.bind(("127.0.0.1", 0))
        s.listen()
        t = threading.Thread(target=lambda: s.accept()[0].close())
        t.start()
        with pytest.raises(PollError) as e:
            c.get(f"http://127.0.0.1:{s.getsockname()[1]}/x", timeout=1)
        t.join()
    assert (e.value.kind, e.value.reachable) == ("connection_error", False)


def test_a_proxy_in_the_environment_is_used(server, monkeypatch, no_proxy_env):
    """`http_proxy` set: the GET goes to the proxy with the absolute URL (requests' handling)."""
    monkeypatch.setenv("http_proxy", server)
    assert PollClient().get("http://sglang.invalid:30000/server_info", timeout=2) \
        == (200, b"got http://sglang.invalid:30000/server_info")


def test_polling_sources_load_no_requests(tmp_path):
    """RSS budget: the API and /metrics sources poll without requests (+3.7 MB) loaded."""
    code = ("import sys; from specwatch.sources.server_api import ServerApiSource; "
            "from specwatch.sources.server_metrics import ServerMetricsSource; "
            "ServerApiSource('http://127.0.0.1:1', print, server='s'); "
            "ServerMetricsSource('http://127.0.0.1:1/metrics', print, server='s'); "
            "print('requests' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()} | {"HOME": str(tmp_path)}  # no .netrc
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                       cwd=Path(__file__).resolve().parents[2], env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


class _KeepAlive(_Handler):
    """HTTP/1.1: the connection stays open between answers until idle for `timeout` s (as uvicorn's
    `timeout_keep_alive`), then the server closes it."""

    protocol_version = "HTTP/1.1"
    timeout = 0.3
    connections: list[tuple] = []

    def setup(self):
        super().setup()
        self.connections.append(self.client_address)

    def handle(self):
        try:
            super().handle()
        except TimeoutError:  # idle past `timeout`: closed, as a keep-alive server does
            self.close_connection = True


def test_one_connection_kept_alive_and_a_closed_one_replaced(no_proxy_env):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _KeepAlive)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _KeepAlive.connections = []
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        c = PollClient()
        assert [c.get(f"{url}/{i}", timeout=2) for i in range(3)] == [(200, f"got /{i}".encode()) for i in range(3)]
        assert len(_KeepAlive.connections) == 1  # one connection for the three GETs
        time.sleep(0.8)  # the server closes the idle connection
        assert c.get(f"{url}/again", timeout=2) == (200, b"got /again")
        assert len(_KeepAlive.connections) == 2
    finally:
        srv.shutdown()
        srv.server_close()
