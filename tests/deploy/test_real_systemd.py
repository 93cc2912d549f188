"""deploy/install.sh and deploy/specwatch.service under a real systemd (252, booted under
systemd-nspawn: tests/nspawn_guest.py), as a user runs them: the README's install commands
word for word (pip offline from a wheelhouse built here: the guest has no network), then the
unit's promises: READY=1, the journal source under the shipped hardening, reload, the
exposure figure, the watchdog. One guest boot serves the whole module (about 2-3 minutes).

Without root or systemd-nspawn (Debian package systemd-container) the tests skip with that
line; in CI (`CI=true`, .ci/run installs it) they fail instead.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import nspawn_guest
import procs

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]
SRC = "/srv/specwatch-src"
WHEELS = "/srv/wheels"
SECRET = "https://hooks.slack.com/services/T000/B000/XXXX"
# The "edit" step of the README: a log file, a second unit's journal, a Slack secret by name.
CONFIG = """server: gpu-box-1
logs:
  - path: /var/log/sglang/gpu-box-1.log
  - journal: {unit: sglang.service}
    server: sglang-journal
alerts:
  slack:
    webhook_url_env: SPECWATCH_SLACK_WEBHOOK_URL
"""
# SGLang 0.5.x decode lines (format of examples/logs/kimi-k25-eagle3-collapse.log), healthy.
DECODE = ("[2026-02-23 16:32:{s:02d} TP0] Decode batch, #running-req: 32, #token: 2268, token usage: 0.02, "
          "accept len: 3.20, accept rate: 0.55, cuda graph: True, gen throughput (token/s): 1200.50, #queue-req: 0")


def need_guest() -> None:
    why = nspawn_guest.missing()
    if why is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"real systemd: {why}")
    pytest.skip(f"real systemd: {why}")


def readme_install_block() -> list[str]:
    """The commands of the README's "Install as a systemd service" block, comments dropped."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Install as a systemd service\n\n```sh\n(.*?)```", text, re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


class Box:
    def __init__(self, guest: nspawn_guest.Guest):
        self.guest = guest
        self.applied = False  # CONFIG is what the daemon runs
        self.sudo = "" if guest.sh("command -v sudo", check=False).returncode == 0 else \
            "sudo() { \"$@\"; }; "  # the guest runs as root; without sudo installed it is a no-op

    def sh(self, cmd: str, **kw) -> subprocess.CompletedProcess:
        return self.guest.sh(self.sudo + cmd, **kw)

    def metrics(self) -> dict[tuple[str, tuple], float]:
        body = self.sh("curl -sf 127.0.0.1:9849/metrics").stdout
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(body) for s in fam.samples}

    def metric(self, name: str, **labels) -> float | None:
        """The value of the one sample `name` whose labels include `labels`, else None."""
        found = [v for (n, ls), v in self.metrics().items() if n == name and set(labels.items()) <= set(ls)]
        assert len(found) <= 1, (name, labels, found)
        return found[0] if found else None

    def show(self, *props: str) -> dict[str, str]:
        out = self.sh(f"systemctl show specwatch.service -p {','.join(props)}").stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def configured(self) -> None:
        """The README's edits done (CONFIG and the secret) and the unit restarted, unless an
        earlier test did it: each test can run alone."""
        if not self.applied:
            self.guest.path("/etc/specwatch/config.yaml").write_text(CONFIG)
            env = self.guest.path("/etc/specwatch/environment")
            env.write_text(env.read_text() + f"SPECWATCH_SLACK_WEBHOOK_URL={SECRET}\n")
            self.sh("systemctl restart specwatch")
            self.applied = True

    def journal(self, unit: str = "specwatch.service") -> str:
        return self.sh(f"journalctl -q --no-pager -o cat -u {unit}").stdout


@pytest.fixture(scope="module")
def box(request):
    need_guest()
    wheels = request.getfixturevalue("wheels")  # after the check: a skip builds nothing
    guest = nspawn_guest.Guest()
    try:
        b = Box(guest)
        shutil.copytree(ROOT, guest.path(SRC), symlinks=True,
                        ignore=shutil.ignore_patterns(".cache", ".git", "__pycache__", "*.egg-info", "build"))
        shutil.copytree(wheels, guest.path(WHEELS))
        # SGLang's log, readable by Debian's log group (the unit's SupplementaryGroups=adm)
        # (the example config's server.log stays empty; the edited config names gpu-box-1.log)
        b.sh("install -d -m 0750 -g adm /var/log/sglang && for f in server gpu-box-1; do "
             "install -m 0640 -g adm /dev/null /var/log/sglang/$f.log; done")
        guest.path("/var/log/sglang/gpu-box-1.log").write_text("".join(DECODE.format(s=s) + "\n" for s in (38, 42)))
        # an interpreter under /root (pyenv's, the one tests run) is refused before anything is done
        if sys.executable.startswith(("/root/", "/home/")):
            b.refused = b.sh(f"cd {SRC} && PYTHON={shlex.quote(sys.executable)} deploy/install.sh", check=False)
        # pip finds no index in the guest: the wheelhouse, through pip's own environment variables
        b.offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": WHEELS}
        first = readme_install_block()[0]
        b.installed = b.sh(f"cd {SRC} && {first}", env=b.offline, timeout=600)
        yield b
    finally:
        guest.close()


