"""Regenerate docs/status-page.png: a live `specwatch run` fed a collapse, its status page
captured with headless Chromium (Debian `chromium`; Pillow not needed).

    python3 docs/make_screenshots.py [--out docs/status-page.png]

Uses the test helpers in tests/ (a real daemon on a free port, a generated SGLang log whose
decode lines fall in the last 30 minutes: rank TP1 collapsed now, TP0 and TP1 once before).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import urllib.request
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import chromium  # noqa: E402
from procs import wait_for  # noqa: E402
from specwatch_daemon import SpecwatchDaemon  # noqa: E402
from status_log import episode_log  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "status-page.png")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=1150)
    args = ap.parse_args(argv)
    if chromium.BINARY is None:
        print("chromium not found: apt-get install --no-install-recommends chromium", file=sys.stderr)
        return 1
    import os

    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="specwatch-shot-") as tmp:
        log = Path(tmp) / "sglang.log"
        episode_log(log, end=time.time(), ranks={"TP0": [(540, 700)], "TP1": [(540, 900), (1560, 1800)]},
                    model="moonshotai/Kimi-K2.5", draft="/models/kimi-k25-eagle3")
        d = SpecwatchDaemon(Path(tmp), log, server="gpu-box-1", extra={"process": {"enabled": False}})
        d.start()
        try:
            url = f"http://127.0.0.1:{d.port}"

            def ready():
                s = json.loads(urllib.request.urlopen(f"{url}/api/status", timeout=5).read())
                return s["servers"] and s["servers"][0]["lines"]["decode"] == 720 and s["alerts"]

            wait_for(ready, timeout=30, what="the log read and the alert firing")
            chromium.screenshot(f"{url}/?refresh=0", args.out, args.width, args.height)
        finally:
            d.stop()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
