"""Errors in a server log: a Python traceback grouped into one event, classified.

The grammar of `parse_line` reads one line at a time; a traceback spans many, so this stage keeps
per-file state (`ErrorGrouper`, one per followed file). Shapes it reads:

- a Python traceback (`traceback.format_exception`, CPython 3.10-3.13): a header line ending in
  `Traceback (most recent call last):`, optionally after a prefix (SGLang's `[ts TP2] Scheduler
  hit an exception: ` — `Scheduler.event_loop` error path, sglang/srt/managers/scheduler.py
  0.5.23 — or `Initialization failed. warmup error: `, sglang/srt/entrypoints/http_server.py
  0.5.23), then indented `  File "…", line N, in f` frames and source lines, then the exception
  line (`RuntimeError: …`); chained exceptions (`During handling of the above exception…`) stay
  in the same group. A prefix repeated on every line (vLLM's `ERROR 12-16 05:03:28 engine.py:366] `)
  is stripped. A traceback whose header was cut off starts at its first frame line;
- torch's C++ error lines (`[rank0]:[E1205 17:08:49.1 ProcessGroupNCCL.cpp:616] …` and the
  `terminate called…` / `what():` / `frame #N:` lines that follow, torch/csrc/distributed/c10d/
  ProcessGroupNCCL.cpp, PyTorch 2.5) grouped the same way;
- SGLang's `Health check failed. Server couldn't get a response from detokenizer…`
  (`health_generate`, sglang/srt/entrypoints/http_server.py 0.5.11-0.5.23): one line, the
  message of a record (`sglang_log.record_message`), never the same words inside another one
  (a request log quoting a prompt); the same for the two lines below;
- SGLang's watchdog: `Scheduler watchdog timeout (self.watchdog_timeout=300.0, self.soft=False)`
  (`ProcessWatchdog._watchdog_once`, sglang/srt/utils/watchdog.py 0.5.x: `{debug_name} watchdog
  timeout (…)`, also `TokenizerManager`/`DetokenizerManager`) or the older `Watchdog timeout
  (self.watchdog_timeout=300)` (`Scheduler.watchdog_thread`, sglang/srt/managers/scheduler.py
  0.4-0.5.11): one line, kind `watchdog_timeout`;
- SGLang's launcher on a dead child: `Subprocess scheduler_0 (pid=7391) crashed with exit code
  -3. Triggering SIGQUIT for cleanup...` (`SubprocessWatchdog._check_processes`, sglang/srt/utils/
  watchdog.py 0.5.x; older builds print no `(pid=…)`): one line, kind `subprocess_crash`.

torch's glog stamp (`E411 10:18:06.598287174`, c10/util/Logging.cpp) writes the month without
a leading zero (April 11 is `E411`, December 5 `E1205`) and no year: the year is the one of the
file's last dated line, else the current year.

A traceback or crash line within `STOPPING` seconds after a line that says the server is being
stopped (vLLM's `[shutdown] … received signal=SIGTERM`, vllm/v1/engine/core.py 0.12+; uvicorn's
`Shutting down`; `SIGTERM`) is of kind `shutdown`: vLLM's `AsyncLLM output_handler failed.` with an
`EngineDeadError` is a race of its own shutdown, not a failure.

A group ends at its exception line (unless a chained exception follows), at a line that cannot
belong to it, after `MAX_LINES` lines, or `TIMEOUT` seconds after its last line (`expire`), so
a cut traceback still ends. It keeps its last `KEEP_LINES` lines. Classification (`classify`)
reads the exception line and the kept lines: one of `KINDS`.
"""

from __future__ import annotations

import re
import time
from collections import deque
from datetime import datetime, tzinfo

from specwatch.core.events import LogError
from specwatch.engines import LogEngine
from specwatch.engines.sglang.log import bracket_prefix, record_message
from specwatch.engines.vllm.log import ENGINE as VLLM, header_time

KINDS = ("cuda_oom", "nccl_timeout", "shape_mismatch", "health_check", "watchdog_timeout", "subprocess_crash",
         "cuda_graph", "device_assert", "unsupported", "shutdown", "other")
