"""Wait for followed files to change, on the caller's own thread: inotify(7) through watchdog's
bindings (`watchdog.observers.inotify_c`, watchdog 7.1), without watchdog's observer threads.

watchdog's Observer wakes three threads (emitter, InotifyFD reader, dispatcher) for every line a
server writes; here the followers' thread itself sleeps in `poll(2)` on the inotify descriptor and
a self-pipe (`wake()` from other threads), so a change costs one wake-up and a quiet file none.
"""

from __future__ import annotations

import errno
import os
import select
import threading

from watchdog.observers.inotify_c import InotifyConstants as C
from watchdog.observers.inotify_c import InotifyFD, inotify_add_watch, inotify_init

# What can change a followed file's content or which file a path names. Not IN_OPEN/IN_ACCESS/
# IN_CLOSE_NOWRITE: our own reads must not wake us.
MASK = (C.IN_MODIFY | C.IN_CLOSE_WRITE | C.IN_CREATE | C.IN_DELETE | C.IN_MOVED_FROM | C.IN_MOVED_TO
        | C.IN_ATTRIB | C.IN_DELETE_SELF | C.IN_MOVE_SELF)
# What a rotation does to a directory's names: a second instance watches only these, so a busy
# log's writes (IN_MODIFY) never wake it while a rename of the followed file does at once.
ENTRIES = C.IN_CREATE | C.IN_MOVED_FROM | C.IN_MOVED_TO | C.IN_DELETE
# Events that concern the watched directory itself (gone or moved) or lost events: always relevant.
ALWAYS = C.IN_Q_OVERFLOW | C.IN_IGNORED | C.IN_DELETE_SELF | C.IN_MOVE_SELF
_BUF = 64 * 1024
_EVENT_MAX = 16 + 255 + 1  # struct inotify_event with the longest name (NAME_MAX) and its NUL


