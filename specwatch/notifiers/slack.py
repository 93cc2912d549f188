"""Deliver notifications to a Slack incoming webhook, in order, surviving outages and restarts.

`build_payload` turns an `Alert` into Block Kit JSON, `build_notification_payload` a group of
alerts; `SlackNotifier` queues them through the shared durable queue (`notifiers/queue.py`):
transient failures (network, timeout, 5xx, 429) are retried forever, permanent ones (Slack says
the payload or the webhook is bad) are logged once and dropped. Slack's responses:
https://api.slack.com/changelog/2016-05-17-changes-to-errors-for-incoming-webhooks and
https://api.slack.com/docs/rate-limits (429 with `Retry-After`).
"""

from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING

from specwatch.alerts.model import FIRING, RESOLVED, Alert, Notification, iso8601, split_code
from specwatch.notifiers.http import REDACTED, RETRY, SENT, Attempt, Secret, check_url, new_session, post_json
from specwatch.notifiers.queue import QueuedNotifier

if TYPE_CHECKING:
    import requests

log = logging.getLogger("specwatch.notifiers.slack")

# Block Kit limits (api.slack.com/reference/block-kit): per-message, per-section, per-field.
MAX_BLOCKS = 50
MAX_SECTION_TEXT = 3000
MAX_FIELD_TEXT = 2000
MAX_FIELDS_PER_SECTION = 10
MAX_HEADER_TEXT = 150
# `text` is the notification fallback: one line, kept short enough for a phone banner.
MAX_FALLBACK_TEXT = 300
AT_FIRING_SHOWN = 4  # a resolved alert's firing evidence: its first pairs, on one context line

# Body strings Slack returns for a request that will never succeed as sent (Slack changelog above).
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


# --------------------------------------------------------------------------------------------
# Payload


def escape_entities(text: str) -> str:
    """Escape only `&`, `<`, `>` (no mention or link can form): what Slack asks of any text,
    and all that the inside of a code span needs (see `mrkdwn`)."""
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


def mrkdwn(text: str, one_line: bool = False) -> str:
    """Alert text (summary, description, fixes: specwatch's words with code spans, see
    `alerts.model.code`) as Slack mrkdwn that shows every value literally.

    Text outside code spans goes through `escape_mrkdwn`. A code span stays a Slack code span
    (Slack formats nothing inside one, so `*`, `_`, `~` in a path show as typed and a command
    stays copyable) with `&`, `<`, `>` as entities; Slack has no way to put a backtick inside
    one, so a backtick in the value becomes a look-alike (U+02CB) and cannot end the span (the
    webhook and Alertmanager payloads carry the exact text). `one_line`: whitespace runs outside
    code spans become one space; newlines inside them, a space.
    """
    out = []
    for is_code, part in split_code(text):
        if is_code:
            out.append("`" + escape_entities(part).replace("`", _LOOKALIKE["`"]).replace("\n", " ") + "`")
        else:
            out.append(escape_mrkdwn(_WS.sub(" ", part) if one_line else part))
    return "".join(out)


_WS = re.compile(r"\s+")
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
    head = escape_mrkdwn(_one_line(head))
    if alert.status == RESOLVED:
        detail = (
            f"resolved after {format_duration(alert.ends_at - alert.starts_at)}"
            if alert.ends_at is not None
            else "resolved"
        )
    elif alert.annotations.get("update"):
        detail = mrkdwn(alert.annotations["update"], one_line=True)  # the news, not what it said before
    else:
        detail = _firing_detail(alert)
    return _truncate(f"{head}: {detail}" if detail else head, MAX_FALLBACK_TEXT)


