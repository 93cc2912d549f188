"""One of specwatch's own sources has failed for a while: it is blind to that server.

`SpecwatchSourceDown` (warning), one alert per source, after `down_for` (60 s: a rotation's
gap, a model still loading or journalctl starting again never pages):

* a followed file that does not exist, is a directory or cannot be read, a journal that
  journalctl cannot read (`SourceHealth` from sources/log_health.py);
* a `server_api` URL that gives no usable answer (`ApiSample.error`: no connection, a timeout,
  401/403, 404 on every endpoint, not JSON). A 5xx is the server's own state, judged by
  `ServerUnhealthy`, not a broken source;
* a `server_metrics` URL whose scrape fails (`MetricsSample.error`, any kind).

For those two, while the process source sees the server's process, the time counts from
`startup_grace` (10 min) after that process started at the earliest: SGLang starts its HTTP
server only after loading the model (`launch_server` in sglang/srt/entrypoints/http_server.py
calls `Engine._launch_subprocesses`, engine.py, which waits until the schedulers are ready,
then runs uvicorn; 0.5.23), so a wrong URL beside a server running for long is named after
`down_for`, a loading one is not.

Labels: `source_kind` (file, journal, server_api, server_metrics) and `source` (the path, or
the URL without credentials). Resolved at the source's first good read, or when the source is
no longer configured (a reload, or a start with another config; the reason in its evidence).
A down server explains its API failing: the default inhibit rules mute this alert for
server_api and server_metrics while `ServerDown` fires for the server
(alerts/inhibit.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specwatch.alerts.model import Alert, code, iso8601
from specwatch.core.sections import Seconds, Section, rule_section
from specwatch.core.events import ApiSample, MetricsSample, ProcessSample, SourceHealth
from specwatch.rules.active import ActiveAlertsRule
from specwatch.rules.base import RuleContext, alert_key, new_alert, register

if TYPE_CHECKING:  # annotations only: rule files never import config.py
    from specwatch.config import Config


@rule_section("source_down")
class SourceDownConfig(Section):
    down_for: Seconds = 60.0  # a source failing this long: SpecwatchSourceDown
    # SGLang serves HTTP only once the model is loaded: its API and /metrics failing this long
    # after its process started is loading, not a broken source
    startup_grace: Seconds = 600.0


ALERT_NAME = "SpecwatchSourceDown"

_WHAT = {"file": "log file", "journal": "journal", "server_api": "HTTP API", "server_metrics": "/metrics endpoint"}

_FIXES = {
    "file": ["Check `logs[].path` against where the server writes (`ls -l` the path as specwatch's user): "
             "a typo, a directory, a path under a directory that does not exist, or a file specwatch's user "
             "cannot read (`chmod o+r`, or add the user to the file's group). The file is read from its "
             "first line once it can be opened."],
    "journal": ["Run the `journalctl` command specwatch runs as its user (the evidence has its error): the "
                "user needs the `systemd-journal` group (`deploy/specwatch.service` has it), and the unit "
                "or matches must exist."],
    "server_api": ["Check `server_api.url` answers from this box (`curl -sS URL/server_info`): the port, "
                   "`server_api.api_key` for a server started with `--api-key`, and that the engine serves "
                   "its HTTP API there."],
    "server_metrics": ["Check `server_metrics[].url` answers from this box (`curl -sS URL`): the port, and "
                       "that SGLang was started with `--enable-metrics` (vLLM always serves /metrics)."],
}


def configured_sources(config: Config) -> set[tuple[str, str]]:
    """(kind, name) of every source `config` has, named as their events name them."""
    out = {("journal" if s.journal is not None else "file", s.path) for s in config.logs}
    if config.server_apis or config.server_metrics:
        from specwatch.sources.server_api import shown_url  # urllib3: only with HTTP sources

        out |= {("server_api", shown_url(a.url or "").rstrip("/")) for a in config.server_apis}
        out |= {("server_metrics", shown_url(m.url or "")) for m in config.server_metrics}
    return out


@register
class SourceDownRule(ActiveAlertsRule):
    """configured: (kind, name) of the sources of the config (None: keep every alert until
    its source answers)."""

    name = "source_down"
    alert_names = (ALERT_NAME,)
    order = 15

    @classmethod
    def build(cls, config: Config, ctx: RuleContext) -> "SourceDownRule":
        return cls(config.source_down, configured_sources(config))

    def __init__(self, config: SourceDownConfig, configured: set[tuple[str, str]] | None = None):
        super().__init__()
        self.config = config
        self.configured = configured
        # (server, kind, name) → [failing since, what is wrong] while failing
        self._failing: dict[tuple[str, str, str], list] = {}
        self._started: dict[str, float] = {}  # server → its process's start time (process source)

    def reconfigure(self, config: Config) -> None:
        self.config = config.source_down
        self.configured = configured_sources(config)

    # --- events ---
    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        if isinstance(event, SourceHealth):
            return self._state(server, event.kind, event.name, None if event.ok else event.state, now)
        if isinstance(event, ApiSample):
            bad = event.error if event.error and not event.error.startswith("http_5") else None
            return self._state(server, "server_api", event.url, bad, now)
        if isinstance(event, MetricsSample):
            return self._state(server, "server_metrics", event.url, event.error, now)
        if isinstance(event, ProcessSample) and event.process is not None:
            self._started[server] = event.process.start_time
        return []

    def _state(self, server: str, kind: str, name: str, bad: str | None, now: float) -> list[Alert]:
        key = (server, kind, name)
        if bad is not None:
            failing = self._failing.setdefault(key, [now, bad])
            failing[1] = bad
            return []
        since = self._failing.pop(key, None)
        if since is None and self.active.empty():
            return []  # the common case: a good read of a source that was fine
        # an alert restored from the state file has no failing clock of this run
        why = ("read again after (s)", f"{now - since[0]:.0f}") if since else ("read again", "after specwatch restarted")
        return self.active.resolve(alert_key(*key), now, why)

    # --- time ---
    def on_tick(self, now: float) -> list[Alert]:
        if not self._failing and self.active.empty():
            return []  # the common case, every tick: every source reads fine
        out: list[Alert] = []
        if self.configured is not None:
            for key in self.active.keys():
                server, kind, name = key.split("|", 2)
                if (kind, name) not in self.configured:
                    self._failing.pop((server, kind, name), None)
                    out += self.active.resolve(key, now, ("resolved because", "the source is no longer configured"))
        for (server, kind, name), (since, bad) in list(self._failing.items()):
            key = alert_key(server, kind, name)
            counted = since
            if kind in ("server_api", "server_metrics") and server in self._started:
                counted = max(since, self._started[server] + self.config.startup_grace)
            if now - counted >= self.config.down_for and key not in self.active:
                out += self.active.fire(key, self._alert(server, kind, name, since, bad, now))
        return out

    def _alert(self, server: str, kind: str, name: str, since: float, bad: str, now: float) -> Alert:
        what = _WHAT.get(kind, kind)
        alert = new_alert(
            ALERT_NAME, "warning", server, "",
            summary=f"specwatch cannot read the {what} of {server or 'this box'}",
            description=(f"The {what} {code(name)} has failed for {now - since:.0f} s: {bad}. Until it is "
                         "read again, specwatch sees nothing of this server through it: no alert can fire "
                         "from it."),
            starts_at=since,
            evidence=[("source", name), ("kind", kind), ("error", bad), ("failing since", iso8601(since) or "")],
            fixes=list(_FIXES.get(kind, [])),
        )
        alert.labels.update(source_kind=kind, source=name)
        return alert
