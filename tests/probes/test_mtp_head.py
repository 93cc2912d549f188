"""mtp_head: a target served as its own draft (SGLang NEXTN without a draft path, vLLM `method: mtp`),
checked against the MTP loaders of the real SGLang and vLLM sources; and a target given as its own
EAGLE-3 draft (BR-50). The targets are real safetensors files with tiny tensors, written here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from checkpoints import ROOT
from specwatch.diagnosis import diagnose
from specwatch.probes.base import ServerSettings
from specwatch.engines.vllm.probes import diagnose_vllm

BR50 = ROOT / "tests" / "data" / "samples" / "bugreport-logs" / "BR-50" / "target"
H = 8


def _t(*shape):
    return np.full(shape, 0.5, dtype=np.float32)


def trunk(n: int) -> dict[str, np.ndarray]:
    out = {"model.embed_tokens.weight": _t(32, H), "model.norm.weight": _t(H), "lm_head.weight": _t(32, H)}
    for i in range(n):
        out |= {f"model.layers.{i}.input_layernorm.weight": _t(H), f"model.layers.{i}.self_attn.o_proj.weight": _t(H, H),
                f"model.layers.{i}.mlp.down_proj.weight": _t(H, 2 * H)}
    return out


def block(prefix: str) -> dict[str, np.ndarray]:
    return {f"{prefix}input_layernorm.weight": _t(H), f"{prefix}self_attn.o_proj.weight": _t(H, H),
            f"{prefix}mlp.down_proj.weight": _t(H, 2 * H)}


# The layouts each family's checkpoints ship (Hugging Face releases): DeepSeek-V3 / GLM-4.5 keep the
# MTP layer after the N decoder layers, MiMo under model.mtp_layers, Qwen3-Next under mtp.
FAMILIES = {
    "deepseek": ({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                  "num_nextn_predict_layers": 1},
                 {**block("model.layers.2."), **{f"model.layers.2.{m}.weight": _t(H) for m in
                                                ("enorm", "hnorm", "shared_head.norm")},
                  "model.layers.2.eh_proj.weight": _t(H, 2 * H), "model.layers.2.shared_head.head.weight": _t(32, H)}),
    "glm": ({"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "num_nextn_predict_layers": 1},
            {**block("model.layers.2."), **{f"model.layers.2.{m}.weight": _t(H) for m in
                                           ("enorm", "hnorm", "shared_head.norm")},
             "model.layers.2.eh_proj.weight": _t(H, 2 * H)}),
    "mimo": ({"architectures": ["MiMoForCausalLM"], "model_type": "mimo", "num_nextn_predict_layers": 1},
             {**block("model.mtp_layers.0."), **{f"model.mtp_layers.0.{m}.weight": _t(H) for m in
                                                 ("token_layernorm", "hidden_layernorm", "final_layernorm")},
              "model.mtp_layers.0.input_proj.weight": _t(H, 2 * H)}),
    "qwen3next": ({"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "mtp_num_hidden_layers": 1},
                  {**block("mtp.layers.0."), "mtp.fc.weight": _t(H, 2 * H), "mtp.norm.weight": _t(H),
                   "mtp.pre_fc_norm_embedding.weight": _t(H), "mtp.pre_fc_norm_hidden.weight": _t(H)}),
}


def target(tmp_path: Path, family: str, *, drop: tuple[str, ...] = (), config: dict | None = None) -> Path:
    cfg, head = FAMILIES[family]
    d = tmp_path / family
    d.mkdir(parents=True)
    tensors = {k: v for k, v in (trunk(2) | head).items() if not any(k.startswith(p) for p in drop)}
    (d / "config.json").write_text(json.dumps({**cfg, "hidden_size": H, "num_hidden_layers": 2, "vocab_size": 32,
                                               **(config or {})}))
    save_file(tensors, str(d / "model.safetensors"))
    return d


def no_eagle3_advice(report) -> None:
    text = report.format_text(verbose=True)
    assert "LlamaForCausalLMEagle3" not in text and "fix-checkpoint" not in text and "strip" not in text
    assert not any(f.probe in ("config_format", "unloaded_weights", "shape_mismatch", "layer_ids") for f in report.findings)


@pytest.mark.parametrize("family", ["deepseek", "glm", "mimo", "qwen3next"])
@pytest.mark.parametrize("version", ["0.5.23", "0.5.11"])
def test_sglang_nextn_target_alone(facts, tmp_path, family, version):
    d = target(tmp_path, family)
    r = diagnose(None, d, facts=facts[version], settings=ServerSettings(algorithm="EAGLE"))  # NEXTN = EAGLE
    assert [f.id for f in r.findings] == ["mtp_head/ok"], r.format_text(verbose=True)
    assert r.findings[0].evidence["read from"].startswith("srt/models/") and not r.has_errors
    no_eagle3_advice(r)


@pytest.mark.parametrize("family, dropped, missing", [
    ("deepseek", ("model.layers.2.enorm",), "model.layers.2.enorm"),
    ("deepseek", ("model.layers.2.",), "model.layers.2.eh_proj"),  # a release without the MTP layer
    ("mimo", ("model.mtp_layers.0.input_proj",), "model.mtp_layers.0.input_proj"),
    ("qwen3next", ("mtp.fc",), "mtp.fc"),
    ("qwen3next", ("mtp.layers.",), "mtp.layers.0 (the MTP decoder block)"),
])
def test_sglang_missing_mtp_tensors_are_an_error(facts, tmp_path, family, dropped, missing):
    r = diagnose(None, target(tmp_path, family, drop=dropped), facts=facts["0.5.23"],
                 settings=ServerSettings(algorithm="EAGLE"))
    f = next(f for f in r.findings if f.id == "mtp_head/missing")
    assert f.severity == "error" and missing in f.evidence["missing"] and r.has_errors
    no_eagle3_advice(r)


def test_deepseek_head_as_each_engine_reads_it(facts, vllm_facts, tmp_path):
    d = target(tmp_path, "deepseek")
    f = diagnose(None, d, facts=facts["0.5.23"]).findings[0]
    assert f.evidence["mtp class"] == "DeepseekV3ForCausalLMNextN"
    assert f.evidence["head modules"] == ["eh_proj", "enorm", "hnorm", "shared_head.norm"]  # deepseek_nextn.py
    assert f.evidence["expected at"] == ["model.layers.2.{eh_proj,enorm,hnorm,shared_head.norm}"]
    for version in ("0.33.0", "0.8.5.post1"):
        r = diagnose_vllm(None, d, vllm_facts[version], settings=ServerSettings(algorithm="MTP"))
        assert [f.id for f in r.findings] == ["mtp_head/ok"] and r.engine == "vllm", r.format_text()
        assert r.findings[0].evidence["mtp class"] == "DeepSeekMTPModel"  # SpeculativeConfig.hf_config_override
        assert r.findings[0].evidence["head modules"] == ["eh_proj", "enorm", "hnorm", "shared_head"]
        no_eagle3_advice(r)


def test_vllm_mtp_layouts_and_versions(vllm_facts, tmp_path):
    for family in ("glm", "mimo", "qwen3next"):
        r = diagnose_vllm(None, target(tmp_path, family), vllm_facts["0.33.0"])
        assert [f.id for f in r.findings] == ["mtp_head/ok"], r.format_text()
        old = diagnose_vllm(None, tmp_path / family, vllm_facts["0.8.5.post1"])  # only DeepSeek MTP in 0.8.5
        assert [f.id for f in old.findings] == ["mtp_head/no_mtp_class"] and old.has_errors
    r = diagnose_vllm(None, target(tmp_path / "q", "qwen3next", drop=("mtp.norm",)), vllm_facts["0.33.0"])
    f = r.findings[0]
    assert f.id == "mtp_head/missing" and f.evidence["missing"] == ["mtp.norm"]  # vLLM builds mtp.norm, SGLang not


def test_an_undeclared_head_is_no_draft(facts, tmp_path):
    d = target(tmp_path, "deepseek", config={"num_nextn_predict_layers": 0})
    r = diagnose(None, d, facts=facts["0.5.23"], settings=ServerSettings(algorithm="EAGLE"))
    assert [f.id for f in r.findings] == ["draft/is_target"]
    assert "`--speculative-draft-model-path <draft folder>`" in r.findings[0].fix


def test_br50_target_given_as_its_own_eagle3_draft(facts, vllm_facts, tmp_path):
    """BR-50: SGLang without --speculative-draft-model-path drafts with the target (Qwen2ForCausalLM):
    an error that says so, with that flag as the fix, not a relabel to LlamaForCausalLMEagle3. The
    same for a copy of the target in another folder (same config, same tensors)."""
    import shutil

    copy = shutil.copytree(BR50, tmp_path / "copy")
    for draft in (BR50, None, copy):
        r = diagnose(draft, BR50, facts=facts["0.5.23"], settings=ServerSettings(algorithm="EAGLE3"))
        assert [f.id for f in r.findings] == ["draft/is_target"] and r.has_errors
        f = r.findings[0]
        assert "the draft is the target model itself" in f.title and "no EAGLE-3 draft was given" in f.title
        assert f.fix.startswith("Pass `--speculative-draft-model-path <draft folder>`")
        no_eagle3_advice(r)
    r = diagnose_vllm(BR50, BR50, vllm_facts["0.33.0"], settings=ServerSettings(algorithm="EAGLE3"))
    assert [f.id for f in r.findings] == ["draft/is_target"] and "--speculative-config" in r.findings[0].fix


def test_eagle3_on_an_mtp_model_without_a_draft_names_both_ways(facts, tmp_path):
    r = diagnose(None, target(tmp_path, "deepseek"), facts=facts["0.5.23"], settings=ServerSettings(algorithm="EAGLE3"))
    f = r.findings[0]
    assert f.id == "draft/is_target" and "`--speculative-algorithm NEXTN`" in f.fix


def cli(*args):
    return subprocess.run([sys.executable, "-m", "specwatch", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def test_cli_target_alone_and_br50(sglang_roots, tmp_path):
    d = target(tmp_path, "deepseek", drop=("model.layers.2.",))
    r = cli("diagnose", "--target", d, "--algorithm", "NEXTN", "--sglang-root", sglang_roots["0.5.23"])
    assert r.returncode == 1 and "[mtp_head/missing]" in r.stdout, r.stdout + r.stderr
    assert "LlamaForCausalLMEagle3" not in r.stdout and "fix-checkpoint" not in r.stdout
    r = cli("diagnose", "--draft", BR50, "--target", BR50, "--algorithm", "EAGLE3", "--sglang-root",
            sglang_roots["0.5.23"])
    assert r.returncode == 1 and "[draft/is_target]" in r.stdout and "LlamaForCausalLMEagle3" not in r.stdout
    out = tmp_path / "fixed"
    r = cli("fix-checkpoint", "--draft", BR50, "--target", BR50, "--out", out, "--sglang-root", sglang_roots["0.5.23"])
    assert r.returncode == 2 and "is the target model itself" in r.stderr and not out.exists()
    r = cli("diagnose", "--sglang-root", sglang_roots["0.5.23"])  # neither --draft nor --target
    assert r.returncode == 2 and "give --draft DIR" in r.stderr


def test_the_daemon_diagnoses_an_mtp_server_without_a_draft_path(sglang_roots, tmp_path):
    """The server_args of a NEXTN server name no draft: the daemon's diagnosis checks the target's
    MTP head (it was 'not checked: no draft known' before)."""
    from specwatch.diagnosis import Diagnoser

    d = target(tmp_path, "deepseek", drop=("model.layers.2.enorm",))
    dg = Diagnoser(background=False, sglang_root=str(sglang_roots["0.5.23"]))
    dg.observe("sglang-0", {"speculative_algorithm": "NEXTN", "model_path": str(d)})
    r = dg.report("sglang-0")
    assert r is not None and [f.id for f in r.findings] == ["mtp_head/missing"], dg.note("sglang-0")
    dg.observe("sglang-1", {"speculative_algorithm": "NGRAM", "model_path": str(d)})
    assert dg.report("sglang-1") is None  # n-gram drafting reads no checkpoint


def test_a_separate_nextn_draft_is_checked_as_an_mtp_head(facts, tmp_path):
    """A NextN layer exported on its own (num_hidden_layers 1, as SGLang's export script writes it)
    served with --speculative-algorithm NEXTN: SGLang reads it at layer 0; its head is checked and no
    EAGLE-3 probe (relabel as LlamaForCausalLMEagle3, strip `model.`) runs."""
    d = tmp_path / "nextn"
    d.mkdir()
    cfg = {"architectures": ["DeepseekV3ForCausalLMNextN"], "model_type": "deepseek_v3", "num_nextn_predict_layers": 1,
           "hidden_size": H, "num_hidden_layers": 1, "vocab_size": 32}
    (d / "config.json").write_text(json.dumps(cfg))
    head = {k.replace("model.layers.2.", "model.layers.0."): v for k, v in FAMILIES["deepseek"][1].items()}
    save_file({"model.embed_tokens.weight": _t(32, H), **head}, str(d / "model.safetensors"))
    full = target(tmp_path, "deepseek")
    r = diagnose(d, full, facts=facts["0.5.23"], settings=ServerSettings(algorithm="EAGLE"))
    assert [f.id for f in r.findings] == ["mtp_head/ok"], r.format_text(verbose=True)
    assert r.findings[0].evidence["expected at"] == ["model.layers.0.{eh_proj,enorm,hnorm,shared_head.norm}"]
    no_eagle3_advice(r)
    save_file({"model.embed_tokens.weight": _t(32, H)}, str(d / "model.safetensors"))  # the head left out
    r = diagnose(d, full, facts=facts["0.5.23"], settings=ServerSettings(algorithm="EAGLE"))
    assert [f.id for f in r.findings] == ["mtp_head/missing"] and "model.layers.0.enorm" in r.findings[0].evidence["missing"]
    no_eagle3_advice(r)


def test_the_missing_head_fix_names_the_engine_flag(facts, vllm_facts, tmp_path):
    d = target(tmp_path, "deepseek", drop=("model.layers.2.",))
    assert diagnose(None, d, facts=facts["0.5.23"]).findings[0].fix.endswith("(no `--speculative-algorithm`).")
    assert diagnose_vllm(None, d, vllm_facts["0.33.0"]).findings[0].fix.endswith("(no `--speculative-config`).")


def test_without_an_engine_source_the_head_is_not_judged(tmp_path):
    """specwatch's version table knows no MTP classes: not checked (info), never a made-up error."""
    from specwatch.engines.sglang.known_versions import TableFacts

    r = diagnose(None, target(tmp_path, "deepseek"), facts=TableFacts("0.5.23"), settings=ServerSettings(algorithm="EAGLE"))
    assert [(f.id, f.severity) for f in r.findings] == [("mtp_head/not_checked", "info")]
    assert "from specwatch's table" in r.findings[0].title and "--sglang-root" in r.findings[0].fix
