"""`specwatch replay`: the daemon's pipeline over recorded logs, then a summary.

Lines come from the same Follower the daemon uses (read once from the first line to the end);
time comes from the log's own timestamps.
"""

from __future__ import annotations

import contextlib
import gzip
import math
import os
import re
import shutil
import tempfile
from typing import Iterable, Iterator

from specwatch.alerts.model import RESOLVED, Alert, iso8601
from specwatch.core.pipeline import KINDS, Pipeline
from specwatch.sources.filestream import READ_BYTES, Follower
from specwatch.sources.logfiles import stage


def replay_files(pipeline: Pipeline, paths: Iterable[str], max_line_bytes: int) -> None:
    """Feed every complete line of each file, in file order, through `pipeline`. A gzipped file
    (a rotated `server.log.2.gz`) is read decompressed. Raises OSError / EOFError for a file that
    cannot be read or a corrupt gzip stream."""
    for path in paths:
        with _readable(path) as readable:
            def feed(batch, _path=path):
                batch.path = _path  # the name the config maps to a server, not the temp copy
                pipeline.feed_batch(batch)

            src = next((s for s in pipeline.config.logs if s.path == path), None)
            on_lines = feed if src is None else stage(src, feed, max_line_bytes)  # envelope, grammar
            follower = Follower(readable, on_lines=on_lines, max_line_bytes=max_line_bytes, read_chunk_bytes=READ_BYTES)
            while follower.poll():
                pass
            follower.finish()  # a last line without a newline still counts in a recorded log
        pipeline.flush_errors()  # a traceback cut off at the end of the file still counts


_LOG_NAME_TAIL = re.compile(r"(\.(log|txt|out|err|jsonl?)(\.\d+)?)?(\.gz)?$", re.I)


def server_of_file(path: str) -> str:
    """The server a log replayed without a config or `--server` is named after: the file's name
    without its log, rotation and gzip suffixes (`sglang-0.log.2.gz` -> `sglang-0`; a version
    in the name stays: `sglang-0.5.23.log` -> `sglang-0.5.23`), `replay` when nothing is left.
    The rotated files of one log share a name, so they replay as one server."""
    return _LOG_NAME_TAIL.sub("", os.path.basename(path), count=1) or "replay"


