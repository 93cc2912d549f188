"""pyproject.toml's lower bounds are true: the lowest build requirement builds the wheel, and the
lowest watchdog has the inotify bindings `sources/inotify_wait.py` uses (real releases from the
index; no index reachable: skipped, or failed in CI). `.ci/run` runs the non-real-part tests on
the lowest direct versions of every dependency (`uv pip install --resolution lowest-direct`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _lower_bound(requirements: list[str], name: str) -> str:
    [req] = [r for r in requirements if re.match(rf"{name}\s*>=", r)]
    return req.split(">=", 1)[1].split(",")[0].strip()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, **extra}


def _pip_target(spec: str, target: Path, *args: str) -> None:
    """`pip install --target`; a pip failure (no index reachable) skips, or fails in CI."""
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                        *args, spec], capture_output=True, text=True, timeout=600, env=_env())
    if r.returncode != 0:
        why = f"cannot install {spec}: {r.stderr.strip()[-500:]}"
        pytest.fail(why) if os.environ.get("CI") == "true" else pytest.skip(why)


def test_the_lowest_build_requirement_builds_the_wheel(tmp_path):
    """`license = "Apache-2.0"` (a PEP 639 expression) needs a setuptools that reads it: the
    declared lowest one builds the wheel with that License-Expression."""
    low = _lower_bound(PYPROJECT["build-system"]["requires"], "setuptools")
    _pip_target(f"setuptools=={low}", tmp_path / "backend")
    out = tmp_path / "wheel"
    probe = subprocess.run([sys.executable, "-c", "import setuptools; print(setuptools.__version__)"],
                           capture_output=True, text=True, env=_env(PYTHONPATH=str(tmp_path / "backend")))
    assert Version(probe.stdout.strip()) == Version(low)  # the build below runs this one
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                        "-w", str(out), str(ROOT)], capture_output=True, text=True, timeout=600,
                       env=_env(PYTHONPATH=str(tmp_path / "backend")), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    [wheel] = out.glob("specwatch-*.whl")
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta.splitlines()


def test_the_lowest_watchdog_drives_the_inotify_waiter(tmp_path):
    """`sources/inotify_wait.py` uses watchdog's inotify bindings (`InotifyFD`): at the declared
    lowest watchdog it imports, and a write to a watched file wakes its wait."""
    low = _lower_bound(PYPROJECT["project"]["dependencies"], "watchdog")
    _pip_target(f"watchdog=={low}", tmp_path / "lib", "--only-binary", ":all:")
    log = tmp_path / "logs" / "server.log"
    log.parent.mkdir()
    log.write_text("")
    script = (
        "import sys, importlib.metadata as md\n"
        "from specwatch.sources.inotify_wait import DirWatcher\n"
        "print(md.version('watchdog'))\n"
        "w = DirWatcher()\n"
        f"w.watch({str(log.parent)!r}); w.interest = frozenset([{str(log)!r}])\n"
        "assert not w.wait(0.2)\n"
        f"open({str(log)!r}, 'a').write('line\\n')\n"
        "assert w.wait(5.0) and w.events_total >= 1\n"
        "w.close(); print('ok')\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                       env=_env(PYTHONPATH=os.pathsep.join([str(tmp_path / "lib"), str(ROOT)])))
    assert r.returncode == 0 and r.stdout.split() == [r.stdout.split()[0], "ok"], r.stderr[-3000:]
    assert Version(r.stdout.split()[0]) == Version(low)  # the lowest one ran, not this environment's


def test_ci_runs_the_tests_on_the_lowest_direct_versions():
    """.ci/run installs the project's lowest direct versions into a venv of their own and runs
    the non-real-part tests there."""
    run = (ROOT / ".ci" / "run").read_text()
    assert "--resolution lowest-direct" in run
    assert re.search(r'"\$LOW/bin/python" -m pytest .*\$LOWEST_TESTS', run)
    for path in re.search(r'LOWEST_TESTS="([^"]+)"', run).group(1).split():
        assert (ROOT / path).exists(), path
