"""shape_mismatch: sizes vs the target and vs the module the installed SGLang builds."""

from __future__ import annotations

import json
import shutil

import numpy as np

from checkpoints import H, V, variant
from conftest import CK, ids, one
from specwatch.probes import shape_mismatch


def _target(tmp_path, **changes):
    d = tmp_path / "target"
    shutil.copytree(CK / "target-llama", d)
    cfg = json.loads((d / "config.json").read_text()) | changes
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_healthy_pair(run_probe):
    out = run_probe(shape_mismatch, "specforge")
    assert ids(out) == ["shape_mismatch/ok"]
    assert ids(run_probe(shape_mismatch, "specforge", target=None)) == ["shape_mismatch/no_target"]


def test_vocab_and_hidden_size_vs_target(run_probe, tmp_path):
    out = run_probe(shape_mismatch, "specforge", target=_target(tmp_path, vocab_size=512, hidden_size=128))
    assert one(out, "shape_mismatch/vocab_size").evidence == {"draft vocab_size": V, "target vocab_size": 512}
    assert one(out, "shape_mismatch/hidden_size").evidence == {"draft hidden_size": H, "target hidden_size": 128}


def test_fc_for_four_aux_states_fails_on_0511_loads_on_0523(run_probe, tmp_path):
    rng = np.random.default_rng(3)
    v = variant(CK / "specforge", tmp_path / "k4", config={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 4, 5]}},
                set_tensors={"fc.weight": (rng.standard_normal((H, 4 * H)) * 0.02).astype(np.float32)})
    f = one(run_probe(shape_mismatch, v, version="0.5.11"), "shape_mismatch/tensor_shape")
    assert f.severity == "error"
    assert f.evidence["mismatches"] == ["fc.weight: [64, 256] (SGLang's model.fc.weight needs [64, 192])"]
    assert "trained for 4 aux hidden states" in f.fix
    assert "shape_mismatch/tensor_shape" not in ids(run_probe(shape_mismatch, v, version="0.5.23"))


def test_head_count_that_does_not_fit_the_tensors(run_probe, tmp_path):
    v = variant(CK / "specforge", tmp_path / "heads", config={"num_attention_heads": 8})
    f = one(run_probe(shape_mismatch, v), "shape_mismatch/tensor_shape")
    assert "midlayer.self_attn.q_proj.weight: [64, 128] (SGLang's model.layers.0.self_attn.qkv_proj.weight needs [128, 128])" in f.evidence["mismatches"]


def test_rope_and_context_length(run_probe, tmp_path):
    v = variant(CK / "specforge", tmp_path / "rope", config={"rope_theta": 10000.0, "max_position_embeddings": 2048})
    out = run_probe(shape_mismatch, v)
    assert one(out, "shape_mismatch/rope").evidence == {"rope_theta": "draft 10000.0 vs target 500000.0"}
    f = one(out, "shape_mismatch/context_length")
    assert f.severity == "warning" and f.evidence["context length"] == 8192


def test_own_embedding_required_when_widths_differ(run_probe, tmp_path):
    v = variant(CK / "specforge", tmp_path / "ht", config={"target_hidden_size": 128})
    out = run_probe(shape_mismatch, v, target=_target(tmp_path, hidden_size=128))
    assert one(out, "shape_mismatch/embed_required").severity == "error"
