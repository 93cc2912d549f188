"""What the status page shows, as plain JSON-ready data: a read-only snapshot of the pipeline (per
server and rank), the firing alerts, the sources' health and the GPUs.

`/api/status` returns `StatusView.snapshot()` as is and `page.render` draws the same dict, so the
two never disagree. Nothing here runs until a page is asked for: the only running cost of the
page is the per-rank `history.AcceptHistory` the pipeline keeps.

Shape (times: seconds since the epoch; absent values: null)::

    {"specwatch": {"version", "generated_at"},
     "window": {"start", "end", "step_seconds", "clock": "wall" | "log"},
     "thresholds": {"collapse_accept_length", "recover_accept_length"},
     "servers": [{"server", "up", "algorithm", "model", "draft_model", "accept_length_ceiling",
                  "lines": {kind: n}, "errors": {kind: n}, "metrics_url",
                  "ranks": [{"rank", "source": "log" | "server_metrics", "url",
                             "accept_length", "accept_rate", "gen_throughput",
                             "running_requests", "queued_requests", "token_usage",
                             "last_decode_at", "decode_batches", "collapsed",
                             "accept_length_history": [[t, accept length], ...],
                             "collapse_episodes": [[start, end or null], ...],
                             "alert_episodes": [[start, end or null], ...]}]}],
     "alerts": [{"alertname", "severity", "server", "rank", "summary", "description",
                 "starts_at", "runbook_url", "labels", "evidence": [[name, value]], "fixes"}],
     "sources": [{"kind", "name", "server", "ok", "state", "last_line_at", "counters"}],
     "gpus": {"enabled", "up", "error", "sampled_at", "driver", "devices": [{"index", "name", "up",
              "utilization_ratio", "memory_used_bytes", "memory_total_bytes",
              "temperature_celsius", "power_watts", "clock_reasons", "xids"}]}}

The window is the last hour of wall time; when no rank's newest point is in it (more than an
hour old or ahead of the clock: an old log, a wrong `log_timezone`) it is the hour up to the
newest point (`clock: "log"`). A rank's points after a line stamped well before them (its log's
clock came back from an excursion ahead) are dropped (`history.AcceptHistory.add`), so the chart
follows the present. Collapse episodes come from the points' collapse state (to within
`history.STEP` seconds); the one firing now starts at its alert's `starts_at`. Alert episodes
are those of the other per-rank acceptance alerts (`history.OTHER_ALERTS`), found the same way.

Servers: those configured (a log's, a `server_api`'s or a `server_metrics`' `server`,
`process.servers`) and any other with something to show (ranks, lines, a running process, an
API or /metrics answer); GPU samples, named after the default server, add none. Settings come
from the pipeline (the server_args line, /server_info, the command line) and, after a restart of
specwatch before any of those is read again, from the collapse rule's persisted copy. Ranks:
the log's; a rank read from /metrics (`source` "server_metrics", `url` the scrape) is listed
when no log rank of the server has the same numbers (`rules.server_metrics.ranks_match`), or
while /metrics judges the server (its log gave no decode line within `rules.windows.max_gap`).

Sources: any object with a `source_status()` method returning {"kind", "name", "ok", "state",
"last_line_at", "counters"} describes itself (the way for new kinds of source: journal,
containers, ...); followed files (`Follower`) and the HTTP API polls are read from their
counters, the process scan from the servers it found; anything else by its `name`/`path`/`url`,
`up`/`is_open` and `last_line_timestamp`. "server" may be empty, "ok" null (unknown).
"""

from __future__ import annotations

import math
import os
import time
from typing import Callable, Iterable

from specwatch import __version__
from specwatch.config import source_servers
from specwatch.alerts.model import FIRING
from specwatch.rules.acceptance_ceiling import accept_length_ceiling
from specwatch.rules.collapse import ALERT_NAME as COLLAPSE
from specwatch.rules.server_metrics import ranks_match
from specwatch.status.history import COLLAPSED, OTHER, OTHER_ALERTS, SPAN, STEP

RANK_ORDER = ("DP", "TP", "PP", "EP")
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
FUTURE_SLACK = 300.0  # seconds a point may be ahead of the clock and still count as wall time


