"""`specwatch silence`: a state directory that does not exist is named (a typo is not 'none'), and
`add --for` takes any value, a leading dash included, to one clear message."""

import json
import subprocess
import sys


def test_list_on_a_missing_state_dir_warns(tmp_path):
    missing = tmp_path / "typo"
    r = subprocess.run([sys.executable, "-m", "specwatch", "silence", "list", "--state-dir", str(missing)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    assert f"state directory {missing} does not exist" in r.stderr
    ok = subprocess.run([sys.executable, "-m", "specwatch", "silence", "list", "--state-dir", str(tmp_path)],
                        capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0 and "does not exist" not in ok.stderr


def _add(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "specwatch", "silence", "add", "--match", "alertname=X",
                           "--comment", "x", "--state-dir", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=30)


def test_for_takes_a_leading_dash_either_way_and_says_what_to_write(tmp_path):
    """`--for -2h` was 'expected one argument'; joined or not, a bad duration gets one message."""
    for args in (["--for", "-2h"], ["--for=-2h"], ["--for", "0"], ["--for", "2x"], ["--for", "-x"]):
        r = _add(tmp_path, *args)
        value = args[-1].removeprefix("--for=")
        assert r.returncode == 2 and f"argument --for: {value!r} is not a positive duration; write how long from now, " \
                                     "e.g. --for 30m, 2h, 1d" in r.stderr, (args, r.stderr)
    r = _add(tmp_path, "--for", "99999999999999999999d")  # its end was no date: `silence list` then crashed
    assert r.returncode == 2 and "is longer than 3650d" in r.stderr
    assert not (tmp_path / "silences.json").exists()  # nothing stored by a refused add
    r = _add(tmp_path, "--for", "90m", "--author", "-ops")  # a value may start with "-"
    assert r.returncode == 0, r.stderr
    listed = subprocess.run([sys.executable, "-m", "specwatch", "silence", "list", "--json", "--state-dir",
                             str(tmp_path)], capture_output=True, text=True, timeout=30)
    [s] = json.loads(listed.stdout)
    assert s["created_by"] == "-ops" and s["state"] == "active" and s["ends_at"] - s["starts_at"] == 5400


def test_add_into_a_missing_state_dir_says_it_was_created(tmp_path):
    missing = tmp_path / "typo"
    r = _add(missing, "--for", "1h")
    assert r.returncode == 0 and missing.is_dir()
    assert f"state directory {missing} did not exist and is created" in r.stderr
    again = _add(missing, "--for", "1h")
    assert again.returncode == 0 and "did not exist" not in again.stderr


def test_silence_and_notifications_with_a_config_need_no_secret_from_the_shell(tmp_path):
    """They read state_dir only: the Slack webhook the daemon gets from its environment
    (`webhook_url_env`, a route's too, a webhook's `url_file`) is not resolved, so an operator's
    shell without the variable lists the daemon's silences and queues."""
    import os

    state = tmp_path / "state"
    state.mkdir()
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"server: sglang-0\nlogs:\n  - path: {tmp_path / 'server.log'}\nstate_dir: {state}\n"
                   "alerts:\n  slack:\n    webhook_url_env: SPECWATCH_TEST_UNSET_HOOK\n"
                   "  webhooks:\n    - {name: pager, url_file: /nonexistent/hook}\n"
                   "  routes:\n    - {matchers: [severity=critical], slack: {channel: '#oncall'}}\n")
    env = {k: v for k, v in os.environ.items() if k != "SPECWATCH_TEST_UNSET_HOOK"}
    for cmd in (["silence", "list"], ["notifications", "list"]):
        r = subprocess.run([sys.executable, "-m", "specwatch", *cmd, "--config", str(cfg)],
                           capture_output=True, text=True, timeout=30, env=env)
        assert "SPECWATCH_TEST_UNSET_HOOK" not in r.stderr, (cmd, r.stderr)
        # the config's state_dir is read (no daemon ran there yet: no state.db)
        assert r.returncode == 0 if cmd[0] == "silence" else f"{state}/state.db: no such file" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "specwatch", "silence", "add", "--match", "alertname=X",
                        "--comment", "x", "--for", "1h", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode == 0 and (state / "silences.json").exists(), r.stderr
    # the daemon's own load still requires it
    check = subprocess.run([sys.executable, "-m", "specwatch", "check-config", str(cfg)],
                           capture_output=True, text=True, timeout=30, env=env)
    assert check.returncode == 2 and "SPECWATCH_TEST_UNSET_HOOK is not set" in check.stderr + check.stdout
