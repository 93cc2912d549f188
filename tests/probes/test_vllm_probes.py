"""The vLLM probes against two real vLLM sources (0.8.5.post1 and 0.33.0, read with ast, never
imported) and small safetensors checkpoints. Expected facts are those of the loader code read:
file and line in `vllm/` of each wheel are cited next to each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from checkpoints import OUT as CKPT
from checkpoints import variant
from specwatch.engines.vllm.probes import diagnose_vllm
from specwatch.engines.vllm.source import LoaderRules

TARGET = CKPT / "target-llama"  # LlamaForCausalLM, N = 8 layers, V = 256
STACKED = ((".q_proj", ".qkv_proj"), (".k_proj", ".qkv_proj"), (".v_proj", ".qkv_proj"),
           (".gate_proj", ".gate_up_proj"), (".up_proj", ".gate_up_proj"))


def ids(report) -> list[str]:
    return [f.id for f in report.findings if f.severity != "info"]


def test_loader_facts_0_8_5(vllm_facts):
    f = vllm_facts["0.8.5.post1"]
    assert f.version == "0.8.5.post1" and f.has_eagle3
    # llama_eagle3.py: `if "t2d" in name: continue` (224), d2t renamed (226-227), `model.` unless lm_head
    # (228-229); LlamaModel.load_weights: midlayer. -> layers.0. (149-150), stacked_params_mapping (138-145)
    assert f.loader == LoaderRules(skips=("t2d",), renames=(("d2t", "draft_id_to_target_id"),), prefix="model.",
                                   unprefixed=("lm_head",), inner_renames=(("midlayer.", "layers.0."),),
                                   stacked=STACKED, optional=())
    assert f.several_layers is False  # `nn.ModuleList([LlamaDecoderLayer(...)])` (96): one layer
    assert "input_norm" not in f.modules["model"] and {"fc", "norm", "embed_tokens", "layers"} <= f.modules["model"]
    assert "hidden_norm" in f.modules["layer"]  # the EAGLE-3 decoder layer's (50)
    assert f.draft_vocab_optional is False  # `self.config.draft_vocab_size` read directly (179)
    assert f.d2t_offsets and not f.d2t_only_smaller_vocab  # base + d2t (208); a parameter always (186)
    assert (f.checks_interface, f.llama_only, f.aux_config_keys, f.speculators_types) == (False, True, (), ())


def test_loader_facts_0_33_0(vllm_facts):
    f = vllm_facts["0.33.0"]
    assert f.version == "0.33.0"
    # load_weights (420-480): t2d skipped (426), mask_hidden skipped without parallel drafting (431-441),
    # absent d2t / embed_tokens / fc. / input_norm. dropped from the mapping (459-465); the inner
    # WeightsMapper (291-299)
    assert f.loader == LoaderRules(skips=("t2d", "mask_hidden"), renames=(("d2t", "draft_id_to_target_id"),),
                                   prefix="model.", unprefixed=("lm_head",), inner_renames=(("midlayer.", "layers.0."),),
                                   stacked=STACKED, optional=("draft_id_to_target_id", "embed_tokens", "fc.", "input_norm."))
    assert f.several_layers is True  # `for layer_idx in range(self.config.num_hidden_layers)` (206)
    assert {"input_norm", "fc_norm", "fc", "norm"} <= f.modules["model"]
    assert f.draft_vocab_optional is True  # getattr(self.config, "draft_vocab_size", None) (314)
    assert f.d2t_offsets and f.d2t_only_smaller_vocab  # base + d2t (386); `= None` when vocabularies match (345)
    # gpu_model_runner.py: supports_eagle3 (5173); top-level ids, then eagle_config (5207-5219)
    assert (f.checks_interface, f.llama_only, f.aux_config_keys) == (True, False, ("top", "eagle_config"))
    assert f.speculators_types == ("eagle3", "peagle", "dflash", "dflash2", "dspark")  # algos.py 15, 53, 90, 129, 152


@pytest.mark.parametrize("version, arch, model_type, supported, default", [
    ("0.8.5.post1", "LlamaForCausalLM", "llama", True, (2, 16, 29)),  # llama.py 534-536
    ("0.8.5.post1", "Qwen3ForCausalLM", "qwen3", False, None),  # config.py 2588: Llama only
    ("0.33.0", "LlamaForCausalLM", "llama", True, (2, 16, 29)),  # interfaces.py 1771-1772
    ("0.33.0", "Qwen3ForCausalLM", "qwen3", True, (2, 16, 29)),
    ("0.33.0", "Gemma3ForCausalLM", "gemma3_text", False, None),  # no SupportsEagle3 among its bases
])
def test_target_support(vllm_facts, version, arch, model_type, supported, default):
    s = vllm_facts[version].target_support(arch, model_type, 32)
    assert (s["registered"], s["supported"], s["default_layers"]) == (True, supported, default)
    assert vllm_facts[version].target_support("NoSuchForCausalLM", None, 32)["registered"] is False


# --- the real checkpoint formats on each version ---

@pytest.mark.parametrize("version, draft, expected", [
    # speculators: no speculators config reader in 0.8.5; its input_norm (norm_before_fc) has no module there
    ("0.8.5.post1", "speculators-eagle3", ["vllm_config_format/speculators_unsupported", "vllm_weights/rejected_keys"]),
    ("0.8.5.post1", "speculators-converted", ["vllm_config_format/speculators_unsupported"]),
    # midlayer.*, fc, norm, lm_head, d2t: what 0.8.5's loader expects; no layer ids: vLLM guesses (a warning)
    ("0.8.5.post1", "specforge", ["vllm_aux_layers/default_layers"]),
    ("0.8.5.post1", "safeailab-eagle3", ["vllm_aux_layers/default_layers"]),
    ("0.33.0", "speculators-eagle3", []),
    ("0.33.0", "speculators-converted", []),
    ("0.33.0", "speculators-fullvocab", []),
    ("0.33.0", "specforge", ["vllm_aux_layers/default_layers"]),
])
def test_real_formats(vllm_facts, version, draft, expected):
    r = diagnose_vllm(CKPT / draft, TARGET, vllm_facts[version])
    assert ids(r) == expected, r.format_text()
    assert r.engine == "vllm" and r.sglang_version == version


def test_model_prefixed_keys_are_rejected(vllm_facts, tmp_path):
    d = variant(CKPT / "specforge", tmp_path / "prefixed", rename={"midlayer.": "model.layers.0.", "fc.": "model.fc.",
                                                                    "norm.": "model.norm."})
    for version in ("0.8.5.post1", "0.33.0"):
        r = diagnose_vllm(d, TARGET, vllm_facts[version])
        f = next(f for f in r.findings if f.id == "vllm_weights/rejected_keys")
        assert "model.fc.weight -> model.model.fc.weight" in f.evidence["keys"]
        assert "Remove the `model.` prefix" in f.fix
        assert "vllm_weights/uninitialised" in ids(r)  # and the real names stay empty


def test_missing_fc_and_norm_load_silently_uninitialised(vllm_facts, tmp_path):
    d = variant(CKPT / "specforge", tmp_path / "nofc", drop=("fc.", "norm."))
    for version in ("0.8.5.post1", "0.33.0"):
        f = next(f for f in diagnose_vllm(d, TARGET, vllm_facts[version]).findings if f.id == "vllm_weights/uninitialised")
        assert f.evidence["missing"] == ["model.fc.weight", "model.norm.weight"]


def test_second_decoder_layer_only_on_a_version_that_builds_it(vllm_facts, tmp_path):
    d = variant(CKPT / "specforge", tmp_path / "two", rename={"midlayer.": "layers.0."}, config={"num_hidden_layers": 2})
    d = variant(d, tmp_path / "two2", set_tensors={"layers.1.input_layernorm.weight": np.ones(64, np.float32)})
    old = diagnose_vllm(d, TARGET, vllm_facts["0.8.5.post1"])
    assert "layers.1.input_layernorm.weight -> model.layers.1.input_layernorm.weight" in \
        next(f for f in old.findings if f.id == "vllm_weights/rejected_keys").evidence["keys"]
    new = diagnose_vllm(d, TARGET, vllm_facts["0.33.0"])
    assert "vllm_weights/rejected_keys" not in ids(new)
    assert "model.layers.1.self_attn.qkv_proj.weight" in \
        next(f for f in new.findings if f.id == "vllm_weights/uninitialised").evidence["missing"]


def test_layer_ids_vllm_never_reads_or_reads_at_the_top_level(vllm_facts, tmp_path):
    d = variant(CKPT / "speculators-converted", tmp_path / "ids", config={"eagle_aux_hidden_state_layer_ids": [1, 3, 6]})
    flat = variant(CKPT / "specforge", tmp_path / "nested", config={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 6]}})
    f = next(f for f in diagnose_vllm(flat, TARGET, vllm_facts["0.8.5.post1"]).findings if f.id == "vllm_aux_layers/layers_differ")
    assert f.evidence["captured"] == [2, 4, 5] and f.evidence["draft layer ids"] == [1, 3, 6]  # (2, 8//2, 8-3)
    assert "never reads" in f.fix
    assert "vllm_aux_layers/layers_differ" not in ids(diagnose_vllm(d, TARGET, vllm_facts["0.33.0"]))
    assert "vllm_aux_layers/layers_differ" not in ids(diagnose_vllm(flat, TARGET, vllm_facts["0.33.0"]))


def test_target_without_eagle3_support(vllm_facts, tmp_path):
    cfg = json.loads((TARGET / "config.json").read_text())
    cfg.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert "vllm_aux_layers/no_capture" in ids(diagnose_vllm(CKPT / "specforge", tmp_path / "config.json",
                                                             vllm_facts["0.8.5.post1"]))
    assert "vllm_aux_layers/no_capture" not in ids(diagnose_vllm(CKPT / "specforge", tmp_path / "config.json",
                                                                 vllm_facts["0.33.0"]))


def test_d2t(vllm_facts, tmp_path):
    from specwatch.probes.checkpoint import load_draft

    offsets = np.asarray(load_draft(CKPT / "specforge").values("d2t")).astype(np.int64)
    absolute = variant(CKPT / "specforge", tmp_path / "abs", set_tensors={"d2t": offsets + np.arange(len(offsets))})
    nomap = variant(CKPT / "specforge", tmp_path / "nomap", drop=("d2t", "t2d"))
    for version in ("0.8.5.post1", "0.33.0"):
        f = next(f for f in diagnose_vllm(absolute, TARGET, vllm_facts[version]).findings if f.id.startswith("vllm_d2t"))
        assert f.id == "vllm_d2t/absolute_ids" and "`d2t = d2t - arange(len(d2t))`" in f.fix
        assert "fix-checkpoint" not in f.fix  # it writes SGLang's layout: no vLLM mode
        m = next(f for f in diagnose_vllm(nomap, TARGET, vllm_facts[version]).findings if f.id == "vllm_d2t/missing_map")
        assert "fix-checkpoint" not in m.fix and "`d2t[i] = target_id[i] - i`" in m.fix
    # a full-vocabulary draft with a d2t: 0.33.0 has no parameter for it (llama_eagle3.py 339-345)
    full = variant(CKPT / "speculators-fullvocab", tmp_path / "full", set_tensors={"d2t": np.zeros(256, np.int64)})
    assert "vllm_d2t/map_without_parameter" in ids(diagnose_vllm(full, TARGET, vllm_facts["0.33.0"]))
    assert "vllm_d2t/map_without_parameter" not in ids(diagnose_vllm(full, TARGET, vllm_facts["0.8.5.post1"]))


def test_flat_config_without_draft_vocab_size(vllm_facts, tmp_path):
    d = variant(CKPT / "specforge", tmp_path / "novd", config={"draft_vocab_size": None})
    assert "vllm_config_format/no_draft_vocab_size" in ids(diagnose_vllm(d, TARGET, vllm_facts["0.8.5.post1"]))
    assert "vllm_config_format/no_draft_vocab_size" not in ids(diagnose_vllm(d, TARGET, vllm_facts["0.33.0"]))


def test_cli_engine_vllm(vllm_facts, tmp_path):
    """`specwatch diagnose --engine vllm`: exit 1 on an error finding, JSON says the engine."""
    root = vllm_facts["0.8.5.post1"].root
    run = lambda *a: subprocess.run([sys.executable, "-m", "specwatch", "diagnose", *a], capture_output=True,  # noqa: E731
                                    text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    r = run("--engine", "vllm", "--vllm-root", str(root), "--draft", str(CKPT / "speculators-eagle3"),
            "--target", str(TARGET), "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["engine"] == "vllm" and doc["sglang_version"] == "0.8.5.post1"
    assert [f["id"] for f in doc["findings"] if f["severity"] == "error"] == [
        "vllm_config_format/speculators_unsupported", "vllm_weights/rejected_keys"]
    r = run("--engine", "vllm", "--vllm-root", str(vllm_facts["0.33.0"].root), "--draft", str(CKPT / "specforge"),
            "--target", str(TARGET))
    assert r.returncode == 0 and "vllm: vLLM 0.33.0 read from" in r.stdout


def test_no_layer_ids_is_a_warning_with_the_layers_vllm_picks(vllm_facts):
    """The draft names no aux layer ids: vLLM guesses them (its default for the target's 8 layers)."""
    r = diagnose_vllm(CKPT / "specforge", TARGET, vllm_facts["0.33.0"])
    f = next(f for f in r.findings if f.id == "vllm_aux_layers/default_layers")
    assert f.severity == "warning" and f.title.endswith("guesses them and captures [2, 4, 5]")
    assert '`"eagle_aux_hidden_state_layer_ids": [2, 4, 5]`' in f.fix
    old = next(f for f in diagnose_vllm(CKPT / "specforge", TARGET, vllm_facts["0.8.5.post1"]).findings
               if f.id == "vllm_aux_layers/default_layers")
    assert old.severity == "warning" and "[2, 4, 5]" in old.fix  # 0.8.5 reads no ids: nothing to write
