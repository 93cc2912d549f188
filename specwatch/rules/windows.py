"""Which decode lines are fair samples: the stage between the parser and the rules.

A `Decode batch` line summarises the decode rounds since the rank's previous one (every
`--decode-log-interval`, 40 by default, rounds: `scheduler.py` / `metrics_reporter.py`,
SGLang 0.5.x). It says nothing about the draft when no request was running (idle DP ranks print
such lines under DP attention), and its numbers have not converged when the window was dominated
by prefill: more prefill batches of the rank than decode rounds since the previous decode line.
Its `gen throughput` also counts idle and prefill time in the window, so throughput is only
compared on windows that follow the previous decode line closely.

The pipeline's summariser classifies each decode line once (`Pipeline._summarise`, the flags of
`rules/summary.py`); a `Window` is that classification of one line for code that reads lines one
at a time (an engine's /metrics samples: `rules/server_metrics.py`).
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from specwatch.core.sections import Count, Seconds, Section, rule_section
from specwatch.core.events import DecodeBatch


@rule_section("windows")
class WindowConfig(Section):
    """rules.windows: what makes a decode line a usable sample."""

    min_running_requests: Count = 1
    max_prefill_batches: Annotated[int, Meta(ge=0, le=1_000_000)] = 40  # SGLang's default --decode-log-interval
    max_gap: Seconds = 120.0


def running_in_window(running: int, draft_tokens: float | None) -> int:
    """The requests a decode line's window ran: the printed count, at least one when the window
    drafted tokens. vLLM prints `Running: N reqs` at the instant of the stats line
    (`LoggingStatLogger.log`, vllm/v1/metrics/loggers.py@0.33.0) and its `SpecDecoding metrics`
    only for an interval that drafted (vllm/v1/spec_decode/metrics.py@0.33.0): an interval that
    drafted hundreds of tokens can print `Running: 0` when its requests finished before the line."""
    return max(running, 1) if draft_tokens else running


class Window:
    """One decode line and what the window behind it was like. Read-only: rules share it.

    idle: fewer running requests than `min_running_requests` (`running_in_window`: a window
    that drafted tokens ran at least one). prefill_dominated: more prefill
    lines of this rank than `max_prefill_batches` since its previous decode line. after_gap: no
    previous decode line of the rank within `max_gap` seconds. gap: seconds since the rank's
    previous decode line (None for its first).

    acceptance_valid: the accept len of this line describes the draft under load.
    throughput_valid: the gen throughput of this line describes steady decoding.
    (Plain attributes computed once, not properties: several rules read them for every line.)
    """

    __slots__ = ("batch", "idle", "prefill_dominated", "after_gap", "gap", "prefill_batches",
                 "acceptance_valid", "throughput_valid")

    def __init__(self, batch: DecodeBatch, idle: bool, prefill_dominated: bool, after_gap: bool,
                 gap: float | None, prefill_batches: int):
        self.batch = batch
        self.idle = idle
        self.prefill_dominated = prefill_dominated
        self.after_gap = after_gap
        self.gap = gap
        self.prefill_batches = prefill_batches
        loaded = not idle and not prefill_dominated
        self.acceptance_valid = loaded and batch.accept_length is not None
        self.throughput_valid = loaded and not after_gap and batch.gen_throughput is not None

    def __repr__(self) -> str:
        return (f"Window(rank={self.batch.rank!r}, idle={self.idle}, prefill_dominated={self.prefill_dominated}, "
                f"after_gap={self.after_gap}, gap={self.gap}, prefill_batches={self.prefill_batches})")
