"""Small EAGLE-3 draft checkpoints in each real format, and the toy targets they pair with.

Every layout follows the trainers' own source, file named per format below (the trainers
themselves need torch and a GPU-sized verifier, so they are not run here):

- `speculators-eagle3`: speculators 0.9.0 trainer output (`speculators/models/eagle3/
  config.py`, `models/eagle3/core.py`, `train/config/schema.py`): nested
  `transformer_layer_config` + `speculators_config`, `architectures: ["Eagle3DraftModel"]`,
  top-level `eagle_aux_hidden_state_layer_ids` `[2, N//2, N-3]`, training defaults
  `norm_before_residual`/`norm_before_fc`/`norm_output` true, every layer
  `sliding_attention` with window 2048; keys `layers.0.*`, `embed_tokens`, `fc` [H, 3H],
  `input_norm` [3H], `norm`, `lm_head` [Vd, H] (the target's rows at the hot ids, frozen),
  `d2t` int64 [Vd] offsets and `t2d` bool [V] (Vd < V); BF16.
- `speculators-converted`: `speculators convert` output
  (`convert/eagle/eagle3_converter.py` 0.9.0): `Eagle3Speculator`,
  `norm_before_residual` false, no `norm_before_fc`/`input_norm`, `midlayer.` renamed to
  `layers.0.`, no embeddings, d2t/t2d copied; BF16.
- `speculators-fullvocab`: a speculators draft with Vd == V: no d2t/t2d
  (`train/vocab_mapping.py` 0.9.0, https://github.com/vllm-project/speculators/pull/261).
- `specforge`: SpecForge 0.2.0 SGLang export (`export/to_sglang.py`,
  `modeling/draft/llama3_eagle.py`): flat `LlamaForCausalLMEagle3` config,
  `midlayer.*`, no embeddings, `fc` [H, 3Ht], `lm_head` [Vd, H] trained, d2t/t2d always; F16.
- `safeailab-eagle3`: SafeAILab/EAGLE at cb7e084 (`eagle/traineagle3/config.json`,
  `eagle/model/cnets.py`): flat `LlamaForCausalLM` + `draft_vocab_size`,
  `midlayer.*`, no aux-id field; F16 safetensors (the repo also loads `model.safetensors`).
- `target-llama`: a toy Llama target, N = 8 layers, Ht = 64, V = 256, with `config.json` and
  only the tensors the probes read (`model.embed_tokens.weight`, `lm_head.weight`, BF16).
- `target-kimi-vlm`: config only, a Kimi-K2.5-style multimodal wrapper
  (`KimiK25ForConditionalGeneration`, `text_config` of `deepseek_v3` type), scaled down.

Sizes: H = Ht = 64, nh = 4, nkv = 2, hd = 16, I = 128, V = 256, Vd = 64, N = 8 (target).

    python tests/checkpoints.py [OUT_DIR]   # default: tests/data/checkpoints

`variant()` copies one of them with changes, for the fault tests.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specwatch.fixes.safetensors_io import from_numpy, write_safetensors  # noqa: E402

OUT = Path(__file__).resolve().parent / "data" / "checkpoints"
H, NH, NKV, HD, INTER, V, VD, N = 64, 4, 2, 16, 128, 256, 64, 8
SEED = 20260223


def _rng(tag: str) -> np.random.Generator:
    return np.random.default_rng([SEED, sum(tag.encode())])


def hot_ids() -> np.ndarray:
    """The Vd most frequent target ids, sorted ascending (speculators vocab_mapping.py@0.9.0)."""
    return np.sort(_rng("vocab").choice(V, size=VD, replace=False)).astype(np.int64)


def d2t_t2d(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Offsets d2t[i] = id_i - i (int64 [Vd]) and t2d (bool [V], Vd True)."""
    t2d = np.zeros(V, dtype=bool)
    t2d[ids] = True
    return ids - np.arange(len(ids), dtype=np.int64), t2d


def _w(rng, *shape, scale=0.02):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _norm(rng, n):
    return (1.0 + rng.standard_normal(n) * 0.05).astype(np.float32)


def target_lm_head() -> np.ndarray:
    return _w(_rng("target-lm-head"), V, H)


def decoder_layer(rng, prefix: str, *, input_width: int, with_hidden_norm: bool = True) -> dict[str, np.ndarray]:
    t = {
        f"{prefix}.input_layernorm.weight": _norm(rng, H),
        f"{prefix}.post_attention_layernorm.weight": _norm(rng, H),
        f"{prefix}.self_attn.q_proj.weight": _w(rng, NH * HD, input_width),
        f"{prefix}.self_attn.k_proj.weight": _w(rng, NKV * HD, input_width),
        f"{prefix}.self_attn.v_proj.weight": _w(rng, NKV * HD, input_width),
        f"{prefix}.self_attn.o_proj.weight": _w(rng, H, NH * HD),
        f"{prefix}.mlp.gate_proj.weight": _w(rng, INTER, H),
        f"{prefix}.mlp.up_proj.weight": _w(rng, INTER, H),
        f"{prefix}.mlp.down_proj.weight": _w(rng, H, INTER),
    }
    if with_hidden_norm:
        t[f"{prefix}.hidden_norm.weight"] = _norm(rng, H)
    return t


def llama_fields() -> dict:
    return {"model_type": "llama", "hidden_size": H, "num_hidden_layers": 1, "num_attention_heads": NH,
            "num_key_value_heads": NKV, "head_dim": HD, "intermediate_size": INTER, "vocab_size": V,
            "hidden_act": "silu", "rms_norm_eps": 1e-05, "max_position_embeddings": 8192, "rope_theta": 500000.0,
            "rope_scaling": None, "tie_word_embeddings": False, "attention_bias": False}


