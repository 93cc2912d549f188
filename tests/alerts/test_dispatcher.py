"""Dispatcher: Alertmanager's grouping, timers, notification log, inhibition, silences, routes."""

import copy

from specwatch.alerts.dispatcher import Dispatcher, Route
from specwatch.alerts.inhibit import default_inhibit_rules
from specwatch.alerts.matchers import parse_matcher
from specwatch.alerts.model import Alert
from specwatch.alerts.silences import SilenceStore


class Recorder:
    def __init__(self, name="rec", send_resolved=True):
        self.name = name
        self.send_resolved = send_resolved
        self.got = []  # Notification objects

    def notify(self, n):
        self.got.append(n)

    def summary(self):
        """[(status of each alert + rank, ...)] per notification."""
        return [tuple(f"{a.status}:{a.labels['alertname']}:{a.labels['rank']}" for a in n.alerts) for n in self.got]


def alert(status="firing", rank="TP0", name="AcceptanceCollapse", starts_at=100.0, ends_at=None, server="s"):
    return Alert(labels={"alertname": name, "server": server, "rank": rank},
                 annotations={"summary": "x"}, starts_at=starts_at, status=status, ends_at=ends_at)


def resolved(a, at):
    r = copy.deepcopy(a)
    r.status, r.ends_at = "resolved", at
    return r


def immediate(rec, **kw):
    return Dispatcher([rec], group_wait=0, group_interval=0, **kw)


def test_fire_dedup_repeat_resolve():
    rec = Recorder()
    d = immediate(rec, repeat_interval=3600)
    d.handle(alert(), now=100)
    d.handle(alert(), now=150)  # same fingerprint while firing: deduplicated
    d.tick(now=3699)
    assert rec.summary() == [("firing:AcceptanceCollapse:TP0",)]
    d.tick(now=3700)
    assert rec.summary() == [("firing:AcceptanceCollapse:TP0",)] * 2
    d.handle(resolved(alert(), 4000.0), now=4000)
    d.tick(now=100000)
    assert rec.summary() == [("firing:AcceptanceCollapse:TP0",)] * 2 + [("resolved:AcceptanceCollapse:TP0",)]
    assert d.active == {} and d.alerts == {}


def test_resolve_of_unknown_alert_is_ignored():
    rec = Recorder()
    d = immediate(rec)
    d.handle(alert("resolved", ends_at=1.0), now=1)
    d.tick(2)
    assert rec.got == [] and d.alerts == {}


def test_notifier_gets_a_snapshot_not_the_live_object():
    rec = Recorder()
    d = immediate(rec)
    a = alert()
    d.handle(a, now=100)
    a.evidence.append(("later", "1"))
    assert rec.got[0].alerts[0].evidence == []


def test_group_wait_batches_alerts_of_one_group():
    rec = Recorder()
    d = Dispatcher([rec])  # Alertmanager defaults: group_by [], 30s, 5m, 4h
    d.handle(alert(rank="DP0", starts_at=100), now=100)
    d.handle(alert(rank="DP1", starts_at=110), now=110)
    d.tick(129.9)
    assert rec.got == []
    d.tick(130)
    assert rec.summary() == [("firing:AcceptanceCollapse:DP0", "firing:AcceptanceCollapse:DP1")]
    n = rec.got[0]
    assert n.group_labels == {} and n.status == "firing" and n.receiver == "rec"
    assert n.common_labels() == {"alertname": "AcceptanceCollapse", "server": "s"}


def test_alert_resolved_within_group_wait_is_never_sent():
    rec = Recorder()
    d = Dispatcher([rec])
    a = alert(starts_at=100)
    d.handle(a, now=100)
    d.handle(resolved(a, 110), now=110)
    d.tick(200)
    d.tick(1000)
    assert rec.got == []
    assert d.alerts == {}


def test_ranks_that_fire_within_group_wait_share_one_message_however_old_their_start():
    """A rule that needed 3 batches starts its alert at the first low batch, long before it fires:
    the group still waits group_wait from when it appeared, so ranks that fire within it (here
    2 ms and 0.9 s apart, as 8 ranks collapsing together do) go out as one message."""
    rec = Recorder()
    d = Dispatcher([rec], group_wait=1, group_interval=60)
    d.handle(alert(rank="DP0", starts_at=50), now=100)
    d.handle(alert(rank="DP1", starts_at=50), now=100.002)
    d.handle(alert(rank="DP2", starts_at=51), now=100.9)
    d.flush_due(100.99)
    assert rec.got == []
    d.flush_due(101)
    assert len(rec.got) == 1 and sorted(rec.summary()[0]) == [
        "firing:AcceptanceCollapse:DP0", "firing:AcceptanceCollapse:DP1", "firing:AcceptanceCollapse:DP2"]


