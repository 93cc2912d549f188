"""SGLang logs for the status page tests and docs/make_screenshots.py: decode lines stamped in
the last hour (local time, as SGLang writes them), so a live daemon charts them."""

from __future__ import annotations

import math
import time
from pathlib import Path

from procs import decode_line
from sglang_lines import server_args_line

# A model path and a draft path carrying markup: the page must show them as text.
HOSTILE_MODEL = "/models/<script>document.title='pwned'</script>"
HOSTILE_DRAFT = "/drafts/<img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">"


def stamp(t: float) -> tuple[str, str]:
    """(day, time of day) of `t` in local time, as in an SGLang log line."""
    day, clock = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)).split()
    return day, clock


def args_line(t: float, **overrides) -> str:
    day, clock = stamp(t)
    return server_args_line(ts=f"{day} {clock}", **overrides)[0] + "\n"


def episode_log(path: Path, *, end: float, minutes: int = 30, every: int = 5,
                ranks: dict[str, list[tuple[int, int]]], model: str = HOSTILE_MODEL,
                draft: str = HOSTILE_DRAFT) -> None:
    """A server_args line, then a decode line per rank every `every` s for `minutes` up to `end`
    (seconds since the epoch). `ranks`: rank → collapse spans as (from, to) seconds after the
    first line, accept len 1.02 inside them, a slow wave of 2.6-3.2 outside."""
    t0 = int(end) - minutes * 60
    lines = [args_line(t0 - 1, model_path=model, speculative_draft_model_path=draft)]
    for i in range(0, minutes * 60, every):
        for n, (rank, spans) in enumerate(ranks.items()):
            low = any(a <= i < b for a, b in spans)
            day, clock = stamp(t0 + i)
            accept = 1.02 if low else 2.9 + 0.3 * math.sin(i / 240 + n)
            lines.append(decode_line(accept, clock, rank=rank, day=day, thr=900.0 - 500 * low))
    Path(path).write_text("".join(lines))
