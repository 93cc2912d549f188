"""README.md § vLLM: its config snippet, as printed there, gets a vLLM collapse alert with
vLLM-specific fixes from `specwatch replay` (the daemon's pipeline) over a vLLM 0.33.0 log."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import vllm_lines as g

ROOT = Path(__file__).resolve().parents[1]


def readme_snippet() -> str:
    section = (ROOT / "README.md").read_text().split("\n## vLLM\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


def test_readme_vllm_config_gets_a_vllm_collapse_alert(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(readme_snippet())
    lines = [g.config_line("0.33.0", method="eagle3", draft="/models/qwen3-8b-eagle3", model="/models/qwen3-8b", k=3)]
    for i in range(6):  # one healthy interval, then five at 1.00
        stamp = f"03-01 10:{i + 1:02d}:00"
        pos = [0.7, 0.5, 0.3] if i == 0 else [0.0, 0.0, 0.0]
        lines.append(g.stats_line("0.33.0", running=12, waiting=0, gen=150.0, kv=30.0, ts=stamp))
        lines.append(g.spec_line("0.33.0", accepted=round(sum(pos) * 200), drafted=600, positions=pos, ts=stamp))
    log = tmp_path / "vllm.log"
    log.write_text("\n".join(lines) + "\n")
    r = subprocess.run([sys.executable, "-m", "specwatch", "replay", str(log), "--config", str(cfg), "--json"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["lines"]["decode"] == 6
    [alert] = doc["alerts"]
    assert (alert["name"], alert["status"], alert["server"], alert["rank"]) == ("AcceptanceCollapse", "firing", "vllm-0", "")
    assert "specwatch diagnose --engine vllm --draft /models/qwen3-8b-eagle3 --target /models/qwen3-8b" in alert["fixes"][0]
    assert "vLLM 0.33.0" in alert["fixes"][0]
    assert any("eagle_aux_hidden_state_layer_ids" in f for f in alert["fixes"])
