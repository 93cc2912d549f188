"""A log whose stamps run hours off the host clock for a while, then come back (real daemon).

Started while the stamps ran +2 h, the daemon learns the offset before the first line; once the
stamps are back on the wall clock it measures the offset again (`logclock.RELEARN_EVERY`) and
reads the log unshifted, so the last decode line is not read 2 h old (the shipped
`DecodeLogSilent` Prometheus rule would fire on that). An excursion +2 h while it runs does not
keep the status page's window on the future hour: the chart follows the log back.
"""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import datetime, timezone

from procs import decode_line, rank_labels, wait_for
from specwatch_daemon import SpecwatchDaemon

TP0 = rank_labels()
OFFSET = ("specwatch_log_clock_offset_seconds", (("server", "gpu-box-1"),))
LAST = ("specwatch_last_decode_batch_timestamp_seconds", TP0)
HOURS2 = 2 * 3600.0


def _write(log, shift: float, accept: float = 2.9) -> None:
    stamp = datetime.fromtimestamp(time.time() + shift, timezone.utc)
    with log.open("a") as f:
        f.write(decode_line(accept, stamp.strftime("%H:%M:%S"), day=stamp.strftime("%Y-%m-%d")))


def _status(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=10) as r:
        return json.loads(r.read())


def _tp0(s: dict) -> dict:
    (server,) = [x for x in s["servers"] if x["server"] == "gpu-box-1"]
    return next(r for r in server["ranks"] if r["rank"] == "TP0")


def _on_the_clock(d) -> bool:
    """Offset 0, the last decode line read now, and the status window on the present hour with
    the rank's newest point in it."""
    m = d.scrape()
    if m.get(OFFSET, 0) != 0 or abs(m.get(LAST, 0) - time.time()) > 60:
        return False
    s = _status(d.port)
    points = _tp0(s)["accept_length_history"]
    return (s["window"]["clock"] == "wall" and abs(s["window"]["end"] - time.time()) < 60
            and bool(points) and abs(points[-1][0] - time.time()) < 60
            and all(p[0] <= time.time() + 60 for p in points))


def test_started_while_the_stamps_ran_ahead_then_they_come_back(tmp_path):
    log = tmp_path / "sglang.log"
    for _ in range(3):
        _write(log, HOURS2)
    d = SpecwatchDaemon(tmp_path, log, env={"TZ": "UTC"}, extra={"diagnosis": {"enabled": False}})
    try:
        d.start()
        wait_for(lambda: d.scrape().get(("specwatch_decode_batches_total", TP0)) == 3, what="the backlog")
        assert d.scrape()[OFFSET] == HOURS2  # learned: the backlog is read on the wall clock
        assert abs(d.scrape()[LAST] - time.time()) < 60
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _on_the_clock(d):
            _write(log, 0)  # the server's clock is right again
            time.sleep(0.5)
        assert _on_the_clock(d), (d.scrape().get(OFFSET), d.scrape().get(LAST), time.time())
        for _ in range(4):  # and stays so
            _write(log, 0)
            time.sleep(0.3)
        assert _on_the_clock(d)
    finally:
        d.stop()
    clock_lines = [ln for ln in d.output.splitlines() if " WARNING " in ln and "clock" in ln]
    assert len(clock_lines) == 2, clock_lines  # the offset, then its end: each said once
    assert "+2h ahead of" in clock_lines[0] and "back on the wall clock" in clock_lines[1]


def test_an_excursion_ahead_while_running_leaves_no_future_window(tmp_path):
    log = tmp_path / "sglang.log"
    log.write_text("")
    d = SpecwatchDaemon(tmp_path, log, env={"TZ": "UTC"}, extra={"diagnosis": {"enabled": False}})
    try:
        d.start()
        for _ in range(3):
            _write(log, 0)
            time.sleep(0.3)
        wait_for(lambda: d.scrape().get(("specwatch_decode_batches_total", TP0)) == 3, what="the first lines")
        for _ in range(3):  # the server's clock jumps 2 h ahead for a moment
            _write(log, HOURS2)
            time.sleep(0.3)
        wait_for(lambda: d.scrape().get(("specwatch_decode_batches_total", TP0)) == 6, what="the excursion")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _on_the_clock(d):
            _write(log, 0)  # and back
            time.sleep(0.5)
        assert _on_the_clock(d), _status(d.port)["window"]
    finally:
        d.stop()


def _points(lines: list[str], columns: bool) -> list[tuple[float, float, int]]:
    from specwatch.alerts.dispatcher import Dispatcher
    from specwatch.config import build_config
    from specwatch.core.pipeline import Pipeline
    from specwatch.sources.filestream import LineBatch

    cfg = build_config({"server": "box", "log_timezone": "UTC", "logs": [{"path": "s.log"}],
                        "diagnosis": {"enabled": False}})
    p = Pipeline(cfg, Dispatcher([], group_wait=0, group_interval=0))
    text = "".join(lines)
    # with a wall clock, as `run` reads a backlog, or the lines' own, as `replay`
    p.feed_batch(LineBatch("s.log", 0, len(text.encode()), block=text.encode(), text=text),
                 time.time() if columns else None)
    p.flush_errors()  # the end of the file, as replay ends it
    return list(p.ranks[("box", "TP0")].history.points)


def test_the_chart_drops_an_excursions_future_points_and_keeps_the_rest():
    """As `run` and as `replay` alike: lines a few seconds out of order take no point; a line
    stamped long before the newest point drops the points after it (the excursion's), not the
    hour before."""
    t0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc).timestamp()

    def at(t: float, accept: float) -> str:
        s = datetime.fromtimestamp(t, timezone.utc)
        return decode_line(accept, s.strftime("%H:%M:%S"), day=s.strftime("%Y-%m-%d"))

    lines = [at(t0 + i, 2.5) for i in range(200)]  # 20 points
    lines += [at(t0 + 195, 2.5)]  # 5 s out of order
    lines += [at(t0 + HOURS2 + i, 2.0) for i in range(30)]  # the excursion: 3 points 2 h ahead
    lines += [at(t0 + 230 + i, 3.0) for i in range(60)]  # back
    for columns in (False, True):
        points = _points(lines, columns)
        assert [t for t, _, _ in points] == [t0 + 10 * i for i in range(20)] + [t0 + 230 + 10 * i for i in range(6)]
        # a point is the mean since the one before: the excursion's last 9 lines (2.0) and this one (3.0)
        assert abs(points[20][1] - 2.1) < 1e-9 and points[21][1] == 3.0
    assert _points(lines, False) == _points(lines, True)


def test_the_window_follows_the_ranks_of_the_present():
    from specwatch.status.view import _window

    now = 1_800_000_000.0
    ranks = [{"accept_length_history": [[now - 5, 2.0]]},  # a rank of the present
             {"accept_length_history": [[now + HOURS2, 2.0]]}]  # one left 2 h ahead, silent since
    assert _window(ranks, now) == {"start": now - 3600, "end": now, "step_seconds": 10.0, "clock": "wall"}
    old = [{"accept_length_history": [[now - 86400, 2.0]]}, {"accept_length_history": [[now - 90000, 2.0]]}]
    assert _window(old, now)["clock"] == "log" and _window(old, now)["end"] == now - 86400
