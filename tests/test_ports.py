"""procs.free_port(): a port no other process can take between the choice and the server's bind."""

from __future__ import annotations

import socket

import pytest
import requests

from procs import free_port
from slack_endpoint import SECRET_PATH, SlackEndpoint


def test_free_port_stays_reserved_until_its_server_binds_it():
    port = free_port()
    with pytest.raises(ConnectionRefusedError):  # reserved, not listening: a receiver that is down
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    others = [socket.socket() for _ in range(300)]
    try:
        for s in others:  # what another test's server or a client's bind(0) would get
            s.bind(("127.0.0.1", 0))
        assert port not in {s.getsockname()[1] for s in others}
        plain = socket.socket()
        with pytest.raises(OSError):  # bind-close-return let this succeed
            plain.bind(("127.0.0.1", port))
        plain.close()
    finally:
        for s in others:
            s.close()
    endpoint = SlackEndpoint(port)  # the test's own server (SO_REUSEADDR) binds it
    try:
        r = requests.post(f"http://127.0.0.1:{port}{SECRET_PATH}", json={"text": "hi"}, timeout=5)
        assert r.text == "ok" and endpoint.delivered_texts() == ["hi"]
    finally:
        endpoint.close()
