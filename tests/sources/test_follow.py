"""Follower / FollowerGroup against real files, real renames and a real writer process.

The writer is a separate Python process appending numbered lines (`line 000123`) with O_APPEND,
one write(2) per line; the tests rotate the file the way logrotate and process managers do and
check that every number arrives exactly once, in order.
"""

from __future__ import annotations

import gzip
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from procs import popen
from rotating_writer import RotatingWriter, tally
from specwatch.daemon import READ_SPAN
from specwatch.core.events import LogLine
from specwatch.core.metrics import FollowerCollector
from specwatch.sources.filestream import HEAD_BYTES, Follower, LineBatch
from specwatch.sources.follow import FollowerGroup
from specwatch.sources.rotated import rotated_files
from specwatch.system.storage import read_json, write_json_atomic

LINE_BYTES = len("line 000000\n")

WRITER = r"""
import os, signal, sys, time
path, start, count, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
reopen = False
def on_hup(signum, frame):
    global reopen
    reopen = True
signal.signal(signal.SIGHUP, on_hup)
def op():
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
fd = op()
interval = 1.0 / rate
t = time.monotonic()
for i in range(start, start + count):
    if reopen:  # like a server reopening its log on SIGHUP after logrotate
        reopen = False
        os.close(fd)
        fd = op()
    os.write(fd, b"line %06d\n" % i)
    t += interval
    d = t - time.monotonic()
    if d > 0:
        time.sleep(d)
os.close(fd)
"""


