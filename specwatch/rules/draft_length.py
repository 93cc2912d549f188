"""Draft too long: the first positions of each draft are accepted, the later ones (almost) never.

Each drafted token past the last useful position costs draft compute and verify width and saves
nothing. vLLM prints the acceptance rate of every draft position (`Per-position acceptance rate`:
drafts whose first i+1 tokens were accepted ÷ drafts, `vllm/v1/spec_decode/metrics.py` 0.8.5-0.33.0;
`DecodeBatch.position_accept_rates`), and so does its /metrics
(`vllm:spec_decode_num_accepted_tokens_per_pos_total`, `RankMetrics.position_accept_rates` per
scrape interval: used for a server whose log gives none), so the useful length can be read off directly: BR-16
(docs/bugreports.md) accepts 0.600, 0.385, 0.215, 0.108, 0.062 at positions 1-5 and 0.000 at the
ten after them.

Per (server, rank), over the last `window` seconds of loaded decode lines, the rates are averaged
weighted by drafts (draft tokens ÷ positions). Once `min_drafts` drafts are in, the useful length
j is the number of leading positions that accept at least `max_position_rate`; it fires when
0 < j < k and the window's accept length (1 + the sum of the rates) is above the collapse
threshold (below it, BR-07's 0.027 at position 1, the collapse rule speaks: rules/collapse.py) and resolves when every position is useful
again, or the server restarts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

import json
import shlex
from collections import deque

from specwatch.alerts.model import Alert, code
from specwatch.core.sections import Count, Ratio, Seconds, Section, rule_section
from specwatch.core.events import MetricsSample, ServerArgs
from specwatch.rules.active import ActiveAlerts
from specwatch.rules.base import Rule, ServerArgsMemory, alert_key, new_alert, register
from specwatch.rules.summary import FLAGS, SEQ, SRC, TS, VALID_ACCEPT

if TYPE_CHECKING:  # annotations only: rule files never import config.py
    from specwatch.config import Config


@rule_section("draft_length")
class DraftLengthConfig(Section):
    """rules.draft_length: a position below max_position_rate accepts almost nothing; judged over
    `window` seconds once min_drafts drafts were made."""

    enabled: bool = True
    max_position_rate: Ratio = 0.02
    min_drafts: Count = 50
    window: Seconds = 600.0


ALERT_NAME = "DraftTooLong"


def _seq(line: tuple) -> int:
    return line[0]


class _Positions:
    """Draft-weighted per-position rates of one rank over a time window."""

    __slots__ = ("samples", "drafts", "accepted")

    def __init__(self, k: int):
        self.samples: deque[tuple[float, float, tuple[float, ...]]] = deque()
        self.drafts = 0.0
        self.accepted = [0.0] * k

    def add(self, t: float, drafts: float, rates: tuple[float, ...], span: float) -> None:
        self.samples.append((t, drafts, rates))
        self._apply(drafts, rates, 1)
        while self.samples and self.samples[0][0] <= t - span:
            _, d, r = self.samples.popleft()
            self._apply(d, r, -1)

    def _apply(self, drafts: float, rates: tuple[float, ...], sign: int) -> None:
        self.drafts += sign * drafts
        for i, r in enumerate(rates):
            self.accepted[i] += sign * r * drafts

    def rates(self) -> list[float]:
        return [max(0.0, a / self.drafts) for a in self.accepted] if self.drafts > 0 else []


def suggestion(args: dict[str, object], useful: int) -> str:
    """The setting to change, as a command-line fragment for the server's engine (vLLM when
    `args["engine"]` says so); a vLLM method that is not known is left to the reader."""
    if args.get("engine") == "vllm":
        if not args.get("speculative_method"):
            return f'`"num_speculative_tokens": {useful}` in `--speculative-config` (keep its method and model)'
        spec = {"method": args["speculative_method"]}
        if args.get("speculative_draft_model_path"):
            spec["model"] = args["speculative_draft_model_path"]
        spec["num_speculative_tokens"] = useful
        return code("--speculative-config " + shlex.quote(json.dumps(spec)))
    return code(f"--speculative-num-steps {useful} --speculative-num-draft-tokens {useful + 1}")


class _WindowSection(Protocol):
    """What the window and event handling read of a rule's section."""

    enabled: bool
    window: float
    min_drafts: int


_S = TypeVar("_S", bound=_WindowSection)


