"""Fixtures shared by the real-systemd and real-Docker tests."""

from __future__ import annotations

import pytest

import wheelhouse


@pytest.fixture(scope="session")
def wheels(tmp_path_factory):
    """A wheelhouse of this checkout and its dependencies (tests/wheelhouse.py), built once."""
    return wheelhouse.build(tmp_path_factory.mktemp("wheels"), "real systemd and Docker")