@contextlib.contextmanager
def _readable(path: str) -> Iterator[str]:
    """`path`, or a decompressed copy of it when it is gzip (magic bytes 1f 8b, RFC 1952)."""
    with open(path, "rb") as f:
        if f.read(2) != b"\x1f\x8b":
            yield path
            return
    with tempfile.TemporaryDirectory(prefix="specwatch-replay-") as tmp:
        plain = os.path.join(tmp, os.path.basename(path).removesuffix(".gz"))
        with gzip.open(path, "rb") as src, open(plain, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        yield plain


def _round(v: float) -> float | None:
    return None if v is None or math.isinf(v) else round(v, 4)


def summary(pipeline: Pipeline, alerts: list[Alert]) -> dict:
    """The `replay --json` document (its shape is fixed: docs/commands.md; extra keys are additions)."""
    lines = dict.fromkeys(KINDS, 0)
    for st in pipeline.servers.values():
        for k in KINDS:
            lines[k] += st.lines[k]
    multi = len({s for s, _ in pipeline.ranks}) > 1
    ranks = {}
    for (server, rank), rs in sorted(pipeline.ranks.items()):
        if rs.decode_batches == 0:
            continue
        d = rs.last_decode
        n = rs.accept_length_count
        ranks[f"{server} {rank}".strip() if multi else rank] = {
            "server": server,
            "decode_batches": rs.decode_batches,
            "accept_length": {
                "last": d.accept_length if d else None,
                "mean": round(rs.accept_length_sum / n, 4) if n else None,
                "min": _round(rs.accept_length_min) if n else None,
                "max": _round(rs.accept_length_max) if n else None,
            },
            "accept_rate_last": d.accept_rate if d else None,
            "gen_throughput_last": d.gen_throughput if d else None,
            "running_requests_last": d.running_requests if d else None,
            "collapsed": pipeline.collapse.collapsed(server, rank),
        }
    servers = {}
    for server, st in pipeline.servers.items():
        servers[server] = {
            "lines": dict(st.lines),
            "server_args": st.server_args.args if st.server_args else None,
        }
    return {
        "lines": {"total": sum(lines.values()), **lines},
        "ranks": ranks,
        "episodes": episodes(alerts, pipeline.dispatcher.alerts, pipeline.dispatcher.update_notes),
        "alerts": [_entry(a) for a in alerts],
        "servers": servers,
    }


def _entry(a: Alert) -> dict:
    """One alert as `replay --json` lists it: the short keys a person reads (name, status,
    server, rank, times, summary, evidence, fixes) and, as Alertmanager's API v2 lists an alert
    (`GET /api/v2/alerts`: prometheus/alertmanager `api/v2/openapi.yaml`, gettableAlert), its
    `labels` (alertname, severity, server, rank, ...), `annotations` and `fingerprint`;
    `severity` repeats the label so a script tells a page (`critical`) from a note (`info`)."""
    return {
        "name": a.name,
        "status": a.status,
        "severity": a.labels.get("severity", ""),
        "server": a.labels.get("server", ""),
        "rank": a.labels.get("rank", ""),
        "starts_at": iso8601(a.starts_at),
        "ends_at": iso8601(a.ends_at),
        "summary": a.annotations.get("summary", ""),
        "evidence": dict(a.evidence),
        "fixes": list(a.fixes),
        "labels": dict(sorted(a.labels.items())),
        "annotations": dict(sorted(a.annotations.items())),
        "fingerprint": a.fingerprint,
    }


def episodes(alerts: list[Alert], current: dict[str, Alert] | None = None,
             notes: Iterable[tuple[str, float, float, str]] = ()) -> list[dict]:
    """One entry per alert episode (same labels, same start), in the order they began: its last
    state (summary, annotations, evidence, fixes), its final status (`firing` only when still
    firing at the end of the log), `ends_at`, why it resolved (`resolved_evidence`), how many
    transitions were sent (`notifications`) and the updates it was notified with (`updates`:
    [{"at": ISO 8601, "note": text}], oldest first).

    `alerts`: the transitions as handled (`Dispatcher.history`: a copy at each firing and
    resolve). `current`: the dispatcher's alerts by fingerprint at the end (`Dispatcher.alerts`):
    an episode still firing reads as that alert is now. A rule refreshes its firing alert in
    place (a crash loop's count of failed starts, the ranks a hang reached, a collapse's newest
    low line) and hands over only some of those refreshes, as updates, which are no
    transitions; the resolve's copy holds an episode's last firing state, less the pairs added
    on resolving (`Alert.why_resolved`). `notes`: (fingerprint, starts_at, clock, note) of each
    update (`Dispatcher.update_notes`)."""
    out: dict[tuple[str, float], dict] = {}
    for a in alerts:
        key = (a.fingerprint, a.starts_at)
        ep = out.get(key)
        if ep is None:
            ep = out[key] = {**_entry(a), "resolved_evidence": {}, "notifications": 0, "updates": []}
        ep["notifications"] += 1
        if a.status == RESOLVED:
            why = set(a.why_resolved)
            ep.update(_last_state(a, [p for i, p in enumerate(a.evidence) if i not in why] if why else None))
            ep["status"], ep["ends_at"] = RESOLVED, iso8601(a.ends_at)
            ep["resolved_evidence"] = dict(a.evidence)
        else:
            ep.update(_last_state(a))
    for fp, a in (current or {}).items():
        ep = out.get((fp, a.starts_at))
        if ep is not None and a.status != RESOLVED and ep["status"] != RESOLVED:
            ep.update(_last_state(a))
    for fp, starts_at, at, note in notes:
        ep = out.get((fp, starts_at))
        if ep is not None:
            ep["updates"].append({"at": iso8601(at), "note": note})
    return list(out.values())


def _last_state(a: Alert, evidence: list[tuple[str, str]] | None = None) -> dict:
    """What an episode says as of `a` (`evidence`: its pairs, when not all of `a.evidence`)."""
    d = {"summary": a.annotations.get("summary", ""), "fixes": list(a.fixes),
         "annotations": dict(sorted(a.annotations.items())), "severity": a.labels.get("severity", ""),
         "labels": dict(sorted(a.labels.items()))}
    if evidence is not None or a.status != RESOLVED:
        d["evidence"] = dict(a.evidence if evidence is None else evidence)
    return d


def format_text(doc: dict) -> str:
    """A readable replay report."""
    out = []
    ln = doc["lines"]
    out.append(f"lines: {ln['total']} (decode {ln['decode']}, prefill {ln['prefill']}, "
               f"other {ln['other']}, malformed {ln['malformed']}"
               + f", unrecognized {ln.get('unrecognized', 0)})")
    for rank, r in doc["ranks"].items():
        al = r["accept_length"]
        state = "COLLAPSED" if r["collapsed"] else "ok"
        fmt = lambda v: "n/a" if v is None else f"{v:.2f}"  # noqa: E731
        out.append(
            f"rank {rank or '(single)'}: {r['decode_batches']} decode batches, accept len last "
            f"{fmt(al['last'])} mean {fmt(al['mean'])} min {fmt(al['min'])} max {fmt(al['max'])}, "
            f"accept rate {fmt(r['accept_rate_last'])}, {fmt(r['gen_throughput_last'])} token/s  [{state}]"
        )
    if not doc["episodes"]:
        out.append("alerts: none")
    shown: set[str] = set()  # fix texts printed already
    for a in doc["episodes"]:
        out.append("")
        where = " ".join(p for p in (a["server"], a["rank"]) if p)
        if a["status"] == RESOLVED:
            out.append(f"ALERT {a['name']} on {where}: {a['starts_at']} → {a['ends_at']} (resolved)")
        else:
            out.append(f"ALERT {a['name']} on {where}: FIRING since {a['starts_at']} (at the end of the log)")
        out.append(f"  {a['summary']}")
        out += [f"  update {u['at']}: {_one_line(u['note'])}" for u in a.get("updates", ())]
        if a["fixes"] and shown.issuperset(a["fixes"]):
            out.append("  what to check: as above")
        elif a["fixes"]:
            out.append("  what to check:")
            for i, fix in enumerate(a["fixes"], 1):
                out.append(f"   {i}. (as above: {_head(fix)})" if fix in shown else f"   {i}. {fix}")
            shown.update(a["fixes"])
    return "\n".join(out)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _head(fix: str, most: int = 60) -> str:
    """A fix's name: its text before the first ": " (`fc bypass`), else its start."""
    head = fix.split(": ", 1)[0]
    return head if len(head) <= most else fix[:most - 1].rstrip() + "…"
