"""Shared fixtures: real local servers the tests talk to."""

from __future__ import annotations

import pytest

from slack_endpoint import SlackEndpoint


@pytest.fixture
def slack():
    """A Slack-compatible webhook endpoint on 127.0.0.1; `slack.url`, `slack.received`."""
    s = SlackEndpoint()
    yield s
    s.close()