def _firing_detail(alert: Alert, was: bool = True) -> str:
    """What a firing alert's phone banner shows after its name and where, as mrkdwn: for an
    acceptance alert (its first evidence item is `accept len ...`) that item and, when its recent
    trend (`accept_length_recent`) went higher, the highest it was (`accept len 1.00 (was
    3.10)`, unless `was` is False: a message of several ranks names each rank's value only); for
    any other its summary (`hung scheduler (watchdog timeout) in the log of ...`),
    else its first evidence item. Never a word of resolving: that is the resolve's."""
    first = alert.evidence[0] if alert.evidence else None
    if first is not None and str(first[0]).startswith("accept len"):
        return f"{escape_mrkdwn(_one_line(str(first[0])))} {literal(_one_line(str(first[1])))}{_was(alert, first[1]) if was else ''}"
    summary = alert.annotations.get("summary", "")
    if summary:
        return mrkdwn(summary, one_line=True)
    return f"{escape_mrkdwn(_one_line(str(first[0])))} {literal(_one_line(str(first[1])))}" if first else ""


def _was(alert: Alert, value: object) -> str:
    """` (was 3.10)`: the highest of the alert's recent accept length trend before its last point,
    when at least 0.1 above `value` (a number); "" otherwise."""
    try:
        now = float(str(value).split()[-1])
        trend = [float(v) for v in alert.annotations.get("accept_length_recent", "").split()]
    except (ValueError, IndexError):
        return ""
    was = max(trend[:-1], default=now)
    return f" (was {was:.2f})" if was >= now + 0.1 else ""


def literal(text: str) -> str:
    """A raw value (an evidence value, a log line, a path) as Slack mrkdwn that shows it as typed:
    as it is (`&`, `<`, `>` as entities) when none of its characters could format; else in a code
    span, or a code block when it spans lines or holds a backtick, where Slack formats nothing, so
    `__init__`, `specwatch_gpu_*` and a traceback copy out exact, not as look-alikes. Only a
    "```" inside a block is changed (to look-alike backticks: nothing else can end a block)."""
    plain = escape_entities(text)
    if escape_mrkdwn(text) == plain:
        return plain
    if "\n" in text or "`" in text:
        return "```" + plain.replace("```", _LOOKALIKE["`"] * 3) + "```"
    return "`" + plain + "`"


SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], floor: float = 1.0) -> str:
    """Unicode bars, one per value, from `floor` (the lowest bar: accept len 1.0, nothing
    accepted) to the largest value (the highest bar); all at the floor → all lowest bars."""
    top = max(values, default=floor)
    span = top - floor
    if span <= 0:
        return SPARK[0] * len(values)
    last = len(SPARK) - 1
    return "".join(SPARK[min(last, max(0, round((v - floor) / span * last)))] for v in values)


def _trend(alert: Alert) -> str | None:
    """The `accept_length_recent` annotation (the rank's recent accept length, oldest first,
    space-separated: 10 s means, then the firing line's value, see `Pipeline._add_trend`) as a sparkline with first → last
    values, and the `accept_length_ranks` annotation (the server's lowest and highest rank)."""
    raw = alert.annotations.get("accept_length_recent", "")
    try:
        values = [float(v) for v in raw.split()]
    except ValueError:
        return None
    if not values:
        return None
    text = (f"*accept len, recent trend*\n"
            f"`{sparkline(values)}` {values[0]:.2f} → {values[-1]:.2f}")
    ranks = alert.annotations.get("accept_length_ranks", "")
    return text + (f"\n{escape_mrkdwn(_one_line(ranks))}" if ranks else "")


def _field(name: str, value: str) -> dict:
    # Name and value both come from the alert (evidence names may be log-derived too).
    text = f"*{escape_mrkdwn(_one_line(name))}*\n{literal(value)}"
    return {"type": "mrkdwn", "text": _truncate(text, MAX_FIELD_TEXT)}


def _section(text: str) -> dict:
    return {"type": "section", "text": {"type": "mrkdwn", "text": _truncate(text, MAX_SECTION_TEXT)}}


