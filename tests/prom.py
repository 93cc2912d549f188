"""A real Prometheus (Debian's /usr/bin/prometheus) for tests: 127.0.0.1, a free port, a temp
storage dir, scrape and rule evaluation every second. Shared by the deploy tests; use the
`prometheus` fixture from conftest.py (it stops every server it started).

    prom = prometheus(scrape_configs=[static_job("specwatch", ["127.0.0.1:9849"])],
                      rule_files=[RULES])
    prom.wait_query('up{job="specwatch"} == 1')
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
from datetime import datetime
import urllib.request
from pathlib import Path

import yaml

from procs import free_port, popen, terminate, wait_for

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "specwatch-rules.yml"


def rules_firing_at_once(path: Path = RULES) -> str:
    """The rules with every `for:` set to 0s, so a test sees alerts fire within seconds."""
    return re.sub(r"(?m)^(\s+)for: \S+$", r"\1for: 0s", path.read_text())


def available() -> bool:
    return Path(PROMETHEUS).is_file()


def static_job(job: str, targets: list[str], **extra) -> dict:
    return {"job_name": job, "static_configs": [{"targets": targets}], **extra}


class Prometheus:
    def __init__(self, workdir: Path, scrape_configs: list[dict], rule_files: list[Path] = (),
                 interval: str = "1s", alertmanagers: list[str] = ()):
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        rules = []
        for i, f in enumerate(rule_files):  # copied: a test may pass a modified text
            dst = self.dir / f"rules-{i}.yml"
            dst.write_text(Path(f).read_text() if isinstance(f, Path) else f)
            rules.append(str(dst))
        self.config = {"global": {"scrape_interval": interval, "evaluation_interval": interval,
                                  "scrape_timeout": interval},
                       "rule_files": rules, "scrape_configs": scrape_configs}
        if alertmanagers:  # host:port of each; Prometheus sends every alert to all of them
            self.config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": list(alertmanagers)}]}]}
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(self.config, sort_keys=False))
        self.log = self.dir / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Prometheus":
        with open(self.log, "w") as out:
            self.proc = popen(
                [PROMETHEUS, f"--config.file={self.dir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self.dir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
                 "--log.level=warn"],
                stdout=out, stderr=subprocess.STDOUT)
        wait_for(self._ready, timeout=30, what="Prometheus /-/ready", interval=0.1)
        return self

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited {self.proc.returncode}: {self.log.read_text()}")
        try:
            return urllib.request.urlopen(f"{self.url}/-/ready", timeout=1).status == 200
        except OSError:
            return False

    def api(self, path: str, **params) -> object:
        """GET /api/v1/<path>; list values become repeated parameters (match[])."""
        qs = urllib.parse.urlencode([(k, x) for k, v in params.items() for x in (v if isinstance(v, list) else [v])])
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{qs}", timeout=10) as r:
            doc = json.load(r)
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[dict]:
        """Instant query now: [{"metric": {...}, "value": float}] (vector or scalar)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": float(data["result"][1])}]
        return [{"metric": r["metric"], "value": float(r["value"][1])} for r in data["result"]]

    def label_values(self, label: str, match: str) -> list[str]:
        """What Grafana's label_values(match, label) lists."""
        return sorted({s[label] for s in self.api("series", **{"match[]": [match]}) if s.get(label)})

    def wait_query(self, expr: str, pred=bool, timeout: float = 20.0) -> list[dict]:
        """Poll until pred(results) holds; returns the results."""
        last = []

        def check():
            nonlocal last
            last = self.query(expr)
            return pred(last)

        try:
            wait_for(check, timeout=timeout, what=expr, interval=0.25)
        except AssertionError:
            raise AssertionError(f"timed out waiting on {expr!r}; last result {last}") from None
        return last

    def targets(self) -> dict:
        return self.api("targets")

    def stop(self) -> None:
        terminate(self.proc)


def wait_scraped(prom: Prometheus, after: float | None = None) -> None:
    """Wait until every active target was scraped after `after` (default: now) — so a query
    sees what the targets exposed at that time."""
    after = time.time() if after is None else after

    def done():
        active = prom.targets()["activeTargets"]
        return active and all(t["health"] != "unknown" and _ts(t["lastScrape"]) > after
                              for t in active if t["health"] == "up")

    wait_for(done, timeout=20, what="a fresh scrape of every target", interval=0.2)


def _ts(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339).timestamp()  # 3.11 reads 'Z' and nanoseconds
