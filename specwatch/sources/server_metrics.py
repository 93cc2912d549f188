"""An inference engine's own Prometheus endpoint (`server_metrics[]`): SGLang or vLLM `/metrics`.

Scraped with `sources/http_poll.py`, read with prometheus-client's text parser
(`prometheus_client.parser.text_string_to_metric_families`); the engine is told from the metric
names. Colon names and their underscore twins are the same family: prometheus-client >= 0.23
renders `sglang:x` as `sglang_x` in OpenMetrics, its text format keeps the colon.

SGLang (`SchedulerMetricsCollector`, sglang/srt/observability/metrics_collector.py 0.5.11-0.5.23):
`sglang:spec_accept_length` and `sglang:spec_accept_rate` are gauges set at every decode-log
interval to the values of the `Decode batch` line (`report_decode_stats`,
sglang/srt/managers/scheduler_components/metrics_reporter.py 0.5.23), 0 without speculation;
`sglang:num_running_reqs` drops to 0 when the scheduler idles (`_maybe_log_idle_metrics`, same
file). Labels: `model_name`, `engine_type`, `tp_rank`, `pp_rank`, `moe_ep_rank`, `dp_rank` (only
with DP), `priority` ("" = the total). Only attention-TP rank 0 exports them. The gauges keep
their last value between intervals: a label set whose values did not move since the previous
scrape is stale (`RankMetrics.fresh` False). `sglang:spec_verify_calls_total` (0.5.23) counts per
finished request, without rank labels: not a per-interval accept length, so not read.

vLLM (`SpecDecodingProm`, vllm/v1/spec_decode/metrics.py 0.11.0-0.33.0; labels `model_name`,
`engine` from `PrometheusStatLogger`, vllm/v1/metrics/loggers.py): counters
`vllm:spec_decode_num_drafts_total`, `..._num_draft_tokens_total`, `..._num_accepted_tokens_total`
and `..._num_accepted_tokens_per_pos_total{position}`. Over one scrape interval: accept length =
1 + accepted / drafts (vLLM's own "Mean acceptance length", bonus token included), accept rate =
accepted / draft tokens, position p = accepted at p / drafts. A counter below its previous value
means the engine restarted: the increase is then its value (as Prometheus' `rate()` takes it).

Cost: one GET per interval on a kept-alive connection, asking only for the samples read
(`?name[]=`, which prometheus-client's exposition honours; a server that answers that with nothing
is then scraped whole); of a whole body only the lines of the families read are parsed (one regex
pass), so a 5 s interval stays inside the daemon's idle budget (README "Performance"). A failing scrape is counted
(`specwatch_server_metrics_errors_total`), logged, and backed off (interval doubled per failure,
capped at `backoff_max`).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from specwatch.core.events import MetricsSample, RankMetrics
from specwatch.sources.base import Emit, PollingSource
from specwatch.sources.http_poll import PollClient, PollError
from specwatch.sources.server_api import shown_url

log = logging.getLogger("specwatch.sources.server_metrics")

SGLANG, VLLM = "sglang", "vllm"
# Families read (colon names; counters without `_total`, as the parser names families).
SGL_LENGTH, SGL_RATE = "sglang:spec_accept_length", "sglang:spec_accept_rate"
SGL_RUNNING, SGL_QUEUED, SGL_THROUGHPUT = "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput"
VL_DRAFTS, VL_DRAFT_TOKENS = "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens"
VL_ACCEPTED, VL_PER_POS = "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos"
VL_RUNNING, VL_WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
FAMILIES = frozenset((SGL_LENGTH, SGL_RATE, SGL_RUNNING, SGL_QUEUED, SGL_THROUGHPUT,
                      VL_DRAFTS, VL_DRAFT_TOKENS, VL_ACCEPTED, VL_PER_POS, VL_RUNNING, VL_WAITING))
_STEMS = tuple(sorted({n.split(":", 1)[1] for n in FAMILIES}))
# A kept line: a sample or `# HELP` / `# TYPE` of a family read, in either name style (one regex
# pass over the body: a line-by-line test costs several times more on a large body).
_WANTED = re.compile(r"\n(?:# (?:HELP|TYPE) )?(?:sglang|vllm)[:_](?:%s)[^\n]*" % "|".join(_STEMS))
_TWIN = re.compile(r"^(# (?:HELP|TYPE) )?(sglang|vllm)_")
# Asked of the server (`?name[]=`, prometheus-client's exposition filters on sample names), so a
# body of hundreds of families comes back as the few lines read; a server that ignores it answers whole.
SAMPLE_NAMES = (SGL_LENGTH, SGL_RATE, SGL_RUNNING, SGL_QUEUED, SGL_THROUGHPUT, VL_RUNNING, VL_WAITING) + tuple(
    f"{n}_total" for n in (VL_DRAFTS, VL_DRAFT_TOKENS, VL_ACCEPTED, VL_PER_POS))


def wanted_lines(text: str) -> str:
    """The lines of a /metrics body that belong to the families read, their names in colon
    style (an OpenMetrics body names its samples `sglang_x` under `# TYPE sglang:x`)."""
    return "\n".join(_TWIN.sub(r"\1\2:", m.group()[1:]) for m in _WANTED.finditer("\n" + text)) + "\n"


# {family (colon name): [(labels, value)]}: what `read_families` gives the engines' readers
Series = dict[str, list[tuple[dict[str, str], float]]]


def read_families(text: str) -> Series:
    """A /metrics body (Prometheus text or OpenMetrics) → {family: [(labels, value)]} for the
    families in FAMILIES, colon names; a counter by its `_total` sample (`_created` dropped).
    Samples are taken by their own names: OpenMetrics' `# TYPE x counter` has no `_total`, so the
    text parser files its `x_total` samples apart. Raises ValueError when the body does not parse."""
    out: Series = {}
    for fam in text_string_to_metric_families(wanted_lines(text)):
        for s in fam.samples:
            name = s.name[:-6] if s.name.endswith("_total") else s.name
            if name in FAMILIES:
                out.setdefault(name, []).append((dict(s.labels), float(s.value)))
    return out


def engine_of(series: Series) -> str | None:
    """"sglang" or "vllm" from which speculative families are present, else None."""
    if SGL_LENGTH in series:
        return SGLANG
    if VL_DRAFTS in series or VL_ACCEPTED in series:
        return VLLM
    return None


def _int(v: float | None) -> int | None:
    return None if v is None else int(v)


def _sglang_key(labels: dict[str, str]) -> tuple[tuple[str, int], ...] | None:
    """Rank tokens of an SGLang label set, in the log prefix's order (`configure_scheduler_process`,
    sglang/srt/managers/scheduler.py 0.5.23): DP when the label exists, PP and TP when not 0.
    None for a per-priority breakdown (only `priority=""`, the total, is read)."""
    if labels.get("priority"):
        return None
    out = []
    for token, label in (("DP", "dp_rank"), ("PP", "pp_rank"), ("TP", "tp_rank")):
        raw = labels.get(label)
        if raw is None or raw == "":
            continue
        try:
            n = int(raw)
        except ValueError:
            continue
        if token == "DP" or n != 0:
            out.append((token, n))
    return tuple(out)


def _rank_text(key: tuple[tuple[str, int], ...]) -> str:
    return " ".join(f"{t}{n}" for t, n in key)


class SGLangReader:
    """Per-rank samples from SGLang's gauges; remembers each label set's last values to tell a
    new decode-log interval from a stale gauge."""

    def __init__(self) -> None:
        self._last: dict[tuple, tuple] = {}

    def read(self, series: Series) -> tuple[RankMetrics, ...]:
        by_rank: dict[tuple, dict[str, float]] = {}
        for fam in (SGL_LENGTH, SGL_RATE, SGL_RUNNING, SGL_QUEUED, SGL_THROUGHPUT):
            for labels, value in series.get(fam, ()):
                key = _sglang_key(labels)
                if key is not None:
                    by_rank.setdefault(key, {}).setdefault(fam, value)
        out = []
        for key, v in sorted(by_rank.items()):
            if SGL_LENGTH not in v:
                continue
            values = tuple(v.get(f) for f in (SGL_LENGTH, SGL_RATE, SGL_RUNNING, SGL_QUEUED, SGL_THROUGHPUT))
            fresh = self._last.get(key) != values
            self._last[key] = values
            length = v[SGL_LENGTH]
            out.append(RankMetrics(
                rank=_rank_text(key), ranks=dict(key),
                accept_length=length if length >= 1.0 else None,  # 0: no speculation / no decode yet
                accept_rate=v.get(SGL_RATE) if length >= 1.0 else None,
                running_requests=_int(v.get(SGL_RUNNING)), queued_requests=_int(v.get(SGL_QUEUED)),
                gen_throughput=v.get(SGL_THROUGHPUT), fresh=fresh))
        return tuple(out)


class _Counters:
    """One vLLM engine's counters at the previous scrape."""

    __slots__ = ("drafts", "draft_tokens", "accepted", "per_pos")

    def __init__(self, drafts: float, draft_tokens: float, accepted: float, per_pos: dict[int, float]):
        self.drafts, self.draft_tokens, self.accepted, self.per_pos = drafts, draft_tokens, accepted, per_pos


