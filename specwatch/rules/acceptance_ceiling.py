"""Acceptance near its ceiling after a lower steady state: how degenerate output shows from outside.

A model that loops (the same sentence or token over and over) is trivially predictable: the
draft guesses every token and accept len jumps to the most a verify round can accept. From
outside that looks like the draft got better. The ceiling (`accept_length_ceiling`) comes from
the server's settings; SGLang's accept len is accepted tokens (drafts + the bonus token) per
verify round (`spec_num_accept_tokens / spec_num_forward_ct` in `report_decode_stats`,
sglang/srt/managers/scheduler_components/metrics_reporter.py 0.5.23).

Per (server, rank): fires after `min_batches` consecutive valid decode lines at or above
`ratio` × ceiling, when the lines of the `steady_window` before them (at least
`min_steady_batches`) averaged at most `max_steady_ratio` × ceiling — a pair that always runs
near its ceiling (repetitive traffic, NGRAM on code) is its normal. Resolves after `min_batches`
lines below `recover_ratio` × ceiling, or when the server restarts.
"""

from __future__ import annotations


from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from specwatch.alerts.model import Alert
from specwatch.core.sections import Bound, Count, Ratio, Seconds, Section, hysteresis, rule_section
from specwatch.core.events import DecodeBatch, ServerArgs
from specwatch.rules.active import ActiveAlerts
from specwatch.rules.base import (
    Rule, ServerArgsMemory, alert_key, args_evidence, fmt, new_alert, register, speculation_configured,
)
from specwatch.rules.stats import Recent
from specwatch.rules.summary import VALID_ACCEPT

if TYPE_CHECKING:  # annotations only: rule files never import config.py
    from specwatch.config import Config


@rule_section("acceptance_ceiling")
class AcceptanceCeilingConfig(Section):
    """rules.acceptance_ceiling: fire after min_batches lines at or above ratio × the ceiling
    that follow a steady state at or below max_steady_ratio × the ceiling. Written alone, a ratio
    moves the others' defaults where they no longer fit, keeping the defaults' distances:
    recover_ratio becomes ratio - 0.05 and max_steady_ratio ratio - 0.10, or ratio becomes the
    larger of recover_ratio + 0.05 and max_steady_ratio + 0.10 (at most 1.0); written, a
    recover_ratio or max_steady_ratio not below ratio is refused."""

    enabled: bool = True
    ratio: Ratio = 0.95
    recover_ratio: Ratio = 0.90
    max_steady_ratio: Ratio = 0.85
    steady_window: Seconds = 600.0
    min_steady_batches: Count = 10
    min_batches: Count = 3
    default_bounds: ClassVar = (
        *hysteresis("recover_ratio", "ratio", up=lambda x: x + 0.05, down=lambda x: x - 0.05),
        Bound("ratio", "above", ("max_steady_ratio",), lambda c: c.max_steady_ratio,
              lambda c: max(c.max_steady_ratio + 0.10, c.recover_ratio + 0.05)),
        Bound("max_steady_ratio", "below", ("ratio",), lambda c: c.ratio, lambda c: c.ratio - 0.10))

    def problems(self):
        if self.recover_ratio >= self.ratio:
            yield "recover_ratio", (f"must be below ratio ({self.ratio}) or the alert would flap; leave it out "
                                    f"(it then follows ratio) or write e.g. {round(max(self.ratio - 0.05, 0), 2)}")
        if self.max_steady_ratio >= self.ratio:
            yield "max_steady_ratio", (f"must be below ratio ({self.ratio}): a step up needs a lower level before it; "
                                       "leave it out (it then follows ratio) or write e.g. "
                                       f"{round(max(self.ratio - 0.10, 0), 2)}")


ALERT_NAME = "AcceptanceNearCeiling"


