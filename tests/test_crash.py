"""kill -9 and a full state_dir (issue #10 items 18, 19): real `specwatch run` processes, a real
writer appending lines, a real Slack endpoint, a real tmpfs."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import threading
import time

import pytest

from procs import decode_line, wait_for
from specwatch_daemon import SpecwatchDaemon, read_state

SERVER = (("server", "gpu-box-1"),)
FAST = {"group_wait": "0s", "group_interval": "0s"}


def delivered(slack) -> list[str]:
    """`FIRING`/`RESOLVED` of every message Slack accepted, in order."""
    return [b["text"].split("]")[0].lstrip("[") for b, ok in zip(slack.received, slack.answered_ok) if ok]


def lines_counted(d) -> int:
    m = d.scrape()
    return int(sum(v for (name, labels), v in m.items() if name == "specwatch_log_lines_total"))


def kill9(d) -> None:
    d.proc.kill()
    d.proc.wait()


def append(log, text: str) -> None:
    with open(log, "a") as f:
        f.write(text)


@pytest.mark.parametrize("recovered_while_down", [True, False])
def test_kill9_after_firing_then_restart(tmp_path, slack, recovered_while_down):
    """The smallest reproduction of item 18: FIRING arrives, kill -9, (3 healthy lines), restart:
    the RESOLVED comes, and without the healthy lines no second FIRING."""
    log = tmp_path / "sglang.log"
    log.write_text("")
    d = SpecwatchDaemon(tmp_path, log, alerts={**FAST, "slack": {"webhook_url": slack.url}}).start()
    append(log, "".join(decode_line(1.01, f"16:32:4{i}", running=50) for i in range(3)))
    wait_for(lambda: delivered(slack) == ["FIRING"], what="the FIRING message")
    # past the POST in flight (the one duplicate the store allows): its outbox row is deleted
    wait_for(lambda: d.saved()[1] == {}, what="the delivered FIRING out of the outbox")
    kill9(d)
    if recovered_while_down:
        append(log, "".join(decode_line(2.50, f"16:33:0{i}", running=50) for i in range(3)))
    d.start()
    if recovered_while_down:
        wait_for(lambda: delivered(slack) == ["FIRING", "RESOLVED"], what="the RESOLVED message after restart")
    time.sleep(1.5)  # a dispatcher tick or two: nothing more is sent
    assert delivered(slack) == (["FIRING", "RESOLVED"] if recovered_while_down else ["FIRING"])
    assert lines_counted(d) == (6 if recovered_while_down else 3)
    rc, out = d.stop()
    assert rc == 0, out


def test_an_episode_while_down_is_notified_but_not_one_of_a_first_start(tmp_path, slack):
    """A whole episode (collapse and recovery) written while specwatch was stopped lies after the
    saved offset: news, both messages go out. The same lines read on a first start (no saved
    offset: the log's history) notify nothing."""
    episode = "".join(decode_line(1.01, f"16:33:0{i}", running=50) for i in range(3)) + \
        "".join(decode_line(2.50, f"16:33:1{i}", running=50) for i in range(3))
    log = tmp_path / "sglang.log"
    log.write_text("".join(decode_line(2.50, f"16:32:0{i}", running=50) for i in range(3)))
    d = SpecwatchDaemon(tmp_path, log, alerts={**FAST, "slack": {"webhook_url": slack.url}}).start()
    wait_for(lambda: lines_counted(d) == 3, what="3 lines counted")
    rc, out = d.stop()
    assert rc == 0, out
    append(log, episode)
    d.start()
    wait_for(lambda: delivered(slack) == ["FIRING", "RESOLVED"], what="the episode written while down")
    rc, out = d.stop()
    assert rc == 0, out

    first = tmp_path / "first"
    first.mkdir()
    log2 = first / "sglang.log"
    log2.write_text(episode)
    d2 = SpecwatchDaemon(first, log2, alerts={**FAST, "slack": {"webhook_url": slack.url}}).start()
    wait_for(lambda: lines_counted(d2) == 6, what="the backlog read")
    time.sleep(1.5)  # a dispatcher tick or two
    assert delivered(slack) == ["FIRING", "RESOLVED"]  # nothing more
    rc, out = d2.stop()
    assert rc == 0, out


class Writer(threading.Thread):
    """Appends decode lines at about `rate` lines/s, in phases of `phase` seconds that alternate
    collapsed (accept len 1.01) and healthy (2.50) acceptance, starting collapsed. `states`: the
    acceptance of each phase that got lines, in order (a loaded machine can starve the thread
    through a whole phase: then that phase has no line and makes no transition)."""

    def __init__(self, log, rate: int = 4000, phase: float = 2.0):
        super().__init__(daemon=True)
        self.log, self.rate, self.phase = log, rate, phase
        self.written = 0
        self.phases = 0
        self.states: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        with open(self.log, "a") as f:
            while not self.stop.is_set():
                t = time.monotonic() - start
                self.phases = int(t // self.phase) + 1
                accept = 1.01 if self.phases % 2 else 2.50
                ts = time.strftime("%H:%M:%S", time.gmtime(1700000000 + t))
                chunk = [decode_line(accept, ts, running=50)] * (self.rate // 20)
                f.write("".join(chunk))
                f.flush()
                self.written += len(chunk)
                state = "FIRING" if self.phases % 2 else "RESOLVED"
                if not self.states or self.states[-1] != state:
                    self.states.append(state)
                time.sleep(0.05)


def test_kill9_at_random_points_counts_every_line_once_and_loses_no_alert(tmp_path, slack):
    """Item 18: three kill -9 at random moments while 4,000 lines/s flow. After the last restart
    specwatch_log_lines_total equals the lines written (none counted twice or lost) and Slack got
    every FIRING/RESOLVED in order; a repeat only for a POST in flight at a kill."""
    log = tmp_path / "sglang.log"
    log.write_text("")
    d = SpecwatchDaemon(tmp_path, log, alerts={**FAST, "slack": {"webhook_url": slack.url}}).start()
    w = Writer(log)
    w.start()
    rng = random.Random()
    kills = 3
    try:
        for _ in range(kills):
            time.sleep(rng.uniform(0.3, 2.5))
            kill9(d)
            time.sleep(rng.uniform(0.0, 0.5))
            d.start()
        time.sleep(rng.uniform(0.5, 1.5))
    finally:
        w.stop.set()
        w.join()
    phases, expected = w.phases, w.states  # FIRING, RESOLVED, ... as the written lines alternate
    wait_for(lambda: lines_counted(d) >= w.written, timeout=30, what="every written line counted")
    time.sleep(1.0)
    assert lines_counted(d) == w.written
    try:
        wait_for(lambda: len(delivered(slack)) >= len(expected), timeout=20)
    except AssertionError:
        raise AssertionError(f"expected {expected} at Slack, got {delivered(slack)} ({phases} phases); "
                             f"daemon log:\n{d.output[-4000:]}") from None
    got = delivered(slack)
    deduped = [s for i, s in enumerate(got) if i == 0 or s != got[i - 1]]
    assert deduped == expected, got
    assert len(got) <= len(expected) + kills, got
    rc, out = d.stop()
    assert rc == 0, out
    assert "Traceback" not in out


def _tmpfs_daemon(tmp_path, log, slack) -> SpecwatchDaemon:
    """A daemon whose state_dir is a 256 KiB tmpfs of its own (a user and mount namespace:
    `unshare -rm`); the test reaches it as /proc/PID/root/STATE."""
    d = SpecwatchDaemon(tmp_path, log, alerts={**FAST, "slack": {"webhook_url": slack.url}})
    d.state.mkdir(parents=True, exist_ok=True)
    d.argv = ["unshare", "-rm", "sh", "-c",
              f'mount -t tmpfs -o size=256k tmpfs "{d.state}" && exec "$@"', "sh", *d.argv]
    return d


def test_full_state_dir_warns_keeps_working_and_loses_nothing(tmp_path, slack):
    """Item 19: state_dir on a full tmpfs: one warning (not a traceback per write), a metric, alerts
    still delivered, a clean SIGTERM; space back: everything written, and a restart resumes from
    the saved offsets (not line 1)."""
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
            capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs in a user namespace here (unshare -rm)")
    log = tmp_path / "sglang.log"
    log.write_text("")
    d = _tmpfs_daemon(tmp_path, log, slack).start()
    state = f"/proc/{d.proc.pid}/root{d.state}"
    append(log, "".join(decode_line(2.9, f"16:30:0{i}") for i in range(3)))
    wait_for(lambda: lines_counted(d) == 3, what="3 lines counted")
    # fill the tmpfs
    subprocess.run(["dd", "if=/dev/zero", f"of={state}/fill", "bs=4k"], capture_output=True)
    append(log, "".join(decode_line(1.01, f"16:32:4{i}") for i in range(3)))
    wait_for(lambda: delivered(slack) == ["FIRING"], what="the FIRING message while state_dir is full")
    wait_for(lambda: d.scrape().get(("specwatch_state_write_errors_total", ())), what="a counted write error")
    time.sleep(2.5)  # several poll rounds and ticks fail to write: still one warning
    append(log, "".join(decode_line(2.9, f"16:33:0{i}") for i in range(3)))
    wait_for(lambda: delivered(slack) == ["FIRING", "RESOLVED"], what="the RESOLVED message while full")
    assert lines_counted(d) == 9
    assert d.output.count("cannot write the state") == 1
    assert "Traceback" not in d.output

    # SIGTERM while full: exit 0, nothing lost in memory (both were delivered); the reserve held
    # since the start gives the last commit its space
    rc, out = d.stop()
    assert rc == 0, out
    assert "Traceback" not in out and "spent its reserve" in out and "stopping with state_dir unwritable" not in out

    # The tmpfs went with the namespace: a fresh one, empty (as after a reboot) would read from line 1;
    # so test "space comes back" on one run instead: full, then freed.
    d = _tmpfs_daemon(tmp_path, log, slack).start()
    state = f"/proc/{d.proc.pid}/root{d.state}"
    wait_for(lambda: lines_counted(d) == 9, what="the log read at first start")
    subprocess.run(["dd", "if=/dev/zero", f"of={state}/fill", "bs=4k"], capture_output=True)
    append(log, "".join(decode_line(1.01, f"16:34:4{i}") for i in range(3)))
    wait_for(lambda: delivered(slack)[2:] == ["FIRING"], what="the second FIRING while full")
    wait_for(lambda: d.scrape().get(("specwatch_state_write_errors_total", ())), what="a counted write error")
    subprocess.run(["rm", f"{state}/fill"], check=True)  # space is back
    wait_for(lambda: "state written to" in d.output, what="the state written once space is back")
    time.sleep(0.5)  # idle: the copy below is of a quiet database
    copy = tmp_path / "copy"  # sqlite resolves /proc/PID/root to /: read a copy (db + WAL; idle now)
    copy.mkdir()
    for name in ("state.db", "state.db-wal"):
        shutil.copy(f"{state}/{name}", copy / name)
    saved, outbox = read_state(copy)  # what is on disk is current again
    assert saved["pipeline"]["counters"]["lines"]["gpu-box-1"]["decode"] == 12
    assert outbox == {}  # the FIRING was delivered and its row deleted
    rc, out = d.stop()
    assert rc == 0, out
    assert delivered(slack) == ["FIRING", "RESOLVED", "FIRING"]


def test_state_json_and_queue_files_of_the_previous_version_are_migrated_once(tmp_path, slack):
    """The first start reads state.json (offsets, rule state) and <name>-queue.json, commits them to
    state.db, and renames them *.migrated: the queued message is sent, old lines are not read again."""
    from specwatch.alerts.model import Alert
    from specwatch.sources.filestream import Follower

    log = tmp_path / "sglang.log"
    append(log, "".join(decode_line(2.9, f"16:30:0{i}") for i in range(3)))
    follower = Follower(log, on_lines=lambda batch: None)
    follower.poll()  # the checkpoint the previous version saved after these 3 lines
    d = SpecwatchDaemon(tmp_path, log, alerts={**FAST, "slack": {"webhook_url": slack.url}})
    d.state.mkdir(parents=True)
    (d.state / "state.json").write_text(json.dumps({"version": 1, "offsets": {str(log): follower.checkpoint()},
                                                    "pipeline": {}}))
    old = Alert(labels={"alertname": "AcceptanceCollapse", "server": "old-box", "rank": "TP0"},
                annotations={"summary": "s"}, starts_at=1771864362.0, evidence=[("accept len", "1.00")])
    (d.state / "slack-queue.json").write_text(json.dumps({"version": 1, "next_seq": 2, "pending": [
        {"seq": 1, "alert": old.to_dict()}]}))
    append(log, decode_line(3.0, "16:31:00"))
    d.start()
    wait_for(lambda: slack.delivered_texts() == ["[FIRING] AcceptanceCollapse on old-box TP0: accept len 1.00"],
             what="the message queued by the previous version")
    wait_for(lambda: lines_counted(d) == 1, what="only the line after the saved offset")
    assert sorted(p.name for p in d.state.iterdir() if "json" in p.name) == [
        "slack-queue.json.migrated", "state.json.migrated"]
    rc, out = d.stop()
    assert rc == 0, out
    d.start()  # a second start reads state.db only
    time.sleep(1.0)
    assert lines_counted(d) == 1 and len(slack.received) == 1
    d.stop()


def test_kill9_during_a_first_backlog_then_restart_notifies_none_of_it(tmp_path, slack):
    """A daemon killed while it reads a log's history (first start, no saved offset) saves no
    offset for it: the next start reads it again from its first line as history, and an episode
    that fired and resolved there goes out to nobody (it went out as news before)."""
    episode = "".join(decode_line(1.01, f"16:33:0{i}", running=50) for i in range(3)) + \
        "".join(decode_line(2.50, f"16:33:1{i}", running=50) for i in range(3))
    healthy = decode_line(2.50, "16:34:00", running=50)
    log = tmp_path / "sglang.log"
    n = 150_000
    log.write_text(episode + healthy * (n - 6))
    d = SpecwatchDaemon(tmp_path, log, alerts={**FAST, "slack": {"webhook_url": slack.url}}).start()
    wait_for(lambda: lines_counted(d) > 0, what="the backlog's first read")
    kill9(d)
    doc, _ = read_state(d.state)
    assert str(log) not in doc.get("offsets", {}), "an offset saved midway through the history"
    d.start()
    wait_for(lambda: lines_counted(d) == n, timeout=120, what="the whole backlog read")
    time.sleep(1.5)  # a dispatcher tick or two
    assert delivered(slack) == []
    rc, out = d.stop()
    assert rc == 0, out


def test_sigterm_during_a_first_backlog_saves_no_offset_of_it(tmp_path, slack):
    """SIGTERM while the history is read: the daemon stops at once, between two reads, and saves
    no offset for the log, so the next start reads its history again as history (nothing sent)."""
    episode = "".join(decode_line(1.01, f"16:33:0{i}", running=50) for i in range(3)) + \
        "".join(decode_line(2.50, f"16:33:1{i}", running=50) for i in range(3))
    log = tmp_path / "sglang.log"
    n = 150_000
    log.write_text(episode + decode_line(2.50, "16:34:00", running=50) * (n - 6))
    d = SpecwatchDaemon(tmp_path, log, alerts={**FAST, "slack": {"webhook_url": slack.url}}).start()
    wait_for(lambda: lines_counted(d) > 0, what="the backlog's first read")
    rc, out = d.stop()
    assert rc == 0, out
    doc, _ = read_state(d.state)
    assert str(log) not in doc.get("offsets", {}), "an offset saved midway through the history"
    d.start()
    wait_for(lambda: lines_counted(d) == n, timeout=120, what="the whole backlog read")
    time.sleep(1.5)
    assert delivered(slack) == []
    rc, out = d.stop()
    assert rc == 0, out


def _mount_tmpfs(where, size: str) -> bool:
    """A real tmpfs of `size` at `where` (root only; False where mounting is not allowed)."""
    where.mkdir(parents=True, exist_ok=True)
    return shutil.which("mount") is not None and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
        capture_output=True).returncode == 0


def test_full_state_dir_then_sigterm_then_restart_sends_each_notification_once(tmp_path, slack):
    """A full state_dir, three collapse episodes and a fourth FIRING delivered while nothing can be
    written, SIGTERM, a restart on the still-full disk, the fourth RESOLVED: every FIRING and
    RESOLVED arrives exactly once (the reproduction sent 3 of 16 twice: lines read and sent but
    never written were read and sent again after the restart). The daemon says at ERROR and in
    /metrics that state cannot be written; the stop spends the reserve to write it."""
    log = tmp_path / "sglang.log"
    log.write_text("")
    d = SpecwatchDaemon(tmp_path, log, alerts={**FAST, "slack": {"webhook_url": slack.url}})
    if not _mount_tmpfs(d.state, "256k"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        d.start()
        append(log, "".join(decode_line(2.9, f"16:30:0{i}") for i in range(3)))
        wait_for(lambda: lines_counted(d) == 3, what="3 lines counted")
        assert d.scrape()[("specwatch_state_reserve_bytes", ())] > 0, d.output
        subprocess.run(["dd", "if=/dev/zero", f"of={d.state}/fill", "bs=4k"], capture_output=True)
        for k in range(4):
            append(log, "".join(decode_line(1.01, f"16:3{k + 1}:0{i}") for i in range(3)))
            wait_for(lambda: len(delivered(slack)) == 2 * k + 1, what=f"FIRING {k + 1}")
            if k == 3:
                break  # still firing at the stop
            append(log, "".join(decode_line(2.9, f"16:3{k + 1}:1{i}") for i in range(3)))
            wait_for(lambda: len(delivered(slack)) == 2 * k + 2, what=f"RESOLVED {k + 1}")
        m = d.scrape()
        assert m[("specwatch_state_write_errors_total", ())] >= 1
        assert m[("specwatch_state_writable", ())] == 0
        rc, out = d.stop()
        assert rc == 0, out
        [line] = [x for x in out.splitlines() if "cannot write the state" in x]
        assert " ERROR " in line, line
        assert "spent its reserve" in out and "stopping with state_dir unwritable" not in out, out
        assert "Traceback" not in out

        d.start()  # still full
        wait_for(lambda: lines_counted(d) == 24, what="the counters of the stop")
        time.sleep(1.5)  # ticks and flushes: anything to re-send would go now
        append(log, "".join(decode_line(2.9, f"16:34:1{i}") for i in range(3)))
        wait_for(lambda: len(delivered(slack)) >= 8, what="RESOLVED 4")
        subprocess.run(["rm", f"{d.state}/fill"], check=True)
        time.sleep(1.5)
        assert delivered(slack) == ["FIRING", "RESOLVED"] * 4, slack.delivered_texts()
        assert lines_counted(d) == 27
        rc, out = d.stop()
        assert rc == 0, out
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
        subprocess.run(["umount", str(d.state)], capture_output=True)
