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

# Port 9849: a free slot near the GPU exporters (dcgm 9400, nvidia_gpu_exporter 9835) on the
# Prometheus "Default port allocations" list (monitoring.md §5); see README, "Port".
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
class SlackConfig:
    webhook_url: str | None = None  # resolved secret (from the value, the env var or the file)
    channel: str | None = None
    timeout: float = 10.0
    backoff_initial: float = 1.0
    backoff_max: float = 300.0

    def __repr__(self) -> str:  # the webhook URL is a secret
        return f"SlackConfig(webhook_url={'<redacted>' if self.webhook_url else None}, channel={self.channel!r})"


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
    repeat_interval: float = 4 * 3600.0
    slack: SlackConfig = field(default_factory=SlackConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    process: ProcessConfig = field(default_factory=ProcessConfig)
    server_apis: list[ServerApiConfig] = field(default_factory=list)
    server_rule: ServerRuleConfig = field(default_factory=ServerRuleConfig)
    log_silent: LogSilentConfig = field(default_factory=LogSilentConfig)
    gpu_errors: GpuErrorsConfig = field(default_factory=GpuErrorsConfig)
    gpu_throttle: GpuThrottleConfig = field(default_factory=GpuThrottleConfig)
    diagnosis: DiagnosisConfig = field(default_factory=DiagnosisConfig)
    source_path: str | None = None


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

    def duration(self, data: dict, key: str, path: str, default: float, minimum: float = 0.001) -> float:
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

    rules = r.section(data, "rules", "", {"collapse", "server", "log_silent", "gpu_errors", "gpu_throttle"})
    _source_rule_sections(r, rules, cfg)
    c = r.section(rules, "collapse", "rules", {"max_accept_length", "min_batches", "recover_accept_length"})
    cfg.collapse = CollapseConfig(
        max_accept_length=r.number(c, "max_accept_length", "rules.collapse", 1.10, lo=1.0),
        min_batches=r.number(c, "min_batches", "rules.collapse", 3, kind=int, lo=1),
        recover_accept_length=r.number(c, "recover_accept_length", "rules.collapse", 1.5, lo=1.0),
    )
    if cfg.collapse.recover_accept_length <= cfg.collapse.max_accept_length:
        r.bad("rules.collapse.recover_accept_length",
              f"must be above max_accept_length ({cfg.collapse.max_accept_length}) or the alert would flap; e.g. 1.5")

    a = r.section(data, "alerts", "", {"repeat_interval", "slack"})
    cfg.repeat_interval = r.duration(a, "repeat_interval", "alerts", 4 * 3600.0)
    s = r.section(a, "slack", "alerts", {
        "webhook_url", "webhook_url_env", "webhook_url_file", "channel", "timeout", "backoff_initial", "backoff_max",
    })
    url = _resolve_secret(r, s, "alerts.slack", "webhook_url")
    if url is not None and not _valid_url(url):
        r.bad("alerts.slack.webhook_url", "must be an http(s) URL such as https://hooks.slack.com/services/T000/B000/XXXX (value not shown: it is a secret)")
        url = None
    cfg.slack = SlackConfig(
        webhook_url=url,
        channel=r.string(s, "channel", "alerts.slack", None),
        timeout=r.duration(s, "timeout", "alerts.slack", 10.0),
        backoff_initial=r.duration(s, "backoff_initial", "alerts.slack", 1.0),
        backoff_max=r.duration(s, "backoff_max", "alerts.slack", 300.0),
    )
    if cfg.slack.backoff_initial > cfg.slack.backoff_max:
        r.bad("alerts.slack.backoff_initial", f"({cfg.slack.backoff_initial:g}s) must not exceed backoff_max "
              f"({cfg.slack.backoff_max:g}s)")
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


def load_run_config(path: str | os.PathLike) -> Config:
    """`load_config` plus what `specwatch run` needs beyond a valid file (at least one log), so
    start-up and a reload (SIGHUP) accept exactly the same files. Raises ConfigError."""
    cfg = load_config(path)
    if not cfg.logs:
        raise ConfigError(["logs: no log file configured; add `logs: [{path: /var/log/sglang/server.log}]`"])
    return cfg
