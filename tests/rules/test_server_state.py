"""ServerDown / ServerRestarted / ServerUnhealthy through the real pipeline, fed by the real process
source (fake SGLang launchers in a venv) and the real HTTP API source (local SGLang-shaped server).
Time is passed explicitly: the same `now` the daemon would use."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ has no __init__.py
from fake_sglang import stop  # noqa: E402
from procs import free_port  # noqa: E402
from sglang_http import SGLangHTTP  # noqa: E402

from specwatch.alerts.dispatcher import Dispatcher  # noqa: E402
from specwatch.config import build_config  # noqa: E402
from specwatch.core.pipeline import Pipeline  # noqa: E402
from specwatch.sources.process import ProcessSource  # noqa: E402
from specwatch.sources.server_api import ServerApiSource  # noqa: E402

MODEL = "/models/meta-llama/Llama-3.1-8B-Instruct"
DRAFT = "/models/lmsys/sglang-EAGLE3-LLaMA3.1-Instruct-8B"


def argv(python, port, steps=5, draft=DRAFT):
    return [str(python), "-m", "sglang.launch_server", "--model-path", MODEL, "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", draft, "--speculative-num-steps", str(steps),
            "--speculative-eagle-topk", "8", "--speculative-num-draft-tokens", "32", "--port", str(port)]


def make_pipeline(extra: dict | None = None) -> Pipeline:
    cfg = build_config({"server": "gpu-box-1", "logs": [{"path": "/var/log/sglang/a.log", "server": "sglang-a"}],
                        "rules": {"server": {"down_for": "30s", "restart_window": "10m", "unhealthy_for": "2m"}},
                        **(extra or {})})
    return Pipeline(cfg, Dispatcher([]))


def sent(p: Pipeline) -> list[tuple[str, str]]:
    return [(a.name, a.status) for a in p.dispatcher.history]


def tick(p: Pipeline, now: float) -> None:
    with p.lock:
        p.tick(now)


def seen_then_down(procs, launcher: list[str], port: int, server: str, extra: dict | None = None, children: int = 2):
    """A server seen at t, gone at t + 5, ticked at t + 40 (down 35 s) → (pipeline, source, t, process)."""
    p1 = procs.start(launcher, children=children)
    pl = make_pipeline(extra)
    src = ProcessSource(pl.feed_event, server="gpu-box-1", servers={port: server})
    t = 1_800_000_000.0
    src.poll(t)
    stop(p1)
    src.poll(t + 5)
    tick(pl, t + 40)
    return pl, src, t, p1


def test_down_restart_with_changed_flags_and_resolve(sglang_install, sglang_procs):
    port = free_port()
    p1 = sglang_procs.start(argv(sglang_install, port, steps=5))
    pl = make_pipeline()
    src = ProcessSource(pl.feed_event, server="gpu-box-1", servers={port: "sglang-a"})
    t = 1_800_000_000.0
    src.poll(t)
    tick(pl, t + 1)
    assert sent(pl) == []  # first sight of a running server: nothing to say

    stop(p1)
    src.poll(t + 10)
    tick(pl, t + 39)
    assert sent(pl) == []  # down for 29 s: not yet
    tick(pl, t + 40)
    assert sent(pl) == [("ServerDown", "firing")]
    down = pl.dispatcher.history[-1]
    ev = dict(down.evidence)
    assert down.labels == {"alertname": "ServerDown", "severity": "critical", "server": "sglang-a", "rank": "",
                           "engine": "sglang"}
    assert ev["last pid"] == str(p1.pid)
    assert ev["down for (s)"] == "30"
    assert "steps=5" in ev["last speculative flags"] and "algorithm=EAGLE3" in ev["last speculative flags"]
    assert any("/var/log/sglang/a.log" in f for f in down.fixes)
    assert any("--speculative-num-steps 5 --speculative-eagle-topk 8" in f for f in down.fixes)
    tick(pl, t + 100)
    assert len(pl.dispatcher.history) == 1  # no repeat inside repeat_interval

    p2 = sglang_procs.start(argv(sglang_install, port, steps=3, draft="/models/new-draft"))
    src.poll(t + 120)
    assert sent(pl)[1:] == [("ServerDown", "resolved"), ("ServerRestarted", "firing")]
    restart = pl.dispatcher.history[-1]
    ev = dict(restart.evidence)
    assert ev["old pid"] == str(p1.pid) and ev["new pid"] == str(p2.pid)
    assert ev["speculative flags"] == "changed"
    assert ev["speculative_num_steps"] == "5 → 3"
    assert ev["speculative_draft_model_path"] == f"{DRAFT} → /models/new-draft"
    assert "speculative_eagle_topk" not in ev  # unchanged flags are not listed as changes
    assert any("specwatch_accept_length" in f for f in restart.fixes)
    assert dict(pl.dispatcher.history[1].evidence)["down for (s)"] == "110"

    # the merged settings follow the new process
    assert pl.servers["sglang-a"].server_args.args["speculative_num_steps"] == 3
    assert pl.collapse._server_args["sglang-a"]["speculative_draft_model_path"] == "/models/new-draft"

    tick(pl, t + 120 + 599)
    assert sent(pl)[-1] == ("ServerRestarted", "firing")
    tick(pl, t + 120 + 600)
    assert sent(pl)[-1] == ("ServerRestarted", "resolved")

    # healthy from here on: many scans, many ticks, nothing sent
    n = len(pl.dispatcher.history)
    for i in range(20):
        src.poll(t + 800 + 5 * i)
        tick(pl, t + 800 + 5 * i)
    assert len(pl.dispatcher.history) == n


def test_unchanged_flags_and_crash_loop_is_one_alert(sglang_install, sglang_procs):
    port = free_port()
    pl = make_pipeline()
    src = ProcessSource(pl.feed_event, server="gpu-box-1", servers={port: "sglang-a"})
    t = 1_800_000_000.0
    pids = []
    for i in range(3):
        p = sglang_procs.start(argv(sglang_install, port))
        pids.append(p.pid)
        src.poll(t + 10 * i)
        tick(pl, t + 10 * i)
        stop(p)
    assert sent(pl) == [("ServerRestarted", "firing")]
    a = pl.dispatcher.history[0]
    ev = dict(pl.rules[1].active.get("sglang-a|restart").evidence)
    assert ev["restarts in window"] == "2"
    assert ev["speculative flags"].startswith("unchanged (algorithm=EAGLE3")
    assert dict(a.evidence)["new pid"] in {str(x) for x in pids}


def test_declared_server_never_started_is_down(sglang_install):
    port = free_port()
    pl = make_pipeline()
    src = ProcessSource(pl.feed_event, server="gpu-box-1", servers={port: "sglang-a"})
    t = 1_800_000_000.0
    src.poll(t)
    tick(pl, t + 30)
    assert sent(pl) == [("ServerDown", "firing")]
    assert "never since specwatch started" in dict(pl.dispatcher.history[0].evidence)["seen"]


def test_undeclared_box_without_sglang_stays_quiet():
    pl = make_pipeline()
    src = ProcessSource(pl.feed_event, server="gpu-box-1", servers={}, match=r"^no-such-program-\d{9}$")
    t = 1_800_000_000.0
    for i in range(10):
        src.poll(t + 5 * i)
        tick(pl, t + 5 * i)
    assert sent(pl) == []


def test_api_only_down_restart_via_startup_time():
    srv = SGLangHTTP("0.5.23")
    port = int(srv.url.rsplit(":", 1)[1])
    pl = make_pipeline()
    api = ServerApiSource(srv.url, pl.feed_event, server="sglang-a", timeout=0.5)
    t = 1_800_000_000.0
    try:
        api.poll(t)
        srv.close()
        api.poll(t + 10)
        tick(pl, t + 39)
        assert sent(pl) == []
        tick(pl, t + 40)
        assert sent(pl) == [("ServerDown", "firing")]
        ev = dict(pl.dispatcher.history[0].evidence)
        assert ev["last API error"] == "connection_error" and ev["API"] == srv.url
        assert "HTTP API has not answered for 30 s" in pl.dispatcher.history[0].annotations["description"]
        srv = SGLangHTTP("0.5.23", port=port)
        srv.startup_time += 3600
        srv.args["speculative_num_steps"] = 3
        api.poll(t + 60)
        assert sent(pl)[1:] == [("ServerDown", "resolved"), ("ServerRestarted", "firing")]
        ev = dict(pl.dispatcher.history[-1].evidence)
        assert ev["speculative_num_steps"] == "5 → 3"
        assert ev["seen by"].endswith("/server_info startup_time")
    finally:
        srv.close()


def test_unhealthy_after_healthy_fires_and_resolves_loading_does_not(sglang_install, sglang_procs):
    port = free_port()
    srv = SGLangHTTP("0.5.23")
    srv.health_status = 503  # still loading: never healthy yet
    p = sglang_procs.start(argv(sglang_install, port))
    pl = make_pipeline()
    src = ProcessSource(pl.feed_event, server="gpu-box-1", servers={port: "sglang-a"})
    api = ServerApiSource(srv.url, pl.feed_event, server="sglang-a", timeout=0.5)
    t = 1_800_000_000.0
    try:
        for i in range(40):
            src.poll(t + 10 * i)
            api.poll(t + 10 * i)
            tick(pl, t + 10 * i)
        assert sent(pl) == []  # 400 s of 503 while loading: not an alert
        srv.health_status = 200
        api.poll(t + 400)
        srv.health_status = 503  # /health is asked every 60 s while fine: next at t+460
        for i in range(1, 18):
            api.poll(t + 400 + 10 * i)
            tick(pl, t + 400 + 10 * i)
        assert sent(pl) == []  # failing since t+460: 110 s < unhealthy_for
        api.poll(t + 580)
        tick(pl, t + 580)
        assert sent(pl) == [("ServerUnhealthy", "firing")]
        a = pl.dispatcher.history[0]
        assert dict(a.evidence)["failure"] == "/health answered 503"
        assert dict(a.evidence)["pid"] == str(p.pid)
        assert any(f"py-spy dump --pid {p.pid}" in f for f in a.fixes)
        srv.health_status = 200
        api.poll(t + 600)  # while failing, /health is asked at every poll
        assert sent(pl)[-1] == ("ServerUnhealthy", "resolved")
    finally:
        srv.close()


def test_state_survives_specwatch_restart(sglang_install, sglang_procs):
    port = free_port()
    pl, src, t, p1 = seen_then_down(sglang_procs, argv(sglang_install, port), port, "sglang-a")
    assert sent(pl) == [("ServerDown", "firing")]
    with pl.lock:
        state = pl.to_state()

    # specwatch restarts; meanwhile the server came back with other flags
    sglang_procs.start(argv(sglang_install, port, steps=7))
    pl2 = make_pipeline()
    pl2.load_state(state)
    src2 = ProcessSource(pl2.feed_event, server="gpu-box-1", servers={port: "sglang-a"})
    src2.poll(t + 100)
    assert sent(pl2) == [("ServerDown", "resolved"), ("ServerRestarted", "firing")]
    ev = dict(pl2.dispatcher.history[-1].evidence)
    assert ev["noticed"] == "after specwatch itself restarted"
    assert ev["speculative_num_steps"] == "5 → 7"


def test_a_stray_server_that_exits_is_forgotten_not_paged(sglang_install, sglang_procs):
    """process.servers empty: a launcher that is not the followed log's server (issue 10 item 3)."""
    from specwatch.config import ProcessTies

    port = free_port()
    stray = sglang_procs.start(argv(sglang_install, port, draft="/scratch/notebook-draft"))
    pl = make_pipeline()
    src = ProcessSource(pl.feed_event, server="gpu-box-1", ties=ProcessTies.of(pl.config))
    t = 1_800_000_000.0
    src.poll(t)
    name = f"gpu-box-1:{port}"
    assert pl.servers[name].process.pid == stray.pid
    assert "sglang-a" not in pl.servers  # its settings went to its own name only
    stop(stray)
    src.poll(t + 5)
    for dt in (40, 400, 4000):
        tick(pl, t + dt)
    assert sent(pl) == []
    assert name not in pl.servers  # forgotten: no `specwatch_server_up 0`, no status page entry left behind
    rule = next(r for r in pl.rules if r.name == "server_state")
    assert name not in rule.to_state()["known"]


