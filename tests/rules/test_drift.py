"""Slow drift over hours (BR-13's shape), reset by a restart, on generated SGLang logs."""

import random

from timeline import T0, Timeline, names, run

EVERY = 20  # seconds between decode lines: 180 lines an hour keeps a 6-hour log small


def drifting(start, end, n, rnd, spread=0.05):
    return lambda i: round(start + (end - start) * i / (n - 1) + rnd.uniform(-spread, spread), 2)


def test_steady_decline_fires_then_restart_resolves_and_resets():
    rnd = random.Random(11)
    n = 5 * 3600 // EVERY  # 5 hours: 3.07 → 2.50, about 3.7 % of the start value per hour
    log = Timeline()
    log.decode(n=n, every=EVERY, accept=drifting(3.07, 2.50, n, rnd))
    log.wait(60).server_args()  # operator restarts the server
    log.decode(n=3 * 3600 // EVERY, every=EVERY, accept=lambda i: round(3.07 + rnd.uniform(-0.05, 0.05), 2))
    t = run(log.lines)
    assert names(t) == [("AcceptanceDrift", "firing", ""), ("AcceptanceDrift", "resolved", "")]
    fired, resolved = t
    ev = dict(fired.evidence)
    per_hour = float(ev["decline"].split("%")[0]) / 100
    assert 0.03 <= per_hour <= 0.05, ev["decline"]
    start, end = (float(x) for x in ev["accept len, fitted"].split(" over ")[0].split(" → "))
    assert start > end and 2.9 < start < 3.1
    # it needs 6 full 10-minute buckets and a 5 % total decline: about 1.4 h into the log
    fired_at = fired.starts_at + float(ev["accept len, fitted"].split(" over ")[1].rstrip("h")) * 3600
    assert 3600 <= fired_at - T0 <= 2.5 * 3600
    assert dict(resolved.evidence)["reset"] == "server restarted"
    assert resolved.ends_at == T0 + n * EVERY + 60


def test_big_gap_resets():
    rnd = random.Random(12)
    n = 4 * 3600 // EVERY
    log = Timeline()
    log.decode(n=n, every=EVERY, accept=drifting(3.0, 2.5, n, rnd))
    log.wait(3 * 3600)  # no decode line for 3 hours (restart_gap is 30 min)
    log.decode(n=10, every=EVERY, accept=2.9)
    t = run(log.lines)
    assert names(t) == [("AcceptanceDrift", "firing", ""), ("AcceptanceDrift", "resolved", "")]
    assert dict(t[1].evidence)["reset"].startswith("no decode line for 108")


def test_quiet_on_flat_noise_and_on_a_single_step():
    rnd = random.Random(13)
    n = 6 * 3600 // EVERY
    flat = Timeline()
    flat.decode(n=n, every=EVERY, accept=lambda i: round(2.9 + rnd.uniform(-0.25, 0.25), 2))
    assert run(flat.lines) == []
    # one step down (a deploy), flat before and after: not a drift (the fit may slope, but
    # the bucket means do not fall steadily)
    step = Timeline()
    step.decode(n=n, every=EVERY, accept=lambda i: round((3.0 if i < n // 2 else 2.6) + rnd.uniform(-0.05, 0.05), 2))
    assert [x for x in names(run(step.lines)) if x[0] == "AcceptanceDrift"] == []


def test_decline_stopping_resolves():
    rnd = random.Random(14)
    n = 3 * 3600 // EVERY
    log = Timeline()
    log.decode(n=n, every=EVERY, accept=drifting(3.0, 2.55, n, rnd, spread=0.02))
    log.decode(n=5 * 3600 // EVERY, every=EVERY, accept=lambda i: round(2.55 + rnd.uniform(-0.02, 0.02), 2))
    t = run(log.lines)
    assert names(t) == [("AcceptanceDrift", "firing", ""), ("AcceptanceDrift", "resolved", "")]
    assert float(dict(t[1].evidence)["decline now"].rstrip("%/h")) < 1.5


def _process(pid):
    from specwatch.core.events import ServerProcess
    return ServerProcess(pid=pid, start_time=T0 + pid, port=30000, cmdline=("python", "-m", "sglang.launch_server"),
                         args={}, interpreter=None, fs_root="/", sglang_version=None, sglang_location=None,
                         pids=(pid,), roles={})


def test_settings_re_sent_by_other_sources_do_not_reset_but_a_process_restart_does():
    from specwatch.core.events import ServerArgs, ServerRestarted
    from timeline import feed, pipeline

    rnd = random.Random(15)
    n = 4 * 3600 // EVERY
    log = Timeline()
    log.decode(n=n, every=EVERY, accept=drifting(3.07, 2.5, n, rnd))
    p = pipeline()
    assert names(feed(p, log.lines)) == [("AcceptanceDrift", "firing", "")]
    end = T0 + n * EVERY
    # the HTTP API and the command line send the settings again (specwatch restarted, a poll)
    p.feed_event("box", ServerArgs(end + 1, {"speculative_algorithm": "EAGLE3"}, source="server_info"), end + 1)
    p.feed_event("box", ServerArgs(end + 2, {"speculative_algorithm": "EAGLE3"}, source="cmdline"), end + 2)
    assert len(p.dispatcher.history) == 1
    p.feed_event("box", ServerRestarted(end + 3, _process(1), _process(2)), end + 3)
    drift = [a for a in p.dispatcher.history if a.name == "AcceptanceDrift"]
    assert [a.status for a in drift] == ["firing", "resolved"]
    assert dict(drift[1].evidence)["reset"] == "server restarted" and drift[1].ends_at == end + 3
    assert ("ServerRestarted", "firing", "") in names(p.dispatcher.history)  # issue 4's rule


def test_lines_read_a_second_at_a_time_decide_as_one_at_a_time(tmp_path):
    """The same log fed line by line (each line its own evaluation) and read whole as `replay`
    does (a second of lines of every rank at once): 4 DP ranks, 0-3 lines each a second, two
    drifting down, a silence past `restart_gap` that resets them, the drift again: the same
    transitions, times and evidence."""
    from pipelines import transitions_two_ways

    rnd = random.Random(13)
    log = Timeline()
    for s in range(100 * 60):
        if 50 * 60 <= s < 57 * 60:  # silence: every rank resets
            log.wait(1)
            continue
        log.wait(1)
        order = [r for r in range(4) for _ in range(rnd.choice([0, 1, 1, 2, 3]))]
        rnd.shuffle(order)
        for r in order:
            fall = 0.8 * (s % (50 * 60)) / (50 * 60) if r < 2 else 0.0
            log.decode(every=0, accept=round(3.0 - fall + rnd.uniform(-0.05, 0.05), 2), ranks=[{"DP": r}])
    cfg = {"rules": {"drift": {"window": "1h", "bucket": "60s", "min_buckets": 6, "restart_gap": "5m",
                               "min_decline_per_hour": 0.02, "min_total_decline": 0.03, "min_falling_fraction": 0.6}}}
    one, whole = transitions_two_ways(tmp_path, lines=log.lines, doc=cfg)
    assert sorted((r, s) for n, r, s, *_ in one if n == "AcceptanceDrift") == [
        ("DP0", "firing"), ("DP0", "firing"), ("DP0", "resolved"),
        ("DP1", "firing"), ("DP1", "firing"), ("DP1", "resolved")]
    assert whole == one
