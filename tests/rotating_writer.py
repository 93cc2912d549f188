"""A writer process that rotates its own log, as Python's `logging.handlers.RotatingFileHandler`
does (`doRollover`: close, shift `.N` → `.N+1` from the highest, rename the log to `.1`, open a
new log): numbered lines (`line 0000123`, or any `fmt`) at a steady rate, a rotation every
`every` seconds.

Modes: "numbered" keeps every copy (`.1` newest) or the newest `keep`, deleting the oldest;
"mv" is `mv log log.1` only: each rotation replaces the previous `.1`. Shared by
tests/sources/test_follow.py and bench/rotation_storm.py.
"""

from __future__ import annotations

import re
import subprocess
import sys

from procs import popen

SCRIPT = r"""
import os, sys, time
path, mode, rate, seconds, every, keep = (sys.argv[1], sys.argv[2], float(sys.argv[3]),
                                          float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]))
fmt = sys.argv[7].encode()
def op():
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
def rotate():
    if mode == "numbered":
        n = 1
        while os.path.exists(f"{path}.{n}"):
            n += 1
        for i in range(n - 1, 0, -1):
            if keep and i >= keep:
                os.unlink(f"{path}.{i}")
            else:
                os.rename(f"{path}.{i}", f"{path}.{i + 1}")
    os.rename(path, f"{path}.1")
fd = op()
start = time.monotonic()
next_rot = start + every
i = 0
rotations = 0
while True:
    now = time.monotonic()
    if now - start >= seconds:
        break
    if now >= next_rot:
        os.close(fd)
        rotate()
        fd = op()
        rotations += 1
        next_rot += every
    due = int((now - start) * rate)
    while i < due:
        os.write(fd, fmt % i)
        i += 1
    time.sleep(0.002)
os.close(fd)
print(i, rotations, flush=True)
"""

LINE = re.compile(r"line (\d{7})")


class RotatingWriter:
    """The writer process; `wait()` returns (lines written, rotations done)."""

    def __init__(self, path, *, mode: str = "numbered", rate: float = 4000.0, seconds: float = 2.0,
                 every: float = 0.2, keep: int = 0, fmt: str = "line %07d\n") -> None:
        """`fmt`: each line, `%` its number (from 0)."""
        self.proc = popen([sys.executable, "-c", SCRIPT, str(path), mode, str(rate), str(seconds),
                           str(every), str(keep), fmt], stdout=subprocess.PIPE, text=True)

    def wait(self, timeout: float = 60.0) -> tuple[int, int]:
        out, _ = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, out
        written, rotations = map(int, out.split())
        return written, rotations

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def tally(texts, written: int) -> tuple[int, int, bool]:
    """(lost, read twice or more, in order) of the numbers 0..written-1 among `texts`."""
    nums = [int(m.group(1)) for t in texts if (m := LINE.fullmatch(t))]
    seen: dict[int, int] = {}
    for n in nums:
        seen[n] = seen.get(n, 0) + 1
    lost = sum(1 for n in range(written) if n not in seen)
    dup = sum(c - 1 for c in seen.values() if c > 1)
    return lost, dup, nums == sorted(nums)
