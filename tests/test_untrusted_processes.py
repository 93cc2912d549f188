"""specwatch runs as root beside other users' processes: it reads them, it never runs them.

Each test starts a real process as the unprivileged user `nobody` (`setpriv --reuid`) from a
virtual environment that user made with `python3 -m venv --copies`, holding a `.pth` file: site.py
executes its `import` line in every interpreter started from that venv, writing the interpreter's
uid to a file. The process is named like an SGLang server. specwatch (root here and in CI) then
diagnoses; the file must only ever hold nobody's uid.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import procs
from checkpoints import OUT as CK
from procs import decode_line, wait_for
from specwatch_daemon import SpecwatchDaemon

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root (to start a process as nobody) and setpriv")

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]
NOBODY_UID = str(pwd.getpwnam("nobody").pw_uid)
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


@pytest.fixture(scope="module")
def trap():
    """(folder, venv python, uid file): nobody's venv with the uid-writing `.pth` payload."""
    d = Path(tempfile.mkdtemp(prefix="specwatch-nobody-"))
    d.chmod(0o777)
    uids = d / "uids"
    subprocess.run(NOBODY + [SYSTEM_PYTHON, "-m", "venv", "--copies", "--without-pip", str(d / "venv")],
                   check=True, timeout=120, cwd=d)
    site = next((d / "venv" / "lib").glob("python3.*/site-packages"))
    payload = site / "payload.pth"
    payload.write_text(f"import os; open({str(uids)!r}, 'a').write(f'{{os.getuid()}}\\n')\n")
    os.chown(payload, pwd.getpwnam("nobody").pw_uid, -1)
    yield d, d / "venv" / "bin" / "python3", uids
    shutil.rmtree(d, ignore_errors=True)


def start_as_nobody(trap, *argv, env=None):
    d, python, uids = trap
    uids.unlink(missing_ok=True)
    p = procs.popen(NOBODY + [str(python), *argv], cwd=d, env=dict(os.environ, **(env or {})),
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: uids.exists() and uids.read_text().strip(), what="the payload run by nobody's own start")
    assert set(uids.read_text().split()) == {NOBODY_UID}  # the trap works
    return p


def uids_seen(trap) -> set[str]:
    """Every uid the payload ran as (site.py may run it twice per start: lib and lib64)."""
    return set(trap[2].read_text().split())


