"""vLLM logs through the whole pipeline (every rule): the reports that must alert, a generated
vLLM server that collapses, one that does not draft, and the per-position metric."""

from datetime import datetime, timedelta
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import vllm_lines as g
from specwatch.core.events import LogLine
from specwatch.core.metrics import PipelineCollector
from specwatch.alerts.dispatcher import Dispatcher
from specwatch.config import build_config
from specwatch.core.pipeline import Pipeline
from timeline import feed, names, pipeline, run

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "samples" / "bugreport-logs"


def sample(name: str) -> list[str]:
    return (SAMPLES / name).read_text().splitlines()


class VllmLog:
    """A vLLM 0.x server's stats and spec lines along a clock, 10 s apart (its default interval)."""

    def __init__(self, version: str = "0.33.0", start: str = "2026-03-01 10:00:00", **config):
        self.version, self.t, self.lines = version, datetime.strptime(start, "%Y-%m-%d %H:%M:%S"), []
        self.k = config.get("k", 3)
        if config.get("config", True):
            self.lines.append(g.config_line(version, ts=self.stamp, **{k: v for k, v in config.items() if k != "config"}))

    @property
    def stamp(self) -> str:
        return self.t.strftime("%m-%d %H:%M:%S")

    def interval(self, n: int = 1, *, positions: list[float] | None, running: int = 8, drafts: int = 100) -> "VllmLog":
        for _ in range(n):
            self.t += timedelta(seconds=10)
            self.lines.append(g.stats_line(self.version, running=running, waiting=0, gen=200.0, kv=20.0, ts=self.stamp))
            if positions is not None:
                accepted = round(sum(positions) * drafts)
                self.lines.append(g.spec_line(self.version, accepted=accepted, drafted=drafts * len(positions),
                                              positions=positions, ts=self.stamp))
        return self


def test_br10_ascend_collapse_alert_with_vllm_fixes():
    t = run(sample("BR-10.log"))
    assert names(t) == [("AcceptanceCollapse", "firing", "")]
    a = t[0]
    ev = dict(a.evidence)
    assert (ev["accept len"], ev["accepted / drafted tokens"], ev["per-position acceptance rate"]) == (
        "1.00", "0 / 495", "0.000, 0.000, 0.000, 0.000, 0.000")
    fixes = "\n".join(a.fixes)
    assert "specwatch diagnose --engine vllm" in fixes and "VLLM_USE_V2_MODEL_RUNNER=0" in fixes
    assert "vllm-ascend/issues/13665" in fixes and "eagle_aux_hidden_state_layer_ids" in fixes
    assert "SGLang" not in fixes


def test_br16_draft_too_long_not_a_collapse():
    t = run(sample("BR-16.log"))
    assert names(t) == [("DraftTooLong", "firing", "")]
    ev = dict(t[0].evidence)
    assert ev["useful positions"] == "5" and ev["draft positions"] == "15" and ev["drafts in window"] == "65"
    assert ev["per-position acceptance rate"].startswith("0.600, 0.385, 0.215, 0.108, 0.062, 0.000")
    assert t[0].fixes[0].startswith("Draft 5 token(s) per step instead of 15: `\"num_speculative_tokens\": 5`")


def test_br06_only_position_one_accepts():
    t = run(sample("BR-06.log"))
    assert names(t) == [("DraftTooLong", "firing", "")]
    assert dict(t[0].evidence)["useful positions"] == "1"


def test_br07_near_zero_is_neither_long_draft_nor_yet_a_collapse():
    """Two intervals at 1.03 (position 1: 0.027): below the draft-length rule's floor, one short of
    the collapse rule's three."""
    assert run(sample("BR-07.log")) == []
    third = [line.replace("06:11:33", "06:11:43") for line in sample("BR-07.log")[-2:]]
    t = run(sample("BR-07.log") + third)
    assert names(t) == [("AcceptanceCollapse", "firing", "")]
    assert "MTP drafts with a head inside the target checkpoint" in t[0].fixes[0]


