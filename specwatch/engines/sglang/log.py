"""The SGLang log grammar: one line of text in, one event out.

`parse_line` is a pure function: it never logs and never raises on input. It reads every
`Decode batch` / `Prefill batch` form SGLang printed from 0.4.6.post1 to 0.5.23 and the startup
`server_args=ServerArgs(...)` line (printing code: `sglang/srt/managers/scheduler_components/
metrics_reporter.py@0.5.23`, `sglang/srt/observability/scheduler_metrics_mixin.py@0.5.11` and their
predecessors `managers/scheduler_metrics_mixin.py` (0.4.10.post2-0.5.9) and `managers/scheduler.py`
(0.4.6.post1, 0.4.9); prefix format: `configure_logger`, `sglang/srt/utils/common.py@0.5.23`).

Line layout::

    [container prefix] [Ray prefix] "[" YYYY-MM-DD HH:MM:SS[.mmm] [ RANK<n>]* "] " message

A line is a batch line only when the bracket prefix starts it (after an optional container prefix
such as `sglang-1  | ` and an optional Ray actor prefix `(Name pid=1, ip=1.2.3.4) `), and the
message starts with `Decode batch` or `Prefill batch`. Request logs carry user text that can
contain a whole decode line, so the text is never searched anywhere else in a line.

Fields are `name: value` pairs joined by ", " and are matched by name, so a field SGLang adds
later does not break the line. A batch line must carry both `#running-req` and `#queue-req`
(every version prints them); without them, or with an unreadable value in a known field, the
line was cut short or garbled and is returned as `MalformedLine`.
"""

from __future__ import annotations

import ast
import math
import re
from datetime import datetime, tzinfo

from specwatch.system import pyast
from specwatch.core.events import (
    DecodeBatch,
    MalformedLine,
    OtherLine,
    ParsedLine,
    PrefillBatch,
    ServerArgs,
    UnrecognizedLine,
)
from specwatch.sources.container import strip_container_prefix

_OTHER = OtherLine()

# "[2026-01-01 12:00:00.123 DP0 TP0] " — ms optional (SGLANG_LOG_MS, 0.5.6+), rank tokens optional.
_PREFIX = re.compile(
    r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,](\d{1,6}))?((?: [A-Z][A-Z_]*\d+)*)\] "
)
# "(SchedulerActor pid=123, ip=10.0.0.1) " — Ray actor prefix (debug_utils/log_parser.py@0.5.23).
_RAY = re.compile(r"\([\w.-]+ pid=\d+(?:, ip=[\w.:]+)?\) ")
_RANK = re.compile(r"([A-Z][A-Z_]*?)(\d+)")
# The common case in one match: the bracket prefix followed by a batch-line start.
_BATCH = re.compile(
    r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,](\d{1,6}))?((?: [A-Z][A-Z_]*\d+)*)\] "
    r"(Decode|Prefill) batch(?:\.|(?: \[(\d+)\])?,) "
)
# "Decode batch." (<=0.5.3.post3), "Decode batch [12]," (0.5.4, or SGLANG_LOG_FORWARD_ITERS),
# "Decode batch," (0.5.5+).

# The speculative CUDA decode line of SGLang 0.5.5+ exactly as printed (field order of
# `metrics_reporter.py` / `scheduler_metrics_mixin.py`, 0.5.5-0.5.23), read in one match: most
# lines of a busy server are this one, so it skips the general field split.
_CANONICAL_DECODE = re.compile(
    r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,](\d{1,6}))?((?: [A-Z][A-Z_]*\d+)*)\] Decode batch, "
    r"#running-req: (\d+), #token: (\d+), token usage: (\d+\.\d+), accept len: (\d+\.\d+), "
    r"accept rate: (\d+\.\d+), cuda graph: (True|False), gen throughput \(token/s\): (\d+\.\d+), "
    r"#queue-req: (\d+)[, \r]*\Z"
)
# The prefill line of SGLang 0.5.10+ (`cuda graph` before `input throughput`; `#pending-token`
# since 0.5.11: `scheduler_metrics_mixin.py`), likewise.
_CANONICAL_PREFILL = re.compile(
    r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,](\d{1,6}))?((?: [A-Z][A-Z_]*\d+)*)\] Prefill batch, "
    r"#new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+), token usage: (\d+\.\d+), "
    r"#running-req: (\d+), #queue-req: (\d+), (?:#pending-token: (\d+), )?cuda graph: (True|False), "
    r"input throughput \(token/s\): (\d+\.\d+)[, \r]*\Z"
)


