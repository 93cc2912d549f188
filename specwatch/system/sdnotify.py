"""The systemd notification protocol (sd_notify(3)) without libsystemd.

One AF_UNIX datagram per message to `$NOTIFY_SOCKET` (a leading `@` names the abstract
namespace). Outside systemd the variable is unset and every call is a no-op returning False.
The watchdog period comes from `$WATCHDOG_USEC`, honoured only when `$WATCHDOG_PID` is unset
or names this process (sd_watchdog_enabled(3)); a ping is due every half period, as the man
page asks.
"""

from __future__ import annotations

import logging
import os
import socket
import time

log = logging.getLogger("specwatch.system.sdnotify")


def notify(message: str) -> bool:
    """Send one datagram (e.g. "READY=1\\nSTATUS=..."); False when not run by systemd or on
    error (logged: a broken socket must not stop the daemon)."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto(message.encode(), addr)
        return True
    except OSError as e:
        log.warning("sd_notify to %s failed: %s", addr.lstrip("\0"), e)
        return False


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds, for `MONOTONIC_USEC=` next to `RELOADING=1`."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class Watchdog:
    """When to send WATCHDOG=1. `period` is None when systemd asked for no watchdog."""

    def __init__(self, environ: dict[str, str] | None = None):
        env = os.environ if environ is None else environ
        self.period: float | None = None
        pid, usec = env.get("WATCHDOG_PID"), env.get("WATCHDOG_USEC")
        if usec and (not pid or pid == str(os.getpid())):
            try:
                if int(usec) > 0:
                    self.period = int(usec) / 1e6 / 2
            except ValueError:
                log.warning("ignoring WATCHDOG_USEC=%r: not an integer", usec)
        self._last = float("-inf")

    def ping_if_due(self, now: float) -> bool:
        """Send WATCHDOG=1 when half the period has passed since the last ping."""
        if self.period is None or now - self._last < self.period:
            return False
        self._last = now
        return notify("WATCHDOG=1")
