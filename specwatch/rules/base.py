"""The rule interface: events in, alert transitions out.

A rule sees every event of every server (`on_event`, on the pipeline's thread, under its lock)
and the passage of time (`on_tick`, about once a second in the daemon, at each decode line in
replay). It returns only transitions: a newly firing `Alert`, or the same alert with status
`resolved`. The dispatcher does dedup, repeats and delivery; a rule knows nothing of Slack.
State that must survive a restart goes through `to_state` / `load_state` (JSON-able).
A config reload (SIGHUP) hands each rule the new config through `reconfigure`; the rule keeps
its state and applies the new thresholds from the next event on.
"""

from __future__ import annotations

from specwatch.alerts.model import Alert
from specwatch.config import Config


class Rule:
    name: str = ""

    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        """An event from a source (DecodeBatch, PrefillBatch, ServerArgs, ...)."""
        return []

    def on_tick(self, now: float) -> list[Alert]:
        """Time passed (seconds since the epoch): for rules that fire on silence or duration."""
        return []

    def to_state(self) -> dict:
        return {}

    def load_state(self, state: dict) -> None:
        pass

    def reconfigure(self, config: Config) -> None:
        """The config was reloaded (under the pipeline's lock): take the new thresholds."""