_GRAPH_KEYS = ("cuda graph", "cpu graph", "npu graph", "musa graph")

# server_args keys specwatch uses (`ServerArgs` fields: sglang/srt/server_args.py 0.5.11,
# sglang/srt/arg_groups/fields/*.py 0.5.23); the rest of the line is kept too when it parses.
SERVER_ARG_KEYS = (
    "model_path",
    "served_model_name",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "decode_log_interval",
    "tp_size",
    "dp_size",
    "pp_size",
    "ep_size",
    "log_level",
    "enable_metrics",
    "disaggregation_mode",
    "port",
)
_ARG_VALUE = re.compile(r"\b(\w+)=('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^,()\[\]{}]+)")

# Lines come in time order, so a minute of seconds is plenty; a cache of an hour of seconds read
# as memory growth in a one-hour soak (bench/soak.py).
_TS_CACHE_MAX = 64
_ts_cache: dict[tuple[str, tzinfo | None], float] = {}
_rank_cache: dict[str, dict[str, int]] = {}

# Both canonical lines at once, over a read's text (one line per `\n`): the chunk scanner of
# `Pipeline.feed_batch`. Groups: stamp, fraction, rank, then the decode line's 8 groups of
# `_CANONICAL_DECODE` (None for a prefill line), then the prefill line's 9 of `_CANONICAL_PREFILL`.
CANONICAL_LINES = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,](\d{1,6}))?((?: [A-Z][A-Z_]*\d+)*)\] (?:Decode batch, "
    r"#running-req: (\d+), #token: (\d+), token usage: (\d+\.\d+), accept len: (\d+\.\d+), "
    r"accept rate: (\d+\.\d+), cuda graph: (True|False), gen throughput \(token/s\): (\d+\.\d+), "
    r"#queue-req: (\d+)|Prefill batch, "
    r"#new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+), token usage: (\d+\.\d+), "
    r"#running-req: (\d+), #queue-req: (\d+), (?:#pending-token: (\d+), )?cuda graph: (True|False), "
    r"input throughput \(token/s\): (\d+\.\d+))[, ]*$", re.M | re.A)  # ASCII digits: what SGLang prints


class _Bad(Exception):
    """A known field whose value does not read (internal: becomes MalformedLine)."""


def _timestamp(stamp: str, frac: str | None, tz: tzinfo | None = None) -> float:
    """`YYYY-MM-DD HH:MM:SS` in zone `tz` (None: this host's local time, as SGLang writes it with
    `time.localtime`) → seconds since the epoch (cached per second). Raises ValueError on an
    impossible date."""
    key = (stamp, tz)
    ts = _ts_cache.get(key)
    if ts is None:
        ts = datetime(
            int(stamp[0:4]), int(stamp[5:7]), int(stamp[8:10]),
            int(stamp[11:13]), int(stamp[14:16]), int(stamp[17:19]), tzinfo=tz,
        ).timestamp()
        if len(_ts_cache) >= _TS_CACHE_MAX:
            _ts_cache.clear()
        _ts_cache[key] = ts
    if frac:
        ts += int(frac) / 10 ** len(frac)
    return ts


def _split_fields(body: str) -> dict[str, str]:
    """`a: 1, b: x, y, c: 2` → {"a": "1", "b": "x, y", "c": "2"}; a piece with no ": " continues
    the previous value (the 0.4.9 SWA form `#token: full=1, swa=2`); `name:` maps to ""."""
    fields: dict[str, str] = {}
    last = None
    for piece in body.split(", "):
        name, sep, value = piece.partition(": ")
        if sep:
            fields[name] = last = value
            last = name
        elif piece.endswith(":"):  # a line cut right after a field name
            fields[piece[:-1]] = ""
        elif last is not None and piece:
            fields[last] += ", " + piece
    return fields


def _int(v: str) -> int:
    try:
        return int(v)
    except ValueError:
        raise _Bad(v) from None


