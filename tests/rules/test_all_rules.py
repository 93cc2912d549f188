"""Every rule at once, through the pipeline: quiet on healthy, idle and real input; the right
alerts, and only those, on a collapse."""

from pathlib import Path

import pytest

from sglang_lines import decode_line, mixed_log, prefill_line, server_args_line
from specwatch.alerts.dispatcher import Dispatcher
from specwatch.alerts.inhibit import default_inhibit_rules
from timeline import Recorder, Timeline, feed, names, pipeline, run

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "samples"


@pytest.mark.parametrize("version,ranks", [("0.5.23", 2), ("0.4.9", 1), ("0.5.6", 2)])
def test_quiet_on_hours_of_healthy_traffic(version, ranks):
    lines = list(mixed_log(version, 6000, ranks=ranks, seed=3))  # ~3 h of prefill/decode/access lines
    p = pipeline()
    assert feed(p, lines) == []
    decode = sum(rs.decode_batches for rs in p.ranks.values())
    assert decode > 4000  # the rules did see the traffic


def test_quiet_on_idle_servers():
    log = Timeline()
    log.decode(n=2000, every=5, accept=1.0, running=0, thr=0.0)  # idle DP ranks print running 0
    log.wait(4 * 3600)  # nothing at all for hours
    log.decode(n=20, every=2, accept=2.9)
    assert run(log.lines) == []
    pd_prefill = Timeline(disaggregation_mode="prefill").prefill(n=500, every=10)
    assert run(pd_prefill.lines) == []


# vLLM reports that must raise an alert: tests/rules/test_vllm_reports.py.
VLLM_ALERTING = ("bugreport-logs/BR-06.log", "bugreport-logs/BR-10.log", "bugreport-logs/BR-16.log")


@pytest.mark.parametrize("path", sorted(p.relative_to(SAMPLES).as_posix() for p in SAMPLES.rglob("*")
                                        if p.suffix in (".log", ".txt") and "\n# expected:" not in p.read_text()[:2000]
                                        and p.relative_to(SAMPLES).as_posix() not in VLLM_ALERTING))
def test_quiet_on_the_shared_samples(path):
    """Real lines (the Kimi sample needs a third low batch to fire with the default config).
    A sample whose header says what it must raise (`# expected:`) has its own test. The
    tracebacks some of them quote are errors (ServerLogError), the only alert."""
    alerts = run((SAMPLES / path).read_text().splitlines())
    assert [a.name for a in alerts if a.name != "ServerLogError"] == []
    assert bool(alerts) == (path in ("bugreport-logs/BR-04.log", "sglang-public-lines.txt"))


def test_real_lines_without_accept_fields_on_a_speculative_server():
    """The public decode lines printed with speculation off, behind an EAGLE3 server_args line."""
    real = [line for line in (SAMPLES / "sglang-public-lines.txt").read_text().splitlines()
            if "Decode batch" in line and "accept len" not in line]
    assert len(real) >= 5
    args = server_args_line(ts="2025-11-11 04:00:00", speculative_algorithm="EAGLE3")[0]
    t = run([args] + real)
    assert names(t) == [("SpeculationInactive", "firing", "")]
    assert dict(t[0].evidence)["gen throughput (token/s)"] == "3.83"  # the third plain line


def test_collapse_under_traffic_notifies_the_collapse_only():
    rec = Recorder()
    d = Dispatcher([rec], group_by=["..."], group_wait=0, group_interval=0, inhibit_rules=default_inhibit_rules(),
                   keep_history=True)
    lines = list(mixed_log("0.5.23", 8000, ranks=2, seed=4, collapse_after=5000))
    feed(pipeline({}, d), lines)
    raised = names(d.history)
    assert raised == [("AcceptanceCollapse", "firing", "DP0 TP0"), ("AcceptanceCollapse", "firing", "DP1 TP1"),
                      ("ThroughputDrop", "firing", "DP0 TP0"), ("ThroughputDrop", "firing", "DP1 TP1")]
    assert rec.got == [("AcceptanceCollapse", "firing", "DP0 TP0"), ("AcceptanceCollapse", "firing", "DP1 TP1")]


def test_collapse_rule_skips_prefill_dominated_windows():
    """Accept len 1.00 measured in windows with more prefill batches than decode rounds."""
    log = Timeline()
    for _ in range(10):
        log.prefill(n=41, every=0.1)
        log.decode(accept=1.0)
    assert run(log.lines) == []
    log = Timeline()
    for _ in range(3):  # 40 prefill batches (= the decode-log interval) still count
        log.prefill(n=40, every=0.1)
        log.decode(accept=1.0)
    assert names(run(log.lines)) == [("AcceptanceCollapse", "firing", "")]