def cli(*args):
    return subprocess.run([sys.executable, "-m", "specwatch", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def test_diagnose_pid_reads_the_process_and_never_runs_its_interpreter(trap):
    p = start_as_nobody(trap, "-c", "import time; time.sleep(600)", "sglang.launch_server")
    try:
        r = cli("diagnose", "--draft", CK / "specforge", "--pid", p.pid)
        assert uids_seen(trap) == {NOBODY_UID}, "specwatch ran nobody's interpreter as root"
        assert r.returncode == 2
        assert f"not checked: no SGLang source found (none readable for pid {p.pid}: pass --sglang-root, or --sglang-version X.Y.Z" in r.stderr
    finally:
        p.kill()
        p.wait()


def test_diagnose_finds_the_sglang_of_the_server_running_the_draft(trap, sglang_roots, tmp_path):
    """No --pid, no --sglang-root: the server whose command line names --draft is found, and its
    SGLang is the one on its PYTHONPATH (read from /proc/PID/environ), not a table's guess."""
    fake = trap[0] / "src" / "sglang"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "launch_server.py").write_text("import time\ntime.sleep(600)\n")
    draft = trap[0] / "specforge"  # nobody's server, nobody's draft
    shutil.rmtree(draft, ignore_errors=True)
    shutil.copytree(CK / "specforge", draft)
    os.chown(draft, int(NOBODY_UID), -1)
    p = start_as_nobody(trap, str(fake / "launch_server.py"), "--model-path", CK / "target-llama",
                        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", draft,
                        env={"PYTHONPATH": str(sglang_roots["0.5.23"])})
    try:
        r = cli("diagnose", "--draft", draft, "--target", CK / "target-llama", "--json")
        assert uids_seen(trap) == {NOBODY_UID}
        doc = json.loads(r.stdout)
        assert doc["sglang_version"] == "0.5.23" and doc["sglang"].startswith("SGLang 0.5.23 read from")
        assert f"SGLang of the server process {p.pid} (its command line names this draft)" in doc["notes"]
        os.chown(draft, 0, -1)  # a draft of root's that nobody's process names: not taken as the server
        r = cli("diagnose", "--draft", draft, "--target", CK / "target-llama")
        assert r.returncode == 2 and "not checked: no SGLang source found" in r.stderr
    finally:
        p.kill()
        p.wait()


def test_daemon_diagnosis_never_runs_a_process_found_on_the_box(trap, tmp_path):
    """`specwatch run` as root, diagnosis on (the default), a server_args line naming a local
    draft; nobody's process says `sglang.launch_server` and is tied to no configured server."""
    p = start_as_nobody(trap, "-c", "import time; time.sleep(600)", "sglang.launch_server")
    log = tmp_path / "server.log"
    log.write_text("")
    d = SpecwatchDaemon(tmp_path, log)
    try:
        d.start()
        with open(log, "a") as f:
            f.write(f"[2026-02-23 16:30:00] server_args=ServerArgs(model_path='{CK / 'target-llama'}', "
                    f"speculative_algorithm='EAGLE3', speculative_draft_model_path='{CK / 'specforge'}')\n")
        wait_for(lambda: "no SGLang source found" in d.output or "0" in uids_seen(trap), timeout=30,
                 what="the diagnosis to run")
        time.sleep(0.5)
        assert uids_seen(trap) == {NOBODY_UID}, "the daemon ran nobody's interpreter as root"
        assert "diagnosis of draft" in d.output and "set diagnosis.sglang_root" in d.output
    finally:
        rc, out = d.stop()
        p.kill()
        p.wait()
    assert rc == 0, out


def test_replay_collapse_alert_says_why_it_has_no_findings(tmp_path):
    """No SGLang source anywhere: the collapse alert's evidence says the draft was not checked
    (not a table's assumed version, not silence)."""
    log = tmp_path / "server.log"
    log.write_text(f"[2026-02-23 16:30:00] server_args=ServerArgs(model_path='{CK / 'target-llama'}', "
                   f"speculative_algorithm='EAGLE3', speculative_draft_model_path='{CK / 'speculators-converted'}')\n"
                   + "".join(decode_line(1.02, f"16:32:3{i}") for i in range(3)))
    r = cli("replay", log, "--json")
    alerts = [a for a in json.loads(r.stdout)["alerts"] if a["name"] == "AcceptanceCollapse"]
    assert alerts, r.stdout + r.stderr
    evidence = dict(alerts[0]["evidence"]) if isinstance(alerts[0]["evidence"], list) else alerts[0]["evidence"]
    assert evidence["diagnosis"].startswith("not checked: no SGLang source found (set diagnosis.sglang_root")


def test_diagnose_without_a_source_is_not_a_clean_bill(tmp_path):
    r = cli("diagnose", "--draft", CK / "speculators-converted", "--target", CK / "target-llama")
    assert r.returncode == 2
    assert "not checked: no SGLang source found (pass --sglang-root or --pid, or --sglang-version X.Y.Z" in r.stderr
    assert "error(s)" not in r.stdout and "assumed" not in r.stdout + r.stderr


def test_package_site_reads_cwd_pythonpath_and_pth_lines_as_the_interpreter_would(trap, tmp_path):
    """sys.path as the process has it: the working directory for -c/-m (not with -I), then the
    site directories, then the directory lines of their .pth files (an editable install)."""
    from specwatch.sources.process import package_site

    d, python, _ = trap
    for where in (d / "sglang", d / "editable" / "sglang"):
        where.mkdir(parents=True, exist_ok=True)
        (where / "__init__.py").write_text("")
    site = next((d / "venv" / "lib").glob("python3.*/site-packages"))
    (site / "__editable__.sglang.pth").write_text(f"{d / 'editable'}\n")
    try:
        p = start_as_nobody(trap, "-c", "import time; time.sleep(600)")
        assert package_site(p.pid) == str(d)  # '' first in sys.path: the working directory
        p.kill()
        p.wait()
        p = start_as_nobody(trap, "-I", "-c", "import time; time.sleep(600)")
        assert package_site(p.pid) == str(d / "editable")
        assert uids_seen(trap) == {NOBODY_UID}
    finally:
        p.kill()
        p.wait()
        (site / "__editable__.sglang.pth").unlink()
        shutil.rmtree(d / "sglang")
        shutil.rmtree(d / "editable")