def _fire_down(extra: dict, name: str) -> dict:
    """A pipeline with `extra` whose declared server `name` was never seen: down fires; its state."""
    port = free_port()
    pl = make_pipeline({"process": {"servers": {port: name}}, **extra})
    src = ProcessSource(pl.feed_event, server="gpu-box-1", servers={port: name})
    t = 1_800_000_000.0
    src.poll(t)
    tick(pl, t + 31)
    assert sent(pl) == [("ServerDown", "firing")]
    return pl.to_state()


def test_saved_down_alert_resolves_when_no_source_can_resolve_it():
    t = 1_800_000_000.0 + 100
    # saved with process watching on, loaded with it off (issue 10 item 3)
    pl = make_pipeline({"process": {"enabled": False}})
    pl.load_state(_fire_down({}, "sglang-a"))
    tick(pl, t)
    assert sent(pl) == [("ServerDown", "resolved")]
    assert dict(pl.dispatcher.history[-1].evidence)["resolved because"] == \
        "process watching is off (process.enabled: false)"
    assert pl.dispatcher.active == {}

    # a server that is no longer configured (the old auto-named `server:port`)
    pl = make_pipeline()
    pl.load_state(_fire_down({}, "gpu-box-1:30001"))
    tick(pl, t)
    assert sent(pl) == [("ServerDown", "resolved")]
    assert "not a configured server" in dict(pl.dispatcher.history[-1].evidence)["resolved because"]

    # still configured (the followed log's server, process watching on): kept until it is back
    pl = make_pipeline()
    pl.load_state(_fire_down({}, "sglang-a"))
    tick(pl, t)
    assert sent(pl) == []