class Writer:
    def __init__(self, path: Path, count: int, *, start: int = 0, rate: float = 2000.0):
        self.path = path
        self.proc = popen(
            [sys.executable, "-c", WRITER, str(path), str(start), str(count), str(rate)]
        )

    def reopen(self) -> None:
        self.proc.send_signal(signal.SIGHUP)

    def pause(self) -> None:
        """SIGSTOP and wait until stopped, so no write lands during a copy + truncate."""
        self.proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{self.proc.pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
            if state in ("T", "t"):
                return
            time.sleep(0.001)
        raise AssertionError("writer did not stop")

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def wait(self, timeout: float = 30.0) -> None:
        assert self.proc.wait(timeout) == 0


@pytest.fixture
def writers():
    started: list[Writer] = []

    def start(path: Path, count: int, **kw) -> Writer:
        w = Writer(path, count, **kw)
        started.append(w)
        return w

    yield start
    for w in started:
        if w.proc.poll() is None:
            w.proc.send_signal(signal.SIGCONT)
            w.proc.kill()
            w.proc.wait()


class Collector:
    def __init__(self) -> None:
        self.lines: list[LogLine] = []
        self.threads: set[int] = set()

    def __call__(self, line: LogLine) -> None:
        self.threads.add(threading.get_ident())
        self.lines.append(line)

    def __len__(self) -> int:
        return len(self.lines)

    @property
    def texts(self) -> list[str]:
        return [line.text for line in self.lines]


def numbered(start: int, stop: int) -> list[str]:
    return [f"line {i:06d}" for i in range(start, stop)]


def assert_exact(texts: list[str], n: int) -> None:
    """Every number 0..n-1 exactly once and in order, with a readable message when not."""
    expected = numbered(0, n)
    if texts != expected:
        seen: dict[str, int] = {}
        for t in texts:
            seen[t] = seen.get(t, 0) + 1
        missing = [t for t in expected if t not in seen]
        dups = sorted(t for t, c in seen.items() if c > 1)
        extra = sorted(t for t in seen if t not in set(expected))
        pytest.fail(
            f"got {len(texts)} lines, want {n}: missing {len(missing)} {missing[:5]}, "
            f"duplicated {len(dups)} {dups[:5]}, unexpected {extra[:5]}, "
            f"in order: {texts == sorted(texts)}"
        )


def wait_for(cond, timeout: float = 20.0, follower: Follower | None = None, what: str = "") -> None:
    """Poll `follower` (if given) until cond() holds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if follower is not None:
            follower.poll()
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what or cond}")
        time.sleep(0.002)


def finish(f: Follower, w: Writer, got: Collector, n: int) -> None:
    wait_for(lambda: w.proc.poll() is not None, 30, f, "writer to finish")
    w.wait()
    wait_for(lambda: len(got) >= n, 20, f, f"{n} lines")
    for _ in range(3):  # nothing more may come: a duplicate would show here
        f.poll()


def size(p: Path) -> int:
    return os.stat(p).st_size


# ------------------------------------------------------------------------------- rotations


def test_rename_rotation_drains_old_fd_then_reads_new_file(tmp_path, writers):
    p, p1, p2 = tmp_path / "server.log", tmp_path / "server.log.1", tmp_path / "server.log.2"
    n = 3000
    got = Collector()
    f = Follower(p, got)
    w = writers(p, n)
    for k, create in ((600, False), (1800, True)):
        wait_for(lambda: len(got) >= k, follower=f)
        if p1.exists():
            os.rename(p1, p2)
        os.rename(p, p1)
        if create:  # logrotate `create`: an empty new file exists while the writer still
            p.touch()  # appends to the old one
        # The writer keeps appending to the renamed file until it reopens.
        grown = size(p1) + 50 * LINE_BYTES
        wait_for(lambda: size(p1) >= grown, follower=f, what="writes to the renamed file")
        w.reopen()
    finish(f, w, got, n)

    assert_exact(got.texts, n)
    assert f.rotations_total == 2
    assert f.truncations_total == 0 and f.recovered_lines_total == 0
    assert {line.path for line in got.lines} == {str(p)}
    assert got.lines[5].offset == 5 * LINE_BYTES
    assert f.lines_total == n and f.bytes_total == n * LINE_BYTES
    assert f.read_errors_total == 0


def reading(tmp_path: Path, writers, n: int, first: int = 300) -> tuple[Path, Follower, Collector, Writer]:
    """A writer of n lines to `server.log` and a Follower that has read its `first` lines."""
    p = tmp_path / "server.log"
    got = Collector()
    f = Follower(p, got)
    w = writers(p, n)
    wait_for(lambda: len(got) >= first, follower=f)
    return p, f, got, w


def copytruncate(p: Path, p1: Path, w: Writer, read_to: int) -> int:
    """logrotate `copytruncate` with the writer held still; returns the lines after `read_to`."""
    w.pause()
    unread = (size(p) - read_to) // LINE_BYTES
    shutil.copyfile(p, p1)
    os.truncate(p, 0)
    w.resume()
    return unread


def gzip_away(path: Path) -> Path:
    """logrotate `compress`: write `<path>.gz`, then remove `<path>` (a new inode)."""
    gz = Path(f"{path}.gz")
    with open(path, "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.unlink(path)
    return gz


def rotate(p: Path, w: Writer, scheme: str, compress: bool, day: int) -> int:
    """One logrotate run without delaycompress: rename `p` (shifting `.N` up, or to a dateext
    name), SIGHUP the writer (postrotate), wait until it writes the new file, then compress.
    Returns the lines of the rotated file (complete: the writer moved on)."""
    if scheme == "numbered":
        for n in range(9, 0, -1):
            for ext in ("", ".gz"):
                q = p.with_name(f"{p.name}.{n}{ext}")
                if q.exists():
                    os.rename(q, p.with_name(f"{p.name}.{n + 1}{ext}"))
        rotated = p.with_name(p.name + ".1")
    else:
        rotated = p.with_name(f"{p.name}-202611{day:02d}")
    os.rename(p, rotated)
    w.reopen()
    wait_for(lambda: p.exists() and size(p) >= 200 * LINE_BYTES, what="writes to the new file")
    lines = size(rotated) // LINE_BYTES
    if compress:
        gzip_away(rotated)
    return lines


@pytest.mark.parametrize("scheme,compress", [
    ("numbered", False), ("numbered", True), ("dateext", False), ("dateext", True)])
def test_two_rotations_while_stopped_read_every_rotated_file_in_order(
        tmp_path, writers, scheme, compress):
    """The reader is stopped (no poll) across two rotations: the file in between exists only as
    `.1` / `.1.gz` / `-YYYYMMDD[.gz]`; it is found, read whole, in order, before the new file."""
    (tmp_path / "server.log.5.gz").write_bytes(gzip.compress(b"old 1\nold 2\n"))  # older history
    (tmp_path / "server.log-20261101").write_text("older\n")
    (tmp_path / "server.log.bak").write_text("not a rotation\n")
    n = 3000
    p, f, got, w = reading(tmp_path, writers, n)
    rotate(p, w, scheme, compress, 2)
    n_between = rotate(p, w, scheme, compress, 3)
    finish(f, w, got, n)

    assert_exact(got.texts, n)
    assert f.rotations_total == 2 and f.rotated_files_lost_total == 0
    assert f.recovered_lines_total == n_between  # the file in between, read by its rotated name


@pytest.mark.parametrize("restart", [False, True])
def test_rotated_then_compressed_before_the_reader_resumes(tmp_path, writers, restart):
    """logrotate without delaycompress while the reader is stopped (SIGSTOP, or the daemon
    restarting from its checkpoint): the unread rest of the file exists only in `.1.gz`."""
    n = 2500
    p, f, got, w = reading(tmp_path, writers, n)
    p1 = tmp_path / "server.log.1"
    cp = f.checkpoint()
    if restart:
        f.close()
    wait_for(lambda: size(p) >= cp["offset"] + 100 * LINE_BYTES)  # unread lines left behind
    if restart:
        rotate(p, w, "numbered", True, 0)
        unread = (gzip.open(f"{p1}.gz").seek(0, 2) - cp["offset"]) // LINE_BYTES
        f = Follower(p, got, checkpoint=cp)
    else:  # copytruncate + compress: the copy is the only place the unread lines are
        unread = copytruncate(p, p1, w, cp["offset"])
        gzip_away(p1)
    finish(f, w, got, n)

    assert_exact(got.texts, n)
    assert f.recovered_lines_total == unread and f.rotated_files_lost_total == 0
    assert f.rotations_total + f.truncations_total == 1


def test_rotated_file_deleted_before_it_was_read_is_counted_and_warned(tmp_path, writers, caplog):
    n = 3000
    p, f, got, w = reading(tmp_path, writers, n)
    p1, p2 = tmp_path / "server.log.1", tmp_path / "server.log.2"
    rotate(p, w, "numbered", False, 0)
    rotate(p, w, "numbered", False, 0)
    n_a, n_b = size(p2) // LINE_BYTES, size(p1) // LINE_BYTES  # both complete: the writer moved on
    os.unlink(p1)
    with caplog.at_level(logging.WARNING, logger="specwatch.sources.filestream"):
        finish(f, w, got, n - n_b)

    assert got.texts == numbered(0, n_a) + numbered(n_a + n_b, n)  # nothing twice, in order
    assert f.rotated_files_lost_total == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"{p1} could not be found" in warnings[0], warnings

    # A restart whose checkpointed file is gone, with bytes known unread: counted with the amount.
    cp = f.checkpoint()
    f.close()
    cp["size"] = cp["offset"] + 1234  # the last size it saw was larger than what it read
    os.rename(p, p1)
    os.unlink(p1)
    p.write_text("fresh\n")
    caplog.clear()
    got2 = Collector()
    g = Follower(p, got2, checkpoint=cp)
    with caplog.at_level(logging.WARNING, logger="specwatch.sources.filestream"):
        g.poll()
    assert got2.texts == ["fresh"] and g.rotated_files_lost_total == 1
    assert "at least 1234 bytes unread" in caplog.text

    registry = CollectorRegistry()
    registry.register(FollowerCollector(lambda: {str(p): f}))
    assert registry.get_sample_value("specwatch_log_rotated_files_lost_total", {"path": str(p)}) == 1


def test_a_hole_in_the_numbering_while_the_writer_shifts_is_not_a_lost_file(tmp_path):
    """logrotate renames `.1` to `.2` before it renames the log to `.1`: a reader that lists the
    copies in between sees `.2` and no `.1`. The hole is listed again; it fills, nothing is lost."""
    p = tmp_path / "server.log"
    p.write_text("".join(f"a {i}\n" for i in range(10)))
    got = Collector()
    f = Follower(p, got)
    f.poll()
    os.rename(p, f"{p}.1")
    p.write_text("".join(f"b {i}\n" for i in range(10)))
    os.rename(f"{p}.1", f"{p}.2")  # the shift has begun: ours is `.2`, no `.1` yet

    def finish_shift():
        time.sleep(0.03)
        os.rename(p, f"{p}.1")
        p.write_text("c 0\n")

    t = threading.Thread(target=finish_shift)
    t.start()
    f.poll()
    t.join()
    f.poll()
    assert got.texts == [f"a {i}" for i in range(10)] + [f"b {i}" for i in range(10)] + ["c 0"]
    assert f.rotated_files_lost_total == 0


def test_copytruncate_recovers_unread_lines_from_dot1(tmp_path, writers):
    p, p1 = tmp_path / "server.log", tmp_path / "server.log.1"
    n = 3000
    got = Collector()
    f = Follower(p, got)
    w = writers(p, n)
    unread_total = 0
    for k in (600, 1800):
        wait_for(lambda: len(got) >= k, follower=f)
        read_to = f.checkpoint()["offset"]
        # Let lines pile up unread (no polling) so only the copy can supply them.
        wait_for(lambda: size(p) >= read_to + 40 * LINE_BYTES)
        unread_total += copytruncate(p, p1, w, read_to)
    finish(f, w, got, n)

    assert_exact(got.texts, n)
    assert f.truncations_total == 2
    assert f.recovered_lines_total == unread_total
    assert f.rotations_total == 0


def test_copytruncate_detected_by_head_hash_when_file_regrew(tmp_path, writers):
    p, p1 = tmp_path / "server.log", tmp_path / "server.log.1"
    n = 2000
    got = Collector()
    f = Follower(p, got)
    w = writers(p, n)
    wait_for(lambda: len(got) >= 100, follower=f)
    read_to = f.checkpoint()["offset"]
    w.pause()
    shutil.copyfile(p, p1)
    os.truncate(p, 0)
    w.resume()
    # Without polling, the truncated file grows past our old offset: size alone looks fine.
    wait_for(lambda: size(p) > read_to + 10 * LINE_BYTES)
    finish(f, w, got, n)

    assert_exact(got.texts, n)
    assert f.truncations_total == 1


def test_truncate_without_copy_restarts_at_zero(tmp_path, writers):
    p = tmp_path / "server.log"
    n = 1500
    got = Collector()
    f = Follower(p, got)
    w = writers(p, n)
    wait_for(lambda: len(got) >= 300, follower=f)
    w.pause()
    wait_for(lambda: f.checkpoint()["offset"] == size(p), follower=f)  # everything read
    with open(p, "r+b") as fh:  # `: > server.log`
        fh.truncate(0)
    w.resume()
    finish(f, w, got, n)

    assert_exact(got.texts, n)
    assert f.truncations_total == 1 and f.recovered_lines_total == 0


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("tail", [b"", b"unterminated"])
def test_truncate_and_rewrite_past_the_offset_after_all_was_read_loses_nothing(
        tmp_path, caplog, tail):
    """`: > server.log` then more lines than before, all between two polls: every old byte had
    been read (an unterminated last line is emitted as one), so nothing is reported lost."""
    p = tmp_path / "server.log"
    p.write_bytes("".join(f"{t}\n" for t in numbered(0, 50)).encode() + tail)
    got = Collector()
    f = Follower(p, got)
    f.poll()
    old_size, read_to = size(p), f.checkpoint()["offset"]
    assert f.checkpoint()["size"] == old_size and read_to == old_size - len(tail)
    with open(p, "r+b") as fh, caplog.at_level(logging.INFO, logger="specwatch.sources"):
        fh.truncate(0)
        fh.write(b"".join(b"decode %06d\n" % i for i in range(800)))
        fh.flush()
        assert size(p) > old_size
        f.poll()

    new = [f"decode {i:06d}" for i in range(800)]
    assert got.texts == numbered(0, 50) + [tail.decode()] * bool(tail) + new
    assert f.truncations_total == 1 and f.rotated_files_lost_total == 0
    assert warnings_of(caplog) == []
    assert f"truncated at offset {read_to}" in caplog.text
    assert f.checkpoint()["offset"] == f.checkpoint()["size"] == size(p)


def test_truncation_with_bytes_unread_and_no_copy_is_a_loss(tmp_path, caplog):
    """Lost for real: the file is truncated and rewritten while bytes the last stat saw are
    still unread (here by the consumer itself, mid-poll; then after a restart from a checkpoint
    behind the file's end). Counted, warned about with the unread amount; the new lines read."""
    p = tmp_path / "server.log"
    p.write_bytes(b"".join(b"%s\n" % t.encode() for t in numbered(0, 200)))
    rewrite = b"".join(b"decode %06d\n" % i for i in range(800))

    def truncate_on_first_line(line: LogLine) -> None:
        got(line)
        if line.text == "line 000000":
            with open(p, "r+b") as fh:
                fh.truncate(0)
                fh.write(rewrite)

    got = Collector()
    f = Follower(p, truncate_on_first_line, read_chunk_bytes=100 * LINE_BYTES)
    with caplog.at_level(logging.WARNING, logger="specwatch.sources.filestream"):
        f.poll()
    assert got.texts == numbered(0, 100) + [f"decode {i:06d}" for i in range(800)]
    assert f.truncations_total == 1 and f.rotated_files_lost_total == 1
    unread = 100 * LINE_BYTES
    assert [w for w in warnings_of(caplog) if f"at least {unread} bytes unread" in w], caplog.text

    # Restart: the checkpoint (same inode) saw 2000 bytes more than it read; the file was
    # truncated and rewritten past that offset meanwhile.
    cp = f.checkpoint()
    f.close()
    cp["size"] = cp["offset"] + 2000
    with open(p, "r+b") as fh:
        fh.truncate(0)
        fh.write(b"".join(b"prefill %06d\n" % i for i in range(1600)))
    caplog.clear()
    got = Collector()
    g = Follower(p, got, checkpoint=cp)
    with caplog.at_level(logging.WARNING, logger="specwatch.sources.filestream"):
        g.poll()
    assert len(got) == 1600 and g.truncations_total == 1 and g.rotated_files_lost_total == 1
    assert "at least 2000 bytes unread" in caplog.text


def test_delete_then_recreate_after_gap(tmp_path, writers):
    p = tmp_path / "server.log"
    n = 2000
    got = Collector()
    f = Follower(p, got)
    w = writers(p, n)
    wait_for(lambda: len(got) >= 500, follower=f)
    os.unlink(p)
    # 0.4 s gap: the writer still appends to the deleted file, which only our fd can read.
    gap_end = time.monotonic() + 0.4
    wait_for(lambda: time.monotonic() > gap_end, follower=f)
    assert not p.exists() and f.is_open
    w.reopen()
    finish(f, w, got, n)
    assert_exact(got.texts, n)
    assert f.rotations_total == 1

    # A restarted server: old writer gone, file removed, a new process creates it later.
    os.unlink(p)
    for _ in range(5):
        f.poll()
    w2 = writers(p, 1000, start=n)
    finish(f, w2, got, n + 1000)
    assert_exact(got.texts, n + 1000)
    assert f.rotations_total == 2


@pytest.mark.parametrize("read_from", ["beginning", "end"])
def test_file_created_late_is_read_from_first_line(tmp_path, writers, read_from):
    p = tmp_path / "server.log"
    n = 1000
    got = Collector()
    f = Follower(p, got, read_from=read_from)
    for _ in range(10):
        assert f.poll() == 0
    assert not f.is_open and f.read_errors_total == 0
    w = writers(p, n)
    finish(f, w, got, n)
    assert_exact(got.texts, n)
    assert f.read_errors_total == 0


def test_read_from_end_skips_existing_lines_but_keeps_line_in_progress(tmp_path):
    p = tmp_path / "server.log"
    p.write_bytes("".join(f"{t}\n" for t in numbered(0, 10)).encode() + b"line 0000")
    got = Collector()
    f = Follower(p, got, read_from="end")
    assert f.poll() == 0
    with open(p, "ab") as fh:
        fh.write(b"10\nline 000011\n")
    assert f.poll() == 2
    assert got.texts == numbered(10, 12)
    assert got.lines[0].offset == 10 * LINE_BYTES


# --------------------------------------------------------------------------------- restarts


def test_restart_from_checkpoint_same_file_with_partial_line(tmp_path):
    p, state = tmp_path / "server.log", tmp_path / "state.json"
    p.write_bytes("".join(f"{t}\n" for t in numbered(0, 10)).encode() + b"line 0000")
    got_a = Collector()
    a = Follower(p, got_a)
    assert a.poll() == 10
    cp = a.checkpoint()
    assert cp["offset"] == 10 * LINE_BYTES  # the partial line is not covered
    assert cp["size"] == 10 * LINE_BYTES + 9 and cp["head_len"] == min(HEAD_BYTES, cp["size"])
    a.close()
    assert not a.is_open
    write_json_atomic(state, {str(p): cp})

    with open(p, "ab") as fh:
        fh.write(b"10\n" + "".join(f"{t}\n" for t in numbered(11, 20)).encode())
    got_b = Collector()
    b = Follower(p, got_b, checkpoint=read_json(state, {})[str(p)])
    assert b.poll() == 10
    assert got_a.texts + got_b.texts == numbered(0, 20)
    assert got_b.lines[0].offset == 10 * LINE_BYTES
    assert b.truncations_total == b.rotations_total == 0


def test_close_then_poll_resumes_like_a_restart(tmp_path):
    p = tmp_path / "server.log"
    p.write_text("a\nb\n")
    got = Collector()
    f = Follower(p, got)
    f.poll()
    f.close()
    with open(p, "a") as fh:
        fh.write("c\n")
    f.poll()
    assert got.texts == ["a", "b", "c"]


def test_restart_after_rename_rotation_while_stopped(tmp_path, writers):
    p, p1 = tmp_path / "server.log", tmp_path / "server.log.1"
    n = 2500
    got_a = Collector()
    a = Follower(p, got_a)
    w = writers(p, n)
    wait_for(lambda: len(got_a) >= 500, follower=a)
    read_to = a.checkpoint()["offset"]
    wait_for(lambda: size(p) >= read_to + 40 * LINE_BYTES)  # unread lines left behind
    cp = a.checkpoint()
    a.close()
    os.rename(p, p1)
    grown = size(p1) + 40 * LINE_BYTES
    wait_for(lambda: size(p1) >= grown)
    w.reopen()
    wait_for(lambda: p.exists() and size(p) > 0)

    got_b = Collector()
    b = Follower(p, got_b, checkpoint=cp)
    finish(b, w, got_b, n - len(got_a))
    assert_exact(got_a.texts + got_b.texts, n)
    assert b.rotations_total == 1
    assert got_b.lines[0].offset == cp["offset"]


def test_restart_after_copytruncate_while_stopped(tmp_path, writers):
    p, p1 = tmp_path / "server.log", tmp_path / "server.log.1"
    n = 2500
    got_a = Collector()
    a = Follower(p, got_a)
    w = writers(p, n)
    wait_for(lambda: len(got_a) >= 500, follower=a)
    cp = a.checkpoint()
    a.close()
    wait_for(lambda: size(p) >= cp["offset"] + 40 * LINE_BYTES)
    unread = copytruncate(p, p1, w, cp["offset"])
    wait_for(lambda: size(p) > 0)

    got_b = Collector()
    b = Follower(p, got_b, checkpoint=cp)
    finish(b, w, got_b, n - len(got_a))
    assert_exact(got_a.texts + got_b.texts, n)
    assert b.truncations_total == 1
    assert b.recovered_lines_total == unread


def test_restart_when_file_was_rewritten_in_place_or_replaced(tmp_path):
    p = tmp_path / "server.log"
    p.write_text("".join(f"{t}\n" for t in numbered(0, 50)))
    a = Follower(p, Collector())
    a.poll()
    cp = a.checkpoint()
    a.close()
    # Same inode, new content longer than the old offset, no `.1`: read it all from the start.
    with open(p, "r+b") as fh:
        fh.truncate(0)
        fh.write(b"".join(b"other %06d\n" % i for i in range(100)))
    got = Collector()
    b = Follower(p, got, checkpoint=cp)
    b.poll()
    assert got.texts == [f"other {i:06d}" for i in range(100)]
    assert b.truncations_total == 1 and b.recovered_lines_total == 0

    # A different file (new inode) and no rotated copy: also read from its start.
    cp = b.checkpoint()
    b.close()
    os.unlink(p)
    p.write_text("fresh 1\nfresh 2\n")
    got = Collector()
    c = Follower(p, got, checkpoint=cp)
    c.poll()
    assert got.texts == ["fresh 1", "fresh 2"]
    # The filesystem may hand the freed inode number to the new file; then only the head hash
    # tells them apart and it reads as a truncation of the same inode.
    assert c.rotations_total + c.truncations_total == 1


def test_checkpoint_before_file_existed_reads_new_file_from_start(tmp_path):
    p = tmp_path / "server.log"
    cp = Follower(p, Collector(), read_from="end").checkpoint()
    assert cp["inode"] is None and cp["offset"] == 0
    p.write_text("x\ny\n")
    got = Collector()
    Follower(p, got, checkpoint=cp, read_from="end").poll()
    assert got.texts == ["x", "y"]


def test_malformed_checkpoint_and_arguments_raise_value_error(tmp_path):
    with pytest.raises(ValueError):
        Follower(tmp_path / "x", print, checkpoint={"offset": 3})
    with pytest.raises(ValueError):
        Follower(tmp_path / "x", print, checkpoint={"dev": 1, "inode": 2, "offset": -1,
                                                    "head_len": 0, "head_sha256": ""})
    with pytest.raises(ValueError):
        Follower(tmp_path / "x", print, read_from="middle")
    with pytest.raises(ValueError):
        Follower(tmp_path / "x", print, max_line_bytes=0)


# ------------------------------------------------------------------------------ line content


def test_partial_line_waits_for_newline_and_is_flushed_when_file_rotates(tmp_path):
    p, p1 = tmp_path / "server.log", tmp_path / "server.log.1"
    p.write_bytes(b"a\nb-part")
    got = Collector()
    f = Follower(p, got)
    assert f.poll() == 1
    assert f.poll() == 0
    with open(p, "ab") as fh:
        fh.write(b"ial\nc-unterminated")
    assert f.poll() == 1
    assert got.texts == ["a", "b-partial"]
    os.rename(p, p1)
    assert f.poll() == 0  # no new file yet: the old one may still grow
    p.write_bytes(b"d\n")
    assert f.poll() == 2
    assert got.texts == ["a", "b-partial", "c-unterminated", "d"]
    assert [line.offset for line in got.lines] == [0, 2, 12, 0]
    assert f.rotations_total == 1


def test_long_lines_are_skipped_and_counted_neighbours_intact(tmp_path):
    p = tmp_path / "server.log"
    p.write_bytes(b"before\n" + b"x" * 250 + b"\n" + b"y" * 100 + b"\nafter\n")
    got = Collector()
    f = Follower(p, got, max_line_bytes=100, read_chunk_bytes=64)
    f.poll()
    assert got.texts == ["before", "y" * 100, "after"]  # exactly the limit is kept
    assert f.long_lines_skipped_total == 1

    # A long line arriving in pieces over several polls, then normal lines again.
    for piece in (b"z" * 60, b"z" * 60, b"z" * 60):
        with open(p, "ab") as fh:
            fh.write(piece)
        assert f.poll() == 0
    with open(p, "ab") as fh:
        fh.write(b"zz\nend\n")
    assert f.poll() == 1
    assert got.texts == ["before", "y" * 100, "after", "end"]
    assert f.long_lines_skipped_total == 2
    assert got.lines[-1].offset == size(p) - 4
    assert f.checkpoint()["offset"] == size(p)


def test_crlf_and_invalid_utf8(tmp_path):
    p = tmp_path / "server.log"
    p.write_bytes(b"one\r\ntwo\r\nbad \xff\xfe end\ncaf\xc3\xa9\n")
    got = Collector()
    Follower(p, got).poll()
    assert got.texts == ["one", "two", "bad \ufffd\ufffd end", "caf\u00e9"]
    assert [line.raw_ok for line in got.lines] == [True, True, False, True]


def test_small_reads_split_lines_across_chunks_exactly(tmp_path):
    p = tmp_path / "server.log"
    p.write_text("".join(f"{t}\n" for t in numbered(0, 3000)))
    got = Collector()
    f = Follower(p, got, read_chunk_bytes=7)
    f.poll()
    assert_exact(got.texts, 3000)
    assert [line.offset for line in got.lines[:3]] == [0, LINE_BYTES, 2 * LINE_BYTES]


def whole_file_lines(path: str, data: bytes, max_line_bytes: int) -> list[LogLine]:
    """What a follower must emit for `data`, written out independently: split the whole file at
    once, drop a line's leading NUL hole (its offset is after it), skip lines over the limit, strip
    one trailing `\r`, replace invalid UTF-8; a last unterminated line counts (finish())."""
    out, pos = [], 0
    *complete, last = data.split(b"\n")
    for i, raw in enumerate([*complete, last]):
        line = raw.lstrip(b"\0")
        start = pos + len(raw) - len(line)
        pos += len(raw) + 1
        if len(line) > max_line_bytes or (i == len(complete) and not line):
            continue
        line = line[:-1] if line.endswith(b"\r") else line
        try:
            out.append(LogLine(path, line.decode("utf-8"), start, True))
        except UnicodeDecodeError:
            out.append(LogLine(path, line.decode("utf-8", "replace"), start, False))
    return out


CLEAN = [b"[2026-01-01 00:00:00 DP0 TP0] Decode batch, accept len: 3.21", b"caf\xc3\xa9 \xe4\xb8\xad",
         b"\n", b"\n", b"\n"]
DIRTY = CLEAN + [b"\r", b"\0" * 50, b"\xff\xfe", b"\xe4\xb8", b"x" * 150, b"a\0b"]


@pytest.mark.parametrize("pieces", [CLEAN, DIRTY], ids=["clean", "dirty"])
@pytest.mark.parametrize("chunk", [7, 100, 4096, 1 << 20])
def test_lines_and_batches_equal_a_whole_file_split(tmp_path, pieces, chunk):
    """on_line and on_lines give the same lines, offsets, counters and checkpoints as a split of
    the whole file, however the reads cut it (batches of clean reads skip per-line work)."""
    rnd = random.Random(chunk)
    data = b"".join(rnd.choice(pieces) for _ in range(4000)) + b"\nlast, unterminated"
    p = tmp_path / "server.log"
    p.write_bytes(data)
    expected = whole_file_lines(str(p), data, max_line_bytes=120)
    assert len(expected) > 500 and any(not line.raw_ok for line in expected) == (pieces is DIRTY)

    one = Collector()
    a = Follower(p, one, max_line_bytes=120, read_chunk_bytes=chunk)
    batches: list[LineBatch] = []
    b = Follower(p, on_lines=batches.append, max_line_bytes=120, read_chunk_bytes=chunk)
    for f in (a, b):
        f.poll()
        assert f.checkpoint()["offset"] == len(data) - len("last, unterminated")
        assert f.finish() == 1
        assert f.checkpoint()["offset"] == len(data)
    assert one.lines == expected
    assert [line for batch in batches for line in batch] == expected
    assert [t for batch in batches for t in batch.lines] == [line.text for line in expected]
    assert "".join(batch.text for batch in batches) == "".join(f"{l.text}\n" for l in expected)
    assert [o for batch in batches for o in batch.offsets()] == [l.offset for l in expected]
    assert all(batch.raw_ok is None or len(batch.raw_ok) == len(batch) for batch in batches)
    assert batches[0].start == 0 and batches[-1].end == len(data)
    assert all(x.end <= y.start for x, y in zip(batches, batches[1:]))
    counters = ("lines_total", "bytes_total", "long_lines_skipped_total", "callback_errors_total")
    assert [getattr(a, c) for c in counters] == [getattr(b, c) for c in counters]
    assert a.lines_total == len(expected)
    if chunk == 1 << 20:
        assert len(batches) == 2  # the whole file in one read, then the last line


def test_nul_hole_cut_by_reads_keeps_the_checkpoint_exact(tmp_path):
    """A NUL hole longer than a read: the checkpoint after the line is the file's end, so a
    restart from it re-reads nothing."""
    p = tmp_path / "server.log"
    data = b"a\n" + b"\0" * 300 + b"b\n"
    p.write_bytes(data)
    got = Collector()
    f = Follower(p, got, read_chunk_bytes=64)
    f.poll()
    assert got.texts == ["a", "b"] and got.lines[1].offset == 302
    assert f.checkpoint()["offset"] == len(data)
    p.open("ab").write(b"c\n")
    again = Collector()
    Follower(p, again, checkpoint=f.checkpoint()).poll()
    assert again.texts == ["c"]


def test_backlog_read_in_one_poll(tmp_path):
    p = tmp_path / "server.log"
    n = 200_000
    p.write_text("".join(f"{t}\n" for t in numbered(0, n)))
    got = Collector()
    f = Follower(p, got)
    assert f.poll() == n
    assert_exact(got.texts, n)
    assert f.poll() == 0
    assert f.last_line_timestamp is not None


# ---------------------------------------------------------------------------------- errors


def test_errors_are_counted_not_raised_and_retried(tmp_path):
    p = tmp_path / "server.log"
    p.mkdir()  # not a regular file
    got = Collector()
    f = Follower(p, got)
    assert f.poll() == 0 and f.poll() == 0
    assert f.read_errors_total == 2 and not f.is_open
    p.rmdir()
    p.write_text("ok\n")
    assert f.poll() == 1 and got.texts == ["ok"]


PERMISSION_SCENARIO = r"""
import os, sys, tempfile
from specwatch.sources.filestream import Follower
if os.geteuid() == 0:  # root ignores file modes: become nobody (modules are already imported)
    os.setgid(65534)
    os.setuid(65534)
d = tempfile.mkdtemp()
p = os.path.join(d, "server.log")
with open(p, "w") as fh:
    fh.write("ok\n")
os.chmod(p, 0)
got = []
f = Follower(p, got.append)
first = f.poll()
errors = f.read_errors_total
os.chmod(p, 0o644)
second = f.poll()
print(first, errors, second, [line.text for line in got])
os.unlink(p)
os.rmdir(d)
"""


def test_permission_denied_is_counted_and_retried():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", PERMISSION_SCENARIO], capture_output=True,
                       text=True, env=env, timeout=60)
    if r.returncode != 0 and "PermissionError" in r.stderr and "setuid" in r.stderr:
        pytest.skip("cannot drop root privileges here")
    assert r.returncode == 0, r.stderr
    # first poll: 0 lines, 1 error counted; after chmod back: the line arrives
    assert r.stdout.strip() == "0 1 1 ['ok']"


def test_on_line_exception_is_counted_and_following_continues(tmp_path):
    p = tmp_path / "server.log"
    p.write_text("a\nboom\nc\n")
    seen = []

    def on_line(line: LogLine) -> None:
        seen.append(line.text)
        if line.text == "boom":
            raise RuntimeError("consumer bug")

    f = Follower(p, on_line)
    assert f.poll() == 3
    assert seen == ["a", "boom", "c"]
    assert f.callback_errors_total == 1
    assert f.checkpoint()["offset"] == size(p)

    batches = []

    def on_lines(batch: LineBatch) -> None:  # one failure for the batch, which counts as passed on
        batches.append(batch.lines)
        raise RuntimeError("consumer bug")

    f = Follower(p, on_lines=on_lines)
    assert f.poll() == 3
    assert batches == [["a", "boom", "c"]]
    assert f.callback_errors_total == 1
    assert f.checkpoint()["offset"] == size(p)
    with pytest.raises(ValueError):
        Follower(p, on_line, on_lines=on_lines)
    with pytest.raises(ValueError):
        Follower(p)


# ------------------------------------------------------------------------------------ group


def test_group_watchdog_delivers_without_waiting_for_poll_interval(tmp_path, writers):
    p, p1 = tmp_path / "server.log", tmp_path / "server.log.1"
    got = Collector()
    f = Follower(p, got)
    g = FollowerGroup([f], poll_interval=30.0)  # only a watchdog event can deliver within 10 s
    g.start()
    try:
        assert g.watching and g.watch_errors_total == 0
        n = 600
        w = writers(p, n, rate=1000)  # the file is created after start
        wait_for(lambda: len(got) >= 200, 10, what="lines via watchdog")
        os.rename(p, p1)
        w.reopen()
        w.wait()
        wait_for(lambda: len(got) >= n, 10, what="lines after rotation via watchdog")
        assert_exact(got.texts, n)
        assert got.threads == {g.thread.ident}
        with pytest.raises(RuntimeError):
            g.poll_all()  # only the group's thread may poll while it runs
        cps = g.checkpoints()
        assert list(cps) == [str(p)]
        assert cps[str(p)]["inode"] == os.stat(p).st_ino
        assert cps[str(p)]["offset"] == size(p)
    finally:
        assert g.stop(5.0)
    assert not f.is_open and f.rotations_total == 1
    assert g.checkpoints()[str(p)]["offset"] == size(p)  # still valid once stopped


def test_group_without_watchdog_delivers_by_polling(tmp_path, writers):
    p = tmp_path / "server.log"
    got = Collector()
    g = FollowerGroup([Follower(p, got)], poll_interval=0.05, use_watchdog=False)
    g.start()
    try:
        w = writers(p, 400, rate=1000)
        w.wait()
        wait_for(lambda: len(got) >= 400, 10, what="lines via polling")
        assert_exact(got.texts, 400)
        assert not g.watching and g.watch_errors_total == 0
    finally:
        assert g.stop(5.0)


def test_group_falls_back_to_polling_when_directory_cannot_be_watched(tmp_path, writers):
    d = tmp_path / "not-yet"
    p = d / "server.log"
    got = Collector()
    g = FollowerGroup([Follower(p, got)], poll_interval=0.05)
    g.start()
    try:
        assert g.watch_errors_total == 1 and not g.watching
        d.mkdir()
        w = writers(p, 300, rate=1000)
        w.wait()
        wait_for(lambda: len(got) >= 300, 10, what="lines via polling fallback")
        assert_exact(got.texts, 300)
    finally:
        assert g.stop(5.0)


def test_group_clean_stop_logs_no_error_while_files_change(tmp_path, caplog):
    """watchdog's Observer.stop() alone raced with emitters handling an event (ERROR "queue_events()
    called when the thread is inactive" in about half of the stops below); stops are repeated so
    the race has its chances."""
    paths = [tmp_path / f"rank{i}" / "server.log" for i in range(8)]
    for p in paths:
        p.parent.mkdir()
    done = threading.Event()

    def write(p: Path) -> None:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            while not done.is_set():
                os.write(fd, b"Decode batch\n")
                time.sleep(0.0002)
        finally:
            os.close(fd)

    writers = [threading.Thread(target=write, args=(p,)) for p in paths]
    for w in writers:
        w.start()
    caplog.set_level(logging.INFO)
    try:
        for _ in range(15):
            g = FollowerGroup([Follower(p, Collector()) for p in paths], poll_interval=1.0)
            g.start()
            assert g.watching
            time.sleep(0.03)
            assert g.stop(5.0)
    finally:
        done.set()
        for w in writers:
            w.join()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_group_poll_all_without_thread_and_duplicate_paths(tmp_path):
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("a1\na2\n")
    b.write_text("b1\n")
    got = Collector()
    g = FollowerGroup([Follower(a, got), Follower(b, got)])
    with pytest.raises(ValueError):
        g.add(Follower(a, got))
    assert g.poll_all() == 3
    assert sorted(got.texts) == ["a1", "a2", "b1"]
    assert {k: v["offset"] for k, v in g.checkpoints().items()} == {str(a): 6, str(b): 3}


def test_group_updating_until_the_added_follower_was_polled(tmp_path):
    """The daemon resumes notifications only when no follower catches up and no update is queued
    (a reload's added log, read from its first line, is history): `updating` stays True from
    update() until a round has polled the added follower, also when the update comes in the middle
    of a round (here: while the thread is held in its after-poll hook)."""
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("a1\n")
    b.write_text("b1\nb2\n")
    got = Collector()
    in_hook, release = threading.Event(), threading.Event()
    seen = []  # (updating, lines of b delivered) at each after-poll

    def after_poll():
        in_hook.set()
        release.wait(10)
        seen.append((g.updating, sum(t.startswith("b") for t in got.texts)))

    g = FollowerGroup([Follower(a, got)], poll_interval=0.05, use_watchdog=False, after_poll=after_poll)
    g.start()
    try:
        assert in_hook.wait(10)  # the thread is inside a round's after-poll hook
        g.update(add=[Follower(b, got)])
        assert g.updating
        release.set()
        deadline = time.monotonic() + 10
        while not any(not u and n == 2 for u, n in seen) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not g.updating
        # never "not updating" while b was not read yet: the daemon could not have resumed early
        assert all(u or n == 2 for u, n in seen[1:]), seen
        assert seen[0] == (True, 0)  # the hook during which the update came
    finally:
        release.set()
        g.stop()


def test_inotify_loop_survives_a_failing_due_hook(tmp_path, caplog):
    """An exception in the inotify wait step (here the `due` hook, which takes the pipeline lock)
    is logged and counted; the thread goes on reading (it ended, and every log with it)."""
    p = tmp_path / "a.log"
    p.write_text("")
    got = Collector()
    calls = []

    def due():
        calls.append(1)
        if len(calls) <= 2:
            raise RuntimeError("boom")
        return None

    g = FollowerGroup([Follower(p, got)], poll_interval=0.1, use_watchdog=False, inotify=True, due=due)
    with caplog.at_level(logging.ERROR, logger="specwatch.sources.follow"):
        g.start()
        try:
            with open(p, "a") as f:
                f.write("x1\nx2\n")
            deadline = time.monotonic() + 10
            while len(got) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert got.texts == ["x1", "x2"]
            assert g.poll_errors_total >= 1 and "waiting on inotify failed" in caplog.text
        finally:
            g.stop()


# ---------------------------------------------------------------------------- state helpers


def test_write_json_atomic_and_read_json(tmp_path):
    state = tmp_path / "state.json"
    assert read_json(state, {"empty": True}) == {"empty": True}
    write_json_atomic(state, {"a": 1})
    write_json_atomic(state, {"b": [1, 2]})
    assert read_json(state, None) == {"b": [1, 2]}
    with pytest.raises(TypeError):
        write_json_atomic(state, {"bad": object()})
    assert read_json(state, None) == {"b": [1, 2]}  # old content kept
    assert sorted(x.name for x in tmp_path.iterdir()) == ["state.json"]  # no temp files left
    state.write_text("{not json")
    assert read_json(state, "default") == "default"


def test_checkpoint_of_another_path_is_ignored(tmp_path):
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("x1\nx2\n")
    os.link(a, b)  # same inode and content: only the path says the position is not b's
    fa = Follower(a, Collector())
    fa.poll()
    got = Collector()
    Follower(b, got, checkpoint=fa.checkpoint()).poll()
    assert got.texts == ["x1", "x2"]


def test_nul_hole_from_non_append_writer_after_copytruncate(tmp_path):
    """`launch_server > server.log` + logrotate copytruncate: the writer's fd offset stays past the
    new end, so the file restarts with a hole of NULs before the next line; that line is real."""
    path = tmp_path / "server.log"
    got: list[str] = []
    f = Follower(str(path), lambda l: got.append(l.text), max_line_bytes=1024)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)  # no O_APPEND
    os.write(fd, b"".join(b"line %04d\n" % i for i in range(300)))  # 3000 bytes > max_line_bytes
    f.poll()
    os.truncate(path, 0)  # the truncate half of copytruncate
    os.write(fd, b"line 0300\n")  # lands at offset 3000: 3000 NULs, then the line
    os.close(fd)
    f.poll()
    assert got == [f"line {i:04d}" for i in range(301)]
    assert f.long_lines_skipped_total == 0


