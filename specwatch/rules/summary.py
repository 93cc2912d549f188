"""The summariser: every batch line of a rank, once, into what every rule reads.

The pipeline hands each decode and prefill line here, whichever parser read it (the chunk scanner
of canonical SGLang lines, `engines.sglang.log.parse_line`, vLLM's assembler). Per line it does
only what needs the line itself: the rank's counters and last line, the window classification of
`rules/windows.py` (idle, prefill-dominated, after a gap), and one entry in the rank's `pending`
list. The rules read the pending lines of every rank that has some at the next evaluation
(`Pipeline.evaluate`: before the clock ticks, before any other event reaches the rules, and at
the end of a live read), each rule in one hook (`Rule.on_lines`), in aggregate where the order
of lines does not matter and line by line where it does (a run of low batches).

A pending entry is a tuple `(ts, clock, accept, running, queued, throughput, flags, src, seq)`:
ts the line's timestamp (s), clock the rules' clock for it (the read's wall time in `run`, ts in
`replay`), accept the accept len (None: no draft ran), running / queued requests, throughput the
gen throughput (token/s, None when not printed), flags the `VALID_*` / `IDLE` / `PREFILL_DOMINATED`
/ `AFTER_GAP` bits, src the line's source (`RankSummary.batch(entry)` builds its DecodeBatch), seq
its place among all batch lines read (file order across ranks). A pending prefill is `(ts, clock,
seq, src)` (`prefill_counts(entry)` reads its running / queued requests).
"""

from __future__ import annotations

import math

from specwatch.core.events import DecodeBatch
from specwatch.engines.sglang.log import decode_at
from specwatch.status.history import AcceptHistory

# bits of a pending entry's flags (`rules/windows.Window`'s booleans)
VALID_ACCEPT = 1  # acceptance_valid: the accept len describes the draft under load
VALID_THROUGHPUT = 2  # throughput_valid: the gen throughput describes steady decoding
IDLE = 4
PREFILL_DOMINATED = 8
AFTER_GAP = 16

TS, CLOCK, ACCEPT, RUNNING, QUEUED, THROUGHPUT, FLAGS, SRC, SEQ = range(9)  # a pending entry's fields


class RankSummary:
    """Everything specwatch knows about one (server, rank) from its batch lines.

    server, rank (tokens as printed), ranks ({"DP": 0, ...}); decode_batches / prefill_batches:
    lines read; accept_length_sum / _count / _min / _max over its decode lines with an accept
    len; last_ts: timestamp of its last decode line (None before one); prefills: its prefill lines
    since that line; pending: its decode lines since the last evaluation (entries, see the module);
    pending_prefills: (ts, clock, seq, src) of its prefill lines since then; history: the status page's chart;
    seen: the clock of its last batch line (set at each evaluation; None: not yet in this process).
    """

    __slots__ = ("server", "rank", "ranks", "decode_batches", "prefill_batches", "accept_length_sum",
                 "accept_length_count", "accept_length_min", "accept_length_max", "history", "last_ts",
                 "prefills", "pending", "pending_prefills", "_last", "_last_batch", "key", "sum0", "count0", "seen")

    def __init__(self, server: str, rank: str, ranks: dict[str, int]):
        self.server, self.rank, self.ranks = server, rank, ranks
        self.key = (server, rank)
        self.decode_batches = self.prefill_batches = 0
        self.accept_length_sum = 0.0
        self.accept_length_count = 0
        self.accept_length_min = math.inf
        self.accept_length_max = -math.inf
        self.history = AcceptHistory()
        self.last_ts: float | None = None
        self.prefills = 0
        self.pending: list[tuple] = []
        self.pending_prefills: list[tuple] = []
        self._last: tuple | None = None  # the last decode line's entry
        self.sum0, self.count0 = 0.0, 0  # accept_length_sum / _count before the first pending line
        self._last_batch: DecodeBatch | None = None
        self.seen: float | None = None  # the clock of its last batch line read by this process (rank expiry)

    def add_accept(self, a: float) -> None:
        """A decode line's accept length into the running sum, count, min and max."""
        self.accept_length_sum += a
        self.accept_length_count += 1
        if a < self.accept_length_min:
            self.accept_length_min = a
        if a > self.accept_length_max:
            self.accept_length_max = a

    def batch(self, entry: tuple) -> DecodeBatch:
        """The DecodeBatch of a pending entry: its event, or built from the line's groups. A line
        summed into another rank (OTHER_RANK) carries that rank."""
        src = entry[SRC]
        b = src if type(src) is not tuple else decode_at(src, entry[TS])
        if b.rank != self.rank:
            b.rank, b.ranks = self.rank, {}
        return b

    @property
    def last_decode(self) -> DecodeBatch | None:
        """The last decode line (built on first read)."""
        b = self._last_batch
        if b is None and self._last is not None:
            b = self._last_batch = self.batch(self._last)
        return b

    @last_decode.setter
    def last_decode(self, batch: DecodeBatch | None) -> None:
        self._last_batch = batch
        self._last = None if batch is None else (batch.timestamp, None, None, None, None, None, 0, batch, 0)



# The rank labels of every per-rank series (specwatch/core/metrics.py, the rules' own families).
RANK_LABELS = ("server", "dp_rank", "tp_rank", "pp_rank", "ep_rank", "engine")
OTHER_RANK = "other"  # the rank the lines of ranks past `limits.max_ranks_per_server` are summed into


def rank_label_values(server: str, ranks: dict[str, int], engine: str = "sglang", rank: str | None = None) -> list[str]:
    """The values of RANK_LABELS. `ranks`: the line's rank tokens ({"DP": 0, "TP": 0}; an absent
    token is ""); `engine`: the server's engine ("sglang", "vllm": `DecodeBatch.engine`); `rank`
    OTHER_RANK: every rank label "other"."""
    if rank == OTHER_RANK:
        return [server] + [OTHER_RANK] * 4 + [engine]
    return [server] + [str(ranks[t]) if t in ranks else "" for t in ("DP", "TP", "PP", "EP")] + [engine]


def prefill_counts(entry: tuple) -> tuple[int, int]:
    """(#running-req, #queue-req) of a pending prefill: its event's, or read from a canonical
    line's groups (`sglang_log.CANONICAL_LINES`: groups 15 and 16)."""
    src = entry[3]
    if type(src) is tuple:
        return int(src[15]), int(src[16])
    return src.running_requests, src.queued_requests

