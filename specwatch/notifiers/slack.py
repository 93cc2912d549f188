"""Deliver alerts to a Slack incoming webhook, in order, surviving outages and restarts.

`build_payload` turns an `Alert` into Block Kit JSON; `SlackNotifier` queues notifications
(optionally in a JSON file), and a background thread posts them one at a time: transient failures
(network, timeout, 5xx, 429) are retried forever, permanent ones (Slack says the payload or the
webhook is bad) are logged once and dropped. Slack's responses: monitoring.md §4.2.

Delivery is at-least-once: if the process dies after Slack accepted a message but before the
queue file was rewritten, that message is posted again after the restart.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import tempfile
import threading
import time
import weakref
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

import requests
from requests.utils import requote_uri

from specwatch.alerts.model import FIRING, RESOLVED, Alert, iso8601

log = logging.getLogger("specwatch.notifiers.slack")

# Block Kit limits (api.slack.com/reference/block-kit): per-message, per-section, per-field.
MAX_BLOCKS = 50
MAX_SECTION_TEXT = 3000
MAX_FIELD_TEXT = 2000
MAX_FIELDS_PER_SECTION = 10
MAX_HEADER_TEXT = 150
# `text` is the notification fallback: one line, kept short enough for a phone banner.
MAX_FALLBACK_TEXT = 300

# Body strings Slack returns for a request that will never succeed as sent (monitoring.md §4.2).
# Keyed on the body, not the status, because the status of the newer ones was not verified.
PERMANENT_ERRORS = frozenset(
    {
        "invalid_payload",
        "channel_not_found",
        "channel_is_archived",
        "action_prohibited",
        "no_service",
        "no_team",
        "invalid_token",
        "invalid_blocks",
        "user_not_found",
    }
)

_EMOJI = {FIRING: ":rotating_light:", RESOLVED: ":white_check_mark:"}
_ELLIPSIS = "…"
REDACTED = "<redacted>"


# --------------------------------------------------------------------------------------------
# Payload


def escape_entities(text: str) -> str:
    """Escape only `&`, `<`, `>` (no mention or link can form) and keep mrkdwn formatting.

    For text specwatch writes itself (descriptions, fixes): their `code spans` must stay copyable
    commands. Log-derived values in them (a draft path) cannot form mentions or links either.
    """
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def escape_mrkdwn(text: str) -> str:
    """Make arbitrary text display literally inside a Slack mrkdwn string.

    `&`, `<`, `>` become entities, so `<!channel>`, `<@U123>` and `<http://x|y>` cannot become
    mentions or links. Slack has no escape for `*`, `_`, `~` and backtick, so those are swapped for
    look-alike characters (as jsx-slack does) where they could open or close formatting: always
    for backtick, and for the others unless they sit between two letters/digits (`spec_len` and
    `2*3` never format and stay copyable). Newlines are kept.
    """
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _FORMAT_CHARS.sub(_neutralise, text)


_LOOKALIKE = {"*": "\u2217", "_": "\uff3f", "~": "\u223c", "`": "\u02cb"}
_FORMAT_CHARS = re.compile(r"[*_~`]")


def _neutralise(m: re.Match) -> str:
    ch, s, i = m.group(), m.string, m.start()
    if ch != "`" and 0 < i < len(s) - 1 and s[i - 1].isalnum() and s[i + 1].isalnum():
        return ch
    return _LOOKALIKE[ch]


def _truncate(text: str, limit: int) -> str:
    """Cut escaped text to `limit` characters with "…", never through an `&amp;`-style entity."""
    if len(text) <= limit:
        return text
    cut = text[: limit - len(_ELLIPSIS)]
    amp = cut.rfind("&", max(0, len(cut) - 5))  # the longest entity we write, "&amp;", is 5
    if amp != -1 and ";" not in cut[amp:]:
        cut = cut[:amp]
    return cut + _ELLIPSIS


def _one_line(text: str) -> str:
    return " ".join(text.split())


def format_duration(seconds: float) -> str:
    """Seconds → short human text: `45s`, `5m 12s`, `2h 03m`, `3d 4h`. Negative counts as 0."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m {s:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h {m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d {h}h"


def _where(alert: Alert) -> str:
    server = alert.labels.get("server", "")
    rank = alert.labels.get("rank", "")
    return " ".join(p for p in (server, rank) if p)


