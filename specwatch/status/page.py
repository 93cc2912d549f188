"""The status snapshot (`view.StatusView.snapshot`) as one self-contained HTML page.

Charts are inline SVG drawn here, server-side: no JavaScript, no stylesheet or font from
anywhere, no dependency. A page is a few tens of KB, built in milliseconds only when asked for,
renders offline in any browser (and from `curl` into a file), scales and prints sharply, and its
points can be checked in the DOM. A vendored charting library (uPlot, Chart.js) would add tens
to hundreds of KB of JavaScript to serve and keep up to date, and the page would show nothing
with scripts off; for one line per rank with a threshold and shaded spans it buys nothing.

Escaping: every value comes from the snapshot, i.e. from logs, checkpoints, the config or the
servers' APIs, and goes through `esc` (text and double-quoted attributes alike); the markup is
this module's own. Links are relative, except a configured runbook URL, kept only when it is
http(s). The page refreshes itself with `<meta http-equiv="refresh">`; the server sends a
Content-Security-Policy that allows no script and no external resource (web.py).
"""

from __future__ import annotations

import html
import math
import time
from datetime import datetime, timezone
from typing import Iterable, Iterator, Sequence

from specwatch.alerts.model import split_code

W, H = 520, 160  # chart size, px
LEFT, RIGHT, TOP, BOTTOM = 36, 10, 8, 20  # plot margins, px
GAP = 60.0  # seconds without a point that break the line (no decode lines: idle, down)
TICK = 600.0  # seconds between time ticks
BAND = 7  # px: height of the band marking other acceptance alerts

