"""Headless Chromium (Debian `chromium`, installed by .ci/run) for the status page tests and
docs/make_screenshots.py: a screenshot and the DOM after load, each in a fresh profile."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

BINARY = shutil.which("chromium") or shutil.which("chromium-browser")


def _run(url: str, *flags: str, timeout: float = 90) -> str:
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        p = subprocess.run([BINARY, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}", *flags, url],
                           capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"chromium exited {p.returncode}: {p.stderr[-2000:]}")
    return p.stdout


def screenshot(url: str, out: Path, width: int = 1280, height: int = 1600) -> Path:
    """A PNG of the page at `url` in a width x height window."""
    _run(url, f"--screenshot={out}", f"--window-size={width},{height}")
    if not Path(out).is_file():
        raise AssertionError(f"chromium wrote no screenshot to {out}")
    return Path(out)


def dump_dom(url: str) -> str:
    """The page's DOM after load, serialized."""
    return _run(url, "--dump-dom")
