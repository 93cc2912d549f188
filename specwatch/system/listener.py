"""The `/metrics` listener: prometheus-client's threaded WSGI server, served without a timer, and
the app it serves.

`prometheus_client.start_http_server` runs `serve_forever()`, whose select wakes every 0.5 s to
look for a shutdown request: two wake-ups a second, 0.015 % of a core on the 2-core development
machine (README "Performance"), for nothing. `serve_quietly` runs the same server's loop with no
timeout instead; `stop_serving` asks it to stop and wakes its select with a connection.

`listener_app` routes as Prometheus' own server does (prometheus/prometheus `web/web.go`, 2.x):
`/metrics` only at `/metrics`, `/-/healthy` (200 while the process answers), `/-/ready` (200 once
ready, else 503 with the reason), every other path to the next app (the status page), whose
unknown paths end in `not_found`. `HEAD` is answered on every path with the headers of a `GET`
and no body; other methods than GET and HEAD get 405.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import TCPServer
from typing import TYPE_CHECKING, Any

from specwatch.system.exposition import Exposition, metrics_answer

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

POKE_EVERY = 0.05  # seconds between connections that wake a loop asked to stop
WRITE_BUFFER = 1 << 16  # bytes; a compressed /metrics answer fits in one send
WORKERS = 4  # threads answering requests: a few stalled connections leave the scrape one
REQUEST_TIMEOUT = 10.0  # seconds a connection may take to send its request and read the answer


def serve_quietly(httpd: TCPServer, thread: threading.Thread | None = None) -> threading.Thread:
    """Stop `thread`'s `serve_forever` loop (start_http_server's), then serve `httpd` on a new
    daemon thread that sleeps until a connection arrives. Returns that thread."""
    if thread is not None:
        stop_serving(httpd, thread)
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": None},
                         name="specwatch-http", daemon=True)
    t.start()
    return t


def serve_pooled(httpd: Any, workers: int = WORKERS) -> list[threading.Thread]:
    """`httpd` (a socketserver with ThreadingMixIn: start_http_server's): each connection handled
    on one of `workers` long-lived daemon threads instead of a thread started for it
    (ThreadingMixIn's), its answer written through a buffer (one send instead of one per status
    line, header block and body chunk), a connection that stalls dropped after REQUEST_TIMEOUT.
    Idle workers block on the queue: no timer. Daemon threads, as ThreadingMixIn's are here: a
    request stuck on a wedged pipeline does not hold up the exit. Returns the workers."""
    cls = httpd.RequestHandlerClass
    httpd.RequestHandlerClass = type(cls.__name__, (cls,), {"wbufsize": WRITE_BUFFER, "timeout": REQUEST_TIMEOUT})
    connections: queue.SimpleQueue = queue.SimpleQueue()

    def work() -> None:
        while True:
            # ThreadingMixIn's body of a request's thread: handle, report errors, close
            httpd.process_request_thread(*connections.get())

    threads = [threading.Thread(target=work, name=f"specwatch-http-worker-{i}", daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    httpd.process_request = lambda request, address: connections.put((request, address))
    return threads


def stop_serving(httpd: TCPServer, thread: threading.Thread, timeout: float = 5.0) -> bool:
    """End the `serve_forever` loop running on `thread` (the listening socket stays open).
    Returns False when it did not end within `timeout` seconds."""
    stopper = threading.Thread(target=httpd.shutdown, daemon=True)  # blocks until the loop ends
    stopper.start()
    host, port = httpd.server_address[:2]
    if isinstance(host, (bytes, bytearray)):  # typed as bind's argument; a bound server's is getsockname()'s str
        host = host.decode()
    deadline = time.monotonic() + timeout
    while stopper.is_alive() and time.monotonic() < deadline:
        try:  # a connection makes select return; the loop then sees the request to stop
            socket.create_connection((host, port), timeout=1.0).close()
        except OSError:
            pass
        stopper.join(POKE_EVERY)
    thread.join(max(0.0, deadline - time.monotonic()))
    return not thread.is_alive()


def _text(start_response: StartResponse, status: str, text: str,
          headers: tuple[tuple[str, str], ...] = ()) -> list[bytes]:
    body = text.encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))),
                            *headers])
    return [body]


def not_found(environ: WSGIEnvironment, start_response: StartResponse) -> list[bytes]:
    """404 with Go's net/http text, as Prometheus answers an unknown path."""
    return _text(start_response, "404 Not Found", "404 page not found\n")


def listener_app(exposition: Exposition, app: WSGIApplication, ready: Callable[[], str | None],
                 name: str = "specwatch") -> WSGIApplication:
    """WSGI app: `/metrics` from `exposition`, `/-/healthy`, `/-/ready` (`ready()`: None when
    ready, else why not, one line), anything else to `app`. Bodies of health answers are
    Prometheus' sentences with `name`."""

    def route(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/metrics":
            status, headers, body = metrics_answer(exposition, environ)
            start_response(status, [*headers, ("Content-Length", str(len(body)))])
            return [body]
        if path == "/-/healthy":
            return _text(start_response, "200 OK", f"{name} is Healthy.\n")
        if path == "/-/ready":
            why = ready()
            if why is None:
                return _text(start_response, "200 OK", f"{name} is Ready.\n")
            return _text(start_response, "503 Service Unavailable", f"{name} is not ready: {why}\n")
        return app(environ, start_response)

    def methods(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        if method == "GET":
            return route(environ, start_response)
        if method != "HEAD":
            return _text(start_response, "405 Method Not Allowed", f"method {method} not allowed: use GET or HEAD\n",
                         (("Allow", "GET, HEAD"),))
        got: dict = {}

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], object]:
            got.update(status=status, headers=headers)
            return lambda data: None  # a HEAD answer has no body

        body = b"".join(route(dict(environ, REQUEST_METHOD="GET"), start))
        status, headers = got["status"], got["headers"]
        if not any(k.lower() == "content-length" for k, _ in headers):
            headers = [*headers, ("Content-Length", str(len(body)))]
        start_response(status, headers)
        return [b""]

    return methods
