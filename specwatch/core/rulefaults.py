"""A rule that raises is a fault of that rule on that line, never of the read.

The pipeline calls every rule hook through `RuleFaults.call` (or catches around it on the hot
path and hands the exception to `failed`): the hook's result is dropped (no alerts from it), the
other rules and the other lines of the read go on. Each failure counts in `counts` (rule name →
failures; `specwatch_rule_errors_total` on /metrics) and is logged: the first of each rule with
its traceback, later ones at most once per `LOG_EVERY` seconds of wall time per rule, as one
line with the count since the last one, so a rule failing on every line of a busy log stays one
line a minute.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("specwatch.core.pipeline")

LOG_EVERY = 60.0  # seconds between two log lines about the same rule's failures


class RuleFaults:
    """Failures of the rules' hooks, counted and logged with rate limiting. Called under the
    pipeline's lock (one thread at a time)."""

    def __init__(self, clock=time.monotonic) -> None:
        self.counts: dict[str, int] = {}
        self._clock = clock
        self._logged: dict[str, float] = {}  # rule → clock of its last log line
        self._unlogged: dict[str, int] = {}  # rule → failures since that line

    def failed(self, rule, hook: str, exc: BaseException) -> None:
        """`rule.hook` raised `exc`: count it, and log it unless this rule was logged less than
        LOG_EVERY seconds ago."""
        name = getattr(rule, "name", type(rule).__name__)
        self.counts[name] = self.counts.get(name, 0) + 1
        now = self._clock()
        last = self._logged.get(name)
        if last is None:
            self._logged[name] = now
            log.error("rule %s failed in %s; its result for this line is dropped, the other rules and lines go on "
                      "(logged at most once a minute from now)", name, hook, exc_info=exc)
            return
        missed = self._unlogged.get(name, 0) + 1
        if now - last < LOG_EVERY:
            self._unlogged[name] = missed
            return
        self._logged[name], self._unlogged[name] = now, 0
        log.error("rule %s failed %d more times (last in %s: %s: %s)", name, missed, hook, type(exc).__name__, exc)

    def call(self, rule, hook: str, *args, default=None):
        """`getattr(rule, hook)(*args)`, or `default` when it raises (counted and logged)."""
        try:
            return getattr(rule, hook)(*args)
        except Exception as e:  # a rule's bug must not stop the read or the other rules
            self.failed(rule, hook, e)
            return default