def _float(v: str) -> float:
    """A number SGLang printed with `:.2f` or as a percentage: finite and >= 0, else _Bad (`nan`,
    `-5` or `1e400` come from a garbled line, and NaN would reach /metrics and JSON)."""
    try:
        x = float(v)
    except ValueError:
        if v.endswith("%"):
            v = v[:-1]
        elif v.startswith("full="):  # 0.4.9 SWA usage: "full=0.10, swa=0.20" → the full pool
            v = v[5:].split(",", 1)[0]
        try:
            x = float(v)
        except ValueError:
            raise _Bad(v) from None
    if not 0.0 <= x < math.inf:  # also False for NaN
        raise _Bad(v)
    return x


def _opt(fields: dict[str, str], name: str, conv):
    v = fields.get(name)
    return v if v is None else conv(v)


def _graph(fields: dict[str, str]) -> tuple[bool | None, str | None]:
    for key in _GRAPH_KEYS:
        v = fields.get(key)
        if v is not None:
            if v not in ("True", "False"):
                raise _Bad(v)
            return v == "True", key.split()[0]
    return None, None


def _tokens(fields: dict[str, str]) -> int | None:
    v = fields.get("#token", fields.get("#full token"))
    if v is None:
        return None
    if v.startswith("full="):
        v = v[5:].split(",", 1)[0]
    return _int(v)


def _usage(fields: dict[str, str]) -> float | None:
    v = fields.get("token usage", fields.get("full token usage"))
    return None if v is None else _float(v)


def _ranks(rank: str) -> dict[str, int]:
    """"DP0 TP3" → {"DP": 0, "TP": 3}; cached and shared: treat the dict as read-only."""
    r = _rank_cache.get(rank)
    if r is None:
        if len(_rank_cache) > 4096:
            _rank_cache.clear()
        r = _rank_cache[rank] = {m.group(1): int(m.group(2)) for m in _RANK.finditer(rank)}
    return r


def _fast_decode(ts, rank, iteration, fields, running, queued) -> DecodeBatch | None:
    """The usual CUDA decode line with plain numbers; None sends it to the general path."""
    get = fields.get
    usage, tokens, graph = get("token usage"), get("#token"), get("cuda graph")
    if usage is None or tokens is None or graph is None or (graph != "True" and graph != "False"):
        return None
    al, ar, thr = get("accept len"), get("accept rate"), get("gen throughput (token/s)")
    try:
        return DecodeBatch(
            ts, rank, _ranks(rank), fields, int(running), int(queued), _float(usage),
            graph == "True", "cuda", int(iteration) if iteration else None,
            None if al is None else _float(al), None if ar is None else _float(ar),
            None if thr is None else _float(thr), int(tokens),
        )
    except (ValueError, _Bad):
        return None  # the general path says what does not read


def _parse_batch(kind: str, iteration: str | None, ts: float, rank: str, body: str) -> ParsedLine:
    fields = _split_fields(body)
    get = fields.get
    running, queued = get("#running-req"), get("#queue-req")
    if running is None or queued is None:
        return MalformedLine("missing #running-req or #queue-req (line cut short?)", ts, rank)
    if "" in fields.values():
        return MalformedLine("field without a value (line cut short?)", ts, rank)
    if kind == "Decode":
        fast = _fast_decode(ts, rank, iteration, fields, running, queued)
        if fast is not None:
            return fast
    try:
        graph_enabled, graph_kind = _graph(fields)
        args = (
            ts, rank, _ranks(rank), fields, _int(running), _int(queued), _usage(fields),
            graph_enabled, graph_kind, int(iteration) if iteration else None,
        )
        if kind == "Decode":
            return DecodeBatch(
                *args,
                _opt(fields, "accept len", _float),
                _opt(fields, "accept rate", _float),
                _opt(fields, "gen throughput (token/s)", _float),
                _tokens(fields),
            )
        return PrefillBatch(
            *args,
            _opt(fields, "#new-seq", _int),
            _opt(fields, "#new-token", _int),
            _opt(fields, "#cached-token", _int),
            _opt(fields, "input throughput (token/s)", _float),
        )
    except _Bad as e:
        return MalformedLine(f"unreadable value {str(e)[:40]!r}", ts, rank)


def _literal(node: ast.AST, source: str):
    try:
        return pyast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return ast.get_source_segment(source, node)


