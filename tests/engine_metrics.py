"""A real HTTP server on 127.0.0.1 serving /metrics like SGLang 0.5.23 or vLLM, for tests.

The body is served by prometheus-client's own exposition app (`make_wsgi_app`: content
negotiation, `?name[]=` filtering, as SGLang's and vLLM's mounted `make_asgi_app`) from a registry holding the engines' own
families, names, label names and help texts:

* SGLang: `SchedulerMetricsCollector` (sglang/srt/observability/metrics_collector.py 0.5.23):
  gauges `sglang:spec_accept_length`, `sglang:spec_accept_rate`, `sglang:num_running_reqs`,
  `sglang:num_queue_reqs`, `sglang:gen_throughput` with labels `model_name`, `engine_type`,
  `tp_rank`, `pp_rank`, `moe_ep_rank` (+ `dp_rank` with DP); plus a histogram and the
  tokenizer's counters, as a real body has (they must be skipped).
* vLLM: `SpecDecodingProm` (vllm/v1/spec_decode/metrics.py 0.11.0-0.33.0) counters with labels
  `model_name`, `engine` (+ `position`), `vllm:num_requests_running` / `_waiting` gauges.

`openmetrics=True` serves the OpenMetrics rendering (prometheus-client >= 0.23 writes `sglang_x`
sample names there), else the text format (colon names). `restart()` starts the counters from
zero (an engine restart); `status` (e.g. 500) makes every answer fail; `empty_when_filtered`
answers a `?name[]=` request with nothing; `queries` records the query strings; `close()` stops.
"""

from __future__ import annotations

import threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, make_wsgi_app
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


