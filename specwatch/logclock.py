"""Logs whose timestamps run far off the host clock, and the zone that reads them right.

SGLang stamps its lines in the local time of its own container (no zone written). A container
in a zone east or west of the host, with `logs[].timezone` / `log_timezone` unset, gives lines
stamped hours ahead or behind: rules clock alerts by the log, the dispatcher by the wall, and
mixed they misfire (alerts held, resolved at once, negative durations). The daemon measures each
log's offset before it reads the log's first line (the newest stamp near the end of the file
against the file's mtime), warns once, exports it, and reads the log in a zone shifted by it,
so log time is wall time again.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta, timezone, tzinfo

from specwatch.sources.sglang_log import bracket_prefix

log = logging.getLogger(__name__)

WARN_AFTER = 300.0  # seconds off the wall clock that say the log's zone is wrong
ZONE_STEP = 900.0  # zones are whole quarter hours off UTC
MAX_ZONE = 23 * 3600.0  # beyond this no zone explains it (and a tzinfo must stay under 24 h)
TAIL_BYTES = 16384  # the end of a file searched for its newest stamp


class LogClocks:
    """Per followed path: the log clock's offset from the wall clock, seconds (log - wall;
    0.0 when within `WARN_AFTER`), learned once per config."""

    def __init__(self) -> None:
        self.offsets: dict[str, float] = {}
        self._zones: dict[str, tzinfo] = {}
        self.server_of: dict[str, str] = {}

    def zone(self, path: str, tz: tzinfo | None) -> tzinfo | None:
        """The zone to read `path` in: `tz` (the configured one, None: local time), shifted by
        the learned offset."""
        return self._zones.get(path, tz)

    def learn(self, path: str, server: str, tz: tzinfo | None) -> None:
        """Measure `path`'s offset once, before its first line is read: the newest `[date time]`
        stamp in the file's last TAIL_BYTES against the file's mtime (when the last bytes were
        written: old lines read late, e.g. after a restart, do not count). Offsets that are not
        whole quarter hours off (a log idle for a while, then an unstamped line) and paths that
        are not files (a journal) or hold no stamp (vLLM) record 0.0: read as configured."""
        self.offsets[path] = 0.0
        self.server_of[path] = server
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                f.seek(max(0, st.st_size - TAIL_BYTES))
                tail = f.read(TAIL_BYTES).decode("utf-8", "replace").splitlines()
        except OSError:
            return
        ts = next((t for t in (bracket_prefix(x, tz)[0] for x in reversed(tail)) if t is not None), None)
        if ts is None:
            return
        off = ts - st.st_mtime
        self.server_of[path] = server
        if abs(off) <= WARN_AFTER:
            self.offsets[path] = 0.0
            return
        if abs(off) > MAX_ZONE:  # not a zone: an old log written now (a copy, a test); left as it is
            self.offsets[path] = 0.0
            return
        zoned = round(off / ZONE_STEP) * ZONE_STEP
        if abs(off - zoned) >= 120:  # not a zone: the log was idle, then wrote an unstamped line
            return
        off = self.offsets[path] = zoned
        base = (datetime.now(tz) if tz is not None else datetime.now().astimezone()).utcoffset()
        if abs(base.total_seconds() + off) >= 86400:
            self.offsets[path] = 0.0
            return
        self._zones[path] = timezone(base + timedelta(seconds=off))
        log.warning("log %s: its timestamps run %s %s the wall clock (%s); read as if in that zone "
                    "from now on. Set `logs[].timezone` (or `log_timezone`) to the zone of the server's "
                    "container (an IANA name)", path, _span(off),
                    "ahead of" if off > 0 else "behind", _utc(base + timedelta(seconds=off)))

    def by_server(self) -> dict[str, float]:
        """server → the largest offset (by size) among its logs, seconds."""
        out: dict[str, float] = {}
        for path, off in dict(self.offsets).items():  # read off the followers' thread
            s = self.server_of.get(path, "")
            if abs(off) >= abs(out.get(s, 0.0)):
                out[s] = off
        return out


def _span(seconds: float) -> str:
    """`+5h`, `-5h30m`, `+7m12s`."""
    s = int(abs(seconds))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    text = (f"{h}h" if h else "") + (f"{m}m" if m else "") + (f"{sec}s" if sec else "")
    return ("+" if seconds > 0 else "-") + (text or "0s")


def _utc(offset: timedelta) -> str:
    """`UTC+05:00`."""
    z = datetime.now(timezone(offset)).strftime("%z")
    return f"UTC{z[:3]}:{z[3:5]}"
