"""Wiring: the dispatcher and its notifiers, built from the config (used by `run` and `replay`).

The daemon gets everything: routes with their timers, inhibit rules, the silences of the state
directory, Alertmanager pushers, and a durable queue per notifier in the state directory.
Replay sends each change at once (group_wait and group_interval 0: log time would only delay
the messages), applies no silences (they are set in wall-clock time) and never pushes to
Alertmanager (old alerts would land in a live Alertmanager). A config reload (SIGHUP) builds
them again from the new config: notifiers of the same name reopen the same queue files, and the
running dispatcher adopts the new one's routing (`Dispatcher.adopt`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from specwatch.alerts.dispatcher import Dispatcher, Receiver, Route
from specwatch.alerts.silences import SilenceStore
from specwatch.config import Config, SlackConfig
from specwatch.notifiers.alertmanager import AlertmanagerNotifier, legacy_name, notifier_name
from specwatch.notifiers.queue import QueuedNotifier, queue_file
from specwatch.notifiers.slack import SlackNotifier
from specwatch.notifiers.webhook import WebhookNotifier

DRY_RUN_URL = "https://dry-run.invalid/"


def build_alerting(cfg: Config, *, state_dir: str | Path | None, replay: bool = False, notify: bool = True,
                   slack_dry_run: TextIO | None = None, dry_run_json: bool = False, store=None) -> tuple[Dispatcher, dict[str, QueuedNotifier]]:
    """→ (dispatcher, every notifier by name). Notifiers are not started.

    state_dir: where queues and silences live (None: queues in memory, no silences).
    store: the daemon's `StateStore`: queues in its outbox (the `<name>-queue.json` files of an
    earlier version are migrated into it).
    notify: False builds no notifier that posts anywhere (replay without --notify).
    slack_dry_run: print each Slack payload there instead of posting it (every Slack receiver,
    and a default one when none is configured), as the message reads, or as JSON with
    `dry_run_json`. Raises ValueError for an unusable URL.
    """
    notifiers: dict[str, QueuedNotifier] = {}
    slacks: dict[tuple, SlackNotifier] = {}

    def queue(name: str) -> Path | None:
        return queue_file(state_dir, name) if state_dir is not None else None

    def slack(sc: SlackConfig | None, name: str) -> SlackNotifier | None:
        if sc is None:
            return None
        url = DRY_RUN_URL if slack_dry_run is not None else sc.webhook_url if notify else None
        if not url:
            return None
        if (url, sc.channel) in slacks:  # routes to the same webhook and channel share a queue
            return slacks[(url, sc.channel)]
        n = slacks[(url, sc.channel)] = notifiers[name] = SlackNotifier(
            url, name=name, queue_path=queue(name), store=store, timeout=sc.timeout, backoff_initial=sc.backoff_initial,
            backoff_max=sc.backoff_max, channel=sc.channel, send_resolved=sc.send_resolved, dry_run=slack_dry_run,
            dry_run_json=dry_run_json, bot_token=None if slack_dry_run is not None else sc.bot_token)
        return n

    hooks = {}
    for w in cfg.webhooks if notify else []:
        assert w.url is not None  # load_config keeps only the webhooks with a URL
        name = f"webhook/{w.name}"
        hooks[w.name] = notifiers[name] = WebhookNotifier(
            w.url, name=name, queue_path=queue(name), store=store, timeout=w.timeout, backoff_initial=w.backoff_initial,
            backoff_max=w.backoff_max, max_alerts=w.max_alerts, external_url=cfg.external_url,
            send_resolved=w.send_resolved)

    default: list[Receiver] = [n for n in [slack(cfg.slack, "slack")] if n is not None]
    default += hooks.values()
    timers = (lambda v, d: 0.0) if replay else (lambda v, d: d if v is None else v)
    routes = []
    for rc in cfg.routes:
        assert rc.name is not None  # every route is named by config.py (`route<N>` when unnamed)
        receivers: list[Receiver]
        if rc.slack is None and rc.webhooks is None:
            receivers = default
        else:
            receivers = [n for n in [slack(rc.slack, f"slack/{rc.name}")] if n is not None]
            receivers += [hooks[h] for h in rc.webhooks or [] if h in hooks]
        routes.append(Route(
            rc.name, receivers, rc.matchers, cfg.group_by if rc.group_by is None else rc.group_by,
            timers(rc.group_wait, cfg.group_wait), timers(rc.group_interval, cfg.group_interval),
            cfg.repeat_interval if rc.repeat_interval is None else rc.repeat_interval, rc.continue_matching))

    pushers = []
    if not replay:
        am = cfg.alertmanager
        for url in am.urls:
            name = notifier_name(url)
            if store is not None and legacy_name(url) != name:  # an earlier version's name held the password
                store.rename_notifier(legacy_name(url), name)
            pushers.append(AlertmanagerNotifier(
                url, name=name, queue_path=queue(name), store=store, timeout=am.timeout, backoff_initial=am.backoff_initial,
                backoff_max=am.backoff_max, resend_delay=am.resend_delay, resolved_retention=am.resolved_retention,
                generator_url=cfg.external_url))
            notifiers[name] = pushers[-1]

    dispatcher = Dispatcher(
        default, cfg.repeat_interval, group_by=cfg.group_by, group_wait=timers(None, cfg.group_wait),
        group_interval=timers(None, cfg.group_interval), routes=routes, inhibit_rules=cfg.inhibit_rules,
        silences=SilenceStore(Path(state_dir)) if state_dir is not None and not replay else None,
        pushers=pushers, runbook_url=cfg.runbook_url, keep_history=replay)
    return dispatcher, notifiers
