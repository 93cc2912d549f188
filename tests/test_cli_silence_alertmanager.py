"""`specwatch silence` in the configured Alertmanagers (real `prometheus-alertmanager`, and
`amtool` where installed): one silence per cluster, as amtool makes it, listed and expired by
either tool, and the local silence kept when an Alertmanager does not answer."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import datetime, timezone

import pytest
import requests
import yaml

from alertmanager import BINARY, Alertmanager
from procs import free_port, wait_for

AMTOOL = shutil.which("amtool")
pytestmark = pytest.mark.skipif(BINARY is None, reason="prometheus-alertmanager not installed (.ci/run installs it)")


def _config(tmp_path, urls: list[str]):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"server": "sglang-0", "logs": [str(tmp_path / "sglang.log")],
                                   "state_dir": str(tmp_path / "state"),
                                   "alerts": {"alertmanager": {"urls": urls, "timeout": "3s"}}}))
    return cfg


def silence(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specwatch", "silence", *args], capture_output=True, text=True,
                          timeout=60)


def _silences(am: Alertmanager) -> list[dict]:
    r = requests.get(f"{am.url}/api/v2/silences", timeout=5)
    r.raise_for_status()
    return r.json()


def _push(am: Alertmanager, labels: dict) -> None:
    now = datetime.now(timezone.utc).isoformat()
    requests.post(f"{am.url}/api/v2/alerts", json=[{"labels": labels, "startsAt": now}], timeout=5).raise_for_status()


def test_add_list_expire_in_two_alertmanagers(tmp_path, alertmanager):
    a, b = alertmanager(), alertmanager()
    cfg = _config(tmp_path, [a.url, b.url])
    r = silence("add", "--config", str(cfg), "--match", "alertname=AcceptanceCollapse", "--match", 'rank=~"TP[01]"',
                "--for", "2h", "--comment", "TP0/TP1 draft being retrained", "--author", "ops")
    assert r.returncode == 0, r.stderr
    sid = r.stdout.strip()
    for am in (a, b):
        [got] = _silences(am)
        assert got["status"]["state"] == "active" and (got["createdBy"], got["comment"]) == (
            "ops", "TP0/TP1 draft being retrained")
        assert sorted((m["name"], m["value"], m["isRegex"], m["isEqual"]) for m in got["matchers"]) == [
            ("alertname", "AcceptanceCollapse", False, True), ("rank", "TP[01]", True, True)]
        span = datetime.fromisoformat(got["endsAt"]) - datetime.fromisoformat(got["startsAt"])
        assert abs(span.total_seconds() - 7200) < 1
        assert f"made in alertmanager/127.0.0.1:{am.port} as {got['id']}" in r.stderr
    # it mutes there: an alert another agent pushes is suppressed by it
    _push(a, {"alertname": "AcceptanceCollapse", "server": "sglang-7", "rank": "TP1"})
    wait_for(lambda: [x["status"]["silencedBy"] for x in a.alerts()] == [[_silences(a)[0]["id"]]],
             what="the pushed alert silenced")
    if AMTOOL:  # amtool reads it, and makes one `silence list` shows
        q = subprocess.run([AMTOOL, "silence", "query", "-o", "json", f"--alertmanager.url={a.url}"],
                           capture_output=True, text=True, timeout=30)
        assert [s["comment"] for s in json.loads(q.stdout)] == ["TP0/TP1 draft being retrained"], q.stderr
        made = subprocess.run([AMTOOL, "silence", "add", "alertname=ServerDown", "--comment=box 3 reimaged",
                               "--author=amtool-user", "--duration=1h", f"--alertmanager.url={a.url}"],
                              capture_output=True, text=True, timeout=30)
        assert made.returncode == 0, made.stderr
        other = made.stdout.strip()
    else:
        other = a.silence(["alertname=ServerDown"], comment="box 3 reimaged")
    listed = silence("list", "--config", str(cfg), "--json")
    assert listed.returncode == 0, listed.stderr
    got = {s["id"]: s for s in json.loads(listed.stdout)}
    assert set(got) == {sid, other}
    assert set(got[sid]["alertmanager_ids"]) == {a.url, b.url} and got[sid]["state"] == "active"
    assert got[other]["alertmanager"] == f"alertmanager/127.0.0.1:{a.port}" and got[other]["comment"] == "box 3 reimaged"
    table = silence("list", "--config", str(cfg)).stdout.splitlines()
    assert "Where" in table[0]
    [row] = [ln for ln in table if sid in ln]
    assert "here, alertmanager/127.0.0.1:" in row and all(f"alertmanager/127.0.0.1:{am.port}" in row for am in (a, b)), \
        "\n".join(table)
    # expire: the local one ends everywhere it was made; the other, by a prefix, in its Alertmanager
    r = silence("expire", "--config", str(cfg), sid, other[:8])
    assert r.returncode == 0, r.stderr
    assert f"expired {other} in alertmanager/127.0.0.1:{a.port}" in r.stdout
    assert sorted(s["status"]["state"] for s in _silences(a)) == ["expired", "expired"]
    assert [s["status"]["state"] for s in _silences(b)] == ["expired"]
    assert json.loads(silence("list", "--config", str(cfg), "--json").stdout) == []
    r = silence("list", "--config", str(cfg), "--local-only", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == []


def test_a_cluster_gets_one_silence(tmp_path):
    """An HA pair gossips its silences: posting to each would make two; one is made and both
    members list it."""
    gossip = [free_port(), free_port()]
    ams = []
    try:
        for me, other in ((0, 1), (1, 0)):
            ams.append(Alertmanager(tmp_path, cluster_port=gossip[me], peers=[gossip[other]]))
        wait_for(lambda: all(len(am.cluster_peers()) == 2 for am in ams), timeout=20, what="the pair joined")
        cfg = _config(tmp_path, [am.url for am in ams])
        r = silence("add", "--config", str(cfg), "--match", "alertname=AcceptanceCollapse", "--for", "1h",
                    "--comment", "one for the pair")
        assert r.returncode == 0, r.stderr
        wait_for(lambda: all(len(_silences(am)) == 1 for am in ams), timeout=10, what="the silence gossiped")
        assert len({_silences(am)[0]["id"] for am in ams}) == 1
        assert r.stderr.count("made in alertmanager/") == 1
        r = silence("expire", "--config", str(cfg), r.stdout.strip())
        assert r.returncode == 0, r.stderr
        wait_for(lambda: all(_silences(am)[0]["status"]["state"] == "expired" for am in ams), timeout=10,
                 what="the expiry gossiped")
    finally:
        for am in ams:
            am.close()


def test_an_alertmanager_that_does_not_answer_is_named_and_the_silence_kept(tmp_path, alertmanager):
    a = alertmanager()
    down = f"http://127.0.0.1:{free_port()}"
    r = silence("add", "--state-dir", str(tmp_path / "state"), "--alertmanager", a.url, "--alertmanager", down,
                "--match", "alertname=DecodeStalled", "--for", "30m", "--comment", "maintenance")
    assert r.returncode == 1
    sid = r.stdout.strip()
    assert f"not made in alertmanager/127.0.0.1:{down.rsplit(':', 1)[1]}" in r.stderr and "no answer" in r.stderr
    assert [s["comment"] for s in _silences(a)] == ["maintenance"]
    [kept] = json.loads(silence("list", "--state-dir", str(tmp_path / "state"), "--json").stdout)
    assert kept["id"] == sid and list(kept["alertmanager_ids"]) == [a.url]
    r = silence("add", "--state-dir", str(tmp_path / "state"), "--alertmanager", "am:9093",
                "--match", "alertname=X", "--for", "1h", "--comment", "x")
    assert r.returncode == 2 and "--alertmanager 'am:9093' must be an http(s) URL" in r.stderr
