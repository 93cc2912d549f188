"""Speculation inactive and spec metrics missing: kept apart from each other and from a collapse."""

from specwatch.core.events import ServerArgs
from pipelines import read_log
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


DP0, DP1 = {"DP": 0, "TP": 0}, {"DP": 1, "TP": 1}


def replayed(tmp_path, log: Timeline, rules: dict | None = None) -> list:
    """The transitions of `specwatch replay` of the log: its lines read in one read, the rules
    reading each second's lines together (the last ones at the end of the log)."""
    path = tmp_path / "server.log"
    path.write_text("".join(line + "\n" for line in log.lines))
    p = read_log(path, {"server": "box", "rules": rules or {}})
    p.flush_errors()
    return p.dispatcher.history


def test_inactive_counts_the_lines_of_all_ranks_in_file_order(tmp_path):
    """The count is the server's, in the order the lines were written across ranks: DP1's drafted
    line between DP0's plain lines of the same second ends DP0's run. Lines read together may
    fire and resolve it more than once: each transition is there, in order."""
    log = Timeline()
    log.decode(accept=None, ranks=[DP0, DP0]).decode(every=0, accept=2.7, ranks=[DP1])
    log.decode(every=0, accept=None, ranks=[DP0])  # 1: DP1's drafted line ended the run of 2
    log.decode(every=1, accept=None, ranks=[DP1, DP0])  # 3
    log.decode(every=1, accept=2.5, ranks=[DP0]).decode(every=0, accept=None, ranks=[DP0, DP1, DP0])
    log.decode(every=0, accept=2.6, ranks=[DP1])
    t = replayed(tmp_path, log, {"speculation_inactive": {"min_batches": 3}})
    assert names(t) == [("SpeculationInactive", "firing", ""), ("SpeculationInactive", "resolved", "")] * 2
    ev = dict(t[0].evidence)
    assert (ev["decode lines without accept fields"], ev["last decode line rank"]) == ("3", "DP0 TP0")
    assert t[0].starts_at == T0 + 2  # DP0's line after DP1's drafted one
    assert (t[1].ends_at, dict(t[1].evidence)["accept len"]) == (T0 + 4, "2.50")
    assert (t[2].starts_at, dict(t[2].evidence)["last decode line rank"]) == (T0 + 4, "DP0 TP0")
    assert (t[3].ends_at, dict(t[3].evidence)["accept len"]) == (T0 + 4, "2.60")


def test_missing_counts_the_prefill_lines_after_the_servers_last_decode_line(tmp_path):
    """A decode line of any rank ends the streak: DP1's prefill line written before DP0's decode
    line of the same second does not count, the one after it starts the streak."""
    log = Timeline()
    log.decode(every=2, ranks=[DP0]).prefill(rank=DP1).decode(every=0, ranks=[DP0]).prefill(rank=DP1)
    log.prefill(n=40, every=20, rank=DP1)
    t = replayed(tmp_path, log, {"decode_stalled": {"enabled": False}})  # requests run, no decode line
    assert names(t) == [("SpecMetricsMissing", "firing", "")]
    assert t[0].starts_at == T0 + 2
    assert dict(t[0].evidence)["prefill lines in window"] == "31"  # T0 + 2, then 30 lines 20 s apart
