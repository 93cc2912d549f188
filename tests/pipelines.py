"""A `Pipeline` that reads a whole log file as `replay` does (Follower reads, no notifiers)."""

from __future__ import annotations

from specwatch.alerting import build_alerting
from specwatch.config import LogSource, build_config
from specwatch.pipeline import Pipeline
from specwatch.sources.filestream import Follower


def read_log(path, doc: dict | None = None, chunk: int = 1 << 20) -> Pipeline:
    """`path` read through a pipeline of config `doc` in reads of `chunk` bytes, to its end."""
    cfg = build_config(doc or {}, for_run=False)
    cfg.logs.append(LogSource(path=str(path), server=cfg.server))
    dispatcher, _ = build_alerting(cfg, state_dir=None, replay=True, notify=False, slack_dry_run=None)
    p = Pipeline(cfg, dispatcher, diagnosis_background=False)
    f = Follower(str(path), on_lines=p.feed_batch, max_line_bytes=1 << 20, read_chunk_bytes=chunk)
    while f.poll():
        pass
    f.finish()
    p.flush_errors()  # the end of the log, as replay ends it: its last lines decided
    return p