class StatusView:
    """Reads the daemon's state for the page. `pipeline`: the `Pipeline`; `sources`: returns the
    sources to list (followers first); `gpu`: returns the `GpuSampler` or None; `gpu_enabled`:
    returns whether `gpu.enabled` is set. Every call takes the pipeline lock once."""

    def __init__(self, pipeline, *, sources: Callable[[], Iterable[object]] = lambda: (),
                 gpu: Callable[[], object | None] = lambda: None, gpu_enabled: Callable[[], bool] = lambda: False):
        self.pipeline = pipeline
        self.sources = sources
        self.gpu = gpu
        self.gpu_enabled = gpu_enabled

    def snapshot(self, now: float | None = None) -> dict:
        """The status as the module docstring shows it. `now`: wall time (default: the clock)."""
        now = time.time() if now is None else now
        p = self.pipeline
        with p.lock:
            cfg = p.collapse.config
            ranks = [_rank(p, rs) for rs in p.ranks.values()]
            logged = [(rs.server, rs.ranks) for rs in p.ranks.values()]
            ranks += [_rank(p, rs, _metrics_url(p.servers.get(rs.server))) for rs in p.scraped.values()
                      if _metrics_decide(p, rs.server)
                      or not any(s == rs.server and ranks_match(n, rs.ranks) for s, n in logged)]
            configured = source_servers(p.config)
            servers = {name: _server(name, p.servers.get(name), p.collapse.settings(name))
                       for name in sorted(configured | p.servers.keys() | {r["server"] for r in ranks})}
            firing = [a for a in p.dispatcher.alerts.values() if a.status == FIRING]
            alerts = [_alert(a) for a in firing]
            server_of = p.server_for
        window = _window(ranks, now)
        starts: dict[int, dict[tuple[str, str], float]] = {COLLAPSED: {}, OTHER: {}}  # bit → (server, rank) → since
        for a in alerts:
            bit = COLLAPSED if a["alertname"] == COLLAPSE else OTHER if a["alertname"] in OTHER_ALERTS else None
            if bit is not None:
                key = (a["server"], a["rank"])
                starts[bit][key] = min(a["starts_at"], starts[bit].get(key, a["starts_at"]))
        for r in ranks:
            key = (r["server"], r["rank"])
            _clip(r, window, starts[COLLAPSED].get(key), starts[OTHER].get(key))
            servers[r["server"]]["ranks"].append(r)
        for name, s in list(servers.items()):
            if not (s.pop("_active") or s["ranks"] or name in configured):
                del servers[name]  # nothing to show (GPU samples name the default server: not one to list)
                continue
            s["ranks"].sort(key=lambda r: r.pop("_order"))
            for r in s["ranks"]:
                del r["server"]
        alerts.sort(key=lambda a: (SEVERITY_ORDER.get(a["severity"], 9), a["starts_at"] or 0, a["alertname"]))
        return {
            "specwatch": {"version": __version__, "generated_at": now},
            "window": window,
            "thresholds": {"collapse_accept_length": cfg.max_accept_length,
                           "recover_accept_length": cfg.recover_accept_length},
            "servers": list(servers.values()),
            "alerts": alerts,
            "sources": [s for s in (source_status(src, server_of) for src in self.sources()) if s is not None],
            "gpus": _gpus(self.gpu(), self.gpu_enabled()),
        }


def _num(v) -> float | None:
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


def _metrics_decide(p, server: str) -> bool:
    """/metrics judges the server's collapse (`CollapseRule.metrics_decide`)."""
    st = p.servers.get(server)
    return st is not None and st.metrics is not None and p.collapse.metrics_decide(server, st.metrics.timestamp)


def _metrics_url(st) -> str | None:
    return st.metrics.url if st is not None and st.metrics is not None else None


