"""The log grammars of the engines specwatch reads, behind the two calls the pipeline makes.

SGLang's grammar (sources/sglang_log.py) reads a line first; a line it leaves as OtherLine that
could be vLLM's goes to sources/vllm_log.py. The two never both match: SGLang lines start with a
`[YYYY-MM-DD …]` bracket, vLLM lines with `LEVEL MM-DD …` (after a process tag).
"""

from __future__ import annotations

import re
from datetime import tzinfo

from specwatch.events import OtherLine
from specwatch.sources import sglang_log, vllm_log

_sglang_maybe, _vllm_maybe = sglang_log.maybe_event, vllm_log.maybe_event
_sglang_parse, _vllm_parse = sglang_log.parse_line, vllm_log.parse_line


def maybe_event(text: str) -> bool:
    """False when `parse_line(text)` is certainly OtherLine."""
    return _sglang_maybe(text) or _vllm_maybe(text)


def parse_line(text: str, *, container_prefix: re.Pattern | None = None, tz: tzinfo | None = None) -> object:
    """SGLang's `parse_line`, else vLLM's (its parsed lines go through `vllm_log.VllmAssembler`)."""
    event = _sglang_parse(text, container_prefix=container_prefix, tz=tz)
    if type(event) is OtherLine and _vllm_maybe(text):
        return _vllm_parse(text, container_prefix=container_prefix, tz=tz)
    return event