class EngineMetrics:
    def __init__(self, engine: str, *, openmetrics: bool = False, dp_size: int = 1, num_spec_tokens: int = 3):
        self.engine = engine
        self.openmetrics = openmetrics
        self.dp_size = dp_size
        self.num_spec_tokens = num_spec_tokens
        self.status = 200
        self.hits = 0
        self._lock = threading.Lock()
        self.empty_when_filtered = False  # an old prometheus-client: `?name[]=` finds nothing
        self.queries: list[str] = []
        self.restart()
        owner = self

        def app(environ, start_response):
            with owner._lock:
                owner.hits += 1
                owner.queries.append(environ.get("QUERY_STRING", ""))
                if owner.status != 200:
                    start_response(f"{owner.status} Error", [("Content-Type", "text/plain")])
                    return [b"internal error\n"]
                if owner.empty_when_filtered and "name" in environ.get("QUERY_STRING", ""):
                    start_response("200 OK", [("Content-Type", "text/plain; version=0.0.4; charset=utf-8")])
                    return [b""]
                if owner.openmetrics:  # as a scraper that asks for OpenMetrics gets it
                    environ = dict(environ, HTTP_ACCEPT="application/openmetrics-text; version=1.0.0")
                # prometheus-client's own exposition app, as SGLang and vLLM mount it
                return make_wsgi_app(owner.registry)(environ, start_response)

        class Server(ThreadingMixIn, WSGIServer):
            daemon_threads = True

        class Quiet(WSGIRequestHandler):
            def log_message(self, *args):
                pass

        self.httpd = make_server("127.0.0.1", 0, app, server_class=Server, handler_class=Quiet)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def body(self) -> bytes:
        return generate_openmetrics(self.registry) if self.openmetrics else generate_latest(self.registry)

    def restart(self) -> None:
        """A fresh registry: every counter from zero, gauges unset (the engine restarted)."""
        with self._lock:
            r = self.registry = CollectorRegistry()
            if self.engine == "sglang":
                self._sglang(r)
            else:
                self._vllm(r)

    # --- SGLang 0.5.23 ---
    def _sglang(self, r: CollectorRegistry) -> None:
        names = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"] + (["dp_rank"] if self.dp_size > 1 else [])
        self._labels = names
        g = lambda name, doc: Gauge(name, doc, names, registry=r)  # noqa: E731
        self.g_len = g("sglang:spec_accept_length", "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).")
        self.g_rate = g("sglang:spec_accept_rate", "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).")
        self.g_running = g("sglang:num_running_reqs", "The number of running requests.")
        self.g_queue = g("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.g_thr = g("sglang:gen_throughput", "The generation throughput (token/s).")
        g("sglang:token_usage", "The token usage.")
        Histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                  ["model_name"], registry=r).labels(MODEL).observe(1.5)
        Counter("sglang:spec_verify_calls", "Number of speculative decoding verification calls.", ["model_name"],
                registry=r).labels(MODEL).inc(100)
        Counter("sglang:generation_tokens", "Number of generation tokens processed.", ["model_name", "is_streaming"],
                registry=r).labels(MODEL, "false").inc(300)

    def set_sglang(self, dp: int = 0, *, accept_length: float, accept_rate: float, running: int = 32, queued: int = 0,
                   throughput: float = 400.0) -> None:
        """What one decode-log interval of DP rank `dp` (TP 0) leaves in the gauges."""
        with self._lock:
            lv = [MODEL, "unified", "0", "0", "0"] + ([str(dp)] if self.dp_size > 1 else [])
            self.g_len.labels(*lv).set(accept_length)
            self.g_rate.labels(*lv).set(accept_rate)
            self.g_running.labels(*lv).set(running)
            self.g_queue.labels(*lv).set(queued)
            self.g_thr.labels(*lv).set(throughput)

    def collapsing(self, dp: int, check):
        """A `wait_for` predicate: each call leaves a new collapsed decode-log interval on DP rank
        `dp` (accept length 1.0, 20 running; the throughput moves, so the gauges are fresh), then
        returns `check()`."""
        calls = 0

        def pred():
            nonlocal calls
            calls += 1
            self.set_sglang(dp, accept_length=1.0, accept_rate=0.0, running=20, throughput=200.0 + calls)
            return check()

        return pred

    # --- vLLM ---
    def _vllm(self, r: CollectorRegistry) -> None:
        names = ["model_name", "engine"]
        c = lambda name, doc, extra=(): Counter(name, doc, names + list(extra), registry=r)  # noqa: E731
        self.c_drafts = c("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
        self.c_draft_tokens = c("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
        self.c_accepted = c("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
        self.c_pos = c("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.", ["position"])
        self.g_vrunning = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", names, registry=r)
        self.g_vwaiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", names, registry=r)
        Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", names,
                  registry=r).labels(MODEL, "0").observe(0.2)
        for e in range(self.dp_size):  # vLLM creates every engine's children up front
            for fam in (self.c_drafts, self.c_draft_tokens, self.c_accepted):
                fam.labels(MODEL, str(e))
            for p in range(self.num_spec_tokens):
                self.c_pos.labels(MODEL, str(e), str(p))
            self.g_vrunning.labels(MODEL, str(e))
            self.g_vwaiting.labels(MODEL, str(e))

    def advance_vllm(self, engine: int = 0, *, drafts: int, accepted_per_pos: list[int], running: int = 16,
                     waiting: int = 0) -> None:
        """What `SpecDecodingProm.observe` adds for `drafts` drafts of num_spec_tokens tokens each,
        `accepted_per_pos[p]` of them accepted at position p."""
        with self._lock:
            e = str(engine)
            self.c_drafts.labels(MODEL, e).inc(drafts)
            self.c_draft_tokens.labels(MODEL, e).inc(drafts * self.num_spec_tokens)
            self.c_accepted.labels(MODEL, e).inc(sum(accepted_per_pos))
            for p, n in enumerate(accepted_per_pos):
                self.c_pos.labels(MODEL, e, str(p)).inc(n)
            self.g_vrunning.labels(MODEL, e).set(running)
            self.g_vwaiting.labels(MODEL, e).set(waiting)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
