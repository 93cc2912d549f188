"""The rule interface: events in, alert transitions out.

A rule sees every event of every server (`on_event`, on the pipeline's thread, under its lock)
and the passage of time (`on_tick`, about once a second in the daemon, at each decode line in
replay). It returns only transitions: a newly firing `Alert`, or the same alert with status
`resolved`. The dispatcher does dedup, repeats and delivery; a rule knows nothing of Slack.
State that must survive a restart goes through `to_state` / `load_state` (JSON-able).
"""

from __future__ import annotations

from specwatch.alerts.model import Alert


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
