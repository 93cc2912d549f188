"""A wheelhouse of this checkout, its dependencies and its build backend, built here with pip, for
installs where no index is reachable (a guest with only a loopback, a container image build).
Pointed at with pip's own settings: `PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR`, or a pip.conf."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def build(dest: Path, what: str) -> Path:
    """Fill `dest`; a pip failure (no index reachable) skips the test, or fails it in CI.
    `what` names the part of the suite for that line."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for cmd in (["wheel", "--quiet", "--no-build-isolation", "-w", str(dest), str(ROOT)],
                ["download", "--quiet", "-d", str(dest), "setuptools>=77"]):
        r = subprocess.run([sys.executable, "-m", "pip", *cmd], capture_output=True, text=True, timeout=600, env=env)
        if r.returncode != 0:
            why = f"{what}: cannot build the wheelhouse (pip {cmd[0]}): {r.stderr.strip()[-500:]}"
            pytest.fail(why) if os.environ.get("CI") == "true" else pytest.skip(why)
    return dest
