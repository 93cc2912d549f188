"""Rank disagreement: one DP rank collapsed while the others are healthy."""

from timeline import Timeline, names, run

DP0, DP1, DP2 = {"DP": 0, "TP": 0}, {"DP": 1, "TP": 1}, {"DP": 2, "TP": 2}


def two_ranks(log, n, a0, a1, **kw):
    for _ in range(n):
        log.decode(accept=a0, ranks=[DP0], **kw)
        log.decode(every=0, accept=a1, ranks=[DP1], **kw)
    return log


def only(t, name="RankDisagreement"):
    return [x for x in names(t) if x[0] == name]


def test_one_rank_collapsed_fires_and_recovery_resolves():
    log = two_ranks(Timeline(), 5, 2.9, 2.8)
    two_ranks(log, 4, 1.02, 2.8)
    two_ranks(log, 3, 2.7, 2.8)
    t = run(log.lines)
    assert only(t) == [("RankDisagreement", "firing", "DP0 TP0"), ("RankDisagreement", "resolved", "DP0 TP0")]
    fired = [a for a in t if a.name == "RankDisagreement"][0]
    ev = dict(fired.evidence)
    assert ev == {"accept len, this rank": "1.02 1.02 1.02", "mean accept len DP1 TP1": "2.80"}
    assert fired.annotations["summary"] == "Only box DP0 TP0 collapsed: accept len 1.02 while 1 other rank(s) reach 2.80+"
    assert "grep -n -E 'DP0 '" in fired.fixes[0]
    assert dict([a for a in t if a.name == "RankDisagreement"][-1].evidence)["rank recovered"] == "2.70"


def test_all_ranks_collapsed_is_not_a_disagreement():
    log = two_ranks(Timeline(), 5, 2.9, 2.8)
    two_ranks(log, 5, 1.0, 1.01)
    assert only(run(log.lines)) == []


def test_when_the_healthy_rank_collapses_too_it_resolves():
    log = two_ranks(Timeline(), 4, 1.0, 2.8)
    two_ranks(log, 4, 1.0, 1.0)
    t = run(log.lines)
    assert only(t) == [("RankDisagreement", "firing", "DP0 TP0"), ("RankDisagreement", "resolved", "DP0 TP0")]
    resolved = [a for a in t if a.name == "RankDisagreement"][-1]
    assert "no healthy rank left" in dict(resolved.evidence)["other ranks"]


def test_idle_or_stale_peers_do_not_count_as_healthy():
    log = Timeline()
    for _ in range(5):  # DP1 idle: its lines say nothing
        log.decode(accept=1.0, ranks=[DP0])
        log.decode(every=0, accept=2.9, running=0, ranks=[DP1])
    assert only(run(log.lines)) == []
    log = two_ranks(Timeline(), 3, 2.9, 2.9)
    log.wait(600)  # DP1 then stops printing (max_age 5 min)
    log.decode(n=5, accept=1.0, ranks=[DP0])
    assert only(run(log.lines)) == []


def test_three_ranks_one_bad():
    log = Timeline()
    log.decode(n=4, accept=2.8, ranks=[DP0, DP1, DP2])
    for _ in range(4):
        log.decode(accept=2.8, ranks=[DP0, DP2])
        log.decode(every=0, accept=1.05, ranks=[DP1])
    t = run(log.lines)
    assert only(t) == [("RankDisagreement", "firing", "DP1 TP1")]
    assert set(dict([a for a in t if a.name == "RankDisagreement"][0].evidence)) == {"accept len, this rank", "mean accept len DP0 TP0", "mean accept len DP2 TP2"}


def test_a_reload_reclassifies_ranks_that_print_nothing_new():
    """Thresholds from a reload apply to every rank's last lines, not only to the rank that
    prints next."""
    from specwatch.config import build_config

    from timeline import feed, pipeline

    log = two_ranks(Timeline(), 3, 1.3, 1.0)  # DP0 between (below 1.5), DP1 collapsed
    p = pipeline()
    assert only(feed(p, log.lines)) == []
    p.reconfigure(build_config({"server": "box", "logs": [{"path": "server.log"}],
                                "rules": {"rank_disagreement": {"healthy_accept_length": 1.25}}}))
    more = Timeline(start="2026-03-01 10:00:30", spec=None).decode(accept=1.0, ranks=[DP1])  # DP1 only
    assert only(feed(p, more.lines)) == [("RankDisagreement", "firing", "DP1 TP1")]


def test_a_second_collapsed_rank_names_the_first_and_the_fix_names_the_log():
    """DP0 collapses, then DP1 while DP2 stays healthy: DP1's alert does not say "Only" and names
    DP0; the grep of the fix reads the followed log, not a `<log>` placeholder."""
    log = Timeline()
    log.decode(n=4, accept=2.8, ranks=[DP0, DP1, DP2])
    log.decode(n=4, accept=1.02, ranks=[DP0])
    for _ in range(4):
        log.decode(accept=1.03, ranks=[DP0, DP1])
        log.decode(every=0, accept=2.8, ranks=[DP2])
    t = run(log.lines, {"logs": [{"path": "/var/log/sglang/my server.log"}]})
    assert only(t) == [("RankDisagreement", "firing", "DP0 TP0"), ("RankDisagreement", "firing", "DP1 TP1")]
    first, second = [a for a in t if a.name == "RankDisagreement"]
    assert first.annotations["summary"].startswith("Only box DP0 TP0 collapsed: accept len 1.02 while 2 other rank(s)")
    assert second.annotations["summary"] == \
        "box DP1 TP1 collapsed (so did DP0 TP0): accept len 1.03 while 1 healthy rank(s) reach 2.80+"
    assert dict(second.evidence)["other collapsed ranks"] == "DP0 TP0"
    assert "grep -n -E 'DP1 ' '/var/log/sglang/my server.log' | grep -i" in second.fixes[0]
    assert "<log>" not in second.fixes[0]
