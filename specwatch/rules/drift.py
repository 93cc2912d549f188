"""Slow drift: accept len falling steadily over hours while the server runs; a restart resets it.

The pattern of an engine-state bug (BR-13 in docs/bugreports.md: a prefix-cache race took accept len
from 3.07 to 2.8 over hours; only a restart restored it). Per (server, rank), valid decode lines
(not idle, not prefill-dominated, above collapse level) are averaged in `bucket`-long buckets;
buckets with at least `min_bucket_batches` lines within the last `window` are fitted with a
least-squares line. The rule fires when, over at least `min_buckets` buckets:

- the fitted decline is at least `min_decline_per_hour` of the fitted starting value per hour,
- the fitted total decline over the span is at least `min_total_decline` of that value, and
- at least `min_falling_fraction` of consecutive bucket means went down (steady, not one step).

Bucket indexes only grow: a line stamped before the open bucket (lines out of order) counts in the
open bucket, so the fit never sees two buckets at one time.

It resolves when the fitted decline falls under half `min_decline_per_hour`, or on a restart:
a new `server_args` line, a restart seen by the process source (`ServerRestarted`, or
`ServerStarted` after the server was down), or no decode line of the rank for `restart_gap`. A
restart clears the history, since the drift is expected to start over.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, ClassVar

from msgspec import Meta

from specwatch.alerts.model import Alert
from specwatch.core.sections import Bound, Count, Ratio, Seconds, Section, rule_section
from specwatch.core.events import DecodeBatch, ServerArgs
from specwatch.rules.active import ActiveAlerts
from specwatch.rules.base import (Rule, RuleContext, ServerArgsMemory, alert_key, args_evidence, fmt, new_alert,
                                  register)
from specwatch.rules.collapse import CollapseConfig
from specwatch.rules.stats import linear_fit
from specwatch.rules.summary import ACCEPT, FLAGS, TS, VALID_ACCEPT

if TYPE_CHECKING:  # annotations only: rule files never import config.py
    from specwatch.config import Config


@rule_section("drift")
class DriftConfig(Section):
    """rules.drift. `window` must hold `min_buckets` buckets of `bucket` seconds; where the
    written keys leave an unwritten one's default too small or too large, it follows them:
    window becomes bucket × min_buckets, else bucket becomes window / min_buckets, else
    min_buckets the buckets that fit in window; all three written and not fitting is refused."""

    enabled: bool = True
    window: Seconds = 4 * 3600.0
    bucket: Seconds = 600.0
    min_buckets: Annotated[int, Meta(ge=3, le=10_000)] = 6
    min_bucket_batches: Count = 3
    min_decline_per_hour: Ratio = 0.03
    min_total_decline: Ratio = 0.05
    min_falling_fraction: Ratio = 0.7
    restart_gap: Seconds = 1800.0
    default_bounds: ClassVar = (
        Bound("window", "at_least", ("bucket", "min_buckets"), lambda c: c.bucket * c.min_buckets),
        Bound("bucket", "at_most", ("window", "min_buckets"), lambda c: c.window / c.min_buckets),
        # 1e-9: 0.3 / 0.1 is 2.9999999999999996
        Bound("min_buckets", "at_most", ("window", "bucket"), lambda c: math.floor(c.window / c.bucket + 1e-9)))

    def problems(self):
        if self.window < self.bucket * self.min_buckets:
            yield "window", (f"must hold min_buckets ({self.min_buckets}) buckets of bucket ({self.bucket:g}s); "
                             f"make it at least {self.bucket * self.min_buckets:g}s, or bucket at most "
                             f"{self.window / self.min_buckets:g}s")


ALERT_NAME = "AcceptanceDrift"


@register
class DriftRule(Rule):
    name = "drift"
    alert_names = (ALERT_NAME,)
    order = 60

    @classmethod
    def build(cls, config: Config, ctx: RuleContext) -> "DriftRule":
        return cls(config.drift, config.collapse)

    def __init__(self, config: DriftConfig, collapse: CollapseConfig | None = None):
        self.config = config
        self.collapse_max = (collapse or CollapseConfig()).max_accept_length
        self.args = ServerArgsMemory()
        # (server, rank) → buckets [[index, sum, count], ...], oldest first (the last one open)
        self._buckets: dict[tuple[str, str], list[list[float]]] = {}
        self._last_seen: dict[tuple[str, str], float] = {}
        self.active = ActiveAlerts()

    def reconfigure(self, config: Config) -> None:
        if config.drift.bucket != self.config.bucket:
            self._buckets.clear()  # indexes of the old bucket size: start over (alerts stay firing)
        self.config = config.drift
        self.collapse_max = config.collapse.max_accept_length

    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        if self.config.enabled and isinstance(event, ServerArgs):
            self.args.observe(server, event)
        return []

    def on_restart(self, server: str, at: float, why: str) -> list[Alert]:
        if not self.config.enabled:
            return []
        firing = [k.partition("|") for k in self.active.keys()]  # alert_key(server, rank)
        return self._reset([k for k in self._buckets if k[0] == server]
                           + [(s, rank) for s, _, rank in firing if s == server], at, "server restarted")

    def on_lines(self, server: str, ranks: list, emit) -> list[Alert]:
        """The pending decode lines of each rank (`rules/summary.py`), in line order: every line
        dates the rank's last decode line (a silence of `restart_gap` before one resets the
        rank); those with VALID_ACCEPT above collapse level go into their bucket, summed in a
        local variable one line at a time as line by line (the same sum), and a line that opens
        a new bucket has the closed ones judged. Exactly the decisions of one line at a time."""
        cfg = self.config
        if not cfg.enabled:
            return []
        cmax, width, gap = self.collapse_max, cfg.bucket, cfg.restart_gap
        floor = math.floor
        for rs in ranks:
            p = rs.pending
            if not p:
                continue
            key = rs.key
            last = self._last_seen.get(key)
            buckets = self._buckets.get(key)
            ob = buckets[-1] if buckets else None  # the open bucket: its sum and count in s, c
            s, c = (ob[1], ob[2]) if ob else (0.0, 0)
            t0: float | None = None
            idx = 0  # set by the first line that counts (t0 is None then)
            for e in p:
                t = e[TS]
                if last is not None and t - last > gap:
                    if ob:
                        ob[1], ob[2] = s, c
                    emit(self._reset([key], t, f"no decode line for {t - last:.0f}s"), e)
                    buckets = ob = None
                last = t
                if not (e[FLAGS] & VALID_ACCEPT and e[ACCEPT] > cmax):
                    continue
                if t != t0:
                    t0, idx = t, floor(t / width)
                if ob and idx <= ob[0]:  # the open bucket; a line stamped before it (out of order) too
                    s += e[ACCEPT]
                    c += 1
                    continue
                if buckets is None:  # none yet, or reset above (ob None then)
                    buckets = self._buckets[key] = []
                elif ob:
                    ob[1], ob[2] = s, c
                closed = bool(buckets)
                ob = [idx, e[ACCEPT], 1]
                s, c = ob[1], 1
                buckets.append(ob)
                horizon = idx - cfg.window / cfg.bucket
                while buckets and buckets[0][0] <= horizon:
                    buckets.pop(0)
                if closed:
                    alerts = self._evaluate(server, rs.rank, t, buckets[:-1], rs, e)
                    if alerts:
                        emit(alerts, e)
            if ob:
                ob[1], ob[2] = s, c
            self._last_seen[key] = p[-1][TS]  # last
        return []

    def _reset(self, keys: list[tuple[str, str]], at: float, why: str) -> list[Alert]:
        out = []
        for k in dict.fromkeys(keys):
            self._buckets.pop(k, None)
            out += self.active.resolve(alert_key(*k), at, ("reset", why))
        return out

    def trend(self, buckets: list[list[float]]) -> dict | None:
        """Fit of the closed buckets: start/end value, decline per hour and in total (fractions
        of the start value), falling fraction, r²; None when there are too few buckets."""
        cfg = self.config
        full = [bk for bk in buckets if bk[2] >= cfg.min_bucket_batches]
        if len(full) < cfg.min_buckets:
            return None
        hours = [(bk[0] + 0.5) * cfg.bucket / 3600.0 for bk in full]
        means = [bk[1] / bk[2] for bk in full]
        try:
            slope, intercept, r2 = linear_fit(hours, means)
        except ValueError:  # one bucket index only (state saved by a version that repeated indexes)
            return None
        start, end = intercept + slope * hours[0], intercept + slope * hours[-1]
        if start <= 0:
            return None
        falls = sum(1 for a, c in zip(means, means[1:]) if c < a)
        return {"start": start, "end": end, "per_hour": -slope / start, "total": (start - end) / start,
                "falling": falls / (len(means) - 1), "r2": r2, "buckets": len(full),
                "span_h": hours[-1] - hours[0], "means": means}

    def _evaluate(self, server: str, rank: str, at: float, closed: list[list[float]], rs, entry: tuple) -> list[Alert]:
        """The fit of the rank's closed buckets at the line (pending `entry` of `rs`, stamped
        `at`) that opened a new one; its DecodeBatch is built only for an alert."""
        cfg = self.config
        key = alert_key(server, rank)
        t = self.trend(closed)
        if t is None:
            return []
        if key in self.active:
            if t["per_hour"] < cfg.min_decline_per_hour / 2:
                return self.active.resolve(key, at, ("decline now", f"{t['per_hour']:.1%}/h"))
            return []
        if (t["per_hour"] >= cfg.min_decline_per_hour and t["total"] >= cfg.min_total_decline
                and t["falling"] >= cfg.min_falling_fraction):
            return self.active.fire(key, self._alert(server, rs.batch(entry), t))
        return []

    def _alert(self, server: str, b: DecodeBatch, t: dict) -> Alert:
        cfg = self.config
        where = f"{server} {b.rank}".strip()
        evidence = [
            ("accept len, fitted", f"{t['start']:.2f} → {t['end']:.2f} over {t['span_h']:.1f}h"),
            ("decline", f"{t['per_hour']:.1%} per hour, {t['total']:.1%} in total"),
            ("buckets falling", f"{t['falling']:.0%} of {t['buckets'] - 1} steps"),
            (f"{cfg.bucket / 60:g}-minute means", " ".join(fmt(m) for m in t["means"][-12:])),
            ("fit r²", fmt(t["r2"])),
        ] + args_evidence(self.args.get(server))
        return new_alert(
            ALERT_NAME, "warning", server, b.rank,
            summary=f"Accept len drifting down on {where}: {t['start']:.2f} → {t['end']:.2f} "
                    f"({t['per_hour']:.1%}/h over {t['span_h']:.1f}h)",
            description=(
                "Speculative acceptance has been falling steadily for hours while the server kept running. "
                "A drift that a restart resets points at state that builds up inside the engine (caches, "
                "allocators), not at the draft model."
            ),
            starts_at=b.timestamp - t["span_h"] * 3600.0,
            evidence=evidence,
            fixes=[
                "Prefix cache: a race that reused KV blocks before they were written made accept len sink "
                "over hours for high-volume prompt types (vllm-project/vllm#41838). Compare with `--disable-radix-cache` on "
                "one server, and upgrade SGLang.",
                "Confirm the reset: restart this server during a quiet period and check that accept len "
                "returns to its start value (specwatch resets this rule on restart).",
                "Traffic shift: a change of prompt mix over the day also moves accept len; compare the "
                "request mix (request logs) between the start and the end of the span before blaming "
                "the engine.",
            ],
        )

    def to_state(self) -> dict:
        return {"buckets": [[list(k), v] for k, v in self._buckets.items()],
                "last_seen": [[list(k), v] for k, v in self._last_seen.items()],
                "active": self.active.to_state(), "args": self.args.to_state()}

    def load_state(self, state: dict) -> None:
        self._buckets.update({tuple(k): [list(b) for b in v] for k, v in state.get("buckets", [])})
        self._last_seen.update({tuple(k): v for k, v in state.get("last_seen", [])})
        self.active.load_state(state.get("active", {}))
        self.args.load_state(state.get("args", {}))
