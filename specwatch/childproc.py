"""Child processes that end with their parent: Linux's parent-death signal (prctl(2)
`PR_SET_PDEATHSIG`), set in the child between fork and exec.

Used for the daemon's journalctl (a SIGKILLed daemon leaves none behind) and by the tests for
everything they start. The kernel sends the signal when the *thread* that started the child
ends, not the process: start such children from a thread that lives as long as they should.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` for `subprocess.Popen` that makes the child receive `sig` when this
    thread ends (see the module doc); the child exits at once if this process is already gone.
    None where prctl is not available (not Linux): the child then outlives its parent."""
    if _PRCTL is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        _PRCTL(PR_SET_PDEATHSIG, int(sig))
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec
