"""Throughput drop against the baseline at the same load, on generated SGLang logs."""

import random

from specwatch.alerts.dispatcher import Dispatcher
from specwatch.alerts.inhibit import default_inhibit_rules
from specwatch.rules.throughput import level_text, load_level
from pipelines import busy_log, transitions_two_ways
from timeline import Recorder, Timeline, feed, names, pipeline, run

FAST = {"window": "2m", "for": "2m", "min_window_batches": 5, "min_baseline_batches": 30}
CFG = {"rules": {"throughput_drop": FAST}}


def noisy(level, rnd, spread=0.05):
    return lambda i: round(level * rnd.uniform(1 - spread, 1 + spread), 2)


def test_drop_at_same_load_fires_and_resolves():
    rnd = random.Random(21)
    log = Timeline()
    log.decode(n=300, every=2, running=32, thr=noisy(330, rnd))  # 10 min: the baseline learns
    log.decode(n=150, every=2, running=32, thr=noisy(150, rnd))  # 5 min at 45 %, accept len unchanged
    log.decode(n=150, every=2, running=32, thr=noisy(330, rnd))
    t = run(log.lines, CFG)
    assert names(t) == [("ThroughputDrop", "firing", ""), ("ThroughputDrop", "resolved", "")]
    ev = dict(t[0].evidence)
    assert abs(float(ev["baseline at same load (token/s)"]) - 330) < 10
    assert float(ev["gen throughput (token/s)"]) < 198  # below 60 % of the baseline
    assert ev["running requests (levels)"] == "32-63"
    assert ev["accept len"] == "2.80" and ev["cuda graph"] == "True"
    assert int(dict(t[1].evidence)["recovered to baseline"].rstrip("%")) >= 80


def test_lower_load_is_not_a_drop_but_lower_throughput_at_that_load_is():
    rnd = random.Random(22)
    log = Timeline()
    for _ in range(150):  # mixed load: 32 requests → 330 token/s, 2 requests → 60 token/s
        log.decode(every=2, running=32, thr=noisy(330, rnd))
        log.decode(every=2, running=2, thr=noisy(60, rnd))
    log.decode(n=150, every=2, running=2, thr=noisy(60, rnd))  # night: only light load
    assert run(log.lines, CFG) == []
    log.decode(n=150, every=2, running=2, thr=noisy(25, rnd))  # light load, half the speed
    t = run(log.lines, CFG)
    assert names(t) == [("ThroughputDrop", "firing", "")]
    ev = dict(t[0].evidence)
    assert abs(float(ev["baseline at same load (token/s)"]) - 60) < 3
    assert ev["running requests (levels)"] == "2-3"


def test_windows_after_idle_or_prefill_do_not_count():
    rnd = random.Random(23)
    log = Timeline()
    log.decode(n=300, every=2, running=32, thr=noisy(330, rnd))
    for _ in range(60):  # each line follows idle minutes (throughput diluted by idle time)
        log.wait(180).decode(running=32, thr=40)
    for _ in range(60):  # or a prefill-dominated window
        log.prefill(n=50)
        log.decode(running=32, thr=90)
    # (the same batch of 32 decoding on after 3 silent minutes is also DecodeStalled's, off here)
    assert run(log.lines, {"rules": {**CFG["rules"], "decode_stalled": {"enabled": False}}}) == []


def test_collapse_inhibits_the_drop_of_the_same_rank():
    rec = Recorder()
    d = Dispatcher([rec], group_by=["..."], group_wait=0, group_interval=0, inhibit_rules=default_inhibit_rules(),
                   keep_history=True)
    p = pipeline(CFG, d)
    rnd = random.Random(24)
    log = Timeline()
    log.decode(n=300, every=2, thr=noisy(330, rnd))
    log.decode(n=150, every=2, accept=1.0, thr=noisy(120, rnd))  # the draft collapses: slower
    feed(p, log.lines)
    assert names(d.history) == [("AcceptanceCollapse", "firing", ""), ("ThroughputDrop", "firing", "")]
    assert rec.got == [("AcceptanceCollapse", "firing", "")]  # the drop is muted by its cause


