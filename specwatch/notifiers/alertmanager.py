"""Push alerts to Alertmanager's `POST /api/v2/alerts`, the way Prometheus does.

Alertmanager then does the routing, grouping, silences and dedup across agents: two specwatch
instances pushing the same alert (same labels) make one alert there. As its API asks of a client
(https://prometheus.io/docs/alerting/latest/clients/; Prometheus does it in prometheus/prometheus
`rules/alerting.go`), every alert is re-sent while it fires (every `resend_delay`, with
`endsAt = now + 4 × resend_delay`, so Alertmanager resolves it by itself if specwatch goes
away) and a resolved one is re-sent with its real `endsAt` for `resolved_retention`.

One notifier per Alertmanager (list both of an HA pair). Each push is a full snapshot queued
under one coalescing key: while an Alertmanager is down the newest snapshot replaces the older
unsent one, and it is delivered once when the Alertmanager is back, after a restart too.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from specwatch.alerts.model import FIRING, Alert, iso8601
from specwatch.notifiers.http import Attempt, Secret, check_url, new_session, post_json
from specwatch.notifiers.queue import QueuedNotifier

if TYPE_CHECKING:
    import requests

log = logging.getLogger("specwatch.notifiers.alertmanager")

API_PATH = "/api/v2/alerts"
_SNAPSHOT = "alerts"


def notifier_name(url: str) -> str:
    """`alertmanager/<host:port>`: the notifier label of one Alertmanager (in /metrics, logs and
    the state's outbox), without the `user:password@` a URL may carry, as `shown_url` shows the
    server API URLs."""
    from specwatch.sources.server_api import shown_url  # loaded by the daemon anyway

    return f"alertmanager/{urlsplit(shown_url(url)).netloc}"


def legacy_name(url: str) -> str:
    """The name earlier versions gave the same Alertmanager (the whole netloc, credentials and
    all): its queued snapshot is moved to `notifier_name(url)` at start."""
    return f"alertmanager/{urlsplit(url).netloc}"


class AlertmanagerNotifier(QueuedNotifier):
    """Keep one Alertmanager informed of specwatch's alerts.

    url: the Alertmanager's base URL (`http://127.0.0.1:9093`, a path prefix kept); the API path
    is appended. resend_delay: seconds between re-sends of firing alerts (Prometheus
    `--rules.alert.resend-delay`, 1m). resolved_retention: seconds a resolved alert keeps being
    re-sent (Prometheus: 15m). generator_url: `generatorURL` of every alert. Other arguments:
    `QueuedNotifier`. Alertmanager answers 200 when it took the alerts, 400 when it rejects them
    (permanent: logged once, dropped); anything else is retried. Raises ValueError when url is
    not http(s).
    """

    kind = "Alertmanager"

    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        queue_path: Path | None = None,
        store=None,
        timeout: float = 10.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
        resend_delay: float = 60.0,
        resolved_retention: float = 900.0,
        generator_url: str = "",
        session: requests.Session | None = None,
    ) -> None:
        check_url(url, "alertmanager url")
        self.url = url.rstrip("/")
        self._api = Secret(self.url + API_PATH)
        self.resend_delay = resend_delay
        self.resolved_retention = resolved_retention
        self.generator_url = generator_url
        self._session = session
        self._last_push: float | None = None
        self._last_delivered: list | None = None  # (fingerprint, status) pairs of the last delivery
        super().__init__(name or notifier_name(url), queue_path=queue_path, store=store, timeout=timeout,
                         backoff_initial=backoff_initial, backoff_max=backoff_max, logger=log)

    def __repr__(self) -> str:
        return f"AlertmanagerNotifier(name={self.name!r}, queue_depth={self.queue_depth})"

    def sync(self, alerts: list[Alert], now: float, changed: bool) -> bool:
        """Queue a snapshot when `changed` or when `resend_delay` passed since the last one.

        alerts: every alert to report (firing, and resolved ones: those resolved more than
        `resolved_retention` seconds before `now` are left out). Returns True when queued.
        """
        if not changed and self._last_push is not None and now - self._last_push < self.resend_delay:
            return False
        keep = [a for a in alerts if a.status == FIRING or a.ends_at is None
                or now - a.ends_at < self.resolved_retention]
        if not keep and not changed:
            return False
        self._last_push = now
        self.enqueue({"alerts": [a.to_dict() for a in keep]}, coalesce_key=_SNAPSHOT)
        return True

    def describe(self, data: dict) -> str:
        return f"{len(data.get('alerts', []))} alert(s)"

    def delivered(self, data: dict, what: str) -> None:
        """INFO when the set of alerts (and their states) differs from the last delivered one,
        DEBUG for a re-send of the same (every `resend_delay` while one fires)."""
        key = sorted((Alert.from_dict(d).fingerprint, d.get("status", "")) for d in data.get("alerts", []))
        changed, self._last_delivered = key != self._last_delivered, key
        self.log.log(logging.INFO if changed else logging.DEBUG, "%s delivered %s", self.kind, what)

    def render(self, data: dict) -> list[dict]:
        # endsAt of a firing alert is computed at send time: a snapshot queued during an outage
        # must not arrive already expired. Never before startsAt (Alertmanager rejects that).
        valid_until = time.time() + 4 * self.resend_delay
        out = []
        for d in data["alerts"]:
            a = Alert.from_dict(d)
            ends = a.ends_at if a.status != FIRING and a.ends_at is not None else valid_until
            alert = {
                # an empty label is an absent one in Prometheus' model (e.g. `rank` on one GPU)
                "labels": {k: v for k, v in a.labels.items() if v != ""},
                "annotations": a.flat_annotations(),
                "startsAt": iso8601(a.starts_at),
                "endsAt": iso8601(max(ends, a.starts_at)),
            }
            if self.generator_url:
                alert["generatorURL"] = self.generator_url
            out.append(alert)
        return out

    def send(self, payload: object, timeout: float) -> Attempt:
        if self._session is None:
            self._session = new_session()
        return post_json(self._session, self._api, payload, timeout,
                         permanent=lambda status, body: status == 400)
