"""Config validation: every problem named by key path with a fix; exit 2 from check-config."""

import subprocess
import sys
from pathlib import Path

import pytest

from specwatch.config import ConfigError, build_config, load_config, parse_duration

ROOT = Path(__file__).resolve().parents[1]


def problems(data) -> list[str]:
    with pytest.raises(ConfigError) as e:
        build_config(data)
    return e.value.problems


def test_example_config_is_valid_and_matches_defaults():
    cfg = load_config(ROOT / "config.example.yaml")
    default = build_config({"logs": ["/var/log/sglang/server.log"]})
    assert cfg.logs[0].path == "/var/log/sglang/server.log"
    assert cfg.listen_port == default.listen_port == 9849
    assert cfg.collapse == default.collapse
    assert cfg.collapse.max_accept_length == 1.10 and cfg.collapse.min_batches == 3
    assert cfg.collapse.recover_accept_length == 1.5
    assert cfg.repeat_interval == default.repeat_interval == 4 * 3600
    assert cfg.follow == default.follow


def test_every_problem_is_reported_with_its_key_path():
    ps = problems({
        "logs": [{"server": "x"}, {"path": "/l", "bogus": 1}],
        "rules": {"collapse": {"min_batches": 0, "max_accept_length": "low"}},
        "alerts": {"repeat_interval": "soon", "slack": {"webhook_url": "hooks.slack.com/x"}},
        "metrics": {"listen_port": 70000},
    })
    keys = sorted(p.split(":")[0] for p in ps)
    assert keys == [
        "alerts.repeat_interval", "alerts.slack.webhook_url", "logs[0].path", "logs[1].bogus",
        "metrics.listen_port", "rules.collapse.max_accept_length", "rules.collapse.min_batches",
    ]
    slack = next(p for p in ps if p.startswith("alerts.slack.webhook_url"))
    assert "hooks.slack.com/x" not in slack  # a secret is never echoed
    assert "https://" in slack  # says how to fix it


def test_recover_must_exceed_collapse_threshold():
    ps = problems({"rules": {"collapse": {"max_accept_length": 1.6, "recover_accept_length": 1.5}}})
    assert ps[0].startswith("rules.collapse.recover_accept_length:")


def test_webhook_from_env_and_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SW_HOOK", "https://hooks.example/abc")
    assert build_config({"alerts": {"slack": {"webhook_url_env": "SW_HOOK"}}}).slack.webhook_url == "https://hooks.example/abc"
    f = tmp_path / "hook"
    f.write_text("https://hooks.example/file\n")
    cfg = build_config({"alerts": {"slack": {"webhook_url_file": str(f)}}})
    assert cfg.slack.webhook_url == "https://hooks.example/file"
    assert "hooks.example" not in repr(cfg)
    ps = problems({"alerts": {"slack": {"webhook_url_env": "SW_UNSET_VAR"}}})
    assert ps == ["alerts.slack.webhook_url_env: environment variable SW_UNSET_VAR is not set or empty; export it, or use webhook_url_file"]
    ps = problems({"alerts": {"slack": {"webhook_url": "https://a/b", "webhook_url_env": "SW_HOOK"}}})
    assert ps[0].startswith("alerts.slack.webhook_url_env: give only one of")


def test_durations():
    assert parse_duration("4h") == 14400 and parse_duration("250ms") == 0.25
    assert parse_duration(30) == 30.0 and parse_duration("1.5m") == 90
    with pytest.raises(ValueError):
        parse_duration("fortnight")


def test_yaml_syntax_error_names_line(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("logs:\n  - path: /x\n bad: [\n")
    with pytest.raises(ConfigError) as e:
        load_config(f)
    assert "not valid YAML at line" in e.value.problems[0]


def test_check_config_cli_exit_codes(tmp_path):
    good = subprocess.run([sys.executable, "-m", "specwatch", "check-config", str(ROOT / "config.example.yaml")],
                          capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    assert "ok" in good.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  collapse:\n    min_batches: -1\nalerts:\n  slack:\n    webhook_url: nope\n")
    r = subprocess.run([sys.executable, "-m", "specwatch", "check-config", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "rules.collapse.min_batches: must be >= 1" in r.stderr
    assert "alerts.slack.webhook_url: must be an http(s) URL" in r.stderr
    assert "nope" not in r.stderr


def test_logs_checked_the_way_run_would_use_them(tmp_path):
    ps = problems({"logs": ["/l/a.log", "/l/a.log"]})
    assert ps == ["logs[1].path: /l/a.log is already followed by logs[0]; list each file once"]
    ps = problems({"server": "box", "logs": ["/l/a.log", "/l/b.log"]})
    assert ps[0].startswith("logs[1].server: logs[0] and logs[1] both default to server 'box'")
    cfg = build_config({"logs": [{"path": "/l/a.log", "server": "a"}, {"path": "/l/b.log", "server": "b"}]})
    assert [(s.path, s.server) for s in cfg.logs] == [("/l/a.log", "a"), ("/l/b.log", "b")]
    f = tmp_path / "conf" / "c.yaml"
    f.parent.mkdir()
    f.write_text("logs:\n  - path: logs/server.log\n")
    assert load_config(f).logs[0].path == str(tmp_path / "conf" / "logs" / "server.log")


def test_numbers_and_urls_that_would_break_run():
    ps = problems({
        "server": 5.5,
        "follow": {"poll_interval": 0.0000001},
        "alerts": {"repeat_interval": float("nan"),
                   "slack": {"webhook_url": "https://", "backoff_initial": "10m", "backoff_max": "1s"}},
        "rules": {"collapse": {"max_accept_length": float("inf")}},
    })
    keys = sorted(p.split(":")[0] for p in ps)
    assert keys == ["alerts.repeat_interval", "alerts.slack.backoff_initial", "alerts.slack.webhook_url",
                    "follow.poll_interval", "rules.collapse.max_accept_length", "server"]
    assert problems({"alerts": {"slack": {"webhook_url": "https://h:99999/x"}}})[0].startswith("alerts.slack.webhook_url:")
