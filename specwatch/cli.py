"""Command line: argument parsing and wiring only (the `specwatch` console script).

Exit codes: 0 ok, 1 runtime failure (e.g. notifications left undelivered by replay), 2 bad usage
or bad config.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import io
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from specwatch.config import (Config, ConfigError, LogSource, build_config, config_warnings, load_config,
                              load_run_config, parse_log_format)

if TYPE_CHECKING:
    from specwatch.probes.base import ServerSettings


def _load(path: str | None) -> Config:
    return load_config(path) if path else build_config({"server": "replay"})


def _print_problems(path: str, e: ConfigError) -> int:
    n = len(e.problems)
    print(f"{path}: invalid config ({n} problem{'s' * (n != 1)}):", file=sys.stderr)
    for p in e.problems:
        print(f"  {p}", file=sys.stderr)
    return 2


def cmd_check_config(args) -> int:
    from specwatch.system import envfile

    env_file = args.env_file or os.path.join(os.path.dirname(os.path.abspath(args.file)), "environment")
    for w in envfile.apply(env_file)[1]:
        print(f"{args.file}: warning: {w}", file=sys.stderr)
    try:
        cfg = load_run_config(args.file)  # what `run` and a reload accept, no more, no less
    except ConfigError as e:
        return _print_problems(args.file, e)
    for w in config_warnings(cfg):
        print(f"{args.file}: warning: {w}", file=sys.stderr)
    journals = sum(1 for s in cfg.logs if s.journal is not None)
    print(f"{args.file}: ok ({len(cfg.logs) - journals} log file(s), "
          + (f"{journals} journal source(s), " if journals else "") + f"metrics on {cfg.listen_address}:{cfg.listen_port}, "
          f"slack {'configured' if cfg.slack.webhook_url else 'not configured'}, {len(cfg.webhooks)} webhook(s), "
          f"{len(cfg.alertmanager.urls)} alertmanager(s), {len(cfg.routes)} route(s), "
          f"process watching {'on' if cfg.process.enabled else 'off'}, {len(cfg.server_apis)} server API(s), {len(cfg.server_metrics)} /metrics source(s))")
    return 0


class _Format(TypedDict, total=False):
    """`replay --format`'s fields of a LogSource."""

    envelope: str
    grammar: str | None