class VllmReader:
    """Per-engine samples from vLLM's counters: increases since the previous scrape."""

    def __init__(self) -> None:
        self._last: dict[str, _Counters] = {}
        self.resets_total = 0

    def read(self, series: Series) -> tuple[tuple[RankMetrics, ...], int]:
        """(samples, counter resets seen in this interval)."""
        engines: dict[str, dict[str, float]] = {}
        per_pos: dict[str, dict[int, float]] = {}
        for fam in (VL_DRAFTS, VL_DRAFT_TOKENS, VL_ACCEPTED, VL_RUNNING, VL_WAITING):
            for labels, value in series.get(fam, ()):
                engines.setdefault(labels.get("engine", ""), {})[fam] = value
        for labels, value in series.get(VL_PER_POS, ()):
            try:
                pos = int(labels.get("position", ""))
            except ValueError:
                continue
            per_pos.setdefault(labels.get("engine", ""), {})[pos] = value
        several = len(engines) > 1
        out, resets = [], 0
        for engine, v in sorted(engines.items()):
            if VL_DRAFTS not in v or VL_ACCEPTED not in v:
                continue
            now = _Counters(v[VL_DRAFTS], v.get(VL_DRAFT_TOKENS, 0.0), v[VL_ACCEPTED], per_pos.get(engine, {}))
            prev = self._last.get(engine)
            self._last[engine] = now
            ranks = {"DP": int(engine)} if engine.isdigit() and (several or engine != "0") else {}
            running = _int(v.get(VL_RUNNING))
            if prev is None:  # the first scrape: no interval yet
                out.append(RankMetrics(_rank_text(tuple(ranks.items())), ranks, None, running_requests=running,
                                       queued_requests=_int(v.get(VL_WAITING)), fresh=False))
                continue
            reset = (now.drafts < prev.drafts or now.accepted < prev.accepted or now.draft_tokens < prev.draft_tokens
                     or any(now.per_pos.get(p, 0.0) < c for p, c in prev.per_pos.items()))
            base = _Counters(0.0, 0.0, 0.0, {}) if reset else prev
            resets += reset
            drafts = now.drafts - base.drafts
            draft_tokens = now.draft_tokens - base.draft_tokens
            accepted = now.accepted - base.accepted
            length = rate = None
            positions: tuple[float, ...] = ()
            if drafts > 0:  # an interval without drafts says nothing about the draft
                length = 1.0 + accepted / drafts
                positions = tuple((now.per_pos[p] - base.per_pos.get(p, 0.0)) / drafts for p in sorted(now.per_pos))
            if draft_tokens > 0:
                rate = accepted / draft_tokens
            out.append(RankMetrics(
                _rank_text(tuple(ranks.items())), ranks, length, accept_rate=rate, running_requests=running,
                queued_requests=_int(v.get(VL_WAITING)), fresh=drafts > 0, drafts=drafts,
                draft_tokens=draft_tokens, accepted_tokens=accepted, position_accept_rates=positions))
        self.resets_total += resets
        return tuple(out), resets


