"""A fleet on the real distributed parts: 20 `specwatch run` agents, one real Prometheus scraping
them with deploy/prometheus/prometheus.yml's `specwatch` job and specwatch-rules.yml, and two real
Alertmanagers in a cluster (gossip on loopback) that both receive every alert from Prometheus and
send to one Slack-compatible endpoint.

Each agent listens on its own loopback address (127.0.0.2 ... 127.0.0.21, as one agent per box:
the shipped relabelling makes `instance` the host) and follows one log file; five of them name
their server `sglang-0` alike, as a fleet whose boxes each run one server named the same. One
agent's log collapses (accept len 1.00 with requests running) and recovers: the incident reaches
Slack once (not once per Alertmanager) and resolves once. The dashboard's fleet panels give one
series per agent.

The rules are loaded with every `for:` at 0s (prom.rules_firing_at_once) so the alert fires on
the first scrape that sees the collapse.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

import prom
from alertmanager import BINARY as ALERTMANAGER
from alertmanager import Alertmanager, slack_receiver
from procs import SpecwatchProcess, decode_line, free_port, wait_for
from slack_endpoint import SlackEndpoint
from test_dashboard_fleet import dashboard, fill, regex_value

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "prometheus" / "prometheus.yml"
AGENTS = 20
SAME_NAME = 5  # agents 0-4 all name their server sglang-0
COLLAPSING = 3  # one of those
PEER_TIMEOUT = 1.0  # s: the second Alertmanager waits this long for the first one's notification,
GROUP_INTERVAL = "3s"  # ... within each flush of the group: a flush must end before the next one


def _need_binaries() -> None:
    missing = [name for name, ok in (("prometheus", prom.available()), ("prometheus-alertmanager", ALERTMANAGER))
               if not ok]
    if missing:
        why = f"{' and '.join(missing)} not installed (Debian packages; .ci/run installs them)"
        pytest.fail(why) if os.environ.get("CI") == "true" else pytest.skip(why)


def host(i: int) -> str:
    return f"127.0.0.{i + 2}"


def server(i: int) -> str:
    return "sglang-0" if i < SAME_NAME else f"sglang-{i}"


def lines(accept: float, n: int, running: int = 32) -> str:
    """n decode lines stamped now (log timestamps are read in the agent's local zone)."""
    now = datetime.now().strftime("%H:%M:%S")
    day = datetime.now().strftime("%Y-%m-%d")
    return "".join(decode_line(accept, now, running=running, day=day) for _ in range(n))


def append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def scrape_job(targets: list[str]) -> dict:
    """The example's `specwatch` job with these targets (host:port), scraped every second."""
    [job] = yaml.safe_load(EXAMPLE.read_text())["scrape_configs"]
    job.pop("file_sd_configs")
    job["static_configs"] = [{"targets": targets}]
    job["scrape_interval"] = job["scrape_timeout"] = "1s"
    return job


def slack_messages(slack: SlackEndpoint) -> list[tuple[str, str]]:
    """(title, text) of each message Alertmanager posted."""
    with slack.lock:
        return [(m["attachments"][0]["title"], m["attachments"][0]["text"]) for m in slack.received]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    _need_binaries()
    tmp = tmp_path_factory.mktemp("fleet")
    slack = SlackEndpoint()
    receiver = slack_receiver(slack.url)
    receiver["slack_configs"][0]["text"] = ("{{ range .Alerts }}{{ .Labels.instance }} {{ .Labels.server }} "
                                            "TP{{ .Labels.tp_rank }}: {{ .Annotations.summary }}\n{{ end }}")
    started: list = []
    try:
        gossip = [free_port(), free_port()]
        ams = []
        for me, other in ((0, 1), (1, 0)):
            ams.append(Alertmanager(tmp, receiver, group_by=["alertname", "instance", "server"],
                                    cluster_port=gossip[me], peers=[gossip[other]], peer_timeout=f"{PEER_TIMEOUT:g}s",
                                    group_interval=GROUP_INTERVAL))
            started.append(ams[-1])
        agents, logs = [], []
        for i in range(AGENTS):
            d = tmp / f"agent-{i}"
            d.mkdir()
            log = d / "sglang.log"
            log.write_text("")
            port = free_port()
            cfg = d / "config.yaml"
            cfg.write_text(yaml.safe_dump({
                "server": server(i), "logs": [{"path": str(log)}], "follow": {"poll_interval": "0.2s"},
                "metrics": {"listen_address": host(i), "listen_port": port}, "state_dir": str(d / "state"),
                "gpu": {"enabled": False}, "process": {"enabled": False}, "diagnosis": {"enabled": False},
                "alerts": {},  # alerts go through Prometheus and Alertmanager only
            }))
            agents.append(SpecwatchProcess(cfg, port, host=host(i)))
            logs.append(log)
        for a in agents:
            a.start(wait=False)
            started.append(a)
        p = prom.Prometheus(tmp / "prometheus", [scrape_job([f"{host(i)}:{a.port}" for i, a in enumerate(agents)])],
                            [prom.rules_firing_at_once()], alertmanagers=[f"127.0.0.1:{am.port}" for am in ams])
        for a in agents:  # before Prometheus scrapes: a refused scrape fires SpecwatchDown
            wait_for(a._up, timeout=60, what=f"agent on {a.host}:{a.port}")
        wait_for(lambda: all(len(am.cluster_peers()) == 2 for am in ams), timeout=20, what="the two Alertmanagers joined")
        p.start()
        started.append(p)
        for log in logs:
            append(log, lines(3.0, 1))
        p.wait_query('count(specwatch_accept_length{job="specwatch"})', lambda r: r and r[0]["value"] == AGENTS, timeout=60)
        time.sleep(2.5)  # two more evaluations of the recording rules
        yield {"prom": p, "ams": ams, "agents": agents, "logs": logs, "slack": slack}
    finally:
        for x in reversed(started):
            try:
                x.stop() if hasattr(x, "stop") else x.close()
            except AssertionError as e:  # an agent that did not stop: the others still are
                print(e, file=sys.stderr)
        slack.close()


FLEET_VARS = {"job": regex_value("specwatch"), "instance": ".*", "server": ".*", "engine": ".*",
              "dp_rank": ".*", "tp_rank": ".*"}


def panel_exprs(title: str) -> list[str]:
    return [fill(t["expr"], FLEET_VARS) for p in dashboard()["panels"] if p["title"] == title for t in p["targets"]]


def per_agent(results: list[dict]) -> dict[tuple[str, str], float]:
    out = {}
    for r in results:
        key = (r["metric"].get("instance", ""), r["metric"].get("server", ""))
        assert key not in out, f"two series for {key}: {results}"
        out[key] = r["value"]
    return out


EVERY_AGENT = {(host(i), server(i)) for i in range(AGENTS)}


def test_fleet_panels_show_one_series_per_agent(fleet):
    p = fleet["prom"]
    # the job variable lists the agents' job; "Agents up" reads it instead of a fixed name
    [job] = [v for v in dashboard()["templating"]["list"] if v["name"] == "job"]
    assert job["query"] == "label_values(specwatch_build_info, job)"
    assert p.label_values("job", "specwatch_build_info") == ["specwatch"]
    [up] = panel_exprs("Agents up")
    assert {(r["metric"]["instance"], r["value"]) for r in p.query(up)} == {(host(i), 1.0) for i in range(AGENTS)}
    # the per-server recording rules and the panels that read them: five boxes named sglang-0
    # stay five series, each with its own value
    for rule in ("server:specwatch_accept_length:avg", "server:specwatch_accept_length:min"):
        assert per_agent(p.query(rule)) == {k: 3.0 for k in EVERY_AGENT}, rule
    [tps] = panel_exprs("Generated tokens per second per server")
    assert "server:specwatch_gen_throughput_tokens_per_second:sum" in tps
    assert per_agent(p.query(tps)) == {k: pytest.approx(400.57) for k in EVERY_AGENT}
    [collapsed] = panel_exprs("Collapsed ranks")
    assert per_agent(p.query(collapsed)) == {k: 0.0 for k in EVERY_AGENT}


def test_a_collapse_reaches_slack_once_and_resolves_once(fleet):
    p, ams, slack, log = fleet["prom"], fleet["ams"], fleet["slack"], fleet["logs"][COLLAPSING]
    me = host(COLLAPSING)
    assert slack_messages(slack) == []
    append(log, lines(1.00, 3))  # rules.collapse.min_batches (3) low batches with requests running
    wait_for(lambda: slack_messages(slack), timeout=30, what="the collapse in Slack")
    # Prometheus sent the alert to both Alertmanagers; they agreed that one of them notifies
    for am in ams:
        active = [a for a in am.alerts() if a["labels"]["alertname"] == "AcceptanceCollapse"]
        assert [(a["labels"]["instance"], a["labels"]["server"], a["status"]["state"]) for a in active] == \
            [(me, "sglang-0", "active")], active
    # the other would have sent by now (after peer_timeout) had the cluster not told it
    time.sleep(PEER_TIMEOUT + 2)
    [(title, text)] = slack_messages(slack)
    assert title == "[FIRING] AcceptanceCollapse"
    assert text.startswith(f"{me} sglang-0 TP0: Speculative decoding collapsed on sglang-0 TP0: accept len 1.00"), text
    assert p.query('count(ALERTS{alertstate="firing"})')[0]["value"] == 1  # the collapse only, nothing else fired
    # the fleet panels tell the collapsed box from the four others named sglang-0
    [collapsed] = panel_exprs("Collapsed ranks")
    assert per_agent(p.query(collapsed)) == {k: float(k[0] == me) for k in EVERY_AGENT}
    assert per_agent(p.query("server:specwatch_accept_length:min"))[(me, "sglang-0")] == 1.0

    append(log, lines(3.0, 3))  # min_batches lines at or above recover_accept_length
    wait_for(lambda: len(slack_messages(slack)) == 2, timeout=30, what="the resolve in Slack")
    time.sleep(PEER_TIMEOUT + 2)
    titles = [t for t, _ in slack_messages(slack)]
    assert titles == ["[FIRING] AcceptanceCollapse", "[RESOLVED] AcceptanceCollapse"]
    assert slack_messages(slack)[1][1].startswith(f"{me} sglang-0 TP0: "), slack_messages(slack)
    assert p.query('ALERTS{alertstate="firing"}') == []
