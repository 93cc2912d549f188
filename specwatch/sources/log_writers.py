"""Which followed log a server process writes, from what /proc shows (proc(5)).

Three ways a server's output reaches a file, each read without touching the processes:

* directly: fd 1 or 2 of one of its processes (`> server.log 2>&1`, a process manager's file)
  or another fd of its launcher (a logging `FileHandler`) is the file: the same inode;
* through a pipe (`... 2>&1 | tee -a server.log`): its fd 1 or 2 is `pipe:[N]`; the process
  whose fd 0 is that pipe (`tee`, or a `logger`-like filter) holds the file open;
* by port (`ports_tie` in sources/process.py, not here): the `port` of the log's own
  `server_args` line is the launcher's `--port`; needs no fd at all.

fd targets need the same user as the process, or root (CAP_SYS_PTRACE, ptrace(2) access mode
`PTRACE_MODE_READ`); a process whose fds cannot be read is simply not tied this way.
Files are compared by (st_dev, st_ino), so a relative or symlinked `logs[].path`, or a server in
another mount namespace (a container), still matches; a glob path is matched against the fd's
link text with `fnmatch`.
"""

from __future__ import annotations

import fnmatch
import glob
import os
from typing import Iterable

FileKey = tuple[int, int]  # (st_dev, st_ino)


def _link(pid: int, fd: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None


def _key(pid: int, fd: int | str) -> FileKey | None:
    """The (st_dev, st_ino) of what the fd is open on (stat follows /proc's fd link)."""
    try:
        st = os.stat(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None
    return st.st_dev, st.st_ino


class LogFiles:
    """The followed paths to match, read once per tie attempt; `match` returns the entry itself
    (a glob for a file it matches).

    paths: followed `logs[].path` entries (exact paths or globs). keys: (dev, ino) → path of
    those that exist now; patterns: the glob entries.
    """

    def __init__(self, paths: Iterable[str]):
        self.keys: dict[FileKey, str] = {}
        self.patterns: list[str] = []
        self.exact: set[str] = set()
        for p in paths:
            if glob.has_magic(p):
                self.patterns.append(p)
                continue
            self.exact.add(p)
            try:
                st = os.stat(p)
            except OSError:
                continue
            self.keys.setdefault((st.st_dev, st.st_ino), p)

    def __bool__(self) -> bool:
        return bool(self.exact or self.patterns)

    def match(self, pid: int, fd: int | str, target: str | None) -> str | None:
        """The followed path the fd `fd` of `pid` (its link text `target`) is open on, or None.
        Only a file path (a target starting with "/") is looked at, never a pipe or socket."""
        if not target or not target.startswith("/") or target.startswith(("/dev/", "/proc/")):
            return None
        if target in self.exact:
            return target
        for pat in self.patterns:
            if fnmatch.fnmatchcase(target, pat):
                return pat
        if self.keys:
            key = _key(pid, fd)
            if key is not None and key in self.keys:
                return self.keys[key]
        return None

    def held_by(self, pid: int) -> str | None:
        """A followed path some fd of `pid` is open on (every fd listed), or None."""
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            return None
        for fd in fds:
            hit = self.match(pid, fd, _link(pid, fd))
            if hit is not None:
                return hit
        return None


def pipe_inode(target: str) -> str | None:
    """`pipe:[123]` → "pipe:[123]" (kept as the link text, which both ends share), else None."""
    return target if target.startswith("pipe:[") else None


def written_log(pids: Iterable[int], launcher: int, outputs: Iterable[str], files: LogFiles,
                candidates: Iterable[int]) -> tuple[str, str] | None:
    """(followed path, how) for the server whose processes are `pids` (its launcher `launcher`,
    fd 1/2 link texts `outputs`), or None.

    how: "stdout" (a process's fd 1 or 2 is the file), "open" (another fd of the launcher is),
    "pipe" (the process reading its stdout pipe holds the file). candidates: the pids to look
    through for a pipe's reader, likeliest first (the launcher's siblings); each is read once,
    one readlink of its fd 0, and only a reader's fds are listed.
    """
    if not files:
        return None
    own = set(pids)
    for pid in own:
        for fd in (1, 2):
            hit = files.match(pid, fd, _link(pid, fd))
            if hit is not None:
                return hit, "stdout"
    pipes = {p for t in outputs if (p := pipe_inode(t))}
    if pipes:
        for pid in candidates:
            if pid in own:
                continue
            target = _link(pid, 0)
            if target is not None and target in pipes:
                hit = files.held_by(pid)
                if hit is not None:
                    return hit, "pipe"
    hit = files.held_by(launcher)
    return (hit, "open") if hit is not None else None


def _writes(pid: int, fd: int | str) -> bool:
    """Whether `pid` has fd `fd` open for writing (the `flags:` line of /proc/PID/fdinfo/FD, octal)."""
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("flags:"):
                    return int(line.split()[1], 8) & os.O_ACCMODE != os.O_RDONLY
    except (OSError, ValueError, IndexError):
        pass
    return False


def log_writers(files: LogFiles, pids: Iterable[int], parent: dict[int, int], skip: Iterable[int] = ()) -> dict[str, int]:
    """followed path → pid of the process whose output it is, whatever its command line (a
    wrapper script, `python3 serve.py`): the reverse of `written_log`, for a log no server found
    by its command line writes.

    A process that holds a followed file open for writing is its writer when its fd 1 or 2 is
    the file (`> server.log 2>&1`); when its fd 0 is a pipe (`tee -a server.log`), the writers
    are the processes whose fd 1 or 2 is that pipe, and the one whose parent is not one of them
    (the pipeline's command, not its children) is named; the oldest pid of several. pids: every
    process to look at (each fd of each is read: run it seldom); parent: pid → parent pid;
    skip: pids never named (specwatch itself).
    """
    skip = set(skip)
    direct: dict[str, set[int]] = {}
    readers: dict[str, str] = {}  # pipe link text → the followed path its reader writes
    for pid in pids:
        if pid in skip:
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            hit = files.match(pid, fd, _link(pid, fd))
            if hit is None or not _writes(pid, fd):
                continue
            if any(files.match(pid, out, _link(pid, out)) == hit for out in (1, 2)):
                direct.setdefault(hit, set()).add(pid)
            else:
                pipe = pipe_inode(_link(pid, 0) or "")
                if pipe is not None:
                    readers[pipe] = hit
            break
    if readers:
        for pid in pids:
            if pid in skip:
                continue
            for std in (1, 2):
                hit = readers.get(_link(pid, std) or "")
                if hit is not None:
                    direct.setdefault(hit, set()).add(pid)
                    break
    return {path: min(p for p in ws if parent.get(p) not in ws) if any(parent.get(p) not in ws for p in ws) else min(ws)
            for path, ws in direct.items()}
