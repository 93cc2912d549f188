#!/usr/bin/env python3
"""Writes grafana/specwatch.json, the importable specwatch dashboard (Grafana >= 10).

The JSON is generated so that every panel has the same shape (datasource variable, legend,
units) and the queries live in one readable list below. Edit here, then run
`python grafana/build_dashboard.py`; `--check` exits 1 when the JSON is out of date (a test
runs it).

Variables: datasource, instance, server, dp_rank, tp_rank (the "rank" selectors: SGLang prints a
decode line per DP rank, each tagged with its TP rank; a single GPU has neither, and the "All"
value `.*` also matches the empty label). Panels that aggregate the fleet (model pair, tokens
per second per server) read the recording rules of deploy/prometheus/specwatch-rules.yml.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "specwatch.json"
DS = {"type": "prometheus", "uid": "${datasource}"}

INST = 'instance=~"$instance"'
SRV = f'{INST},server=~"$server"'
RK = f'{SRV},dp_rank=~"$dp_rank",tp_rank=~"$tp_rank"'
RANK = "{{server}} DP{{dp_rank}} TP{{tp_rank}}"
GPU = "{{instance}} GPU{{gpu}}"


def q(expr: str, legend: str = "", instant: bool = False, fmt: str | None = None) -> dict:
    t = {"datasource": DS, "expr": expr, "legendFormat": legend or "__auto", "range": not instant,
         "instant": instant}
    if fmt:
        t["format"] = fmt
    return t


def panel(kind: str, title: str, targets: list[dict], *, unit: str = "short", desc: str = "",
          w: int = 8, h: int = 8, **extra) -> dict:
    p = {"type": kind, "title": title, "description": desc, "datasource": DS,
         "targets": [dict(t, refId=chr(65 + i)) for i, t in enumerate(targets)],
         "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
         "options": {}, "_size": (w, h)}
    if kind == "timeseries":
        p["fieldConfig"]["defaults"]["custom"] = {"lineWidth": 1, "fillOpacity": 10, "showPoints": "never"}
        p["options"] = {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "min", "max"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}}
    elif kind == "stat":
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "background", "graphMode": "none", "textMode": "value_and_name"}
    elif kind == "state-timeline":
        p["options"] = {"showValue": "never", "mergeValues": True, "rowHeight": 0.8,
                        "legend": {"showLegend": True, "displayMode": "list", "placement": "bottom"}}
    elif kind == "table":
        p["options"] = {"showHeader": True}
        p["transformations"] = [{"id": "labelsToFields", "options": {}}] if extra.pop("labels_table", False) else []
    for k, v in extra.items():
        if k == "thresholds":
            p["fieldConfig"]["defaults"]["thresholds"] = {"mode": "absolute", "steps": v}
            p["fieldConfig"]["defaults"]["color"] = {"mode": "thresholds"}
        elif k == "mappings":
            p["fieldConfig"]["defaults"]["mappings"] = v
        elif k == "minmax":
            p["fieldConfig"]["defaults"]["min"], p["fieldConfig"]["defaults"]["max"] = v
        else:
            p[k] = v
    return p


def steps(*pairs) -> list[dict]:
    return [{"color": c, "value": v} for v, c in pairs]


def mapping(values: dict[str, tuple[str, str]]) -> list[dict]:
    return [{"type": "value", "options": {k: {"text": t, "color": c, "index": i}
                                           for i, (k, (t, c)) in enumerate(values.items())}}]


OK_BAD = mapping({"0": ("ok", "green"), "1": ("COLLAPSED", "red")})
UP_DOWN = mapping({"0": ("down", "red"), "1": ("up", "green")})

ROWS: list[tuple[str, list[dict]]] = [
    ("Speculative decoding", [
        panel("timeseries", "Accept length per rank", [q(f"specwatch_accept_length{{{RK}}}", RANK)],
              unit="none", desc="Tokens per request per verify round from the last decode line; 1.0 = no draft token accepted (collapse threshold 1.10).",
              thresholds=steps((None, "red"), (1.1, "orange"), (1.5, "green"))),
        panel("timeseries", "Accept rate per rank", [q(f"specwatch_accept_rate{{{RK}}}", RANK)],
              unit="percentunit", desc="As SGLang printed it: its formula changed in 0.5.6 and 0.5.11, so compare a server with itself, and decide collapse from accept length."),
        panel("state-timeline", "Collapse state per rank", [q(f"specwatch_acceptance_collapsed{{{RK}}}", RANK)],
              desc="The daemon's collapse rule: COLLAPSED after min_batches consecutive decode batches at or below max_accept_length with requests running.",
              mappings=OK_BAD, thresholds=steps((None, "green"), (1, "red"))),
        panel("timeseries", "Accept length per model pair (fleet)",
              [q("model_pair:specwatch_accept_length:avg", "mean {{model}} + {{draft_model}}"),
               q("model_pair:specwatch_accept_length:min", "worst rank {{model}} + {{draft_model}}")],
              unit="none", desc="Across every server running the same target and draft (recording rules model_pair:*; load deploy/prometheus/specwatch-rules.yml)."),
        panel("stat", "Collapsed ranks", [q(f"sum by (server) (specwatch_acceptance_collapsed{{{SRV}}})", "{{server}}", instant=True)],
              thresholds=steps((None, "green"), (1, "red"))),
        panel("table", "Speculative settings", [q(f"specwatch_speculative_info{{{SRV}}}", instant=True, fmt="table")],
              desc="From each server's server_args line: algorithm, target and draft, steps, topk, draft tokens."),
    ]),
    ("Throughput and load", [
        panel("timeseries", "Generated tokens per second per rank",
              [q(f"specwatch_gen_throughput_tokens_per_second{{{RK}}}", RANK)], unit="short",
              desc="gen throughput (token/s) of the last decode line of each rank."),
        panel("timeseries", "Generated tokens per second per server",
              [q('server:specwatch_gen_throughput_tokens_per_second:sum{server=~"$server"}', "{{server}}")],
              unit="short", desc="Sum over the ranks that printed a decode line in the last 5 minutes (recording rule; an idle server is 0)."),
        panel("timeseries", "Running and queued requests",
              [q(f"specwatch_running_requests{{{RK}}}", "running " + RANK),
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
    ("specwatch", [
        panel("stat", "Agents up", [q(f'up{{job="specwatch",{INST}}}', "{{instance}}", instant=True)],
              mappings=UP_DOWN, thresholds=steps((None, "red"), (1, "green"))),
        panel("timeseries", "Log lines read per second",
              [q(f"rate(specwatch_log_lines_total{{{SRV}}}[$__rate_interval])", "{{server}} {{kind}}")], unit="short"),
        panel("timeseries", "Malformed lines (last hour)",
              [q(f'increase(specwatch_log_lines_total{{{SRV},kind="malformed"}}[1h])', "{{server}}")], unit="short",
              desc="Batch lines specwatch could not read: a new SGLang format, or garbage in the log."),
        panel("timeseries", "Log file events",
              [q(f"increase(specwatch_log_rotations_total{{{INST}}}[1h])", "rotations {{path}}"),
               q(f"increase(specwatch_log_truncations_total{{{INST}}}[1h])", "truncations {{path}}"),
               q(f"increase(specwatch_log_read_errors_total{{{INST}}}[1h])", "read errors {{path}}"),
               q(f"increase(specwatch_log_long_lines_skipped_total{{{INST}}}[1h])", "long lines skipped {{path}}"),
               q(f"increase(specwatch_log_recovered_lines_total{{{INST}}}[1h])", "recovered lines {{path}}")],
              unit="short", desc="Per followed file, in the last hour."),
        panel("timeseries", "Log bytes read per second",
              [q(f"rate(specwatch_log_read_bytes_total{{{INST}}}[$__rate_interval])", "{{instance}} {{path}}")], unit="Bps"),
        panel("timeseries", "Age of the last log line",
              [q(f"time() - specwatch_log_last_line_timestamp_seconds{{{INST}}}", "{{instance}} {{path}}")], unit="s"),
        panel("stat", "Log files open", [q(f"specwatch_log_file_open{{{INST}}}", "{{path}}", instant=True)],
              mappings=mapping({"0": ("missing", "red"), "1": ("open", "green")})),
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
ANNOTATIONS = [
    {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
     "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"},
    {"datasource": DS, "enable": True, "iconColor": "red", "name": "Firing alerts",
     "expr": 'ALERTS{alertstate="firing",instance=~"$instance"}', "step": "60s",
     "titleFormat": "{{alertname}}", "textFormat": "{{severity}} {{server}} {{instance}}",
     "tagKeys": "alertname,severity", "useValueForTime": False},
]


def variable(name: str, label: str, query: str) -> dict:
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "definition": query, "query": {"query": query, "refId": name},
            "refresh": 2, "sort": 1, "multi": True, "includeAll": True, "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "hide": 0}


TEMPLATING = [
    {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
     "current": {}, "hide": 0, "refresh": 1, "regex": ""},
    variable("instance", "Instance", "label_values(specwatch_build_info, instance)"),
    variable("server", "Server", 'label_values(specwatch_log_lines_total{instance=~"$instance"}, server)'),
    variable("dp_rank", "DP rank", 'label_values(specwatch_accept_length{instance=~"$instance",server=~"$server"}, dp_rank)'),
    variable("tp_rank", "TP rank", 'label_values(specwatch_accept_length{instance=~"$instance",server=~"$server"}, tp_rank)'),
]


def build() -> dict:
    panels, y, pid = [], 0, 1
    for title, row in ROWS:
        panels.append({"type": "row", "title": title, "collapsed": False, "id": pid,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y, x, row_h = pid + 1, y + 1, 0, 0
        for p in row:
            w, h = p.pop("_size")
            if x + w > 24:
                x, y, row_h = 0, y + row_h, 0
            p["id"], p["gridPos"] = pid, {"h": h, "w": w, "x": x, "y": y}
            pid, x, row_h = pid + 1, x + w, max(row_h, h)
            panels.append(p)
        y += row_h
    return {
        "title": "specwatch: speculative decoding", "uid": "specwatch", "version": 1,
        "description": "SGLang speculative decoding (EAGLE-3) per server and rank, GPUs, and the specwatch agents. "
                       "Generated by grafana/build_dashboard.py.",
        "tags": ["specwatch", "sglang", "speculative-decoding", "gpu"],
        "editable": True, "graphTooltip": 1, "schemaVersion": 39, "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s", "timezone": "", "fiscalYearStartMonth": 0, "liveNow": False,
        "links": [], "weekStart": "",
        "annotations": {"list": ANNOTATIONS}, "templating": {"list": TEMPLATING}, "panels": panels,
    }


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