MAX_LINES = 1000  # lines of one group before it is ended as cut
KEEP_LINES = 12  # last lines kept for the alert
MAX_LINE_CHARS = 400  # each kept line is cut to this
TIMEOUT = 5.0  # seconds after its last line an open group ends
STOPPING = 60.0  # seconds after a shutdown line in which an error is part of the stop

HEADER = "Traceback (most recent call last):"
_CHAIN = ("During handling of the above exception", "The above exception was the direct cause")
# A whole frame line: user text quoted in a request log never ends the line like this.
_FRAME = re.compile(r'(.*?)  File "[^"\n]*", line \d+, in [\w<>.]+\s*\Z')
# `ValueError: msg`, `torch.OutOfMemoryError: msg`, `KeyboardInterrupt`.
_EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(?::(?: .*)?)?\Z")
# torch C++ log lines at error/fatal level: `[rank3]:[E1205 17:08:49.123 file.cpp:616] ` or glog
# `E411 17:08:49`: the month is not zero-padded (MDD or MMDD).
_C10D = re.compile(r"(?:\[(rank\d+)\]:)?\[?[EF](\d{1,2})(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?")
_WATCHDOG = re.compile(r"(?:(\w+) w|W)atchdog timeout \(self\.watchdog_timeout=([\d.]+)")
_SUBPROCESS = re.compile(r"Subprocess (\S+) (?:\(pid=(\d+)\) )?crashed with exit code (-?\d+)")
_STOPPING = re.compile(r"received signal=SIGTERM|SIGTERM received|Received sigterm|\bShutting down\b|\[shutdown\]")
_C10D_TAIL = ("terminate called", "  what():", "Exception raised from", "frame #")
HEALTH_FAILED = "Health check failed. Server couldn't get a response"

_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED")
_NCCL_TIMEOUT = re.compile(
    r"collective operation timeout|Watchdog got stuck|watchdog thread .* (?:timed out|stuck)"
    r"|NCCL.*(?:[Tt]imeout|timed out)|(?:[Tt]imeout|timed out).*NCCL")
_CUDA_GRAPH = re.compile(r"Capture cuda graph failed|cudaErrorStreamCaptureUnsupported|operation not permitted when stream is capturing"
                         r"|CUDA graph capture failed|cudaErrorStreamCaptureInvalidated")
_DEVICE_ASSERT = re.compile(r"device-side assert|cudaErrorAssert|Assertion `.*` failed")
_UNSUPPORTED = re.compile(r"^(?:\S+\.)?NotImplementedError\b|not (?:yet )?supported(?: yet)?\b")
_SHAPE = re.compile(
    r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)"
    r"|shapes cannot be multiplied|is invalid for input of size|size mismatch for "
    r"|Expected size \d+ but got size \d+|shape mismatch")


def maybe_error(text: str) -> bool:
    """False when `ErrorGrouper.line` certainly ignores `text` while no group is open: a cheap
    test run on every line that is not a batch line."""
    return ("Traceback" in text or 'File "' in text or "rror" in text or "NCCL" in text
            or "Health check failed" in text or text[:1] == "[" and "]:[E" in text[:16]
            or "atchdog timeout" in text or "crashed with exit code" in text
            or "SIGTERM" in text or "hutting down" in text or "[shutdown]" in text or "sigterm" in text)


def classify(exception: str | None, lines: list[str] | tuple[str, ...]) -> str:
    """One of `KINDS` from the exception line (first) and the group's kept lines. A device-side
    assert is read before an NCCL timeout (the assert poisons the rank whose peers then time out),
    a failed CUDA graph capture before the CUDA error it wraps."""
    texts = ([exception] if exception else []) + list(lines)
    for text in texts:
        if _OOM.search(text):
            return "cuda_oom"
        if _DEVICE_ASSERT.search(text):
            return "device_assert"
        if _CUDA_GRAPH.search(text):
            return "cuda_graph"
    for text in texts:
        if _NCCL_TIMEOUT.search(text):
            return "nccl_timeout"
        if _SHAPE.search(text):
            return "shape_mismatch"
        if HEALTH_FAILED in text:
            return "health_check"
    if exception and _UNSUPPORTED.search(exception):
        return "unsupported"
    return "other"


