"""`specwatch run` with only `server_metrics` (no log reachable), end to end: a real HTTP server
serving an SGLang 0.5.23-shaped /metrics, the daemon as a subprocess, the collapse delivered to a
real local Slack endpoint; then the scrape failing (counted, logged, backed off)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_metrics import EngineMetrics  # noqa: E402
from procs import SpecwatchProcess, free_port, wait_for  # noqa: E402
from test_daemon import delivered  # noqa: E402


def test_collapse_from_metrics_alone_reaches_slack(tmp_path, slack):
    eng = EngineMetrics("sglang", openmetrics=True, dp_size=2)
    port = free_port()
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({
        "server": "gpu-box-1",
        "server_metrics": [{"url": eng.url, "server": "sglang-a", "interval": "1s", "timeout": "500ms",
                            "backoff_max": "2s"}],
        "metrics": {"listen_port": port}, "state_dir": str(tmp_path / "state"),
        "gpu": {"enabled": False}, "process": {"enabled": False}, "diagnosis": {"enabled": False},
        "rules": {"collapse": {"min_batches": 2}},
        "alerts": {"group_wait": "0s", "group_interval": "0s", "slack": {"webhook_url": slack.url}},
    }))
    check = subprocess.run([sys.executable, "-m", "specwatch", "check-config", str(cfg)], capture_output=True, text=True)
    assert check.returncode == 0 and "1 /metrics source(s)" in check.stdout, check.stderr
    daemon = SpecwatchProcess(cfg, port)
    try:
        eng.set_sglang(0, accept_length=2.9, accept_rate=0.5, running=20, throughput=500.0)
        eng.set_sglang(1, accept_length=1.0, accept_rate=0.0, running=20, throughput=200.0)
        daemon.start()
        fired = lambda: [b for b in delivered(slack) if b["text"].startswith("[FIRING] AcceptanceCollapse")]  # noqa: E731
        (msg,) = wait_for(eng.collapsing(1, fired), timeout=30, interval=0.5, what="the collapse in Slack")
        body = json.dumps(msg)
        assert msg["text"].startswith("[FIRING] AcceptanceCollapse on sglang-a DP1"), msg["text"]
        assert "accept len 1.00" in body and eng.url in body  # says it read /metrics
        assert "DP0" not in json.dumps(delivered(slack))
        m = daemon.scrape()
        url = (("server", "sglang-a"), ("url", eng.url))
        assert m[("specwatch_server_metrics_up", url)] == 1
        assert m[("specwatch_server_metrics_engine_info", (("engine", "sglang"),) + url)] == 1
        rank1 = (("dp_rank", "1"), ("engine", "sglang"), ("ep_rank", ""), ("pp_rank", ""), ("server", "sglang-a"),
                 ("source", "server_metrics"), ("tp_rank", ""))
        rank0 = tuple((k, "0" if k == "dp_rank" else v) for k, v in rank1)
        assert (m[("specwatch_accept_length", rank1)], m[("specwatch_accept_length", rank0)]) == (1.0, 2.9)
        assert (m[("specwatch_running_requests", rank1)], m[("specwatch_accept_rate", rank0)]) == (20, 0.5)
        # the series Prometheus' AcceptanceCollapse rule joins on (deploy/prometheus/specwatch-rules.yml)
        assert (m[("specwatch_acceptance_collapsed", rank1)], m[("specwatch_acceptance_collapsed", rank0)]) == (1, 0)
        # the families with scraped series added still pass Prometheus' own linter
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        if shutil.which("promtool"):
            lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True)
            assert lint.returncode == 0, lint.stdout + lint.stderr
        # the endpoint fails: counted, logged (once), backed off; the daemon keeps running
        eng.status = 503
        wait_for(lambda: daemon.scrape().get(("specwatch_server_metrics_errors_total", (("error", "http_503"),) + url), 0) >= 2,
                 timeout=20, what="failed scrapes counted")
        assert daemon.scrape()[("specwatch_server_metrics_up", url)] == 0
        assert daemon.output.count("scrape failed (http_503); backing off up to 2 s") == 1
        assert daemon.stop() == 0
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()
        eng.close()


def test_check_config_names_the_bad_server_metrics_keys(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump({"server_metrics": [
        {"url": "127.0.0.1:30000/metrics", "interval": "5s"},
        {"server": "b"},
        {"url": "http://127.0.0.1:30001", "interval": "200ms", "intervall": "5s"},
        "http://127.0.0.1:30002/metrics",
    ]}))
    r = subprocess.run([sys.executable, "-m", "specwatch", "check-config", str(cfg)], capture_output=True, text=True)
    assert r.returncode == 2
    lines = [x.strip() for x in r.stderr.splitlines()[1:]]
    assert lines == [
        "server_metrics[0].url: '127.0.0.1:30000/metrics' is not an http(s) URL; e.g. http://127.0.0.1:30000/metrics",
        "server_metrics[1].url: missing; the engine's metrics URL, e.g. `url: http://127.0.0.1:30000/metrics`",
        "server_metrics[2].intervall: unknown key; known keys here: backoff_max, interval, server, timeout, url; "
        "did you mean `interval`?",
        "server_metrics[2].interval: must be a finite duration of at least 1s, got '200ms'",
        "server_metrics[2].url: 'http://127.0.0.1:30001' has no path; the engine serves its metrics at /metrics, "
        "e.g. http://127.0.0.1:30001/metrics",
        "server_metrics[3]: must be a mapping, e.g. {url: http://127.0.0.1:30000/metrics, server: sglang-0, interval: 5s}",
    ]
