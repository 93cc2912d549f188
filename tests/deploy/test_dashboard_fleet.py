"""The Grafana dashboard and the fleet rules against real data: two `specwatch run` agents with
different `server` names follow logs written while a real Prometheus scrapes them every second
with deploy/prometheus/prometheus.yml's relabelling and specwatch-rules.yml loaded.

Agent "a" (127.0.0.1) follows generated SGLang 0.5.23 lines (two DP ranks, collapsing half-way)
and has NVML answered by tests/fake_pynvml.py (two H200s, an XID 79), so every GPU panel has
data on this GPU-less machine. It also follows a real journal (systemd-journal-remote files)
and scrapes a real HTTP server serving SGLang 0.5.23-shaped /metrics for the same server,
whose accept length (4.5) is not the log's: MetricsLogDisagreement fires. Agent "b"
(localhost) follows generated 0.5.6 lines (no rank tokens) followed by the real Kimi-K2.5
sample, with the real NVML, which finds no driver here (specwatch_gpu_up 0), a journal folder
that does not exist (specwatch_journal_up 0), and scrapes a vLLM-shaped /metrics of a second
server "v" that has no log (per-position acceptance, one engine restart). Both /metrics
servers answer 503 until each agent has counted a failed scrape. Every panel query is run
through the Prometheus HTTP API with its variables filled in as Grafana would.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

import prom
from engine_metrics import EngineMetrics
from journal_files import JournalDir, need_tools
from procs import SAMPLES, SpecwatchProcess, decode_line, free_port, scrape, wait_for
from slack_endpoint import SlackEndpoint

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "grafana" / "specwatch.json"
EXAMPLE = ROOT / "deploy" / "prometheus" / "prometheus.yml"
TESTS = ROOT / "tests"
# Exported by the SGLang process source (issue 4), not by this checkout yet. While absent from
# /metrics their panels are only checked for syntax; once exported they are checked like all.
PENDING = {"specwatch_server_up", "specwatch_server_restarts_total"}
RATE_INTERVAL = "5s"  # Grafana: max(4 x scrape interval, ...), scrape interval 1s here
# metric names in a query: specwatch_*, recording rules (level:metric:op), up{...}, ALERTS{...}
NAME = re.compile(r"\b(specwatch_[a-z0-9_]+|(?:model_pair|server):[a-z0-9_:]+|up(?=\{)|ALERTS(?=\{))")

# Only agent b's vLLM /metrics gives these (SGLang's /metrics and logs have no positions, no
# counters to reset): empty when agent a alone is selected.
VLLM_ONLY = {"specwatch_position_accept_rate", "specwatch_server_metrics_resets_total"}
A_METRICS = 4.5  # a's /metrics accept length, far from every accept len of its log
POSITIONS = [8, 5, 2]  # v's accepted tokens per position per 10 drafts: rates 0.8, 0.5, 0.2; accept length 2.5
JOURNAL_LINES = ["INFO:     Started server process [4242]", "INFO:     Application startup complete."]

pytestmark = pytest.mark.skipif(not prom.available(), reason=f"{prom.PROMETHEUS} not installed "
                                "(Debian package prometheus; .ci/run installs it)")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def targets(d: dict) -> list[tuple[str, str]]:
    """(panel title, expr) of every query."""
    return [(p["title"], t["expr"]) for p in d["panels"] for t in p.get("targets", [])]


def fill(expr: str, values: dict[str, str]) -> str:
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("$" + name, values[name])
    assert "$" not in expr, expr
    return expr


def regex_value(*values: str) -> str:
    """Selected values as Grafana writes them into =~"...": regex-escaped, several as (a|b)."""
    escaped = [re.escape(v).replace("\\", "\\\\") for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def write_slowly(path: Path, lines: list[str], chunks: int, pause: float) -> threading.Thread:
    def run():
        n = len(lines)
        for i in range(chunks):
            with open(path, "a") as f:
                f.writelines(lines[i * n // chunks:(i + 1) * n // chunks])
            time.sleep(pause)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def generated(version: str, n: int, ranks: int, collapse_after: int | None = None) -> list[str]:
    cmd = [sys.executable, str(TESTS / "sglang_lines.py"), "--version", version, "--lines", str(n),
           "--ranks", str(ranks)]
    if collapse_after is not None:
        cmd += ["--collapse-after", str(collapse_after)]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines(keepends=True)


def lines_read(port: int, server: str) -> float:
    return sum(v for (name, labels), v in scrape(port).items()
               if name == "specwatch_log_lines_total" and ("server", server) in labels)


def agent_config(path: Path, port: int, server: str, log: Path, state: Path, gpu: bool, slack: str,
                 journal: Path, metrics: dict) -> Path:
    path.write_text(yaml.safe_dump({
        "server": server, "follow": {"poll_interval": "0.2s"},
        # the server's log file and its unit's journal: one SGLang server, both named
        "logs": [{"path": str(log), "server": server},
                 {"journal": {"unit": "sglang.service", "directory": str(journal)}, "server": server}],
        "server_metrics": [dict(metrics, interval="1s", timeout="500ms", backoff_max="1s")],
        "rules": {"metrics_crosscheck": {"intervals": 1}},
        "metrics": {"listen_port": port}, "state_dir": str(state),
        "gpu": {"enabled": gpu, "interval": "0.5s"},
        # Watch one SGLang port no process here uses: the server panels get deterministic data
        # (down, no restarts) whatever else runs on the machine.
        "process": {"interval": "0.5s", "servers": {free_port(): server}},
        "alerts": {"slack": {"webhook_url": slack, "backoff_initial": "0.1s"}},
    }))
    return path


class Traffic:
    """The engines serving requests: every 0.2 s a new decode-log interval in SGLang's gauges
    (each scrape sees fresh values) and 10 more drafts in vLLM's counters."""

    def __init__(self, sglang: EngineMetrics, vllm: EngineMetrics):
        self.sglang, self.vllm = sglang, vllm
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        i = 0
        while not self.stop.wait(0.2):
            i += 1
            for dp in (0, 1):
                self.sglang.set_sglang(dp, accept_length=A_METRICS + 0.01 * (i % 2), accept_rate=0.9, running=40)
            self.vllm.advance_vllm(drafts=10, accepted_per_pos=POSITIONS, running=16)


