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
