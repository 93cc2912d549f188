"""The vLLM log grammar: one line of text in, one parsed line out; `VllmAssembler` turns a
server's parsed lines into the events the rules read (`DecodeBatch`, `ServerArgs`).

Lines read (the printing code, file in the vLLM wheel and the versions that print each form):

- V1 `SpecDecoding metrics:` per stats interval (`SpecDecodingLogging.log`,
  `vllm/v1/spec_decode/metrics.py`), in three orders:
  0.8.3-0.8.4 `Draft acceptance rate: x%, Accepted: N tokens, Drafted: M tokens`;
  0.8.5-0.10.1.1 `Draft acceptance rate: x%, Mean acceptance length: m, Accepted: …, Drafted: …,
  Per-position acceptance rate: a, b, c` (0.8.5.post1 line 83: `m` = accepted / drafts, without
  the bonus token; from 0.9.0 `1 + accepted / drafts`);
  0.10.2-0.33.0 `Mean acceptance length: m, Accepted throughput: x tokens/s, Drafted throughput:
  y tokens/s, Accepted: N tokens, Drafted: M tokens, Per-position acceptance rate: a, b, c, Avg
  Draft acceptance rate: x%` (0.33.0 line 121).
- V0 `Speculative metrics:` (`LoggingStatLogger._format_spec_decode_metrics_str`,
  `vllm/engine/metrics.py`, 0.4.1-0.9.2; 0.8.5.post1 line 526): counters since the engine
  started; 0.4.1-0.5.2 print `Number of draft tokens tokens:` and `Number of emitted tokens tokens:`.
- The periodic stats line: V0 `Avg prompt throughput: …, Running: N reqs, Swapped: …, Pending: N
  reqs, GPU KV cache usage: x%, CPU KV cache usage: y%.` (`vllm/engine/metrics.py@0.8.5.post1`
  line 487); V1 `[Engine 00k: |N Engines Aggregated: ]Avg prompt throughput: …, Running: N reqs,
  Waiting: N reqs, … GPU KV cache usage: x%, …` (`vllm/v1/metrics/loggers.py`, 0.8.5.post1 line
  112, 0.33.0 line 283; `N Engines Aggregated` from 0.12.0); the CPU build prints `CPU KV cache
  usage` where a GPU prints `GPU KV cache usage` (`_kv_usage`).
- The engine config: `Initializing an LLM engine (v…) with config: …` (0.4-0.7), `Initializing a
  V0 LLM engine (v…)` (`vllm/engine/llm_engine.py@0.8.5.post1` line 241), `Initializing a V1 LLM
  engine (v…) with config: model='…', speculative_config=SpeculativeConfig(method='eagle3',
  model='…', num_spec_tokens=N), …` (`vllm/v1/engine/core.py`, 0.8.5.post1 line 58, 0.33.0 line
  140; the repr is `SpeculativeConfig.__repr__`, `vllm/config/speculative.py@0.33.0` line 2210,
  `SpeculativeConfig(draft_model='…', num_spec_tokens=N)` up to 0.6).

Line layout (`_FORMAT` in `vllm/logger.py`, date format `%m-%d %H:%M:%S`: no year)::

    [container prefix] [(Name pid=N) ] LEVEL MM-DD HH:MM:SS [[]file:line] message

`(APIServer pid=N)` / `(EngineCore_DP0 pid=N)` tags are written by 0.8.3+ (0.33.0 in the
formatter); up to 0.7.3 the file has no opening `[`. ANSI colour codes are removed. A line is read
only when this header starts it and the message starts with one of the forms above: request logs
print user text with `%r` after their own start (`Received request …: prompt: %r` in earlier versions;
`Request … details: prompt: %r` and `Generated response …: output: %r`,
vllm/entrypoints/serve/utils/request_logger.py@0.33.0), so it never starts a message, and its
newlines are escaped (a message's own newlines would repeat the header on each line:
`NewLineFormatter`, vllm/logging_utils/formatter.py@0.33.0).
Fields are `Key: value` pairs matched by name (forks insert fields), and a line whose last field
does not read was cut short: `MalformedLine`.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, tzinfo

from specwatch.core.events import DecodeBatch, MalformedLine, OtherLine, ServerArgs

_OTHER = OtherLine()
ENGINE = "vllm"

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# "(APIServer pid=7) ", "(EngineCore_DP0 pid=9) ", "(VllmWorker rank=0 pid=3) ", Ray "(X pid=1, ip=1.2.3.4) ".
_TAG = re.compile(r"\(([\w.-]+)(?: [\w=]+)? pid=\d+(?:, ip=[\w.:]+)?\) ")
_HEADER = re.compile(
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:[.,](\d{1,6}))? "
    r"\[?[\w./-]+:\d+\] "
)
_ENGINE = re.compile(r"Engine (\d+): ")
_AGGREGATED = re.compile(r"(\d+) Engines Aggregated: ")
_VERSION = re.compile(r"Initializing an? (?:V[01] )?LLM engine \(v([^)\s]+)\) with config: ")
_SPEC_REPR = re.compile(r"speculative_config=(None|SpeculativeConfig\(([^()]*)\))")
_KW = re.compile(r"(\w+)=('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^,()]*)")
_NUMBER_UNIT = re.compile(r"(-?[\d.]+|nan|inf)\s*(tokens/s|tokens|reqs|%)?\.?")
SPEC_PREFIX = "SpecDecoding metrics: "
V0_SPEC_PREFIX = "Speculative metrics: "
STATS_PREFIX = "Avg prompt throughput: "


def maybe_event(text: str) -> bool:
    """False when `parse_line(text)` is certainly OtherLine (a cheap test for most lines)."""
    return "metrics: " in text or "throughput: " in text or "with config: " in text


# --- parsed lines (internal to this source: the assembler turns them into rule events) ---


@dataclass(frozen=True, slots=True)
class VllmLine:
    """A vLLM line specwatch reads. timestamp: seconds since the epoch (the year inferred, see
    `_timestamp`); fields: every `Key: value` pair as printed."""

    timestamp: float
    fields: dict[str, str]


@dataclass(frozen=True, slots=True)
class VllmStats(VllmLine):
    """The periodic stats line. engine: `Engine 00k` index (None when the line names none, V0 and
    0.8.0-0.8.2); engines: the count of an `N Engines Aggregated` line. gen_throughput in tokens/s;
    kv_usage 0-1."""

    engine: int | None = None
    engines: int | None = None
    running: int = 0
    waiting: int = 0
    gen_throughput: float | None = None
    kv_usage: float | None = None


@dataclass(frozen=True, slots=True)
class VllmSpecDecoding(VllmLine):
    """A V1 `SpecDecoding metrics` line, one stats interval. accept_length as printed (None in
    0.8.3-0.8.4), accept_rate 0-1 (None for `nan%`), positions: per-position acceptance rates."""

    accepted: int = 0
    drafted: int = 0
    accept_length: float | None = None
    accept_rate: float | None = None
    positions: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class VllmV0Spec(VllmLine):
    """A V0 `Speculative metrics` line: counters since the engine started. k: tokens per draft."""

    k: int = 0
    accepted: int = 0
    draft: int = 0
    emitted: int = 0
    accept_rate: float | None = None
    efficiency: float | None = None


@dataclass(frozen=True, slots=True)
class VllmConfig(VllmLine):
    """The engine-config line; args: `engine_config_args`."""

    args: dict[str, object] = field(default_factory=dict)


class _Bad(Exception):
    pass


# --- grammar ---

_ts_cache: dict[tuple, float] = {}


def _timestamp(m: re.Match, tz: tzinfo | None, now: float | None = None) -> float:
    """`MM-DD HH:MM:SS[.f]` → seconds since the epoch. vLLM prints no year: the current year, or
    the one before when that would put the line more than a day in the future (a log from
    December read in January). Raises ValueError on an impossible date."""
    mon, day, hh, mm, ss, frac = m.groups()
    clock = time.time() if now is None else now
    key = (mon, day, hh, mm, ss, tz, int(clock // 86400))
    ts = _ts_cache.get(key)
    if ts is None:
        year = datetime.fromtimestamp(clock, tz).year
        ts = None
        for y in (year, year - 1, year - 2, year - 3, year - 4):  # Feb 29: the last leap year
            try:
                t = datetime(y, int(mon), int(day), int(hh), int(mm), int(ss), tzinfo=tz).timestamp()
            except ValueError:
                if y == year - 4:
                    raise
                continue
            if t <= clock + 86400:
                ts = t
                break
        if ts is None:
            raise ValueError("date in the future")
        if len(_ts_cache) >= 64:
            _ts_cache.clear()
        _ts_cache[key] = ts
    if frac:
        ts += int(frac) / 10 ** len(frac)
    return ts


def header_time(text: str, tz: tzinfo | None = None, now: float | None = None) -> float | None:
    """The timestamp of a line that starts with vLLM's header (after a process tag), the year
    inferred as `parse_line` does (`_timestamp`); None for any other line or an impossible date."""
    if text[:1] == "(":
        m = _TAG.match(text)
        if m is None:
            return None
        text = text[m.end():]
    h = _HEADER.match(text) if text[:1] in ("I", "D", "W", "E", "C") else None
    if h is None:
        return None
    try:
        return _timestamp(h, tz, now)
    except ValueError:
        return None


def split_fields(body: str) -> dict[str, str]:
    """`a: 1, b: x, y,z, c: 2` → {"a": "1", "b": "x, y,z", "c": "2"}: a piece without ": "
    continues the previous value (the per-position list, `0.000,0.000` spacing included)."""
    fields: dict[str, str] = {}
    last = None
    for piece in body.split(", "):
        name, sep, value = piece.partition(": ")
        if sep:
            fields[name] = value
            last = name
        elif last is not None:
            fields[last] += ", " + piece
        else:
            raise _Bad(piece)
    return fields


def _number(v: str | None, unit: str | None = None, *, integer: bool = False, nan_ok: bool = False):
    """`"394.48tokens/s"`, `"49 tokens"`, `"2.3%"`, `"0.0%."` → the number (unit checked when
    given); None for an absent field, or for `nan` when `nan_ok`. Raises _Bad otherwise."""
    if v is None:
        return None
    m = _NUMBER_UNIT.fullmatch(v.strip())
    if m is None or (unit is not None and m.group(2) != unit):
        raise _Bad(v)
    try:
        x = int(m.group(1)) if integer else float(m.group(1))
    except ValueError:
        raise _Bad(v) from None
    if isinstance(x, float) and math.isnan(x) and nan_ok:
        return None
    if not 0 <= x < math.inf:
        raise _Bad(v)
    return x


def _positions(v: str | None) -> tuple[float, ...]:
    if v is None or v == "":
        return ()
    out = tuple(_number(p) for p in re.split(r",\s*", v.strip()))
    if any(p > 1.0 for p in out):
        raise _Bad(v)
    return out


def _spec(ts: float, body: str) -> VllmSpecDecoding:
    f = split_fields(body)
    accepted, drafted = _number(f.get("Accepted"), "tokens", integer=True), _number(f.get("Drafted"), "tokens", integer=True)
    if accepted is None or drafted is None:
        raise _Bad("no Accepted/Drafted")
    rate = f.get("Avg Draft acceptance rate", f.get("Draft acceptance rate"))
    _number(f.get("Accepted throughput"), "tokens/s")
    _number(f.get("Drafted throughput"), "tokens/s")
    pct = _number(rate, "%", nan_ok=True)
    return VllmSpecDecoding(ts, f, accepted, drafted, _number(f.get("Mean acceptance length"), nan_ok=True),
                            None if pct is None else round(pct / 100, 6), _positions(f.get("Per-position acceptance rate")))


def _v0_spec(ts: float, body: str) -> VllmV0Spec:
    f = split_fields(body.rstrip("."))
    g = lambda *names: next((f[n] for n in names if n in f), None)  # noqa: E731
    k = _number(f.get("Number of speculative tokens"), integer=True)
    accepted = _number(f.get("Number of accepted tokens"), integer=True)
    draft = _number(g("Number of draft tokens", "Number of draft tokens tokens"), integer=True)
    emitted = _number(g("Number of emitted tokens", "Number of emitted tokens tokens"), integer=True)
    if None in (k, accepted, draft, emitted):
        raise _Bad("missing counter")
    return VllmV0Spec(ts, f, k, accepted, draft, emitted, _number(f.get("Draft acceptance rate"), nan_ok=True),
                      _number(f.get("System efficiency"), nan_ok=True))


def _kv_usage(f: dict[str, str]) -> str | None:
    """The KV usage field of a stats line: `<device> KV cache usage`, the device as V1 names its
    KV cache (`kv_cache_device`: GPU for cuda, else the device type upper-cased, CPU on the CPU
    build; vllm/v1/metrics/loggers.py@0.33.0 line 117). V0 prints both `GPU KV cache usage` and
    `CPU KV cache usage`, the CPU one being swap space (vllm/engine/metrics.py@0.8.5.post1 line
    490): any other device's field is read first."""
    found = [(k.startswith("CPU"), v) for k, v in f.items() if k.endswith("KV cache usage")]
    return min(found, key=lambda kv: kv[0])[1] if found else None