def test_group_interval_paces_updates_and_repeat_is_a_multiple_of_it():
    rec = Recorder()
    d = Dispatcher([rec], group_wait=30, group_interval=300, repeat_interval=3500)
    a0 = alert(rank="DP0", starts_at=100)
    d.handle(a0, now=100)
    d.tick(130)
    assert len(rec.got) == 1
    d.handle(alert(rank="DP1", starts_at=140), now=140)
    d.tick(170)
    d.tick(429)  # a rank joining an open incident waits for the group's next tick: 130 + 300
    assert len(rec.got) == 1
    d.tick(430)
    assert rec.summary()[1] == ("firing:AcceptanceCollapse:DP0", "firing:AcceptanceCollapse:DP1")
    d.handle(resolved(a0, 500), now=500)
    d.tick(729)
    assert len(rec.got) == 2  # a resolve waits for the group's next tick: 430 + 300
    d.tick(730)
    assert rec.summary()[2] == ("firing:AcceptanceCollapse:DP1", "resolved:AcceptanceCollapse:DP0")
    # repeat 3500 s after 730, rounded up to the next group_interval tick: 730 + 12 × 300
    for t in range(1030, 4330, 300):
        d.tick(t)
    assert len(rec.got) == 3
    d.tick(4330)
    assert rec.summary()[3] == ("firing:AcceptanceCollapse:DP1",)  # the resolved one is gone


def test_an_episode_after_a_pending_resolve_is_sent_with_the_resolve_first():
    """The same alert resolves (restart) and fires again before its group's next tick: the old
    episode's RESOLVED goes out at once, the new FIRING group_wait later (issue #10 item 1)."""
    rec = Recorder()
    d = Dispatcher([rec], group_wait=1, group_interval=60)
    a = alert(starts_at=100)
    d.handle(a, now=103)
    d.flush_due(104)  # group_wait after it fired
    assert rec.summary() == [("firing:AcceptanceCollapse:TP0",)]
    d.handle(resolved(a, 110), now=110)
    d.tick(120)
    assert len(rec.got) == 1  # the resolve waits for the group tick (164)
    d.handle(alert(starts_at=121), now=121.5)
    assert rec.summary()[1] == ("resolved:AcceptanceCollapse:TP0",)
    assert rec.got[1].alerts[0].ends_at == 110
    d.flush_due(122.4)  # group_wait counts from when the alert fired (121.5): nothing is open
    assert len(rec.got) == 2
    d.flush_due(122.5)
    assert rec.summary()[2] == ("firing:AcceptanceCollapse:TP0",) and rec.got[2].alerts[0].starts_at == 121
    d.handle(resolved(rec.got[2].alerts[0], 130), now=130)
    d.handle(alert(starts_at=125), now=131)  # the resolve at once, the new episode group_wait later
    d.flush_due(132)
    assert rec.summary()[3:] == [("resolved:AcceptanceCollapse:TP0",), ("firing:AcceptanceCollapse:TP0",)]
    assert d.active.keys() == {a.fingerprint}


def test_an_episode_after_a_notified_resolve_is_sent_within_group_wait():
    rec = Recorder()
    d = Dispatcher([rec], group_wait=1, group_interval=60)
    a = alert(starts_at=100)
    d.handle(a, now=103)
    d.tick(104)
    d.handle(resolved(a, 110), now=110)
    d.tick(164)
    assert rec.summary() == [("firing:AcceptanceCollapse:TP0",), ("resolved:AcceptanceCollapse:TP0",)]
    d.handle(alert(starts_at=170), now=170)  # the group's next tick is 224
    d.tick(171)
    assert rec.summary()[2] == ("firing:AcceptanceCollapse:TP0",)


def test_another_rank_after_the_incident_resolved_is_a_new_incident():
    """Nothing of the group firing any more: a rank that collapses next is not held back by the
    group_interval of the incident before."""
    rec = Recorder()
    d = Dispatcher([rec], group_wait=1, group_interval=60)
    a = alert(rank="DP0", starts_at=100)
    d.handle(a, now=100)
    d.tick(101)
    d.handle(resolved(a, 110), now=110)
    d.handle(alert(rank="DP1", starts_at=105), now=112)  # the group's next tick is 161
    d.tick(113)
    assert rec.summary() == [("firing:AcceptanceCollapse:DP0",),
                             ("firing:AcceptanceCollapse:DP1", "resolved:AcceptanceCollapse:DP0")]