def _rank(p, rs, url: str | None = None) -> dict:
    """One rank under the pipeline lock: its last decode line and a copy of its points. `url`:
    the /metrics it was read from (None: a log)."""
    d = rs.last_decode
    h = rs.history
    points = [[t, round(v, 3), c] for t, v, c in h.points]
    state = p.alert_state(rs.server, rs.rank)
    if d is not None and d.accept_length is not None and (not points or d.timestamp > points[-1][0]):
        tail = h.pending(rs.accept_length_sum, rs.accept_length_count)
        points.append([d.timestamp, round(d.accept_length if tail is None else tail, 3), state])
    order = (url is not None,) + tuple(rs.ranks.get(t, -1) for t in RANK_ORDER) + (rs.rank,)
    return {
        "server": rs.server, "rank": rs.rank, "_order": order,
        "source": "log" if url is None else "server_metrics", "url": url,
        "accept_length": _num(d.accept_length) if d else None,
        "accept_rate": _num(d.accept_rate) if d else None,
        "gen_throughput": _num(d.gen_throughput) if d else None,
        "running_requests": d.running_requests if d else None,
        "queued_requests": d.queued_requests if d else None,
        "token_usage": _num(d.token_usage) if d else None,
        "last_decode_at": d.timestamp if d else None,
        "decode_batches": rs.decode_batches,
        "collapsed": bool(state & COLLAPSED),
        "_alerting": bool(state & OTHER),
        "accept_length_history": points,
    }


def _server(name: str, st, saved: dict) -> dict:
    """One server; `saved`: its settings as the collapse rule kept them (read when `st` has none)."""
    args = st.server_args.args if st is not None and st.server_args is not None else saved
    up = None
    if st is not None and st.process_watched:
        up = st.process is not None
    elif st is not None and st.api is not None:
        up = st.api.info is not None
    top = accept_length_ceiling(args)
    text = lambda k: None if args.get(k) is None else str(args[k])  # noqa: E731
    return {
        "server": name, "up": up, "algorithm": text("speculative_algorithm"), "model": text("model_path"),
        "draft_model": text("speculative_draft_model_path"), "accept_length_ceiling": top[0] if top else None,
        "lines": dict(st.lines) if st else {}, "errors": {k: n for k, n in st.errors.items() if n} if st else {},
        "metrics_url": _metrics_url(st), "ranks": [],
        "_active": st is not None and (any(st.lines.values()) or st.process is not None or st.api is not None
                                       or st.metrics is not None or st.server_args is not None),
    }


def _window(ranks: list[dict], now: float) -> dict:
    """The last hour of wall time while some rank's newest point is in it; else the hour up to
    the newest point (a rank left ahead of the clock by an excursion does not take the window
    from the ranks of the present)."""
    lasts = [r["accept_length_history"][-1][0] for r in ranks if r["accept_length_history"]]
    log_clock = bool(lasts) and not any(now - SPAN <= t <= now + FUTURE_SLACK for t in lasts)
    end = max(lasts) if log_clock else now
    return {"start": end - SPAN, "end": end, "step_seconds": STEP, "clock": "log" if log_clock else "wall"}


def _clip(r: dict, window: dict, collapse_since: float | None, alert_since: float | None) -> None:
    """Keep the rank's points inside the window, as [t, value]; derive its collapse episodes and
    those of the other acceptance alerts (`*_since`: the start of the one firing now)."""
    start = window["start"]
    points = [p for p in r["accept_length_history"] if start <= p[0] <= window["end"]]
    for key, bit, firing, since in (("collapse_episodes", COLLAPSED, r["collapsed"], collapse_since),
                                    ("alert_episodes", OTHER, r.pop("_alerting"), alert_since)):
        episodes = _episodes(points, bit, firing, since, r["last_decode_at"])
        r[key] = [[max(a, start), b] for a, b in episodes if b is None or b >= start]
    r["accept_length_history"] = [[t, v] for t, v, _ in points]


def _episodes(points: list, bit: int, firing: bool, since: float | None, last: float | None) -> list[list]:
    """[start, end or None] spans of the points whose state has `bit`; `firing`: it holds now,
    since `since` (its alert's start) when known; `last`: the rank's newest line."""
    episodes: list[list] = []
    for t, _, state in points:
        on = bool(state & bit)
        if on and (not episodes or episodes[-1][1] is not None):
            episodes.append([t, None])
        elif not on and episodes and episodes[-1][1] is None:
            episodes[-1][1] = t
    if firing:
        if not episodes or episodes[-1][1] is not None:
            episodes.append([since if since is not None else last, None])
        elif since is not None:
            episodes[-1][0] = min(episodes[-1][0], since)
    elif episodes and episodes[-1][1] is None:  # resolved since its last point
        episodes[-1][1] = last
    return episodes