def build_payload(alert: Alert, *, channel: str | None = None) -> dict:
    """Slack incoming-webhook JSON (Block Kit) for one alert.

    Firing: header (emoji + alert name), fields (server, rank — "" shown as "(single rank)" —
    then each evidence pair in order), the description, "What to check" with `alert.fixes`
    numbered, and a context line ("replay of <files>" for a `replay` label, start time, severity, fingerprint). Resolved: header, a
    "Resolved after <ends_at - starts_at>" section, server, rank and the evidence of why it
    resolved (`Alert.why_resolved`) as fields, the first 4 pairs it fired with on an "At
    firing:" context line; no description or fixes.
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
    now, before = _evidence_now(alert)
    fields += [_field(str(n), str(v)) for n, v in now]

    tail: list[dict] = []
    if before:  # a resolved alert's firing evidence: history, not the current state
        line = " · ".join(f"{escape_mrkdwn(_one_line(str(n)))}: {literal(_one_line(str(v)))}"
                          for n, v in before[:AT_FIRING_SHOWN]) + (" · …" if len(before) > AT_FIRING_SHOWN else "")
        tail.append({"type": "context", "elements": [
            {"type": "mrkdwn", "text": _truncate(f"*At firing:* {line}", MAX_SECTION_TEXT)}]})
    if not resolved:
        if alert.annotations.get("update"):
            tail.append(_section(f"*Update:* {mrkdwn(alert.annotations['update'])}"))
        trend = _trend(alert)
        if trend:
            tail.append(_section(trend))
        description = alert.annotations.get("description", "") or alert.annotations.get("summary", "")
        if description:
            tail.append(_section(mrkdwn(description)))
        if alert.fixes:
            items = "\n".join(f"{i}. {mrkdwn(f, one_line=True)}" for i, f in enumerate(alert.fixes, 1))
            tail.append(_section(f"*What to check*\n{items}"))
    context = [f"started {iso8601(alert.starts_at)}"]
    if alert.labels.get("replay"):  # `replay --notify`: an old episode, not a live one
        context.insert(0, f"replay of {escape_mrkdwn(_one_line(alert.labels['replay']))}")
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


def _evidence_now(alert: Alert) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(pairs that hold now, pairs from when it fired): a firing alert's evidence is all current;
    a resolved one's current pairs are those its rule added on resolving (`Alert.why_resolved`)."""
    if alert.status != RESOLVED:
        return list(alert.evidence), []
    why = set(alert.why_resolved)
    return ([p for i, p in enumerate(alert.evidence) if i in why],
            [p for i, p in enumerate(alert.evidence) if i not in why])


def _alert_line(alert: Alert) -> str:
    where = _where(alert)
    line = f"{_EMOJI.get(alert.status, ':grey_question:')} *{escape_mrkdwn(alert.name or 'alert')}*"
    if where:
        line += f" on {escape_mrkdwn(where)}"
    if alert.status == RESOLVED:
        if alert.ends_at is not None:
            line += f": resolved after {format_duration(alert.ends_at - alert.starts_at)}"
        return line
    if alert.annotations.get("update"):
        line += f" _(update)_\n*Update:* {mrkdwn(alert.annotations['update'])}"
    summary = alert.annotations.get("summary", "")
    trend = _trend(alert)
    return line + (f"\n{mrkdwn(summary, one_line=True)}" if summary else "") + (f"\n{trend}" if trend else "")


def _reading_order(alert: Alert) -> tuple:
    """Alerts of a message by name, server, then rank as a person counts (DP2 before DP10)."""
    where = [int(t) if t.isdigit() else t for t in _DIGITS.split(alert.labels.get("rank", ""))]
    return alert.name, alert.labels.get("server", ""), where, alert.fingerprint


_DIGITS = re.compile(r"(\d+)")


