"""One followed file: `tail -F` for an SGLang log that loses no line and emits none twice.

`Follower` follows one path through rename rotation, copytruncate, delete-and-recreate, late
creation and restarts (via `checkpoint()`), and hands out complete lines one by one (`on_line`) or
one read at a time (`on_lines`, a `LineBatch`). The set of followed files, their thread and the
watchdog observer are in `specwatch.sources.follow` (the split of mtail's
`internal/tailer/logstream/filestream.go` and `internal/tailer/tail.go`).

A followed file is identified by device + inode + a hash of its first `HEAD_BYTES` bytes (the
"head"): the inode alone is reused by filesystems, and copytruncate keeps the inode but replaces
the content. Every file is read through a descriptor held from the moment a poll (or a `glance`)
first sees it at the path, so later renames and removals cannot take it away; files that came and
went between two polls, or while the reader was stopped, are found in the rotated copies
(`<path>.1`, `.2.gz`, `-YYYYMMDD`, ...: `specwatch.sources.rotated`), opened by identity (device
+ inode, not by the name they had when listed), and read in order before the next file; what cannot
be found is counted (`rotated_files_lost_total`) and logged as a warning.
"""

from __future__ import annotations

import enum
import errno
import hashlib
import logging
import os
import stat
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from itertools import accumulate, repeat
from typing import Any, ClassVar, Final, Literal

from specwatch.core.events import LogLine
from specwatch.sources.rotated import (
    Fingerprint, RotatedFile, newest_fingerprint, rotated_files, since,
)

log = logging.getLogger(__name__)

HEAD_BYTES = 256
# bytes per read(2) of a backlog (`run` and `replay` alike): larger reads hold more of a read's
# records at once and leave the heap fragmented after the backlog (docs/performance.md)
READ_BYTES = 1 << 18
_SLACK = 64 * 1024  # bytes read past the size last seen (what the writer added since the stat)
# a hole in the `.N` numbering is listed again this often, this far apart, before it counts as lost
RELIST_TRIES, RELIST_PAUSE = 5, 0.02
CHECKPOINT_VERSION = 1
_EMPTY_SHA = hashlib.sha256(b"").hexdigest()
_READ_FROM = ("beginning", "end")


class _Mark(enum.Enum):
    """What a `prior` argument says instead of a fingerprint: enum members, so that `prior is
    _LIST` leaves a fingerprint (or None) to the type checker."""

    LIST = "list"  # list the rotated copies now
    UNKNOWN = "unknown"  # a checkpoint without "prior": where our file stood among its copies


_LIST: Final = _Mark.LIST
_UNKNOWN: Final = _Mark.UNKNOWN


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


class _Stream:
    """Reading state of one open file (one inode, or one content after a truncation).

    Fields only grow while the stream is current (offsets, head), so another thread can read a
    consistent checkpoint from it without a lock; a truncation makes a new _Stream instead of
    resetting this one.
    """

    __slots__ = (
        "fd", "dev", "ino", "offset", "emitted", "buf", "skipping", "count_skip", "head",
        "mtime_ns", "size", "prior",
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
        # The newest rotated copy when this file became current (None: there was none). Copies
        # after it were rotated while this file was read: they hold this file or later ones.
        self.prior: Fingerprint | None = None

    def fingerprint(self) -> Fingerprint:
        return Fingerprint.of(self.dev, self.ino, self.head)

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
            "prior": None if self.prior is None else list(self.prior),
        }


def _decode(raw: bytes) -> tuple[str, bool]:
    """Bytes of one line (no `\n`) → (text, valid UTF-8): `\r` stripped, invalid UTF-8 replaced."""
    if raw[-1:] == b"\r":
        raw = raw[:-1]
    try:
        return raw.decode("utf-8"), True
    except UnicodeDecodeError:
        return raw.decode("utf-8", "replace"), False


_PLUS_ONE = (1).__add__  # line length + its newline, without a Python-level loop


