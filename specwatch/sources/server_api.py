"""The SGLang HTTP API: `/server_info`, `/model_info` and `/health`, polled (`sources/http_poll.py`).

Facts (`sglang/srt/entrypoints/http_server.py` 0.4.6.post1-0.5.23; `avg_spec_accept_length` from
`sglang/srt/managers/scheduler_components/internal_state.py` 0.5.23):

* `/server_info` exists from 0.5.6; `/get_server_info` is its deprecated alias there and logs a
  WARNING on every call, so it is asked only after `/server_info` answered 404 (older servers),
  and `/server_info` is tried again whenever the server comes back (it may have been upgraded)
  or reports a version that has it. Same for `/model_info` / `/get_model_info`.
* The answer is flat: every server arg at the top level plus `internal_states` (one dict per DP
  rank; 0.4.6.post1 merged that dict into the top level instead) and `version`; 0.5.23 adds
  `startup_time`. `internal_states[i].avg_spec_accept_length` is a lifetime average: it is
  exported as `specwatch_server_avg_accept_length_lifetime`, never mixed with the log's
  per-interval accept len.
* `/model_info` has the target's `architectures` from 0.5.10.
* `/health` is a plain 200 on 0.4.x; from 0.5.4 it runs a one-token generation (an extra
  `Prefill batch` line in the log when the server is idle), so it is polled at its own, slower
  `health_interval`. `/server_info` and `/model_info` follow `--api-key` (Bearer); `/health`
  does not.

Every call has a short timeout. While the server does not answer, polls back off (interval,
doubled per failure, capped at `backoff_max`). The API key is sent only in the Authorization
header and never logged.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from urllib.parse import urlsplit, urlunsplit
from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from specwatch.core.events import ApiSample, DpState, ServerArgs, ServerInfo
from specwatch.sources.base import Emit, PollingSource
from specwatch.sources.http_poll import PollClient, PollError
from specwatch.engines.sglang.log import SERVER_ARG_KEYS
from specwatch.engines.vllm.api import MODELS_PATH, VERSION_PATH, is_vllm_server_info, parse_vllm_info

log = logging.getLogger("specwatch.sources.server_api")

INFO_PATHS = ("/server_info", "/get_server_info")
MODEL_PATHS = ("/model_info", "/get_model_info")
HEALTH_PATH = "/health"
NEW_ENDPOINTS_SINCE = (0, 5, 6)  # first version with /server_info and /model_info

# server args specwatch keeps from /server_info (it has ~300); the log grammar's list plus these
ARG_KEYS = SERVER_ARG_KEYS + (
    "speculative_draft_model_revision",
    "speculative_draft_window_size",
    "speculative_token_map",
    "speculative_accept_threshold_single",
    "speculative_accept_threshold_acc",
    "enable_dp_attention",
    "max_total_num_tokens",
    "context_length",
    "host",
)


def version_tuple(version: str | None) -> tuple[int, ...]:
    """`0.5.6.post1` → (0, 5, 6); unreadable → ()."""
    out = []
    for part in (version or "").split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
    return tuple(out)


def _float(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def parse_server_info(doc: dict, endpoint: str = "/server_info") -> ServerInfo:
    """A `/server_info` JSON object → ServerInfo (any version from 0.4.6.post1 to 0.5.23).

    Raises ValueError when `doc` is not an object.
    """
    if not isinstance(doc, dict):
        raise ValueError("server info is not a JSON object")
    states = doc.get("internal_states")
    if not isinstance(states, list):
        states = [doc]  # 0.4.6.post1: the scheduler's state merged into the top level
    dp = tuple(
        DpState(i, _float(st.get("avg_spec_accept_length")), _float(st.get("last_gen_throughput")))
        for i, st in enumerate(states) if isinstance(st, dict)
    )
    args = {k: doc[k] for k in ARG_KEYS if k in doc}
    version = doc.get("version")
    return ServerInfo(
        version=str(version) if version is not None else None,
        args=args,
        dp_states=dp,
        startup_time=_float(doc.get("startup_time")),
        endpoint=endpoint,
    )


def shown_url(url: str) -> str:
    """`url` for logs and metrics: no user, password or query (`http://u:p@h:1/x?token=t` →
    `http://h:1/x`); they may hold credentials."""
    parts = urlsplit(url)
    if not (parts.username or parts.password or parts.query):
        return url
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class ApiError(OSError):
    """A call that got no usable answer. kind: `timeout`, `connection_error`, `request_error`,
    `unauthorized`, `http_<status>` or `bad_response`; reachable: False when nothing answered."""

    def __init__(self, url: str, kind: str, status: int | None = None, reachable: bool = True):
        super().__init__(f"{url}: {kind}")
        self.kind = kind
        self.status = status
        self.reachable = reachable


class ServerApiSource(PollingSource):
    """Polls one SGLang server's HTTP API and emits `ApiSample` (every poll) and `ServerArgs`
    (source "server_info", when the resolved args change).

    url: base URL (`http://127.0.0.1:30000`). server: name for events and metrics. api_key:
    the server's `--api-key` (a secret). interval / health_interval / timeout / backoff_max:
    seconds. client: the `PollClient` to GET with (default: a new one).
    """

    name = "server_api"

    def __init__(self, url: str, emit: Emit, *, server: str, api_key: str | None = None,
                 interval: float = 10.0, health_interval: float = 60.0, timeout: float = 2.0,
                 backoff_max: float = 120.0, client: PollClient | None = None):
        super().__init__(interval)
        self.url = url.rstrip("/")
        self.shown = shown_url(self.url).rstrip("/")  # what logs, errors and metrics say
        self.emit = emit
        self.server = server
        self.health_interval = float(health_interval)
        self.timeout = float(timeout)
        self.backoff_max = max(float(backoff_max), self.interval)
        self.client = client or PollClient()
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._info_path: str | None = None  # the endpoint that answered; None: probe again
        self._vllm = False  # a vLLM server: /version and /v1/models instead (engines/vllm/api.py)
        self._model_path: str | None = None
        self._architectures: tuple[str, ...] | None = None
        self._last_args: dict | None = None
        self._next_health = 0.0
        self._healthy: bool | None = None
        self._health_status: int | None = None
        self._failures = 0
        self._warned: set[str] = set()
        self.lock = threading.Lock()
        # metrics (read by ServerApiCollector under `lock`)
        self.requests_total: dict[str, int] = {}
        self.errors_total: dict[tuple[str, str], int] = {}
        self.last_success: float | None = None
        self.up = False

    def __repr__(self) -> str:  # never the key
        return f"ServerApiSource({self.shown!r}, server={self.server!r}, api_key={'<redacted>' if self._headers else None})"

    # --- HTTP ---
    def _get(self, path: str, *, auth: bool = True) -> tuple[int, bytes]:
        """GET `path` → (status, body). Raises ApiError (no answer, or 401/403)."""
        with self.lock:
            self.requests_total[path] = self.requests_total.get(path, 0) + 1
        try:
            status, body = self.client.get(self.url + path, headers=self._headers if auth else None,
                                           timeout=self.timeout)
        except PollError as e:
            raise self._error(path, e.kind, reachable=e.reachable) from None
        if status in (401, 403):
            if "unauthorized" not in self._warned:
                self._warned.add("unauthorized")
                log.warning("%s%s answered %d: set server_api.api_key (or _env/_file) to the server's "
                            "--api-key", self.shown, path, status)
            raise self._error(path, "unauthorized", status)
        return status, body

    def _error(self, path: str, kind: str, status: int | None = None, reachable: bool = True) -> ApiError:
        with self.lock:
            key = (path, kind)
            self.errors_total[key] = self.errors_total.get(key, 0) + 1
        return ApiError(self.shown + path, kind, status, reachable)

    def _json(self, path: str, answer: tuple[int, bytes]) -> dict:
        status, body = answer
        if status != 200:
            raise self._error(path, f"http_{status}", status)
        try:
            doc = json.loads(body)
        except ValueError:  # not JSON, or not UTF-8/16/32
            raise self._error(path, "bad_response", status) from None
        if not isinstance(doc, dict):
            raise self._error(path, "bad_response", status)
        return doc

    def _fetch(self, paths: tuple[str, str], current: str | None) -> tuple[dict, str]:
        """GET the new endpoint, or the old one only when the new one answered 404."""
        if current is not None:
            return self._json(current, self._get(current)), current
        new, old = paths
        answer = self._get(new)
        if answer[0] != 404:
            return self._json(new, answer), new
        return self._json(old, self._get(old)), old

    def server_info(self) -> ServerInfo:
        """`/server_info` (or `/get_server_info`) and `/model_info`, parsed; on a vLLM server
        `/version` and `/v1/models`. Raises ApiError."""
        if self._vllm:
            return self._vllm_info()
        path: str | None  # the endpoint to keep asking; None: probe again
        try:
            doc, path = self._fetch(INFO_PATHS, self._info_path)
        except ApiError as e:
            if e.status != 404:
                raise
            try:
                return self._vllm_info()  # neither endpoint: a vLLM server?
            except ApiError as not_vllm:
                if not_vllm.status == 404:
                    raise e from None  # neither engine: say what SGLang's endpoint answered
                raise
        if is_vllm_server_info(doc):
            return self._vllm_info()
        info = parse_server_info(doc, path)
        if path != INFO_PATHS[0] and version_tuple(info.version) >= NEW_ENDPOINTS_SINCE:
            path = None  # upgraded in place: use /server_info from the next poll on
        self._info_path = path
        if self._architectures is None:
            self._architectures = self._model_info()
        return ServerInfo(info.version, info.args, info.dp_states, info.startup_time,
                          self._architectures or (), info.endpoint)

    # --- one poll ---
    def poll(self, now: float) -> float:
        info = None
        error = None
        reachable = True
        try:
            info = self.server_info()
        except ApiError as e:
            error, reachable = e.kind, e.reachable
            if not e.reachable:
                self._forget_instance()
        if reachable and now >= self._next_health:
            self._poll_health(now)
        elif not reachable:
            self._healthy, self._health_status = None, None
        with self.lock:
            self.up = info is not None
            if info is not None:
                self.last_success = now
        if info is not None:
            if self._failures and "down" in self._warned:
                log.warning("%s answers again", self.shown)
            self._failures = 0
            self._warned.discard("down")
            self._warned.discard("unauthorized")
            if info.args != self._last_args:
                self._last_args = dict(info.args)
                self.emit(self.server, ServerArgs(now, dict(info.args), source="server_info"), now)
        else:
            self._failures += 1
            if not reachable and "down" not in self._warned:
                self._warned.add("down")
                log.warning("%s does not answer (%s); backing off up to %.0f s", self.shown, error, self.backoff_max)
        self.emit(self.server, ApiSample(now, self.shown, reachable, error, info, self._healthy, self._health_status), now)
        return self.next_delay()

    def next_delay(self) -> float:
        """Seconds until the next poll: `interval`, doubled per consecutive failure, capped."""
        if self._failures == 0:
            return self.interval
        return min(self.backoff_max, self.interval * 2 ** (self._failures - 1))

    def _vllm_info(self) -> ServerInfo:
        doc = self._json(VERSION_PATH, self._get(VERSION_PATH))
        try:
            models = self._json(MODELS_PATH, self._get(MODELS_PATH))
        except ApiError:
            models = None
        try:
            info = parse_vllm_info(doc, models)
        except ValueError:
            raise self._error(VERSION_PATH, "bad_response", 200) from None
        self._vllm = True
        return info

    def _forget_instance(self) -> None:
        # the server went away: the one that comes back may be another version or model
        self._info_path = None
        self._vllm = False
        self._model_path = None
        self._architectures = None
        self._last_args = None
        self._next_health = 0.0

    def _model_info(self) -> tuple[str, ...] | None:
        try:
            doc, path = self._fetch(MODEL_PATHS, self._model_path)
        except ApiError:
            return None  # asked again next poll
        self._model_path = path
        arch = doc.get("architectures")
        if isinstance(arch, list):
            return tuple(str(a) for a in arch)
        return ()  # before 0.5.10: not reported

    def _poll_health(self, now: float) -> None:
        try:
            status, _ = self._get(HEALTH_PATH, auth=False)
            self._health_status = status
            self._healthy = status == 200
            if status != 200:
                self._error(HEALTH_PATH, f"http_{status}", status)
        except ApiError as e:
            self._healthy, self._health_status = False, e.status
        # while failing, ask again at the poll interval so recovery is seen soon
        self._next_health = now + (self.health_interval if self._healthy else self.interval)


class ServerApiCollector(Collector):
    """specwatch's view of the API polls: up, requests and errors by endpoint, last success."""

    def __init__(self, sources: list[ServerApiSource]):
        self.sources = sources

    def collect(self) -> Iterable:
        up = GaugeMetricFamily("specwatch_server_api_up", "1 when the last /server_info poll succeeded, else 0.", labels=("server",))
        reqs = CounterMetricFamily("specwatch_server_api_requests", "HTTP requests made to the SGLang API, by endpoint.", labels=("server", "endpoint"))
        errs = CounterMetricFamily("specwatch_server_api_errors", "Failed SGLang API requests by endpoint and error (connection_error, timeout, unauthorized, http_<status>, bad_response).", labels=("server", "endpoint", "error"))
        last = GaugeMetricFamily("specwatch_server_api_last_success_timestamp_seconds", "Wall time of the last successful /server_info poll, seconds since the epoch.", labels=("server",))
        for src in self.sources:
            with src.lock:
                up.add_metric([src.server], 1.0 if src.up else 0.0)
                for path, n in sorted(src.requests_total.items()):
                    reqs.add_metric([src.server, path], n)
                for (path, kind), n in sorted(src.errors_total.items()):
                    errs.add_metric([src.server, path, kind], n)
                if src.last_success is not None:
                    last.add_metric([src.server], src.last_success)
        yield from (up, reqs, errs, last)
