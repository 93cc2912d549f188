"""The followed log sources' own health as events: `SourceHealth` on each change.

A file follower (sources/filestream.py) is ok while it holds the file open; a journal follower
(sources/journal.py) while journalctl runs without an error. Read between the followers' poll
rounds (their own thread): `is_open`, and for a closed one its `why_closed` (a file: one `stat`).
"""

from __future__ import annotations

from typing import Callable

from specwatch.core.events import SourceHealth
from specwatch.sources.stream import LineStream


class LogHealth:
    """emit: `(server, event, now)`; server_for: followed path → server. `check(followers, now)`
    emits a `SourceHealth` for each follower whose (ok, state) differs from the last one
    emitted (every follower at the first check); a follower no longer there is forgotten."""

    def __init__(self, emit: Callable[[str, object, float], None], server_for: Callable[[str], str]):
        self.emit = emit
        self.server_for = server_for
        self._last: dict[str, tuple[bool, str]] = {}

    def check(self, followers: dict[str, LineStream], now: float) -> None:
        for path in self._last.keys() - followers.keys():
            del self._last[path]
        for path, f in followers.items():
            ok = bool(f.is_open)
            state = "" if ok else f.why_closed()
            if self._last.get(path) != (ok, state):
                self._last[path] = (ok, state)
                self.emit(self.server_for(path), SourceHealth(now, f.kind, path, ok, state), now)
