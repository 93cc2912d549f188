"""Run the whole daemon (`specwatch run`, GPU collector on) against a real GPU once; no pytest.

Starts the daemon on a temporary log holding the real Kimi-K2.5 collapse lines, waits for a few
NVML samples, scrapes /metrics twice, and checks that the GPU families carry values next to the
log-derived ones, that the daemon stays under its 60 MB RSS budget with NVML loaded, and that
SIGTERM stops it cleanly. Writes the exposition to $OUT (or the current folder) and exits 0 on
success. Usage: python tests/gpu/daemon_on_real_gpu.py
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from specwatch.system.childproc import die_with_parent  # noqa: E402  (the daemon dies with this script)

SAMPLE = ROOT / "tests" / "data" / "samples" / "kimi-k25-eagle3-collapse.log"
GPU_FAMILIES = ("specwatch_gpu_utilization_ratio", "specwatch_gpu_memory_used_bytes", "specwatch_gpu_power_watts",
                "specwatch_gpu_temperature_celsius", "specwatch_gpu_sm_clock_hertz",
                "specwatch_gpu_clock_event_reason_active", "specwatch_gpu_energy_joules_total")


def _rss_by_mapping(pid: int) -> str:
    """RSS per mapped file (anonymous memory summed as [anon]), largest first, in kB."""
    totals: dict[str, int] = {}
    name = "[anon]"
    for line in open(f"/proc/{pid}/smaps"):
        parts = line.split()
        if parts and "-" in parts[0] and len(parts) >= 5 and not parts[0].endswith(":"):
            name = parts[5] if len(parts) > 5 else "[anon]"
        elif parts[:1] == ["Rss:"]:
            totals[name] = totals.get(name, 0) + int(parts[1])
    rows = sorted(totals.items(), key=lambda kv: -kv[1])
    return "\n".join(f"{kb:8d} kB  {n}" for n, kb in rows[:40]) + "\n"


def main() -> int:
    out_dir = Path(os.environ.get("OUT", "."))
    tmp = Path(tempfile.mkdtemp(prefix="specwatch-gpu-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp / "server.log"
    log.write_text(SAMPLE.read_text())
    cfg = tmp / "config.yaml"
    cfg.write_text(f"server: h200\nlogs:\n  - path: {log}\nmetrics:\n  listen_port: {port}\n"
                   f"state_dir: {tmp / 'state'}\ngpu:\n  interval: 1s\nrules:\n  collapse:\n    min_batches: 2\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(die_with_parent([sys.executable, "-m", "specwatch", "run", "--config", str(cfg)],
                                            signal.SIGKILL), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    problems = []
    try:
        text = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                if "specwatch_gpu_up 1.0" in text and "specwatch_gpu_power_watts{" in text:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        time.sleep(3)  # a few more samples
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        (out_dir / "daemon_metrics.txt").write_text(text)
        rss = psutil.Process(proc.pid).memory_info().rss
        (out_dir / "daemon_rss_by_mapping.txt").write_text(_rss_by_mapping(proc.pid))
        if "specwatch_gpu_up 1.0" not in text:
            problems.append("specwatch_gpu_up is not 1")
        for fam in GPU_FAMILIES:
            if f"\n{fam}{{" not in text:
                problems.append(f"no series of {fam}")
        if 'specwatch_acceptance_collapsed{dp_rank="",engine="sglang",ep_rank="",pp_rank="",server="h200",tp_rank="0"} 1.0' not in text:
            problems.append("the collapse from the log is not in the same exposition")
        if rss > 60 * 2**20:
            problems.append(f"RSS {rss / 2**20:.1f} MB over the 60 MB budget")
        print(f"daemon RSS with NVML loaded: {rss / 2**20:.1f} MB")
        for line in text.splitlines():
            if line.startswith(("specwatch_gpu_up", "specwatch_gpu_count", "specwatch_gpu_power_watts",
                                "specwatch_gpu_utilization_ratio", "specwatch_gpu_temperature_celsius",
                                "specwatch_gpu_driver_info", "specwatch_acceptance_collapsed",
                                "specwatch_alerts_firing")):
                print(line)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "killed"
        output = proc.stdout.read()
        (out_dir / "daemon_log.txt").write_text(output)
        if rc != 0:
            problems.append(f"daemon exit status {rc} after SIGTERM")
    print("\n".join(f"PROBLEM: {p}" for p in problems) or "PASS")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
