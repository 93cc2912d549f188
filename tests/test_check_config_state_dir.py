"""`specwatch check-config` refuses a state_dir that `specwatch run` cannot use (one validation,
`load_run_config`): a path under /proc, a regular file, a folder under a regular file. A folder
that does not exist yet but can be created passes and is not created by the check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def specwatch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specwatch", *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


def config(tmp_path: Path, state_dir: Path | str) -> Path:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"server: sglang-0\nlogs: [{{path: {tmp_path / 'server.log'}}}]\nstate_dir: {state_dir}\n"
                   "metrics: {listen_port: 0}\n")
    return cfg


def test_a_state_dir_run_cannot_use_fails_check_config_and_run_alike(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x\n")
    for state_dir, says in (("/proc/nope", "/proc/nope cannot be created in /proc ("),
                            (afile, f"{afile} is not a directory; "),
                            (afile / "sub", f"{afile} is not a directory (a parent of {afile / 'sub'})")):
        cfg = config(tmp_path, state_dir)
        r = specwatch("check-config", str(cfg))
        assert r.returncode == 2 and f"  state_dir: {says}" in r.stderr, (state_dir, r.stdout, r.stderr)
        run = specwatch("run", "--config", str(cfg))
        assert run.returncode == 2 and f"  state_dir: {says}" in run.stderr, (state_dir, run.stderr)
    assert afile.read_text() == "x\n"


def test_a_state_dir_that_can_be_created_passes_and_is_left_uncreated(tmp_path):
    new = tmp_path / "state" / "sub"
    r = specwatch("check-config", str(config(tmp_path, new)))
    assert r.returncode == 0 and ": ok (" in r.stdout, r.stderr
    assert not (tmp_path / "state").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]
    (tmp_path / "state").mkdir()
    r = specwatch("check-config", str(config(tmp_path, tmp_path / "state")))
    assert r.returncode == 0 and list((tmp_path / "state").iterdir()) == []