def test_prefill_only_ranks_of_other_ranks_do_not_dilute():
    """Prefill lines of DP1 do not make DP0's windows prefill-dominated."""
    lines = [server_args_line(ts="2026-03-01 09:59:00")[0]]
    for i in range(3):
        ts = f"2026-03-01 10:00:{10 + i:02d}"
        lines += [prefill_line("0.5.23", ts=ts, rank={"DP": 1, "TP": 1})[0]] * 50
        lines.append(decode_line("0.5.23", ts=ts, rank={"DP": 0, "TP": 0}, accept_len=1.0)[0])
    assert names(run(lines)) == [("AcceptanceCollapse", "firing", "DP0 TP0")]


def test_a_reload_hands_every_rule_its_new_section_and_keeps_its_state():
    """`Pipeline.reconfigure` (SIGHUP): each rule takes its new thresholds, runs carry over."""
    from specwatch.config import build_config
    from specwatch.rules.base import Rule

    p = pipeline()
    assert all(type(r).reconfigure is not Rule.reconfigure for r in p.rules), [r.name for r in p.rules]
    log = Timeline().decode(n=1, accept=1.05)
    assert feed(p, log.lines) == []
    new = build_config({"server": "box", "logs": [{"path": "server.log"}], "rules": {
        "collapse": {"min_batches": 2}, "rank_disagreement": {"min_batches": 5},
        "degradation": {"window": "20m"}, "windows": {"max_gap": "5m"}}})
    p.reconfigure(new)
    sections = {id(s) for s in new.rules.values()}
    assert all(id(r.config) in sections for r in p.rules)  # each rule holds a section of the new config
    assert p._wcfg is new.windows
    # one more low line: the run of one before the reload counts (two under the new threshold)
    assert names(feed(p, Timeline(start="2026-03-01 10:00:02", spec=None).decode(n=1, accept=1.05).lines)) == [
        ("AcceptanceCollapse", "firing", "")]
    rd = next(r for r in p.rules if r.name == "rank_disagreement")
    kept = [lines for ranks in rd._recent.values() for lines in ranks.values()]
    assert kept and all(lines.maxlen == 5 and len(lines) == 2 for lines in kept)


def test_the_pipeline_decides_a_restart_once_for_every_rule():
    """A server_args log line after an earlier one (or after the server's lines) is a restart;
    the same line again, settings from the API or the command line, or a first start are not.
    The decision survives a specwatch restart through the saved state."""
    from specwatch.core.events import ServerArgs, ServerRestarted

    p = pipeline()
    got = []

    class Spy:
        name = "spy"

        def on_restart(self, server, at, why):
            got.append((server, at, why))
            return []

        def on_event(self, server, event, now):
            return []
    p._on_event = [(Spy(), True)]  # only the spy: the events here are bare
    with p.lock:
        p._apply_rules("box", ServerArgs(100.0, {}), 100.0)  # first start
        p._apply_rules("box", ServerArgs(100.0, {}), 101.0)  # the same line again
        p._apply_rules("box", ServerArgs(None, {}, "server_info"), 102.0)
        p._apply_rules("box", ServerArgs(None, {}, "cmdline"), 103.0)
        assert got == []
        p._apply_rules("box", ServerArgs(200.0, {}), 200.0)
        assert got == [("box", 200.0, "the server restarted (new server_args line)")]
        p._apply_rules("box", ServerRestarted(300.0, None, None), 300.0)
        assert got[-1] == ("box", 300.0, "the server process restarted")
        state = p.to_state()
    q = pipeline()
    q.load_state(state)
    q._on_event = [(Spy(), True)]
    with q.lock:
        q._apply_rules("box", ServerArgs(400.0, {}), 400.0)
    assert got[-1] == ("box", 400.0, "the server restarted (new server_args line)")
    # a log whose first server_args line follows decode lines: the server had an earlier life
    r = pipeline()
    r._on_event = [(Spy(), True)]
    feed(r, Timeline(spec=None).decode(n=2).server_args().lines)
    assert got[-1][2] == "the server restarted (new server_args line)" and len(got) == 4


def test_every_rule_declares_the_alert_names_it_raises():
    """`specwatch_alerts_firing` exports 0 for each declared name (issue #10 item 12): a rule
    must name each alert it raises, with its module's constant, and no name has two owners.
    (`feed` in tests/timeline.py checks each raised alert against the declared names.)"""
    import inspect

    from specwatch.rules.base import all_rules

    owners: dict[str, str] = {}
    for cls in all_rules():
        assert cls.alert_names, f"{cls.__name__} declares no alert_names"
        source = inspect.getsource(inspect.getmodule(cls))
        for n in cls.alert_names:
            assert f'"{n}"' in source, (cls.__name__, n)
            assert owners.setdefault(n, cls.name) == cls.name, f"{n} raised by {owners[n]} and {cls.name}"
    assert {"AcceptanceCollapse", "ServerDown", "GpuLost", "ThroughputDrop"} <= set(owners)