def cmd_replay(args) -> int:
    from specwatch.alerting import build_alerting
    from specwatch.notifiers.http import PERMANENT
    from specwatch.core.pipeline import Pipeline
    from specwatch.replay import format_text, replay_files, server_of_file, summary
    from specwatch.sources.logfiles import is_pattern, resolve

    cfg = _load(args.config)
    for p in args.logs:
        if os.path.isdir(p):
            print(f"specwatch replay: {p} is a directory; give the log files in it", file=sys.stderr)
            return 2
        if not os.path.isfile(p):
            what = "not a regular file (pipes are not supported: save the log to a file)" if os.path.exists(p) else "no such file"
            print(f"specwatch replay: {p}: {what}", file=sys.stderr)
            return 2
    known = {s.path for s in cfg.logs}
    # one server per run; without a config it is named after the (first) file, not `replay`
    server = args.server or (cfg.server if args.config or not args.logs else server_of_file(args.logs[0]))
    tz = args.log_timezone or cfg.log_timezone
    fmt: _Format = {}
    if args.format is not None:
        try:
            envelope, grammar = parse_log_format(args.format)
        except ConfigError as e:
            print(f"specwatch replay: {e}", file=sys.stderr)
            return 2
        fmt = {"envelope": envelope, "grammar": grammar}
        cfg.logs = [dataclasses.replace(s, **fmt) if s.path in args.logs else s for s in cfg.logs]
    for p in args.logs:
        if p in known:
            continue
        # a file a config glob matches (a pod's CRI file) reads as that entry says: its format,
        # its server template filled from the path; --server and --format still win
        glob_src = next((s for s in cfg.logs if is_pattern(s.path) and fnmatch.fnmatch(os.path.abspath(p), s.path)), None)
        if glob_src is not None and args.server is None:
            cfg.logs.append(dataclasses.replace(resolve(glob_src, p), **fmt))
        else:
            cfg.logs.append(LogSource(path=p, server=server, timezone=tz, **fmt))

    captured = io.StringIO()  # the dry run's payloads, with --json
    dry_out = captured if args.json else sys.stdout
    if args.notify and args.slack_dry_run:
        print("specwatch replay: give --notify or --slack-dry-run, not both", file=sys.stderr)
        return 2
    receivers = cfg.receiver_names()
    if args.notify:
        if not receivers:
            print("specwatch replay: --notify: the config names no Slack webhook or webhook to notify",
                  file=sys.stderr)
            return 2
        print(f"specwatch replay: --notify: sending this log's alerts to {', '.join(receivers)}", file=sys.stderr)
    elif receivers and not args.slack_dry_run:
        print(f"specwatch replay: notifying nobody (the config's {', '.join(receivers)} left alone; "
              "--notify sends this log's alerts there, --slack-dry-run prints them)", file=sys.stderr)
    dispatcher, notifiers = build_alerting(cfg, state_dir=None, replay=True, notify=args.notify,
                                           slack_dry_run=dry_out if args.slack_dry_run else None,
                                           dry_run_json=args.json)
    if args.notify:  # old episodes under their own identity: a receiver must not take them for live ones
        dispatcher.labels["replay"] = " ".join(os.path.basename(p) for p in args.logs)
    recorder = None
    if args.plot:
        from specwatch.plot import PlotUnavailable, SeriesRecorder, check_output

        try:
            check_output(args.plot)
        except PlotUnavailable as e:
            print(f"specwatch replay: {e}", file=sys.stderr)
            return 2
        recorder = SeriesRecorder()
    pipeline = Pipeline(cfg, dispatcher, diagnosis_background=False,  # deterministic replay
                        extra_rules=(recorder,) if recorder else ())
    try:
        replay_files(pipeline, args.logs, cfg.follow.max_line_bytes)
    except (OSError, EOFError) as e:  # unreadable, or a corrupt/truncated gzip file
        print(f"specwatch replay: {getattr(e, 'filename', None) or 'a log'}: cannot read it ({e})", file=sys.stderr)
        return 2
    rc = 0
    deadline = time.monotonic() + args.slack_timeout  # one wait for all receivers, not one each
    for name, n in notifiers.items():
        if not n.drain(timeout=max(0.0, deadline - time.monotonic())):
            print(f"specwatch replay: {n.queue_depth} {name} notification(s) not delivered within "
                  f"{args.slack_timeout:.0f}s and not kept (a replay has no queue): run it again with "
                  "--notify once the receiver is up", file=sys.stderr)
            rc = 1
        dropped = n.failed_total[PERMANENT]
        if dropped:
            print(f"specwatch replay: {dropped} {name} notification(s) rejected by the receiver and dropped "
                  "(its answer is logged above): fix the receiver's URL or token and run it again with --notify",
                  file=sys.stderr)
            rc = 1
    doc = summary(pipeline, list(dispatcher.history))
    if not args.json:
        print(format_text(doc), flush=True)  # before the plot: a rendering error loses no report
    if recorder is not None:
        from specwatch.plot import render

        doc["plot"] = {"path": args.plot}
        try:
            doc["plot"].update(render(args.plot, recorder, doc["episodes"], cfg.collapse.max_accept_length))
            print(f"specwatch replay: plot written to {args.plot}", file=sys.stderr)
        except Exception as e:  # noqa: BLE001 — whatever matplotlib raises, the report stands
            doc["plot"]["error"] = f"{type(e).__name__}: {e}"
            print(f"specwatch replay: --plot {args.plot}: could not draw the plot ({doc['plot']['error']})",
                  file=sys.stderr)
            rc = 1
    if args.json:
        if args.slack_dry_run:
            doc["slack_payloads"] = _json_stream(captured.getvalue())
        print(json.dumps(doc, indent=2))
    return rc


def _json_stream(text: str) -> list:
    """Concatenated JSON documents (as the dry run prints them) → list."""
    docs: list[object] = []
    dec, i = json.JSONDecoder(), 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return docs
        doc, i = dec.raw_decode(text, i)
        docs.append(doc)


def _state_dir(args) -> str:
    if args.state_dir:
        return args.state_dir
    # state_dir is all these commands need: a secret the daemon's environment holds is not read
    return load_config(args.config, secrets=False).state_dir if args.config else Config().state_dir


