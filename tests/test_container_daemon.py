"""A real `specwatch run` following a Docker json-file log and Kubernetes CRI logs by glob, with the
README's config shape: the collapse alert of each reaches a real local Slack endpoint under the
container's and the pod's name; decode lines in an unknown format are counted and alerted."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from container_writer import records
from procs import decode_line, wait_for
from specwatch_daemon import SpecwatchDaemon
from test_crash import FAST

BR30 = Path(__file__).resolve().parent / "data" / "samples" / "bugreport-logs" / "BR-30.log"


def write(path, fmt: str, lines: list[str]) -> None:
    """Records as the runtime writes them: Docker with each line cut in two, CRI as P + F."""
    with open(path, "a") as f:
        for i, line in enumerate(lines):
            recs = records(fmt, line, i)
            if len(recs) == 1:  # shorter than the runtime's cut: cut it here, as a longer line would be
                half = len(line) // 2
                if fmt == "docker":
                    recs = [json.dumps({"log": line[:half], "stream": "stderr", "time": "t"}) + "\n",
                            json.dumps({"log": line[half:] + "\n", "stream": "stderr", "time": "t"}) + "\n"]
                else:
                    recs = [f"2026-02-23T16:32:40.1Z stderr P {line[:half]}\n",
                            f"2026-02-23T16:32:40.1Z stderr F {line[half:]}\n"]
            f.write("".join(recs))


def collapsed(n: int = 3) -> list[str]:
    return [decode_line(1.01, f"16:32:4{i}", running=50).rstrip("\n") for i in range(n)]


def slack_texts(slack) -> list[str]:
    return [json.dumps(b) for b in slack.received]


def test_collapse_from_docker_and_cri_files_reaches_slack(tmp_path, slack):
    cid = "5f" * 32
    cdir = tmp_path / "containers" / cid
    cdir.mkdir(parents=True)
    (cdir / "config.v2.json").write_text(json.dumps({"ID": cid, "Name": "/sglang-docker",
                                                     "Config": {"Image": "lmsysorg/sglang:v0.5.23"}}))
    docker_log = cdir / f"{cid}-json.log"
    docker_log.write_text("")
    pods = tmp_path / "pods"
    pods.mkdir()
    custom = tmp_path / "custom.log"
    custom.write_text("")
    logs = [{"path": str(tmp_path / "containers" / "*" / "*-json.log"), "server": "{container}"},
            {"path": str(pods / "*" / "*" / "*.log"), "server": "{pod}", "format": "auto"},
            {"path": str(custom), "server": "custom"}]
    d = SpecwatchDaemon(tmp_path, docker_log, alerts={**FAST, "slack": {"webhook_url": slack.url}},
                        extra={"logs": logs, "follow": {"poll_interval": "0.2s", "rescan_interval": "0.5s"},
                               "process": {"enabled": False}}).start()
    try:
        write(docker_log, "docker", collapsed())
        wait_for(lambda: any("sglang-docker" in t and "AcceptanceCollapse" in t for t in slack_texts(slack)),
                 timeout=20, what="the Docker container's collapse at Slack")

        pod_dir = pods / "llm_sglang-cri-0_0f0e1d2c" / "sglang"  # a pod that appears later
        pod_dir.mkdir(parents=True)
        write(pod_dir / "0.log", "cri", collapsed())
        wait_for(lambda: any("sglang-cri-0" in t and "AcceptanceCollapse" in t for t in slack_texts(slack)),
                 timeout=20, what="the pod's collapse at Slack")

        shutil.copyfile(BR30, custom)  # SGLang with its own logging config, no format given
        wait_for(lambda: any("SGLangLogUnrecognized" in t and str(custom) in t for t in slack_texts(slack)),
                 timeout=20, what="the unrecognized-format warning at Slack")
        m = d.scrape()
        lines = {(dict(k).get("server"), dict(k).get("kind")): v for (name, k), v in m.items()
                 if name == "specwatch_log_lines_total"}
        assert lines[("sglang-docker", "decode")] == 3
        assert lines[("sglang-cri-0", "decode")] == 3
        assert lines[("custom", "unrecognized")] == 3 and lines[("custom", "decode")] == 0

        # a restart resumes each matched file after its last line: none read twice, none lost
        rc, out = d.stop()
        assert rc == 0, out
        write(docker_log, "docker", collapsed(2))
        write(pod_dir / "0.log", "cri", collapsed(4))
        d.start()
        wait_for(lambda: decode_lines(d) == {"sglang-docker": 5, "sglang-cri-0": 7, "custom": 0},
                 timeout=20, what="the lines written while stopped, once each")
        time.sleep(1.0)
        assert decode_lines(d) == {"sglang-docker": 5, "sglang-cri-0": 7, "custom": 0}
    finally:
        rc, out = d.stop()
    assert rc == 0, out
    assert "Traceback" not in out
    assert "following " + str(pod_dir / "0.log") in out  # the new pod's file, logged when picked up


def decode_lines(d) -> dict[str, float]:
    return {dict(k)["server"]: v for (name, k), v in d.scrape().items()
            if name == "specwatch_log_lines_total" and dict(k)["kind"] == "decode"}



def test_a_deleted_pods_collapse_resolves_live_and_across_a_restart(tmp_path, slack):
    """A rollout deletes the collapsed pod (its log directory goes): its alert resolves, with the
    reason, and its server leaves /metrics; a pod deleted while specwatch was stopped resolves at
    start-up (its restored alert could never resolve otherwise)."""
    pods = tmp_path / "pods"
    pods.mkdir()
    logs = [{"path": str(pods / "*" / "*" / "*.log"), "server": "{pod}", "format": "cri"}]
    first = pods / "llm_sglang-a_0001" / "sglang"
    first.mkdir(parents=True)
    d = SpecwatchDaemon(tmp_path, first / "0.log", alerts={**FAST, "slack": {"webhook_url": slack.url}},
                        extra={"logs": logs, "follow": {"poll_interval": "0.2s", "rescan_interval": "0.5s"},
                               "process": {"enabled": False}}).start()
    try:
        write(first / "0.log", "cri", collapsed())
        wait_for(lambda: any("[FIRING] AcceptanceCollapse on sglang-a" in t for t in slack_texts(slack)),
                 timeout=20, what="pod a's collapse at Slack")
        shutil.rmtree(pods / "llm_sglang-a_0001")
        wait_for(lambda: any("[RESOLVED] AcceptanceCollapse on sglang-a" in t for t in slack_texts(slack)),
                 timeout=20, what="pod a's collapse resolved once its log is gone")
        resolved = [b for b in slack.received if b["text"].startswith("[RESOLVED] AcceptanceCollapse on sglang-a")][0]
        assert "the pod or container was deleted" in json.dumps(resolved)
        assert "sglang-a" not in decode_lines(d)

        second = pods / "llm_sglang-b_0002" / "sglang"
        second.mkdir(parents=True)
        write(second / "0.log", "cri", collapsed())
        wait_for(lambda: any("[FIRING] AcceptanceCollapse on sglang-b" in t for t in slack_texts(slack)),
                 timeout=20, what="pod b's collapse at Slack")
        rc, out = d.stop()
        assert rc == 0, out
        shutil.rmtree(pods / "llm_sglang-b_0002")  # deleted while specwatch is stopped
        d.start()
        wait_for(lambda: any("[RESOLVED] AcceptanceCollapse on sglang-b" in t for t in slack_texts(slack)),
                 timeout=20, what="pod b's restored collapse resolved at start-up")
    finally:
        rc, out = d.stop()
    assert rc == 0, out
    assert "stopped following " + str(first / "0.log") in out