def _positive_int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def accept_length_ceiling(args: dict[str, object] | None) -> tuple[int, str] | None:
    """The most tokens one verify round can accept, and where that number comes from; None when
    the settings do not say (or name no speculation).

    From sglang/srt/arg_groups/speculative_hook.py 0.5.23 (the same rules in
    sglang/srt/server_args.py 0.5.11): with `speculative_eagle_topk` 1 (a chain) SGLang sets
    `speculative_num_draft_tokens` to `speculative_num_steps + 1` (`_handle_eagle_family`; MTP the
    same, `_handle_iquest_q1_mtp_draft`), so the ceiling is steps + 1; a tree (topk > 1) verifies
    `speculative_num_draft_tokens` nodes but accepts one path of at most steps + 1; NGRAM
    proposes `speculative_num_draft_tokens` (12 when unset, `_handle_ngram`) and accepts at most
    that many. With only one of the two known, that one decides (`report_decode_stats` counts
    `speculative_num_draft_tokens - 1` drafts per round, else `speculative_num_steps`).
    """
    if args is None or not speculation_configured(args):
        return None
    steps = _positive_int(args.get("speculative_num_steps"))
    topk = _positive_int(args.get("speculative_eagle_topk"))
    n = _positive_int(args.get("speculative_num_draft_tokens"))
    if str(args.get("speculative_algorithm")).strip().upper() == "NGRAM":
        out = (n, f"speculative_num_draft_tokens {n}") if n else (12, "speculative_num_draft_tokens 12 (NGRAM default)")
    elif steps and (topk in (None, 1) or n is None or n >= steps + 1):
        out = (steps + 1, f"speculative_num_steps {steps} + 1")
    elif n:
        out = (n, f"speculative_num_draft_tokens {n}")
    else:
        return None
    return out if out[0] > 1 else None


@dataclass
class _Rank:
    steady: Recent  # accept len of the lines below the near-ceiling level
    high_run: int = 0
    low_run: int = 0
    high_since: float | None = None
    steady_before: tuple[float, int] | None = None  # (mean, lines) when the current high run began


