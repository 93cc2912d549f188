#!/usr/bin/env python3
"""Writes grafana/specwatch.json, the importable specwatch dashboard (Grafana >= 10), with Grafana's
own dashboards-as-code SDK (PyPI `grafana-foundation-sdk`, typed builders kept by Grafana:
https://github.com/grafana/grafana-foundation-sdk).

Every panel has the same shape (datasource variable, legend, units) and the queries live in one
readable list below. Edit here, then run `python grafana/build_dashboard.py` (needs
`pip install '.[grafana]'`); `--check` exits 1 when the JSON is out of date (a test runs it).

Variables: datasource, job (the agents' scrape jobs), instance, server, engine (sglang, vllm), dp_rank, tp_rank (the "rank"
selectors: SGLang prints a decode line per DP rank, each tagged with its TP rank; a single GPU has
neither; a series without the label, e.g. one from a log without an engine label, shows under
"All": its value `.*` also matches the empty label). Panels that aggregate the fleet (model
pair, tokens per second per server) read the recording rules of deploy/prometheus/specwatch-rules.yml;
per-server ones keep `instance`, so boxes that all name their server alike stay one series each.

An agent with `server_metrics` exports the engine's /metrics beside the log's series, labelled
`source="server_metrics"` (docs/server-metrics.md). Per-rank panels show one line per rank
(`preferred`: the log's, the /metrics one for a server without a log), as the recording rules
do; "Accept length: log vs /metrics" shows both.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import bargauge, prometheus, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.builders.common import ReduceDataOptions, VizLegendOptions, VizTooltipOptions
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync, DataSourceRef, DataTransformerConfig, Threshold, ThresholdsMode, ValueMap, ValueMappingResult,
    VariableRefresh, VariableSort,
)

OUT = Path(__file__).resolve().parent / "specwatch.json"
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")

INST = 'instance=~"$instance"'
SRV = f'{INST},server=~"$server"'
RK = f'{SRV},engine=~"$engine",dp_rank=~"$dp_rank",tp_rank=~"$tp_rank"'
RANK = "{{server}} DP{{dp_rank}} TP{{tp_rank}}"
LOG, METRICS = 'source!="server_metrics"', 'source="server_metrics"'


def preferred(metric: str, sel: str = RK) -> str:
    """`metric`'s per-rank series from the log, or from the engine's /metrics for a server whose
    logs give none: one series per rank (deploy/prometheus/specwatch-rules.yml does the same)."""
    return f"{metric}{{{sel},{LOG}}} or on (instance, server) {metric}{{{sel},{METRICS}}}"
GPU = "{{instance}} GPU{{gpu}}"


def q(expr: str, legend: str = "", instant: bool = False, fmt: str | None = None) -> prometheus.Dataquery:
    t = prometheus.Dataquery().datasource(DS).expr(expr).legend_format(legend or "__auto")
    t = t.instant() if instant else t.range()
    return t.format(fmt) if fmt else t


def steps(*pairs) -> gd.ThresholdsConfig:
    return gd.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps([Threshold(v, c) for v, c in pairs])


def mapping(values: dict[str, tuple[str, str]]) -> list[ValueMap]:
    return [ValueMap({k: ValueMappingResult(text=t, color=c, index=i)
                      for i, (k, (t, c)) in enumerate(values.items())})]


KINDS = {"timeseries": timeseries.Panel, "stat": stat.Panel, "state-timeline": statetimeline.Panel,
         "table": table.Panel, "bargauge": bargauge.Panel}


def panel(kind: str, title: str, targets: list[prometheus.Dataquery], *, unit: str = "short", desc: str = "",
          w: int = 8, h: int = 8, thresholds: gd.ThresholdsConfig | None = None,
          mappings: list[ValueMap] | None = None, minmax: tuple[float, float] | None = None,
          labels_table: bool = False):
    """One panel of `kind`, `w` x `h` grid units, its targets lettered A, B, ..."""
    p = KINDS[kind]().title(title).description(desc).datasource(DS).unit(unit).span(w).height(h)
    for i, t in enumerate(targets):
        p = p.with_target(t.ref_id(chr(65 + i)))
    if kind == "timeseries":
        p = (p.line_width(1).fill_opacity(10).show_points(common.VisibilityMode.NEVER)
             .legend(VizLegendOptions().display_mode(common.LegendDisplayMode.TABLE)
                     .placement(common.LegendPlacement.BOTTOM).show_legend(True)
                     .calcs(["lastNotNull", "min", "max"]))
             .tooltip(VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.DESCENDING)))
    elif kind == "stat":
        p = (p.reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
             .color_mode(common.BigValueColorMode.BACKGROUND).graph_mode(common.BigValueGraphMode.NONE)
             .text_mode(common.BigValueTextMode.VALUE_AND_NAME))
    elif kind == "state-timeline":
        p = (p.show_value(common.VisibilityMode.NEVER).merge_values(True).row_height(0.8)
             .legend(VizLegendOptions().show_legend(True).display_mode(common.LegendDisplayMode.LIST)
                     .placement(common.LegendPlacement.BOTTOM)))
    elif kind == "bargauge":
        p = (p.reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
             .orientation(common.VizOrientation.HORIZONTAL).display_mode(common.BarGaugeDisplayMode.GRADIENT))
    elif kind == "table":
        p = p.show_header(True)
        if labels_table:
            p = p.transformations([DataTransformerConfig(id_val="labelsToFields", options={})])
    if thresholds is not None:
        p = p.thresholds(thresholds).color_scheme(gd.FieldColor().mode("thresholds"))
    if mappings is not None:
        p = p.mappings(mappings)
    if minmax is not None:
        p = p.min(minmax[0]).max(minmax[1])
    return p


OK_BAD = mapping({"0": ("ok", "green"), "1": ("COLLAPSED", "red")})
UP_DOWN = mapping({"0": ("down", "red"), "1": ("up", "green")})

ROWS: list[tuple[str, list[dict]]] = [
    ("Speculative decoding", [
        panel("timeseries", "Accept length per rank", [q(preferred("specwatch_accept_length"), RANK)],
              unit="none", desc="Tokens per request per verify round from the last decode line; 1.0 = no draft token accepted (collapse threshold 1.10).",
              thresholds=steps((None, "red"), (1.1, "orange"), (1.5, "green"))),
        panel("timeseries", "Accept rate per rank", [q(preferred("specwatch_accept_rate"), RANK)],
              unit="percentunit", desc="As SGLang printed it: its formula changed in 0.5.6 and 0.5.11, so compare a server with itself, and decide collapse from accept length."),
        panel("state-timeline", "Collapse state per rank", [q(preferred("specwatch_acceptance_collapsed"), RANK)],
              desc="The daemon's collapse rule: COLLAPSED after min_batches consecutive decode batches at or below max_accept_length with requests running.",
              mappings=OK_BAD, thresholds=steps((None, "green"), (1, "red"))),
        panel("timeseries", "Accept length per model pair (fleet)",
              [q("model_pair:specwatch_accept_length:avg", "mean {{model}} + {{draft_model}}"),
               q("model_pair:specwatch_accept_length:min", "worst rank {{model}} + {{draft_model}}")],
              unit="none", desc="Across every server running the same target and draft (recording rules model_pair:*; load deploy/prometheus/specwatch-rules.yml)."),
        panel("stat", "Collapsed ranks", [q(f"sum by (instance, server) ({preferred('specwatch_acceptance_collapsed', SRV)})", "{{server}} {{instance}}", instant=True)],
              thresholds=steps((None, "green"), (1, "red"))),
        panel("table", "Speculative settings", [q(f"specwatch_speculative_info{{{SRV}}}", instant=True, fmt="table")],
              desc="From each server's server_args line: algorithm, target and draft, steps, topk, draft tokens."),
    ]),
    ("Per-position acceptance and the engine's /metrics", [
        panel("timeseries", "Per-position accept rate", [q(f"specwatch_position_accept_rate{{{RK}}}", RANK + " pos {{position}} {{source}}")],
              unit="percentunit", minmax=(0, 1),
              desc="Share of drafts whose token at this draft position (0 = the first drafted token) was accepted, over the last interval. "
                   "Positions past k that accept almost nothing: the draft is longer than what it learned (a smaller num_speculative_tokens)."),
        panel("bargauge", "Per-position accept rate now", [q(f"specwatch_position_accept_rate{{{RK}}}", RANK + " pos {{position}}", instant=True)],
              unit="percentunit", minmax=(0, 1), thresholds=steps((None, "red"), (0.2, "orange"), (0.5, "green")),
              desc="The last interval's rate per rank and position: a falling staircase is normal, a cliff after position k is not."),
        panel("timeseries", "Accept length: log vs /metrics",
              [q(f"specwatch_accept_length{{{RK},{LOG}}}", "log " + RANK),
               q(f"specwatch_accept_length{{{RK},{METRICS}}}", "/metrics {{server}} DP{{dp_rank}} TP{{tp_rank}} {{engine}}")],
              unit="none", desc="The log's decode lines against the engine's own /metrics (server_metrics): for the same server the lines overlap "
                                "(SGLang's gauge holds the last decode-log interval, vLLM's counters give the scrape interval's mean). "
                                "/metrics leaves TP0 and DP0 of a single engine unlabelled."),
        panel("state-timeline", "MetricsLogDisagreement",
              [q(f'specwatch_alerts_firing{{{INST},alertname="MetricsLogDisagreement"}}', "{{instance}}")],
              desc="The agent's cross-check (rules.metrics_crosscheck): the log and /metrics of one server disagreed on accept length for several scrapes, "
                   "so one of them is another server's.",
              mappings=mapping({"0": ("agree", "green"), "1": ("DISAGREE", "orange")}), thresholds=steps((None, "green"), (1, "orange")),
              w=24, h=5),
    ]),
    ("Throughput and load", [
        panel("timeseries", "Generated tokens per second per rank",
              [q(f"specwatch_gen_throughput_tokens_per_second{{{RK}}}", RANK)], unit="short",
              desc="gen throughput (token/s) of the last decode line of each rank."),
        panel("timeseries", "Generated tokens per second per server",
              [q(f"server:specwatch_gen_throughput_tokens_per_second:sum{{{SRV}}}", "{{server}} {{instance}}")],
              unit="short", desc="Sum over the ranks that printed a decode line in the last 5 minutes (recording rule; an idle server is 0)."),
        panel("timeseries", "Running and queued requests",
              [q(preferred("specwatch_running_requests"), "running " + RANK),
               q(f"specwatch_queued_requests{{{RK}}}", "queued " + RANK)], unit="short"),
        panel("timeseries", "KV cache token usage", [q(f"specwatch_token_usage_ratio{{{RK}}}", RANK)],
              unit="percentunit", minmax=(0, 1)),
        panel("timeseries", "KV tokens in use", [q(f"specwatch_kv_tokens{{{RK}}}", RANK)], unit="short"),
        panel("timeseries", "Decode lines per second",
              [q(f"rate(specwatch_decode_batches_total{{{RK}}}[$__rate_interval])", RANK),
               q(f"rate(specwatch_prefill_batches_total{{{RK}}}[$__rate_interval])", "prefill " + RANK)], unit="short",
              desc="SGLang prints a decode line every --decode-log-interval (40) decode rounds while requests run."),
        panel("timeseries", "Age of the last decode line",
              [q(f"time() - specwatch_last_decode_batch_timestamp_seconds{{{RK}}}", RANK)], unit="s",
              desc="Log timestamp of the last decode line against now (read in log_timezone / logs[].timezone, default the agent's local zone)."),
        panel("stat", "CUDA graph", [q(f"specwatch_cuda_graph_enabled{{{RK}}}", RANK, instant=True)],
              mappings=mapping({"0": ("off", "orange"), "1": ("on", "green")})),
    ]),
    ("GPU", [
        panel("timeseries", "GPU utilisation", [q(f"specwatch_gpu_utilization_ratio{{{INST}}}", GPU)],
              unit="percentunit", minmax=(0, 1)),
        panel("timeseries", "GPU memory used", [q(f"specwatch_gpu_memory_used_bytes{{{INST}}}", "used " + GPU),
                                                q(f"specwatch_gpu_memory_total_bytes{{{INST}}}", "total " + GPU)],
              unit="bytes"),
        panel("timeseries", "GPU power", [q(f"specwatch_gpu_power_watts{{{INST}}}", GPU),
                                          q(f"rate(specwatch_gpu_energy_joules_total{{{INST}}}[$__rate_interval])", "mean " + GPU)],
              unit="watt"),
        panel("timeseries", "GPU temperature", [q(f"specwatch_gpu_temperature_celsius{{{INST}}}", GPU)], unit="celsius",
              thresholds=steps((None, "green"), (80, "orange"), (87, "red"))),
        panel("timeseries", "GPU clocks", [q(f"specwatch_gpu_sm_clock_hertz{{{INST}}}", "SM " + GPU),
                                           q(f"specwatch_gpu_memory_clock_hertz{{{INST}}}", "memory " + GPU)], unit="hertz"),
        panel("state-timeline", "Clock throttle reasons",
              [q(f'specwatch_gpu_clock_event_reason_active{{{INST},reason!="gpu_idle"}}', GPU + " {{reason}}")],
              desc="sw_power_cap is normal at full load; thermal, hw_slowdown and power brake are not.",
              mappings=mapping({"0": ("", "transparent"), "1": ("active", "orange")})),
        panel("table", "XID errors since specwatch started",
              [q(f"specwatch_gpu_xid_errors_total{{{INST}}}", instant=True, fmt="table"),
               q(f"time() - specwatch_gpu_xid_last_timestamp_seconds{{{INST}}}", instant=True, fmt="table")],
              desc="Per GPU and XID: count, and seconds since the last one. 79 = fell off the bus, 48/94/95 = ECC, 13/31/43 = application fault."),
        panel("timeseries", "ECC errors (volatile)", [q(f"specwatch_gpu_ecc_errors_total{{{INST}}}", GPU + " {{type}}")],
              unit="short"),
        panel("timeseries", "PCIe replays per second",
              [q(f"rate(specwatch_gpu_pcie_replays_total{{{INST}}}[$__rate_interval])", GPU)], unit="short"),
        panel("stat", "NVML", [q(f"specwatch_gpu_up{{{INST}}}", "{{instance}}", instant=True),
                               q(f"specwatch_gpu_device_up{{{INST}}}", GPU, instant=True)],
              mappings=UP_DOWN, thresholds=steps((None, "red"), (1, "green"))),
    ]),
    ("SGLang server", [
        panel("stat", "Server process", [q(f"specwatch_server_up{{{SRV}}}", "{{server}}", instant=True)],
              mappings=UP_DOWN, thresholds=steps((None, "red"), (1, "green")),
              desc="From the process source (psutil)."),
        panel("timeseries", "Server restarts", [q(f"increase(specwatch_server_restarts_total{{{SRV}}}[1h])", "{{server}}")],
              unit="short", desc="Restarts in the last hour (a new pid or start time of the SGLang server)."),
    ]),
    ("Sources: followed files, journal, engine /metrics", [
        panel("timeseries", "Log lines read per second",
              [q(f"rate(specwatch_log_lines_total{{{SRV}}}[$__rate_interval])", "{{server}} {{kind}}")], unit="short",
              desc="Per server, from every log source (files, container logs, journal), by kind."),
        panel("timeseries", "Lines not understood (last hour)",
              [q(f'increase(specwatch_log_lines_total{{{SRV},kind=~"malformed|unrecognized"}}[1h])', "{{server}} {{kind}}")], unit="short",
              desc="malformed: batch lines specwatch could not read (a new SGLang format, or garbage in the log); "
                   "unrecognized: lines the source's log format (logs[].format) did not match."),
        panel("timeseries", "Log file events",
              [q(f"increase(specwatch_log_rotations_total{{{INST}}}[1h])", "rotations {{path}}"),
               q(f"increase(specwatch_log_truncations_total{{{INST}}}[1h])", "truncations {{path}}"),
               q(f"increase(specwatch_log_read_errors_total{{{INST}}}[1h])", "read errors {{path}}"),
               q(f"increase(specwatch_log_long_lines_skipped_total{{{INST}}}[1h])", "long lines skipped {{path}}"),
               q(f"increase(specwatch_log_recovered_lines_total{{{INST}}}[1h])", "recovered lines {{path}}")],
              unit="short", desc="Per followed file, in the last hour."),
        panel("timeseries", "Log bytes read per second",
              [q(f"rate(specwatch_log_read_bytes_total{{{INST}}}[$__rate_interval])", "{{instance}} {{path}}")], unit="Bps",
              desc="Per source: a file's path, or journal:UNIT[@DIRECTORY]."),
        panel("timeseries", "Age of the last log line",
              [q(f"time() - specwatch_log_last_line_timestamp_seconds{{{INST}}}", "{{instance}} {{path}}")], unit="s"),
        panel("stat", "Log files open", [q(f"specwatch_log_file_open{{{INST}}}", "{{path}}", instant=True)],
              mappings=mapping({"0": ("missing", "red"), "1": ("open", "green")})),
        panel("stat", "Journal sources", [q(f"specwatch_journal_up{{{INST}}}", "{{instance}} {{path}}", instant=True)],
              mappings=UP_DOWN, thresholds=steps((None, "red"), (1, "green")),
              desc="logs[].journal: up while journalctl runs and reports no problem; down: the agent's log has an ERROR line saying what to fix "
                   "(no journal files, no permission: the systemd-journal group)."),
        panel("timeseries", "Journal cursor lost (last hour)",
              [q(f"increase(specwatch_journal_cursor_lost_total{{{INST}}}[1h])", "{{instance}} {{path}}")], unit="short",
              desc="Restarts whose saved cursor was rotated and vacuumed away: reading resumed at the oldest entry after its time, lines in between are lost."),
        panel("stat", "Engine /metrics scrapes", [q(f"specwatch_server_metrics_up{{{SRV}}}", "{{server}} {{url}}", instant=True)],
              mappings=UP_DOWN, thresholds=steps((None, "red"), (1, "green")),
              desc="server_metrics[]: up when the last scrape of the engine's /metrics succeeded."),
        panel("timeseries", "Engine /metrics scrape errors (last hour)",
              [q(f"increase(specwatch_server_metrics_errors_total{{{SRV}}}[1h])", "{{server}} {{error}}")], unit="short",
              desc="By error: connection_error, timeout, http_<status>, bad_response. A failing scrape is retried with backoff."),
        panel("timeseries", "Engine /metrics scrape duration",
              [q(f"specwatch_server_metrics_scrape_duration_seconds{{{SRV}}}", "{{server}} {{url}}"),
               q(f"time() - specwatch_server_metrics_last_success_timestamp_seconds{{{SRV}}}", "since the last good scrape {{server}}")],
              unit="s", desc="GET and parse of the last scrape, and the age of the last successful one."),
        panel("timeseries", "vLLM counter resets (last hour)",
              [q(f"increase(specwatch_server_metrics_resets_total{{{SRV}}}[1h])", "{{server}} {{url}}")], unit="short",
              desc="vLLM's spec-decode counters went backwards: the engine restarted. That interval is read from zero."),
        panel("table", "Engines", [q(f"specwatch_server_metrics_engine_info{{{SRV}}}", instant=True, fmt="table")],
              desc="The engine behind each /metrics URL, told from its metric names."),
    ]),
    ("specwatch", [
        panel("stat", "Agents up", [q(f'up{{job=~"$job",{INST}}}', "{{instance}}", instant=True)],
              mappings=UP_DOWN, thresholds=steps((None, "red"), (1, "green"))),
        panel("stat", "Alerts firing (agent)", [q(f"sum by (alertname) (specwatch_alerts_firing{{{INST}}})", "{{alertname}}", instant=True)],
              thresholds=steps((None, "green"), (1, "red"))),
        panel("timeseries", "Alert delivery",
              [q(f"increase(specwatch_notifications_sent_total{{{INST}}}[1h])", "sent {{notifier}}"),
               q(f"increase(specwatch_notifications_failed_total{{{INST}}}[1h])", "failed {{notifier}} {{reason}}"),
               q(f"specwatch_notification_queue_depth{{{INST}}}", "queued {{notifier}}")],
              unit="short", desc="Notifications sent and failed in the last hour, and waiting now."),
        panel("stat", "Since last delivery",
              [q(f"time() - specwatch_notification_last_success_timestamp_seconds{{{INST}}}", "{{instance}} {{notifier}}", instant=True)],
              unit="s", thresholds=steps((None, "green"))),
        panel("stat", "Config reload", [q(f"specwatch_config_reload_success{{{INST}}}", "{{instance}}", instant=True),
                                        q(f"time() - specwatch_config_last_reload_success_timestamp_seconds{{{INST}}}", "{{instance}} age", instant=True)],
              mappings=mapping({"0": ("FAILED", "red"), "1": ("ok", "green")})),
        panel("table", "Agents", [q(f"specwatch_build_info{{{INST}}}", instant=True, fmt="table")]),
    ]),
]

# Every rule in specwatch-rules.yml that fires is an ALERTS series; shown as regions on all panels.
# titleFormat/textFormat/step/tagKeys are the Prometheus data source's annotation fields, which the
# SDK's typed AnnotationQuery does not model: added to its JSON in `build`.
FIRING = {"step": "60s", "titleFormat": "{{alertname}}", "textFormat": "{{severity}} {{server}} {{instance}}",
          "tagKeys": "alertname,severity", "useValueForTime": False}


def variable(name: str, label: str, query: str, all_value: str | None = ".*") -> gd.QueryVariable:
    v = (gd.QueryVariable(name).label(label).datasource(DS).query(query)
         .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
         .multi(True).include_all(True))
    return v.all_value(all_value) if all_value is not None else v


VARIABLES = [
    gd.DatasourceVariable("datasource").label("Data source").type("prometheus"),
    # The scrape job(s) of the agents; "All" is every listed job (no .* value: `up` of other jobs
    # would show in "Agents up").
    variable("job", "Job", "label_values(specwatch_build_info, job)", all_value=None),
    variable("instance", "Instance", 'label_values(specwatch_build_info{job=~"$job"}, instance)'),
    variable("server", "Server", 'label_values(specwatch_log_lines_total{instance=~"$instance"}, server)'),
    variable("engine", "Engine", 'label_values(specwatch_accept_length{instance=~"$instance",server=~"$server"}, engine)'),
    variable("dp_rank", "DP rank", 'label_values(specwatch_accept_length{instance=~"$instance",server=~"$server",engine=~"$engine"}, dp_rank)'),
    variable("tp_rank", "TP rank", 'label_values(specwatch_accept_length{instance=~"$instance",server=~"$server",engine=~"$engine"}, tp_rank)'),
]


def build() -> dict:
    b = (gd.Dashboard("specwatch: speculative decoding").uid("specwatch").version(1)
         .description("SGLang and vLLM speculative decoding (EAGLE-3) per server and rank, GPUs, log and /metrics sources, and the specwatch agents. "
                      "Generated by grafana/build_dashboard.py.")
         .tags(["specwatch", "sglang", "vllm", "speculative-decoding", "gpu"])
         .editable().tooltip(DashboardCursorSync.CROSSHAIR).time("now-6h", "now").refresh("30s").timezone("")
         .annotation(gd.AnnotationQuery().name("Firing alerts").datasource(DS).enable(True).icon_color("red")
                     .expr('ALERTS{alertstate="firing",instance=~"$instance"}')))
    for v in VARIABLES:
        b = b.with_variable(v)
    for title, row in ROWS:
        b = b.with_row(gd.Row(title))
        for p in row:
            b = b.with_panel(p)
    d = json.loads(json.dumps(b.build(), cls=JSONEncoder))
    for i, p in enumerate(d["panels"], 1):
        p["id"] = i
    for a in d["annotations"]["list"]:
        a.update(FIRING)
    return d


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python grafana/build_dashboard.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
