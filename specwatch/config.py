"""Configuration: schema, defaults, loading and validation.

Each section is declared once, as a `Section` (a msgspec Struct: fields, types, bounds in
`msgspec.Meta`, defaults); a rule's section lives in its rule file (`@rule_section`), and
`build_config` composes `rules:` from the registered ones. The file itself is one too
(`Document`), and msgspec converts each section (`_Reader.section_of`); what this module adds is
the wording of msgspec's errors, the checks across fields (`Section.problems`), and the keys read
apart (secrets, matchers, log formats, a route's Slack keys inherited from alerts.slack).

msgspec was chosen over pydantic v2 for the daemon's RSS budget (45 MB without a GPU): measured
in a bare Python 3.11 interpreter (13.3 MB), `import msgspec` adds 2.9 MB, `import pydantic` 15 MB
(18 MB with one model).

Every problem is reported with its key path (`alerts.slack.webhook_url: ...`) and how to fix it;
`load_config` collects all problems before raising `ConfigError`, so a user fixes a file in one
pass; a hostile file (not UTF-8, binary, nested too deep, an alias bomb, a duplicate key) is
refused the same way (`safe_yaml`). The defaults are the ones documented in `config.example.yaml`.
"""

from __future__ import annotations

import difflib
import glob
import ipaddress
import math
import os
import re
import shutil
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError
import socket
import types
from dataclasses import dataclass, field
from pathlib import Path
from operator import attrgetter
from typing import Annotated, Any, ClassVar, Iterable, Iterator, TypeGuard, TypeVar, Union, cast, get_args, get_origin

import msgspec
import yaml
from msgspec import Meta

from specwatch.system import safe_yaml
from specwatch.alerts.inhibit import InhibitRule, default_inhibit_rules
from specwatch.alerts.matchers import Matcher, parse_matcher
from specwatch.alerts.renamed import follow_renames
from specwatch.core.sections import (  # noqa: F401  (re-exported: the names every caller knows config by)
    _RULE_SECTIONS, DROP_BOUNDS, DURATION, LOCAL_HOSTS, YEAR, AcceptLength, Bound, Count, ProcessTies, Ratio,
    Seconds, Section, drop_hysteresis, hysteresis, rule_section)

# Port 9849: a free slot near the GPU exporters (dcgm 9400, nvidia_gpu_exporter 9835) on the
# Prometheus "Default port allocations" list
# (https://github.com/prometheus/prometheus/wiki/Default-port-allocations); see README, "Port".
DEFAULT_PORT = 9849

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}



