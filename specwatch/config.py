"""Configuration: schema, defaults, loading and validation.

Every problem is reported with its key path (`alerts.slack.webhook_url: ...`) and how to fix it;
`load_config` collects all problems before raising `ConfigError`, so a user fixes a file in one
pass. The defaults here are the ones documented in `config.example.yaml`.
"""

from __future__ import annotations

import math
import os
import re
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError
import socket
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from specwatch.alerts.inhibit import InhibitRule, default_inhibit_rules
from specwatch.alerts.matchers import Matcher, parse_matcher

# Port 9849: a free slot near the GPU exporters (dcgm 9400, nvidia_gpu_exporter 9835) on the
# Prometheus "Default port allocations" list (https://github.com/prometheus/prometheus/wiki/
# Default-port-allocations); see README, "Port".
DEFAULT_PORT = 9849

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


class ConfigError(Exception):
    """A config that cannot be used. `problems` lists `key.path: what is wrong; how to fix`."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass
class LogSource:
    path: str
    server: str
    container_prefix: str | None = None  # regex; None = recognise `service  | ` automatically
    timezone: str | None = None  # IANA zone of the log's timestamps; None = this host's local time


@dataclass
class FollowConfig:
    poll_interval: float = 1.0
    max_line_bytes: int = 1_048_576
    watchdog: bool = True


@dataclass
class CollapseConfig:
    max_accept_length: float = 1.10
    min_batches: int = 3
    recover_accept_length: float = 1.5


@dataclass
class WindowConfig:
    """What makes a decode line a usable sample (rules/windows.py)."""

    min_running_requests: int = 1
    max_prefill_batches: int = 40  # SGLang's default --decode-log-interval
    max_gap: float = 120.0


@dataclass
class ExpectedAcceptance:
    model: str
    draft: str | None  # None: any draft of that model
    accept_length: float


@dataclass
class DegradationConfig:
    enabled: bool = True
    max_drop_ratio: float = 0.20
    recover_drop_ratio: float = 0.10
    window: float = 600.0
    hold: float = 600.0  # `for:` in YAML
    min_window_batches: int = 10
    baseline_window: float = 86400.0
    min_baseline_batches: int = 100
    expected: list[ExpectedAcceptance] = field(default_factory=list)


@dataclass
class DriftConfig:
    enabled: bool = True
    window: float = 4 * 3600.0
    bucket: float = 600.0
    min_buckets: int = 6
    min_bucket_batches: int = 3
    min_decline_per_hour: float = 0.03
    min_total_decline: float = 0.05
    min_falling_fraction: float = 0.7
    restart_gap: float = 1800.0


@dataclass
class SpeculationInactiveConfig:
    enabled: bool = True
    min_batches: int = 3


@dataclass
class SpecMetricsMissingConfig:
    enabled: bool = True
    window: float = 600.0
    min_prefill_batches: int = 10


@dataclass
class ThroughputDropConfig:
    enabled: bool = True
    max_drop_ratio: float = 0.40
    recover_drop_ratio: float = 0.20
    window: float = 300.0
    hold: float = 300.0  # `for:` in YAML
    min_window_batches: int = 5
    baseline_window: float = 86400.0
    min_baseline_batches: int = 30


@dataclass
class RankDisagreementConfig:
    enabled: bool = True
    max_accept_length: float = 1.10
    healthy_accept_length: float = 1.5
    min_batches: int = 3
    max_age: float = 300.0


@dataclass
class SlackConfig:
    webhook_url: str | None = None  # resolved secret (from the value, the env var or the file)
    channel: str | None = None
    timeout: float = 10.0
    backoff_initial: float = 1.0
    backoff_max: float = 300.0
    send_resolved: bool = True

    def __repr__(self) -> str:  # the webhook URL is a secret
        return f"SlackConfig(webhook_url={'<redacted>' if self.webhook_url else None}, channel={self.channel!r})"


@dataclass
class WebhookConfig:
    name: str
    url: str  # resolved secret
    send_resolved: bool = True
    max_alerts: int = 0
    timeout: float = 10.0
    backoff_initial: float = 1.0
    backoff_max: float = 300.0

    def __repr__(self) -> str:
        return f"WebhookConfig(name={self.name!r}, url=<redacted>)"


@dataclass
class AlertmanagerConfig:
    urls: list[str] = field(default_factory=list)
    resend_delay: float = 60.0
    resolved_retention: float = 900.0
    timeout: float = 10.0
    backoff_initial: float = 1.0
    backoff_max: float = 60.0


@dataclass
class RouteConfig:
    """One entry of alerts.routes; None = inherit from alerts.*."""

    name: str
    matchers: list[Matcher]
    slack: SlackConfig | None = None
    webhooks: list[str] | None = None
    group_by: list[str] | None = None
    group_wait: float | None = None
    group_interval: float | None = None
    repeat_interval: float | None = None
    continue_matching: bool = False


@dataclass
class GpuConfig:
    enabled: bool = True  # without a driver it exports specwatch_gpu_up 0 and warns once
    interval: float = 5.0


@dataclass
class ProcessConfig:
    enabled: bool = True  # psutil scan of the SGLang processes
    interval: float = 5.0
    match: str | None = None  # regex: command lines that are launchers too (wrappers)
    servers: dict[int, str] = field(default_factory=dict)  # --port -> server name; empty = all, auto-named


@dataclass
class ServerApiConfig:
    url: str
    server: str
    api_key: str | None = None  # resolved secret (value, env var or file)
    interval: float = 10.0
    health_interval: float = 60.0
    timeout: float = 2.0
    backoff_max: float = 120.0

    def __repr__(self) -> str:  # the API key is a secret
        return (f"ServerApiConfig(url={self.url!r}, server={self.server!r}, "
                f"api_key={'<redacted>' if self.api_key else None})")


@dataclass
class ServerRuleConfig:
    down_for: float = 30.0  # no process (or no HTTP answer) this long: SGLangServerDown
    restart_window: float = 600.0  # SGLangServerRestarted stays firing this long
    unhealthy_for: float = 120.0  # /health failing this long after it was fine: SGLangServerUnhealthy


LOCAL_HOSTS = frozenset(("127.0.0.1", "localhost", "::1", "0.0.0.0", "::"))


@dataclass(frozen=True)
class ProcessTies:
    """What makes an SGLang process found on the box a configured server (process source).

    logs: followed log path → server (the process writes its stdout/stderr there). api_ports:
    --port of a `server_api` URL on this host → server. configured: the names of configured
    servers: `process.servers`' names when given, else those of `logs` and `api_ports`.
    """

    logs: dict[str, str]
    api_ports: dict[int, str]
    configured: frozenset[str]

    @classmethod
    def of(cls, cfg: "Config") -> "ProcessTies":
        logs = {src.path: src.server for src in cfg.logs}
        ports: dict[int, str] = {}
        for api in cfg.server_apis:
            u = urlsplit(api.url)
            if (u.hostname or "") in LOCAL_HOSTS and u.port:
                ports.setdefault(u.port, api.server)
        named = cfg.process.servers.values() if cfg.process.servers else [*logs.values(), *ports.values()]
        return cls(logs, ports, frozenset(named))


@dataclass
class LogSilentConfig:
    intervals: int = 3  # decode-log intervals seen through /server_info without a decode line


GPU_THROTTLE_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown",
                        "hw_power_brake_slowdown", "sw_power_cap")
KNOWN_CLOCK_REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown",
                       "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown",
                       "hw_power_brake_slowdown", "display_clock_setting")


@dataclass
class GpuErrorsConfig:
    window: float = 600.0  # an XID/ECC alert resolves after this long without a new error
    ignore_xids: tuple[int, ...] = ()


@dataclass
class GpuThrottleConfig:
    reasons: tuple[str, ...] = GPU_THROTTLE_REASONS
    drop_ratio: float = 0.2  # throughput below (1 - drop_ratio) x the unthrottled baseline
    min_batches: int = 3
    baseline_window: float = 3600.0


@dataclass
class DiagnosisConfig:
    """`diagnosis:`: run the probes ahead of time and put their findings into collapse alerts.

    draft / target: folders (target may be its config.json); None → `speculative_draft_model_path`
    / `model_path` of the server's `server_args` log line. sglang_root: the folder containing the
    `sglang` package the server runs; None → found without importing it. timeout: seconds.
    """

    enabled: bool = True
    draft: str | None = None
    target: str | None = None
    sglang_root: str | None = None
    timeout: float = 60.0


@dataclass
class Config:
    server: str = ""  # default `server` label (host name)
    log_timezone: str | None = None  # default zone of log timestamps (None: local time)
    logs: list[LogSource] = field(default_factory=list)
    follow: FollowConfig = field(default_factory=FollowConfig)
    listen_address: str = "127.0.0.1"
    listen_port: int = DEFAULT_PORT
    state_dir: str = "/var/lib/specwatch"
    collapse: CollapseConfig = field(default_factory=CollapseConfig)
    windows: WindowConfig = field(default_factory=WindowConfig)
    degradation: DegradationConfig = field(default_factory=DegradationConfig)
    drift: DriftConfig = field(default_factory=DriftConfig)
    speculation_inactive: SpeculationInactiveConfig = field(default_factory=SpeculationInactiveConfig)
    spec_metrics_missing: SpecMetricsMissingConfig = field(default_factory=SpecMetricsMissingConfig)
    throughput_drop: ThroughputDropConfig = field(default_factory=ThroughputDropConfig)
    rank_disagreement: RankDisagreementConfig = field(default_factory=RankDisagreementConfig)
    # alerts: Alertmanager's route defaults
    # Alertmanager's default is [] (one group); per alert name and server, an XID on one GPU
    # never holds back a collapse by a group_interval.
    group_by: list[str] = field(default_factory=lambda: ["alertname", "server"])
    group_wait: float = 1.0  # Alertmanager: 30s; see config.example.yaml
    group_interval: float = 60.0  # Alertmanager: 5m; a resolve goes out within a minute
    repeat_interval: float = 4 * 3600.0
    inhibit_rules: list[InhibitRule] = field(default_factory=default_inhibit_rules)
    runbook_url: str = ""
    external_url: str = ""
    slack: SlackConfig = field(default_factory=SlackConfig)
    webhooks: list[WebhookConfig] = field(default_factory=list)
    alertmanager: AlertmanagerConfig = field(default_factory=AlertmanagerConfig)
    routes: list[RouteConfig] = field(default_factory=list)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    process: ProcessConfig = field(default_factory=ProcessConfig)
    server_apis: list[ServerApiConfig] = field(default_factory=list)
    server_rule: ServerRuleConfig = field(default_factory=ServerRuleConfig)
    log_silent: LogSilentConfig = field(default_factory=LogSilentConfig)
    gpu_errors: GpuErrorsConfig = field(default_factory=GpuErrorsConfig)
    gpu_throttle: GpuThrottleConfig = field(default_factory=GpuThrottleConfig)
    diagnosis: DiagnosisConfig = field(default_factory=DiagnosisConfig)
    source_path: str | None = None

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
        return float(value)
    m = _DURATION.match(str(value))
    if not m:
        raise ValueError(value)
    return float(m.group(1)) * _UNITS[m.group(2)]


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else str(key)


class _Reader:
    """Walks a parsed YAML mapping, recording problems with key paths."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def bad(self, path: str, msg: str) -> None:
        self.problems.append(f"{path}: {msg}")

    def section(self, data: dict, key: str, path: str, known: set[str]) -> dict:
        value = data.get(key)
        full = _join(path, key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.bad(full, f"must be a mapping, got {type(value).__name__}; write `{key}:` followed by indented keys")
            return {}
        self.unknown(value, full, known)
        return value

    def unknown(self, data: dict, path: str, known: set[str]) -> None:
        for k in data:
            if k not in known:
                where = _join(path, k)
                self.bad(where, f"unknown key; known keys here: {', '.join(sorted(known))}")

    def number(self, data: dict, key: str, path: str, default, *, kind=float, lo=None, hi=None):
        if key not in data or data[key] is None:
            return default
        v = data[key]
        full = _join(path, key)
        if (isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int))
                or not math.isfinite(v)):
            self.bad(full, f"must be {'an integer' if kind is int else 'a number'}, got {v!r}; e.g. `{key}: {default}`")
            return default
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            rng = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
            self.bad(full, f"must be {rng}, got {v}; the default is {default}")
            return default
        return kind(v)

    def duration(self, data: dict, key: str, path: str, default, minimum: float = 0.001):
        """A duration in seconds, at least `minimum` (0: zero allowed)."""
        if key not in data or data[key] is None:
            return default
        try:
            v = parse_duration(data[key])
        except ValueError:
            self.bad(_join(path, key), f"not a duration: {data[key]!r}; write e.g. `30s`, `5m`, `4h` or a number of seconds")
            return default
        if not math.isfinite(v) or v < minimum:
            self.bad(_join(path, key), f"must be a finite duration of at least {minimum:g}s, got {data[key]!r}")
            return default
        return v

    def boolean(self, data: dict, key: str, path: str, default: bool) -> bool:
        if key not in data or data[key] is None:
            return default
        if not isinstance(data[key], bool):
            self.bad(_join(path, key), f"must be true or false, got {data[key]!r}")
            return default
        return data[key]

    def string(self, data: dict, key: str, path: str, default: str | None) -> str | None:
        if key not in data or data[key] is None:
            return default
        if not isinstance(data[key], (str, int)) or isinstance(data[key], bool):
            self.bad(_join(path, key), f"must be a string, got {data[key]!r}")
            return default
        return str(data[key])

    def strings(self, data: dict, key: str, path: str, default: list[str] | None) -> list[str] | None:
        if key not in data or data[key] is None:
            return default
        v = data[key]
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
            self.bad(f"{path}.{key}", f"must be a list of strings, got {v!r}; e.g. `{key}: [alertname, server]`")
            return default
        return list(v)

    def matchers(self, data: dict, key: str, path: str) -> list[Matcher]:
        out = []
        for i, text in enumerate(self.strings(data, key, path, []) or []):
            try:
                out.append(parse_matcher(text))
            except ValueError as e:
                self.bad(f"{path}.{key}[{i}]", str(e))
        return out

    def ratio(self, data: dict, key: str, path: str, default: float) -> float:
        return self.number(data, key, path, default, lo=0.0, hi=1.0)

    def items(self, data: dict, key: str, path: str, example: str) -> list[tuple[str, dict]]:
        """A list of mappings → [(key path, mapping)]; anything else is reported."""
        v = data.get(key)
        if v is None:
            return []
        if not isinstance(v, list):
            self.bad(f"{path}.{key}", f"must be a list of mappings, e.g. `{key}: [{example}]`")
            return []
        out = []
        for i, item in enumerate(v):
            if isinstance(item, dict):
                out.append((f"{path}.{key}[{i}]", item))
            else:
                self.bad(f"{path}.{key}[{i}]", f"must be a mapping, e.g. {example}")
        return out


