"""Helpers for the probe tests: run one probe on a committed or derived checkpoint."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from checkpoints import OUT as CK
from specwatch.system import pyast
from specwatch.probes.base import ProbeContext, ServerSettings
from specwatch.probes.checkpoint import load_draft, load_target


def path(p) -> Path:
    return p if isinstance(p, Path) else CK / p


@pytest.fixture
def run_probe(facts):
    """run_probe(module, draft, target="target-llama", version="0.5.23", **ServerSettings fields)."""

    def run(module, draft, target="target-llama", version="0.5.23", **settings):
        ctx = ProbeContext(load_draft(path(draft)), load_target(path(target)) if target else None,
                           facts[version], ServerSettings(**settings))
        return module.run(ctx)

    return run


def one(findings, fid: str):
    """The single finding with id `probe/kind`."""
    hits = [f for f in findings if f.id == fid]
    assert len(hits) == 1, f"{fid} not found once in {[f.id for f in findings]}"
    return hits[0]


def ids(findings, severity: str | None = None) -> list[str]:
    return [f.id for f in findings if severity is None or f.severity == severity]


def stripped_gemma3_site(sglang_root: Path, dest: Path) -> Path:
    """A site folder holding 0.5.23's real gemma3 files with `Gemma3ForCausalLM`'s
    `set_eagle3_layers_to_capture` removed: the wrapper's `if hasattr(...)` then forwards nothing
    (the silent case of `gemma3_mm.py@0.5.23`). Returns the folder to use as an SGLang root."""
    models = dest / "sglang" / "srt" / "models"
    models.mkdir(parents=True)
    (dest / "sglang" / "__init__.py").write_text("")
    for name in ("gemma3_mm.py", "gemma3_causal.py"):
        shutil.copy(sglang_root / "sglang" / "srt" / "models" / name, models / name)
    text = (models / "gemma3_causal.py").read_text()
    lines = text.splitlines(keepends=True)
    for node in ast.walk(pyast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name == "set_eagle3_layers_to_capture":
            start = node.lineno - 1 - len(node.decorator_list)
            lines[start:node.end_lineno] = ["\n"] * (node.end_lineno - start)
    (models / "gemma3_causal.py").write_text("".join(lines))
    return dest
