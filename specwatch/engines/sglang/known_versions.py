"""Fallback facts by SGLang version, used only when no SGLang source can be read.

Every row comes from reading the published wheels (`sglang/srt/models/*.py`, mainly
`llama_eagle3.py`, and `model_executor/` of each version named below); the
report says when these were used instead of the installed source. Versions between the ones
read are assumed to follow the nearest rule below them.
"""

from __future__ import annotations

from specwatch.engines.sglang.facts import (
    AS_IS_IF_MAX_IS_N,
    PLUS_ONE,
    PLUS_ONE_IF_FIRST_IS_1,
    CaptureSupport,
    DraftRules,
    SGLangFacts,
    version_tuple,
)

NEWEST_KNOWN = "0.5.23"
STACKED = ((".qkv_proj", ".q_proj", "q"), (".qkv_proj", ".k_proj", "k"), (".qkv_proj", ".v_proj", "v"),
           (".gate_up_proj", ".gate_proj", 0), (".gate_up_proj", ".up_proj", 1))
# llama_eagle3.py@0.5.12…0.5.23 `legacy_name_map`.
LEGACY_RENAMES = (("midlayer", "layers.0"), ("aux_norm_low", "fc_norm.0"), ("aux_norm_mid", "fc_norm.1"),
                  ("aux_norm_high", "fc_norm.2"))

# Target classes with `set_eagle3_layers_to_capture`, by the first version read that has them
# (`set_eagle3_layers_to_capture` in srt/models/*.py of 0.4.9, 0.5.4, 0.5.10, 0.5.14, 0.5.23):
# arch → (since, kind, inner class or None, id rule).
CAPTURE = {
    "LlamaForCausalLM": ((0, 4, 9), "direct", None, PLUS_ONE),
    "Llama4ForCausalLM": ((0, 4, 9), "direct", None, PLUS_ONE),
    "MistralForCausalLM": ((0, 4, 9), "direct", None, PLUS_ONE),
    "Phi3ForCausalLM": ((0, 4, 9), "direct", None, PLUS_ONE),
    "InternLM3ForCausalLM": ((0, 4, 9), "direct", None, PLUS_ONE),
    "Qwen3ForCausalLM": ((0, 4, 9), "direct", None, PLUS_ONE),
    "Qwen3MoeForCausalLM": ((0, 4, 9), "direct", None, PLUS_ONE),
    "GptOssForCausalLM": ((0, 5, 4), "direct", None, PLUS_ONE),
    "Qwen2ForCausalLM": ((0, 5, 4), "direct", None, PLUS_ONE),
    "Qwen2MoeForCausalLM": ((0, 5, 4), "direct", None, PLUS_ONE),
    "Qwen2_5_VLForConditionalGeneration": ((0, 5, 4), "direct", None, PLUS_ONE),
    "DeepseekV2ForCausalLM": ((0, 5, 10), "direct", None, PLUS_ONE),
    "DeepseekV3ForCausalLM": ((0, 5, 10), "direct", None, PLUS_ONE),
    "DeepseekV32ForCausalLM": ((0, 5, 10), "direct", None, PLUS_ONE),
    "KimiK25ForConditionalGeneration": ((0, 5, 10), "delegate_or_raise", "DeepseekV3ForCausalLM", PLUS_ONE),
    "Glm4MoeForCausalLM": ((0, 5, 10), "direct", None, PLUS_ONE),
    "MiniMaxM2ForCausalLM": ((0, 5, 10), "direct", None, PLUS_ONE),
    "Qwen3NextForCausalLM": ((0, 5, 10), "direct", None, PLUS_ONE),
    "Gemma3ForCausalLM": ((0, 5, 14), "direct", None, PLUS_ONE),
    "Gemma3ForConditionalGeneration": ((0, 5, 14), "delegate_if_present", "Gemma3ForCausalLM", PLUS_ONE),
    "Llama4ForConditionalGeneration": ((0, 5, 14), "delegate_if_present", "Llama4ForCausalLM", PLUS_ONE),
    "Qwen3VLForConditionalGeneration": ((0, 5, 14), "direct", None, PLUS_ONE),
    "Qwen3_5ForCausalLM": ((0, 5, 14), "direct", None, PLUS_ONE),
}
# Rules that changed after they appeared (read in 0.5.23, absent in 0.5.11; PRs #25454, #32334).
RULE_CHANGES = {
    "DeepseekV2ForCausalLM": ((0, 5, 23), PLUS_ONE_IF_FIRST_IS_1),
    "DeepseekV3ForCausalLM": ((0, 5, 23), PLUS_ONE_IF_FIRST_IS_1),
    "DeepseekV32ForCausalLM": ((0, 5, 23), PLUS_ONE_IF_FIRST_IS_1),
    "KimiK25ForConditionalGeneration": ((0, 5, 23), PLUS_ONE_IF_FIRST_IS_1),
    "GptOssForCausalLM": ((0, 5, 23), AS_IS_IF_MAX_IS_N),
}


