"""Line grammars: where a log record starts, its timestamp, ranks and message, for logs that SGLang
did not format itself (`SGLANG_LOGGING_CONFIG_PATH`, a wrapper's own logging setup).

A grammar is a regular expression with named groups `timestamp`, `message` and optionally
`ranks`, matched at the start of each line. A matching line is rewritten into SGLang's own record
form, `[YYYY-MM-DD HH:MM:SS[.ffffff][ RANKS]] message`, so the SGLang parser and every rule read it
exactly as a plain SGLang line. A line that does not match is no record start (a continuation of
a multi-line message, such as a request log holding user text): if it could pass for a batch,
`server_args` or health-check line it is marked (`NOT_A_RECORD` in front), so that it never counts
as one; the request-log injection guard holds under every grammar.

Presets: `python-logging`, Python's `%(asctime)s %(levelname)s %(process)d [%(filename)s:%(lineno)d]
%(message)s` (CPython `logging` docs, LogRecord attributes; `asctime` `YYYY-MM-DD HH:MM:SS,mmm`, or
without `,mmm` under a `datefmt`), as in an SGLang run with `SGLANG_LOGGING_CONFIG_PATH`
(https://github.com/mit-han-lab/fastrl/pull/4); `sglang`, SGLang's default
`[%(asctime)s{.msecs}{ rank tokens}] %(message)s` (`configure_logger`,
sglang/srt/utils/common.py@0.5.23), read by the parser directly (no rewriting).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, tzinfo

from specwatch.sources.container import strip_container_prefix
from specwatch.sources.filestream import LineBatch

PRESETS = {
    "python-logging": (r"(?P<timestamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:,\d{3})?) (?P<level>[A-Z]+) "
                       r"(?P<process>\d+) \[(?P<source>[^\]]*)\] (?P<message>.*)"),
    "sglang": (r"\[(?P<timestamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,6})?)"
               r"(?P<ranks>(?: [A-Z][A-Z_]*\d+)*)\] (?P<message>.*)"),
}
REQUIRED_GROUPS = ("timestamp", "message")
NOT_A_RECORD = "\u2026 "  # "… ": no record starts like this, so no batch line either

_TS = re.compile(r"(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)(?:[.,](\d{1,9}))?\s*(Z|[+-]\d\d:?\d\d)?")
_RANK = re.compile(r"([A-Za-z][A-Za-z_]*?)[\s=:]*(\d+)")


def problem(pattern: str) -> str | None:
    """What makes `pattern` unusable as a grammar (not a regex, a required group missing), else None."""
    try:
        rx = re.compile(pattern)
    except re.error as e:
        return f"not a valid regular expression ({e})"
    missing = [g for g in REQUIRED_GROUPS if g not in rx.groupindex]
    if missing:
        return f"has no named group {', '.join(f'(?P<{g}>...)' for g in missing)}"
    return None


def _stamp(text: str, tz: tzinfo | None) -> str | None:
    """A timestamp as the SGLang prefix writes it (`YYYY-MM-DD HH:MM:SS[.ffffff]`, the log's zone
    `tz`, None: local time); None when it does not read. One with a zone is converted to `tz`."""
    m = _TS.fullmatch(text.strip())
    if m is None:
        return None
    date, clock, frac, zone = m.groups()
    if zone:
        try:
            dt = datetime.fromisoformat(f"{date}T{clock}{'+00:00' if zone == 'Z' else zone}")
        except ValueError:
            return None
        dt = dt.astimezone(tz) if tz is not None else dt.astimezone()
        date, clock = dt.strftime("%Y-%m-%d"), dt.strftime("%H:%M:%S")
    return f"{date} {clock}.{frac[:6]}" if frac else f"{date} {clock}"


class Grammar:
    """One compiled grammar. `rewrite(line)`: the line in SGLang's record form, or marked as no
    record start (see the module docstring). `container_prefix`: stripped before matching (the
    pipeline's own `container_prefix`); `tz`: the log's zone, for timestamps that carry one."""

    def __init__(self, pattern: str, *, container_prefix: re.Pattern | None = None,
                 tz: tzinfo | None = None) -> None:
        why = problem(pattern)
        if why:
            raise ValueError(f"grammar {pattern!r}: {why}")
        self.pattern = pattern
        self._rx = re.compile(pattern)
        self._has_ranks = "ranks" in self._rx.groupindex
        self._prefix = container_prefix
        self._tz = tz

    def rewrite(self, line: str) -> str:
        text = strip_container_prefix(line, self._prefix)
        m = self._rx.match(text)
        if m is not None:
            stamp = _stamp(m.group("timestamp") or "", self._tz)
            if stamp is not None:
                ranks = m.group("ranks") if self._has_ranks else None
                if ranks:
                    ranks = " ".join(f"{k.upper()}{n}" for k, n in _RANK.findall(ranks))
                return f"[{stamp}{' ' + ranks if ranks else ''}] {m.group('message') or ''}"
        if "batch" in text or "server_args=" in text or "Health check failed" in text:
            return NOT_A_RECORD + text
        return text


class Regrammar:
    """`on_lines` stage: each batch's lines rewritten by `grammar`, passed to `on_lines`."""

    def __init__(self, grammar: Grammar, on_lines: Callable[[LineBatch], None]) -> None:
        self.grammar = grammar
        self._on_lines = on_lines

    def __call__(self, batch: LineBatch) -> None:
        rewrite = self.grammar.rewrite
        self._on_lines(LineBatch(batch.path, batch.start, batch.end, lines=[rewrite(t) for t in batch.lines],
                                 raw_ok=batch.raw_ok, bounds=batch._bounds_list()))

