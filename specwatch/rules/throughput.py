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
from typing import TYPE_CHECKING, ClassVar

import msgspec

from specwatch.alerts.model import Alert
from specwatch.core.sections import Count, DROP_BOUNDS, Ratio, Seconds, Section, drop_hysteresis, rule_section
from specwatch.core.events import DecodeBatch
from specwatch.rules.active import ActiveAlerts
from specwatch.rules.base import Rule, alert_key, fmt, new_alert, register
from specwatch.rules.stats import Baseline, Recent, drop_transition
from specwatch.rules.summary import FLAGS, RUNNING, THROUGHPUT, TS, VALID_THROUGHPUT

if TYPE_CHECKING:  # annotations only: rule files never import config.py
    from specwatch.config import Config


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
    # written alone, one ratio moves the other's default where it no longer fits (config.DROP_BOUNDS)
    default_bounds: ClassVar = DROP_BOUNDS

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
    akey: str = ""  # alert_key(server, rank), built once


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
                base = lv.base = self._usable(lv.learned)
                recent = lv.recent
                count = recent.count if base else 0
                st.n += count - lv.count
                lv.count = count
                st.terms[lv.index] = recent.sum / base if base and count else 0.0

    def _usable(self, learned: Baseline | None) -> float | None:
        """The learned mean once it holds min_baseline_batches lines (as `baseline`)."""
        return learned.mean() if learned is not None and learned.count >= self.config.min_baseline_batches else None

    def on_lines(self, server: str, ranks: list, emit) -> list[Alert]:
        """The pending decode lines of each rank (`rules/summary.py`) with VALID_THROUGHPUT, in
        line order. What ages out of the windows at a timestamp ages at its first line
        (`_open`), and the window average after each line is the average after aging plus the
        lines so far (sum / baseline of each, in local variables); the lines of one timestamp
        and load level go into that level's window as one sum (`Recent.add(t, sum, n)`: the
        same buckets, so the same buckets age out and are learned), once the timestamp's lines
        are judged (`_close`). So each line is judged as one at a time, with sums rounded per
        timestamp instead of per line."""
        cfg = self.config
        if not cfg.enabled:
            return []
        if cfg is not self._cached_for:
            self._refresh()
        thr, minw = 1 - cfg.max_drop_ratio, cfg.min_window_batches
        valid, ts_, running_, throughput_, flags_ = VALID_THROUGHPUT, TS, RUNNING, THROUGHPUT, FLAGS  # locals: per line
        for rs in ranks:
            t0: float | None = None  # None until the rank's first line (then st, levels, akey are its)
            since: float | None = None
            runs: list[tuple[int, float, int]]
            runs, lv0, s, c = [], 0, 0.0, 0  # set at a rank's first line (names for the checkers)
            for e in rs.pending:
                if not e[flags_] & valid:
                    continue
                t = e[ts_]
                if t != t0:
                    if t0 is None:
                        st = self._rank(rs.key)
                        levels, akey = st.levels, st.akey
                    else:
                        runs.append((lv0, s, c))
                        self._close(st, t0, runs, since)
                    t0, lv0, runs = t, 0, []
                    total, n = self._open(st, rs.key, t)  # the window average after aging: total / n
                    since, firing = st.low_since, akey in self.active
                r = e[running_]
                lv = r.bit_length() if r > 1 else 1  # load_level, inline
                if lv != lv0:
                    if lv0:
                        runs.append((lv0, s, c))
                    lv0, s, c = lv, 0.0, 0
                    cur = levels.get(lv)
                    base = (cur or self._level(st, rs.key, lv)).base
                v = e[throughput_]
                s += v
                c += 1
                if base:  # a level with a usable baseline: in the average
                    total += v / base
                    n += 1
                if n < minw:
                    continue
                ratio = total / n
                if not firing and not ratio < thr:
                    since = None  # what drop_transition says in the common, healthy case
                    continue
                action, since = drop_transition(ratio, t, since, firing, max_drop=cfg.max_drop_ratio,
                                                recover_drop=cfg.recover_drop_ratio, hold=cfg.hold)
                if action == "fire":
                    runs.append((lv0, s, c))  # the window as of this line, for the evidence
                    self._close(st, t, runs, since)
                    runs, s, c = [], 0.0, 0
                    used = [(lv.recent.sum, lv.count, lv.base) for lv in levels.values() if lv.count and lv.base]
                    emit(self.active.fire(akey, self._alert(server, rs.batch(e), st, used, ratio)), e)
                    firing = True
                elif action == "resolve":
                    emit(self.active.resolve(akey, t, ("recovered to baseline", f"{ratio:.0%}")), e)
                    firing = False
            if t0 is not None:
                runs.append((lv0, s, c))
                self._close(st, t0, runs, since)
        return []

    def baseline(self, server: str, rank: str, level: int) -> float | None:
        """Learned gen throughput (token/s) of the rank at that load level, once usable."""
        b = self._baselines.get((server, rank, level))
        return b.mean() if b is not None and b.count >= self.config.min_baseline_batches else None

    def _rank(self, key: tuple[str, str]) -> _Rank:
        st = self._ranks.get(key)
        if st is None:
            st = self._ranks[key] = _Rank()
        if not st.akey:  # new, or loaded with its pending time
            st.akey = alert_key(*key)
        return st

    def _level(self, st: _Rank, key: tuple[str, str], level: int) -> _Level:
        """A load level the rank had no line at before (its baseline maybe from the state file)."""
        learned = self._baselines.get((*key, level))
        lv = st.levels[level] = _Level(level, len(st.terms), Recent(self.config.window), learned)
        lv.base = self._usable(learned)
        st.terms.append(0.0)
        return lv

    def _open(self, st: _Rank, key: tuple[str, str], t: float) -> tuple[float, int]:
        """A new timestamp `t` of the rank: what every level's window ages out of, learned while
        the rank is healthy; returns the window average's (sum of sum / baseline, lines)."""
        healthy = st.low_since is None and st.akey not in self.active
        terms, n = st.terms, st.n
        limit = t - self.config.window  # every level's window spans `window` (`reconfigure` resizes them)
        for lv in st.levels.values():
            recent = lv.recent
            if recent.oldest <= limit:  # prune's test, inline
                aged = recent.prune(t)
                if healthy and aged:
                    learned = lv.learned
                    if learned is None:
                        learned = lv.learned = self._baselines.setdefault(
                            (*key, lv.level), Baseline(BASELINE_BUCKET, self.config.baseline_window))
                    for at, v, k in aged:
                        learned.add(at, v, k)
                    lv.base = learned.mean() if learned.count >= self.config.min_baseline_batches else None  # _usable
                base = lv.base  # this level's share of the window average
                if base:
                    count = recent.count
                    terms[lv.index] = recent.sum / base if count else 0.0
                else:
                    count = 0
                    terms[lv.index] = 0.0
                n += count - lv.count
                lv.count = count
        st.n = n
        return sum(terms), n

    @staticmethod
    def _close(st: _Rank, t: float, runs: list[tuple[int, float, int]], since: float | None) -> None:
        """The lines of timestamp `t` into their levels' windows: `runs`, (load level, gen
        throughput sum, lines) in line order; `since`, the pending time after the last one."""
        levels, terms, n = st.levels, st.terms, st.n
        for level, total, k in runs:
            if k:
                lv = levels[level]
                recent = lv.recent
                recent.add(t, total, k)
                base = lv.base
                if base:
                    n += k
                    lv.count += k
                    terms[lv.index] = recent.sum / base
        st.n = n
        st.low_since = since

    def _alert(self, server: str, b: DecodeBatch, st: _Rank, used: list[tuple[float, int, float]],
               ratio: float) -> Alert:
        cfg = self.config
        since = st.low_since
        assert since is not None  # it fired: the drop's pending time began
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
            starts_at=since,
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