def test_generated_vllm_server_collapses_and_recovers_with_its_settings_in_the_advice():
    log = VllmLog(method="eagle3", draft="/models/llama-eagle3", model="/models/llama", k=3)
    log.interval(20, positions=[0.8, 0.6, 0.4])
    log.interval(5, positions=[0.0, 0.0, 0.0])
    log.interval(5, positions=[0.8, 0.6, 0.4])
    t = run(log.lines)
    assert names(t) == [("AcceptanceCollapse", "firing", ""), ("AcceptanceCollapse", "resolved", "")]
    fixes = "\n".join(t[0].fixes)
    assert "specwatch diagnose --engine vllm --draft /models/llama-eagle3 --target /models/llama" in fixes
    assert "vLLM 0.33.0" in fixes
    assert dict(t[0].evidence)["speculative_algorithm"] == "EAGLE3"


def test_draft_too_long_resolves_after_a_restart_with_fewer_tokens():
    log = VllmLog(k=6)
    log.interval(3, positions=[0.7, 0.4, 0.1, 0.0, 0.0, 0.0])
    log.t += timedelta(minutes=5)
    log.lines.append(g.config_line("0.33.0", ts=log.stamp, k=3))
    log.interval(10, positions=[0.7, 0.4, 0.1])
    t = run(log.lines)
    assert names(t) == [("DraftTooLong", "firing", ""), ("DraftTooLong", "resolved", "")]
    assert "`--speculative-config '{\"method\": \"eagle3\", \"model\": \"/models/draft\", \"num_speculative_tokens\": 3}'`" in t[0].fixes[0]


def test_vllm_server_that_does_not_draft_is_speculation_inactive():
    """BR-14's failure on a server: configured for EAGLE-3, stats lines with requests running and
    no SpecDecoding line (vLLM prints none without drafts)."""
    log = VllmLog()
    log.interval(5, positions=None)
    t = run(log.lines)
    assert names(t) == [("SpeculationInactive", "firing", "")]


def test_position_metric_and_engine_label():
    p = pipeline()
    log = VllmLog(version="0.10.2").interval(2, positions=[0.9, 0.5, 0.1])
    for line in log.lines:
        p.feed(LogLine("server.log", line))
    reg = CollectorRegistry()
    reg.register(PipelineCollector(p))
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in text_string_to_metric_families(generate_latest(reg).decode()) for s in fam.samples}
    lab = {"server": "box", "dp_rank": "", "tp_rank": "", "pp_rank": "", "ep_rank": "", "engine": "vllm"}
    key = lambda name, **extra: (name, tuple(sorted({**lab, **extra}.items())))  # noqa: E731
    assert got[key("specwatch_accept_length")] == 2.5
    assert [got[key("specwatch_position_accept_rate", position=str(i))] for i in range(3)] == [0.9, 0.5, 0.1]
    assert got[key("specwatch_running_requests")] == 8
    assert got[key("specwatch_decode_batches_total")] == 2
    assert p.servers["box"].lines == {"decode": 2, "prefill": 0, "other": 3, "malformed": 0, "unrecognized": 0}


def test_collapse_alert_carries_the_vllm_diagnosis(vllm_facts, tmp_path):
    """diagnosis.vllm_root: a vLLM collapse alert starts with the vLLM probes' findings for the
    draft its engine-config line names (here one without fc and norm: loaded uninitialised)."""
    from checkpoints import OUT as CKPT
    from checkpoints import variant

    draft = variant(CKPT / "specforge", tmp_path / "draft", drop=("fc.", "norm."),
                    config={"eagle_aux_hidden_state_layer_ids": [2, 4, 5]})  # named: no guessed-layers warning
    log = VllmLog(version="0.33.0", method="eagle3", draft=str(draft), model=str(CKPT / "target-llama"), k=3)
    log.interval(4, positions=[0.0, 0.0, 0.0])
    cfg = build_config({"server": "box", "logs": [{"path": "server.log"}],
                        "diagnosis": {"vllm_root": str(vllm_facts["0.33.0"].root)}})
    p = Pipeline(cfg, Dispatcher([], group_wait=0, group_interval=0, keep_history=True), diagnosis_background=False)
    t = feed(p, log.lines)  # inline, as replay runs it
    assert names(t) == [("AcceptanceCollapse", "firing", "")]
    assert dict(t[0].evidence)["diagnosis"] == "1 error(s), 0 warning(s) on vLLM 0.33.0"
    assert t[0].fixes[0].startswith("[error] vllm_weights: 2 parameter(s) of the draft get no weights")
    assert "(`model.fc.weight`, `model.norm.weight`)" in t[0].fixes[0]  # which ones, in the alert itself
    assert "specwatch diagnose --engine vllm" in t[0].fixes[1]


