"""specwatch's self-alerts in a real Prometheus: a refused reload fires
SpecwatchConfigReloadFailed, a stopped agent fires SpecwatchDown (rules loaded with for: 0s)."""

from __future__ import annotations

import signal

import prom
from procs import SpecwatchProcess, decode_line, free_port


def firing(p, alertname):
    return p.wait_query(f'ALERTS{{alertname="{alertname}",alertstate="firing"}}', timeout=30)


def test_reload_failure_and_agent_down_fire(tmp_path, prometheus):
    log = tmp_path / "a.log"
    log.write_text(decode_line(2.5, "10:00:00"))
    port = free_port()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"server: box\nlogs: [{log}]\nmetrics: {{listen_port: {port}}}\nstate_dir: {tmp_path / 's'}\n"
                   "gpu: {enabled: false}\n")
    agent = SpecwatchProcess(cfg, port).start()
    p = prometheus([prom.static_job("specwatch", [f"127.0.0.1:{port}"])], [prom.rules_firing_at_once()])
    try:
        p.wait_query('specwatch_config_reload_success{job="specwatch"} == 1', timeout=30)
        assert p.query('ALERTS{alertname=~"SpecwatchConfigReloadFailed|SpecwatchDown"}') == []

        cfg.write_text(cfg.read_text() + "rules: {collapse: {min_batches: 0}}\n")
        agent.signal(signal.SIGHUP)
        [alert] = firing(p, "SpecwatchConfigReloadFailed")
        assert alert["metric"]["instance"] == f"127.0.0.1:{port}" and alert["metric"]["severity"] == "warning"
    finally:
        assert agent.stop() == 0, agent.output
    [alert] = firing(p, "SpecwatchDown")
    assert alert["metric"]["severity"] == "critical"