_STYLE = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;padding:12px 20px;max-width:1200px;color:#1d2330;background:#fff}
h1{font-size:20px;margin:0}h2{font-size:16px;margin:22px 0 6px;border-bottom:1px solid #dde;padding-bottom:3px}
h3{font-size:15px;margin:14px 0 4px}
header{display:flex;gap:16px;align-items:baseline;flex-wrap:wrap}header .meta{color:#667}
a{color:#2456a6}code{font:12.5px ui-monospace,Menlo,Consolas,monospace;background:#f1f2f6;padding:0 3px;border-radius:3px;overflow-wrap:anywhere}
table{border-collapse:collapse;margin:4px 0}th,td{padding:2px 10px 2px 0;text-align:left;vertical-align:top}
th{font-weight:600;color:#445}td.n{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#17803d}.bad{color:#c0262d;font-weight:600}.muted{color:#778}
.alert{border-left:5px solid #c0262d;background:#fff5f5;padding:6px 12px;margin:8px 0}
.alert.warning{border-color:#d88a00;background:#fffaf0}.alert.info{border-color:#2456a6;background:#f4f8ff}
.alert dl{display:grid;grid-template-columns:max-content 1fr;gap:0 12px;margin:4px 0}.alert dt{color:#556}.alert dd{margin:0}
.alert ol{margin:4px 0;padding-left:22px}#firing ul{margin:4px 0;padding-left:20px}#firing li{margin:2px 0}
#firing li.critical::marker{color:#c0262d}
.charts{display:flex;flex-wrap:wrap;gap:8px 18px}figure{margin:0}figcaption{font-size:13px;color:#445}
svg.chart{display:block}svg text{font:10px system-ui,sans-serif;fill:#556}
.plot{fill:#fbfbfd;stroke:#dde}.grid{stroke:#e8e8ef}.episode{fill:#e5484d;fill-opacity:.18}.alerting{fill:#e8920c;fill-opacity:.85}
.warn{color:#b86e00}
.threshold{stroke:#c0262d;stroke-width:1.2;stroke-dasharray:5 3}.recover{stroke:#17803d;stroke-width:1;stroke-dasharray:2 3}
.ceiling{stroke:#889;stroke-width:1;stroke-dasharray:1 3}.line{fill:none;stroke:#2456a6;stroke-width:1.6}.dot{fill:#2456a6}
svg text.threshold-label{fill:#c0262d}
"""


_LEGEND = ('<p class="muted">Mean accept length per {step:g} s of log time (of scrape time for a rank read from '
           '/metrics), one scale per server. <span class="bad">Red shade</span>: collapse episodes; '
           '<span class="warn">orange band</span>: the rank\'s other acceptance alerts (RankDisagreement, '
           'AcceptanceDegradation); <span class="bad">red dashes</span>: the collapse threshold '
           '(rules.collapse.max_accept_length); <span class="ok">green dots</span>: recovery '
           '(recover_accept_length); grey dots: the most one verify round can accept.</p>')


def esc(value: object) -> str:
    """Any value as HTML text or a double-quoted attribute value."""
    return html.escape(str(value), quote=True)


def _num(v, spec: str = ".2f", unit: str = "") -> str:
    return "–" if v is None else format(v, spec) + unit


def _clock(ts: float | None) -> str:
    """Local time of this host, HH:MM:SS (with the date when not today)."""
    if ts is None:
        return "–"
    t = time.localtime(ts)
    return time.strftime("%H:%M:%S" if t[:3] == time.localtime()[:3] else "%Y-%m-%d %H:%M:%S", t)


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _age(ts: float | None, now: float) -> str:
    if ts is None:
        return "never"
    s = now - ts
    if s < 0:
        return "in the future"
    for unit, n in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= n:
            return f"{s / n:.0f} {unit} ago"
    return f"{s:.0f} s ago"


def _when(ts: float | None, now: float) -> str:
    if ts is None:
        return '<span class="muted">never</span>'
    return f'<span title="{esc(_utc(ts))}">{esc(_clock(ts))}</span> <span class="muted">({esc(_age(ts, now))})</span>'


def _state(ok: bool | None, text: str) -> str:
    cls = "muted" if ok is None else "ok" if ok else "bad"
    return f'<span class="{cls}">{esc(text)}</span>'


def _rich(text: str) -> str:
    """specwatch's Markdown-like text (code spans from `alerts.model.code`) as HTML."""
    return "".join(f"<code>{esc(part)}</code>" if is_code else esc(part) for is_code, part in split_code(text))


def render(status: dict, refresh: int = 10) -> str:
    """The whole page for `status`; `refresh`: seconds between reloads (0: none)."""
    now = status["specwatch"]["generated_at"]
    firing = len(status["alerts"])
    title = f"specwatch: {firing} alert(s) firing" if firing else "specwatch: ok"
    head = ('<!doctype html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width,initial-scale=1">'
            + (f'<meta http-equiv="refresh" content="{int(refresh)}">' if refresh > 0 else "")
            + f"<title>{esc(title)}</title><style>{_STYLE}</style></head><body>")
    alerts = status["alerts"]
    # What is wrong, the curves, then the details: the charts stay in the first screen.
    return "".join([
        head, _header(status, refresh),
        _section("firing", f"Firing alerts ({len(alerts)})", _firing(alerts, now)),
        _section("servers", "Servers", _servers(status, now)),
        _section("alerts", "Findings and fixes", _alerts(alerts, now)) if alerts else "",
        _section("sources", f"Sources ({len(status['sources'])})", _sources(status["sources"], now)),
        _section("gpus", "GPUs", _gpus(status["gpus"], now)),
        "</body></html>"])


def _section(name: str, heading: str, parts: Iterable[str]) -> str:
    return f'<section id="{name}"><h2>{esc(heading)}</h2>{"".join(parts)}</section>'


def _header(status: dict, refresh: int) -> str:
    s = status["specwatch"]
    again = f", refreshes every {refresh} s" if refresh > 0 else ""
    return (f'<header><h1>specwatch {esc(s["version"])}</h1>'
            f'<span class="meta">as of {esc(_clock(s["generated_at"]))}{esc(again)}</span>'
            '<span><a href="/metrics">/metrics</a> · <a href="/api/status">/api/status</a></span></header>')


def _firing(alerts: list[dict], now: float) -> Iterator[str]:
    """One line per firing alert, linked to its findings and fixes further down."""
    if not alerts:
        yield '<p class="ok">None firing.</p>'
    else:
        yield ("<ul>" + "".join(
            f'<li class="{esc(a["severity"])}"><a href="#alert-{i}"><b>{esc(a["alertname"])}</b></a> '
            f'<span class="muted">{esc(a["severity"])} · {esc(_where(a))} · since {_when(a["starts_at"], now)}</span>'
            f' {_rich(a["summary"])}</li>' for i, a in enumerate(alerts, 1)) + "</ul>")


def _where(a: dict) -> str:
    return " ".join(x for x in (a["server"], a["rank"]) if x)


def _alerts(alerts: list[dict], now: float) -> Iterator[str]:
    """Each firing alert in full: description, findings (evidence), fixes."""
    for i, a in enumerate(alerts, 1):
        yield (f'<div class="alert {esc(a["severity"])}" id="alert-{i}"><h3>{esc(a["alertname"])} '
               f'<span class="muted">{esc(a["severity"])} · {esc(_where(a))} · since {_when(a["starts_at"], now)}</span></h3>'
               f'<p><b>{_rich(a["summary"])}</b></p><p>{_rich(a["description"])}</p>')
        if a["evidence"]:
            yield ("<h4>Findings</h4><dl>" + "".join(
                f"<dt>{esc(n)}</dt><dd><code>{esc(v)}</code></dd>" for n, v in a["evidence"]) + "</dl>")
        if a["fixes"]:
            yield ("<h4>Fixes, most likely first</h4><ol>"
                   + "".join(f"<li>{_rich(f)}</li>" for f in a["fixes"]) + "</ol>")
        url = a.get("runbook_url") or ""
        if url.lower().startswith(("https://", "http://")):
            yield f'<p><a href="{esc(url)}" rel="noreferrer">Runbook</a></p>'
        yield "</div>"


def _servers(status: dict, now: float) -> Iterator[str]:
    if not status["servers"]:
        yield '<p class="muted">No line read from any server yet.</p>'
    w = status["window"]
    if w["clock"] == "log":
        yield (f'<p class="muted">The newest decode line is from {esc(_utc(w["end"]))}: the charts show the '
               "hour of log time before it (an old log, or check log_timezone).</p>")
    for s in status["servers"]:
        up = "" if s["up"] is None else " " + _state(s["up"], "up" if s["up"] else "down")
        yield f'<h3>{esc(s["server"] or "(no name)")}{up}</h3><p>'
        for label, key in (("algorithm", "algorithm"), ("model", "model"), ("draft model", "draft_model")):
            if s[key] is not None:
                yield f'{esc(label)} <code>{esc(s[key])}</code> '
        if s["accept_length_ceiling"] is not None:
            yield f'accept length ceiling <code>{esc(s["accept_length_ceiling"])}</code>'
        yield "</p>"
        if s["ranks"]:
            critical = [a for a in status["alerts"] if a["server"] == s["server"] and a["severity"] == "critical"]
            yield _rank_table(s["ranks"], now, critical)
            top = _y_top(s, status["thresholds"])
            yield ('<div class="charts">' + "".join(
                _chart(s, r, status, top) for r in s["ranks"]) + "</div>" + _LEGEND.format(step=w["step_seconds"]))
        else:
            yield f'<p class="muted">{esc(_waiting(s))}</p>'


def _waiting(server: dict) -> str:
    """What a server without ranks waits for: the log's first decode line, /metrics' first accept length."""
    n = sum(server["lines"].values())
    url = server["metrics_url"]
    read = f"{n} line{'s' if n > 1 else ''} read, none a decode line" if n else "no line read yet"
    out = [] if url and not n else [f"waiting for the first decode line ({read})"]
    if url:
        out.append(f"waiting for an accept length from {url} (no decoding yet, or speculative decoding off)")
    return "; ".join(out) + "."


def _rank_table(ranks: list[dict], now: float, critical: Sequence[dict] = ()) -> str:
    """The ranks' rows; `critical`: the server's firing critical alerts. A rank is `ok` only
    when none of them is its own or server-wide (DecodeStalled, ServerDown): its state
    names them instead."""
    rows = ["<table><tr><th>rank</th><th>from</th><th>state</th><th>accept length</th><th>accept rate</th>"
            "<th>throughput (token/s)</th><th>running</th><th>queued</th><th>token usage</th>"
            "<th>decode batches</th><th>last decode line</th></tr>"]
    for r in ranks:
        alerting = r["alert_episodes"] and r["alert_episodes"][-1][1] is None
        names = sorted({a["alertname"] for a in critical if not a["rank"] or a["rank"] == r["rank"]})
        state = (_state(False, "collapsed") if r["collapsed"] else _state(False, ", ".join(names)) if names
                 else '<span class="warn">alert firing</span>' if alerting else _state(True, "ok"))
        rows.append(
            f'<tr><td>{esc(r["rank"] or "–")}</td><td>{_source(r)}</td><td>{state}</td>'
            f'<td class="n">{esc(_num(r["accept_length"]))}</td><td class="n">{esc(_num(r["accept_rate"]))}</td>'
            f'<td class="n">{esc(_num(r["gen_throughput"], ".1f"))}</td>'
            f'<td class="n">{esc(_num(r["running_requests"], "d"))}</td><td class="n">{esc(_num(r["queued_requests"], "d"))}</td>'
            f'<td class="n">{esc(_num(r["token_usage"]))}</td><td class="n">{esc(r["decode_batches"])}</td>'
            f'<td>{_when(r["last_decode_at"], now)}</td></tr>')
    rows.append("</table>")
    return "".join(rows)


def _source(rank: dict) -> str:
    if rank["source"] == "log":
        return "log"
    return f'<span title="{esc(rank["url"])}">/metrics</span>'


def _y_top(server: dict, thresholds: dict) -> float:
    """The top of the y axis, one for all ranks of `server` (their charts compare at a glance)."""
    top = max([thresholds["recover_accept_length"] + 0.5, server["accept_length_ceiling"] or 0]
              + [v for r in server["ranks"] for _, v in r["accept_length_history"]])
    return math.ceil(top * 2) / 2  # a multiple of 0.5


def _chart(server: dict, rank: dict, status: dict, top: float) -> str:
    """One rank's accept length over the window, from 1 to `top`: line, collapse threshold,
    collapse episodes and other acceptance alerts shaded."""
    w, th = status["window"], status["thresholds"]
    t0, t1 = w["start"], w["end"]
    y0, y1 = 1.0, top  # accept length is never below 1.0
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    x = lambda t: LEFT + (t - t0) / (t1 - t0) * pw  # noqa: E731
    y = lambda v: TOP + ph - (min(max(v, y0), y1) - y0) / (y1 - y0) * ph  # noqa: E731
    name = " ".join(v for v in (server["server"], rank["rank"]) if v)
    where = "" if rank["source"] == "log" else " from /metrics"
    out = [f'<figure><figcaption>{esc(name)}: accept length{where}, last hour</figcaption>'
           f'<svg class="chart" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           f'role="img" data-server="{esc(server["server"])}" data-rank="{esc(rank["rank"])}">'
           f'<title>{esc(name)}: accept length over the last hour</title>'
           f'<rect class="plot" x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}"/>']
    step = 0.5 if y1 - y0 <= 3 else 1.0
    v = y0
    while v <= y1 + 1e-9:
        out.append(f'<line class="grid" x1="{LEFT}" x2="{LEFT + pw}" y1="{y(v):.1f}" y2="{y(v):.1f}"/>'
                   f'<text x="{LEFT - 4}" y="{y(v) + 3:.1f}" text-anchor="end">{v:g}</text>')
        v += step
    tick = math.ceil(t0 / TICK) * TICK
    while tick <= t1:
        out.append(f'<line class="grid" x1="{x(tick):.1f}" x2="{x(tick):.1f}" y1="{TOP}" y2="{TOP + ph}"/>'
                   f'<text x="{x(tick):.1f}" y="{H - 6}" text-anchor="middle">{esc(time.strftime("%H:%M", time.localtime(tick)))}</text>')
        tick += TICK
    # collapse: shaded full height; the other acceptance alerts: a band along the top (they overlap)
    for cls, what, key, height in (("episode", "collapse", "collapse_episodes", ph),
                                   ("alerting", "acceptance alert", "alert_episodes", BAND)):
        for a, b in rank[key]:
            b = t1 if b is None else min(b, t1)
            out.append(f'<rect class="{cls}" x="{x(a):.1f}" y="{TOP}" width="{max(x(b) - x(a), 2):.1f}" height="{height}">'
                       f'<title>{what} {esc(_clock(a))} to {esc(_clock(b) if b < t1 else "now")}</title></rect>')
    if server["accept_length_ceiling"] is not None and server["accept_length_ceiling"] <= y1:
        c = y(server["accept_length_ceiling"])
        out.append(f'<line class="ceiling" x1="{LEFT}" x2="{LEFT + pw}" y1="{c:.1f}" y2="{c:.1f}"/>')
    r = y(th["recover_accept_length"])
    out.append(f'<line class="recover" x1="{LEFT}" x2="{LEFT + pw}" y1="{r:.1f}" y2="{r:.1f}"/>')
    c = y(th["collapse_accept_length"])
    out.append(f'<line class="threshold" x1="{LEFT}" x2="{LEFT + pw}" y1="{c:.1f}" y2="{c:.1f}"/>'
               f'<text class="threshold-label" x="{LEFT + pw - 2}" y="{c - 3:.1f}" text-anchor="end">'
               f'collapse ≤ {th["collapse_accept_length"]:.2f}</text>')
    if not rank["accept_length_history"]:
        out.append(f'<text x="{LEFT + pw / 2:.0f}" y="{TOP + ph / 2:.0f}" text-anchor="middle">'
                   "no decode line with an accept length in this hour</text>")
    for seg in _segments(rank["accept_length_history"]):
        pts = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in seg)
        if len(seg) == 1:
            out.append(f'<circle class="dot" cx="{x(seg[0][0]):.1f}" cy="{y(seg[0][1]):.1f}" r="2"/>')
        else:
            out.append(f'<polyline class="line" points="{pts}"/>')
    out.append("</svg></figure>")
    return "".join(out)


def _segments(points: list[list[float]]) -> list[list[list[float]]]:
    """Points split where more than GAP seconds have no point."""
    segs: list[list[list[float]]] = []
    for p in points:
        if not segs or p[0] - segs[-1][-1][0] > GAP:
            segs.append([])
        segs[-1].append(p)
    return segs


def _sources(sources: list[dict], now: float) -> Iterator[str]:
    if not sources:
        yield '<p class="muted">None configured.</p>'
    else:
        yield "<table><tr><th>kind</th><th>name</th><th>server</th><th>health</th><th>last line</th><th>counters</th></tr>"
        for s in sources:
            counters = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in (s.get("counters") or {}).items() if v)
            yield (f'<tr><td>{esc(s.get("kind", ""))}</td><td><code>{esc(s.get("name", ""))}</code></td>'
                   f'<td>{esc(s.get("server") or "")}</td><td>{_state(s.get("ok"), s.get("state") or "")}</td>'
                   f'<td>{_when(s.get("last_line_at"), now)}</td><td class="muted">{esc(counters)}</td></tr>')
        yield "</table>"


def _gpus(g: dict, now: float) -> Iterator[str]:
    if not g["enabled"]:
        yield '<p class="muted">GPU sampling is off (gpu.enabled: false).</p>'
    elif g["up"] is None:
        yield '<p class="muted">No NVML sample yet.</p>'
    elif not g["up"]:
        why = f'{esc(g["error"])}; ' if g.get("error") else ""
        yield f'<p class="bad">NVML unavailable ({why}last try {_when(g["sampled_at"], now)}).</p>'
    if g["devices"]:
        if g["driver"]:
            yield f'<p class="muted">driver {esc(g["driver"])}, sampled {_when(g["sampled_at"], now)}</p>'
        yield ("<table><tr><th>GPU</th><th>name</th><th>utilization</th><th>memory used</th>"
               "<th>temperature</th><th>power</th><th>clock reasons</th><th>XIDs</th></tr>")
        for d in g["devices"]:
            mem = ("–" if d["memory_used_bytes"] is None else
                   f'{d["memory_used_bytes"] / 2**30:.1f}' + ("" if not d["memory_total_bytes"] else f' / {d["memory_total_bytes"] / 2**30:.1f}') + " GiB")
            util = None if d["utilization_ratio"] is None else d["utilization_ratio"] * 100
            yield (f'<tr><td>{esc(d["index"])}{"" if d["up"] else " " + _state(False, "failing")}</td>'
                   f'<td>{esc(d["name"])}</td><td class="n">{esc(_num(util, ".0f", " %"))}</td>'
                   f'<td class="n">{esc(mem)}</td><td class="n">{esc(_num(d["temperature_celsius"], ".0f", " °C"))}</td>'
                   f'<td class="n">{esc(_num(d["power_watts"], ".0f", " W"))}</td>'
                   f'<td>{esc(", ".join(d["clock_reasons"]) or "–")}</td>'
                   f'<td class="n">{_state(not d["xids"], str(d["xids"])) if d["xids"] else "0"}</td></tr>')
        yield "</table>"
