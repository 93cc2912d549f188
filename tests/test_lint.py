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


def test_no_user_text_cites_a_bug_report_by_its_internal_id():
    """Alert text (Slack, webhooks, the status page) cites a public upstream issue as `owner/repo#N`,
    never the ids of docs/bugreports.md (`BR-05`), which mean nothing outside this repository. Only
    docstrings and comments may use the ids."""
    import ast
    import re

    found = []
    for p in sorted((ROOT / "specwatch").rglob("*.py")):
        tree = ast.parse(p.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        found += [f"{p.relative_to(ROOT)}:{n.lineno}" for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
                  and re.search(r"\bBR-\d\d", n.value)]
    assert found == []
