"""Silences: label matchers that mute notifications for a time, kept in the state directory.

`specwatch silence add|list|expire` writes `<state_dir>/silences.json`; a running daemon sees
the change without a restart because `SilenceStore.reload_if_changed` re-reads the file when its
size, inode or modification time changes (one stat per call). Writers hold an exclusive
`flock` on `silences.lock` around read-modify-write, so two CLI calls never lose each other's
silence. Semantics follow Alertmanager: a silence mutes an alert whose labels match all its
matchers while `starts_at <= now < ends_at`; muted alerts are left out of notifications (to
every notifier) but keep firing in the rules and metrics. A silence the CLI also made in
Alertmanagers (`specwatch.alerts.am_silences`) keeps their silence IDs (`alertmanager_ids`), so
`silence expire` ends it there too.
"""

from __future__ import annotations

import builtins
import fcntl
import logging
import os
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from specwatch.alerts.matchers import Matcher, matches_all, parse_matcher
from specwatch.alerts.renamed import follow_renames
from specwatch.system.storage import PRIVATE_FILE, private_dir, read_json, write_json_atomic

log = logging.getLogger(__name__)

FILE_NAME = "silences.json"
# Expired silences are kept this long for `silence list --expired` (Alertmanager: 5 days).
RETENTION = 5 * 86400.0

ACTIVE, PENDING, EXPIRED = "active", "pending", "expired"


@dataclass
class Silence:
    """One silence. Times are seconds since the epoch."""

    id: str
    matchers: list[Matcher]
    starts_at: float
    ends_at: float
    created_by: str = ""
    comment: str = ""
    updated_at: float = 0.0
    alertmanager_ids: dict[str, str] = field(default_factory=dict)  # Alertmanager base URL → its silence ID

    def state(self, now: float) -> str:
        if now >= self.ends_at:
            return EXPIRED
        return PENDING if now < self.starts_at else ACTIVE

    def mutes(self, labels: dict[str, str], now: float) -> bool:
        return self.state(now) == ACTIVE and matches_all(self.matchers, labels)

    def to_dict(self) -> dict:
        return {"id": self.id, "matchers": [str(m) for m in self.matchers], "starts_at": self.starts_at,
                "ends_at": self.ends_at, "created_by": self.created_by, "comment": self.comment,
                "updated_at": self.updated_at, "alertmanager_ids": dict(self.alertmanager_ids)}

    @classmethod
    def from_dict(cls, d: dict) -> "Silence":
        return cls(id=str(d["id"]), matchers=[follow_renames(parse_matcher(m), f"silence {d['id']}") for m in d["matchers"]],
                   starts_at=float(d["starts_at"]), ends_at=float(d["ends_at"]),
                   created_by=str(d.get("created_by", "")), comment=str(d.get("comment", "")),
                   updated_at=float(d.get("updated_at", 0.0)),
                   alertmanager_ids={str(k): str(v) for k, v in (d.get("alertmanager_ids") or {}).items()})


def check(matchers: list[Matcher], starts_at: float, ends_at: float) -> None:
    """Raises ValueError, saying what to write, on an empty matcher list, a silence that would
    match every alert, or ends_at <= starts_at."""
    if not matchers:
        raise ValueError("a silence needs at least one matcher, e.g. --match alertname=AcceptanceCollapse")
    if all(m.matches({}) for m in matchers):
        raise ValueError("these matchers match every alert (even one without labels); name a label value")
    if ends_at <= starts_at:
        raise ValueError("the silence must end after it starts")


