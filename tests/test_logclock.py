"""`LogClocks` on real files: which stamps decide a log's zone (specwatch/core/logclock.py).

The file's mtime dates only its last line; stamps before an unstamped line may be any idle gap
old, so they decide nothing, and no zone ever reads a line later than the file was written.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone

from procs import decode_line
from specwatch.core.logclock import LogClocks
from specwatch.engines.sglang.log import bracket_prefix

UTC = timezone.utc
# BR-47's second exception, printed without SGLang's stamp (tests/data/samples/bugreport-logs/BR-47.log).
TRACEBACK = ("Traceback (most recent call last):\n"
             "    raise Exception(\n"
             "Exception: Capture cuda graph failed: CUDA error: operation failed due to a previous error during capture\n")


def _stamped(t: float) -> str:
    s = datetime.fromtimestamp(t, UTC)
    return decode_line(2.9, s.strftime("%H:%M:%S"), day=s.strftime("%Y-%m-%d"))


def _log(path, text: str, mtime: float):
    path.write_text(text)
    os.utime(path, (mtime, mtime))
    return str(path)


def test_no_idle_gap_then_an_unstamped_line_is_a_zone(tmp_path):
    """Every idle gap from 5 minutes to 5 hours, in 20 s steps, then a traceback: no offset."""
    now = time.time()
    misread = []
    for gap in range(300, 5 * 3600, 20):
        clocks = LogClocks()
        path = _log(tmp_path / f"idle-{gap}.log", _stamped(now - gap) + TRACEBACK, now)
        clocks.learn(path, "box", UTC, now)
        if clocks.offsets[path] or clocks.zone(path, UTC) is not UTC:
            misread.append(gap)
    assert not misread, f"{len(misread)} idle gaps read as a zone, e.g. {misread[:5]}"


def test_a_zone_ahead_then_an_idle_hour_is_not_dated_in_the_future(tmp_path):
    """The container runs 2 h ahead; its last stamped line is an hour old, then a traceback: the
    newest stamp is +1 h off the mtime, a zone that would date every new line an hour ahead.
    Nothing is decided until a stamped line comes last: then +2 h, and the line reads now."""
    now = time.time()
    clocks = LogClocks()
    path = _log(tmp_path / "s.log", _stamped(now - 3600 + 7200) + TRACEBACK, now)
    clocks.learn(path, "box", UTC, now)
    assert clocks.offsets[path] == 0.0 and clocks.zone(path, UTC) is UTC
    line = _stamped(now + 7200)
    with open(path, "a") as f:
        f.write(line)
    os.utime(path, (now, now))
    clocks.follow(path, "box", UTC, line, now + 20)
    assert clocks.offsets[path] == 7200.0
    read = bracket_prefix(line, clocks.zone(path, UTC))[0]
    assert now - 2 <= read <= now


def test_a_zone_that_dates_the_last_line_after_its_write_is_not_taken(tmp_path):
    """The last line is stamped 14 min 50 s behind the mtime: a zone 15 min west would read it
    10 s after it was written, so it is no zone (a line written late, read as it is)."""
    now = time.time()
    clocks = LogClocks()
    path = _log(tmp_path / "s.log", _stamped(now - 890), now)
    clocks.learn(path, "box", UTC, now)
    assert clocks.offsets[path] == 0.0 and clocks.zone(path, UTC) is UTC


def test_a_learned_zone_stays_while_an_unstamped_line_comes_last(tmp_path):
    """+5 h learned from a stamped last line; a measure after a traceback keeps it (no evidence
    either way), a measure on a stamped line on the wall clock ends it."""
    now = time.time()
    clocks = LogClocks()
    path = _log(tmp_path / "s.log", _stamped(now + 5 * 3600), now)
    clocks.learn(path, "box", UTC, now)
    assert clocks.offsets[path] == 5 * 3600.0
    with open(path, "a") as f:
        f.write(TRACEBACK)
    os.utime(path, (now + 3600, now + 3600))
    clocks.learn(path, "box", UTC, now + 3600)
    assert clocks.offsets[path] == 5 * 3600.0
    with open(path, "a") as f:
        f.write(_stamped(now + 3601))
    os.utime(path, (now + 3601, now + 3601))
    clocks.learn(path, "box", UTC, now + 3601)
    assert clocks.offsets[path] == 0.0 and clocks.zone(path, UTC) is UTC
