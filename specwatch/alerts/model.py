"""The alert: what a rule raises and a notifier delivers.

Shaped after Alertmanager's alert (labels identify it, annotations describe it, a fingerprint is a
hash of the labels) so the same object can be pushed to `/api/v2/alerts` later. Notifiers know
nothing about SGLang: everything they print is in labels, annotations, evidence and fixes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

FIRING = "firing"
RESOLVED = "resolved"


@dataclass(slots=True)
class Alert:
    """One alert instance.

    labels: identity, e.g. {"alertname": "AcceptanceCollapse", "severity": "critical",
        "server": "sglang-0", "rank": "DP0 TP0"}.
    annotations: {"summary": one line, "description": a paragraph}.
    evidence: ordered (name, value) pairs shown to the user, values already formatted as text
        (taken from logs: notifiers must escape them).
    fixes: concrete things to check or change, most likely first.
    starts_at / ends_at: seconds since the epoch; ends_at is None while firing.
    """

    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float
    evidence: list[tuple[str, str]] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)
    ends_at: float | None = None
    status: str = FIRING

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")

    @property
    def fingerprint(self) -> str:
        """16 hex digits of SHA-256 over the sorted labels (stable across runs and hosts)."""
        blob = json.dumps(sorted(self.labels.items()), separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["evidence"] = [list(p) for p in self.evidence]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Alert":
        d = dict(d)
        d["evidence"] = [tuple(p) for p in d.get("evidence", [])]
        return cls(**d)


def iso8601(ts: float | None) -> str | None:
    """Seconds since the epoch → RFC 3339 in UTC (`2026-02-23T16:32:42Z`); None stays None."""
    if ts is None:
        return None
    dt = datetime.fromtimestamp(ts, tz=timezone.utc)
    return dt.isoformat(timespec="milliseconds" if ts % 1 else "seconds").replace("+00:00", "Z")
