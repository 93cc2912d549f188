"""Spec metrics missing: the server serves requests, but no decode line says how the draft does.

Prefill lines show requests arriving, yet for a whole `window` no `Decode batch` line came: the
acceptance metrics specwatch (and the user) rely on are missing (BR-15 in docs/bugreports.md).
Distinct from "speculation inactive" (decode lines without accept fields) and from a collapse. Per
server: a streak starts at the first prefill line after a decode line (or after `window` without any
line); the rule fires once the streak is `window` old and at least `min_prefill_batches` prefill
lines arrived in the last `window`; it resolves at the next decode line. Servers whose settings say
they never decode (a PD prefill node, an embedding server) or do not speculate are left alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bisect import bisect_right
from collections import deque
from itertools import chain

from specwatch.alerts.model import Alert
from specwatch.core.sections import Count, Seconds, Section, rule_section
from specwatch.core.events import ServerArgs
from specwatch.rules.active import ActiveAlerts
from specwatch.rules.base import Rule, ServerArgsMemory, args_evidence, new_alert, register, speculation_configured
from specwatch.rules.fileorder import first_and_last
from specwatch.rules.summary import CLOCK, SEQ

if TYPE_CHECKING:  # annotations only: rule files never import config.py
    from specwatch.config import Config


@rule_section("spec_metrics_missing")
class SpecMetricsMissingConfig(Section):
    enabled: bool = True
    window: Seconds = 600.0
    min_prefill_batches: Count = 10


ALERT_NAME = "SpecMetricsMissing"


def _seq(prefill: tuple) -> int:
    return prefill[2]


def never_decodes(args: dict | None) -> bool:
    args = args or {}
    return str(args.get("disaggregation_mode") or "").lower() == "prefill" or args.get("is_embedding") is True


@register
class SpecMetricsMissingRule(Rule):
    name = "spec_metrics_missing"
    alert_names = (ALERT_NAME,)
    order = 80

    def __init__(self, config: SpecMetricsMissingConfig):
        self.config = config
        self.args = ServerArgsMemory()
        self._prefills: dict[str, deque[float]] = {}  # server → times of recent prefill lines
        self._streak: dict[str, float] = {}  # server → first prefill line since the last decode line
        self.active = ActiveAlerts()  # by server

    def reconfigure(self, config: Config) -> None:
        self.config = config.spec_metrics_missing

    def on_lines(self, server: str, ranks: list, emit) -> list[Alert]:
        """The server's batch lines since the last evaluation. A decode line ends the streak of
        prefill lines (and resolves the alert: the first decode line in file order, at its
        clock), so only the prefill lines after the server's last decode line (by `seq`, file
        order across ranks) count, in file order: what line-by-line reading leaves."""
        if not self.config.enabled:
            return []
        out = []
        lines = first_and_last(ranks)
        after = 0  # prefill lines count from the one after this `seq`
        if lines is not None:
            self._prefills.pop(server, None)
            self._streak.pop(server, None)
            after = lines[3][SEQ]
            if server in self.active:
                out = self.active.resolve(server, lines[1][CLOCK], ("decode line", lines[0].rank or "(single rank)"))
        tails = []
        for rs in ranks:
            pre = rs.pending_prefills
            if pre and pre[-1][2] > after:
                tails.append(pre if pre[0][2] > after else pre[bisect_right(pre, after, key=_seq):])
        if tails:
            merged = tails[0] if len(tails) == 1 else sorted(chain.from_iterable(tails), key=_seq)
            self._prefill(server, [p[1] for p in merged])
        return out

    def _prefill(self, server: str, clocks: list[float]) -> None:
        """Prefill lines at `clocks` (file order) into the server's recent ones: a line more than
        `window` after the one before it (or the first) starts a new streak."""
        times = self._prefills.get(server)
        if times is None:
            times = self._prefills[server] = deque()
        window = self.config.window
        prev = times[-1] if times else None
        start = -1  # the last line that starts a streak
        for i, t in enumerate(clocks):
            if prev is None or t - prev > window:  # first, or after an idle spell
                start = i
            prev = t
        if start >= 0:
            times.clear()
            self._streak[server] = clocks[start]
            clocks = clocks[start:]
        times.extend(clocks)

    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        if self.config.enabled and isinstance(event, ServerArgs):
            self.args.observe(server, event)
        return []

    def on_tick(self, now: float) -> list[Alert]:
        if not self.config.enabled:
            return []
        out = []
        for server, times in self._prefills.items():
            while len(times) > 1 and times[0] < now - self.config.window:
                times.popleft()  # the newest stays: it tells when the server was last busy
            if not times or server in self.active:
                continue
            args = self.args.get(server)
            if speculation_configured(args) is False or never_decodes(args):
                continue
            first = self._streak.get(server, now)
            if now - first < self.config.window:
                continue
            n = sum(1 for t in times if t >= now - self.config.window)
            if n >= self.config.min_prefill_batches:
                out += self.active.fire(server, self._alert(server, args, first, n, now))
        return out

    def _alert(self, server: str, args: dict | None, first: float, n: int, now: float) -> Alert:
        interval = (args or {}).get("decode_log_interval")
        return new_alert(
            ALERT_NAME, "warning", server, "",
            summary=f"No decode lines from {server} for {now - first:.0f}s while it serves requests: acceptance unknown",
            description=(
                f"{n} prefill batch lines in the last {self.config.window:g}s show the server taking requests, "
                "but no `Decode batch` line arrived, so there is no accept len, accept rate or generation "
                "throughput to watch. Speculative decoding may be fine or broken: nothing says which."
            ),
            starts_at=first,
            evidence=[("prefill lines in window", str(n)), ("decode lines since", f"{now - first:.0f}s ago or never"),
                      ("decode_log_interval", "n/a" if interval is None else str(interval))] + args_evidence(args),
            fixes=[
                "Decode log interval: SGLang prints a decode line every --decode-log-interval decode rounds "
                "(default 40); a large value makes them rare. Check `grep -o 'decode_log_interval=[0-9]*' "
                "<log>` and restart with `--decode-log-interval 40`.",
                "Short outputs: requests with max_new_tokens of 1 (scoring, classification) never reach a "
                "decode round; this is expected for such traffic — silence the alert "
                "(`specwatch silence add --match alertname=SpecMetricsMissing --for 24h --comment ...`).",
                "Log routing: decode lines come from the scheduler processes; with several nodes "
                "(`--nnodes`) or a collector that filters lines, they can land elsewhere. Check "
                "`grep -c 'Decode batch' <log>` on each node and the collector's filters.",
                "Scheduler stuck: prefill without decode can mean requests never finish; check "
                "`curl -s localhost:30000/health_generate` and the log for tracebacks.",
            ],
        )

    def to_state(self) -> dict:
        return {"active": self.active.to_state(), "args": self.args.to_state(),
                "prefills": {s: list(t) for s, t in self._prefills.items()}, "streak": self._streak}

    def load_state(self, state: dict) -> None:
        self.active.load_state(state.get("active", {}))
        self.args.load_state(state.get("args", {}))
        self._prefills.update({s: deque(t) for s, t in state.get("prefills", {}).items()})
        self._streak.update(state.get("streak", {}))
