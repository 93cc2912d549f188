"""Shared fixtures: real local servers the tests talk to."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import prom
from slack_endpoint import SlackEndpoint

ROOT = Path(__file__).resolve().parents[1]
# Subprocesses (`python -m specwatch ...`) run this checkout, not an installed copy.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


@pytest.fixture
def slack():
    """A Slack-compatible webhook endpoint on 127.0.0.1; `slack.url`, `slack.received`."""
    s = SlackEndpoint()
    yield s
    s.close()


@pytest.fixture
def prometheus(tmp_path):
    """Start real Prometheus servers: `prometheus(scrape_configs, rule_files=())` → prom.Prometheus
    (see tests/prom.py); all are stopped after the test."""
    if not prom.available():
        pytest.skip(f"{prom.PROMETHEUS} not installed (Debian package prometheus; .ci/run installs it)")
    started = []

    def start(scrape_configs, rule_files=(), name="prometheus"):
        p = prom.Prometheus(tmp_path / name, scrape_configs, rule_files)
        started.append(p)
        return p.start()

    yield start
    for p in started:
        p.stop()