def _lines_within(block: bytes, maxb: int) -> bool:
    """No line of `block` (complete lines) is longer than `maxb` bytes: a jump to the last
    newline within reach of each line start, a few searches per read."""
    p, n = 0, len(block)
    while n - p > maxb + 1:
        nl = block.rfind(b"\n", p, p + maxb + 1)
        if nl < 0:
            return False
        p = nl + 1
    return True


class LineBatch:
    """The complete lines of one read, in file order, as `Follower(on_lines=...)` hands them out.

    `path`: the followed path. `start`/`end`: byte offsets of the first line's start and just after
    the last line's newline. `lines`: each line's text, exactly as `on_line` would get it (UTF-8
    decoded, no `\n`, a trailing `\r` and a leading NUL hole removed; lines over `max_line_bytes`
    left out). `text`: the same lines, each followed by `\n`, as one str (a regex can reject lines
    in bulk before anything is split). `raw_ok`: None when every line was valid UTF-8, else one
    flag per line (False: decoded with U+FFFD). Iterating yields the `LogLine`s `on_line` would get.

    Built lazily: a read of clean ASCII lines (the usual case) keeps its bytes (`_block`) only;
    `lines`, `text` and `offsets()` are made on first use.
    """

    __slots__ = ("path", "start", "end", "raw_ok", "_text", "_lines", "_block", "_bounds", "_n")

    def __init__(self, path: str, start: int, end: int, *, block: bytes | None = None,
                 text: str | None = None, lines: list[str] | None = None,
                 raw_ok: list[bool] | None = None, bounds: list[int] | None = None) -> None:
        self.path, self.start, self.end, self.raw_ok = path, start, end, raw_ok
        self._text, self._lines, self._block, self._bounds = text, lines, block, bounds
        self._n: int | None = None

    def __len__(self) -> int:
        if self._lines is not None:
            return len(self._lines)
        if self._n is None:
            self._n = self._text.count("\n") if self._text is not None else self._kept_block().count(b"\n")
        return self._n

    def _kept_block(self) -> bytes:
        """The read's bytes (`block`: given whenever neither `lines` nor `text` is)."""
        block = self._block
        assert block is not None
        return block

    @property
    def text(self) -> str:
        if self._text is None:
            if self._lines is None:  # an ASCII block: its text is its bytes
                self._text = self._kept_block().decode("ascii")
            else:
                self._text = "\n".join(self._lines) + "\n" if self._lines else ""
        return self._text

    @property
    def lines(self) -> list[str]:
        if self._lines is None:
            self._lines = self.text.split("\n")
            self._lines.pop()  # after the last "\n"
        return self._lines

    @property
    def data(self) -> bytes:
        """The lines as bytes, each followed by `\n`: the read's own bytes where it kept them."""
        return self._block if self._block is not None else self.text.encode()

    def _bounds_list(self) -> list[int]:
        """Start of each line, then `end` (len(self) + 1 offsets)."""
        if self._bounds is None:
            if self._block is None or self._block.isascii():  # characters are bytes
                parts: list = self.lines
            else:
                parts = self._block.split(b"\n")
                parts.pop()
            self._bounds = list(accumulate(map(_PLUS_ONE, map(len, parts)), initial=self.start))
        return self._bounds

    def offsets(self) -> list[int]:
        """Byte offset of each line's start (what `LogLine.offset` holds)."""
        return self._bounds_list()[:-1]

    def __iter__(self) -> Iterator[LogLine]:
        ok = repeat(True) if self.raw_ok is None else self.raw_ok
        return map(LogLine, repeat(self.path), self.lines, self._bounds_list(), ok)


