"""The C heap around a large catch-up (glibc malloc tuning; a no-op elsewhere).

A catch-up in columns allocates and frees arrays of 0.1-4 MiB thousands of times a second.
glibc serves each from a fresh `mmap` or grows and trims the heap top around it, and every new
page is a page fault: a third of the catch-up's system time for nothing. `hold()` keeps the
freed memory in the heap for the next read (`mallopt` M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, see
mallopt(3)); `release()` puts the default values back and hands the free pages back to the OS
(`malloc_trim(0)`), so the daemon's RSS after the backlog is what it holds, not its peak.
"""

from __future__ import annotations

import ctypes
import gc

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_DEFAULT = 128 * 1024  # both thresholds' glibc defaults (bytes)
_HELD_MMAP, _HELD_TRIM = 64 << 20, 256 << 20

_held = False


def _libc():
    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def hold() -> bool:
    """Keep freed memory in the heap until `release()` (for a catch-up); False without glibc."""
    global _held
    if _held:
        return True
    libc = _libc()
    if libc is None:
        return False
    libc.mallopt(_M_MMAP_THRESHOLD, _HELD_MMAP)
    libc.mallopt(_M_TRIM_THRESHOLD, _HELD_TRIM)
    _held = True
    return True


def release() -> int:
    """The thresholds back at glibc's default values (128 KiB; fixed from then on: once set,
    glibc no longer raises its mmap threshold on its own, mallopt(3)), and the heap's free pages
    back to the OS. Returns malloc_trim's result (1: memory released, 0: none), -1 without glibc."""
    global _held
    gc.collect()
    libc = _libc()
    if libc is None:
        return -1
    if _held:
        libc.mallopt(_M_MMAP_THRESHOLD, _DEFAULT)
        libc.mallopt(_M_TRIM_THRESHOLD, _DEFAULT)
        _held = False
    return int(libc.malloc_trim(0))
