"""The status page's data without a daemon: the per-rank accept-length history the real pipeline
keeps, and `StatusView.snapshot` over it (log clock, as `specwatch replay` feeds it)."""

from __future__ import annotations

import json

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
