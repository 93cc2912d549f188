"""deploy/ checked with the real tools: systemd-analyze (verify, security), promtool (check and
unit-test the rules, check the example config), amtool, shellcheck, and a real install.sh run
into a staging root. Each tool-based test skips, naming the Debian package, where the tool is
absent; .ci/run installs them all."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from procs import popen

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "specwatch.service"
PROMDIR = DEPLOY / "prometheus"
RULES = PROMDIR / "specwatch-rules.yml"
RULE_TESTS = PROMDIR / "specwatch-rules.test.yml"
MAX_EXPOSURE = 2.0


def tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (Debian package {package}; .ci/run installs it)")
    return path


def run(*cmd, cwd=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=120, **kw)


# --- systemd ------------------------------------------------------------------------------

def unit_for(tmp_path: Path, exec_start: str) -> Path:
    """The unit with ExecStart pointed at an executable that exists here (verify checks it)."""
    text = UNIT.read_text().replace("/opt/specwatch/bin/specwatch", exec_start)
    assert exec_start in text
    out = tmp_path / "specwatch.service"
    out.write_text(text)
    return out


def test_unit_verifies_clean(tmp_path):
    sa = tool("systemd-analyze", "systemd")
    r = run(sa, "verify", "--man=no", str(unit_for(tmp_path, sys.executable + " -m specwatch")))
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr


def test_unit_verify_catches_a_bad_directive(tmp_path):
    sa = tool("systemd-analyze", "systemd")
    bad = unit_for(tmp_path, sys.executable)
    bad.write_text(bad.read_text().replace("Restart=on-failure", "Restart=sometimes"))
    r = run(sa, "verify", "--man=no", str(bad))
    # systemd ignores a bad line (exit 0) but says so: the clean test asserts silence
    assert "Failed to parse service restart specifier, ignoring: sometimes" in r.stdout + r.stderr


def exposure(sa: str, unit: Path) -> tuple[float, str, int]:
    r = run(sa, "security", "--offline=true", f"--threshold={int(MAX_EXPOSURE * 10)}", str(unit))
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", r.stdout)
    assert m, r.stdout + r.stderr
    return float(m.group(1)), m.group(2), r.returncode


def test_unit_exposure_is_ok_and_documented(tmp_path):
    sa = tool("systemd-analyze", "systemd")
    level, verdict, rc = exposure(sa, unit_for(tmp_path, sys.executable))
    assert level <= MAX_EXPOSURE and verdict == "OK" and rc == 0, (level, verdict)
    # docs/deploy.md states the figure this test measures
    assert f"exposure {level:.1f} (\"OK\")" in (ROOT / "docs" / "deploy.md").read_text()
    assert f"exposure {level:.1f}, \"OK\"" in (ROOT / "README.md").read_text()


def test_exposure_check_fails_an_unhardened_unit(tmp_path):
    sa = tool("systemd-analyze", "systemd")
    text = unit_for(tmp_path, sys.executable).read_text()
    plain = tmp_path / "plain.service"
    plain.write_text("\n".join(l for l in text.splitlines()
                               if l.startswith(("[", "Description", "Type", "ExecStart", "WantedBy"))))
    level, verdict, rc = exposure(sa, plain)
    assert level > MAX_EXPOSURE and rc != 0, (level, verdict)


def directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            k, v = line.split("=", 1)
            out.setdefault(k, []).append(v)
    return out


def test_unit_settings_the_daemon_relies_on():
    d = directives(UNIT.read_text())
    assert d["Type"] == ["notify"] and d["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert d["Restart"] == ["on-failure"] and d["WatchdogSec"] == ["30s"]
    assert d["StateDirectory"] == ["specwatch"] and d["ConfigurationDirectory"] == ["specwatch"]
    assert d["DevicePolicy"] == ["closed"]
    # NVML opens /dev/nvidiactl and /dev/nvidia<N> (major 195) read-write, under either name
    assert sorted(d["DeviceAllow"]) == ["char-nvidia rw", "char-nvidia-frontend rw"]
    assert "PrivateDevices" not in d  # it would hide /dev/nvidia*
    # log files (adm) and the journal files for a `journal:` source (systemd-journal)
    assert d["SupplementaryGroups"] == ["adm systemd-journal"]
    # the config's default state_dir is the StateDirectory
    example = yaml.safe_load((ROOT / "config.example.yaml").read_text())
    assert example["state_dir"] == "/var/lib/specwatch"
    assert d["ExecStart"] == ["/opt/specwatch/bin/specwatch run --config /etc/specwatch/config.yaml"]
    # every directive block carries a comment saying why
    assert len(re.findall(r"(?m)^# ", UNIT.read_text())) >= 25


# --- install.sh ---------------------------------------------------------------------------

def test_install_script_is_shellcheck_clean():
    sc = tool("shellcheck", "shellcheck")
    r = run(sc, str(DEPLOY / "install.sh"))
    assert r.returncode == 0, r.stdout


def test_install_dry_run_changes_nothing(tmp_path):
    r = run("sh", str(DEPLOY / "install.sh"), "--dry-run", "--root", str(tmp_path / "r"))
    assert r.returncode == 0, r.stderr
    # the new venv is built beside the installed one, then /opt/specwatch is switched to it
    m = re.search(rf"^\+ \S*python\S* -m venv {re.escape(str(tmp_path))}/r/opt/specwatch\.d/(\d{{8}}T\d{{6}}Z-\d+)$",
                  r.stdout, re.M)
    assert m, r.stdout
    assert f"+ ln -sfn specwatch.d/{m.group(1)} {tmp_path}/r/opt/specwatch.link" in r.stdout.splitlines()
    assert f"+ ln -sfn {tmp_path}/r/opt/specwatch/bin/specwatch {tmp_path}/r/usr/local/bin/specwatch" in r.stdout
    assert f"+ install -m 0644 {DEPLOY}/specwatch.service {tmp_path}/r/etc/systemd/system/specwatch.service" in r.stdout
    assert not (tmp_path / "r").exists()
    # on the real root it would enable the unit
    r = run("sh", str(DEPLOY / "install.sh"), "--dry-run")
    assert "+ systemctl enable --now specwatch.service" in r.stdout.splitlines()


def test_install_over_an_install_of_the_older_layout_moves_it_aside(tmp_path):
    """/opt/specwatch as a venv directory (install.sh before the side-by-side layout): moved into
    /opt/specwatch.d once the new venv validates, then replaced by the symlink."""
    old = tmp_path / "r" / "opt" / "specwatch"
    (old / "bin").mkdir(parents=True)
    r = run("sh", str(DEPLOY / "install.sh"), "--dry-run", "--root", str(tmp_path / "r"))
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    [mv] = [x for x in out if x.startswith(f"+ mv {old} ")]
    assert re.fullmatch(rf"\+ mv {re.escape(str(old))} {re.escape(str(old))}\.d/\d{{8}}T\d{{6}}Z-\d+-before", mv), mv
    check = next(i for i, x in enumerate(out) if " check-config " in x)
    assert check < out.index(mv) < next(i for i, x in enumerate(out) if x.startswith("+ mv -T "))


def _next_step(out: str) -> str:
    [line] = [x for x in out.splitlines() if x.startswith("next: ")]
    return line


def test_install_says_the_next_step_for_what_runs(tmp_path):
    """Staged or not enabled: start it (enable --now), never reload; enabled on a first install:
    it runs, so reload after editing; already running before: restart for the new code."""
    install = str(DEPLOY / "install.sh")
    staged = _next_step(run("sh", install, "--dry-run", "--root", str(tmp_path / "r")).stdout)
    assert "systemctl" not in staged and "without --root" in staged
    off = _next_step(run("sh", install, "--dry-run", "--no-enable").stdout)
    assert off.endswith("then: systemctl daemon-reload && systemctl enable --now specwatch.service")
    env = dict(os.environ, PATH=f"{tmp_path}/bin:{os.environ['PATH']}")
    (tmp_path / "bin").mkdir()
    systemctl = tmp_path / "bin" / "systemctl"  # no systemd in a test: `is-active` answers from here
    for active, want in ((1, "it runs with the example config now: edit /etc/specwatch/config.yaml "
                             "(logs[].path, server, alerts.slack), then: systemctl reload specwatch"),
                         (0, "systemctl restart specwatch (it was already running")):
        systemctl.write_text(f"#!/bin/sh\nexit {active}\n")
        systemctl.chmod(0o755)
        r = run("sh", install, "--dry-run", env=env)
        assert "+ systemctl enable --now specwatch.service" in r.stdout.splitlines()
        assert want in _next_step(r.stdout), r.stdout


def _hidden_by_protect_home(python: str) -> bool:
    r = run(python, "-c", "import os, sys; print(os.path.realpath(sys.base_prefix))")
    return r.returncode == 0 and r.stdout.strip().startswith(("/home/", "/root/"))


def test_install_refuses_a_python_the_unit_cannot_see_and_picks_one_it_can(tmp_path):
    """ProtectHome=yes hides /home and /root from the service: a venv whose interpreter lives
    there fails with 203/EXEC in a restart loop. Given one, install.sh refuses and names the fix;
    without PYTHON it takes the first python3 >= 3.11 outside them (pyenv's shims come first
    on PATH here)."""
    candidates = [sys.executable, *sorted(str(p) for p in Path("/root/.pyenv/versions").glob("3.1[1-9]*/bin/python3"))]
    home = next((c for c in candidates if _hidden_by_protect_home(c)), None)
    if home is None:
        pytest.skip("no Python under /home or /root here to refuse (pyenv installs one under /root)")
    install = str(DEPLOY / "install.sh")
    r = run("sh", install, "--dry-run", env=dict(os.environ, PYTHON=home))
    assert r.returncode == 1 and "+ " not in r.stdout, r.stdout + r.stderr
    assert "the unit's ProtectHome=yes hides it from the service" in r.stderr and "PYTHON=/usr/bin/python3" in r.stderr
    env = dict(os.environ, PATH=f"{Path(home).parent}:{os.environ['PATH']}")
    env.pop("PYTHON", None)
    r = run("sh", install, "--dry-run", env=env)
    [chosen] = re.findall(r"^\+ (\S+) -m venv ", r.stdout, re.M) or [None]
    if chosen is None and "no python3 >= 3.11 outside /home and /root" in r.stderr:
        pytest.skip("no python3 >= 3.11 outside /home and /root here (Debian 12: apt install python3-venv)")
    assert r.returncode == 0 and not _hidden_by_protect_home(chosen), (chosen, r.stderr)


def test_install_rejects_unknown_options():
    r = run("sh", str(DEPLOY / "install.sh"), "--frobnicate")
    assert r.returncode == 2 and "unknown option --frobnicate" in r.stderr and "usage:" in r.stderr


@pytest.mark.timeout(300)  # a wheel built and five runs of install.sh (venvs, pip installs)
def test_install_into_a_staging_root(tmp_path):
    """A real venv, a real pip install of a wheel of this checkout (offline: the dependencies
    come from this interpreter's site-packages), config, secrets file, unit."""
    import setuptools

    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip("building the wheel offline needs setuptools>=77 (license expression); .ci/run upgrades it")
    wheels = tmp_path / "wheels"
    r = run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
            "--wheel-dir", str(wheels), str(ROOT))
    assert r.returncode == 0, r.stderr
    [wheel] = wheels.glob("specwatch-*.whl")
    root = tmp_path / "root"
    cmd = ["sh", str(DEPLOY / "install.sh"), "--root", str(root), "--venv-args", "--system-site-packages",
           "--pip-args", "--no-deps --no-index --ignore-installed", str(wheel)]
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("PYTHONPATH", None)  # the venv must import its own installed copy
    r = run(*cmd, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "installed under" in r.stdout and "not enabled" in r.stdout and "+ systemctl" not in r.stdout
    assert "systemctl reload" not in r.stdout  # nothing runs from a staging root

    venv_bin = root / "opt" / "specwatch" / "bin" / "specwatch"
    v = run(str(venv_bin), "--version", env=env)
    assert v.stdout.strip() == "specwatch 0.1.0", v.stdout + v.stderr
    where = run(str(root / "opt/specwatch/bin/python"), "-c", "import specwatch; print(specwatch.__file__)",
                env=env, cwd=tmp_path)  # not the checkout
    assert where.stdout.startswith(str(root / "opt/specwatch/lib")), where.stdout
    cfg = root / "etc" / "specwatch" / "config.yaml"
    assert cfg.read_text() == (ROOT / "config.example.yaml").read_text()
    envfile = root / "etc" / "specwatch" / "environment"
    assert stat.S_IMODE(envfile.stat().st_mode) == 0o600
    assert "SPECWATCH_SLACK_WEBHOOK_URL" in envfile.read_text()
    assert (root / "etc/systemd/system/specwatch.service").read_text() == UNIT.read_text()
    assert (root / "opt/specwatch/share/prometheus/specwatch-rules.yml").is_file()
    assert (root / "opt/specwatch/share/grafana/specwatch.json").is_file()

    # re-running upgrades (a new venv beside) and keeps an edited config
    first = os.readlink(root / "opt/specwatch")
    cfg.write_text(cfg.read_text().replace("path: /var/log/sglang/server.log", "path: /srv/sglang.log"))
    r = run(*cmd, env=env)
    assert r.returncode == 0 and f"keeping {cfg}" in r.stdout, r.stdout + r.stderr
    assert "/srv/sglang.log" in cfg.read_text()

    # `specwatch` on PATH: /usr/local/bin/specwatch -> the stable /opt/specwatch path
    link = root / "usr/local/bin/specwatch"
    assert os.readlink(link) == str(root / "opt/specwatch/bin/specwatch")
    assert run(str(link), "--version", env=env).stdout.strip() == "specwatch 0.1.0"
    releases = root / "opt/specwatch.d"
    second = os.readlink(root / "opt/specwatch")
    assert len(list(releases.iterdir())) == 2  # this one and the one before (a daemon may still run it)

    # an invalid config stops the install before anything installed is replaced: the venv
    # /opt/specwatch points at and its code stay, the half-built new one is removed
    cfg.write_text("logs: 3\n")
    (root / "etc/systemd/system/specwatch.service").unlink()
    before = sorted(releases.iterdir())
    r = run(*cmd, env=env)
    assert r.returncode != 0 and "logs: must be a list" in r.stdout + r.stderr
    assert not (root / "etc/systemd/system/specwatch.service").exists()
    assert os.readlink(root / "opt/specwatch") == second and sorted(releases.iterdir()) == before
    assert run(str(link), "--version", env=env).stdout.strip() == "specwatch 0.1.0"

    # a third install keeps itself, the previous one and one a process still runs (a daemon not
    # restarted since the first install), and removes the rest
    cfg.write_text((ROOT / "config.example.yaml").read_text())
    running = popen(["sh", "-c", "sleep 60", str(root / "opt" / first / "bin" / "specwatch")])
    try:
        r = run(*cmd, env=env)
    finally:
        running.kill()
        running.wait()
    assert r.returncode == 0 and f"keeping {root / 'opt' / first} (still running)" in r.stdout, r.stdout + r.stderr
    third = os.readlink(root / "opt/specwatch")
    assert sorted(p.name for p in releases.iterdir()) == sorted(Path(x).name for x in (first, second, third))
    r = run(*cmd, env=env)  # nothing runs the first one now
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in releases.iterdir()) == sorted(Path(x).name for x in (third, os.readlink(root / "opt/specwatch")))

    sa = shutil.which("systemd-analyze")
    if sa:  # the staged unit verifies with ExecStart at the staged binary
        r = run(sa, "verify", "--man=no", str(unit_for(tmp_path, str(venv_bin))))
        assert r.returncode == 0, r.stdout + r.stderr


