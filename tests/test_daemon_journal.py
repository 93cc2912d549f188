"""`specwatch run` on a journal source: real journal files written by systemd-journal-remote,
the real journalctl, a real local Slack endpoint."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from journal_files import JournalDir
from procs import SAMPLES, decode_line, rank_labels, wait_for
from specwatch_daemon import SpecwatchDaemon
from test_daemon import delivered

LAB = rank_labels()


def daemon(tmp_path: Path, slack, logs: list[dict], name: str) -> SpecwatchDaemon:
    return SpecwatchDaemon(tmp_path, tmp_path / "unused.log", name=name, env={"SW_TEST_HOOK": slack.url},
                           extra={"logs": logs}, alerts={
                               "group_wait": "0s", "group_interval": "0s",
                               "slack": {"webhook_url_env": "SW_TEST_HOOK", "backoff_initial": "0.1s"}})


def collapse_lines() -> list[str]:
    return (SAMPLES / "kimi-k25-eagle3-collapse.log").read_text().splitlines() + \
        [decode_line(1.04, "16:32:46").rstrip("\n")]


def lines_of(d: SpecwatchDaemon, kind: str) -> float | None:
    return d.scrape().get(("specwatch_log_lines_total", (("kind", kind), ("server", "gpu-box-1"))))


def test_collapse_in_the_journal_alerts_like_from_a_file(tmp_path, slack):
    jdir = JournalDir(tmp_path / "journal")
    d = daemon(tmp_path, slack, [{"journal": {"unit": "sglang.service", "directory": str(jdir.path)},
                                  "server": "gpu-box-1"}], "journal")
    d.start()
    key = f"journal:sglang.service@{jdir.path}"
    wait_for(lambda: d.scrape().get(("specwatch_journal_up", (("path", key),))) == 1, what="journalctl running")
    jdir.append(["INFO:     127.0.0.1:40052 - \"POST /generate HTTP/1.1\" 200 OK"])
    jdir.append(["another unit's line"], _SYSTEMD_UNIT="other.service")
    jdir.append(collapse_lines())
    firing = wait_for(lambda: delivered(slack), timeout=20, what="the firing message")
    m = d.scrape()
    assert m[("specwatch_decode_batches_total", LAB)] == 3
    assert m[("specwatch_accept_length", LAB)] == 1.04
    assert m[("specwatch_acceptance_collapsed", LAB)] == 1
    assert lines_of(d, "other") == 1 and lines_of(d, "decode") == 3
    assert m[("specwatch_log_read_bytes_total", (("path", key),))] > 0
    with urllib.request.urlopen(f"http://127.0.0.1:{d.port}/api/status", timeout=10) as r:
        [src] = [s for s in json.load(r)["sources"] if s["kind"] == "journal"]
    assert (src["name"], src["ok"], src["state"], src["counters"]["lines"]) == (key, True, "following", 4)
    rc, out = d.stop()
    assert rc == 0, out

    # the same lines from a file: the same alert, word for word
    log = tmp_path / "sglang.log"
    f = daemon(tmp_path, slack, [{"path": str(log), "server": "gpu-box-1"}], "file")
    f.start()
    log.write_text("INFO:     127.0.0.1:40052 - \"POST /generate HTTP/1.1\" 200 OK\n"
                   + "\n".join(collapse_lines()) + "\n")
    wait_for(lambda: len(delivered(slack)) == 2, timeout=20, what="the file daemon's firing message")
    rc, out = f.stop()
    assert rc == 0, out
    from_journal, from_file = delivered(slack)
    assert from_journal["text"].startswith("[FIRING] AcceptanceCollapse on gpu-box-1 TP0")
    # the recent trend is read at the evaluation that fired it (docs/one-path.md): it holds the
    # lines of the reads before, and journalctl may hand the three lines over in more than one
    trends = [_trend(p) for p in (from_journal, from_file)]
    assert all(t.startswith("*accept len, recent trend*\n`") and t.endswith(" → 1.04") for t in trends), trends
    assert _trend(from_journal, drop=True) == _trend(from_file, drop=True)


def _trend(payload: dict, drop: bool = False):
    """The trend section's text, or (`drop`) the payload without it."""
    def is_trend(b: dict) -> bool:
        return b.get("type") == "section" and b.get("text", {}).get("text", "").startswith("*accept len, recent trend*")
    if drop:
        return {**payload, "blocks": [b for b in payload["blocks"] if not is_trend(b)]}
    return next(b["text"]["text"] for b in payload["blocks"] if is_trend(b))


