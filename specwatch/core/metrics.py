"""Every specwatch Prometheus family from the log path, rendered at scrape time.

A custom collector (prometheus_client's recommended shape for scraped state): the pipeline
keeps plain Python state, `collect()` turns a snapshot of it into families. Names follow the
Prometheus conventions (base units, `_total` counters, `_ratio`, `_timestamp_seconds`). The table
in README.md "Metrics" lists each one; keep the two in sync.

Rank labels: `dp_rank`, `tp_rank`, `pp_rank`, `ep_rank` from the line's prefix tokens (empty
when the line has none, e.g. a single-GPU server; vLLM: `dp_rank` = its `Engine 00k` index), and
`engine` (`sglang`, `vllm`). SGLang prints stats only from attention-CP
rank 0 (0.5.23), so ATTN_CP/MOE_DP tokens are not labels; the full token string is in `rank`
of the JSON summary.
"""

from __future__ import annotations

import platform
import time
from typing import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from specwatch import __version__
from specwatch.config import source_servers
from specwatch.core.pipeline import KINDS, Pipeline
from specwatch.rules.base import alert_names_of
from specwatch.rules.summary import RANK_LABELS, rank_label_values

def add_scraped(families: tuple, server: str, sample) -> None:
    """The last scrape of an engine's /metrics (`server_metrics`) as series of the families
    (accept length, accept rate, running requests, per-position accept rate), labelled
    `source="server_metrics"` and `engine` beside the rank labels (the log's series have neither;
    the collapse rule adds its state of these ranks while /metrics decides: CollapseRule)."""
    if sample is None or sample.error is not None:
        return
    accept_length, accept_rate, running, positions = families
    for rm in sample.ranks:
        labels = dict(zip(RANK_LABELS, rank_label_values(server, rm.ranks)), source="server_metrics",
                      engine=sample.engine or "")
        for fam, v in ((accept_length, rm.accept_length), (accept_rate, rm.accept_rate),
                       (running, rm.running_requests)):
            if v is not None:
                fam.samples.append(Sample(fam.name, labels, v))
        for p, rate in enumerate(rm.position_accept_rates):
            positions.samples.append(Sample(positions.name, dict(labels, position=str(p)), rate))


