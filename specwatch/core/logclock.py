"""Logs whose timestamps run far off the host clock, and the zone that reads them right.

SGLang stamps its lines in the local time of its own container (no zone written). A container
in a zone east or west of the host, with `logs[].timezone` / `log_timezone` unset, gives lines
stamped hours ahead or behind: rules clock alerts by the log, the dispatcher by the wall, and
mixed they misfire (alerts held, resolved at once, negative durations). The daemon measures each
log's offset before it reads the log's first line (the stamp of the file's last line against
the file's mtime), warns once, exports it, and reads the log in a zone shifted by it,
so log time is wall time again.

Only a stamp that the file's mtime dates is evidence: the file's last line, stamped. A log idle
for an hour, then a traceback without stamps, has its newest stamp an hour behind the mtime,
which is an idle gap, not a zone; whatever came after the last stamp, nothing is decided (the
log is read as configured, or in the zone learned before). A zone that would read the last
line later than the mtime (more than `FUTURE_SLACK`: stamps are whole seconds) is not taken
either: a line is never written before it happened, so no zone may date it in the future.

The offset follows the log: a live read whose last stamp, read in the log's current zone, is
more than `WARN_AFTER` off the wall clock measures the offset again (the same way; at most once
per `RELEARN_EVERY` seconds per log), so a log that ran hours off when the daemon started and
came back (or one that steps off while it runs) is read on the wall clock again within that
bound. Each change is logged once.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import datetime, timedelta, timezone, tzinfo

from specwatch.engines.sglang.log import bracket_prefix

log = logging.getLogger(__name__)

WARN_AFTER = 300.0  # seconds off the wall clock that say the log's zone is wrong
ZONE_STEP = 900.0  # zones are whole quarter hours off UTC
MAX_ZONE = 23 * 3600.0  # beyond this no zone explains it (and a tzinfo must stay under 24 h)
TAIL_BYTES = 16384  # the end of a file searched for its last line
RELEARN_EVERY = 10.0  # seconds of wall time between two measures of one log's offset
FUTURE_SLACK = 2.0  # seconds a zoned stamp may read past the mtime (whole-second stamps, coarse mtimes)


class LogClocks:
    """Per followed path: the log clock's offset from the wall clock, seconds (log - wall;
    0.0 when within `WARN_AFTER`), learned at the first read under a config and measured again
    when a live read's stamps leave the wall clock (`follow`)."""

    def __init__(self) -> None:
        self.offsets: dict[str, float] = {}
        self._zones: dict[str, tzinfo] = {}
        self.server_of: dict[str, str] = {}
        self._measured: dict[str, float] = {}  # path → wall time of its last measure (`follow`)

    def zone(self, path: str, tz: tzinfo | None) -> tzinfo | None:
        """The zone to read `path` in: `tz` (the configured one, None: local time), shifted by
        the learned offset."""
        return self._zones.get(path, tz)

    def follow(self, path: str, server: str, tz: tzinfo | None, last_line: str, now: float) -> None:
        """After a live read at wall time `now` whose last line is `last_line`: when its stamp,
        read in `zone(path, tz)`, is more than WARN_AFTER off `now`, measure the offset again
        (`learn`), at most once per RELEARN_EVERY seconds. A line without a stamp changes nothing."""
        if last_line[:1] != "[" or now - self._measured.get(path, -RELEARN_EVERY) < RELEARN_EVERY:
            return
        ts = bracket_prefix(last_line, self.zone(path, tz))[0]
        if ts is not None and abs(ts - now) > WARN_AFTER:
            self.learn(path, server, tz, now)

    def learn(self, path: str, server: str, tz: tzinfo | None, now: float | None = None) -> None:
        """Measure `path`'s offset (before its first line is read; again from `follow`), and read
        it in the zone that offset gives from now on: the stamp of the file's last line (within
        its last TAIL_BYTES) against the file's mtime (when that line was written: old lines read
        late, e.g. after a restart, do not count). A last line without a stamp (a traceback, a
        uvicorn line after an idle gap) is no evidence: the offset stays as it was (0.0 at the
        first measure). Offsets that are not whole quarter hours off, that would date the line
        after the mtime, and paths that are not files (a journal) record 0.0: read as
        configured. `now`: wall time of the measure (default: the clock). A change of offset is
        logged once."""
        old = self.offsets.get(path)
        self._measured[path] = time.time() if now is None else now
        self.server_of[path] = server
        off = self._measure(path, tz)
        if off is None:
            off = 0.0 if old is None else old
        if off == old:
            return
        self.offsets[path] = off
        if not off:
            if self._zones.pop(path, None) is not None:
                log.warning("log %s: its timestamps are back on the wall clock; read in its configured zone again",
                            path)
            return
        base = _utc_offset_now(tz)
        self._zones[path] = timezone(base + timedelta(seconds=off))
        log.warning("log %s: its timestamps run %s %s the wall clock (%s); read as if in that zone "
                    "from now on. Set `logs[].timezone` (or `log_timezone`) to the zone of the server's "
                    "container (an IANA name)", path, _span(off),
                    "ahead of" if off > 0 else "behind", _utc(base + timedelta(seconds=off)))

    @staticmethod
    def _measure(path: str, tz: tzinfo | None) -> float | None:
        """`path`'s offset as `learn` takes it (0.0: read as configured; None: no evidence, the
        file's last line has no stamp)."""
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                f.seek(max(0, st.st_size - TAIL_BYTES))
                tail = f.read(TAIL_BYTES).decode("utf-8", "replace").splitlines()
        except OSError:
            return 0.0
        last = next((x for x in reversed(tail) if x.strip()), "")
        ts = bracket_prefix(last, tz)[0] if last[:1] == "[" else None
        if ts is None:  # what came last is undated: the stamps before it may be an idle gap old
            return None
        off = ts - st.st_mtime
        if abs(off) <= WARN_AFTER or abs(off) > MAX_ZONE:  # on the clock; or not a zone: an old log written now
            return 0.0
        zoned = round(off / ZONE_STEP) * ZONE_STEP
        # written at most a while after its stamp (a buffered write), never before it
        if not -120 < off - zoned <= FUTURE_SLACK:
            return 0.0
        base = _utc_offset_now(tz)
        if abs(base.total_seconds() + zoned) >= 86400:
            return 0.0
        return zoned

    def by_server(self) -> dict[str, float]:
        """server → the largest offset (by size) among its logs, seconds."""
        out: dict[str, float] = {}
        for path, off in dict(self.offsets).items():  # read off the followers' thread
            s = self.server_of.get(path, "")
            if abs(off) >= abs(out.get(s, 0.0)):
                out[s] = off
        return out


def last_line(batch) -> str:
    """The last line of a `filestream.LineBatch` (its text or bytes end in "\\n"), found without
    splitting a read the catch-up keeps as bytes."""
    if batch._lines is not None:
        return batch._lines[-1] if batch._lines else ""
    data = batch._text if batch._text is not None else batch._block
    if not data:
        return ""
    cut = data.rfind("\n" if isinstance(data, str) else b"\n", 0, len(data) - 1) + 1
    tail = data[cut:len(data) - 1]
    return tail if isinstance(tail, str) else tail.decode("utf-8", "replace")


def _utc_offset_now(tz: tzinfo | None) -> timedelta:
    """The UTC offset `tz` has now (None: this host's zone)."""
    off = (datetime.now(tz) if tz is not None else datetime.now().astimezone()).utcoffset()
    assert off is not None  # an aware datetime has one
    return off


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