def scrape_job(ports: tuple[int, int], sd_file: Path) -> dict:
    """The example's `specwatch` job, pointed at the two agents and a file_sd file."""
    [job] = yaml.safe_load(EXAMPLE.read_text())["scrape_configs"]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{ports[0]}", f"localhost:{ports[1]}"]}]
    job["file_sd_configs"] = [{"files": [str(sd_file)], "refresh_interval": "1s"}]
    job["scrape_interval"] = job["scrape_timeout"] = "1s"
    return job


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    need_tools()  # systemd-journal-remote and journalctl; before anything is started
    tmp = tmp_path_factory.mktemp("fleet")
    slack = SlackEndpoint()
    log_a, log_b = tmp / "a.log", tmp / "b.log"
    lines_a = generated("0.5.23", 1200, 2, collapse_after=600)
    # b ends on the real collapse sample plus a third low batch (the daemon's rule needs three)
    # and one malformed batch line.
    lines_b = (generated("0.5.6", 300, 1) + (SAMPLES / "kimi-k25-eagle3-collapse.log").read_text().splitlines(True)
               + [decode_line(1.04, "16:32:46"), "[2026-02-23 16:33:00 TP0] Decode batch, #running-req: 3, accept len: banana\n"])
    journal_a, journal_b = JournalDir(tmp / "journal-a"), tmp / "journal-b"
    journal_a.append(JOURNAL_LINES)
    sglang, vllm = EngineMetrics("sglang", dp_size=2), EngineMetrics("vllm", num_spec_tokens=len(POSITIONS))
    sglang.status = vllm.status = 503
    ports = free_port(), free_port()
    a = SpecwatchProcess(agent_config(tmp / "a.yaml", ports[0], "a", log_a, tmp / "sa", True, slack.url,
                                      journal_a.path, {"url": sglang.url, "server": "a"}), ports[0],
                         argv=[sys.executable, str(TESTS / "fake_gpu_specwatch.py"), "run", "--config", str(tmp / "a.yaml")])
    b = SpecwatchProcess(agent_config(tmp / "b.yaml", ports[1], "b", log_b, tmp / "sb", True, slack.url,
                                      journal_b, {"url": vllm.url, "server": "v"}), ports[1])
    sd = tmp / "targets.yml"
    # a bare host name (gets :9849) and an opted-out one, as in targets/specwatch-example.yml
    sd.write_text(yaml.safe_dump([{"targets": ["127.0.0.2"]}, {"targets": ["127.0.0.3"], "labels": {"specwatch": "off"}}]))
    # Alerts fire at once here (for: 0s) so the ALERTS annotation has data within the test.
    p = prom.Prometheus(tmp / "prometheus", [scrape_job(ports, sd)], [prom.rules_firing_at_once()])
    procs = [a, b]
    traffic = None
    try:
        for x in procs:
            x.start(wait=False)
        p.start()
        for x in procs:
            wait_for(x._up, what=f"agent on {x.port}")
        # Prometheus applies new targets after up to 5 s (discovery reload interval): the
        # logs are written once both agents are scraped, so counters grow under its eyes.
        wait_for(lambda: sum(t["health"] == "up" for t in p.targets()["activeTargets"]) == 2,
                 timeout=30, what="both agents scraped", interval=0.2)
        for port, eng in ((ports[0], sglang), (ports[1], vllm)):
            wait_for(lambda: any(n == "specwatch_server_metrics_errors_total" for n, _ in scrape(port)),
                     timeout=20, what=f"a failed scrape of {eng.url} counted")
            eng.status = 200
        traffic = Traffic(sglang, vllm)
        writers = [write_slowly(log_a, lines_a, 8, 0.4), write_slowly(log_b, lines_b, 8, 0.4)]
        for w in writers:
            w.join(30)
        for port, server, n in ((ports[0], "a", len(lines_a) + len(JOURNAL_LINES)), (ports[1], "b", len(lines_b))):
            wait_for(lambda: lines_read(port, server) == n, what=f"agent {server} read every line")
        assert scrape(ports[1])[("specwatch_log_lines_total", (("kind", "malformed"), ("server", "b")))] == 1
        # v's engine restarts: its counters start from zero, the agent counts a reset
        wait_for(lambda: accept_length_of(ports[1], "v") == 2.5, what="v's accept length from /metrics")
        vllm.restart()
        wait_for(lambda: scrape(ports[1]).get(("specwatch_server_metrics_resets_total", (("server", "v"), ("url", vllm.url)))) == 1,
                 what="v's counter reset")
        wait_for(lambda: alert_firing(ports[0], "MetricsLogDisagreement"), what="a's log and /metrics disagree")
        time.sleep(1.5)  # one more evaluation of the recording rules after the last scrape
        prom.wait_scraped(p)
        yield {"prom": p, "a": a, "b": b, "ports": ports, "slack": slack, "urls": (sglang.url, vllm.url)}
    finally:
        if traffic is not None:
            traffic.stop.set()
            traffic.thread.join(5)
        p.stop()
        for x in procs:
            if x.proc is not None:
                x.stop()
        slack.close()
        sglang.close()
        vllm.close()


