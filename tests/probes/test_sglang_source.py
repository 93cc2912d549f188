"""Facts read with ast from the real SGLang 0.5.11 and 0.5.23 sources, and the fallback table."""

from __future__ import annotations

import pytest

from conftest import stripped_gemma3_site

from specwatch.engines.sglang.known_versions import TableFacts
from specwatch.engines.sglang.source import (
    AS_IS_IF_MAX_IS_N,
    PLUS_ONE,
    PLUS_ONE_IF_FIRST_IS_1,
    SourceFacts,
    capture_indices,
    find_sglang_root,
    read_version,
    sglang_root_from,
)


def test_version_and_root(sglang_roots):
    assert read_version(sglang_roots["0.5.11"]) == "0.5.11"
    assert read_version(sglang_roots["0.5.23"]) == "0.5.23"
    pkg = sglang_roots["0.5.23"] / "sglang"
    assert sglang_root_from(pkg) == sglang_roots["0.5.23"]  # the package dir itself is accepted
    with pytest.raises(FileNotFoundError):
        sglang_root_from(sglang_roots["0.5.23"] / "sglang" / "srt")
    assert find_sglang_root() is None  # not importable here, and never imported


def test_draft_loader_rules_differ_by_version(facts):
    old, new = facts["0.5.11"].draft_rules("LlamaForCausalLMEagle3"), facts["0.5.23"].draft_rules("LlamaForCausalLMEagle3")
    assert (old.decoder, old.single_layer_only, old.renames, old.fc_aux) == ("midlayer", True, (), "fixed:3")
    assert (new.decoder, new.single_layer_only, new.fc_aux) == ("layers", False, "config")
    assert dict(new.renames) == {"midlayer": "layers.0", "aux_norm_low": "fc_norm.0", "aux_norm_mid": "fc_norm.1",
                                 "aux_norm_high": "fc_norm.2"}
    for r in (old, new):
        assert r.stacked[0] == (".qkv_proj", ".q_proj", "q") and r.stacked[-1] == (".gate_up_proj", ".up_proj", 1)
        assert r.skips == ("d2t", "t2d") and r.d2t_offsets and r.prefix == "model."
    assert not old.input_norm and new.input_norm and new.fc_norm
    assert "norm_before_fc" in new.config_keys and "norm_before_fc" not in old.config_keys
    assert "norm_before_residual" not in new.config_keys


def test_eagle3_classes_and_unmodelled_mla_loader(facts):
    assert facts["0.5.11"].eagle3_draft_classes() == ["LlamaForCausalLMEagle3"]
    assert facts["0.5.23"].eagle3_draft_classes() == ["Eagle3DeepseekV2ForCausalLM", "LlamaForCausalLMEagle3"]
    assert facts["0.5.23"].draft_rules("Eagle3DeepseekV2ForCausalLM").modelled is False
    assert facts["0.5.23"].draft_rules("LlamaForCausalLM") is None


@pytest.mark.parametrize("version, arch, kind, rule, inner", [
    ("0.5.11", "LlamaForCausalLM", "direct", PLUS_ONE, None),
    ("0.5.23", "LlamaForCausalLM", "direct", PLUS_ONE, None),
    ("0.5.11", "KimiK25ForConditionalGeneration", "delegate_or_raise", PLUS_ONE, "DeepseekV3ForCausalLM"),
    ("0.5.23", "KimiK25ForConditionalGeneration", "delegate_or_raise", PLUS_ONE_IF_FIRST_IS_1, "DeepseekV3ForCausalLM"),
    ("0.5.23", "Gemma3ForConditionalGeneration", "delegate_if_present", PLUS_ONE, "Gemma3ForCausalLM"),
    ("0.5.11", "Gemma3ForConditionalGeneration", "missing", "unknown", None),
    ("0.5.23", "Llama4ForConditionalGeneration", "delegate_if_present", PLUS_ONE, "Llama4ForCausalLM"),
    ("0.5.23", "GptOssForCausalLM", "direct", AS_IS_IF_MAX_IS_N, None),
    ("0.5.11", "GptOssForCausalLM", "direct", PLUS_ONE, None),
    ("0.5.23", "Qwen3MoeForCausalLM", "direct", PLUS_ONE, None),
    ("0.5.23", "Glm4ForCausalLM", "missing", "unknown", None),
    ("0.5.23", "NoSuchForCausalLM", "unregistered", "unknown", None),
])
def test_capture_support_read_through_bases_and_wrappers(facts, version, arch, kind, rule, inner):
    s = facts[version].capture(arch)
    assert (s.kind, s.id_rule) == (kind, rule)
    assert (s.inner.arch if s.inner else None) == inner


def test_where_ids_are_read_and_other_facts(facts):
    for v in ("0.5.11", "0.5.23"):
        f = facts[v]
        assert f.aux_ids_top_level_read() is False
        assert f.reads_speculators_config() is False
        assert f.draft_arch_rewrites()["DeepseekV3ForCausalLM"] == "DeepseekV3ForCausalLMNextN"
        assert "LlamaForCausalLM" not in f.draft_arch_rewrites()
        assert f.is_registered("LlamaForCausalLM") and not f.is_registered("Eagle3DraftModel")
    assert facts["0.5.11"].has_draft_window_flag() is False and facts["0.5.23"].has_draft_window_flag() is True


def test_capture_rules():
    assert capture_indices(PLUS_ONE, None, 61) == [2, 30, 58]
    assert capture_indices(PLUS_ONE, [1, 29, 57], 61) == [2, 30, 58]
    assert capture_indices(PLUS_ONE_IF_FIRST_IS_1, [2, 30, 58], 61) == [2, 30, 58]
    assert capture_indices(PLUS_ONE_IF_FIRST_IS_1, [1, 29, 57], 61) == [2, 30, 58]
    assert capture_indices(AS_IS_IF_MAX_IS_N, [24, 30, 36], 36) == [24, 30, 36]
    assert capture_indices(AS_IS_IF_MAX_IS_N, [24, 30, 35], 36) == [25, 31, 36]


@pytest.mark.parametrize("version", ["0.5.11", "0.5.23"])
def test_table_agrees_with_the_source(facts, version):
    src, table = facts[version], TableFacts(version)
    a, b = src.draft_rules("LlamaForCausalLMEagle3"), table.draft_rules("LlamaForCausalLMEagle3")
    for field in ("decoder", "single_layer_only", "renames", "stacked", "fc_aux", "input_norm", "fc_norm", "prefix"):
        assert getattr(a, field) == getattr(b, field), field
    for arch in ("LlamaForCausalLM", "KimiK25ForConditionalGeneration", "GptOssForCausalLM", "DeepseekV3ForCausalLM"):
        assert src.capture(arch).kind == table.capture(arch).kind
        assert src.capture(arch).effective.id_rule == table.capture(arch).effective.id_rule, arch
    assert src.eagle3_draft_classes() == table.eagle3_draft_classes()
    assert table.describe().startswith("no SGLang source found")
    assert "assumed 0.5.23" in TableFacts(None).describe()


def test_wrapper_whose_language_model_lacks_capture_is_a_silent_noop(sglang_roots, tmp_path):
    root = stripped_gemma3_site(sglang_roots["0.5.23"], tmp_path / "site")
    s = SourceFacts(root).capture("Gemma3ForConditionalGeneration")
    assert s.kind == "delegate_if_present" and s.inner.arch == "Gemma3ForCausalLM" and s.inner.kind == "missing"
