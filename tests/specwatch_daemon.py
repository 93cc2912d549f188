"""`specwatch run` as a real subprocess for tests, its config written from dicts."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import yaml

from procs import SpecwatchProcess, free_port


class SpecwatchDaemon(SpecwatchProcess):
    """One daemon with its own state dir under `tmp_path/name`, following `log`.

    alerts: the `alerts:` section; rules: the `rules:` section; extra: more top-level sections
    (e.g. `diagnosis`); env: extra environment. `stop()` returns (exit code, everything it
    printed).
    """

    def __init__(self, tmp_path: Path, log: Path, *, name: str = "specwatch", server: str = "gpu-box-1",
                 alerts: dict | None = None, rules: dict | None = None, extra: dict | None = None,
                 env: dict | None = None):
        self.dir = Path(tmp_path) / name
        self.dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.state = self.dir / "state"
        self.cfg = self.dir / "config.yaml"
        doc = {"server": server, "logs": [{"path": str(log)}], "follow": {"poll_interval": "0.2s"},
               "metrics": {"listen_port": port}, "state_dir": str(self.state), "gpu": {"enabled": False},
               "alerts": alerts or {}}
        if rules:
            doc["rules"] = rules
        doc.update(extra or {})
        self.cfg.write_text(yaml.safe_dump(doc))
        super().__init__(self.cfg, port, env=env)

    def stop(self) -> tuple[int, str]:
        return super().stop(), self.output

    def saved(self) -> tuple[dict, dict[str, list[dict]]]:
        """What `state.db` holds: (state document, {notifier: [queued item data, oldest first]})."""
        return read_state(self.state)


def read_state(state_dir: Path) -> tuple[dict, dict[str, list[dict]]]:
    """The committed state of the daemon of `state_dir`, read with sqlite3 like any reader."""
    db = sqlite3.connect(f"file:{Path(state_dir) / 'state.db'}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT doc FROM state WHERE id = 1").fetchone()
        outbox: dict[str, list[dict]] = {}
        for name, data in db.execute("SELECT notifier, data FROM outbox ORDER BY notifier, seq"):
            outbox.setdefault(name, []).append(json.loads(data))
    finally:
        db.close()
    return (json.loads(row[0]) if row else {}), outbox
