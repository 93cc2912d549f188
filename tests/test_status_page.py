"""The status page at `/` and `/api/status` of a live `specwatch run` (real daemon, real log
file, real HTTP), and the page in headless Chromium."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from html.parser import HTMLParser

import pytest

import chromium
from procs import decode_line, wait_for
from specwatch_daemon import SpecwatchDaemon
from status_log import HOSTILE_DRAFT, HOSTILE_MODEL, args_line, episode_log, stamp


def get(port: int, path: str) -> tuple[dict, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return dict(r.headers), r.read()


def status(port: int) -> dict:
    return json.loads(get(port, "/api/status")[1])


def test_api_status_values(tmp_path):
    """Points are one per 10 s of log time, each the mean of the lines since the previous one;
    the rank that collapsed has its episode from the alert's start; thresholds from the config."""
    log = tmp_path / "sglang.log"
    t0 = int(time.time()) - 120
    lines = [args_line(t0 - 5, model_path="/models/target", speculative_draft_model_path="/models/draft")]
    for dt, (a0, a1) in enumerate([(3.0, 1.02), (2.0, 1.04), (1.0, 1.0), (2.5, 1.06)]):
        day, clock = stamp(t0 + 5 * dt)
        lines += [decode_line(a0, clock, rank="TP0", day=day, running=10 + dt),
                  decode_line(a1, clock, rank="TP1", day=day, thr=120.0)]
    log.write_text("".join(lines))
    started = time.time()
    d = SpecwatchDaemon(tmp_path, log, rules={"collapse": {"max_accept_length": 1.2, "recover_accept_length": 1.6}})
    d.start()
    try:
        s = wait_for(lambda: (x := status(d.port)) and [v for v in x["servers"] if v["lines"].get("decode") == 8] and x,
                     what="the log read, in /api/status")
    finally:
        d.stop()
    assert s["thresholds"] == {"collapse_accept_length": 1.2, "recover_accept_length": 1.6}
    assert s["window"]["clock"] == "wall" and s["window"]["end"] - s["window"]["start"] == 3600
    # the process scan may find other SGLang servers on this machine: only ours is asserted
    (server,) = [x for x in s["servers"] if x["server"] == "gpu-box-1"]
    assert (server["server"], server["model"], server["draft_model"], server["algorithm"]) == (
        "gpu-box-1", "/models/target", "/models/draft", "EAGLE3")
    assert server["accept_length_ceiling"] == 4  # speculative_num_steps 3 + 1
    assert server["lines"] == {"decode": 8, "prefill": 0, "other": 1, "malformed": 0, "unrecognized": 0}
    tp0, tp1 = server["ranks"]
    assert tp0["rank"] == "TP0" and tp1["rank"] == "TP1"
    # TP0: 3.0 at t0; at t0+10 the mean of 2.0 and 1.0; the line at t0+15 is the live tail.
    assert tp0["accept_length_history"] == [[t0, 3.0], [t0 + 10, 1.5], [t0 + 15, 2.5]]
    assert (tp0["accept_length"], tp0["running_requests"], tp0["queued_requests"], tp0["decode_batches"]) == (2.5, 13, 0, 4)
    assert (tp0["collapsed"], tp0["collapse_episodes"], tp0["last_decode_at"]) == (False, [], t0 + 15)
    assert tp1["accept_length_history"] == [[t0, 1.02], [t0 + 10, 1.02], [t0 + 15, 1.06]]
    assert (tp1["collapsed"], tp1["gen_throughput"], tp1["accept_rate"]) == (True, 120.0, 0.21)
    assert tp1["collapse_episodes"] == [[t0, None]]  # from the first low line (the alert's start)
    collapse = [a for a in s["alerts"] if a["alertname"] == "AcceptanceCollapse"]
    assert [(a["server"], a["rank"], a["severity"], a["starts_at"]) for a in collapse] == [
        ("gpu-box-1", "TP1", "critical", t0)]
    assert ["accept len", "1.06"] in collapse[0]["evidence"] and collapse[0]["fixes"]
    (src,) = [x for x in s["sources"] if x["kind"] == "file"]
    assert [x["kind"] for x in s["sources"]] == ["file", "process"]  # followers first, then the /proc scan
    assert (src["kind"], src["name"], src["server"], src["ok"], src["state"]) == ("file", str(log), "gpu-box-1", True, "open")
    assert src["counters"]["lines"] == 9 and started <= src["last_line_at"] <= time.time()
    assert s["gpus"] == {"enabled": False, "up": None, "error": None, "sampled_at": None, "driver": None, "devices": []}


