"""`specwatch diagnose` and `fix-checkpoint` as real subprocesses, and the Kimi-K2.5 story."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path


from checkpoints import OUT as CK
from checkpoints import ROOT
from checkpoints import hot_ids, variant
from specwatch.diagnosis import diagnose
from specwatch.probes.base import ServerSettings


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "specwatch", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def tree_hash(d: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(d.rglob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def test_diagnose_json_speculators_on_0511(sglang_roots):
    r = cli("diagnose", "--draft", CK / "speculators-converted", "--target", CK / "target-llama",
            "--sglang-root", sglang_roots["0.5.11"], "--algorithm", "EAGLE3", "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["sglang_version"] == "0.5.11"
    errors = [f["id"] for f in doc["findings"] if f["severity"] == "error"]
    assert errors == ["config_format/speculators_format", "unloaded_weights/dropped_keys",
                      "unloaded_weights/unfilled_params"]
    assert set(doc["findings"][0]) >= {"probe", "severity", "title", "evidence", "fix"}
    assert [f["severity"] for f in doc["findings"]] == sorted((f["severity"] for f in doc["findings"]),
                                                             key=["error", "warning", "info"].index)


def test_diagnose_healthy_exit_0_text_report(sglang_roots, tmp_path):
    named = variant(CK / "specforge", tmp_path / "named", config={"eagle_config": {
        "eagle_aux_hidden_state_layer_ids": [1, 3, 4]}})  # the layers it was trained on, written down
    r = cli("diagnose", "--draft", named, "--target", CK / "target-llama", "--sglang-root",
            sglang_roots["0.5.23"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "result: 0 error(s), 0 warning(s)" in r.stdout and "INFOS" in r.stdout
    assert "sglang: SGLang 0.5.23 read from" in r.stdout


def test_diagnose_bad_usage_exit_2(sglang_roots, tmp_path):
    assert cli("diagnose", "--draft", tmp_path / "nope").returncode == 2
    r = cli("diagnose", "--draft", CK / "specforge", "--sglang-root", tmp_path)
    assert r.returncode == 2 and "no `sglang` package in this folder" in r.stderr
    assert cli("diagnose").returncode == 2  # argparse: --draft missing


def test_no_source_and_no_version_is_not_checked_even_as_json():
    """No SGLang source found and no --sglang-version: exit 2 naming both ways out; with --json
    the outcome is a JSON object too (a script reads stdout), nothing checked."""
    r = cli("diagnose", "--draft", CK / "speculators-converted", "--target", CK / "target-llama", "--json")
    assert r.returncode == 2
    doc = json.loads(r.stdout)
    assert doc["checked"] is False and doc["findings"] == [] and doc["draft"] == str(CK / "speculators-converted")
    assert doc["notes"][0].startswith("not checked: no SGLang source found (")
    assert "--sglang-version X.Y.Z to judge against specwatch's built-in table" in doc["notes"][0]
    assert "--sglang-version X.Y.Z" in r.stderr
    text = cli("diagnose", "--draft", CK / "speculators-converted", "--target", CK / "target-llama")
    assert text.returncode == 2 and text.stdout == "" and "--sglang-version X.Y.Z" in text.stderr


def test_missing_draft_and_target_paths_are_named_first(tmp_path):
    """Not `no SGLang source found`: each path that is not there, by its flag."""
    r = cli("diagnose", "--draft", tmp_path / "nonexistent", "--target", tmp_path / "nonexistent2")
    assert r.returncode == 2 and r.stderr.splitlines() == [
        f"specwatch diagnose: --draft {tmp_path / 'nonexistent'}: no such file or directory",
        f"specwatch diagnose: --target {tmp_path / 'nonexistent2'}: no such file or directory"]
    r = cli("diagnose", "--draft", CK / "speculators-converted", "--target", tmp_path / "nonexistent2")
    assert r.returncode == 2 and r.stderr.splitlines() == [
        f"specwatch diagnose: --target {tmp_path / 'nonexistent2'}: no such file or directory"]


def test_a_missing_sglang_root_says_how_to_get_it(tmp_path):
    """A fresh clone has no `.cache/`: the README's --sglang-root names a folder that is not there."""
    root = tmp_path / ".cache" / "sglang-0.5.11"
    r = cli("diagnose", "--draft", CK / "specforge", "--sglang-root", root)
    assert r.returncode == 2 and r.stderr.strip() == (
        f"specwatch diagnose: SGLang root {root}: no such folder; `python3 -m pip install --no-deps --target "
        f"{root} sglang==0.5.11` puts the source there (read, never imported), or give the site-packages folder "
        "of the SGLang the server runs")


