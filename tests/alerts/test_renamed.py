"""Engine-neutral alert names: a vLLM server's down alert is `ServerDown` with engine="vllm"
(once `SGLangServerDown on vllm-0`), and what a user wrote for the old names (routes, inhibit
rules, stored silences, `silence add --match`) still matches, with a warning naming the new one."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ has no __init__.py
from fake_sglang import stop  # noqa: E402
from procs import free_port  # noqa: E402

from specwatch.alerting import build_alerting  # noqa: E402
from specwatch.alerts.matchers import parse_matcher  # noqa: E402
from specwatch.alerts.model import Alert  # noqa: E402
from specwatch.alerts.renamed import RENAMED, follow_renames  # noqa: E402
from specwatch.alerts.silences import SilenceStore  # noqa: E402
from specwatch.config import build_config  # noqa: E402
from specwatch.core.pipeline import Pipeline  # noqa: E402
from specwatch.sources.process import ProcessSource  # noqa: E402

MODEL = "/models/meta-llama/Llama-3.1-8B-Instruct"
DRAFT = "/models/lmsys/sglang-EAGLE3-LLaMA3.1-Instruct-8B"
DOWN = {"alertname": "ServerDown", "severity": "critical", "server": "vllm-0", "rank": "", "engine": "vllm"}


def renamed_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "specwatch.alerts.renamed" and r.levelno == logging.WARNING]


def test_a_config_for_the_old_names_routes_and_inhibits_a_vllm_server_down(tmp_path, slack, sglang_procs, caplog):
    """A config written for `SGLangServerDown`: its route and inhibit rule still take the
    `ServerDown` of a real (stand-in) vLLM server that exits, and loading it warns, naming the key
    and the new name."""
    from fake_vllm import make_install

    python = make_install(tmp_path / "vllm-env")
    port = free_port()
    vllm = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, "--speculative-config",
            json.dumps({"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 3}), "--port", str(port)]
    caplog.set_level(logging.WARNING, logger="specwatch.alerts.renamed")
    cfg = build_config({
        "server": "gpu-box-1", "logs": [],
        "process": {"servers": {port: "vllm-0"}}, "rules": {"server": {"down_for": "30s"}},
        "alerts": {
            "group_by": ["..."], "group_wait": "0s", "group_interval": "0s",
            "slack": {"webhook_url": slack.url, "channel": "#gpu"},
            "routes": [{"name": "down", "matchers": ["alertname=SGLangServerDown"], "slack": {"channel": "#oncall"}}],
            "inhibit_rules": [{"source_matchers": ["alertname=SGLangServerDown"],
                               "target_matchers": ["alertname=SpecwatchSourceDown"], "equal": ["server"]}]}})
    warned = renamed_warnings(caplog)
    assert len(warned) == 2
    assert warned[0].startswith("alerts.inhibit_rules[0].source_matchers[0]: alertname=\"SGLangServerDown\" names an "
                                "alert by its old name (SGLangServerDown is now ServerDown;")
    assert warned[1].startswith("alerts.routes[0].matchers[0]: ") and "write the new name" in warned[1]
    d, notifiers = build_alerting(cfg, state_dir=tmp_path / "state")
    pl = Pipeline(cfg, d)
    src = ProcessSource(pl.feed_event, server="gpu-box-1", servers={port: "vllm-0"})
    t = 1_800_000_000.0
    p1 = sglang_procs.start(vllm, children=0)
    src.poll(t)
    stop(p1)
    src.poll(t + 5)
    with pl.lock:
        pl.tick(t + 40)
        # a source alert of the down server: the old-name inhibit rule mutes it
        pl._handle([Alert(labels={"alertname": "SpecwatchSourceDown", "severity": "warning", "server": "vllm-0",
                                  "rank": "", "source_kind": "log"}, annotations={"summary": "x"}, starts_at=t)],
                   t + 40)
    [down] = [a for a in d.active.values() if a.name == "ServerDown"]
    assert down.labels == DOWN
    assert pl.engine_of("vllm-0") == "vllm"
    for n in notifiers.values():
        assert n.drain(5)
    assert [(b["channel"], b["text"].split(":")[0]) for b in slack.received] == [
        ("#oncall", "[FIRING] ServerDown on vllm-0")]  # routed as the old name was; the source alert muted


def test_a_silence_stored_for_an_old_name_still_mutes_and_warns(tmp_path, caplog):
    """silences.json as `specwatch silence add --match alertname=SGLangServerDown` wrote it before
    the rename."""
    caplog.set_level(logging.WARNING, logger="specwatch.alerts.renamed")
    (tmp_path / "silences.json").write_text(json.dumps({"silences": [
        {"id": "0f1e", "matchers": ['alertname="SGLangServerDown"', 'server="vllm-0"'], "starts_at": 100.0,
         "ends_at": 200.0, "created_by": "ops", "comment": "draining", "updated_at": 100.0}]}))
    store = SilenceStore(tmp_path)
    assert store.reload_if_changed()
    assert store.muted_by(DOWN, 150.0) == ["0f1e"]
    assert store.muted_by({**DOWN, "alertname": "SGLangServerDown"}, 150.0) == ["0f1e"]  # restored from old state
    assert store.muted_by({**DOWN, "alertname": "ServerRestarted"}, 150.0) == []
    [warned] = renamed_warnings(caplog)
    assert warned.startswith('silence 0f1e: alertname="SGLangServerDown" names an alert by its old name')
    assert 'read as alertname=~"SGLangServerDown|ServerDown"' in warned


def test_silence_add_with_an_old_name_stores_the_new_one_and_says_so(tmp_path):
    r = subprocess.run([sys.executable, "-m", "specwatch", "silence", "add", "--match", "alertname=SGLangLogError",
                        "--for", "1h", "--comment", "x", "--state-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "--match: alertname=\"SGLangLogError\" names an alert by its old name (SGLangLogError is now " \
           "ServerLogError;" in r.stderr
    [s] = json.loads((tmp_path / "silences.json").read_text())["silences"]
    assert s["matchers"] == ['alertname=~"SGLangLogError|ServerLogError"']


@pytest.mark.parametrize("text,widened", [
    ("alertname=SGLangServerDown", 'alertname=~"SGLangServerDown|ServerDown"'),
    ("alertname!=SGLangServerUnhealthy", 'alertname!~"SGLangServerUnhealthy|ServerUnhealthy"'),
    ('alertname=~"SGLang.*"', 'alertname=~"(?:SGLang.*)|ServerDown|ServerRestarted|ServerUnhealthy|ServerLogError"'),
    ('alertname!~"SGLangServer(Down|Restarted)"', 'alertname!~"(?:SGLangServer(Down|Restarted))|ServerDown|ServerRestarted"'),
])
def test_a_matcher_that_treats_an_old_name_apart_is_widened_to_its_new_name(text, widened, caplog):
    m = follow_renames(parse_matcher(text), "x")
    assert str(m) == widened
    for old, new in RENAMED.items():  # the new names now fare as the old ones did
        assert m.matches({"alertname": new}) is m.matches({"alertname": old}) is parse_matcher(text).matches(
            {"alertname": old})
    assert m.matches({"alertname": "SGLangLogSilent"}) is parse_matcher(text).matches({"alertname": "SGLangLogSilent"})


@pytest.mark.parametrize("text", ["alertname=ServerDown", "alertname=SGLangLogSilent", 'alertname=~".*Down"',
                                  "server=SGLangServerDown", "alertname!=AcceptanceCollapse"])
def test_other_matchers_are_left_alone_without_a_warning(text, caplog):
    caplog.set_level(logging.WARNING, logger="specwatch.alerts.renamed")
    m = parse_matcher(text)
    assert follow_renames(m, "x") is m
    assert renamed_warnings(caplog) == []
