"""Rank disagreement: one rank's draft collapsed while the other ranks of the server are healthy.

Every DP rank runs the same draft weights and code, so a collapse on some ranks only points at
something rank-specific (reports in docs/bugreports.md): a rank that built its drafter differently
(BR-05: TP ranks logged opposite weight-sharing verdicts), a faulty GPU, a PD transfer path on some
ranks (BR-10), or a class of traffic routed to one rank. Per server, a rank is collapsed when its
last `min_batches` valid decode lines (`rules/windows.py`) all had accept len <=
`max_accept_length`, healthy when they all had accept len >= `healthy_accept_length`; lines older
than `max_age` (against the newest line of the server) do not count. Fires per collapsed rank while
at least one other rank is healthy; resolves when the rank is no longer collapsed or no healthy rank
is left (then it is a whole-server collapse, which the collapse rule reports).
"""

from __future__ import annotations

import shlex
from collections import deque
from typing import TYPE_CHECKING, ClassVar

from specwatch.alerts.model import Alert
from specwatch.core.sections import AcceptLength, Count, Seconds, Section, hysteresis, rule_section
from specwatch.rules.active import ActiveAlerts
from specwatch.rules.base import Rule, RuleContext, alert_key, fmt, log_paths_of, new_alert, register
from specwatch.rules.summary import VALID_ACCEPT

if TYPE_CHECKING:  # annotations only: rule files never import config.py
    from specwatch.config import Config


@rule_section("rank_disagreement")
class RankDisagreementConfig(Section):
    """rules.rank_disagreement. Written alone, one threshold moves the other's default where it
    no longer fits: healthy_accept_length becomes max_accept_length + 0.4 (the defaults'
    distance), or max_accept_length becomes healthy_accept_length - 0.4 (at least 1.0); both
    written, a healthy_accept_length not above max_accept_length is refused."""

    enabled: bool = True
    max_accept_length: AcceptLength = 1.10
    healthy_accept_length: AcceptLength = 1.5
    min_batches: Count = 3
    max_age: Seconds = 300.0
    default_bounds: ClassVar = hysteresis("max_accept_length", "healthy_accept_length",
                                          up=lambda x: x + 0.4, down=lambda x: x - 0.4)

    def problems(self):
        if self.healthy_accept_length <= self.max_accept_length:
            yield "healthy_accept_length", (f"must be above max_accept_length ({self.max_accept_length}); leave it out "
                                            "(it then follows max_accept_length) or write e.g. "
                                            f"{round(self.max_accept_length + 0.4, 2)}")


ALERT_NAME = "RankDisagreement"


_COLLAPSED, _HEALTHY, _BETWEEN = "collapsed", "healthy", "between"
NAMED_MAX = 3  # other collapsed ranks named in a summary


