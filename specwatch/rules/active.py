"""The firing alerts of one rule, by key, kept in the rule's persisted state.

A rule that forgot its firing alert across a specwatch restart could never resolve it: the
dispatcher would repeat it forever. Every rule here keeps its firing alerts in an `ActiveAlerts`
and saves it with `to_state`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specwatch.alerts.model import FIRING, RESOLVED, Alert
from specwatch.rules.base import Rule

if TYPE_CHECKING:
    from _collections_abc import dict_keys


class ActiveAlerts(dict[str, Alert]):
    """Firing alerts by key: a dict (`key in active` and `get` are the dict's own: the rules ask
    on every decode line) with the transitions the rules make."""

    def empty(self) -> bool:
        """Nothing is firing (lets rules skip work in the common, healthy case)."""
        return not self

    def keys(self) -> dict_keys[str, Alert]:  # of a copy: callers resolve while they iterate
        return dict.copy(self).keys()

    def fire(self, key: str, alert: Alert) -> list[Alert]:
        """Record a firing alert; [] when one is already firing under `key`."""
        if key in self:
            return []
        alert.status = FIRING
        self[key] = alert
        return [alert]

    def resolve(self, key: str, now: float, *evidence: tuple[str, str]) -> list[Alert]:
        """The firing alert under `key`, resolved at `now` with extra evidence; [] if none."""
        alert = self.pop(key, None)
        if alert is None:
            return []
        alert.status = RESOLVED
        alert.ends_at = now
        alert.resolved_with(*evidence)
        return [alert]

    def resolve_server(self, server: str, now: float, *evidence: tuple[str, str]) -> list[Alert]:
        """Every firing alert of `server` (its `server` label), resolved at `now` with `evidence`."""
        out = []
        for key in [k for k, a in self.items() if a.labels.get("server") == server]:
            out += self.resolve(key, now, *evidence)
        return out

    def to_state(self) -> dict:
        return {k: a.to_dict() for k, a in self.items()}

    def load_state(self, state: dict) -> None:
        for k, d in (state or {}).items():
            self[k] = Alert.from_dict(d)


class ActiveAlertsRule(Rule):
    """A rule whose persisted state is its firing alerts (`self.active`); extend the two
    methods to save more."""

    def __init__(self) -> None:
        self.active = ActiveAlerts()

    def to_state(self) -> dict:
        return {"active": self.active.to_state()}

    def load_state(self, state: dict) -> None:
        self.active.load_state(state.get("active", {}))
