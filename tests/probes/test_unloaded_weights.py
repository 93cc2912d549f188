"""unloaded_weights: keys through the installed loader's rules onto the draft module's parameters."""

from __future__ import annotations

import numpy as np
import pytest

from checkpoints import H, NH, HD, variant
from conftest import CK, ids, one
from specwatch.probes import unloaded_weights

LAYER_KEYS = 10  # q, k, v, o, gate, up, down, 3 norms


def test_seed_case_layers0_dropped_on_0511(run_probe):
    out = run_probe(unloaded_weights, "speculators-converted", version="0.5.11")
    dropped = one(out, "unloaded_weights/dropped_keys")
    assert dropped.severity == "error" and dropped.evidence["count"] == LAYER_KEYS
    assert dropped.evidence["groups"] == ["layers.0.*"]
    assert "model.layers.0.self_attn.qkv_proj.weight" in dropped.evidence["looked_up_as"]
    assert dropped.evidence["decoder_module"] == "model.midlayer"
    assert "`layers.0.*` → `midlayer.*`" in dropped.fix and "fix-checkpoint" in dropped.fix
    unfilled = one(out, "unloaded_weights/unfilled_params")
    assert unfilled.evidence["count"] == 7 and "model.midlayer.self_attn.qkv_proj.weight" in unfilled.evidence["unfilled"]


def test_seed_case_layers0_loads_on_0523(run_probe):
    out = run_probe(unloaded_weights, "speculators-converted", version="0.5.23")
    assert ids(out, "error") == []
    assert one(out, "unloaded_weights/ok").evidence["loaded"] == LAYER_KEYS + 3  # + fc, norm, lm_head


@pytest.mark.parametrize("draft", ["specforge", "safeailab-eagle3", "speculators-fullvocab"])
@pytest.mark.parametrize("version", ["0.5.11", "0.5.23"])
def test_midlayer_and_healthy_drafts_load_everywhere(run_probe, draft, version):
    out = run_probe(unloaded_weights, draft, version=version)
    if draft == "speculators-fullvocab" and version == "0.5.11":
        assert ids(out, "error") == ["unloaded_weights/dropped_keys", "unloaded_weights/unfilled_params"]
    else:
        assert ids(out, "error") == []
        assert one(out, "unloaded_weights/from_target").evidence == {
            "model.embed_tokens.weight": "SGLang replaces the draft embedding with the target's (H == Ht)"}


def test_qkv_bias_and_fc_bias_dropped(run_probe, tmp_path):
    rng = np.random.default_rng(1)
    v = variant(CK / "specforge", tmp_path / "bias", set_tensors={
        "midlayer.self_attn.q_proj.bias": rng.standard_normal(NH * HD).astype(np.float32),
        "fc.bias": rng.standard_normal(H).astype(np.float32)})
    f = one(run_probe(unloaded_weights, v), "unloaded_weights/dropped_keys")
    assert f.evidence["dropped"] == ["fc.bias", "midlayer.self_attn.q_proj.bias"]
    assert "bias=False" in f.fix


def test_input_norm_without_flag_and_tied_head(run_probe, tmp_path):
    rng = np.random.default_rng(2)
    v = variant(CK / "specforge", tmp_path / "in", set_tensors={"input_norm.weight": np.ones(3 * H, np.float32) + rng.random(3 * H).astype(np.float32)})
    f = one(run_probe(unloaded_weights, v, version="0.5.23"), "unloaded_weights/dropped_keys")
    assert f.evidence["dropped"] == ["input_norm.weight"] and '"norm_before_fc": true' in f.fix
    f = one(run_probe(unloaded_weights, v, version="0.5.11"), "unloaded_weights/dropped_keys")
    assert "SGLang >= 0.5.17" in f.fix
    flagged = variant(v, tmp_path / "in2", config={"norm_before_fc": True})
    assert ids(run_probe(unloaded_weights, flagged, version="0.5.23"), "error") == []
    tied = variant(CK / "specforge", tmp_path / "tied", config={"tie_word_embeddings": True})
    f = one(run_probe(unloaded_weights, tied), "unloaded_weights/dropped_keys")
    assert f.evidence["dropped"] == ["lm_head.weight"] and "tie_word_embeddings" in f.fix


def test_missing_lm_head_is_left_at_init(run_probe, tmp_path):
    v = variant(CK / "specforge", tmp_path / "nohead", drop=("lm_head.",))
    f = one(run_probe(unloaded_weights, v), "unloaded_weights/unfilled_params")
    assert f.evidence["unfilled"] == ["lm_head.weight"] and "draft_vocab_size" in f.fix
    borrowed = variant(v, tmp_path / "borrow", config={"draft_vocab_size": None})
    out = run_probe(unloaded_weights, borrowed)
    assert ids(out, "error") == [] and "lm_head.weight" in one(out, "unloaded_weights/from_target").evidence


def test_no_weights(run_probe, tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    (d / "config.json").write_text((CK / "specforge" / "config.json").read_text())
    assert one(run_probe(unloaded_weights, d), "unloaded_weights/no_weights").severity == "error"
