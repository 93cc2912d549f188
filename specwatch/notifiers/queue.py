"""Durable, ordered delivery shared by every notifier: an on-disk queue and one sender thread.

A notifier subclasses `QueuedNotifier` and supplies two steps: `render(data)` (queued JSON →
the payload to send; an exception drops the item as permanently broken) and `send(payload,
timeout)` (one attempt → an `Attempt`). The base class keeps the queue, in order, in
`<state_dir>/<name>-queue.json` (rewritten atomically on every change, so it survives a crash or
restart), retries transient failures forever with exponential backoff (a 429 or 503 waits its
Retry-After instead, when it sends one), and counts what happened.

Dead letter: an item the receiver refuses (a permanent answer: Slack's 404 `no_service`, a 4xx)
is logged at ERROR once and kept, not dropped (a coalesced snapshot excepted: the next one
replaces it): it leaves the head of the queue (what follows is still delivered) and is stored
marked `data["dead_letter"] = {"status", "detail", "at", "endpoint"}` (HTTP status or None, the
redacted answer, epoch seconds, a hash of the receiver's URL). It goes back into the queue, oldest first, when the receiver takes a notification again,
when its oldest one is accepted by a probe retry (the sender thread re-sends it after
backoff_initial, doubling up to backoff_max), when the receiver's URL changes (a reload or a
restart with another URL: `take_queue`, `_load_store`), or on `retry_dead` (`specwatch
notifications retry`). `dead_letter` lists them; `specwatch.notifiers.failing` raises an alert
about them through the other receivers (this receiver is not sent alerts about itself).

With a `StateStore` (the daemon) the queue lives in its `outbox` table instead: `enqueue` only
stages an item, the daemon's commit writes it in the same transaction as the rule state that
made it (`changes` / `committed`), and only then may it be sent; its row is deleted as soon as
the receiver accepted it. While the store cannot be written, staged items are sent from memory
and written by the first commit that works, if still pending.

Delivery is at-least-once: if the process dies after the receiver accepted an item but before
its removal was written, that item is sent again after the restart. A clean stop (SIGTERM)
waits for the request in flight, so a restart repeats nothing.

Ordering: one queue per receiver, oldest first; an item is retried until it succeeds or is
refused before the next one is tried (a refused one that goes back in the queue takes its place
by age again), so notifications about one alert arrive in the order they
were made. `coalesce_key` lets a notifier replace a queued item that has not been sent yet (the
Alertmanager push queues full snapshots: only the newest matters).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import threading
import time
from pathlib import Path
from typing import TextIO

from specwatch.alerts.model import Notification
from specwatch.notifiers.http import PERMANENT, RETRY, SENT, Attempt
from specwatch.system.storage import write_json_atomic

DESCRIBE_MAX = 5  # alerts named in one log line about a notification
DEAD = "dead_letter"  # the key of a refused item's data that marks it kept in the dead letter
FAILING_ALERT = "SpecwatchNotificationsFailing"  # specwatch.notifiers.failing: not sent to the receiver it names
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def describe_alerts(data: dict, most: int = DESCRIBE_MAX) -> str:
    """The alerts of a queued item's data on one line (see `QueuedNotifier.describe`)."""
    alerts = data.get("alerts") or []
    parts = []
    for a in alerts[:most]:
        labels = a.get("labels", {})
        where = " ".join(v for v in (labels.get("server", ""), labels.get("rank", "")) if v)
        parts.append(f"{labels.get('alertname', '?')} {a.get('status', '?')}" + (f" on {where}" if where else ""))
    if len(alerts) > most:
        parts.append(f"{len(alerts) - most} more")
    return " ".join("; ".join(parts).split()) or "notification"


def queue_file(state_dir: str | os.PathLike, name: str) -> Path:
    """`<state_dir>/<name>-queue.json`, with characters unsafe in a file name replaced by `_`."""
    return Path(state_dir) / f"{_UNSAFE.sub('_', name)}-queue.json"