@dataclass
class SilenceStore:
    """The silences of one state directory. Not thread-safe: the daemon uses it under its lock."""

    state_dir: Path
    silences: list[Silence] = field(default_factory=list)
    _stamp: tuple | None = None

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        self.path = self.state_dir / FILE_NAME

    # -- reading ---------------------------------------------------------------------------

    def reload_if_changed(self) -> bool:
        """Re-read the file when it changed since the last read. Returns True when it did.

        A missing file means no silences; an unreadable one is logged and the silences already
        loaded are kept (a half-edited file must not unmute everything)."""
        try:
            st = os.stat(self.path)
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            stamp = None
        except OSError as e:
            log.warning("cannot stat %s: %s", self.path, e)
            return False
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        self.silences = self._read()
        return True

    def _read(self) -> list[Silence]:
        try:
            doc = read_json(self.path, {}) or {}
            return [Silence.from_dict(d) for d in doc.get("silences", [])]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            log.error("ignoring unreadable silences file %s: %s", self.path, e)
            return list(self.silences)

    def muted_by(self, labels: dict[str, str], now: float) -> list[str]:
        """IDs of the active silences that match `labels`."""
        return [s.id for s in self.silences if s.mutes(labels, now)]

    def list(self, now: float, include_expired: bool = False) -> list[Silence]:
        self.reload_if_changed()
        out = [s for s in self.silences if include_expired or s.state(now) != EXPIRED]
        return sorted(out, key=lambda s: (s.ends_at, s.id))

    # -- writing (CLI) ---------------------------------------------------------------------

    @contextmanager
    def _locked(self):
        private_dir(self.state_dir)
        lock_path = self.state_dir / "silences.lock"
        with os.fdopen(os.open(lock_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, PRIVATE_FILE), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                self._stamp = None
                self.silences = self._read()
                yield
                write_json_atomic(self.path, {"version": 1, "silences": [s.to_dict() for s in self.silences]})
                self._hand_over(lock_path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _hand_over(self, lock_path: Path) -> None:
        """Let the daemon read (and later rewrite) what the CLI wrote: 0600 (a comment or
        matcher may name what is private), and run as root (`sudo specwatch silence ...`), the
        files are given to the state directory's owner (the daemon's user)."""
        for p in (self.path, lock_path):
            os.chmod(p, PRIVATE_FILE)
            if os.geteuid() == 0:
                st = os.stat(self.state_dir)
                os.chown(p, st.st_uid, st.st_gid)

    # builtins.list: in this class `list` names the method above
    def add(self, matchers: builtins.list[Matcher], starts_at: float, ends_at: float, *, created_by: str = "",
            comment: str = "", alertmanager_ids: dict[str, str] | None = None) -> Silence:
        """Store a new silence and return it (`alertmanager_ids`: where Alertmanagers hold it). Raises ValueError on an empty matcher list, a
        silence that would match every alert, or ends_at <= starts_at; OSError when the state
        directory is not writable."""
        check(matchers, starts_at, ends_at)
        s = Silence(id=str(uuid.uuid4()), matchers=list(matchers), starts_at=starts_at, ends_at=ends_at,
                    created_by=created_by, comment=comment, updated_at=starts_at,
                    alertmanager_ids=dict(alertmanager_ids or {}))
        with self._locked():
            self._gc(starts_at)
            self.silences.append(s)
        return s

    def expire(self, silence_id: str, now: float) -> Silence:
        """End a silence now. `silence_id` may be a unique prefix of the ID. Raises KeyError when
        none or several silences match, ValueError when it has already expired."""
        with self._locked():
            hits = [s for s in self.silences if s.id.startswith(silence_id)] if silence_id else []
            if len(hits) != 1:
                raise KeyError(f"{'no' if not hits else 'more than one'} silence with ID {silence_id!r}; "
                               "see `specwatch silence list`")
            s = hits[0]
            if s.state(now) == EXPIRED:
                raise ValueError(f"silence {s.id} already expired")
            if s.state(now) == PENDING:
                s.starts_at = now
            s.ends_at = now
            s.updated_at = now
            self._gc(now)
        return s

    def _gc(self, now: float) -> None:
        self.silences = [s for s in self.silences if now - s.ends_at < RETENTION]
