"""The durable queue every notifier shares: coalescing, file format, upgrade from the Slack-only file."""

from __future__ import annotations

import json

from specwatch.alerts.model import Alert
from specwatch.notifiers.queue import queue_file
from specwatch.notifiers.slack import SlackNotifier
from specwatch.notifiers.webhook import WebhookNotifier


def alert(server):
    return Alert(labels={"alertname": "AcceptanceCollapse", "server": server, "rank": "TP0"},
                 annotations={"summary": "s"}, starts_at=1771864362.0, evidence=[("accept len", "1.00")])


def test_coalescing_replaces_the_unsent_item_in_place(slack, tmp_path):
    qp = tmp_path / "q.json"
    n = WebhookNotifier(slack.url, queue_path=qp)
    s1 = n.enqueue({"n": 1}, coalesce_key="snapshot")
    s2 = n.enqueue({"n": 2})
    s3 = n.enqueue({"n": 3}, coalesce_key="snapshot")
    assert (s1, s2, s3) == (1, 2, 1) and n.queue_depth == 2
    on_disk = json.loads(qp.read_text())
    assert on_disk["version"] == 2 and on_disk["next_seq"] == 3
    assert [(it["seq"], it["key"], it["data"]) for it in on_disk["pending"]] == [
        (1, "snapshot", {"n": 3}), (2, None, {"n": 2})]


def test_a_slack_queue_file_of_the_previous_version_is_delivered(slack, tmp_path):
    qp = tmp_path / "slack-queue.json"
    qp.write_text(json.dumps({"version": 1, "next_seq": 8, "pending": [
        {"seq": 6, "alert": alert("old-1").to_dict()}, {"seq": 7, "alert": alert("old-2").to_dict()}]}))
    n = SlackNotifier(slack.url, queue_path=qp, backoff_initial=0.05, backoff_max=0.1)
    assert n.queue_depth == 2
    assert n.drain(5)
    assert slack.delivered_texts() == ["[FIRING] AcceptanceCollapse on old-1 TP0: accept len 1.00",
                                       "[FIRING] AcceptanceCollapse on old-2 TP0: accept len 1.00"]
    assert n.notify(alert("new")) == 8


def test_queue_file_names():
    assert queue_file("/var/lib/specwatch", "slack").name == "slack-queue.json"
    assert queue_file("/s", "alertmanager/10.0.0.1:9093").name == "alertmanager_10.0.0.1_9093-queue.json"


def test_with_a_store_an_item_is_sent_only_once_committed(slack, tmp_path):
    """Daemon mode (issue #10 item 18): `enqueue` stages; the commit writes the outbox row and
    releases it; delivery deletes the row. Coalescing replaces a staged item."""
    from specwatch.system.storage import StateStore

    store = StateStore(tmp_path)
    hook = WebhookNotifier(slack.url, store=store, name="webhook/ops")
    assert (hook.enqueue({"n": 1}, coalesce_key="k"), hook.enqueue({"n": 2}), hook.enqueue({"n": 3}, coalesce_key="k")) == (1, 2, 1)
    assert hook.changes() == ([("webhook/ops", 1, "k", '{"n": 3}'), ("webhook/ops", 2, None, '{"n": 2}')], [])

    n = SlackNotifier(slack.url, store=store, backoff_initial=0.05, backoff_max=0.1)
    assert (n.notify(alert("a")), n.notify(alert("b"))) == (1, 2)
    assert n.queue_depth == 2 and n.has_changes
    assert n.drain(0.2) is False and slack.received == []  # staged: not sendable before the commit
    put, delete = n.changes()
    assert store.commit('{"a": 1}', put, delete)
    n.committed(True, put, delete)
    assert [(seq, key) for seq, key, _ in store.outbox("slack")] == [(1, None), (2, None)] and not n.has_changes
    assert n.drain(5) and slack.delivered_texts() == ["[FIRING] AcceptanceCollapse on a TP0: accept len 1.00",
                                                     "[FIRING] AcceptanceCollapse on b TP0: accept len 1.00"]
    assert store.outbox("slack") == [] and store.load() == {"a": 1}
    again = SlackNotifier(slack.url, store=store)  # as after a restart: its numbers go on
    assert again.queue_depth == 0 and again.notify(alert("c")) == 3


