"""Rotated copies of a followed file: their names, their order, and whether one is a given file.

logrotate leaves `<path>.1`, `<path>.2`, ... (`.1` newest), or with `dateext` `<path>-YYYYMMDD`
(newest last), each maybe compressed (`.gz`, logrotate's default `compress`); Python's
`TimedRotatingFileHandler` leaves `<path>.YYYY-MM-DD[_HH-MM-SS]`. A file is recognised among them
by identity, as Vector's `file_source` checksum fingerprinter and Filebeat's `file_identity` do:
device + inode and a hash of its first bytes, or the first bytes alone for a compressed copy
(its inode is new). A copy is opened by identity: a rotation storm renames `.3` to `.4` between
the listing and the open, so the name is checked against the listed inode and looked up again.
Compressed copies are read with the standard library's `gzip`.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import os
import re
import stat
from typing import BinaryIO, NamedTuple

_NUMBERED = re.compile(r"\.(\d{1,6})(\.gz)?")
_RENAME_TRIES = 8  # names looked up again for one inode (a rotation storm renames it meanwhile)
_LIST_TRIES = 5  # listings taken until two in a row agree
_DATED = re.compile(r"[-.](\d{8}(?:[-_]?\d+)*|\d{4}-\d{2}-\d{2}(?:_\d{2}(?:-\d{2}){0,2})?)(\.gz)?")


class Fingerprint(NamedTuple):
    """Who a file is: dev/ino of the file on disk, and sha256 of its first `head_len` bytes
    (decompressed). JSON-able as a list."""

    dev: int
    ino: int
    head_len: int
    head_sha256: str

    @classmethod
    def of(cls, dev: int, ino: int, head: bytes) -> "Fingerprint":
        return cls(dev, ino, len(head), hashlib.sha256(head).hexdigest())

    @classmethod
    def parse(cls, value: object) -> "Fingerprint":
        """From its JSON list. Raises ValueError for anything else."""
        if not isinstance(value, (list, tuple)) or len(value) != 4:
            raise ValueError(f"bad fingerprint {value!r}")
        dev, ino, n, sha = value
        if not (isinstance(dev, int) and isinstance(ino, int) and isinstance(n, int)
                and isinstance(sha, str) and n >= 0):
            raise ValueError(f"bad fingerprint {value!r}")
        return cls(dev, ino, n, sha)


class RotatedFile:
    """One rotated copy. `number`: the `.N` of a numbered name (None for a dated one)."""

    __slots__ = ("path", "base", "compressed", "number", "dev", "ino", "size", "_heads", "_fd",
                 "_fd_gz")

    def __init__(self, path: str, compressed: bool, number: int | None, st: os.stat_result,
                 base: str = ""):
        self.path, self.compressed, self.number = path, compressed, number
        self.base = base  # the followed file's path: where to look for this one's new name
        self.dev, self.ino, self.size = st.st_dev, st.st_ino, st.st_size
        self._heads: dict[int, bytes] = {}
        self._fd: int | None = None  # held open (`hold`)
        self._fd_gz = compressed

    def open(self) -> BinaryIO:
        """Its content (decompressed), from byte 0, opened by identity: under its listed name
        when that still names its inode, else under the name the inode has now (renamed by a
        later rotation); a plain copy compressed (`.gz` written, the plain one removed) since it
        was listed is read from its `.gz`. Raises OSError (FileNotFoundError: gone)."""
        fh: io.FileIO
        if self._fd is not None:
            fh, gz = os.fdopen(os.dup(self._fd), "rb", buffering=0), self._fd_gz
            fh.seek(0)
        else:
            fh, gz = self._open_raw()
        if gz:
            z = gzip.GzipFile(fileobj=fh, mode="rb")
            z.myfileobj = fh  # closed with it, as gzip.open(name) does with the file it opens
            # GzipFile has BinaryIO's methods, but typeshed derives it from BufferedIOBase only
            return z  # type: ignore[return-value]
        return fh

    def hold(self) -> None:
        """Open it now (by identity, see `open`) and keep it open until `release()`: later
        renames and a removal no longer matter. Raises OSError."""
        if self._fd is None:
            fh, self._fd_gz = self._open_raw()
            with fh:
                self._fd = os.dup(fh.fileno())

    def take(self) -> int:
        """Its raw file descriptor (opened by identity, see `open`), now the caller's to close.
        Raises OSError."""
        self.hold()
        fd, self._fd = self._fd, None
        assert fd is not None  # hold() opened it
        return fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open_raw(self) -> tuple[io.FileIO, bool]:
        """The file itself, found by (dev, ino): its name may have moved on since the listing
        (`.3` is `.4` after the next rotation), and that name may meanwhile hold another file."""
        path = self.path
        for _ in range(_RENAME_TRIES):
            try:
                fh = open(path, "rb", buffering=0)
            except FileNotFoundError:
                fh = None
            if fh is not None:
                st = os.fstat(fh.fileno())
                if (st.st_dev, st.st_ino) == (self.dev, self.ino):
                    return fh, self.compressed
                fh.close()
            now = next((f.path for f in _listing(self.base)
                        if (f.dev, f.ino) == (self.dev, self.ino)), None)
            if now is None:
                break
            path = now
        if not self.compressed:
            # compressed since listed (`.gz` written, the plain copy removed): a new inode, the
            # same content
            try:
                fh = open(self.path + ".gz", "rb", buffering=0)
            except FileNotFoundError:
                pass
            else:
                self.compressed = True
                return fh, True
        raise FileNotFoundError(errno.ENOENT, "rotated away and removed", self.path)

    def head(self, n: int) -> bytes:
        """The first `n` bytes of its content (fewer when shorter); b"" when unreadable."""
        if n not in self._heads:
            try:
                with self.open() as fh:
                    self._heads[n] = fh.read(n)
            except (OSError, EOFError):  # gzip.BadGzipFile is an OSError
                self._heads[n] = b""
        return self._heads[n]

    def is_(self, fp: Fingerprint) -> bool:
        """True when this is the file `fp` describes, or a copy of it (same first bytes). An empty
        head matches only by inode: it says nothing about content."""
        if fp.head_len == 0:
            return not self.compressed and (self.dev, self.ino) == (fp.dev, fp.ino)
        head = self.head(fp.head_len)
        return len(head) == fp.head_len and hashlib.sha256(head).hexdigest() == fp.head_sha256

    def fingerprint(self, head_bytes: int) -> Fingerprint:
        return Fingerprint.of(self.dev, self.ino, self.head(head_bytes))

    def __repr__(self) -> str:
        return f"RotatedFile({self.path!r})"


def rotated_files(path: str) -> list[RotatedFile]:
    """The rotated copies of `path` in its directory, oldest first: dated names by date, numbered
    ones from the highest number; at one name the compressed copy comes before the plain one
    (logrotate writes `.1.gz` before it removes `.1`). When both kinds are present (the naming
    was changed), the kind with the newest modification time is the newer. Regular files only;
    [] when the directory cannot be read.

    A listing is a `listdir` and a `stat` per name, not atomic: a rotation in between shows one
    inode under two names or none. The directory is listed until two listings in a row name the
    same inodes (a few tries), so the order is one the directory really had."""
    files = _listing(path)
    for _ in range(_LIST_TRIES - 1):
        again = _listing(path)
        if [(f.path, f.dev, f.ino) for f in again] == [(f.path, f.dev, f.ino) for f in files]:
            break
        files = again
    return files


def _listing(path: str) -> list[RotatedFile]:
    d, base = os.path.split(path)
    try:
        names = os.listdir(d or ".")
    except OSError:
        return []
    keyed = []
    newest = [0, 0]  # latest mtime of dated, of numbered names
    for name in names:
        if not name.startswith(base) or name == base:
            continue
        rest = name[len(base):]
        m = _NUMBERED.fullmatch(rest)
        key: tuple[int, int | str, bool]  # (kind: 0 dated, 1 numbered; order within the kind; plain first)
        if m:
            number, key = int(m.group(1)), (1, -int(m.group(1)), m.group(2) is None)
        else:
            m = _DATED.fullmatch(rest)
            if not m:
                continue
            number, key = None, (0, re.sub(r"\D", "", m.group(1)), m.group(2) is None)
        full = os.path.join(d, name)
        try:
            st = os.stat(full)
        except OSError:
            # Compressed since the listing (`.gz` written, then the plain copy removed).
            if m.group(2) or name + ".gz" in names:
                continue
            try:
                st = os.stat(full + ".gz")
            except OSError:
                continue
            full += ".gz"
            key = (*key[:2], False)
        if stat.S_ISREG(st.st_mode):
            keyed.append((key, RotatedFile(full, full.endswith(".gz"), number, st, path)))
            newest[key[0]] = max(newest[key[0]], st.st_mtime_ns)
    if newest[0] > newest[1]:
        keyed = [((1 - k[0], *k[1:]), rf) for k, rf in keyed]
    keyed.sort(key=lambda kv: kv[0])
    return [rf for _, rf in keyed]


def rotation_suffix(rest: str) -> bool:
    """True when `rest` (what follows a file's name) is one a rotated copy adds: `.1`, `.2.gz`,
    `-20261130`, `.20261130-100000` (kubelet), ... as `rotated_files` reads them."""
    return bool(_NUMBERED.fullmatch(rest) or _DATED.fullmatch(rest))


def newest_fingerprint(files: list[RotatedFile], head_bytes: int) -> Fingerprint | None:
    """The newest non-empty file's fingerprint (an empty one cannot be told apart once compressed)."""
    for rf in reversed(files):
        head = rf.head(head_bytes)
        if head:
            return Fingerprint.of(rf.dev, rf.ino, head)
    return None


def since(files: list[RotatedFile], prior: Fingerprint | None) -> list[RotatedFile]:
    """The files rotated after `prior` (the newest one when the reader opened its file; None: there
    was none). When `prior` is gone (rotated away: the oldest go first), all of them."""
    if prior is not None:
        for i in range(len(files) - 1, -1, -1):
            if files[i].is_(prior):
                return files[i + 1:]
    return files
