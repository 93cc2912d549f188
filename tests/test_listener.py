"""The HTTP listener of a live `specwatch run` (real daemon, real log, real HTTP): metrics only at
/metrics, HEAD, /-/healthy and /-/ready as Prometheus answers them, `specwatch_alerts` like
Prometheus' ALERTS (and scraped by a real Prometheus)."""

from __future__ import annotations

import gzip
import http.client
import socket
import time
import urllib.error
import urllib.request

import prom
from procs import SAMPLES, decode_line, rank_labels, scrape, wait_for
from specwatch_daemon import SpecwatchDaemon


def request(port: int, method: str, path: str) -> tuple[int, dict, bytes]:
    """(status, headers, body) of one request on its own connection."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request(method, path)
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def alerts(port: int) -> dict[tuple, float]:
    """The specwatch_alerts series: {sorted label pairs: value}."""
    return {labels: v for (name, labels), v in scrape(port).items() if name == "specwatch_alerts"}


def test_metrics_only_at_metrics_head_and_health(tmp_path):
    log = tmp_path / "sglang.log"
    log.write_text(decode_line(2.5, "10:00:00"))
    d = SpecwatchDaemon(tmp_path, log)
    d.start()
    try:
        wait_for(lambda: d.scrape().get(("specwatch_decode_batches_total", rank_labels())) == 1,
                 what="the decode line in /metrics")
        status, headers, body = request(d.port, "GET", "/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert b"\nspecwatch_log_lines_total{kind=\"decode\",server=\"gpu-box-1\"} 1.0\n" in body
        assert int(headers["Content-Length"]) == len(body)

        # HEAD: a GET's status and headers, no body
        status, headers, body = request(d.port, "HEAD", "/metrics")
        assert (status, body) == (200, b"") and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert int(headers["Content-Length"]) > 1000
        status, headers, body = request(d.port, "HEAD", "/")
        assert (status, body) == (200, b"") and headers["Content-Type"].startswith("text/html")
        assert request(d.port, "HEAD", "/-/healthy")[0] == 200
        assert request(d.port, "HEAD", "/nothing-here")[0] == 404

        assert request(d.port, "GET", "/-/healthy")[::2] == (200, b"specwatch is Healthy.\n")
        assert request(d.port, "GET", "/-/ready")[::2] == (200, b"specwatch is Ready.\n")
        # every other path: Prometheus' 404, not the metrics
        for path in ("/metrics/", "/metricsx", "/favicon.ico", "/federate", "/-/unknown", "/api/v1/query"):
            assert request(d.port, "GET", path)[::2] == (404, b"404 page not found\n"), path
        status, headers, body = request(d.port, "POST", "/metrics")
        assert status == 405 and headers["Allow"] == "GET, HEAD" and b"POST" in body
        # connections that send nothing hold a worker each, not the listener: a scrape still answers
        stalled = [socket.create_connection(("127.0.0.1", d.port)) for _ in range(2)]
        try:
            t0 = time.monotonic()
            assert request(d.port, "GET", "/metrics")[0] == 200 and time.monotonic() - t0 < 5
        finally:
            for c in stalled:
                c.close()
        # the status page and its JSON stay where they were
        assert request(d.port, "GET", "/")[0] == 200 and request(d.port, "GET", "/api/status")[0] == 200
        # Prometheus' gzip scrape
        req = urllib.request.Request(f"http://127.0.0.1:{d.port}/metrics", headers={
            "Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
            "Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.headers["Content-Encoding"] == "gzip"
            assert r.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
            text = gzip.decompress(r.read())
        assert text.endswith(b"# EOF\n") and b"specwatch_log_lines_total{kind=\"decode\",server=\"gpu-box-1\"} 1.0\n" in text
    finally:
        rc, out = d.stop()
    assert rc == 0, out


def test_ready_only_once_the_start_up_backlog_is_read(tmp_path):
    """503 with the reason while the backlog is read, 200 after, and then every line is counted."""
    log = tmp_path / "sglang.log"
    seconds = 25_000  # 8 ranks a second: 200,000 lines, seconds of reading
    with open(log, "w") as f:
        for t in range(seconds):
            clock = f"{t // 3600:02d}:{t // 60 % 60:02d}:{t % 60:02d}"
            f.write("".join(decode_line(2.5, clock, rank=f"DP{r} TP{r}") for r in range(8)))
    d = SpecwatchDaemon(tmp_path, log)
    d.start(wait=False)
    try:
        # logged once the listener holds the port and the followers' thread has started reading
        wait_for(lambda: f"metrics on http://127.0.0.1:{d.port}/metrics" in d.output or d.proc.poll() is not None,
                 timeout=60, interval=0.01, what="the start-up line")
        assert d.proc.poll() is None, d.output
        answers = []

        def ready():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{d.port}/-/ready", timeout=10) as r:
                    answers.append((r.status, r.read()))
                    return True
            except urllib.error.HTTPError as e:
                answers.append((e.code, e.read()))
            return False

        wait_for(ready, timeout=180, interval=0.01, what="/-/ready 200")
        assert answers[0] == (503, b"specwatch is not ready: reading the start-up backlog of the logs\n"), answers[:3]
        assert answers[-1] == (200, b"specwatch is Ready.\n")
        # ready means read: every line is counted by then
        lines = scrape(d.port)[("specwatch_log_lines_total", (("kind", "decode"), ("server", "gpu-box-1")))]
        assert lines == 8 * seconds
        assert request(d.port, "GET", "/-/healthy")[0] == 200
    finally:
        rc, out = d.stop()
    assert rc == 0, out


def test_alerts_series_while_an_alert_fires(tmp_path, prometheus):
    """One series per firing alert, value 1, with ALERTS' labels; gone once it resolves, in
    specwatch's /metrics and in a real Prometheus that scrapes it."""
    log = tmp_path / "sglang.log"
    log.write_text(decode_line(2.9, "16:32:00"))
    d = SpecwatchDaemon(tmp_path, log)
    d.start()
    p = prometheus([prom.static_job("specwatch", [f"127.0.0.1:{d.port}"])])
    try:
        wait_for(lambda: scrape(d.port).get(("specwatch_log_lines_total", (("kind", "decode"), ("server", "gpu-box-1")))) == 1,
                 what="the first line")
        assert alerts(d.port) == {}
        p.wait_query('up{job="specwatch"} == 1', timeout=30)
        with open(log, "a") as f:  # a real collapse (accept len 1.0x on TP0)
            f.write((SAMPLES / "kimi-k25-eagle3-collapse.log").read_text())
            f.write(decode_line(1.04, "16:32:46"))
        firing = wait_for(lambda: alerts(d.port), timeout=30, what="specwatch_alerts of the collapse")
        assert firing == {(("alertname", "AcceptanceCollapse"), ("alertstate", "firing"), ("rank", "TP0"),
                           ("server", "gpu-box-1"), ("severity", "critical")): 1.0}
        assert scrape(d.port)[("specwatch_alerts_firing", (("alertname", "AcceptanceCollapse"),))] == 1
        [series] = p.wait_query('specwatch_alerts{alertstate="firing"}', timeout=30)
        assert series["value"] == 1 and series["metric"] == {
            "__name__": "specwatch_alerts", "alertname": "AcceptanceCollapse", "alertstate": "firing",
            "rank": "TP0", "server": "gpu-box-1", "severity": "critical", "job": "specwatch",
            "instance": f"127.0.0.1:{d.port}"}

        with open(log, "a") as f:  # recovery: three healthy batches resolve it
            f.writelines(decode_line(2.9, f"16:33:0{i}") for i in range(3))
        wait_for(lambda: alerts(d.port) == {}, timeout=30, what="specwatch_alerts empty after the resolve")
        assert scrape(d.port)[("specwatch_alerts_firing", (("alertname", "AcceptanceCollapse"),))] == 0
        # a series missing from a scrape is stale in Prometheus at once: the query is empty
        p.wait_query("specwatch_alerts", pred=lambda r: r == [], timeout=30)
        assert p.query('up{job="specwatch"}')[0]["value"] == 1
    finally:
        rc, out = d.stop()
    assert rc == 0, out
