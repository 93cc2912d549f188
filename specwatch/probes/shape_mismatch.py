"""shape_mismatch: draft sizes that disagree with the target or with the module SGLang builds.

Checks (`sglang/srt/models/llama_eagle3.py`, `models/llama.py`, `configs/model_config.py` 0.5.23):
- draft `vocab_size` == target vocab (the VLM's text config); Ht (`target_hidden_size`, else H)
  == target hidden size; `embed_tokens.weight` present when `target_hidden_size` ≠ H;
- every tensor's shape against the parameter (or q/k/v / gate/up shard) it loads into — SGLang's
  weight loader fails at startup on these, `fc.weight` [H, k·Ht] included (k computed the
  installed version's way: 3 on ≤0.5.11);
- RoPE (`rope_theta`, `rope_scaling`/`rope_parameters`, `partial_rotary_factor`) vs the target's;
  `max_position_embeddings` below the target's (SGLang refuses a longer context unless
  `SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1`).
Tensor shapes are `not_checked` when the weights were not all read.
"""

from __future__ import annotations

from specwatch.probes.base import ERROR, INFO, WARNING, Finding, ProbeContext, short_list, weights_not_checked
from specwatch.probes.draft_module import map_keys

PROBE_ID = "shape_mismatch"


def _rope(cfg: dict) -> dict:
    params, scaling = cfg.get("rope_parameters"), cfg.get("rope_scaling")
    params = params if isinstance(params, dict) else {}
    scaling = scaling if isinstance(scaling, dict) else {}
    theta = params.get("rope_theta", cfg.get("rope_theta"))
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    return {"rope_theta": float(theta) if isinstance(theta, (int, float)) else None,
            "rope_type": kind,
            "partial_rotary_factor": params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))}


def run(ctx: ProbeContext) -> list[Finding]:
    d, t = ctx.draft, ctx.target
    out: list[Finding] = []

    def add(kind, severity, title, evidence, fix):
        out.append(Finding(PROBE_ID, kind, severity, title, evidence, fix))

    skipped = weights_not_checked(PROBE_ID, ctx, "tensor shapes")
    if skipped is not None:  # the config-level comparisons below still run
        out.append(skipped)
    m = map_keys(ctx)
    if m is not None and m.shape_errors:
        rows = [f"{k}: {list(got)} (SGLang's {p} needs {list(want)})" for k, p, got, want in m.shape_errors]
        fc = next((e for e in m.shape_errors if e[0] == "fc.weight"), None)
        fix = "Make config.json describe the saved tensors (hidden_size, heads, head_dim, intermediate_size, vocab sizes)."
        if fc is not None and d.target_hidden_size and fc[2][1] % d.target_hidden_size == 0:
            k = fc[2][1] // d.target_hidden_size
            fix = (f"fc.weight was trained for {k} aux hidden states; SGLang {ctx.sglang.version or '?'} builds fc "
                   f"for {fc[3][1] // d.target_hidden_size}: list {k} ids in eagle_config.eagle_aux_hidden_state_layer_ids "
                   "(SGLang >= 0.5.12 sizes fc from them).")
        add("tensor_shape", ERROR, f"{len(rows)} tensor(s) do not fit the module SGLang builds: loading fails at startup",
            {"mismatches": short_list(rows)}, fix)
    if t is None:
        add("no_target", INFO, "no target config given: vocab, hidden size and RoPE not compared",
            {}, "Pass --target DIR (the target model folder or its config.json).")
        return out

    if d.vocab_size and t.vocab_size and d.vocab_size != t.vocab_size:
        add("vocab_size", ERROR, f"draft vocab_size {d.vocab_size} != target vocab {t.vocab_size}",
            {"draft vocab_size": d.vocab_size, "target vocab_size": t.vocab_size},
            f'Set "vocab_size": {t.vocab_size} (the draft must share the target tokenizer) or pair the right target.')
    if d.target_hidden_size and t.hidden_size and d.target_hidden_size != t.hidden_size:
        src = "target_hidden_size" if d.flat.get("target_hidden_size") else "hidden_size"
        add("hidden_size", ERROR, f"draft expects {d.target_hidden_size}-wide target states ({src}), the target has "
            f"{t.hidden_size}", {f"draft {src}": d.target_hidden_size, "target hidden_size": t.hidden_size},
            "Pair the draft with the target it was trained on (fc.weight is [H, k·Ht]).")
    ht = d.flat.get("target_hidden_size")
    if ht and ht != d.hidden_size and "embed_tokens.weight" not in d.tensors:
        add("embed_required", ERROR, "target_hidden_size differs from hidden_size: SGLang keeps the draft's own "
            "embedding, which the checkpoint lacks", {"hidden_size": d.hidden_size, "target_hidden_size": ht},
            "Export embed_tokens.weight [V, H] with the draft.")

    dr, tr = _rope(d.flat), _rope(t.text)
    diffs = {k: f"draft {dr[k]} vs target {tr[k]}" for k in dr if dr[k] != tr[k] and dr[k] is not None}
    if diffs:
        add("rope", WARNING, "RoPE settings differ from the target's: positions are encoded differently than "
            "the target's hidden states assume", diffs,
            "Copy rope_theta / rope_scaling (rope_parameters) / partial_rotary_factor from the target config, "
            "unless the draft was trained with these values.")
    dmax, tmax = d.flat.get("max_position_embeddings"), t.get("max_position_embeddings")
    ctx_len = ctx.settings.context_length or tmax
    if isinstance(dmax, int) and isinstance(ctx_len, int) and dmax < ctx_len:
        add("context_length", WARNING, f"draft max_position_embeddings {dmax} < context length {ctx_len}: SGLang "
            "refuses it unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1",
            {"draft max_position_embeddings": dmax, "context length": ctx_len},
            f'Set "max_position_embeddings": {ctx_len} in the draft config (positions beyond {dmax} were never trained).')
    if not out:
        add("ok", INFO, "draft sizes match the target and the module SGLang builds",
            {"hidden_size": d.hidden_size, "target hidden_size": t.hidden_size, "vocab_size": t.vocab_size}, "")
    return out
