"""Rank disagreement: one rank's draft collapsed while the other ranks of the server are healthy.

Every DP rank runs the same draft weights and code, so a collapse on some ranks only points at
something rank-specific: a rank that built its drafter differently (BR-05: TP ranks logged
opposite weight-sharing verdicts), a faulty GPU, a PD transfer path on some ranks (BR-10), or a
class of traffic routed to one rank. Per server, a rank is collapsed when its last `min_batches`
valid decode lines (`rules/windows.py`) all had accept len <= `max_accept_length`, healthy when
they all had accept len >= `healthy_accept_length`; lines older than `max_age` (against the
newest line of the server) do not count. Fires per collapsed rank while at least one other rank
is healthy; resolves when the rank is no longer collapsed or no healthy rank is left (then it is
a whole-server collapse, which the collapse rule reports).
"""

from __future__ import annotations

from collections import deque

from specwatch.alerts.model import Alert
from specwatch.config import Config, RankDisagreementConfig, WindowConfig
from specwatch.events import DecodeBatch, PrefillBatch
from specwatch.rules.active import ActiveAlerts
from specwatch.rules.base import Rule, alert_key, fmt, new_alert
from specwatch.rules.windows import WindowTracker

ALERT_NAME = "RankDisagreement"


class RankDisagreementRule(Rule):
    name = "rank_disagreement"

    def __init__(self, config: RankDisagreementConfig, windows: WindowConfig | None = None):
        self.config = config
        self.windows = WindowTracker(windows or WindowConfig())
        # server → rank → last min_batches valid lines (timestamp, accept len)
        self._recent: dict[str, dict[str, deque[tuple[float, float]]]] = {}
        self.active = ActiveAlerts()

    def reconfigure(self, config: Config) -> None:
        self.config = config.rank_disagreement
        self.windows.config = config.windows
        for ranks in self._recent.values():  # keep the newest min_batches lines of each rank
            for r, lines in ranks.items():
                ranks[r] = deque(lines, maxlen=self.config.min_batches)

    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        if not self.config.enabled or not isinstance(event, (DecodeBatch, PrefillBatch)):
            return []
        w = self.windows.observe(server, event)
        if w is None or not w.acceptance_valid:
            return []
        ranks = self._recent.setdefault(server, {})
        ranks.setdefault(event.rank, deque(maxlen=self.config.min_batches)).append((event.timestamp, event.accept_length))
        return self._evaluate(server, event.timestamp)

    def _state(self, lines: deque, newest: float) -> str:
        cfg = self.config
        if len(lines) < cfg.min_batches or newest - lines[-1][0] > cfg.max_age:
            return "unknown"
        if all(a <= cfg.max_accept_length for _, a in lines):
            return "collapsed"
        if all(a >= cfg.healthy_accept_length for _, a in lines):
            return "healthy"
        return "between"

    def _evaluate(self, server: str, newest: float) -> list[Alert]:
        ranks = self._recent[server]
        states = {r: self._state(lines, newest) for r, lines in ranks.items()}
        healthy = sorted(r for r, s in states.items() if s == "healthy")
        out = []
        for rank, s in sorted(states.items()):
            key = alert_key(server, rank)
            if s == "collapsed" and healthy and key not in self.active:
                out += self.active.fire(key, self._alert(server, rank, healthy))
            elif key in self.active and (s == "healthy" or not healthy):
                why = ("rank recovered", fmt(ranks[rank][-1][1])) if s == "healthy" else \
                      ("other ranks", "no healthy rank left: see AcceptanceCollapse")
                out += self.active.resolve(key, newest, why)
        return out

    def _alert(self, server: str, rank: str, healthy: list[str]) -> Alert:
        cfg = self.config
        ranks = self._recent[server]
        mine = [a for _, a in ranks[rank]]
        others = {r: sum(a for _, a in ranks[r]) / len(ranks[r]) for r in healthy}
        where = f"{server} {rank}".strip()
        return new_alert(
            ALERT_NAME, "warning", server, rank,
            summary=f"Only {where} collapsed: accept len {mine[-1]:.2f} while {len(healthy)} other rank(s) "
                    f"reach {min(others.values()):.2f}+",
            description=(
                f"The last {cfg.min_batches} decode lines of {rank or 'this rank'} show accept len at or below "
                f"{cfg.max_accept_length:.2f} while other ranks of the same server, with the same draft, stay at "
                f"or above {cfg.healthy_accept_length:.2f}. The draft checkpoint is not the problem; something "
                "specific to this rank is."
            ),
            starts_at=ranks[rank][0][0],
            evidence=[("accept len, this rank", " ".join(fmt(a) for a in mine))]
                     + [(f"mean accept len {r}", fmt(v)) for r, v in sorted(others.items())],
            fixes=[
                f"Compare how each rank built its drafter: `grep -n -E '{rank.split()[0] if rank else 'TP0'} ' <log> "
                "| grep -i -E 'draft|eagle|load weight|embed|lm_head'` against a healthy rank; ranks that "
                "disagree on weight sharing or loading build different drafters (BR-05).",
                "Check the GPU of this rank: `nvidia-smi -q -d ECC,PERFORMANCE` and "
                "`dmesg | grep -i xid` (specwatch_gpu_* metrics); a faulty GPU corrupts draft logits first.",
                "PD disaggregation / transfer: if only some ranks receive requests through a KV transfer "
                "path, the draft may miss its hidden states there (BR-10).",
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
