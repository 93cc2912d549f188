"""Collapse alerts carry the probes' findings, computed ahead of time; late findings → one update."""

from __future__ import annotations

import threading
import time

import pytest

from checkpoints import OUT as CK
from specwatch import diagnosis
from specwatch.alerts.dispatcher import Dispatcher
from specwatch.config import build_config
from specwatch.core.events import LogLine
from specwatch.core.pipeline import Pipeline


class Recorder:
    """A receiver keeping the alerts of each notification, in order."""

    name = "rec"
    send_resolved = True

    def __init__(self):
        self.got = []

    def notify(self, notification):
        self.got.extend(notification.alerts)


def server_args_line(algorithm="EAGLE3", draft="speculators-converted"):
    return (f"[2026-02-23 16:30:00] server_args=ServerArgs(model_path='{CK / 'target-llama'}', "
            f"speculative_algorithm='{algorithm}', speculative_draft_model_path='{CK / draft}', "
            "speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)")


def decode(sec: int, accept=1.02):
    return (f"[2026-02-23 16:32:{sec:02d} TP0] Decode batch, #running-req: 32, #token: 2268, token usage: 0.02, "
            f"accept len: {accept:.2f}, accept rate: 0.21, cuda graph: False, gen throughput (token/s): 400.57, "
            "#queue-req: 0")


def pipeline(sglang_root, background):
    cfg = build_config({"server": "k25", "logs": [{"path": "/x.log"}],
                        "diagnosis": {"sglang_root": str(sglang_root), "timeout": "30s"}})
    rec = Recorder()
    # every change notified at once (no group_wait / group_interval), as replay does
    return Pipeline(cfg, Dispatcher([rec], group_wait=0, group_interval=0), diagnosis_background=background), rec


def feed(p, text):
    p.feed(LogLine("/x.log", text), now=time.time())  # wall clock, as the daemon does


def test_findings_ready_before_the_collapse_lead_the_fixes(sglang_roots):
    p, rec = pipeline(sglang_roots["0.5.11"], background=False)
    feed(p, server_args_line())
    for s in range(3):
        feed(p, decode(s))
    assert len(rec.got) == 1
    a = rec.got[0]
    assert a.fixes[0].startswith("[error] config_format: speculators-format config: SGLang 0.5.11 cannot read it")
    assert a.fixes[1].startswith("[error] unloaded_weights: 10 checkpoint key(s) silently dropped")
    assert a.fixes[-1].startswith("d2t map:")  # the generic known causes follow the findings
    assert dict(a.evidence)["diagnosis"] == "3 error(s), 0 warning(s) on SGLang 0.5.11"


def test_a_healthy_draft_keeps_the_generic_causes_only(sglang_roots, tmp_path):
    from checkpoints import variant

    named = variant(CK / "specforge", tmp_path / "named", config={"eagle_config": {
        "eagle_aux_hidden_state_layer_ids": [1, 3, 4]}})  # aux layers written down: nothing guessed
    p, rec = pipeline(sglang_roots["0.5.23"], background=False)
    feed(p, server_args_line(draft=named))
    for s in range(3):
        feed(p, decode(s))
    assert rec.got[0].fixes[0].startswith("Run the whole diagnosis") and rec.got[0].fixes[1].startswith("Unloaded draft weights:")
    assert dict(rec.got[0].evidence)["diagnosis"] == "0 error(s), 0 warning(s) on SGLang 0.5.23"  # checked, clean


