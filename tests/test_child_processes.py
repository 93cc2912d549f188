"""Processes the tests start die with the test run, and a killed daemon's journalctl dies with
it: a killed or timed-out run leaves no `specwatch run` or `journalctl` behind (parent pid 1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from journal_files import JournalDir
from procs import popen, wait_for
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


def test_a_killed_test_run_takes_its_daemon_with_it(tmp_path):
    starter = popen([sys.executable, "-c", STARTER, str(TESTS), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        daemon = int(starter.stdout.readline())
        assert psutil.Process(daemon).cmdline()[1:4] == ["-m", "specwatch", "run"]
        starter.send_signal(signal.SIGKILL)  # as a CI timeout kills a run: no cleanup code runs
        starter.wait(10)
        wait_for(lambda: gone(daemon), timeout=5, what="the daemon to die with its starter")
    finally:
        starter.kill()
        starter.wait()
        if "daemon" in locals() and not gone(daemon):
            os.kill(daemon, signal.SIGKILL)


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
    try:
        journalctl = int(daemon.stdout.readline())
        assert psutil.Process(journalctl).ppid() == daemon.pid
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(10)
        wait_for(lambda: gone(journalctl), timeout=5, what="journalctl to end with the daemon")
    finally:
        daemon.kill()
        daemon.wait()
        if "journalctl" in locals() and not gone(journalctl):
            os.kill(journalctl, signal.SIGKILL)


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
