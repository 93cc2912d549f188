"""The README's commands and config snippets work as written (issue 12 item 4)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def first_commands() -> list[str]:
    block = re.match(r"# specwatch\n\n```sh\n(.*?)```", README, re.S)
    assert block, "the README must open with its two commands"
    return block.group(1).strip().splitlines()


def test_the_test_command_is_the_one_ci_runs():
    install, tests = first_commands()[1].split(" && ")
    assert install == "pip install '.[test]'"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m pip install -q '.[test]'" in ci
    assert ci.rstrip().splitlines()[-1] == tests == "python3 -m pytest -q"


def test_the_first_command_runs_as_written(tmp_path):
    """`pip install . && specwatch replay ...`, typed into a shell whose `pip` and `specwatch`
    are a fresh venv's (dependencies from this interpreter's site-packages: no download)."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=True)
    # ensurepip's old setuptools would shadow this interpreter's (>= 77 builds the PEP 639 license)
    subprocess.run([env_dir / "bin" / "python", "-m", "pip", "uninstall", "-q", "-y", "setuptools"], check=True,
                   capture_output=True)
    env = dict(os.environ, PATH=f"{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}", PIP_NO_BUILD_ISOLATION="0",  # pip reads "0" as --no-build-isolation
               PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", VIRTUAL_ENV=str(env_dir))
    env.pop("PYTHONPATH", None)  # the installed copy answers, not the checkout
    r = subprocess.run(["bash", "-c", first_commands()[0]], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Successfully installed specwatch" in r.stdout
    assert r.stdout[r.stdout.index("Successfully installed"):].split("\n", 1)[1].startswith(
        ":rotating_light: AcceptanceCollapse\n")
    assert "ALERT AcceptanceCollapse on kimi-k25-tp8 TP0: FIRING since" in r.stdout


def yaml_snippets() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", README, re.S)


@pytest.mark.parametrize("snippet", yaml_snippets(), ids=lambda s: s.splitlines()[0][:40])
def test_every_config_snippet_passes_check_config(snippet, tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\n" + snippet)
    r = subprocess.run([sys.executable, "-m", "specwatch", "check-config", str(cfg)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
