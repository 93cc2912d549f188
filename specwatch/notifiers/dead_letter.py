"""The notifiers' queues seen from outside the daemon: `specwatch notifications list` / `retry`.

`queued(state_dir)` reads `<state_dir>/state.db` read-only (SQLite lets a reader in beside the
daemon's writer, WAL journal): every notification waiting for delivery, and those the receiver
refused (kept in the dead letter: `queue.DEAD` in its data, see `queue.QueuedNotifier`).

`retry(state_dir, receivers)` puts refused notifications back in the queue. With a daemon running
(it holds `specwatch.lock`) it writes the request to `<state_dir>/notifications-retry.json` and
sends the daemon SIGUSR1, which reads and removes the file (`take_request`) and retries at once;
with none, it removes the mark in state.db itself, so the next start sends them.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from pathlib import Path

from specwatch.notifiers.queue import DEAD, describe_alerts
from specwatch.system.storage import LOCK_NAME, STATE_DB, StateDirLocked, lock_state_dir, read_json, write_json_atomic

REQUEST = "notifications-retry.json"


def queued(state_dir: str | os.PathLike) -> list[dict]:
    """Every queued notification, by receiver then age: [{"receiver", "seq", "state" ("queued" or
    "refused"), "alerts" (text), "status" (HTTP status or None), "detail", "refused_at" (epoch
    s or None)}]. Raises FileNotFoundError when there is no state.db; sqlite3.Error when it cannot
    be read."""
    path = Path(state_dir) / STATE_DB
    if not path.exists():
        raise FileNotFoundError(str(path))
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT notifier, seq, data FROM outbox ORDER BY notifier, seq").fetchall()
    finally:
        db.close()
    out = []
    for name, seq, text in rows:
        data = json.loads(text)
        dead = data.get(DEAD) or {}
        out.append({"receiver": name, "seq": seq, "state": "refused" if dead else "queued",
                    "alerts": describe_alerts(data), "status": dead.get("status"), "detail": dead.get("detail", ""),
                    "refused_at": dead.get("at")})
    return out


def retry(state_dir: str | os.PathLike, receivers: list[str]) -> tuple[str, int]:
    """Ask for the refused notifications of `receivers` (all when empty) to be sent again.
    Returns ("daemon", its pid) when a running daemon was asked, ("offline", rows unmarked)
    otherwise. Raises OSError / sqlite3.Error."""
    state_dir = Path(state_dir)
    try:
        fd = lock_state_dir(state_dir)
    except StateDirLocked as e:
        write_json_atomic(state_dir / REQUEST, {"receivers": sorted(receivers)})
        pid = e.pid
        if pid is None:
            raise OSError(f"cannot tell which process holds {state_dir / LOCK_NAME}") from None
        os.kill(pid, signal.SIGUSR1)
        return "daemon", pid
    try:
        return "offline", _unmark(state_dir / STATE_DB, receivers)
    finally:
        os.close(fd)


def _unmark(path: Path, receivers: list[str]) -> int:
    if not path.exists():
        return 0
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        n = 0
        for name, seq, text in db.execute("SELECT notifier, seq, data FROM outbox").fetchall():
            data = json.loads(text)
            if DEAD in data and (not receivers or name in receivers):
                del data[DEAD]
                db.execute("UPDATE outbox SET data = ? WHERE notifier = ? AND seq = ?", (json.dumps(data), name, seq))
                n += 1
        db.execute("COMMIT")
    finally:
        db.close()
    return n


def take_request(state_dir: str | os.PathLike) -> list[str] | None:
    """The daemon's side: the receivers of a retry request (empty: all), None when there is none;
    the request file is removed."""
    path = Path(state_dir) / REQUEST
    doc = read_json(path, None)
    if doc is None:
        return None
    try:
        os.unlink(path)
    except OSError:
        pass
    return [str(r) for r in doc.get("receivers") or []] if isinstance(doc, dict) else []
