"""PollingSource: a failing poll is logged once and retried; the thread stops on request."""

from __future__ import annotations

import logging
import threading

import pytest

from specwatch.sources.base import PollingSource


class Flaky(PollingSource):
    name = "flaky"

    def __init__(self):
        super().__init__(0.05)
        self.calls = 0
        self.done = threading.Event()

    def poll(self, now: float) -> float:
        self.calls += 1
        if self.calls <= 3:
            raise RuntimeError("boom")  # a bug in one poll
        if self.calls >= 5:
            self.done.set()
        return 0.01


def test_failing_polls_logged_once_then_recovers(caplog):
    src = Flaky()
    with caplog.at_level(logging.ERROR, logger="specwatch.sources"):
        src.start()
        assert src.done.wait(5)
        assert src.stop(timeout=2)
    assert src.calls >= 5
    errors = [r for r in caplog.records if "flaky poll failed" in r.getMessage()]
    assert len(errors) == 1 and "boom" in caplog.text


def test_interval_must_be_positive():
    with pytest.raises(ValueError):
        PollingSource(0)
