"""Window classification (rules/windows.py): the pipeline's one tracker, read by every rule."""

from specwatch.rules.windows import WindowConfig
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
    assert w.idle and not w.acceptance_valid and not w.prefill_dominated
    w = t.observe("s", decode(6))
    assert w.acceptance_valid and w.throughput_valid and (w.gap, w.prefill_batches) == (2, 0)
    assert t.observe("s", decode(6, rank="DP1 TP1")).gap is None  # per rank
    assert t.observe("s", object()) is None


def test_trackers_with_other_thresholds_classify_the_same_line_by_their_own():
    strict, loose = WindowTracker(WindowConfig(max_gap=10)), WindowTracker(WindowConfig(max_gap=60))
    for t in (strict, loose):
        t.observe("s", decode(0))
    line = decode(30)
    assert strict.observe("s", line).after_gap and not loose.observe("s", line).after_gap
    loose.config = WindowConfig(max_gap=10)  # a reload hands the tracker a new config
    line = decode(60)
    assert strict.observe("s", line).after_gap and loose.observe("s", line).after_gap


def test_the_pipeline_classifies_each_decode_line_once_for_every_rule():
    """One pending entry per decode line, classified once, reaches every rule that reads lines."""
    from timeline import Timeline, pipeline

    from specwatch.events import LogLine
    from specwatch.rules.summary import AFTER_GAP, VALID_ACCEPT

    p = pipeline()
    seen: dict[str, list] = {}
    for rule in p._on_lines:
        orig = rule.on_lines

        def spy(server, ranks, emit, _orig=orig, _name=rule.name):
            seen.setdefault(_name, []).extend(e for rs in ranks for e in rs.pending)
            return _orig(server, ranks, emit)
        rule.on_lines = spy
    log = Timeline().decode(n=3).prefill(n=2).decode(n=1)
    for line in log.lines:
        p.feed(LogLine("server.log", line))
    assert "collapse" in seen and {len(es) for es in seen.values()} == {4}
    for i in range(4):
        assert len({id(es[i]) for es in seen.values()}) == 1  # the same entry for every rule
    assert [(bool(e[6] & AFTER_GAP), bool(e[6] & VALID_ACCEPT)) for e in seen["collapse"]] == \
        [(True, True)] + [(False, True)] * 3
