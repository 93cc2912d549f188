"""Child processes that end with their parent: Linux's parent-death signal (prctl(2)
`PR_SET_PDEATHSIG`), set in the child by a few lines of Python run by this interpreter
(`python -I -S -c …`, no site, no environment), which then exec the command: the signal
survives exec, so the pid `Popen` returns is the command's.

Why not `setpriv --pdeathsig` (util-linux): setpriv applies its capability state with capset(2)
even when only `--pdeathsig` is given, and a unit with `SystemCallFilter=~@privileged` (the
shipped deploy/specwatch.service) refuses capset: `setpriv: activate capabilities: Operation not
permitted`, exit 127 (util-linux 2.38, sys-utils/setpriv.c; systemd 252's @privileged holds
capset). prctl(PR_SET_PDEATHSIG) is in @system-service. Why not a `preexec_fn`: Python documents
it as unsafe in a process with threads (the child may deadlock before exec;
https://docs.python.org/3/library/subprocess.html#popen-constructor), and the daemon runs several.

Used for the daemon's journalctl (a SIGKILLed daemon leaves none behind) and by the tests for
everything they start. The kernel sends the signal when the *thread* that started the child
ends, not the process: start such children from a thread that lives as long as they should.
A parent that is already gone when the child sets the signal (the child was reparented) ends
the child at once. Not Linux: the child is a plain one; its owner ends it on stop.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

# argv: SIGNUM PARENT_PID COMMAND ARG... ; exit 127 when the command cannot be run (as a shell).
_SET_AND_EXEC = """\
import ctypes, os, sys
sig, parent, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(1, sig, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
    sys.stderr.write("cannot set the parent-death signal: " + os.strerror(ctypes.get_errno()) + "\\n")
    os._exit(127)
if os.getppid() != parent:  # the parent ended before the signal was set
    os._exit(128 + sig)
try:
    os.execvp(argv[0], argv)
except OSError as e:
    sys.stderr.write("cannot run " + argv[0] + ": " + e.strerror + "\\n")
    os._exit(127)
"""


def die_with_parent(argv: Sequence[str], sig: signal.Signals = signal.SIGTERM) -> list[str]:
    """`argv` as a command whose process receives `sig` when the calling thread ends (see the
    module doc): `[sys.executable, "-I", "-S", "-c", …, SIGNUM, PID, *argv]`, which execs argv;
    `argv` unchanged where that is not possible (not Linux, no interpreter path). argv[0] must
    be a path or on PATH; one that cannot be run exits 127 with a line on stderr."""
    if not sys.platform.startswith("linux") or not sys.executable:
        return list(argv)
    return [sys.executable, "-I", "-S", "-c", _SET_AND_EXEC, str(int(signal.Signals(sig))), str(os.getpid()),
            *argv]
