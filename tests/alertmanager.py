"""A real Prometheus Alertmanager (Debian `prometheus-alertmanager`) on 127.0.0.1 for tests.

    am = Alertmanager(tmp_path, receivers=slack_receiver(slack.url))   # or the `alertmanager` fixture
    am.alerts()                      # GET /api/v2/alerts
    am.silence(["alertname=X"])      # POST /api/v2/silences → id
    am.close()

Clustering is off (`--cluster.listen-address=`) unless `cluster_port` is given: then it gossips
on 127.0.0.1:cluster_port with the `peers` (their cluster ports) every 100ms, and a peer that is
not first waits `peer_timeout` for the first one's notification before sending its own
(Alertmanager's high-availability mode; keep it below group_interval: a flush that outlasts the
interval shifts the next one, which can then send a state the other peer already replaced). Storage is a temp dir, and the route's timers are short
(group_wait 100ms, group_interval 1s) so notifications come within a second or two.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import requests
import yaml

from procs import free_port, popen, terminate

BINARY = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


def slack_receiver(url: str, *, send_resolved: bool = True) -> dict:
    """A receiver posting to a Slack-compatible webhook with the alert text in the message."""
    return {"name": "slack", "slack_configs": [{
        "api_url": url, "channel": "#specwatch", "send_resolved": send_resolved,
        "title": '[{{ .Status | toUpper }}] {{ .CommonLabels.alertname }}',
        "text": '{{ range .Alerts }}{{ .Labels.server }} {{ .Labels.rank }}: {{ .Annotations.summary }}\n'
                '{{ .Annotations.fixes }}\n{{ end }}',
    }]}


class Alertmanager:
    """One Alertmanager process. `receiver`: a receiver dict (default: one that sends nothing)."""

    def __init__(self, tmp_path: Path, receiver: dict | None = None, *, group_by: list[str] | None = None,
                 port: int | None = None, cluster_port: int | None = None, peers: list[int] = (),
                 peer_timeout: str = "2s", group_interval: str = "1s"):
        if BINARY is None:
            raise RuntimeError("prometheus-alertmanager is not installed (apt-get install prometheus-alertmanager)")
        self.dir = Path(tmp_path) / f"am-{id(self)}"
        self.dir.mkdir(parents=True)
        receiver = receiver or {"name": "null"}
        config = {
            "route": {"receiver": receiver["name"], "group_by": group_by or ["alertname", "server"],
                      "group_wait": "100ms", "group_interval": group_interval, "repeat_interval": "1h"},
            "receivers": [receiver],
        }
        (self.dir / "alertmanager.yml").write_text(yaml.safe_dump(config))
        if cluster_port is None:
            cluster = ["--cluster.listen-address="]
        else:
            cluster = [f"--cluster.listen-address=127.0.0.1:{cluster_port}",
                       f"--cluster.advertise-address=127.0.0.1:{cluster_port}",
                       *(f"--cluster.peer=127.0.0.1:{p}" for p in peers),
                       "--cluster.gossip-interval=100ms", "--cluster.pushpull-interval=1s",
                       f"--cluster.peer-timeout={peer_timeout}", "--cluster.reconnect-interval=1s"]
        self.proc = None
        for attempt in range(3):  # a free port can be taken before we bind it: retry
            self.port = port or free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self.proc = popen(
                [BINARY, f"--config.file={self.dir / 'alertmanager.yml'}", f"--storage.path={self.dir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", *cluster, "--log.level=warn"],
                stdout=subprocess.DEVNULL, stderr=open(self.dir / "stderr.log", "wb"))
            if self._wait_ready():
                return
            self.proc.kill()
            self.proc.wait()
            if port is not None:
                break
        raise RuntimeError(f"alertmanager did not start: {(self.dir / 'stderr.log').read_text()[-2000:]}")

    def _wait_ready(self, timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return True
            except requests.RequestException:
                pass
            time.sleep(0.05)
        return False

    def alerts(self, **params) -> list[dict]:
        """GET /api/v2/alerts (active, silenced and inhibited ones; not resolved ones)."""
        r = requests.get(f"{self.url}/api/v2/alerts", params=params, timeout=5)
        r.raise_for_status()
        return r.json()

    def silence(self, matchers: list[str], hours: float = 1.0, comment: str = "test") -> str:
        """Create a silence from `name=value` matchers; returns its ID."""
        now = datetime.now(timezone.utc)
        body = {
            "matchers": [{"name": m.split("=", 1)[0], "value": m.split("=", 1)[1], "isRegex": False, "isEqual": True}
                         for m in matchers],
            "startsAt": now.isoformat(), "endsAt": (now + timedelta(hours=hours)).isoformat(),
            "createdBy": "pytest", "comment": comment,
        }
        r = requests.post(f"{self.url}/api/v2/silences", json=body, timeout=5)
        r.raise_for_status()
        return r.json()["silenceID"]

    def cluster_peers(self) -> list[str]:
        """The addresses of the cluster members this one knows (itself included), from /api/v2/status."""
        r = requests.get(f"{self.url}/api/v2/status", timeout=5)
        r.raise_for_status()
        return sorted(p["address"] for p in r.json()["cluster"].get("peers") or [])

    def close(self) -> None:
        terminate(self.proc)
