"""The server itself (SGLang or vLLM): down, restarted, or up but not answering its health check.

* `ServerDown` (critical): no server process for `down_for` seconds (the process source);
  for a server watched only through the HTTP API, no HTTP answer for that long. Resolves when it
  is back. Only configured servers are expected (`config.ProcessTies`: declared in
  `process.servers`, or writing to a followed log, or polled by `server_api`); another SGLang
  process found on the box is never alerted on and is forgotten when it exits.
* An alert no running source can resolve any more (its source disabled, its server no longer
  configured; e.g. restored from the state file after `process.enabled: false`) resolves at the
  next tick, with the reason in its evidence.
* `ServerRestarted` (warning): the launcher's pid or start time changed (or, API only,
  `/server_info` `startup_time` changed; or the pid differs from the one recorded before
  specwatch itself restarted). Evidence shows the speculative flags before and after when they
  changed. Stays firing `restart_window` seconds; more restarts in that window update its
  evidence (a crash loop is one alert, with its count).
* `ServerUnhealthy` (critical): the process runs but `/health` fails, or `/server_info`
  times out or answers 5xx, for `unhealthy_for` seconds, after it had answered fine since this
  process started (so a model still loading never counts).

The names say what happened, for any engine (they were `SGLangServerDown` ... before:
`alerts/renamed.py`); the pipeline adds the server's `engine` label, and their summary,
description and fixes name the engine the process or API is (`ServerProcess.engine`, the API's
`engine` setting; SGLang until one was seen).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import shlex
from dataclasses import dataclass

from specwatch.alerts.model import Alert, code, iso8601
from specwatch.core.sections import ProcessTies, Seconds, Section, rule_section
from specwatch.core.events import (
    ApiSample,
    ProcessSample,
    ServerDown,
    ServerProcess,
    ServerRestarted,
    ServerStarted,
)
from specwatch.rules.active import ActiveAlertsRule
from specwatch.rules.base import RuleContext, log_paths_of, register

if TYPE_CHECKING:  # annotations only: rule files never import config.py
    from specwatch.config import Config


@rule_section("server", attr="server_rule")
class ServerRuleConfig(Section):
    down_for: Seconds = 30.0  # no process (or no HTTP answer) this long: ServerDown
    restart_window: Seconds = 600.0  # ServerRestarted stays firing this long
    unhealthy_for: Seconds = 120.0  # /health failing this long after it was fine: ServerUnhealthy


DOWN = "ServerDown"
RESTARTED = "ServerRestarted"
UNHEALTHY = "ServerUnhealthy"

# settings whose change across a restart changes what accept length to expect
SPEC_KEYS = (
    "model_path",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "tp_size",
    "dp_size",
)


def spec_changes(old: dict, new: dict) -> list[tuple[str, str]]:
    """Evidence pairs `key: old → new` for each speculative setting that differs."""
    out = []
    for k in SPEC_KEYS:
        a, b = old.get(k), new.get(k)
        if a != b:
            out.append((k, f"{_show(a)} → {_show(b)}"))
    return out


def spec_summary(args: dict) -> str:
    parts = [f"{k.replace('speculative_', '')}={args[k]}" for k in SPEC_KEYS[1:] if args.get(k) is not None]
    return ", ".join(parts) or "no speculative flags"


def _show(v) -> str:
    return "(not set)" if v is None else str(v)


ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM"}


def _cmd(sp: ServerProcess) -> str:
    """The process's command line as a code span, each argument shell-quoted (cut at 600
    characters, with "...")."""
    text = shlex.join(sp.cmdline)
    return code(text if len(text) <= 600 else text[:597] + "...")


@dataclass(frozen=True)
class Watching:
    """The servers the running sources report on. process: the process source's configured
    servers (None: process watching is off); api: the servers `server_api` polls."""

    process: frozenset[str] | None
    api: frozenset[str]

    @classmethod
    def of(cls, cfg: Config) -> "Watching":
        return cls(ProcessTies.of(cfg).configured if cfg.process.enabled else None,
                   frozenset(a.server or "" for a in cfg.server_apis))

    def why_not(self, server: str, kind: str) -> str | None:
        """None when a running source can resolve the `kind` alert of `server`, else why not."""
        if kind == "unhealthy":
            return None if server in self.api else "server_api does not poll this server any more"
        if server in self.api or (self.process is not None and server in self.process):
            return None
        if self.process is None:
            return "process watching is off (process.enabled: false)"
        return "not a configured server (process.servers, a followed log or a server_api URL)"


@register
class ServerStateRule(ActiveAlertsRule):
    """watching: which servers the sources report on (None: keep every alert until its source
    resolves it)."""

    name = "server_state"
    alert_names = (DOWN, RESTARTED, UNHEALTHY)
    order = 10

    @classmethod
    def build(cls, config: Config, ctx: RuleContext) -> "ServerStateRule":
        return cls(config.server_rule, ctx.log_paths, Watching.of(config))

    def __init__(self, config: ServerRuleConfig, log_paths: dict[str, list[str]] | None = None,
                 watching: Watching | None = None):
        super().__init__()
        self.config = config
        self.log_paths = log_paths or {}
        self.watching = watching
        self._stale: dict[str, str] = {}  # alert key -> why no source can resolve it
        self._watched: set[str] = set()  # servers with process samples (the process source is on)
        self._last: dict[str, ServerProcess] = {}  # last process seen, this run
        self._known: dict[str, dict] = {}  # persisted: {"pid", "start_time", "args"} per server
        self._down_since: dict[str, float] = {}
        self._down_evidence: dict[str, list[tuple[str, str]]] = {}
        self._restart_until: dict[str, float] = {}
        self._api_ok: set[str] = set()  # answered fine since this process started
        self._bad_since: dict[str, float] = {}
        self._bad_what: dict[str, str] = {}
        self._startup: dict[str, tuple[float, dict]] = {}  # API only: startup_time, args
        self._engine: dict[str, str] = {}  # "sglang" or "vllm": what its process or API was, this run

    def reconfigure(self, config: Config) -> None:
        self.config = config.server_rule
        self.log_paths = log_paths_of(config)
        self.watching = Watching.of(config)
        self._find_stale()

    def _find_stale(self) -> None:
        if self.watching is None:
            return
        for key in self.active.keys():
            server, _, kind = key.rpartition("|")
            why = (None if server in self._restart_until else "no restart window recorded") if kind == "restart" \
                else self.watching.why_not(server, kind)
            if why is not None:
                self._stale[key] = why

    def _forget(self, server: str, now: float, why: str, kinds=("down", "restart", "unhealthy")) -> list[Alert]:
        """Drop what is known of `server` (its `kinds` of alerts, resolved with `why`)."""
        out: list[Alert] = []
        for kind in kinds:
            out += self.active.resolve(f"{server}|{kind}", now, ("resolved because", why))
            self._stale.pop(f"{server}|{kind}", None)
        if "down" in kinds:
            for d in (self._down_since, self._down_evidence, self._last, self._known, self._engine):
                d.pop(server, None)
            self._watched.discard(server)
        if "restart" in kinds:
            self._restart_until.pop(server, None)
        if "unhealthy" in kinds:
            self._bad_since.pop(server, None)
        return out

    # --- events ---
    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        if isinstance(event, ProcessSample):
            return self._process(server, event, now)
        if isinstance(event, ServerDown):
            self._down_since.setdefault(server, event.timestamp)
            if event.last is not None:
                self._last[server] = event.last
                self._engine[server] = event.last.engine
            return []
        if isinstance(event, ServerRestarted):
            self._api_ok.discard(server)
            return self._restarted(server, event.old.args, event.new.args, now, [
                ("old pid", str(event.old.pid)), ("new pid", str(event.new.pid)),
                ("old start", iso8601(event.old.start_time) or ""),
                ("new start", iso8601(event.new.start_time) or ""),
            ], command=_cmd(event.new))
        if isinstance(event, ServerStarted):
            if not event.first_seen:
                self._api_ok.discard(server)
            return self._back(server, event.process, now)
        if isinstance(event, ApiSample):
            return self._api(server, event, now)
        return []

    def _process(self, server: str, event: ProcessSample, now: float) -> list[Alert]:
        sp = event.process
        if not event.expected:  # found on the box, not configured: never alerted on
            return self._forget(server, now, "not a configured server; it exited") if sp is None else []
        self._watched.add(server)
        out: list[Alert] = []
        if sp is None:
            self._down_since.setdefault(server, now)
            self._bad_since.pop(server, None)
            return out
        out += self._back(server, sp, now)
        known = self._known.get(server)
        if server not in self._last and known and (known["pid"], known["start_time"]) != sp.identity:
            # restarted while specwatch was not running
            out += self._restarted(server, known.get("args", {}), sp.args, now, [
                ("old pid", str(known["pid"])), ("new pid", str(sp.pid)),
                ("old start", iso8601(known["start_time"]) or ""), ("new start", iso8601(sp.start_time) or ""),
                ("noticed", "after specwatch itself restarted"),
            ], command=_cmd(sp))
        self._last[server] = sp
        self._engine[server] = sp.engine
        self._known[server] = {"pid": sp.pid, "start_time": sp.start_time, "args": dict(sp.args)}
        return out

    def _back(self, server: str, sp: ServerProcess, now: float) -> list[Alert]:
        since = self._down_since.pop(server, None)
        if since is None:
            return []
        return self.active.resolve(f"{server}|down", now, ("back with pid", str(sp.pid)),
                                   ("down for (s)", f"{now - since:.0f}"))

    def _api(self, server: str, s: ApiSample, now: float) -> list[Alert]:
        out: list[Alert] = []
        if s.info is not None and server not in self._watched:
            self._engine[server] = str(s.info.args.get("engine") or "sglang")
        process_watched = server in self._watched
        if not process_watched:
            if not s.reachable:
                self._down_since.setdefault(server, now)
                self._down_evidence[server] = [("API", s.url), ("last API error", s.error or "")]
                return out
            since = self._down_since.pop(server, None)
            if since is not None:
                out += self.active.resolve(f"{server}|down", now, ("API answers again", s.url),
                                           ("down for (s)", f"{now - since:.0f}"))
                self._api_ok.discard(server)
            if s.info is not None and s.info.startup_time is not None:
                prev = self._startup.get(server)
                self._startup[server] = (s.info.startup_time, dict(s.info.args))
                if prev is not None and prev[0] != s.info.startup_time:
                    self._api_ok.discard(server)
                    out += self._restarted(server, prev[1], s.info.args, now, [
                        ("old start", iso8601(prev[0]) or ""), ("new start", iso8601(s.info.startup_time) or ""),
                        ("seen by", f"{s.url}/server_info startup_time"),
                    ])
        elif self._last.get(server) is None or server in self._down_since:
            return out  # no process: the down alert covers it
        bad = None
        if s.healthy is False:
            bad = f"/health answered {s.health_status}" if s.health_status else "/health did not answer"
        elif s.error in ("timeout", "connection_error") or (s.error or "").startswith("http_5"):
            bad = f"/server_info: {s.error}"
        if bad is None and s.info is not None:
            self._api_ok.add(server)
            self._bad_since.pop(server, None)
            out += self.active.resolve(f"{server}|unhealthy", now, ("answers again", s.url))
        elif bad is not None and server in self._api_ok:
            self._bad_since.setdefault(server, now)
            self._bad_what[server] = bad
        return out

    def _restarted(self, server: str, old: dict, new: dict, now: float, evidence: list[tuple[str, str]],
                   command: str | None = None) -> list[Alert]:
        key = f"{server}|restart"
        changes = spec_changes(old, new)
        if changes:
            evidence += [("speculative flags", "changed")] + changes
        else:
            evidence.append(("speculative flags", f"unchanged ({spec_summary(new)})"))
        self._restart_until[server] = now + self.config.restart_window
        firing = self.active.get(key)
        if firing is not None:  # a crash loop: one alert, its evidence tells how many
            n = int(dict(firing.evidence).get("restarts in window", "1")) + 1
            firing.evidence[:] = evidence + [("restarts in window", str(n))]
            return []
        engine = ENGINE_NAMES.get(str(new.get("engine") or self._engine.get(server, "sglang")), "SGLang")
        fixes = [
            "If nobody restarted it on purpose, find why the old process exited: the last lines of "
            f"the {engine} log before the restart (a Traceback, `CUDA out of memory`, `NCCL` timeout, "
            "`Received sigquit`), your process manager's record (`journalctl -u <unit> --since -1h`, "
            "`docker inspect <container> --format '{{.State.ExitCode}} {{.State.OOMKilled}}'`) and "
            "`sudo dmesg -T | grep -iE 'xid|oom-kill'` for a GPU fault or the kernel OOM killer.",
        ]
        if changes:
            fixes.append(
                "The speculative settings changed: the accept length to expect changed with them. "
                "Compare `specwatch_accept_length` before and after the restart, and check the new "
                "draft path and flags are the intended ones.")
        if self.log_paths.get(server):
            fixes.append(f"The log specwatch follows for it: {', '.join(self.log_paths[server])}.")
        alert = Alert(
            labels={"alertname": RESTARTED, "severity": "warning", "server": server, "rank": ""},
            annotations={
                "summary": f"{engine} server {server} restarted",
                "description": (
                    f"The {engine} server process was replaced by a new one. Requests in flight were "
                    "lost, and caches and CUDA graphs are being rebuilt."
                    + (f" New command line: {command}" if command else "")
                ),
            },
            starts_at=now,
            evidence=evidence + [("restarts in window", "1")],
            fixes=fixes,
        )
        return self.active.fire(key, alert)

    # --- time ---
    def on_tick(self, now: float) -> list[Alert]:
        if not (self._down_since or self._restart_until or self._bad_since or self._stale):
            return []  # the common case, every second: nothing down, restarting or unhealthy
        out: list[Alert] = []
        for key, why in list(self._stale.items()):
            server, _, kind = key.rpartition("|")
            out += self._forget(server, now, why, (kind,))
        for server, since in list(self._down_since.items()):
            key = f"{server}|down"
            if now - since >= self.config.down_for and key not in self.active:
                out += self.active.fire(key, self._down_alert(server, since, now))
        for server, until in list(self._restart_until.items()):
            if now >= until:
                del self._restart_until[server]
                out += self.active.resolve(f"{server}|restart", now)
        for server, since in list(self._bad_since.items()):
            key = f"{server}|unhealthy"
            if now - since >= self.config.unhealthy_for and key not in self.active:
                out += self.active.fire(key, self._unhealthy_alert(server, since))
        return out

    def _engine_name(self, server: str) -> str:
        """"SGLang" or "vLLM": what the server's process or API was (SGLang until one was seen)."""
        return ENGINE_NAMES.get(self._engine.get(server, "sglang"), "SGLang")

    def _down_alert(self, server: str, since: float, now: float) -> Alert:
        engine = self._engine_name(server)
        last = self._last.get(server)
        evidence = [("down since", iso8601(since) or ""), ("down for (s)", f"{now - since:.0f}")]
        fixes = []
        if last is not None:
            evidence += [("last pid", str(last.pid)), ("last start", iso8601(last.start_time) or ""),
                         ("last speculative flags", spec_summary(last.args))]
            fixes.append(f"Start it again with the same command: {_cmd(last)}")
        elif server not in self._watched:
            evidence += self._down_evidence.get(server, [])
        else:
            evidence.append(("seen", "never since specwatch started (declared in process.servers)"))
        logs = self.log_paths.get(server)
        fixes.insert(0,
            f"Find why it exited: the end of the {engine} log"
            + (f" ({', '.join(logs)})" if logs else "")
            + " for a Traceback, `CUDA out of memory` or an `NCCL` error; `journalctl -u <unit> -n 200` "
            "or `docker logs --tail 200 <container>`; `sudo dmesg -T | grep -iE 'xid|oom-kill'` for a "
            "GPU fault or the kernel OOM killer.")
        return Alert(
            labels={"alertname": DOWN, "severity": "critical", "server": server, "rank": ""},
            annotations={
                "summary": f"{engine} server {server} is down",
                "description": (f"No {engine} server process for {now - since:.0f} s"
                                if server in self._watched else
                                f"The {engine} HTTP API has not answered for {now - since:.0f} s") + ".",
            },
            starts_at=since,
            evidence=evidence,
            fixes=fixes,
        )

    def _unhealthy_alert(self, server: str, since: float) -> Alert:
        engine = self._engine_name(server)
        last = self._last.get(server)
        evidence = [("failure", self._bad_what.get(server, "")), ("failing since", iso8601(since) or "")]
        if last is not None:
            evidence.append(("pid", str(last.pid)))
        return Alert(
            labels={"alertname": UNHEALTHY, "severity": "critical", "server": server, "rank": ""},
            annotations={
                "summary": f"{engine} server {server} runs but fails its health check",
                "description": ("The process is alive but its HTTP API stopped answering correctly "
                                "after it had been healthy: a wedged scheduler, a hung NCCL collective, "
                                "or a GPU fault."),
            },
            starts_at=since,
            evidence=evidence,
            fixes=[
                f"Look at the last lines of the {engine} log for a Traceback or a watchdog message "
                "(`Scheduler hit an exception`, `watchdog timeout`).",
                f"Dump the stacks: `py-spy dump --pid {last.pid if last else '<pid>'}` (and each "
                f"`{'VLLM::EngineCore' if engine == 'vLLM' else 'sglang::scheduler'}` child), to see where it is stuck.",
                "Check the GPUs: `nvidia-smi` (a GPU at 100% with no progress, or an XID in "
                "`sudo dmesg -T | grep -i xid`). Restart the server if it does not recover.",
            ],
        )

    # --- persistence ---
    def to_state(self) -> dict:
        return {**super().to_state(), "known": self._known, "restart_until": self._restart_until}

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        self._known.update(state.get("known", {}))
        self._restart_until.update(state.get("restart_until", {}))
        for key in self.active.keys():
            server, _, kind = key.rpartition("|")
            if kind == "down":
                self._down_since.setdefault(server, self.active[key].starts_at)  # resolved by the next sample
        self._find_stale()  # e.g. saved while process watching was on, loaded with it off