class PipelineCollector(Collector):
    """Families from the log pipeline: per-rank decode/prefill state, line counts, rule state."""

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline

    def collect(self) -> Iterable:
        p = self.pipeline
        g = lambda name, doc: GaugeMetricFamily(name, doc, labels=RANK_LABELS)  # noqa: E731
        accept_length = g("specwatch_accept_length", "Accept length of the last decode batch line: tokens per request per verify round (1.0 = no draft token accepted).")
        accept_rate = g("specwatch_accept_rate", "Accept rate of the last decode batch line, as SGLang printed it (its formula depends on the SGLang version).")
        throughput = g("specwatch_gen_throughput_tokens_per_second", "Generated tokens per second over the last decode-log interval.")
        running = g("specwatch_running_requests", "Requests running in the last decode batch line.")
        queued = g("specwatch_queued_requests", "Requests waiting in the queue (last decode batch line).")
        usage = g("specwatch_token_usage_ratio", "KV cache token usage 0-1 of the last decode batch line (the full-attention pool on hybrid models).")
        tokens = g("specwatch_kv_tokens", "KV cache tokens in use (#token) in the last decode batch line.")
        graph = g("specwatch_cuda_graph_enabled", "1 when the last decode batch ran with a CUDA (or cpu/npu/musa) graph, else 0.")
        last_ts = g("specwatch_last_decode_batch_timestamp_seconds", "Log timestamp of the last decode batch line, seconds since the epoch.")
        positions = GaugeMetricFamily("specwatch_position_accept_rate", "Share of drafts whose token at this draft position (0 = the first drafted token) was accepted, over the last interval (0-1): vLLM's `Per-position acceptance rate` log field or its /metrics.", labels=RANK_LABELS + ("position",))
        decode_total = CounterMetricFamily("specwatch_decode_batches", "Decode batch lines read.", labels=RANK_LABELS)
        prefill_total = CounterMetricFamily("specwatch_prefill_batches", "Prefill batch lines read.", labels=RANK_LABELS)
        lines = CounterMetricFamily("specwatch_log_lines", "Log lines read, by kind (decode, prefill, other, malformed).", labels=("server", "kind"))
        overflow = CounterMetricFamily("specwatch_rank_overflow_lines", "Batch lines of ranks past limits.max_ranks_per_server, summed into the rank series dp_rank=\"other\".", labels=("server",))
        errors = CounterMetricFamily("specwatch_log_errors", "Errors in the log (a traceback is one), by kind (cuda_oom, nccl_timeout, shape_mismatch, health_check, watchdog_timeout, subprocess_crash, cuda_graph, device_assert, unsupported, shutdown, other).", labels=("server", "kind"))
        last_line = GaugeMetricFamily("specwatch_server_log_last_line_timestamp_seconds", "When the last line of this kind (decode, prefill, other, malformed, error) from the server's logs was read, seconds since the epoch (agent clock).", labels=("server", "kind"))
        spec = GaugeMetricFamily(
            "specwatch_speculative_info",
            "Speculative settings (value 1) from the server's startup server_args line, /server_info and its command line, merged.",
            labels=("server", "algorithm", "draft_model", "model", "num_steps", "eagle_topk", "num_draft_tokens"),
        )
        skew = GaugeMetricFamily("specwatch_log_clock_offset_seconds", "How far the timestamps of the server's logs run ahead of the wall clock (negative: behind), seconds, measured at the first live read and again when the stamps leave it (specwatch/core/logclock.py); 0 within 5 minutes. Hours off: `logs[].timezone` is wrong or unset (specwatch/core/logclock.py).", labels=("server",))
        for server, off in p.clocks.by_server().items():
            skew.add_metric([server], off)
        rule_errors = CounterMetricFamily("specwatch_rule_errors", "Exceptions a rule raised on a line or tick (specwatch/core/rulefaults.py): that rule's result for that line is dropped, the read goes on. Nonzero is a specwatch bug: see its log.", labels=("rule",))
        for name, n in dict(p.rule_faults.counts).items():
            rule_errors.add_metric([name], n)
        named = source_servers(p.config)
        with p.lock:
            ranks = list(p.ranks.values())
            servers = list(p.servers.items())
            for rs in ranks:
                d = rs.last_decode
                lv = rank_label_values(rs.server, rs.ranks, "sglang" if d is None else d.engine, rs.rank)
                decode_total.add_metric(lv, rs.decode_batches)
                prefill_total.add_metric(lv, rs.prefill_batches)
                if d is None:
                    continue
                for i, rate in enumerate(d.position_accept_rates or ()):
                    positions.add_metric(lv + [str(i)], rate)
                last_ts.add_metric(lv, d.timestamp)
                running.add_metric(lv, d.running_requests)
                queued.add_metric(lv, d.queued_requests)
                for fam, v in ((accept_length, d.accept_length), (accept_rate, d.accept_rate),
                               (throughput, d.gen_throughput), (usage, d.token_usage), (tokens, d.num_tokens)):
                    if v is not None:
                        fam.add_metric(lv, v)
                if d.graph_enabled is not None:
                    graph.add_metric(lv, 1.0 if d.graph_enabled else 0.0)
            for server, st in servers:
                if st.metrics is not None:
                    add_scraped((accept_length, accept_rate, running, positions), server, st.metrics)
                if server in named or any(st.lines.values()):  # not the host-name default no source uses
                    for kind in KINDS:
                        lines.add_metric([server, kind], st.lines[kind])
                    overflow.add_metric([server], p.rank_overflow.get(server, 0))
                for kind, n in st.errors.items():
                    errors.add_metric([server, kind], n)
                for kind, ts in st.last_line.items():
                    last_line.add_metric([server, kind], ts)
                if st.server_args is not None:
                    a = st.server_args.args
                    spec.add_metric([server] + [
                        "" if a.get(k) is None else str(a.get(k)) for k in (
                            "speculative_algorithm", "speculative_draft_model_path", "model_path",
                            "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
                    ], 1.0)
        yield from (accept_length, accept_rate, throughput, running, queued, usage, tokens, graph,
                    last_ts, positions, decode_total, prefill_total, lines, overflow, errors, last_line, spec, skew)
        yield rule_errors
        with p.lock:
            own = [f for rule in p.rules for f in rule.metric_families()]
        yield from own


class ServerCollector(Collector):
    """Families about each SGLang server from the process and HTTP API sources (pipeline state).

    `specwatch_server_up` follows the process source when it watches the server, else whether
    `/server_info` answered. CPU and memory are per role (`main`, `scheduler`, `detokenizer`,
    ...: see sources/process.py); the CPU counter drops when a process exits (a counter reset).
    """

    INFO_LABELS = ("server", "algorithm", "draft_model", "model", "sglang_version", "architecture",
                   "tp_size", "dp_size", "pp_size", "port")

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline

    def collect(self) -> Iterable:
        up = GaugeMetricFamily("specwatch_server_up", "1 while the SGLang server runs (its process is found; without process watching: its HTTP API answers), else 0.", labels=("server",))
        restarts = CounterMetricFamily("specwatch_server_restarts", "Restarts seen (the launcher's pid or start time changed) since specwatch started.", labels=("server",))
        start = GaugeMetricFamily("specwatch_server_start_time_seconds", "Start time of the SGLang launcher process, seconds since the epoch.", labels=("server",))
        cpu = CounterMetricFamily("specwatch_server_cpu_seconds", "User + system CPU time of the live SGLang processes of this role, seconds.", labels=("server", "role"))
        rss = GaugeMetricFamily("specwatch_server_resident_memory_bytes", "Resident memory of the SGLang processes of this role, bytes (shared pages counted once per process).", labels=("server", "role"))
        nproc = GaugeMetricFamily("specwatch_server_processes", "Live SGLang processes of this role.", labels=("server", "role"))
        info = GaugeMetricFamily("specwatch_server_info", "The SGLang server's settings and version (value 1): from its command line, /server_info and the log.", labels=self.INFO_LABELS)
        healthy = GaugeMetricFamily("specwatch_server_healthy", "1 when the last /health answer was 200, else 0 (absent until asked).", labels=("server",))
        lifetime = GaugeMetricFamily(
            "specwatch_server_avg_accept_length_lifetime",
            "Average accept length since the server started, tokens per verify round, from /server_info internal_states (not the per-interval value of the log).",
            labels=("server", "dp_rank"))
        with self.pipeline.lock:
            servers = list(self.pipeline.servers.items())
        for server, st in servers:
            proc, api, inf = st.process, st.api, st.info
            if st.process_watched:
                up.add_metric([server], 1.0 if proc is not None else 0.0)
            elif api is not None:
                up.add_metric([server], 1.0 if api.info is not None else 0.0)
            if st.process_watched or st.restarts:
                restarts.add_metric([server], st.restarts)
            if proc is not None:
                start.add_metric([server], proc.start_time)
                for role, u in sorted(proc.roles.items()):
                    cpu.add_metric([server, role], u.cpu_seconds)
                    rss.add_metric([server, role], u.rss_bytes)
                    nproc.add_metric([server, role], u.processes)
            if api is not None and api.healthy is not None:
                healthy.add_metric([server], 1.0 if api.healthy else 0.0)
            if inf is not None and api is not None and api.info is not None:
                for dp in inf.dp_states:
                    if dp.avg_spec_accept_length is not None:
                        lifetime.add_metric([server, str(dp.dp_rank)], dp.avg_spec_accept_length)
            if proc is not None or inf is not None:
                a = st.server_args.args if st.server_args else proc.args if proc else {}
                version = (proc.sglang_version if proc else None) or (inf.version if inf else None)
                arch = ",".join(inf.architectures) if inf else ""
                port = a.get("port", proc.port if proc else "")
                info.add_metric([server] + ["" if v is None else str(v) for v in (
                    a.get("speculative_algorithm"), a.get("speculative_draft_model_path"), a.get("model_path"),
                    version, arch, a.get("tp_size"), a.get("dp_size"), a.get("pp_size"), port)], 1.0)
        yield from (up, restarts, start, cpu, rss, nproc, info, healthy, lifetime)


class FollowerCollector(Collector):
    """Families about the followed files: bytes, rotations, truncations, skipped and lost lines."""

    def __init__(self, followers: Callable[[], dict[str, object]]):
        self.followers = followers  # path -> Follower

    def collect(self) -> Iterable:
        fams = {
            "bytes_total": CounterMetricFamily("specwatch_log_read_bytes", "Bytes read from the followed log file.", labels=("path",)),
            "rotations_total": CounterMetricFamily("specwatch_log_rotations", "Rotations (rename, delete/recreate) of the followed file seen.", labels=("path",)),
            "truncations_total": CounterMetricFamily("specwatch_log_truncations", "Truncations (copytruncate) of the followed file seen.", labels=("path",)),
            "long_lines_skipped_total": CounterMetricFamily("specwatch_log_long_lines_skipped", "Lines longer than follow.max_line_bytes, skipped.", labels=("path",)),
            "read_errors_total": CounterMetricFamily("specwatch_log_read_errors", "Errors opening or reading the followed file (retried).", labels=("path",)),
            "recovered_lines_total": CounterMetricFamily("specwatch_log_recovered_lines", "Lines read from rotated copies (<path>.1, .2.gz, -YYYYMMDD, ...): after a copytruncate, or rotated away while the reader was stopped.", labels=("path",)),
            # Neither lines nor bytes of a file never seen can be known: the unit is files.
            "rotated_files_lost_total": CounterMetricFamily("specwatch_log_rotated_files_lost", "Rotated files, or the unread rest of one, that could not be found or read (a gap in .N, a checkpointed file gone, a corrupt .gz): their lines were never read. Each is also a warning in the log with the path.", labels=("path",)),
            "bad_records_total": CounterMetricFamily("specwatch_log_bad_envelope_records", "Records of a Docker json-file or CRI log that do not read as that format (passed on as plain lines).", labels=("path",)),
        }
        last = GaugeMetricFamily("specwatch_log_last_line_timestamp_seconds", "Wall time the last line was read from the file, seconds since the epoch.", labels=("path",))
        is_open = GaugeMetricFamily("specwatch_log_file_open", "1 when the followed file is open, 0 while it does not exist or cannot be read.", labels=("path",))
        for path, f in self.followers().items():
            stage = getattr(f, "stage", None)  # a container log's Unwrap counts what it rejoins and drops
            for attr, fam in fams.items():
                fam.add_metric([path], getattr(f, attr, 0) + getattr(stage, attr, 0))
            at = getattr(f, "last_line_timestamp", None)
            if at is not None:
                last.add_metric([path], at)
            is_open.add_metric([path], 1.0 if getattr(f, "is_open", False) else 0.0)
        yield from fams.values()
        yield last
        yield is_open


ALERT_LABELS = ("alertname", "server", "rank", "severity", "alertstate")


def alerts_family(firing: Iterable) -> GaugeMetricFamily:
    """`specwatch_alerts`: one series of value 1 per firing alert (silenced or inhibited ones too),
    labelled like Prometheus' own `ALERTS` series (prometheus/prometheus `rules/alerting.go`:
    alertname, the alert's labels, `alertstate`). `rank` is empty for an alert of a whole server.
    specwatch's rules have no `pending` state (an alert fires once its evidence is complete), so
    `alertstate` is always `firing`; a resolved alert's series is gone at the next scrape."""
    fam = GaugeMetricFamily("specwatch_alerts", "One series (value 1) per alert firing now, silenced or inhibited ones too, like Prometheus' ALERTS: alertname, server, rank (empty for a whole server), severity, alertstate (always firing: specwatch has no pending state).", labels=ALERT_LABELS)
    seen = set()
    for a in firing:
        values = tuple(a.labels.get(k, "") for k in ALERT_LABELS[:-1]) + ("firing",)
        if values not in seen:  # alerts apart only by a label not kept here: one series
            seen.add(values)
            fam.add_metric(list(values), 1.0)
    return fam


class SelfCollector(Collector):
    """specwatch's own health: build, alerts, notifications."""

    def __init__(self, pipeline: Pipeline, notifiers: Callable[[], dict[str, object]],
                 reload_status: Callable[[], tuple[bool, float]] | None = None, store=None):
        self.pipeline = pipeline
        self.notifiers = notifiers
        self.store = store  # the daemon's StateStore
        self.reload_status = reload_status  # the daemon's (last reload ok, time of the last ok one)

    def collect(self) -> Iterable:
        build = GaugeMetricFamily("specwatch_build_info", "specwatch build (value 1).", labels=("version", "python_version"))
        build.add_metric([__version__, platform.python_version()], 1.0)
        yield build
        if self.reload_status is not None:
            ok, reloaded_at = self.reload_status()
            # Named like Prometheus' own prometheus_config_last_reload_success* pair.
            g = GaugeMetricFamily("specwatch_config_reload_success", "1 when the last config reload (SIGHUP) succeeded or none was tried, 0 when it was refused (the previous config keeps running).")
            g.add_metric([], 1.0 if ok else 0.0)
            yield g
            g = GaugeMetricFamily("specwatch_config_last_reload_success_timestamp_seconds", "Wall time of the last successful config load (start-up or reload), seconds since the epoch.")
            g.add_metric([], reloaded_at)
            yield g
        if self.store is not None:
            c = CounterMetricFamily("specwatch_state_write_errors", "Failed commits of the state to state_dir/state.db (disk full, I/O error); specwatch runs on from memory and writes it once it works again.")
            c.add_metric([], self.store.write_errors_total)
            yield c
            g = GaugeMetricFamily("specwatch_state_writable", "1 while the last commit to state_dir/state.db succeeded, 0 while state cannot be written (disk full, I/O error): what is read and sent meanwhile lives in memory only.")
            g.add_metric([], 1.0 if self.store.ok else 0.0)
            yield g
            g = GaugeMetricFamily("specwatch_state_reserve_bytes", "Space held in state_dir/state.reserve for the last commit before a stop on a full disk (0: none could be kept).")
            g.add_metric([], getattr(self.store, "reserve_bytes", 0))
            yield g
        firing = GaugeMetricFamily("specwatch_alerts_firing", "Alerts currently firing, by alert name (0 for every alert the rules can raise).", labels=("alertname",))
        counts = dict.fromkeys(alert_names_of(self.pipeline.rules), 0)
        with self.pipeline.lock:
            firing_alerts = list(self.pipeline.dispatcher.active.values())
        for a in firing_alerts:
            counts[a.name] = counts.get(a.name, 0) + 1
        for name, n in sorted(counts.items()):
            firing.add_metric([name], n)
        yield firing
        yield alerts_family(firing_alerts)
        store = self.pipeline.dispatcher.silences
        if store is not None:
            silences = GaugeMetricFamily("specwatch_silences", "Silences in the state directory, by state (active, pending, expired).", labels=("state",))
            now = time.time()
            with self.pipeline.lock:
                store.reload_if_changed()
                states = [s.state(now) for s in store.silences]
            for state in ("active", "pending", "expired"):
                silences.add_metric([state], states.count(state))
            yield silences
        sent = CounterMetricFamily("specwatch_notifications_sent", "Notifications delivered, by notifier.", labels=("notifier",))
        failed = CounterMetricFamily("specwatch_notifications_failed", "Failed delivery attempts, by notifier and reason (retry: will be retried; permanent: refused by the receiver, kept in the dead letter).", labels=("notifier", "reason"))
        depth = GaugeMetricFamily("specwatch_notification_queue_depth", "Notifications waiting for delivery, by notifier.", labels=("notifier",))
        last_ok = GaugeMetricFamily("specwatch_notification_last_success_timestamp_seconds", "Wall time of the last successful delivery.", labels=("notifier",))
        dead = GaugeMetricFamily("specwatch_notifications_dead_letter", "Notifications the receiver refused (e.g. HTTP 404), kept in state_dir and retried when it takes one again or its URL changes (`specwatch notifications list`).", labels=("notifier",))
        for name, notifier in self.notifiers().items():
            sent.add_metric([name], getattr(notifier, "sent_total", 0))
            for reason, c in sorted(getattr(notifier, "failed_total", {}).items()):
                failed.add_metric([name, reason], c)
            depth.add_metric([name], getattr(notifier, "queue_depth", 0))
            dead.add_metric([name], getattr(notifier, "dead_letter_count", 0))
            ok_at = getattr(notifier, "last_success_timestamp", None)
            if ok_at:
                last_ok.add_metric([name], ok_at)
        yield from (sent, failed, depth, last_ok, dead)