@register
class AcceptanceCeilingRule(Rule):
    name = "acceptance_ceiling"
    alert_names = (ALERT_NAME,)
    order = 55

    def __init__(self, config: AcceptanceCeilingConfig):
        self.config = config
        self.args = ServerArgsMemory()
        self._ceiling: dict[str, tuple[int, str] | None] = {}
        self._ranks: dict[tuple[str, str], _Rank] = {}
        self.active = ActiveAlerts()

    def reconfigure(self, config: Config) -> None:
        self.config = config.acceptance_ceiling
        for st in self._ranks.values():
            st.steady.resize(self.config.steady_window)

    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        if isinstance(event, ServerArgs):
            self.args.observe(server, event)
            self._ceiling[server] = accept_length_ceiling(event.args)
        return []

    def metric_families(self) -> list:
        """`specwatch_accept_length_ceiling` of each server whose settings give one."""
        from prometheus_client.core import GaugeMetricFamily  # scrapes only: replay never loads it

        fam = GaugeMetricFamily(
            "specwatch_accept_length_ceiling",
            "The most tokens one verify round can accept, from the server's speculative settings (rules/acceptance_ceiling.py).",
            labels=("server",))
        for server, top in self._ceiling.items():
            if top is not None:
                fam.add_metric([server], top[0])
        return [fam]

    def on_restart(self, server: str, at: float, why: str) -> list[Alert]:
        """A restarted server (other settings, maybe another ceiling) starts from scratch."""
        for key in [k for k in self._ranks if k[0] == server]:
            del self._ranks[key]
        return [a for key in list(self.active.keys()) if key.startswith(alert_key(server, ""))
                for a in self.active.resolve(key, at, ("resolved because", why))]

    def on_lines(self, server: str, ranks: list, emit) -> list[Alert]:
        """Each rank's valid lines in order through `_step` (runs of lines near the ceiling, and
        the steady mean before one); nothing to do while the server's ceiling is unknown."""
        ceiling = self._ceiling.get(server)
        if not self.config.enabled or ceiling is None:
            return []
        for rs in ranks:
            st = self._ranks.get(rs.key)
            if st is None:
                st = self._ranks[rs.key] = _Rank(Recent(self.config.steady_window))
            akey = alert_key(server, rs.rank)
            for e in rs.pending:
                if e[6] & VALID_ACCEPT:
                    alerts = self._step(server, akey, st, e[0], e[2], rs, e, ceiling)
                    if alerts:
                        emit(alerts, e)
        return []

    def _step(self, server: str, akey: str, st: _Rank, ts: float, accept: float, rs, entry,
              ceiling: tuple[int, str]) -> list[Alert]:
        """One valid decode line (timestamp `ts` s, accept len) of the rank of `rs` (`entry`: its
        pending entry, whose DecodeBatch an alert reads)."""
        cfg, top = self.config, ceiling[0]
        if accept >= cfg.ratio * top:
            st.low_run = 0
            if st.high_run == 0:
                st.high_since = ts
                st.steady.prune(ts)
                mean = st.steady.mean()  # None: no line in the window
                st.steady_before = (mean, len(st.steady)) if mean is not None else None
            st.high_run += 1
            before = st.steady_before
            if (st.high_run >= cfg.min_batches and akey not in self.active and before is not None
                    and before[1] >= cfg.min_steady_batches and before[0] <= cfg.max_steady_ratio * top):
                return self.active.fire(akey, self._alert(server, rs.batch(entry), st, ceiling, before))
            return []
        st.high_run = 0
        st.steady.add(ts, accept)
        if akey not in self.active:
            return []
        if accept < cfg.recover_ratio * top:
            st.low_run += 1
            if st.low_run >= cfg.min_batches:
                st.low_run = 0
                return self.active.resolve(akey, ts, ("back to accept len", fmt(accept)))
        else:
            st.low_run = 0
        return []

    def _alert(self, server: str, b: DecodeBatch, st: _Rank, ceiling: tuple[int, str],
               before: tuple[float, int]) -> Alert:
        top, source = ceiling
        mean, lines = before
        accept = b.accept_length
        assert accept is not None  # a line with a valid accept len fires
        where = f"{server} {b.rank}".strip()
        return new_alert(
            ALERT_NAME, "warning", server, b.rank,
            summary=(f"Accept len jumped to {accept:.2f} on {where}, {accept / top:.0%} of its "
                     f"ceiling {top} (steady {mean:.2f} before): check the output for repetition"),
            description=(
                f"accept len stayed at or above {self.config.ratio:.0%} of the most a verify round can accept "
                f"({top}) for {st.high_run} decode batches, after {lines} batches at {mean:.2f} on average. "
                "A draft rarely gets better by itself: a model that repeats itself (a loop of the same "
                "sentence or token) is perfectly predictable, so nearly every draft token is accepted. "
                "From outside that is how degenerate output looks."
            ),
            starts_at=st.high_since if st.high_since is not None else b.timestamp,
            evidence=[("accept len", fmt(b.accept_length)), ("accept len ceiling", f"{top} ({source})"),
                      ("steady accept len before", f"{mean:.2f} over {lines} decode batches"),
                      ("decode batches near the ceiling", str(st.high_run)),
                      ("running requests", str(b.running_requests)), ("queued requests", str(b.queued_requests)),
                      ("gen throughput (token/s)", fmt(b.gen_throughput))] + args_evidence(self.args.get(server)),
            fixes=[
                "Read what the server generates now: send one of your usual prompts (`curl -s "
                "localhost:30000/generate -H 'Content-Type: application/json' -d '{\"text\": \"...\", \"sampling_params\": {\"max_new_tokens\": 200}}'`, "
                "port: --port) or turn on request logging (`--log-requests`) and look for the same text "
                "repeated. A loop runs until max_new_tokens: long, useless answers.",
                f"Few requests make it likely: with {b.running_requests} running, one looping request can carry "
                "the whole batch. Check the sampling settings of the traffic: greedy (temperature 0) without "
                "a repetition or frequency penalty loops more often; a client that sends the same prompt "
                "over and over (a benchmark, a retry loop) also runs near the ceiling. If that is what "
                "runs, silence this alert for it.",
                "If every answer is degenerate (empty, one token repeated, `!!!!`), the target itself is "
                "broken (weights, quantization, kernels after an upgrade): compare with a server without the "
                "`--speculative-*` flags on the same prompt.",
            ],
        )

    def to_state(self) -> dict:
        return {"active": self.active.to_state(), "args": self.args.to_state(),
                "ranks": [{"server": s, "rank": r, "steady": st.steady.to_state(), "high_run": st.high_run,
                           "low_run": st.low_run, "high_since": st.high_since, "steady_before": st.steady_before}
                          for (s, r), st in self._ranks.items()]}

    def load_state(self, state: dict) -> None:
        self.active.load_state(state.get("active", {}))
        self.args.load_state(state.get("args", {}))
        for server, args in self.args.args.items():
            self._ceiling[server] = accept_length_ceiling(args)
        for d in state.get("ranks", []):
            st = _Rank(Recent(self.config.steady_window), d["high_run"], d["low_run"], d["high_since"],
                       tuple(d["steady_before"]) if d.get("steady_before") else None)
            st.steady.load_state(d["steady"])
            self._ranks[(d["server"], d["rank"])] = st
