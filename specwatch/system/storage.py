"""The daemon's durable state, and small durable JSON files (silences, standalone queues).

`StateStore` is one SQLite database, `<state_dir>/state.db` (the standard library's sqlite3, WAL
journal): a `state` row (each followed file's offset and the pipeline's rule state, alerts and
counters, one JSON document), an `outbox` table (the notifications waiting for each notifier)
and a `sequence` table (each notifier's next sequence number, so the numbers go on after a restart).
Both change in one transaction, so after a crash (kill -9 included) the next start resumes from
a state in which every line before the saved offsets was counted once, every alert transition
those lines caused is either in the rule state and queued for delivery or not at all, and lines
after the offsets are read again. The daemon commits after each poll round that read lines or
queued a notification, on the followers' thread (where offsets and pipeline agree), and nothing
when nothing changed. A notifier sends an item only once it is committed and deletes its row as
soon as the receiver accepted it, so only a POST in flight at a crash can be sent twice.

A write that fails (disk full, I/O error) rolls back: the daemon keeps running from memory,
delivers queued notifications from memory, counts the failure (`write_errors_total`, `ok`),
logs it at ERROR at most once a minute, and the next commit writes everything still pending.
A reserve of space (`state.reserve`, held while the disk has room) is spent on the last commit
of a stop on a full disk, so a SIGTERM saves what this run read and sent, and the restart
neither reads those lines again nor re-sends their notifications. What is on disk is
always an earlier consistent state, so a restart never reads a log from an older offset than
the last commit and never from line 1.

`write_json_atomic` replaces a whole file atomically, so a reader sees the old or the new
content, never a mix.

What the state holds (alert texts, command lines, receiver names) is the daemon's alone: the
folder is created 0700 (`private_dir`) and every file specwatch writes in it is 0600, files of
an earlier version included; a folder that exists already with group or other bits is left as
it is (its owner may have chosen that) and warned about.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import sqlite3
import stat
import tempfile
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def private_dir(path: str | os.PathLike[str]) -> None:
    """Create `path` (and missing parents) with mode 0700; warn once when an existing folder lets
    its group or others in. Raises OSError when it cannot be created."""
    path = os.fspath(path)
    try:
        os.makedirs(path, PRIVATE_DIR)
    except FileExistsError:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & 0o077:
            log.warning("state_dir %s is mode %04o: other users can list it (its files are 0600); "
                        "`chmod 700 %s` keeps even their names private", path, mode, path)


def state_dir_problem(path: str | os.PathLike[str]) -> str | None:
    """Why `path` cannot be the daemon's state_dir (None: it can): it must be a directory this
    process can write in, or be creatable as one (`private_dir`) under its nearest existing
    parent. Tried for real (a temporary file or folder, removed at once): permission bits say
    nothing for root, nor for /proc, a read-only mount or a full disk."""
    path = os.path.abspath(os.fspath(path))
    top = path
    while not os.path.lexists(top):
        top = os.path.dirname(top)
    if not os.path.isdir(top):
        return (f"{top} is not a directory" + (f" (a parent of {path})" if top != path else "")
                + "; give a folder the daemon may write in, e.g. /var/lib/specwatch")
    try:
        if top == path:
            tempfile.TemporaryFile(dir=path).close()
        else:
            os.rmdir(tempfile.mkdtemp(dir=top))
    except OSError as e:
        what = "cannot write in it" if top == path else f"cannot be created in {top}"
        return f"{path} {what} ({e.strerror or e}); give a folder the daemon may write in, or fix its permissions"
    return None


def private_file(path: str | os.PathLike[str], fd: int | None = None) -> None:
    """Make an existing file (or the open `fd` of it) 0600: one of an earlier version, or
    SQLite's `-wal`/`-shm`. Nothing when it is missing; a warning when it is another user's."""
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode if fd is not None else os.stat(path).st_mode)
        if mode != PRIVATE_FILE:
            os.fchmod(fd, PRIVATE_FILE) if fd is not None else os.chmod(path, PRIVATE_FILE)
    except FileNotFoundError:
        pass
    except PermissionError:
        log.warning("%s is mode %04o and not specwatch's to change: other users may read it; "
                    "`chown` it to specwatch's user or `chmod 600` it", os.fspath(path), mode)


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
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE)
    private_file(path, fd)  # a lock file of an earlier version was 0644
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


STATE_DB = "state.db"
WARN_EVERY = 60.0  # seconds between warnings about failing state writes


# A notifier's next sequence number, never lowered (SQLite's upsert, 3.24+).
_RAISE_SEQ = ("INSERT INTO sequence (notifier, next_seq) VALUES (?, ?) "
              "ON CONFLICT (notifier) DO UPDATE SET next_seq = max(next_seq, excluded.next_seq)")


class StateStore:
    """`<state_dir>/state.db`: the state document and the notifiers' outbox, changed together.

    Thread-safe: one connection behind `lock` (held by callers that must order their commit
    with a notifier's delivery, see `QueuedNotifier`). `write_errors_total` counts failed
    commits; `ok` is False while the last write failed. Raises sqlite3.Error / OSError from
    the constructor when the database cannot be opened or created.
    """

    def __init__(self, state_dir: str | os.PathLike[str]):
        self.path = os.path.join(os.fspath(state_dir), STATE_DB)
        self.lock = threading.RLock()
        self.write_errors_total = 0
        self.ok = True
        self._warned = -WARN_EVERY
        # created 0600 before SQLite opens it: SQLite gives its -wal and -shm the database's mode
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE))
        private_file(self.path)
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT).
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA secure_delete=ON")  # a deleted row (a renamed receiver's) leaves no bytes
        self._db.execute("PRAGMA journal_mode=WAL")
        for suffix in ("-wal", "-shm"):
            private_file(self.path + suffix)
        self._db.execute("PRAGMA synchronous=NORMAL")  # survives a process crash; fsync at checkpoints
        self._db.execute("PRAGMA wal_autocheckpoint=64")  # pages: a small WAL, for small disks
        self._db.execute("PRAGMA journal_size_limit=262144")
        self._db.execute("CREATE TABLE IF NOT EXISTS state (id INTEGER PRIMARY KEY CHECK (id = 1), doc TEXT NOT NULL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS outbox (notifier TEXT NOT NULL, seq INTEGER NOT NULL, "
                         "key TEXT, data TEXT NOT NULL, PRIMARY KEY (notifier, seq))")
        # each notifier's next sequence number: its delivered rows are deleted, so the outbox
        # alone would hand a restarted daemon's first notification the number 1 again
        self._db.execute("CREATE TABLE IF NOT EXISTS sequence (notifier TEXT PRIMARY KEY, next_seq INTEGER NOT NULL)")

    def load(self) -> dict | None:
        """The last committed state document, None when none was committed yet."""
        with self.lock:
            row = self._db.execute("SELECT doc FROM state WHERE id = 1").fetchone()
        return json.loads(row[0]) if row else None

    def outbox(self, notifier: str) -> list[tuple[int, str | None, dict]]:
        """`notifier`'s committed items, oldest first: [(seq, coalesce key, data)]."""
        with self.lock:
            rows = self._db.execute("SELECT seq, key, data FROM outbox WHERE notifier = ? ORDER BY seq",
                                    (notifier,)).fetchall()
        return [(seq, key, json.loads(data)) for seq, key, data in rows]

    def next_seq(self, notifier: str) -> int:
        """The number after the highest `notifier` ever committed (1 when none): a notifier's
        sequence numbers keep counting across restarts, as its log lines and
        `specwatch notifications list` show them."""
        with self.lock:
            row = self._db.execute("SELECT next_seq FROM sequence WHERE notifier = ?", (notifier,)).fetchone()
        return int(row[0]) if row else 1

    def commit(self, doc: str | None, put: list[tuple[str, int, str | None, str]],
               delete: list[tuple[str, int]], *, final: bool = False) -> bool:
        """One transaction: the state document (`doc`, JSON text; None: unchanged), outbox rows
        to write ([(notifier, seq, key, data JSON)], replacing a row of the same seq) and rows
        to delete ([(notifier, seq)]). Returns False when it failed (rolled back, counted,
        logged at ERROR at most once a minute).

        final: the last commit before a stop. On a full disk it spends the reserve (see
        `hold_reserve`) and tries once more: what this run delivered is then on disk, and the
        next start neither reads those lines again nor re-sends their notifications."""
        with self.lock:
            try:
                self._write(doc, put, delete)
            except (sqlite3.Error, OSError) as e:
                if not (final and _disk_full(e) and self._spend_reserve()):
                    self._failed(e)
                    return False
                try:
                    self._write(doc, put, delete)
                except (sqlite3.Error, OSError) as again:
                    self._failed(again)
                    return False
            self.hold_reserve()
            if not self.ok:
                log.warning("state written to %s again after %d failed write(s)", self.path, self.write_errors_total)
            self.ok = True
            return True

    def rename_notifier(self, old: str, new: str) -> int:
        """Move the outbox rows of notifier `old` to `new` (a receiver whose name changed, e.g.
        one that named a password); a seq `new` already has keeps `new`'s row. Returns the rows
        moved. Raises sqlite3.Error."""
        with self.lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                moved = db.execute("UPDATE OR IGNORE outbox SET notifier = ? WHERE notifier = ?", (new, old)).rowcount
                db.execute("DELETE FROM outbox WHERE notifier = ?", (old,))
                row = db.execute("SELECT next_seq FROM sequence WHERE notifier = ?", (old,)).fetchone()
                if row is not None:
                    db.execute(_RAISE_SEQ, (new, row[0]))
                    db.execute("DELETE FROM sequence WHERE notifier = ?", (old,))
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            return moved

    def _failed(self, e: Exception) -> None:
        self.write_errors_total += 1
        self.ok = False
        now = time.monotonic()
        if now - self._warned >= WARN_EVERY:
            self._warned = now
            log.error("cannot write the state to %s: %s (%d failure(s) so far); running from memory, "
                        "notifications are still delivered, and everything is written once it works again "
                        "(free space in state_dir?)", self.path, e, self.write_errors_total)

    def close(self) -> None:
        with self.lock:
            self._db.close()

    def _write(self, doc: str | None, put: list, delete: list) -> None:
        """The transaction of `commit`; rolled back and raised (sqlite3.Error, OSError) on failure."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            if doc is not None:
                db.execute("INSERT OR REPLACE INTO state (id, doc) VALUES (1, ?)", (doc,))
            if put:
                db.executemany("INSERT OR REPLACE INTO outbox (notifier, seq, key, data) VALUES (?, ?, ?, ?)", put)
                top: dict[str, int] = {}
                for notifier, seq, _, _ in put:
                    top[notifier] = max(top.get(notifier, 0), seq + 1)
                db.executemany(_RAISE_SEQ, top.items())
            if delete:
                db.executemany("DELETE FROM outbox WHERE notifier = ? AND seq = ?", delete)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    # The reserve: `<state_dir>/state.reserve`, space taken while the disk has some and given
    # back for the last commit of a stop when the disk is full (the same trick as a database's
    # "ballast" file). Set on the instance by `hold_reserve`.
    reserve_bytes = 0  # the size held now; 0: none
    _reserve_tried = -math.inf  # time.monotonic() of the last try to make one
    _reserve_warned = False  # the lack of one was said (once, until one is held again)

    @property
    def reserve_path(self) -> str:
        return os.path.join(os.path.dirname(self.path), RESERVE_NAME)

    def hold_reserve(self) -> int:
        """Make the reserve when there is none (at most one try every WARN_EVERY seconds): a
        quarter of the free space, at most RESERVE_MAX bytes, allocated on disk. Returns its
        size (0: none; not enough free space is said once at WARNING, then tried quietly)."""
        if self.reserve_bytes or time.monotonic() - self._reserve_tried < WARN_EVERY:
            return self.reserve_bytes
        self._reserve_tried = time.monotonic()
        path = self.reserve_path
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                size = os.fstat(fd).st_size  # kept from a run that did not spend it (kill -9)
                if size < RESERVE_MIN:
                    st = os.statvfs(os.path.dirname(path))
                    size = min(RESERVE_MAX, st.f_bavail * st.f_frsize // 4) // 4096 * 4096
                    if size < RESERVE_MIN:
                        raise OSError(errno.ENOSPC, f"{st.f_bavail * st.f_frsize} bytes free")
                    os.posix_fallocate(fd, 0, size)  # blocks on disk, not a sparse file
            finally:
                os.close(fd)
        except OSError as e:
            try:
                os.unlink(path)
            except OSError:
                pass
            if not self._reserve_warned:
                self._reserve_warned = True
                log.warning("cannot keep a reserve of space in %s (%s): if the disk fills up, what was read "
                            "and sent since the last saved state is read and sent again after a restart",
                            os.path.dirname(path), e.strerror or e)
            return 0
        self.reserve_bytes, self._reserve_warned = size, False
        return size

    def _spend_reserve(self) -> bool:
        """Delete the reserve so the next write has its space; False when there was none."""
        if not self.reserve_bytes:
            return False
        try:
            os.unlink(self.reserve_path)
        except OSError:
            pass
        log.error("state_dir %s is full: spent its reserve of %d bytes to write the state before stopping; "
                  "free space there", os.path.dirname(self.path), self.reserve_bytes)
        self.reserve_bytes = 0
        return True


RESERVE_NAME = "state.reserve"
RESERVE_MAX = 1 << 20  # bytes: a few commits of a large state document (8 ranks' windows)
RESERVE_MIN = 16 << 10  # bytes: less would not hold one commit of a small state


def _disk_full(e: BaseException) -> bool:
    """Whether a failed write failed for want of space (SQLITE_FULL, ENOSPC, EDQUOT)."""
    if isinstance(e, sqlite3.Error):
        return getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "full" in str(e)
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def migrate_json(path: str | os.PathLike[str], default: Any = None) -> Any:
    """Read a file of the JSON-file state layout and rename it `<path>.migrated` (once: the
    content then lives in `StateStore`). Returns `default` when it is missing or unreadable."""
    doc = read_json(path, default)
    if os.path.exists(path):
        os.replace(path, os.fspath(path) + ".migrated")
    return doc