def build_notification_payload(notification: Notification, *, channel: str | None = None) -> dict:
    """Slack JSON for a group notification.

    One alert: exactly `build_payload(alert)`. Several: a header counting firing and resolved
    alerts, then per alert (firing first; by name, server, then rank: DP2 before DP10) a divider, a line with its name, where and summary,
    up to 10 evidence fields (a resolved alert: why it resolved) and, while firing, its numbered fixes
    (fixes the same as an earlier alert's: "as for <server rank> above"). Alerts that would pass
    Slack's 50-block cap are counted in a last "N more alerts not shown" line. `text`, the
    fallback (what a phone shows), reads e.g. `[FIRING:2] AcceptanceCollapse on sglang-0: DP3 TP3
    accept len 1.02; DP5 TP5 accept len 1.04`, with `(+N resolved)` after them when the group also
    holds resolved alerts. An update (a firing alert
    with `annotations["update"]`) is marked "(update)" with its note, and the fallback starts
    with `[UPDATE]`.
    """
    alerts = notification.alerts
    if len(alerts) == 1:
        return build_payload(alerts[0], channel=channel)
    firing = sorted((a for a in alerts if a.status == FIRING), key=_reading_order)
    resolved = sorted((a for a in alerts if a.status != FIRING), key=_reading_order)
    server = notification.common_labels().get("server", "")
    names = lambda group: ", ".join(sorted({a.name or "alert" for a in group}))  # noqa: E731
    if firing:
        # a phone shows only this: each firing rank with its value, the resolved ones only counted after
        # them (a banner ending in "resolved: <name>" reads as if the incident were over)
        each = "; ".join(" ".join(p for p in (escape_mrkdwn(_one_line(a.labels.get("rank", "") if server else _where(a))),
                                              _firing_detail(a, was=False)) if p)
                         for a in firing)
        fallback = (escape_mrkdwn(_one_line(f"[FIRING:{len(firing)}] {names(firing)}" + (f" on {server}" if server else "")))
                    + (f": {each}" if each else ""))
        if resolved:
            fallback += f" (+{len(resolved)} resolved)"
    else:
        fallback = escape_mrkdwn(_one_line(f"[RESOLVED:{len(resolved)}] {names(resolved)}" + (f" on {server}" if server else "")))
    if any(a.annotations.get("update") for a in firing):
        fallback = "[UPDATE] " + fallback
    title = f"{_EMOJI[FIRING if firing else RESOLVED]} {len(alerts)} alerts: {len(firing)} firing, {len(resolved)} resolved"
    blocks: list[dict] = [{"type": "header", "text": {"type": "plain_text", "text": title, "emoji": True}}]
    shown = 0
    listed: dict[tuple[str, ...], str] = {}  # fixes already shown → the alert they were shown with
    for a in firing + resolved:
        part: list[dict] = [{"type": "divider"}, _section(_alert_line(a))]
        fields = [_field(str(n), str(v)) for n, v in _evidence_now(a)[0][:MAX_FIELDS_PER_SECTION]]
        if fields:
            part.append({"type": "section", "fields": fields})
        if a.status == FIRING and a.fixes:
            first = listed.setdefault(tuple(a.fixes), _where(a) or a.name or "alert")
            if first != (_where(a) or a.name or "alert"):  # ranks of one incident share their fixes: once
                part.append(_section(f"*What to check:* as for {escape_mrkdwn(first)} above"))
            else:
                items = "\n".join(f"{i}. {mrkdwn(f, one_line=True)}" for i, f in enumerate(a.fixes, 1))
                part.append(_section(f"*What to check*\n{items}"))
        if len(blocks) + len(part) > MAX_BLOCKS - 1:  # keep one block for the "not shown" line
            break
        blocks += part
        shown += 1
    if shown < len(alerts):
        blocks.append({"type": "context", "elements": [
            {"type": "mrkdwn", "text": f"_{len(alerts) - shown} more alerts not shown_"}]})
    payload: dict = {"text": _truncate(fallback, MAX_FALLBACK_TEXT), "blocks": blocks}
    if channel:
        payload["channel"] = channel
    return payload