def test_the_readme_example_prints_what_the_readme_shows(sglang_roots):
    """docs/diagnosis.md: its command, run from the checkout, prints its block line for line."""
    text = (ROOT / "docs" / "diagnosis.md").read_text()
    block = re.search(r"```console\n\$ (specwatch diagnose [^\n]+)\n(.*?)```", text, re.S)
    cmd, shown = block.group(1), block.group(2)
    assert "--sglang-root .cache/sglang-0.5.11" in cmd and sglang_roots["0.5.11"] == ROOT / ".cache/sglang-0.5.11"
    assert "pip install --no-deps --target .cache/sglang-0.5.11 sglang==0.5.11" in text[:block.start()]
    r = subprocess.run([sys.executable, "-m", *shlex.split(cmd)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and r.stdout == shown, r.stdout + r.stderr


def test_target_folder_or_its_config_json_is_the_same_target(sglang_roots):
    """The target's lm_head (the frozen-head check) is read through either form of --target."""
    docs = []
    for target in (CK / "target-llama", CK / "target-llama" / "config.json"):
        r = cli("diagnose", "--draft", CK / "speculators-eagle3", "--target", target, "--sglang-root",
                sglang_roots["0.5.23"], "--json")
        docs.append(json.loads(r.stdout))
    assert docs[0]["findings"] == docs[1]["findings"] and docs[0]["target"] == docs[1]["target"]
    assert "d2t_encoding/head_confirms" in [f["id"] for f in docs[1]["findings"]]


def test_no_source_falls_back_to_the_table_and_says_so():
    r = cli("diagnose", "--draft", CK / "speculators-converted", "--target", CK / "target-llama",
            "--sglang-version", "0.5.11", "--json")
    doc = json.loads(r.stdout)
    assert doc["sglang"].startswith("no SGLang source found: facts from specwatch's table")
    assert "unloaded_weights/dropped_keys" in [f["id"] for f in doc["findings"]]


def test_settings_from_the_server_args_log_line(sglang_roots, tmp_path):
    log = tmp_path / "server.log"
    log.write_text(f"[2026-02-23 16:30:00] server_args=ServerArgs(model_path='{CK / 'target-llama'}', "
                   f"speculative_algorithm='EAGLE', speculative_draft_model_path='{CK / 'specforge'}', "
                   "speculative_num_steps=5)\n")
    r = cli("diagnose", "--draft", CK / "specforge", "--sglang-root", sglang_roots["0.5.23"],
            "--server-args-from", log, "--json")
    assert r.returncode == 1
    ids = [f["id"] for f in json.loads(r.stdout)["findings"]]
    assert "fc_bypass/bypassed" in ids  # algorithm and target both came from the log line


def test_kimi_k25_story_three_faults_in_one_report(facts, tmp_path):
    """samples/README.md: layers.0.* on an old SGLang, fc bypassed, d2t encoded differently."""
    draft = variant(CK / "speculators-converted", tmp_path / "k25-eagle3", set_tensors={"d2t": hot_ids()})
    report = diagnose(draft, CK / "target-kimi-vlm", facts=facts["0.5.11"], settings=ServerSettings(algorithm="EAGLE"))
    errors = [f.id for f in report.findings if f.severity == "error"]
    assert {"unloaded_weights/dropped_keys", "fc_bypass/bypassed", "d2t_encoding/absolute_ids"} <= set(errors)
    assert report.findings[0].severity == "error"


def test_no_heavy_imports_at_daemon_import_time():
    code = ("import sys, specwatch.cli, specwatch.daemon, specwatch.core.pipeline, specwatch.diagnosis, "
            "specwatch.rules.collapse; print(sorted(m for m in ('numpy', 'safetensors', 'torch') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
