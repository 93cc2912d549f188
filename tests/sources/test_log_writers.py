"""sources/log_writers.py against real processes and files: which followed log a process writes,
by inode (a symlinked or relative `logs[].path` still matches), through its fd 1/2, another fd
it holds, or the `tee` reading its pipe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from procs import popen, wait_for  # noqa: E402

from specwatch.sources.log_writers import LogFiles, written_log  # noqa: E402

SLEEP = "import sys, time; sys.stdout.write('x'); sys.stdout.flush(); time.sleep(60)"


def _holds(pid: int, path: Path) -> bool:
    return any(os.path.realpath(f"/proc/{pid}/fd/{fd}") == str(path) for fd in os.listdir(f"/proc/{pid}/fd"))


def test_stdout_into_the_file_behind_a_symlinked_path(tmp_path):
    real, link = tmp_path / "real.log", tmp_path / "server.log"
    real.touch()
    link.symlink_to(real)
    with open(real, "a") as out:
        p = popen([sys.executable, "-c", SLEEP], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: real.stat().st_size > 0, what="the process's first write")
        assert written_log([p.pid], p.pid, (os.readlink(f"/proc/{p.pid}/fd/1"),), LogFiles([str(link)]), []) \
            == (str(link), "stdout")
        assert written_log([p.pid], p.pid, (), LogFiles([str(tmp_path / "other.log")]), []) is None
    finally:
        p.kill()
        p.wait()


def test_a_file_it_holds_open_and_a_glob(tmp_path):
    log = tmp_path / "server.log"
    p = popen([sys.executable, "-c", f"f = open({str(log)!r}, 'a'); " + SLEEP], stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: log.exists() and _holds(p.pid, log), what="the file opened")
        assert written_log([p.pid], p.pid, ("/dev/null",), LogFiles([str(log)]), []) == (str(log), "open")
        assert written_log([p.pid], p.pid, (), LogFiles([str(tmp_path / "*.log")]), []) \
            == (str(tmp_path / "*.log"), "open")
    finally:
        p.kill()
        p.wait()


def test_the_tee_that_reads_its_pipe(tmp_path):
    log = tmp_path / "server.log"
    sh = popen(["sh", "-c", f"{sys.executable} -c \"{SLEEP}\" 2>&1 | tee -a {log}"], stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: log.exists() and log.stat().st_size > 0, what="tee writing")
        kids = {int(x) for x in open(f"/proc/{sh.pid}/task/{sh.pid}/children").read().split()}
        [server] = [k for k in kids if os.readlink(f"/proc/{k}/fd/1").startswith("pipe:[")]
        outputs = (os.readlink(f"/proc/{server}/fd/1"),)
        assert written_log([server], server, outputs, LogFiles([str(log)]), sorted(kids)) == (str(log), "pipe")
        assert written_log([server], server, outputs, LogFiles([str(log)]), []) is None  # tee not among them
    finally:
        for k in open(f"/proc/{sh.pid}/task/{sh.pid}/children").read().split():
            os.kill(int(k), 9)  # the sleeper and tee; the shell then exits
        sh.wait()
