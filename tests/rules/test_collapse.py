"""The acceptance-collapse rule on real and generated decode lines."""

from pathlib import Path

from specwatch.rules.collapse import CollapseConfig
from specwatch.rules.windows import WindowConfig
from specwatch.core.events import DecodeBatch, LogLine
from specwatch.rules.collapse import CollapseRule
from window_tracker import WindowTracker
from specwatch.engines.sglang.log import parse_line

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "samples"


def decode_text(accept: float, *, ts: int = 0, rank: str = "TP0", running: int = 32) -> str:
    rank_part = f" {rank}" if rank else ""
    return (f"[2026-02-23 16:32:{ts:02d}{rank_part}] Decode batch, #running-req: {running}, #token: 2268, "
            f"token usage: 0.02, accept len: {accept:.2f}, accept rate: 0.21, cuda graph: False, "
            f"gen throughput (token/s): 400.57, #queue-req: 0")


def decode(accept: float, *, ts: int = 0, rank: str = "TP0", running: int = 32) -> DecodeBatch:
    line = decode_text(accept, ts=ts, rank=rank, running=running)
    ev = parse_line(line)
    assert isinstance(ev, DecodeBatch), line
    return ev


def feed(rule, server, batches, tracker=None):
    """Classify each batch (as the pipeline does) and feed the collapse rule."""
    tracker = tracker or WindowTracker(WindowConfig())
    return [a for b in batches if (a := rule.observe(server, tracker.decode(server, b))) is not None]


def test_real_kimi_lines_fire_with_min_batches_two():
    rule = CollapseRule(CollapseConfig(min_batches=2))
    lines = (SAMPLES / "kimi-k25-eagle3-collapse.log").read_text().splitlines()
    alerts = feed(rule, "kimi", [parse_line(l) for l in lines])
    assert len(alerts) == 1
    a = alerts[0]
    assert a.status == "firing" and a.name == "AcceptanceCollapse"
    assert a.labels == {"alertname": "AcceptanceCollapse", "severity": "critical", "server": "kimi", "rank": "TP0"}
    assert dict(a.evidence)["accept len"] == "1.06"
    assert dict(a.evidence)["accept rate"] == "0.21"
    assert dict(a.evidence)["running requests"] == "32"
    # since the first low batch (16:32:38), not the batch that tipped it
    assert a.starts_at == parse_line(lines[0]).timestamp
    assert any("midlayer" in f for f in a.fixes) and any("set_eagle3_layers_to_capture" in f for f in a.fixes)
    assert any("21504" in f for f in a.fixes)


def test_real_kimi_lines_do_not_fire_with_default_three():
    rule = CollapseRule(CollapseConfig())
    lines = (SAMPLES / "kimi-k25-eagle3-collapse.log").read_text().splitlines()
    assert feed(rule, "kimi", [parse_line(l) for l in lines]) == []
    assert not rule.collapsed("kimi", "TP0")


def test_fires_after_three_resolves_after_three_healthy():
    rule = CollapseRule(CollapseConfig())
    assert feed(rule, "s", [decode(1.0, ts=1), decode(1.05, ts=2)]) == []
    fired = feed(rule, "s", [decode(1.10, ts=3)])  # 1.10 is at the threshold: counts
    assert [a.status for a in fired] == ["firing"]
    assert rule.collapsed("s", "TP0")
    # still collapsed: no second alert while low
    assert feed(rule, "s", [decode(1.0, ts=4)] * 5) == []
    # two healthy batches are not enough
    assert feed(rule, "s", [decode(2.5, ts=10), decode(2.6, ts=11)]) == []
    resolved = feed(rule, "s", [decode(1.5, ts=12)])  # exactly recover threshold counts
    assert [a.status for a in resolved] == ["resolved"]
    assert resolved[0].ends_at == decode(1.5, ts=12).timestamp
    assert resolved[0].fingerprint == fired[0].fingerprint
    assert not rule.collapsed("s", "TP0")


def test_between_thresholds_resets_runs_no_flap():
    rule = CollapseRule(CollapseConfig())
    seq = [decode(1.0), decode(1.0), decode(1.3), decode(1.0), decode(1.0)]
    assert feed(rule, "s", seq) == []  # 1.3 broke the run


def test_idle_rank_never_collapses():
    rule = CollapseRule(CollapseConfig())
    assert feed(rule, "s", [decode(1.0, running=0)] * 10) == []


def test_ranks_are_independent():
    rule = CollapseRule(CollapseConfig())
    batches = []
    for i in range(3):
        batches += [decode(1.0, ts=i, rank="DP0 TP0"), decode(2.9, ts=i, rank="DP1 TP1")]
    alerts = feed(rule, "s", batches)
    assert [(a.labels["rank"], a.status) for a in alerts] == [("DP0 TP0", "firing")]
    assert rule.collapsed("s", "DP0 TP0") and not rule.collapsed("s", "DP1 TP1")


def test_no_accept_fields_means_no_decision():
    rule = CollapseRule(CollapseConfig())
    line = ("[2026-04-05 20:02:51] Decode batch, #running-req: 32, #token: 11179, token usage: 0.08, "
            "cuda graph: True, gen throughput (token/s): 1635.11, #queue-req: 0")
    assert feed(rule, "s", [parse_line(line)] * 5) == []


def test_state_round_trip_keeps_firing_alert():
    rule = CollapseRule(CollapseConfig())
    fired = feed(rule, "s", [decode(1.0, ts=i) for i in range(3)])
    state = rule.to_state()
    rule2 = CollapseRule(CollapseConfig())
    rule2.load_state(state)
    assert rule2.collapsed("s", "TP0")
    resolved = feed(rule2, "s", [decode(3.0, ts=10 + i) for i in range(3)])
    assert [a.status for a in resolved] == ["resolved"]
    assert resolved[0].starts_at == fired[0].starts_at


