"""The diagnosis of an EAGLE-3 draft served by vLLM: the checkpoint read against the loader of
the vLLM on disk (`vllm_source.VllmFacts`), from files alone.

Probes (ids in the report): `vllm_config_format` (speculators configs, `draft_vocab_size`),
`vllm_weights` (keys the loader rejects, skips, or never fills: from 0.9.0 `load_weights` returns
None and the proposer (0.8.5.post1 `v1/spec_decode/eagle.py` line 238) never checks, so a missing
`fc`, `norm` or `lm_head` stays at its initial value with nothing in the log), `vllm_aux_layers`
(target support and the layers vLLM captures against those the draft was trained on) and
`vllm_d2t` (the vocabulary map, read as offsets).
"""

from __future__ import annotations

from pathlib import Path

from specwatch.alerts.model import code
from specwatch.probes.base import ERROR, INFO, WARNING, Finding, Report, sort_findings
from specwatch.engines.vllm.source import VllmFacts

# The parameters of vLLM's Llama EAGLE-3 draft decoder layer (model_executor/models/llama.py and
# llama_eagle3.py): attribute path → the module table that must hold its first part.
LAYER_PARAMS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj",
                "input_layernorm", "post_attention_layernorm", "hidden_norm")


def _ids(v) -> list[int] | None:
    return [int(x) for x in v] if isinstance(v, (list, tuple)) and all(isinstance(x, int) for x in v) and v else None


def known_param(facts: VllmFacts, name: str) -> bool:
    """`name` (a mapped parameter name) is a parameter of the draft module this vLLM builds."""
    m = facts.modules
    parts = name.split(".")
    if parts[0] != "model":
        return parts[0] in m["top"] and parts[0] != "model"
    if len(parts) < 3 or parts[1] not in m["model"]:
        return False
    if parts[1] == "layers":
        if not parts[2].isdigit() or (not facts.several_layers and parts[2] != "0") or len(parts) < 5:
            return False
        sub = parts[3]
        if sub not in m["layer"]:
            return False
        return sub not in ("self_attn", "mlp") or parts[4] in m[sub]
    if parts[1] == "fc_norm":
        return len(parts) == 4 and parts[2].isdigit()
    return len(parts) == 3


def diagnose_vllm(draft: str | Path | None, target: str | Path | None, facts: VllmFacts, *, settings=None):
    """Run the vLLM probes. Raises CheckpointError for a draft or target that cannot be read.
    `draft` None or the target's folder: `method: mtp` (the target's MTP head, `probes/mtp_head.py`),
    or an EAGLE-3 server (`settings.algorithm` EAGLE3) given no draft."""
    from specwatch.probes import mtp_head
    from specwatch.probes.checkpoint import CheckpointError, load_draft, load_target

    if draft is None and target is None:
        raise CheckpointError("give --draft (an EAGLE-3 draft folder) or --target (an MTP model served alone)")
    tgt = load_target(target) if target is not None else None
    if tgt is not None and mtp_head.same_model(None if draft is None else str(draft), tgt):
        layout = mtp_head.vllm_layout(facts, tgt.architecture, tgt.get("model_type"))
        findings = mtp_head.self_draft(tgt, layout, getattr(settings, "algorithm", None), "vllm")
        return Report(facts.version, facts.describe(), str(tgt.path), str(tgt.path), sort_findings(findings),
                      list(facts.notes) + ["the draft is the target itself (no separate draft model)"], engine="vllm")
    assert draft is not None  # no draft given: same_model holds and the target drafts (above)
    ckpt = load_draft(draft)
    findings = []
    if not facts.has_eagle3:
        findings.append(Finding("vllm_support", "no_eagle3", ERROR,
                                f"vLLM {facts.version} has no EAGLE-3 draft (Eagle3LlamaForCausalLM, vLLM >= 0.8.5)",
                                {"vllm": facts.describe()}, "Upgrade vLLM (EAGLE-3 from 0.8.5, the speculators format from 0.10.1.1)."))
    else:
        for probe in (_config_format, _weights, _aux_layers, _d2t):
            findings += probe(ckpt, tgt, facts)
    return Report(facts.version, facts.describe(), str(ckpt.path), str(tgt.path) if tgt else None,
                  sort_findings(findings), list(facts.notes), engine="vllm")


