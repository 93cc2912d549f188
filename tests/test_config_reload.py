"""SIGHUP with a config that cannot be used (issue #10 item 17): a real `specwatch run`
subprocess keeps running on the old config and logs one ERROR line naming the problem."""

from __future__ import annotations

import signal

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