def test_sequence_numbers_survive_a_reopened_store_and_a_renamed_receiver(slack, tmp_path):
    """The next number is committed with the rows (the `sequence` table), so a store opened again
    (the daemon restarted) numbers on though every row was delivered and deleted; a renamed
    receiver keeps counting under its new name."""
    from specwatch.system.storage import StateStore

    store = StateStore(tmp_path)
    n = SlackNotifier(slack.url, store=store, name="slack")
    assert [n.notify(alert(s)) for s in "abc"] == [1, 2, 3]
    _commit(store, n)
    assert n.drain(5) and store.outbox("slack") == []
    store.close()
    store = StateStore(tmp_path)
    assert store.next_seq("slack") == 4 and store.next_seq("webhook/ops") == 1
    assert SlackNotifier(slack.url, store=store, name="slack").notify(alert("d")) == 4  # not 1 again
    store.rename_notifier("slack", "slack/oncall")
    assert (store.next_seq("slack"), store.next_seq("slack/oncall")) == (1, 4)


def _commit(store, n):
    put, delete = n.changes()
    assert store.commit(None, put, delete)
    n.committed(True, put, delete)


def test_a_refused_item_is_kept_in_the_store_and_goes_to_a_changed_url_after_a_restart(slack, tmp_path):
    """The dead letter is the item's own outbox row, marked: a restart with the same URL keeps it
    there (not sent), one with another URL (the webhook was re-created) sends it at once."""
    from slack_endpoint import SlackEndpoint
    from specwatch.notifiers.queue import DEAD
    from specwatch.system.storage import StateStore

    store = StateStore(tmp_path)
    slack.script.append((404, {}, "no_service"))
    n = SlackNotifier(slack.url, store=store, backoff_initial=60, backoff_max=60)
    n.notify(alert("box"))
    _commit(store, n)
    assert n.drain(5) and n.dead_letter_count == 1
    [kept] = n.dead_letter()
    assert (kept["status"], kept["detail"], kept["what"]) == (404, "HTTP 404 'no_service'", "AcceptanceCollapse firing on box TP0")
    _commit(store, n)
    [(seq, _, data)] = store.outbox("slack")
    assert data[DEAD]["status"] == 404 and data[DEAD]["endpoint"] == n.endpoint_id and "s3cr3t" not in json.dumps(data)

    same = SlackNotifier(slack.url, store=store, backoff_initial=60, backoff_max=60)
    assert (same.dead_letter_count, same.queue_depth) == (1, 0)
    assert same.drain(1) and len(slack.received) == 1  # the probe waits its backoff
    new = SlackEndpoint()
    try:
        moved = SlackNotifier(new.url, store=store, backoff_initial=60, backoff_max=60)
        assert (moved.dead_letter_count, moved.queue_depth) == (0, 1)
        _commit(store, moved)
        assert moved.drain(5)
        assert new.delivered_texts() == ["[FIRING] AcceptanceCollapse on box TP0: accept len 1.00"]
        assert store.outbox("slack") == []
    finally:
        new.close()


def test_an_alert_about_a_receiver_is_not_queued_for_that_receiver(slack):
    from specwatch.alerts.model import Notification
    from specwatch.notifiers.failing import failing_alert

    about = failing_alert("slack", "Slack", [{"what": "x", "status": 404, "detail": "HTTP 404 'no_service'"}],
                          "box", 1771864362.0)
    n = SlackNotifier(slack.url)
    assert n.notify(Notification("slack", "g", {}, [about])) == 0 and n.queue_depth == 0
    other = WebhookNotifier(slack.url, name="webhook/ops")
    assert other.notify(Notification("webhook/ops", "g", {}, [about])) == 1
