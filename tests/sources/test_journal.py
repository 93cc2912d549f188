"""The journal source against real journal files (systemd-journal-remote) and the real journalctl."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from journal_files import REMOTE, JournalDir, export_entry
from procs import decode_line, wait_for
from specwatch.alerts.dispatcher import Dispatcher
from specwatch.config import ConfigError, JournalConfig, build_config
from specwatch.core.pipeline import Pipeline
from specwatch.sources.filestream import Follower
from specwatch.sources.follow import FollowerGroup
from specwatch.sources.journal import JournalFollower, journalctl_command


class Reader:
    """A JournalFollower and everything it passed on; `with Reader(...) as r:` stops its
    journalctl however the block ends."""

    def __init__(self, cfg: JournalConfig, checkpoint=None, **kw):
        self.lines: list[str] = []
        self.ok: list[bool] = []
        self.f = JournalFollower(cfg, self._take, checkpoint=checkpoint, **kw)

    def _take(self, batch):
        assert batch.path == self.f.path and len(batch) == len(batch.lines) > 0
        self.lines += batch.lines
        self.ok += [True] * len(batch) if batch.raw_ok is None else batch.raw_ok

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()

    def until(self, n: int, timeout: float = 15.0) -> list[str]:
        wait_for(lambda: self.f.poll() is not None and len(self.lines) >= n, timeout=timeout,
                 what=f"{n} journal lines, have {self.lines}")
        self.f.poll()
        return self.lines


@pytest.fixture
def jdir(tmp_path):
    return JournalDir(tmp_path / "journal")


def cfg_for(jdir, **kw) -> JournalConfig:
    return JournalConfig(**{"unit": "sglang.service", "directory": str(jdir.path), **kw})


def test_follows_appended_entries_of_the_unit_only(jdir):
    jdir.append(["line 1", "line 2"])
    jdir.append(["not ours"], _SYSTEMD_UNIT="other.service")
    r = Reader(cfg_for(jdir))
    try:
        assert r.until(2) == ["line 1", "line 2"]
        jdir.append(["line 3", "two\nlines\n", b"bytes \xff\x00 end"])  # appended while following
        assert r.until(6) == ["line 1", "line 2", "line 3", "two", "lines", "bytes \ufffd\x00 end"]
        assert r.ok == [True] * 5 + [False]  # not UTF-8: decoded with U+FFFD, flagged
        assert r.f.is_open and r.f.error is None
        assert r.f.entries_total == 5 and r.f.lines_total == 6
        cp = r.f.checkpoint()
        assert cp["journal"] == "journal:sglang.service@" + str(jdir.path) and cp["cursor"].startswith("s=")
    finally:
        r.f.close()
    assert r.f._proc is None


def test_matches_select_entries_by_field(jdir):
    jdir.append(["a"], SYSLOG_IDENTIFIER="sglang")
    jdir.append(["b"], SYSLOG_IDENTIFIER="other")
    jdir.append(["c"], SYSLOG_IDENTIFIER="sglang", CONTAINER_NAME="sglang-1")
    r = Reader(JournalConfig(matches=["SYSLOG_IDENTIFIER=sglang"], directory=str(jdir.path)))
    try:
        assert r.until(2) == ["a", "c"]
    finally:
        r.f.close()
    r = Reader(JournalConfig(matches=["SYSLOG_IDENTIFIER=sglang", "CONTAINER_NAME=sglang-1"],
                             directory=str(jdir.path)))
    try:
        assert r.until(1) == ["c"]
    finally:
        r.f.close()


def test_resumes_after_the_saved_cursor_across_rotation_and_vacuum(jdir, caplog):
    cfg = cfg_for(jdir)
    jdir.append([f"a{i}" for i in range(3)])
    with Reader(cfg) as r:
        assert r.until(3) == ["a0", "a1", "a2"]
        jdir.rotate()  # journald's rotation while following: a new active file
        jdir.append(["b0", "b1"])
        assert r.until(5) == ["a0", "a1", "a2", "b0", "b1"]
        cp = r.f.checkpoint()

    # stopped: more entries, then a restart resumes after the last one read
    jdir.append(["b2"])
    with Reader(cfg, checkpoint=cp) as r2:
        assert r2.until(1) == ["b2"]
        cp = r2.f.checkpoint()
    assert r2.f.cursor_lost_total == 0

    # stopped again: its file is rotated away and vacuumed, so the saved cursor no longer exists
    jdir.rotate()
    jdir.append(["c0", "c1"])
    jdir.vacuum()
    assert [p.name for p in jdir.path.iterdir()] == ["system.journal"]
    with caplog.at_level(logging.WARNING, logger="specwatch.sources.journal"):
        with Reader(cfg, checkpoint=cp) as r3:
            assert r3.until(2) == ["c0", "c1"]
            jdir.append(["c2"])
            assert r3.until(3) == ["c0", "c1", "c2"]
    assert r3.f.cursor_lost_total == 1
    assert "no longer in the journal (rotated and vacuumed); resuming at the oldest entry after" in caplog.text


def test_a_cursor_journalctl_refuses_resumes_by_its_time(jdir, caplog):
    jdir.append(["old 1", "old 2"])
    with Reader(cfg_for(jdir)) as r:
        r.until(2)
        realtime = r.f.checkpoint()["realtime"]
    jdir.append(["new 1"])
    cp = {"version": 1, "journal": r.f.path, "cursor": "not-a-cursor", "realtime": realtime}
    with caplog.at_level(logging.WARNING, logger="specwatch.sources.journal"), \
            Reader(cfg_for(jdir), checkpoint=cp) as r2:
        assert r2.until(1) == ["new 1"]
    assert "journalctl refused the saved cursor" in caplog.text and r2.f.cursor_lost_total == 1


def test_missing_journalctl_is_an_error_not_silence(tmp_path, caplog):
    with caplog.at_level(logging.ERROR, logger="specwatch.sources.journal"):
        f = JournalFollower(JournalConfig(unit="sglang.service"), lambda b: None,
                            journalctl=str(tmp_path / "journalctl"))
        assert f.poll() == 0
    assert not f.is_open and f.error == "journalctl not found"
    assert "cannot read the journal for journal:sglang.service: journalctl not found; install systemd" in caplog.text


def test_missing_directory_is_reported_then_read_once_it_exists(tmp_path, caplog):
    d = tmp_path / "later"
    got = []
    f = JournalFollower(JournalConfig(unit="sglang.service", directory=str(d)), lambda b: got.extend(b.lines))
    try:
        with caplog.at_level(logging.ERROR, logger="specwatch.sources.journal"):
            wait_for(lambda: f.poll() is not None and f.error, what="journalctl's exit")
        assert not f.is_open and f.read_errors_total == 1
        assert f"journalctl exited (status 1): Failed to open {d}: No such file or directory" in caplog.text
        assert "is it the folder holding the *.journal files?" in caplog.text
        JournalDir(d).append(["finally"])
        wait_for(lambda: f.poll() is not None and got, timeout=15, what="the entry after the retry")
        assert got == ["finally"] and f.is_open and f.error is None
    finally:
        f.close()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root to drop to nobody")
@pytest.mark.parametrize("readable_dir, said", [
    (True, "No journal files were opened due to insufficient permissions."),  # /var/log/journal's case
    (False, "Permission denied"),
])
def test_no_permission_is_an_error_with_the_fix(tmp_path, caplog, readable_dir, said):
    base = Path(tempfile.mkdtemp(prefix="specwatch-journal-"))  # outside pytest's 0700 tree
    try:
        base.chmod(0o755 if readable_dir else 0o700)
        jdir = JournalDir(base / "j")
        jdir.append(["secret"])  # a 0640 root-owned file
        wrapper = tmp_path / "journalctl-as-nobody"
        wrapper.write_text(f"#!/bin/sh\nexec setpriv --reuid=nobody --regid=nogroup --clear-groups "
                           f"{shutil.which('journalctl')} \"$@\"\n")
        wrapper.chmod(0o755)
        f = JournalFollower(cfg_for(jdir), lambda b: None, journalctl=str(wrapper))
        with caplog.at_level(logging.ERROR, logger="specwatch.sources.journal"):
            wait_for(lambda: f.poll() is not None and f.read_errors_total, what="journalctl's exit")
    finally:
        if "f" in locals():
            f.close()
        shutil.rmtree(base)
    assert not f.is_open
    assert f.error.startswith("journalctl exited (status 1): ") and said in f.error
    assert "add specwatch's user to the systemd-journal group" in caplog.text


def test_long_lines_are_skipped_and_counted(jdir):
    jdir.append(["short", "x" * 2000, "after"])
    r = Reader(cfg_for(jdir), max_line_bytes=1024)
    try:
        assert r.until(2) == ["short", "after"]
        assert r.f.long_lines_skipped_total == 1
    finally:
        r.f.close()


def test_command_line():
    cfg = JournalConfig(unit="sglang.service", matches=["CONTAINER_NAME=sglang"], directory="/j")
    assert journalctl_command(cfg, cursor="s=1") == [
        "journalctl", "--output=json", "--output-fields=MESSAGE", "--all", "--follow", "--merge", "--no-pager",
        "--directory=/j", "--cursor=s=1", "--unit=sglang.service", "CONTAINER_NAME=sglang"]
    assert journalctl_command(cfg, since_us=1_700_000_000_000_042)[8] == "--since=@1700000000.000042"
    assert journalctl_command(JournalConfig(unit="u"))[-2:] == ["--no-tail", "--unit=u"]


def test_config_keys_are_validated_with_key_path_and_fix(tmp_path):
    cfg = build_config({"logs": [{"journal": {"unit": "sglang.service"}, "server": "s1"},
                                 {"journal": {"matches": ["SYSLOG_IDENTIFIER=sglang"], "directory": "j"},
                                  "server": "s2"}]}, str(tmp_path / "c.yaml"))
    assert [s.path for s in cfg.logs] == ["journal:sglang.service",
                                         f"journal:SYSLOG_IDENTIFIER=sglang@{tmp_path / 'j'}"]
    assert cfg.logs[1].journal.directory == str(tmp_path / "j")  # relative to the config file
    with pytest.raises(ConfigError) as e:
        build_config({"logs": [
            {"journal": {}},
            {"journal": {"unit": "a", "matches": ["lower=x", "NOEQUALS"]}, "server": "b"},
            {"journal": {"unit": "a", "bogus": 1}, "server": "c"},
            {"journal": "sglang.service", "server": "d"},
            {"journal": {"unit": "a"}, "path": "/x.log", "server": "e"},
            {"journal": {"unit": "a", "directory": 5}, "server": "f"},
        ]})
    p = e.value.problems
    assert p[0].startswith("logs[0].journal.unit: missing; give `unit: sglang.service` or `matches:")
    assert p[1].startswith("logs[1].journal.matches[0]: 'lower=x' is not a journal match; write FIELD=value")
    assert p[2].startswith("logs[1].journal.matches[1]: 'NOEQUALS' is not a journal match")
    assert p[3].startswith("logs[2].journal.bogus: unknown key; known keys here: directory, matches, unit")
    assert p[4] == "logs[3].journal: must be a mapping, e.g. `journal: {unit: sglang.service}`"
    assert p[5].startswith("logs[4].journal: give either `path:` (a file) or `journal:` in one entry")
    assert p[6].startswith("logs[5].journal.directory: must be")
    assert len(p) == 7


def test_the_readme_snippet_is_a_valid_journal_source():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("**The journal**", 1)[1]
    snippet = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    cfg = build_config(yaml.safe_load(snippet), for_run=True)
    [src] = cfg.logs
    assert (src.path, src.server, src.journal.unit) == ("journal:sglang.service", "sglang-0", "sglang.service")


def test_check_config_exits_2_naming_the_journal_key_and_warns_about_a_missing_folder(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("logs:\n  - journal: {unit: sglang.service, matches: [sglang]}\n")
    r = subprocess.run([sys.executable, "-m", "specwatch", "check-config", str(bad)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert "logs[0].journal.matches[0]: 'sglang' is not a journal match; write FIELD=value" in r.stderr
    ok = tmp_path / "ok.yaml"
    ok.write_text("logs:\n  - journal: {unit: sglang.service, directory: nowhere}\n")
    r = subprocess.run([sys.executable, "-m", "specwatch", "check-config", str(ok)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"warning: logs[0].journal.directory: {tmp_path / 'nowhere'} is not a folder (yet)" in r.stderr


def test_a_large_backlog_leaves_a_files_lines_at_most_a_turn_behind(tmp_path, jdir):
    """A new journalctl's backlog (100,000 decode lines into the real pipeline, seconds of work)
    is read in turns of `TURN` s: a collapse line written to a plain file meanwhile reaches the
    pipeline within a second, before the journal is caught up."""
    big = decode_line(2.8, "10:00:00").rstrip("\n")
    raw = b"".join(export_entry(big, 1_700_000_000_000_000 + i * 1000, jdir.fields) for i in range(100_000))
    r = subprocess.run([REMOTE, f"--output={jdir.active}", "-"], input=raw, capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    log = tmp_path / "sglang.log"
    log.write_text("")
    cfg = build_config({"server": "box", "logs": [
        {"journal": {"unit": "sglang.service", "directory": str(jdir.path)}, "server": "journal-box"},
        {"path": str(log), "server": "file-box"}]})
    p = Pipeline(cfg, Dispatcher([], group_wait=0, group_interval=0))
    journal = JournalFollower(cfg.logs[0].journal, p.feed_batch)
    group = FollowerGroup([journal, Follower(str(log), on_lines=p.feed_batch)], poll_interval=0.05,
                          use_watchdog=False)
    decoded = lambda server: p.servers[server].lines["decode"] if server in p.servers else 0  # noqa: E731
    group.start()
    try:
        wait_for(lambda: decoded("journal-box") > 0, what="the journal's first lines")
        with log.open("a") as f:
            f.write(decode_line(1.04, "10:00:01"))
        written = time.monotonic()
        wait_for(lambda: decoded("file-box") == 1, timeout=30, interval=0.01, what="the file's collapse line")
        took = time.monotonic() - written
        behind = decoded("journal-box")
        assert took < 1.0 and behind < 100_000, (took, behind)
        assert p.ranks[("file-box", "TP0")].last_decode.accept_length == 1.04
        wait_for(lambda: decoded("journal-box") == 100_000, timeout=60, what="the whole backlog")
        wait_for(lambda: not group.catching_up, what="the end of the catch-up (a quiet journalctl)")
    finally:
        group.stop()
    assert journal._proc is None


@pytest.mark.parametrize("mode", ["watchdog", "inotify"])
def test_a_journal_source_is_polled_not_watched(tmp_path, jdir, caplog, mode):
    """A journal follower's `path` (`journal:UNIT@DIR`) names no file: the group watches only the
    followed files' folders (no "cannot watch" warning at start or when a reload adds it) and
    polls the journal each round."""
    jdir.append(["line 1"])
    log = tmp_path / "sglang.log"
    log.write_text("")
    got: list[str] = []
    take = lambda batch: got.extend(batch.lines)  # noqa: E731
    journal = JournalFollower(cfg_for(jdir), take)
    added = JournalFollower(cfg_for(jdir, unit="other.service"), take)
    group = FollowerGroup([journal, Follower(str(log), on_lines=take)], poll_interval=0.05,
                          use_watchdog=mode == "watchdog", inotify=mode == "inotify")
    with caplog.at_level(logging.INFO, logger="specwatch.sources"):
        group.start()
        try:
            wait_for(lambda: got == ["line 1"], what="the journal's entry")
            group.update(add=[added])
            jdir.append(["other 1"], _SYSTEMD_UNIT="other.service")
            log.write_text("file 1\n")
            wait_for(lambda: sorted(got) == ["file 1", "line 1", "other 1"], what="every line")
            assert group.watching and group.watch_errors_total == 0
        finally:
            group.stop()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "cannot watch" not in caplog.text
