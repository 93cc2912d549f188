"""Child processes that end with their parent: Linux's parent-death signal (prctl(2)
`PR_SET_PDEATHSIG`), set by util-linux's `setpriv --pdeathsig SIG -- argv…` (util-linux 2.33+,
on every Debian), which then execs the command: the signal survives exec.

Not a `preexec_fn`: Python documents it as unsafe in a process with threads (the child may
deadlock before exec; https://docs.python.org/3/library/subprocess.html#popen-constructor), and
the daemon runs several. Used for the daemon's journalctl (a SIGKILLed daemon leaves none
behind) and by the tests for everything they start. The kernel sends the signal when the
*thread* that started the child ends, not the process: start such children from a thread that
lives as long as they should. Without setpriv (not Linux, util-linux missing or older) the child
is a plain one: its owner ends it on stop, and a SIGKILLed parent leaves it running.
"""

from __future__ import annotations

import functools
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence


@functools.cache
def setpriv() -> str | None:
    """The path of a `setpriv` that takes `--pdeathsig`, else None (checked once)."""
    path = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    if path is None:
        return None
    try:
        usage = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return path if "--pdeathsig" in usage else None


def die_with_parent(argv: Sequence[str], sig: signal.Signals = signal.SIGTERM) -> list[str]:
    """`argv` as a command whose process receives `sig` when the calling thread ends (see the
    module doc): `setpriv --pdeathsig SIG -- argv…`; `argv` unchanged without setpriv. The pid
    `Popen` returns is the command's (setpriv execs it). argv[0] must be a path or on PATH."""
    path = setpriv()
    if path is None:
        return list(argv)
    return [path, f"--pdeathsig={signal.Signals(sig).name}", "--", *argv]
