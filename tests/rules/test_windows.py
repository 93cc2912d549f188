"""Window classification (rules/windows.py): the summariser classifies each line once, as the
reference tracker (tests/window_tracker.py) does, and every rule reads it."""

from specwatch.rules.windows import WindowConfig
from specwatch.core.events import DecodeBatch, PrefillBatch
from window_tracker import WindowTracker


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

    from specwatch.core.events import LogLine
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


def test_the_summariser_classifies_as_the_reference_tracker():
    """Random decode and prefill lines of 3 ranks (idle, prefill-dominated, after gaps, no accept
    len): each pending entry's flags are the reference `Window`'s booleans, in every read size."""
    import random

    from timeline import pipeline

    from specwatch.rules.summary import AFTER_GAP, IDLE, PREFILL_DOMINATED, VALID_ACCEPT, VALID_THROUGHPUT
    from specwatch.engines.sglang.log import parse_line

    def decode_line(accept, clock, rank, running):
        return (f"[2026-01-01 {clock} {rank}] Decode batch, #running-req: {running}, #token: 900, token usage: 0.10, "
                f"accept len: {accept:.2f}, accept rate: 0.50, cuda graph: True, gen throughput (token/s): 400.00, "
                f"#queue-req: 0")

    def prefill_line(clock, rank):
        return (f"[2026-01-01 {clock} {rank}] Prefill batch, #new-seq: 1, #new-token: 100, #cached-token: 0, "
                f"token usage: 0.10, #running-req: 3, #queue-req: 0, cuda graph: True, input throughput (token/s): 50.00")

    rnd = random.Random(5)
    lines, t = [], 0
    for _ in range(600):
        t += rnd.choice([0, 0, 1, 1, 2, 30, 200])
        rank = f"DP{rnd.randrange(3)} TP{rnd.randrange(1)}"
        clock = f"{10 + t // 3600:02d}:{t // 60 % 60:02d}:{t % 60:02d}"
        if rnd.random() < 0.35:
            lines.append(prefill_line(clock, rank))
        else:
            lines.append(decode_line(rnd.choice([1.0, 2.5, 3.1]), clock, rank, rnd.choice([0, 1, 8, 32])))
    tracker = WindowTracker(WindowConfig(max_prefill_batches=2, max_gap=60))
    want = [(w.idle, w.prefill_dominated, w.after_gap, w.acceptance_valid, w.throughput_valid)
            for w in (tracker.observe("box", parse_line(x)) for x in lines) if w is not None]
    p = pipeline({"rules": {"windows": {"max_prefill_batches": 2, "max_gap": "60s"}}})
    seen = []
    rule = next(r for r in p._on_lines if r.name == "collapse")
    orig = rule.on_lines

    def spy(server, ranks, emit):
        seen.extend(e for rs in ranks for e in rs.pending)
        return orig(server, ranks, emit)
    rule.on_lines = spy
    from specwatch.core.events import LogLine
    for x in lines:
        p.feed(LogLine("server.log", x))
    got = [(bool(f & IDLE), bool(f & PREFILL_DOMINATED), bool(f & AFTER_GAP), bool(f & VALID_ACCEPT),
            bool(f & VALID_THROUGHPUT)) for f in (e[6] for e in sorted(seen, key=lambda e: e[8]))]
    assert len(got) == len(want) > 300 and got == want
    assert {g[0] for g in got} == {g[1] for g in got} == {g[2] for g in got} == {True, False}