# --- Prometheus and Alertmanager ----------------------------------------------------------

def test_rules_check_clean():
    promtool = tool("promtool", "prometheus")
    r = run(promtool, "check", "rules", str(RULES))
    assert r.returncode == 0 and f"SUCCESS: {len(rules())} rules found" in r.stdout, r.stdout + r.stderr


def test_rule_unit_tests_pass():
    promtool = tool("promtool", "prometheus")
    r = run(promtool, "test", "rules", RULE_TESTS.name, cwd=PROMDIR)
    assert r.returncode == 0 and "SUCCESS" in r.stdout + r.stderr, r.stdout + r.stderr


def test_rule_unit_tests_can_fail(tmp_path):
    promtool = tool("promtool", "prometheus")
    (tmp_path / RULES.name).write_text(RULES.read_text().replace("specwatch_accept_length <= 1.10", "specwatch_accept_length <= 1.00"))
    shutil.copy(RULE_TESTS, tmp_path)
    r = run(promtool, "test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert r.returncode != 0 and "AcceptanceCollapse" in r.stderr


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_every_rule_is_unit_tested_and_documented():
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {a["alertname"] for t in tests for a in t.get("alert_rule_test", []) if a["exp_alerts"]}
    quiet = {a["alertname"] for t in tests for a in t.get("alert_rule_test", []) if not a["exp_alerts"]}
    recorded = {e["expr"].split("{")[0].strip() for t in tests for e in t.get("promql_expr_test", [])}
    runbook = (DEPLOY / "RUNBOOK.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in re.findall(r"(?m)^## (.+)$", runbook)}
    alerts = [r for r in rules() if "alert" in r]
    for r in alerts:
        name = r["alert"]
        assert name in fired and name in quiet, f"{name}: needs a firing and a quiet promtool case"
        assert r["labels"]["severity"] in ("critical", "warning", "info")
        assert {"summary", "description", "runbook_url"} <= set(r["annotations"])
        assert r["annotations"]["runbook_url"].endswith("RUNBOOK.md#" + name.lower())
        assert name.lower() in anchors, f"RUNBOOK.md has no section for {name}"
    # every alert but the instant ones (an XID, a restart, an ECC error, a traceback) waits with for:
    instant = {"GpuXidError", "ServerRestarted", "GpuEccUncorrectable", "ServerLogError"}
    assert {r["alert"] for r in alerts if "for" not in r} == instant
    assert {r["record"] for r in rules() if "record" in r} == recorded


def test_prometheus_rules_mirror_the_daemons_alerts():
    from specwatch.rules import collapse, decode_stalled, log_errors

    names = {r["alert"] for r in rules() if "alert" in r}
    assert {collapse.ALERT_NAME, decode_stalled.ALERT_NAME, log_errors.ALERT_NAME} <= names
    # the error alert's severity by kind, as the daemon's
    by_kind = {r["labels"]["severity"]: r["expr"] for r in rules() if r.get("alert") == log_errors.ALERT_NAME}
    for kind, severity in log_errors.SEVERITY.items():
        assert kind in by_kind[severity], (kind, severity)


BR37 = ROOT / "tests" / "data" / "samples" / "bugreport-logs" / "BR-37"


@pytest.mark.parametrize("stall_rule", [True, False])
def test_br37_wedged_server_fires_through_prometheus(tmp_path, stall_rule):
    """BR-37 (keiretsu-labs/kubernetes-manifests PR #2577), its own promtool test run against
    these rules: a collapse fires, and a wedged server (requests running, no decode progress,
    /health failing, access lines arriving) fires within 15 minutes, by DecodeStalled alone."""
    promtool = tool("promtool", "prometheus")
    text = RULES.read_text()
    if not stall_rule:
        start = text.index("      - alert: DecodeStalled")
        text = text[:start] + text[text.index("      - alert: ServerLogError"):]
    (tmp_path / RULES.name).write_text(text)
    shutil.copy(BR37 / "keiretsu-2577.test.yml", tmp_path)
    r = run(promtool, "test", "rules", "keiretsu-2577.test.yml", cwd=tmp_path)
    if stall_rule:
        assert r.returncode == 0 and "SUCCESS" in r.stdout + r.stderr, r.stdout + r.stderr
    else:
        out = r.stdout + r.stderr
        assert r.returncode != 0 and out.count("FAILED:") == 1 and "time: 15m" in out and "got: nil" in out, out


def test_example_scrape_config_and_alertmanager_config_check(tmp_path):
    promtool = tool("promtool", "prometheus")
    r = run(promtool, "check", "config", "prometheus.yml", cwd=PROMDIR)
    assert r.returncode == 0, r.stdout + r.stderr
    amtool = tool("amtool", "prometheus-alertmanager")
    r = run(amtool, "check-config", str(PROMDIR / "alertmanager.yml"))
    assert r.returncode == 0 and "3 inhibit rules" in r.stdout, r.stdout + r.stderr
    # the inhibitions name alerts that exist
    am = yaml.safe_load((PROMDIR / "alertmanager.yml").read_text())
    names = {r["alert"] for r in rules() if "alert" in r}
    for rule in am["inhibit_rules"]:
        for m in rule["source_matchers"] + rule["target_matchers"]:
            value = m.split("=", 1)[1].strip('~"')
            assert set(value.split("|")) <= names, m


# --- Grafana --------------------------------------------------------------------------------

def test_dashboard_json_is_generated_and_importable():
    r = run(sys.executable, str(ROOT / "grafana" / "build_dashboard.py"), "--check")
    assert r.returncode == 0, r.stderr
    d = json.loads((ROOT / "grafana" / "specwatch.json").read_text())
    assert d["uid"] == "specwatch" and "id" not in d  # importable anywhere
    names = [v["name"] for v in d["templating"]["list"]]
    assert names == ["datasource", "job", "instance", "server", "engine", "dp_rank", "tp_rank"]
    # "All" is `.*`, which also matches a series without the label (issue 13: engine); but for
    # job it is the listed jobs, so "Agents up" shows no other job's targets
    assert all(v["allValue"] == ".*" for v in d["templating"]["list"] if v["type"] == "query" and v["name"] != "job")
    [job] = [v for v in d["templating"]["list"] if v["name"] == "job"]
    assert "allValue" not in job and job["includeAll"]
    [up] = [t["expr"] for p in d["panels"] if p.get("title") == "Agents up" for t in p["targets"]]
    assert up == 'up{job=~"$job",instance=~"$instance"}'
    ids, titles = set(), set()
    for p in d["panels"]:
        assert p["id"] not in ids
        ids.add(p["id"])
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24
        if p["type"] == "row":
            continue
        assert p["title"] not in titles
        titles.add(p["title"])
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}" and t["refId"] and t["expr"]
    # what the issue lists, by title
    for want in ("Accept length per rank", "Accept rate per rank", "Collapse state per rank",
                 "Generated tokens per second per server", "Running and queued requests", "KV cache token usage",
                 "GPU utilisation", "GPU memory used", "GPU power", "GPU temperature", "Clock throttle reasons",
                 "XID errors since specwatch started", "ECC errors (volatile)", "Server restarts",
                 "Log lines read per second", "Lines not understood (last hour)", "Log file events", "Alert delivery",
                 # issue 12 item 5, issue 13 item 6: sources' health, per-position acceptance, log vs /metrics
                 "Journal sources", "Engine /metrics scrapes", "Engine /metrics scrape errors (last hour)",
                 "Per-position accept rate", "Accept length: log vs /metrics", "MetricsLogDisagreement"):
        assert want in titles, want
    [alerts] = [a for a in d["annotations"]["list"] if a.get("expr")]
    assert alerts["expr"].startswith('ALERTS{alertstate="firing"')


def test_grafana_provisioning_points_at_the_dashboard():
    ds = yaml.safe_load((ROOT / "grafana/provisioning/datasources/specwatch.yml").read_text())
    [source] = ds["datasources"]
    assert source["type"] == "prometheus" and ds["apiVersion"] == 1
    dash = yaml.safe_load((ROOT / "grafana/provisioning/dashboards/specwatch.yml").read_text())
    [provider] = dash["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/var/lib/grafana/dashboards")
