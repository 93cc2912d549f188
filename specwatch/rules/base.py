"""The rule interface: events in, alert transitions out; the registry; what rules share.

A rule is one file in this package: its config section (a `Section` decorated with
`@rule_section`, read from `rules.<key>` and found as `config.<key>`), its class, decorated with
`@register`, and its logic. The pipeline builds every registered rule (`build`) and calls only
the hooks a rule overrides, on its thread, under its lock:

- `on_lines(server, ranks, emit)`: the batch lines of `server` since the last evaluation, summarised
  per rank once by the pipeline (`rules/summary.py`: counters, the window classification of
  `rules/windows.py`, each line's entry), for the rules that read many lines at once;
- `on_event(server, event, now)`: every other event (ServerArgs, process, HTTP API, GPU);
- `on_restart(server, at, why)`: the server restarted (the pipeline decides it once);
- `on_tick(now)`: time passed (every 1-3 s in the daemon, at each timestamped line in replay),
  for rules that fire on silence or duration;
- `forget(server)`: the server is gone for good (a deleted pod): drop its state (by default every
  dict entry of the rule keyed by the server or by (server, ...)).

Each returns only transitions: a newly firing `Alert`, or the same alert with status
`resolved`. The dispatcher does grouping, repeats and delivery; a rule knows nothing of Slack.
State that must survive a restart goes through `to_state` / `load_state` (JSON-able).
A config reload (SIGHUP) hands each rule the new config through `reconfigure`; the rule keeps
its state and applies the new thresholds from the next event on.
"""

from __future__ import annotations

import threading

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from specwatch.alerts.model import FIRING, Alert
from specwatch.core.events import ServerArgs, ServerRestarted, ServerStarted

if TYPE_CHECKING:  # annotations only: rule files never import config.py
    from specwatch.config import Config


@dataclass
class RuleContext:
    """What a rule may need besides the config: log_paths (server → followed files), the
    collapse diagnoser (None when diagnosis is off) and last_lines (server → {line kind: clock of
    its last line}, kinds "decode", "prefill", "other", "malformed", "error"; read under the
    pipeline's lock, do not keep or change it)."""

    log_paths: dict[str, list[str]]
    diagnoser: object | None = None
    last_lines: Callable[[str], dict[str, float]] | None = None


class Rule:
    """name: the rule's key (registry, saved state). order: rules run in ascending order, so
    the transitions one event causes reach the dispatcher in a fixed order. alert_names: the
    `alertname` of every alert it raises."""

    name: str = ""
    order: int = 100
    # Every `alertname` the rule can raise (its module's constants): `specwatch_alerts_firing`
    # reads 0 for each of them while none fires, instead of being absent.
    alert_names: tuple[str, ...] = ()

    @classmethod
    def build(cls, config: Config, ctx: RuleContext) -> "Rule":
        """The rule for this config (override when the constructor needs more than its section)."""
        make: Callable[..., Rule] = cls  # a rule without its own build takes its section
        return make(getattr(config, cls.name))

    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        """Any other event: ServerArgs, ProcessSample, ServerRestarted, ApiSample, GpuSample, ..."""
        return []

    def on_restart(self, server: str, at: float, why: str) -> list[Alert]:
        """The server restarted at `at` (decided once by the pipeline; called just before
        `on_event` gets the event that showed it): for rules whose state a restart ends."""
        return []

    def on_tick(self, now: float) -> list[Alert]:
        """Time passed (seconds since the epoch): for rules that fire on silence or duration."""
        return []

    def on_lines(self, server: str, ranks: list, emit: Callable[[list[Alert], tuple], None]) -> list[Alert]:
        """The batch lines summarised since the last evaluation (`rules/summary.py`): `ranks`,
        the `RankSummary` of each rank of `server` with pending lines (`pending` decode entries,
        `pending_prefills`), in the order they first had one. A rule reads them here, in
        aggregate where the order of lines does not matter, instead of one line at a time.

        `emit(alerts, entry)`: transitions at the line of pending `entry` (a decode entry or a
        pending prefill); the pipeline hands them over in file order, those of one line together,
        at that line's clock (as if each line had been read alone), and an alert that fires and
        resolves within one evaluation is both. What is returned is handed over after them."""
        return []

    def forget_rank(self, server: str, rank: str, at: float, why: str) -> list[Alert]:
        """A rank of `server` is gone (`Pipeline._expire_ranks`; its firing alerts in `active`
        were resolved just before): drop its state. By default the entries of the rule's dicts
        keyed (server, rank, ...) or `alert_key(server, rank, ...)`, and `rank` in dicts of
        server → rank → state. Returns transitions it makes (rarely)."""
        forget_rank_keys(vars(self).values(), server, rank)
        return []

    def metric_families(self) -> list:
        """The Prometheus families this rule exports about its own state (`prometheus_client`
        metric families; read under the pipeline's lock at each scrape, specwatch/core/metrics.py)."""
        return []

    def to_state(self) -> dict:
        return {}

    def load_state(self, state: dict) -> None:
        pass

    def reconfigure(self, config: Config) -> None:
        """The config was reloaded (under the pipeline's lock): take the new thresholds."""

    def forget(self, server: str) -> None:
        """Drop every piece of state this rule keeps for `server` (a server nothing reports on
        any more: `Pipeline.forget_server`). Rules key their state by server or by
        (server, rank, ...), in dicts that are attributes of the rule: those entries go."""
        forget_keys(vars(self).values(), server)

    def firing_alerts(self) -> list[Alert]:
        """The live alert objects this rule keeps firing (it updates their evidence): by default
        those of its `active` ActiveAlerts, if it has one."""
        active = getattr(self, "active", None)
        return [] if active is None else [a for k in active.keys() if (a := active.get(k)) is not None]


