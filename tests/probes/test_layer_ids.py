"""layer_ids: captured positions vs trained positions, per engine version and target family."""

from __future__ import annotations

from checkpoints import variant
from conftest import CK, ids, one
from specwatch.probes import layer_ids

IDS = "eagle_aux_hidden_state_layer_ids"


def test_no_ids_is_a_warning_naming_the_guessed_layers(run_probe, tmp_path):
    """A draft config without aux layer ids: SGLang guesses [2, N//2, N-3] (N = 8 here), which is
    right only for a draft trained on that default: a warning with the layers it picks."""
    f = one(run_probe(layer_ids, "specforge"), "layer_ids/guessed")
    assert f.severity == "warning" and "captures positions [2, 4, 5]" in f.title
    assert f.evidence["ids read by SGLang"] is None and f.evidence["captured positions"] == [2, 4, 5]
    assert f'"eagle_config": {{"{IDS}": [1, 3, 4]}}' in f.fix
    explicit = variant(CK / "specforge", tmp_path / "e", config={"eagle_config": {IDS: [1, 3, 4]}})
    f = one(run_probe(layer_ids, explicit), "layer_ids/ok")
    assert f.evidence["captured positions"] == [2, 4, 5] and f.evidence["trained positions"] == [2, 4, 5]


def test_speculators_top_level_ids_ignored(run_probe, tmp_path):
    f = one(run_probe(layer_ids, "speculators-converted"), "layer_ids/top_level_ignored")
    assert f.severity == "info" and f.evidence["top-level ids"] == [2, 4, 5]
    custom = variant(CK / "speculators-converted", tmp_path / "c", config={IDS: [1, 4, 6]})
    f = one(run_probe(layer_ids, custom), "layer_ids/top_level_ignored")
    assert f.severity == "error"
    assert f.evidence["captured positions"] == [2, 4, 5] and f.evidence["trained positions"] == [1, 4, 6]
    assert f.fix == f'Set "eagle_config": {{"{IDS}": [0, 3, 5]}} in the draft config.json.'


def test_capture_before_ids_on_deepseek_family_fixed_in_0523(run_probe, tmp_path):
    """Ids already in capture-before convention (first id != 1): 0.5.11 adds 1, 0.5.23 does not (PR #25454)."""
    v = variant(CK / "specforge", tmp_path / "k", config={"eagle_config": {IDS: [2, 4, 5]}})
    f = one(run_probe(layer_ids, v, target="target-kimi-vlm", version="0.5.11"), "layer_ids/mismatch")
    assert f.evidence["captured positions"] == [3, 5, 6] and f.evidence["trained positions"] == [2, 4, 5]
    assert "layer_ids/mismatch" not in ids(run_probe(layer_ids, v, target="target-kimi-vlm", version="0.5.23"))


def test_never_captured_duplicates_unsorted_and_count(run_probe, tmp_path):
    out = run_probe(layer_ids, variant(CK / "specforge", tmp_path / "a", config={"eagle_config": {IDS: [1, 3, 7]}}))
    f = one(out, "layer_ids/never_captured")
    assert f.severity == "error" and "[8]" in f.title and f.evidence["captured positions"] == [2, 4]
    out = run_probe(layer_ids, variant(CK / "specforge", tmp_path / "b", config={"eagle_config": {IDS: [1, 1, 4]}}))
    assert one(out, "layer_ids/duplicates").severity == "error"
    out = run_probe(layer_ids, variant(CK / "specforge", tmp_path / "c", config={"eagle_config": {IDS: [4, 1, 3]}}))
    assert one(out, "layer_ids/unsorted").severity == "warning"
    out = run_probe(layer_ids, variant(CK / "specforge", tmp_path / "d", config={"eagle_config": {IDS: [0, 1, 3, 4]}}))
    f = one(out, "layer_ids/count")
    assert f.evidence["fc.weight"] == [64, 192] and "4 captured states" in f.title


def test_no_target_no_finding(run_probe):
    assert run_probe(layer_ids, "specforge", target=None) == []
