"""unloaded_weights: checkpoint keys SGLang silently drops, and parameters no key fills.

Every key goes through the installed loader's rules (`draft_module.map_with`, mirroring
`LlamaForCausalLMEagle3.load_weights`) onto the parameters the installed draft module builds from
the draft config. SGLang logs nothing for either case (`load_weights` in llama_eagle3.py, 0.5.11 and
0.5.23): a dropped key is a trained tensor thrown away, an unfilled parameter runs at its
random/ones initialisation. The seed case: `layers.0.*` (speculators) on SGLang ≤ 0.5.11, whose
module is `midlayer`. Unreadable weight files (a lying safetensors header, a pickle without torch)
are reported here.
"""

from __future__ import annotations

import re
from dataclasses import replace

from specwatch.probes.base import ERROR, INFO, WARNING, Finding, ProbeContext, fix_checkpoint_command, short_list
from specwatch.probes.draft_module import KeyMapping, draft_class, map_keys, map_with

PROBE_ID = "unloaded_weights"
_SWAPS = (("layers.0.", "midlayer."), ("midlayer.", "layers.0."))


def run(ctx: ProbeContext) -> list[Finding]:
    d = ctx.draft
    out: list[Finding] = []
    for problem in d.store.problems:
        if problem in d.store.outside:
            out.append(Finding(PROBE_ID, "outside_checkpoint", ERROR, f"weights not read: {problem}",
                               {"path": str(d.path), "problem": problem},
                               "Keep every weight file inside the checkpoint folder (a regular file, or a link that "
                               "stays inside it) and name it by its file name in model.safetensors.index.json's "
                               "weight_map; specwatch opens nothing that resolves outside the folder."))
            continue
        out.append(Finding(PROBE_ID, "unreadable_weights", ERROR, f"weights cannot be read: {problem}",
                           {"path": str(d.path), "problem": problem},
                           "Re-export the checkpoint (the file is corrupt, truncated or not what its header says); "
                           "specwatch read nothing from it."))
    if d.store.format is None and not d.store.problems:
        out.append(Finding(PROBE_ID, "no_weights", ERROR, "no weights: neither `*.safetensors` nor `pytorch_model.bin`",
                           {"path": str(d.path)}, "Point --draft at the folder holding the draft's weights."))
    if not d.tensors:
        return out
    version = ctx.sglang.version or "?"
    cls = draft_class(ctx)
    rules = ctx.sglang.draft_rules(cls)
    m = map_keys(ctx)
    if m is None or rules is None:  # a mapping exists only for a modelled class (map_keys)
        why = ("the draft config lacks sizes (hidden_size, heads, intermediate_size, vocab_size)"
               if rules is not None and rules.modelled else f"{cls}'s loader in SGLang {version} is not modelled by specwatch")
        out.append(Finding(PROBE_ID, "not_checked", WARNING, f"keys not mapped: {why}", {"draft_class": cls}, ""))
        return out

    if m.dropped:
        out.append(_dropped(ctx, m, rules, version))
    if m.unfilled:
        out.append(Finding(
            PROBE_ID, "unfilled_params", ERROR,
            f"{len(m.unfilled)} parameter(s) of {cls} get no checkpoint tensor and run at their initial values",
            {"unfilled": short_list(m.unfilled), "count": len(m.unfilled), "sglang_version": version,
             "draft_class": cls},
            _unfilled_fix(ctx, m)))
    unused = [k for k, (p, _) in m.loaded.items()
              if rules.decoder == "layers" and rules.input_layer_only_2h
              and re.match(r"model\.layers\.[1-9]\d*\.input_layernorm\.weight$", p)]
    if unused:
        out.append(Finding(PROBE_ID, "loaded_unused", WARNING,
                           "input_layernorm of layers >= 1 is loaded but unused: SGLang normalises those layers "
                           "with hidden_norm (which no key fills)", {"keys": short_list(unused)},
                           "Check that the draft was trained with SGLang's multi-layer layout."))
    if m.from_target:
        out.append(Finding(PROBE_ID, "from_target", INFO,
                           f"{', '.join(m.from_target)} taken from the target model at startup",
                           {p: why for p, why in m.from_target.items()}, ""))
    if not m.dropped and not m.unfilled:
        out.append(Finding(PROBE_ID, "ok", INFO, f"all {len(m.loaded)} weight keys load into {cls} (SGLang {version})",
                           {"loaded": len(m.loaded), "skipped": sorted(m.skipped)}, ""))
    return out