class Dom(HTMLParser):
    """Elements of a page: every (tag, attrs), the text, and per chart (svg data-rank) its
    polyline coordinates, dots, episode rectangles and threshold lines."""

    def __init__(self, text: str):
        super().__init__()
        self.elements: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.charts: dict[str, dict] = {}
        self._chart = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.elements.append((tag, a))
        if tag == "svg" and "chart" in a.get("class", ""):
            self._chart = self.charts.setdefault(a["data-rank"], {"points": 0, "episodes": 0, "threshold": 0})
        elif self._chart is not None:
            cls = a.get("class", "")
            if tag == "polyline":
                self._chart["points"] += len(a["points"].split())
            elif tag == "circle" and cls == "dot":
                self._chart["points"] += 1
            elif tag == "rect" and cls == "episode":
                self._chart["episodes"] += 1
            elif tag == "line" and cls == "threshold":
                self._chart["threshold"] += 1

    def handle_endtag(self, tag):
        if tag == "svg":
            self._chart = None

    def handle_data(self, data):
        self.text.append(data)


URL_ATTRS = {"src", "href", "srcset", "action", "formaction", "poster", "data", "xlink:href", "background", "ping"}


def external_urls(dom: Dom, raw: str) -> list[str]:
    """URLs that would make a browser reach another host: absolute or protocol-relative URL
    attributes, and `url(...)` / `@import` in styles."""
    found = [v for _, a in dom.elements for k, v in a.items()
             if k in URL_ATTRS and v and re.match(r"\s*([a-z][a-z0-9+.-]*:|//)", v, re.I)]
    return found + re.findall(r"url\s*\(|@import", raw, re.I)


@pytest.mark.skipif(chromium.BINARY is None, reason="chromium not installed (.ci/run installs it)")
def test_status_page_in_headless_chromium(tmp_path):
    """A live daemon fed two collapses on TP1 (one over, one firing) and one on TP0: the page
    renders, each rank's chart has all its points and shaded episodes, the alert is listed, the
    page reaches no other host and markup in model paths is text."""
    from PIL import Image

    log = tmp_path / "sglang.log"
    episode_log(log, end=time.time(), ranks={"TP0": [(600, 780)], "TP1": [(600, 900), (1500, 1800)]})
    d = SpecwatchDaemon(tmp_path, log, extra={"process": {"enabled": False}})  # only this server
    d.start()
    try:
        s = wait_for(lambda: (x := status(d.port))["servers"] and x["servers"][0]["lines"].get("decode") == 720
                     and x["alerts"] and x, what="the log read and the alert firing")
        headers, raw = get(d.port, "/")
        raw = raw.decode()
        dom = Dom(chromium.dump_dom(f"http://127.0.0.1:{d.port}/"))
        png = chromium.screenshot(f"http://127.0.0.1:{d.port}/", tmp_path / "status.png")
    finally:
        d.stop()

    ranks = {r["rank"]: r for r in s["servers"][0]["ranks"]}
    assert set(ranks) == {"TP0", "TP1"} == set(dom.charts)
    for name, r in ranks.items():
        assert len(r["accept_length_history"]) >= 170  # 30 min at one point per 10 s
        assert dom.charts[name] == {"points": len(r["accept_length_history"]),
                                    "episodes": len(r["collapse_episodes"]), "threshold": 1}, name
    assert [len(ranks["TP0"]["collapse_episodes"]), len(ranks["TP1"]["collapse_episodes"])] == [1, 2]
    assert ranks["TP1"]["collapse_episodes"][-1][1] is None  # still firing

    text = " ".join(" ".join(dom.text).split())
    assert "AcceptanceCollapse critical · gpu-box-1 TP1" in text
    assert "Speculative decoding collapsed on gpu-box-1 TP1: accept len 1.02" in text
    # Hostile paths: shown as text, never parsed as markup or run.
    assert HOSTILE_MODEL in text and HOSTILE_DRAFT in text
    assert not [t for t, _ in dom.elements if t in ("script", "img", "iframe", "object", "embed")]
    assert not [a for t, a in dom.elements if t == "body" and "data-pwned" in a]
    assert "pwned" not in re.search(r"<title>(.*?)</title>", raw).group(1)
    assert external_urls(dom, raw) == [] and external_urls(Dom(raw), raw) == []
    assert headers["Content-Security-Policy"].startswith("default-src 'none'")

    im = Image.open(png).convert("RGB")
    assert im.size == (1280, 1600)
    colors = im.getcolors(maxcolors=1 << 20)
    background = max(colors)[0]
    assert len(colors) > 100 and background < 0.97 * im.width * im.height  # not blank
    # The shaded episodes are on screen: #e5484d at 18 % over the plot's #fbfbfd.
    shade = sum(n for n, (r, g, b) in colors if abs(r - 247) <= 4 and abs(g - 219) <= 4 and abs(b - 221) <= 4)
    assert shade > 500


