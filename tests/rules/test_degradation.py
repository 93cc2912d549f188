"""Acceptance degradation on generated SGLang logs, through the whole pipeline."""

import random

from specwatch.rules.degradation import DegradationConfig
from specwatch.rules.degradation import DegradationRule, path_matches
from pipelines import busy_log, transitions_two_ways
from timeline import T0, Timeline, feed, names, pipeline, run

# Short windows keep the logs small; the logic is the same at the defaults (10m / 10m).
FAST = {"window": "2m", "for": "2m", "min_window_batches": 10, "min_baseline_batches": 100}


def noisy(level, rnd, spread=0.08):
    return lambda i: round(level + rnd.uniform(-spread, spread), 2)


def test_configured_baseline_fires_after_for_and_resolves():
    rnd = random.Random(7)
    log = Timeline(model_path="/models/moonshotai/Kimi-K2.5", speculative_draft_model_path="/models/k25-eagle3")
    log.decode(n=150, every=2, accept=noisy(3.0, rnd))  # 5 min at the expected level
    log.decode(n=300, every=2, accept=noisy(2.2, rnd))  # 10 min at -27 %
    log.decode(n=150, every=2, accept=noisy(3.0, rnd))  # back
    cfg = {"rules": {"degradation": {**FAST, "expected": [
        {"model": "Kimi-K2.5", "draft": "k25-eagle3", "accept_length": 3.0}]}}}
    t = run(log.lines, cfg)
    assert names(t) == [("AcceptanceDegradation", "firing", ""), ("AcceptanceDegradation", "resolved", "")]
    fired, resolved = t
    ev = dict(fired.evidence)
    assert ev["baseline accept len"] == "3.00" and ev["baseline from"] == "configured"
    assert 2.1 < float(ev["mean accept len"]) < 2.4  # below 2.40 = 3.0 × (1 − 0.20)
    assert ev["model_path"] == "/models/moonshotai/Kimi-K2.5"
    assert fired.labels == {"alertname": "AcceptanceDegradation", "severity": "warning", "server": "box", "rank": "",
                            "engine": "sglang"}
    # the drop starts at 300 s; the 2-minute mean crosses 2.40 when 3/4 of its lines are low
    # (about 90 s later); the alert fires 2 minutes after that
    assert 330 <= fired.starts_at - T0 <= 420
    assert "regression" in fired.annotations["description"] and len(fired.fixes) == 5
    assert float(dict(resolved.evidence)["recovered mean accept len"]) >= 2.7


def test_learned_baseline_survives_a_restart_and_catches_an_engine_regression():
    """30 min healthy (the baseline learns), restart with the same model pair after an upgrade,
    accept len 25 % lower from the first request: the learned baseline catches it."""
    rnd = random.Random(3)
    log = Timeline()
    log.decode(n=900, every=2, accept=noisy(2.9, rnd))
    before = list(log.lines)
    log.lines.clear()
    log.wait(600).server_args()  # the upgraded server starts
    log.decode(n=200, every=2, accept=noisy(2.15, rnd))
    cfg = {"rules": {"degradation": FAST}}
    p = pipeline(cfg)
    assert feed(p, before) == []
    state = p.to_state()
    p2 = pipeline(cfg)  # specwatch restarted too
    p2.load_state(state)
    t = feed(p2, log.lines)
    assert names(t) == [("AcceptanceDegradation", "firing", "")]
    ev = dict(t[0].evidence)
    assert ev["baseline from"].startswith("learned from ")
    assert abs(float(ev["baseline accept len"]) - 2.9) < 0.03


def test_quiet_on_healthy_noise_idle_prefill_and_collapse_level():
    rnd = random.Random(5)
    log = Timeline()
    log.decode(n=600, every=2, accept=noisy(2.8, rnd, spread=0.4))  # noisy but healthy
    log.decode(n=200, every=2, accept=1.6, running=0)  # idle DP rank lines: not evidence
    for _ in range(100):  # prefill-dominated windows
        log.prefill(n=41)
        log.decode(accept=1.6)
    log.decode(n=20, every=2, accept=2.8)
    t = run(log.lines, {"rules": {"degradation": FAST}})
    assert t == []
    # at collapse level it is the collapse rule's alert, not a degradation
    log.decode(n=200, every=2, accept=1.02)
    t = run(log.lines, {"rules": {"degradation": FAST}})
    assert [n for n in names(t) if n[0] == "AcceptanceDegradation"] == []
    assert ("AcceptanceCollapse", "firing", "") in names(t)


def test_path_matching():
    assert path_matches("Kimi-K2.5", "/models/moonshotai/Kimi-K2.5")
    assert path_matches("moonshotai/Kimi-K2.5", "moonshotai/Kimi-K2.5/")
    assert not path_matches("K2.5", "/models/Kimi-K2.5")
    assert path_matches(None, "anything")


def test_no_baseline_no_alert():
    rule = DegradationRule(DegradationConfig(window=60, hold=60, min_window_batches=5))
    assert rule.baseline("box") == (None, "none yet")


def test_the_baseline_follows_the_servers_model_pair_and_reloaded_expectations():
    """The rule looks the baseline up per decode line (cached per server and config): new
    settings of the server, or a reloaded `expected`, apply from the next line."""
    from specwatch.config import build_config

    rnd = random.Random(9)
    expected = {"rules": {"degradation": {**FAST, "expected": [{"model": "Kimi-K2.5", "accept_length": 3.0}]}}}
    log = Timeline(model_path="/models/other-model")  # no expectation for this model
    log.decode(n=150, every=2, accept=noisy(2.2, rnd))
    p = pipeline(expected)
    assert feed(p, log.lines) == []
    log.lines.clear()
    log.server_args(model_path="/models/moonshotai/Kimi-K2.5")  # restarted with the expected model
    log.decode(n=150, every=2, accept=noisy(2.2, rnd))
    assert names(feed(p, log.lines)) == [("AcceptanceDegradation", "firing", "")]

    q = pipeline({"rules": {"degradation": FAST}})
    log = Timeline(model_path="/models/moonshotai/Kimi-K2.5")
    log.decode(n=150, every=2, accept=noisy(2.2, rnd))
    assert feed(q, log.lines) == []  # no baseline yet
    q.reconfigure(build_config({"server": "box", "logs": [{"path": "server.log"}], **expected}))
    log.lines.clear()
    log.decode(n=150, every=2, accept=noisy(2.2, rnd))
    assert names(feed(q, log.lines)) == [("AcceptanceDegradation", "firing", "")]


def test_lines_read_a_second_at_a_time_decide_as_one_at_a_time(tmp_path):
    """The same log fed line by line (each line its own evaluation) and read whole as `replay`
    does (one evaluation per second of lines of every rank, the learned baseline shared by the
    ranks): the same transitions, times and evidence."""
    lines = busy_log(5, {2: 2.2, 3: 2.3})
    one, whole = transitions_two_ways(tmp_path, lines, {"rules": {"degradation": FAST}})
    assert {(n, r, s) for n, r, s, *_ in one} == {
        ("AcceptanceDegradation", rank, status) for rank in ("DP2 TP2", "DP3 TP3") for status in ("firing", "resolved")}
    assert whole == one