def save(dirname: Path, config: dict, tensors: dict[str, np.ndarray], float_code: str) -> None:
    dirname.mkdir(parents=True, exist_ok=True)
    (dirname / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    raw = {k: from_numpy(v, float_code if v.dtype == np.float32 else None) for k, v in sorted(tensors.items())}
    write_safetensors(dirname / "model.safetensors", raw, {"format": "pt"})


def speculators_config(*, trained: bool, vd: int) -> dict:
    layer = llama_fields()
    if trained:
        layer |= {"layer_types": ["sliding_attention"], "sliding_window": 2048}
    return {
        "architectures": ["Eagle3DraftModel" if trained else "Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "transformers_version": "4.57.1",
        "dtype": "bfloat16",
        "transformer_layer_config": layer,
        "draft_vocab_size": vd,
        "norm_before_residual": trained,
        **({"norm_before_fc": True, "norm_output": True} if trained else {}),
        "fc_norm": False,
        "embed_requires_grad": False,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": [2, N // 2, N - 3],
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1,
                                  "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": "toy/target-llama", "architectures": ["LlamaForCausalLM"]},
        },
    }


def build_speculators(out: Path, *, trained: bool, full_vocab: bool = False) -> None:
    rng = _rng(f"speculators-{trained}-{full_vocab}")
    ids = np.arange(V, dtype=np.int64) if full_vocab else hot_ids()
    t = {"fc.weight": _w(rng, H, 3 * H), "norm.weight": _norm(rng, H),
         "lm_head.weight": target_lm_head()[ids]}  # frozen copy of the verifier rows
    t |= decoder_layer(rng, "layers.0", input_width=2 * H)
    if trained:
        t["embed_tokens.weight"] = _w(_rng("target-embed"), V, H)
        t["input_norm.weight"] = _norm(rng, 3 * H)
    if not full_vocab:
        t["d2t"], t["t2d"] = d2t_t2d(ids)
    name = "speculators-fullvocab" if full_vocab else "speculators-eagle3" if trained else "speculators-converted"
    save(out / name, speculators_config(trained=trained, vd=V if full_vocab else VD), t, "BF16")


def build_flat(out: Path, name: str, architecture: str) -> None:
    rng = _rng(name)
    cfg = {"architectures": [architecture], **llama_fields(), "draft_vocab_size": VD}
    if architecture == "LlamaForCausalLM":  # SafeAILab's training config has bias false, no aux ids
        cfg["bias"] = False
    t = {"fc.weight": _w(rng, H, 3 * H), "norm.weight": _norm(rng, H), "lm_head.weight": _w(rng, VD, H)}
    t |= decoder_layer(rng, "midlayer", input_width=2 * H)
    t["d2t"], t["t2d"] = d2t_t2d(hot_ids())
    save(out / name, cfg, t, "F16")


def build_targets(out: Path) -> None:
    cfg = {"architectures": ["LlamaForCausalLM"], **llama_fields(), "num_hidden_layers": N,
           "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 256,
           "max_position_embeddings": 8192}
    save(out / "target-llama", cfg, {"model.embed_tokens.weight": _w(_rng("target-embed"), V, H),
                                     "lm_head.weight": target_lm_head()}, "BF16")
    text = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": H,
            "num_hidden_layers": N, "vocab_size": V, "num_attention_heads": NH, "kv_lora_rank": 32,
            "q_lora_rank": 48, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
            "intermediate_size": INTER, "rms_norm_eps": 1e-06, "rope_theta": 50000.0,
            "max_position_embeddings": 8192, "tie_word_embeddings": False}
    kimi = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
            "text_config": text, "vision_config": {"model_type": "moonvit"}, "tie_word_embeddings": False}
    d = out / "target-kimi-vlm"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(kimi, indent=2) + "\n")


def build_all(out: Path = OUT) -> None:
    build_targets(out)
    build_speculators(out, trained=True)
    build_speculators(out, trained=False)
    build_speculators(out, trained=False, full_vocab=True)
    build_flat(out, "specforge", "LlamaForCausalLMEagle3")
    build_flat(out, "safeailab-eagle3", "LlamaForCausalLM")


def variant(src: Path, dst: Path, *, rename: dict[str, str] | None = None, drop: tuple[str, ...] = (),
            config: dict | None = None, set_tensors: dict[str, np.ndarray] | None = None,
            float_code: str | None = None) -> Path:
    """Copy checkpoint `src` to `dst` with key prefix renames, keys dropped, config keys set
    (None deletes), and tensors replaced or added (float32 arrays stored as `float_code`, default
    the source's float dtype)."""
    sys.path.insert(0, str(ROOT))
    from specwatch.probes.checkpoint import load_draft

    ck = load_draft(src)
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    cfg = json.loads((src / "config.json").read_text())
    for k, v in (config or {}).items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    code = float_code or next((i.dtype for i in ck.tensors.values() if i.dtype in ("BF16", "F16", "F32")), "F32")
    out = {}
    for name in ck.tensors:
        if any(name.startswith(d) for d in drop):
            continue
        new = name
        for a, b in (rename or {}).items():
            if new.startswith(a):
                new = b + new[len(a):]
        out[new] = ck.store.raw(name)
    for name, arr in (set_tensors or {}).items():
        out[name] = from_numpy(arr, code if arr.dtype == np.float32 else None)
    write_safetensors(dst / "model.safetensors", out, {"format": "pt"})
    return dst


if __name__ == "__main__":
    build_all(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