class DirWatcher:
    """inotify watching directories (non-recursively) for changes to named files: one instance
    for every change, one for names only (created, renamed, removed).

    `wait(timeout, files=True)` blocks until an event names a file of `interest` (absolute paths),
    `wake()` is called, or `timeout` seconds pass; with `files=False` only `wake()`, a file of
    `interest` created, renamed or removed (a rotation: its reader must open the new file before
    the next rename takes it out of reach: `renamed` is then True), or the timeout end it (other
    events stay queued in the kernel for the next wait). Returns True when woken by an event or
    `wake()`, False on timeout. Raises OSError from `__init__` (EMFILE: no inotify instance
    left) and from `watch` (ENOENT, ENOSPC: the watch limit); the caller polls instead.
    """

    def __init__(self) -> None:
        fd = _init()
        self._fd = fd
        try:
            self._entries = _init()
        except OSError:
            os.close(fd)
            raise
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._files = select.poll()
        self._files.register(fd, select.POLLIN)
        self._files.register(self._entries, select.POLLIN)
        self._files.register(self._r, select.POLLIN)
        self._pipe = select.poll()
        self._pipe.register(self._entries, select.POLLIN)
        self._pipe.register(self._r, select.POLLIN)
        self._lock = threading.Lock()  # wake() (any thread) against close(): no write to a reused fd
        self._closed = False
        self._dirs: dict[int, str] = {}  # watch descriptor -> directory
        self._entry_dirs: dict[int, str] = {}  # the same, of the entries instance
        # Each create/rename/remove of a followed file reaches both instances, one a little
        # after the other: the later copy wakes no second round.
        self._owed = 0  # seen by the full instance, not yet by the entries instance
        self._ahead = 0  # the converse
        self._interest: frozenset[str] = frozenset()
        # a read's bytes -> whether they name a file of interest: a busy log queues the same one
        # IN_MODIFY event (the kernel merges repeats) between two rounds, parsed once
        self._known: dict[bytes, bool] = {}
        self.events_total = 0  # relevant events read (for tests and metrics)
        # the last `wait` was ended only by a followed file's create, rename or removal
        self.renamed = False

    @property
    def watched(self) -> set[str]:
        return set(self._dirs.values())

    @property
    def interest(self) -> frozenset[str]:
        return self._interest

    @interest.setter
    def interest(self, paths: frozenset[str]) -> None:
        self._interest = paths
        self._known.clear()

    def watch(self, directory: str) -> None:
        wd = inotify_add_watch(self._fd, os.fsencode(directory), MASK)
        if wd == -1:
            InotifyFD._raise_error()
        ewd = inotify_add_watch(self._entries, os.fsencode(directory), ENTRIES)
        if ewd == -1:
            InotifyFD._raise_error()
        self._dirs[wd] = directory
        self._entry_dirs[ewd] = directory
        self._known.clear()

    def wake(self) -> None:
        """End a `wait` now (any thread; nothing once closed)."""
        with self._lock:
            if self._closed:
                return
            try:
                os.write(self._w, b"!")
            except BlockingIOError:  # the pipe is full: a wake is pending anyway
                pass

    def wait(self, timeout: float, files: bool = True) -> bool:
        try:
            ready = (self._files if files else self._pipe).poll(max(0, int(timeout * 1000 + 0.999)))
        except InterruptedError:
            return True
        woke = entries = False
        for fd, _ in ready:
            if fd == self._r:
                self._drain_pipe()
                woke = True
            elif fd == self._fd and self.drain():
                woke = True
            elif fd == self._entries and self._drain_entries():
                entries = True
        self.renamed = entries and not woke
        return woke or entries

    def _drain_entries(self) -> bool:
        """Read the entries instance's events (only read when `poll` says some are queued: an
        idle round costs no read); True when one names a file of `interest`."""
        relevant = False
        while True:
            try:
                buf = os.read(self._entries, _BUF)
            except BlockingIOError:
                return relevant
            except InterruptedError:
                continue
            if not buf:
                return relevant
            for wd, mask, _cookie, name in InotifyFD._parse_event_buffer(buf):
                if mask & C.IN_Q_OVERFLOW:
                    self._owed = self._ahead = 0
                    relevant = True
                elif mask & C.IN_IGNORED:
                    self._entry_dirs.pop(wd, None)
                elif name and os.path.join(self._entry_dirs.get(wd, ""), os.fsdecode(name)) in self._interest:
                    if self._owed:  # the other instance had it first: a round was woken for it
                        self._owed -= 1
                    else:
                        self._ahead += 1
                        relevant = True
            if len(buf) <= _BUF - _EVENT_MAX:
                return relevant

    def drain(self) -> bool:
        """Read every queued event; True when one concerns a file of `interest` (or events were lost)."""
        relevant = False
        while True:
            try:
                buf = os.read(self._fd, _BUF)
            except BlockingIOError:
                return relevant
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                raise
            if not buf:
                return relevant
            known = self._known.get(buf)
            if known is None:
                known = self._parse(buf)
            if known:
                relevant = True
                self.events_total += 1
            if len(buf) <= _BUF - _EVENT_MAX:  # the next event would have fitted: none was queued
                return relevant

    def _parse(self, buf: bytes) -> bool:
        """Whether the events in `buf` concern a file of `interest` (remembered unless one concerns
        a watched directory itself or lost events)."""
        relevant = always = False
        for wd, mask, _cookie, name in InotifyFD._parse_event_buffer(buf):
            if mask & ALWAYS:
                if mask & C.IN_IGNORED:  # the directory is gone: watched again when it is back
                    self._dirs.pop(wd, None)
                if mask & C.IN_Q_OVERFLOW:
                    self._owed = self._ahead = 0
                relevant = always = True
            elif mask & ENTRIES and name and os.path.join(
                    self._dirs.get(wd, ""), os.fsdecode(name)) in self._interest:
                always = True  # counted: not remembered
                if self._ahead:  # the entries instance had it first: a round was woken for it
                    self._ahead -= 1
                else:
                    self._owed += 1
                    relevant = True
            elif name and os.path.join(self._dirs.get(wd, ""), os.fsdecode(name)) in self._interest:
                relevant = True
        if not always and len(buf) <= 1024:  # a busy log's usual read: a few events (64 KiB at most kept)
            if len(self._known) >= 64:
                self._known.clear()
            self._known[buf] = relevant
        return relevant

    def _drain_pipe(self) -> None:
        try:
            while os.read(self._r, 512):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for fd in (self._fd, self._entries, self._r, self._w):
                os.close(fd)


def _init() -> int:
    """A non-blocking inotify instance. Raises OSError (EMFILE)."""
    fd = inotify_init()
    if fd == -1:
        InotifyFD._raise_error()  # watchdog's errno → OSError mapping
    os.set_blocking(fd, False)
    return fd