def test_group_inotify_reads_a_change_at_once_and_a_busy_file_once_per_interval(tmp_path, writers):
    """inotify on the group's own thread (no watchdog observer threads): the first line after a
    quiet spell arrives long before the 30 s poll interval."""
    p, p1 = tmp_path / "server.log", tmp_path / "server.log.1"
    got = Collector()
    g = FollowerGroup([Follower(p, got)], poll_interval=30.0, use_watchdog=False, inotify=True)
    threads = threading.active_count()
    g.start()
    try:
        assert g.watching and g.watch_errors_total == 0
        assert threading.active_count() == threads + 1  # the group's thread only
        time.sleep(0.2)
        with open(p, "a") as f:  # the file is created after start
            f.write("one\n")
        wait_for(lambda: len(got) >= 1, 10, what="a line via inotify")
        assert got.texts == ["one"]
        os.rename(p, p1)
        with open(p, "a") as f:
            f.write("two\n")
        time.sleep(1.0)
        assert got.texts == ["one"]  # a round read a line: the next waits for the poll interval...
        # ...but the new file was opened at once: renamed over its predecessor's copy and
        # removed, its line is still read
        os.rename(p, p1)
        os.unlink(p1)
        g.wake()  # ...unless asked
        wait_for(lambda: len(got) >= 2, 10, what="a line of the new file")
        assert got.texts == ["one", "two"]
        assert got.threads == {g.thread.ident}
    finally:
        assert g.stop(5.0)
    assert not g.watching