def _stats(ts: float, msg: str) -> VllmStats:
    engine = engines = None
    m = _ENGINE.match(msg)
    if m:
        engine, msg = int(m.group(1)), msg[m.end():]
    else:
        m = _AGGREGATED.match(msg)
        if m:
            engines, msg = int(m.group(1)), msg[m.end():]
    f = split_fields(msg.rstrip("."))
    running = _number(f.get("Running"), "reqs", integer=True)
    waiting = _number(f.get("Waiting", f.get("Pending")), "reqs", integer=True)
    if running is None:
        raise _Bad("no Running")
    kv = _number(_kv_usage(f), "%")
    return VllmStats(ts, f, engine, engines, running, waiting or 0,
                     _number(f.get("Avg generation throughput"), "tokens/s"), None if kv is None else round(kv / 100, 6))


_METHODS = {"eagle3": "EAGLE3", "eagle": "EAGLE", "mtp": "MTP", "ngram": "NGRAM", "ngram_gpu": "NGRAM",
            "[ngram]": "NGRAM", "draft_model": "STANDALONE"}


def algorithm(method: str | None) -> str | None:
    """A vLLM speculative `method` (`SpeculativeConfig.method`, `vllm/config/speculative.py@0.33.0`)
    as the algorithm name the rules use (`speculative_algorithm`): eagle3 → EAGLE3, eagle → EAGLE,
    mtp and every `*_mtp` → MTP, ngram / ngram_gpu → NGRAM, draft_model → STANDALONE, others
    upper-cased (SUFFIX, MEDUSA, DFLASH, …)."""
    if method is None or method in ("", "None"):
        return None
    m = method.strip().lower()
    if m.endswith("_mtp"):
        return "MTP"
    return _METHODS.get(m, m.upper())


