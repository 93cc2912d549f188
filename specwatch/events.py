"""Plain events that flow from sources to metrics and rules.

Sources produce these; nothing here knows about Prometheus, rules or Slack.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Rank tokens SGLang puts in the bracket prefix, as printed (sglang.md §1.2).
RANK_TOKENS = ("DP", "PP", "ATTN_CP", "MOE_DP", "TP", "EP")


@dataclass(frozen=True, slots=True)
class LogLine:
    """One complete line read from a followed file.

    `text` is decoded UTF-8 without the trailing newline; `raw_ok` is False when the bytes were
    not valid UTF-8 (they were decoded with replacement characters).
    `path` is the followed path (not the rotated name), `offset` the byte offset of the line start.
    """

    path: str
    text: str
    offset: int = 0
    raw_ok: bool = True


@dataclass(slots=True)
class BatchLine:
    """Fields shared by decode and prefill lines.

    `timestamp` is seconds since the epoch (the log's local time, converted), `rank` the rank
    tokens exactly as printed (e.g. "DP0 TP0", "" on a single GPU), `ranks` the parsed numbers by
    token name, `fields` every `name: value` pair of the line as text, by name.
    """

    timestamp: float
    rank: str
    ranks: dict[str, int]
    fields: dict[str, str]
    running_requests: int
    queued_requests: int
    token_usage: float | None = None
    graph_enabled: bool | None = None
    graph_kind: str | None = None  # "cuda", "cpu", "npu", "musa"
    forward_iteration: int | None = None


@dataclass(slots=True)
class DecodeBatch(BatchLine):
    """A `Decode batch` line (sglang.md §1.5). Rates are per decode-log interval.

    accept_length: tokens per request per verify round, >= 1.0 (1.0 = no draft token accepted).
    accept_rate: version-dependent meaning (sglang.md §1.6); never used to decide a collapse.
    gen_throughput: generated tokens per second since the previous decode line.
    """

    accept_length: float | None = None
    accept_rate: float | None = None
    gen_throughput: float | None = None
    num_tokens: int | None = None


@dataclass(slots=True)
class PrefillBatch(BatchLine):
    """A `Prefill batch` line (sglang.md §1.7)."""

    new_seq: int | None = None
    new_token: int | None = None
    cached_token: int | None = None
    input_throughput: float | None = None


@dataclass(slots=True)
class ServerArgs:
    """Speculative settings read from the startup `server_args=ServerArgs(...)` line.

    Values are kept as Python literals where they parse (int, str, None, bool).
    """

    timestamp: float | None
    args: dict[str, object] = field(default_factory=dict)

    @property
    def speculative_algorithm(self) -> str | None:
        v = self.args.get("speculative_algorithm")
        return str(v) if v is not None else None


@dataclass(frozen=True, slots=True)
class OtherLine:
    """Any line that is not a batch line: request logs, access logs, tracebacks, progress bars."""


@dataclass(frozen=True, slots=True)
class MalformedLine:
    """A line that starts like a batch line but cannot be read. `reason` says why."""

    reason: str
    timestamp: float | None = None
    rank: str = ""


ParsedLine = DecodeBatch | PrefillBatch | ServerArgs | OtherLine | MalformedLine