def _config_format(d, tgt, facts: VllmFacts) -> list[Finding]:
    out = []
    if d.format == "speculators":
        kind = d.config.get("speculators_model_type")
        if not facts.speculators_types:
            out.append(Finding("vllm_config_format", "speculators_unsupported", ERROR,
                               f"vLLM {facts.version} cannot read a speculators config (speculators_config, "
                               f"speculators_model_type {kind!r}): the server will not start",
                               {"speculators_model_type": kind, "vllm": facts.version},
                               "Upgrade to vLLM >= 0.10.1.1, or serve a flat config (architectures "
                               "[\"LlamaForCausalLM\"], draft_vocab_size, target_hidden_size at the top level)."))
        elif kind not in facts.speculators_types:
            out.append(Finding("vllm_config_format", "speculators_type", ERROR,
                               f"speculators_model_type {kind!r} is not one this vLLM registers",
                               {"registered": list(facts.speculators_types)}, "Upgrade vLLM or use an eagle3 export."))
    elif "draft_vocab_size" not in d.flat and not facts.draft_vocab_optional:
        out.append(Finding("vllm_config_format", "no_draft_vocab_size", ERROR,
                           f"the draft config has no draft_vocab_size, which vLLM {facts.version} reads unconditionally "
                           "(`Eagle3LlamaForCausalLM.__init__`): the server will not start",
                           {"config": str(d.path / "config.json")},
                           "Add \"draft_vocab_size\" (the lm_head rows; the vocabulary size for a full-vocabulary draft)."))
    return out


def _weights(d, tgt, facts: VllmFacts) -> list[Finding]:
    out, rules = [], facts.loader
    mapped: dict[str, str] = {}
    skipped, unknown = [], []
    for key in sorted(d.tensors):
        name = rules.map(key)
        if name is None:
            skipped.append(key)
        elif not known_param(facts, name):
            unknown.append((key, name))
        else:
            mapped[key] = name
    if unknown:
        prefixed = [k for k, _ in unknown if k.startswith("model.")]
        out.append(Finding("vllm_weights", "rejected_keys", ERROR,
                           f"{len(unknown)} checkpoint key(s) have no parameter in vLLM {facts.version}'s draft: the loader "
                           "raises at start-up (a KeyError in 0.8.5's `LlamaModel.load_weights`, `There is no module or "
                           "parameter named ...` from `AutoWeightsLoader` later)",
                           {"keys": [f"{k} -> {n}" for k, n in unknown[:8]], "count": len(unknown)},
                           ("Remove the `model.` prefix from the keys (vLLM adds it: " + code("model." + "<key>") + ")."
                            if prefixed else "Export only the draft's own modules (`midlayer.*` or `layers.N.*`, fc, norm, "
                            "lm_head, d2t), or upgrade vLLM for the modules it does not know yet.")))
    if skipped:
        out.append(Finding("vllm_weights", "skipped_keys", INFO, f"{len(skipped)} key(s) the loader ignores",
                           {"keys": skipped[:8]}))
    loaded = set(mapped.values())
    n_layers = d.num_hidden_layers if facts.several_layers else 1
    m = facts.modules
    required = [f"model.layers.{i}.{p}.weight" for i in range(n_layers) for p in LAYER_PARAMS
                if p.split(".")[0] in m["layer"]]
    required += ["model.fc.weight", "model.norm.weight", "lm_head.weight"]
    if d.flat.get("norm_before_fc") and "input_norm" in m["model"]:
        required.append("model.input_norm.weight")
    missing = [p for p in required if p not in loaded]
    if missing:
        out.append(Finding("vllm_weights", "uninitialised", ERROR,
                           f"{len(missing)} parameter(s) of the draft get no weights from the checkpoint "
                           f"({', '.join(code(m) for m in missing[:8])}{', …' if len(missing) > 8 else ''}): vLLM "
                           f"{facts.version} serves them at their initial values without an error, and the target "
                           "rejects (almost) every draft token",
                           {"missing": missing[:8], "count": len(missing)},
                           "Export the draft with these tensors (names as vLLM maps them: `midlayer.` → `layers.0.`, "
                           "q/k/v → qkv_proj, `model.` prefixed by the loader)."))
    return out


