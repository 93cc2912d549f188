"""The alert: what a rule raises and a notifier delivers; the notification: a group of alerts.

Shaped after Alertmanager's alert (labels identify it, annotations describe it, a fingerprint is a
hash of the labels) so the same object can be pushed to `/api/v2/alerts` as is. Notifiers know
nothing about SGLang: everything they print is in labels, annotations, evidence and fixes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import overload

FIRING = "firing"
RESOLVED = "resolved"


@functools.lru_cache(maxsize=4096)  # inhibition and grouping ask for it on every tick
def _fingerprint(items: tuple[tuple[str, str], ...]) -> str:
    blob = json.dumps(items, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(slots=True)
class Alert:
    """One alert instance.

    labels: identity, e.g. {"alertname": "AcceptanceCollapse", "severity": "critical",
        "server": "sglang-0", "rank": "DP0 TP0"}.
    annotations: {"summary": one line, "description": a paragraph, optional "runbook_url"}.
    evidence: ordered (name, value) pairs shown to the user, values already formatted as text
        (taken from logs: notifiers must escape them).
    fixes: concrete things to check or change, most likely first.
    starts_at / ends_at: seconds since the epoch; ends_at is None while firing.
    why_resolved: indices into `evidence` of the pairs the rule added when it resolved the alert
        (why it resolved, e.g. `recovered accept len`); the others are as they were at firing.
    """

    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float
    evidence: list[tuple[str, str]] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)
    ends_at: float | None = None
    status: str = FIRING
    why_resolved: list[int] = field(default_factory=list)

    def resolved_with(self, *evidence: tuple[str, str], first: bool = False) -> None:
        """Add the pairs that say why the alert resolved (at the end, or before the others when
        `first`) and note them in `why_resolved`. Does not change `status`."""
        if first:
            self.evidence[:0] = evidence
            self.why_resolved = list(range(len(evidence)))
        else:
            self.why_resolved = list(range(len(self.evidence), len(self.evidence) + len(evidence)))
            self.evidence.extend(evidence)

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")

    @property
    def fingerprint(self) -> str:
        """16 hex digits of SHA-256 over the sorted labels (stable across runs and hosts)."""
        return _fingerprint(tuple(sorted(self.labels.items())))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["evidence"] = [list(p) for p in self.evidence]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Alert":
        d = dict(d)
        d["evidence"] = [tuple(p) for p in d.get("evidence", [])]
        return cls(**d)

    def flat_annotations(self) -> dict[str, str]:
        """Annotations as Alertmanager carries them (strings only): the alert's own, plus
        `evidence` ("name: value" lines) and `fixes` (numbered lines) when there are any."""
        out = dict(self.annotations)
        if self.evidence:
            out["evidence"] = "\n".join(f"{n}: {v}" for n, v in self.evidence)
        if self.fixes:
            out["fixes"] = "\n".join(f"{i}. {f}" for i, f in enumerate(self.fixes, 1))
        return out


@dataclass(slots=True)
class Notification:
    """What one receiver is sent for one aggregation group (Alertmanager's model).

    receiver: the notifier's name (`slack`, `webhook/ops`, ...). group_key: stable text naming
    the route and the group's label values. group_labels: the values of the route's group_by.
    alerts: firing ones first, then resolved ones, each a snapshot. truncated: alerts left out
    by a receiver's max_alerts (webhook `truncatedAlerts`).
    """

    receiver: str
    group_key: str
    group_labels: dict[str, str]
    alerts: list[Alert]
    truncated: int = 0

    @property
    def status(self) -> str:
        return FIRING if any(a.status == FIRING for a in self.alerts) else RESOLVED

    def common_labels(self) -> dict[str, str]:
        return _common([a.labels for a in self.alerts])

    def common_annotations(self) -> dict[str, str]:
        return _common([a.flat_annotations() for a in self.alerts])

    def to_dict(self) -> dict:
        return {"receiver": self.receiver, "group_key": self.group_key, "group_labels": dict(self.group_labels),
                "alerts": [a.to_dict() for a in self.alerts], "truncated": self.truncated}

    @classmethod
    def from_dict(cls, d: dict) -> "Notification":
        return cls(receiver=str(d["receiver"]), group_key=str(d["group_key"]),
                   group_labels=dict(d.get("group_labels", {})),
                   alerts=[Alert.from_dict(a) for a in d["alerts"]], truncated=int(d.get("truncated", 0)))

    @classmethod
    def single(cls, alert: Alert, receiver: str = "") -> "Notification":
        """A notification of one alert (group key = its fingerprint)."""
        return cls(receiver=receiver, group_key=alert.fingerprint, group_labels={}, alerts=[alert])


# --- text of summaries, descriptions and fixes ---------------------------------------------
# They are Markdown-like text: specwatch's words, with commands and values in code spans. Every
# value from a log, a checkpoint or an API goes in a span made by `code()` (in a command, also
# shell-quoted), so a notifier can show it literally (`split_code`) and a backtick in it cannot
# end the span early.

_BACKTICKS = re.compile(r"`+")


def code(text: object) -> str:
    """`text` as a CommonMark code span (spec 0.31, §6.1) that holds it exactly: the fence is one
    backtick longer than the longest run of backticks inside, with a space of padding when the
    text starts or ends with a backtick (or with spaces at both ends, which a reader strips).
    E.g. code("ls") == "`ls`", code("a`b") == "``a`b``"."""
    text = str(text)
    fence = "`" * (max((len(m.group()) for m in _BACKTICKS.finditer(text)), default=0) + 1)
    pad = " " if text[:1] == "`" or text[-1:] == "`" or (text[:1] == text[-1:] == " " and text.strip(" ")) else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def split_code(text: str) -> list[tuple[bool, str]]:
    """Text → [(is_code, part)], code spans found as CommonMark finds them (the inverse of
    `code`): a run of n backticks opens a span that the next run of exactly n backticks closes;
    the content loses one space at each end when it has one at both; a run with no closer is
    text. Adjacent text parts are merged."""
    out: list[tuple[bool, str]] = []
    pos = i = 0
    while (m := _BACKTICKS.search(text, i)) is not None:
        n, end = len(m.group()), None
        for c in _BACKTICKS.finditer(text, m.end()):
            if len(c.group()) == n:
                end = c
                break
        if end is None:
            i = m.end()
            continue
        if m.start() > pos:
            out.append((False, text[pos:m.start()]))
        body = text[m.end():end.start()].replace("\n", " ")
        if len(body) > 1 and body[0] == body[-1] == " " and body.strip(" "):
            body = body[1:-1]
        out.append((True, body))
        pos = i = end.end()
    if pos < len(text):
        out.append((False, text[pos:]))
    return out


def _common(dicts: list[dict[str, str]]) -> dict[str, str]:
    """The pairs every dict has with the same value."""
    if not dicts:
        return {}
    first, rest = dicts[0], dicts[1:]
    return {k: v for k, v in first.items() if all(d.get(k) == v for d in rest)}


@overload
def iso8601(ts: float) -> str: ...
@overload
def iso8601(ts: None) -> None: ...
@overload
def iso8601(ts: float | None) -> str | None: ...


def iso8601(ts: float | None) -> str | None:
    """Seconds since the epoch → RFC 3339 in UTC (`2026-02-23T16:32:42Z`); None stays None."""
    if ts is None:
        return None
    dt = datetime.fromtimestamp(ts, tz=timezone.utc)
    return dt.isoformat(timespec="milliseconds" if ts % 1 else "seconds").replace("+00:00", "Z")
