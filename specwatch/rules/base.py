"""The rule interface: events in, alert transitions out; and what rules share.

A rule sees every event of every server (`on_event`, on the pipeline's thread, under its lock)
and the passage of time (`on_tick`, about once a second in the daemon, at each timestamped line
in replay). It returns only transitions: a newly firing `Alert`, or the same alert with status
`resolved`. The dispatcher does grouping, repeats and delivery; a rule knows nothing of Slack.
State that must survive a restart goes through `to_state` / `load_state` (JSON-able).
"""

from __future__ import annotations

from specwatch.alerts.model import FIRING, RESOLVED, Alert
from specwatch.events import ServerArgs


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


def fmt(v: float | None, spec: str = ".2f") -> str:
    return "n/a" if v is None else format(v, spec)


def new_alert(name: str, severity: str, server: str, rank: str, *, summary: str, description: str,
              starts_at: float, evidence: list[tuple[str, str]], fixes: list[str]) -> Alert:
    """A firing alert with the labels every specwatch rule uses."""
    return Alert(labels={"alertname": name, "severity": severity, "server": server, "rank": rank},
                 annotations={"summary": summary, "description": description}, starts_at=starts_at,
                 evidence=evidence, fixes=fixes, status=FIRING)


def resolve(alert: Alert, at: float, *evidence: tuple[str, str]) -> Alert:
    """Mark `alert` resolved at `at` (seconds), appending evidence of why; returns it."""
    alert.status = RESOLVED
    alert.ends_at = max(at, alert.starts_at)
    alert.evidence.extend(evidence)
    return alert


def alerts_to_state(alerts: dict[tuple, Alert]) -> list:
    return [{"key": list(k), "alert": a.to_dict()} for k, a in alerts.items()]


def alerts_from_state(state: list) -> dict[tuple, Alert]:
    return {tuple(d["key"]): Alert.from_dict(d["alert"]) for d in state}


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
    """The latest `ServerArgs` of each server, and whether a new one means a (re)start.

    Log lines carry the start time as their timestamp; another source (the HTTP API) may send
    the same settings again and again. A ServerArgs event counts as a restart when its timestamp
    differs from the previous one's, or, without a timestamp, when the settings changed.
    """

    def __init__(self) -> None:
        self.args: dict[str, dict[str, object]] = {}
        self._stamp: dict[str, float | None] = {}

    def observe(self, server: str, event: ServerArgs) -> bool:
        """Remember `event`; True when it marks a start or restart after an earlier one."""
        seen = server in self.args
        old_args, old_ts = self.args.get(server), self._stamp.get(server)
        self.args[server] = dict(event.args)
        if event.timestamp is not None:
            self._stamp[server] = event.timestamp
            return seen and event.timestamp != old_ts
        return seen and event.args != old_args

    def get(self, server: str) -> dict[str, object] | None:
        return self.args.get(server)

    def to_state(self) -> dict:
        return {"args": self.args, "stamp": self._stamp}

    def load_state(self, state: dict) -> None:
        self.args.update(state.get("args", {}))
        self._stamp.update(state.get("stamp", {}))
