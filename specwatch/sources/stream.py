"""One interface for every source of log lines, as mtail's `logstream` hides a file from a pipe
or a socket (github.com/google/mtail, internal/tailer/logstream): a followed file and its
rotations (`filestream.Follower`, also behind a container log's envelope: `logfiles.stage`) and a
systemd journal (`journal.JournalFollower`). The daemon, the followers' group and the source
health check hold `LineStream`s and never ask which kind they hold; `open_stream` is the one
place that picks the kind, from the config entry.

Each kind says, as class attributes, what differs: `kind` (the `source_kind` of
`SpecwatchSourceDown`, the status page), `watches_file` (inotify watches its path, else it is
polled each round), `first_read_is_history` (a new source is read from its start: what it holds
is history, saved only once read; a journal resumes by cursor instead), `warns_when_closed`
(it logs why it is closed itself) and `collector` (its own Prometheus families, registered once
per kind)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol

if TYPE_CHECKING:
    import threading

    from specwatch.config import LogSource
    from specwatch.sources.filestream import LineBatch


class LineStream(Protocol):
    path: str
    kind: ClassVar[str]
    watches_file: ClassVar[bool]
    first_read_is_history: ClassVar[bool]
    warns_when_closed: ClassVar[bool]
    collector: ClassVar[Any]  # a Collector class taking `() -> {path: stream}`, or None
    stopping: threading.Event | None  # set by the FollowerGroup: a long read ends when it is

    @property
    def is_open(self) -> bool: ...

    def why_closed(self) -> str:
        """Why it is not open, in words (for the health check and the status page)."""
        ...

    def poll(self) -> int: ...

    def checkpoint(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def open_stream(src: LogSource, on_lines: Callable[[LineBatch], None], *, max_line_bytes: int,
                checkpoint: dict[str, Any] | None = None) -> LineStream:
    """The stream of `src` (a `logs[]` entry), passing its lines to `on_lines` from `checkpoint`."""
    if src.journal is not None:
        from specwatch.sources.journal import JournalFollower  # a subprocess reader: only when configured

        return JournalFollower(src.journal, on_lines, max_line_bytes=max_line_bytes, checkpoint=checkpoint)
    from specwatch.sources.filestream import READ_BYTES, Follower
    from specwatch.sources.logfiles import stage

    return Follower(src.path, on_lines=stage(src, on_lines, max_line_bytes), max_line_bytes=max_line_bytes,
                    checkpoint=checkpoint, read_chunk_bytes=READ_BYTES)