def test_install_refuses_an_interpreter_the_unit_cannot_see(box):
    if not hasattr(box, "refused"):
        pytest.skip("the test interpreter is not under /home or /root")
    assert box.refused.returncode == 1, box.refused.stdout + box.refused.stderr
    assert "ProtectHome=yes hides it" in box.refused.stderr and "+ " not in box.refused.stdout


def test_install_as_the_readme_says_starts_the_unit_via_ready(box):
    out = box.installed.stdout
    assert "+ systemctl enable --now specwatch.service" in out, out
    assert "check: systemctl status specwatch" in out and "it runs with the example config now" in out, out
    # the venv's interpreter is one the unit can see
    base = box.sh("/opt/specwatch/bin/python -c 'import sys; print(sys.base_prefix)'").stdout.strip()
    assert not base.startswith(("/root", "/home")), base
    s = box.show("Type", "ActiveState", "SubState", "StatusText", "NRestarts", "ExecMainStatus")
    # Type=notify: "active" only after the daemon's READY=1; STATUS= came over the same socket
    assert (s["Type"], s["ActiveState"], s["SubState"], s["NRestarts"]) == ("notify", "active", "running", "0"), s
    assert s["StatusText"], s


def test_the_readmes_commands_after_install_work_as_written(box):
    """The two edits done by the test (sudoedit is interactive), the rest run as written."""
    edit, edit_env, check, restart, curl = readme_install_block()[1:]
    assert (edit, edit_env) == ("sudoedit /etc/specwatch/config.yaml", "sudoedit /etc/specwatch/environment")
    box.guest.path("/etc/specwatch/config.yaml").write_text(CONFIG)
    env = box.guest.path("/etc/specwatch/environment")
    env.write_text(env.read_text() + f"SPECWATCH_SLACK_WEBHOOK_URL={SECRET}\n")
    assert box.sh("command -v specwatch").stdout.strip() == "/usr/local/bin/specwatch"
    r = box.sh(check)
    assert "/etc/specwatch/config.yaml: ok (1 log file(s), 1 journal source(s)" in r.stdout, r.stdout + r.stderr
    assert "slack configured" in r.stdout and SECRET not in r.stdout + r.stderr
    box.sh(restart)
    box.applied = True

    def edited_servers_line():
        return [x for x in box.sh(curl, check=False).stdout.splitlines()
                if x.startswith("specwatch_accept_length{") and 'server="gpu-box-1"' in x]

    try:
        [line] = procs.wait_for(edited_servers_line, timeout=30, interval=0.5,
                                what="specwatch_accept_length of the edited config's server")
    except AssertionError as e:
        raise AssertionError(f"{e}; specwatch's log:\n{box.journal()[-3000:]}") from None
    assert line.endswith(" 3.2"), line
    assert box.metric("specwatch_config_reload_success") == 1.0
    assert box.sh("stat -c %a /etc/specwatch/environment").stdout.strip() == "600"


def test_the_journal_source_reads_a_second_units_output_under_the_hardening(box):
    box.configured()
    server = box.guest.path("/usr/local/bin/fake-sglang-server")  # prints SGLang's lines to its stdout
    server.write_text("#!/bin/sh\n" + "".join(f"echo {shlex.quote(DECODE.format(s=s))}\n" for s in (1, 2, 3))
                      + "exec sleep infinity\n")
    server.chmod(0o755)
    box.sh("systemd-run --quiet --unit=sglang.service /usr/local/bin/fake-sglang-server")
    assert box.sh("journalctl -q --no-pager -o cat -u sglang.service").stdout.count("Decode batch") == 3
    want = ("specwatch_log_lines_total", (("kind", "decode"), ("server", "sglang-journal")))
    try:
        procs.wait_for(lambda: box.metrics().get(want) == 3.0, timeout=30, interval=0.5, what="3 decode lines from the journal")
    except AssertionError:
        raise AssertionError(f"{box.metrics().get(want)} decode lines; specwatch's log:\n{box.journal()[-3000:]}")
    assert box.metric("specwatch_journal_up", path="journal:sglang.service") == 1.0
    assert "setpriv" not in box.journal() and "Operation not permitted" not in box.journal()
    # journalctl runs as specwatch's child, as its dynamic user
    main = box.show("MainPID")["MainPID"]
    kids = box.sh(f"ps -o user=,comm= --ppid {main}").stdout.split()
    assert kids[1::2] == ["journalctl"] and kids[0] != "root", kids