def _fallback_text(alert: Alert) -> str:
    status = "RESOLVED" if alert.status == RESOLVED else "UPDATE" if alert.annotations.get("update") else "FIRING"
    head = f"[{status}] {alert.name}"
    where = _where(alert)
    if where:
        head += f" on {where}"
    if alert.status == RESOLVED:
        detail = (
            f"resolved after {format_duration(alert.ends_at - alert.starts_at)}"
            if alert.ends_at is not None
            else "resolved"
        )
    elif alert.evidence:
        name, value = alert.evidence[0]
        detail = f"{name} {value}"
    else:
        detail = alert.annotations.get("summary", "")
    line = f"{head}: {detail}" if detail else head
    return _truncate(escape_mrkdwn(_one_line(line)), MAX_FALLBACK_TEXT)


def _field(name: str, value: str) -> dict:
    # Name and value both come from the alert (evidence names may be log-derived too).
    text = f"*{escape_mrkdwn(_one_line(name))}*\n{escape_mrkdwn(value)}"
    return {"type": "mrkdwn", "text": _truncate(text, MAX_FIELD_TEXT)}


def _section(text: str) -> dict:
    return {"type": "section", "text": {"type": "mrkdwn", "text": _truncate(text, MAX_SECTION_TEXT)}}


def build_payload(alert: Alert, *, channel: str | None = None) -> dict:
    """Slack incoming-webhook JSON (Block Kit) for one alert.

    Firing: header (emoji + alert name), fields (server, rank — "" shown as "(single rank)" —
    then each evidence pair in order), the description, "What to check" with `alert.fixes`
    numbered, and a context line (start time, severity, fingerprint). Resolved: header, a
    "Resolved after <ends_at - starts_at>" section, and the same fields; no description or fixes.
    `text` is a one-line fallback, e.g. `[FIRING] AcceptanceCollapse on sglang-0 DP0 TP0: accept
    len 1.05`. An update of a firing alert (`annotations["update"]`, e.g. diagnosis findings that
    arrived after it fired) says `[UPDATE]`, "(update)" in the header and the note first. All alert text is escaped (see `escape_mrkdwn`); sections are cut at 3,000
    characters, fields at 2,000, the header at 150, and the message at 50 blocks. `channel`
    (legacy webhooks only) is added as is. Raises nothing for any well-typed Alert.
    """
    resolved = alert.status == RESOLVED
    title = f"{_EMOJI.get(alert.status, ':grey_question:')} {alert.name or 'alert'}"
    if resolved:
        title += " resolved"
    elif alert.annotations.get("update"):
        title += " (update)"
    # plain_text is not parsed for mentions, but swap angle brackets anyway: cheap insurance
    # against an alert name that looks like `<!channel>`, without showing `&lt;` literally.
    title = _one_line(title).replace("<", "\u2039").replace(">", "\u203a")
    if len(title) > MAX_HEADER_TEXT:
        title = title[: MAX_HEADER_TEXT - 1] + _ELLIPSIS
    blocks: list[dict] = [{"type": "header", "text": {"type": "plain_text", "text": title, "emoji": True}}]

    if resolved:
        if alert.ends_at is not None:
            msg = f"Resolved after *{format_duration(alert.ends_at - alert.starts_at)}*"
            msg += f" (firing since {iso8601(alert.starts_at)}, ended {iso8601(alert.ends_at)})."
        else:
            msg = f"Resolved (firing since {iso8601(alert.starts_at)})."
        blocks.append(_section(msg))

    fields = [
        _field("Server", alert.labels.get("server", "") or "(unknown)"),
        _field("Rank", alert.labels.get("rank", "") or "(single rank)"),
    ]
    fields += [_field(str(n), str(v)) for n, v in alert.evidence]

    tail: list[dict] = []
    if not resolved:
        if alert.annotations.get("update"):
            tail.append(_section(f"*Update:* {escape_mrkdwn(alert.annotations['update'])}"))
        description = alert.annotations.get("description", "") or alert.annotations.get("summary", "")
        if description:
            tail.append(_section(escape_entities(description)))
        if alert.fixes:
            items = "\n".join(f"{i}. {escape_entities(_one_line(f))}" for i, f in enumerate(alert.fixes, 1))
            tail.append(_section(f"*What to check*\n{items}"))
    context = [f"started {iso8601(alert.starts_at)}"]
    if alert.labels.get("severity"):
        context.append(f"severity {escape_mrkdwn(alert.labels['severity'])}")
    context.append(f"fingerprint {alert.fingerprint}")
    tail.append({"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(context)}]})

    # Fields go 10 to a section; keep the header, tail and the 50-block cap.
    room = MAX_BLOCKS - len(blocks) - len(tail)
    chunks = [fields[i : i + MAX_FIELDS_PER_SECTION] for i in range(0, len(fields), MAX_FIELDS_PER_SECTION)]
    if len(chunks) > room:
        shown = room * MAX_FIELDS_PER_SECTION - 1
        hidden = len(fields) - shown
        fields = fields[:shown] + [{"type": "mrkdwn", "text": f"_{hidden} more evidence items not shown_"}]
        chunks = [fields[i : i + MAX_FIELDS_PER_SECTION] for i in range(0, len(fields), MAX_FIELDS_PER_SECTION)]
    blocks += [{"type": "section", "fields": chunk} for chunk in chunks]
    blocks += tail

    payload: dict = {"text": _fallback_text(alert), "blocks": blocks}
    if channel:
        payload["channel"] = channel
    return payload


# --------------------------------------------------------------------------------------------
# Secret handling


class _Secret:
    """Holds the webhook URL so that repr(), vars() dumps and tracebacks of locals never show it."""

    __slots__ = ("value", "fragments", "__weakref__")

    def __init__(self, url: str) -> None:
        self.value = url
        forms = set()
        # The path carries the token on hooks.slack.com; requests/urllib3 messages quote the
        # path alone ("... with url: /services/T/B/x"), percent-encoded, so redact every form.
        for u in (url, requote_uri(url)):
            parts = urlsplit(u)
            forms |= {u, parts.path + (f"?{parts.query}" if parts.query else ""), parts.path}
        self.fragments = sorted((f for f in forms if f and f != "/"), key=len, reverse=True)

    def redact(self, text: str) -> str:
        for f in self.fragments:
            text = text.replace(f, REDACTED)
        return text

    def __repr__(self) -> str:
        return REDACTED


class _RedactFilter(logging.Filter):
    """Scrubs webhook URLs from urllib3's own records (e.g. its DEBUG line with the path)."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: weakref.WeakSet[_Secret] = weakref.WeakSet()

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


def _register_secret(secret: _Secret) -> None:
    with _filter_lock:
        for name in _URLLIB3_LOGGERS:
            logger = logging.getLogger(name)
            if _urllib3_filter not in logger.filters:
                logger.addFilter(_urllib3_filter)
        _urllib3_filter.secrets.add(secret)


# --------------------------------------------------------------------------------------------
# Notifier

_SENT, _DROPPED, _RETRY = "sent", "dropped", "retry"


class SlackNotifier:
    """Queue alerts and post them to a Slack incoming webhook, oldest first.

    webhook_url: secret; never logged, shown in repr or put in an exception message.
    queue_path: JSON file holding pending notifications across restarts (None: memory only).
    timeout: seconds per HTTP request. backoff_initial / backoff_max: seconds; the n-th
        consecutive transient failure waits min(backoff_max, backoff_initial × 2^n) minus up to
        10 % jitter. A 429 waits `Retry-After` seconds instead and leaves the backoff alone.
    session: a `requests.Session` to post with (default: a new one).
    dry_run: a text stream; when set each payload is printed there as indented JSON and nothing
        is posted (counted as sent).
    channel: channel override for legacy webhooks (new-style webhooks are bound to one channel).

    Counters (read by the metrics layer): `sent_total`, `failed_total` {"permanent": dropped
    notifications, "retry": failed attempts that will be retried}, `queue_depth`,
    `last_success_timestamp` (seconds since the epoch, None before the first success).

    Raises ValueError when webhook_url is not an http(s) URL (message omits the URL) or a
    backoff/timeout is not positive; OSError when an existing queue file cannot be read. A queue
    file that is not valid JSON is renamed to `<name>.corrupt-<epoch>` and logged at ERROR.
    """

    def __init__(
        self,
        webhook_url: str,
        *,
        queue_path: Path | None = None,
        timeout: float = 10.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 300.0,
        session: requests.Session | None = None,
        dry_run: TextIO | None = None,
        channel: str | None = None,
    ) -> None:
        parts = urlsplit(webhook_url or "")
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("webhook_url must be an http(s) URL")
        if timeout <= 0 or backoff_initial <= 0 or backoff_max < backoff_initial:
            raise ValueError("timeout and backoff_initial must be > 0 and backoff_max >= backoff_initial")
        self._url = _Secret(webhook_url)
        _register_secret(self._url)
        self.queue_path = Path(queue_path) if queue_path is not None else None
        self.timeout = timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.channel = channel
        self._session = session
        self._dry_run = dry_run

        self.sent_total = 0
        self.failed_total: dict[str, int] = {"permanent": 0, "retry": 0}
        self.last_success_timestamp: float | None = None

        self._pending: list[dict] = []  # [{"seq": int, "alert": Alert.to_dict()}], oldest first
        self._next_seq = 1
        self._lock = threading.Lock()  # guards _pending, _next_seq and the queue file
        self._cond = threading.Condition(self._lock)
        self._send_lock = threading.Lock()  # one delivery attempt at a time (thread or drain)
        self._failures = 0  # consecutive transient failures of the head notification
        self._not_before = 0.0  # time.monotonic() before which the head is not retried
        self._thread: threading.Thread | None = None
        self._stopping = False
        if self.queue_path is not None:
            self._load()

    def __repr__(self) -> str:
        return (
            f"SlackNotifier(webhook_url={REDACTED}, queue_path={self.queue_path!r}, "
            f"queue_depth={self.queue_depth}, dry_run={self._dry_run is not None})"
        )

    # -- queue -------------------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """Notifications not yet delivered or dropped."""
        with self._lock:
            return len(self._pending)

    def notify(self, alert: Alert) -> int:
        """Queue a snapshot of `alert` for delivery and return its sequence number at once.

        Later changes to `alert` do not affect what is sent. With a queue_path the file is
        rewritten before returning; if that fails the error is logged and the notification is
        kept in memory only. Raises TypeError when the alert holds values JSON cannot encode.
        """
        snapshot = json.loads(json.dumps(alert.to_dict()))  # deep copy + proves it is storable
        with self._cond:
            item = {"seq": self._next_seq, "alert": snapshot}
            self._next_seq += 1
            self._pending.append(item)
            self._persist_locked()
            self._cond.notify_all()
        return item["seq"]

    def _load(self) -> None:
        path = self.queue_path
        try:
            raw = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            return
        try:
            data = json.loads(raw) if raw.strip() else {}
            pending = [
                {"seq": int(it["seq"]), "alert": dict(it["alert"])} for it in data.get("pending", [])
            ]
            next_seq = int(data.get("next_seq", 1))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            os.replace(path, aside)
            log.error("Slack queue file %s is unreadable (%s); moved to %s, starting empty", path, exc, aside)
            return
        pending.sort(key=lambda it: it["seq"])
        self._pending = pending
        self._next_seq = max([next_seq] + [it["seq"] + 1 for it in pending])
        if pending:
            log.info("Slack queue %s: %d notification(s) pending from a previous run", path, len(pending))

    def _persist_locked(self) -> None:
        """Rewrite the queue file atomically (temp file in the same dir, fsync, rename)."""
        if self.queue_path is None:
            return
        path = self.queue_path
        data = {"version": 1, "next_seq": self._next_seq, "pending": self._pending}
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, ensure_ascii=False)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            tmp = None
            # fsync the directory too, or the rename itself may not survive a power cut.
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            log.error("could not write Slack queue file %s: %s", path, exc)
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def _remove_head(self, seq: int) -> None:
        with self._lock:
            if self._pending and self._pending[0]["seq"] == seq:
                self._pending.pop(0)
                self._persist_locked()

    # -- delivery ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the background delivery thread (no-op when already running)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="specwatch-slack", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop the delivery thread, waiting up to `timeout` seconds; pending items stay queued.

        A request in flight is not interrupted (it lasts at most `self.timeout` seconds). Returns
        True when the thread has ended.
        """
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def drain(self, timeout: float = 30.0) -> bool:
        """Deliver pending notifications in this thread for up to `timeout` seconds.

        Waits out backoff and Retry-After like the background thread (the two may run at once;
        attempts are serialised). Request timeouts are shortened so the call ends within about
        `timeout`. Returns True when the queue is empty.
        """
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return self.queue_depth == 0
            wait = self._deliver_one(request_timeout=min(self.timeout, remaining))
            if wait is None:
                return True
            if wait > 0:
                time.sleep(min(wait, max(0.0, deadline - time.monotonic())))

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopping:
                    return
            wait = self._deliver_one(request_timeout=self.timeout)
            with self._cond:
                if self._stopping:
                    return
                if wait is None:
                    if not self._pending:
                        self._cond.wait()  # notify() or stop() wakes us
                elif wait > 0:
                    # notify() may wake us early; _deliver_one then returns the time still left.
                    self._cond.wait(wait)

    def _deliver_one(self, request_timeout: float) -> float | None:
        """Try the oldest notification once.

        Returns None when nothing is pending, 0 to go on at once, or seconds to wait before the
        head may be tried again.
        """
        with self._send_lock:
            with self._lock:
                if not self._pending:
                    return None
                item = self._pending[0]
            wait = self._not_before - time.monotonic()
            if wait > 0:
                return wait
            outcome, delay = self._attempt(item, request_timeout)
            if outcome == _RETRY:
                self._not_before = time.monotonic() + delay
                return delay
            self._failures = 0
            self._not_before = 0.0
            self._remove_head(item["seq"])
            return 0.0

    def _backoff(self) -> float:
        delay = min(self.backoff_max, self.backoff_initial * 2.0 ** min(self._failures, 60))
        self._failures += 1
        return delay * random.uniform(0.9, 1.0)  # jitter down, so backoff_max is a true cap

    def _attempt(self, item: dict, request_timeout: float) -> tuple[str, float]:
        seq = item["seq"]
        try:
            alert = Alert.from_dict(item["alert"])
            payload = build_payload(alert, channel=self.channel)
        except Exception as exc:  # a hand-edited or foreign queue file; retrying cannot help
            self.failed_total["permanent"] += 1
            log.error("Slack notification seq=%d is malformed (%s: %s); dropped", seq, type(exc).__name__, exc)
            return _DROPPED, 0.0

        if self._dry_run is not None:
            try:
                self._dry_run.write(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
                self._dry_run.flush()
            except (OSError, ValueError) as exc:  # closed or full stream: keep it queued
                self.failed_total["retry"] += 1
                delay = self._backoff()
                log.warning("dry-run output failed (%s); retry in %.2fs", exc, delay)
                return _RETRY, delay
            self._record_success()
            return _SENT, 0.0

        if self._session is None:
            self._session = requests.Session()
        try:
            resp = self._session.post(self._url.value, json=payload, timeout=request_timeout)
        except Exception as exc:  # noqa: BLE001 - anything here is retried, never kills the thread
            # requests puts the URL in its messages; only the redacted text is logged, no traceback.
            self.failed_total["retry"] += 1
            delay = self._backoff()
            log.warning(
                "Slack post of %s seq=%d failed (%s: %s); retry %d in %.2fs",
                alert.name, seq, type(exc).__name__, self._url.redact(str(exc)), self._failures, delay,
            )
            return _RETRY, delay

        status = resp.status_code
        body = self._url.redact(resp.text.strip())[:200]
        error = _error_code(body)
        if status == 200 and body == "ok":
            self._record_success()
            return _SENT, 0.0
        if error in PERMANENT_ERRORS or (400 <= status < 500 and status != 429):
            self.failed_total["permanent"] += 1
            log.error(
                "Slack rejected %s seq=%d permanently: HTTP %d %r; dropped", alert.name, seq, status, body
            )
            return _DROPPED, 0.0
        self.failed_total["retry"] += 1
        if status == 429:
            delay = _retry_after(resp.headers.get("Retry-After"))
            if delay is None:
                delay = self.backoff_initial * random.uniform(0.9, 1.0)
            log.warning("Slack rate-limited %s seq=%d; retry in %.2fs", alert.name, seq, delay)
            return _RETRY, delay
        delay = self._backoff()
        log.warning(
            "Slack post of %s seq=%d got HTTP %d %r; retry %d in %.2fs",
            alert.name, seq, status, body, self._failures, delay,
        )
        return _RETRY, delay

    def _record_success(self) -> None:
        self.sent_total += 1
        self.last_success_timestamp = time.time()


def _error_code(body: str) -> str:
    """Slack's error string: the body itself, or `error` of a JSON body."""
    if body.startswith("{"):
        try:
            return str(json.loads(body).get("error", ""))
        except (ValueError, AttributeError):
            return body
    return body


def _retry_after(value: str | None) -> float | None:
    """`Retry-After` → seconds ≥ 0: delta-seconds (what Slack sends) or an HTTP date; else None."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError):
        return None