def test_group_inotify_spaces_reads_of_a_busy_file(tmp_path):
    p = tmp_path / "server.log"
    got = Collector()
    rounds = []
    g = FollowerGroup([Follower(p, got)], poll_interval=0.3, use_watchdog=False, inotify=True,
                      after_poll=lambda: rounds.append((time.monotonic(), len(got))))
    g.start()
    try:
        with open(p, "a", buffering=1) as f:
            for i in range(60):  # 40 lines a second for 1.5 s
                f.write(f"l{i}\n")
                time.sleep(0.025)
        wait_for(lambda: len(got) >= 60, 10, what="every line")
        assert got.texts == [f"l{i}" for i in range(60)]
        # rounds that read lines (the file's creation may get a round of its own, at once)
        reads = [t for (t, n), (_, before) in zip(rounds, [(0.0, 0)] + rounds) if n > before]
        gaps = [b - a for a, b in zip(reads, reads[1:])]
        assert len(reads) <= 10 and min(gaps) >= 0.25, gaps  # not one round per line
    finally:
        assert g.stop(5.0)


def test_group_inotify_wakes_when_the_hook_has_work_due(tmp_path):
    """A busy log is read once per poll interval; a notification due between two reads (its
    group_wait ends) gets a round of its own at that time (`due`), not at the next read."""
    p = tmp_path / "server.log"
    p.write_text("")
    rounds = []
    deadline = [None]
    g = FollowerGroup([Follower(p, Collector())], poll_interval=30.0, use_watchdog=False, inotify=True,
                      after_poll=lambda: rounds.append(time.monotonic()), due=lambda: deadline[0])
    g.start()
    try:
        time.sleep(0.3)
        assert rounds == []  # nothing changed, nothing due
        t0 = time.monotonic()
        deadline[0] = t0 + 0.4
        g.wake()  # the hook's work appeared (the daemon: an alert raised during a round)
        wait_for(lambda: len(rounds) >= 2, 5, what="a round at the due time")
        deadline[0] = None
        assert rounds[1] - t0 == pytest.approx(0.4, abs=0.15)
    finally:
        assert g.stop(5.0)