def accept_length_of(port: int, server: str) -> float | None:
    return next((v for (name, labels), v in scrape(port).items()
                 if name == "specwatch_accept_length" and ("server", server) in labels), None)


def alert_firing(port: int, alertname: str) -> bool:
    return scrape(port).get(("specwatch_alerts_firing", (("alertname", alertname),))) == 1


def variable_values(p: prom.Prometheus, d: dict, chosen: dict[str, str]) -> dict[str, list[str]]:
    """Evaluate each query variable's label_values(...) in order, as Grafana does, with the
    earlier variables filled by `chosen`."""
    out = {}
    for v in d["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.*), (\w+)\)", v["query"])
        out[v["name"]] = p.label_values(m.group(2), fill(m.group(1), chosen))
    return out


ALL = {"job": regex_value("specwatch"), "instance": ".*", "server": ".*", "engine": ".*", "dp_rank": ".*", "tp_rank": ".*"}


def test_variables_list_both_agents_and_their_ranks(fleet):
    p, d = fleet["prom"], dashboard()
    vals = variable_values(p, d, ALL)
    assert vals["instance"] == ["127.0.0.1", "localhost"]
    assert vals["server"] == ["a", "b", "v"]
    assert vals["engine"] == ["sglang", "vllm"]  # a's /metrics (and the logs' series where they carry it), v's
    assert vals["dp_rank"] == ["0", "1"] and vals["tp_rank"] == ["0", "1"]
    only_b = variable_values(p, d, dict(ALL, instance=regex_value("localhost")))
    assert only_b["server"] == ["b", "v"] and only_b["engine"][-1:] == ["vllm"]
    assert only_b["dp_rank"] == [] and only_b["tp_rank"] == ["0"]


