"""Window classification (rules/windows.py): per tracker, even when trackers share the newest
Window (each rule has its own tracker; five of them classify every decode line)."""

from specwatch.config import WindowConfig
from specwatch.events import DecodeBatch, PrefillBatch
from specwatch.rules.windows import WindowTracker


def decode(ts: float, rank: str = "DP0 TP0", running: int = 32, accept: float | None = 2.8) -> DecodeBatch:
    return DecodeBatch(timestamp=ts, rank=rank, ranks={}, fields={}, running_requests=running, queued_requests=0,
                       accept_length=accept, gen_throughput=330.0)


def prefill(ts: float, rank: str = "DP0 TP0") -> PrefillBatch:
    return PrefillBatch(timestamp=ts, rank=rank, ranks={}, fields={}, running_requests=32, queued_requests=0)


def test_a_window_describes_the_line_and_what_came_before_it():
    t = WindowTracker(WindowConfig(min_running_requests=1, max_prefill_batches=2, max_gap=60))
    w = t.observe("s", decode(0))
    assert (w.gap, w.after_gap, w.acceptance_valid, w.throughput_valid) == (None, True, True, False)
    for _ in range(3):
        assert t.observe("s", prefill(1)) is None
    w = t.observe("s", decode(2))
    assert (w.gap, w.prefill_batches, w.prefill_dominated, w.acceptance_valid) == (2, 3, True, False)
    w = t.observe("s", decode(4, running=0))
    assert w.idle and not w.acceptance_valid and w.why_not() == "idle"
    w = t.observe("s", decode(6))
    assert w.acceptance_valid and w.throughput_valid and w.why_not() == "valid"
    assert t.observe("s", decode(6, rank="DP1 TP1")).gap is None  # per rank
    assert t.observe("s", object()) is None


def test_trackers_that_saw_different_lines_classify_the_same_line_differently():
    """A tracker that missed lines (its rule was disabled) or saw others keeps its own view,
    whichever tracker classifies a line first."""
    cfg = WindowConfig(max_prefill_batches=2, max_gap=60)
    for order in (1, -1):
        busy, quiet, late = WindowTracker(cfg), WindowTracker(cfg), WindowTracker(cfg)
        first = decode(0)
        busy.observe("s", first)
        quiet.observe("s", first)
        for _ in range(3):
            busy.observe("s", prefill(1))  # only `busy` sees the prefill lines
        line = decode(30)
        trackers = [busy, quiet, late][::order]
        got = {id(t): t.observe("s", line) for t in trackers}
        b, q, l = got[id(busy)], got[id(quiet)], got[id(late)]
        assert (b.prefill_dominated, b.prefill_batches, b.gap) == (True, 3, 30)
        assert (q.prefill_dominated, q.prefill_batches, q.gap) == (False, 0, 30)
        assert (l.prefill_dominated, l.gap, l.after_gap) == (False, None, True)
        assert all(w.batch is line for w in (b, q, l))


def test_trackers_with_other_thresholds_classify_the_same_line_by_their_own():
    strict, loose = WindowTracker(WindowConfig(max_gap=10)), WindowTracker(WindowConfig(max_gap=60))
    for t in (strict, loose):
        t.observe("s", decode(0))
    line = decode(30)
    assert strict.observe("s", line).after_gap and not loose.observe("s", line).after_gap
    loose.config = WindowConfig(max_gap=10)  # a reload hands the tracker a new config
    line = decode(60)
    assert strict.observe("s", line).after_gap and loose.observe("s", line).after_gap
