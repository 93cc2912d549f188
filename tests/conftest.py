"""Shared fixtures: real local servers the tests talk to."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from alertmanager import BINARY as ALERTMANAGER_BINARY
from alertmanager import Alertmanager
from fake_sglang import Launcher, make_install
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


@pytest.fixture(scope="session")
def sglang_install(tmp_path_factory):
    """bin/python of a venv with a stand-in `sglang` 0.5.6.post2 (tests/fake_sglang.py)."""
    return make_install(tmp_path_factory.mktemp("venv") / "sglang-env", version="0.5.6.post2")


@pytest.fixture
def sglang_procs():
    """`sglang_procs.start(argv, ...)` launches a fake SGLang server; all are killed after the test."""
    runner = Launcher()
    yield runner
    runner.stop_all()