class ScrapeError(OSError):
    """A scrape that got no usable body; kind: `timeout`, `connection_error`, `request_error`,
    `http_<status>` or `bad_response`."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind


class ServerMetricsSource(PollingSource):
    """Scrapes one engine's /metrics every `interval` seconds and emits a `MetricsSample`.

    url: the full /metrics URL. server: name for events and metrics. timeout / backoff_max:
    seconds. client: the `PollClient` to GET with (default: a new one).
    """

    name = "server_metrics"

    def __init__(self, url: str, emit: Emit, *, server: str, interval: float = 5.0, timeout: float = 2.0,
                 backoff_max: float = 120.0, client: PollClient | None = None):
        super().__init__(interval)
        self.url = url
        self.shown = shown_url(url)
        self.emit = emit
        self.server = server
        self.timeout = float(timeout)
        self.backoff_max = max(float(backoff_max), self.interval)
        self.client = client or PollClient()
        self.filtered = True  # ask for SAMPLE_NAMES only (see `scrape`)
        self._sglang = SGLangReader()
        self._vllm = VllmReader()
        self._failures = 0
        self._warned: set[str] = set()
        self.lock = threading.Lock()
        # metrics (read by ServerMetricsCollector under `lock`)
        self.scrapes_total = 0
        self.errors_total: dict[str, int] = {}
        self.last_success: float | None = None
        self.last_duration: float | None = None
        self.up = False
        self.engine: str | None = None
        self.last_error: str | None = None  # the last failed scrape's error kind

    def __repr__(self) -> str:
        return f"ServerMetricsSource({self.shown!r}, server={self.server!r})"

    def source_status(self) -> dict:
        """This source as the status page lists it (specwatch/status/view.py): kind
        `server_metrics`, named by its URL (credentials cut), `ok` None before the first scrape;
        `last_line_at`: wall time of the last successful scrape."""
        with self.lock:
            if not self.scrapes_total:
                ok, state = None, "not scraped yet"
            elif self.up:
                ok, state = True, f"answering ({self.engine})" if self.engine else "answering, no speculative metrics"
            else:
                ok, state = False, f"failing ({self.last_error})"
            return {"kind": "server_metrics", "name": self.shown, "server": self.server, "ok": ok, "state": state,
                    "last_line_at": self.last_success,
                    "counters": {"scrapes": self.scrapes_total, "errors": sum(self.errors_total.values())}}

    def fetch(self, filtered: bool = False) -> str:
        """GET the /metrics body (`filtered`: only SAMPLE_NAMES asked for). Raises ScrapeError."""
        try:
            status, body = self.client.get(self.url, params={"name[]": SAMPLE_NAMES} if filtered else None,
                                           timeout=self.timeout, headers={"Accept": "text/plain;version=0.0.4"})
        except PollError as e:
            raise ScrapeError(e.kind) from None
        if status != 200:
            raise ScrapeError(f"http_{status}")
        return body.decode("utf-8", "replace")  # the text exposition format is UTF-8

    def scrape(self, now: float) -> MetricsSample:
        """One scrape → MetricsSample (its `error` set when it failed; never raises)."""
        try:
            series = read_families(self.fetch(self.filtered))
            if self.filtered and engine_of(series) is None:
                # An exposition without the filter (prometheus-client < 0.14 with multiprocess
                # collectors answers `name[]` with nothing): ask whole from now on.
                self.filtered = False
                log.info("%s: no speculative metrics with ?name[]=; scraping the whole body from now on", self.shown)
                series = read_families(self.fetch())
        except ScrapeError as e:
            return MetricsSample(now, self.shown, self.engine, error=e.kind)
        except ValueError:  # the parser's error for a body that is not the exposition format
            return MetricsSample(now, self.shown, self.engine, error="bad_response")
        engine = engine_of(series)
        if engine == SGLANG:
            return MetricsSample(now, self.shown, engine, ranks=self._sglang.read(series))
        if engine == VLLM:
            ranks, resets = self._vllm.read(series)
            return MetricsSample(now, self.shown, engine, ranks=ranks, resets=resets)
        return MetricsSample(now, self.shown, None)

    def poll(self, now: float) -> float:
        t0 = time.perf_counter()
        sample = self.scrape(now)
        with self.lock:
            self.scrapes_total += 1
            self.last_duration = time.perf_counter() - t0
            self.up = sample.error is None
            if sample.error is None:
                self.last_success = now
                self.engine = sample.engine or self.engine
            else:
                self.errors_total[sample.error] = self.errors_total.get(sample.error, 0) + 1
                self.last_error = sample.error
        self._say(sample)
        self.emit(self.server, sample, now)
        return self.next_delay()

    def _say(self, sample: MetricsSample) -> None:
        """Log the first failure of a run and the recovery; a body without speculative metrics once."""
        if sample.error is not None:
            self._failures += 1
            if "down" not in self._warned:
                self._warned.add("down")
                log.warning("%s: scrape failed (%s); backing off up to %.0f s (specwatch_server_metrics_errors_total)",
                            self.shown, sample.error, self.backoff_max)
            return
        if "down" in self._warned:
            log.warning("%s answers again after %d failed scrape(s)", self.shown, self._failures)
            self._warned.discard("down")
        self._failures = 0
        if sample.engine is None and "none" not in self._warned:
            self._warned.add("none")
            log.warning("%s has no speculative-decoding metrics (sglang:spec_accept_length or "
                        "vllm:spec_decode_num_drafts_total): is the server started with --enable-metrics "
                        "(SGLang) and speculative decoding on?", self.shown)
        elif sample.engine is not None:
            self._warned.discard("none")

    def next_delay(self) -> float:
        """Seconds until the next scrape: `interval`, doubled per consecutive failure, capped."""
        if self._failures == 0:
            return self.interval
        return min(self.backoff_max, self.interval * 2 ** (self._failures - 1))


class ServerMetricsCollector(Collector):
    """The scrapes' health (the samples themselves are rendered by metrics.PipelineCollector)."""

    def __init__(self, sources: list[ServerMetricsSource]):
        self.sources = sources

    def collect(self) -> Iterable:
        labels = ("server", "url")
        up = GaugeMetricFamily("specwatch_server_metrics_up", "1 when the last scrape of the engine's /metrics succeeded, else 0.", labels=labels)
        scrapes = CounterMetricFamily("specwatch_server_metrics_scrapes", "Scrapes of the engine's /metrics.", labels=labels)
        errors = CounterMetricFamily("specwatch_server_metrics_errors", "Failed scrapes by error (connection_error, timeout, http_<status>, bad_response).", labels=labels + ("error",))
        last = GaugeMetricFamily("specwatch_server_metrics_last_success_timestamp_seconds", "Wall time of the last successful scrape, seconds since the epoch.", labels=labels)
        took = GaugeMetricFamily("specwatch_server_metrics_scrape_duration_seconds", "How long the last scrape took (GET and parse), seconds.", labels=labels)
        engine = GaugeMetricFamily("specwatch_server_metrics_engine_info", "The engine told from the metric names (value 1).", labels=labels + ("engine",))
        resets = CounterMetricFamily("specwatch_server_metrics_resets", "vLLM counters that went backwards (an engine restart).", labels=labels)
        for src in self.sources:
            with src.lock:
                lv = [src.server, src.shown]
                up.add_metric(lv, 1.0 if src.up else 0.0)
                scrapes.add_metric(lv, src.scrapes_total)
                for kind, n in sorted(src.errors_total.items()):
                    errors.add_metric(lv + [kind], n)
                if src.last_success is not None:
                    last.add_metric(lv, src.last_success)
                if src.last_duration is not None:
                    took.add_metric(lv, src.last_duration)
                if src.engine is not None:
                    engine.add_metric(lv + [src.engine], 1.0)
                if src.engine == VLLM:
                    resets.add_metric(lv, src._vllm.resets_total)
        yield from (up, scrapes, errors, last, took, engine, resets)
