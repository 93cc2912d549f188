"""sources/server_metrics.py against a real HTTP server on 127.0.0.1 serving /metrics bodies
rendered by prometheus-client in SGLang 0.5.23's and vLLM's shapes (tests/engine_metrics.py)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine_metrics import EngineMetrics  # noqa: E402
from procs import free_port  # noqa: E402
from specwatch.sources.server_metrics import ServerMetricsCollector, ServerMetricsSource, read_families  # noqa: E402


@pytest.fixture
def engines():
    started = []

    def start(engine, **kw):
        started.append(EngineMetrics(engine, **kw))
        return started[-1]

    yield start
    for e in started:
        e.close()


def source(url, **kw):
    got = []
    src = ServerMetricsSource(url, lambda server, event, now: got.append((server, event, now)), server="s", **kw)
    return src, got


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text-colon-names", "openmetrics-underscore-names"])
def test_sglang_gauges_per_dp_rank_in_both_name_styles(engines, openmetrics):
    from importlib.metadata import version

    from packaging.version import Version

    if openmetrics and Version(version("prometheus-client")) < Version("0.23"):
        pytest.skip("the engine double renders with this prometheus-client, which writes colon names in "
                    "OpenMetrics before 0.23; the underscore style needs a newer one (the main test run has it)")
    eng = engines("sglang", openmetrics=openmetrics, dp_size=2)
    eng.set_sglang(0, accept_length=2.75, accept_rate=0.44, running=12, queued=3, throughput=512.5)
    eng.set_sglang(1, accept_length=1.0, accept_rate=0.0, running=9)
    body = eng.body().decode()
    assert ("sglang_spec_accept_length{" in body) is openmetrics and ("sglang:spec_accept_length{" in body) is not openmetrics
    src, got = source(eng.url)
    src.poll(1000.0)
    (server, sample, now), = got
    assert (server, now, sample.engine, sample.error, sample.url) == ("s", 1000.0, "sglang", None, eng.url)
    r0, r1 = sample.ranks
    assert (r0.rank, r0.ranks, r0.accept_length, r0.accept_rate, r0.running_requests, r0.queued_requests,
            r0.gen_throughput, r0.fresh) == ("DP0", {"DP": 0}, 2.75, 0.44, 12, 3, 512.5, True)
    assert (r1.rank, r1.accept_length, r1.accept_rate, r1.running_requests) == ("DP1", 1.0, 0.0, 9)
    # a gauge that did not move is the same decode-log interval: stale, not a second sample
    src.poll(1005.0)
    assert [r.fresh for r in got[1][1].ranks] == [False, False]
    eng.set_sglang(1, accept_length=1.02, accept_rate=0.01, running=9)
    src.poll(1010.0)
    assert [(r.rank, r.fresh) for r in got[2][1].ranks] == [("DP0", False), ("DP1", True)]


def test_sglang_without_speculation_or_before_a_decode_interval_has_no_accept_length(engines):
    eng = engines("sglang")
    eng.set_sglang(accept_length=0.0, accept_rate=0.0, running=0)  # `spec_algorithm.is_none()`: 0
    src, got = source(eng.url)
    src.poll(1.0)
    (rank,) = got[0][1].ranks
    assert (rank.rank, rank.ranks, rank.accept_length, rank.accept_rate, rank.running_requests) == ("", {}, None, None, 0)


def test_priority_breakdown_is_not_a_rank():
    body = ('# TYPE sglang:spec_accept_length gauge\n'
            'sglang:spec_accept_length{model_name="m",engine_type="unified",tp_rank="2",pp_rank="1",moe_ep_rank="0",priority=""} 2.5\n'
            '# TYPE sglang:num_running_reqs gauge\n'
            'sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="2",pp_rank="1",moe_ep_rank="0",priority=""} 7\n'
            'sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="2",pp_rank="1",moe_ep_rank="0",priority="3"} 2\n')
    from specwatch.sources.server_metrics import SGLangReader

    (rank,) = SGLangReader().read(read_families(body))
    assert (rank.rank, rank.ranks, rank.accept_length, rank.running_requests) == ("PP1 TP2", {"PP": 1, "TP": 2}, 2.5, 7)


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
def test_vllm_counters_over_the_interval_with_a_reset(engines, openmetrics):
    eng = engines("vllm", openmetrics=openmetrics, num_spec_tokens=3)
    eng.advance_vllm(drafts=1000, accepted_per_pos=[800, 500, 200])  # lifetime before specwatch looked
    src, got = source(eng.url)
    src.poll(10.0)
    first = got[-1][1].ranks[0]
    assert (first.rank, first.accept_length, first.fresh, first.running_requests) == ("", None, False, 16)
    eng.advance_vllm(drafts=200, accepted_per_pos=[100, 40, 10], running=20)
    src.poll(15.0)
    r = got[-1][1].ranks[0]
    # 1 + accepted / drafts over the interval only: (100 + 40 + 10) / 200
    assert r.accept_length == pytest.approx(1.75) and r.accept_rate == pytest.approx(150 / 600)
    assert r.position_accept_rates == pytest.approx((0.5, 0.2, 0.05))
    assert (r.drafts, r.draft_tokens, r.accepted_tokens, r.running_requests, r.fresh) == (200, 600, 150, 20, True)
    src.poll(20.0)  # no drafts in this interval: nothing to judge (not a collapse)
    idle = got[-1][1].ranks[0]
    assert (idle.accept_length, idle.position_accept_rates, idle.fresh, idle.drafts) == (None, (), False, 0)
    eng.restart()  # counters from zero: the increase since the restart is their value
    eng.advance_vllm(drafts=50, accepted_per_pos=[0, 0, 0], running=4)
    src.poll(25.0)
    s = got[-1][1]
    assert s.resets == 1 and src._vllm.resets_total == 1
    assert (s.ranks[0].accept_length, s.ranks[0].accept_rate, s.ranks[0].position_accept_rates) == (1.0, 0.0, (0.0, 0.0, 0.0))
    fams = {f.name: f for f in ServerMetricsCollector([src]).collect()}
    assert [s.value for s in fams["specwatch_server_metrics_resets"].samples if s.name.endswith("_total")] == [1]
    assert [s.labels["engine"] for s in fams["specwatch_server_metrics_engine_info"].samples] == ["vllm"]


def test_vllm_data_parallel_engines_are_dp_ranks(engines):
    eng = engines("vllm", dp_size=2, num_spec_tokens=2)
    src, got = source(eng.url)
    src.poll(0.0)
    eng.advance_vllm(0, drafts=10, accepted_per_pos=[10, 10])
    eng.advance_vllm(1, drafts=10, accepted_per_pos=[0, 0])
    src.poll(5.0)
    assert [(r.rank, r.ranks, r.accept_length) for r in got[-1][1].ranks] == [("DP0", {"DP": 0}, 3.0), ("DP1", {"DP": 1}, 1.0)]


def test_a_failing_endpoint_is_counted_logged_and_backed_off(engines, caplog):
    eng = engines("sglang")
    eng.set_sglang(accept_length=2.0, accept_rate=0.3)
    src, got = source(eng.url, interval=5.0, backoff_max=30.0)
    caplog.set_level(logging.WARNING, "specwatch.sources.server_metrics")
    assert (src.source_status()["ok"], src.source_status()["state"]) == (None, "not scraped yet")
    assert src.poll(0.0) == 5.0 and src.up
    assert (src.source_status()["ok"], src.source_status()["state"]) == (True, "answering (sglang)")
    eng.status = 500
    delays = [src.poll(float(t)) for t in range(1, 6)]
    assert delays == [5.0, 10.0, 20.0, 30.0, 30.0]  # doubled per failure, capped at backoff_max
    assert [e.error for _, e, _ in got[1:]] == ["http_500"] * 5 and not src.up
    eng.close()
    src.poll(7.0)
    assert got[-1][1].error == "connection_error"
    assert src.errors_total == {"http_500": 5, "connection_error": 1} and src.scrapes_total == 7
    assert src.source_status() == {  # as the status page lists it
        "kind": "server_metrics", "name": eng.url, "server": "s", "ok": False, "state": "failing (connection_error)",
        "last_line_at": 0.0, "counters": {"scrapes": 7, "errors": 6}}
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "scrape failed (http_500)" in warned[0] and eng.url in warned[0]
    fams = {f.name: f for f in ServerMetricsCollector([src]).collect()}
    assert {s.labels["error"]: s.value for s in fams["specwatch_server_metrics_errors"].samples
            if s.name.endswith("_total")} == {"http_500": 5, "connection_error": 1}
    assert [s.value for s in fams["specwatch_server_metrics_up"].samples] == [0.0]
    # it answers again: said once, the interval is back to normal
    back = engines("sglang")
    back.set_sglang(accept_length=2.0, accept_rate=0.3)
    src.url = back.url
    assert src.poll(8.0) == 5.0 and src.up
    assert "answers again after 6 failed scrape(s)" in caplog.records[-1].getMessage()


def test_a_body_without_speculative_metrics_is_said_once(caplog):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    import threading

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        caplog.set_level(logging.WARNING, "specwatch.sources.server_metrics")
        src, got = source(f"http://127.0.0.1:{httpd.server_address[1]}/metrics")
        src.poll(0.0)
        src.poll(1.0)
        assert [(e.engine, e.error, e.ranks) for _, e, _ in got] == [(None, None, ())] * 2
        assert len(caplog.records) == 1 and "--enable-metrics" in caplog.records[0].getMessage()
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_body_that_does_not_parse_is_a_bad_response():
    from specwatch.sources.server_metrics import ServerMetricsSource

    class Body(ServerMetricsSource):
        def fetch(self, filtered=False):
            return 'sglang:spec_accept_length{tp_rank="0" 2.5\n'

    got = []
    Body(f"http://127.0.0.1:{free_port()}/metrics", lambda *a: got.append(a), server="s").poll(0.0)
    assert got[0][1].error == "bad_response"


def test_only_the_samples_read_are_asked_for_and_an_old_exposition_is_scraped_whole(engines, caplog):
    eng = engines("sglang")
    eng.set_sglang(accept_length=2.5, accept_rate=0.4, running=8)
    src, got = source(eng.url)
    whole, asked = src.fetch(), src.fetch(filtered=True)
    assert "sglang:e2e_request_latency_seconds_bucket" in whole and "sglang:generation_tokens_total" in whole
    assert "e2e_request_latency" not in asked and "generation_tokens" not in asked and "sglang:spec_accept_length{" in asked
    assert len(asked) * 3 < len(whole)
    src.poll(0.0)
    assert "name%5B%5D=sglang%3Aspec_accept_length" in eng.queries[-1] and src.filtered
    assert got[-1][1].ranks[0].accept_length == 2.5
    # prometheus-client < 0.14 with multiprocess collectors answers name[] with nothing
    eng.empty_when_filtered = True
    caplog.set_level(logging.INFO, "specwatch.sources.server_metrics")
    eng.set_sglang(accept_length=2.25, accept_rate=0.3, running=8)
    src.poll(5.0)
    src.poll(10.0)
    assert "name%5B%5D=" in eng.queries[-3] and eng.queries[-2:] == ["", ""] and not src.filtered
    assert [e.ranks[0].accept_length for _, e, _ in got[1:]] == [2.25, 2.25]
    assert "scraping the whole body from now on" in caplog.records[-1].getMessage()
