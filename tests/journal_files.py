"""Real systemd journal files for tests, written by `systemd-journal-remote` (Debian package
systemd-journal-remote; .ci/run installs it) from Journal Export Format
(https://systemd.io/JOURNAL_EXPORT_FORMATS/), rotated and vacuumed as journald does."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest

REMOTE = next((p for p in ("/lib/systemd/systemd-journal-remote", "/usr/lib/systemd/systemd-journal-remote")
               if os.access(p, os.X_OK)), None)
BOOT_ID = "0123456789abcdef0123456789abcdef"


def need_tools() -> None:
    """Skip unless systemd-journal-remote and journalctl are installed (.ci/run installs both)."""
    if REMOTE is None or shutil.which("journalctl") is None:
        pytest.skip("systemd-journal-remote/journalctl not installed (Debian packages systemd-journal-remote, "
                    "systemd; .ci/run installs them)")


def export_entry(message: str | bytes, realtime_us: int, fields: dict[str, str]) -> bytes:
    """One entry in Journal Export Format; a bytes or multi-line MESSAGE in the binary form."""
    head = {"__REALTIME_TIMESTAMP": str(realtime_us), "__MONOTONIC_TIMESTAMP": str(realtime_us % 10**12),
            "_BOOT_ID": BOOT_ID, **fields}
    out = "".join(f"{k}={v}\n" for k, v in head.items()).encode()
    raw = message.encode() if isinstance(message, str) else message
    if isinstance(message, bytes) or "\n" in message:
        out += b"MESSAGE\n" + struct.pack("<Q", len(raw)) + raw + b"\n"
    else:
        out += b"MESSAGE=" + raw + b"\n"
    return out + b"\n"


class JournalDir:
    """A folder of journal files like /var/log/journal/<machine-id>: `append()` writes entries
    into the active `system.journal`, `rotate()` archives it under journald's name
    (`system@<seqnum id>-<head seqnum>-<head realtime>.journal`), `vacuum()` deletes archived
    files with `journalctl --vacuum-files`. Realtime stamps grow by 1 ms per entry."""

    def __init__(self, path: Path, fields: dict[str, str] | None = None):
        need_tools()
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.fields = {"_SYSTEMD_UNIT": "sglang.service", "SYSLOG_IDENTIFIER": "python3", **(fields or {})}
        self._t = time.time_ns() // 1000

    @property
    def active(self) -> Path:
        return self.path / "system.journal"

    def append(self, messages: list[str | bytes], **fields: str) -> None:
        data = b""
        for m in messages:
            self._t += 1000
            data += export_entry(m, self._t, {**self.fields, **fields})
        r = subprocess.run([REMOTE, f"--output={self.active}", "-"], input=data, capture_output=True, timeout=30)
        assert r.returncode == 0, r.stderr.decode()

    def header(self, name: str) -> str:
        r = subprocess.run(["journalctl", f"--file={self.active}", "--header"], capture_output=True, text=True,
                           timeout=30)
        return next(l.split(":", 1)[1].strip() for l in r.stdout.splitlines() if l.startswith(name + ":"))

    def rotate(self) -> Path:
        seqnum_id = self.header("Sequential number ID").replace("-", "")
        head_seq = int(self.header("Head sequential number").split()[0])
        head_rt = int(self.header("Head realtime timestamp").rsplit("(", 1)[1].rstrip(")"), 16)
        archived = self.path / f"system@{seqnum_id}-{head_seq:016x}-{head_rt:016x}.journal"
        os.rename(self.active, archived)
        return archived

    def vacuum(self, files: int = 1) -> None:
        """Delete the oldest archived files until `files` journal files are left, the active one
        included (journalctl 252 counts it; 0 means no limit)."""
        r = subprocess.run(["journalctl", f"--directory={self.path}", f"--vacuum-files={files}"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
