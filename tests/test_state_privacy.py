"""What the daemon keeps is its own: no receiver password in /metrics, its log or state.db; the
state folder 0700 and every file in it 0600 (a real daemon, real files, real /metrics text)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path

from procs import decode_line, free_port, wait_for
from specwatch.system.storage import StateStore
from specwatch_daemon import SpecwatchDaemon, read_state

PASSWORD = "hunter2-pw-0b5cure"


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def modes(d: Path) -> dict[str, int]:
    return {p.name: mode(p) for p in sorted(d.iterdir())}


def collapse(log: Path) -> None:
    with open(log, "a") as f:
        for i in range(3):
            f.write(decode_line(1.02, f"16:32:3{i}"))


def test_an_alertmanager_password_is_shown_nowhere_and_the_state_is_private(tmp_path):
    port = free_port()  # bound, not listening: every push is refused and stays queued
    log = tmp_path / "server.log"
    log.write_text("")
    d = SpecwatchDaemon(tmp_path, log, alerts={"alertmanager": {"urls": [f"http://specwatch:{PASSWORD}@127.0.0.1:{port}"]}},
                        extra={"diagnosis": {"enabled": False}})
    d.start()
    name = f"alertmanager/127.0.0.1:{port}"
    collapse(log)
    queued = wait_for(lambda: [k for k in read_state(d.state)[1] if k.startswith("alertmanager/")], timeout=20,
                      what="the snapshot queued in state.db")
    assert queued == [name]
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{d.port}/metrics", timeout=5).read().decode()
    assert f'specwatch_notification_queue_depth{{notifier="{name}"}} 1.0' in metrics
    assert mode(d.state) == 0o700
    files = modes(d.state)
    assert {"state.db", "state.db-wal", "state.db-shm", "specwatch.lock"} <= set(files)
    assert set(files.values()) == {0o600}, files
    rc, out = d.stop()
    assert rc == 0, out
    assert f"notifiers: {name}" in out
    for text in [metrics, out] + [p.read_bytes().decode("latin-1") for p in d.state.iterdir()]:
        assert PASSWORD not in text and "specwatch:hunter2" not in text


def test_an_existing_loose_state_dir_is_warned_about_and_old_files_tightened(tmp_path):
    """A state_dir of an earlier version: 0755 with a 0644 state.db holding a snapshot queued under
    the old notifier name (the netloc with its password)."""
    port = free_port()
    url = f"http://specwatch:{PASSWORD}@127.0.0.1:{port}"
    log = tmp_path / "server.log"
    log.write_text("")
    d = SpecwatchDaemon(tmp_path, log, alerts={"alertmanager": {"urls": [url]}}, extra={"diagnosis": {"enabled": False}})
    d.state.mkdir(mode=0o755)
    os.chmod(d.state, 0o755)
    old = StateStore(d.state)
    assert old.commit(None, [(f"alertmanager/specwatch:{PASSWORD}@127.0.0.1:{port}", 1, "alerts", '{"alerts": []}')], [])
    old.close()
    os.chmod(d.state / "state.db", 0o644)
    d.start()
    wait_for(lambda: "state_dir" in d.output and "mode 0755" in d.output, what="the warning")
    assert mode(d.state / "state.db") == 0o600 and mode(d.state) == 0o755  # the owner's folder is not changed
    rc, out = d.stop()
    assert rc == 0, out
    assert f"state_dir {d.state} is mode 0755: other users can list it" in out
    assert list(read_state(d.state)[1]) == [f"alertmanager/127.0.0.1:{port}"]  # the queued snapshot moved
    assert all(PASSWORD.encode() not in p.read_bytes() for p in d.state.iterdir() if p.is_file())


def test_silence_files_are_private(tmp_path):
    state = tmp_path / "state"
    r = subprocess.run([sys.executable, "-m", "specwatch", "silence", "add", "--state-dir", str(state), "--match",
                        "alertname=AcceptanceCollapse", "--for", "1h", "--comment", "draft swap"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert mode(state) == 0o700 and set(modes(state).values()) == {0o600}, modes(state)
