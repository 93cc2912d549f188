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
