"""The `/metrics` listener: prometheus-client's threaded WSGI server, served without a timer.

`prometheus_client.start_http_server` runs `serve_forever()`, whose select wakes every 0.5 s to
look for a shutdown request: two wake-ups a second, 0.015 % of a core on the 2-core development
machine (README "Performance"), for nothing. `serve_quietly` runs the same server's loop with no
timeout instead; `stop_serving` asks it to stop and wakes its select with a connection.
"""

from __future__ import annotations

import socket
import threading
import time
from socketserver import BaseServer

POKE_EVERY = 0.05  # seconds between connections that wake a loop asked to stop


def serve_quietly(httpd: BaseServer, thread: threading.Thread | None = None) -> threading.Thread:
    """Stop `thread`'s `serve_forever` loop (start_http_server's), then serve `httpd` on a new
    daemon thread that sleeps until a connection arrives. Returns that thread."""
    if thread is not None:
        stop_serving(httpd, thread)
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": None},
                         name="specwatch-http", daemon=True)
    t.start()
    return t


def stop_serving(httpd: BaseServer, thread: threading.Thread, timeout: float = 5.0) -> bool:
    """End the `serve_forever` loop running on `thread` (the listening socket stays open).
    Returns False when it did not end within `timeout` seconds."""
    stopper = threading.Thread(target=httpd.shutdown, daemon=True)  # blocks until the loop ends
    stopper.start()
    host, port = httpd.server_address[:2]
    deadline = time.monotonic() + timeout
    while stopper.is_alive() and time.monotonic() < deadline:
        try:  # a connection makes select return; the loop then sees the request to stop
            socket.create_connection((host, port), timeout=1.0).close()
        except OSError:
            pass
        stopper.join(POKE_EVERY)
    thread.join(max(0.0, deadline - time.monotonic()))
    return not thread.is_alive()
