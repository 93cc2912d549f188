"""Processes the tests start die with the test run, and a killed daemon's journalctl dies with
it: a killed or timed-out run leaves no `specwatch run` or `journalctl` behind (parent pid 1)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil

from journal_files import JournalDir
import procs
from procs import popen, wait_for
from specwatch.system.childproc import die_with_parent
from specwatch_daemon import SpecwatchDaemon

TESTS = Path(__file__).resolve().parent

# A stand-in for a pytest run: starts a real daemon the way the tests do, says its pid, waits.
STARTER = """
import sys, time
from pathlib import Path
sys.path[:0] = [sys.argv[1], str(Path(sys.argv[1]).parent)]
from specwatch_daemon import SpecwatchDaemon
tmp = Path(sys.argv[2])
d = SpecwatchDaemon(tmp, tmp / "server.log").start()
print(d.proc.pid, flush=True)
time.sleep(300)
"""


def gone(pid: int) -> bool:
    """No such process, or only its exit status is left (a zombie waiting for pid 1)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def assert_dies_with(parent: subprocess.Popen, check, what: str) -> None:
    """`parent` prints its child's pid; `check(pid)` looks at the child; then `parent` is
    SIGKILLed (no cleanup code runs, as when a CI timeout or the OOM killer ends it) and the child
    must end within 5 s. Both are killed whatever happens."""
    child = None
    try:
        child = int(parent.stdout.readline())
        check(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        wait_for(lambda: gone(child), timeout=5, what=what)
    finally:
        parent.kill()
        parent.wait()
        if child is not None and not gone(child):
            os.kill(child, signal.SIGKILL)


def test_a_killed_test_run_takes_its_daemon_with_it(tmp_path):
    starter = popen([sys.executable, "-c", STARTER, str(TESTS), str(tmp_path)], stdout=subprocess.PIPE, text=True)

    def is_daemon(pid):
        assert psutil.Process(pid).cmdline()[1:4] == ["-m", "specwatch", "run"]

    assert_dies_with(starter, is_daemon, "the daemon to die with its starter")


# A daemon's journal source, its process killed: the follower starts `journalctl` (argv[1]) and
# says its pid. The stand-in journalctl waits without watching its stdout, as a journalctl
# blocked between entries may: only the parent-death signal can end it.
FOLLOWER = """
import sys, time
from specwatch.config import JournalConfig
from specwatch.sources.journal import JournalFollower
f = JournalFollower(JournalConfig(unit="sglang.service"), lambda batch: None, journalctl=sys.argv[1])
f.poll()
print(f._proc.pid, flush=True)
time.sleep(300)
"""


def test_a_killed_daemon_leaves_no_journalctl_even_one_that_ignores_the_closed_pipe(tmp_path):
    stub = tmp_path / "journalctl"
    stub.write_text("#!/bin/sh\nexec sleep 300\n")
    stub.chmod(0o755)
    daemon = popen([sys.executable, "-c", FOLLOWER, str(stub)], stdout=subprocess.PIPE, text=True, cwd=TESTS.parent)

    def is_child(pid):
        assert psutil.Process(pid).ppid() == daemon.pid

    assert_dies_with(daemon, is_child, "journalctl to end with the daemon")


def test_a_killed_daemon_leaves_no_journalctl(tmp_path):
    jdir = JournalDir(tmp_path / "journal")
    d = SpecwatchDaemon(tmp_path, tmp_path / "unused.log", extra={
        "logs": [{"journal": {"unit": "sglang.service", "directory": str(jdir.path)}, "server": "gpu-box-1"}]})
    d.start()
    try:
        [journalctl] = wait_for(lambda: [c for c in psutil.Process(d.proc.pid).children()
                                         if c.name() == "journalctl"], what="the daemon's journalctl")
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(10)
        wait_for(lambda: gone(journalctl.pid), timeout=5, what="journalctl to end with the daemon")
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()
        if "journalctl" in locals() and not gone(journalctl.pid):
            os.kill(journalctl.pid, signal.SIGKILL)


def test_die_with_parent_execs_the_command_and_it_ends_with_the_thread_that_started_it():
    """No `preexec_fn` (unsafe with threads) and no setpriv (its capset is refused under the
    unit's system-call filter): this interpreter sets the signal and execs the command, so the
    pid is the command's, and it gets the signal when the starting thread ends."""
    argv = die_with_parent(["sleep", "60"], signal.SIGTERM)
    assert argv[:4] == [sys.executable, "-I", "-S", "-c"]
    assert argv[5:] == [str(int(signal.SIGTERM)), str(os.getpid()), "sleep", "60"]
    assert "setpriv" not in " ".join(argv)
    started: list[subprocess.Popen] = []

    def starter() -> None:  # lives until the signal is set and `sleep` exec'd
        started.append(subprocess.Popen(argv))
        wait_for(lambda: psutil.Process(started[0].pid).cmdline()[:1] == ["sleep"], what="the exec of sleep")

    t = threading.Thread(target=starter)
    t.start()
    t.join()
    child = started[0]
    try:
        assert child.wait(10) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()


def test_popen_returns_once_the_command_itself_runs():
    """A process scan right after `procs.popen` sees the command, never the wrapper that execs
    it: a scan that read the wrapper's command line took this test interpreter for the server's
    (an exec's command line reads empty until the kernel sets it, after Popen returned)."""
    for _ in range(100):
        p = popen(["/bin/sleep", "30"])
        try:
            with open(f"/proc/{p.pid}/cmdline", "rb") as f:
                assert f.read().split(b"\0")[:-1] == [b"/bin/sleep", b"30"]
        finally:
            p.kill()
            p.wait()


def test_a_command_that_cannot_run_exits_127_and_says_so():
    r = subprocess.run(die_with_parent(["/nonexistent/journalctl", "-f"]), capture_output=True, text=True, timeout=30)
    assert r.returncode == 127 and r.stderr == "cannot run /nonexistent/journalctl: No such file or directory\n", r


def test_a_child_whose_parent_is_already_gone_does_not_run(tmp_path):
    """The parent pid given is not the child's parent (as when the parent died before the signal
    was set): the child ends at once instead of running unowned."""
    marker = tmp_path / "ran"
    argv = die_with_parent(["touch", str(marker)], signal.SIGTERM)
    argv[6] = "1"  # the parent pid it checks
    r = subprocess.run(argv, timeout=30)
    assert r.returncode == 128 + signal.SIGTERM and not marker.exists()


# The follower's journalctl is its child, and `close()` (the daemon's stop) ends it (PATH holds only
# the stand-in journalctl).
PLAIN = """
import os, sys
import psutil
from specwatch.config import JournalConfig
from specwatch.sources.journal import JournalFollower
f = JournalFollower(JournalConfig(unit="sglang.service"), lambda batch: None)
f.poll()
p = psutil.Process(f._proc.pid)
print(p.ppid() == os.getpid(), flush=True)
f.close()
print(p.is_running() and p.status() != psutil.STATUS_ZOMBIE, flush=True)
"""


def test_journalctl_is_a_child_of_the_follower_that_stop_ends(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "journalctl"
    stub.write_text(f"#!/bin/sh\nexec {shutil.which('sleep')} 300\n")
    stub.chmod(0o755)
    r = procs.run([sys.executable, "-c", PLAIN], capture_output=True, text=True, cwd=TESTS.parent, timeout=30,
                  env={**os.environ, "PATH": str(bin_dir)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["True", "False"], r.stdout  # a child of the follower; gone after close()
