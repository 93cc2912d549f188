"""HTTP GETs of the sources that poll (`server_api`, `server_metrics`): the standard library's
`http.client`, without requests or urllib3's pool.

`requests` costs an idle daemon 3.7 MB of RSS (charset_normalizer, idna, cookies; measured with
Python 3.11, requests 2.32, urllib3 2.x) and a third of each poll's CPU (preparing, hooks,
adapters); urllib3's PoolManager adds URL normalisation, pool lookups and response wrapping to
every GET (docs/idle-cost.md, seventh round). A poll needs none of it: one GET on one connection, kept alive
where the server allows, a timeout, no redirect followed, no retry. Where the environment sets a
proxy (`http_proxy`, `https_proxy`, `all_proxy`, `no_proxy`) or a `.netrc` exists, a requests
Session is used instead, so those settings apply as they always did (requests 2.32, sessions.py
`merge_environment_settings`, utils.py `get_netrc_auth`).
"""

from __future__ import annotations

import http.client
import os
import select
import socket
import ssl
from typing import TYPE_CHECKING
from urllib.parse import urlencode, urlsplit, urlunsplit

if TYPE_CHECKING:  # imported only where the environment asks for it (PollClient)
    import requests

_PROXY_SETTINGS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "netrc")


class PollError(OSError):
    """A GET that got no answer. kind: `timeout`, `connection_error` or `request_error`;
    reachable: False when nothing answered (no connection, or it timed out connecting)."""

    def __init__(self, kind: str, reachable: bool):
        super().__init__(kind)
        self.kind = kind
        self.reachable = reachable


def environment_settings() -> bool:
    """True when the environment has proxy or .netrc settings (which requests applies)."""
    return any(k.lower() in _PROXY_SETTINGS for k in os.environ) or any(
        os.path.exists(os.path.expanduser(f"~/{n}")) for n in (".netrc", "_netrc"))


def _certifi() -> str | None:
    """certifi's CA bundle (what requests verifies against), else None: the system's store."""
    try:
        import certifi
    except ImportError:
        return None
    return certifi.where()


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """The kept-alive connection was closed by the server (readable while no answer is due: EOF,
    or bytes nobody asked for), as urllib3 checks before it reuses one (`is_connection_dropped`)."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):  # closed under us
        return True


class PollClient:
    """GETs for one polling source: one `http.client` connection per host, kept alive where the
    server allows, or a requests Session when `environment_settings()` (read once, here)."""

    def __init__(self) -> None:
        self._session: requests.Session | None = None
        self._conns: dict[tuple[str, str, int], http.client.HTTPConnection] = {}
        self._tls: ssl.SSLContext | None = None  # made at the first https GET
        if environment_settings():
            import requests  # only here: its proxy and .netrc handling

            self._session = requests.Session()

    def get(self, url: str, *, timeout: float, headers: dict | None = None,
            params: dict | None = None) -> tuple[int, bytes]:
        """GET `url` (`params` as its query, lists as repeated keys), no redirect followed, no
        retry → (status, body). `timeout`: seconds to connect, and between bytes read.
        Raises PollError."""
        parts = urlsplit(url)
        if params:
            query = "&".join(filter(None, (parts.query, urlencode(params, doseq=True))))
            parts = parts._replace(query=query)
            url = urlunsplit(parts)
        if self._session is not None:
            return self._requests_get(self._session, url, timeout, headers)
        try:
            host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:  # a port that is no number
            raise PollError("request_error", False) from None
        if parts.scheme not in ("http", "https") or not host:
            raise PollError("request_error", False)
        target = urlunsplit(("", "", parts.path or "/", parts.query, ""))
        key = (parts.scheme, host, port)
        kept = self._conns.pop(key, None)
        if kept is not None and _dropped(kept):
            kept.close()
            kept = None
        if kept is not None:
            kept.timeout = timeout
            if kept.sock is not None:
                kept.sock.settimeout(timeout)
            try:
                return self._exchange(key, kept, target, headers)
            except PollError as e:
                if e.kind == "timeout":
                    raise
                # the server closed it as the request went out: once more on a new connection
        return self._exchange(key, self._connect(parts.scheme, host, port, timeout), target, headers)

    def _exchange(self, key: tuple[str, str, int], conn: http.client.HTTPConnection, target: str,
                  headers: dict | None) -> tuple[int, bytes]:
        """The GET of `target` on `conn` → (status, body); the connection kept for the next GET
        unless the answer closes it. Raises PollError (the connection closed)."""
        try:
            conn.request("GET", target, headers=headers or {})
            r = conn.getresponse()
            body = r.read()
        except (TimeoutError, socket.timeout):
            conn.close()
            raise PollError("timeout", True) from None
        except (OSError, http.client.HTTPException):  # reset, closed without an answer, bad status line, TLS
            conn.close()
            raise PollError("connection_error", False) from None
        if r.will_close:
            conn.close()
        else:
            self._conns[key] = conn
        return r.status, body

    def _connect(self, scheme: str, host: str, port: int, timeout: float) -> http.client.HTTPConnection:
        """A new connection, connected (raises PollError: refused, no route, timed out)."""
        conn: http.client.HTTPConnection
        if scheme == "https":
            if self._tls is None:
                ca = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or _certifi()
                self._tls = ssl.create_default_context(cafile=ca)
            conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=self._tls)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            conn.connect()
        except (TimeoutError, socket.timeout):
            conn.close()
            raise PollError("timeout", False) from None
        except ssl.SSLError:
            conn.close()
            raise PollError("connection_error", False) from None
        except OSError:  # refused, no route, no such host
            conn.close()
            raise PollError("connection_error", False) from None
        return conn

    @staticmethod
    def _requests_get(session: requests.Session, url: str, timeout: float, headers: dict | None) -> tuple[int, bytes]:
        import requests

        try:
            r = session.get(url, headers=headers, timeout=(timeout, timeout), allow_redirects=False)
        except requests.exceptions.ConnectTimeout:
            raise PollError("timeout", False) from None
        except requests.exceptions.Timeout:
            raise PollError("timeout", True) from None
        except requests.exceptions.ConnectionError:
            raise PollError("connection_error", False) from None
        except requests.exceptions.RequestException:
            raise PollError("request_error", False) from None
        return r.status_code, r.content
