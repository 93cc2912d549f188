"""config_format on every real format and each config fault."""

from __future__ import annotations

import json
import shutil

import pytest

from checkpoints import variant
from conftest import CK, ids, one
from specwatch.probes import config_format


@pytest.mark.parametrize("version", ["0.5.11", "0.5.23"])
def test_speculators_config_refused_by_both_versions(run_probe, version):
    f = one(run_probe(config_format, "speculators-converted", version=version), "config_format/speculators_format")
    assert f.severity == "error" and f.evidence["sglang_version"] == version
    assert f.evidence["speculators_model_type"] == "eagle3" and "fix-checkpoint" in f.fix


@pytest.mark.parametrize("draft", ["specforge", "speculators-converted"])
def test_no_false_alarm_beyond_the_format(run_probe, draft):
    errors = ids(run_probe(config_format, draft), "error")
    assert errors == ([] if draft == "specforge" else ["config_format/speculators_format"])


def test_safeailab_architecture(run_probe):
    f = one(run_probe(config_format, "safeailab-eagle3"), "config_format/architecture")
    assert f.severity == "error" and f.evidence["architectures"] == ["LlamaForCausalLM"]
    assert '"architectures": ["LlamaForCausalLMEagle3"]' in f.fix


def test_trained_speculators_defaults(run_probe):
    old = run_probe(config_format, "speculators-eagle3", version="0.5.11")
    assert one(old, "config_format/norm_before_residual").severity == "error"
    flags = {f.evidence["flag"]: f.evidence["supported_since"] for f in old if f.kind == "unsupported_flag"}
    assert flags == {"norm_before_fc": "0.5.17", "norm_output": "0.5.12"}
    window = one(old, "config_format/sliding_window")
    assert window.severity == "warning" and "has no --speculative-draft-window-size" in window.fix
    new = run_probe(config_format, "speculators-eagle3", version="0.5.23")
    assert not [f for f in new if f.kind == "unsupported_flag"]
    assert one(new, "config_format/sliding_window").fix == "Start SGLang with --speculative-draft-window-size 2048."
    assert not [f for f in run_probe(config_format, "speculators-eagle3", version="0.5.23", draft_window_size=2048)
                if f.kind == "sliding_window"]


def test_tied_head_layer_count_and_null_fields(run_probe, tmp_path):
    tied = variant(CK / "specforge", tmp_path / "tied", config={"tie_word_embeddings": True})
    assert one(run_probe(config_format, tied), "config_format/tied_lm_head").evidence["lm_head.weight"] == [64, 64]
    two = variant(CK / "specforge", tmp_path / "two", config={"num_hidden_layers": 2})
    f = one(run_probe(config_format, two, version="0.5.11"), "config_format/layer_count")
    assert f.severity == "error" and f.evidence["num_hidden_layers"] == 2
    assert "config_format/layer_count" not in ids(run_probe(config_format, two, version="0.5.23"))
    null = variant(CK / "specforge", tmp_path / "null", config={"target_hidden_size": None})
    cfg = json.loads((null / "config.json").read_text())
    cfg["target_hidden_size"] = None  # variant() deletes None keys; write the null explicitly
    (null / "config.json").write_text(json.dumps(cfg))
    assert one(run_probe(config_format, null), "config_format/target_hidden_size_null").severity == "error"
    vnull = variant(CK / "specforge", tmp_path / "vnull", config={"draft_vocab_size": None})
    f = one(run_probe(config_format, vnull), "config_format/draft_vocab_null")
    assert f.evidence["lm_head.weight"] == [64, 64] and '"draft_vocab_size": 64' in f.fix


def test_specforge_norm_output_semantics_and_unreadable_config(run_probe, tmp_path):
    v = variant(CK / "specforge", tmp_path / "no", config={"norm_output": True})
    assert one(run_probe(config_format, v), "config_format/norm_output_semantics").severity == "warning"
    bad = tmp_path / "bad"
    shutil.copytree(CK / "specforge", bad)
    (bad / "config.json").write_text("{oops")
    f = one(run_probe(config_format, bad), "config_format/unreadable_config")
    assert f.severity == "error" and "not readable JSON" in f.title
