"""Dispatcher: one message on firing, one on resolve, repeats only after repeat_interval."""

from specwatch.alerts.dispatcher import Dispatcher
from specwatch.alerts.model import Alert


class Recorder:
    def __init__(self):
        self.got = []

    def notify(self, alert):
        self.got.append((alert.status, alert.labels["rank"]))


def alert(status="firing", rank="TP0", ends_at=None):
    return Alert(labels={"alertname": "AcceptanceCollapse", "server": "s", "rank": rank},
                 annotations={"summary": "x"}, starts_at=100.0, status=status, ends_at=ends_at)


def test_fire_repeat_resolve():
    rec = Recorder()
    d = Dispatcher([rec], repeat_interval=3600)
    d.handle(alert(), now=100)
    d.handle(alert(), now=150)  # same fingerprint while firing: deduplicated
    d.tick(now=3699)
    assert rec.got == [("firing", "TP0")]
    d.tick(now=3700)
    assert rec.got == [("firing", "TP0")] * 2
    d.handle(alert("resolved", ends_at=4000.0), now=4000)
    d.tick(now=100000)
    assert rec.got == [("firing", "TP0")] * 2 + [("resolved", "TP0")]
    assert d.active == {}


def test_resolve_of_unknown_alert_is_ignored():
    rec = Recorder()
    d = Dispatcher([rec])
    d.handle(alert("resolved"), now=1)
    assert rec.got == []


def test_notifier_gets_a_snapshot_not_the_live_object():
    rec = []

    class Keep:
        def notify(self, a):
            rec.append(a)

    d = Dispatcher([Keep()])
    a = alert()
    d.handle(a, now=1)
    a.evidence.append(("later", "1"))
    assert rec[0].evidence == []


def test_state_round_trip():
    rec = Recorder()
    d = Dispatcher([rec], repeat_interval=60)
    d.handle(alert(), now=100)
    d2 = Dispatcher([rec], repeat_interval=60)
    d2.load_state(d.to_state())
    d2.handle(alert(), now=120)  # already firing before the restart: not sent again
    d2.tick(now=159)
    assert rec.got == [("firing", "TP0")]
    d2.tick(now=160)
    assert len(rec.got) == 2


def test_update_of_a_firing_alert_is_sent_once_and_not_repeated_as_update():
    rec = []

    class Keep:
        def notify(self, a):
            rec.append(a)

    d = Dispatcher([Keep()], repeat_interval=60)
    a = alert()
    d.handle(a, now=100)
    a.fixes = ["[error] unloaded_weights: ..."]
    a.annotations["update"] = "specwatch diagnose: 1 error(s)"
    d.handle(a, now=110)
    assert [x.annotations.get("update") for x in rec] == [None, "specwatch diagnose: 1 error(s)"]
    assert rec[1].fixes == ["[error] unloaded_weights: ..."] and rec[1].fingerprint == rec[0].fingerprint
    assert "update" not in a.annotations and "update" not in d.active[a.fingerprint].annotations
    d.handle(a, now=120)  # no new update mark: deduplicated as before
    d.tick(now=170)  # the repeat carries the new fixes, not the update mark
    assert len(rec) == 3 and rec[2].annotations.get("update") is None and rec[2].fixes == a.fixes
    b = alert(rank="TP1")
    b.annotations["update"] = "x"
    d.handle(b, now=130)  # an update of an alert that is not firing fires it normally
    assert rec[-1].labels["rank"] == "TP1"
