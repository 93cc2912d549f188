"""The registry of the engines specwatch reads: their names (`NAMES`), each one's log grammar
(`GRAMMARS`, the two calls the pipeline makes) and the dispatch between them. Each engine's
modules live in its own folder, `specwatch/engines/<name>/` (docs/engines.md).

SGLang's grammar (engines/sglang/log.py) reads a line first; a line it leaves as OtherLine that
could be vLLM's goes to engines/vllm/log.py. The two never both match: SGLang lines start with a
`[YYYY-MM-DD …]` bracket, vLLM lines with `LEVEL MM-DD …` (after a process tag).

A log is one engine's: `LogEngine` (one per log source) tries both only until a line of one is
read, then runs that engine's checks alone (an SGLang log's many non-batch lines skip vLLM's
substring scans, and a vLLM log's skip SGLang's).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import tzinfo
from typing import NamedTuple

from specwatch.core.events import MalformedLine, OtherLine, UnrecognizedLine
from specwatch.engines.sglang import log as sglang_log
from specwatch.engines.vllm import log as vllm_log

_sglang_maybe, _vllm_maybe = sglang_log.maybe_event, vllm_log.maybe_event
_sglang_parse, _vllm_parse = sglang_log.parse_line, vllm_log.parse_line
SGLANG, VLLM = "sglang", vllm_log.ENGINE


class Grammar(NamedTuple):
    """What one engine's `log` module gives the registry."""

    maybe_event: Callable[[str], bool]
    parse_line: Callable[..., object]


# In the order `parse_line` tries them.
GRAMMARS = {SGLANG: Grammar(_sglang_maybe, _sglang_parse), VLLM: Grammar(_vllm_maybe, _vllm_parse)}
NAMES = tuple(GRAMMARS)
TITLES = {SGLANG: "SGLang", VLLM: "vLLM"}  # each engine as its project writes its name, for messages
_NOT_PROOF = (OtherLine, UnrecognizedLine, MalformedLine)  # lines that do not tell the engine


def maybe_event(text: str) -> bool:
    """False when `parse_line(text)` is certainly OtherLine."""
    return _sglang_maybe(text) or _vllm_maybe(text)


def parse_line(text: str, *, container_prefix: re.Pattern | None = None, tz: tzinfo | None = None) -> object:
    """SGLang's `parse_line`, else vLLM's (its parsed lines go through `vllm_log.VllmAssembler`)."""
    event = _sglang_parse(text, container_prefix=container_prefix, tz=tz)
    if type(event) is OtherLine and _vllm_maybe(text):
        return _vllm_parse(text, container_prefix=container_prefix, tz=tz)
    return event


_ACCEPT_LEN = re.compile(rb"accept len: (\d+(?:\.\d+)?)")


def low_accept_in(data: bytes, at_most: float) -> bool:
    """Whether raw log bytes (plain, or in a Docker JSON or CRI envelope) may hold a decode line
    whose accept length is at most `at_most`: SGLang's `accept len: X` (also `block accept len`,
    0.5.18+) with X <= at_most, or any vLLM spec-decoding line (every form says `acceptance`: V1
    `Mean acceptance length` / `Draft acceptance rate`, V0 `Speculative metrics: Draft acceptance
    rate`; they come every few seconds: never held back). False for no such line; a line cut
    short may say True."""
    if b"acceptance" in data:
        return True
    if b"accept len: " not in data:
        return False
    if at_most < 2.0 and b"accept len: 0" not in data and b"accept len: 1" not in data:
        return False  # the usual read: every value is 2 or more (SGLang prints no sign, no space)
    return any(float(m[1]) <= at_most for m in _ACCEPT_LEN.finditer(data))


class LogEngine:
    """The grammar of one log source: `maybe_event(text)` and `parse_line(text, *,
    container_prefix, tz)` as the module's functions, those of both engines while `name` is None,
    then those of the engine `name` ("sglang" or "vllm") alone. `name` is set by the config (a
    `format:` grammar rewrites lines into SGLang's form) or by the first line read as one
    engine's event (a batch, stats, spec or settings line; not a malformed or other line)."""

    __slots__ = ("name", "maybe_event", "parse_line")

    def __init__(self, name: str | None = None):
        self.name: str | None = None
        self.maybe_event: Callable[[str], bool] = maybe_event
        self.parse_line: Callable[..., object] = self._detect
        if name is not None:
            self.settle(name)

    def settle(self, name: str) -> None:
        """From now on read this log as `name`'s ("sglang" or "vllm"; ValueError otherwise)."""
        grammar = GRAMMARS.get(name)
        if grammar is None:
            raise ValueError(f"unknown engine {name!r}")
        self.maybe_event, self.parse_line = grammar
        self.name = name

    def _detect(self, text: str, *, container_prefix: re.Pattern | None = None, tz: tzinfo | None = None) -> object:
        event = parse_line(text, container_prefix=container_prefix, tz=tz)
        if not isinstance(event, _NOT_PROOF):
            self.settle(VLLM if isinstance(event, vllm_log.VllmLine) else SGLANG)
        return event
