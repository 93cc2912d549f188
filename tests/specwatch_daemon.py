"""`specwatch run` as a real subprocess for tests, its config written from dicts."""

from __future__ import annotations

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