def _literal(raw: str) -> object:
    raw = raw.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        return raw[1:-1]
    if raw in ("None", "True", "False"):
        return {"None": None, "True": True, "False": False}[raw]
    try:
        return int(raw)
    except ValueError:
        return raw


def engine_config_args(msg: str) -> dict[str, object]:
    """`Initializing a V1 LLM engine (v0.9.0) with config: model='m', speculative_config=…, …`
    → settings under the names the rules read (`model_path`, `speculative_algorithm`,
    `speculative_draft_model_path`, `speculative_num_steps` = k with `speculative_eagle_topk` 1:
    vLLM drafts a chain, so the ceiling is k + 1; `tp_size`, `pp_size`, `dp_size`), plus
    `engine`, `vllm_version`, `speculative_method` and `num_speculative_tokens` as vLLM names them."""
    args: dict[str, object] = {"engine": ENGINE}
    m = _VERSION.search(msg)
    if m:
        args["vllm_version"] = m.group(1)
        msg = msg[m.end():]
    spec = _SPEC_REPR.search(msg)
    head = msg if spec is None else msg[:spec.start()] + msg[spec.end():]
    kw: dict[str, object] = {}
    for km in _KW.finditer(head):
        kw.setdefault(km.group(1), _literal(km.group(2)))
    for ours, theirs in (("model_path", "model"), ("tp_size", "tensor_parallel_size"),
                         ("pp_size", "pipeline_parallel_size"), ("dp_size", "data_parallel_size"),
                         ("served_model_name", "served_model_name")):
        if theirs in kw:
            args[ours] = kw[theirs]
    if spec is not None and spec.group(1) != "None":
        sk = {km.group(1): _literal(km.group(2)) for km in _KW.finditer(spec.group(2) or "")}
        k = sk.get("num_spec_tokens")
        args.update(spec_settings(sk.get("method"), sk.get("model", sk.get("draft_model")), k if isinstance(k, int) else None))
    elif spec is not None:
        args.update(speculative_algorithm=None, speculative_method=None, speculative_draft_model_path=None)
    return args