def test_reload_applies_a_good_config_and_refuses_a_bad_one(box):
    box.configured()
    main = box.show("MainPID")["MainPID"]
    box.guest.path("/var/log/sglang/other.log").write_text(DECODE.format(s=50) + "\n")
    box.sh("chgrp adm /var/log/sglang/other.log && chmod 0640 /var/log/sglang/other.log")
    cfg = box.guest.path("/etc/specwatch/config.yaml")
    cfg.write_text(CONFIG.replace("logs:\n", "logs:\n  - path: /var/log/sglang/other.log\n    server: gpu-box-2\n"))
    box.sh("systemctl reload specwatch")
    procs.wait_for(lambda: box.metric("specwatch_accept_length", server="gpu-box-2") == 3.2
                   if box.metric("specwatch_config_reload_success") == 1.0 else False, timeout=30,
                   what="the reloaded config's new log read")
    cfg.write_text("logs: 3\n")
    box.sh("systemctl reload specwatch")
    procs.wait_for(lambda: box.metric("specwatch_config_reload_success") == 0.0, timeout=30, what="the refused reload")
    s = box.show("ActiveState", "MainPID", "StatusText")
    assert s["ActiveState"] == "active" and s["MainPID"] == main and "FAILED" in s["StatusText"], s
    assert "config reload from /etc/specwatch/config.yaml refused, the running config stays" in box.journal()
    # the running config still reads its logs
    with box.guest.path("/var/log/sglang/other.log").open("a") as f:
        f.write(DECODE.format(s=51).replace("accept len: 3.20", "accept len: 2.80") + "\n")
    procs.wait_for(lambda: box.metric("specwatch_accept_length", server="gpu-box-2") == 2.8,
                   timeout=30, what="the old config to keep reading")
    cfg.write_text(CONFIG)
    box.sh("systemctl reload specwatch")


def test_online_exposure_is_what_the_readme_says(box):
    out = box.sh("systemd-analyze security --no-pager specwatch.service").stdout
    m = re.search(r"Overall exposure level for specwatch\.service: (\d+\.\d+) (\w+)", out)
    assert m, out[-2000:]
    readme = (ROOT / "README.md").read_text()
    assert f"`systemd-analyze security specwatch` exposure {m.group(1)}, \"{m.group(2)}\"" in readme, m.group(0)


def test_an_upgrade_leaves_the_running_daemon_on_its_venv_until_restart(box):
    """install.sh again over a running service: the new venv is built beside, the daemon keeps
    running (and reloading) from its own venv, and a restart runs the new one."""
    box.configured()
    old = box.sh("readlink /opt/specwatch").stdout.strip()
    main = box.show("MainPID")["MainPID"]
    r = box.sh(f"cd {SRC} && {readme_install_block()[0]}", env=box.offline, timeout=600)
    assert "next: systemctl restart specwatch (it was already running" in r.stdout, r.stdout
    new = box.sh("readlink /opt/specwatch").stdout.strip()
    assert new != old and box.guest.path(f"/opt/{old}/bin/python").exists()

    def venv_of(pid: str) -> str:
        return box.sh(f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout.split()[0]

    assert box.show("MainPID", "ActiveState") == {"MainPID": main, "ActiveState": "active"}
    assert venv_of(main) == f"/opt/{old}/bin/python"
    reloaded = "config reloaded from /etc/specwatch/config.yaml"
    n = box.journal().count(reloaded)
    box.sh("systemctl reload specwatch")  # its code path imports modules lazily: they must still be there
    procs.wait_for(lambda: box.journal().count(reloaded) == n + 1, timeout=20, interval=0.5,
                   what="a reload of the daemon on the previous venv")
    assert box.metric("specwatch_config_reload_success") == 1.0
    box.sh("systemctl restart specwatch")
    assert venv_of(box.show("MainPID")["MainPID"]) == f"/opt/{new}/bin/python"


def test_the_watchdog_restarts_a_stopped_daemon(box):
    """SIGSTOP: no WATCHDOG=1 for WatchdogSec (30 s), then SIGABRT and a restart (RestartSec)."""
    before = box.show("MainPID", "NRestarts")
    box.sh(f"kill -STOP {before['MainPID']}")
    started = time.monotonic()
    procs.wait_for(lambda: box.show("NRestarts")["NRestarts"] == str(int(before["NRestarts"]) + 1)
                   and box.show("ActiveState")["ActiveState"] == "active", timeout=120, interval=1,
                   what="the watchdog's restart")
    took = time.monotonic() - started
    after = box.show("MainPID", "SubState")
    assert after["MainPID"] != before["MainPID"] and after["SubState"] == "running", after
    assert "Watchdog timeout" in box.sh("journalctl -q --no-pager -u specwatch.service").stdout
    # the killed daemon's journalctl went with it; the new one has its own
    procs.wait_for(lambda: box.sh("ps -o ppid= -C journalctl", check=False).stdout.split() == [after["MainPID"]],
                   timeout=20, interval=0.5, what="one journalctl, the new daemon's")
    assert took >= 25, took  # not before the watchdog's interval ran out