class ConfigError(Exception):
    """A config that cannot be used. `problems` lists `key.path: what is wrong; how to fix`."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


# a notifier's unwritten backoff key follows the written one (Section.default_bounds)
_BACKOFF_BOUNDS = (("backoff_initial", "at_most", "backoff_max"), ("backoff_max", "at_least", "backoff_initial"))


def rule_sections() -> dict[str, tuple[str, type[Section]]]:
    """`rules.<key>` → (Config attribute, Section) of every rule file (imports them once)."""
    from specwatch.rules.base import all_rules

    all_rules()
    return _RULE_SECTIONS


def _rules_section() -> type[Section]:
    """`rules:`, a Section of the registered rule sections (made anew: a rule file may register
    one after the first config is read)."""
    # cast: defstruct is typed as making a bare Struct, whatever its bases
    return cast("type[Section]", msgspec.defstruct(
        "RulesConfig", [(key, cls, msgspec.field(default_factory=cls)) for key, (_, cls) in rule_sections().items()],
        bases=(Section,), kw_only=True))


def _default_rules() -> dict[str, Section]:
    return {attr: cls() for attr, cls in rule_sections().values()}


JOURNALCTL = "journalctl"  # the program sources/journal.py runs (`journal_warnings`: on PATH?)
_JOURNAL_FIELD = re.compile(r"[A-Z_][A-Z0-9_]{0,63}")  # a journal field name, systemd.journal-fields(7)


class JournalConfig(Section):
    """`logs[].journal`: entries of the systemd journal instead of a file (sources/journal.py).
    unit: `journalctl --unit`; matches: `FIELD=value` journal matches (ANDed, the same field
    twice ORed, as journalctl does); directory: read the journal files of this folder, not the
    system journal."""

    unit: UnitName | None = None
    matches: list[NonEmpty] = msgspec.field(default_factory=list)
    directory: FilePath | None = None

    def problems(self):
        if not self.unit and not self.matches:
            yield "unit", "missing; give `unit: sglang.service` or `matches: [SYSLOG_IDENTIFIER=sglang]` (not the whole journal)"
        for i, m in enumerate(self.matches):
            field, eq, _ = m.partition("=")
            if not eq or not _JOURNAL_FIELD.fullmatch(field):
                yield f"matches[{i}]", (f"{_show(m)} is not a journal match; write FIELD=value with an upper-case "
                                        "field name, e.g. _SYSTEMD_UNIT=sglang.service, SYSLOG_IDENTIFIER=sglang, "
                                        "CONTAINER_NAME=sglang")

    @property
    def key(self) -> str:
        """The source's name where a file source has its path (metrics' `path`, saved offsets,
        alerts): `journal:UNIT,FIELD=value[@DIRECTORY]`."""
        what = ",".join(([self.unit] if self.unit else []) + self.matches)
        return f"journal:{what}" + (f"@{self.directory}" if self.directory else "")


@dataclass
class LogSource:
    path: str  # a file, or `JournalConfig.key` for a journal source
    server: str
    container_prefix: str | None = None  # regex; None = recognise `service  | ` automatically
    timezone: str | None = None  # IANA zone of the log's timestamps; None = this host's local time
    journal: JournalConfig | None = None  # set: the lines are this journal's entries, not a file's
    # `format:` (docs/log-formats.md): the container envelope ("auto", "plain", "docker", "cri")
    # and the line grammar (a regex; None: SGLang's own). `path` may be a glob and `server` a
    # template ("{pod}"): `specwatch.sources.logfiles` turns them into one entry per file.
    envelope: str = "auto"
    grammar: str | None = None


class LogEntry(Section):
    """One of `logs:` as written (a bare string is its path), read into a `LogSource` by
    `build_config`: `journal` by `_journal` (it or `path`), `format` by `_log_format`."""

    path: FilePath | None = None
    journal: Raw = None
    server: str | None = None  # None: the top-level `server`
    container_prefix: str | None = None
    timezone: str | None = None  # None: the top-level `log_timezone`
    format: Raw = None

    def problems(self):
        if self.container_prefix is not None and (e := _regex_error(self.container_prefix)):
            yield "container_prefix", f"not a valid regular expression ({e}); e.g. '^\\S+\\s+\\| '"


class FollowConfig(Section):
    # inotify on the followers' own thread by default (sources/inotify_wait.py): a change after a
    # quiet spell is read at once, a busy file read again at its cadence (sources/cadence.py:
    # between poll_interval / 3 and 3 intervals, soon after a line that may start a collapse), and
    # every file is polled each poll_interval without a change. watchdog's observer instead wakes three
    # threads for every line SGLang writes (what that costs: docs/idle-cost.md).
    poll_interval: Annotated[float, Meta(ge=0.05, le=YEAR, extra=DURATION)] = 0.75
    inotify: bool = True
    # a longer line is skipped; bounded: the follower holds one line in memory (the RSS budget)
    max_line_bytes: Annotated[int, Meta(ge=1024, le=16 * 1024 * 1024)] = 1_048_576
    watchdog: bool = False
    # seconds between looks for new files matching a `logs[].path` glob (pods, containers)
    rescan_interval: Annotated[float, Meta(ge=0.1, le=YEAR, extra=DURATION)] = 10.0


class LimitsConfig(Section):
    # distinct ranks (`DP3 TP3` tokens) one server's logs may name: each is a label set on
    # /metrics and state in every per-rank rule; the lines of any further rank are summed into
    # one rank `other`, counted and warned once (rules/summary.py OTHER_RANK)
    max_ranks_per_server: Annotated[int, Meta(ge=1, le=100_000)] = 64
    # a rank whose server printed batch lines for this long without it is gone (a garbage line's
    # rank, a DP rank a restart dropped): it leaves /metrics, the rules and the status page
    rank_expiry: Annotated[float, Meta(ge=1.0, le=YEAR, extra=DURATION)] = 600.0


class SlackConfig(Section):
    """alerts.slack, and a route's `slack` (its unset keys come from alerts.slack). The webhook
    URL is a secret: one of webhook_url, webhook_url_env (a variable's name) or webhook_url_file;
    `load_config` reads it into webhook_url (the other two are then None). Instead of a webhook, a
    bot token (`bot_token`, `_env`, `_file`; a secret too) posts with the Web API at `api_url`
    (chat.postMessage to `channel`, which it needs) and edits a group's message in place
    (chat.update) while its incident is open; webhook_url is then that chat.postMessage URL."""

    webhook_url: Secret | None = None
    webhook_url_env: str | None = None
    webhook_url_file: str | None = None
    bot_token: Secret | None = None
    bot_token_env: str | None = None
    bot_token_file: str | None = None
    api_url: str = "https://slack.com/api"
    channel: str | None = None
    timeout: Seconds = 10.0
    backoff_initial: Seconds = 1.0
    backoff_max: Seconds = 300.0
    send_resolved: bool = True

    default_bounds: ClassVar = _BACKOFF_BOUNDS

    def problems(self):
        return _backoff_problems(self.backoff_initial, self.backoff_max)

    def __repr__(self) -> str:  # the webhook URL is a secret
        return (f"SlackConfig(webhook_url={'<redacted>' if self.webhook_url else None}, "
                f"bot_token={'<redacted>' if self.bot_token else None}, channel={self.channel!r})")


class WebhookConfig(Section):
    """One of alerts.webhooks. The URL may hold a token: one of url, url_env or url_file, read
    into url like Slack's."""

    example: ClassVar[str] = "{name: ops, url: https://hooks.example/specwatch}"
    name: Annotated[str, Meta(min_length=1, description="a short name for metrics and routes, e.g. `name: ops`")]
    url: Secret | None = None
    url_env: str | None = None
    url_file: str | None = None
    send_resolved: bool = True
    max_alerts: Annotated[int, Meta(ge=0, le=10_000)] = 0  # 0: every alert of a group in one payload
    timeout: Seconds = 10.0
    backoff_initial: Seconds = 1.0
    backoff_max: Seconds = 300.0

    default_bounds: ClassVar = _BACKOFF_BOUNDS

    def problems(self):
        return _backoff_problems(self.backoff_initial, self.backoff_max)

    def __repr__(self) -> str:
        return f"WebhookConfig(name={self.name!r}, url=<redacted>)"


class AlertmanagerConfig(Section):
    urls: list[Annotated[str, Meta(min_length=1)]] = msgspec.field(default_factory=list)
    resend_delay: Seconds = 60.0
    resolved_retention: Seconds = 900.0
    timeout: Seconds = 10.0
    backoff_initial: Seconds = 1.0
    backoff_max: Seconds = 60.0

    default_bounds: ClassVar = _BACKOFF_BOUNDS

    def problems(self):
        for i, u in enumerate(self.urls):
            if not _valid_url(u):
                yield f"urls[{i}]", f"{_show(u)} is not an http(s) URL; e.g. http://127.0.0.1:9093"
        yield from _backoff_problems(self.backoff_initial, self.backoff_max)


class RouteConfig(Section):
    """One entry of alerts.routes; None = inherit from alerts.*. Its matchers (parsed) and its
    Slack keys (unset ones from alerts.slack) are read apart, by `_alerts`."""

    example: ClassVar[str] = "{matchers: [severity=critical], slack: {channel: '#oncall'}}"
    name: str | None = None  # None: route<N>, N its place in the list
    matchers: list[Matcher] = msgspec.field(default_factory=list)
    slack: SlackConfig | None = None
    webhooks: list[NonEmpty] | None = None
    group_by: list[NonEmpty] | None = None
    group_wait: Delay | None = None
    group_interval: Delay | None = None
    repeat_interval: Seconds | None = None
    continue_matching: bool = msgspec.field(default=False, name="continue")


class InhibitConfig(Section):
    """One of alerts.inhibit_rules as written, read into an `InhibitRule` (matchers parsed apart)."""

    example: ClassVar[str] = ("{source_matchers: [alertname=AcceptanceCollapse], target_matchers: "
                              "[alertname=ThroughputDrop], equal: [server, rank]}")
    source_matchers: Raw = None
    target_matchers: Raw = None
    equal: list[NonEmpty] = msgspec.field(default_factory=list)


class MetricsSection(Section):
    listen_address: str = "127.0.0.1"
    listen_port: Annotated[int, Meta(ge=0, le=65535)] = DEFAULT_PORT

    def problems(self):
        if not _valid_host(self.listen_address):
            yield "listen_address", (f"{_show(self.listen_address)} is not an IP address or host name; e.g. "
                                     "127.0.0.1 (this host only), 0.0.0.0 (all IPv4 interfaces) or ::")


class GpuConfig(Section):
    enabled: bool = True  # without a driver it exports specwatch_gpu_up 0 and warns once
    interval: Seconds = 5.0


class ProcessConfig(Section):
    enabled: bool = True  # psutil scan of the SGLang processes
    # a scan reads /proc with cold caches (its cost: docs/idle-cost.md); a death alerts after
    # server.down_for anyway, and Prometheus scrapes the CPU and memory figures far less often
    interval: Seconds = 10.0
    match: str | None = None  # regex: command lines that are launchers too (wrappers)
    # --port -> server name; empty = all, auto-named
    servers: Annotated[dict[Annotated[int, Meta(ge=1, le=65535, description="a port number (the server's --port), e.g. "
                                                                  "`30000: sglang-0`")],
                  Annotated[str, Meta(min_length=1, description="a server name (the `server` label)")]],
                       Meta(description="a mapping of SGLang --port numbers to server names, e.g. "
                                        "`servers: {30000: sglang-0}`")] = msgspec.field(default_factory=dict)

    def problems(self):
        if self.match is not None and (e := _regex_error(self.match)):
            yield "match", f"not a valid regular expression ({e}); e.g. 'my_sglang_wrapper\\.py'"


class ServerApiConfig(Section):
    """`server_api:`, one mapping or a list (one per SGLang server on the box); url null: not
    polled. The API key is a secret read like Slack's webhook URL."""

    example: ClassVar[str] = "{url: http://127.0.0.1:30000}"
    url: str | None = None
    server: str | None = None  # None: the top-level `server`
    api_key: Secret | None = None
    api_key_env: str | None = None
    api_key_file: str | None = None
    interval: Seconds = 10.0
    health_interval: Seconds = 60.0
    timeout: Seconds = 2.0  # unwritten: at most interval
    backoff_max: Seconds = 120.0
    default_bounds: ClassVar = (("timeout", "at_most", "interval"),)

    def problems(self):
        if self.url is not None and not _valid_url(self.url):
            yield "url", "must be an http(s) base URL such as http://127.0.0.1:30000"
        yield from _timeout_problems(self, "polls")

    def __repr__(self) -> str:  # the API key is a secret
        return (f"ServerApiConfig(url={self.url!r}, server={self.server!r}, "
                f"api_key={'<redacted>' if self.api_key else None})")


class ServerMetricsConfig(Section):
    """One of `server_metrics:` (a list, or one mapping): an engine's own Prometheus endpoint
    (SGLang with --enable-metrics, or vLLM), read by sources/server_metrics.py."""

    example: ClassVar[str] = "{url: http://127.0.0.1:30000/metrics, server: sglang-0, interval: 5s}"
    url: Annotated[str, Meta(min_length=1, description="the engine's metrics URL, e.g. "
                                                       "`url: http://127.0.0.1:30000/metrics`")]
    server: str | None = None  # None: the top-level `server`
    interval: Annotated[float, Meta(ge=1.0, le=YEAR, extra=DURATION)] = 5.0
    timeout: Seconds = 2.0  # unwritten: at most interval, as Prometheus' scrape_timeout
    backoff_max: Seconds = 120.0  # unwritten: at least interval
    default_bounds: ClassVar = (("timeout", "at_most", "interval"), ("backoff_max", "at_least", "interval"))

    def problems(self):
        if not _valid_url(self.url):
            yield "url", f"{_show(self.url)} is not an http(s) URL; e.g. http://127.0.0.1:30000/metrics"
        elif not urlsplit(self.url).path.rstrip("/"):
            yield "url", f"{_show(self.url)} has no path; the engine serves its metrics at /metrics, e.g. {self.url.rstrip('/')}/metrics"
        yield from _timeout_problems(self, "scrapes")
        if self.backoff_max < self.interval:
            backoff = _default_of(type(self), "backoff_max")
            yield "backoff_max", (f"must be at least interval ({self.interval:g}s); e.g. {max(self.interval, backoff):g}s, "
                                  f"or leave it out (then max({backoff:g}s, interval))")


def _timeout_problems(s: ServerApiConfig | ServerMetricsConfig, what: str) -> list[tuple[str, str]]:
    """The problem of a poll whose timeout exceeds its interval."""
    if s.timeout <= s.interval:
        return []
    return [("timeout", f"must not exceed interval ({s.interval:g}s) or {what} fall behind it; e.g. "
                        f"{max(s.interval / 2, 0.1):g}s, or leave it out (then min({_default_of(type(s), 'timeout'):g}s, interval))")]


class DiagnosisConfig(Section):
    """`diagnosis:`: run the probes ahead of time and put their findings into collapse alerts.

    draft / target: folders (target may be its config.json); None → `speculative_draft_model_path`
    / `model_path` of the server's `server_args` log line. sglang_root: the folder containing the
    `sglang` package the server runs; None → found without importing it. timeout: seconds.
    Relative paths are taken from the config file's folder.
    """

    enabled: bool = True
    draft: str | None = None
    target: str | None = None
    sglang_root: str | None = None
    vllm_root: str | None = None  # the folder containing the `vllm` package a vLLM server runs (docs/vllm.md)
    timeout: Seconds = 60.0


Raw = Any  # a key read apart, by a reader of its own that says what it must be


class AlertsConfig(Section):
    """`alerts:`: Alertmanager's route defaults, kept on `Config` as `group_by`, `group_wait`, ...
    The receivers, routes and inhibit rules are read apart (`_alerts`: secrets, names, matchers,
    a route's Slack keys inherited from alerts.slack)."""

    # Alertmanager's default is [] (one group); per alert name and server, an XID on one GPU
    # never holds back a collapse by a group_interval.
    group_by: list[NonEmpty] = msgspec.field(default_factory=lambda: ["alertname", "server"])
    group_wait: Delay = 0.0  # Alertmanager: 30s; see config.example.yaml
    group_interval: Delay = 60.0  # Alertmanager: 5m; a resolve goes out within a minute
    repeat_interval: Seconds = 4 * 3600.0
    runbook_url: str = ""
    external_url: str = ""
    inhibit_rules: Raw = None
    slack: Raw = None
    webhooks: Raw = None
    alertmanager: AlertmanagerConfig = msgspec.field(default_factory=AlertmanagerConfig)
    routes: Raw = None


class Document(Section):
    """The keys at the top of a config file. A key typed as a Section is read as that section;
    a Raw one apart (`build_config`)."""

    server: str | None = None  # the default `server` label; None: this host's name
    log_timezone: str | None = None  # the default zone of log timestamps; None: this host's local time
    logs: Raw = None
    follow: FollowConfig = msgspec.field(default_factory=FollowConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    gpu: GpuConfig = msgspec.field(default_factory=GpuConfig)
    process: ProcessConfig = msgspec.field(default_factory=ProcessConfig)
    server_api: Raw = None
    server_metrics: Raw = None
    diagnosis: DiagnosisConfig = msgspec.field(default_factory=DiagnosisConfig)
    metrics: MetricsSection = msgspec.field(default_factory=MetricsSection)
    state_dir: FilePath = "/var/lib/specwatch"
    rules: Raw = None
    alerts: AlertsConfig = msgspec.field(default_factory=AlertsConfig)


_DEFAULTS, _ALERTS, _METRICS = Document(), AlertsConfig(), MetricsSection()


@dataclass
class Config:
    """A config as specwatch uses it: `build_config` reads it from a `Document`."""

    server: str = ""  # default `server` label (host name)
    log_timezone: str | None = None  # default zone of log timestamps (None: local time)
    logs: list[LogSource] = field(default_factory=list)
    follow: FollowConfig = field(default_factory=FollowConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    listen_address: str = _METRICS.listen_address
    listen_port: int = _METRICS.listen_port
    state_dir: str = _DEFAULTS.state_dir
    # rules.*: each rule file's Section, by Config attribute (`config.collapse`, ...: __getattr__)
    rules: dict[str, Section] = field(default_factory=_default_rules)
    # alerts: (AlertsConfig)
    group_by: list[str] = field(default_factory=lambda: list(_ALERTS.group_by))
    group_wait: float = _ALERTS.group_wait
    group_interval: float = _ALERTS.group_interval
    repeat_interval: float = _ALERTS.repeat_interval
    inhibit_rules: list[InhibitRule] = field(default_factory=default_inhibit_rules)
    runbook_url: str = _ALERTS.runbook_url
    external_url: str = _ALERTS.external_url
    slack: SlackConfig = field(default_factory=SlackConfig)
    webhooks: list[WebhookConfig] = field(default_factory=list)
    alertmanager: AlertmanagerConfig = field(default_factory=AlertmanagerConfig)
    routes: list[RouteConfig] = field(default_factory=list)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    process: ProcessConfig = field(default_factory=ProcessConfig)
    server_apis: list[ServerApiConfig] = field(default_factory=list)
    server_metrics: list[ServerMetricsConfig] = field(default_factory=list)
    diagnosis: DiagnosisConfig = field(default_factory=DiagnosisConfig)
    source_path: str | None = None

    def __getattr__(self, name: str):
        rules = self.__dict__.get("rules")
        if rules is not None and name in rules:
            return rules[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def receiver_names(self) -> list[str]:
        """The notifiers that post somewhere (`slack`, `slack/ROUTE`, `webhook/NAME`); never URLs."""
        names = ["slack"] if self.slack.webhook_url else []
        names += [f"slack/{r.name}" for r in self.routes if r.slack is not None and r.slack.webhook_url]
        return names + [f"webhook/{w.name}" for w in self.webhooks]


def parse_duration(value) -> float:
    """`30s`, `5m`, `4h`, `1d`, `250ms` or a number of seconds → seconds. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # an int too large for a float: infinite, as float("1e400") is
            return math.inf if value > 0 else -math.inf
    m = _DURATION.match(str(value))
    if not m:
        raise ValueError(value)
    return float(m.group(1)) * _UNITS[m.group(2)]


def _join(path: str, key) -> str:
    key = str(key)[:80]
    return f"{path}.{key}" if path else key


def _show(value, limit: int = 60) -> str:
    """`repr` of a value from the file, cut short: a message never echoes a huge value."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


NonEmpty = Annotated[str, Meta(min_length=1)]
Secret = Annotated[str, Meta(extra={"secret": True})]  # a message never shows it
FilePath = Annotated[str, Meta(min_length=1, pattern=r"\A[^\x00]*\Z", extra={"path": True})]  # never a number; no NUL
Delay = Annotated[float, Meta(ge=0.0, le=YEAR, extra=DURATION)]  # a duration that may be 0
UnitName = Annotated[str, Meta(min_length=1, description="a non-empty string, e.g. `sglang.service`",
                               extra={"string": True})]  # a systemd unit: never a number
_KINDS: dict[object, str] = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_PLURAL: dict[object, str] = {int: "integers", float: "numbers", str: "strings"}
_AT = re.compile(r"(?:key` in `)?\$\.(\w+)")  # the field msgspec names: `$.key...`, `key` in `$.key`
_PLACEHOLDER = object()  # stands for a missing required key, last, so msgspec checks every other first


class _Bad(Exception):
    """A value that does not fit its field; the message says why and how to fix it."""


def _unwrap(t) -> tuple[object, Meta | None]:
    """A field type → (the type without Annotated and `| None`, its Meta or None)."""
    meta = None
    for _ in range(2):
        if get_origin(t) is Annotated:
            t, *extras = get_args(t)
            meta = next((m for m in extras if isinstance(m, Meta)), meta)
        if get_origin(t) in (Union, types.UnionType):
            args = [a for a in get_args(t) if a is not type(None)]
            if len(args) == 1:
                t = args[0]
    return t, meta


def _written(t, raw):
    """`raw` as msgspec is to check it against the field type `t`: a duration (`5m`) in seconds,
    an integer where a string is declared (`server: 1`, `equal: [rank, 0]`, a mapping's value)
    as its text. Raises
    _Bad for a duration that is none."""
    base, meta = _unwrap(t)
    extra = (meta.extra or {}) if meta is not None else {}
    if extra.get("duration"):
        try:
            return parse_duration(raw)
        except ValueError:
            raise _Bad(f"not a duration: {_show(raw)}; write e.g. `30s`, `5m`, `4h` or a number of seconds") from None
    if get_origin(base) in (list, tuple) and isinstance(raw, list):
        return [_written(get_args(base)[0], x) for x in raw]
    if get_origin(base) is dict and isinstance(raw, dict):
        return {k: _written(get_args(base)[1], v) for k, v in raw.items()}
    if base is str and type(raw) is int and not (extra.get("path") or extra.get("string")):
        return str(raw)
    return raw


def _wrong(t, raw, error: str, key: str, default) -> str:
    """msgspec's `error` about `raw` (as written) for the field type `t`, said as what the value
    must be and how to fix it (never the whole value; a secret not at all)."""
    base, meta = _unwrap(t)
    lo, hi = (meta.ge, meta.le) if meta is not None else (None, None)
    extra = (meta.extra or {}) if meta is not None else {}
    what = meta.description if meta is not None else None
    if extra.get("secret"):
        return "must be a string (value not shown: it is a secret)"
    if extra.get("duration"):
        if "<=" in error and hi is not None and math.isfinite(parse_duration(raw)):
            return f"must be at most {hi / 86400:g}d, got {_show(raw)}"
        return f"must be a finite duration of at least {lo or 0:g}s, got {_show(raw)}"
    if get_origin(base) in (list, tuple):
        example = f"; e.g. `{key}: [{', '.join(map(str, default))}]`" if default else ""
        return f"must be a list of {what or _PLURAL.get(_unwrap(get_args(base)[0])[0], 'values')}, got {_show(raw)}{example}"
    if base is str and extra.get("path") and "regex" in error:  # the OS cannot open it: every use would raise
        return (f"contains a NUL character (\\0), which no file name can hold; got {_show(raw)}; "
                "give the path without it")
    if base is str and "length" in error:
        return f"must be {what or 'a non-empty string'}, got {_show(raw)}"
    if base in (int, float) and any(s in error for s in ("<=", ">=", "out of range")):
        # A narrow range is stated whole (a ratio, a port); a wide one (a sanity cap) by the bound crossed.
        if lo is not None and hi is not None and hi - lo <= 65535:
            rng = f"between {lo} and {hi}"
        else:
            rng = f">= {lo}" if lo is not None and not raw > lo else f"<= {hi}"
        return f"must be {rng}, got {_show(raw)}" + (f"; the default is {default}" if default is not None else "")
    example = f"; e.g. `{key}: {default}`" if base in (int, float) else ""
    return f"must be {what or _KINDS.get(base, str(base))}, got {_show(raw)}{example}"


def _line(path: str, msg: str) -> str:
    if len(msg) > 500:  # a value from the file echoed by a message (a path, a matcher)
        msg = msg[:500] + "…"
    return f"{path}: {msg}"


def _default(f: msgspec.structs.FieldInfo):
    return f.default_factory() if f.default_factory is not msgspec.NODEFAULT else (
        None if f.default is msgspec.NODEFAULT else f.default)


def _default_of(cls: type[Section], name: str):
    """The declared default of the field `name` of `cls` (a message that names it says this one)."""
    return _default(next(f for f in msgspec.structs.fields(cls) if f.name == name))


def _entries(t, raw: dict, path: str) -> tuple[dict, list[str]]:
    """The entries of the mapping `raw` that fit the dict type `t`, and a problem for each other
    one, named by its own key path."""
    kt, vt = get_args(_unwrap(t)[0])
    kmeta = _unwrap(kt)[1]
    kept, lines = {}, []
    for k, v in raw.items():
        try:
            msgspec.convert({k: v}, t)
            kept[k] = v
        except msgspec.ValidationError as e:
            error, _, at = str(e).partition(" - at `")
            lines.append(_line(_join(path, k), f"the key must be {kmeta.description if kmeta is not None else _KINDS.get(kt)}"
                               if at.startswith("key") else _wrong(vt, v, error, str(k), None)))
    return kept, lines


S = TypeVar("S", bound=Section)  # the Section a reader reads: what it returns


def _is_section(t: object) -> TypeGuard[type[Section]]:
    return isinstance(t, type) and issubclass(t, Section)


class _Reader:
    """Walks a parsed YAML mapping, recording problems with key paths."""

    def __init__(self, secrets: bool = True) -> None:
        self.problems: list[str] = []
        self.secrets = secrets  # False: `*_env` / `*_file` secrets are left unread (None)

    def bad(self, path: str, msg: str) -> None:
        self.problems.append(_line(path, msg))

    def unknown(self, data: dict, path: str, known: Iterable[str]) -> None:
        known = sorted(known)
        for k in data:
            if k not in known:
                close = difflib.get_close_matches(str(k), known, n=1)
                hint = f"; did you mean `{close[0]}`?" if close else ""
                self.bad(_join(path, k), f"unknown key; known keys here: {', '.join(known)}{hint}")

    def section_of(self, cls: type[S], data, path: str, base: S | None = None) -> S | None:
        """`data` (a mapping; None: the defaults) as the Section `cls`, converted by msgspec
        (`_convert`), unset keys from `base` (default: the declared defaults), its unwritten
        defaults bent to its written keys (`default_bounds`) and its checks across fields run.
        None when a required key is missing or wrong."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            key = path.rsplit(".", 1)[-1]
            self.bad(path, f"must be a mapping, got {type(data).__name__}; write `{key}:` followed by indented keys")
            data = {}
        fields = {f.encode_name: f for f in msgspec.structs.fields(cls)}
        self.unknown(data, path, fields)
        obj, given, wrong = self._convert(cls, fields, data, path, base)
        if obj is None:
            return None
        if base is not None:
            obj = msgspec.structs.replace(base, **{fields[k].name: getattr(obj, fields[k].name) for k in given})
        obj, stuck = _bound_defaults(obj, {f.name for k, f in fields.items() if data.get(k) is not None})
        for key, msg in obj.problems():
            head = re.split(r"[.\[]", key, maxsplit=1)[0]
            if head in stuck:  # a default that cannot give way: the written key it follows is the one to change
                w, need = stuck[head]
                self.bad(_join(path, w), f"{getattr(obj, w):g} leaves no value for {head} (not written: it "
                                         f"follows {w}, but its range has no value {need}); change {w}, or write both")
            elif head not in wrong:  # said already, as a wrong value
                self.bad(_join(path, key), msg)
        return obj

    def section(self, cls: type[S], data, path: str, base: S | None = None) -> S:
        """`section_of` for a Section whose every key has a default: never None (a wrong value is
        reported and its default kept)."""
        obj = self.section_of(cls, data, path, base)
        assert obj is not None, f"{cls.__name__} has a required key: read it with section_of"
        return obj

    def _convert(self, cls: type[S], fields: dict, data: dict, path: str,
                 base: S | None) -> tuple[S | None, dict, set[str]]:
        """`data` converted by msgspec into `cls` (None where a required key is missing or
        wrong), the keys it took and the keys it refused. msgspec stops at the first wrong value:
        that one is reported and left out, and the rest converted again, so every problem is said
        at once, in the order of the fields. A field that is a Section (or a list of them) is read
        as its own section, with its checks."""
        place = {k: i for i, k in enumerate(fields)}
        found: list[tuple[int, str]] = []  # (field's place, problem): said in field order
        given: dict = {}
        for k, raw in data.items():
            f = fields.get(k)
            if f is None or raw is None:
                continue
            t, n = _unwrap(f.type)[0], len(self.problems)
            if _is_section(t) or (get_origin(t) is list and _is_section(get_args(t)[0])):  # all its problems, its checks
                if _is_section(t):
                    if (x := self.section_of(t, raw, _join(path, k))) is not None:
                        given[k] = x
                else:
                    given[k] = [x for ip, e in self.items(raw, _join(path, k), get_args(t)[0].example)
                                if (x := self.section_of(get_args(t)[0], e, ip)) is not None]
                found += [(place[k], line) for line in self.problems[n:]]
                del self.problems[n:]
                continue
            try:
                given[k] = _written(f.type, raw)
            except _Bad as e:
                found.append((place[k], _line(_join(path, k), str(e))))
        wrong = {k for k in data if k in fields and data[k] is not None and k not in given}
        missing = [k for k, f in fields.items() if f.required and k not in given]
        for k in missing:
            if k not in wrong:
                meta = _unwrap(fields[k].type)[1]
                found.append((place[k], _line(_join(path, k), f"missing; {meta.description if meta is not None else 'required'}")))
        obj = None
        while obj is None:
            try:
                obj = msgspec.convert({**given, **dict.fromkeys(missing, _PLACEHOLDER)}, cls)
            except msgspec.ValidationError as e:
                error, _, at = str(e).partition(" - at `")
                k = m.group(1) if (m := _AT.match(at)) else None
                if k is None or k in missing:
                    break
                f, full, raw = fields[k], _join(path, k), given.pop(k)
                if get_origin(_unwrap(f.type)[0]) is dict and isinstance(raw, dict) and k not in wrong:
                    given[k], lines = _entries(f.type, raw, full)  # msgspec names no entry: each by its own key
                    found += [(place[k], line) for line in lines]
                else:
                    found.append((place[k], _line(full, _wrong(f.type, data[k], error, k, getattr(base, f.name, _default(f))))))
                    missing += [k] if f.required else []
                wrong.add(k)
        self.problems += [line for _, line in sorted(found, key=lambda x: x[0])]
        return obj, given, wrong

    def matchers(self, data: dict, key: str, path: str) -> list[Matcher]:
        """data[key], a list of matchers (`severity=critical`), parsed; each problem by its key path."""
        try:
            texts = msgspec.convert([] if data.get(key) is None else _written(list[NonEmpty], data[key]), list[NonEmpty])
        except msgspec.ValidationError as e:
            self.bad(_join(path, key), _wrong(list[NonEmpty], data[key], str(e), key, None))
            return []
        out = []
        for i, text in enumerate(texts):
            try:
                out.append(follow_renames(parse_matcher(text), f"{path}.{key}[{i}]"))
            except ValueError as e:
                self.bad(f"{path}.{key}[{i}]", str(e))
        return out

    def items(self, v, path: str, example: str, one: bool = False) -> Iterator[tuple[str, dict]]:
        """`v`, a list of mappings (one: or one mapping) at `path` → (key path, mapping) each;
        anything else is reported, in its place."""
        if one and isinstance(v, dict):
            yield path, v
        elif v is not None and not isinstance(v, list):
            self.bad(path, f"must be {'a mapping or ' if one else ''}a list of mappings, e.g. "
                           f"`{path.rsplit('.', 1)[-1]}: [{example}]`")
        for i, item in enumerate(v if isinstance(v, list) else []):
            if isinstance(item, dict):
                yield f"{path}[{i}]", item
            else:
                self.bad(f"{path}[{i}]", f"must be a mapping, e.g. {example}")


def _resolve_secret(r: _Reader, data: dict, path: str, name: str) -> str | None:
    """A secret from `name`, `name_env` (variable name) or `name_file` (path); at most one."""
    given = [k for k in (name, f"{name}_env", f"{name}_file") if data.get(k) and isinstance(data[k], (str, int))]
    if len(given) > 1:
        r.bad(f"{path}.{given[1]}", f"give only one of {', '.join(given)}")
        return None
    if not given:
        return None
    key = given[0]
    raw = str(data[key])
    if key == name:
        return raw
    if not r.secrets:
        return None
    if key.endswith("_env"):
        value = os.environ.get(raw)
        if not value:
            # INVOCATION_ID: set by systemd for a service (systemd.exec(5)); its EnvironmentFile= is read at start
            how = ("; a variable added to the unit's EnvironmentFile takes effect on `systemctl restart`, not on reload"
                   if os.environ.get("INVOCATION_ID") else f"; export it, or use {name}_file")
            r.bad(f"{path}.{key}", f"environment variable {raw} is not set or empty{how}")
        return value or None
    try:
        value = read_secret_file(raw)
    except SecretFileError as e:
        r.bad(f"{path}.{key}", f"{_show(raw)}: {e}")
        return None
    if not value:
        r.bad(f"{path}.{key}", f"{raw} is empty; put the {name.replace('_', ' ')} in it")
    return value or None


SECRET_FILE_MAX = 16 << 10  # bytes: a URL or an API key is far shorter; more is not a secret file


class SecretFileError(Exception):
    """A `*_file` secret that cannot be used; the message says why and what to do (no content)."""


def read_secret_file(path: str) -> str:
    """The text of a secret file (`webhook_url_file`, `url_file`, `api_key_file`), stripped.

    Reads at most SECRET_FILE_MAX bytes, without blocking: a FIFO, a device (/dev/zero) or a
    directory is refused before any read. Raises SecretFileError when the path holds a NUL, the
    file cannot be opened, is not a regular file, is larger than the bound, or is binary (a NUL
    byte, not UTF-8, or control characters other than the newline after the secret).
    """
    import stat

    if "\0" in path:
        raise SecretFileError("contains a NUL character (\\0); give the path without it")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise SecretFileError(f"cannot read it: {e.strerror}; check the path and that specwatch may read it") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SecretFileError("is not a regular file (a device, FIFO, socket or directory); "
                                  "put the secret in a plain file and give its path")
        if st.st_size > SECRET_FILE_MAX:
            raise SecretFileError(f"is {st.st_size} bytes, more than a secret file holds (at most "
                                  f"{SECRET_FILE_MAX}); give the file that holds only the URL or key")
        data = os.read(fd, SECRET_FILE_MAX + 1)
    except OSError as e:
        raise SecretFileError(f"cannot read it: {e.strerror}; check the path and that specwatch may read it") from None
    finally:
        os.close(fd)
    if len(data) > SECRET_FILE_MAX:  # grew since the fstat
        raise SecretFileError(f"holds more than {SECRET_FILE_MAX} bytes; give the file that holds only the URL or key")
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        text = None
    if text is None or any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise SecretFileError("is binary (not UTF-8 text, or control characters); the file must hold only "
                              "the URL or key, as text")
    return text


def _is(test, path: str) -> bool:
    """`test(Path(path))`, False where the path cannot even be looked up (too long, a NUL)."""
    try:
        return test(Path(path))
    except (OSError, ValueError):
        return False


def _check_diagnosis_paths(r: _Reader, d: DiagnosisConfig) -> None:
    if d.draft is not None and not _is(Path.is_dir, d.draft):
        r.bad("diagnosis.draft", f"{d.draft} is not a directory; give the draft checkpoint folder "
              "(config.json + *.safetensors), or remove the key to use the server's speculative_draft_model_path")
    if d.target is not None and not _is(Path.exists, d.target):
        r.bad("diagnosis.target", f"{d.target} does not exist; give the target model folder or its config.json, "
              "or remove the key to use the server's model_path")
    if d.sglang_root is not None and not (_is(Path.is_file, os.path.join(d.sglang_root, "sglang", "__init__.py"))
                                          or _is(Path.is_file, os.path.join(d.sglang_root, "__init__.py"))):
        r.bad("diagnosis.sglang_root", f"no sglang package in {d.sglang_root}; give the folder that contains sglang/ "
              "(e.g. the server's site-packages), or remove the key to find it automatically")
    if d.vllm_root is not None and not _is(Path.is_file, os.path.join(d.vllm_root, "vllm", "__init__.py")):
        r.bad("diagnosis.vllm_root", f"no vllm package in {d.vllm_root}; give the folder that contains vllm/ "
              "(e.g. the server's site-packages), or remove the key to find it automatically")


def _timezone(r: _Reader, name: str | None, path: str, default: str | None) -> str | None:
    """`name` (at `path`), or `default` where it is not a time zone (reported)."""
    if name is None or name == default:
        return default
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        r.bad(path, f"unknown time zone {name!r}; use an IANA name such as UTC or Europe/Berlin")
        return default
    return name


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")  # fullmatch: `$` would let "0\n" pass


def _valid_host(host: str) -> bool:
    """An IP address or a DNS name (RFC 1123); `999.1.1.1` is neither."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    return (0 < len(host) <= 253 and all(_HOST_LABEL.fullmatch(x) for x in labels)
            and not labels[-1].isdigit())


def _valid_url(url: str) -> bool:
    if any(ord(c) <= 32 or ord(c) == 127 for c in url):  # urlsplit drops them silently; requests would not
        return False
    try:
        u = urlsplit(url)
        u.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError:
        return False
    return u.scheme in ("http", "https") and bool(u.hostname)


def build_config(data: object, source_path: str | None = None, *, for_run: bool = False,
                 secrets: bool = True) -> Config:
    """Validate a parsed YAML document. Raises ConfigError listing every problem. for_run: at
    least one log is required (`specwatch run`). secrets=False: secrets named by a variable or a
    file are not read (left None), for commands that only need state_dir (`silence`, `notifications`)."""
    r = _Reader(secrets)
    cfg = Config(source_path=source_path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(["(top level): must be a mapping of keys such as `logs:`, `metrics:`, `alerts:`"])
    doc = r.section(Document, data, "")
    default_server = doc.server or socket.gethostname()
    cfg.server = default_server
    default_tz = _timezone(r, doc.log_timezone, "log_timezone", None)
    cfg.log_timezone = default_tz

    logs = doc.logs
    if logs is None:
        logs = []
    if not isinstance(logs, list):
        r.bad("logs", "must be a list of entries like `- path: /var/log/sglang/server.log`")
        logs = []
    seen_paths: dict[str, int] = {}
    defaulted: list[int] = []
    source_dir = os.path.dirname(os.path.abspath(source_path)) if source_path else None
    for i, entry in enumerate(logs):
        p = f"logs[{i}]"
        if isinstance(entry, str):
            entry = {"path": entry}
        if not isinstance(entry, dict):
            r.bad(p, "must be a mapping with `path:` (and optional `server:`, `container_prefix:`)")
            continue
        e = r.section(LogEntry, entry, p)
        journal = _journal(r, entry, p, source_dir)
        if journal is None and entry.get("path") is None:
            if "journal" not in entry:
                r.bad(f"{p}.path", "missing; give the SGLang log file to follow (or `journal: {unit: sglang.service}`)")
            continue
        path = journal.key if journal else e.path
        if path is None:
            continue
        if journal is None and not os.path.isabs(path) and source_dir is not None:
            path = os.path.normpath(os.path.join(source_dir, path))  # relative to the config file
        if path in seen_paths:
            r.bad(f"{p}.path", f"{path} is already followed by logs[{seen_paths[path]}]; list each file once")
            continue
        seen_paths[path] = i
        if entry.get("server") is None:
            defaulted.append(i)
        server = default_server if e.server is None else e.server
        if server and (why := template_problem(server)):
            r.bad(f"{p}.server", why)
        envelope, grammar = _log_format(r, e.format, f"{p}.format")
        if journal is not None and e.format is not None:
            r.bad(f"{p}.format", "applies to files only; a journal entry's MESSAGE is the line itself")
        prefix = None if e.container_prefix is None or _regex_error(e.container_prefix) else e.container_prefix
        cfg.logs.append(LogSource(path=path, server=server, container_prefix=prefix, envelope=envelope, grammar=grammar,
                                  timezone=_timezone(r, e.timezone, f"{p}.timezone", default_tz), journal=journal))
    if len(defaulted) > 1:
        # Two servers' lines under one name would merge their ranks (a collapse hidden in a mean).
        r.bad(f"logs[{defaulted[1]}].server", f"logs[{defaulted[0]}] and logs[{defaulted[1]}] both default to "
              f"server {default_server!r}; give each log its own `server:` (the same name twice only "
              "if both files come from one SGLang server)")

    cfg.follow, cfg.limits, cfg.gpu, cfg.process = doc.follow, doc.limits, doc.gpu, doc.process
    cfg.server_apis = _server_api_section(r, doc.server_api, default_server)
    cfg.server_metrics = _server_metrics_section(r, doc.server_metrics, default_server)
    dg = doc.diagnosis
    cfg.diagnosis = msgspec.structs.replace(dg, **{  # relative to the config file, like logs[].path
        k: os.path.normpath(os.path.join(source_dir, v))
        for k in ("draft", "target", "sglang_root", "vllm_root") if (v := getattr(dg, k)) and source_dir})
    _check_diagnosis_paths(r, cfg.diagnosis)

    cfg.listen_address, cfg.listen_port = doc.metrics.listen_address, doc.metrics.listen_port
    cfg.state_dir = doc.state_dir

    rules = r.section(_rules_section(), doc.rules, "rules")
    cfg.rules = {attr: getattr(rules, key) for key, (attr, _) in rule_sections().items()}
    _alerts(r, cfg, doc.alerts)
    if for_run and not cfg.logs and not cfg.server_metrics and not any(
            p.startswith(("logs", "server_metrics")) for p in r.problems):
        r.bad("logs", "no log file configured; add `logs: [{path: /var/log/sglang/server.log}]` "
                      "(or `server_metrics: [{url: http://127.0.0.1:30000/metrics}]`)")
    if r.problems:
        raise ConfigError(r.problems)
    return cfg


def _journal(r: _Reader, entry: dict, p: str, source_dir: str | None) -> JournalConfig | None:
    """`logs[i].journal`, its directory relative to the config file; None when absent or invalid."""
    if "journal" not in entry:
        return None
    if entry.get("path") is not None:
        r.bad(f"{p}.journal", "give either `path:` (a file) or `journal:` in one entry; make two entries for both")
        return None
    if not isinstance(entry["journal"], dict):
        r.bad(f"{p}.journal", "must be a mapping, e.g. `journal: {unit: sglang.service}`")
        return None
    n = len(r.problems)
    j = r.section_of(JournalConfig, entry["journal"], f"{p}.journal")
    if j is None or len(r.problems) > n:
        return None
    if j.directory and source_dir and not os.path.isabs(j.directory):
        j = msgspec.structs.replace(j, directory=os.path.normpath(os.path.join(source_dir, j.directory)))
    return j


LOG_FORMATS = ("auto", "sglang", "docker", "cri", "python-logging")
_FORMAT_FIX = ("use one of auto (plain, Docker json-file or Kubernetes CRI, detected per file), sglang, docker, "
               "cri, python-logging, or {regex: '(?P<timestamp>...) ... (?P<message>.*)'}")


def _log_format(r: _Reader, raw, path: str) -> tuple[str, str | None]:
    """`logs[].format` → (container envelope, line grammar regex or None for SGLang's own)."""
    from specwatch.sources import grammar

    if raw is None or raw == "auto":
        return "auto", None
    if not isinstance(raw, (str, dict)):
        r.bad(path, f"must be a name or a mapping, not {type(raw).__name__}; {_FORMAT_FIX}")
        return "auto", None
    if isinstance(raw, dict):
        r.unknown(raw, path, {"regex"})
        rx = raw.get("regex")
        if not isinstance(rx, str) or not rx:
            r.bad(f"{path}.regex", "missing; a regular expression with named groups timestamp, message "
                  "(and optionally ranks), e.g. '(?P<timestamp>\\S+ \\S+) (?P<message>.*)'")
        elif why := grammar.problem(rx):
            r.bad(f"{path}.regex", f"{why}; give named groups timestamp and message (ranks optional), "
                  "e.g. '(?P<timestamp>\\S+ \\S+) \\w+ (?P<message>.*)'")
        else:
            return "auto", rx
        return "auto", None
    if raw in ("docker", "cri"):
        return raw, None
    if raw == "sglang":
        return "plain", None
    if raw in grammar.PRESETS:
        return "auto", grammar.PRESETS[raw]
    r.bad(path, f"unknown format {_show(raw)}; {_FORMAT_FIX}")
    return "auto", None


def parse_log_format(raw) -> tuple[str, str | None]:
    """A `format` value (`replay --format`: a name, else a regex) → (envelope, grammar).
    Raises ConfigError saying how to fix it."""
    r = _Reader()
    if isinstance(raw, str) and raw not in LOG_FORMATS:
        raw = {"regex": raw}
    out = _log_format(r, raw, "--format")
    if r.problems:
        raise ConfigError(r.problems)
    return out


# the fields a `server:` template may name: what a container log's path tells (sources/logfiles.py)
TEMPLATE_FIELDS = ("container", "image", "id", "pod", "namespace", "uid", "file")


def template_problem(server: str) -> str | None:
    """What is wrong with a `server:` template such as "{pod}" (None when fine)."""
    import string
    try:
        parsed = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(server) if f is not None]
    except ValueError as e:
        return f"not a valid template ({e}); write fields as {{pod}}, a literal brace as {{{{ or }}}}"
    if any(spec or conv for _, spec, conv in parsed):
        return "a field takes no format spec or conversion (`{pod:>9}`, `{pod!r}`); write it bare, e.g. {pod}"
    fields = [f for f, _, _ in parsed]
    unknown = [f for f in fields if f not in TEMPLATE_FIELDS]
    if unknown:
        return (f"unknown field {{{unknown[0]}}}; use {', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)} "
                "(from the log file's path or its Docker config.v2.json)")
    return None


def _regex_error(pattern: str) -> str | None:
    try:
        re.compile(pattern)
    except re.error as e:
        return str(e)
    return None


def _server_api_section(r: _Reader, raw, default_server: str) -> list[ServerApiConfig]:
    """`server_api:` is one mapping or a list of them (one per SGLang server on the box)."""
    out: list[ServerApiConfig] = []
    for path, entry in r.items(raw, "server_api", ServerApiConfig.example, one=True):
        api = r.section(ServerApiConfig, entry, path)
        if api.url is None:
            continue  # `url: null` (the example's default): the API is not polled
        out.append(msgspec.structs.replace(
            api, url=api.url.rstrip("/"), server=api.server or default_server,
            api_key=_resolve_secret(r, entry, path, "api_key"), api_key_env=None, api_key_file=None))
    return out


def _server_metrics_section(r: _Reader, raw, default_server: str) -> list[ServerMetricsConfig]:
    """`server_metrics:` is a list of mappings (or one mapping); each URL once."""
    out: list[ServerMetricsConfig] = []
    for path, entry in r.items(raw, "server_metrics", ServerMetricsConfig.example, one=True):
        sm = r.section_of(ServerMetricsConfig, entry, path)
        if sm is None:
            continue
        if any(x.url == sm.url for x in out):
            r.bad(f"{path}.url", f"{_show(sm.url)} is listed twice; scrape each endpoint once")
            continue
        out.append(msgspec.structs.replace(sm, server=sm.server or default_server))
    return out


def load_config(path: str | os.PathLike, *, for_run: bool = False, secrets: bool = True) -> Config:
    """Read and validate a YAML config file. Raises ConfigError (with key paths) on any problem,
    whatever the file holds (bounded: see `safe_yaml`). for_run: also require what `specwatch run`
    needs beyond a valid file (at least one log)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(safe_yaml.MAX_BYTES + 1)
    except OSError as e:
        raise ConfigError([f"{path}: cannot read the config file ({e.strerror}); check its path"]) from None
    try:
        data = safe_yaml.load(raw)
    except safe_yaml.InputError as e:
        raise ConfigError([f"{path}: {e.where}: {e.message}"]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError([f"{path}: not valid YAML{where}: {str(getattr(e, 'problem', None) or e)[:200]}"]) from None
    if data is None:
        raise ConfigError([f"{path}: (file): empty; start from config.example.yaml (at least "
                           "`logs: [{path: /var/log/sglang/server.log}]`)"])
    return build_config(data, str(path), for_run=for_run, secrets=secrets)


def _slack(r: _Reader, raw, path: str, base: SlackConfig) -> SlackConfig:
    """A Slack section; unset keys come from `base` (alerts.slack for a route)."""
    sc = r.section(SlackConfig, raw, path, base)
    url = _resolve_secret(r, raw if isinstance(raw, dict) else {}, path, "webhook_url")
    if url is not None and not _valid_url(url):
        r.bad(f"{path}.webhook_url", "must be an http(s) URL such as https://hooks.slack.com/services/T000/B000/XXXX (value not shown: it is a secret)")
        url = None
    token = _resolve_secret(r, raw if isinstance(raw, dict) else {}, path, "bot_token") or base.bot_token
    if token:
        if url:
            r.bad(f"{path}.bot_token", "give a bot_token or a webhook_url, not both (a bot posts with the Web API)")
        if not sc.channel:
            r.bad(f"{path}.channel", "missing: a bot_token posts with chat.postMessage, which needs a channel, "
                  "e.g. channel: '#oncall' (invite the bot there)")
        if not _valid_url(sc.api_url):
            r.bad(f"{path}.api_url", f"{_show(sc.api_url)} is not an http(s) URL; e.g. https://slack.com/api")
        url = sc.api_url.rstrip("/") + "/chat.postMessage"
    return msgspec.structs.replace(sc, webhook_url=url or base.webhook_url, webhook_url_env=None,
                                   webhook_url_file=None, bot_token=token or None, bot_token_env=None,
                                   bot_token_file=None)


_FITS = {"at_most": float.__le__, "at_least": float.__ge__, "below": float.__lt__, "above": float.__gt__}


def _bound_defaults(obj: S, written: set[str]) -> tuple[S, dict[str, tuple[str, str]]]:
    """`obj` with each unwritten key of its `default_bounds` moved within its bound (in their
    order: a later bound reads the keys an earlier one moved), and {key that no value of its
    range fits: (the written key its bound reads, what the key would have to be)}."""
    ranges = {f.name: _unwrap(f.type)[1] for f in msgspec.structs.fields(obj)}
    stuck = {}
    for entry in obj.default_bounds:
        b = entry if isinstance(entry, Bound) else Bound(entry[0], entry[1], (entry[2],), attrgetter(entry[2]))
        value, limit = getattr(obj, b.key), b.limit(obj)
        if b.key in written or _FITS[b.how](float(value), float(limit)):
            continue
        moved = (b.bent or b.limit)(obj)
        meta = ranges[b.key]
        if meta is not None:
            moved = min(max(moved, meta.ge if meta.ge is not None else moved), meta.le if meta.le is not None else moved)
        moved = round(moved, 9) if isinstance(moved, float) else moved  # 1.1 + 0.4 is 1.5, not 1.5000000000000002
        if _FITS[b.how](float(moved), float(limit)):
            obj = msgspec.structs.replace(obj, **{b.key: moved})
        elif written & set(b.on):
            stuck[b.key] = (next(k for k in b.on if k in written), f"{b.how.replace('_', ' ')} {float(limit):g}")
    return obj, stuck


def _backoff_problems(initial: float, maximum: float) -> list[tuple[str, str]]:
    return [("backoff_initial", f"({initial:g}s) must not exceed backoff_max ({maximum:g}s)")] if initial > maximum else []


def _alerts(r: _Reader, cfg: Config, al: AlertsConfig) -> None:
    for f in msgspec.structs.fields(al):  # the keys not read apart are Config's of the same name
        if f.type is not Raw:
            setattr(cfg, f.name, getattr(al, f.name))
    if al.inhibit_rules is not None:
        cfg.inhibit_rules = []
        for ip, raw in r.items(al.inhibit_rules, "alerts.inhibit_rules", InhibitConfig.example):
            rule = r.section(InhibitConfig, raw, ip)
            src, tgt = r.matchers(raw, "source_matchers", ip), r.matchers(raw, "target_matchers", ip)
            if (not src and not rule.source_matchers) or (not tgt and not rule.target_matchers):
                r.bad(ip, "needs source_matchers and target_matchers, e.g. " + InhibitConfig.example)
                continue
            if not src or not tgt:  # given but invalid: already reported
                continue
            cfg.inhibit_rules.append(InhibitRule(tuple(src), tuple(tgt), tuple(rule.equal)))

    cfg.slack = _slack(r, al.slack, "alerts.slack", SlackConfig())

    for wp, w in r.items(al.webhooks, "alerts.webhooks", WebhookConfig.example):
        hook = r.section_of(WebhookConfig, w, wp)
        url = _resolve_secret(r, w, wp, "url")
        if url is None and not any(w.get(k) for k in ("url", "url_env", "url_file")):
            r.bad(f"{wp}.url", "missing; the URL to POST to (or url_env / url_file)")
        elif url is not None and not _valid_url(url):
            r.bad(f"{wp}.url", "must be an http(s) URL (value not shown: it may hold a token)")
            url = None
        if hook is not None and any(x.name == hook.name for x in cfg.webhooks):
            r.bad(f"{wp}.name", f"{hook.name!r} is used twice; give each webhook its own name")
        elif hook is not None and url:
            cfg.webhooks.append(msgspec.structs.replace(hook, url=url, url_env=None, url_file=None))

    hooks = {w.name for w in cfg.webhooks}
    for i, (rp, rt) in enumerate(r.items(al.routes, "alerts.routes", RouteConfig.example)):
        route = r.section(RouteConfig, {**rt, "matchers": None, "slack": None}, rp)
        name = f"route{i + 1}" if route.name is None else route.name
        matchers = r.matchers(rt, "matchers", rp)
        if not matchers and not rt.get("matchers"):  # (given but invalid: already reported)
            r.bad(f"{rp}.matchers", "missing; a route needs at least one matcher, e.g. [severity=critical]")
        slack = None
        if "slack" in rt:
            slack = _slack(r, rt.get("slack"), f"{rp}.slack", cfg.slack)
            if not slack.webhook_url and r.secrets:
                r.bad(f"{rp}.slack", "no webhook: set webhook_url (or _env/_file) here or in alerts.slack")
        for j, h in enumerate(route.webhooks or []):
            if h not in hooks:
                r.bad(f"{rp}.webhooks[{j}]", f"no webhook named {h!r} in alerts.webhooks; known: {', '.join(sorted(hooks)) or 'none'}")
        if any(x.name == name for x in cfg.routes) or name == "default":
            r.bad(f"{rp}.name", f"{name!r} is used twice (or is the reserved name 'default'); give each route its own name")
        cfg.routes.append(msgspec.structs.replace(route, name=name, matchers=matchers, slack=slack))


def load_run_config(path: str | os.PathLike) -> Config:
    """`load_config(path, for_run=True)`, so start-up, a reload (SIGHUP) and `check-config` accept
    exactly the same files, and its state_dir is a folder the daemon can write in (or create).
    Raises ConfigError."""
    from specwatch.system.storage import state_dir_problem

    cfg = load_config(path, for_run=True)
    problem = state_dir_problem(cfg.state_dir)
    if problem:
        raise ConfigError([f"state_dir: {problem}"])
    return cfg


def journal_warnings(cfg: JournalConfig) -> list[str]:
    """What `check-config` warns about a valid journal entry: `key: problem; fix` lines."""
    out = []
    if shutil.which(JOURNALCTL) is None:
        out.append("unit: journalctl is not on PATH; install systemd (journalctl reads the journal for specwatch)")
    if cfg.directory and not os.path.isdir(cfg.directory):
        out.append(f"directory: {cfg.directory} is not a folder (yet); specwatch reads it once it exists")
    return out


def config_warnings(cfg: Config) -> list[str]:
    """What is valid but probably not meant, as `key.path: what; what specwatch does` lines: no
    log at all (fine for replay only), a log file that does not exist (yet: followed once it appears)."""
    if not cfg.logs and not cfg.server_metrics:
        return ["logs: no log file configured; `specwatch run` refuses this file (a `replay --config` "
                "file needs none); add `logs: [{path: /var/log/sglang/server.log}]`"]
    out = []
    for i, src in enumerate(cfg.logs):
        if src.journal is not None:
            out += [f"logs[{i}].journal.{w}" for w in journal_warnings(src.journal)]
        elif glob.has_magic(src.path):
            if not glob.glob(src.path):
                out.append(f"logs[{i}].path: {src.path} matches no file (yet); specwatch follows the files "
                           "that appear; check the pattern if the server logs elsewhere")
        elif os.path.isdir(src.path):
            out.append(f"logs[{i}].path: {src.path} is a directory; give the log file in it")
        elif not os.path.exists(src.path):
            out.append(f"logs[{i}].path: {src.path} does not exist (yet); specwatch follows it once it "
                       "appears; check the path if the server logs elsewhere")
    return out


def source_servers(cfg: Config) -> set[str]:
    """The servers a source of `cfg` names: each followed log's (globs expanded), each HTTP API's
    and /metrics endpoint's, and `process.servers`' (the default `server` only where one of
    them uses it)."""
    apis = [a.server for a in cfg.server_apis] + [m.server for m in cfg.server_metrics]  # set on each by build_config
    return ({s.server for s in cfg.logs} | {s for s in apis if s is not None} | set(cfg.process.servers.values()))
