"""Small durable JSON files in the state directory (daemon state, queues, silences).

Writers replace the whole file atomically, so a reader (another process included) sees the old
or the new content, never a mix, and a crash mid-write loses nothing already on disk.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Any

log = logging.getLogger(__name__)


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Write `obj` as JSON to `path` so readers see the old or the new file, never a mix.

    Temp file in the same directory, fsync, os.replace, then fsync of the directory so the
    rename survives a crash. Raises OSError on I/O errors and TypeError/ValueError when `obj` is
    not JSON-serialisable (the old file is then left untouched).
    """
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return  # some filesystems do not allow opening directories; the data itself is synced
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def read_json(path: str | os.PathLike[str], default: Any = None) -> Any:
    """Load JSON from `path`; returns `default` when the file is missing or not valid JSON
    (logged). Raises OSError for other I/O errors (e.g. PermissionError)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return default
    except (ValueError, UnicodeDecodeError) as e:
        log.warning("ignoring unreadable JSON state %s: %s", os.fspath(path), e)
        return default


LOCK_NAME = "specwatch.lock"


class StateDirLocked(Exception):
    """Another process holds the lock of the state directory. `path`: the lock file; `pid`: the
    holder's pid as it wrote it (None when unreadable)."""

    def __init__(self, path: str, pid: int | None):
        self.path, self.pid = path, pid
        holder = f"pid {pid}" if pid is not None else "another process"
        super().__init__(f"state directory {os.path.dirname(path)} is in use by {holder} "
                         f"(lock {path}): one specwatch daemon per state_dir")


def lock_state_dir(state_dir: str | os.PathLike[str]) -> int:
    """Take `<state_dir>/specwatch.lock` for this process's life: an exclusive `flock(2)` on an
    open descriptor (returned; the kernel drops the lock when it is closed or the process dies,
    kill -9 included, so a stale file never blocks a restart). Our pid is written into the file
    for the message another process gets.

    Raises StateDirLocked when another process holds it; OSError when the file cannot be
    opened or written.
    """
    import fcntl

    path = os.path.join(os.fspath(state_dir), LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            pid: int | None = int(os.pread(fd, 32, 0).decode().strip())
        except (OSError, ValueError):
            pid = None
        os.close(fd)
        raise StateDirLocked(path, pid) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