def test_probes_still_running_alert_at_once_then_one_update(sglang_roots, monkeypatch):
    gate = threading.Event()
    real = diagnosis.diagnose

    def slow(*a, **kw):
        gate.wait(20)
        return real(*a, **kw)

    monkeypatch.setattr(diagnosis, "diagnose", slow)
    p, rec = pipeline(sglang_roots["0.5.11"], background=True)
    feed(p, server_args_line(algorithm="EAGLE"))
    t0 = time.monotonic()
    for s in range(3):
        feed(p, decode(s))
    assert time.monotonic() - t0 < 1.0  # the alert never waits for the probes
    assert len(rec.got) == 1 and rec.got[0].fixes[1].startswith("Unloaded draft weights:")
    assert "update" not in rec.got[0].annotations
    with p.lock:
        p.tick(time.time())
    assert len(rec.got) == 1
    gate.set()
    deadline = time.monotonic() + 20
    while p.diagnoser.report("k25") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    for _ in range(3):
        with p.lock:
            p.tick(time.time())
    assert len(rec.got) == 2  # exactly one follow-up
    upd = rec.got[1]
    assert upd.fingerprint == rec.got[0].fingerprint and upd.status == "firing"
    assert upd.annotations["update"] == "specwatch diagnose: 4 error(s), 0 warning(s) on SGLang 0.5.11"
    assert any(f.startswith("[error] fc_bypass:") for f in upd.fixes)
    assert "update" not in p.dispatcher.active[upd.fingerprint].annotations  # repeats do not say "update"
    # the same episode goes on: no more updates
    feed(p, decode(4))
    with p.lock:
        p.tick(time.time())
    assert len(rec.got) == 2


def test_resolved_before_findings_no_update(sglang_roots, monkeypatch):
    gate = threading.Event()
    real = diagnosis.diagnose
    monkeypatch.setattr(diagnosis, "diagnose", lambda *a, **kw: (gate.wait(20), real(*a, **kw))[1])
    p, rec = pipeline(sglang_roots["0.5.11"], background=True)
    feed(p, server_args_line())
    for s in range(3):
        feed(p, decode(s))
    for s in range(3, 6):
        feed(p, decode(s, accept=2.9))
    gate.set()
    deadline = time.monotonic() + 20
    while p.diagnoser.report("k25") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    with p.lock:
        p.tick(time.time())
    assert [a.status for a in rec.got] == ["firing", "resolved"]


def test_disabled(sglang_roots):
    cfg = build_config({"diagnosis": {"enabled": False}})
    p = Pipeline(cfg, Dispatcher([]))
    assert p.diagnoser is None and p.collapse.diagnoser is None


@pytest.mark.parametrize("args, expected", [
    ({}, None),
    ({"speculative_draft_model_path": "org/name-not-cached"}, None),
])
def test_nothing_to_diagnose(args, expected, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    d = diagnosis.Diagnoser(background=False)
    d.observe("s", args)
    assert d.report("s") is expected and not d.pending("s")


def test_late_findings_for_several_ranks_are_one_update_message(sglang_roots, monkeypatch):
    """4 ranks collapse together while the probes run: one message; the findings arrive for all
    4 at the same tick: one update message with the 4 alerts marked, not one per rank."""
    gate = threading.Event()
    real = diagnosis.diagnose
    monkeypatch.setattr(diagnosis, "diagnose", lambda *a, **kw: (gate.wait(20), real(*a, **kw))[1])
    p, _ = pipeline(sglang_roots["0.5.11"], background=True)
    messages = []
    p.dispatcher.default_route.receivers = [
        type("Rec", (), {"name": "rec", "send_resolved": True, "notify": lambda self, n: messages.append(n)})()]
    p.dispatcher.default_route.group_by = ["alertname", "server"]
    feed(p, server_args_line(algorithm="EAGLE"))
    for s in range(3):
        for r in range(4):
            feed(p, decode(s).replace(" TP0]", f" TP{r}]"))
    gate.set()
    deadline = time.monotonic() + 20
    while p.diagnoser.report("k25") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    for _ in range(3):
        with p.lock:
            p.tick(time.time())
    updates = [n for n in messages if any("update" in a.annotations for a in n.alerts)]
    assert len(updates) == 1, [[a.labels["rank"] for a in n.alerts] for n in messages]
    assert sorted(a.labels["rank"] for a in updates[0].alerts if "update" in a.annotations) == [
        "TP0", "TP1", "TP2", "TP3"]