def parse_server_args(text: str) -> dict[str, object]:
    """`ServerArgs(model_path='m', tp_size=8, ...)` → {"model_path": "m", "tp_size": 8, ...}.

    Every keyword is kept when the repr parses as Python (values that are not literals are kept
    as source text); otherwise the keys in `SERVER_ARG_KEYS` are read one by one.
    """
    start = text.find("ServerArgs(")
    if start < 0:
        return {}
    source = text[start:]
    try:
        tree = pyast.parse(source, mode="eval")  # an ast.Expression
        call = tree.body if isinstance(tree, ast.Expression) else None
        if isinstance(call, ast.Call):
            return {kw.arg: _literal(kw.value, source) for kw in call.keywords if kw.arg}
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        pass
    args: dict[str, object] = {}
    for m in _ARG_VALUE.finditer(source):
        key, raw = m.group(1), m.group(2).strip()
        if key in SERVER_ARG_KEYS and key not in args:
            try:
                args[key] = pyast.literal_eval(raw)
            except (ValueError, SyntaxError):
                args[key] = raw
    return args


def canonical_decode(groups: tuple, tz: tzinfo | None) -> DecodeBatch | None:
    """The groups of a `_CANONICAL_DECODE` match → DecodeBatch, the same one the general path
    builds (None: an impossible date, which the general path reports)."""
    try:
        ts = _timestamp(groups[0], groups[1], tz)
    except ValueError:
        return None  # the general path says why
    return decode_at(groups, ts)


def decode_at(groups: tuple, ts: float) -> DecodeBatch:
    """The groups of a canonical decode line stamped `ts` (s) → its DecodeBatch."""
    _, _, rank, running, tokens, usage, al, ar, graph, thr, queued = groups[:11]
    rank = rank[1:]
    fields = {"#running-req": running, "#token": tokens, "token usage": usage, "accept len": al,
              "accept rate": ar, "cuda graph": graph, "gen throughput (token/s)": thr, "#queue-req": queued}
    return DecodeBatch(ts, rank, _rank_cache.get(rank) or _ranks(rank), fields, int(running), int(queued),
                       float(usage), graph == "True",
                       "cuda", None, float(al), float(ar), float(thr), int(tokens))


def canonical_prefill(groups: tuple, tz: tzinfo | None) -> PrefillBatch | None:
    """The groups of a `_CANONICAL_PREFILL` match → PrefillBatch, the same one the general path
    builds (None: an impossible date)."""
    try:
        ts = _timestamp(groups[0], groups[1], tz)
    except ValueError:
        return None
    return prefill_at(groups, ts)


def prefill_at(groups: tuple, ts: float) -> PrefillBatch:
    """The groups of a canonical prefill line (`_CANONICAL_PREFILL`'s 12) stamped `ts` → its PrefillBatch."""
    stamp, frac, rank, seqs, new, cached, usage, running, queued, pending, graph, thr = groups
    rank = rank[1:]
    fields = {"#new-seq": seqs, "#new-token": new, "#cached-token": cached, "token usage": usage,
              "#running-req": running, "#queue-req": queued}
    if pending:  # None when not printed
        fields["#pending-token"] = pending
    fields["cuda graph"], fields["input throughput (token/s)"] = graph, thr
    return PrefillBatch(ts, rank, _ranks(rank), fields, int(running), int(queued), float(usage), graph == "True",
                        "cuda", None, int(seqs), int(new), int(cached), float(thr))


def bracket_prefix(text: str, tz: tzinfo | None = None) -> tuple[float | None, str]:
    """The timestamp (seconds since the epoch) and rank tokens ("DP0 TP2", "" when none) of a
    line that starts with SGLang's bracket prefix; (None, "") for any other line."""
    m = _PREFIX.match(text) if text[:1] == "[" else None
    if m is None:
        return None, ""
    try:
        return _timestamp(m.group(1), m.group(2), tz), m.group(3)[1:]
    except ValueError:
        return None, m.group(3)[1:]


def record_message(text: str) -> str | None:
    """The message of a line that starts a record of SGLang's logger (after an optional Ray
    actor prefix, the bracket prefix `[YYYY-MM-DD HH:MM:SS[.mmm][ RANKS]] `), else None: a line
    that starts no record (a continuation of a multi-line message) carries no engine event.
    Every engine message specwatch reads is matched at the start of this, never anywhere in a
    line: request logs (`Receive: obj=...`, `Finish: obj=..., out=...`, the JSON events;
    `RequestLogger`, sglang/srt/utils/request_logger.py@0.5.23) put user text after their own
    message start."""
    if text[:1] == "(":
        m = _RAY.match(text)
        if m is None:
            return None
        text = text[m.end():]
    m = _PREFIX.match(text) if text[:1] == "[" else None
    return None if m is None else text[m.end():]


