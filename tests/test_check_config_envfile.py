"""`specwatch check-config` reads the secrets the unit gives the daemon (`EnvironmentFile=` of
deploy/specwatch.service, `environment` beside the config): the README's check after an install
passes in a shell with a `webhook_url_env:` secret that only the file holds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from specwatch.system import envfile

ROOT = Path(__file__).resolve().parents[1]
URL = "https://hooks.slack.com/services/T000/B000/XXXX"
CONFIG = """server: gpu-box-1
logs: [{path: /var/log/sglang/server.log}]
alerts:
  slack:
    webhook_url_env: SPECWATCH_SLACK_WEBHOOK_URL
"""


def check(cfg: Path, *extra: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "SPECWATCH_SLACK_WEBHOOK_URL"}
    return subprocess.run([sys.executable, "-m", "specwatch", "check-config", *extra, str(cfg)],
                          capture_output=True, text=True, timeout=60, env={**environ, **env}, cwd=ROOT)


def test_the_secret_in_the_environment_file_beside_the_config_is_used(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG)
    r = check(cfg)  # no file: the variable is missing, as before
    assert r.returncode == 2 and "environment variable SPECWATCH_SLACK_WEBHOOK_URL is not set" in r.stderr
    (tmp_path / "environment").write_text(f"# KEY=value lines\nSPECWATCH_SLACK_WEBHOOK_URL={URL}\n")
    r = check(cfg)
    assert r.returncode == 0 and "slack configured" in r.stdout, r.stderr
    assert URL not in r.stdout + r.stderr


def test_an_env_file_given_and_its_problems_named_without_values(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG)
    secrets = tmp_path / "secrets"
    secrets.write_text(f"; comment\n\nSPECWATCH_SLACK_WEBHOOK_URL = \"{URL}\"\nnot a line\n")
    r = check(cfg, "--env-file", str(secrets))
    assert r.returncode == 0, r.stderr
    assert f"{cfg}: warning: {secrets}: line 4: not KEY=value (ignored, as systemd ignores it)" in r.stderr
    # a bad URL from the file is named by key, the value never shown
    secrets.write_text("SPECWATCH_SLACK_WEBHOOK_URL=hooks.example/x\n")
    r = check(cfg, "--env-file", str(secrets))
    assert r.returncode == 2 and "alerts.slack.webhook_url: must be an http(s) URL" in r.stderr
    assert "hooks.example" not in r.stderr


def test_the_shells_variable_wins_over_the_file(tmp_path):
    values, problems = envfile.parse("A=1\nB='two words'\n")
    assert values == {"A": "1", "B": "two words"} and problems == []
    f = tmp_path / "environment"
    f.write_text("A=from-file\nB=from-file\n")
    environ = {"A": "from-shell"}
    assert envfile.apply(str(f), environ) == (["B"], [])
    assert environ == {"A": "from-shell", "B": "from-file"}


def test_a_file_that_cannot_be_read_is_said_with_the_fix(tmp_path):
    """The shipped file is root's (0600): run by another user the read fails; the warning says
    what is not checked and how to check it (here the read fails on a folder)."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG)
    (tmp_path / "environment").mkdir()
    r = check(cfg)
    assert r.returncode == 2, r.stderr
    assert (f"{cfg}: warning: {tmp_path}/environment: cannot read it (Is a directory): the variables the service "
            "gets from it are not set here; run check-config as root (sudo) to check them too") in r.stderr


def test_under_systemd_a_missing_variable_says_restart_not_reload(tmp_path):
    """systemd reads EnvironmentFile= when it starts the service: a variable added later reaches
    the daemon on restart only, so the reload's refusal says that (INVOCATION_ID: set by systemd
    for every service it starts, systemd.exec(5))."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG)
    r = check(cfg, INVOCATION_ID="0123456789abcdef0123456789abcdef")
    assert r.returncode == 2
    assert ("environment variable SPECWATCH_SLACK_WEBHOOK_URL is not set or empty; a variable added to the unit's "
            "EnvironmentFile takes effect on `systemctl restart`, not on reload") in r.stderr, r.stderr
