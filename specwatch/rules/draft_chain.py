"""Draft chain broken: the first drafted token is accepted as usual, the ones after it far less.

vLLM prints the acceptance rate of every draft position (`Per-position acceptance rate`: entry i
= drafts whose first i+1 tokens were accepted ÷ drafts, `vllm/v1/spec_decode/metrics.py`
0.8.5-0.33.0; `DecodeBatch.position_accept_rates`, or its /metrics per scrape interval). Entry i
÷ entry i-1 is the acceptance of position i given the ones before it were accepted. A draft that
predicts well keeps that ratio near position 0's rate; one whose later positions are drafted from
a wrong input drops it at position 1: a chained MTP head (vLLM runs its one MTP layer again for
each further token with `num_speculative_tokens` > 1, feeding it the hidden state of the step
before) or an EAGLE draft fed back its own features. 0.80, 0.24, 0.10 is such a chain: position 0
accepts 80 %, position 1 given position 0 only 30 %. The draft-too-long rule
(rules/draft_length.py) says nothing here: no position is under its 2 % floor.

Per (server, rank), over the same window of draft-weighted rates as that rule (`window`,
`min_drafts`): fires when position 0 accepts at least `min_first_rate` and position 1's rate given
position 0 is below `max_step_ratio` × position 0's rate, while every position accepts at least
`rules.draft_length.max_position_rate` (below it, the draft-too-long rule speaks, one voice per
fault); resolves when it is no longer below, when position 0 falls under `min_first_rate` (a
collapse or degradation then, reported by those rules), when a position falls under that floor,
or at a restart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specwatch.alerts.model import Alert
from specwatch.core.sections import Count, Ratio, Seconds, Section, rule_section
from specwatch.rules.base import alert_key, new_alert, register
from specwatch.rules.collapse import MTP, draft_kind
from specwatch.rules.draft_length import DraftPositionsRule, _Positions, suggestion

if TYPE_CHECKING:  # annotations only: rule files never import config.py
    from specwatch.config import Config


@rule_section("draft_chain")
class DraftChainConfig(Section):
    """rules.draft_chain: over `window` seconds once min_drafts drafts were made, position 1 given
    position 0 accepting less than max_step_ratio × position 0's rate (itself >= min_first_rate)."""

    enabled: bool = True
    min_first_rate: Ratio = 0.5
    max_step_ratio: Ratio = 0.5
    min_drafts: Count = 50
    window: Seconds = 600.0


ALERT_NAME = "DraftChainBroken"


@register
class DraftChainRule(DraftPositionsRule[DraftChainConfig]):
    """The window and event handling of `DraftLengthRule` (`DraftPositionsRule`), another decision (`_judge`)."""

    name = "draft_chain"
    alert_names = (ALERT_NAME,)
    order = 61

    long_rate = 0.02  # rules.draft_length.max_position_rate: a position under it is that rule's case

    def reconfigure(self, config: Config) -> None:
        super().reconfigure(config)
        self.long_rate = config.draft_length.max_position_rate

    def _judge(self, server: str, rank: str, ts: float, pos: _Positions, engine: str | None) -> list[Alert]:
        avg = pos.rates()
        akey = alert_key(server, rank)
        if len(avg) < 2:
            return self.active.resolve(akey, ts, ("draft positions", str(len(avg))))
        cfg = self.config
        first, given = avg[0], (avg[1] / avg[0] if avg[0] > 0 else 0.0)
        if first < cfg.min_first_rate:
            return self.active.resolve(akey, ts, ("position 0 accepts", f"{first:.3f}"))
        if given >= cfg.max_step_ratio * first:
            return self.active.resolve(akey, ts, ("position 1 given position 0", f"{given:.3f}"))
        if min(avg) < self.long_rate:  # positions that accept almost nothing: DraftTooLong speaks
            return self.active.resolve(akey, ts,
                                       ("a position accepts less than", f"{self.long_rate:.3f}"))
        if akey in self.active:
            return []
        args = dict(self.args.get(server) or {})
        args.setdefault("engine", engine)
        return self.active.fire(akey, self._chain_alert(server, rank, ts, avg, given, pos.drafts, args))

    def _chain_alert(self, server: str, rank: str, ts: float, avg: list[float], given: float, drafts: float,
                     args: dict[str, object]) -> Alert:
        where = f"{server} {rank}".strip()
        mtp = draft_kind(args) == MTP
        head = "MTP head" if mtp else "draft"
        carried = ("the hidden state the MTP layer is given for each further step (vLLM runs its one MTP layer "
                   "again per drafted token, on the hidden state of the step before)" if mtp else
                   "the features the draft is fed back for each further step")
        return new_alert(
            ALERT_NAME, "warning", server, rank,
            summary=(f"Draft chain broken on {where}: position 0 accepts {avg[0]:.2f}, position 1 given "
                     f"position 0 only {given:.2f}"),
            description=(
                f"Over the last {self.config.window:.0f} s ({drafts:.0f} drafts) the first drafted token was "
                f"accepted in {avg[0]:.0%} of drafts, but the next one, once the first was accepted, in only "
                f"{given:.0%}. The {head} predicts one step well and the steps after it badly: what is carried "
                f"between draft steps is wrong, {carried}. The tokens drafted past the first cost time and save "
                "little."),
            starts_at=ts,
            evidence=[("per-position acceptance rate", ", ".join(f"{r:.3f}" for r in avg)),
                      ("position 1 given position 0", f"{given:.3f}"),
                      ("drafts in window", f"{drafts:.0f}"), ("draft positions", str(len(avg)))],
            fixes=[
                f"Draft one token per step until it is fixed: {suggestion(args, 1)} keeps position 0's gain "
                "and drops the steps that fail.",
                (f"Check the engine's multi-step MTP for this model: the {head} is one layer trained for one step; "
                 "chained steps need the engine to pass each step's hidden state on (and the model's config to "
                 "allow it, `num_nextn_predict_layers`). Compare the engine's release notes and issues for "
                 "multi-token MTP on this architecture, or try another engine version." if mtp else
                 "Check that the draft was trained for multi-step drafting (test-time training over several "
                 "steps, as EAGLE-3 trainers do) and that the engine feeds it the states it was trained on "
                 "(aux hidden-state layers, `eagle_aux_hidden_state_layer_ids`)."),
            ],
        )
