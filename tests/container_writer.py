"""A container runtime's log writer, run as a real process by the tests.

    python container_writer.py FORMAT PATH LINES ROTATE_BYTES MODE

FORMAT: `docker` (json-file records, a line longer than SPLIT characters cut into records whose
`log` has no newline, as moby's copier does at 16 KiB) or `cri` (`<time> stderr P|F <text>`, as
containerd cuts at 16 KiB). Before each record, a file of ROTATE_BYTES or more is rotated, also in
the middle of a cut line: MODE `rename` (docker: `.1` → `.2` ..., live → `.1`), `gzip` (docker with
`compress`: also `.1` → `.1.gz`, the plain copy removed once the gzip is complete), `copy`
(copytruncate: live copied to `.1`, then truncated) or `kubelet` (live → `0.log.<YYYYMMDD-HHMMSS>`,
the older plain rotated files gzipped through `.tmp`, as kubelet's container log manager does).
The lines written are `expected_lines(LINES)`.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import time

SPLIT = 200  # characters per record (16 KiB in Docker and containerd, scaled down)


def expected_lines(n: int) -> list[str]:
    """Every 7th line is long (cut into several records), every 11th empty."""
    out = []
    for i in range(n):
        if i % 11 == 5:
            out.append("")
        elif i % 7 == 3:
            out.append(f"line {i:06d} long " + "x" * (SPLIT * 3 + i % 50))
        else:
            out.append(f"[2026-11-30 10:00:00 TP0] line {i:06d}")
    return out


def records(fmt: str, line: str, i: int) -> list[str]:
    parts = [line[k:k + SPLIT] for k in range(0, len(line), SPLIT)] or [""]
    stamp = f"2026-11-30T10:{i // 60 % 60:02d}:{i % 60:02d}.{i:09d}Z"
    if fmt == "docker":
        out = [json.dumps({"log": p + ("\n" if k == len(parts) - 1 else ""), "stream": "stderr", "time": stamp})
               for k, p in enumerate(parts)]
    else:
        out = [f"{stamp} stderr {'F' if k == len(parts) - 1 else 'P'} {p}" for k, p in enumerate(parts)]
    return [r + "\n" for r in out]


def _gzip(src: str, dst: str) -> None:
    with open(src, "rb") as f, gzip.open(dst + ".tmp", "wb") as g:
        shutil.copyfileobj(f, g)
    os.rename(dst + ".tmp", dst)
    os.remove(src)


def rotate(path: str, mode: str, n: int) -> None:
    d, base = os.path.split(path)
    if mode == "kubelet":
        for name in sorted(os.listdir(d)):
            rest = name[len(base):]
            if name.startswith(base + ".") and not rest.endswith((".gz", ".tmp")):
                _gzip(os.path.join(d, name), os.path.join(d, name) + ".gz")
        os.rename(path, f"{path}.20261130-1000{n:02d}")
        return
    for k in range(100, 0, -1):  # shift .k → .k+1 (max-file never reached: nothing deleted)
        for ext in ("", ".gz"):
            if os.path.exists(f"{path}.{k}{ext}"):
                os.rename(f"{path}.{k}{ext}", f"{path}.{k + 1}{ext}")
    if mode == "copy":
        shutil.copyfile(path, path + ".1")
        os.truncate(path, 0)
        return
    os.rename(path, path + ".1")
    if mode == "gzip":
        _gzip(path + ".1", path + ".1.gz")


def main(fmt: str, path: str, n: int, rotate_bytes: int, mode: str) -> None:
    rotations = 0
    f = open(path, "a")
    for i, line in enumerate(expected_lines(n)):
        for rec in records(fmt, line, i):
            if os.fstat(f.fileno()).st_size >= rotate_bytes:
                if mode != "copy":
                    f.close()
                rotations += 1
                rotate(path, mode, rotations)
                if mode != "copy":
                    f = open(path, "a")
            f.write(rec)
            f.flush()
        if i % 40 == 0:
            time.sleep(0.002)  # let the reader interleave
    f.close()
    print(rotations)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
