"""What the rules make of an engine's /metrics samples (`MetricsSample`, sources/server_metrics.py).

Two jobs:

* **Collapse from /metrics alone.** While a server's logs give no decode line (none within
  `rules.windows.max_gap`: no log configured, or one that cannot be read), each fresh rank sample
  becomes one window for the collapse rule (`metrics_windows`), judged like a decode line: idle
  (fewer running requests than `rules.windows.min_running_requests`) and intervals without drafts
  say nothing and neither count nor break a run. With a log, the log decides.
* **Cross-check** (`rules.metrics_crosscheck`): where a log and /metrics describe the same server,
  the accept length of each fresh rank sample is compared with the log's new decode lines of the
  same rank (ranks matched by number: `DP0 TP0` in a log is `dp_rank="0", tp_rank="0"`; an absent token
  is 0). SGLang's gauge carries the value of one decode-log interval, vLLM's counters cover the
  scrape interval: a sample disagrees when it is more than `max_difference` away from every log
  line read since the previous comparison (and the one before them, which the follower may not
  have passed yet). `intervals` disagreeing samples in a row fire a warning naming both values;
  as many agreeing ones resolve it.
"""

from __future__ import annotations

import dataclasses

from collections import deque
from typing import TYPE_CHECKING, Annotated, Iterable, Iterator

from msgspec import Meta

from specwatch.alerts.model import FIRING, Alert
from specwatch.core.sections import Count, Seconds, Section, rule_section
from specwatch.core.events import DecodeBatch, MetricsSample, RankMetrics
from specwatch.rules.active import ActiveAlertsRule
from specwatch.rules.base import alert_key, fmt, new_alert, register
from specwatch.rules.summary import ACCEPT, CLOCK, FLAGS, VALID_ACCEPT
from specwatch.rules.windows import Window, WindowConfig, running_in_window

if TYPE_CHECKING:  # annotations only: rule files never import config.py
    from specwatch.config import Config


def metrics_windows(sample: MetricsSample, cfg: WindowConfig) -> Iterator[tuple[RankMetrics, Window]]:
    """Each rank sample of `sample` that describes decoding since the previous scrape, as a
    Window over a DecodeBatch (timestamp: the scrape). No drafts or a stale gauge: nothing."""
    if sample.error is not None:
        return
    for rm in sample.ranks:
        if not rm.fresh or rm.accept_length is None:
            continue
        running = running_in_window(rm.running_requests, rm.draft_tokens) if rm.running_requests is not None else 1  # drafts were made
        batch = DecodeBatch(sample.timestamp, rm.rank, dict(rm.ranks), {}, running, rm.queued_requests or 0,
                            accept_length=rm.accept_length, accept_rate=rm.accept_rate,
                            gen_throughput=rm.gen_throughput, engine=sample.engine or "sglang")
        yield rm, Window(batch, running < cfg.min_running_requests, False, False, None, 0)


def collapse_from_metrics(collapse, server: str, sample: MetricsSample, cfg: WindowConfig,
                          log_ranks: Iterable[tuple[str, dict[str, int]]] = ()) -> list[Alert]:
    """Feed the collapse rule (`CollapseRule.observe`) from a sample; the transitions it returns.
    A firing alert says where its numbers come from. `log_ranks`: (name, numbers) of the ranks the
    server's log named; a /metrics rank with the same numbers takes the log's name (`DP0 TP0`, not
    /metrics' `DP0`), so the log resolves what /metrics fired when it comes back, and back."""
    out = []
    known = list(log_ranks)
    for _, window in metrics_windows(sample, cfg):
        b = window.batch
        name = next(((n, r) for n, r in known if ranks_match(r, b.ranks)), None)
        if name is not None and name[0] != b.rank:
            b = dataclasses.replace(b, rank=name[0], ranks=dict(name[1]))
            window = Window(b, window.idle, window.prefill_dominated, window.after_gap, window.gap,
                            window.prefill_batches)
        alert = collapse.observe(server, window)
        if alert is None:
            continue
        if alert.status == FIRING:
            alert.evidence.append(("read from", f"{sample.url} ({sample.engine}): no decode line from a log "
                                                f"within {cfg.max_gap:g}s; each scrape counts as one decode batch"))
        out.append(alert)
    return out


def ranks_match(a: dict[str, int], b: dict[str, int]) -> bool:
    """Same rank by number: every token of either equal in both (absent = 0)."""
    return all(a.get(t, 0) == b.get(t, 0) for t in a.keys() | b.keys())


@rule_section("metrics_crosscheck")
class MetricsCrossCheckConfig(Section):
    """rules.metrics_crosscheck: fire after `intervals` scrapes whose accept length is more than
    `max_difference` from the log's; log lines older than `max_age` are not compared."""

    enabled: bool = True
    max_difference: Annotated[float, Meta(ge=0.01, le=100.0)] = 0.3
    intervals: Count = 3
    max_age: Seconds = 60.0


ALERT_NAME = "MetricsLogDisagreement"
_KEEP = 64  # log lines kept per rank between two scrapes (a 5 s scrape, 8 lines/s at most)


class _LogRank:
    __slots__ = ("ranks", "lines", "compared_at")

    def __init__(self, ranks: dict[str, int]):
        self.ranks = ranks
        self.lines: deque[tuple[float, float]] = deque(maxlen=_KEEP)  # (clock, accept len)
        self.compared_at = float("-inf")


