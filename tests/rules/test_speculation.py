"""Speculation inactive and spec metrics missing: kept apart from each other and from a collapse."""

from specwatch.events import ServerArgs
from timeline import T0, Timeline, feed, names, pipeline, run


def test_inactive_fires_on_decode_lines_without_accept_fields_and_resolves():
    log = Timeline()  # server_args: speculative_algorithm='EAGLE3'
    log.decode(n=2, accept=None)
    log.decode(n=3, accept=None, thr=1635.11)
    log.decode(n=1, accept=2.7)
    t = run(log.lines)
    assert names(t) == [("SpeculationInactive", "firing", ""), ("SpeculationInactive", "resolved", "")]
    fired = t[0]
    ev = dict(fired.evidence)
    assert ev["decode lines without accept fields"] == "3"
    assert ev["speculative_algorithm"] == "EAGLE3"
    assert ev["gen throughput (token/s)"] == "1635.11"
    assert fired.starts_at == T0 + 2  # the first plain line
    assert "not an acceptance collapse" in fired.annotations["description"]
    assert any("server_info" in f for f in fired.fixes)
    assert dict(t[1].evidence)["accept len"] == "2.70"


def test_inactive_needs_speculation_configured():
    assert run(Timeline(spec=False).decode(n=20, accept=None).lines) == []
    assert run(Timeline(spec=None).decode(n=20, accept=None).lines) == []  # settings unknown


def test_inactive_from_server_args_of_another_source():
    """A source other than the log (issue 4: the HTTP API) sends ServerArgs events."""
    p = pipeline()
    lines = Timeline(spec=None).decode(n=5, accept=None).lines
    p.feed_event("box", ServerArgs(None, {"speculative_algorithm": "EAGLE3", "model_path": "m"}), now=T0)
    assert names(feed(p, lines)) == [("SpeculationInactive", "firing", "")]
    # the same settings again (a poll) change nothing; settings without a draft resolve it
    p.feed_event("box", ServerArgs(None, {"speculative_algorithm": "EAGLE3", "model_path": "m"}), now=T0 + 20)
    p.feed_event("box", ServerArgs(None, {"speculative_algorithm": None, "model_path": "m"}), now=T0 + 30)
    assert names(p.dispatcher.history) == [("SpeculationInactive", "firing", ""), ("SpeculationInactive", "resolved", "")]


def test_idle_lines_do_not_count():
    assert run(Timeline().decode(n=10, accept=None, running=0).lines) == []


def test_missing_fires_when_prefills_but_no_decode_lines_for_a_window():
    log = Timeline()
    log.prefill(n=40, every=20)  # 13 minutes of requests, no decode line
    log.decode(n=1, accept=2.8)
    t = run(log.lines)
    assert names(t) == [("SpecMetricsMissing", "firing", ""), ("SpecMetricsMissing", "resolved", "")]
    fired = t[0]
    assert fired.starts_at == T0 + 20  # the first prefill line
    ev = dict(fired.evidence)
    assert ev["prefill lines in window"] == "31"  # 600 s / 20 s + the line at the window's edge
    assert ev["decode_log_interval"] == "40"
    assert "Speculative decoding may be fine or broken" in fired.annotations["description"]
    assert t[1].ends_at == T0 + 40 * 20 + 2  # the decode line, 2 s after the last prefill


def test_missing_quiet_cases():
    # decode lines keep coming
    log = Timeline()
    for _ in range(40):
        log.prefill(every=10)
        log.decode(every=10)
    assert run(log.lines) == []
    # a burst shorter than the window, then a decode line
    assert run(Timeline().prefill(n=50, every=5).decode().lines) == []
    # a PD prefill node never decodes; an embedding server neither; a server without a draft
    for args in ({"disaggregation_mode": "prefill"}, {"is_embedding": True}):
        assert run(Timeline(**args).prefill(n=60, every=20).lines) == []
    assert run(Timeline(spec=False).prefill(n=60, every=20).lines) == []


def test_an_idle_spell_restarts_the_streak():
    log = Timeline()
    log.prefill(n=3, every=5)
    log.wait(3600)  # idle for an hour
    log.prefill(n=20, every=5)  # busy again: 100 s, shorter than the window
    assert run(log.lines) == []


def test_inactive_missing_and_collapse_are_distinct():
    """Decode lines with accept len 1.00 are a collapse: neither of the two others fires."""
    t = run(Timeline().prefill(n=5).decode(n=5, accept=1.0).lines)
    assert names(t) == [("AcceptanceCollapse", "firing", "")]