class DraftPositionsRule(Rule, Generic[_S]):
    """Each rank's window of per-position rates, from vLLM's lines or /metrics; `_judge` decides
    (DraftLengthRule's and DraftChainRule's, each reading its own section)."""

    def __init__(self, config: _S, collapse_accept_length: float = 1.10):
        self.config = config
        self.collapse_accept_length = collapse_accept_length  # at or below: the collapse rule's case
        self.args = ServerArgsMemory()
        self._ranks: dict[tuple[str, str], _Positions] = {}
        self._from_log: set[str] = set()  # servers whose log gives the positions: /metrics not used
        self.active = ActiveAlerts()

    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        if isinstance(event, ServerArgs):
            self.args.observe(server, event)
        elif isinstance(event, MetricsSample) and server not in self._from_log and self.config.enabled:
            # vLLM's /metrics (`vllm:spec_decode_num_accepted_tokens_per_pos_total`): each rank's
            # per-position rates over the scrape interval, weighted by its drafts
            out = []
            for r in event.ranks:
                if r.fresh and r.drafts and r.position_accept_rates:
                    out += self._observe(server, r.rank, event.timestamp, tuple(r.position_accept_rates),
                                         r.drafts, event.engine)
            return out
        return []

    def on_restart(self, server: str, at: float, why: str) -> list[Alert]:
        out = []
        self._from_log.discard(server)
        for key in [k for k in self._ranks if k[0] == server]:
            del self._ranks[key]
            out += self.active.resolve(alert_key(*key), at, ("resolved because", why))
        return out

    def on_lines(self, server: str, ranks: list, emit) -> list[Alert]:
        """The server's decode lines since the last evaluation that carry per-position rates
        (vLLM's, `DecodeBatch.position_accept_rates`) and describe the draft under load
        (`VALID_ACCEPT`), each rank's in order (the window is per rank). Only vLLM's assembler
        makes them, as DecodeBatch events: a canonical SGLang line (its entry's `src` the line's
        groups) never carries them and is skipped without building anything."""
        if not self.config.enabled:
            return []
        lines = [(e[SEQ], rs.rank, e) for rs in ranks for e in rs.pending
                 if type(e[SRC]) is not tuple and e[SRC].position_accept_rates and e[FLAGS] & VALID_ACCEPT]
        if not lines:
            return []
        lines.sort(key=_seq)  # file order: the transitions of several ranks in the order of their lines
        self._from_log.add(server)
        for _, rank, e in lines:
            b = e[SRC]
            rates = b.position_accept_rates
            drafts = b.draft_tokens / len(rates) if b.draft_tokens else 1.0
            if alerts := self._observe(server, rank, e[TS], tuple(rates), drafts, b.engine):
                emit(alerts, e)
        return []

    def _observe(self, server: str, rank: str, ts: float, rates: tuple[float, ...], drafts: float,
                 engine: str | None) -> list[Alert]:
        """One interval's per-position accept rates of a rank (`drafts` drafts made in it)."""
        k, key = len(rates), (server, rank)
        pos = self._ranks.get(key)
        if pos is None or len(pos.accepted) != k:  # a new draft length: start again
            pos = self._ranks[key] = _Positions(k)
        pos.add(ts, drafts, rates, self.config.window)
        if pos.drafts < self.config.min_drafts:
            return []
        return self._judge(server, rank, ts, pos, engine)

    def _judge(self, server: str, rank: str, ts: float, pos: _Positions, engine: str | None) -> list[Alert]:
        """The decision on a rank's window of rates (`pos`, at least min_drafts drafts)."""
        raise NotImplementedError

    @classmethod
    def build(cls, config: Config, ctx) -> "DraftPositionsRule":
        rule = cls(getattr(config, cls.name))
        rule.reconfigure(config)
        return rule

    def reconfigure(self, config: Config) -> None:
        """Its own section (`rules.<name>`) and the collapse rule's threshold."""
        self.config = getattr(config, self.name)
        self.collapse_accept_length = config.collapse.max_accept_length

    def to_state(self) -> dict:
        return {"active": self.active.to_state(), **self.args.to_state()}

    def load_state(self, state: dict) -> None:
        self.active.load_state(state.get("active", {}))
        self.args.load_state(state)


@register
class DraftLengthRule(DraftPositionsRule[DraftLengthConfig]):
    name = "draft_length"
    alert_names = (ALERT_NAME,)
    order = 60

    def _judge(self, server: str, rank: str, ts: float, pos: _Positions, engine: str | None) -> list[Alert]:
        k, key = len(pos.accepted), (server, rank)
        avg = pos.rates()
        thr = self.config.max_position_rate
        useful = next((i for i, r in enumerate(avg) if r < thr), k)
        akey = alert_key(*key)
        if useful == k:
            return self.active.resolve(akey, ts, ("every position accepts at least", f"{thr:.3f}"))
        if useful == 0 or akey in self.active or 1 + sum(avg) <= self.collapse_accept_length:
            return []  # (almost) nothing accepted at all: a collapse, not a long draft
        args = dict(self.args.get(server) or {})
        args.setdefault("engine", engine)
        return self.active.fire(akey, self._alert(server, rank, ts, k, useful, avg, pos.drafts, args))

    def _alert(self, server: str, rank: str, ts: float, k: int, useful: int, avg: list[float],
               drafts: float, args: dict[str, object]) -> Alert:
        where = f"{server} {rank}".strip()
        thr = self.config.max_position_rate
        return new_alert(
            ALERT_NAME, "warning", server, rank,
            summary=f"Draft too long on {where}: positions {useful + 1}-{k} of {k} accept almost nothing",
            description=(
                f"Over the last {self.config.window:.0f} s ({drafts:.0f} drafts) draft positions {useful + 1} to {k} "
                f"were accepted in less than {thr:.1%} of drafts: every token drafted there costs draft and verify "
                f"time and saves none. The draft is longer than what it learned to predict: {useful} "
                "position(s) carry the speedup."),
            starts_at=ts,
            evidence=[("per-position acceptance rate", ", ".join(f"{r:.3f}" for r in avg)),
                      ("drafts in window", f"{drafts:.0f}"), ("draft positions", str(k)),
                      ("useful positions", str(useful))],
            fixes=[
                f"Draft {useful} token(s) per step instead of {k}: {suggestion(args, useful)}; accept length "
                "stays about the same and each step gets cheaper.",
                f"If the draft was trained to predict {k} positions, positions past {useful} failing points at a "
                "mismatch between training and serving rather than a short draft: its config (e.g. a "
                "`partial_rotary_factor` copied into a DFlash draft that was trained with full RoPE, "
                "vllm-project/speculators#613) or the training sequence length.",
            ],
        )