class TableFacts(SGLangFacts):
    """Facts for `version` from the table above; `version` None → the newest known version."""

    source = "table"

    def __init__(self, version: str | None):
        super().__init__()
        self.version = version or NEWEST_KNOWN
        self.v = version_tuple(self.version) or version_tuple(NEWEST_KNOWN)
        self.assumed = version is None

    def describe(self) -> str:
        what = (f"version unknown, assumed {NEWEST_KNOWN} (the newest specwatch knows)" if self.assumed
                else f"SGLang {self.version}")
        return f"no SGLang source found: facts from specwatch's table of known versions ({what})"

    def eagle3_draft_classes(self) -> list[str]:
        return ["Eagle3DeepseekV2ForCausalLM", "LlamaForCausalLMEagle3"] if self.v >= (0, 5, 23) else ["LlamaForCausalLMEagle3"]

    def draft_rules(self, arch: str) -> DraftRules | None:
        if arch not in self.eagle3_draft_classes():
            return None
        if arch != "LlamaForCausalLMEagle3":
            return DraftRules(cls=arch, file="srt/models/kimi_k25_eagle3.py", decoder="midlayer",
                              single_layer_only=True, modelled=False)
        keys = {"target_hidden_size", "bias", "draft_vocab_size", "tie_word_embeddings", "rope_parameters", "rope_scaling"}
        if self.v <= (0, 5, 11):  # llama_eagle3.py@0.5.11: one `midlayer`, fc = 3·Ht
            return DraftRules(cls=arch, file="srt/models/llama_eagle3.py", decoder="midlayer", single_layer_only=True,
                              stacked=STACKED, fc_aux="fixed:3", config_keys=frozenset(keys),
                              input_layer_only_2h=False)
        keys |= {"num_aux_hidden_states", "eagle_config", "eagle_aux_hidden_state_layer_ids", "fc_norm",
                 "use_aux_norm", "norm_output"}
        norm_fc = self.v >= (0, 5, 17)
        if norm_fc:
            keys.add("norm_before_fc")
        return DraftRules(cls=arch, file="srt/models/llama_eagle3.py", decoder="layers", renames=LEGACY_RENAMES,
                          stacked=STACKED, fc_aux="config", input_norm=norm_fc, fc_norm=True,
                          config_keys=frozenset(keys))

    def is_registered(self, arch: str) -> bool | None:
        if arch in self.eagle3_draft_classes() or self._row(arch) is not None:
            return True
        return None  # the table does not list every class

    def _row(self, arch: str):
        row = CAPTURE.get(arch)
        return row if row and self.v >= row[0] else None

    def capture(self, arch: str) -> CaptureSupport:
        row = self._row(arch)
        if row is None:
            return CaptureSupport(arch, "unknown")
        _, kind, inner, rule = row
        change = RULE_CHANGES.get(arch)
        if change and self.v >= change[0]:
            rule = change[1]
        inner_support = self.capture(inner) if inner else None
        if inner_support is not None:
            rule = inner_support.effective.id_rule
        return CaptureSupport(arch, kind, owner=arch, inner=inner_support,
                              inner_attr="language_model" if inner else None, id_rule=rule)

    def aux_ids_top_level_read(self) -> bool:
        return False  # eagle_config only, every version read

    def reads_speculators_config(self) -> bool:
        return False  # no `speculators_model_type` in any version read (0.4.6.post1-0.5.23)

    def draft_arch_rewrites(self) -> dict[str, str]:
        return {}  # none for Llama EAGLE-3 drafts (model_config.py@0.5.23 rewrites MTP only)

    def has_draft_window_flag(self) -> bool:
        return self.v >= (0, 5, 23)  # absent in 0.5.11, present in 0.5.23
