"""`specwatch run` as real subprocesses: one daemon per state_dir, alert transitions in the log,
alert metrics across restarts (issue #10 items 10, 11, 12)."""

from __future__ import annotations

import subprocess
import sys
import time

import yaml

from procs import free_port, wait_for
from specwatch_daemon import SpecwatchDaemon


def test_second_daemon_on_one_state_dir_exits_1_naming_the_holder(tmp_path):
    log = tmp_path / "sglang.log"
    log.write_text("")
    first = SpecwatchDaemon(tmp_path, log).start()  # /metrics answers: its state_dir is locked
    doc = yaml.safe_load(first.cfg.read_text())
    doc["metrics"]["listen_port"] = free_port()  # only the state_dir is shared
    second_cfg = tmp_path / "second.yaml"
    second_cfg.write_text(yaml.safe_dump(doc))
    r = subprocess.run([sys.executable, "-m", "specwatch", "run", "--config", str(second_cfg)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, r.stderr
    assert f"state directory {first.state} is in use by pid {first.proc.pid}" in r.stderr
    assert "Traceback" not in r.stderr
    assert first.proc.poll() is None  # the first one runs on
    assert (first.state / "specwatch.lock").read_text() == f"{first.proc.pid}\n"

    # kill -9 leaves the file but not the lock: the next daemon starts
    first.proc.kill()
    first.proc.wait()
    again = subprocess.Popen([sys.executable, "-m", "specwatch", "run", "--config", str(second_cfg)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: (first.state / "specwatch.lock").read_text() == f"{again.pid}\n" or again.poll() is not None,
                 what="the restarted daemon's lock")
        assert again.poll() is None
    finally:
        again.terminate()
        assert again.wait(20) == 0
