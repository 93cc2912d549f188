"""Throughput drop: gen throughput well below what this rank did at the same load.

Generated tokens per second depend mostly on how many requests run, so the baseline is learned
per (server, rank, load level), the level being the power-of-two bin of `#running-req` (1, 2-3,
4-7, 8-15, ...). Each valid decode line (`rules/windows.py`: requests running, not
prefill-dominated, close after the previous decode line, since gen throughput counts the whole
time between two lines) is compared with the baseline of its level; the rule averages these
ratios over `window` and fires when the average stays below `1 − max_drop_ratio` for `for`,
resolving at or above `1 − recover_drop_ratio`. Baselines learn from lines that aged out of the
window while the rank was healthy, over the last `baseline_window` of activity, and are used once
they hold `min_baseline_batches` lines. An acceptance collapse (or degradation) of the same rank
inhibits this alert by default: it is the cause, and its alert carries the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from specwatch.alerts.model import Alert
from specwatch.config import Config, Count, Ratio, Seconds, Section, drop_hysteresis, rule_section
from specwatch.events import DecodeBatch
from specwatch.rules.active import ActiveAlerts
from specwatch.rules.base import Rule, alert_key, fmt, new_alert, register
from specwatch.rules.stats import Baseline, Recent, drop_transition
from specwatch.rules.windows import Window


@rule_section("throughput_drop")
class ThroughputDropConfig(Section):
    enabled: bool = True
    max_drop_ratio: Ratio = 0.40
    recover_drop_ratio: Ratio = 0.20
    window: Seconds = 300.0
    hold: Seconds = msgspec.field(default=300.0, name="for")
    min_window_batches: Count = 5
    baseline_window: Seconds = 86400.0
    min_baseline_batches: Count = 30

    def problems(self):
        return drop_hysteresis(self.max_drop_ratio, self.recover_drop_ratio)


ALERT_NAME = "ThroughputDrop"
BASELINE_BUCKET = 300.0  # seconds per learned-baseline bucket


def load_level(running: int) -> int:
    """Power-of-two bin of the running requests: 1 → 1, 2-3 → 2, 4-7 → 3, ..."""
    return max(1, running).bit_length()


def level_text(level: int) -> str:
    lo, hi = 2 ** (level - 1), 2 ** level - 1
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


class _Level:
    """One load level of a rank: its recent throughputs, its learned baseline, and what it adds
    to the window average: `count` lines and `_Rank.terms[index]` (sum / baseline), both 0
    while it has no usable baseline or no recent line. `base` caches `ThroughputDropRule.baseline`:
    it is refreshed when the level learns, on `reconfigure` / `load_state`, and when `config`
    is replaced by another object."""

    __slots__ = ("level", "index", "recent", "learned", "base", "count")

    def __init__(self, level: int, index: int, recent: Recent, learned: Baseline | None):
        self.level = level
        self.index = index  # position in _Rank.levels and _Rank.terms
        self.recent = recent
        self.learned = learned  # this level's entry of ThroughputDropRule._baselines, once it has one
        self.base: float | None = None  # learned mean once usable (ThroughputDropRule.baseline)
        self.count = 0


@dataclass
class _Rank:
    levels: dict[int, _Level] = field(default_factory=dict)  # load level → state, first seen first
    low_since: float | None = None
    # Per line only the levels that changed are recomputed. The window average sums `terms`
    # (one per level, in `levels` order): an unused level's 0.0 changes no float sum, so this
    # is exactly the sum of sum / baseline over the used levels, in the same order.
    terms: list[float] = field(default_factory=list)
    n: int = 0  # lines in the window at levels with a usable baseline
    akey: str | None = None  # alert_key(server, rank), built once


@register
class ThroughputDropRule(Rule):
    name = "throughput_drop"
    alert_names = (ALERT_NAME,)

    order = 90

    def __init__(self, config: ThroughputDropConfig):
        self.config = config
        self._ranks: dict[tuple[str, str], _Rank] = {}
        self._baselines: dict[tuple[str, str, int], Baseline] = {}
        self.active = ActiveAlerts()
        self._cached_for = config  # the config the levels' cached baselines were computed under

    def reconfigure(self, config: Config) -> None:
        # Learned baselines and pending times carry over; windows take the new spans.
        self.config = config.throughput_drop
        for st in self._ranks.values():
            for lv in st.levels.values():
                lv.recent.resize(self.config.window)
        for b in self._baselines.values():
            b.resize(self.config.baseline_window)
        self._refresh()

    def _refresh(self) -> None:
        """Recompute every level's cached baseline and window term (config or state replaced)."""
        self._cached_for = self.config
        for (server, rank), st in self._ranks.items():
            for lv in st.levels.values():
                lv.learned = self._baselines.get((server, rank, lv.level))
                lv.base = self._usable(lv.learned)
                recent = lv.recent
                count = recent.count if lv.base else 0
                st.n += count - lv.count
                lv.count = count
                st.terms[lv.index] = recent.sum / lv.base if count else 0.0

    def _usable(self, learned: Baseline | None) -> float | None:
        """The learned mean once it holds min_baseline_batches lines (as `baseline`)."""
        return learned.mean() if learned is not None and learned.count >= self.config.min_baseline_batches else None

    def on_decode(self, server: str, window: Window, now: float) -> list[Alert]:
        if not self.config.enabled or not window.throughput_valid:
            return []
        b = window.batch
        return self._observe(server, b.rank, b.timestamp, b.running_requests, b.gen_throughput, b, -1)

    def baseline(self, server: str, rank: str, level: int) -> float | None:
        """Learned gen throughput (token/s) of the rank at that load level, once usable."""
        b = self._baselines.get((server, rank, level))
        return b.mean() if b is not None and b.count >= self.config.min_baseline_batches else None

    def _observe(self, server: str, rank: str, t: float, running: int, thr: float, src, j: int) -> list[Alert]:
        """One valid line: its rank, timestamp, running requests and gen throughput; its event
        is `src` (j < 0) or decode row j of `src` (`catchup.Rows`), built only for an alert."""
        cfg = self.config
        if cfg is not self._cached_for:
            self._refresh()
        key = (server, rank)
        st = self._ranks.get(key)
        if st is None:
            st = self._ranks[key] = _Rank()
        akey = st.akey
        if akey is None:
            akey = st.akey = alert_key(server, rank)
        this = running.bit_length() if running > 1 else 1  # load_level, inline
        cur = st.levels.get(this)
        if cur is None:
            learned = self._baselines.get((server, rank, this))  # loaded from the state file, maybe
            cur = st.levels[this] = _Level(this, len(st.terms), Recent(cfg.window), learned)
            cur.base = self._usable(learned)
            st.terms.append(0.0)
        aged_here = cur.recent.add(t, thr)
        firing = akey in self.active
        healthy = st.low_since is None and not firing
        terms, n = st.terms, st.n
        for lv in st.levels.values():
            recent = lv.recent
            if lv is cur:
                aged = aged_here
            else:
                if recent.oldest > t - recent.span:
                    continue  # nothing ages out at this level: nothing changed (prune's test, inline)
                aged = recent.prune(t)
            if healthy and aged:
                learned = lv.learned
                if learned is None:
                    learned = lv.learned = self._baselines.setdefault(
                        (server, rank, lv.level), Baseline(BASELINE_BUCKET, cfg.baseline_window))
                for at, v, k in aged:
                    learned.add(at, v, k)
                lv.base = self._usable(learned)
            # this level's lines changed: its share of the window average
            base = lv.base
            count = recent.count if base else 0
            n += count - lv.count
            lv.count = count
            terms[lv.index] = recent.sum / base if count else 0.0
        st.n = n
        if n < cfg.min_window_batches:
            return []
        ratio = 0.0
        for term in st.terms:  # one addition at a time, in level order (catch-up sums the same way)
            ratio += term
        ratio /= n
        if not firing and not ratio < 1 - cfg.max_drop_ratio:
            st.low_since = None  # what drop_transition says in the common, healthy case
            return []
        action, st.low_since = drop_transition(ratio, t, st.low_since, firing,
                                               max_drop=cfg.max_drop_ratio, recover_drop=cfg.recover_drop_ratio,
                                               hold=cfg.hold)
        if action == "fire":
            used = [(lv.recent.sum, lv.count, lv.base) for lv in st.levels.values() if lv.count]
            return self.active.fire(akey, self._alert(server, src if j < 0 else src.decode(j), st, used, ratio))
        if action == "resolve":
            return self.active.resolve(akey, t, ("recovered to baseline", f"{ratio:.0%}"))
        return []

    def _alert(self, server: str, b: DecodeBatch, st: _Rank, used: list[tuple[float, int, float]],
               ratio: float) -> Alert:
        cfg = self.config
        where = f"{server} {b.rank}".strip()
        n = sum(c for _, c, _ in used)
        mean_thr = sum(s for s, _, _ in used) / n
        mean_base = sum(base * c for _, c, base in used) / n
        levels = sorted(level for level, lv in st.levels.items() if len(lv.recent))
        evidence = [
            ("gen throughput (token/s)", fmt(mean_thr, ".1f")),
            ("baseline at same load (token/s)", fmt(mean_base, ".1f")),
            ("of baseline", f"{ratio:.0%}"),
            ("running requests (levels)", ", ".join(level_text(lv) for lv in levels)),
            ("last line running requests", str(b.running_requests)),
            ("accept len", fmt(b.accept_length)),
            ("cuda graph", "n/a" if b.graph_enabled is None else str(b.graph_enabled)),
            ("token usage", fmt(b.token_usage)),
            ("queued requests", str(b.queued_requests)),
            ("window", f"{n} decode lines over {cfg.window:g}s"),
        ]
        return new_alert(
            ALERT_NAME, "warning", server, b.rank,
            summary=f"Generation throughput on {where} at {ratio:.0%} of its baseline at the same load "
                    f"({mean_thr:.0f} vs {mean_base:.0f} token/s)",
            description=(
                f"Over the last {cfg.window:g}s this rank generated {1 - ratio:.0%} fewer tokens per second "
                f"than it did before with the same number of running requests, for {cfg.hold:g}s. Lower load "
                "is already accounted for: the comparison is per load level."
            ),
            starts_at=st.low_since,
            evidence=evidence,
            fixes=[
                "GPU clocks: `nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER` shows thermal or power "
                "throttling (`specwatch_gpu_clock_event_reason_active`); check cooling and power caps "
                "(`nvidia-smi -q -d POWER`).",
                "CUDA graphs: a `cuda graph: False` decode line means the batch ran eagerly (batch size above "
                "`--cuda-graph-max-bs`, or graphs disabled); raise `--cuda-graph-max-bs` or remove "
                "`--disable-cuda-graph`.",
                "Acceptance: a lower accept len means fewer tokens per verify round; see the accept len "
                "above and the AcceptanceDegradation / AcceptanceCollapse alerts.",
                "Contention: another process on the GPU (`nvidia-smi --query-compute-apps=pid,name,"
                "used_memory --format=csv`), XID or ECC errors (`dmesg | grep -i xid`), or KV cache "
                "pressure (token usage near 1.0, retractions in the log: `grep -c 'Decode out of memory' "
                "<log>`).",
            ],
        )

    def to_state(self) -> dict:
        return {"baselines": [[list(k), b.to_state()] for k, b in self._baselines.items()],
                "active": self.active.to_state(),
                "low_since": [[list(k), st.low_since] for k, st in self._ranks.items() if st.low_since is not None]}

    def load_state(self, state: dict) -> None:
        for k, buckets in state.get("baselines", []):
            b = self._baselines[tuple(k)] = Baseline(BASELINE_BUCKET, self.config.baseline_window)
            b.load_state(buckets)
        self.active.load_state(state.get("active", {}))
        for k, since in state.get("low_since", []):
            self._ranks[tuple(k)] = _Rank(low_since=since)
        self._refresh()  # levels kept from before point at the loaded baselines