def test_state_of_earlier_versions_keeps_firing_alert():
    """A state saved before collapse kept its alerts in `active` (the alert in each rank's entry)."""
    rule = CollapseRule(CollapseConfig())
    fired = feed(rule, "s", [decode(1.0, ts=i) for i in range(3)])
    state = rule.to_state()
    alerts = state.pop("active")
    assert list(alerts) == ["s|TP0"]
    for d in state["ranks"]:
        d.update(collapsed=True, alert=alerts["s|TP0"])
    rule2 = CollapseRule(CollapseConfig())
    rule2.load_state(state)
    assert rule2.collapsed("s", "TP0") and rule2.firing_alerts()[0].fingerprint == fired[0].fingerprint
    resolved = feed(rule2, "s", [decode(3.0, ts=10 + i) for i in range(3)])
    assert [(a.status, a.evidence[0][0]) for a in resolved] == [("resolved", "recovered accept len")]


def test_server_args_paths_appear_in_evidence_and_fixes():
    rule = CollapseRule(CollapseConfig())
    ev = parse_line("[2026-02-23 16:00:00] server_args=ServerArgs(model_path='/models/Kimi-K2.5', "
                    "speculative_algorithm='EAGLE', speculative_draft_model_path='/models/k25-eagle3', "
                    "speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)")
    rule.observe_server_args("s", ev)
    a = feed(rule, "s", [decode(1.0, ts=i) for i in range(3)])[0]
    ev_d = dict(a.evidence)
    assert ev_d["speculative_algorithm"] == "EAGLE"
    assert ev_d["speculative_draft_model_path"] == "/models/k25-eagle3"
    assert any("/models/k25-eagle3/config.json" in f for f in a.fixes)
    assert any("(this server: `EAGLE`)" in f for f in a.fixes)


def test_restart_resolves_the_collapse_and_resets_ranks():
    """The usual fix is a restart with other flags (or speculation off): the collapse of the old
    process resolves; decode lines without accept fields afterwards keep it resolved."""
    from specwatch.alerts.dispatcher import Dispatcher
    from specwatch.config import build_config
    from specwatch.core.pipeline import Pipeline

    cfg = build_config({"server": "s", "logs": [{"path": "s.log"}], "diagnosis": {"enabled": False}})
    p = Pipeline(cfg, Dispatcher([], group_wait=0, group_interval=0, keep_history=True))
    for i in range(3):
        p.feed(LogLine("s.log", decode_text(1.0, ts=i)))
    assert [a.status for a in p.dispatcher.history] == ["firing"]
    text = "[2026-02-23 17:00:00] server_args=ServerArgs(model_path='/m', speculative_algorithm=None)"
    p.feed(LogLine("s.log", text))
    out = p.dispatcher.history[1:]
    assert [(a.status, a.labels["rank"]) for a in out] == [("resolved", "TP0")]
    assert out[0].ends_at == parse_line(text).timestamp
    assert out[0].evidence[0] == ("resolved because", "the server restarted (new server_args line)")
    assert not p.collapse.collapsed("s", "TP0")
    for i in range(2):  # runs start over
        p.feed(LogLine("s.log", decode_text(1.0, ts=10 + i)))
    assert len(p.dispatcher.history) == 2


def test_known_causes_commands_use_the_servers_paths_or_the_hub_snapshot():
    from specwatch.rules.collapse import known_causes

    local = known_causes({"speculative_draft_model_path": "/models/d", "model_path": "/models/t",
                          "speculative_algorithm": "EAGLE3"})
    assert local[0].startswith("Run the whole diagnosis") and \
        "`specwatch diagnose --draft /models/d --target /models/t --algorithm EAGLE3`" in local[0]
    # the folder reaches the Python check as its argument (tests/test_hostile_paths.py runs them)
    assert "glob.glob(glob.escape(sys.argv[1]) + '/*.safetensors')" in local[1] and ".keys()}))\" /models/d`" in local[1]
    hub = known_causes({"speculative_draft_model_path": "Rayzl/qwen2.5-vl-7b-eagle3-sgl"})
    # a repo id is no folder: the commands read its local snapshot instead of printing []
    assert ".keys()}))\" \"$(huggingface-cli download Rayzl/qwen2.5-vl-7b-eagle3-sgl)\"`" in hub[1]


def test_after_a_restart_repeats_carry_the_rules_current_evidence(tmp_path):
    """The state file restores the rule's alert and the dispatcher's copy; they are one object
    again, so a repeat after the restart shows the newest accept len, not the saved one."""
    from specwatch.alerts.dispatcher import Dispatcher
    from specwatch.config import build_config
    from specwatch.core.pipeline import Pipeline

    cfg = build_config({"server": "s", "diagnosis": {"enabled": False}})
    p1 = Pipeline(cfg, Dispatcher([], group_wait=0))
    for i in range(3):
        p1.feed(LogLine("s.log", decode_text(1.07, ts=i)), now=float(i))
    with p1.lock:
        state = p1.to_state()
    p2 = Pipeline(cfg, Dispatcher([], group_wait=0))
    p2.load_state(state)
    p2.feed(LogLine("s.log", decode_text(1.09, ts=10)), now=10.0)
    [alert] = p2.dispatcher.alerts.values()
    assert dict(alert.evidence)["accept len"] == "1.09"