def test_a_rank_that_joins_an_open_incident_and_resolves_before_its_follow_up_is_still_sent():
    """DP0's collapse is notified; DP1 collapses a moment later (it joins the open incident: the
    follow-up waits for group_interval) and recovers after 21 s, before that follow-up: it is in
    the follow-up as resolved, not lost. A flash (fired and resolved within FLASH_SECONDS) is not."""
    rec = Recorder()
    d = Dispatcher([rec], group_wait=0, group_interval=30)
    a0 = alert(rank="DP0", starts_at=100)
    d.handle(a0, now=100)
    assert rec.summary() == [("firing:AcceptanceCollapse:DP0",)]
    a1, a2 = alert(rank="DP1", starts_at=100.3), alert(rank="DP2", starts_at=100.5)
    d.handle(a1, now=100.3)
    d.handle(a2, now=100.5)
    d.handle(resolved(a1, 121.3), now=121.3)  # a 21 s collapse, over before the follow-up
    flash = alert(rank="DP3", starts_at=101)
    d.handle(flash, now=101)
    d.handle(resolved(flash, 101.5), now=101.5)
    d.tick(129.9)
    assert len(rec.got) == 1
    d.tick(130)
    assert sorted(rec.summary()[1]) == ["firing:AcceptanceCollapse:DP0", "firing:AcceptanceCollapse:DP2",
                                        "resolved:AcceptanceCollapse:DP1"]


def test_group_by_splits_groups():
    rec = Recorder()
    d = Dispatcher([rec], group_by=["alertname"], group_wait=0, group_interval=0)
    d.handle(alert(name="AcceptanceCollapse"), now=100)
    d.handle(alert(name="ThroughputDrop", rank="TP1"), now=100)
    assert rec.summary() == [("firing:AcceptanceCollapse:TP0",), ("firing:ThroughputDrop:TP1",)]
    assert rec.got[1].group_labels == {"alertname": "ThroughputDrop"}
    assert rec.got[0].group_key != rec.got[1].group_key


def test_send_resolved_false_skips_resolves_but_clears_the_log():
    rec = Recorder(send_resolved=False)
    d = immediate(rec)
    a = alert()
    d.handle(a, now=100)
    d.handle(resolved(a, 200), now=200)
    d.tick(201)
    assert rec.summary() == [("firing:AcceptanceCollapse:TP0",)]
    d.handle(alert(starts_at=300), now=300)  # fires again: a new notification
    assert len(rec.got) == 2


def test_collapse_inhibits_throughput_drop_of_same_server_and_rank():
    rec = Recorder()
    d = immediate(rec, inhibit_rules=default_inhibit_rules(), group_by=["..."])
    collapse = alert(name="AcceptanceCollapse", rank="TP0")
    d.handle(collapse, now=100)
    d.handle(alert(name="ThroughputDrop", rank="TP0"), now=101)
    d.handle(alert(name="ThroughputDrop", rank="TP1"), now=102)  # other rank: not inhibited
    d.handle(alert(name="ThroughputDrop", rank="TP0", server="other"), now=103)
    assert [n.alerts[0].labels["alertname"] + "/" + n.alerts[0].labels["server"] + "/" + n.alerts[0].labels["rank"]
            for n in rec.got] == ["AcceptanceCollapse/s/TP0", "ThroughputDrop/s/TP1", "ThroughputDrop/other/TP0"]
    d.handle(alert(name="GpuThrottlingThroughputDrop", rank="TP1"), now=104)
    d.handle(alert(name="ThroughputDrop", rank="TP1", server="t"), now=105)  # another server: not muted
    assert [(n.alerts[0].labels["alertname"], n.alerts[0].labels["server"]) for n in rec.got[3:]] == [
        ("GpuThrottlingThroughputDrop", "s"), ("ThroughputDrop", "t")]
    del rec.got[3:]
    d.handle(resolved(collapse, 200), now=200)
    d.tick(201)  # the cause is gone: the throughput drop of TP0 is now notified
    assert [(n.alerts[0].labels["alertname"], n.alerts[0].status, n.alerts[0].labels["rank"]) for n in rec.got[3:]] == [
        ("AcceptanceCollapse", "resolved", "TP0"), ("ThroughputDrop", "firing", "TP0")]


