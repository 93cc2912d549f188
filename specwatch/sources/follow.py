"""`tail -F` for SGLang logs that loses no line and emits none twice.

`Follower` follows one path through rename rotation, copytruncate, delete-and-recreate, late
creation and restarts (via `checkpoint()`); `FollowerGroup` drives several followers from one
thread, woken by `watchdog` events with a polling fallback. See monitoring.md §1.7 for why.

A followed file is identified by device + inode + a hash of its first `HEAD_BYTES` bytes (the
"head"): the inode alone is reused by filesystems, and copytruncate keeps the inode but replaces
the content.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from specwatch.events import LogLine
from specwatch.storage import read_json, write_json_atomic  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

HEAD_BYTES = 256
CHECKPOINT_VERSION = 1
_EMPTY_SHA = hashlib.sha256(b"").hexdigest()
_READ_FROM = ("beginning", "end")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _open_regular(path: str) -> tuple[int, os.stat_result]:
    """Open `path` read-only. Raises FileNotFoundError, other OSError, and OSError(EINVAL) when
    it is not a regular file (a FIFO or a directory cannot be followed by offset)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _stat_ident(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class _Stream:
    """Reading state of one open file (one inode, or one content after a truncation).

    Fields only grow while the stream is current (offsets, head), so another thread can read a
    consistent checkpoint from it without a lock; a truncation makes a new _Stream instead of
    resetting this one.
    """

    __slots__ = (
        "fd", "dev", "ino", "offset", "emitted", "buf", "skipping", "count_skip", "head",
        "mtime_ns", "size", "prior_rotated",
    )

    def __init__(self, fd: int, st: os.stat_result, offset: int = 0, head: bytes = b""):
        self.fd = fd
        self.dev = st.st_dev
        self.ino = st.st_ino
        self.offset = offset  # next byte to read
        self.emitted = offset  # end of the last line passed on (or skipped): the checkpoint
        self.buf = b""  # bytes [emitted, offset): an unfinished line
        self.skipping = False  # inside an over-long line, discarding until its newline
        self.count_skip = True  # False when discarding a fragment after read_from="end"
        self.head = head
        self.mtime_ns = st.st_mtime_ns
        self.size = st.st_size
        self.prior_rotated: tuple[int, int, int] | None = None  # `<path>.1` seen at open

    def snapshot(self, path: str) -> dict[str, Any]:
        head = self.head  # read before `emitted`: an older, shorter head is still a valid prefix
        emitted = self.emitted
        return {
            "version": CHECKPOINT_VERSION,
            "path": path,
            "dev": self.dev,
            "inode": self.ino,
            "offset": emitted,
            "head_len": len(head),
            "head_sha256": _sha(head),
            "size": max(self.size, emitted),
        }


def _line(path: str, raw: bytes, pos: int) -> LogLine:
    """Bytes of one line (no `\n`) → LogLine: `\r` stripped, invalid UTF-8 replaced and flagged."""
    if raw[-1:] == b"\r":
        raw = raw[:-1]
    try:
        return LogLine(path, raw.decode("utf-8"), pos, True)
    except UnicodeDecodeError:
        return LogLine(path, raw.decode("utf-8", "replace"), pos, False)


class Follower:
    """Follow one file path like `tail -F`, passing each complete line to `on_line` exactly once.

    Not thread-safe: call `poll()` (and `close()`) from one thread; `checkpoint()` and the
    counters may be read from any thread. Assumes one writer order per file: once a replacement
    file at `path` has data, nothing more is appended to the old one.

    Counters (plain attributes, read by the metrics code): `lines_total`, `bytes_total` (bytes of
    lines passed on or skipped, terminators included), `rotations_total` (switches to a new
    file at `path`), `truncations_total`, `long_lines_skipped_total`, `read_errors_total`,
    `recovered_lines_total` (lines read from `<path>.1` after a copytruncate),
    `callback_errors_total` (exceptions raised by `on_line`, logged and swallowed),
    `last_line_timestamp` (time.time() seconds of the last emitted line, or None).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        on_line: Callable[[LogLine], None],
        *,
        max_line_bytes: int = 1_048_576,
        checkpoint: dict[str, Any] | None = None,
        read_from: str = "beginning",
        read_chunk_bytes: int = 1 << 20,
    ) -> None:
        """`max_line_bytes`: lines longer than this (bytes, without the newline) are skipped and
        counted. `checkpoint`: a dict from `checkpoint()` to resume exactly after its last line
        (ignored, with a warning, when it names another path).
        `read_from`: "beginning" or "end", only for a file already present at the first poll
        without a checkpoint; a file that appears later is always read from its start.
        `read_chunk_bytes`: bytes per read(2).

        Raises ValueError for a bad argument or a malformed checkpoint.
        """
        if read_from not in _READ_FROM:
            raise ValueError(f"read_from must be one of {_READ_FROM}, not {read_from!r}")
        if max_line_bytes < 1 or read_chunk_bytes < 1:
            raise ValueError("max_line_bytes and read_chunk_bytes must be >= 1")
        self.path = os.fspath(path)
        self.max_line_bytes = max_line_bytes
        self._on_line = on_line
        self._read_from = read_from
        self._chunk = read_chunk_bytes
        self._resume = None
        if checkpoint is not None:
            cp = self._validate_checkpoint(checkpoint)
            if cp["path"] is not None and os.path.abspath(cp["path"]) != os.path.abspath(self.path):
                # The configured path changed: that position belongs to another file.
                log.warning("ignoring checkpoint of %s for %s", cp["path"], self.path)
            else:
                cp["path"] = self.path
                self._resume = cp
        self._opened_once = False
        self._cur: _Stream | None = None
        self._ckpt: _Stream | None = None  # what checkpoint() describes (may be a recovery stream)

        self.lines_total = 0
        self.bytes_total = 0
        self.rotations_total = 0
        self.truncations_total = 0
        self.long_lines_skipped_total = 0
        self.read_errors_total = 0
        self.recovered_lines_total = 0
        self.callback_errors_total = 0
        self.last_line_timestamp: float | None = None

    # ----------------------------------------------------------------------------------- public

    @property
    def is_open(self) -> bool:
        """True while a file descriptor is held (the file, or the rotated file being drained)."""
        return self._cur is not None

    def poll(self) -> int:
        """Read everything available now and pass each complete line to `on_line`.

        Returns the number of lines emitted. Never raises OSError: I/O errors (permissions, races
        with rotation, ESTALE) are counted in `read_errors_total` and retried on the next call.
        When nothing changed this costs one os.stat().
        """
        before = self.lines_total
        try:
            self._poll()
        except OSError as e:
            self.read_errors_total += 1
            log.debug("read error on %s: %s", self.path, e)
            # NFS handle gone, or failed half-way through a recovery from `<path>.1`: restart
            # from the checkpoint, which always describes exactly what was emitted.
            if e.errno == errno.ESTALE or (self._cur is not None and self._ckpt is not self._cur):
                self.close()
        return self.lines_total - before

    def checkpoint(self) -> dict[str, Any]:
        """A JSON-able position just after the last line passed to `on_line` (whose call returned).

        Keys: version, path, dev, inode, offset (bytes), head_len (bytes), head_sha256, size
        (bytes, last size seen). dev/inode are None when no file was ever opened.
        Safe to call from any thread.
        """
        s = self._ckpt
        if s is None:
            if self._resume is not None:
                return dict(self._resume)
            return {
                "version": CHECKPOINT_VERSION, "path": self.path, "dev": None, "inode": None,
                "offset": 0, "head_len": 0, "head_sha256": _EMPTY_SHA, "size": 0,
            }
        return s.snapshot(self.path)

    def finish(self) -> int:
        """The file is complete (a recorded log being replayed): emit an unterminated last line
        as a line. Returns the lines emitted (0 or 1)."""
        before = self.lines_total
        if self._cur is not None:
            self._finish(self._cur)
        return self.lines_total - before

    def close(self) -> None:
        """Release the file descriptor. A later `poll()` resumes from `checkpoint()`, exactly as a
        new Follower given that checkpoint would (a buffered partial line is re-read)."""
        s = self._cur
        if s is None:
            return
        self._resume = self.checkpoint()
        self._cur = None
        self._ckpt = None
        try:
            os.close(s.fd)
        except OSError:
            pass

    # --------------------------------------------------------------------------------- polling

    def _poll(self) -> None:
        if self._cur is None:
            self._open()
            if self._cur is None:
                return
        s = self._cur
        try:
            st: os.stat_result | None = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if st is not None and st.st_ino == s.ino and st.st_dev == s.dev:
            if st.st_size == s.offset and st.st_mtime_ns == s.mtime_ns:
                return  # nothing changed
            s.mtime_ns = st.st_mtime_ns
            s.size = st.st_size
            # Equal size with a new mtime may be a truncate + rewrite of the same length.
            if (
                st.st_size < s.offset
                or (st.st_size == s.offset and not self._head_ok(s))
                or not self._read(s)
            ):
                self._truncated(s)
            return

        # `path` is gone or is another file: `s` is the old file. Keep draining it; switch only
        # once the new file has data, since the writer may still append to its old fd until then.
        fst = os.fstat(s.fd)
        s.size = fst.st_size
        if fst.st_size < s.offset or not self._read(s):
            self._truncated(s)
            return
        if st is None or st.st_size == 0:
            return
        # The new file's first byte was written after the writer's last write to the old one,
        # and we saw it (stat above) before that last read: the old file is complete.
        self._finish(s)
        self._cur = None
        os.close(s.fd)
        self.rotations_total += 1
        log.info("%s rotated: old file finished at offset %d", self.path, s.emitted)
        self._open()  # a new file at `path` is read from its start

    def _open(self) -> None:
        cp, self._resume = self._resume, None
        if cp is not None and cp["inode"] is not None:
            self._resume_from(cp)
            return
        try:
            fd, st = _open_regular(self.path)
        except FileNotFoundError:
            self._opened_once = True  # absent at start: read it from its first line later
            if cp is not None:
                self._resume = cp
            return
        except OSError:
            self.read_errors_total += 1
            if cp is not None:
                self._resume = cp
            return
        s = _Stream(fd, st)
        if not self._opened_once and cp is None and self._read_from == "end":
            self._start_near_end(s, st.st_size)
        self._opened_once = True
        self._set_current(s)
        self._read_or_truncate(s)

    def _set_current(self, s: _Stream) -> None:
        s.prior_rotated = _stat_ident(self.path + ".1")
        self._cur = s
        self._ckpt = s

    def _start_near_end(self, s: _Stream, size: int) -> None:
        """Start after the last newline, so the first line emitted is a whole one."""
        if size == 0:
            return
        n = min(size, self._chunk, self.max_line_bytes + 1)
        tail = os.pread(s.fd, n, size - n)
        i = tail.rfind(b"\n")
        if i >= 0:
            s.offset = s.emitted = size - n + i + 1
        elif n < size:  # mid-way through a line longer than we look back: drop its rest
            s.offset = s.emitted = size
            s.skipping = True
            s.count_skip = False

    # ------------------------------------------------------------------------ resume, recovery

    @staticmethod
    def _validate_checkpoint(cp: dict[str, Any]) -> dict[str, Any]:
        try:
            out = {
                "version": CHECKPOINT_VERSION,
                "path": cp.get("path"),
                "dev": cp["dev"],
                "inode": cp["inode"],
                "offset": int(cp["offset"]),
                "head_len": int(cp["head_len"]),
                "head_sha256": str(cp["head_sha256"]),
                "size": int(cp.get("size", 0)),
            }
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"malformed checkpoint: {e!r}") from e
        ident_ok = (out["dev"] is None and out["inode"] is None) or (
            isinstance(out["dev"], int) and isinstance(out["inode"], int)
        )
        if not ident_ok or out["offset"] < 0 or not 0 <= out["head_len"] <= HEAD_BYTES:
            raise ValueError(f"malformed checkpoint: {cp!r}")
        return out

    def _resume_from(self, cp: dict[str, Any]) -> None:
        dev, ino, off = cp["dev"], cp["inode"], cp["offset"]
        hlen, hsha = cp["head_len"], cp["head_sha256"]
        try:
            fd, st = _open_regular(self.path)
        except FileNotFoundError:
            fd, st = None, None
        except OSError:
            self.read_errors_total += 1
            self._resume = cp  # cannot tell what happened yet: retry next poll
            return
        self._opened_once = True
        try:
            if st is not None and (st.st_dev, st.st_ino) == (dev, ino):
                head = os.pread(fd, hlen, 0)
                if st.st_size >= off and _sha(head) == hsha:
                    fd, s = None, _Stream(fd, st, off, head)  # the stream owns the fd now
                    self._set_current(s)
                    self._read_or_truncate(s)
                    return
                # Same inode, other content: truncated (copytruncate) or inode reused meanwhile.
                self.truncations_total += 1
                self._recover_rotated(dev, ino, off, hlen, hsha, None)
            else:
                # Replaced or removed while we were stopped: the old file is usually `<path>.1`.
                found = self._open_matching_rotated(off, hlen, hsha, None)
                if found is not None:
                    fd1, st1 = found
                    if (st1.st_dev, st1.st_ino) == (dev, ino):
                        # Renamed; its writer may still append. Follow it as the old file: _poll
                        # drains it and switches once `path` has data.
                        if fd is not None:
                            os.close(fd)
                            fd = None
                        s = _Stream(fd1, st1, off, os.pread(fd1, hlen, 0))
                        self._set_current(s)
                        self._poll()
                        return
                    self._drain_rotated(fd1, st1, off, hlen)  # a copy: complete, read to its end
                if fd is not None:
                    self.rotations_total += 1
            if fd is not None:
                fd, s = None, _Stream(fd, st)
                self._set_current(s)
                self._read_or_truncate(s)
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise

    def _open_matching_rotated(
        self, off: int, hlen: int, hsha: str, prior: tuple[int, int, int] | None
    ) -> tuple[int, os.stat_result] | None:
        """Open `<path>.1` if it holds our file's content up to `off` (same head hash)."""
        try:
            fd1, st1 = _open_regular(self.path + ".1")
        except FileNotFoundError:
            return None
        except OSError:
            self.read_errors_total += 1
            return None
        try:
            ok = st1.st_size >= off and _sha(os.pread(fd1, hlen, 0)) == hsha
            # A short head is a weak fingerprint: also reject the `.1` that was there before we
            # opened the file (an older rotation), by inode and ctime.
            if ok and hlen < HEAD_BYTES and prior is not None:
                ok = (st1.st_dev, st1.st_ino, st1.st_ctime_ns) != prior
        except BaseException:
            os.close(fd1)
            raise
        if not ok:
            os.close(fd1)
            return None
        return fd1, st1

    def _recover_rotated(
        self, dev: int, ino: int, off: int, hlen: int, hsha: str,
        prior: tuple[int, int, int] | None,
    ) -> bool:
        """After a copytruncate, read the lines after `off` from the copy at `<path>.1`."""
        found = self._open_matching_rotated(off, hlen, hsha, prior)
        if found is None:
            return False
        fd1, st1 = found
        if (st1.st_dev, st1.st_ino) == (dev, ino):  # that is the truncated file itself
            os.close(fd1)
            return False
        self._drain_rotated(fd1, st1, off, hlen)
        return True

    def _drain_rotated(self, fd1: int, st1: os.stat_result, off: int, hlen: int) -> None:
        try:
            r = _Stream(fd1, st1, off, os.pread(fd1, hlen, 0))
            self._ckpt = r  # a crash now resumes from the copy, then the truncated file
            before = self.lines_total
            self._read(r)
            self._finish(r)
            self.recovered_lines_total += self.lines_total - before
            log.info("%s: recovered %d lines from %s.1", self.path, self.lines_total - before,
                     self.path)
        finally:
            os.close(fd1)

    def _truncated(self, s: _Stream, depth: int = 0) -> None:
        """`s` (same fd) now holds new content from offset 0: recover, then restart at 0."""
        self.truncations_total += 1
        log.info("%s truncated at offset %d", self.path, s.emitted)
        if not self._recover_rotated(
            s.dev, s.ino, s.emitted, len(s.head), _sha(s.head), s.prior_rotated
        ):
            self._finish(s)  # without a copy, the unfinished tail is all that is left of it
        new = _Stream(s.fd, os.fstat(s.fd))
        self._set_current(new)
        self._read_or_truncate(new, depth)

    def _read_or_truncate(self, s: _Stream, depth: int = 0) -> None:
        # Bounded: a file truncated again and again is left to the next poll.
        if not self._read(s) and depth < 2:
            self._truncated(s, depth + 1)

    # -------------------------------------------------------------------------------- reading

    def _head_ok(self, s: _Stream) -> bool:
        """True when the file still starts with the bytes we saw; grows the head up to HEAD_BYTES."""
        n = len(s.head)
        cur = os.pread(s.fd, HEAD_BYTES if n < HEAD_BYTES else n, 0)
        if cur[:n] != s.head:
            return False
        if len(cur) > n:
            s.head = cur
        return True

    def _read(self, s: _Stream) -> bool:
        """Read `s` to its current end. False when its content was replaced (truncated)."""
        while True:
            chunk = os.pread(s.fd, self._chunk, s.offset)
            if not chunk:
                return True
            # Checked after the read: a truncation before it shows as a changed head, so
            # bytes of the new content are never taken as the old file's continuation.
            if not self._head_ok(s):
                return False
            self._consume(s, chunk)
            if len(chunk) < self._chunk:
                return True

    def _consume(self, s: _Stream, chunk: bytes) -> None:
        pos = s.emitted
        if s.skipping:
            nl = chunk.find(b"\n")
            if nl < 0:
                s.offset += len(chunk)
                self.bytes_total += len(chunk)
                return
            if s.count_skip:
                self.long_lines_skipped_total += 1
            s.skipping = False
            s.count_skip = True
            pos = s.offset + nl + 1
            s.emitted = pos
            data = chunk[nl + 1:]
        elif s.buf:
            data = s.buf + chunk
        else:
            data = chunk
        s.offset += len(chunk)
        self.bytes_total += len(chunk)

        parts = data.split(b"\n")
        tail = parts.pop()
        maxb = self.max_line_bytes
        on_line = self._on_line
        path = self.path
        n = 0
        # Hot loop (a backlog is millions of lines): counters kept local.
        try:
            for raw in parts:
                size = len(raw)
                end = pos + size + 1
                if raw[:1] == b"\0":
                    # NULs: the hole a non-append writer leaves after a copytruncate (its fd
                    # offset stays past the new end); the line written after them is real.
                    raw = raw.lstrip(b"\0")
                    size = len(raw)
                if size > maxb:
                    self.long_lines_skipped_total += 1
                else:
                    try:
                        on_line(_line(path, raw, pos))
                    except Exception:
                        self._callback_failed(path, pos)
                    n += 1
                s.emitted = pos = end
        finally:
            if n:
                self.lines_total += n
                self.last_line_timestamp = time.time()
        if tail[:1] == b"\0":
            tail = tail.lstrip(b"\0")  # a NUL hole never makes a line too long (see above)
        if len(tail) > maxb:
            s.buf = b""
            s.skipping = True
        else:
            s.buf = tail

    def _deliver(self, on_line: Callable[[LogLine], None], path: str, raw: bytes, pos: int) -> None:
        try:
            on_line(_line(path, raw, pos))
        except Exception:
            self._callback_failed(path, pos)
        self.lines_total += 1

    def _callback_failed(self, path: str, pos: int) -> None:
        # The line counts as passed on: re-sending it would double count downstream.
        self.callback_errors_total += 1
        if self.callback_errors_total <= 10 or self.callback_errors_total % 1000 == 0:
            log.exception("on_line failed for %s offset %d", path, pos)

    def _finish(self, s: _Stream) -> None:
        """The file will get no more bytes: an unterminated last line is emitted as a line."""
        if s.skipping:
            if s.count_skip:
                self.long_lines_skipped_total += 1
            s.skipping = False
            s.emitted = s.offset
        elif s.buf:
            raw, s.buf = s.buf, b""
            self._deliver(self._on_line, self.path, raw, s.emitted)
            s.emitted = s.offset
            self.last_line_timestamp = time.time()


class FollowerGroup:
    """Run several Followers on one background thread.

    Every `on_line` call of every follower happens on that single thread, so consumers need no
    locks. The thread wakes on `watchdog` events for the followed paths (one non-recursive watch
    per parent directory) and also every `poll_interval` seconds, so lost or missing events
    (inotify overflow, NFS, a directory that does not exist yet) only delay lines. Idle, it blocks
    on an Event (no busy loop).

    Counters: `watch_errors_total` (watchdog could not start or watch a directory; those paths
    are polled only), `poll_errors_total` (unexpected exceptions from a follower, logged).
    `watching` is True while watchdog watches at least one directory.
    """

    _WATCH_RETRY_S = 30.0

    def __init__(
        self,
        followers: Iterable[Follower] = (),
        *,
        poll_interval: float = 1.0,
        use_watchdog: bool = True,
        name: str = "specwatch-follow",
        after_poll: Callable[[], None] | None = None,
    ) -> None:
        """`poll_interval`: seconds between polls when no event arrives (> 0).
        `after_poll`: called on the group's thread after each poll round, when no `on_line` call
        is in flight, so it can persist `checkpoints()` together with the consumer's state.

        Raises ValueError for a bad poll_interval or two followers of the same path.
        """
        if not poll_interval > 0:
            raise ValueError("poll_interval must be > 0 seconds")
        self.poll_interval = float(poll_interval)
        self._use_watchdog = use_watchdog
        self._name = name
        self._after_poll = after_poll
        self._followers: dict[str, Follower] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._observer: Any = None
        self._interest: frozenset[str] = frozenset()
        self._watched: set[str] = set()
        self._last_watch_try = 0.0
        self.watch_errors_total = 0
        self.poll_errors_total = 0
        self._pending: list[tuple[list[Follower], list[str]]] = []  # update() calls not yet applied
        self._pending_lock = threading.Lock()
        for f in followers:
            self.add(f)

    @property
    def followers(self) -> dict[str, Follower]:
        """Followers by path (a copy)."""
        return dict(self._followers)

    @property
    def watching(self) -> bool:
        return bool(self._watched)

    @property
    def thread(self) -> threading.Thread | None:
        """The thread that runs every poll and every on_line call (None before `start()`)."""
        return self._thread

    def add(self, follower: Follower) -> None:
        """Add a follower before `start()`. Raises RuntimeError once started, ValueError for a
        path already followed."""
        if self._thread is not None:
            raise RuntimeError("cannot add followers to a started FollowerGroup")
        if follower.path in self._followers:
            raise ValueError(f"{follower.path!r} is already followed")
        self._followers[follower.path] = follower

    def update(self, add: Iterable[Follower] = (), remove: Iterable[str] = ()) -> None:
        """Follow more paths and stop following others, also while running (a config reload).

        Before `start()` this applies at once. Once started, the change is queued and applied on
        the group's thread before its next poll round (woken now), so `on_line` stays
        single-threaded and no line is cut in half; a removed follower's file is closed there.
        Raises ValueError for a path added twice or already followed (and not removed).
        """
        add, remove = list(add), [os.fspath(p) for p in remove]
        paths = [f.path for f in add]
        kept = set(self._followers) - set(remove)
        for p in paths:
            if p in kept or paths.count(p) > 1:
                raise ValueError(f"{p!r} is already followed")
        with self._pending_lock:
            self._pending.append((add, remove))
        if self._thread is None:
            self._apply_pending()
        else:
            self._wake.set()

    def start(self) -> None:
        """Start watchdog (if enabled) and the thread; the first poll happens at once.
        Raises RuntimeError if already started."""
        if self._thread is not None:
            raise RuntimeError("FollowerGroup already started")
        self._interest = frozenset(os.path.abspath(p) for p in self._followers)
        if self._use_watchdog:
            self._start_watchdog()
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop the thread and watchdog, waiting up to `timeout` seconds each; the followers'
        files are closed (their checkpoints stay valid). Returns True when the thread ended."""
        self._stop.set()
        self._wake.set()
        if self._observer is not None:
            try:
                self._observer.stop()
                self._observer.join(timeout)
            except Exception:  # watchdog internals: stopping must not fail the daemon's shutdown
                log.exception("stopping watchdog failed")
            self._observer = None
            self._watched.clear()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def wake(self) -> None:
        """Ask the thread for a poll round now (from any thread)."""
        self._wake.set()

    def poll_all(self) -> int:
        """Poll every follower once; returns the lines emitted. While the group runs, only its own
        thread may call this (RuntimeError otherwise: use `wake()`), keeping on_line single-threaded."""
        t = self._thread
        if t is not None and t.is_alive() and threading.current_thread() is not t:
            raise RuntimeError("FollowerGroup is running: use wake() from other threads")
        total = 0
        for f in self._followers.values():
            try:
                total += f.poll()
            except Exception:
                self.poll_errors_total += 1
                log.exception("polling %s failed", f.path)
        return total

    def checkpoints(self) -> dict[str, dict[str, Any]]:
        """`Follower.checkpoint()` of every follower, by path. Safe from any thread."""
        return {p: f.checkpoint() for p, f in self._followers.items()}

    # ------------------------------------------------------------------------------- internals

    def _run(self) -> None:
        try:
            self.poll_all()
            while not self._stop.is_set():
                woke = self._wake.wait(self.poll_interval)
                if self._stop.is_set():
                    break
                self._wake.clear()  # before polling: an event during the poll means another round
                self._apply_pending()
                self.poll_all()
                if self._after_poll is not None:
                    try:
                        self._after_poll()
                    except Exception:
                        log.exception("after_poll hook failed")
                if not woke:
                    self._retry_watches()
        finally:
            for f in self._followers.values():
                f.close()

    def _apply_pending(self) -> None:
        """Apply queued `update()` calls (on the group's thread once started). The dict is
        replaced, never mutated, so readers on other threads iterate a consistent copy."""
        with self._pending_lock:
            pending, self._pending = self._pending, []
        for add, remove in pending:
            followers = dict(self._followers)
            for p in remove:
                f = followers.pop(p, None)
                if f is not None and self._thread is not None:
                    f.close()
            for f in add:
                followers[f.path] = f
            self._followers = followers
            self._interest = frozenset(os.path.abspath(p) for p in followers)
            if self._observer is not None:  # watch the directories of new paths at once
                for d in sorted(self._dirs() - self._watched):
                    if os.path.isdir(d):
                        self._watch(d)

    def _dirs(self) -> set[str]:
        return {os.path.dirname(p) for p in self._interest}

    def _start_watchdog(self) -> None:
        from watchdog.events import (
            FileClosedEvent, FileCreatedEvent, FileDeletedEvent, FileModifiedEvent,
            FileMovedEvent, FileSystemEventHandler,
        )
        from watchdog.observers import Observer

        group = self

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:
                src = os.fsdecode(event.src_path)
                dest_path = getattr(event, "dest_path", "")  # only on move events before watchdog 4
                dest = os.fsdecode(dest_path) if dest_path else ""
                if src in group._interest or dest in group._interest:
                    group._wake.set()

        self._handler = _Handler()
        # No open/close-nowrite events: our own reads must not wake us.
        self._event_filter = [FileModifiedEvent, FileCreatedEvent, FileMovedEvent,
                              FileDeletedEvent, FileClosedEvent]
        observer = Observer()
        observer.daemon = True
        try:
            observer.start()
        except Exception as e:  # e.g. OSError EMFILE when inotify instances are exhausted
            self.watch_errors_total += 1
            log.warning("watchdog unavailable, polling every %.1fs only: %s", self.poll_interval, e)
            return
        self._observer = observer
        self._last_watch_try = time.monotonic()
        for d in sorted(self._dirs()):
            self._watch(d)

    def _watch(self, d: str) -> None:
        try:
            try:
                self._observer.schedule(self._handler, d, recursive=False,
                                        event_filter=self._event_filter)
            except TypeError:  # watchdog < 4 has no event_filter
                self._observer.schedule(self._handler, d, recursive=False)
        except Exception as e:  # missing directory, inotify watch limit (ENOSPC), ...
            self.watch_errors_total += 1
            log.warning("cannot watch %s, polling it every %.1fs: %s", d, self.poll_interval, e)
            return
        self._watched.add(d)

    def _retry_watches(self) -> None:
        """Watch directories that were missing at start, once they exist (rate-limited)."""
        if self._observer is None or time.monotonic() - self._last_watch_try < self._WATCH_RETRY_S:
            return
        self._last_watch_try = time.monotonic()
        for d in sorted(self._dirs() - self._watched):
            if os.path.isdir(d):
                self._watch(d)
