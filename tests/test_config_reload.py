"""SIGHUP with a config that cannot be used (issue #10 item 17): a real `specwatch run`
subprocess keeps running on the old config and logs one ERROR line naming the problem."""

from __future__ import annotations

import signal
import time

import hostile_configs
from procs import decode_line, rank_labels, wait_for
from specwatch_daemon import SpecwatchDaemon


def test_sighup_with_any_hostile_config_keeps_the_old_one(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(decode_line(1.05, "10:00:00"))
    d = SpecwatchDaemon(tmp_path, log, server="box")
    good = d.cfg.read_bytes()
    d.start()
    try:
        for n, (name, (content, expected)) in enumerate(hostile_configs.cases(f"logs: [{log}]\n").items(), 1):
            d.cfg.write_bytes(content)
            d.signal(signal.SIGHUP)
            wait_for(lambda: d.output.count("config reload from") >= n, what=f"the reload of {name!r} refused")
            # the newest reload line (other sources may log after it, e.g. the process scan)
            line = [x for x in d.output.split("\n") if "config reload from" in x][-1]
            assert " ERROR " in line and "refused, the running config stays" in line and expected in line, line
            assert d.proc.poll() is None, d.output
        assert "Traceback" not in d.output
        # The old config still runs: the default collapse rule (three lines <= 1.10) fires.
        with open(log, "a") as f:
            f.write(decode_line(1.05, "10:00:01") + decode_line(1.05, "10:00:02"))
        wait_for(lambda: d.scrape().get(("specwatch_acceptance_collapsed", rank_labels("box"))) == 1,
                 what="a collapse under the old config")
        assert d.scrape()[("specwatch_config_reload_success", ())] == 0
        d.cfg.write_bytes(good)
        d.signal(signal.SIGHUP)
        wait_for(lambda: d.scrape()[("specwatch_config_reload_success", ())] == 1, what="the good config back")
    finally:
        rc, out = d.stop()
    assert rc == 0, out


def _reload_adding_b(tmp_path, slack, a, started, read_a):
    """Start a daemon on `a`; once `started(d)`, a reload adds `b`, which holds an old, finished
    collapse: b's history is read and not sent (`read_a(d)` checks a), a collapse written after is."""
    import yaml

    b = tmp_path / "b.log"
    b.write_text("".join([decode_line(1.01, f"09:00:0{i}", running=50) for i in range(3)]
                         + [decode_line(2.5, f"09:00:1{i}", running=50) for i in range(3)]))
    d = SpecwatchDaemon(tmp_path, a, server="box", alerts={"group_wait": "0s", "group_interval": "0s",
                                                           "slack": {"webhook_url": slack.url}})
    d.start()
    try:
        wait_for(lambda: started(d), what="the daemon following a")
        doc = yaml.safe_load(d.cfg.read_text())
        doc["logs"] = [{"path": str(a), "server": "box"}, {"path": str(b), "server": "box-b"}]
        d.cfg.write_text(yaml.safe_dump(doc))
        d.signal(signal.SIGHUP)
        wait_for(lambda: d.scrape().get(("specwatch_decode_batches_total", rank_labels("box-b"))) == 6,
                 timeout=60, what="b's history read")
        read_a(d)
        with open(b, "a") as f:  # a new collapse in b after the reload: news
            f.write("".join(decode_line(1.02, f"10:05:0{i}", running=50) for i in range(3)))
        wait_for(lambda: len(slack.received) >= 1, what="the new collapse at Slack")
        time.sleep(0.5)
        # (was 1.76): the highest of its trend, the mean of b's old lines of 09:00 (1.01 and 2.5)
        assert [m["text"] for m in slack.received] == ["[FIRING] AcceptanceCollapse on box-b TP0: accept len 1.02 (was 1.76)"]
    finally:
        rc, out = d.stop()
    assert rc == 0, out


def test_a_log_added_by_a_reload_sends_its_history_no_old_episode(tmp_path, slack):
    """A reload that adds a log holding an old, finished episode: history, as at a first start
    (a reviewer found it sent as FIRING and RESOLVED); a collapse written after the reload is news."""
    a = tmp_path / "a.log"
    a.write_text(decode_line(2.5, "10:00:00"))
    _reload_adding_b(tmp_path, slack, a,
                     lambda d: d.scrape().get(("specwatch_decode_batches_total", rank_labels("box"))) == 1,
                     lambda d: None)


def test_a_reload_while_the_backlog_is_read_holds_the_added_logs_history(tmp_path, slack):
    """A reload that adds a log while the start-up backlog is still being read: the added log's old
    episode stays history. (A round under way when the reload came resumed notifications at its end,
    before the added log was followed: FollowerGroup.updating.)"""
    a = tmp_path / "a.log"
    with open(a, "w") as f:  # a backlog whose first read lasts a while
        for i in range(120_000):
            t = i // 8  # 8 DP ranks, one line a second each, from 04:00:00
            f.write(decode_line(2.5, f"{4 + t // 3600:02d}:{t // 60 % 60:02d}:{t % 60:02d}", rank=f"DP{i % 8} TP{i % 8}"))

    def read_a(d):
        wait_for(lambda: d.scrape().get(("specwatch_decode_batches_total", rank_labels("box", tp="7", dp="7")))
                 == 15_000, timeout=60, what="a's backlog read")

    _reload_adding_b(tmp_path, slack, a, lambda d: "following 1 log(s)" in d.output, read_a)