def test_engine_variable_filters_the_rank_panels(fleet):
    p, d = fleet["prom"], dashboard()
    [expr] = [e for title, e in targets(d) if title == "Accept length per rank"]
    shown = lambda engine: series_by(p.query(fill(expr, dict(ALL, engine=engine))), "server", "dp_rank", "tp_rank")  # noqa: E731
    # All: the log's series (no engine label) and v's from /metrics; a's /metrics not beside its log
    assert set(shown(".*")) == {("a", "0", "0"), ("a", "1", "1"), ("b", "", ""), ("b", "", "0"), ("v", "", "")}
    assert shown(regex_value("vllm")) == {("v", "", ""): 2.5}
    sglang = {k[0] for k in shown(regex_value("sglang"))}
    assert "a" in sglang and "v" not in sglang


def fillings(p, d):
    """All, then each agent on its own with all its servers and its first DP rank (or All where
    it has none). TP stays All: SGLang's /metrics leaves TP0 unlabelled, so a TP filter hides
    the /metrics series of the rank it selects."""
    yield "All", ALL
    for inst in ("127.0.0.1", "localhost"):
        chosen = dict(ALL, instance=regex_value(inst))
        vals = variable_values(p, d, chosen)
        chosen["server"] = regex_value(*vals["server"])
        if vals["dp_rank"]:
            chosen["dp_rank"] = regex_value(vals["dp_rank"][0])
        yield inst, chosen


def gpu_only(expr: str) -> bool:
    names = {n for n in NAME.findall(expr) if n.startswith("specwatch_")}
    return bool(names) and all(n.startswith("specwatch_gpu_") and n != "specwatch_gpu_up" for n in names)


def test_every_panel_query_returns_data(fleet):
    p, d = fleet["prom"], dashboard()
    exported = set(_exported(fleet))
    empty = []
    for label, values in fillings(p, d):
        for title, expr in targets(d):
            q = fill(expr, values)
            pending = {n for n in NAME.findall(expr) if n in PENDING and n not in exported}
            result = p.query(q)
            if pending:
                assert result == [], (title, q)  # not exported yet: nothing to show
            elif label == "localhost" and gpu_only(expr):
                assert result == [], (title, q)  # agent b has no GPU (specwatch_gpu_up 0 only)
            elif label == "127.0.0.1" and set(NAME.findall(expr)) <= VLLM_ONLY:
                assert result == [], (title, q)
            elif not result:
                empty.append(f"{label}: {title}: {q}")
    assert not empty, "panels without data:\n" + "\n".join(empty)


def _exported(fleet) -> dict[str, float]:
    names = {}
    for port in fleet["ports"]:
        for (name, _), v in scrape(port).items():
            names[name] = v
    return names


def test_every_metric_the_dashboard_names_exists(fleet):
    d = dashboard()
    exprs = [e for _, e in targets(d)] + [v["query"] for v in d["templating"]["list"] if v["type"] == "query"]
    exprs += [a["expr"] for a in d["annotations"]["list"] if "expr" in a]
    names = {n for e in exprs for n in NAME.findall(e)}
    exported = set(_exported(fleet))
    recorded = {r["record"] for g in yaml.safe_load(prom.RULES.read_text())["groups"] for r in g["rules"] if "record" in r}
    nvml_doc = set(re.findall(r"``(specwatch_gpu_\w+)``", (ROOT / "specwatch" / "sources" / "nvml.py").read_text()))
    missing = sorted(n for n in names if n.startswith("specwatch_") and n not in exported | PENDING)
    assert not missing, missing
    assert {n for n in names if ":" in n} <= recorded
    gpu = {n for n in names if n.startswith("specwatch_gpu_")}
    assert len(gpu) >= 14 and gpu <= nvml_doc, gpu - nvml_doc  # and documented in sources/nvml.py
    assert {"up", "ALERTS"} <= names


def series_by(results, *labels):
    return {tuple(r["metric"].get(x, "") for x in labels): r["value"] for r in results}


def agents_series(fleet, metric: str) -> dict[tuple[str, str, str, str], float]:
    """{(source, server, dp_rank, tp_rank): value} of `metric` on both agents' /metrics."""
    out = {}
    for port in fleet["ports"]:
        for (name, labels), v in scrape(port).items():
            if name == metric:
                lab = dict(labels)
                out[(lab.get("source", ""), lab["server"], lab["dp_rank"], lab["tp_rank"])] = v
    return out