def _aux_layers(d, tgt, facts: VllmFacts) -> list[Finding]:
    out = []
    n = tgt.num_hidden_layers if tgt is not None else None
    support = None
    if tgt is not None:
        support = facts.target_support(tgt.architecture, tgt.get("model_type"), n)
        ev = {"target architecture": tgt.architecture, "class": support["class"], "vllm": facts.version}
        if support["registered"] and support["supported"] is False:
            out.append(Finding("vllm_aux_layers", "no_capture", ERROR,
                               f"vLLM {facts.version} cannot capture aux hidden states of {tgt.architecture}: it "
                               f"{support['why']}; the server refuses EAGLE-3 at start-up", ev,
                               "Use a target class vLLM supports for EAGLE-3, or a newer vLLM."))
        elif not support["registered"]:
            out.append(Finding("vllm_aux_layers", "unknown_target", WARNING, support["why"], ev))
    top = _ids(d.config.get("eagle_aux_hidden_state_layer_ids"))
    nested = _ids(d.eagle_config().get("eagle_aux_hidden_state_layer_ids"))
    trained = top or nested
    keys = facts.aux_config_keys
    top_read = "top" in keys and (d.format != "speculators" or facts.speculators_copies_layer_ids)
    read = top if top and top_read else nested if nested and "eagle_config" in keys else None
    default = support["default_layers"] if support else None
    captured = tuple(read) if read else default
    ev = {"draft layer ids": trained, "captured": list(captured) if captured else "default (2, N//2, N-3)",
          "keys vLLM reads": list(keys) or "none (always the default)", "vllm": facts.version}
    if trained and captured is not None and tuple(trained) != tuple(captured):
        fix = ("Move the ids to the top level of the draft's config.json: "
               + code(f'"eagle_aux_hidden_state_layer_ids": {list(trained)}') + "." if "top" in keys else
               f"vLLM {facts.version} never reads the draft's layer ids: upgrade to vLLM >= 0.12 (top-level "
               "`eagle_aux_hidden_state_layer_ids`), or retrain the draft on the default layers.")
        out.append(Finding("vllm_aux_layers", "layers_differ", ERROR,
                           f"the draft was trained on target layers {list(trained)} but vLLM captures "
                           f"{list(captured)}: its fc gets other hidden states", ev, fix))
    elif trained and captured is None:
        out.append(Finding("vllm_aux_layers", "layers_unchecked", INFO,
                           "give --target to compare the draft's layer ids with what vLLM captures", ev))
    elif not trained:
        # the engine guesses: right only for a draft trained on the same default
        picks = list(captured) if captured else "(2, N//2, N-3)"
        out.append(Finding("vllm_aux_layers", "default_layers", WARNING,
                           f"the draft names no layer ids: vLLM {facts.version} guesses them and captures {picks}", ev,
                           "Write the layers the draft was trained on into its config.json: "
                           + code(f'"eagle_aux_hidden_state_layer_ids": {picks}') + " for the ones vLLM picks now."
                           if captured and "top" in keys else
                           "Check that the draft was trained on the layers vLLM picks (" + str(picks) + ")."))
    return out


def _d2t(d, tgt, facts: VllmFacts) -> list[Finding]:
    out: list[Finding] = []
    V = (tgt.vocab_size if tgt is not None else None) or d.vocab_size
    Vd = d.draft_vocab_size or V
    key = next((k for k in d.tensors if "d2t" in k), None)
    if not V:
        return out
    if key is None:
        if Vd < V:
            out.append(Finding("vllm_d2t", "missing_map", ERROR,
                               f"draft vocab {Vd} < target vocab {V} but the checkpoint has no d2t: vLLM keeps the "
                               "zero map, so draft token i is read as target token i", {"draft_vocab_size": Vd, "vocab": V},
                               "Export d2t with the draft, as offsets: " + code("d2t[i] = target_id[i] - i")
                               + " (from a t2d mask: " + code("d2t = nonzero(t2d) - arange(draft_vocab_size)") + ")."))
        return out
    if Vd == V and facts.d2t_only_smaller_vocab:
        out.append(Finding("vllm_d2t", "map_without_parameter", ERROR,
                           f"a full-vocabulary draft (draft_vocab_size = vocab = {V}) with a d2t: vLLM {facts.version} "
                           "builds no draft_id_to_target_id then, and its loader has no parameter for it",
                           {"d2t": key}, "Remove d2t and t2d from the checkpoint (they map every id to itself)."))
        return out
    try:
        import numpy as np

        d2t = np.asarray(d.values(key)).astype(np.int64).ravel()
    except Exception as e:  # an unreadable tensor: the weights probes say more
        return [Finding("vllm_d2t", "unreadable", WARNING, f"d2t could not be read: {e}", {"d2t": key})]
    if len(d2t) != Vd:
        out.append(Finding("vllm_d2t", "length", ERROR, f"d2t has {len(d2t)} entries, draft_vocab_size is {Vd}",
                           {"d2t": len(d2t), "draft_vocab_size": Vd}, "Re-export d2t for this draft head."))
        return out
    targets = d2t + np.arange(len(d2t))
    ok = bool(((targets >= 0) & (targets < V)).all() and (np.diff(targets) > 0).all())
    if facts.d2t_offsets and not ok:
        absolute = bool(((d2t >= 0) & (d2t < V)).all() and (np.diff(d2t) > 0).all())
        out.append(Finding("vllm_d2t", "absolute_ids" if absolute else "bad_map", ERROR,
                           "vLLM reads d2t as offsets (target = i + d2t[i]) but this d2t "
                           + ("holds absolute target ids" if absolute else "sends draft ids outside the target vocabulary"),
                           {"d2t[:8]": d2t[:8].tolist(), "vocab": V},
                           "Re-encode it as offsets: " + code("d2t = d2t - arange(len(d2t))")
                           + " (vLLM adds the draft id back)." if absolute else
                           "Re-export d2t from the trainer's vocabulary mapping."))
    return out