def test_a_stop_ends_a_long_read_after_its_chunk(tmp_path):
    """A follower whose group is stopping (`stopping` set) ends a backlog read after the chunk in
    hand, its checkpoint after the lines passed on; the next poll reads on from there, every line
    once (a daemon told to stop does not read gigabytes first)."""
    import threading

    log = tmp_path / "big.log"
    log.write_text("".join(f"line {i:07d}\n" for i in range(200_000)))  # 2.6 MB
    got = []
    f = Follower(str(log), on_lines=lambda b: got.extend(b.lines), read_chunk_bytes=1 << 16)
    f.stopping = threading.Event()
    f.stopping.set()
    f.poll()
    first = len(got)
    assert 0 < first < 20_000 and f.checkpoint()["offset"] == 13 * first  # a chunk or two of 64 KiB
    f.stopping.clear()
    f.poll()
    assert got == [f"line {i:07d}" for i in range(200_000)]
    f.close()


def test_group_inotify_reads_a_busy_file_at_its_cadence(tmp_path):
    """With `cadence`, a round that read lines is followed by the next `cadence()` seconds later,
    however often the file changes meanwhile (one round per 2 s of a file written 40 times a
    second), its lines in order; a shorter cadence (after a line that may start a collapse,
    sources/cadence.py) reads each line within it."""
    p = tmp_path / "server.log"
    got = Collector()
    rounds = []
    wait = [2.0]
    g = FollowerGroup([Follower(p, got)], poll_interval=0.25, use_watchdog=False, inotify=True,
                      after_poll=lambda: rounds.append((time.monotonic(), len(got))), cadence=lambda: wait[0])

    def reads() -> list[float]:
        return [t for (t, n), (_, before) in zip(rounds, [(0.0, 0)] + rounds) if n > before]

    g.start()
    try:
        mark_at = mark_read = None
        with open(p, "a", buffering=1) as f:
            start = time.monotonic()
            for i in range(200):  # 40 lines a second for 5 s
                if i == 80:
                    # the first 2 s: the creation's round, the first line's, then one per 2 s
                    # (not one per 0.25 s); +1: a writer stalled a whole interval
                    assert len(reads()) <= 3 + (time.monotonic() - start) / 2.0, reads()
                    wait[0] = 0.1
                if i == 180:  # the 2 s wait under way at the switch has ended by now
                    f.write("MARK\n")
                    mark_at = time.monotonic()
                if mark_at is not None and mark_read is None and "MARK" in got.texts:
                    mark_read = time.monotonic()
                f.write(f"l{i}\n")
                time.sleep(0.025)
        wait_for(lambda: len(got) >= 201, 10, what="every line")
        assert got.texts == [f"l{i}" for i in range(180)] + ["MARK"] + [f"l{i}" for i in range(180, 200)]
        assert mark_read is not None and mark_read - mark_at < 1.0  # not the 2 s cadence
        assert len([t for t in reads() if t > mark_at - 0.5]) >= 3  # a round every 0.1 s, not every 2
    finally:
        assert g.stop(5.0)