def _alert(a) -> dict:
    labels = dict(a.labels)
    return {
        "alertname": a.name, "severity": labels.get("severity", ""), "server": labels.get("server", ""),
        "rank": labels.get("rank", ""), "summary": a.annotations.get("summary", ""),
        "description": a.annotations.get("description", ""), "runbook_url": a.annotations.get("runbook_url"),
        "starts_at": a.starts_at, "labels": labels, "evidence": [[str(n), str(v)] for n, v in a.evidence],
        "fixes": [str(f) for f in a.fixes],
    }


def source_status(src, server_for: Callable[[str], str] = lambda _: "") -> dict | None:
    """One source's health (see the module docstring); None for an object that names nothing."""
    own = getattr(src, "source_status", None)
    if callable(own):
        return dict(own())
    if hasattr(src, "is_open") and hasattr(src, "rotations_total"):  # a followed file (sources/filestream.py)
        path = src.path
        state = ("open" if src.is_open else "a directory" if os.path.isdir(path)
                 else "unreadable" if os.path.exists(path) else "missing")
        return {"kind": "file", "name": path, "server": server_for(path), "ok": bool(src.is_open), "state": state,
                "last_line_at": src.last_line_timestamp,
                "counters": {k: getattr(src, k + "_total", 0) for k in (
                    "lines", "read_errors", "rotations", "truncations", "long_lines_skipped", "rotated_files_lost")}}
    if hasattr(src, "requests_total") and hasattr(src, "shown"):  # an HTTP API poll (sources/server_api.py)
        with src.lock:
            return {"kind": "server_api", "name": src.shown, "server": src.server, "ok": bool(src.up),
                    "state": "answering" if src.up else "not answering", "last_line_at": src.last_success,
                    "counters": {"requests": sum(src.requests_total.values()),
                                 "errors": sum(src.errors_total.values())}}
    if hasattr(src, "scans_total") and callable(getattr(src, "current", None)):  # the /proc scan (sources/process.py)
        found = sorted(src.current())
        return {"kind": "process", "name": "SGLang processes", "server": ", ".join(found),
                "ok": True if src.scans_total else None, "state": f"{len(found)} server(s) running",
                "last_line_at": None, "counters": {"scans": src.scans_total, "scan_errors": src.scan_errors_total}}
    name = next((getattr(src, k) for k in ("name", "path", "url") if isinstance(getattr(src, k, None), str)), None)
    if name is None:
        return None
    ok = next((bool(getattr(src, k)) for k in ("up", "is_open") if hasattr(src, k)), None)
    kind = type(src).__name__.removesuffix("Source").lower() or "source"
    return {"kind": kind, "name": name, "server": getattr(src, "server", ""), "ok": ok,
            "state": "" if ok is None else "ok" if ok else "failing",
            "last_line_at": getattr(src, "last_line_timestamp", None), "counters": {}}


def _gpus(sampler, enabled: bool) -> dict:
    last = getattr(sampler, "last", None)
    if last is None:
        return {"enabled": enabled, "up": None, "error": None, "sampled_at": None, "driver": None, "devices": []}
    return {
        "enabled": enabled, "up": last.up, "error": None if last.up else getattr(sampler, "unavailable", None),
        "sampled_at": last.timestamp,
        "driver": last.driver[0] if last.driver else None,
        "devices": [{
            "index": g.index, "name": g.model_name, "up": g.up, "utilization_ratio": g.utilization_ratio,
            "memory_used_bytes": g.memory_used_bytes, "memory_total_bytes": g.memory_total_bytes,
            "temperature_celsius": g.temperature_celsius, "power_watts": g.power_watts,
            "clock_reasons": sorted(g.reasons), "xids": sum(int(n) for n, _ in g.xids.values()),
        } for g in last.gpus if g.listed],
    }