def test_silence_mutes_and_expiry_unmutes_seen_without_restart(tmp_path):
    rec = Recorder()
    store = SilenceStore(tmp_path)
    d = immediate(rec, silences=store, group_by=["..."])
    cli = SilenceStore(tmp_path)  # another process: the CLI
    s = cli.add([parse_matcher("alertname=AcceptanceCollapse"), parse_matcher("rank=~TP[01]")], 0, 10_000,
                created_by="ops", comment="draft retraining")
    d.handle(alert(rank="TP0"), now=100)
    d.handle(alert(rank="TP2"), now=100)
    assert rec.summary() == [("firing:AcceptanceCollapse:TP2",)]
    cli.expire(s.id[:8], now=150)
    d.tick(151)
    assert rec.summary()[1] == ("firing:AcceptanceCollapse:TP0",)


def test_routes_first_match_and_continue():
    default, crit, audit = Recorder("default"), Recorder("crit"), Recorder("audit")
    routes = [
        Route("audit", [audit], [parse_matcher("server=s")], group_wait=0, group_interval=0, continue_matching=True),
        Route("critical", [crit], [parse_matcher("severity=critical")], group_wait=0, group_interval=0),
        Route("never", [default], [parse_matcher("severity=critical")], group_wait=0, group_interval=0),
    ]
    d = Dispatcher([default], routes=routes, group_wait=0, group_interval=0)
    a = alert()
    a.labels["severity"] = "critical"
    d.handle(a, now=100)
    d.handle(alert(server="t", rank="TP1"), now=100)  # matches no route: default
    assert len(audit.got) == 1 and len(crit.got) == 1
    assert default.summary() == [("firing:AcceptanceCollapse:TP1",)]
    assert crit.got[0].group_key.startswith("critical:")


def test_state_round_trip_sends_nothing_twice():
    rec = Recorder()
    d = Dispatcher([rec], group_wait=0, group_interval=60, repeat_interval=600)
    d.handle(alert(), now=100)
    assert len(rec.got) == 1
    d2 = Dispatcher([rec], group_wait=0, group_interval=60, repeat_interval=600)
    d2.load_state(copy.deepcopy(d.to_state()))
    d2.handle(alert(), now=120)  # still firing after the restart: not new
    d2.tick(121)
    d2.tick(699)
    assert len(rec.got) == 1
    d2.tick(760)
    assert len(rec.got) == 2  # the repeat still comes, on the restored schedule


def test_legacy_state_is_not_sent_again():
    rec = Recorder()
    old = {"active": [alert().to_dict()], "last_sent": {alert().fingerprint: 100.0}}
    d = immediate(rec)
    d.load_state(old)
    d.tick(200)
    assert rec.got == [] and list(d.active) == [alert().fingerprint]


class Pusher:
    resolved_retention = 900.0

    def __init__(self):
        self.calls = []

    def sync(self, alerts, now, changed):
        self.calls.append((now, changed, sorted(f"{a.status}:{a.labels['rank']}" for a in alerts)))


def test_pushers_get_every_unsilenced_alert_and_resolved_ones_for_a_while(tmp_path):
    p = Pusher()
    store = SilenceStore(tmp_path)
    store.add([parse_matcher("rank=TP9")], 0, 10_000)
    d = Dispatcher([], pushers=[p], silences=store)
    a = alert(rank="TP0")
    d.handle(a, now=100)
    d.handle(alert(rank="TP9"), now=100)
    d.tick(101)
    d.handle(resolved(a, 200), now=200)
    d.tick(1099)
    d.tick(1100)
    assert p.calls == [
        (100, True, ["firing:TP0"]), (100, True, ["firing:TP0"]), (101, False, ["firing:TP0"]),
        (200, True, ["resolved:TP0"]), (1099, False, ["resolved:TP0"]), (1100, False, []),
    ]


def test_runbook_url_template():
    rec = Recorder()
    d = immediate(rec, runbook_url="https://wiki.example/runbooks/{alertname}#{rank}{nosuch}")
    d.handle(alert(), now=100)
    assert rec.got[0].alerts[0].annotations["runbook_url"] == "https://wiki.example/runbooks/AcceptanceCollapse#TP0"


