"""The one interface every non-log source has: `start()`, `stop(timeout)`, `poll(now)`.

A source runs on its own daemon thread, polls at its own interval, and hands events to
`emit(server, event, now)` (the daemon passes `Pipeline.feed_event`). A failing poll is logged
once per kind of failure and retried at the next interval: a source never takes the daemon down,
and a missing capability (no psutil permission, no HTTP server) only removes its own metrics.
`GpuSampler` (sources/nvml.py) has the same `start`/`stop` shape.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger("specwatch.sources")

Emit = Callable[[str, object, float], None]


class PollingSource:
    """Calls `poll(now)` on a daemon thread; `poll` returns the seconds until the next call."""

    name = "source"

    def __init__(self, interval: float):
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval}")
        self.interval = float(interval)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed_with: str | None = None

    def poll(self, now: float) -> float:
        """One round (`now`: seconds since the epoch). Returns the delay before the next, seconds."""
        raise NotImplementedError

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"specwatch-{self.name}", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """The source's thread was started and has not ended."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop the thread; False when it did not end within `timeout` seconds."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            delay = self.interval
            try:
                delay = self.poll(time.time())
                self._failed_with = None
            except Exception as e:  # a bug in one poll must not end the source
                kind = type(e).__name__
                if self._failed_with != kind:
                    log.exception("%s poll failed; retrying every %.0f s", self.name, self.interval)
                self._failed_with = kind
            self._stop.wait(max(0.05, delay))
