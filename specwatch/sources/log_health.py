"""The followed log sources' own health as events: `SourceHealth` on each change.

A file follower (sources/filestream.py) is ok while it holds the file open; a journal follower
(sources/journal.py) while journalctl runs without an error. Read between the followers' poll
rounds (their own thread): `is_open`, and for a closed file one `stat` saying why.
"""

from __future__ import annotations

import os
from typing import Callable, Protocol

from specwatch.events import SourceHealth
from specwatch.sources.filestream import Follower


class Followed(Protocol):
    """What a follower shows here: a `Follower` (sources/filestream.py) or a `JournalFollower`
    (sources/journal.py, whose `error` says why journalctl is not running)."""

    @property
    def is_open(self) -> bool: ...


def _why_closed(path: str) -> str:
    """Why a followed path is not open, in words."""
    try:
        os.stat(path)
    except FileNotFoundError:
        parent = os.path.dirname(path) or "."
        return "does not exist" if os.path.isdir(parent) else f"does not exist (nor its directory {parent})"
    except OSError as e:
        return f"cannot be looked at: {e}"
    if os.path.isdir(path):
        return "is a directory"
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        return f"cannot be read: {e}"
    return "not open yet"


class LogHealth:
    """emit: `(server, event, now)`; server_for: followed path → server. `check(followers, now)`
    emits a `SourceHealth` for each follower whose (ok, state) differs from the last one
    emitted (every follower at the first check); a follower no longer there is forgotten."""

    def __init__(self, emit: Callable[[str, object, float], None], server_for: Callable[[str], str]):
        self.emit = emit
        self.server_for = server_for
        self._last: dict[str, tuple[bool, str]] = {}

    def check(self, followers: dict[str, Followed], now: float) -> None:
        for path in self._last.keys() - followers.keys():
            del self._last[path]
        for path, f in followers.items():
            journal = not isinstance(f, Follower)  # sources/journal.py's JournalFollower
            ok = bool(f.is_open)
            if ok:
                state = ""
            elif journal:
                state = str(getattr(f, "error", None) or "journalctl is not running")
            else:
                state = _why_closed(path)
            if self._last.get(path) != (ok, state):
                self._last[path] = (ok, state)
                kind = "journal" if journal else "file"
                self.emit(self.server_for(path), SourceHealth(now, kind, path, ok, state), now)
