"""The window classification of `rules/windows.py`, one line at a time: the reference the
pipeline's summariser (`Pipeline._summarise`, inline) is checked against in tests/rules/test_windows.py,
and the classifier of rule tests that feed a rule's one-line decision (`CollapseRule.observe`)."""

from __future__ import annotations

from specwatch.core.events import DecodeBatch, PrefillBatch
from specwatch.rules.windows import Window, WindowConfig, running_in_window


class WindowTracker:
    """Classifies decode lines per (server, rank). Times: the batch timestamps (seconds)."""

    def __init__(self, config: WindowConfig):
        self.config = config
        self._last: dict[tuple[str, str], float] = {}
        self._prefills: dict[tuple[str, str], int] = {}

    def observe(self, server: str, event: object) -> Window | None:
        """Feed any event; returns a Window for a decode line, else None."""
        if type(event) is DecodeBatch or isinstance(event, DecodeBatch):
            return self.decode(server, event)
        if isinstance(event, PrefillBatch):
            self.prefill(server, event)
        return None

    def prefill(self, server: str, batch: PrefillBatch) -> None:
        key = (server, batch.rank)
        self._prefills[key] = self._prefills.get(key, 0) + 1

    def decode(self, server: str, batch: DecodeBatch) -> Window:
        key = (server, batch.rank)
        prev = self._last.get(key)
        gap = None if prev is None else batch.timestamp - prev
        prefills = self._prefills.pop(key, 0) if self._prefills else 0
        self._last[key] = batch.timestamp
        cfg = self.config
        running = running_in_window(batch.running_requests, batch.draft_tokens)
        return Window(batch, running < cfg.min_running_requests, prefills > cfg.max_prefill_batches,
                      gap is None or gap > cfg.max_gap, gap, prefills)