@register
class MetricsCrossCheckRule(ActiveAlertsRule):
    name = "metrics_crosscheck"
    alert_names = (ALERT_NAME,)
    order = 110

    @classmethod
    def build(cls, config: Config, ctx) -> "MetricsCrossCheckRule":
        rule = cls(config.metrics_crosscheck)
        rule.watching = bool(config.server_metrics)  # restart-only: no /metrics, no log lines kept
        return rule

    def __init__(self, config: MetricsCrossCheckConfig):
        super().__init__()
        self.config = config
        self.watching = True
        self._log: dict[tuple[str, str], _LogRank] = {}  # (server, log rank) → its recent lines
        self._runs: dict[str, list] = {}  # alert key → [disagreeing in a row, agreeing in a row, since]

    def reconfigure(self, config: Config) -> None:
        self.config = config.metrics_crosscheck

    def on_lines(self, server: str, ranks: list, emit) -> list[Alert]:
        """The (clock, accept len) of each rank's pending decode lines with VALID_ACCEPT
        (`rules/summary.py`), in line order, for the next scrape to compare with. A scrape comes
        as an event, after the evaluation of the lines read before it: the same lines as one
        at a time."""
        if not self.watching:
            return []
        for rs in ranks:
            got = [(e[CLOCK], e[ACCEPT]) for e in rs.pending if e[FLAGS] & VALID_ACCEPT]
            if got:
                lr = self._log.get(rs.key)
                if lr is None:
                    lr = self._log[rs.key] = _LogRank(dict(rs.ranks))
                lr.lines.extend(got)
        return []

    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        if type(event) is not MetricsSample or not self.config.enabled or event.error is not None:
            return []
        out = []
        for rm in event.ranks:
            if not rm.fresh or rm.accept_length is None or (rm.running_requests is not None
                                                          and running_in_window(rm.running_requests, rm.draft_tokens) < 1):
                continue
            found = self._log_values(server, rm, now)
            if found is not None:
                out += self._judge(server, event, rm, *found, now)
        return out

    def _log_values(self, server: str, rm: RankMetrics, now: float) -> tuple[str, list[float]] | None:
        """(log rank, the accept lens to compare with) of the log rank matching `rm`; None when
        the log gave no line of it since the previous comparison (or its newest is older than
        max_age)."""
        for (s, rank), lr in self._log.items():
            if s != server or not ranks_match(lr.ranks, rm.ranks) or not lr.lines:
                continue
            since = [a for t, a in lr.lines if t > lr.compared_at]
            if not since or now - lr.lines[-1][0] > self.config.max_age:
                return None  # no line of the log since the last comparison: nothing to compare with
            before = [a for t, a in lr.lines if t <= lr.compared_at][-1:]
            lr.compared_at = lr.lines[-1][0]
            return rank, before + since
        return None

    def _judge(self, server: str, sample: MetricsSample, rm: RankMetrics, log_rank: str, values: list[float],
               now: float) -> list[Alert]:
        cfg = self.config
        key = alert_key(server, rm.rank)
        run = self._runs.setdefault(key, [0, 0, now])
        accept = rm.accept_length
        assert accept is not None  # on_event judges only samples with one
        nearest = min(values, key=lambda v: abs(v - accept))
        if abs(nearest - accept) > cfg.max_difference:
            if run[0] == 0:
                run[2] = now
            run[0], run[1] = run[0] + 1, 0
            if run[0] >= cfg.intervals and key not in self.active:
                return self.active.fire(key, self._alert(server, sample, rm, log_rank, values[-1], run))
            alert = self.active.get(key)
            if alert is not None:  # keep the numbers of a firing alert current
                alert.evidence[:2] = self._values(sample, rm, log_rank, values[-1])
        else:
            run[0], run[1] = 0, run[1] + 1
            if run[1] >= cfg.intervals:
                return self.active.resolve(key, now, ("agree again", f"log {fmt(nearest)}, /metrics {fmt(rm.accept_length)}"))
        return []

    @staticmethod
    def _values(sample: MetricsSample, rm: RankMetrics, log_rank: str, log_value: float) -> list[tuple[str, str]]:
        return [(f"accept len in the log ({log_rank or 'no rank prefix'})", fmt(log_value)),
                (f"accept len from {sample.url} ({sample.engine})", fmt(rm.accept_length))]

    def _alert(self, server: str, sample: MetricsSample, rm: RankMetrics, log_rank: str, log_value: float,
               run: list) -> Alert:
        cfg = self.config
        where = f"{server} {rm.rank}".strip()
        return new_alert(
            ALERT_NAME, "warning", server, rm.rank,
            summary=f"Log and /metrics disagree on {where}: accept len {log_value:.2f} in the log, "
                    f"{rm.accept_length:.2f} from /metrics",
            description=(f"For {run[0]} scrapes in a row the accept length {sample.engine} exports at {sample.url} "
                         f"differed by more than {cfg.max_difference:g} from every decode line of the log for the "
                         "same rank. Both describe the same decoding, so one of them is not this server: the "
                         "collapse rule reads the log and may be judging the wrong server."),
            starts_at=run[2],
            evidence=self._values(sample, rm, log_rank, log_value) + [("scrapes in a row", str(run[0]))],
            fixes=[
                "Check that `logs[].server` and `server_metrics[].server` name the same server: the followed "
                "file may be another server's log (another port, an old run), or the URL another server's /metrics "
                f"(`curl -s {sample.url} | grep -E 'spec_accept|spec_decode'`).",
                "A restart in between (a counter reset, a new `server_args` line) makes the two describe different "
                "processes for one interval; a disagreement that stays is not that.",
                "Several servers writing into one log file mix their ranks' lines: give each server its own file.",
            ])

    def to_state(self) -> dict:
        return {**super().to_state(), "runs": self._runs}

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        self._runs.update({k: list(v) for k, v in (state.get("runs") or {}).items()})
