"""SpecwatchSourceDown through the pipeline: a source failing past `down_for` raises it, a
shorter gap (a rotation) does not, a good read resolves it, and a down server's API is muted."""

from __future__ import annotations

from specwatch.alerts.dispatcher import Dispatcher
from specwatch.alerts.inhibit import default_inhibit_rules
from specwatch.config import build_config
from specwatch.core.events import ApiSample, MetricsSample, SourceHealth
from specwatch.core.pipeline import Pipeline
from timeline import Recorder

T0 = 1.9e9


def _pipeline(extra=None, rec=None):
    cfg = build_config({"server": "sglang-0", "logs": ["/var/log/sglang/server.log"], "diagnosis": {"enabled": False},
                        "server_api": {"url": "http://127.0.0.1:30000"},
                        "server_metrics": [{"url": "http://user:pw@127.0.0.1:30000/metrics?x=1"}],
                        "process": {"servers": {30000: "sglang-0"}}, **(extra or {})})
    d = Dispatcher([rec] if rec else [], group_by=["..."], group_wait=0, group_interval=0, keep_history=True,
                   inhibit_rules=default_inhibit_rules())
    return Pipeline(cfg, d)


def _fired(p):
    return [(a.name, a.status, a.labels["source_kind"], a.labels["source"]) for a in p.dispatcher.history]


def test_a_missing_file_fires_after_down_for_and_resolves_when_it_opens():
    p = _pipeline()
    path = "/var/log/sglang/server.log"
    p.feed_event("sglang-0", SourceHealth(T0, "file", path, False, "does not exist"), T0)
    p.tick(T0 + 59)
    assert _fired(p) == []  # a rotation's gap, a late start: not yet
    p.tick(T0 + 61)
    assert _fired(p) == [("SpecwatchSourceDown", "firing", "file", path)]
    a = p.dispatcher.history[0]
    assert a.labels["severity"] == "warning" and a.labels["server"] == "sglang-0"
    assert dict(a.evidence)["error"] == "does not exist" and a.starts_at == T0
    p.feed_event("sglang-0", SourceHealth(T0 + 70, "file", path, True), T0 + 70)
    assert _fired(p)[-1] == ("SpecwatchSourceDown", "resolved", "file", path)


def test_a_gap_shorter_than_down_for_never_fires():
    p = _pipeline({"rules": {"source_down": {"down_for": "10s"}}})
    path = "/var/log/sglang/server.log"
    for t in (0, 20, 40):
        p.feed_event("sglang-0", SourceHealth(T0 + t, "file", path, False, "does not exist"), T0 + t)
        p.tick(T0 + t + 9)
        p.feed_event("sglang-0", SourceHealth(T0 + t + 9.5, "file", path, True), T0 + t + 9.5)
        p.tick(T0 + t + 15)
    assert _fired(p) == []


def test_api_and_metrics_failures_but_not_a_5xx():
    p = _pipeline()
    api, metrics = "http://127.0.0.1:30000", "http://127.0.0.1:30000/metrics"
    p.feed_event("sglang-0", ApiSample(T0, api, True, "http_503"), T0)
    p.feed_event("sglang-0", MetricsSample(T0, metrics, None, error="connection_error"), T0)
    p.tick(T0 + 61)
    assert _fired(p) == [("SpecwatchSourceDown", "firing", "server_metrics", metrics)]
    p.feed_event("sglang-0", ApiSample(T0 + 62, api, True, "unauthorized"), T0 + 62)
    p.tick(T0 + 130)
    assert _fired(p)[-1] == ("SpecwatchSourceDown", "firing", "server_api", api)
    assert "connection_error" in p.dispatcher.history[0].annotations["description"]


def test_a_down_server_mutes_its_api_source_alert_only():
    rec = Recorder()
    p = _pipeline(rec=rec)
    api = "http://127.0.0.1:30000"
    p.feed_event("sglang-0", ApiSample(T0, api, False, "connection_error"), T0)
    p.feed_event("sglang-0", SourceHealth(T0, "file", "/var/log/sglang/server.log", False, "is a directory"), T0)
    from specwatch.core.events import ProcessSample
    p.feed_event("sglang-0", ProcessSample(T0, None, expected=True), T0)  # declared, never seen: down
    p.tick(T0 + 61)
    fired = {(a.name, a.labels.get("source_kind", "")) for a in p.dispatcher.history if a.status == "firing"}
    assert fired == {("ServerDown", ""), ("SpecwatchSourceDown", "server_api"), ("SpecwatchSourceDown", "file")}
    assert sorted(n for n, s, _ in rec.got if s == "firing") == ["ServerDown", "SpecwatchSourceDown"]


def test_a_source_removed_from_the_config_resolves_its_alert():
    p = _pipeline()
    path = "/var/log/sglang/server.log"
    p.feed_event("sglang-0", SourceHealth(T0, "file", path, False, "does not exist"), T0)
    p.tick(T0 + 61)
    p.reconfigure(build_config({"server": "sglang-0", "logs": ["/var/log/sglang/other.log"],
                                "diagnosis": {"enabled": False}}))
    p.tick(T0 + 62)
    assert _fired(p)[-1] == ("SpecwatchSourceDown", "resolved", "file", path)
    assert dict(p.dispatcher.history[-1].evidence)["resolved because"] == "the source is no longer configured"


def _process(start_time):
    from specwatch.core.events import ServerProcess
    return ServerProcess(pid=4242, start_time=start_time, port=30000, cmdline=("python", "-m", "sglang.launch_server"),
                         args={}, interpreter=None, fs_root="/", sglang_version=None, sglang_location=None,
                         pids=(4242,), roles={})


def test_an_api_that_does_not_answer_while_the_model_loads_waits_for_startup_grace():
    """SGLang serves HTTP once its model is loaded: a process started a moment ago whose API
    refuses connections is loading; one running for long beside a failing URL is a wrong URL."""
    from specwatch.core.events import ProcessSample

    api = "http://127.0.0.1:30000"
    p = _pipeline()
    p.feed_event("sglang-0", ProcessSample(T0, _process(T0 - 5)), T0)
    p.feed_event("sglang-0", ApiSample(T0, api, False, "connection_error"), T0)
    p.tick(T0 + 300)
    assert _fired(p) == []  # loading
    p.tick(T0 - 5 + 600 + 61)
    assert _fired(p) == [("SpecwatchSourceDown", "firing", "server_api", api)]
    assert p.dispatcher.history[0].starts_at == T0

    p = _pipeline()
    p.feed_event("sglang-0", ProcessSample(T0, _process(T0 - 3600)), T0)  # up for an hour: the URL is wrong
    p.feed_event("sglang-0", ApiSample(T0, api, False, "connection_error"), T0)
    p.tick(T0 + 61)
    assert _fired(p) == [("SpecwatchSourceDown", "firing", "server_api", api)]


def test_an_alert_restored_from_the_state_resolves_at_the_first_good_read():
    path = "/var/log/sglang/server.log"
    p = _pipeline()
    p.feed_event("sglang-0", SourceHealth(T0, "file", path, False, "does not exist"), T0)
    p.tick(T0 + 61)
    state = p.to_state()
    q = _pipeline()  # specwatch restarted; the file is there now
    q.load_state(state)
    q.feed_event("sglang-0", SourceHealth(T0 + 100, "file", path, True), T0 + 100)
    assert _fired(q)[-1] == ("SpecwatchSourceDown", "resolved", "file", path)
