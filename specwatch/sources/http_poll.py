"""HTTP GETs of the sources that poll (`server_api`, `server_metrics`): urllib3, without requests.

`requests` costs an idle daemon 3.7 MB of RSS on top of urllib3 (charset_normalizer, idna,
cookies; measured with Python 3.11, requests 2.32, urllib3 2.x) and a third of each poll's CPU
(preparing, hooks, adapters). Polls need none of it: a GET with a timeout, no redirect followed,
no retry. Where the environment sets a proxy (`http_proxy`, `https_proxy`, `all_proxy`,
`no_proxy`) or a `.netrc` exists, a requests Session is used instead, so those settings apply as
they always did (requests 2.32, sessions.py `merge_environment_settings`, utils.py `get_netrc_auth`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING
from urllib.parse import urlencode, urlsplit, urlunsplit

import urllib3
from urllib3.exceptions import (ConnectTimeoutError, HTTPError, NewConnectionError, ProtocolError, SSLError,
                                TimeoutError)

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


class PollClient:
    """GETs for one polling source: a urllib3 pool (keep-alive where the server allows), or a
    requests Session when `environment_settings()` (read once, here)."""

    def __init__(self) -> None:
        self._session: requests.Session | None = None  # exactly one of the two is set
        self._pool: urllib3.PoolManager | None = None
        if environment_settings():
            import requests  # only here: its proxy and .netrc handling

            self._session = requests.Session()
        else:
            ca = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or _certifi()
            self._pool = (urllib3.PoolManager(num_pools=2, maxsize=1, retries=False, ca_certs=ca) if ca
                          else urllib3.PoolManager(num_pools=2, maxsize=1, retries=False))

    def get(self, url: str, *, timeout: float, headers: dict | None = None,
            params: dict | None = None) -> tuple[int, bytes]:
        """GET `url` (`params` as its query, lists as repeated keys), no redirect followed, no
        retry → (status, body). `timeout`: seconds to connect, and between bytes read.
        Raises PollError."""
        if params:
            parts = urlsplit(url)
            query = "&".join(filter(None, (parts.query, urlencode(params, doseq=True))))
            url = urlunsplit(parts._replace(query=query))
        if self._session is not None:
            return self._requests_get(self._session, url, timeout, headers)
        assert self._pool is not None  # no session: a pool (__init__)
        try:
            r = self._pool.request("GET", url, headers=headers, timeout=urllib3.Timeout(connect=timeout, read=timeout),
                                   redirect=False, retries=False)
        except NewConnectionError:  # refused, no route (a subclass of ConnectTimeoutError)
            raise PollError("connection_error", False) from None
        except ConnectTimeoutError:
            raise PollError("timeout", False) from None
        except TimeoutError:
            raise PollError("timeout", True) from None
        except (ProtocolError, SSLError):  # reset, closed without an answer, bad status line, TLS
            raise PollError("connection_error", False) from None
        except HTTPError:  # a URL it cannot parse, ...
            raise PollError("request_error", False) from None
        return r.status, r.data

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