def test_update_of_a_firing_alert_is_sent_once_and_not_repeated_as_update():
    rec = Recorder()
    d = immediate(rec, repeat_interval=60)
    a = alert()
    d.handle(a, now=100)
    a.fixes = ["[error] unloaded_weights: ..."]
    a.annotations["update"] = "specwatch diagnose: 1 error(s)"
    d.handle(a, now=110)
    sent = [n.alerts[0] for n in rec.got]
    assert [x.annotations.get("update") for x in sent] == [None, "specwatch diagnose: 1 error(s)"]
    assert sent[1].fixes == ["[error] unloaded_weights: ..."] and sent[1].fingerprint == sent[0].fingerprint
    assert rec.got[1].group_key == rec.got[0].group_key  # a notification of the same group
    assert "update" not in a.annotations and "update" not in d.active[a.fingerprint].annotations
    d.handle(a, now=120)  # no new update mark: deduplicated as before
    d.tick(now=169)
    assert len(rec.got) == 2  # the update restarted the repeat timer
    d.tick(now=170)  # the repeat carries the new fixes, not the update mark
    assert len(rec.got) == 3 and rec.got[2].alerts[0].annotations.get("update") is None
    assert rec.got[2].alerts[0].fixes == a.fixes
    b = alert(rank="TP1")
    b.annotations["update"] = "x"
    d.handle(b, now=180)  # an update of an alert that is not firing fires it normally, unmarked
    last = rec.got[-1].alerts
    assert [x.labels["rank"] for x in last] == ["TP0", "TP1"] and all("update" not in x.annotations for x in last)


def test_update_goes_to_every_group_and_receiver_that_was_told_and_marks_only_that_alert():
    crit, audit, default = Recorder("crit"), Recorder("audit"), Recorder("default")
    routes = [Route("audit", [audit], [parse_matcher("server=s")], group_by=["..."], group_wait=0, group_interval=0,
                    continue_matching=True),
              Route("critical", [crit], [parse_matcher("rank=~TP[01]")], group_wait=0, group_interval=0)]
    d = Dispatcher([default], routes=routes, group_wait=0, group_interval=0)
    a0, a1 = alert(rank="TP0"), alert(rank="TP1")
    d.handle(a0, now=100)
    d.handle(a1, now=100)
    assert crit.summary()[-1] == ("firing:AcceptanceCollapse:TP0", "firing:AcceptanceCollapse:TP1")
    assert len(audit.got) == 2 and default.got == []
    n_crit, n_audit = len(crit.got), len(audit.got)
    a1.annotations["update"] = "findings"
    d.handle(a1, now=105)
    assert len(crit.got) == n_crit + 1 and len(audit.got) == n_audit + 1 and default.got == []
    upd = crit.got[-1]  # the whole group, only the updated alert marked
    assert [x.annotations.get("update") for x in upd.alerts] == [None, "findings"]
    assert [(x.labels["rank"], x.annotations.get("update")) for x in audit.got[-1].alerts] == [("TP1", "findings")]
    d.tick(106)
    assert len(crit.got) == n_crit + 1 and len(audit.got) == n_audit + 1  # once


def test_update_of_a_muted_or_not_yet_notified_alert_sends_nothing_extra(tmp_path):
    rec = Recorder()
    store = SilenceStore(tmp_path)
    d = Dispatcher([rec], silences=store, group_by=["..."])  # group_wait 30s
    a = alert(starts_at=100)
    d.handle(a, now=100)
    a.annotations["update"] = "early"
    d.handle(a, now=110)  # still in group_wait: its first notification will carry the new content
    assert rec.got == []
    d.tick(130)
    assert len(rec.got) == 1 and "update" not in rec.got[0].alerts[0].annotations
    store.add([parse_matcher("rank=TP0")], 0, 10_000)
    a.annotations["update"] = "muted"
    d.handle(a, now=140)
    assert len(rec.got) == 1 and "update" not in a.annotations


def test_adopt_takes_new_routes_and_keeps_what_was_sent():
    old_rec, new_rec = Recorder("slack"), Recorder("slack")
    d = immediate(old_rec, repeat_interval=3600)
    d.handle(alert(rank="TP0"), now=100)
    assert len(old_rec.got) == 1
    crit = Recorder("crit")
    d.adopt(Dispatcher([new_rec], repeat_interval=3600, group_wait=0, group_interval=0,
                       routes=[Route("critical", [crit], [parse_matcher("rank=TP1")], group_wait=0, group_interval=0)]),
            now=150)
    d.tick(151)
    assert new_rec.got == [] and crit.got == []  # same receiver name, same group: nothing re-sent
    d.handle(alert(rank="TP1"), now=160)
    assert crit.summary() == [("firing:AcceptanceCollapse:TP1",)]  # the new route
    d.handle(alert(rank="TP2"), now=170)
    assert new_rec.summary() == [("firing:AcceptanceCollapse:TP0", "firing:AcceptanceCollapse:TP2")]
    assert old_rec.got[1:] == []


