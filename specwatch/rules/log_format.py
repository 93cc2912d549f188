"""Decode lines specwatch cannot read: the log's format is not the one it was told.

A line that mentions `Decode batch` but does not start like a record of the file's grammar
(`UnrecognizedLine`: SGLang run with its own logging config, `SGLANG_LOGGING_CONFIG_PATH`, or a
wrapper's format) would otherwise count as "other", and a server whose every decode line is
unreadable would look like a quiet one (BR-30 from https://github.com/mit-han-lab/fastrl/pull/4).
`SGLangLogUnrecognized` (warning) fires at the first such line of a file, naming the file and one
example line, and resolves once `quiet` passes without another.
"""

from __future__ import annotations

import shlex
from collections import defaultdict

from specwatch.alerts.model import Alert, code
from specwatch.core.sections import Seconds, Section, rule_section
from specwatch.core.events import UnrecognizedLine
from specwatch.rules.active import ActiveAlertsRule
from specwatch.rules.base import register


@rule_section("log_format")
class LogFormatConfig(Section):
    quiet: Seconds = 1800.0  # resolve after this long without an unrecognized line from the file


ALERT_NAME = "SGLangLogUnrecognized"


@register
class LogFormatRule(ActiveAlertsRule):
    name = "log_format"
    alert_names = (ALERT_NAME,)
    order = 110  # last: tests and state address the other rules by position

    def __init__(self, config: LogFormatConfig):
        super().__init__()
        self.config = config
        self._last: dict[str, float] = {}  # alert key → clock of the file's last unrecognized line
        self._count: defaultdict[str, int] = defaultdict(int)

    def reconfigure(self, config) -> None:
        self.config = config.log_format

    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        if type(event) is not UnrecognizedLine:
            return []
        key = f"{server}\0{event.path}"
        self._last[key] = max(now, self._last.get(key, now))  # a log's clock may step back
        self._count[key] += 1
        alert = self.active.get(key)
        if alert is not None:
            alert.evidence[1] = ("unrecognized lines", str(self._count[key]))
            return []
        return self.active.fire(key, self._alert(server, event, now, self._count[key]))

    def on_tick(self, now: float) -> list[Alert]:
        if self.active.empty():
            return []
        out = []
        for key in self.active.keys():
            if now - self._last.get(key, now) >= self.config.quiet:
                self._count.pop(key, None)
                out += self.active.resolve(key, now, ("unrecognized lines", f"none for {self.config.quiet:g}s"))
        return out

    @staticmethod
    def _alert(server: str, event: UnrecognizedLine, now: float, count: int) -> Alert:
        path = event.path or "(unknown file)"
        return Alert(
            labels={"alertname": ALERT_NAME, "severity": "warning", "server": server, "rank": "", "file": path},
            annotations={
                "summary": f"Decode lines in {code(path)} are in a format specwatch does not read",
                "description": (
                    "Lines mention `Decode batch` but do not start like a record of this log's format, so "
                    "accept length, throughput and collapse detection are blind for this server. Usually "
                    "SGLang runs with its own logging config (SGLANG_LOGGING_CONFIG_PATH)."
                ),
            },
            starts_at=now,
            evidence=[("file", path), ("unrecognized lines", str(count)),  # raw: notifiers show values as typed
                      ("example line", event.text[:300])],
            fixes=[
                "Set `format:` of this log in the config: `python-logging` for "
                "`%(asctime)s %(levelname)s %(process)d [%(filename)s:%(lineno)d] %(message)s`, or "
                "`{regex: '...'}` with named groups timestamp, message (and ranks); see docs/log-formats.md",
                "Or drop SGLANG_LOGGING_CONFIG_PATH so SGLang prints its default `[time RANKS] message` lines",
                f"Check a config with `specwatch replay {shlex.quote(path)}` (add `--format python-logging` to try one)",
            ],
        )

    def to_state(self) -> dict:
        return {**super().to_state(), "last": dict(self._last)}

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        self._last.update({k: float(v) for k, v in (state.get("last") or {}).items()})
