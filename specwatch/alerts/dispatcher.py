"""From rule transitions to notifications, with Alertmanager's semantics.

Rules hand over transitions (`handle`: an alert starts firing, or resolves). The dispatcher

- keeps every current alert by fingerprint (firing, and resolved ones until they are notified);
- routes each alert: the first route whose matchers match (more with `continue`), else the
  default route; a route names its receivers (notifiers) and its timers;
- groups alerts per route by the values of its `group_by` labels (none: one group; `...`: every
  label, i.e. one group per alert);
- flushes a group `group_wait` after it appeared (however long ago its first alert started:
  alerts that fire within group_wait of each other share one message), then every
  `group_interval`; an alert joining a group whose incident is open (an alert of it firing and
  notified) goes out in one follow-up at the next group_interval tick, never in a message of its
  own (group_wait after it, where a receiver edits the incident's message in place: a Slack
  bot's `chat.update`); one that finds nothing open starts a new incident, out group_wait after it fired; at a
  flush it leaves out alerts muted by an
  inhibit rule or a silence and sends a receiver a notification only when the set of firing
  (or, with send_resolved, resolved) alerts changed since the last notification to it, or when
  `repeat_interval` has passed (so repeats fall on a group_interval tick, as in Alertmanager);
- sends an update of a firing alert (a rule hands it over again with `annotations["update"]`,
  e.g. collapse diagnosis findings that arrived after it fired) at once, to the receivers of
  the groups that were already told about it, as a notification of that group with the alert
  marked (Slack shows `[UPDATE]`); updates handed over together (`handle(..., flush=False)`,
  then `flush_due`: the findings of every rank of a server) are one notification per group;
- feeds every alert that no silence mutes to the push notifiers (Alertmanager), which re-send
  on their own schedule.

Time comes from the caller's clock (log timestamps in replay, wall time in the daemon), so replay
and run share this code path. Not thread-safe: the pipeline calls it under its lock.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Protocol

from specwatch.alerts.inhibit import InhibitRule, inhibited
from specwatch.alerts.matchers import Matcher, matches_all
from specwatch.alerts.model import FIRING, RESOLVED, Alert, Notification
from specwatch.alerts.silences import SilenceStore

log = logging.getLogger("specwatch.alerts")

# Alertmanager's route defaults (prometheus/alertmanager `docs/configuration.md`, `<route>`).
GROUP_WAIT = 30.0
GROUP_INTERVAL = 300.0
REPEAT_INTERVAL = 4 * 3600.0
ALL_LABELS = "..."


class Receiver(Protocol):
    name: str
    send_resolved: bool

    def notify(self, notification: Notification) -> object: ...


class Pusher(Protocol):
    def sync(self, alerts: list[Alert], now: float, changed: bool) -> object:
        """Must not keep or change the alerts it is given (they are the dispatcher's)."""


@dataclass
class Route:
    """Where matching alerts go and how they are grouped. Times are seconds.

    group_by: label names; [] puts every alert of the route in one group (Alertmanager's
    default), ["..."] gives each alert its own group.
    """

    name: str
    receivers: list[Receiver]
    matchers: list[Matcher] = field(default_factory=list)
    group_by: list[str] = field(default_factory=list)
    group_wait: float = GROUP_WAIT
    group_interval: float = GROUP_INTERVAL
    repeat_interval: float = REPEAT_INTERVAL
    continue_matching: bool = False

    def group_labels(self, labels: dict[str, str]) -> dict[str, str]:
        if ALL_LABELS in self.group_by:
            return dict(labels)
        return {k: labels.get(k, "") for k in self.group_by}


@dataclass
class _Group:
    route: Route
    key: str
    labels: dict[str, str]
    fingerprints: set[str] = field(default_factory=set)
    next_flush: float = float("-inf")
    flushed: bool = False
    seen_version: int = -1  # Dispatcher._version at the last flush
    next_repeat: float = float("-inf")  # a flush before this, with nothing changed, sends nothing
    updates: dict[str, str] = field(default_factory=dict)  # fingerprint → update note not sent yet


# An alert whose stamps span no more than this from firing to resolving, inside one `together`
# batch, is a flash of one moment's lines taken one after another (whole-second stamps).
FLASH_SECONDS = 1.0


def _flash(alert: Alert) -> bool:
    return alert.ends_at is not None and alert.ends_at - alert.starts_at <= FLASH_SECONDS


class Dispatcher:
    """Route, group, mute and notify.

    notifiers: the default route's receivers (each with `name`, `send_resolved`, `notify`).
    repeat_interval, group_by, group_wait, group_interval: the default route's settings
    (Alertmanager's defaults: 4h, [], 30s, 5m). routes: checked in order before the default.
    inhibit_rules, silences: what mutes an alert. pushers: notifiers that get every unsilenced
    alert (`sync(alerts, now, changed)`). runbook_url: a template such as
    `https://wiki.example/runbooks/{alertname}`, added as the `runbook_url` annotation of
    alerts that have none. keep_history: keep every transition in `history` (replay, tests; the
    daemon turns it off: it would grow for ever). `labels` (set after construction): added to
    every alert handled, e.g. `replay --notify`'s `replay="<file>"`, so its fingerprints are not
    those of the live daemon's alerts.
    """

    def __init__(
        self,
        notifiers: Iterable[Receiver] = (),
        repeat_interval: float = REPEAT_INTERVAL,
        *,
        group_by: list[str] | None = None,
        group_wait: float = GROUP_WAIT,
        group_interval: float = GROUP_INTERVAL,
        routes: Iterable[Route] = (),
        inhibit_rules: Iterable[InhibitRule] = (),
        silences: SilenceStore | None = None,
        pushers: Iterable[Pusher] = (),
        runbook_url: str = "",
        keep_history: bool = True,
    ):
        self.default_route = Route("default", list(notifiers), [], list(group_by or []), group_wait,
                                   group_interval, repeat_interval)
        self.routes = list(routes)
        self.inhibit_rules = list(inhibit_rules)
        self.silences = silences
        self.pushers = list(pushers)
        self.runbook_url = runbook_url
        self.keep_history = keep_history
        self.labels: dict[str, str] = {}
        self._version = 0  # bumped on every alert or silence change (see _flush_due)
        # While paused (the daemon catching up on a backlog at start), alerts are tracked but
        # nothing is sent: an episode that fired and resolved in old log lines never notifies,
        # one still firing when the backlog is read does (Alertmanager's notification-log rules).
        self.paused = False
        self.alerts: dict[str, Alert] = {}  # fingerprint → current alert (firing or resolved)
        # Status as last handled: a rule resolves by mutating the alert object it returned before,
        # so the stored object's own status cannot tell what the dispatcher already saw.
        self._status: dict[str, str] = {}
        self.history: list[Alert] = []  # transitions as handled (keep_history only)
        # (fingerprint, starts_at, now, note) of each update handed over (keep_history only): an
        # update is no transition, so `history` does not hold it (`replay.episodes` reads both)
        self.update_notes: list[tuple[str, float, float, str]] = []
        self._groups: dict[tuple[str, str], _Group] = {}
        self._nflog: dict[tuple[str, str, str], dict] = {}  # (route, group, receiver) → last sent
        self._updated: list[_Group] = []  # groups holding update notes to send (see `_update`)
        self._batch = False  # inside `together`: nothing flushes until it ends
        self._batch_fired: set[str] = set()  # fingerprints that fired inside it
        self._batch_clock = -math.inf  # the latest clock handed over inside `together`
        self._batch_tick = False  # a tick came inside `together`: the whole tick runs at its end

    @property
    def active(self) -> dict[str, Alert]:
        """Firing alerts by fingerprint."""
        return {fp: a for fp, a in self.alerts.items() if a.status == FIRING}

    # -- input -----------------------------------------------------------------------------

    def handle(self, alert: Alert, now: float, flush: bool = True) -> None:
        """Take a transition from a rule: a newly firing alert or a resolved one; or an update
        of a firing one.

        A firing alert already firing refreshes the stored copy (its evidence). When it carries
        `annotations["update"]` (what changed, e.g. diagnosis findings that arrived after it
        fired) its groups are notified once, now, the alert marked with that note; the mark is
        removed from the alert, so repeats do not carry it. A muted alert, or one whose group
        has not been notified yet, sends nothing extra: its next notification has the new
        content. A resolve of an alert that is not firing is ignored. `flush=False`: due groups
        wait for the caller's `flush_due` (alerts raised together are all in before any is sent,
        so inhibitions among them hold).
        """
        alert.labels.update(self.labels)
        fp = alert.fingerprint
        was_firing = self._status.get(fp) == FIRING
        if self._batch:
            self._batch_clock = max(self._batch_clock, now)
            flush = False
            if alert.status == FIRING and not was_firing:
                self._batch_fired.add(fp)
            elif alert.status == RESOLVED and fp in self._batch_fired and not _flash(alert):
                self._batch_fired.clear()
                self._flush_due(now)  # an episode inside one read (a backlog): its firing goes out first
        self._version += 1  # groups with this alert have something to say (or to re-check)
        note = alert.annotations.pop("update", None)  # meaningful only for an alert already firing
        if self.runbook_url and "runbook_url" not in alert.annotations:
            alert.annotations["runbook_url"] = self.runbook_url.format_map(_Blank(alert.labels))
        if alert.status == FIRING:
            if was_firing:
                self.alerts[fp] = alert
                if note:
                    log.info("alert update: %s: %s", describe(alert), _one_line(note))
                    if self.keep_history:
                        self.update_notes.append((fp, alert.starts_at, now, note))
                    self._update(alert, note, now)
                    if flush:
                        self._flush_due(now)
                return
            if fp in self.alerts:  # a new episode while the last one's resolve is still pending
                self._flush_pending_resolve(fp, now)
            self.alerts[fp] = alert
            for route in self._routes_for(alert):
                self._insert(route, alert, now)
        elif alert.status != RESOLVED or not was_firing:
            return
        self.alerts[fp] = alert
        self._status[fp] = alert.status
        if alert.status == FIRING:
            log.info("alert firing: %s: %s", describe(alert), _one_line(alert.annotations.get("summary", "")))
        else:
            lasted = "" if alert.ends_at is None else f" after {max(0.0, alert.ends_at - alert.starts_at):.0f}s"
            log.info("alert resolved%s: %s", lasted, describe(alert))
        if self.keep_history:
            self.history.append(copy.deepcopy(alert))
        if alert.status != FIRING and self.inhibit_rules:
            self._wake(now)
        if flush:
            self._flush_due(now)
        self._push(now, changed=True)

    def resume(self, now: float) -> None:
        """End a pause: resolved alerts that were never notified firing leave their groups (an
        old episode is not news), then due groups flush as usual."""
        notified = set().union(*(e["firing"] for e in self._nflog.values())) if self._nflog else set()
        for g in self._groups.values():
            g.fingerprints = {fp for fp in g.fingerprints
                              if fp in notified or (fp in self.alerts and self.alerts[fp].status == FIRING)}
        self.paused = False
        self.tick(now)

    def flush_due(self, now: float) -> None:
        """Flush the groups whose timer is due (cheap when none is): between the once-a-second
        ticks, so a group_wait that ends between two ticks does not wait for the next one.
        Inside `together`, at its end."""
        if self._batch:
            self._batch_clock = max(self._batch_clock, now)
            return
        self._flush_due(now)

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """Take the transitions handed over inside the block as one batch: the rules' transitions
        of one evaluation, the lines of one read. No group flushes before the block ends; then
        the due groups flush once, at the latest clock handed over. Alerts that fire in the same
        moment thus share their first message even at group_wait 0 (one at a time, the first
        rank's new group would flush alone and the others join its open incident a group_interval
        later), and an alert of a later line that mutes one of an earlier line is in before
        either is sent. A single alert goes out as early as one at a time: at the block's end.
        An alert that fires and resolves inside the block has its firing flushed before the
        resolve (an episode within one read of a backlog is news), unless it lasted no more than
        FLASH_SECONDS of its own stamps: one moment's lines taken one after another raise such
        flashes (a rank disagreement for the first of 8 ranks collapsing together), no state a
        receiver should hear of; like one resolved within group_wait it is never sent (logged
        both times). A block inside a block is the outer one.
        """
        if self._batch:
            yield
            return
        self._batch, self._batch_clock, self._batch_tick = True, -math.inf, False
        self._batch_fired.clear()
        try:
            yield
        finally:
            clock, tick = self._batch_clock, self._batch_tick
            self._batch, self._batch_clock, self._batch_tick = False, -math.inf, False
            if tick:
                self.tick(clock)
            elif clock > -math.inf:
                self._flush_due(clock)

    def next_flush(self) -> float | None:
        """When the earliest group timer is due (the caller's clock: wall time in the daemon,
        seconds), None without groups or while paused: the daemon's followers' thread, which
        reads a busy log every few poll intervals, wakes then for `flush_due`."""
        if self.paused or not self._groups:
            return None
        return min(g.next_flush for g in self._groups.values())

    def tick(self, now: float) -> None:
        """Flush groups whose timer is due, let pushers re-send, forget what is done (inside
        `together`: at its end)."""
        if self._batch:
            self._batch_clock, self._batch_tick = max(self._batch_clock, now), True
            return
        self._flush_due(now)
        self._gc(now)
        self._push(now, changed=False)

    def adopt(self, other: "Dispatcher", now: float) -> None:
        """Take the routing of `other`, built from a reloaded config: the default route, routes,
        receivers, timers, inhibit rules, pushers and runbook URL. Alerts, silences and the
        notification log stay, so a reload re-sends nothing already sent (receivers are known by
        name); groups are rebuilt under the new routes, those that still exist keeping their
        timers, and a group new to the routes waits its group_wait like any new group."""
        self.default_route, self.routes = other.default_route, other.routes
        self.inhibit_rules, self.pushers, self.runbook_url = other.inhibit_rules, other.pushers, other.runbook_url
        old, self._groups = self._groups, {}
        pending = set().union(*(g.fingerprints for g in old.values())) if old else set()
        for fp, a in self.alerts.items():
            if a.status != FIRING and fp not in pending:
                continue  # resolved and already notified: kept only for the pushers
            for route in self._routes_for(a):
                gk = (route.name, self._group_key(route, a))
                fresh = gk not in self._groups
                self._insert(route, a, now)
                if not fresh:
                    continue
                g, prev = self._groups[gk], old.get(gk)
                if prev is not None:
                    g.next_flush, g.flushed = prev.next_flush, prev.flushed
                elif any(k[:2] == gk for k in self._nflog):
                    g.next_flush, g.flushed = now, True  # was notified under this name: re-check now

    # -- routing and grouping -----------------------------------------------------------

    def _routes_for(self, alert: Alert) -> list[Route]:
        hit = []
        for r in self.routes:
            if matches_all(r.matchers, alert.labels):
                hit.append(r)
                if not r.continue_matching:
                    break
        return hit or [self.default_route]

    def _insert(self, route: Route, alert: Alert, now: float) -> None:
        key = self._group_key(route, alert)
        g = self._groups.get((route.name, key))
        if g is None:
            g = self._groups[(route.name, key)] = _Group(route, key, route.group_labels(alert.labels),
                                                         next_flush=now + route.group_wait)
        g.fingerprints.add(alert.fingerprint)
        if alert.status != FIRING or not g.flushed:
            # A new group waits group_wait from when it appeared, however old its first alert:
            # ranks that fire together (each rule's alert starts at its first low line) share
            # the first message instead of one message each.
            return
        if not self._open(g, alert.fingerprint) or any(getattr(r, "updates_in_place", False) for r in route.receivers):
            # Nothing of the group is firing and notified (an earlier episode resolved, a resolve
            # still pending, all of it muted): a new incident, out group_wait after it fired. Or
            # a receiver edits the incident's message in place (a Slack bot): no new message.
            g.next_flush = min(g.next_flush, now + route.group_wait)
        # else it joins an open incident: one follow-up at the group's next group_interval tick

    def _open(self, g: _Group, new: str = "") -> bool:
        """Whether the group has an open incident: an alert other than `new`, still firing, that
        was in the last notification to one of its receivers."""
        notified = set()
        for rcv in g.route.receivers:
            entry = self._nflog.get((g.route.name, g.key, rcv.name))
            if entry is not None:
                notified.update(entry["firing"])
        return any(fp != new and fp in notified and self._status.get(fp) == FIRING for fp in g.fingerprints)

    def _wake(self, now: float) -> None:
        """After a resolve: a group with firing alerts but no open incident (they were muted by
        the alert that just resolved, e.g. a collapse under a rank disagreement that has become
        a whole-server collapse) is notified group_wait from now, not at its group_interval tick."""
        for g in self._groups.values():
            if g.flushed and g.next_flush > now + g.route.group_wait and not self._open(g) and any(
                    self._status.get(fp) == FIRING for fp in g.fingerprints):
                g.next_flush = now + g.route.group_wait

    def _flush_pending_resolve(self, fp: str, now: float) -> None:
        """The alert `fp` fires again while its resolved copy still waits in groups: notify
        those groups now, so the old episode's RESOLVED goes out and the new episode is news
        (the notification log knows alerts by fingerprint only)."""
        if self.paused:
            return
        for route in self._routes_for(self.alerts[fp]):
            g = self._groups.get((route.name, self._group_key(route, self.alerts[fp])))
            if g is not None and g.flushed and fp in g.fingerprints:
                self._flush(g, now)

    def _flush_due(self, now: float) -> None:
        if self.paused:
            return
        if self._updated:
            self._send_updates(now)
        due = [g for g in self._groups.values() if g.next_flush <= now]
        if not due:
            return
        if self.silences is not None and self.silences.reload_if_changed():
            self._version += 1
        # A silence can start or end with time alone: then every due group is looked at.
        timeless = self.silences is None or not self.silences.silences
        for g in due:
            if timeless and g.seen_version == self._version and now < g.next_repeat:
                g.next_flush = now + g.route.group_interval  # nothing changed, no repeat due
                continue
            self._flush(g, now)
            sent = [self._nflog.get((g.route.name, g.key, r.name)) for r in g.route.receivers]
            g.seen_version = self._version
            g.next_repeat = (min(e["ts"] for e in sent if e) + g.route.repeat_interval
                             if sent and all(sent) else float("-inf"))
            g.next_flush = now + g.route.group_interval
            if not g.fingerprints:
                del self._groups[(g.route.name, g.key)]

    def _muted(self, alert: Alert, now: float) -> bool:
        if self.silences is not None and self.silences.muted_by(alert.labels, now):
            return True
        return bool(self.inhibit_rules) and inhibited(alert, self.inhibit_rules, list(self.alerts.values()))

    def _update(self, alert: Alert, note: str, now: float) -> None:
        """Mark `alert` with `note` in the groups that already told their receivers about it:
        the next `_flush_due` (at once, or once the caller's alerts are all in) notifies each such
        group once, every alert updated meanwhile marked `annotations["update"]` (the rest of the
        group as it is now): the diagnosis of 8 ranks arriving together is one message."""
        if self.silences is not None:
            self.silences.reload_if_changed()
        if self.paused or self._muted(alert, now):
            return
        fp = alert.fingerprint
        for route in self._routes_for(alert):
            g = self._groups.get((route.name, self._group_key(route, alert)))
            if g is not None and g.flushed and fp in g.fingerprints:
                if not g.updates:
                    self._updated.append(g)
                g.updates[fp] = note
        self._push(now, changed=True)

    def _send_updates(self, now: float) -> None:
        groups, self._updated = self._updated, []
        for g in groups:
            notes, g.updates = g.updates, {}
            if notes and self._groups.get((g.route.name, g.key)) is g:
                self._flush(g, now, update=notes)

    def _flush(self, g: _Group, now: float, update: dict[str, str] | None = None) -> None:
        """Notify each receiver of the group whose last notification is out of date; with
        `update` (fingerprint → note), every receiver, those alerts marked with their note."""
        alerts = [self.alerts[fp] for fp in sorted(g.fingerprints) if fp in self.alerts]
        if not g.route.receivers:  # nobody to tell (a replay without --notify): the group's bookkeeping only
            alerts, update = [a for a in alerts if a.status != FIRING], None
        visible = [a for a in alerts if not self._muted(a, now)]
        firing = [a for a in visible if a.status == FIRING]
        resolved = [a for a in visible if a.status != FIRING]
        f_fps = {a.fingerprint for a in firing}
        for rcv in g.route.receivers:
            key = (g.route.name, g.key, rcv.name)
            send_resolved = getattr(rcv, "send_resolved", True)
            last = self._nflog.get(key)
            # a resolve only to a receiver told the alert fired, or of an episode longer than a
            # flash: one that fired and resolved within group_wait (or one batch's moment) is never
            # sent; one that joined an open incident and resolved before its follow-up is, as
            # Alertmanager sends a group's resolved alerts (a rank's collapse never lost)
            told = set(last["firing"]) | set(last["resolved"]) if last else set()
            flash = max(g.route.group_wait, FLASH_SECONDS)
            gone = [a for a in resolved if a.fingerprint in told
                    or last and a.ends_at is not None and a.ends_at - a.starts_at > flash]
            r_fps = {a.fingerprint for a in gone}
            if not update and not _needs_update(last, f_fps, r_fps, send_resolved, g.route.repeat_interval, now):
                continue
            self._nflog[key] = {"firing": sorted(f_fps), "resolved": sorted(r_fps), "ts": now}
            out = copy.deepcopy(firing + (gone if send_resolved else []))
            for a in out:
                if update and a.fingerprint in update:
                    a.annotations["update"] = update[a.fingerprint]
            if out:
                rcv.notify(Notification(rcv.name, g.key, dict(g.labels), out))
        g.flushed = True
        # Resolved alerts leave the group once flushed (notified or muted), as in Alertmanager.
        g.fingerprints -= {a.fingerprint for a in alerts if a.status != FIRING}
        g.fingerprints &= set(self.alerts)

    def _push(self, now: float, changed: bool) -> None:
        if not self.pushers or self.paused:
            return
        if self.silences is not None:
            self.silences.reload_if_changed()
        alerts = [a for a in self.alerts.values()
                  if self.silences is None or not self.silences.muted_by(a.labels, now)]
        for p in self.pushers:
            p.sync(alerts, now, changed)  # pushers copy what they queue (Alert.to_dict)

    def _gc(self, now: float) -> None:
        grouped = set().union(*(g.fingerprints for g in self._groups.values())) if self._groups else set()
        keep_for = max((getattr(p, "resolved_retention", 0.0) for p in self.pushers), default=0.0)
        for fp, a in list(self.alerts.items()):
            if a.status != FIRING and fp not in grouped and now - (a.ends_at or now) >= keep_for:
                del self.alerts[fp]
                self._status.pop(fp, None)

    # -- persistence -------------------------------------------------------------------

    def to_state(self) -> dict:
        return {
            "alerts": [a.to_dict() for a in self.alerts.values()],
            "nflog": [{"route": r, "group": g, "receiver": n, **e} for (r, g, n), e in self._nflog.items()],
        }

    def load_state(self, state: dict) -> None:
        """Restore alerts and what was sent; groups are rebuilt from the current routes, so a
        restart sends only what changed (or is due to repeat) since the last notification."""
        for d in state.get("alerts", []):
            a = Alert.from_dict(d)
            self.alerts[a.fingerprint] = a
        for e in state.get("nflog", []):
            self._nflog[(e["route"], e["group"], e["receiver"])] = {
                "firing": list(e["firing"]), "resolved": list(e["resolved"]), "ts": float(e["ts"])}
        # State from before grouping: {"active": [...], "last_sent": {fp: ts}}; those were sent.
        legacy_sent = state.get("last_sent", {})
        for d in state.get("active", []):
            a = Alert.from_dict(d)
            self.alerts[a.fingerprint] = a
        for fp, a in self.alerts.items():
            self._status[fp] = a.status
            for route in self._routes_for(a):
                self._insert(route, a, a.starts_at + route.group_wait)
                g = self._groups[(route.name, self._group_key(route, a))]
                if a.fingerprint in legacy_sent:
                    for rcv in route.receivers:
                        self._nflog.setdefault((route.name, g.key, rcv.name), {
                            "firing": [a.fingerprint], "resolved": [], "ts": float(legacy_sent[a.fingerprint])})
                if any(k[0] == route.name and k[1] == g.key for k in self._nflog):
                    g.flushed = True
                    g.next_flush = float("-inf")  # re-evaluate at the first tick

    def _group_key(self, route: Route, alert: Alert) -> str:
        labels = route.group_labels(alert.labels)
        return f"{route.name}:{{{','.join(f'{k}={v!r}' for k, v in sorted(labels.items()))}}}"


def _needs_update(entry: dict | None, firing: set[str], resolved: set[str], send_resolved: bool,
                  repeat_interval: float, now: float) -> bool:
    """Alertmanager's notification-log check (notify.DedupStage.needsUpdate)."""
    if entry is None:
        return bool(firing)
    if not firing <= set(entry["firing"]):
        return True
    if not firing:
        return bool(entry["firing"])  # all resolved: clear the log, even without send_resolved
    if send_resolved and not resolved <= set(entry["resolved"]):
        return True
    return entry["ts"] <= now - repeat_interval


def _one_line(text: str) -> str:
    """Log-derived text on one line: a newline in a value cannot forge a journal line."""
    return " ".join(str(text).split())


def describe(alert: Alert) -> str:
    """`AcceptanceCollapse on gpu-box-1 TP0 (critical, fingerprint 0123456789abcdef)`: an alert
    in one log line, from its labels (no annotation holds a secret, none is printed here)."""
    where = " ".join(v for v in (alert.labels.get("server", ""), alert.labels.get("rank", "")) if v)
    sev = alert.labels.get("severity", "")
    return _one_line(f"{alert.name or 'alert'}{' on ' + where if where else ''} "
                     f"({sev + ', ' if sev else ''}fingerprint {alert.fingerprint})")


class _Blank(dict):
    """format_map mapping that leaves unknown names empty."""

    def __missing__(self, key: str) -> str:
        return ""
