"""Shared fixtures: real local servers the tests talk to."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from alertmanager import BINARY as ALERTMANAGER_BINARY
from alertmanager import Alertmanager
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
def alertmanager(tmp_path):
    """Factory: `alertmanager(receiver=None, group_by=None, port=None)` starts a real
    Alertmanager on 127.0.0.1 (see tests/alertmanager.py); all are stopped after the test."""
    if ALERTMANAGER_BINARY is None:
        pytest.skip("prometheus-alertmanager not installed (.ci/run installs it)")
    started = []

    def start(receiver=None, group_by=None, port=None):
        started.append(Alertmanager(tmp_path, receiver, group_by=group_by, port=port))
        return started[-1]

    yield start
    for am in started:
        am.close()
