"""The status page's data without a daemon: the per-rank accept-length history the real pipeline
keeps, and `StatusView.snapshot` over it (log clock, as `specwatch replay` feeds it)."""

from __future__ import annotations

import json
import re

from specwatch.status.history import POINTS, STEP
from specwatch.status.page import render
from specwatch.status.view import StatusView
from timeline import T0, Timeline, feed, pipeline


def test_history_is_one_mean_per_step_and_bounded_to_the_hour():
    log = Timeline().decode(n=3 * 3600 // 4, every=4, accept=lambda i: 2.0 + (i % 5) / 10)  # 3 h, a line per 4 s
    p = pipeline({"diagnosis": {"enabled": False}})
    feed(p, log.lines)
    (rs,) = p.ranks.values()
    points = list(rs.history.points)
    gaps = {b[0] - a[0] for a, b in zip(points, points[1:])}
    assert gaps == {12.0}  # the first line at or after STEP s from the last point (lines every 4 s)
    assert len(points) == POINTS  # bounded: points are >= STEP s apart, so they cover at least the hour
    # line k at T0 + 4 (k + 1): points at lines 0, 3, 6, ..., 2697; lines 2698 and 2699 are pending
    assert points[-1][0] == T0 + 4 * 2698 and points[0][0] == points[-1][0] - (POINTS - 1) * 12
    # each point the mean of the 3 lines since the previous one: accept lengths 2.0-2.4 in turn
    lines = [2.0 + (i % 5) / 10 for i in range(3 * 3600 // 4)]
    assert [round(v, 9) for _, v, _ in points[-3:]] == [round(sum(lines[k - 2:k + 1]) / 3, 9)
                                                       for k in (2691, 2694, 2697)]
    assert round(rs.history.pending(rs.accept_length_sum, rs.accept_length_count), 9) == round((lines[-2] + lines[-1]) / 2, 9)
    assert not any(c for _, _, c in points)


def test_snapshot_of_a_replayed_collapse_and_restart():
    """An old log (log clock): the window is the hour up to its newest line; an episode that a
    restart resolved is closed, the one after it is open and starts at its alert's start."""
    log = (Timeline().decode(n=60, every=5, accept=2.9)
           .decode(n=30, every=5, accept=1.0)
           .server_args()  # a restart resolves the collapse
           .decode(n=30, every=5, accept=2.7)
           .decode(n=10, every=5, accept=1.02))
    p = pipeline({"diagnosis": {"enabled": False}})
    feed(p, log.lines)
    s = StatusView(p).snapshot(now=T0 + 86400)  # a day later
    last = T0 + 5 * 130
    assert s["window"] == {"start": last - 3600, "end": last, "step_seconds": STEP, "clock": "log"}
    (server,) = s["servers"]
    (r,) = server["ranks"]
    assert r["collapsed"] and r["accept_length"] == 1.02 and r["last_decode_at"] == last
    (a,) = [a for a in s["alerts"] if a["alertname"] == "AcceptanceCollapse"]
    assert a["starts_at"] == T0 + 605  # the first of the last low lines
    # Points every 10 s (lines at T0+5, +10, ...: every other line), the last line as the live tail.
    assert len(r["accept_length_history"]) == 65 + 1
    # The first episode from the point after its third low line (T0+315: it fired) to the first
    # point after the restart at T0+450; the open one from its alert's start.
    assert r["collapse_episodes"] == [[T0 + 315, T0 + 455], [T0 + 605, None]]
    json.dumps(s, allow_nan=False)  # what /api/status sends


def test_page_escapes_every_value_and_links_nowhere_else():
    hostile = "<script>x()</script>&\"'"
    log = Timeline(model_path=hostile, speculative_draft_model_path=hostile).decode(n=5, every=5, accept=1.0)
    p = pipeline({"diagnosis": {"enabled": False}, "server": hostile})
    feed(p, log.lines)
    s = StatusView(p, sources=lambda: [type("Journal", (), {"source_status": lambda self: {
        "kind": "journal", "name": hostile, "server": hostile, "ok": False, "state": hostile,
        "last_line_at": None, "counters": {"lost": 3}}})()]).snapshot(now=T0)
    page = render(s)
    assert "<script" not in page and "x()</script>" not in page
    assert page.count("&lt;script&gt;x()&lt;/script&gt;&amp;&quot;&#x27;") >= 5  # server, model, draft, source, alert
    assert "journal" in page and "lost 3" in page
    assert "http://" not in page and "https://" not in page


def test_gpus_from_the_nvml_sampler():
    """The sampler behind NVML's interface (tests/fake_pynvml.py: no GPU here) → the GPUs section."""
    from fake_pynvml import FakeDevice, FakeNvml
    from specwatch.sources.nvml import GpuSampler

    dev = FakeDevice("GPU-1", "00000000:18:00.0", name="NVIDIA H200 <b>", gpu_util_percent=87,
                     memory_used_bytes=120 * 2**30, temperature_c=71, power_mw=650_000)
    sampler = GpuSampler(FakeNvml([dev]), init_retry_min=0.0)
    try:
        assert sampler.sample_once()
        p = pipeline({"diagnosis": {"enabled": False}})
        s = StatusView(p, gpu=lambda: sampler, gpu_enabled=lambda: True).snapshot(now=T0)
    finally:
        sampler.stop(timeout=3.0)
    g = s["gpus"]
    assert (g["enabled"], g["up"]) == (True, True)
    (d,) = g["devices"]
    assert (d["index"], d["name"], d["utilization_ratio"], d["memory_used_bytes"], d["temperature_celsius"],
            d["power_watts"], d["xids"]) == ("0", "NVIDIA H200 <b>", 0.87, 120 * 2**30, 71, 650, 0)
    page = render(s)
    assert "NVIDIA H200 &lt;b&gt;" in page and "87 %" in page and "120.0 / 140.4 GiB" in page
    assert "71 °C" in page and "650 W" in page


def test_a_rank_without_accept_length_gets_an_empty_chart_that_says_so():
    log = Timeline(spec=False)
    log.lines.append("[2026-03-01 10:00:02 TP0] Decode batch, #running-req: 9, #token: 1200, token usage: 0.01, "
                     "cuda graph: True, gen throughput (token/s): 80.00, #queue-req: 0")
    p = pipeline({"diagnosis": {"enabled": False}})
    feed(p, log.lines)
    s = StatusView(p).snapshot(now=T0)
    (r,) = s["servers"][0]["ranks"]
    assert (r["accept_length"], r["gen_throughput"], r["accept_length_history"]) == (None, 80.0, [])
    page = render(s)
    assert "no decode line with an accept length in this hour" in page and "<polyline" not in page


URL = "http://127.0.0.1:30000/metrics"


def test_ranks_read_only_from_metrics_are_charted_and_no_phantom_server():
    """Only `server_metrics` (no log, no top-level `server:`): the scraped ranks get the table,
    chart, state and episodes (marked as read from /metrics); GPU samples, which carry the default
    server name (the host's), add no server; the alert keeps its `read from` line as it updates."""
    from specwatch.alerts.dispatcher import Dispatcher
    from specwatch.config import build_config
    from specwatch.core.events import GpuSample, MetricsSample, RankMetrics
    from specwatch.core.pipeline import Pipeline

    cfg = build_config({"server_metrics": [{"url": URL, "server": "sglang-a"}], "diagnosis": {"enabled": False},
                        "rules": {"collapse": {"min_batches": 2}}})
    p = Pipeline(cfg, Dispatcher([], group_wait=0, group_interval=0, keep_history=True))
    for i in range(12):  # a scrape every 5 s; DP1 collapses from the fifth
        t = T0 + 5 * i
        ranks = (RankMetrics("DP0", {"DP": 0}, 2.9, 0.6, running_requests=20),
                 RankMetrics("DP1", {"DP": 1}, 2.5 if i < 4 else 1.0, running_requests=20, gen_throughput=100.0 + i))
        p.feed_event("sglang-a", MetricsSample(t, URL, "sglang", ranks=ranks), t)
        p.feed_event(cfg.server, GpuSample(t, False, None), t)
    s = StatusView(p).snapshot(now=T0 + 60)
    assert [x["server"] for x in s["servers"]] == ["sglang-a"]
    (server,) = s["servers"]
    assert server["metrics_url"] == URL
    dp0, dp1 = server["ranks"]
    assert [(r["rank"], r["source"], r["url"]) for r in (dp0, dp1)] == [("DP0", "server_metrics", URL),
                                                                        ("DP1", "server_metrics", URL)]
    assert (dp0["accept_length"], dp0["accept_rate"], dp0["collapsed"], dp0["decode_batches"]) == (2.9, 0.6, False, 12)
    assert (dp1["accept_length"], dp1["gen_throughput"], dp1["running_requests"], dp1["collapsed"]) == (1.0, 111.0, 20, True)
    # a point per 10 s, each the mean of the scrapes since the previous one; the last scrape as the tail
    assert dp1["accept_length_history"] == [[T0, 2.5], [T0 + 10, 2.5], [T0 + 20, 1.75], [T0 + 30, 1.0],
                                            [T0 + 40, 1.0], [T0 + 50, 1.0], [T0 + 55, 1.0]]
    assert dp1["collapse_episodes"] == [[T0 + 20, None]] and dp0["collapse_episodes"] == []
    (alert,) = [a for a in s["alerts"] if a["alertname"] == "AcceptanceCollapse"]
    assert (alert["rank"], alert["starts_at"]) == ("DP1", T0 + 20)
    ev = dict(alert["evidence"])
    assert ev["read from"].startswith(f"{URL} (sglang): no decode line from a log")
    assert ev["gen throughput (token/s)"] == "111.00"  # updated by the last scrape, the source line kept
    page = render(s)
    assert "sglang-a DP1: accept length from /metrics, last hour" in page
    assert f'<span title="{URL}">/metrics</span>' in page


def test_a_log_rank_hides_the_same_rank_read_from_metrics():
    from specwatch.core.events import MetricsSample, RankMetrics

    p = pipeline({"diagnosis": {"enabled": False}, "server_metrics": [{"url": URL, "server": "box"}]})
    feed(p, Timeline().decode(n=3, every=5, ranks=[{"TP": 0}]).lines)
    sample = lambda t: MetricsSample(t, URL, "sglang", ranks=(RankMetrics("", {}, 2.8, running_requests=9),))  # noqa: E731
    p.feed_event("box", sample(T0 + 20), T0 + 20)
    (server,) = StatusView(p).snapshot(now=T0)["servers"]
    assert [(r["rank"], r["source"]) for r in server["ranks"]] == [("TP0", "log")]
    # the log falls silent for longer than windows.max_gap: /metrics judges, its rank is listed too
    p.feed_event("box", sample(T0 + 200), T0 + 200)
    (server,) = StatusView(p).snapshot(now=T0)["servers"]
    assert [(r["rank"], r["source"]) for r in server["ranks"]] == [("TP0", "log"), ("", "server_metrics")]


def test_server_settings_come_back_after_a_restart_of_specwatch():
    """The followed log is not read again after a restart: the settings come from the state the
    collapse rule saved (which the alerts already use)."""
    log = Timeline(model_path="/models/target", speculative_draft_model_path="/models/draft").decode(n=3, every=5)
    p = pipeline({"diagnosis": {"enabled": False}})
    feed(p, log.lines)
    before = StatusView(p).snapshot(now=T0)["servers"][0]
    assert (before["algorithm"], before["model"], before["draft_model"], before["accept_length_ceiling"]) == (
        "EAGLE3", "/models/target", "/models/draft", 4)
    state = json.loads(json.dumps(p.to_state()))  # as the state store keeps it
    again = pipeline({"diagnosis": {"enabled": False}})
    again.load_state(state)
    after = StatusView(again).snapshot(now=T0)["servers"][0]
    assert {k: after[k] for k in ("server", "algorithm", "model", "draft_model", "accept_length_ceiling")} == {
        k: before[k] for k in ("server", "algorithm", "model", "draft_model", "accept_length_ceiling")}


def _y_labels(page: str) -> dict[str, list[str]]:
    """Each chart's y-axis labels by its data-rank."""
    out = {}
    for rank, body in re.findall(r'<svg class="chart"[^>]*data-rank="([^"]*)"[^>]*>(.*?)</svg>', page):
        out[rank] = re.findall(r'text-anchor="end">([0-9.]+)</text>', body)
    return out


def test_the_ranks_of_a_server_share_one_y_scale():
    log = Timeline(spec=None)  # no server_args: no ceiling to set the scale
    for _ in range(6):
        log.decode(every=5, accept=3.4, ranks=[{"TP": 0}])
        log.decode(every=0, accept=1.3, ranks=[{"TP": 1}])
    p = pipeline({"diagnosis": {"enabled": False}})
    feed(p, log.lines)
    labels = _y_labels(render(StatusView(p).snapshot(now=T0 + 86400)))
    assert set(labels) == {"TP0", "TP1"}
    assert labels["TP0"] == labels["TP1"] == ["1", "1.5", "2", "2.5", "3", "3.5"]


def test_a_configured_server_without_a_decode_line_says_what_it_waits_for():
    from specwatch.config import build_config
    from specwatch.alerts.dispatcher import Dispatcher
    from specwatch.core.pipeline import Pipeline

    p = pipeline({"diagnosis": {"enabled": False}})
    feed(p, Timeline().lines + ["plain line one", "plain line two"])
    (server,) = StatusView(p).snapshot(now=T0)["servers"]
    assert (server["server"], server["ranks"], server["lines"]["other"]) == ("box", [], 3)
    assert "waiting for the first decode line (3 lines read, none a decode line)." in render(StatusView(p).snapshot(now=T0))
    # nothing read yet: the configured servers are listed all the same
    cfg = build_config({"logs": [{"path": "a.log", "server": "a"}], "server_metrics": [{"url": URL, "server": "b"}],
                        "diagnosis": {"enabled": False}})
    s = StatusView(Pipeline(cfg, Dispatcher([]))).snapshot(now=T0)
    assert [(x["server"], x["ranks"]) for x in s["servers"]] == [("a", []), ("b", [])]
    page = render(s)
    assert "waiting for the first decode line (no line read yet)." in page


def test_gpus_unavailable_says_why():
    from pynvml import NVML_ERROR_LIBRARY_NOT_FOUND

    from fake_pynvml import FakeNvml
    from specwatch.sources.nvml import GpuSampler

    sampler = GpuSampler(FakeNvml([], init_error=NVML_ERROR_LIBRARY_NOT_FOUND), init_retry_min=0.0)
    try:
        sampler.sample_once()
        s = StatusView(pipeline({"diagnosis": {"enabled": False}}), gpu=lambda: sampler,
                       gpu_enabled=lambda: True).snapshot(now=T0)
    finally:
        sampler.stop(timeout=3.0)
    assert (s["gpus"]["up"], s["gpus"]["error"]) == (False, "library_not_found")
    assert "NVML unavailable (library_not_found; last try" in render(s)


def test_other_acceptance_alerts_are_shaded_apart_from_the_collapse():
    """AcceptanceDegradation twice on one rank (over, then firing) and RankDisagreement on a
    collapsed rank: their episodes come apart from the collapse's and are drawn in their own colour."""
    import random

    rnd = random.Random(7)
    noisy = lambda level: lambda i: round(level + rnd.uniform(-0.08, 0.08), 2)  # noqa: E731
    log = Timeline(model_path="/models/Kimi-K2.5")
    for level, n in ((3.0, 150), (2.2, 300), (3.0, 150), (2.2, 200)):
        log.decode(n=n, every=2, accept=noisy(level))
    p = pipeline({"diagnosis": {"enabled": False}, "rules": {"degradation": {
        "window": "2m", "for": "2m", "expected": [{"model": "Kimi-K2.5", "accept_length": 3.0}]}}})
    t = [a for a in feed(p, log.lines) if a.name == "AcceptanceDegradation"]
    assert [a.status for a in t] == ["firing", "resolved", "firing"]
    s = StatusView(p).snapshot(now=T0 + 86400)
    (r,) = s["servers"][0]["ranks"]
    (first, second) = r["alert_episodes"]
    assert t[1].ends_at <= first[1] <= t[1].ends_at + 10 and t[0].starts_at <= first[0] < first[1]
    assert second == [t[2].starts_at, None]
    assert r["collapse_episodes"] == [] and not r["collapsed"]
    page = render(s)
    assert page.count('<rect class="alerting"') == 2 and '<rect class="episode"' not in page
    assert "alert firing" in page and "orange band" in page

    log = Timeline()
    for a0 in (2.9,) * 5 + (1.02,) * 6:
        log.decode(every=5, accept=a0, ranks=[{"DP": 0}])
        log.decode(every=0, accept=2.8, ranks=[{"DP": 1}])
    p = pipeline({"diagnosis": {"enabled": False}})
    feed(p, log.lines)
    dp0 = StatusView(p).snapshot(now=T0)["servers"][0]["ranks"][0]
    (disagreement,) = [a for a in p.dispatcher.alerts.values() if a.name == "RankDisagreement"]
    assert dp0["rank"] == "DP0" and dp0["collapsed"]
    assert dp0["alert_episodes"] == [[disagreement.starts_at, None]] and len(dp0["collapse_episodes"]) == 1