def glog_time(m: re.Match, year: int, tz: tzinfo | None) -> float | None:
    """A `_C10D` match (month, day, time, fraction) in `year` → seconds since the epoch (zone
    `tz`, None: local time); None for an impossible date."""
    _, mon, day, hh, mm, ss, frac = m.groups()
    try:
        ts = datetime(year, int(mon), int(day), int(hh), int(mm), int(ss), tzinfo=tz).timestamp()
    except ValueError:
        return None
    return ts + (int(frac) / 10 ** len(frac) if frac else 0.0)


class _Group:
    __slots__ = ("mode", "prefix", "start", "last", "rank", "lines", "count", "exception", "after")

    def __init__(self, mode: str, prefix: str, start: float | None, rank: str):
        self.mode = mode  # "traceback" or "c10d"
        self.prefix = prefix  # text before the traceback on its first line, stripped from the rest
        self.start = start
        self.last = start
        self.rank = rank
        self.lines: deque[str] = deque(maxlen=KEEP_LINES)
        self.count = 0
        self.exception: str | None = None
        self.after = False  # the exception line came: only a chained exception continues


class ErrorGrouper:
    """Per followed file: lines in (every line while `open`, else those `maybe_error` passes),
    `LogError` events out. Not thread-safe (the pipeline calls it under its lock).

    engine: "vllm" once a line with vLLM's header (`ERROR 12-16 05:03:28 engine.py:366] `) was
    grouped, or once `log` (the file's `engines.LogEngine`) knows the file is vLLM's;
    every later event says so (its fixes name vLLM's options). A group with no time stamp of its
    own in a replay (`now` None) takes the file's last stamp seen here."""

    def __init__(self, path: str, log: LogEngine | None = None):
        self.path = path
        self.log = log
        self.engine = ""
        self.group: _Group | None = None
        self._last_stamp: float | None = None
        self._stopping: float | None = None  # stamp of the last line saying the server is being stopped

    @property
    def open(self) -> bool:
        return self.group is not None

    def line(self, text: str, now: float | None, tz: tzinfo | None = None,
             dated: float | None = None) -> list[LogError]:
        """One line (after any container prefix). `now`: the clock when it was read (None in a
        replay). `dated`: the stamp of the file's last dated line the caller read (the year of a
        glog stamp). Returns the events it completed (a finished group, and a one-line event)."""
        if dated is not None and (self._last_stamp is None or dated > self._last_stamp):
            self._last_stamp = dated
        out: list[LogError] = []
        g = self.group
        if g is not None:
            if self._continues(g, text):
                g.last = now if now is not None else g.last
                if g.count >= MAX_LINES:
                    out.append(self._close(g, cut=True))
                return out
            out.append(self._close(g))
        started = self._start(text, now, tz)
        if started is not None:
            out.append(started)
        return out

    def expire(self, now: float) -> list[LogError]:
        """End a group whose last line is `TIMEOUT` seconds old (a traceback cut off)."""
        g = self.group
        if g is None or g.last is None or now - g.last < TIMEOUT:
            return []
        return [self._close(g)]

    def flush(self) -> list[LogError]:
        """End the open group now (end of a recorded log)."""
        g = self.group
        return [] if g is None else [self._close(g)]

    def _engine(self) -> str:
        return self.engine or (VLLM if self.log is not None and self.log.name == VLLM else "")

    def _add(self, g: _Group, text: str) -> None:
        g.count += 1
        g.lines.append(text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS] + "…")

    def _start(self, text: str, now: float | None, tz) -> LogError | None:
        if _STOPPING.search(text):
            self._stopping = self._stamp(text, now, tz)[0]
            return None
        body = text.rstrip()
        if body.endswith(HEADER):
            prefix = body[:-len(HEADER)]
            self._open("traceback", prefix, text, now, tz)
            return None
        m = _FRAME.match(body)
        if m is not None:  # a traceback whose header was cut off
            self._open("traceback", m.group(1), text, now, tz)
            return None
        if _C10D.match(text):
            self._open("c10d", "", text, now, tz)
            return None
        # a record's own message, never the same words inside another one (a request log quoting it)
        if HEALTH_FAILED in text or "atchdog timeout" in text or "Subprocess " in text:
            msg = record_message(text) or ""
            if msg.startswith(HEALTH_FAILED):
                return self._one_line("health_check", text, now, tz)
            if _WATCHDOG.match(msg):
                return self._one_line("watchdog_timeout", text, now, tz)
            if _SUBPROCESS.match(msg):
                return self._one_line("subprocess_crash", text, now, tz)
        return None

    def _one_line(self, kind: str, text: str, now: float | None, tz) -> LogError:
        ts, rank = self._stamp(text, now, tz)
        short = text[:MAX_LINE_CHARS]
        if kind == "health_check":
            return LogError(ts, self.path, kind, None, (short,), 1, rank, engine=self._engine())
        if self._in_stop(ts):
            kind = "shutdown"
        return LogError(ts, self.path, kind, short, (short,), 1, rank, engine=self._engine())

    def _in_stop(self, ts: float | None) -> bool:
        """`ts` (a group's start) falls within `STOPPING` seconds after a shutdown line."""
        return self._stopping is not None and ts is not None and 0 <= ts - self._stopping <= STOPPING

    def _open(self, mode: str, prefix: str, text: str, now: float | None, tz) -> None:
        ts, rank = self._stamp(text, now, tz)
        g = self.group = _Group(mode, prefix, ts, rank)
        g.last = now if now is not None else ts
        self._add(g, text)

    def _stamp(self, text: str, now: float | None, tz) -> tuple[float | None, str]:
        """The SGLang prefix's timestamp and rank tokens, else torch's glog stamp (`[rank3]:[E411
        10:18:06.5 …`, the year of the file's last stamp, else of `now`, else the current year),
        else vLLM's header's timestamp (its year inferred as `vllm_log.parse_line` does), else the
        clock `now` (in a replay: the last stamp of this file). Notes a vLLM header in `engine`."""
        ts, rank = bracket_prefix(text, tz)
        g = _C10D.match(text) if ts is None else None
        if g is not None:
            ref = self._last_stamp
            clock = now if now is not None else time.time()
            year = datetime.fromtimestamp(clock if ref is None else ref, tz).year
            ts, rank = glog_time(g, year, tz), g.group(1) or rank
            if ts is not None and ref is not None and ts < ref - 183 * 86400:
                ts = glog_time(g, year + 1, tz)  # January's line after December's: the new year
            elif ts is not None and ref is None and ts > clock + 86400:
                ts = glog_time(g, year - 1, tz)  # no line in the future: December's, read in January
        if ts is None and text[:1] != "[":
            ts = header_time(text, tz, now)
            if ts is not None:
                self.engine = VLLM
        if ts is not None:
            self._last_stamp = ts
            return ts, rank
        return (now if now is not None else self._last_stamp), rank

    def _continues(self, g: _Group, text: str) -> bool:
        """`text` belongs to the open group (then it is added to it)."""
        if g.mode == "c10d":
            if _C10D.match(text) or text.startswith(_C10D_TAIL):
                self._add(g, text)
                return True
            return False
        body = text[len(g.prefix):] if g.prefix and text.startswith(g.prefix) else text
        if g.after:  # after the exception line: only a chained exception continues
            if not body.strip() or body.startswith(_CHAIN):
                g.after = not body.strip()
                self._add(g, text)
                return True
            return False
        if not body.strip() or body[:1] in (" ", "\t") or body.startswith(_CHAIN) or body.rstrip().endswith(HEADER):
            self._add(g, text)
            return True
        if _EXCEPTION.match(body.rstrip()):
            g.exception = body.rstrip()[:MAX_LINE_CHARS]
            g.after = True
            self._add(g, text)
            return True
        return False  # a line of something else: the traceback was cut

    def _close(self, g: _Group, *, cut: bool = False) -> LogError:
        """The open group `g` as an event, and no group open; `cut`: it hit `MAX_LINES` (a
        traceback without its exception line is cut too)."""
        self.group = None
        lines = tuple(g.lines)
        cut = cut or (g.mode == "traceback" and g.exception is None)
        kind = "shutdown" if self._in_stop(g.start) else classify(g.exception, lines)
        return LogError(g.start, self.path, kind, g.exception, lines, g.count, g.rank, cut, self._engine())