MAX_SILENCE_S = 3650 * 86400  # 10 years: beyond, the end is no date the platform can write


def _silence_duration(text: str) -> float:
    """argparse type of `silence add --for`: `30m`, `2h`, `1d` → seconds, positive and at most
    MAX_SILENCE_S. Raises ArgumentTypeError saying what to write."""
    from specwatch.config import parse_duration

    try:
        seconds = parse_duration(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds <= MAX_SILENCE_S:
        why = "longer than 3650d" if seconds > MAX_SILENCE_S else "not a positive duration"
        raise argparse.ArgumentTypeError(
            f"{text!r} is {why}; write how long from now, e.g. --for 30m, 2h, 1d "
            "(`specwatch silence expire ID` ends a silence early)")
    return seconds


# Options whose value may start with "-": argparse takes `--for -2h` as two options and says only
# "expected one argument", so such a value is joined (`--for=-2h`) and reaches the option's check.
DASH_VALUE_OPTIONS = ("--for", "--comment", "--author")


def _join_dash_values(argv: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(argv):
        a, nxt = argv[i], argv[i + 1] if i + 1 < len(argv) else ""
        if a == "--":
            return out + argv[i:]
        if a in DASH_VALUE_OPTIONS and nxt.startswith("-") and not nxt.startswith("--") and nxt != "-h":
            out.append(f"{a}={nxt}")
            i += 2
        else:
            out.append(a)
            i += 1
    return out


def cmd_notifications(args) -> int:
    """`notifications list`: the daemon's queues from state.db (exit 0; 1 when it cannot be read).
    `notifications retry`: refused ones back in the queue, through the running daemon or in state.db."""
    import sqlite3

    from specwatch.alerts.model import iso8601
    from specwatch.notifiers import dead_letter

    state_dir = _state_dir(args)
    try:
        if args.action == "retry":
            refused = sorted({i["receiver"] for i in dead_letter.queued(state_dir) if i["state"] == "refused"})
            unknown = [r for r in args.receivers if r not in refused]
            if unknown:  # a typo, or nothing of that receiver's was refused: say so, ask no one
                print(f"specwatch notifications retry: no refused notification for {', '.join(unknown)} "
                      f"(refused: {', '.join(refused) or 'none'}; `specwatch notifications list` shows the queues)",
                      file=sys.stderr)
                return 1
            if not refused:
                print("no refused notification to send again")
                return 0
            how, n = dead_letter.retry(state_dir, args.receivers)
            print(f"asked the daemon (pid {n}) to send them again; its log says how many" if how == "daemon" else
                  f"{n} refused notification(s) back in the queue; the daemon sends them when it starts")
            return 0
        items = dead_letter.queued(state_dir)
    except FileNotFoundError as e:
        print(f"specwatch notifications {args.action}: {e.filename or e}: no such file or directory "
              "(give the daemon's --config or --state-dir)", file=sys.stderr)
        return 1
    except (OSError, sqlite3.Error) as e:
        print(f"specwatch notifications {args.action}: {state_dir}: {getattr(e, 'strerror', None) or e} "
              "(use --state-dir, or run as the user that runs the daemon)", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(items, indent=2))
        return 0
    if not items:
        print("no notification queued or refused")
        return 0
    rows: list[tuple[str, ...]] = [("Receiver", "Seq", "State", "Answer", "Refused at", "Alerts")]
    rows += [(i["receiver"], str(i["seq"]), i["state"], i["detail"] or "-",
              iso8601(i["refused_at"]) if i["refused_at"] else "-", i["alerts"]) for i in items]
    _print_rows(rows)
    return 0


def _alertmanagers(args) -> tuple[list[str], float]:
    """The Alertmanagers `silence` works on, and the seconds each request may take: the
    `--alertmanager` URLs, else the config's `alerts.alertmanager.urls` (none with --local-only).
    Raises ValueError on a URL that is not http(s)."""
    from specwatch.notifiers.http import check_url

    if getattr(args, "local_only", False):
        return [], 10.0
    cfg = load_config(args.config, secrets=False) if getattr(args, "config", None) else None
    urls = list(args.alertmanager or (cfg.alertmanager.urls if cfg is not None else []))
    for u in urls:
        check_url(u, f"--alertmanager {u!r}")
    return urls, cfg.alertmanager.timeout if cfg is not None else 10.0


def _where(ids: dict[str, str]) -> list[str]:
    """`alertmanager/host:port[+host:port]` per Alertmanager silence ID in `ids` (URL → ID)."""
    from specwatch.alerts.am_silences import Cluster

    by_id: dict[str, list[str]] = {}
    for u, sid in ids.items():
        by_id.setdefault(sid, []).append(u)
    return [Cluster(urls).name for urls in by_id.values()]


def cmd_silence(args) -> int:
    import getpass
    import time

    from specwatch.alerts import am_silences
    from specwatch.alerts.matchers import parse_matcher
    from specwatch.alerts.model import iso8601
    from specwatch.alerts.renamed import follow_renames
    from specwatch.alerts.silences import EXPIRED, SilenceStore, check
    from specwatch.sources.server_api import shown_url

    state_dir = _state_dir(args)
    if not os.path.isdir(state_dir):
        # a typo would otherwise look exactly like "no silences", or mute nothing
        if args.action == "add":
            print(f"specwatch silence: state directory {state_dir} did not exist and is created: only a "
                  "daemon with this state_dir sees the silence (give the daemon's --config or --state-dir)",
                  file=sys.stderr)
        else:
            print(f"specwatch silence: state directory {state_dir} does not exist: no silences are stored "
                  "there (give the daemon's --config or --state-dir)", file=sys.stderr)
    store = SilenceStore(Path(state_dir))
    now = time.time()
    failed: list[str] = []  # Alertmanagers that lack what was asked: said, and exit 1
    remote: list[am_silences.RemoteSilence] = []
    try:
        urls, timeout = _alertmanagers(args)
        found = am_silences.clusters(urls, timeout) if urls else []
        if args.action == "add":
            matchers = [follow_renames(parse_matcher(m), "--match") for m in args.match]
            author = args.author or os.environ.get("SUDO_USER") or getpass.getuser()
            check(matchers, now, now + args.duration)
            ids, failed = am_silences.create(found, matchers, now, now + args.duration, created_by=author,
                                             comment=args.comment, timeout=timeout)
            for c in found:
                if c.urls[0] in ids:
                    print(f"specwatch silence add: made in {c.name} as {ids[c.urls[0]]}", file=sys.stderr)
            s = store.add(matchers, now, now + args.duration, created_by=author, comment=args.comment,
                          alertmanager_ids=ids)
            print(s.id)
            for msg in failed:
                print(f"specwatch silence add: not made in {msg}; it is stored here ({s.id}): run the same "
                      "`specwatch silence add` with --alertmanager URL when that Alertmanager answers",
                      file=sys.stderr)
            return 1 if failed else 0
        if args.action == "expire":
            for sid in args.ids:
                try:
                    s = store.expire(sid, now)
                except KeyError:
                    if not found:
                        raise
                    remote, why = am_silences.query(found, timeout)
                    hits = [r for r in remote if r.id.startswith(sid)] if sid else []
                    if len(hits) != 1:
                        raise KeyError(f"{'no' if not hits else 'more than one'} silence with ID {sid!r}, here or in "
                                       "the Alertmanagers" + (f" ({'; '.join(why)})" if why else "")
                                       + "; see `specwatch silence list`") from None
                    if hits[0].state == EXPIRED:
                        raise ValueError(f"silence {hits[0].id} already expired in {hits[0].cluster.name}") from None
                    failed += am_silences.expire(dict.fromkeys(hits[0].cluster.urls, hits[0].id), timeout)
                    print(f"expired {hits[0].id} in {hits[0].cluster.name}")
                    continue
                failed += am_silences.expire(s.alertmanager_ids, timeout)  # where it was made
                print(f"expired {s.id}" + "".join(f" and in {w}" for w in _where(s.alertmanager_ids)))
            for msg in failed:
                print(f"specwatch silence expire: not ended in Alertmanager: {msg}; `amtool silence expire ID` "
                      "ends it there", file=sys.stderr)
            return 1 if failed else 0
        silences = store.list(now, include_expired=args.expired)
        if found:
            linked = {sid for s in store.list(now, include_expired=True) for sid in s.alertmanager_ids.values()}
            remote, failed = am_silences.query(found, timeout)
            remote = [r for r in remote if r.id not in linked and (args.expired or r.state != EXPIRED)]
            remote.sort(key=lambda r: (r.ends_at, r.id))
    except (ValueError, KeyError) as e:
        print(f"specwatch silence {args.action}: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"specwatch silence {args.action}: {e.filename or store.path}: {e.strerror} "
              "(use --state-dir, or run as the user that runs the daemon)", file=sys.stderr)
        return 1
    for msg in failed:
        print(f"specwatch silence list: not listed: {msg}", file=sys.stderr)
    if args.json:
        print(json.dumps([{**s.to_dict(), "alertmanager_ids": {shown_url(u): i for u, i in s.alertmanager_ids.items()},
                           "state": s.state(now)} for s in silences] + [r.to_dict() for r in remote], indent=2))
        return 1 if failed else 0
    rows: list[tuple[str, ...]] = [("ID", "Matchers", "Starts", "Ends", "State", "Created by", "Comment")]
    rows += [(s.id, " ".join(str(m) for m in s.matchers), iso8601(s.starts_at), iso8601(s.ends_at), s.state(now),
              s.created_by, s.comment) for s in silences]
    rows += [(r.id, " ".join(str(m) for m in r.matchers), iso8601(r.starts_at), iso8601(r.ends_at), r.state,
              r.created_by, r.comment) for r in remote]
    if found or any(s.alertmanager_ids for s in silences):  # where each one is
        where = ["Where"] + [", ".join(["here", *_where(s.alertmanager_ids)]) for s in silences] \
            + [r.cluster.name for r in remote]
        rows = [(*row[:5], w, *row[5:]) for row, w in zip(rows, where)]
    _print_rows(rows)
    return 1 if failed else 0


def _print_rows(rows: list[tuple[str, ...]]) -> None:
    """A table: columns padded to their widest cell, the last one left as it is."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])


def cmd_run(args) -> int:
    from specwatch.daemon import Daemon

    try:
        cfg = load_run_config(args.config)
    except ConfigError as e:
        return _print_problems(args.config, e)
    return Daemon(cfg).run()


def _settings(args: argparse.Namespace) -> tuple[ServerSettings, dict]:
    """ServerSettings from --server-args-from / --server-info / --pid, then explicit flags over them."""
    from specwatch.probes.base import ServerSettings, normalize_algorithm
    from specwatch.engines.sglang import settings as server_settings

    found: dict = {}
    if args.server_args_from:
        found = server_settings.from_log(args.server_args_from)
    elif args.server_info:
        found = server_settings.from_server_info(args.server_info)
    elif args.pid:
        found = server_settings.from_pid(args.pid)
    s = ServerSettings.from_server_args(found)
    for name in ("num_steps", "eagle_topk", "num_draft_tokens", "draft_window_size", "context_length"):
        if getattr(args, name) is not None:
            setattr(s, name, getattr(args, name))
    if args.algorithm:
        s.algorithm = normalize_algorithm(args.algorithm)
    return s, found


def _facts(args):
    """The SGLang facts: --sglang-root, else the server process's (--pid, else the running server
    whose command line names --draft), else the importable sglang, else the table for
    --sglang-version. Raises NoSGLangSource (nothing checked) when none of them is there."""
    from specwatch.diagnosis import NoSGLangSource, facts_for, server_of_draft
    from specwatch.engines.sglang.source import sglang_root_of_process

    root, pid = args.sglang_root, args.pid
    if root is None and pid is None and args.draft is not None:
        pid = server_of_draft(args.draft)
    if root is None and pid:
        root = sglang_root_of_process(pid)
        if root is None and args.pid and not args.sglang_version:
            raise NoSGLangSource(f"none readable for pid {pid}: pass --sglang-root, or --sglang-version X.Y.Z to "
                                 "judge against specwatch's built-in table")
    facts = facts_for(root, args.sglang_version)
    if pid and root is not None:
        facts.notes.append(f"SGLang of the server process {pid}" + ("" if args.pid else " (its command line names this draft)"))
    return facts


def _vllm_facts(args, found: dict):
    """VllmFacts for `diagnose`, or None for an SGLang server: `--engine vllm`, or (auto) a
    server whose settings (`--pid`, `--server-info`) say vLLM. Raises FileNotFoundError when no
    vLLM source is found."""
    from specwatch.engines.vllm.source import VllmFacts, find_vllm_root, vllm_root_of_process

    if args.engine == "sglang" or (args.engine == "auto" and found.get("engine") != "vllm"):
        return None
    root = args.vllm_root or (vllm_root_of_process(args.pid) if args.pid else None) or find_vllm_root()
    if root is None:
        raise FileNotFoundError("no vLLM source found: pass --vllm-root DIR (the folder holding vllm/; "
                                "`pip install --no-deps --no-compile --target DIR vllm==VERSION` fills one)")
    return VllmFacts(root)


def cmd_diagnose(args) -> int:
    from specwatch.diagnosis import NoSGLangSource, diagnose
    from specwatch.probes.checkpoint import CheckpointError
    from specwatch.engines.vllm.probes import diagnose_vllm

    missing = [f"--{flag} {path}: no such file or directory" for flag, path in (("draft", args.draft), ("target", args.target))
               if path is not None and not os.path.exists(os.path.expanduser(path))]
    if missing:  # before the SGLang source: a mistyped path is the first thing to fix
        for m in missing:
            print(f"specwatch diagnose: {m}", file=sys.stderr)
        return 2
    try:
        settings, found = _settings(args)
        target = args.target or (found.get("model_path") if found and os.path.exists(str(found.get("model_path"))) else None)
        vllm = _vllm_facts(args, found)
        logged = found.get("speculative_draft_model_path")
        draft = args.draft or (logged if logged and os.path.isdir(str(logged)) else None)
        if draft is None and target is None:
            raise CheckpointError("give --draft DIR (an EAGLE-3 draft), or --target DIR alone for an MTP/NEXTN server")
        if vllm is not None:
            report = diagnose_vllm(draft, target, vllm, settings=settings)
        else:
            report = diagnose(draft, target, facts=_facts(args), settings=settings)
    except NoSGLangSource as e:
        print(f"specwatch diagnose: {e}", file=sys.stderr)
        if args.json:  # a script reads the outcome: nothing was checked
            print(json.dumps({"engine": "sglang", "sglang_version": None, "sglang": None, "draft": args.draft,
                              "target": args.target, "checked": False, "notes": [str(e)], "findings": []}, indent=2))
        return 2
    except (CheckpointError, FileNotFoundError, OSError) as e:
        print(f"specwatch diagnose: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.format_text(verbose=args.verbose))
    return 1 if report.has_errors else 0


def cmd_fix_checkpoint(args) -> int:
    from specwatch.fixes.fix_checkpoint import FixError, fix_checkpoint
    from specwatch.probes.checkpoint import CheckpointError

    if args.draft is None:
        print("specwatch fix-checkpoint: --draft is required (the EAGLE-3 draft folder to convert)", file=sys.stderr)
        return 2
    try:
        settings, _ = _settings(args)
        result = fix_checkpoint(args.draft, args.out, facts=_facts(args), target=args.target, settings=settings)
    except (CheckpointError, FixError, FileNotFoundError, OSError) as e:
        print(f"specwatch fix-checkpoint: {e}", file=sys.stderr)
        return 2
    report = result.report
    assert report is not None  # fix_checkpoint diagnoses what it wrote
    if args.json:
        print(json.dumps({"out": str(result.out), "actions": result.actions, **report.to_dict()}, indent=2))
    else:
        print("\n".join(f"- {a}" for a in result.actions))
        print(f"\nDiagnosis of {result.out}:")
        print(report.format_text())
    return 1 if report.has_errors else 0


def _diagnosis_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft", metavar="DIR", help="draft checkpoint folder (config.json + weights); omit it for an "
                                                  "MTP/NEXTN server, whose --target is its own draft")
    p.add_argument("--target", metavar="DIR|CONFIG",
                   help="target model folder, or its config.json: the same either way (the folder's weights, "
                        "when present, are read for the lm_head check)")
    p.add_argument("--sglang-root", metavar="DIR",
                   help="folder containing the sglang package the server runs (default: that of --pid, else of the "
                        "running server whose command line names --draft, else the importable one; read, never "
                        "imported or run)")
    p.add_argument("--sglang-version", metavar="X.Y.Z",
                   help="judge against specwatch's table for this version when no source is found (without it and "
                        "without a source nothing is checked: exit 2)")
    p.add_argument("--algorithm", help="--speculative-algorithm of the server (EAGLE3, EAGLE, NEXTN)")
    p.add_argument("--num-steps", type=int, help="--speculative-num-steps")
    p.add_argument("--eagle-topk", type=int, help="--speculative-eagle-topk")
    p.add_argument("--num-draft-tokens", type=int, help="--speculative-num-draft-tokens")
    p.add_argument("--draft-window-size", type=int, help="--speculative-draft-window-size")
    p.add_argument("--context-length", type=int, help="--context-length")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--server-args-from", metavar="LOG", help="read settings from the server_args line of an SGLang log")
    src.add_argument("--server-info", metavar="URL", help="read settings from http://HOST:PORT/server_info")
    src.add_argument("--pid", type=int, help="read settings (and the sglang install) from the server process")
    p.add_argument("--json", action="store_true", help="print JSON")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specwatch",
        description="Watch SGLang speculative decoding: follow its logs, export Prometheus metrics, "
                    "detect acceptance collapse and alert with what to check.")
    p.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    # accepted before or after the subcommand
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", default=argparse.SUPPRESS, choices=["debug", "info", "warning", "error"],
                        help="specwatch's own log level on stderr (default: $SPECWATCH_LOG_LEVEL or info)")
    p.add_argument("--log-level", default=os.environ.get("SPECWATCH_LOG_LEVEL", "info"),
                   choices=["debug", "info", "warning", "error"], help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", parents=[common],
                       help="follow the server's logs, serve /metrics, send alerts (the daemon); SIGHUP reloads the config",
                       description="The daemon: follows the configured logs (files, the journal, container logs), "
                                   "polls the engine's /metrics, HTTP API, processes and GPUs, decides, alerts, and "
                                   "serves /metrics and the status page. SIGHUP reloads the config (a bad one is "
                                   "refused and the running config stays); SIGTERM stops it, state saved.")
    r.add_argument("--config", required=True, help="YAML config file (see config.example.yaml)")
    r.set_defaults(func=cmd_run)

    rp = sub.add_parser("replay", parents=[common], help="run the same pipeline over recorded logs and print a summary")
    rp.add_argument("logs", nargs="+", metavar="LOG",
                    help="a recorded server log (SGLang or vLLM; a rotated copy, gzipped too)")
    rp.add_argument("--config", help="YAML config file (rules, Slack); optional")
    rp.add_argument("--json", action="store_true", help="print the summary as JSON")
    rp.add_argument("--slack-dry-run", action="store_true", help="print each Slack message as it would read instead of posting it "
                    "(the Block Kit JSON with --json, under slack_payloads)")
    rp.add_argument("--notify", action="store_true",
                    help="send this log's alerts to the config's Slack and webhooks, labelled replay=<file names> (default: notify nobody)")
    rp.add_argument("--plot", metavar="OUT.svg|png",
                    help="draw accept length per rank (threshold, alert episodes, restarts) and throughput "
                         "over the log's time; needs pip install 'specwatch[plot]' (from a checkout: pip install '.[plot]')")
    rp.add_argument("--server", help="server name for the replayed logs (default: the config's `server`; without --config, "
                                      "the first log's file name, e.g. sglang-0 for sglang-0.log.1)")
    rp.add_argument("--format", help="the logs' format: auto (default: plain, Docker json-file or Kubernetes CRI, "
                    "detected per file), sglang, docker, cri, python-logging, or a regex with named groups "
                    "timestamp, message (and ranks)")
    rp.add_argument("--log-timezone", help="IANA zone of the log's timestamps (default: config's log_timezone, else local time)")
    rp.add_argument("--slack-timeout", type=float, default=60.0,
                    help="seconds to wait for delivery, all receivers together (default 60)")
    rp.set_defaults(func=cmd_replay)

    sil = sub.add_parser("silence", help="mute notifications of matching alerts for a while (add, list, expire), "
                                         "here and in the configured Alertmanagers")
    silsub = sil.add_subparsers(dest="action", required=True)

    def where(sp, alertmanager: bool = True):
        g = sp.add_mutually_exclusive_group()
        g.add_argument("--state-dir", help="the daemon's state directory (default: from --config, else /var/lib/specwatch)")
        g.add_argument("--config", help="the daemon's config file, to find its state_dir"
                       + (" (and alerts.alertmanager.urls)" if alertmanager else ""))
        if not alertmanager:  # the notification queues live in the state directory alone
            return
        a = sp.add_mutually_exclusive_group()
        a.add_argument("--alertmanager", action="append", metavar="URL",
                       help="also in this Alertmanager (repeatable, amtool's --alertmanager.url; default: the "
                            "config's alerts.alertmanager.urls); one silence per cluster")
        a.add_argument("--local-only", action="store_true", help="only in the state directory, not in Alertmanager")

    sa = silsub.add_parser("add", parents=[common], help="add a silence; prints its ID")
    sa.add_argument("--match", action="append", required=True, metavar="MATCHER",
                    help='label matcher: name=value, name!=value, name=~regex, name!~regex (repeatable; all must match)')
    sa.add_argument("--for", dest="duration", required=True, type=_silence_duration, metavar="DURATION",
                    help="how long from now, e.g. 30m, 2h, 1d (positive, at most 3650d)")
    sa.add_argument("--comment", required=True, help="why (shown in `silence list`)")
    sa.add_argument("--author", help="who (default: the user name)")
    where(sa)
    sl = silsub.add_parser("list", parents=[common], help="list active and pending silences")
    sl.add_argument("--expired", action="store_true", help="also list expired silences (kept 5 days)")
    sl.add_argument("--json", action="store_true", help="print JSON")
    where(sl)
    se = silsub.add_parser("expire", parents=[common], help="end silences now")
    se.add_argument("ids", nargs="+", metavar="ID", help="silence ID (a unique prefix is enough)")
    where(se)
    sil.set_defaults(func=cmd_silence)

    nt = sub.add_parser("notifications", help="queued and refused notifications (list, retry)")
    ntsub = nt.add_subparsers(dest="action", required=True)
    nl = ntsub.add_parser("list", parents=[common], help="list what waits for delivery and what receivers refused")
    nl.add_argument("--json", action="store_true", help="print JSON")
    where(nl, alertmanager=False)
    nr = ntsub.add_parser("retry", parents=[common], help="send refused notifications again (all receivers, or those named)")
    nr.add_argument("receivers", nargs="*", metavar="RECEIVER", help="notifier name, e.g. slack or webhook/ops")
    where(nr, alertmanager=False)
    nt.set_defaults(func=cmd_notifications)

    dg = sub.add_parser("diagnose", parents=[common], help="check a draft checkpoint against the target and the installed SGLang "
                                         "(exit 1 on any error finding)")
    _diagnosis_args(dg)
    dg.add_argument("--engine", choices=["auto", "sglang", "vllm"], default="auto",
                    help="the server's engine (auto: vLLM when --pid or --server-info shows a vLLM server, else SGLang)")
    dg.add_argument("--vllm-root", metavar="DIR", help="folder containing the vllm package the server runs "
                                                       "(default: the server process's with --pid, else the importable one)")
    dg.add_argument("--verbose", action="store_true", help="show the evidence of info findings too")
    dg.set_defaults(func=cmd_diagnose)

    fx = sub.add_parser("fix-checkpoint", parents=[common], help="write a copy of the draft the installed SGLang loads correctly, "
                                               "then diagnose it")
    _diagnosis_args(fx)
    fx.add_argument("--out", required=True, metavar="DIR", help="new folder for the converted copy")
    fx.set_defaults(func=cmd_fix_checkpoint)

    c = sub.add_parser("check-config", parents=[common], help="validate a config file (exit 2 with every problem named)")
    c.add_argument("file", help="the YAML config file to check (as `run --config` would read it)")
    c.add_argument("--env-file", metavar="FILE", help="KEY=value secrets the service gets (the unit's EnvironmentFile); "
                   "default: `environment` beside the config; the shell's variables win")
    c.set_defaults(func=cmd_check_config)
    return p


class _Version(argparse.Action):
    """`--version`, the installed version read only when asked (`specwatch.__version__`)."""

    def __call__(self, parser, namespace, values, option_string=None):
        import specwatch

        print(f"specwatch {specwatch.__version__}")
        parser.exit()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_join_dash_values(sys.argv[1:] if argv is None else list(argv)))
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except ConfigError as e:
        for problem in e.problems:
            print(problem, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