def test_paused_dispatcher_sends_only_what_still_fires_when_resumed():
    """Start-up catch-up: an old episode that fired and resolved while paused is never sent;
    one still firing when the backlog is read is sent once on resume."""
    from specwatch.alerts.dispatcher import Dispatcher as D
    from specwatch.alerts.model import Alert as A

    got = []

    class Rec:
        name = "rec"

        def notify(self, n):
            got.append([(a.labels["rank"], a.status) for a in getattr(n, "alerts", [n])])

    d = D([Rec()], group_wait=0, group_interval=300, repeat_interval=3600)
    d.paused = True

    def alert(rank, status, t0=100.0):
        return A(labels={"alertname": "AcceptanceCollapse", "server": "s", "rank": rank},
                 annotations={}, starts_at=t0, status=status, ends_at=None if status == "firing" else t0 + 50)

    d.handle(alert("DP0", "firing"), now=1000)
    d.handle(alert("DP0", "resolved"), now=1000)
    d.handle(alert("DP1", "firing"), now=1000)
    d.tick(now=1001)
    assert got == []
    d.resume(now=1002)
    assert got == [[("DP1", "firing")]]


def test_alerts_handed_over_together_share_the_first_message_at_group_wait_0():
    """group_wait 0 (specwatch's default): 8 ranks whose collapse the pipeline hands over in one
    batch (one evaluation) go out as one message, at the batch's end; one at a time, the first
    rank's group flushes alone and the other 7 join it a group_interval later."""
    rec = Recorder()
    d = Dispatcher([rec], group_wait=0, group_interval=300)
    with d.together():
        for r in range(8):
            d.handle(alert(rank=f"DP{r}", starts_at=50), now=100)
            d.flush_due(100)  # what the pipeline does after each line: held to the batch's end
        assert rec.got == []
    assert [sorted(s) for s in rec.summary()] == [sorted(f"firing:AcceptanceCollapse:DP{r}" for r in range(8))]
    d.tick(399)
    assert len(rec.got) == 1  # nothing joins later


def test_a_single_alert_in_a_batch_goes_out_when_the_batch_ends():
    rec = Recorder()
    d = Dispatcher([rec], group_wait=0, group_interval=300)
    with d.together():
        d.handle(alert(rank="DP3"), now=100)
    assert rec.summary() == [("firing:AcceptanceCollapse:DP3",)]


def test_an_alert_that_fires_and_resolves_in_one_batch_is_never_sent():
    """As one resolved within group_wait: a flash of one moment's lines taken one after another
    (the pipeline hands a snapshot of the firing alert and then the resolved one) is no news."""
    rec = Recorder()
    d = Dispatcher([rec], group_wait=0, group_interval=0)
    a = alert(rank="DP0", starts_at=100)
    with d.together():
        d.handle(copy.deepcopy(a), now=100)
        d.handle(alert(rank="DP1", starts_at=100), now=100)
        d.handle(resolved(a, 101), now=101)
    assert [sorted(s) for s in rec.summary()] == [["firing:AcceptanceCollapse:DP1"]]


def test_an_episode_inside_one_batch_is_notified_firing_then_resolved():
    """A collapse and its recovery 12 s later, both in one read (a backlog written while
    specwatch was down): news, the firing goes out before its resolve is taken in."""
    rec = Recorder()
    d = Dispatcher([rec], group_wait=0, group_interval=0)
    a = alert(rank="DP0", starts_at=100)
    with d.together():
        d.handle(copy.deepcopy(a), now=200)
        d.handle(resolved(a, 112), now=200)
    assert rec.summary() == [("firing:AcceptanceCollapse:DP0",), ("resolved:AcceptanceCollapse:DP0",)]


def test_updates_handed_over_together_are_one_message():
    rec = Recorder()
    d = Dispatcher([rec], group_wait=0, group_interval=300)
    alerts = [alert(rank=f"DP{r}") for r in range(3)]
    with d.together():
        for a in alerts:
            d.handle(a, now=100)
    for a in alerts:
        a.annotations["update"] = "diagnosis: 1 error"
    with d.together():
        for a in alerts:
            d.handle(a, now=105)
    assert len(rec.got) == 2 and [a.annotations.get("update") for a in rec.got[1].alerts] == ["diagnosis: 1 error"] * 3