def test_load_levels():
    assert [load_level(n) for n in (0, 1, 2, 3, 4, 7, 8, 63, 64)] == [1, 1, 2, 2, 3, 3, 4, 6, 7]
    assert [level_text(v) for v in (1, 2, 6)] == ["1", "2-3", "32-63"]



def test_a_baseline_from_the_state_file_is_used_at_once():
    """A new pipeline that loads a learned baseline compares the next lines with it from the
    first one (the rule caches each level's baseline: a level first seen after the load must
    read it, not wait for lines of its own to age out of the window)."""
    import json

    from timeline import T0

    rnd = random.Random(25)
    log = Timeline()
    log.decode(n=300, every=2, running=32, thr=noisy(330, rnd))  # the baseline learns
    p = pipeline(CFG)
    feed(p, log.lines)
    state = json.loads(json.dumps(p.to_state()))
    q = pipeline(CFG)
    q.load_state(state)
    after = Timeline(start="2026-03-01 10:20:00")
    after.decode(n=150, every=2, running=32, thr=noisy(150, rnd))  # 5 min at 45 %
    [fired] = feed(q, after.lines)
    assert (fired.name, fired.status) == ("ThroughputDrop", "firing")
    assert fired.starts_at - (T0 + 20 * 60) <= 12  # low from the 5th line (min_window_batches)


def test_a_reload_applies_new_thresholds_to_learned_baselines():
    """min_baseline_batches applies again on reload: a baseline that became too small is not
    used any more, so the recovery of a firing rank cannot be judged (it stays firing)."""
    from specwatch.config import build_config

    rnd = random.Random(26)
    log = Timeline()
    log.decode(n=300, every=2, running=32, thr=noisy(330, rnd))
    log.decode(n=150, every=2, running=32, thr=noisy(150, rnd))
    p = pipeline(CFG)
    assert names(feed(p, log.lines)) == [("ThroughputDrop", "firing", "")]
    p.reconfigure(build_config({"server": "box", "logs": [{"path": "server.log"}],
                                "rules": {"throughput_drop": {**FAST, "min_baseline_batches": 5000}}}))
    back = Timeline(start="2026-03-01 10:15:00", spec=None).decode(n=150, every=2, running=32, thr=noisy(330, rnd))
    assert feed(p, back.lines) == []
    p.reconfigure(build_config({"server": "box", "logs": [{"path": "server.log"}], **CFG}))
    assert names(feed(p, Timeline(start="2026-03-01 10:20:00", spec=None).decode(n=5, every=2, running=32).lines)) == [
        ("ThroughputDrop", "resolved", "")]


def test_a_state_loaded_into_a_running_pipeline_replaces_its_baselines():
    """load_state into a pipeline that already saw lines: its levels read the loaded baselines."""
    import json

    from timeline import T0

    rnd = random.Random(27)
    learned = pipeline(CFG)
    feed(learned, Timeline().decode(n=300, every=2, running=32, thr=noisy(330, rnd)).lines)
    state = json.loads(json.dumps(learned.to_state()))
    p = pipeline(CFG)
    feed(p, Timeline(start="2026-03-01 10:20:00").decode(n=10, every=2, running=32, thr=noisy(150, rnd)).lines)
    p.load_state(state)
    [fired] = feed(p, Timeline(start="2026-03-01 10:20:20", spec=None).decode(
        n=150, every=2, running=32, thr=noisy(150, rnd)).lines)
    assert (fired.name, fired.status) == ("ThroughputDrop", "firing")
    assert fired.starts_at - (T0 + 20 * 60) <= 30  # low from the first lines after the load


def test_lines_read_a_second_at_a_time_decide_as_one_at_a_time(tmp_path):
    """The same log fed line by line (each line its own evaluation) and read whole as `replay`
    does (one evaluation per second of lines of every rank, several lines of a rank and load
    levels mixed within a second): the same transitions, times and evidence."""
    lines = busy_log(8, {}, {0: 0.45, 1: 0.5})
    one, whole = transitions_two_ways(tmp_path, lines, CFG)
    assert {(n, r, s) for n, r, s, *_ in one} == {
        ("ThroughputDrop", rank, status) for rank in ("DP0 TP0", "DP1 TP1") for status in ("firing", "resolved")}
    assert whole == one