def test_status_of_a_server_read_only_from_its_metrics(tmp_path):
    """Only `server_metrics` and no top-level `server:`, GPU sampling on (NVML samples carry the
    host's name): the page lists the one server, its ranks read from /metrics with their charts,
    the scrape as a source by its URL with its counters, and the alert's `read from` line."""
    import yaml

    from engine_metrics import EngineMetrics
    from procs import SpecwatchProcess, free_port

    eng = EngineMetrics("sglang", dp_size=2)
    port = free_port()
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({
        "server_metrics": [{"url": eng.url, "server": "sglang-a", "interval": "2s", "timeout": "1.9s"}],
        "metrics": {"listen_port": port}, "state_dir": str(tmp_path / "state"),
        "process": {"enabled": False}, "diagnosis": {"enabled": False}, "rules": {"collapse": {"min_batches": 2}}}))
    eng.set_sglang(0, accept_length=2.9, accept_rate=0.5, running=20, throughput=500.0)
    daemon = SpecwatchProcess(cfg, port)
    try:
        daemon.start()
        charted = lambda: (x := status(port))["alerts"] and any(  # noqa: E731
            len(r["accept_length_history"]) >= 2 for v in x["servers"] for r in v["ranks"]) and x
        s = wait_for(eng.collapsing(1, charted), timeout=30, interval=0.5, what="the collapse on /api/status")
        page = get(port, "/")[1].decode()
    finally:
        daemon.stop()
        eng.close()
    assert [x["server"] for x in s["servers"]] == ["sglang-a"]  # not the host's name too
    dp0, dp1 = s["servers"][0]["ranks"]
    assert [(r["rank"], r["source"], r["url"]) for r in (dp0, dp1)] == [("DP0", "server_metrics", eng.url),
                                                                        ("DP1", "server_metrics", eng.url)]
    assert (dp0["accept_length"], dp0["collapsed"], dp1["accept_length"], dp1["collapsed"]) == (2.9, False, 1.0, True)
    assert dp1["collapse_episodes"] == [[s["alerts"][0]["starts_at"], None]]
    (src,) = s["sources"]
    assert (src["kind"], src["name"], src["server"], src["ok"], src["state"]) == (
        "server_metrics", eng.url, "sglang-a", True, "answering (sglang)")
    assert src["counters"]["scrapes"] >= 2 and src["counters"]["errors"] == 0
    assert s["specwatch"]["generated_at"] - 5 <= src["last_line_at"] <= s["specwatch"]["generated_at"]
    assert dict(s["alerts"][0]["evidence"])["read from"].startswith(f"{eng.url} (sglang)")
    dom = Dom(page)
    assert set(dom.charts) == {"DP0", "DP1"} and dom.charts["DP1"]["episodes"] == 1
    assert f"read from</dt><dd><code>{eng.url} (sglang)" in page


def test_a_rank_of_a_server_with_a_firing_critical_alert_is_not_ok(tmp_path):
    """DecodeStalled fires for the server (rank-less, critical): its rank rows name it in red,
    not a green `ok`; the API says the same alert."""
    log = tmp_path / "sglang.log"
    t0 = int(time.time()) - 4
    lines = [args_line(t0 - 1)]
    for dt in range(3):
        day, clock = stamp(t0 + dt)
        lines += [decode_line(2.5, clock, rank="TP0", day=day, running=32)]
    log.write_text("".join(lines))
    d = SpecwatchDaemon(tmp_path, log, rules={"decode_stalled": {"silent_for": "2s"}})
    d.start()
    try:
        wait_for(lambda: any(a["alertname"] == "DecodeStalled" for a in status(d.port)["alerts"]), timeout=30,
                 what="DecodeStalled firing")
        page = get(d.port, "/")[1].decode()
    finally:
        d.stop()
    row = re.search(r"<tr><td>TP0</td>.*?</tr>", page).group(0)
    assert '<span class="bad">DecodeStalled</span>' in row and '<span class="ok">ok</span>' not in row, row