def panel_query(title: str, ref: str = "A", values: dict[str, str] = ALL) -> str:
    [expr] = [t["expr"] for p in dashboard()["panels"] if p["title"] == title for t in p["targets"] if t["refId"] == ref]
    return fill(expr, values)


def test_panels_show_the_agents_values(fleet):
    p = fleet["prom"]
    exported = agents_series(fleet, "specwatch_accept_length")
    log = {k[1:]: v for k, v in exported.items() if k[0] == ""}
    metrics = {k[1:]: v for k, v in exported.items() if k[0] == "server_metrics"}
    # a: DP0/TP0 and DP1/TP1; b: no rank tokens (0.5.6 lines) and TP0 (the Kimi sample)
    assert set(log) == {("a", "0", "0"), ("a", "1", "1"), ("b", "", ""), ("b", "", "0")}
    assert log[("b", "", "0")] == 1.04  # the sample's 1.05, 1.06, then 1.04
    # /metrics: a's DP ranks (TP0 unlabelled), v's one vLLM engine: 1 + 15 accepted / 10 drafts
    assert set(metrics) == {("a", "0", ""), ("a", "1", ""), ("v", "", "")} and metrics[("v", "", "")] == 2.5
    assert {metrics[("a", dp, "")] for dp in "01"} <= {A_METRICS, A_METRICS + 0.01}
    # one line per rank: the log's, /metrics only for v (no log)
    assert series_by(p.query(panel_query("Accept length per rank")), "server", "dp_rank", "tp_rank") == \
        log | {("v", "", ""): 2.5}
    # both, side by side
    assert series_by(p.query(panel_query("Accept length: log vs /metrics", "A")), "server", "dp_rank", "tp_rank") == log
    shown = series_by(p.query(panel_query("Accept length: log vs /metrics", "B")), "server", "dp_rank", "tp_rank")
    assert set(shown) == set(metrics) and shown[("v", "", "")] == 2.5  # a's alternate between scrapes
    collapsed = series_by(p.query(panel_query("Collapse state per rank")), "server", "dp_rank", "tp_rank")
    assert collapsed == {("a", "0", "0"): 1, ("a", "1", "1"): 1, ("b", "", ""): 0, ("b", "", "0"): 1, ("v", "", ""): 0}
    assert series_by(p.query(panel_query("Collapsed ranks")), "server") == {("a",): 2, ("b",): 1, ("v",): 0}
    # per-position acceptance from v's vLLM counters
    pos = series_by(p.query(panel_query("Per-position accept rate now")), "server", "position")
    assert pos == {("v", str(i)): n / 10 for i, n in enumerate(POSITIONS)}
    # sources' health
    kinds = series_by(p.query(panel_query("Lines not understood (last hour)")), "server", "kind")
    assert {k[1] for k in kinds} == {"malformed", "unrecognized"} and kinds[("b", "malformed")] > 0
    sglang_url, vllm_url = fleet["urls"]
    up = series_by(p.query(panel_query("Engine /metrics scrapes")), "server", "url")
    assert up == {("a", sglang_url): 1, ("v", vllm_url): 1}
    errors = series_by(p.query("specwatch_server_metrics_errors_total"), "server", "error")
    assert set(errors) == {("a", "http_503"), ("v", "http_503")} and min(errors.values()) >= 1
    assert series_by(p.query("specwatch_server_metrics_resets_total"), "server") == {("v",): 1}
    assert series_by(p.query(panel_query("Engines")), "server", "engine") == {("a", "sglang"): 1, ("v", "vllm"): 1}
    journal = series_by(p.query(panel_query("Journal sources")), "instance")
    assert journal == {("127.0.0.1",): 1, ("localhost",): 0}  # b's folder does not exist
    assert series_by(p.query(panel_query("MetricsLogDisagreement")), "instance") == {("127.0.0.1",): 1, ("localhost",): 0}
    # GPU panels show the fake H200s' readings
    util = series_by(p.query('specwatch_gpu_utilization_ratio{instance=~".*"}'), "instance", "gpu")
    assert util == {("127.0.0.1", "0"): 0.87, ("127.0.0.1", "1"): 0.05}
    xid = series_by(p.query("specwatch_gpu_xid_errors_total"), "gpu", "xid")
    assert xid == {("0", "79"): 1}
    reasons = p.query('specwatch_gpu_clock_event_reason_active{reason="sw_power_cap"} == 1')
    assert [r["metric"]["gpu"] for r in reasons] == ["0"]