# ------------------------------------------------------------------------- rotation storms


class SlowConsumer:
    """An `on_lines` consumer that takes `per_line` seconds a line, as the daemon's pipeline
    does: a catch-up over several rotated copies takes long enough for the writer to rename
    them again meanwhile."""

    def __init__(self, per_line: float = 25e-6) -> None:
        self.texts: list[str] = []
        self.per_line = per_line

    def __call__(self, batch: LineBatch) -> None:
        self.texts.extend(batch.lines)
        time.sleep(len(batch) * self.per_line)


def storm_read(tmp_path: Path, f: Follower, got: SlowConsumer, run, **writer) -> tuple[int, int]:
    """Start `run` (the reader), a RotatingWriter with `writer`, wait for the writer and every
    line (then a second more: a line read twice shows up too); (written, rotations)."""
    w = RotatingWriter(f.path, **writer)
    try:
        stop = run()
        written, rotations = w.wait(60)
        deadline = time.monotonic() + 20
        while len(got.texts) < written and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        stop()
    finally:
        w.kill()
    return written, rotations


def assert_storm(texts: list[str], written: int, f: Follower) -> None:
    lost, dup, ordered = tally(texts, written)
    assert (lost, dup, ordered) == (0, 0, True), (
        f"{written} written, {len(texts)} read: {lost} lost, {dup} read twice, in order {ordered};"
        f" rotated_files_lost_total {f.rotated_files_lost_total}")
    assert f.rotated_files_lost_total == 0


