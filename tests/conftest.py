"""Shared fixtures: real local servers the tests talk to."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