class QueuedNotifier:
    """Base class: a durable FIFO of JSON items and a thread that delivers them one at a time.

    name: the `notifier` label of the delivery metrics (e.g. `slack`, `webhook/ops`).
    queue_path: JSON file holding pending items across restarts (None: memory only). With
        `store`, the file of an earlier version to migrate: its items are taken into the outbox
        and `migrated()` renames it `<name>.migrated` once they are committed.
    store: a `specwatch.system.storage.StateStore` whose outbox holds the queue (see the module doc).
    timeout: seconds per attempt. backoff_initial / backoff_max: seconds; the n-th consecutive
        transient failure waits min(backoff_max, backoff_initial × 2^n) minus up to 10 % jitter.
        A wait the receiver asks for (Retry-After) is used instead and leaves the backoff alone.
    dry_run: a text stream; when set each payload is printed there (`dry_run_text`: indented JSON
        unless a notifier renders it for people) and nothing is sent (counted as sent).
    dry_run_json: print the payloads as JSON even where a notifier has a readable rendering.
    send_resolved: whether the dispatcher sends this receiver notifications of resolved alerts.

    Counters (read by the metrics layer): `sent_total`, `failed_total` {"permanent": refusals
    (items put in the dead letter, or malformed and dropped), "retry": failed attempts that will
    be retried}, `queue_depth` (not counting the dead letter), `dead_letter_count`,
    `last_success_timestamp` (seconds since the epoch, None before the first success).

    Raises ValueError when a backoff/timeout is not positive; OSError when an existing queue file
    cannot be read. A queue file that is not valid JSON is renamed to `<name>.corrupt-<epoch>`
    and logged at ERROR.
    """

    kind = "notifier"  # human name in log lines ("Slack", "webhook", "Alertmanager")

    def __init__(
        self,
        name: str,
        *,
        queue_path: Path | None = None,
        store=None,
        timeout: float = 10.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 300.0,
        dry_run: TextIO | None = None,
        dry_run_json: bool = False,
        send_resolved: bool = True,
        logger: logging.Logger | None = None,
    ) -> None:
        if timeout <= 0 or backoff_initial <= 0 or backoff_max < backoff_initial:
            raise ValueError("timeout and backoff_initial must be > 0 and backoff_max >= backoff_initial")
        self.name = name
        self.queue_path = Path(queue_path) if queue_path is not None else None
        self.timeout = timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.send_resolved = send_resolved
        self.log = logger or logging.getLogger(f"specwatch.notifiers.{self.kind.lower()}")
        self._dry_run = dry_run
        self._dry_run_json = dry_run_json

        self.sent_total = 0
        self.failed_total: dict[str, int] = {PERMANENT: 0, RETRY: 0}
        self.last_success_timestamp: float | None = None

        self._pending: list[dict] = []  # [{"seq": int, "key": str|None, "data": dict}], oldest first
        self._next_seq = 1
        self._inflight: int | None = None  # seq of the item being attempted (never coalesced)
        self._lock = threading.Lock()  # guards _pending, _next_seq, _inflight and the queue file
        self._cond = threading.Condition(self._lock)
        self._send_lock = threading.Lock()  # one delivery attempt at a time (thread or drain)
        self._failures = 0  # consecutive transient failures of the head item
        self._not_before = 0.0  # time.monotonic() before which the head is not retried
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.store = store
        self._staged: list[dict] = []  # store: enqueued, not committed yet, not sent yet
        self._unsaved: set[int] = set()  # store: seqs whose row is to be written
        self._undeleted: set[int] = set()  # store: seqs delivered whose row is still to be deleted
        self._on_disk: set[int] = set()  # store: seqs with a committed row
        self._legacy = False  # store: items were read from the queue_path file
        self._dead: list[dict] = []  # refused items, oldest first (data carries DEAD)
        self._dead_failures = 0  # probe retries of the dead letter refused in a row
        self._dead_next = 0.0  # time.monotonic() of the next probe retry
        if store is not None:
            self._load_store()
        elif self.queue_path is not None:
            self._load(self.queue_path)

    # -- what subclasses provide ---------------------------------------------------------

    def render(self, data: dict) -> object:
        """Queued item → payload (JSON-able). Raising drops the item as permanently broken."""
        raise NotImplementedError

    def dry_run_text(self, payload: object) -> str:
        """What a dry run prints for `payload`: indented JSON (a notifier may show it as people
        would read it)."""
        return json.dumps(payload, indent=2, ensure_ascii=False) + "\n"

    def send(self, payload: object, timeout: float) -> Attempt:
        """One delivery attempt of `payload`, at most `timeout` seconds. Must not raise."""
        raise NotImplementedError

    def describe(self, data: dict) -> str:
        """Short text naming the item in log lines (no secrets), one line whatever the labels
        hold: `AcceptanceCollapse firing on gpu-box-1 TP0; ThroughputDrop resolved on gpu-box-1`."""
        return describe_alerts(data)

    def delivered(self, data: dict, what: str) -> None:
        """Log one delivered item (INFO); a notifier that re-sends the same content on a timer
        (Alertmanager) overrides this to say only what is new."""
        self.log.info("%s delivered %s", self.kind, what)

    def notify(self, notification: Notification) -> int:
        """Queue a group notification (from the dispatcher); returns its sequence number (0:
        nothing queued: it held only alerts that this receiver refuses notifications)."""
        about_me = [a for a in notification.alerts
                    if a.labels.get("alertname") == FAILING_ALERT and a.labels.get("receiver") == self.name]
        if about_me:
            notification.alerts = [a for a in notification.alerts if a not in about_me]
            if not notification.alerts:
                return 0
        return self.enqueue(notification.to_dict())

    # -- dead letter -----------------------------------------------------------------------

    @property
    def endpoint_id(self) -> str:
        """16 hex digits of SHA-256 over where this notifier posts (URL, channel): tells a
        dead-lettered item whether its receiver changed since (the URL itself is a secret)."""
        url = getattr(self, "_url", None) or getattr(self, "_api", None)
        text = json.dumps([getattr(url, "value", ""), getattr(self, "channel", None)])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def dead_letter_count(self) -> int:
        return len(self._dead)

    def dead_letter(self) -> list[dict]:
        """The refused items, oldest first: [{"seq", "what" (alerts, as in log lines), "status"
        (HTTP status or None), "detail" (the receiver's answer, redacted), "at" (epoch s)}]."""
        with self._lock:
            return [{"seq": it["seq"], "what": self.describe(it["data"]), "status": it["data"][DEAD].get("status"),
                     "detail": it["data"][DEAD].get("detail", ""), "at": it["data"][DEAD].get("at")}
                    for it in self._dead]

    def retry_dead(self, why: str) -> int:
        """Put every dead-lettered item back in the queue (oldest first, before the items queued
        after them) and send at once; `why` goes in the log line. Returns how many."""
        with self._cond:
            n = self._revive_locked()
            self._cond.notify_all()
        if n:
            self.log.info("%s: %d refused notification(s) back in the queue (%s)", self.kind, n, why)
        return n

    def _revive_locked(self) -> int:
        dead, self._dead = self._dead, []
        for it in dead:
            it["data"].pop(DEAD, None)
            if self.store is not None:
                self._unsaved.add(it["seq"])  # its row is written again without the mark
        head = [self._pending[0]] if self._pending and self._pending[0]["seq"] == self._inflight else []
        rest = self._pending[len(head):]
        self._pending = head + sorted(dead + rest, key=lambda it: it["seq"])
        self._dead_failures, self._dead_next = 0, 0.0
        if dead and self.store is None:
            self._persist_locked()
        return len(dead)

    def _bury(self, item: dict, result: Attempt) -> None:
        """The receiver refused `item`: out of the queue, into the dead letter (written at the
        next commit, or now to the queue file)."""
        with self._lock:
            self._inflight = None
            self._pending = [it for it in self._pending if it["seq"] != item["seq"]]
            item["data"][DEAD] = {"status": result.status, "detail": result.detail, "at": time.time(),
                                  "endpoint": self.endpoint_id}
            self._dead.append(item)
            if self.store is not None:
                self._unsaved.add(item["seq"])
            else:
                self._persist_locked()
            if len(self._dead) == 1:
                self._dead_failures = 0
                self._dead_next = time.monotonic() + self._probe_delay()

    def source_status(self) -> dict:
        """This receiver on the status page (`specwatch.status.view.source_status`): not ok while
        its dead letter holds anything. Names the notifier, never its URL."""
        dead = self.dead_letter()
        queued = self.queue_depth
        if dead:
            last = dead[-1]
            answer = f"HTTP {last['status']}" if last["status"] is not None else last["detail"][:60]
            state = f"{len(dead)} refused ({answer}), kept and retried"
        elif queued and self._failures:
            state = f"{queued} queued, retrying"
        else:
            state = f"{queued} queued" if queued else "delivering"
        return {"kind": "notifier", "name": self.name, "server": "", "ok": not dead, "state": state,
                "last_line_at": self.last_success_timestamp,
                "counters": {"sent": self.sent_total, "queued": queued, "dead_letter": len(dead),
                             "failed_attempts": self.failed_total[RETRY]}}

    def _probe_delay(self) -> float:
        return min(self.backoff_max, self.backoff_initial * 2.0 ** min(self._dead_failures, 60))

    # -- queue -----------------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """Items not yet delivered or dropped."""
        with self._lock:
            return len(self._pending) + len(self._staged)

    def enqueue(self, data: dict, coalesce_key: str | None = None) -> int:
        """Queue a snapshot of `data` and return its sequence number at once.

        With `coalesce_key`, a queued item with the same key that is not being sent right now
        is replaced in place (keeping its position and number). With a queue_path the file is
        rewritten before returning; if that fails the error is logged and the item is kept in
        memory only. Raises TypeError when `data` holds values JSON cannot encode.
        """
        snapshot = json.loads(json.dumps(data))  # deep copy + proves it is storable
        if self.store is not None:
            return self._stage(snapshot, coalesce_key)
        with self._cond:
            for it in self._pending:
                if coalesce_key is not None and it.get("key") == coalesce_key and it["seq"] != self._inflight:
                    it["data"] = snapshot
                    seq = it["seq"]
                    break
            else:
                seq = self._next_seq
                self._next_seq += 1
                self._pending.append({"seq": seq, "key": coalesce_key, "data": snapshot})
            self._persist_locked()
            self._cond.notify_all()
        return seq

    def _stage(self, snapshot: dict, key: str | None) -> int:
        with self._cond:
            for it in self._staged + self._pending:
                if key is not None and it.get("key") == key and it["seq"] != self._inflight:
                    it["data"] = snapshot
                    self._unsaved.add(it["seq"])
                    return it["seq"]
            seq = self._next_seq
            self._next_seq += 1
            self._staged.append({"seq": seq, "key": key, "data": snapshot})
            self._unsaved.add(seq)
            return seq

    @property
    def has_changes(self) -> bool:
        """Store: something is staged or not yet written (the daemon then commits)."""
        return bool(self._staged or self._unsaved or self._undeleted)

    def changes(self) -> tuple[list[tuple[str, int, str | None, str]], list[tuple[str, int]]]:
        """Store: (rows to write, rows to delete) for `StateStore.commit`; the caller holds
        `store.lock` until it hands the result to `committed`."""
        with self._lock:
            put = [(self.name, it["seq"], it["key"], json.dumps(it["data"]))
                   for it in self._staged + self._pending + self._dead if it["seq"] in self._unsaved]
            return put, [(self.name, seq) for seq in self._undeleted]

    def committed(self, ok: bool, put: list, delete: list) -> None:
        """Store: the commit of `changes()` ended; staged items may be sent now (from memory
        when `ok` is False: they are written by a later commit while still pending)."""
        with self._cond:
            if ok:
                self._unsaved.difference_update(p[1] for p in put)
                self._undeleted.difference_update(d[1] for d in delete)
                self._on_disk.update(p[1] for p in put)
                self._on_disk.difference_update(d[1] for d in delete)
            if self._staged:
                self._pending.extend(self._staged)
                self._staged.clear()
                self._cond.notify_all()

    def take_queue(self, old: "QueuedNotifier") -> None:
        """Store: continue the queue of `old`, the notifier of the same name before a reload
        (stopped): what it has not committed or deleted yet is not in the outbox."""
        with old._lock, self._lock:
            self._pending, self._staged = list(old._pending), list(old._staged)
            self._unsaved, self._undeleted = set(old._unsaved), set(old._undeleted)
            self._on_disk = set(old._on_disk)
            self._next_seq = max(self._next_seq, old._next_seq)
            self._dead, self._dead_failures, self._dead_next = list(old._dead), old._dead_failures, old._dead_next
            changed = bool(self._dead) and old.endpoint_id != self.endpoint_id
            n = self._revive_locked() if changed else 0
        if n:
            self.log.info("%s: its URL changed; %d refused notification(s) back in the queue", self.kind, n)

    def migrated(self) -> None:
        """Store: the items of the old queue file are committed; rename it `<name>.migrated`."""
        if self._legacy and self.queue_path is not None and not self._unsaved:
            self._legacy = False
            try:
                os.replace(self.queue_path, self.queue_path.with_name(self.queue_path.name + ".migrated"))
            except OSError as exc:  # its items are committed: the file is only read once more
                self.log.warning("could not rename the migrated queue file %s: %s", self.queue_path, exc)

    def _load_store(self) -> None:
        rows = [{"seq": seq, "key": key, "data": data} for seq, key, data in self.store.outbox(self.name)]
        self._pending = [it for it in rows if DEAD not in it["data"]]
        self._dead = [it for it in rows if DEAD in it["data"]]
        self._next_seq = max([self.store.next_seq(self.name)] + [it["seq"] + 1 for it in rows])
        self._on_disk = {it["seq"] for it in rows}
        self._after_load_dead()
        if self.queue_path is not None and self.queue_path.exists():
            saved, first, self._pending = self._pending, self._next_seq, []
            self._load(self.queue_path)
            self._next_seq = first
            for it in self._pending:  # new numbers after the outbox's
                it["seq"] = self._next_seq
                self._next_seq += 1
                self._unsaved.add(it["seq"])
            self._pending = saved + self._pending
            self._legacy = True
        elif self._pending:
            self.log.info("%s outbox: %d notification(s) pending from a previous run", self.kind, len(self._pending))

    def _load(self, path: Path) -> None:
        try:
            raw = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            return
        try:
            data = json.loads(raw) if raw.strip() else {}
            pending = [self._item_from_file(it) for it in data.get("pending", [])]
            next_seq = int(data.get("next_seq", 1))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            os.replace(path, aside)
            self.log.error("%s queue file %s is unreadable (%s); moved to %s, starting empty",
                           self.kind, path, exc, aside)
            return
        pending.sort(key=lambda it: it["seq"])
        self._pending = [it for it in pending if DEAD not in it["data"]]
        self._dead += [it for it in pending if DEAD in it["data"]]
        self._next_seq = max([next_seq] + [it["seq"] + 1 for it in pending])
        if self.store is None:  # with a store: `_load_store` looked at its dead letter
            self._after_load_dead()
        if pending:
            self.log.info("%s queue %s: %d notification(s) pending from a previous run", self.kind, path, len(pending))

    def _after_load_dead(self) -> None:
        """Refused items from a previous run: back in the queue when the URL changed since."""
        if not self._dead:
            return
        if any(it["data"][DEAD].get("endpoint") != self.endpoint_id for it in self._dead):
            n = self._revive_locked()
            self.log.info("%s: its URL changed since the last run; %d refused notification(s) back in the queue",
                          self.kind, n)
        else:
            self._dead_next = time.monotonic() + self._probe_delay()
            self.log.warning("%s dead letter: %d notification(s) refused by the receiver in a previous run "
                             "(`specwatch notifications list`); retried when it takes one again", self.kind,
                             len(self._dead))

    def _item_from_file(self, it: dict) -> dict:
        if "data" not in it and "alert" in it:  # version 1 (Slack only): one alert per item
            data = {"receiver": self.name, "group_key": "", "group_labels": {}, "alerts": [dict(it["alert"])]}
            return {"seq": int(it["seq"]), "key": None, "data": data}
        return {"seq": int(it["seq"]), "key": it.get("key"), "data": dict(it["data"])}

    def _persist_locked(self) -> None:
        if self.queue_path is None:
            return
        try:
            write_json_atomic(self.queue_path, {"version": 2, "next_seq": self._next_seq,
                                                "pending": sorted(self._pending + self._dead, key=lambda it: it["seq"])})
        except OSError as exc:
            self.log.error("could not write %s queue file %s: %s", self.kind, self.queue_path, exc)

    def _remove(self, seq: int) -> None:
        if self.store is not None:
            # Under the store's lock: a commit never writes back a row deleted here.
            with self.store.lock:
                with self._lock:
                    self._inflight = None
                    self._pending = [it for it in self._pending if it["seq"] != seq]
                    self._dead = [it for it in self._dead if it["seq"] != seq]
                    self._unsaved.discard(seq)
                    if seq not in self._on_disk:  # no row committed: nothing to delete
                        return
                ok = self.store.commit(None, [], [(self.name, seq)])
                with self._lock:
                    if ok:
                        self._on_disk.discard(seq)
                    else:
                        self._undeleted.add(seq)
            return
        with self._lock:
            self._inflight = None
            for i, it in enumerate(self._pending):
                if it["seq"] == seq:
                    del self._pending[i]
                    self._persist_locked()
                    return
            for i, it in enumerate(self._dead):
                if it["seq"] == seq:
                    del self._dead[i]
                    self._persist_locked()
                    return

    # -- delivery ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the background delivery thread (no-op when already running)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name=f"specwatch-{self.name}", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop the delivery thread, waiting up to `timeout` seconds; pending items stay queued.

        A request in flight is not interrupted (it lasts at most `self.timeout` seconds). Returns
        True when the thread has ended.
        """
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def drain(self, timeout: float = 30.0) -> bool:
        """Deliver pending items in this thread for up to `timeout` seconds.

        Waits out backoff and Retry-After like the background thread (the two may run at once;
        attempts are serialised). Request timeouts are shortened so the call ends within about
        `timeout`. Returns True when the queue is empty.
        """
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return self.queue_depth == 0
            if not self._pending:
                return self.queue_depth == 0  # items staged for a commit are not sendable yet
            wait = self._deliver_one(request_timeout=min(self.timeout, remaining))
            if wait is None:
                return self.queue_depth == 0
            if wait > 0:
                time.sleep(min(wait, max(0.0, deadline - time.monotonic())))

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopping:
                    return
            wait = self._deliver_one(request_timeout=self.timeout)
            with self._cond:
                if self._stopping:
                    return
                if wait is None:
                    if not self._pending:
                        self._cond.wait()  # enqueue(), retry_dead() or stop() wakes us
                elif wait > 0:
                    # enqueue() may wake us early; _deliver_one then returns the time still left.
                    self._cond.wait(wait)

    def _deliver_one(self, request_timeout: float) -> float | None:
        """Try the oldest item once.

        Returns None when nothing is pending, 0 to go on at once, or seconds to wait before the
        head may be tried again.
        """
        with self._send_lock:
            with self._lock:
                if not self._pending:
                    if not self._dead or self._dry_run is not None:
                        return None
                    wait = self._dead_next - time.monotonic()
                    if wait > 0:
                        return wait
            if not self._pending:
                return self._probe(request_timeout)
            with self._lock:
                wait = self._not_before - time.monotonic()
                if wait > 0:
                    return wait
                item = self._pending[0]
                self._inflight = item["seq"]
                data = item["data"]
            delay = self._attempt(item["seq"], data, request_timeout)
            if isinstance(delay, Attempt):  # refused: kept in the dead letter, the next one goes on
                self._failures = 0
                self._not_before = 0.0
                if item.get("key") is None:
                    self._bury(item, delay)
                else:  # a coalesced snapshot (Alertmanager): the next one replaces it, an old one must not follow
                    self._remove(item["seq"])
                return 0.0
            if delay is not None:
                key = item.get("key")
                with self._lock:
                    superseded = key is not None and any(it.get("key") == key for it in self._pending[1:])
                if superseded:
                    self._remove(item["seq"])  # a newer item replaced it while it was being sent
                    return 0.0
                with self._lock:
                    self._inflight = None
                self._not_before = time.monotonic() + delay
                return delay
            self._failures = 0
            self._not_before = 0.0
            self._remove(item["seq"])
            if self._dead and self._dry_run is None:
                self.retry_dead("the receiver takes notifications again")
            return 0.0

    def _probe(self, request_timeout: float) -> float:
        """Send the oldest dead-lettered item again (the send thread holds `_send_lock`): accepted,
        the rest of the dead letter goes back in the queue; refused or failed, the next probe
        waits twice as long, up to backoff_max. Returns 0 or the seconds until the next probe."""
        with self._lock:
            item = self._dead[0]
            data = {k: v for k, v in item["data"].items() if k != DEAD}
        what = f"{self.describe(data)} seq={item['seq']}"
        try:
            result = self.send(self.render(data), request_timeout)
        except Exception as exc:  # noqa: BLE001 - a malformed item stays where it is
            result = Attempt(PERMANENT, None, f"{type(exc).__name__}: {exc}")
        if result.outcome == SENT:
            self.sent_total += 1
            self.last_success_timestamp = time.time()
            self.delivered(data, what)
            self._remove(item["seq"])
            self.retry_dead("the receiver took a retried notification")
            return 0.0
        with self._lock:
            self._dead_failures += 1
            delay = self._probe_delay()
            self._dead_next = time.monotonic() + delay
        self.log.warning("%s still refuses %s (%s); %d notification(s) in the dead letter, next retry in %.0fs",
                         self.kind, what, result.detail, len(self._dead), delay)
        return delay

    def _backoff(self) -> float:
        delay = min(self.backoff_max, self.backoff_initial * 2.0 ** min(self._failures, 60))
        self._failures += 1
        return delay * random.uniform(0.9, 1.0)  # jitter down, so backoff_max is a true cap

    def _attempt(self, seq: int, data: dict, request_timeout: float) -> float | Attempt | None:
        """One attempt; returns None when the item is done (sent or dropped as malformed), the
        receiver's `Attempt` when it refused the item (to keep in the dead letter), else the
        delay before the next attempt."""
        what = f"{self.describe(data)} seq={seq}"
        try:
            payload = self.render(data)
        except Exception as exc:  # a hand-edited or foreign queue file; retrying cannot help
            self.failed_total[PERMANENT] += 1
            self.log.error("%s notification %s is malformed (%s: %s); dropped", self.kind, what, type(exc).__name__, exc)
            return None
        if self._dry_run is not None:
            try:
                self._dry_run.write(json.dumps(payload, indent=2, ensure_ascii=False) + "\n" if self._dry_run_json
                                    else self.dry_run_text(payload))
                self._dry_run.flush()
            except (OSError, ValueError) as exc:  # closed or full stream: keep it queued
                self.failed_total[RETRY] += 1
                delay = self._backoff()
                self.log.warning("dry-run output failed (%s); retry in %.2fs", exc, delay)
                return delay
            result = Attempt(SENT)
        else:
            result = self.send(payload, request_timeout)
        if result.outcome == SENT:
            self.sent_total += 1
            self.last_success_timestamp = time.time()
            if self._dry_run is None:
                self.delivered(data, what)
            else:
                self.log.info("%s dry run: printed %s (nothing sent)", self.kind, what)
            return None
        if result.outcome == PERMANENT:
            self.failed_total[PERMANENT] += 1
            if any(it["seq"] == seq and it.get("key") is not None for it in self._pending):
                self.log.error("%s refused %s: %s; dropped: the next snapshot replaces it", self.kind, what,
                               result.detail)
            else:
                self.log.error("%s refused %s: %s; kept in the dead letter (%d there), retried when the receiver "
                               "takes a notification again or its URL changes (`specwatch notifications list`)",
                               self.kind, what, result.detail, len(self._dead) + 1)
            return result
        self.failed_total[RETRY] += 1
        # the wait the receiver asks for leaves the backoff alone; a 429 without one backs off as any failure
        delay = result.wait if result.wait is not None else self._backoff()
        if result.rate_limited:
            self.log.warning("%s rate-limited %s (%s); retry in %.2fs", self.kind, what, result.detail, delay)
        else:
            self.log.warning("%s delivery of %s failed (%s); retry %d in %.2fs",
                             self.kind, what, result.detail, self._failures, delay)
        return delay
