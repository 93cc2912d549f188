"""`logs[].format`, globs and server templates in check-config; `replay` detecting each file's
format, and `--format` (issue 11 items 2-4)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from container_writer import records
from procs import decode_line
from specwatch.config import build_config

BR30 = Path(__file__).resolve().parent / "data" / "samples" / "bugreport-logs" / "BR-30.log"


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specwatch", *argv], capture_output=True, text=True, timeout=60)


def test_check_config_names_each_bad_format_key_with_its_fix(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"logs": [
        {"path": "/var/log/a.log", "format": "jsonn", "server": "a"},
        {"path": "/var/log/b.log", "format": {"regex": "(?P<timestamp>\\S+) (?P<msg>.*)"}, "server": "b"},
        {"path": "/var/log/pods/*/*/*.log", "server": "{podname}"},
        {"path": "/var/log/d.log", "format": {"regex": "(", "grammar": 1}, "server": "d"},
    ]}))
    r = run("check-config", str(cfg))
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr
    assert "logs[0].format: unknown format 'jsonn'; use one of auto" in err and "python-logging" in err
    assert "logs[1].format.regex: has no named group (?P<message>...); give named groups timestamp" in err
    assert "logs[2].server: unknown field {podname}; use {container}, {image}, {id}, {pod}" in err
    assert "logs[3].format.regex: not a valid regular expression" in err
    assert "logs[3].format.grammar" in err  # unknown key, with the known ones


def test_check_config_refuses_a_list_format_and_template_specs_without_a_traceback(tmp_path):
    """Found by a new-user trial: `format: [python-logging]` raised TypeError; `{pod:>99999999}`
    passed and made every state write fail; `{pod!r}` quoted the server name."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"logs": [
        {"path": "/var/log/a.log", "format": ["python-logging"], "server": "a"},
        {"path": "/var/log/pods/*/*/*.log", "server": "{pod:>99999999}"},
        {"path": "/var/log/pods2/*/*/*.log", "server": "{pod!r}"},
    ]}))
    r = run("check-config", str(cfg))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "logs[0].format: must be a name or a mapping, not list; use one of auto" in r.stderr
    assert "logs[1].server: a field takes no format spec or conversion" in r.stderr
    assert "logs[2].server: a field takes no format spec or conversion" in r.stderr


def test_check_config_accepts_every_format_and_warns_on_an_empty_glob(tmp_path):
    logs = [{"path": f"/var/log/{f}.log", "format": f, "server": f}
            for f in ("auto", "sglang", "docker", "cri", "python-logging")]
    logs += [{"path": "/var/log/r.log", "server": "r", "format": {"regex": "(?P<timestamp>\\S+) (?P<message>.*)"}},
             {"path": str(tmp_path / "pods" / "*" / "*" / "*.log"), "server": "{namespace}-{pod}"}]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"logs": logs}))
    r = run("check-config", str(cfg))
    assert r.returncode == 0, r.stderr
    assert f"logs[6].path: {tmp_path}/pods/*/*/*.log matches no file (yet)" in r.stderr
    got = [(s.envelope, s.grammar is not None) for s in build_config({"logs": logs}).logs]
    assert got == [("auto", False), ("plain", False), ("docker", False), ("cri", False), ("auto", True),
                   ("auto", True), ("auto", False)]


def replay(*argv: str) -> dict:
    r = run("replay", "--json", *argv)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_replay_detects_docker_and_cri_files(tmp_path):
    lines = [decode_line(1.01, f"16:32:4{i}", running=50).rstrip("\n") for i in range(3)]
    lines.insert(1, "x" * 700)  # cut into several records
    for fmt, name in (("docker", "c-json.log"), ("cri", "0.log")):
        p = tmp_path / name
        p.write_text("".join(r for i, ln in enumerate(lines) for r in records(fmt, ln, i)))
        doc = replay(str(p))
        assert doc["lines"]["decode"] == 3 and doc["lines"]["other"] == 1, (fmt, doc["lines"])
        assert [a["name"] for a in doc["alerts"]] == ["AcceptanceCollapse"]
        forced = replay("--format", "sglang", str(p))  # told it is plain: nothing reads
        assert forced["lines"]["decode"] == 0


def test_replay_br30_flagged_then_read_with_format():
    flagged = replay(str(BR30))
    assert (flagged["lines"]["decode"], flagged["lines"]["unrecognized"]) == (0, 3)
    assert [a["name"] for a in flagged["alerts"]] == ["SGLangLogUnrecognized"]
    read = replay("--format", "python-logging", str(BR30))
    assert (read["lines"]["decode"], read["lines"]["unrecognized"]) == (3, 0)
    assert read["ranks"][""]["accept_length"]["mean"] == 1.0
    regex = replay("--format", r"(?P<timestamp>\S+ \S+) \w+ \d+ \[[^\]]*\] (?P<message>.*)", str(BR30))
    assert regex["lines"]["decode"] == 3


def test_replay_refuses_a_bad_format(tmp_path):
    r = run("replay", "--format", "(?P<timestamp>x)", str(BR30))
    assert r.returncode == 2
    assert "--format.regex: has no named group (?P<message>...)" in r.stderr


def test_replay_of_a_file_a_config_glob_matches_reads_it_as_that_entry_says(tmp_path):
    """A pod's file replayed with the DaemonSet-like config: the glob entry's `format` and
    `{pod}` template apply (a reviewer found it read as plain SGLang under the default server)."""
    pod = tmp_path / "pods" / "llm_sglang-a_0001" / "sglang"
    pod.mkdir(parents=True)
    log = pod / "0.log"
    log.write_bytes(BR30.read_bytes())  # SGLang under its own logging config
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"server": "default", "logs": [
        {"path": str(tmp_path / "pods" / "*" / "*" / "*.log"), "server": "{pod}", "format": "python-logging"}]}))
    doc = replay(str(log), "--config", str(cfg))
    assert doc["lines"]["decode"] == 3 and doc["lines"].get("unrecognized", 0) == 0
    assert list(doc["servers"]) == ["sglang-a"]
    [collapse] = [e for e in doc["episodes"] if e["name"] == "AcceptanceCollapse"]
    assert collapse["server"] == "sglang-a"
