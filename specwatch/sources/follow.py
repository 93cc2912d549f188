"""The set of followed files: one thread polls every `Follower`, woken by inotify or `watchdog`.

`FollowerGroup` owns the thread that makes every `on_line`/`on_lines` call, what wakes it (inotify
on that thread itself, `specwatch.sources.inotify_wait`, or the watchdog observer; one
non-recursive watch per parent directory, with a polling fallback) and changes to the followed
set while running (a config reload). One file's reading is in
`specwatch.sources.filestream` (the split of mtail's `internal/tailer/tail.go` and
`internal/tailer/logstream/filestream.go`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specwatch.sources.stream import LineStream

log = logging.getLogger(__name__)


class FollowerGroup:
    """Run several Followers on one background thread.

    Every `on_line` call of every follower happens on that single thread, so consumers need no
    locks. The thread wakes on `watchdog` events for the followed paths (one non-recursive watch
    per parent directory of a followed file; a journal follower has none) and also every
    `poll_interval` seconds, so lost or missing events
    (inotify overflow, NFS, a directory that does not exist yet) only delay lines. Idle, it blocks
    on an Event (no busy loop).

    With `inotify=True` (and `use_watchdog=False`) the thread itself waits on inotify
    (`DirWatcher`): a change to a followed file after a quiet spell is read at once, a file that
    keeps changing at most once per `poll_interval` (a busy log: one wake-up per interval, not
    one per line; with `cadence`, below, as often as it says), and without any change the files
    are polled every `poll_interval` (rotation missed, NFS, no inotify). Wake-ups, not reads, set
    an idle daemon's cost (docs/idle-cost.md).

    With `cadence` as well, a round that read lines is followed by the next one `cadence()`
    seconds later instead of `poll_interval` (`sources/cadence.py`: soon after a line that may
    start a collapse, else as the log's pace needs). A busy file renamed away (a rotation)
    is glanced at once (`Follower.glance`: its new file opened, nothing read), so a rotation storm
    cannot replace a file before it was opened, whatever the read cadence.

    Counters: `watch_errors_total` (watchdog could not start or watch a directory; those paths
    are polled only), `poll_errors_total` (unexpected exceptions from a follower, logged).
    `watching` is True while watchdog watches at least one directory.
    """

    _WATCH_RETRY_S = 30.0
    _MIN_GAP = 0.05  # seconds between rounds woken by `due`

    def __init__(
        self,
        followers: Iterable[LineStream] = (),
        *,
        poll_interval: float = 1.0,
        use_watchdog: bool = True,
        name: str = "specwatch-follow",
        after_poll: Callable[[], None] | None = None,
        inotify: bool = False,
        due: Callable[[], float | None] | None = None,
        cadence: Callable[[], float] | None = None,
    ) -> None:
        """`poll_interval`: seconds between polls when no event arrives (> 0).
        `after_poll`: called on the group's thread after each poll round, when no `on_line` call
        is in flight, so it can persist `checkpoints()` together with the consumer's state.
        `due`: with inotify, when (`time.monotonic()`) the after-poll hook next has work due (a
        notification's group_wait ending), None for nothing: a round comes then at the latest.
        `cadence`: with inotify, seconds from a round that read lines to the next (see the class
        docstring); None: `poll_interval`.

        Raises ValueError for a bad poll_interval or two followers of the same path.
        """
        if not poll_interval > 0:
            raise ValueError("poll_interval must be > 0 seconds")
        self.poll_interval = float(poll_interval)
        self._use_watchdog = use_watchdog
        self._use_inotify = inotify and not use_watchdog
        self._inotify: Any = None  # a DirWatcher while running with inotify
        self._name = name
        self._after_poll = after_poll
        self._due = due
        self._cadence = cadence
        self._followers: dict[str, LineStream] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._observer: Any = None
        self._interest: frozenset[str] = frozenset()
        self._watched: set[str] = set()
        self._last_watch_try = 0.0
        self.watch_errors_total = 0
        self.poll_errors_total = 0
        self.catching_up = False  # a follower had not read its first backlog at the last round
        self.polled = False  # the thread's first poll (every file's backlog, a journal's first turn) ended
        self._pending: list[tuple[list[LineStream], list[str]]] = []  # update() calls not yet applied
        self._pending_lock = threading.Lock()
        for f in followers:
            self.add(f)

    @property
    def followers(self) -> dict[str, LineStream]:
        """Followers by path (a copy)."""
        return dict(self._followers)

    @property
    def watching(self) -> bool:
        return bool(self._watched) or bool(self._inotify and self._inotify.watched)

    @property
    def thread(self) -> threading.Thread | None:
        """The thread that runs every poll and every on_line call (None before `start()`)."""
        return self._thread

    def add(self, follower: LineStream) -> None:
        """Add a follower before `start()`. Raises RuntimeError once started, ValueError for a
        path already followed."""
        if self._thread is not None:
            raise RuntimeError("cannot add followers to a started FollowerGroup")
        if follower.path in self._followers:
            raise ValueError(f"{follower.path!r} is already followed")
        self._followers[follower.path] = follower

    def update(self, add: Iterable[LineStream] = (), remove: Iterable[str] = ()) -> None:
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
            self.wake()

    def start(self) -> None:
        """Start watchdog (if enabled) and the thread; the first poll happens at once.
        Raises RuntimeError if already started."""
        if self._thread is not None:
            raise RuntimeError("FollowerGroup already started")
        self._interest = _files(self._followers)
        if self._use_watchdog:
            self._start_watchdog()
        elif self._use_inotify:
            self._start_inotify()
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop the thread and watchdog, waiting up to `timeout` seconds each; the followers'
        files are closed (their checkpoints stay valid). Returns True when the thread ended."""
        self._stop.set()
        self.wake()
        if self._observer is not None:
            try:
                _stop_observer(self._observer, timeout)
            except Exception:  # watchdog internals: stopping must not fail the daemon's shutdown
                log.exception("stopping watchdog failed")
            self._observer = None
            self._watched.clear()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def updating(self) -> bool:
        """An `update()` is queued and not yet applied (its followers have not been polled)."""
        return bool(self._pending)

    def wake(self) -> None:
        """Ask the thread for a poll round now (from any thread)."""
        self._wake.set()
        watcher = self._inotify
        if watcher is not None:
            watcher.wake()

    def poll_all(self) -> int:
        """Poll every follower once; returns the lines emitted. While the group runs, only its own
        thread may call this (RuntimeError otherwise: use `wake()`), keeping on_line single-threaded."""
        t = self._thread
        if t is not None and t.is_alive() and threading.current_thread() is not t:
            raise RuntimeError("FollowerGroup is running: use wake() from other threads")
        total = 0
        more = catching_up = False
        for f in self._followers.values():
            f.stopping = self._stop
            try:
                total += f.poll()
            except Exception:
                self.poll_errors_total += 1
                log.exception("polling %s failed", f.path)
            # a journal reads in turns (sources/journal.py); a file reads all it has
            more = more or getattr(f, "more", False)
            catching_up = catching_up or getattr(f, "catching_up", False)
        self.catching_up = catching_up
        if more:  # a turn ended with output left: another round at once
            self.wake()
        return total

    def checkpoints(self) -> dict[str, dict[str, Any]]:
        """`Follower.checkpoint()` of every follower, by path. Safe from any thread."""
        return {p: f.checkpoint() for p, f in self._followers.items()}

    # ------------------------------------------------------------------------------- internals

    def _run(self) -> None:
        watcher = self._inotify
        try:
            if watcher is not None:
                self._run_inotify(watcher)
                return
            self.poll_all()
            self.polled = not self._stop.is_set()  # a stop may have cut the first reads short
            while not self._stop.is_set():
                woke = self._wake.wait(self.poll_interval)
                if self._stop.is_set():
                    break
                self._wake.clear()  # before polling: an event during the poll means another round
                self._round(woke)
        finally:
            for f in self._followers.values():
                f.close()
            if watcher is not None:
                self._inotify = None
                watcher.close()

    def _run_inotify(self, watcher: Any) -> None:
        """The loop with inotify: a round when a followed file changes (not before the cadence's
        wait after a round that read lines), or after `poll_interval` without a change."""
        read = self.poll_all() > 0
        self.polled = not self._stop.is_set()  # a stop may have cut the first reads short
        last = time.monotonic()
        wait = self._wait(read)
        while not self._stop.is_set():
            until = last + wait
            try:
                due = self._due() if self._due is not None else None
                if due is not None:
                    until = min(until, max(due, last + self._MIN_GAP))
                # after reading, the next changes wait for the interval (events queue in the kernel)
                woke = watcher.wait(until - time.monotonic(), files=not read)
                if self._stop.is_set():
                    break
                if read and watcher.renamed:  # busy, and a followed file was rotated: its new
                    self._glance()  # file is opened now, its lines wait for the next round
                    continue
                self._wake.clear()
                watcher.drain()  # what this round reads; a later change wakes the next wait
            except Exception:  # the thread must go on reading: this round as a plain poll
                self.poll_errors_total += 1
                log.exception("waiting on inotify failed; polling")
                woke = False
                if self._stop.wait(max(0.0, until - time.monotonic())):
                    break
            last = time.monotonic()
            read = self._round(woke) > 0
            wait = self._wait(read)

    def _wait(self, read: bool) -> float:
        """Seconds from the round that just ended to the next without a change: `cadence()`
        after one that read lines (not while catching up or updating), else `poll_interval`."""
        if read and self._cadence is not None and not (self.catching_up or self._pending):
            return self._cadence()
        return self.poll_interval

    def _glance(self) -> None:
        """Let every file follower open the file now at its path (`Follower.glance`)."""
        for f in self._followers.values():
            glance = getattr(f, "glance", None)  # a journal has none
            if glance is not None:
                glance()

    def _round(self, woke: bool) -> int:
        """Apply queued updates, poll every follower, call the after-poll hook; the lines read."""
        self._apply_pending()
        n = self.poll_all()
        if self._after_poll is not None:
            try:
                self._after_poll()
            except Exception:
                log.exception("after_poll hook failed")
        if not woke:
            self._retry_watches()
        return n

    def _start_inotify(self) -> None:
        from specwatch.sources.inotify_wait import DirWatcher

        try:
            self._inotify = DirWatcher()
        except OSError as e:  # EMFILE: inotify instances exhausted
            self.watch_errors_total += 1
            log.warning("inotify unavailable, polling every %.1fs only: %s", self.poll_interval, e)
            return
        self._inotify.interest = self._interest
        self._last_watch_try = time.monotonic()
        for d in sorted(self._dirs()):
            self._watch(d)

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
            self._interest = _files(followers)
            if self._inotify is not None:
                self._inotify.interest = self._interest
            if self._observer is not None or self._inotify is not None:  # new paths' directories at once
                for d in sorted(self._dirs() - self._watched_dirs()):
                    if os.path.isdir(d):
                        self._watch(d)

    def _dirs(self) -> set[str]:
        return {os.path.dirname(p) for p in self._interest}

    def _watched_dirs(self) -> set[str]:
        return self._inotify.watched if self._inotify is not None else self._watched

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
        if self._inotify is not None:
            try:
                self._inotify.watch(d)
            except OSError as e:  # missing directory, inotify watch limit (ENOSPC), ...
                self.watch_errors_total += 1
                log.warning("cannot watch %s, polling it every %.1fs: %s", d, self.poll_interval, e)
            return
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
        if (self._observer is None and self._inotify is None
                or time.monotonic() - self._last_watch_try < self._WATCH_RETRY_S):
            return
        self._last_watch_try = time.monotonic()
        for d in sorted(self._dirs() - self._watched_dirs()):
            if os.path.isdir(d):
                self._watch(d)


def _files(followers: dict[str, Any]) -> frozenset[str]:
    """Absolute paths of the followers that follow a file (watched). A journal source's `path`
    names no file (`journal:UNIT@DIR`, sources/journal.py): it is polled each round, unwatched."""
    return frozenset(os.path.abspath(p) for p, f in followers.items() if f.watches_file)


def _stop_observer(observer: Any, timeout: float) -> None:
    """Stop a watchdog observer and join its threads within `timeout` seconds in all.

    watchdog 7.1's `Observer.stop()` drops each InotifyEmitter's watch group while the emitter's
    thread may still be handling an event, which then logs ERROR "InotifyEmitter.queue_events()
    called when the thread is inactive" (watchdog/observers/inotify.py). So each emitter's loop is
    ended first: its stop flag set, the queue it blocks on closed (`deactivate()`, keeping the
    group), its thread joined; the observer then has nothing running left to race with.
    """
    deadline = time.monotonic() + timeout
    emitters = list(observer.emitters)
    for emitter in emitters:
        emitter.stopped_event.set()  # the loop ends after the event in hand
    for emitter in emitters:
        group = getattr(emitter, "_inotify", None)  # None on other platforms' emitters
        if group is not None:
            group.deactivate()  # wakes a read blocked on an empty queue
    for emitter in emitters:
        emitter.join(max(0.0, deadline - time.monotonic()))
    observer.stop()
    observer.join(max(0.0, deadline - time.monotonic()))