def spec_settings(method: object, draft: object, k: int | None) -> dict[str, object]:
    """A vLLM speculative config (method, draft model, num_speculative_tokens) as the settings
    the rules read. Without a method, vLLM picks it from the draft's name (`SpeculativeConfig.
    __post_init__`, vllm/config/speculative.py@0.33.0): `[ngram]` → ngram (0.4-0.8.2), a name with
    `eagle3` → eagle3, `eagle-` → eagle, else draft_model (DRAFT_MODEL here: it may also be an
    MTP model, told only by its config)."""
    method = str(method) if method not in (None, "", "None") else None
    draft = str(draft) if draft not in (None, "", "None") else None
    if method is None and draft is not None:
        low = draft.lower()
        method = "ngram" if draft == "[ngram]" else "eagle3" if "eagle3" in low else "eagle" if "eagle-" in low else None
    return {"speculative_algorithm": algorithm(method) if method else ("DRAFT_MODEL" if draft else None),
            "speculative_method": method, "speculative_draft_model_path": None if draft == "[ngram]" else draft,
            "num_speculative_tokens": k, "speculative_num_steps": k, "speculative_eagle_topk": 1}


def parse_line(text: str, *, container_prefix: re.Pattern | None = None, tz: tzinfo | None = None,
               now: float | None = None) -> VllmLine | MalformedLine | OtherLine:
    """Classify and read one vLLM log line (no trailing newline). `tz`: the zone of the log's
    timestamps (None: this host's); `now`: the clock that picks the year (None: wall time).

    Returns VllmStats, VllmSpecDecoding, VllmV0Spec, VllmConfig (the engine config),
    MalformedLine (a line of these forms that does not read), or OtherLine. Never raises.
    """
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if container_prefix is not None:
        m = container_prefix.match(text)
        if m:
            text = text[m.end():]
    elif text[:1] not in ("(", "I", "D", "W", "E", "C") and "| " in text[:80]:
        from specwatch.sources.container import strip_container_prefix

        text = strip_container_prefix(text, None)
    if text[:1] == "(":
        m = _TAG.match(text)
        if m is None:
            return _OTHER
        text = text[m.end():]
    h = _HEADER.match(text)
    if h is None:
        return _OTHER
    msg = text[h.end():].rstrip("\r ")
    kind: Callable[[float, str], VllmLine]  # (timestamp, text) → the line read; raises _Bad
    if msg.startswith(SPEC_PREFIX):
        kind, body = _spec, msg[len(SPEC_PREFIX):]
    elif msg.startswith(V0_SPEC_PREFIX):
        kind, body = _v0_spec, msg[len(V0_SPEC_PREFIX):]
    elif STATS_PREFIX in msg[:60] and (msg.startswith(STATS_PREFIX) or _ENGINE.match(msg) or _AGGREGATED.match(msg)):
        kind, body = _stats, msg
    elif msg.startswith("Initializing ") and _VERSION.match(msg):
        try:
            return VllmConfig(_timestamp(h, tz, now), {}, engine_config_args(msg))
        except ValueError:
            return _OTHER
    else:
        return _OTHER
    try:
        ts = _timestamp(h, tz, now)
    except ValueError:
        return MalformedLine("impossible timestamp")
    try:
        return kind(ts, body)
    except _Bad as e:
        return MalformedLine(f"unreadable vLLM stats line (cut short?): {str(e)[:40]!r}", ts)


