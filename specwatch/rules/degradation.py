"""Acceptance degradation: accept len clearly below what this model pair reaches — a regression.

Not a collapse (the draft still helps) but a loss: an engine upgrade, a sampler change, another
chat template, PD disaggregation (BR-10, BR-11, BR-18, BR-19 in docs/bugreports.md). Compared per
(server, rank) over a recent window (`window`, mean of valid decode lines) against a baseline:

- configured: `expected` accept len of the model pair (`model_path` and, optionally,
  `speculative_draft_model_path` from the server_args line; a value matches the full path or its
  last components, so `Kimi-K2.5` matches `/models/moonshotai/Kimi-K2.5`);
- else learned: the mean over the last `baseline_window` of activity for the model pair, from
  samples that aged out of the recent window while the rank was healthy (a degradation never
  becomes the baseline), kept across restarts, and used once it has `min_baseline_batches`.

Fires when the recent mean stays below `baseline × (1 − max_drop_ratio)` for `for`; resolves
at or above `baseline × (1 − recover_drop_ratio)`. Lines at collapse level (accept len <=
rules.collapse.max_accept_length) are left to the collapse rule and are not counted.
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from bisect import bisect_left
from operator import itemgetter
from typing import TYPE_CHECKING, Annotated, ClassVar

import msgspec
from msgspec import Meta

from specwatch.alerts.model import Alert
from specwatch.core.sections import Count, DROP_BOUNDS, Ratio, Seconds, Section, drop_hysteresis, rule_section
from specwatch.core.events import DecodeBatch, ServerArgs
from specwatch.rules.active import ActiveAlerts
from specwatch.rules.base import Rule, RuleContext, ServerArgsMemory, alert_key, args_evidence, fmt, new_alert, register
from specwatch.rules.collapse import CollapseConfig
from specwatch.rules.stats import Baseline, Recent, drop_transition
from specwatch.rules.summary import ACCEPT, FLAGS, RUNNING, SEQ, TS, VALID_ACCEPT, RankSummary

if TYPE_CHECKING:  # annotations only: rule files never import config.py
    from specwatch.config import Config


class ExpectedAcceptance(Section):
    """One entry of rules.degradation.expected: the healthy accept len of a model pair."""

    example: ClassVar[str] = "{model: moonshotai/Kimi-K2.5, draft: /models/k25-eagle3, accept_length: 2.9}"
    model: Annotated[str, Meta(min_length=1, description="the target's model_path as in the server_args line "
                                                         "(--model-path)")]
    accept_length: Annotated[float, Meta(ge=1.0, le=100.0, description="the accept len this model pair "
                                                                        "reaches when healthy, e.g. 2.9")]
    draft: str | None = None  # None: any draft of that model


@rule_section("degradation")
class DegradationConfig(Section):
    enabled: bool = True
    max_drop_ratio: Ratio = 0.20
    recover_drop_ratio: Ratio = 0.10
    window: Seconds = 600.0
    hold: Seconds = msgspec.field(default=600.0, name="for")
    min_window_batches: Count = 10
    baseline_window: Seconds = 86400.0
    min_baseline_batches: Count = 100
    expected: list[ExpectedAcceptance] = msgspec.field(default_factory=list)
    # written alone, one ratio moves the other's default where it no longer fits (config.DROP_BOUNDS)
    default_bounds: ClassVar = DROP_BOUNDS

    def problems(self):
        return drop_hysteresis(self.max_drop_ratio, self.recover_drop_ratio)


ALERT_NAME = "AcceptanceDegradation"
BASELINE_BUCKET = 300.0  # seconds per learned-baseline bucket


@dataclass
class _Rank:
    recent: Recent  # accept len
    running: Recent  # running requests, same lines
    low_since: float | None = None
    akey: str = ""  # alert_key(server, rank), built once
    open: tuple | None = None  # its timestamp's lines being judged (`DegradationRule._open`)


def path_matches(configured: str | None, actual: object) -> bool:
    """`configured` is the whole path or its trailing components; None matches anything."""
    if configured is None:
        return True
    actual = str(actual or "").rstrip("/")
    configured = configured.rstrip("/")
    return actual == configured or actual.endswith("/" + configured)


@register
class DegradationRule(Rule):
    name = "degradation"
    alert_names = (ALERT_NAME,)
    order = 50

    @classmethod
    def build(cls, config: Config, ctx: RuleContext) -> "DegradationRule":
        return cls(config.degradation, config.collapse)

    def __init__(self, config: DegradationConfig, collapse: CollapseConfig | None = None):
        self.config = config
        self.collapse_max = (collapse or CollapseConfig()).max_accept_length
        self.args = ServerArgsMemory()
        self._ranks: dict[tuple[str, str], _Rank] = {}
        self._baselines: dict[str, Baseline] = {}  # model pair → learned baseline
        self.active = ActiveAlerts()
        # At each evaluation the baseline is looked up for the server's model pair: the pair
        # (server → (model, draft, "model|draft")) is kept until the server's settings change,
        # and the configured `expected` value of a pair until `config` is another object.
        self._pairs: dict[str, tuple[str, str, str]] = {}
        self._expected: dict[str, tuple] = {}  # "model|draft" → `_configured`
        self._expected_for = config

    def reconfigure(self, config: Config) -> None:
        # Learned baselines and pending times carry over; windows take the new spans.
        self.config = config.degradation
        self.collapse_max = config.collapse.max_accept_length
        for st in self._ranks.values():
            st.recent.resize(self.config.window)
            st.running.resize(self.config.window)
        for b in self._baselines.values():
            b.resize(self.config.baseline_window)

    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        if not self.config.enabled:
            return []
        if isinstance(event, ServerArgs):
            self.args.observe(server, event)
            self._pairs.pop(server, None)
        return []

    def _pair(self, server: str) -> tuple[str, str, str]:
        """(model, draft, "model|draft") of the server, from its latest settings."""
        pair = self._pairs.get(server)
        if pair is None:
            args = self.args.get(server) or {}
            model, draft = str(args.get("model_path") or ""), str(args.get("speculative_draft_model_path") or "")
            pair = self._pairs[server] = (model, draft, f"{model}|{draft}")
        return pair

    def _configured(self, model: str, draft: str, pair: str) -> tuple:
        """(accept len,) of the first `expected` entry matching the pair; () when none does."""
        if self.config is not self._expected_for:
            self._expected.clear()
            self._expected_for = self.config
        hit = self._expected.get(pair)
        if hit is None:
            hit = next(((e.accept_length,) for e in self.config.expected
                        if path_matches(e.model, model) and path_matches(e.draft, draft)), ())
            self._expected[pair] = hit
        return hit

    def baseline(self, server: str) -> tuple[float | None, str]:
        """(baseline accept len, where it comes from) for the server's model pair."""
        model, draft, pair = self._pair(server)
        base, count = self._baseline_of(pair, self._configured(model, draft, pair))
        return base, self._source(count)

    def on_lines(self, server: str, ranks: list, emit) -> list[Alert]:
        """The pending decode lines of the server's ranks (`rules/summary.py`) with VALID_ACCEPT
        above collapse level, each judged as if read alone. Per rank and timestamp, the lines go
        into the windows at once (`Recent.add(t, sum, n)`: the same buckets, so the same buckets
        age out, at the timestamp's first line) and after each line the window mean is the mean
        after aging plus the lines so far (local sums). The learned baseline is shared by the
        ranks of a model pair: the timestamps open in file order of their first lines, so it
        learns as line by line, and each line is judged with the baseline as it was at that
        line (`steps`: the baseline after each step it learned). Sums are rounded per timestamp
        instead of per line."""
        cfg = self.config
        if not cfg.enabled:
            return []
        cmax = self.collapse_max
        seconds: list[tuple[int, RankSummary, list]] = []  # (seq of the first line, rank, the lines of one timestamp)
        valid, ts_, accept_, flags_ = VALID_ACCEPT, TS, ACCEPT, FLAGS  # locals: per line
        for rs in ranks:
            t0 = None
            for e in rs.pending:
                if e[flags_] & valid and e[accept_] > cmax:
                    if e[ts_] != t0:
                        t0 = e[ts_]
                        lines = [e]
                        seconds.append((e[SEQ], rs, lines))
                    else:
                        lines.append(e)
        if not seconds:
            return []
        if len(seconds) > 1:
            seconds.sort(key=itemgetter(0))
        pair = self._pairs.get(server) or self._pair(server)
        configured = self._configured(*pair)
        steps = [(-1, *self._baseline_of(pair[2], configured))]  # (seq, baseline from that line on, lines it has)
        opened = []
        for first, rs, lines in seconds:
            st = self._ranks.get(rs.key)
            if st is None:
                st = self._ranks[rs.key] = _Rank(Recent(cfg.window), Recent(cfg.window), akey=alert_key(*rs.key))
            elif not st.akey:  # loaded with its pending time
                st.akey = alert_key(*rs.key)
            if st.open is not None:  # the rank's previous timestamp: judged before this one opens
                self._judge(server, st, st.open, steps, emit)
            aged = self._open(st, rs, lines)
            if aged:
                learned = self._baselines.get(pair[2])
                if learned is None:
                    learned = self._baselines[pair[2]] = Baseline(BASELINE_BUCKET, cfg.baseline_window)
                for at, v, k in aged:
                    learned.add(at, v, k)
                if not configured:
                    steps.append((first, *self._baseline_of(pair[2], configured)))
            opened.append(st)
        for st in opened:
            if st.open is not None:
                self._judge(server, st, st.open, steps, emit)
        return []

    def _baseline_of(self, pair: str, configured: tuple) -> tuple[float | None, int]:
        """(baseline, the lines it was learned from: 0 configured, -1 none yet) of a model pair
        (`configured`: its `_configured`)."""
        if configured:
            return configured[0], 0
        learned = self._baselines.get(pair)
        if learned is not None and learned.count >= self.config.min_baseline_batches:
            return learned.mean(), learned.count
        return None, -1

    @staticmethod
    def _source(count: int) -> str:
        """Where a baseline comes from (`_baseline_of`'s count)."""
        return "configured" if count == 0 else "none yet" if count < 0 else f"learned from {count} decode lines"

    def _open(self, st: _Rank, rs, lines: list[tuple]) -> list:
        """The lines of a timestamp of a rank into its windows at once, to be judged
        (`st.open`); returns what aged out at its first line to learn from while the rank is
        healthy, else []."""
        first = lines[0]
        t = first[TS]
        k = len(lines)
        if k == 1:
            acc, run = first[ACCEPT], first[RUNNING]
        else:
            acc = sum([e[ACCEPT] for e in lines])
            run = sum([e[RUNNING] for e in lines])
        recent, running = st.recent, st.running
        aged = recent.add(t, acc, k)
        running.add(t, run, k)
        # the windows before these lines, after aging
        st.open = (rs, t, lines, recent.sum - acc, recent.count - k, running.sum - run)
        if aged and (st.low_since is not None or st.akey in self.active):
            return []  # a degradation never teaches the baseline that it is normal
        return aged

    def _judge(self, server: str, st: _Rank, opened: tuple, steps: list[tuple[int, float | None, int]], emit) -> None:
        """The lines of the rank's open timestamp (`opened`, its `st.open`), one at a time, each
        against the baseline of the last of `steps` before it (None: none yet)."""
        cfg = self.config
        rs, t, lines, sw, nw, rsw = opened
        st.open = None
        # the step in force at the first line: the last one at or before it (a timestamp that
        # taught the baseline is judged after learning, as its first line was)
        j = bisect_left(steps, (lines[0][SEQ] + 1,)) - 1 if len(steps) > 1 else 0
        _, base, learned_from = steps[j]
        nxt = steps[j + 1][0] if j + 1 < len(steps) else math.inf
        since, akey = st.low_since, st.akey
        firing = akey in self.active
        thr, minw = 1 - cfg.max_drop_ratio, cfg.min_window_batches
        acc = 0.0
        k = 0
        seq_, accept_ = SEQ, ACCEPT  # locals: per line
        for e in lines:
            if e[seq_] >= nxt:  # the baseline learned since the previous line
                while j + 1 < len(steps) and steps[j + 1][0] <= e[SEQ]:
                    j += 1
                _, base, learned_from = steps[j]
                nxt = steps[j + 1][0] if j + 1 < len(steps) else math.inf
            acc += e[accept_]
            k += 1
            n = nw + k
            if n < minw or base is None:
                continue
            mean = (sw + acc) / n
            if not firing and not mean / base < thr:
                since = None  # what drop_transition says in the common, healthy case
                continue
            action, since = drop_transition(mean / base, t, since, firing, max_drop=cfg.max_drop_ratio,
                                            recover_drop=cfg.recover_drop_ratio, hold=cfg.hold)
            if action == "fire":
                st.low_since = since
                running = (rsw + sum([x[RUNNING] for x in lines[:k]])) / n  # the window as of this line
                alert = self._alert(server, rs.batch(e), st, mean, base, self._source(learned_from), n, running)
                emit(self.active.fire(akey, alert), e)
                firing = True
            elif action == "resolve":
                emit(self.active.resolve(akey, t, ("recovered mean accept len", fmt(mean))), e)
                firing = False
            elif firing:
                self.active[akey].evidence[:2] = self._evidence(mean, base)
        st.low_since = since

    @staticmethod
    def _evidence(mean: float, base: float) -> list[tuple[str, str]]:
        return [("mean accept len", fmt(mean)), ("baseline accept len", fmt(base))]

    def _alert(self, server: str, b: DecodeBatch, st: _Rank, mean: float, base: float, source: str, n: int,
               running: float) -> Alert:
        """The alert at line `b`: the window then held `n` lines, `running` requests on average."""
        cfg = self.config
        since = st.low_since
        assert since is not None  # it fired: the drop's pending time began
        args = self.args.get(server)
        where = f"{server} {b.rank}".strip()
        drop = 1 - mean / base
        evidence = self._evidence(mean, base) + [
            ("drop", f"{drop:.0%}"),
            ("baseline from", source),
            ("window", f"{n} decode lines over {cfg.window:g}s"),
            ("below for", f"{b.timestamp - since:.0f}s"),
            ("mean running requests", fmt(running, ".1f")),
        ] + args_evidence(args)
        draft = str((args or {}).get("speculative_draft_model_path") or "<draft>")
        return new_alert(
            ALERT_NAME, "warning", server, b.rank,
            summary=f"Speculative acceptance degraded on {where}: accept len {mean:.2f} vs baseline {base:.2f} (-{drop:.0%})",
            description=(
                f"The mean accept len over the last {cfg.window:g}s stayed more than {cfg.max_drop_ratio:.0%} "
                f"below this model pair's baseline for {cfg.hold:g}s. The draft still helps, but less than it "
                "did: this is a regression in the serving stack or the traffic, not a broken draft."
            ),
            starts_at=since,
            evidence=evidence,
            fixes=[
                "Engine change: compare `pip show sglang` with the version the baseline was measured on; "
                "SGLang releases changed rejection sampling and speculative code paths (vllm-project/vllm#40551). Pin the old "
                "version on one server and compare accept len.",
                "Sampling: higher temperature / top_p lowers acceptance. Check what clients send (request "
                "logs, `--log-requests`) against what the baseline saw.",
                "Traffic: another chat template or thinking mode the draft was not trained on lowers "
                "acceptance (z-lab/dflash#133). Compare accept len per client or per `enable_thinking`.",
                "Deployment: PD disaggregation loses draft state on the decode node (vllm-project/vllm-ascend#13665, sgl-project/sglang#7927); "
                "larger batches lower accept len on some engines (NVIDIA/TensorRT-LLM#9208): compare with the mean running "
                "requests above.",
                f"Pairing: confirm the draft at {draft} is the one trained for this target revision "
                "(`config.json` of both); a re-quantized target changes hidden states (vllm-project/vllm-ascend#5974). If the "
                "new level is expected, set rules.degradation.expected for this model pair.",
            ],
        )

    def to_state(self) -> dict:
        return {"baselines": {k: b.to_state() for k, b in self._baselines.items()},
                "active": self.active.to_state(), "args": self.args.to_state(),
                "low_since": [[list(k), st.low_since] for k, st in self._ranks.items() if st.low_since is not None]}

    def load_state(self, state: dict) -> None:
        for k, buckets in state.get("baselines", {}).items():
            b = self._baselines[k] = Baseline(BASELINE_BUCKET, self.config.baseline_window)
            b.load_state(buckets)
        self.active.load_state(state.get("active", {}))
        self.args.load_state(state.get("args", {}))
        self._pairs.clear()
        for k, since in state.get("low_since", []):
            self._ranks[tuple(k)] = _Rank(Recent(self.config.window), Recent(self.config.window), low_since=since)
