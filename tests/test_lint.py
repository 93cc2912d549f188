"""`ruff check specwatch` and `mypy` are clean: the rules of [tool.ruff] in pyproject.toml
(pyflakes, pycodestyle's error class, bugbear) and mypy's defaults ([tool.mypy]), on every module.
docs/development.md lists them with the other checks anyone can run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_is_clean():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "specwatch"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_is_clean():
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def test_no_module_is_exempt_from_mypy():
    """Every module is checked: no `[[tool.mypy.overrides]]` that ignores a module's errors."""
    import tomllib

    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert not [o for o in mypy.get("overrides", []) if o.get("ignore_errors")]