# --- assembly: parsed lines of one server → DecodeBatch ---


@dataclass
class VllmAssembler:
    """One server's vLLM lines → `DecodeBatch` events, as the rules read SGLang's.

    vLLM prints the stats line (running, waiting, throughput, KV usage) and right after it, in the
    same call, the spec line of that engine (V1: `LoggingStatLogger.log` in
    `vllm/v1/metrics/loggers.py`; V0: `vllm/engine/metrics.py`). A stats line waits for its spec
    line (same engine, within `PAIR_SECONDS`); a stats line that none follows is a decode batch
    without acceptance (no drafts that interval) when the next stats line of that engine arrives.
    A spec line with no stats line before it (a grep'd log) counts one running request: vLLM
    prints it only when drafts were made. rank: `DP<k>` for `Engine 00k` when the server runs
    several engines (`data_parallel_size` > 1 in its engine-config line, or an engine above 0
    seen), else "" (one engine, as a single GPU; the same ranks as `server_metrics` gives vLLM).

    accept_length: V1 the printed mean acceptance length, +1 for the 0.8.5 form (recognised as
    `sum(positions)` instead of `1 + sum(positions)`); 0.8.3-0.8.4 `1 + k * accepted / drafted`
    with k from the engine config. V0: from the counters' change since the previous line,
    `k * Δemitted / Δdraft` (tokens per verify step, bonus token included); a counter that went
    down means the engine restarted, and the line's own values are the interval. accept_rate
    0-1: accepted / drafted tokens.
    """

    PAIR_SECONDS = 2.0
    pending: dict[int | None, VllmStats] = field(default_factory=dict)
    last: VllmStats | None = None
    k: int | None = None
    v0: VllmV0Spec | None = None
    several: bool = False  # data_parallel_size > 1, or an engine index above 0 was seen

    def take(self, event: object) -> list[object]:
        """One parsed line → the events for the pipeline (DecodeBatch, ServerArgs), maybe none."""
        if isinstance(event, VllmStats):
            self.several = self.several or bool(event.engine)
            out: list[object] = [self._batch(p) for p in self._stale(event)]
            self.pending[event.engine] = event
            self.last = event
            return out
        if isinstance(event, VllmSpecDecoding):
            return self._v1(event)
        if isinstance(event, VllmV0Spec):
            return self._v0(event)
        if isinstance(event, VllmConfig):
            self.configure(event.args)
            self.v0 = None  # a new engine: counters start again
            return [ServerArgs(event.timestamp, dict(event.args), "log")]
        return []

    def configure(self, args: dict) -> "VllmAssembler":
        """Take k (`num_speculative_tokens`) and the DP size from the engine's settings: those of
        its engine-config line, or the saved ones when specwatch resumes a log past that line."""
        k, dp = args.get("num_speculative_tokens"), args.get("dp_size")
        self.k = k if isinstance(k, int) and k > 0 else None
        self.several = isinstance(dp, int) and dp > 1
        return self

    def _stale(self, now: VllmStats) -> list[VllmStats]:
        out = [p for e, p in self.pending.items() if e == now.engine or now.timestamp - p.timestamp > self.PAIR_SECONDS]
        for p in out:
            self.pending.pop(p.engine, None)
        return out

    def _stats_for(self, ts: float) -> VllmStats | None:
        s = self.last
        if s is None or abs(ts - s.timestamp) > self.PAIR_SECONDS or self.pending.get(s.engine) is not s:
            return None
        del self.pending[s.engine]
        return s

    def _batch(self, s: VllmStats | None, ts: float | None = None, fields: dict | None = None,
               running: int | None = None, **acceptance) -> DecodeBatch:
        if ts is None:
            if s is None:
                raise TypeError("_batch needs the stats line or a timestamp")
            ts = s.timestamp
        if s is not None and s.engine is not None and self.several:
            rank, ranks = f"DP{s.engine}", {"DP": s.engine}
        else:
            rank, ranks = "", {}
        merged = {**(s.fields if s is not None else {}), **(fields or {})}
        return DecodeBatch(
            timestamp=ts, rank=rank, ranks=ranks, fields=merged,
            running_requests=s.running if s is not None else (running or 0),
            queued_requests=s.waiting if s is not None else 0,
            token_usage=s.kv_usage if s is not None else None,
            gen_throughput=s.gen_throughput if s is not None else None, engine=ENGINE, **acceptance)

    def _v1(self, e: VllmSpecDecoding) -> list[object]:
        al = e.accept_length
        if e.positions and al is not None:
            total = sum(e.positions)
            if abs(al - total) < abs(al - (1 + total)):
                al += 1.0  # 0.8.5: accepted / drafts, without the bonus token
        elif al is None and self.k and e.drafted:
            al = 1 + self.k * e.accepted / e.drafted
        rate = e.accept_rate if e.accept_rate is not None else (e.accepted / e.drafted if e.drafted else None)
        s = self._stats_for(e.timestamp)
        return [self._batch(s, e.timestamp, e.fields, 1 if e.drafted else 0, accept_length=al, accept_rate=rate,
                            position_accept_rates=e.positions or None, accepted_tokens=e.accepted,
                            draft_tokens=e.drafted)]

    def _v0(self, e: VllmV0Spec) -> list[object]:
        prev, self.v0 = self.v0, e
        if prev is not None and e.k == prev.k and e.draft >= prev.draft and e.accepted >= prev.accepted \
                and e.emitted >= prev.emitted:
            accepted, draft, emitted = e.accepted - prev.accepted, e.draft - prev.draft, e.emitted - prev.emitted
        else:  # the first line, or the counters started again (a restart)
            accepted, draft, emitted = e.accepted, e.draft, e.emitted
        al = e.k * emitted / draft if draft and e.k else None
        s = self._stats_for(e.timestamp)
        fields = {**e.fields, "interval accepted": str(accepted), "interval draft": str(draft),
                  "interval emitted": str(emitted)}
        return [self._batch(s, e.timestamp, fields, 1 if draft else 0, accept_length=al,
                            accept_rate=accepted / draft if draft else None, accepted_tokens=accepted,
                            draft_tokens=draft)]