REGISTRY: dict[str, type[Rule]] = {}


def register(cls: type[Rule]) -> type[Rule]:
    """Class decorator: make a rule known to the pipeline under `cls.name`."""
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise ValueError(f"two rules named {cls.name!r}")
    REGISTRY[cls.name] = cls
    return cls


def overrides(rule: Rule, hook: str) -> bool:
    """The rule's class has its own `hook` (the pipeline calls only those)."""
    return getattr(type(rule), hook) is not getattr(Rule, hook)


def all_rules() -> list[type[Rule]]:
    """Every rule of this package, imported once, in `order`."""
    import importlib
    import pkgutil

    import specwatch.rules as pkg

    for m in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"{pkg.__name__}.{m.name}")
    return sorted(REGISTRY.values(), key=lambda c: (c.order, c.name))


def alert_names_of(rules: list[Rule]) -> list[str]:
    """Every alert name the given rules can raise, sorted."""
    return sorted({n for r in rules for n in r.alert_names})


def log_paths_of(config: Config) -> dict[str, list[str]]:
    """server → the log files followed for it (for rules that name them in alerts)."""
    paths: dict[str, list[str]] = {}
    for src in config.logs:
        paths.setdefault(src.server, []).append(src.path)
    return paths


def fmt(v: float | None, spec: str = ".2f") -> str:
    return "n/a" if v is None else format(v, spec)


def new_alert(name: str, severity: str, server: str, rank: str, *, summary: str, description: str,
              starts_at: float, evidence: list[tuple[str, str]], fixes: list[str]) -> Alert:
    """A firing alert with the labels every specwatch rule uses."""
    return Alert(labels={"alertname": name, "severity": severity, "server": server, "rank": rank},
                 annotations={"summary": summary, "description": description}, starts_at=starts_at,
                 evidence=evidence, fixes=fixes, status=FIRING)


def alert_key(*parts: str) -> str:
    """Key of a firing alert in a rule's `ActiveAlerts` (strings: the state is JSON)."""
    return "|".join(parts)


SPEC_ARG_KEYS = ("speculative_algorithm", "speculative_draft_model_path", "model_path",
                 "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")


def args_evidence(args: dict[str, object] | None) -> list[tuple[str, str]]:
    """The speculative settings of a server as evidence pairs (those that are set)."""
    args = args or {}
    return [(k, str(args[k])) for k in SPEC_ARG_KEYS if args.get(k) is not None]


def speculation_configured(args: dict[str, object] | None) -> bool | None:
    """True/False from a server's args; None when no args were seen."""
    if args is None:
        return None
    algo = args.get("speculative_algorithm")
    return algo is not None and str(algo).strip().upper() not in ("", "NONE")


class ServerArgsMemory:
    """The latest settings (`ServerArgs.args`, merged by the pipeline) of each server."""

    def __init__(self) -> None:
        self.args: dict[str, dict[str, object]] = {}

    def observe(self, server: str, event: ServerArgs) -> None:
        self.args[server] = dict(event.args)

    def get(self, server: str) -> dict[str, object] | None:
        return self.args.get(server)

    def to_state(self) -> dict:
        return {"args": self.args}

    def load_state(self, state: dict) -> None:
        self.args.update(state.get("args", {}))


def is_restart_event(event: object) -> bool:
    """A process-source event saying the server restarted (or came back after being down)."""
    return isinstance(event, ServerRestarted) or (isinstance(event, ServerStarted) and not event.first_seen)


def forget_keys(containers, server: str, depth: int = 2) -> None:
    """From each dict in `containers`, remove the keys that are `server` or a tuple starting with
    it (the way per-server and per-rank state is keyed); objects among them (a rule's helper such
    as `ServerArgsMemory`) are searched the same way, `depth` levels down."""
    for d in containers:
        if isinstance(d, dict):
            for key in [k for k in d if k == server or (isinstance(k, tuple) and k and k[0] == server)]:
                del d[key]
            if depth:
                forget_keys(d.values(), server, depth - 1)
        elif depth and hasattr(d, "__dict__") and not isinstance(d, type) and not _shared(d):
            forget_keys(vars(d).values(), server, depth - 1)


def forget_rank_keys(containers, server: str, rank: str, depth: int = 2) -> None:
    """From each dict in `containers`, remove the keys of one rank: (server, rank, ...) tuples,
    `alert_key(server, rank)`, and `rank` in a dict that is the value of key `server`; objects
    among them are searched the same way, `depth` levels down (as `forget_keys`)."""
    akey = alert_key(server, rank)
    for d in containers:
        if isinstance(d, dict):
            for key in [k for k in d if k == akey or isinstance(k, str) and k.startswith(akey + "|")
                        or isinstance(k, tuple) and k[:2] == (server, rank)]:
                del d[key]
            inner = d.get(server)
            if isinstance(inner, dict):
                inner.pop(rank, None)
            if depth:
                forget_rank_keys(d.values(), server, rank, depth - 1)
        elif depth and hasattr(d, "__dict__") and not isinstance(d, type) and not _shared(d):
            forget_rank_keys(vars(d).values(), server, rank, depth - 1)


def _shared(obj) -> bool:
    """An object with a lock of its own (the diagnoser) is another thread's: left alone."""
    return any(isinstance(v, _LOCK) for v in vars(obj).values())


_LOCK = type(threading.Lock())