@register
class RankDisagreementRule(Rule):
    name = "rank_disagreement"
    alert_names = (ALERT_NAME,)
    order = 100

    @classmethod
    def build(cls, config: Config, ctx: RuleContext) -> "RankDisagreementRule":
        return cls(config.rank_disagreement, ctx.log_paths)

    def __init__(self, config: RankDisagreementConfig, log_paths: dict[str, list[str]] | None = None):
        """log_paths: server → followed log files (journal sources aside), named in the fix."""
        self.config = config
        self.log_paths = log_paths or {}
        # server → rank → last min_batches valid lines (timestamp, accept len)
        self._recent: dict[str, dict[str, deque[tuple[float, float]]]] = {}
        # server → rank → what its lines in `_recent` say, ages aside (`_kind`): recomputed only
        # when they change (one rank per line), under `_kinds_for` (the thresholds' config)
        self._kinds: dict[str, dict[str, str]] = {}
        self._kinds_for = config
        self.active = ActiveAlerts()

    def reconfigure(self, config: Config) -> None:
        self.config = config.rank_disagreement
        self.log_paths = log_paths_of(config)
        for ranks in self._recent.values():  # keep the newest min_batches lines of each rank
            for r, lines in ranks.items():
                ranks[r] = deque(lines, maxlen=self.config.min_batches)
        self._rekind()

    def on_restart(self, server: str, at: float, why: str) -> list[Alert]:
        """A restarted server's ranks start again (a DP rank the restart dropped is no longer
        compared): its alerts resolve, its ranks' lines are forgotten."""
        self._recent.pop(server, None)
        self._kinds.pop(server, None)
        return self.active.resolve_server(server, at, ("resolved because", why))

    def _rekind(self) -> None:
        self._kinds_for = self.config
        self._kinds = {s: {r: self._kind(lines) for r, lines in ranks.items()} for s, ranks in self._recent.items()}

    def on_lines(self, server: str, ranks: list, emit) -> list[Alert]:
        """The valid lines of the server's ranks, in file order (`seq`), each decided as it comes:
        a rank's kind changes at a line and the server's ranks are compared then. When no
        decision can fall in this evaluation (nothing fires, no rank is or can become collapsed
        while another is or can become healthy), each rank keeps its newest lines at once."""
        cfg = self.config
        if not cfg.enabled:
            return []
        if cfg is not self._kinds_for:
            self._rekind()
        recent = self._recent.get(server)
        if recent is None:
            recent = self._recent[server] = {}
            self._kinds[server] = {}
        kinds = self._kinds[server]
        valid, low, high = VALID_ACCEPT, cfg.max_accept_length, cfg.healthy_accept_length
        lines = [(rs, [e for e in rs.pending if e[6] & valid]) for rs in ranks]
        if self.active.empty():
            now = set(kinds.values())
            can_collapse = _COLLAPSED in now or any(e[2] <= low for _, es in lines for e in es)
            can_heal = _HEALTHY in now or any(e[2] >= high for _, es in lines for e in es)
            if not (can_collapse and can_heal):
                for rs, es in lines:
                    if es:
                        kept = self._lines(recent, rs.rank)
                        kept.extend((e[0], e[2]) for e in es[-cfg.min_batches:])
                        kinds[rs.rank] = self._kind(kept)
                return []
        merged = sorted((e[8], rs.rank, e) for rs, es in lines for e in es)
        for _, rank, e in merged:
            kept = self._lines(recent, rank)
            kept.append((e[0], e[2]))
            kinds[rank] = self._kind(kept)
            if self.active.empty() and (_COLLAPSED not in kinds.values() or _HEALTHY not in kinds.values()):
                # Firing needs a collapsed rank and a healthy one, resolving a firing alert: the
                # common case (all healthy, or all collapsed) ends here.
                continue
            alerts = self._evaluate(server, e[0])
            if alerts:
                emit(alerts, e)
        return []

    def _lines(self, recent: dict, rank: str) -> deque:
        lines = recent.get(rank)
        if lines is None:
            lines = recent[rank] = deque(maxlen=self.config.min_batches)
        return lines

    def _kind(self, lines: deque) -> str:
        """What a rank's lines say, ages and count aside: collapsed if all are <=
        max_accept_length, else healthy if all are >= healthy_accept_length, else between."""
        low, high = self.config.max_accept_length, self.config.healthy_accept_length
        collapsed = healthy = True
        for _, a in lines:  # one pass instead of two all(): this runs for every decode line
            if not a <= low:
                collapsed = False
            if not a >= high:
                healthy = False
        return _COLLAPSED if collapsed else _HEALTHY if healthy else _BETWEEN

    def _evaluate(self, server: str, newest: float) -> list[Alert]:
        cfg = self.config
        ranks = self._recent[server]
        kinds = self._kinds[server]
        # a rank's state: its kind, unless it has fewer than min_batches lines or its newest is
        # older than max_age (against the newest line of the server)
        states = {r: "unknown" if len(lines) < cfg.min_batches or newest - lines[-1][0] > cfg.max_age else kinds[r]
                  for r, lines in ranks.items()}
        healthy = sorted(r for r, s in states.items() if s == _HEALTHY)
        out = []
        for rank, s in sorted(states.items()):
            key = alert_key(server, rank)
            if s == _COLLAPSED and healthy and key not in self.active:
                collapsed = [r for r, k in sorted(states.items()) if k == _COLLAPSED and r != rank]
                out += self.active.fire(key, self._alert(server, rank, healthy, collapsed))
            elif key in self.active and (s == _HEALTHY or not healthy):
                why = ("rank recovered", fmt(ranks[rank][-1][1])) if s == _HEALTHY else \
                      ("other ranks", "no healthy rank left: see AcceptanceCollapse")
                out += self.active.resolve(key, newest, why)
        return out

    def _alert(self, server: str, rank: str, healthy: list[str], collapsed: list[str]) -> Alert:
        """The alert of `rank`, collapsed while the `healthy` ranks are not; `collapsed`: the
        server's other collapsed ranks (named in the summary and evidence)."""
        cfg = self.config
        ranks = self._recent[server]
        mine = [a for _, a in ranks[rank]]
        others = {r: sum(a for _, a in ranks[r]) / len(ranks[r]) for r in healthy}
        where = f"{server} {rank}".strip()
        if collapsed:
            named = ", ".join(collapsed[:NAMED_MAX]) + (f" and {len(collapsed) - NAMED_MAX} more"
                                                         if len(collapsed) > NAMED_MAX else "")
            who = f"{where} collapsed (so did {named}):"
        else:
            who = f"Only {where} collapsed:"
        files = [p for p in self.log_paths.get(server, []) if not p.startswith("journal:")]
        log = " ".join(shlex.quote(p) for p in files) if files else "<log>"
        # critical: it is the rank's collapse alert too (the default inhibit rules mute that
        # rank's AcceptanceCollapse under it: one message, one diagnosis)
        return new_alert(
            ALERT_NAME, "critical", server, rank,
            summary=f"{who} accept len {mine[-1]:.2f} while {len(healthy)} {'healthy' if collapsed else 'other'} "
                    f"rank(s) reach {min(others.values()):.2f}+",
            description=(
                f"The last {cfg.min_batches} decode lines of {rank or 'this rank'} show accept len at or below "
                f"{cfg.max_accept_length:.2f} while other ranks of the same server, with the same draft, stay at "
                f"or above {cfg.healthy_accept_length:.2f}. The draft checkpoint is not the problem; something "
                "specific to this rank is."
            ),
            starts_at=ranks[rank][0][0],
            evidence=[("accept len, this rank", " ".join(fmt(a) for a in mine))]
                     + ([("other collapsed ranks", ", ".join(collapsed))] if collapsed else [])
                     + [(f"mean accept len {r}", fmt(v)) for r, v in sorted(others.items())],
            fixes=[
                f"Compare how each rank built its drafter: `grep -n -E '{rank.split()[0] if rank else 'TP0'} ' {log} "
                "| grep -i -E 'draft|eagle|load weight|embed|lm_head'` against a healthy rank; ranks that "
                "disagree on weight sharing or loading build different drafters (vllm-project/vllm#50158).",
                "Check the GPU of this rank: `nvidia-smi -q -d ECC,PERFORMANCE` and "
                "`dmesg | grep -i xid` (`specwatch_gpu_*` metrics); a faulty GPU corrupts draft logits first.",
                "PD disaggregation / transfer: if only some ranks receive requests through a KV transfer "
                "path, the draft may miss its hidden states there (vllm-project/vllm-ascend#13665).",
                "Routing: a load-balance method that sends one kind of request to one DP rank "
                "(`--load-balance-method`) makes that rank's acceptance differ; check what it serves.",
            ],
        )

    def to_state(self) -> dict:
        return {"active": self.active.to_state(),
                "recent": {s: {r: list(v) for r, v in ranks.items()} for s, ranks in self._recent.items()}}

    def load_state(self, state: dict) -> None:
        self.active.load_state(state.get("active", {}))
        for s, ranks in state.get("recent", {}).items():
            self._recent[s] = {r: deque([tuple(x) for x in v], maxlen=self.config.min_batches) for r, v in ranks.items()}
        self._rekind()