def test_a_vllm_server_is_named_as_vllm(tmp_path, sglang_procs):
    """New-user trial: `process: {servers: {PORT: vllm-0}}` and a vLLM server that exits and comes
    back: `ServerDown` and `ServerRestarted` (once `SGLangServerDown on vllm-0`) with the label
    engine="vllm", the texts say vLLM, not SGLang."""
    import json

    from fake_vllm import make_install

    from specwatch.notifiers.slack import build_payload, payload_text

    python = make_install(tmp_path / "vllm-env")
    port = free_port()
    vllm = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, "--speculative-config",
            json.dumps({"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 3}), "--port", str(port)]
    pl, src, t, _ = seen_then_down(sglang_procs, vllm, port, "vllm-0", {"logs": []}, children=0)
    down = pl.dispatcher.history[-1]
    assert (down.name, down.status) == ("ServerDown", "firing")
    assert down.labels == {"alertname": "ServerDown", "severity": "critical", "server": "vllm-0", "rank": "",
                           "engine": "vllm"}
    assert down.annotations["summary"] == "vLLM server vllm-0 is down"
    assert down.annotations["description"] == "No vLLM server process for 35 s."
    assert down.fixes[0].startswith("Find why it exited: the end of the vLLM log")
    text = payload_text(build_payload(down))
    assert "SGLang" not in text and "No vLLM server process for 35 s." in text

    sglang_procs.start(vllm, children=0)
    src.poll(t + 50)
    restart = pl.dispatcher.history[-1]
    assert (restart.name, restart.annotations["summary"]) == ("ServerRestarted", "vLLM server vllm-0 restarted")
    assert restart.labels["engine"] == "vllm"
    assert "SGLang" not in payload_text(build_payload(restart))
    assert "SGLang" not in restart.annotations["description"] + " ".join(restart.fixes)


def test_a_down_alert_saved_before_the_rename_resolves_under_its_old_labels():
    """State written before the rename: `SGLangServerDown`, no `engine` label. Restored, it keeps
    its labels (its fingerprint) until it resolves, so the resolve reaches the dispatcher's alert."""
    state = _fire_down({}, "sglang-a")
    for d in list(state["rules"]["server_state"]["active"].values()) + state["dispatcher"]["alerts"]:
        assert d["labels"].pop("engine") == "sglang"
        d["labels"]["alertname"] = "SGLangServerDown"
    pl = make_pipeline({"process": {"enabled": False}})
    pl.load_state(state)
    assert [a.name for a in pl.dispatcher.active.values()] == ["SGLangServerDown"]
    tick(pl, 1_800_000_000.0 + 100)
    assert sent(pl) == [("SGLangServerDown", "resolved")]
    assert "engine" not in pl.dispatcher.history[-1].labels
    assert pl.dispatcher.active == {}
