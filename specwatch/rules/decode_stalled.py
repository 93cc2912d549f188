"""Decode stalled: requests were running, no decode line since, and the server says it is stuck.

A wedged scheduler (a hung kernel or collective, a deadlock) prints nothing more, while the HTTP
server around it stays up: access lines keep arriving, the process runs, and `/health`, which
sends a one-token generation through the scheduler, times out (`health_generate`,
sglang/srt/entrypoints/http_server.py 0.5.11-0.5.23: 503 and the ERROR line `Health check failed.
Server couldn't get a response from detokenizer …`). `DecodeStalled` (critical) fires when a rank's
last decode line showed running requests, no decode line came for `for`, and since that line the
health check failed: `/health` not 200 (the HTTP API source) or that ERROR line in the log (any
client's health probe writes it). It resolves at the next decode line, or when the server stops or
restarts (the down and restart alerts take over).

Silence alone is not enough: SGLang prints a decode line every `--decode-log-interval` rounds, not
when the batch drains, so the last line before traffic stops nearly always shows running requests;
an idle server with a load balancer polling `/health` looks alive and silent too. `SGLangLogSilent`
is the opposite case (the scheduler decodes, its lines do not reach specwatch); the scheduler's own
`--watchdog-timeout` (300 s) kills a forward pass stuck that long, so this alert often precedes a
crash and restart.
"""

from __future__ import annotations

from collections import defaultdict

import msgspec

from specwatch.alerts.model import Alert, iso8601
from specwatch.config import Config, Seconds, Section, rule_section
from specwatch.events import ApiSample, LogError, ProcessSample, ServerArgs, ServerProcess
from specwatch.rules.active import ActiveAlertsRule
from specwatch.rules.base import RuleContext, args_evidence, new_alert, register
from specwatch.rules.windows import Window


@rule_section("decode_stalled")
class DecodeStalledConfig(Section):
    enabled: bool = True
    hold: Seconds = msgspec.field(default=120.0, name="for")  # no decode line this long


ALERT_NAME = "DecodeStalled"


class _State:
    __slots__ = ("last_decode", "running", "queued", "unhealthy", "process", "watched", "api_reachable", "args")

    def __init__(self) -> None:
        self.last_decode: float | None = None  # clock of the last decode line of any rank
        self.running: dict[str, tuple[int, int]] = {}  # rank → (running, queued) of its last decode line
        self.unhealthy: tuple[float, str] | None = None  # last failed health check: (clock, what)
        self.process: ServerProcess | None = None
        self.watched = False
        self.api_reachable: float | None = None  # clock of the last HTTP answer
        self.args: dict = {}


