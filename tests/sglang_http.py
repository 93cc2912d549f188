"""A local HTTP server on 127.0.0.1 that answers like SGLang's HTTP API (`entrypoints/http_server.py`).

Profiles (`version`):
* "0.5.23": `/server_info` (flat server args + `internal_states` + `version` + `startup_time`,
  `launch_command`, `frontend`), `/get_server_info` (same body; deprecated: each call is
  counted, SGLang logs a warning per call), `/model_info` with `architectures`, `/health`.
* "0.4.9": only `/get_server_info` (flat args + `internal_states` list) and `/get_model_info`
  (model_path, tokenizer_path, is_generation); `/server_info` is 404 as in FastAPI.
* "0.4.6.post1": like 0.4.9 but the scheduler's internal state is merged into the top level.

Knobs: `api_key` (401 without the right Bearer on the info endpoints; `/health` is open),
`health_status` (e.g. 503), `delay` (seconds before answering, for timeouts), `throughput`
(the `last_gen_throughput` to report; the test advances it, or `advancing` does on each call).
`hits` counts requests per path; `auth` records the Authorization headers seen.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ARGS = {
    "model_path": "meta-llama/Llama-3.1-8B-Instruct",
    "tokenizer_path": "meta-llama/Llama-3.1-8B-Instruct",
    "served_model_name": "meta-llama/Llama-3.1-8B-Instruct",
    "host": "127.0.0.1",
    "port": 30000,
    "tp_size": 1,
    "dp_size": 1,
    "pp_size": 1,
    "ep_size": 1,
    "mem_fraction_static": 0.8,
    "speculative_algorithm": "EAGLE3",
    "speculative_draft_model_path": "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B",
    "speculative_draft_model_revision": None,
    "speculative_num_steps": 5,
    "speculative_eagle_topk": 8,
    "speculative_num_draft_tokens": 32,
    "speculative_accept_threshold_single": 1.0,
    "speculative_accept_threshold_acc": 1.0,
    "speculative_token_map": None,
    "decode_log_interval": 40,
    "enable_metrics": False,
    "log_level": "info",
    "disaggregation_mode": "null",
    "enable_dp_attention": False,
    "api_key": None,
}
SCHEDULER_INFO = {"max_total_num_tokens": 411528, "max_req_input_len": 131066}


class SGLangHTTP:
    def __init__(self, version: str = "0.5.23", *, api_key: str | None = None, dp_size: int = 1, port: int = 0,
                 advancing: bool = False):
        self.version = version
        self.api_key = api_key
        self.dp_size = dp_size
        self.health_status = 200
        self.delay = 0.0
        self.throughput = 1234.5
        self.accept_lifetime = 3.42
        self.startup_time = 1767225600.25
        self.args = dict(ARGS, dp_size=dp_size)
        self.advancing = advancing  # each /server_info call completes a decode-log interval
        self.hits: Counter[str] = Counter()
        self.auth: list[str | None] = []
        self._srv = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._srv.daemon_threads = True
        self.port = self._srv.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()

    # --- bodies ---
    def internal_state(self, rank: int) -> dict:
        st = dict(self.args)
        st.update(last_gen_throughput=self.throughput + rank,
                  memory_usage={"weight": 15.06, "kvcache": 52.31, "graph": 1.18, "token_capacity": 411528})
        if self.args.get("speculative_algorithm"):
            st["avg_spec_accept_length"] = round(self.accept_lifetime + 0.01 * rank, 4)
        if self.version == "0.5.23":
            st.update(world_size=1, effective_max_running_requests_per_dp=48, startup_time=self.startup_time)
        return st

    def server_info(self) -> dict:
        if self.advancing:
            self.throughput += 1.5
        doc = dict(self.args, **SCHEDULER_INFO)
        if self.version == "0.4.6.post1":
            doc.update(self.internal_state(0))
        else:
            doc["internal_states"] = [self.internal_state(r) for r in range(self.dp_size)]
        if self.version == "0.5.23":
            doc.update(launch_command="python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct",
                       kv_events=None, startup_time=self.startup_time, frontend="python")
        doc["version"] = self.version
        return doc

    def model_info(self) -> dict:
        doc = {"model_path": self.args["model_path"], "tokenizer_path": self.args["tokenizer_path"],
               "is_generation": True}
        if self.version == "0.5.23":
            doc.update(served_model_name=self.args["served_model_name"], weight_version="default",
                       model_type="llama", architectures=["LlamaForCausalLM"])
        return doc

    def routes(self) -> dict:
        new = self.version.startswith("0.5.")
        r = {"/get_server_info": self.server_info, "/get_model_info": self.model_info}
        if new:
            r.update({"/server_info": self.server_info, "/model_info": self.model_info})
        return r

    def _handler(self):
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code: int, doc: dict) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                outer.hits[self.path] += 1
                outer.auth.append(self.headers.get("Authorization"))
                if outer.delay:
                    time.sleep(outer.delay)
                if self.path == "/health":
                    return self._send(outer.health_status, {})
                route = outer.routes().get(self.path)
                if route is None:
                    return self._send(404, {"detail": "Not Found"})
                if outer.api_key and self.headers.get("Authorization") != f"Bearer {outer.api_key}":
                    return self._send(401, {"error": "Unauthorized"})
                return self._send(200, route())

        return H