def test_fleet_recording_rules_show_both_servers(fleet):
    p = fleet["prom"]
    # the log's series; a's /metrics beside its log is not counted, v (no log) is
    acc = series_by(p.query('specwatch_accept_length{source=""}'), "server", "dp_rank", "tp_rank")
    per_server = series_by(p.query("server:specwatch_accept_length:avg"), "server")
    assert set(per_server) == {("a",), ("b",), ("v",)} and per_server[("v",)] == 2.5
    for s in ("a", "b"):
        vals = [v for k, v in acc.items() if k[0] == s]
        assert per_server[(s,)] == pytest.approx(sum(vals) / len(vals))
    pair = p.query("model_pair:specwatch_accept_length:avg")
    assert [r["metric"] for r in pair] == [{"__name__": "model_pair:specwatch_accept_length:avg", "algorithm": "EAGLE3",
                                            "model": "moonshotai/Kimi-K2.5",
                                            "draft_model": "/models/kimi-k25-eagle3-1.2b"}]
    assert pair[0]["value"] == pytest.approx(sum(acc.values()) / len(acc))  # both servers, every rank (v has no settings)
    worst = p.query("model_pair:specwatch_accept_length:min")[0]["value"]
    assert worst == min(acc.values())
    assert p.query("model_pair:specwatch_acceptance_collapsed:sum")[0]["value"] == 3  # a's two ranks, b's TP0

    thr = series_by(p.query("specwatch_gen_throughput_tokens_per_second"), "server", "dp_rank", "tp_rank")
    tps = series_by(p.query("server:specwatch_gen_throughput_tokens_per_second:sum"), "server")
    assert set(tps) == {("a",), ("b",)}
    for s in ("a", "b"):  # every rank printed decode lines within the last 5 minutes
        assert tps[(s,)] == pytest.approx(sum(v for k, v in thr.items() if k[0] == s))
        assert tps[(s,)] > 0
    assert len([k for k in thr if k[0] == "b"]) == 2


def test_alert_annotations_and_firing_alerts(fleet):
    p, d = fleet["prom"], dashboard()
    [ann] = [a for a in d["annotations"]["list"] if "expr" in a]
    firing = p.wait_query(fill(ann["expr"], {"instance": ".*"}),
                          lambda r: {x["metric"]["alertname"] for x in r} >= {"AcceptanceCollapse", "GpuXidError"})
    names = {(x["metric"]["alertname"], x["metric"].get("server", ""), x["metric"].get("tp_rank", "")) for x in firing}
    assert ("AcceptanceCollapse", "a", "0") in names and ("AcceptanceCollapse", "a", "1") in names
    # b: the real sample's rank collapsed, its 0.5.6 rank (no rank tokens) is healthy
    assert ("AcceptanceCollapse", "b", "0") in names and ("AcceptanceCollapse", "b", "") not in names
    # the agents' own alerts reached Slack too (alert delivery panels have data). An agent's
    # alerts form one group (Alertmanager's default group_by: []), so a's first message may
    # carry its first collapsed rank and the XID error together; its collapse is listed by rank.
    msgs = fleet["slack"].received
    texts = [m["text"] for m in msgs]
    a_msgs = [json.dumps(m) for m in msgs if m["text"].startswith("[FIRING") and "AcceptanceCollapse on a" in m["text"]]
    assert any(re.search(r"AcceptanceCollapse\*? on a:? DP[01] TP[01]", m) for m in a_msgs), texts
    assert any(t.startswith("[FIRING] AcceptanceCollapse on b TP0") for t in texts), texts


def test_scrape_config_relabelling(fleet):
    p = fleet["prom"]
    t = p.targets()
    active = {x["labels"]["instance"]: x for x in t["activeTargets"]}
    assert set(active) == {"127.0.0.1", "localhost", "127.0.0.2"}
    assert active["127.0.0.1"]["scrapeUrl"] == f"http://127.0.0.1:{fleet['ports'][0]}/metrics"
    assert active["127.0.0.2"]["scrapeUrl"] == "http://127.0.0.2:9849/metrics"  # bare host: default port
    assert all(x["labels"]["job"] == "specwatch" for x in active.values())
    dropped = [x["discoveredLabels"]["__address__"] for x in t["droppedTargets"]]
    assert dropped == ["127.0.0.3"]  # specwatch: "off"
