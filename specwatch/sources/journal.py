"""A systemd journal as a log source: each entry's MESSAGE is a log line, exactly as a file's.

Binding: `journalctl -o json --follow` as a child process, read through a pipe. Chosen over the
Python bindings because the project's Python is pyenv's 3.11, where Debian's `python3-systemd`
cannot be imported; PyPI `systemd-python` builds from source (libsystemd-dev and a compiler on
every box); `cysystemd` ships wheels but loads libsystemd into the daemon. journalctl is on
every systemd host, needs no build, adds no RSS to the daemon (the child holds ~8 MB of its
own) and idles on inotify: 0 CPU ticks in 10 s measured with journalctl 252. The daemon side
reads the pipe (non-blocking) for at most `TURN` s per poll round of the followers' thread, so
a large backlog never holds up the other followed logs' lines; that thread starts
journalctl with a parent-death signal (`specwatch.system.childproc`): a killed daemon leaves none
behind; a stopped one ends it in `close()`.

`JournalFollower` has `Follower`'s shape (`path`, `poll()`, `checkpoint()`, `close()`,
`is_open`, the counters), so `FollowerGroup` runs it beside the files and its cursor is saved
in the state store in the same transaction as the pipeline state, like a file offset. Its
`path` is `JournalConfig.key` (`journal:sglang.service`).

journalctl options, as observed with systemd 252 (Debian 12):
- `--merge`: without it `--follow` shows only the newest boot, so entries after the cursor that
  belong to an earlier boot (the last lines before a reboot) would be skipped.
- `--cursor=C`, not `--after-cursor=C`: after-cursor skips one entry *unconditionally*, which
  loses an entry when C was vacuumed. With `--cursor` the first entry is C itself (dropped) when C
  still exists; any other first entry means C is gone (rotated away and vacuumed): reading
  resumes at the oldest entry after C's realtime timestamp, said in a warning and counted.
- `--all`: without it a field over 4096 bytes is printed as null. MESSAGE holding bytes that are
  not printable UTF-8 comes as an array of byte values (decoded with U+FFFD, `raw_ok` False).
- No cursor yet: `--no-tail`, from the oldest entry (a file is read from its first line too).

journalctl missing, a folder that does not exist, no permission ("insufficient permissions",
"not seeing messages from other users"), no journal files: `specwatch_journal_up` 0, an ERROR
line saying what to fix (again every `REPEAT_EVERY` s), and journalctl restarted with backoff.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import IO, Any, ClassVar

import msgspec
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from specwatch.system.childproc import die_with_parent
from specwatch.config import JOURNALCTL, JournalConfig
from specwatch.sources.filestream import LineBatch

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1
READ_BYTES = 1 << 16  # per os.read: a bigger buffer is allocated (mmap) on every poll, data or not
CATCH_UP_QUIET = 0.1  # s without output that ends the first read of a new journalctl (its backlog)
CATCH_UP_MAX = 30.0  # s the first read (its turns together) may take at most
TURN = 0.2  # s one poll reads at most: then the other followers' lines (`more`: poll again at once)
RETRY_FIRST, RETRY_MAX = 1.0, 60.0  # s before restarting journalctl after it exited (doubling)
REPEAT_EVERY = 600.0  # s between repeats of the same error line
KEEP_STDERR = 5  # last stderr lines quoted when journalctl exits
_PERMISSION = ("insufficient permissions", "not seeing messages from other users", "Permission denied")
_FIX_PERMISSION = ("add specwatch's user to the systemd-journal group (deploy/specwatch.service has "
                   "SupplementaryGroups=systemd-journal), or give a readable `directory:`")
_FIX_NO_FILES = ("is systemd-journald running with the journal in /var/log/journal or /run/log/journal? "
                 "for `directory:`, is it the folder holding the *.journal files?")


def journalctl_command(cfg: JournalConfig, *, cursor: str | None = None, since_us: int | None = None,
                       journalctl: str = JOURNALCTL) -> list[str]:
    """The argv that follows `cfg`'s entries: from `cursor` (that entry first), else from
    `since_us` (realtime, µs since the epoch), else from the oldest entry."""
    argv = [journalctl, "--output=json", "--output-fields=MESSAGE", "--all", "--follow", "--merge",
            "--no-pager"]
    if cfg.directory:
        argv.append(f"--directory={cfg.directory}")
    if cursor is not None:
        argv.append(f"--cursor={cursor}")
    elif since_us is not None:
        argv.append(f"--since=@{since_us // 1_000_000}.{since_us % 1_000_000:06d}")
    else:
        argv.append("--no-tail")
    if cfg.unit:
        argv.append(f"--unit={cfg.unit}")
    return argv + list(cfg.matches)  # FIELD=value (validated: never an option)


def _iso(us: int | None) -> str:
    if us is None:
        return "?"
    return datetime.fromtimestamp(us / 1e6, timezone.utc).isoformat(timespec="microseconds")


def _fix_for(text: str) -> str | None:
    """What to do about a journalctl complaint that means the journal cannot be read; None otherwise."""
    if any(p in text for p in _PERMISSION):
        return _FIX_PERMISSION
    if "No journal files were found" in text or "No such file or directory" in text:
        return _FIX_NO_FILES
    return None


def _message(value: Any) -> tuple[str, bool] | None:
    """A MESSAGE value of `-o json` → (text, valid UTF-8); None when absent or not a message."""
    if isinstance(value, str):
        return value, True
    if isinstance(value, list):  # bytes journalctl would not print as a string
        try:
            raw = bytes(value)
        except (TypeError, ValueError):
            return None
        try:
            return raw.decode("utf-8"), True
        except UnicodeDecodeError:
            return raw.decode("utf-8", "replace"), False
    return None  # null (over --all's limit) or a field given several times (a list of lists)


class JournalFollower:
    """Follow the journal entries `cfg` selects, passing their MESSAGE lines to `on_lines` as
    `LineBatch`es (path `cfg.key`; offsets are entry numbers since start). Multi-line messages
    give one line per `\\n`; a line over `max_line_bytes` is skipped and counted.

    Not thread-safe: `poll()`/`close()` from one thread (the followers'); `checkpoint()` and the
    counters from any. `checkpoint`: a dict from `checkpoint()` to resume after its entry (one
    of another key is ignored with a warning).

    Counters: `lines_total`, `entries_total`, `bytes_total` (MESSAGE bytes passed on),
    `long_lines_skipped_total`, `read_errors_total` (journalctl exits, unreadable output),
    `callback_errors_total`, `cursor_lost_total` (saved cursor gone: resumed by time),
    `last_line_timestamp` (time.time() of the last line passed on). `error`: what keeps the
    journal from being read now (None when fine); `is_open` is True while journalctl runs
    and no error is known. `more`: the last poll ended its `TURN` with output left (the group
    polls again at once); `catching_up`: the backlog of a new journalctl is still being read.

    A `sources.stream.LineStream` of kind "journal".
    """

    kind: ClassVar[str] = "journal"
    watches_file: ClassVar[bool] = False  # its path names no file (`journal:UNIT@DIR`): polled each round
    first_read_is_history: ClassVar[bool] = False  # resumes by cursor; its first turn may not end before a stop
    warns_when_closed: ClassVar[bool] = True  # `_say`: journalctl's complaint, with the fix
    collector: ClassVar[Any] = None  # JournalCollector (below): specwatch_journal_*
    stopping: threading.Event | None = None  # set by its FollowerGroup; a journal turn is short and never reads it

    def __init__(self, cfg: JournalConfig, on_lines: Callable[[LineBatch], None], *,
                 max_line_bytes: int = 1_048_576, checkpoint: dict[str, Any] | None = None,
                 journalctl: str = JOURNALCTL) -> None:
        self.cfg = cfg
        self.path = cfg.key
        self._on_lines = on_lines
        self.max_line_bytes = max_line_bytes
        self._journalctl = journalctl
        self._cursor: str | None = None
        self._realtime: int | None = None  # µs since the epoch, of the entry at _cursor
        if checkpoint is not None:
            self._resume(checkpoint)
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self._err_buf = b""
        self._stderr: list[str] = []
        self._expect: str | None = None  # the saved cursor, expected as the first entry
        self._by_time = False  # journalctl refused the saved cursor: start at its time
        self._after_us: int | None = None  # drop entries at or before this realtime (cursor lost)
        self._catch_up = False
        self._catch_up_end = 0.0  # monotonic time the first read ends at the latest
        self.more = False
        self._retry_at = 0.0
        self._backoff = RETRY_FIRST
        self._said: dict[str, float] = {}  # error text -> when logged (monotonic)
        self._seq = 0
        self.error: str | None = None
        self.lines_total = self.entries_total = self.bytes_total = 0
        self.long_lines_skipped_total = self.read_errors_total = self.callback_errors_total = 0
        self.cursor_lost_total = 0
        self.last_line_timestamp: float | None = None

    # ----------------------------------------------------------------------------------- public

    @property
    def is_open(self) -> bool:
        return self._proc is not None and self.error is None

    def why_closed(self) -> str:
        return str(self.error or "journalctl is not running")

    @property
    def catching_up(self) -> bool:
        return self._catch_up and self._proc is not None

    def source_status(self) -> dict[str, Any]:
        """This source as the status page lists it (specwatch/status/view.py): kind `journal`,
        the journalctl error when there is one."""
        return {"kind": "journal", "name": self.path, "server": "", "ok": self.is_open,
                "state": "following" if self.is_open else self.error or "starting",
                "last_line_at": self.last_line_timestamp,
                "counters": {"lines": self.lines_total, "entries": self.entries_total,
                             "read_errors": self.read_errors_total, "long_lines_skipped": self.long_lines_skipped_total,
                             "cursor_lost": self.cursor_lost_total}}

    def checkpoint(self) -> dict[str, Any]:
        """{version, journal: key, cursor: the last entry passed on (None: none yet), realtime:
        its __REALTIME_TIMESTAMP, µs}."""
        return {"version": CHECKPOINT_VERSION, "journal": self.path, "cursor": self._cursor,
                "realtime": self._realtime}

    def poll(self) -> int:
        """Start journalctl if it is not running (and its retry is due), pass on the complete
        entries it printed for at most `TURN` s (a new journalctl's backlog over as many polls as
        it takes, until it pauses for `CATCH_UP_QUIET` s), and note its exit. Returns the lines
        passed on; never raises OSError."""
        before = self.lines_total
        self.more = False
        if self._proc is None:
            if time.monotonic() < self._retry_at or not self._spawn():
                return 0
        proc = self._proc
        assert proc is not None  # running, or just started by _spawn
        try:
            self._read_stderr(proc)
            eof = self._read(proc)
        except OSError as e:
            eof = True
            self._fail(f"reading journalctl's output failed: {e}", "")
        if eof:
            self._exited(proc)
        return self.lines_total - before

    def close(self) -> None:
        """Stop journalctl (SIGTERM, then SIGKILL after 1 s). A later `poll()` starts it again
        from `checkpoint()`."""
        p, self._proc = self._proc, None
        self._buf = self._err_buf = b""
        if p is None:
            return
        try:
            p.terminate()
            p.wait(1.0)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        except OSError:
            pass
        for f in (p.stdout, p.stderr):
            if f is not None:
                f.close()

    # ------------------------------------------------------------------------------- internals

    def _resume(self, cp: dict[str, Any]) -> None:
        if cp.get("journal") != self.path:
            log.warning("ignoring saved position of %s for %s", cp.get("journal"), self.path)
            return
        cursor, realtime = cp.get("cursor"), cp.get("realtime")
        if cursor is not None and not (isinstance(cursor, str) and cursor and "\n" not in cursor):
            log.warning("ignoring a malformed saved cursor for %s: %r", self.path, cursor)
            return
        self._cursor = cursor
        self._realtime = realtime if isinstance(realtime, int) and not isinstance(realtime, bool) else None

    def _spawn(self) -> bool:
        cursor, since = self._cursor, None
        if self._by_time:  # journalctl refused the saved cursor: by its time instead
            cursor, since, self._after_us = None, self._realtime, self._realtime
            self._by_time = False
        argv = journalctl_command(self.cfg, cursor=cursor, since_us=since, journalctl=self._journalctl)
        try:
            exe = shutil.which(self._journalctl)  # exec'd by childproc: a missing one is said here
            if exe is None:
                raise FileNotFoundError(errno.ENOENT, "not found", self._journalctl)
            self._proc = proc = subprocess.Popen(
                die_with_parent([exe, *argv[1:]], signal.SIGTERM),  # ends with the followers' thread, even on SIGKILL
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True,  # a Ctrl-C of the daemon's terminal is the daemon's to handle
                env={**os.environ, "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": "", "LC_ALL": "C.UTF-8"})
        except OSError as e:
            what = ("journalctl not found" if e.errno == errno.ENOENT else f"cannot run journalctl: {e}")
            self._fail(what, "install systemd (journalctl), or put it on specwatch's PATH")
            self._retry_at = time.monotonic() + RETRY_MAX
            return False
        for f in (proc.stdout, proc.stderr):
            os.set_blocking(_fd(f), False)
        self._expect = cursor
        self._catch_up = True
        self._catch_up_end = time.monotonic() + CATCH_UP_MAX
        log.info("following the journal for %s: %s", self.path, " ".join(argv[1:]))
        return True

    def _read(self, proc: subprocess.Popen[bytes]) -> bool:
        """Read what journalctl printed, for at most `TURN` s, and pass it on. Returns True at
        end of file (it exited). A turn cut short sets `more`."""
        fd = _fd(proc.stdout)
        turn_end = time.monotonic() + TURN
        while True:
            try:
                chunk = os.read(fd, READ_BYTES)
            except BlockingIOError:
                now = time.monotonic()
                if not self._catch_up or now > self._catch_up_end:
                    self._catch_up = False
                    return False
                wait = min(CATCH_UP_QUIET, turn_end - now)
                if not select.select([fd], [], [], max(wait, 0.0))[0]:
                    if wait >= CATCH_UP_QUIET:  # quiet that long: the backlog is read
                        self._catch_up = False
                    else:  # the turn ended first: the next poll waits on
                        self.more = True
                    return False
                continue
            if not chunk:
                return True
            self._entries(chunk)
            if time.monotonic() >= turn_end:
                self.more = True
                return False

    def _entries(self, chunk: bytes) -> None:
        data = self._buf + chunk
        cut = data.rfind(b"\n") + 1
        self._buf = data[cut:]
        lines: list[str] = []
        ok: list[bool] = []
        cursor = realtime = None
        for raw in data[:cut].splitlines():
            try:
                entry = msgspec.json.decode(raw)
                c = entry["__CURSOR"]
                rt = int(entry.get("__REALTIME_TIMESTAMP", 0))
            except (msgspec.DecodeError, KeyError, TypeError, ValueError):
                self.read_errors_total += 1
                self._say(f"unreadable journalctl output line skipped: {raw[:200]!r}")
                continue
            if not self._take(c, rt):
                continue
            cursor, realtime = c, rt
            self.entries_total += 1
            msg = _message(entry.get("MESSAGE"))
            if msg is None:
                continue
            text, valid = msg
            parts = text.split("\n") if "\n" in text else [text]
            if len(parts) > 1 and parts[-1] == "":  # a message ending in a newline
                parts.pop()
            for line in parts:
                if line.endswith("\r"):
                    line = line[:-1]
                size = len(line) if line.isascii() else len(line.encode("utf-8", "surrogatepass"))
                if size > self.max_line_bytes:
                    self.long_lines_skipped_total += 1
                    continue
                self.bytes_total += size + 1
                lines.append(line)
                ok.append(valid)
        if cursor is None:
            return
        if self.error is not None:
            log.info("journal %s readable again", self.path)
            self.error = None
        self._backoff = RETRY_FIRST
        if lines:
            start, self._seq = self._seq, self._seq + len(lines)
            batch = LineBatch(self.path, start, self._seq, lines=lines,
                              raw_ok=None if all(ok) else ok, bounds=list(range(start, self._seq + 1)))
            try:
                self._on_lines(batch)
            except Exception:
                self.callback_errors_total += 1
                log.exception("processing journal lines of %s failed", self.path)
            self.lines_total += len(lines)
            self.last_line_timestamp = time.time()
        self._cursor, self._realtime = cursor, realtime  # after the lines were passed on

    def _take(self, cursor: str, realtime: int) -> bool:
        """False for an entry read before: the saved cursor itself, or one not after its time
        once that cursor is gone."""
        if self._expect:
            expected, self._expect = self._expect, None
            if cursor == expected:
                return False
            self.cursor_lost_total += 1
            self._after_us = self._realtime
            log.warning("journal %s: the saved cursor is no longer in the journal (rotated and vacuumed); "
                        "resuming at the oldest entry after %s", self.path, _iso(self._realtime))
        if self._after_us is not None:
            if realtime <= self._after_us:
                return False
            self._after_us = None
        return True

    def _read_stderr(self, proc: subprocess.Popen[bytes], final: bool = False) -> None:
        """Classify journalctl's complete stderr lines (all of them once it exited: `final`)."""
        data = self._err_buf
        try:
            while chunk := os.read(_fd(proc.stderr), 65536):
                data += chunk
        except OSError:  # BlockingIOError: nothing more for now
            pass
        cut = len(data) if final else data.rfind(b"\n") + 1
        self._err_buf = data[cut:]
        for raw in data[:cut].splitlines():
            line = raw.decode("utf-8", "replace").strip()
            if not line:
                continue
            self._stderr = (self._stderr + [line])[-KEEP_STDERR:]
            fix = _fix_for(line)
            if fix:
                self._fail(line, fix)
            elif "Failed to seek to cursor" in line and self._expect:
                self._by_time = True  # restart from the saved time instead
                self.cursor_lost_total += 1
                log.warning("journal %s: journalctl refused the saved cursor (%s); resuming at the oldest "
                            "entry after %s", self.path, line, _iso(self._realtime))
            else:
                log.warning("journalctl (%s): %s", self.path, line)

    def _exited(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            rc: int | None = proc.wait(1.0)
        except subprocess.TimeoutExpired:
            rc = None
        self._read_stderr(proc, final=True)
        said = "; ".join(self._stderr) or "no message"
        refused = self._by_time and self._expect
        self._stderr = []
        self.close()
        if refused:  # the cursor itself was refused: start again at once, by time
            self._retry_at = 0.0
            return
        self.read_errors_total += 1
        fix = _fix_for(said) or (f"check the `journal:` settings; run `{' '.join(journalctl_command(self.cfg))}` "
                                 "as specwatch's user to see what it says")
        self._fail(f"journalctl exited (status {rc}): {said}", fix)
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(RETRY_MAX, self._backoff * 2)

    def _fail(self, what: str, fix: str) -> None:
        self.error = what
        self._say(f"cannot read the journal for {self.path}: {what}" + (f"; {fix}" if fix else ""), error=True)

    def _say(self, text: str, error: bool = False) -> None:
        now = time.monotonic()
        if now - self._said.get(text, -REPEAT_EVERY) >= REPEAT_EVERY:
            self._said[text] = now
            (log.error if error else log.warning)("%s", text)


def _fd(pipe: IO[bytes] | None) -> int:
    """The fd of one of journalctl's pipes (started with stdout and stderr PIPE: never None)."""
    assert pipe is not None
    return pipe.fileno()


class JournalCollector(Collector):
    """`specwatch_journal_up{path}` (1 while journalctl runs and reports no problem) and
    `specwatch_journal_cursor_lost_total{path}` of every journal source."""

    def __init__(self, followers: Callable[[], dict[str, object]]):
        self.followers = followers  # path -> Follower or JournalFollower

    def collect(self):
        up = GaugeMetricFamily("specwatch_journal_up", "1 while the journal source reads (journalctl runs and "
                               "reported no problem), 0 when it cannot: see the ERROR line in specwatch's log.",
                               labels=("path",))
        lost = CounterMetricFamily("specwatch_journal_cursor_lost", "Restarts whose saved journal cursor was gone "
                                   "(rotated and vacuumed): reading resumed at the oldest entry after its time.",
                                   labels=("path",))
        for path, f in self.followers().items():
            if isinstance(f, JournalFollower):
                up.add_metric([path], 1.0 if f.is_open else 0.0)
                lost.add_metric([path], f.cursor_lost_total)
        yield up
        yield lost


JournalFollower.collector = JournalCollector
