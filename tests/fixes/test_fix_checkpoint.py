"""`specwatch fix-checkpoint`: the converted copy loads on the installed SGLang; the input is untouched."""

from __future__ import annotations

import json

import numpy as np
import pytest

from checkpoints import OUT as CK
from checkpoints import hot_ids, variant
from test_diagnosis import cli, tree_hash


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