def test_restart_resumes_after_the_last_entry_across_rotation_and_vacuum(tmp_path, slack):
    jdir = JournalDir(tmp_path / "journal")
    d = daemon(tmp_path, slack, [{"journal": {"unit": "sglang.service", "directory": str(jdir.path)},
                                  "server": "gpu-box-1"}], "journal")
    d.start()
    jdir.append([decode_line(3.0, f"16:30:0{i}").rstrip("\n") for i in range(3)] + ["other 1"])
    wait_for(lambda: d.scrape().get(("specwatch_decode_batches_total", LAB)) == 3, what="3 batches")
    jdir.rotate()  # while following
    jdir.append([decode_line(3.1, "16:30:10").rstrip("\n"), "other 2"])
    wait_for(lambda: d.scrape().get(("specwatch_decode_batches_total", LAB)) == 4, what="the 4th batch")
    rc, out = d.stop()
    assert rc == 0, out
    state, _ = d.saved()
    key = f"journal:sglang.service@{jdir.path}"
    assert state["offsets"][key]["cursor"].startswith("s=")

    # written while stopped: read once after the restart, nothing before it again
    jdir.append([decode_line(3.2, "16:31:00").rstrip("\n")])
    d.start()
    wait_for(lambda: d.scrape().get(("specwatch_decode_batches_total", LAB)) == 5, what="the batch after restart")
    assert lines_of(d, "decode") == 5 and lines_of(d, "other") == 2
    rc, out = d.stop()
    assert rc == 0, out

    # stopped: rotated, written, and the file with the saved cursor vacuumed
    jdir.rotate()
    jdir.append([decode_line(3.3, "16:31:01").rstrip("\n"), "other 3"])
    jdir.vacuum()
    d.start()
    wait_for(lambda: d.scrape().get(("specwatch_decode_batches_total", LAB)) == 6, what="the batch after restart")
    jdir.append([decode_line(3.4, "16:31:02").rstrip("\n")])
    wait_for(lambda: d.scrape().get(("specwatch_decode_batches_total", LAB)) == 7, what="a batch appended after")
    m = d.scrape()
    assert m[("specwatch_accept_length", LAB)] == 3.4
    assert lines_of(d, "decode") == 7 and lines_of(d, "other") == 3
    assert m[("specwatch_journal_cursor_lost_total", (("path", key),))] == 1
    rc, out = d.stop()
    assert rc == 0, out
    assert "the saved cursor is no longer in the journal (rotated and vacuumed)" in out
    assert delivered(slack) == []


def test_first_start_on_an_old_journal_sends_no_old_episode(tmp_path, slack):
    """The journal's backlog is read before notifying, like a file's: a week-old episode (fired
    and resolved) is not news; a new collapse is."""
    jdir = JournalDir(tmp_path / "journal")
    old = [decode_line(a, f"10:0{m}:0{i}", day="2026-02-16").rstrip("\n") for m, a in ((0, 1.0), (1, 2.9))
           for i in range(3)]
    jdir.append([f"filler {i}" for i in range(2000)] + old)
    d = daemon(tmp_path, slack, [{"journal": {"unit": "sglang.service", "directory": str(jdir.path)},
                                  "server": "gpu-box-1"}], "journal")
    d.start()
    wait_for(lambda: d.scrape().get(("specwatch_decode_batches_total", LAB)) == 6, what="the backlog")
    time.sleep(2.5)  # past the first poll round and group_wait
    assert slack.received == []
    jdir.append([decode_line(1.01, f"16:40:0{i}").rstrip("\n") for i in range(3)])
    msgs = wait_for(lambda: delivered(slack), timeout=15, what="the new collapse")
    assert len(msgs) == 1 and msgs[0]["text"].startswith("[FIRING] AcceptanceCollapse on gpu-box-1 TP0")
    assert lines_of(d, "other") == 2000
    rc, out = d.stop()
    assert rc == 0, out