def maybe_event(text: str) -> bool:
    """False when `parse_line(text)` is certainly OtherLine: no batch or server_args line can lack
    both words (a cheap test for the many lines of access logs and tracebacks)."""
    return "batch" in text or "server_args=" in text


# What stands before `Decode batch` in a record of another format: a time of day, and no quote,
# `=`, `(` or `{` (those open a value holding user text).
_PLAIN_LEAD = re.compile(r"[^\"'=({]*\d:\d\d[^\"'=({]*")
_LEADING_TIME = re.compile(r"\W{0,2}(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)")


def _other(text: str, tz: tzinfo | None) -> ParsedLine:
    """A line that starts no record: one with `Decode batch` in its first 200 characters after a
    time of day, not in a quoted or structured value, is a decode line in a format not read
    (never silently "other", docs/log-formats.md), with the time it starts with, if any. A bare
    `Decode batch` line (a `%(message)s` format) cannot be told from a prompt's continuation line,
    nor can an indented one (a continuation of a multi-line message: an indented copy, a
    pretty-printed request dump): both are other lines."""
    lead = text[2:3] if text.startswith("\u2026 ") else text[:1]  # after grammar.NOT_A_RECORD's mark
    if lead in (" ", "\t"):
        return _OTHER
    at = text.find("Decode batch")
    if not 0 <= at <= 200 or not _PLAIN_LEAD.fullmatch(text, 0, at):
        return _OTHER  # none, or inside a quoted or structured value: user text (a request log)
    m = _LEADING_TIME.match(text)
    try:
        ts = None if m is None else _timestamp(f"{m.group(1)} {m.group(2)}", None, tz)
    except ValueError:
        ts = None
    return UnrecognizedLine(text[:500], "", ts)


def parse_line(text: str, *, container_prefix: re.Pattern | None = None, tz: tzinfo | None = None) -> ParsedLine:
    """Classify and read one log line (no trailing newline). `tz`: the zone of the log's naive
    timestamps (None: this host's local time).

    Returns DecodeBatch, PrefillBatch, ServerArgs, MalformedLine, or OtherLine for everything
    else. Never raises on input.
    """
    if container_prefix is None and text[:1] == "[":
        m = _CANONICAL_DECODE.match(text)
        if m is not None:
            event = canonical_decode(m.groups(), tz)
            if event is not None:
                return event
        else:
            m = _CANONICAL_PREFILL.match(text)
            if m is not None:
                prefill = canonical_prefill(m.groups(), tz)
                if prefill is not None:
                    return prefill
    if container_prefix is not None or text[:1] != "[":
        text = strip_container_prefix(text, container_prefix)
        if text[:1] == "(":
            m = _RAY.match(text)
            if not m:
                return _other(text, tz)
            text = text[m.end():]
    m = _BATCH.match(text)
    if m is not None:
        rank = m.group(3)[1:]
        try:
            ts = _timestamp(m.group(1), m.group(2), tz)
        except ValueError:  # an impossible date: garbled
            return MalformedLine(f"impossible timestamp {m.group(1)!r}", None, rank)
        return _parse_batch(m.group(4), m.group(5), ts, rank, text[m.end():].rstrip(", \r"))
    m = _PREFIX.match(text)
    if m is None:
        return _other(text, tz)
    msg = text[m.end():]
    if msg.startswith(("Decode batch", "Prefill batch")):
        return MalformedLine("unknown batch line start", None, m.group(3).strip())
    if msg.startswith("server_args=ServerArgs("):
        try:
            ts = _timestamp(m.group(1), m.group(2), tz)
        except ValueError:
            return _OTHER
        return ServerArgs(ts, parse_server_args(msg))
    return _OTHER


timestamp_of = _timestamp  # the chunk scanner's clock (`Pipeline.feed_batch`)
rank_numbers = _ranks  # "DP0 TP3" → {"DP": 0, "TP": 3} (shared: read-only)
