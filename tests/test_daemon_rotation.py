"""`specwatch run` stopped (SIGTERM) across rotations: what is still on disk is read exactly once
at the next start, and what is gone is counted and warned about."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from procs import decode_line, rank_labels, wait_for
from rotating_writer import RotatingWriter
from specwatch_daemon import SpecwatchDaemon

LOST = "specwatch_log_rotated_files_lost_total"


def write(log: Path, first: int, n: int) -> None:
    with open(log, "a") as f:
        for i in range(first, first + n):
            f.write(decode_line(3.0, f"16:{i // 60:02d}:{i % 60:02d}"))


def batches(d: SpecwatchDaemon) -> float | None:
    return d.scrape().get(("specwatch_decode_batches_total", rank_labels()))


def test_two_rotations_while_stopped_the_first_copy_deleted(tmp_path):
    """Stopped; 5 lines; `mv log log.1`; 5 lines; `rm log.1; mv log log.1`; 5 lines; started:
    the 5 lines of the removed file are counted lost (one file, a warning naming it), the 10
    still on disk are read once each."""
    log = tmp_path / "sglang.log"
    write(log, 0, 100)
    d = SpecwatchDaemon(tmp_path, log)
    d.start()
    wait_for(lambda: batches(d) == 100, what="100 decode batches")
    rc, out = d.stop()
    assert rc == 0, out

    write(log, 100, 5)
    os.rename(log, f"{log}.1")
    write(log, 105, 5)
    os.unlink(f"{log}.1")
    os.rename(log, f"{log}.1")
    write(log, 110, 5)

    d.start()
    wait_for(lambda: batches(d) == 110, what="the 10 decode batches still on disk")
    m = d.scrape()
    assert m[(LOST, (("path", str(log)),))] == 1
    write(log, 115, 5)  # and on from there, once each
    wait_for(lambda: batches(d) == 115, what="5 more decode batches")
    rc, out = d.stop()
    assert rc == 0, out
    warnings = [ln for ln in out.splitlines() if "lines lost" in ln]
    assert len(warnings) == 1 and "WARNING" in warnings[0] and str(log) in warnings[0], warnings
    assert "before the stop" in warnings[0]


@pytest.mark.parametrize("mode", ["mv", "numbered"])
def test_a_rotation_storm_while_running_counts_every_line_once(tmp_path, mode):
    """A writer renaming its log every 0.2 s (`mv log log.1`, or `.N` → `.N+1` with every copy
    kept) at 2,000 decode lines/s for 2 s, `specwatch run` at its default cadence: every line is
    counted once, nothing is lost."""
    log = tmp_path / "sglang.log"
    log.touch()
    d = SpecwatchDaemon(tmp_path, log, extra={"follow": {}})  # the default poll_interval
    d.start()
    w = RotatingWriter(log, mode=mode, rate=2000, seconds=2.0, every=0.2,
                       fmt=decode_line(3.0, "16:00:00").replace("#token: 2268", "#token: %d"))
    try:
        written, rotations = w.wait(60)
    finally:
        w.kill()
    assert rotations >= 8
    wait_for(lambda: batches(d) == written, timeout=30, what=f"{written} decode batches")
    time.sleep(1.0)  # a line read twice would show now
    m = d.scrape()
    assert batches(d) == written
    assert m[(LOST, (("path", str(log)),))] == 0
    rc, out = d.stop()
    assert rc == 0, out