def _dropped(ctx: ProbeContext, m: KeyMapping, rules, version: str) -> Finding:
    renames: dict[str, str] = {}
    for old, new in _SWAPS:
        keys = [k for k in m.dropped if k.startswith(old)]
        if keys and _loads_after(ctx, m, rules, old, new, keys):
            renames[old] = new
    groups = sorted({_group(k) for k in m.dropped})
    fixes = []
    if renames:
        fixes.append("Rename " + ", ".join(f"`{a}*` → `{b}*`" for a, b in renames.items())
                     + f": {fix_checkpoint_command(ctx.draft.path)}"
                     + (" (or upgrade SGLang to >= 0.5.12, which loads `layers.0.*`)" if "layers.0." in renames else ""))
    rest = [k for k in m.dropped if not any(k.startswith(a) for a in renames)]
    if any(re.search(r"\.(q|k|v)_proj\.bias$", k) for k in rest):
        fixes.append("SGLang builds qkv_proj with bias=False: q/k/v biases are lost (retrain without attention "
                     "bias, or serve with vLLM)")
    if "input_norm.weight" in rest:
        fixes.append("`input_norm.weight` (norm_before_fc) loads only on SGLang >= 0.5.17 with "
                     '`"norm_before_fc": true` in config.json' if not rules.input_norm
                     else 'add `"norm_before_fc": true` to config.json so SGLang builds input_norm')
    if any(k.startswith(("fc_norm.", "aux_norm_")) for k in rest):
        fixes.append('fc_norm weights load only on SGLang >= 0.5.12 with `"fc_norm": true` in config.json')
    if "lm_head.weight" in rest:
        fixes.append('set `"tie_word_embeddings": false` so lm_head.weight has a parameter')
    if not fixes:
        fixes.append(f"these names match no parameter of {rules.cls}: check how the checkpoint was exported")
    return Finding(
        PROBE_ID, "dropped_keys", ERROR,
        f"{len(m.dropped)} checkpoint key(s) silently dropped by SGLang {version}'s {rules.cls} loader",
        {"dropped": short_list(sorted(m.dropped)), "count": len(m.dropped), "groups": short_list(groups),
         "looked_up_as": short_list(sorted(set(m.dropped.values()))), "sglang_version": version,
         "decoder_module": f"model.{rules.decoder}", "legacy_renames": dict(rules.renames)},
        "; ".join(fixes) + ".")


def _group(key: str) -> str:
    """`layers.0.mlp.up_proj.weight` → `layers.0.*`; `input_norm.weight` → `input_norm.*`."""
    parts = key.split(".")
    head = parts[:2] if len(parts) > 2 and parts[1].isdigit() else parts[:1]
    return ".".join(head) + ".*"


def _loads_after(ctx, m: KeyMapping, rules, old: str, new: str, keys: list[str]) -> bool:
    """Whether renaming `old` → `new` makes these keys load."""
    renamed = {new + k[len(old):]: replace(ctx.draft.tensors[k], name=new + k[len(old):]) for k in keys}
    return not map_with(rules, m.params, renamed).dropped


def _unfilled_fix(ctx: ProbeContext, m: KeyMapping) -> str:
    if any(p == "lm_head.weight" for p in m.unfilled):
        return ('the checkpoint has no lm_head.weight but draft_vocab_size is set: export the trained head, or set '
                '"draft_vocab_size": null to borrow the target\'s (only right if the draft never had its own)')
    if any(p == "model.embed_tokens.weight" for p in m.unfilled):
        return "target_hidden_size differs from hidden_size, so SGLang keeps the draft's own embedding: export embed_tokens.weight"
    if m.dropped:
        return "fill them by renaming the dropped keys (see dropped_keys)"
    return "export the missing tensors from the trainer, or check the draft config (it declares more than was saved)"
