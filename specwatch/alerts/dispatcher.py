"""From rule transitions to notifications: dedup by fingerprint, repeat interval, resolve.

A firing alert is sent once, then again only every `repeat_interval` seconds while it keeps
firing; a resolved alert is sent once. Time comes from the caller's clock (log timestamps in
replay, wall time in the daemon), so replay and run share this code path.
"""

from __future__ import annotations

import copy
from typing import Protocol

from specwatch.alerts.model import FIRING, RESOLVED, Alert


class Notifier(Protocol):
    def notify(self, alert: Alert) -> None: ...


class Dispatcher:
    def __init__(self, notifiers: list[Notifier], repeat_interval: float = 4 * 3600.0):
        self.notifiers = list(notifiers)
        self.repeat_interval = repeat_interval
        self.active: dict[str, Alert] = {}
        self._last_sent: dict[str, float] = {}
        self.history: list[Alert] = []  # every notification sent, as sent (for replay summaries)

    def handle(self, alert: Alert, now: float) -> None:
        """Take a transition from a rule: a newly firing alert, an update of a firing one
        (`annotations["update"]` says what changed; the mark is removed so repeats do not carry
        it), or a resolved one."""
        fp = alert.fingerprint
        if alert.status == FIRING:
            if fp in self.active:
                # already firing: repeats come from tick(); an update (new content, e.g. diagnosis
                # findings, marked annotations["update"]) is sent once, now
                note = alert.annotations.pop("update", None)
                if note:
                    self.active[fp] = alert
                    snap = copy.deepcopy(alert)
                    snap.annotations["update"] = note
                    self._send(snap, now)
                return
            self.active[fp] = alert
            self._send(alert, now)
        elif alert.status == RESOLVED and fp in self.active:
            del self.active[fp]
            self._last_sent.pop(fp, None)
            self._send(alert, now)

    def tick(self, now: float) -> None:
        """Re-send firing alerts whose repeat interval has passed."""
        for fp, alert in list(self.active.items()):
            if now - self._last_sent.get(fp, now) >= self.repeat_interval:
                self._send(alert, now)

    def _send(self, alert: Alert, now: float) -> None:
        snap = copy.deepcopy(alert)
        self._last_sent[alert.fingerprint] = now
        self.history.append(snap)
        for n in self.notifiers:
            n.notify(snap)

    def to_state(self) -> dict:
        return {"active": [a.to_dict() for a in self.active.values()], "last_sent": self._last_sent}

    def load_state(self, state: dict) -> None:
        for d in state.get("active", []):
            a = Alert.from_dict(d)
            self.active[a.fingerprint] = a
        self._last_sent.update(state.get("last_sent", {}))
