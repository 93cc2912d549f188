"""`specwatch diagnose` and `fix-checkpoint` as real subprocesses, and the Kimi-K2.5 story."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from checkpoints import OUT as CK
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


def test_diagnose_healthy_exit_0_text_report(sglang_roots):
    r = cli("diagnose", "--draft", CK / "specforge", "--target", CK / "target-llama", "--sglang-root",
            sglang_roots["0.5.23"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "result: 0 error(s), 0 warning(s)" in r.stdout and "INFOS" in r.stdout
    assert "sglang: SGLang 0.5.23 read from" in r.stdout


def test_diagnose_bad_usage_exit_2(sglang_roots, tmp_path):
    assert cli("diagnose", "--draft", tmp_path / "nope").returncode == 2
    r = cli("diagnose", "--draft", CK / "specforge", "--sglang-root", tmp_path)
    assert r.returncode == 2 and "no `sglang` package" in r.stderr
    assert cli("diagnose").returncode == 2  # argparse: --draft missing


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


@pytest.mark.parametrize("version", ["0.5.11", "0.5.23"])
def test_fix_checkpoint_output_passes_diagnose(sglang_roots, tmp_path, version):
    src = CK / "speculators-converted"
    before = tree_hash(src)
    out = tmp_path / "fixed"
    r = cli("fix-checkpoint", "--draft", src, "--out", out, "--target", CK / "target-llama",
            "--sglang-root", sglang_roots[version])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "keys: layers.0.* → midlayer.*" in r.stdout and "result: 0 error(s)" in r.stdout
    assert tree_hash(src) == before  # the input is never touched
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["hidden_size"] == 64
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}
    assert "speculators_config" not in cfg and "target_hidden_size" not in cfg
    r = cli("diagnose", "--draft", out, "--target", CK / "target-llama", "--sglang-root", sglang_roots[version])
    assert r.returncode == 0, r.stdout
    # refuses to write into a non-empty folder
    r = cli("fix-checkpoint", "--draft", src, "--out", out, "--sglang-root", sglang_roots[version])
    assert r.returncode == 2 and "not empty" in r.stderr


def test_fix_checkpoint_reencodes_d2t_and_sets_architecture(facts, tmp_path):
    from specwatch.fixes.fix_checkpoint import fix_checkpoint
    from specwatch.probes.checkpoint import load_draft

    abs_ids = variant(CK / "safeailab-eagle3", tmp_path / "abs", set_tensors={"d2t": hot_ids()})
    res = fix_checkpoint(abs_ids, tmp_path / "out", facts=facts["0.5.11"], target=CK / "target-llama")
    assert "d2t: absolute target ids re-encoded as offsets (d2t - arange(Vd))" in res.actions
    assert any("LlamaForCausalLMEagle3" in a for a in res.actions)
    assert not res.report.has_errors, res.report.format_text()
    fixed = load_draft(tmp_path / "out").values("d2t")
    assert np.array_equal(fixed, hot_ids() - np.arange(len(hot_ids())))
    zero = variant(CK / "specforge", tmp_path / "zero", set_tensors={"d2t": np.zeros(len(hot_ids()), np.int64)})
    res = fix_checkpoint(zero, tmp_path / "out2", facts=facts["0.5.23"], target=CK / "target-llama")
    assert "d2t: rebuilt from t2d (64 hot ids) as offsets" in res.actions and not res.report.has_errors


def test_kimi_k25_story_three_faults_in_one_report(facts, tmp_path):
    """samples/README.md: layers.0.* on an old SGLang, fc bypassed, d2t encoded differently."""
    draft = variant(CK / "speculators-converted", tmp_path / "k25-eagle3", set_tensors={"d2t": hot_ids()})
    report = diagnose(draft, CK / "target-kimi-vlm", facts=facts["0.5.11"], settings=ServerSettings(algorithm="EAGLE"))
    errors = [f.id for f in report.findings if f.severity == "error"]
    assert {"unloaded_weights/dropped_keys", "fc_bypass/bypassed", "d2t_encoding/absolute_ids"} <= set(errors)
    assert report.findings[0].severity == "error"
