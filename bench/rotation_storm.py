"""Benchmark: a rotation storm, lines written against lines read.

A writer process (tests/rotating_writer.py) writes numbered lines at `--rates` lines/s and
rotates its log every `--every` seconds for `--seconds`, as Python's RotatingFileHandler does
("numbered": `.N` → `.N+1`, log → `.1`, every copy kept; "mv": `mv log log.1` only, each
rotation replacing the last copy). The reader is a FollowerGroup set up as `specwatch run` sets
it up (inotify, `follow.poll_interval` 0.75 s, a busy log held `HOLD_ROUNDS` intervals, no line
urgent), or with `--cadence S` a plain poll every S seconds (no inotify, as when it is
unavailable). Prints, per mode, cadence and rate: lines written, read, lost, read twice, whether
in order, the writer's renames, and the follower's rotations_total and rotated_files_lost_total.

Usage: python bench/rotation_storm.py [--rates 400 4000] [--seconds 20] [--every 0.2]
           [--modes numbered mv] [--cadence 0 1] [--repeats 1]
Figures (README, Reliability) come from `python bench/rotation_storm.py --seconds 20 --cadence 0 1`.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
from rotating_writer import RotatingWriter, tally  # noqa: E402

from specwatch.daemon import HOLD_ROUNDS  # noqa: E402
from specwatch.sources.filestream import Follower  # noqa: E402
from specwatch.sources.follow import FollowerGroup  # noqa: E402


def storm(mode: str, rate: float, seconds: float, every: float, cadence: float | None) -> dict:
    """One run; `cadence`: seconds between polls of a plain poller thread instead of the group."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "server.log"
        path.touch()
        texts: list[str] = []
        f = Follower(path, on_line=lambda line: texts.append(line.text))
        if cadence is None:
            group = FollowerGroup([f], poll_interval=0.75, use_watchdog=False, inotify=True,
                                  urgent=lambda p, b: False, hold=HOLD_ROUNDS)
        else:
            group = FollowerGroup([f], poll_interval=cadence, use_watchdog=False)
        group.start()
        w = RotatingWriter(path, mode=mode, rate=rate, seconds=seconds, every=every)
        written, rotations = w.wait(seconds + 60)
        deadline = time.monotonic() + 10
        while len(texts) < written and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # anything read twice arrives too
        group.stop()
        lost, dup, ordered = tally(texts, written)
        return {"mode": mode, "rate": rate, "written": written, "read": len(texts), "lost": lost,
                "dup": dup, "ordered": ordered, "rotations": rotations,
                "rotations_total": f.rotations_total, "lost_files": f.rotated_files_lost_total}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=float, nargs="+", default=[400, 4000])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--every", type=float, default=0.2)
    ap.add_argument("--modes", nargs="+", default=["numbered", "mv"], choices=["numbered", "mv"])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--cadence", type=float, nargs="+", default=[0.0],
                    help="seconds between plain polls (no inotify); 0: as `specwatch run` reads")
    a = ap.parse_args()
    print(f"{'mode':9} {'cadence':>7} {'lines/s':>7} {'written':>8} {'read':>8} {'lost':>6} {'twice':>6} "
          f"{'ordered':>7} {'renames':>7} {'seen':>5} {'lost_files':>10}")
    for mode in a.modes:
        for rate in a.rates:
            for cadence, _ in itertools.product(a.cadence, range(a.repeats)):
                r = storm(mode, rate, a.seconds, a.every, cadence or None)
                print(f"{r['mode']:9} {cadence or 'daemon':>7} {r['rate']:7.0f} {r['written']:8d} {r['read']:8d} {r['lost']:6d} "
                      f"{r['dup']:6d} {str(r['ordered']):>7} {r['rotations']:7d} "
                      f"{r['rotations_total']:5d} {r['lost_files']:10d}", flush=True)


if __name__ == "__main__":
    main()