def test_rotation_storm_a_slow_reader_finds_every_copy_by_identity(tmp_path):
    """A rename every 0.2 s at 4,000 lines/s (`.N` → `.N+1`, log → `.1`, every copy kept) and a
    reader polled once a second with a consumer of the daemon's speed: five copies or more pile
    up between two polls and are renamed again while they are read; each is found by its inode,
    read once, in order."""
    p = tmp_path / "server.log"
    p.touch()
    got = SlowConsumer()
    f = Follower(p, on_lines=got)
    g = FollowerGroup([f], poll_interval=1.0, use_watchdog=False)

    def run():
        g.start()
        return g.stop

    written, rotations = storm_read(tmp_path, f, got, run, mode="numbered", rate=4000, seconds=3.0,
                                    every=0.2)
    assert rotations >= 10
    assert_storm(got.texts, written, f)
    assert f.rotations_total == rotations


@pytest.mark.parametrize("mode,keep", [("mv", 0), ("numbered", 2)])
def test_rotation_storm_at_the_daemons_cadence_opens_each_file_before_it_is_gone(
        tmp_path, mode, keep):
    """The reader set up as `specwatch run` sets it up (inotify, a busy log read at its slowest
    cadence, READ_SPAN intervals of 0.75 s) and a writer that replaces its `.1` on each rename
    (`mv log log.1`) or keeps two copies: every file is opened as it appears, so the copies
    removed meanwhile are read from their open descriptor: nothing lost, nothing twice."""
    p = tmp_path / "server.log"
    p.touch()
    got = SlowConsumer()
    f = Follower(p, on_lines=got)
    g = FollowerGroup([f], poll_interval=0.75, use_watchdog=False, inotify=True,
                      cadence=lambda: READ_SPAN * 0.75)

    def run():
        g.start()
        return g.stop

    written, rotations = storm_read(tmp_path, f, got, run, mode=mode, keep=keep, rate=4000,
                                    seconds=3.0, every=0.2)
    assert rotations >= 10
    assert_storm(got.texts, written, f)


def test_a_listed_copy_renamed_since_is_opened_by_its_inode(tmp_path):
    """`.2` and `.1` listed, then one more rotation (`.2` → `.3`, `.1` → `.2`, a new `.1`): each
    listed copy still opens as itself; one removed since is FileNotFoundError, not its neighbour."""
    p = tmp_path / "server.log"
    Path(f"{p}.2").write_text("old\n")
    Path(f"{p}.1").write_text("mid\n")
    listed = rotated_files(str(p))
    assert [Path(f.path).name for f in listed] == ["server.log.2", "server.log.1"]
    os.rename(f"{p}.2", f"{p}.3")
    os.rename(f"{p}.1", f"{p}.2")
    Path(f"{p}.1").write_text("new\n")
    assert [f.open().read() for f in listed] == [b"old\n", b"mid\n"]
    os.unlink(f"{p}.3")
    with pytest.raises(FileNotFoundError):
        listed[0].open()
    listed[1].hold()  # held open: a removal no longer matters
    os.unlink(f"{p}.2")
    with listed[1].open() as fh:
        assert fh.read() == b"mid\n"
    listed[1].release()