@register
class DecodeStalledRule(ActiveAlertsRule):
    name = "decode_stalled"
    alert_names = (ALERT_NAME,)
    order = 35

    @classmethod
    def build(cls, config: Config, ctx: RuleContext) -> "DecodeStalledRule":
        return cls(config.decode_stalled, ctx.last_lines)

    def __init__(self, config: DecodeStalledConfig, last_lines=None):
        super().__init__()
        self.config = config
        self.last_lines = last_lines  # server → {line kind: clock of its last line} (the pipeline's)
        self._s: defaultdict[str, _State] = defaultdict(_State)  # server → state, made on first use

    def reconfigure(self, config: Config) -> None:
        self.config = config.decode_stalled

    def on_decode(self, server: str, window: Window, now: float) -> list[Alert]:
        st = self._s[server]
        b = window.batch
        st.last_decode = now
        st.running[b.rank] = (b.running_requests, b.queued_requests)
        if server not in self.active:
            return []  # the common case
        return self.active.resolve(server, now, ("decode lines", f"arriving again ({b.rank or 'single rank'})"))

    def advance(self, server: str, rows, a: int, b: int) -> tuple[int, list[Alert]]:
        da, db = rows.decodes(a, b)
        if da == db:
            return b, []
        if server in self.active:
            return a, []
        st = self._s[server]
        from specwatch import columns

        st.last_decode = rows.clock[rows.dpos[db - 1]]
        names, running, queued = columns.rank_names(rows), rows.array("d_running"), rows.array("d_queued")
        for code, j in columns.last_by_rank(rows, da, db):  # as a line at a time: each rank's last line
            st.running[names[code]] = (int(running[j]), int(queued[j]))
        return b, []

    def on_restart(self, server: str, at: float, why: str) -> list[Alert]:
        st = self._s.pop(server, None)
        return [] if st is None else self.active.resolve(server, at, ("server", why))

    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        if type(event) is LogError:
            if event.kind == "health_check":
                self._s[server].unhealthy = (now, "log: " + event.lines[0][:200])
        elif isinstance(event, ApiSample):
            st = self._s[server]
            if event.reachable:
                st.api_reachable = now
            if event.healthy is False:
                st.unhealthy = (now, f"/health answered {event.health_status}" if event.health_status
                                else "/health did not answer")
            elif event.healthy and st.unhealthy is not None and st.unhealthy[0] < now:
                st.unhealthy = None  # it answers: whatever was stuck moves again
        elif isinstance(event, ProcessSample):
            st = self._s[server]
            st.watched, st.process = True, event.process
            if event.process is None:
                st.running.clear()
                return self.active.resolve(server, now, ("server", "stopped"))
        elif isinstance(event, ServerArgs):
            self._s[server].args = dict(event.args)
        return []

    def quiet_until(self, server: str, rows, a: int) -> int:
        """No server that is not firing had a failed health check (events set it, never log
        lines): on_tick does nothing, whatever decode lines come."""
        if not self.config.enabled or all(st.unhealthy is None or s in self.active for s, st in self._s.items()):
            return len(rows.dec)
        return a

    def on_tick(self, now: float) -> list[Alert]:
        if not self.config.enabled:
            return []
        out = []
        for server, st in self._s.items():
            if server in self.active or st.last_decode is None or st.unhealthy is None:
                continue
            if now - st.last_decode < self.config.hold or st.unhealthy[0] < st.last_decode:
                continue
            if not any(r for r, _ in st.running.values()) or (st.watched and st.process is None):
                continue
            out += self.active.fire(server, self._alert(server, st, now))
        return out

    def _alert(self, server: str, st: _State, now: float) -> Alert:
        running = sum(r for r, _ in st.running.values())
        queued = sum(q for _, q in st.running.values())
        last = (self.last_lines(server) if self.last_lines else {}) or {}
        alive = []
        if st.process is not None:
            alive.append(f"process {st.process.pid} runs")
        if st.api_reachable is not None and st.api_reachable > st.last_decode:
            alive.append("the HTTP API answers")
        other = last.get("other")
        if other is not None and other > st.last_decode:
            alive.append(f"other log lines until {iso8601(other)}")
        evidence = [
            ("running requests at the last decode line", str(running)),
            ("queued requests at the last decode line", str(queued)),
            ("last decode line", iso8601(st.last_decode) or "n/a"),
            ("no decode line for", f"{now - st.last_decode:.0f}s"),
            ("health check", f"{st.unhealthy[1]} at {iso8601(st.unhealthy[0])}"),
            ("server alive", "; ".join(alive) or "unknown"),
        ]
        if len(st.running) > 1:
            evidence.append(("ranks", ", ".join(f"{r or '-'}: {n} running" for r, (n, _) in sorted(st.running.items()))))
        evidence += args_evidence(st.args)
        pid = st.process.pid if st.process is not None else "PID"
        watchdog = st.args.get("watchdog_timeout")
        return new_alert(
            ALERT_NAME, "critical", server, "",
            summary=f"Decoding stalled on {server}: {running} request(s) running, no decode line for {now - st.last_decode:.0f}s",
            description=(
                f"The last decode line showed {running} running request(s); no decode line since "
                f"{iso8601(st.last_decode)}, and the health check fails, which sends a one-token "
                "generation through the scheduler. The HTTP server is up but the scheduler makes no "
                "progress: every request hangs."
            ),
            starts_at=now,
            evidence=evidence,
            fixes=[
                f"See where the scheduler is stuck before restarting: `py-spy dump --pid {pid}` on the "
                "scheduler processes (`pstree -p` under the launcher), `nvidia-smi` (a GPU at 100 % with "
                "no progress is a hung kernel or collective).",
                "A hung collective shows on the other ranks and nodes: look for an NCCL timeout or a "
                "traceback in their logs, and XIDs in `journalctl -k | grep -i xid`.",
                "SGLang's `--watchdog-timeout` (now "
                + (f"{watchdog}" if watchdog is not None else "300 by default")
                + " s) crashes a scheduler whose forward pass takes longer; a lower value turns a hang into "
                "a restart. Restart the server to serve again.",
            ],
        )

    def to_state(self) -> dict:
        return {"active": self.active.to_state(),
                "servers": {s: {"last_decode": st.last_decode, "running": {r: list(v) for r, v in st.running.items()}}
                            for s, st in self._s.items() if st.last_decode is not None}}

    def load_state(self, state: dict) -> None:
        self.active.load_state(state.get("active", {}))
        for server, d in (state.get("servers") or {}).items():
            try:
                st = self._s[server]
                st.last_decode = float(d["last_decode"])
                st.running = {str(r): (int(v[0]), int(v[1])) for r, v in d["running"].items()}
            except (KeyError, TypeError, ValueError, IndexError):
                self._s.pop(server, None)
