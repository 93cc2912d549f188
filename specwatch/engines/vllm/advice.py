"""The known causes of an acceptance collapse on a vLLM server, each with a check and a fix.

Used by rules/collapse.py for a server whose settings say `engine: vllm` (engines/vllm/log.py,
sources/process.py). Facts, all in `vllm/` of the wheels named:
- `model_executor/models/llama_eagle3.py`: `Eagle3LlamaForCausalLM.load_weights` drops `t2d`,
  renames `d2t`, keeps `lm_head*` and prefixes every other key with `model.` (0.8.5.post1 lines
  216-232, 0.33.0 lines 420-444); from 0.9.0 it returns None, so the loader cannot report a
  weight the checkpoint lacked (0.33.0 line 476); `d2t` is an offset, target id = draft id +
  d2t (0.8.5.post1 line 208, 0.33.0 line 386).
- aux hidden-state layers: the default `(2, n // 2, n - 3)` (`get_eagle3_aux_hidden_state_layers`,
  `model_executor/models/llama.py@0.8.5.post1` line 534, never reading the draft config); the top
  level `eagle_aux_hidden_state_layer_ids` of the draft config, then `eagle_config` (V1 runner,
  `v1/worker/gpu_model_runner.py@0.33.0` lines 5190-5219); Model Runner V2 reads only the top
  level (`v1/worker/gpu/spec_decode/eagle/eagle3_utils.py@0.33.0` line 113).
- embed_tokens of the draft kept when it differs from the target's, per TP rank
  (`v1/spec_decode/llm_base_proposer.py@0.33.0` line 1465; https://github.com/vllm-project/vllm/issues/50158).
"""

from __future__ import annotations

import shlex

from specwatch.alerts.model import code

_PY_KEYS = ("python -c \"import glob, sys; from safetensors import safe_open; "
            "print(sorted({'.'.join(k.split('.')[:2]) for f in glob.glob(glob.escape(sys.argv[1]) + '/*.safetensors') "
            "for k in safe_open(f, 'np').keys()}))\" ")
_PY_D2T = ("python -c \"import glob, sys; from safetensors import safe_open; "
           "fs = [safe_open(f, 'np') for f in glob.glob(glob.escape(sys.argv[1]) + '/*.safetensors')]; "
           "d = [f.get_tensor('d2t') for f in fs if 'd2t' in f.keys()][0]; print(d[:8], d.min(), d.max())\" ")
_PY_LAYERS = ("python -c \"import json, sys; c = json.load(open(sys.argv[1] + '/config.json')); "
              "print(c.get('eagle_aux_hidden_state_layer_ids'), (c.get('eagle_config') or {}).get('eagle_aux_hidden_state_layer_ids'))\" ")


def _q(v: object, placeholder: str) -> str:
    return shlex.quote(str(v)) if v else placeholder


def vllm_causes(args: dict[str, object], kind: str | None) -> list[str]:
    """What to check on a vLLM server, by draft kind (`rules.collapse.draft_kind`: "eagle",
    "mtp", "ngram", "draft" or None)."""
    draft, target = args.get("speculative_draft_model_path"), args.get("model_path")
    d, t = _q(draft, "<draft dir>"), _q(target, "<target dir>")
    version = args.get("vllm_version")
    on = f" (this server: vLLM {version})" if version else ""
    common = [
        "Prefill/decode disaggregation: a decode node that accepts nothing while the same model accepts "
        "normally co-located points at what the decode node receives, not at the draft "
        "(https://github.com/vllm-project/vllm-ascend/issues/13665: accept length 2.67 co-located, 1.00 on "
        "the decode node). Compare one co-located instance with the same flags.",
        "Model Runner V2 rejects more EAGLE-3 drafts than the V1 runner on some builds "
        "(https://github.com/vllm-project/vllm/issues/40551): restart once with `VLLM_USE_V2_MODEL_RUNNER=0` "
        "and compare the `SpecDecoding metrics` lines.",
    ]
    if kind == "ngram":
        return ["n-gram drafting has no model: on traffic with little repetition a mean acceptance length near "
                "1.0 is expected. Check which requests ran and `prompt_lookup_max`/`prompt_lookup_min` in "
                "`--speculative-config`."]
    if kind == "mtp":
        return [f"MTP drafts with a head inside the target checkpoint: check that {code(t)} still carries it "
                f"({code(_PY_KEYS + t)} lists `mtp.*` or `model.layers.<num_hidden_layers>.*`); a quantized or "
                "pruned re-export often drops it. With `num_speculative_tokens` > 1 vLLM runs the one MTP layer "
                "several times and warns that acceptance drops.", *common]
    return [
        f"Run the diagnosis against the vLLM this server runs{on}: "
        + code(f"specwatch diagnose --engine vllm --draft {d} --target {t}")
        + " — it reads vLLM's loader on disk and names dropped or unloaded keys, the aux layers it captures and the d2t map.",
        "Aux hidden-state layers guessed: vLLM <= 0.11 always captures the default layers `(2, n//2, n-3)` of the "
        "target; 0.12+ read the draft config's top-level `eagle_aux_hidden_state_layer_ids` (then "
        "`eagle_config`; Model Runner V2 only the top level). A draft trained on other layers accepts almost "
        f"nothing. Check: {code(_PY_LAYERS + d)}. Fix: put the layer ids the draft was trained on at the top "
        "level of its config.json and run vLLM >= 0.12 (https://github.com/vllm-project/vllm/pull/25961).",
        "Keys vLLM never loads: `Eagle3LlamaForCausalLM.load_weights` prefixes every key except `lm_head*`/`d2t` "
        "with `model.`, so `model.`-prefixed keys fail and a missing `fc`, `norm` or `lm_head` loads silently "
        f"uninitialised (vLLM >= 0.9.0). Check: {code(_PY_KEYS + d)} — expect `fc.weight`, `norm.weight`, "
        "`lm_head.weight`, `midlayer.*` or `layers.0.*`, `d2t`.",
        "Draft embed_tokens kept (vLLM >= 0.12): a draft whose `embed_tokens` differs from the target's keeps its "
        "own, decided per TP rank; an untrained copy accepts almost nothing. Check: "
        "`grep -n 'Detected EAGLE model with' <log>` — `distinct embed_tokens weights` on any rank. Fix: remove "
        "`embed_tokens.weight` from the draft checkpoint so vLLM shares the target's.",
        "d2t map: vLLM reads `d2t` as offsets (target id = draft id + d2t[draft id]); a map of absolute target "
        f"ids sends every draft token to the wrong target token. Check: {code(_PY_D2T + d)} — offsets start near 0. "
        "Fix: re-export d2t as offsets (`d2t[i] = target_id[i] - i`) from the trainer's vocabulary map.",
        *common,
    ]