def payload_text(payload: dict) -> str:
    """A Block Kit payload as the message reads: the header, each section's mrkdwn, fields as
    `name: value` lines, context lines, with `&lt;`-style entities shown as their characters
    (what Slack displays). For `replay --slack-dry-run`; the payload itself is unchanged."""
    out = []
    for block in payload.get("blocks") or []:
        kind = block.get("type")
        if kind == "header":
            title = (block.get("text") or {}).get("text", "")
            out += [title, "=" * min(len(title), 60)]
        elif kind == "section":
            if block.get("text"):
                out.append(_unescape(block["text"].get("text", "")))
            for f in block.get("fields") or []:
                name, _, value = f.get("text", "").partition("\n")
                out.append(f"{_unescape(name.strip('*'))}: {_unescape(value)}")
        elif kind == "context":
            out += [_unescape(e.get("text", "")) for e in block.get("elements") or []]
        elif kind == "divider":
            out.append("-" * 40)
        out.append("")
    if not out:
        out = [_unescape(payload.get("text", "")), ""]
    return "\n".join(out) + "\n"


def _unescape(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


# --------------------------------------------------------------------------------------------
# Notifier


class SlackNotifier(QueuedNotifier):
    """Post notifications to a Slack incoming webhook, oldest first, through the durable queue.

    webhook_url: secret; never logged, shown in repr or put in an exception message.
    channel: channel override for legacy webhooks (new-style webhooks are bound to one channel).
    bot_token: a bot token (secret, like the URL): webhook_url is then the Web API's
        `chat.postMessage` URL, posted to with the token as Bearer and `channel` in the body; a
        group's next notification while its incident is open edits that message
        (`chat.update` with its `ts`, https://api.slack.com/methods/chat.update) instead of
        posting another: later ranks joining, their diagnosis, the resolve. A repeat (the same
        firing alerts, nothing new) and a new incident post a new message. The `ts` of each
        open message is kept in memory: after a restart the next notification posts anew.
    session: a `requests.Session` to post with (default: a new one).
    queue_options (queue_path, timeout, backoff_initial, backoff_max, dry_run, send_resolved)
    and the counters: see `QueuedNotifier`. A 200 `ok` is delivered; Slack's permanent error strings
    (`PERMANENT_ERRORS`) and other 4xx except 429 drop the message; the rest is retried.

    Raises ValueError when webhook_url is not an http(s) URL (message omits the URL) or a
    backoff/timeout is not positive.
    """

    kind = "Slack"

    updates_in_place = False  # the dispatcher may send a joining rank at once: it edits, never adds

    def __init__(self, webhook_url: str, *, name: str = "slack", channel: str | None = None,
                 session: requests.Session | None = None, bot_token: str | None = None, **queue_options) -> None:
        check_url(webhook_url, "webhook_url")
        self._url = Secret(webhook_url)
        self.channel = channel
        self._session = session
        self._token = Secret(bot_token) if bot_token else None
        self.updates_in_place = self._token is not None
        if self._token is not None:
            base = webhook_url.rsplit("/", 1)[0]
            self._update_url = Secret(f"{base}/chat.update")
        # group key → (channel id, ts, firing fingerprints) of the message open for it (bot only)
        self._open: dict[str, tuple[str, str, frozenset]] = {}
        super().__init__(name, logger=log, **queue_options)

    def __repr__(self) -> str:
        return (
            f"SlackNotifier(name={self.name!r}, webhook_url={REDACTED}, queue_path={self.queue_path!r}, "
            f"queue_depth={self.queue_depth}, dry_run={self._dry_run is not None})"
        )

    @property
    def target(self) -> tuple[str, str | None]:
        """(webhook URL, channel): two routes with the same target share one notifier."""
        return self._url.value, self.channel

    def notify(self, notification: Notification | Alert) -> int:
        """Queue a notification (or one alert) and return its sequence number at once.

        Later changes to the argument do not affect what is sent. Raises TypeError when it holds
        values JSON cannot encode.
        """
        if isinstance(notification, Alert):
            notification = Notification.single(notification, receiver=self.name)
        return super().notify(notification)

    def render(self, data: dict) -> dict:
        n = Notification.from_dict(data)
        payload = build_notification_payload(n, channel=self.channel)
        if self._token is None:
            return payload
        firing = frozenset(a.fingerprint for a in n.alerts if a.status != RESOLVED)
        news = any(a.annotations.get("update") or a.status == RESOLVED for a in n.alerts)
        prev = self._open.get(n.group_key)
        if prev is not None and (news or not firing <= prev[2]):  # else a repeat: notify again
            payload.update(channel=prev[0], ts=prev[1])  # something new for the open message: edit it
            return {"method": "chat.update", "group": n.group_key, "firing": sorted(firing), "body": payload}
        return {"method": "chat.postMessage", "group": n.group_key, "firing": sorted(firing), "body": payload}

    def dry_run_text(self, payload: object) -> str:
        return payload_text(payload) if isinstance(payload, dict) else super().dry_run_text(payload)

    def send(self, payload: object, timeout: float) -> Attempt:
        session = self._session
        if session is None:
            session = self._session = new_session()
        if self._token is not None:
            assert isinstance(payload, dict)  # render's Web API call
            return self._send_api(session, self._token, payload, timeout)
        return post_json(
            session, self._url, payload, timeout,
            # Slack answers 200 `ok`; a proxy or compatible receiver may answer any 2xx body.
            # Re-posting an accepted message forever is worse than trusting the status.
            succeeded=lambda status, body: 200 <= status < 300 and _error_code(body) not in PERMANENT_ERRORS,
            permanent=lambda status, body: _error_code(body) in PERMANENT_ERRORS or (400 <= status < 500 and status != 429),
        )


    def _send_api(self, session: requests.Session, token: Secret, payload: dict, timeout: float) -> Attempt:
        """One Web API call (chat.postMessage or chat.update): Slack answers 200 with `ok` in a
        JSON body, `error` naming what failed; the `ts` of a posted message is kept for its group
        while it has firing alerts."""
        url = self._update_url if payload["method"] == "chat.update" else self._url
        answer: dict = {}

        def ok(status: int, body: str) -> bool:
            try:
                answer.update(json.loads(body))
            except ValueError:
                return False
            return 200 <= status < 300 and answer.get("ok") is True

        result = post_json(
            session, url, payload["body"], timeout, succeeded=ok,
            permanent=lambda status, body: _error_code(body) in PERMANENT_ERRORS | API_PERMANENT_ERRORS
            or (400 <= status < 500 and status != 429),
            headers={"Authorization": f"Bearer {token.value}"}, full_body=True)
        if result.outcome == SENT:
            group, firing = payload["group"], frozenset(payload["firing"])
            if not firing:
                self._open.pop(group, None)  # all resolved: the next incident posts anew
            elif payload["method"] == "chat.postMessage":
                self._open[group] = (str(answer.get("channel", "")), str(answer.get("ts", "")), firing)
            else:
                channel, ts, _ = self._open.get(group, (payload["body"]["channel"], payload["body"]["ts"], firing))
                self._open[group] = (channel, ts, firing)
        elif payload["method"] == "chat.update" and answer.get("error") in ("message_not_found", "cant_update_message"):
            self._open.pop(payload["group"], None)  # deleted or too old: the retry posts a new one
            result = Attempt(RETRY, 0.0, result.detail, status=result.status)
        return result


# Web API errors (https://api.slack.com/methods/chat.postMessage, chat.update) that no retry fixes.
API_PERMANENT_ERRORS = frozenset({"not_authed", "invalid_auth", "account_inactive", "token_revoked",
                                  "missing_scope", "not_in_channel", "msg_too_long", "no_text", "too_many_attachments"})


def _error_code(body: str) -> str:
    """Slack's error string: the body itself, or `error` of a JSON body."""
    if body.startswith("{"):
        try:
            return str(json.loads(body).get("error", ""))
        except (ValueError, AttributeError):
            return body
    return body
