"""Generic webhook: POST Alertmanager's webhook payload (version 4) to any URL.

The body is what Alertmanager's own `webhook_config` sends (prometheus/alertmanager
`docs/configuration.md`, `<webhook_config>`), so receivers
written for Alertmanager (alerta, PagerDuty bridges, chat relays) take specwatch's notifications
as they are. Evidence and fixes travel as the `evidence` and `fixes` annotations.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from specwatch.alerts.model import FIRING, Alert, Notification, iso8601
from specwatch.notifiers.http import REDACTED, Attempt, Secret, check_url, new_session, post_json
from specwatch.notifiers.queue import QueuedNotifier

if TYPE_CHECKING:
    import requests

log = logging.getLogger("specwatch.notifiers.webhook")

# Alertmanager writes Go's zero time as the end of an alert that has none.
ZERO_TIME = "0001-01-01T00:00:00Z"


def webhook_alert(alert: Alert, generator_url: str = "") -> dict:
    """One entry of `alerts[]`: status, labels, annotations, startsAt, endsAt, generatorURL,
    fingerprint."""
    return {
        "status": alert.status,
        "labels": dict(alert.labels),
        "annotations": alert.flat_annotations(),
        "startsAt": iso8601(alert.starts_at),
        "endsAt": iso8601(alert.ends_at) if alert.status != FIRING and alert.ends_at is not None else ZERO_TIME,
        "generatorURL": generator_url,
        "fingerprint": alert.fingerprint,
    }


def build_webhook_payload(notification: Notification, *, external_url: str = "", max_alerts: int = 0) -> dict:
    """The version-4 webhook body for a group notification.

    max_alerts > 0 keeps that many alerts (firing first, as queued) and counts the rest in
    `truncatedAlerts`; common labels and annotations are computed over all alerts, as
    Alertmanager does.
    """
    alerts = notification.alerts
    kept = alerts[:max_alerts] if max_alerts > 0 else alerts
    return {
        "version": "4",
        "groupKey": notification.group_key,
        "truncatedAlerts": len(alerts) - len(kept) + notification.truncated,
        "status": notification.status,
        "receiver": notification.receiver,
        "groupLabels": dict(notification.group_labels),
        "commonLabels": notification.common_labels(),
        "commonAnnotations": notification.common_annotations(),
        "externalURL": external_url,
        "alerts": [webhook_alert(a, external_url) for a in kept],
    }


class WebhookNotifier(QueuedNotifier):
    """POST version-4 webhook payloads to `url` through the durable queue.

    url: may carry a token, so it is treated as a secret (never logged). 2xx is delivered; 4xx
    other than 408/429 is permanent (logged once, dropped); network errors, 408, 429 and 5xx
    are retried. max_alerts: see `build_webhook_payload`. queue_options (queue_path, timeout,
    backoff_initial, backoff_max, dry_run, send_resolved): `QueuedNotifier`.
    Raises ValueError when url is not http(s).
    """

    kind = "webhook"

    def __init__(self, url: str, *, name: str = "webhook", max_alerts: int = 0, external_url: str = "",
                 session: requests.Session | None = None, **queue_options) -> None:
        check_url(url, "url")
        self._url = Secret(url)
        self.max_alerts = max_alerts
        self.external_url = external_url
        self._session = session
        super().__init__(name, logger=log, **queue_options)

    def __repr__(self) -> str:
        return f"WebhookNotifier(name={self.name!r}, url={REDACTED}, queue_depth={self.queue_depth})"

    def render(self, data: dict) -> dict:
        return build_webhook_payload(Notification.from_dict(data), external_url=self.external_url,
                                     max_alerts=self.max_alerts)

    def send(self, payload: object, timeout: float) -> Attempt:
        if self._session is None:
            self._session = new_session()
        return post_json(self._session, self._url, payload, timeout)