class Follower:
    """Follow one file path like `tail -F`, passing each complete line on exactly once: to
    `on_line` one `LogLine` at a time, or to `on_lines` one `LineBatch` per read (up to
    `read_chunk_bytes` of lines: the backlog path, one call per thousands of lines).

    Not thread-safe: call `poll()` (and `close()`) from one thread; `checkpoint()` and the
    counters may be read from any thread. Assumes one writer order per file: once a replacement
    file at `path` has data, nothing more is appended to the old one.

    Counters (plain attributes, read by the metrics code): `lines_total`, `bytes_total` (bytes of
    lines passed on or skipped, terminators included), `rotations_total` (switches to a new
    file at `path`), `truncations_total`, `long_lines_skipped_total`, `read_errors_total`,
    `recovered_lines_total` (lines read from rotated copies by name: `<path>.1` after a
    copytruncate, files rotated away while the reader was stopped), `rotated_files_lost_total`
    (rotated files, or the unread rest of one, that could not be found or read: a gap in `.N`,
    a checkpointed file gone at start, a corrupt `.gz`; each also a warning),
    `callback_errors_total` (exceptions raised by `on_line` or `on_lines`, logged and swallowed),
    `last_line_timestamp` (time.time() seconds of the last emitted line, or None).

    A `sources.stream.LineStream` of kind "file".
    """

    kind: ClassVar[str] = "file"
    watches_file: ClassVar[bool] = True
    first_read_is_history: ClassVar[bool] = True  # a file new to the config: its history first
    warns_when_closed: ClassVar[bool] = False  # the daemon warns about a missing file
    collector: ClassVar[Any] = None  # its counters are in `metrics.FollowerCollector`

    def __init__(
        self,
        path: str | os.PathLike[str],
        on_line: Callable[[LogLine], None] | None = None,
        *,
        on_lines: Callable[[LineBatch], None] | None = None,
        max_line_bytes: int = 1_048_576,
        checkpoint: dict[str, Any] | None = None,
        read_from: str = "beginning",
        read_chunk_bytes: int = READ_BYTES,
    ) -> None:
        """Exactly one of `on_line` (called once per line) and `on_lines` (called once per read with
        its complete lines, never with none; the checkpoint moves past the whole batch when it
        returns or raises) receives the lines, in file order, on the thread calling `poll()`.
        `max_line_bytes`: lines longer than this (bytes, without the newline) are skipped and
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
        if (on_line is None) == (on_lines is None):
            raise ValueError("give exactly one of on_line and on_lines")
        self.path = os.fspath(path)
        # set by its FollowerGroup: a stop ends a long read after its current chunk (a backlog
        # of gigabytes is not read to its end by a daemon told to stop)
        self.stopping: threading.Event | None = None
        self.max_line_bytes = max_line_bytes
        self._on_line = on_line
        self._on_lines = on_lines
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
        # files seen at `path` after `_cur`, oldest first, held open until read (their checkpoint
        # is `_cur`'s: a restart finds them among the rotated copies)
        self._later: list[_Stream] = []
        self._ckpt: _Stream | None = None  # what checkpoint() describes (may be a recovery stream)

        self.lines_total = 0
        self.bytes_total = 0
        self.rotations_total = 0
        self.truncations_total = 0
        self.long_lines_skipped_total = 0
        self.read_errors_total = 0
        self.recovered_lines_total = 0
        self.rotated_files_lost_total = 0
        self.callback_errors_total = 0
        self.last_line_timestamp: float | None = None

    # ----------------------------------------------------------------------------------- public

    @property
    def is_open(self) -> bool:
        """True while a file descriptor is held (the file, or the rotated file being drained)."""
        return self._cur is not None

    def why_closed(self) -> str:
        """Why the path is not open, in words."""
        path = self.path
        try:
            os.stat(path)
        except FileNotFoundError:
            parent = os.path.dirname(path) or "."
            return "does not exist" if os.path.isdir(parent) else f"does not exist (nor its directory {parent})"
        except OSError as e:
            return f"cannot be looked at: {e}"
        if os.path.isdir(path):
            return "is a directory"
        try:
            with open(path, "rb"):
                pass
        except OSError as e:
            return f"cannot be read: {e}"
        return "not open yet"

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
            # NFS handle gone, or failed half-way through reading a rotated copy: restart
            # from the checkpoint, which always describes exactly what was emitted.
            if e.errno == errno.ESTALE or (self._cur is not None and self._ckpt is not self._cur):
                self.close()
            elif self._cur is None and self._ckpt is not None:  # failed between two files
                self._resume, self._ckpt = self.checkpoint(), None
                self._drop_later()  # found again among the rotated copies
        return self.lines_total - before

    def glance(self) -> None:
        """Open the file now at `path` when it is not the one being read (rotated: it is read
        from that fd later, so a further rename or removal cannot take it out of reach). Reads
        no line; a stat when nothing changed. Never raises."""
        s = self._cur
        if s is None:
            return
        try:
            st = os.stat(self.path)
        except OSError:
            return
        if (st.st_dev, st.st_ino) != (s.dev, s.ino):
            self._hold_new(st)

    @property
    def stage(self) -> Callable[[LineBatch], None] | None:
        """The `on_lines` callback (e.g. a container log's `Unwrap`, which counts lines of its own)."""
        return self._on_lines

    def checkpoint(self) -> dict[str, Any]:
        """A JSON-able position just after the last line passed on (whose call returned).

        Keys: version, path, dev, inode, offset (bytes), head_len (bytes), head_sha256, size
        (bytes, last size seen), prior (the newest rotated copy when the file was opened, as
        [dev, inode, head_len, head_sha256], or None). dev/inode are None when no file was ever
        opened.
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
        self._drop_later()

    def _drop_later(self) -> None:
        later, self._later = self._later, []
        for n in later:
            try:
                os.close(n.fd)
            except OSError:
                pass

    # --------------------------------------------------------------------------------- polling

    def _poll(self) -> None:
        if self._cur is None:
            self._open()
            if self._cur is None:
                return
        while True:  # once per file rotated away since the last poll (each held open)
            s = self._cur
            try:
                st: os.stat_result | None = os.stat(self.path)
            except FileNotFoundError:
                st = None
            if st is not None and st.st_ino == s.ino and st.st_dev == s.dev:
                if st.st_size == s.offset and st.st_mtime_ns == s.mtime_ns:
                    return  # nothing changed
                s.mtime_ns = st.st_mtime_ns
                # Equal size with a new mtime may be a truncate + rewrite of the same length.
                if (
                    st.st_size < s.offset
                    or (st.st_size == s.offset and not self._head_ok(s))
                    or not self._read(s, st.st_size)
                ):
                    self._truncated(s)
                return

            # `path` is gone or is another file: `s` is the old file. The new one is opened at
            # once, so a further rename cannot take it out of reach; `s` is drained, and left
            # only once a later file has data, since the writer may still append to its old fd
            # until then.
            if st is not None:
                self._hold_new(st)
            fst = os.fstat(s.fd)
            if fst.st_size < s.offset or not self._read(s, fst.st_size):
                self._truncated(s)
                return
            if not any(os.fstat(n.fd).st_size for n in self._later):
                return
            # The later file's first byte was written after the writer's last write to the old
            # one, and we saw it (fstat above) before that last read: the old file is complete.
            self._finish(s)
            self._cur = None
            os.close(s.fd)
            self.rotations_total += 1
            log.info("%s rotated: old file finished at offset %d", self.path, s.emitted)
            # Files rotated after it and before the next one held (missed between two polls).
            _, prior = self._catch_up(s.fingerprint(), s.emitted, s.prior, read_match=False)
            nxt = self._later.pop(0)
            nxt.prior = prior
            self._cur = self._ckpt = nxt
            self._read_or_truncate(nxt)

    def _hold_new(self, st: os.stat_result) -> None:
        """Open the file now at `path` (stat `st`) unless it is one already held."""
        held = {(n.dev, n.ino) for n in self._later}
        if (st.st_dev, st.st_ino) in held:
            return
        # An empty file removed before it got data holds nothing: let it go (a writer that makes
        # and removes empty files at `path` must not pile up descriptors).
        for n in list(self._later):
            fst = os.fstat(n.fd)
            if fst.st_size == 0 and fst.st_nlink == 0:
                self._later.remove(n)
                os.close(n.fd)
        try:
            fd, fst = _open_regular(self.path)
        except OSError:  # gone again (its rotated copy is found by listing), unreadable, a FIFO
            return
        if (fst.st_dev, fst.st_ino) in held or self._cur is not None and (
                fst.st_dev, fst.st_ino) == (self._cur.dev, self._cur.ino):
            os.close(fd)
            return
        self._later.append(_Stream(fd, fst))

    def _open(self, prior: Fingerprint | None | Literal[_Mark.LIST] = _LIST) -> None:
        """Open `path` (resuming a checkpoint first); `prior`: the newest rotated copy, listed
        now when not given."""
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
        self._set_current(s, prior)
        self._read_or_truncate(s)

    def _set_current(self, s: _Stream, prior: Fingerprint | None | Literal[_Mark.LIST] = _LIST) -> None:
        s.prior = newest_fingerprint(rotated_files(self.path), HEAD_BYTES) if prior is _LIST else prior
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
            if "prior" in cp:  # absent in checkpoints of older versions: not known
                prior = cp["prior"]
                out["prior"] = None if prior is None else list(Fingerprint.parse(prior))
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
        ours = Fingerprint(dev, ino, hlen, hsha)
        prior = cp.get("prior", _UNKNOWN)
        if isinstance(prior, list):
            prior = Fingerprint(*prior)
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
            if fd is not None and st is not None and (st.st_dev, st.st_ino) == (dev, ino):
                head = os.pread(fd, hlen, 0)
                if st.st_size >= off and _sha(head) == hsha:
                    s = _Stream(fd, st, off, head)
                    fd = None  # the stream owns the fd now
                    self._set_current(s)
                    self._read_or_truncate(s)
                    return
                # Same inode, other content: truncated (copytruncate) or inode reused meanwhile.
                self.truncations_total += 1
                prior = self._catch_up(ours, off, prior, known_end=cp["size"],
                                       counter="truncations_total", restart=True)[0]
            else:
                # Replaced or removed while we were stopped: our file is among the rotated
                # copies, its writer maybe still appending (then it is followed: _poll drains it
                # and switches once `path` has data).
                prior = self._catch_up(ours, off, prior, known_end=cp["size"], follow=True,
                                       restart=True)[0]
                if self._cur is not None:
                    if fd is not None:
                        os.close(fd)
                        fd = None
                    self._poll()
                    return
                if fd is not None:
                    self.rotations_total += 1
            if fd is not None and st is not None:  # (both or neither)
                s = _Stream(fd, st)
                fd = None
                self._set_current(s, prior)
                self._read_or_truncate(s)
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise

    def _catch_up(
        self, ours: Fingerprint, off: int, prior: Fingerprint | None | Literal[_Mark.UNKNOWN], *,
        read_match: bool = True, known_end: int = 0, unfinished: _Stream | None = None,
        follow: bool = False, counter: str = "rotations_total", restart: bool = False,
    ) -> tuple[Fingerprint | None, Fingerprint | None]:
        """Read, oldest first, what was rotated away after our file (`ours`, read up to byte
        `off`) and before the file now at `path` (or the first later file held open): the rest
        of our file from its rotated copy (when `read_match`), then each later copy whole, each
        counted in `counter`. Every copy to read is opened (by identity) before the first is
        read, so the writer's renames and removals meanwhile change nothing.

        Our file is found by inode or first bytes among the copies rotated after `prior` (all of
        them when `prior` is gone; none when `_UNKNOWN` and ours is not found). Lost, counted and
        warned about: our file's rest when no copy of it is found and `known_end` (its last size
        seen) says bytes were unread, or at all on a `restart` (a file removed while the reader
        was stopped may have had lines after `off`), a missing `.N` between ours and `path`, an
        unreadable copy.
        Not found, `unfinished` (our stream) emits its last unterminated line. With `follow`, the
        newest copy is followed as the current file when `path` has no data yet (its writer may
        still append). Returns (the newest copy's fingerprint, the fingerprint of the last file
        read, or `ours`, or `prior` when ours was not found and nothing was read): the next
        file's `prior` as listed, and as read.
        """
        files = self._listing(ours)
        try:
            path_has_data = os.stat(self.path).st_size > 0
        except OSError:
            path_has_data = False
        cands = files if prior is _UNKNOWN else since(files, prior)
        at = next((i for i in range(len(cands) - 1, -1, -1)
                   if cands[i].is_(ours) and (cands[i].compressed or cands[i].size >= off)), None)
        todo: list[tuple[RotatedFile, int | None]]  # (file, where to start reading; None: a later one, from 0)
        if at is None:
            if unfinished is not None:
                self._finish(unfinished)  # the unterminated tail is all that is left of it
                off = unfinished.emitted
            if read_match and known_end > off:
                self._lost(f"the rest of the file read up to offset {off}", known_end - off)
            elif restart:  # gone while stopped: what was written to it after the stop is not known
                self._lost(f"the file read up to offset {off} (inode {ours.ino}) before the stop, with "
                           "any lines written to it since,", None)
            todo = [] if prior is _UNKNOWN else [(f, None) for f in cands if not f.is_(ours)]
            prev = prior if isinstance(prior, Fingerprint) else None
        else:
            ours_at = cands[at]
            todo = [(ours_at, off)] if read_match else []
            newer = cands[at + 1:]
            todo += [(f, None) for f in newer]
            if ours_at.number:  # logrotate numbering: `.1` up to ours, none may be missing
                have = {f.number for f in newer}
                for n in range(ours_at.number - 1, 0, -1):
                    if n not in have:
                        self._lost(f"{self.path}.{n}", None)
            prev = ours
        # Files held open since they were at `path` are read from their own fd, after these.
        held = {(n.dev, n.ino) for n in self._later}
        stop = next((i for i, (f, _) in enumerate(todo) if (f.dev, f.ino) in held), len(todo))
        todo = todo[:stop]
        try:
            for f, _ in todo:
                try:
                    f.hold()
                except OSError:
                    pass  # counted as lost when read (`_read_rotated`)
            for i, (f, start) in enumerate(todo):
                if start is None:  # a later file: one more rotation (or truncation) passed
                    setattr(self, counter, getattr(self, counter) + 1)
                    start = 0
                if follow and i == len(todo) - 1 and not path_has_data and not f.compressed \
                        and not self._later:
                    self._follow_rotated(f, start, prev)
                    break
                self._read_rotated(f, start, prev)
                prev = f.fingerprint(HEAD_BYTES)
        finally:
            for f, _ in todo:
                f.release()
        return newest_fingerprint(files, HEAD_BYTES), prev

    def _listing(self, ours: Fingerprint) -> list[RotatedFile]:
        """`rotated_files(path)`, listed again while the `.N` numbering has a hole below our
        file's copy: a writer shifting `.N` to `.N+1` one rename at a time leaves one for a
        moment, which is not a lost file (a hole that stays is: `_catch_up`). Holes in older
        history cost nothing."""
        for _ in range(RELIST_TRIES):
            files = rotated_files(self.path)
            k = next((f.number for f in files if f.number and f.is_(ours)), None)
            if not k or len({f.number for f in files if f.number and f.number < k}) == k - 1:
                break
            time.sleep(RELIST_PAUSE)
        return files

    def _follow_rotated(self, f: RotatedFile, off: int, prior: Fingerprint | None) -> None:
        fd = f.take()
        try:
            st = os.fstat(fd)
            s = _Stream(fd, st, off, os.pread(fd, HEAD_BYTES, 0))
        except BaseException:
            os.close(fd)
            raise
        s.prior = prior
        self._cur = self._ckpt = s

    def _read_rotated(self, f: RotatedFile, off: int, prior: Fingerprint | None) -> None:
        """Emit the lines of the complete rotated copy `f` from byte `off` (decompressed)."""
        before = self.lines_total
        try:
            with f.open() as fh:
                r = _Stream(-1, os.fstat(fh.fileno()), off, f.head(HEAD_BYTES))
                r.prior = prior
                self._ckpt = r  # a crash now resumes from this copy
                if off:
                    fh.seek(off)
                while chunk := fh.read(self._chunk):
                    self._consume(r, chunk)
                self._finish(r)
        except (OSError, EOFError, zlib.error) as e:  # gone, unreadable, a corrupt or cut .gz
            self.read_errors_total += 1
            self._lost(f"{f.path} ({e})", None)
        n = self.lines_total - before
        self.recovered_lines_total += n
        log.info("%s: read %d lines from %s", self.path, n, f.path)

    def _lost(self, what: str, nbytes: int | None) -> None:
        self.rotated_files_lost_total += 1
        log.warning("%s: lines lost: %s could not be found or read (%s)", self.path, what,
                    "size unknown" if nbytes is None else f"at least {nbytes} bytes unread")

    def _truncated(self, s: _Stream, depth: int = 0) -> None:
        """`s` (same fd) now holds new content from offset 0: read the rest of the old content
        from its copy (copytruncate) and any later copies, then restart at 0."""
        self.truncations_total += 1
        log.info("%s truncated at offset %d", self.path, s.emitted)
        # Bytes of the old content past the last size seen of it were never known to exist:
        # a truncation after everything was read loses nothing.
        prior = self._catch_up(s.fingerprint(), s.emitted, s.prior,
                               known_end=max(s.size, s.offset), unfinished=s,
                               counter="truncations_total")[0]
        new = _Stream(s.fd, os.fstat(s.fd))
        self._set_current(new, prior)
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

    def _read(self, s: _Stream, size: int | None = None) -> bool:
        """Read `s` to its current end. False when its content was replaced (truncated).

        `size`: bytes, the file's size by a stat just before (default `s.size`). It becomes
        `s.size` (the last size seen of this content) only once a read after that stat finds the
        head unchanged: a stat after a truncate-and-rewrite gives the new content's size.
        The first read asks for what the stat says is new plus `_SLACK`, not a whole chunk: a
        live log's poll reads a few lines, and a 1 MiB buffer per poll (mmap'd, then shrunk)
        cost more than reading them."""
        if size is None:
            size = s.size
        want = min(self._chunk, max(size - s.offset, 0) + _SLACK)
        while True:
            chunk = os.pread(s.fd, want, s.offset)
            if not chunk:
                return True
            # Checked after the read: a truncation before it shows as a changed head, so
            # bytes of the new content are never taken as the old file's continuation.
            first = not s.head
            if not self._head_ok(s):
                return False
            if first and s.head:
                self._read_missed(s)
            if size > s.size:
                s.size = size
            self._consume(s, chunk)
            if len(chunk) < want or self.stopping is not None and self.stopping.is_set():
                return True
            want = self._chunk  # it grew past the stat: read on in whole chunks

    def _read_missed(self, s: _Stream) -> None:
        """`s` has just shown its first bytes: read the copies rotated after `s.prior` that are
        older than `s`, before any of its lines. They were rotated after the copies were listed
        and before `s` had data to tell it apart (a file opened just after another rotation, an
        empty file after a copytruncate that got a whole content copied and truncated away), and
        would otherwise be lost."""
        if s.prior is _UNKNOWN:
            return
        files = rotated_files(self.path)
        late = since(files, s.prior)
        if s.prior is not None and len(late) == len(files):
            return  # `prior` is gone: there is no telling
        ours = s.fingerprint()
        held = {(n.dev, n.ino) for n in self._later}
        # `s` itself rotated meanwhile, or a later file held open: read from its own fd
        stop = next((i for i, f in enumerate(late) if f.is_(ours) or (f.dev, f.ino) in held),
                    len(late))
        late = late[:stop]
        try:
            for f in late:
                try:
                    f.hold()
                except OSError:
                    pass
            for f in late:
                if f.head(HEAD_BYTES):
                    log.info("%s: a file rotated before its first bytes were seen", self.path)
                    self.rotations_total += 1
                    self._read_rotated(f, 0, s.prior)
                    s.prior = f.fingerprint(HEAD_BYTES)
        finally:
            for f in late:
                f.release()
        self._ckpt = s

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

        cut = data.rfind(b"\n") + 1
        if cut:
            self._emit(s, self._batch(data[:cut] if cut < len(data) else data, pos), pos + cut)
        tail = data[cut:]
        if tail[:1] == b"\0":
            # A NUL hole (see _batch) is passed at once: it never makes a line too long or
            # fills memory, and the checkpoint stays exact however the reads cut it.
            n = len(tail)
            tail = tail.lstrip(b"\0")
            s.emitted += n - len(tail)
        if len(tail) > self.max_line_bytes:
            s.buf = b""
            s.skipping = True
        else:
            s.buf = tail

    def _batch(self, block: bytes, start: int) -> LineBatch:
        """The lines of `block` (complete lines, each ending in `\n`, starting at offset `start`).

        Clean bytes (no NUL, no `\r`, no over-long line, valid UTF-8: a backlog's usual read) are
        one decode and no per-line Python work; anything else goes line by line.
        """
        maxb = self.max_line_bytes
        if (
            b"\0" not in block
            and b"\r" not in block
            and (
                len(block) <= maxb
                # Only a block's first line can be longer than one read (see _consume).
                or (self._chunk <= maxb and block.find(b"\n") <= maxb)
                or _lines_within(block, maxb)
            )
        ):
            if block.isascii():  # the usual read: text made only if asked for
                return LineBatch(self.path, start, start + len(block), block=block)
            try:
                text = block.decode("utf-8")
            except UnicodeDecodeError:
                pass
            else:
                return LineBatch(self.path, start, start + len(block), block=block, text=text)
        lines: list[str] = []
        oks: list[bool] = []
        bounds: list[int] = []
        pos = start
        for raw in block.split(b"\n")[:-1]:
            end = pos + len(raw) + 1
            if raw[:1] == b"\0":
                # NULs: the hole a non-append writer leaves after a copytruncate (its fd
                # offset stays past the new end); the line written after them is real.
                raw = raw.lstrip(b"\0")
            if len(raw) > maxb:
                self.long_lines_skipped_total += 1
            else:
                text, ok = _decode(raw)
                lines.append(text)
                oks.append(ok)
                bounds.append(end - len(raw) - 1)  # a line starts after its NUL hole
            pos = end
        bounds.append(pos)
        return LineBatch(self.path, start, pos, lines=lines, raw_ok=None if all(oks) else oks,
                         bounds=bounds)

    def _emit(self, s: _Stream, batch: LineBatch, end: int) -> None:
        """Pass `batch` on, moving the checkpoint `s.emitted` to `end` (per line for `on_line`)."""
        done = 0
        try:
            if self._on_lines is not None:
                n = len(batch)
                if n:
                    done = n
                    try:
                        self._on_lines(batch)
                    except Exception:
                        self._callback_failed(batch.path, batch.start)
            else:
                # Hot loop (a backlog is millions of lines): after each line, the checkpoint
                # moves to the next line's start (past any over-long line skipped between).
                on_line = self._on_line
                assert on_line is not None  # one of on_line and on_lines (__init__)
                stops = iter(batch._bounds_list())
                next(stops)
                for line, stop in zip(batch, stops):
                    try:
                        on_line(line)
                    except Exception:
                        self._callback_failed(line.path, line.offset)
                    s.emitted = stop
                    done += 1
            s.emitted = end
        finally:
            if done:
                self.lines_total += done
                self.last_line_timestamp = time.time()

    def _callback_failed(self, path: str, pos: int) -> None:
        # The line counts as passed on: re-sending it would double count downstream.
        self.callback_errors_total += 1
        if self.callback_errors_total <= 10 or self.callback_errors_total % 1000 == 0:
            log.exception("consumer failed on %s at offset %d", path, pos)

    def _finish(self, s: _Stream) -> None:
        """The file will get no more bytes: an unterminated last line is emitted as a line."""
        if s.skipping:
            if s.count_skip:
                self.long_lines_skipped_total += 1
            s.skipping = False
            s.emitted = s.offset
        elif s.buf:
            text, ok = _decode(s.buf)  # kept only when not over-long, its NUL hole removed
            s.buf = b""
            self._emit(s, LineBatch(self.path, s.emitted, s.offset, lines=[text],
                                    raw_ok=None if ok else [ok], bounds=[s.emitted, s.offset]),
                       s.offset)
