#!/usr/bin/env python3
"""Regenerates the README's pictures under docs/: `replay-plot.png` (`specwatch replay --plot` on a
generated 3-rank log in which one DP rank collapses and the server restarts).

Run from the repository root: `python docs/make_pictures.py` (needs `pip install '.[plot]'`).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from sglang_lines import three_rank_collapse_log  # noqa: E402  (the tests' line generator)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        three_rank_collapse_log(log)
        out = ROOT / "docs" / "replay-plot.png"
        subprocess.run([sys.executable, "-m", "specwatch", "replay", str(log), "--server", "sglang-0",
                        "--plot", str(out)], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
