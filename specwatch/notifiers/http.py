"""HTTP delivery shared by the notifiers: secret URLs, one POST, and what its answer means.

A receiver URL (Slack webhook, generic webhook) often carries a token in its path, so it is held
in a `Secret` that redacts every form of it from our log lines and from urllib3's.
`requests` (~6 MB resident with urllib3 and charset_normalizer) is imported at the first delivery,
or by `specwatch run` on a thread of its own at start when a notifier is configured (so the first
alert does not wait for the import); a daemon without notifiers never holds it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import requests

REDACTED = "<redacted>"

SENT, PERMANENT, RETRY = "sent", "permanent", "retry"


@dataclass(frozen=True)
class Attempt:
    """The outcome of one delivery attempt.

    outcome: SENT, PERMANENT (refused: will not succeed as sent to this receiver; kept in the
        dead letter, see `QueuedNotifier`) or RETRY.
    wait: for RETRY, seconds the receiver asked us to wait (Retry-After); None = use the backoff.
    detail: for logs, already free of secrets.
    rate_limited: the receiver answered 429 (logged as such; without `wait` it backs off like any failure).
    status: the HTTP status of the answer (None: no answer, e.g. a network error or a dry run).
    """

    outcome: str
    wait: float | None = None
    detail: str = ""
    rate_limited: bool = False
    status: int | None = None


class Secret:
    """Holds a URL so that repr(), vars() dumps and tracebacks of locals never show it."""

    __slots__ = ("value", "_fragments", "__weakref__")

    def __init__(self, url: str) -> None:
        self.value = url
        self._fragments: list[str] | None = None
        _register_secret(self)

    @property
    def fragments(self) -> list[str]:
        """Every form of the URL to redact, longest first."""
        if self._fragments is None:
            from requests.utils import requote_uri

            forms = set()
            # The path carries the token on hooks.slack.com; requests/urllib3 messages quote the
            # path alone ("... with url: /services/T/B/x"), percent-encoded, so redact every form.
            for u in (self.value, requote_uri(self.value)):
                parts = urlsplit(u)
                forms |= {u, parts.path + (f"?{parts.query}" if parts.query else ""), parts.path}
            self._fragments = sorted((f for f in forms if f and f != "/"), key=len, reverse=True)
        return self._fragments

    def redact(self, text: str) -> str:
        for f in self.fragments:
            text = text.replace(f, REDACTED)
        return text

    def __repr__(self) -> str:
        return REDACTED


def check_url(url: str, what: str) -> None:
    """Raises ValueError (without the URL: it may be a secret) unless `url` is http(s)."""
    parts = urlsplit(url or "")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{what} must be an http(s) URL")


class _RedactFilter(logging.Filter):
    """Scrubs secret URLs from urllib3's own records (e.g. its DEBUG line with the path)."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: weakref.WeakSet[Secret] = weakref.WeakSet()

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = list(self.secrets)
        if secrets:
            msg = record.getMessage()
            clean = msg
            for s in secrets:
                clean = s.redact(clean)
            if clean != msg:
                record.msg, record.args = clean, None
        return True


# Filters do not inherit, so each urllib3 logger that prints a URL or path gets its own.
_URLLIB3_LOGGERS = ("urllib3.connectionpool", "urllib3.poolmanager", "urllib3.util.retry")
_urllib3_filter = _RedactFilter()
_filter_lock = threading.Lock()


def _register_secret(secret: Secret) -> None:
    with _filter_lock:
        for name in _URLLIB3_LOGGERS:
            logger = logging.getLogger(name)
            if _urllib3_filter not in logger.filters:
                logger.addFilter(_urllib3_filter)
        _urllib3_filter.secrets.add(secret)


RETRY_AFTER_MAX = 3600.0  # a receiver asking for more (or for `inf`) is not waited for longer


def retry_after(value: str | None) -> float | None:
    """`Retry-After` → seconds in [0, RETRY_AFTER_MAX]: delta-seconds (what Slack sends) or an
    HTTP date; None when absent or unreadable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    if math.isnan(seconds):
        return None
    return min(max(0.0, seconds), RETRY_AFTER_MAX)


def new_session() -> requests.Session:
    """A `requests.Session` (requests is imported here at the latest: the first delivery)."""
    import requests

    return requests.Session()


def post_json(
    session: requests.Session,
    url: Secret,
    payload: Any,  # JSON-able: what `render` built, for requests' `json=`
    timeout: float,
    *,
    succeeded: Callable[[int, str], bool] = lambda status, body: 200 <= status < 300,
    permanent: Callable[[int, str], bool] = lambda status, body: 400 <= status < 500 and status not in (408, 429),
    headers: dict[str, str] | None = None,
    full_body: bool = False,
) -> Attempt:
    """POST `payload` as JSON and classify the answer.

    `succeeded(status, body)` and `permanent(status, body)` decide (body stripped, redacted, at
    most 200 characters; `full_body`: all of it, e.g. a JSON answer to parse); anything else — network errors, timeouts, 5xx, 429 — is RETRY, a 429
    or 503 with the wait its `Retry-After` asks for. Never raises for I/O errors.
    """
    try:
        resp = session.post(url.value, json=payload, timeout=timeout, headers=headers)
    except Exception as exc:  # noqa: BLE001 - anything here is retried, never kills the thread
        # requests puts the URL in its messages; only the redacted text is logged.
        return Attempt(RETRY, None, f"{type(exc).__name__}: {url.redact(str(exc))}")
    status = resp.status_code
    whole = url.redact(resp.text.strip())
    body = whole[:200]
    detail = f"HTTP {status} {body!r}"
    if full_body:
        body = whole
    if succeeded(status, body):
        return Attempt(SENT, None, detail, status=status)
    if permanent(status, body):
        return Attempt(PERMANENT, None, detail, status=status)
    wait = retry_after(resp.headers.get("Retry-After")) if status in (429, 503) else None
    return Attempt(RETRY, wait, detail, rate_limited=status == 429, status=status)
