"""`SpecwatchNotificationsFailing`: a receiver refuses notifications, said through the others.

A notifier keeps what its receiver refuses in its dead letter (`queue.QueuedNotifier`); this
turns that into an alert, one per receiver, so a Slack webhook that answers 404 is heard of in
the webhook, Alertmanager or the other Slack routes (the receiver named is never sent it:
`QueuedNotifier.notify`). It fires while the receiver's dead letter holds anything and resolves
once it is empty (retried and delivered, or the receiver removed from the config).

Stateless: each check compares the notifiers with the alerts of this name the dispatcher holds
firing, so an alert restored after a restart resolves or stays as its receiver's dead letter says.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from specwatch.alerts.model import FIRING, RESOLVED, Alert
from specwatch.notifiers.queue import FAILING_ALERT, QueuedNotifier

ALERT_NAME = FAILING_ALERT


def failing_alert(receiver: str, kind: str, refused: list[dict], server: str, now: float) -> Alert:
    """The alert for `receiver` (a notifier's name), `refused` its `dead_letter()` (non-empty)."""
    last = refused[-1]
    status = f"HTTP {last['status']}" if last.get("status") is not None else "no HTTP status"
    return Alert(
        labels={"alertname": ALERT_NAME, "severity": "critical", "server": server, "rank": "",
                "receiver": receiver},
        annotations={
            "summary": f"{kind} receiver {receiver} refuses notifications ({status}): "
                       f"{len(refused)} kept undelivered",
            "description": f"{receiver} answered {last.get('detail', '')[:200]} to {last['what']}; "
                           "specwatch keeps what it refused in state_dir and sends it again when the "
                           "receiver takes a notification, its URL changes, or on "
                           "`specwatch notifications retry`.",
        },
        starts_at=now,
        evidence=[("receiver", receiver), ("answer", status), ("kept undelivered", str(len(refused))),
                  ("oldest refused", refused[0]["what"])],
        fixes=[f"Check the URL of {receiver} in the config (a 404 from Slack: the webhook was revoked or "
               "its channel deleted; create a new one), then reload (SIGHUP): the kept notifications are "
               "sent to the new URL",
               "`specwatch notifications list` shows what is kept; `specwatch notifications retry` sends it again"],
    )


def check(notifiers: Mapping[str, QueuedNotifier], active: Iterable[Alert], server: str, now: float) -> list[Alert]:
    """Transitions to hand the dispatcher: a firing alert for each notifier whose dead letter
    holds something and has none firing; a resolve for each firing one whose receiver's dead
    letter is empty or which is no longer configured."""
    firing = {a.labels.get("receiver", ""): a for a in active if a.name == ALERT_NAME and a.status == FIRING}
    out = []
    for name, n in notifiers.items():
        if getattr(n, "dead_letter_count", 0) and name not in firing:
            out.append(failing_alert(name, getattr(n, "kind", "notifier"), n.dead_letter(), server, now))
    for name, a in firing.items():
        kept = notifiers.get(name)
        if kept is None or not getattr(kept, "dead_letter_count", 0):
            done = Alert.from_dict(a.to_dict())
            done.status, done.ends_at = RESOLVED, now
            done.resolved_with(("resolved because", "its refused notifications were delivered" if kept is not None
                                else "the receiver is no longer in the config"), first=True)
            out.append(done)
    return out
