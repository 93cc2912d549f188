"""aux_capture: the target class's capture support in the installed SGLang."""

from __future__ import annotations

import json

from conftest import CK, one, stripped_gemma3_site
from specwatch.probes import aux_capture, fc_bypass
from specwatch.probes.base import ProbeContext
from specwatch.probes.checkpoint import load_draft, load_target
from specwatch.engines.sglang.source import SourceFacts


def _target(tmp_path, arch, **text):
    d = tmp_path / arch
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": [arch], "hidden_size": 64, "vocab_size": 256,
                                               "num_hidden_layers": 8, **text}))
    return d


def test_llama_and_kimi_wrapper(run_probe):
    f = one(run_probe(aux_capture, "specforge"), "aux_capture/ok")
    assert f.severity == "info" and f.evidence["id_rule"] == "LlamaForCausalLM: ids +1 (id i = output of layer i)"
    old = one(run_probe(aux_capture, "specforge", target="target-kimi-vlm", version="0.5.11"), "aux_capture/ok")
    new = one(run_probe(aux_capture, "specforge", target="target-kimi-vlm", version="0.5.23"), "aux_capture/ok")
    assert old.evidence["wraps"] == "self.language_model = DeepseekV3ForCausalLM"
    assert old.evidence["id_rule"] == "DeepseekV2ForCausalLM: ids +1 (id i = output of layer i)"
    assert new.evidence["id_rule"] == "DeepseekV2ForCausalLM: ids +1 only when the first id is 1"


def test_gemma3_wrapper_missing_on_0511_captures_on_0523(run_probe, tmp_path):
    t = _target(tmp_path, "Gemma3ForConditionalGeneration")
    f = one(run_probe(aux_capture, "specforge", target=t, version="0.5.11"), "aux_capture/missing")
    assert f.severity == "error" and "fails at startup" in f.title
    f = one(run_probe(aux_capture, "specforge", target=t, version="0.5.23"), "aux_capture/ok")
    assert f.evidence["capture"] == "delegate_if_present" and f.evidence["inner_capture"] == "direct"


def test_class_without_capture_and_unknown_class(run_probe, tmp_path):
    f = one(run_probe(aux_capture, "specforge", target=_target(tmp_path, "Glm4ForCausalLM")), "aux_capture/missing")
    assert f.evidence["target_architecture"] == "Glm4ForCausalLM"
    f = one(run_probe(aux_capture, "specforge", target=_target(tmp_path, "MadeUpForCausalLM")),
            "aux_capture/unknown_architecture")
    assert f.severity == "error"


def test_silent_noop_wrapper(tmp_path, sglang_roots):
    """A wrapper that forwards only `if hasattr(...)` to a language model without the method."""
    facts = SourceFacts(stripped_gemma3_site(sglang_roots["0.5.23"], tmp_path / "site"))
    ctx = ProbeContext(load_draft(CK / "specforge"), load_target(_target(tmp_path, "Gemma3ForConditionalGeneration")), facts)
    f = one(aux_capture.run(ctx), "aux_capture/silent_noop")
    assert f.severity == "error" and "silently" in f.title
    f = one(fc_bypass.run(ctx), "fc_bypass/bypassed")
    assert "forwards capture only if Gemma3ForCausalLM has it" in f.evidence["why"][0]