def _resolve_secret(r: _Reader, data: dict, path: str, name: str) -> str | None:
    """A secret from `name`, `name_env` (variable name) or `name_file` (path); at most one."""
    given = [k for k in (name, f"{name}_env", f"{name}_file") if data.get(k)]
    if len(given) > 1:
        r.bad(f"{path}.{given[1]}", f"give only one of {', '.join(given)}")
        return None
    if not given:
        return None
    key = given[0]
    raw = str(data[key])
    if key == name:
        return raw
    if key.endswith("_env"):
        value = os.environ.get(raw)
        if not value:
            r.bad(f"{path}.{key}", f"environment variable {raw} is not set or empty; export it, or use {name}_file")
        return value or None
    try:
        value = Path(raw).read_text().strip()
    except OSError as e:
        r.bad(f"{path}.{key}", f"cannot read {raw}: {e.strerror}; check the path and that specwatch may read it")
        return None
    if not value:
        r.bad(f"{path}.{key}", f"{raw} is empty; put the {name.replace('_', ' ')} in it")
    return value or None


def _check_diagnosis_paths(r: _Reader, d: DiagnosisConfig) -> None:
    if d.draft is not None and not Path(d.draft).is_dir():
        r.bad("diagnosis.draft", f"{d.draft} is not a directory; give the draft checkpoint folder "
              "(config.json + *.safetensors), or remove the key to use the server's speculative_draft_model_path")
    if d.target is not None and not Path(d.target).exists():
        r.bad("diagnosis.target", f"{d.target} does not exist; give the target model folder or its config.json, "
              "or remove the key to use the server's model_path")
    if d.sglang_root is not None and not ((Path(d.sglang_root) / "sglang" / "__init__.py").is_file()
                                          or (Path(d.sglang_root) / "__init__.py").is_file()):
        r.bad("diagnosis.sglang_root", f"no sglang package in {d.sglang_root}; give the folder that contains sglang/ "
              "(e.g. the server's site-packages), or remove the key to find it automatically")