def test_a_chained_mtp_head_that_breaks_after_position_0_gets_its_own_warning():
    """0.80 / 0.24 / 0.10 on an MTP server: no position under the draft-too-long floor and far from a
    collapse, but position 1 given position 0 accepts 0.30 against position 0's 0.80: the state
    carried between the head's steps is wrong. A warning of its own, with one token per step as
    the fix; a healthy chain (0.8 / 0.6 / 0.4) raises nothing."""
    log = VllmLog(method="mtp", draft=None, model="/models/glm", k=3)
    log.interval(10, positions=[0.80, 0.24, 0.10])
    t = run(log.lines)
    assert names(t) == [("DraftChainBroken", "firing", "")]
    a = t[0]
    ev = dict(a.evidence)
    assert ev["per-position acceptance rate"] == "0.800, 0.240, 0.100" and ev["position 1 given position 0"] == "0.300"
    assert a.labels["severity"] == "warning"
    assert "hidden state" in a.annotations["description"] and "MTP" in a.annotations["description"]
    assert "`--speculative-config '{\"method\": \"mtp\", \"num_speculative_tokens\": 1}'`" in a.fixes[0]
    # the head fixed (a restart with one token per step, then a good chain): resolved
    log.t += timedelta(minutes=11)
    log.interval(10, positions=[0.80, 0.62, 0.45])
    t = run(log.lines)
    assert names(t) == [("DraftChainBroken", "firing", ""), ("DraftChainBroken", "resolved", "")]
    healthy = VllmLog(method="mtp", draft=None, model="/models/glm", k=3).interval(10, positions=[0.8, 0.6, 0.4])
    assert run(healthy.lines) == []


def test_br38_mtp_collapse_is_one_message_with_mtp_head_advice():
    """BR-38 (vLLM MTP, GLM): the collapse gets MTP-head advice, not EAGLE-3 checks; the
    DraftTooLong that fires during it is muted by the default inhibit rules."""
    from specwatch.alerts.inhibit import default_inhibit_rules
    from timeline import Recorder

    rec = Recorder()
    d = Dispatcher([rec], group_by=["alertname", "server"], group_wait=0, group_interval=0,
                   inhibit_rules=default_inhibit_rules(), keep_history=True)
    t = feed(pipeline(dispatcher=d), sample("BR-38.log"))
    assert ("DraftTooLong", "firing", "") in names(t)  # it fires (metrics, log): only not notified
    assert rec.got == [("AcceptanceCollapse", "firing", "")]
    [collapse] = [a for a in t if a.name == "AcceptanceCollapse"]
    assert collapse.fixes[0].startswith("MTP drafts with a head inside the target checkpoint")
    assert not any("eagle_aux_hidden_state_layer_ids" in f or "specwatch diagnose" in f for f in collapse.fixes)


def test_a_chain_whose_later_positions_accept_nothing_is_draft_too_long_only():
    """0.80 / 0.01 / 0.00: broken after position 0 too, but positions under the draft-length floor
    are that rule's case: one alert (DraftTooLong, one token per step), not two."""
    log = VllmLog(method="mtp", draft=None, model="/models/glm", k=3).interval(10, positions=[0.80, 0.01, 0.0])
    assert names(run(log.lines)) == [("DraftTooLong", "firing", "")]
