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


def test_output_keeps_the_input_modes(sglang_roots, tmp_path):
    """safetensors writes through a 0600 temp file: another user's SGLang could not read the copy."""
    src = variant(CK / "specforge", tmp_path / "in")
    (src / "config.json").chmod(0o644)
    (src / "model.safetensors").chmod(0o640)  # group-readable weights stay group-readable
    out = tmp_path / "out"
    r = cli("fix-checkpoint", "--draft", src, "--out", out, "--sglang-root", sglang_roots["0.5.23"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert oct((out / "config.json").stat().st_mode & 0o777) == "0o644"
    assert oct((out / "model.safetensors").stat().st_mode & 0o777) == "0o640"


def test_written_safetensors_follow_the_umask(tmp_path):
    import os

    from specwatch.fixes.safetensors_io import from_numpy, write_safetensors

    old = os.umask(0o027)
    try:
        write_safetensors(tmp_path / "a.safetensors", {"x": from_numpy(np.zeros(3, np.float32))})
    finally:
        os.umask(old)
    assert oct((tmp_path / "a.safetensors").stat().st_mode & 0o777) == "0o640"


def test_identity_t2d_is_not_rebuilt_from(facts, tmp_path):
    """d2t all zeros and t2d marking the first Vd ids: both unfilled, nothing to rebuild from."""
    from specwatch.fixes.fix_checkpoint import fix_checkpoint

    vd = len(hot_ids())
    t2d = np.zeros(256, bool)
    t2d[:vd] = True
    src = variant(CK / "specforge", tmp_path / "id", set_tensors={"d2t": np.zeros(vd, np.int64), "t2d": t2d})
    res = fix_checkpoint(src, tmp_path / "out", facts=facts["0.5.23"], target=CK / "target-llama")
    assert not any(a.startswith("d2t:") for a in res.actions)
    assert "d2t_encoding/zero_map" in [f.id for f in res.report.findings if f.severity == "error"]
