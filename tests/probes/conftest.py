"""Helpers for the probe tests: run one probe on a committed or derived checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpoints import OUT as CK
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