def _timezone(r: _Reader, data: dict, path: str, default: str | None) -> str | None:
    key = "timezone" if path else "log_timezone"
    name = r.string(data, key, path, default)
    if name is None or name == default:
        return name
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        r.bad(_join(path, key), f"unknown time zone {name!r}; use an IANA name such as UTC or Europe/Berlin")
        return default
    return name


def _valid_url(url: str) -> bool:
    try:
        u = urlsplit(url)
        u.port  # raises ValueError on a bad port
    except ValueError:
        return False
    return u.scheme in ("http", "https") and bool(u.hostname)


def build_config(data: dict | None, source_path: str | None = None) -> Config:
    """Validate a parsed YAML document. Raises ConfigError listing every problem."""
    r = _Reader()
    cfg = Config(source_path=source_path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(["(top level): must be a mapping of keys such as `logs:`, `metrics:`, `alerts:`"])
    r.unknown(data, "", {"server", "log_timezone", "logs", "follow", "metrics", "state_dir", "rules", "alerts", "gpu",
                         "process", "server_api", "diagnosis"})
    default_server = r.string(data, "server", "", None) or socket.gethostname()
    cfg.server = default_server
    default_tz = _timezone(r, data, "", None)
    cfg.log_timezone = default_tz

    logs = data.get("logs") or []
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
        r.unknown(entry, p, {"path", "server", "container_prefix", "timezone"})
        path = r.string(entry, "path", p, None)
        if not path:
            r.bad(f"{p}.path", "missing; give the SGLang log file to follow")
            continue
        prefix = r.string(entry, "container_prefix", p, None)
        if prefix is not None:
            try:
                re.compile(prefix)
            except re.error as e:
                r.bad(f"{p}.container_prefix", f"not a valid regular expression ({e}); e.g. '^\\S+\\s+\\| '")
                prefix = None
        if not os.path.isabs(path) and source_dir is not None:
            path = os.path.normpath(os.path.join(source_dir, path))  # relative to the config file
        if path in seen_paths:
            r.bad(f"{p}.path", f"{path} is already followed by logs[{seen_paths[path]}]; list each file once")
            continue
        seen_paths[path] = i
        explicit = entry.get("server") is not None
        if not explicit:
            defaulted.append(i)
        cfg.logs.append(LogSource(path=path, server=r.string(entry, "server", p, default_server),
                                  container_prefix=prefix, timezone=_timezone(r, entry, p, default_tz)))
    if len(defaulted) > 1:
        # Two servers' lines under one name would merge their ranks (a collapse hidden in a mean).
        r.bad(f"logs[{defaulted[1]}].server", f"logs[{defaulted[0]}] and logs[{defaulted[1]}] both default to "
              f"server {default_server!r}; give each log its own `server:` (the same name twice only "
              "if both files come from one SGLang server)")

    f = r.section(data, "follow", "", {"poll_interval", "max_line_bytes", "watchdog"})
    cfg.follow = FollowConfig(
        poll_interval=r.duration(f, "poll_interval", "follow", 1.0, minimum=0.05),
        max_line_bytes=r.number(f, "max_line_bytes", "follow", 1_048_576, kind=int, lo=1024),
        watchdog=r.boolean(f, "watchdog", "follow", True),
    )

    g = r.section(data, "gpu", "", {"enabled", "interval"})
    cfg.gpu = GpuConfig(enabled=r.boolean(g, "enabled", "gpu", True), interval=r.duration(g, "interval", "gpu", 5.0))

    cfg.process = _process_section(r, data)
    cfg.server_apis = _server_api_section(r, data, default_server)
    dg = r.section(data, "diagnosis", "", {"enabled", "draft", "target", "sglang_root", "timeout"})
    def _path(key: str) -> str | None:  # relative to the config file, like logs[].path
        value = r.string(dg, key, "diagnosis", None)
        return os.path.normpath(os.path.join(source_dir, value)) if value and source_dir else value

    cfg.diagnosis = DiagnosisConfig(
        enabled=r.boolean(dg, "enabled", "diagnosis", True),
        draft=_path("draft"),
        target=_path("target"),
        sglang_root=_path("sglang_root"),
        timeout=r.duration(dg, "timeout", "diagnosis", 60.0),
    )
    _check_diagnosis_paths(r, cfg.diagnosis)

    m = r.section(data, "metrics", "", {"listen_address", "listen_port"})
    cfg.listen_address = r.string(m, "listen_address", "metrics", "127.0.0.1")
    cfg.listen_port = r.number(m, "listen_port", "metrics", DEFAULT_PORT, kind=int, lo=0, hi=65535)

    cfg.state_dir = r.string(data, "state_dir", "", cfg.state_dir)

    rules = r.section(data, "rules", "", {
        "collapse", "windows", "degradation", "drift", "speculation_inactive", "spec_metrics_missing",
        "throughput_drop", "rank_disagreement", "server", "log_silent", "gpu_errors", "gpu_throttle",
    })
    _source_rule_sections(r, rules, cfg)
    _rules(r, cfg, rules)
    _alerts(r, cfg, r.section(data, "alerts", "", {
        "group_by", "group_wait", "group_interval", "repeat_interval", "inhibit_rules", "runbook_url",
        "external_url", "slack", "webhooks", "alertmanager", "routes",
    }))
    if r.problems:
        raise ConfigError(r.problems)
    return cfg


def _process_section(r: _Reader, data: dict) -> ProcessConfig:
    p = r.section(data, "process", "", {"enabled", "interval", "match", "servers"})
    match = r.string(p, "match", "process", None)
    if match is not None:
        try:
            re.compile(match)
        except re.error as e:
            r.bad("process.match", f"not a valid regular expression ({e}); e.g. 'my_sglang_wrapper\\.py'")
            match = None
    servers: dict[int, str] = {}
    raw = p.get("servers") or {}
    if not isinstance(raw, dict):
        r.bad("process.servers", "must map SGLang --port numbers to server names, e.g. `servers: {30000: sglang-0}`")
        raw = {}
    for port, name in raw.items():
        key = f"process.servers.{port}"
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            r.bad(key, "the key must be a port number (the server's --port), e.g. `30000: sglang-0`")
        elif not isinstance(name, str) or not name:
            r.bad(key, f"must be a server name (the `server` label), got {name!r}")
        else:
            servers[port] = name
    return ProcessConfig(
        enabled=r.boolean(p, "enabled", "process", True),
        interval=r.duration(p, "interval", "process", 5.0),
        match=match,
        servers=servers,
    )


_API_KEYS = {"url", "server", "api_key", "api_key_env", "api_key_file", "interval", "health_interval",
             "timeout", "backoff_max"}


def _server_api_section(r: _Reader, data: dict, default_server: str) -> list[ServerApiConfig]:
    """`server_api:` is one mapping or a list of them (one per SGLang server on the box)."""
    raw = data.get("server_api")
    if raw is None:
        return []
    entries = raw if isinstance(raw, list) else [raw]
    out: list[ServerApiConfig] = []
    for i, entry in enumerate(entries):
        path = f"server_api[{i}]" if isinstance(raw, list) else "server_api"
        if not isinstance(entry, dict):
            r.bad(path, "must be a mapping with `url:` (e.g. `url: http://127.0.0.1:30000`)")
            continue
        r.unknown(entry, path, _API_KEYS)
        url = r.string(entry, "url", path, None)
        if url is None:
            continue  # `url: null` (the example's default): the API is not polled
        if not _valid_url(url):
            r.bad(f"{path}.url", "must be an http(s) base URL such as http://127.0.0.1:30000")
            continue
        timeout = r.duration(entry, "timeout", path, 2.0)
        interval = r.duration(entry, "interval", path, 10.0)
        if timeout >= interval:
            r.bad(f"{path}.timeout", f"must be shorter than interval ({interval:g}s) or polls pile up; e.g. 2s")
        out.append(ServerApiConfig(
            url=url.rstrip("/"),
            server=r.string(entry, "server", path, default_server),
            api_key=_resolve_secret(r, entry, path, "api_key"),
            interval=interval,
            health_interval=r.duration(entry, "health_interval", path, 60.0),
            timeout=timeout,
            backoff_max=r.duration(entry, "backoff_max", path, 120.0),
        ))
    return out


def _source_rule_sections(r: _Reader, rules: dict, cfg: Config) -> None:
    s = r.section(rules, "server", "rules", {"down_for", "restart_window", "unhealthy_for"})
    cfg.server_rule = ServerRuleConfig(
        down_for=r.duration(s, "down_for", "rules.server", 30.0),
        restart_window=r.duration(s, "restart_window", "rules.server", 600.0),
        unhealthy_for=r.duration(s, "unhealthy_for", "rules.server", 120.0),
    )
    ls = r.section(rules, "log_silent", "rules", {"intervals"})
    cfg.log_silent = LogSilentConfig(intervals=r.number(ls, "intervals", "rules.log_silent", 3, kind=int, lo=1))
    ge = r.section(rules, "gpu_errors", "rules", {"window", "ignore_xids"})
    ignore = ge.get("ignore_xids") or []
    if not isinstance(ignore, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in ignore):
        r.bad("rules.gpu_errors.ignore_xids", f"must be a list of XID numbers, e.g. [13, 43], got {ignore!r}")
        ignore = []
    cfg.gpu_errors = GpuErrorsConfig(window=r.duration(ge, "window", "rules.gpu_errors", 600.0),
                                     ignore_xids=tuple(ignore))
    gt = r.section(rules, "gpu_throttle", "rules", {"reasons", "drop_ratio", "min_batches", "baseline_window"})
    reasons = gt.get("reasons")
    if reasons is None:
        reasons = list(GPU_THROTTLE_REASONS)
    elif not isinstance(reasons, list) or not reasons or any(x not in KNOWN_CLOCK_REASONS for x in reasons):
        r.bad("rules.gpu_throttle.reasons",
              f"must be a non-empty list of clock event reasons from: {', '.join(KNOWN_CLOCK_REASONS)}; got {reasons!r}")
        reasons = list(GPU_THROTTLE_REASONS)
    cfg.gpu_throttle = GpuThrottleConfig(
        reasons=tuple(reasons),
        drop_ratio=r.number(gt, "drop_ratio", "rules.gpu_throttle", 0.2, lo=0.01, hi=0.99),
        min_batches=r.number(gt, "min_batches", "rules.gpu_throttle", 3, kind=int, lo=1),
        baseline_window=r.duration(gt, "baseline_window", "rules.gpu_throttle", 3600.0),
    )


def load_config(path: str | os.PathLike) -> Config:
    """Read and validate a YAML config file. Raises ConfigError (with key paths) on any problem."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError([f"{path}: cannot read ({e.strerror}); check the path given to --config"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError([f"{path}: not valid YAML{where}: {getattr(e, 'problem', e)}"]) from None
    return build_config(data, str(path))


def _rules(r: _Reader, cfg: Config, rules: dict) -> None:
    p = "rules.collapse"
    c = r.section(rules, "collapse", "rules", {"max_accept_length", "min_batches", "recover_accept_length"})
    cfg.collapse = CollapseConfig(
        max_accept_length=r.number(c, "max_accept_length", p, 1.10, lo=1.0),
        min_batches=r.number(c, "min_batches", p, 3, kind=int, lo=1),
        recover_accept_length=r.number(c, "recover_accept_length", p, 1.5, lo=1.0),
    )
    if cfg.collapse.recover_accept_length <= cfg.collapse.max_accept_length:
        r.bad("rules.collapse.recover_accept_length",
              f"must be above max_accept_length ({cfg.collapse.max_accept_length}) or the alert would flap; e.g. 1.5")

    p = "rules.windows"
    w = r.section(rules, "windows", "rules", {"min_running_requests", "max_prefill_batches", "max_gap"})
    cfg.windows = WindowConfig(
        min_running_requests=r.number(w, "min_running_requests", p, 1, kind=int, lo=1),
        max_prefill_batches=r.number(w, "max_prefill_batches", p, 40, kind=int, lo=0),
        max_gap=r.duration(w, "max_gap", p, 120.0),
    )

    p = "rules.degradation"
    d = r.section(rules, "degradation", "rules", {
        "enabled", "max_drop_ratio", "recover_drop_ratio", "window", "for", "min_window_batches",
        "baseline_window", "min_baseline_batches", "expected"})
    expected = []
    for ep, e in r.items(d, "expected", p, "{model: moonshotai/Kimi-K2.5, draft: /models/k25-eagle3, accept_length: 2.9}"):
        r.unknown(e, ep, {"model", "draft", "accept_length"})
        model = r.string(e, "model", ep, None)
        if not model:
            r.bad(f"{ep}.model", "missing; the target's model_path as in the server_args line (--model-path)")
        if "accept_length" not in e:
            r.bad(f"{ep}.accept_length", "missing; the accept len this model pair reaches when healthy, e.g. 2.9")
        length = r.number(e, "accept_length", ep, 0.0, lo=1.0)
        if model and length >= 1.0:
            expected.append(ExpectedAcceptance(model, r.string(e, "draft", ep, None), length))
    cfg.degradation = DegradationConfig(
        enabled=r.boolean(d, "enabled", p, True),
        max_drop_ratio=r.ratio(d, "max_drop_ratio", p, 0.20),
        recover_drop_ratio=r.ratio(d, "recover_drop_ratio", p, 0.10),
        window=r.duration(d, "window", p, 600.0),
        hold=r.duration(d, "for", p, 600.0),
        min_window_batches=r.number(d, "min_window_batches", p, 10, kind=int, lo=1),
        baseline_window=r.duration(d, "baseline_window", p, 86400.0),
        min_baseline_batches=r.number(d, "min_baseline_batches", p, 100, kind=int, lo=1),
        expected=expected,
    )
    _check_hysteresis(r, p, cfg.degradation.max_drop_ratio, cfg.degradation.recover_drop_ratio)

    p = "rules.drift"
    d = r.section(rules, "drift", "rules", {
        "enabled", "window", "bucket", "min_buckets", "min_bucket_batches", "min_decline_per_hour",
        "min_total_decline", "min_falling_fraction", "restart_gap"})
    cfg.drift = DriftConfig(
        enabled=r.boolean(d, "enabled", p, True),
        window=r.duration(d, "window", p, 4 * 3600.0),
        bucket=r.duration(d, "bucket", p, 600.0),
        min_buckets=r.number(d, "min_buckets", p, 6, kind=int, lo=3),
        min_bucket_batches=r.number(d, "min_bucket_batches", p, 3, kind=int, lo=1),
        min_decline_per_hour=r.ratio(d, "min_decline_per_hour", p, 0.03),
        min_total_decline=r.ratio(d, "min_total_decline", p, 0.05),
        min_falling_fraction=r.ratio(d, "min_falling_fraction", p, 0.7),
        restart_gap=r.duration(d, "restart_gap", p, 1800.0),
    )
    if cfg.drift.window < cfg.drift.bucket * cfg.drift.min_buckets:
        r.bad("rules.drift.window", f"must hold min_buckets ({cfg.drift.min_buckets}) buckets of "
              f"{cfg.drift.bucket:g}s; make it at least {cfg.drift.bucket * cfg.drift.min_buckets:g}s")

    p = "rules.speculation_inactive"
    d = r.section(rules, "speculation_inactive", "rules", {"enabled", "min_batches"})
    cfg.speculation_inactive = SpeculationInactiveConfig(
        enabled=r.boolean(d, "enabled", p, True), min_batches=r.number(d, "min_batches", p, 3, kind=int, lo=1))

    p = "rules.spec_metrics_missing"
    d = r.section(rules, "spec_metrics_missing", "rules", {"enabled", "window", "min_prefill_batches"})
    cfg.spec_metrics_missing = SpecMetricsMissingConfig(
        enabled=r.boolean(d, "enabled", p, True), window=r.duration(d, "window", p, 600.0),
        min_prefill_batches=r.number(d, "min_prefill_batches", p, 10, kind=int, lo=1))

    p = "rules.throughput_drop"
    d = r.section(rules, "throughput_drop", "rules", {
        "enabled", "max_drop_ratio", "recover_drop_ratio", "window", "for", "min_window_batches",
        "baseline_window", "min_baseline_batches"})
    cfg.throughput_drop = ThroughputDropConfig(
        enabled=r.boolean(d, "enabled", p, True),
        max_drop_ratio=r.ratio(d, "max_drop_ratio", p, 0.40),
        recover_drop_ratio=r.ratio(d, "recover_drop_ratio", p, 0.20),
        window=r.duration(d, "window", p, 300.0),
        hold=r.duration(d, "for", p, 300.0),
        min_window_batches=r.number(d, "min_window_batches", p, 5, kind=int, lo=1),
        baseline_window=r.duration(d, "baseline_window", p, 86400.0),
        min_baseline_batches=r.number(d, "min_baseline_batches", p, 30, kind=int, lo=1),
    )
    _check_hysteresis(r, p, cfg.throughput_drop.max_drop_ratio, cfg.throughput_drop.recover_drop_ratio)

    p = "rules.rank_disagreement"
    d = r.section(rules, "rank_disagreement", "rules", {
        "enabled", "max_accept_length", "healthy_accept_length", "min_batches", "max_age"})
    cfg.rank_disagreement = RankDisagreementConfig(
        enabled=r.boolean(d, "enabled", p, True),
        max_accept_length=r.number(d, "max_accept_length", p, 1.10, lo=1.0),
        healthy_accept_length=r.number(d, "healthy_accept_length", p, 1.5, lo=1.0),
        min_batches=r.number(d, "min_batches", p, 3, kind=int, lo=1),
        max_age=r.duration(d, "max_age", p, 300.0),
    )
    if cfg.rank_disagreement.healthy_accept_length <= cfg.rank_disagreement.max_accept_length:
        r.bad(f"{p}.healthy_accept_length",
              f"must be above max_accept_length ({cfg.rank_disagreement.max_accept_length}); e.g. 1.5")


def _check_hysteresis(r: _Reader, path: str, max_drop: float, recover_drop: float) -> None:
    if recover_drop >= max_drop:
        r.bad(f"{path}.recover_drop_ratio",
              f"must be below max_drop_ratio ({max_drop}) or the alert would flap; e.g. {max_drop / 2:g}")


_SLACK_KEYS = {"webhook_url", "webhook_url_env", "webhook_url_file", "channel", "timeout", "backoff_initial",
               "backoff_max", "send_resolved"}


def _slack(r: _Reader, s: dict, path: str, base: SlackConfig) -> SlackConfig:
    """A Slack section; unset keys come from `base` (alerts.slack for a route)."""
    url = _resolve_secret(r, s, path, "webhook_url")
    if url is not None and not _valid_url(url):
        r.bad(f"{path}.webhook_url", "must be an http(s) URL such as https://hooks.slack.com/services/T000/B000/XXXX (value not shown: it is a secret)")
        url = None
    sc = SlackConfig(
        webhook_url=url or base.webhook_url,
        channel=r.string(s, "channel", path, base.channel),
        timeout=r.duration(s, "timeout", path, base.timeout),
        backoff_initial=r.duration(s, "backoff_initial", path, base.backoff_initial),
        backoff_max=r.duration(s, "backoff_max", path, base.backoff_max),
        send_resolved=r.boolean(s, "send_resolved", path, base.send_resolved),
    )
    _check_backoff(r, path, sc.backoff_initial, sc.backoff_max)
    return sc


def _check_backoff(r: _Reader, path: str, initial: float, maximum: float) -> None:
    if initial > maximum:
        r.bad(f"{path}.backoff_initial", f"({initial:g}s) must not exceed backoff_max ({maximum:g}s)")


def _alerts(r: _Reader, cfg: Config, a: dict) -> None:
    cfg.group_by = r.strings(a, "group_by", "alerts", ["alertname", "server"])
    cfg.group_wait = r.duration(a, "group_wait", "alerts", 1.0, minimum=0.0)
    cfg.group_interval = r.duration(a, "group_interval", "alerts", 60.0, minimum=0.0)
    cfg.repeat_interval = r.duration(a, "repeat_interval", "alerts", 4 * 3600.0)
    cfg.runbook_url = r.string(a, "runbook_url", "alerts", "")
    cfg.external_url = r.string(a, "external_url", "alerts", "")
    if "inhibit_rules" in a and a["inhibit_rules"] is not None:
        cfg.inhibit_rules = []
        example = "{source_matchers: [alertname=AcceptanceCollapse], target_matchers: [alertname=ThroughputDrop], equal: [server, rank]}"
        for ip, rule in r.items(a, "inhibit_rules", "alerts", example):
            r.unknown(rule, ip, {"source_matchers", "target_matchers", "equal"})
            src, tgt = r.matchers(rule, "source_matchers", ip), r.matchers(rule, "target_matchers", ip)
            if not src or not tgt:
                r.bad(ip, "needs source_matchers and target_matchers, e.g. " + example)
                continue
            cfg.inhibit_rules.append(InhibitRule(tuple(src), tuple(tgt), tuple(r.strings(rule, "equal", ip, []))))

    cfg.slack = _slack(r, r.section(a, "slack", "alerts", _SLACK_KEYS), "alerts.slack", SlackConfig())

    for wp, w in r.items(a, "webhooks", "alerts", "{name: ops, url: https://hooks.example/specwatch}"):
        r.unknown(w, wp, {"name", "url", "url_env", "url_file", "send_resolved", "max_alerts", "timeout",
                          "backoff_initial", "backoff_max"})
        name = r.string(w, "name", wp, None)
        if not name:
            r.bad(f"{wp}.name", "missing; a short name for metrics and routes, e.g. `name: ops`")
        elif any(x.name == name for x in cfg.webhooks):
            r.bad(f"{wp}.name", f"{name!r} is used twice; give each webhook its own name")
        url = _resolve_secret(r, w, wp, "url")
        if url is None and not any(w.get(k) for k in ("url", "url_env", "url_file")):
            r.bad(f"{wp}.url", "missing; the URL to POST to (or url_env / url_file)")
        elif url is not None and not _valid_url(url):
            r.bad(f"{wp}.url", "must be an http(s) URL (value not shown: it may hold a token)")
            url = None
        hook = WebhookConfig(
            name=name or "", url=url or "",
            send_resolved=r.boolean(w, "send_resolved", wp, True),
            max_alerts=r.number(w, "max_alerts", wp, 0, kind=int, lo=0),
            timeout=r.duration(w, "timeout", wp, 10.0),
            backoff_initial=r.duration(w, "backoff_initial", wp, 1.0),
            backoff_max=r.duration(w, "backoff_max", wp, 300.0),
        )
        _check_backoff(r, wp, hook.backoff_initial, hook.backoff_max)
        if name and url:
            cfg.webhooks.append(hook)

    p = "alerts.alertmanager"
    m = r.section(a, "alertmanager", "alerts", {"urls", "resend_delay", "resolved_retention", "timeout",
                                                "backoff_initial", "backoff_max"})
    urls = r.strings(m, "urls", p, []) or []
    for i, u in enumerate(urls):
        if not _valid_url(u):
            r.bad(f"{p}.urls[{i}]", f"{u!r} is not an http(s) URL; e.g. http://127.0.0.1:9093")
    cfg.alertmanager = AlertmanagerConfig(
        urls=[u for u in urls if _valid_url(u)],
        resend_delay=r.duration(m, "resend_delay", p, 60.0),
        resolved_retention=r.duration(m, "resolved_retention", p, 900.0),
        timeout=r.duration(m, "timeout", p, 10.0),
        backoff_initial=r.duration(m, "backoff_initial", p, 1.0),
        backoff_max=r.duration(m, "backoff_max", p, 60.0),
    )
    _check_backoff(r, p, cfg.alertmanager.backoff_initial, cfg.alertmanager.backoff_max)

    hooks = {w.name for w in cfg.webhooks}
    for i, (rp, rt) in enumerate(r.items(a, "routes", "alerts", "{matchers: [severity=critical], slack: {channel: '#oncall'}}")):
        r.unknown(rt, rp, {"name", "matchers", "slack", "webhooks", "group_by", "group_wait", "group_interval",
                           "repeat_interval", "continue"})
        name = r.string(rt, "name", rp, f"route{i + 1}")
        matchers = r.matchers(rt, "matchers", rp)
        if not matchers:
            r.bad(f"{rp}.matchers", "missing; a route needs at least one matcher, e.g. [severity=critical]")
        slack = None
        if "slack" in rt:
            slack = _slack(r, r.section(rt, "slack", rp, _SLACK_KEYS), f"{rp}.slack", cfg.slack)
            if not slack.webhook_url:
                r.bad(f"{rp}.slack", "no webhook: set webhook_url (or _env/_file) here or in alerts.slack")
        webhooks = r.strings(rt, "webhooks", rp, None)
        for j, h in enumerate(webhooks or []):
            if h not in hooks:
                r.bad(f"{rp}.webhooks[{j}]", f"no webhook named {h!r} in alerts.webhooks; known: {', '.join(sorted(hooks)) or 'none'}")
        if any(x.name == name for x in cfg.routes) or name == "default":
            r.bad(f"{rp}.name", f"{name!r} is used twice (or is the reserved name 'default'); give each route its own name")
        cfg.routes.append(RouteConfig(
            name=name, matchers=matchers, slack=slack, webhooks=webhooks,
            group_by=r.strings(rt, "group_by", rp, None),
            group_wait=r.duration(rt, "group_wait", rp, None, minimum=0.0),
            group_interval=r.duration(rt, "group_interval", rp, None, minimum=0.0),
            repeat_interval=r.duration(rt, "repeat_interval", rp, None),
            continue_matching=r.boolean(rt, "continue", rp, False),
        ))


def load_run_config(path: str | os.PathLike) -> Config:
    """`load_config` plus what `specwatch run` needs beyond a valid file (at least one log), so
    start-up and a reload (SIGHUP) accept exactly the same files. Raises ConfigError."""
    cfg = load_config(path)
    if not cfg.logs:
        raise ConfigError(["logs: no log file configured; add `logs: [{path: /var/log/sglang/server.log}]`"])
    return cfg
