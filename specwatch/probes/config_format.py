"""config_format: a draft config the installed SGLang cannot read, or reads differently.

Checks (facts from `sglang/srt/models/llama_eagle3.py` 0.5.11 and 0.5.23, `configs/model_config.py`
0.5.23; speculators 0.9.0 `models/eagle3/config.py`, SpecForge 0.2.0 `export/to_sglang.py`):
- `config.json` missing or not JSON;
- speculators format (nested `transformer_layer_config`): no SGLang version reads it
  (no `speculators_model_type` anywhere in the package) → the server cannot start;
- `architectures[0]` not an EAGLE-3 draft class of the installed SGLang (SafeAILab's
  `LlamaForCausalLM`, speculators' `Eagle3DraftModel`), with no draft rewrite rule for it;
- more than one decoder layer where the installed class refuses it (≤0.5.11);
- `tie_word_embeddings: true` with a trained `lm_head.weight` (the key has no parameter);
- `target_hidden_size: null` (llama_eagle3.py uses `hasattr`, so None becomes the fc width);
- `draft_vocab_size` null while `lm_head.weight` has fewer rows than `vocab_size`;
- `norm_before_residual` (never read by SGLang), `norm_before_fc`, `fc_norm`/`use_aux_norm`,
  `norm_output` set while the installed draft class does not read them;
- `norm_output` in a SpecForge export (≤0.2.0 meant "norm before lm_head", PR #879);
- speculators' sliding-window layers: SGLang's EAGLE-3 draft ignores `layer_types` and honours
  only `--speculative-draft-window-size`.
"""

from __future__ import annotations

from specwatch.probes.base import ERROR, INFO, WARNING, Finding, ProbeContext, fix_checkpoint_command
from specwatch.probes.draft_module import draft_class

PROBE_ID = "config_format"
# First versions whose llama_eagle3.py reads the flag (read in the 0.5.11/0.5.12/0.5.16/0.5.17 wheels).
FLAG_SINCE = {"norm_before_fc": "0.5.17", "fc_norm": "0.5.12", "use_aux_norm": "0.5.12", "norm_output": "0.5.12"}


def run(ctx: ProbeContext) -> list[Finding]:
    d, facts = ctx.draft, ctx.sglang
    out: list[Finding] = []

    def add(kind, severity, title, evidence, fix):
        out.append(Finding(PROBE_ID, kind, severity, title, evidence, fix))

    version = facts.version or "?"
    fix_cmd = fix_checkpoint_command(d.path)
    if d.config_problem:
        add("unreadable_config", ERROR, f"draft config unreadable: {d.config_problem}",
            {"path": str(d.path / "config.json")}, "Write the draft's config.json (flat Llama config with "
            '"architectures": ["LlamaForCausalLMEagle3"] and draft_vocab_size).')
        return out
    cfg, flat = d.config, d.flat
    arch = (cfg.get("architectures") or [None])[0] if isinstance(cfg.get("architectures"), list) else None
    classes = facts.eagle3_draft_classes()
    rewritten = facts.draft_arch_rewrites().get(arch or "")

    if d.format == "speculators" and not facts.reads_speculators_config():
        add("speculators_format", ERROR,
            f"speculators-format config: SGLang {version} cannot read it (the server will not start)",
            {"format": "speculators", "speculators_model_type": cfg.get("speculators_model_type"),
             "architectures": cfg.get("architectures"), "sglang_version": version,
             "hidden_size (top level)": cfg.get("hidden_size"),
             "aux layer ids (top level)": cfg.get("eagle_aux_hidden_state_layer_ids")},
            f"Convert it: {fix_cmd} writes a flat SGLang config "
            '("architectures": ["LlamaForCausalLMEagle3"], the transformer_layer_config fields, '
            "eagle_config.eagle_aux_hidden_state_layer_ids converted, norm flags) and SGLang key names.")
    elif arch not in classes and (rewritten or "") not in classes:
        add("architecture", ERROR,
            f"architectures[0] is {arch!r}: SGLang {version} builds EAGLE-3 drafts only as {', '.join(classes)}",
            {"architectures": cfg.get("architectures"), "eagle3_draft_classes": classes, "format": d.format},
            'Set "architectures": ["LlamaForCausalLMEagle3"] in config.json '
            f"(or run {fix_cmd}).")

    if d.format != "speculators" and "target_hidden_size" in cfg and cfg["target_hidden_size"] is None:
        add("target_hidden_size_null", ERROR, "target_hidden_size is null: SGLang takes any present value as the "
            "target width and fails to build fc", {"target_hidden_size": None},
            'Remove "target_hidden_size" from config.json (or set it to the target hidden size).')
    rules = facts.draft_rules(draft_class(ctx))
    n_layers = d.num_hidden_layers
    if rules is not None and rules.single_layer_only and n_layers != 1:
        add("layer_count", ERROR, f"{n_layers} decoder layers: {rules.cls} in SGLang {version} raises "
            "'EAGLE3 currently only supports 1 layer' at startup",
            {"num_hidden_layers": n_layers, "sglang_version": version},
            "Upgrade SGLang to >= 0.5.12 (multi-layer EAGLE-3 drafts), or use a 1-layer draft.")

    if flat.get("tie_word_embeddings") and "lm_head.weight" in d.tensors:
        add("tied_lm_head", ERROR, "tie_word_embeddings is true but the checkpoint has a trained lm_head.weight: "
            "SGLang makes lm_head the embedding and drops the trained head",
            {"tie_word_embeddings": True, "lm_head.weight": list(d.tensors["lm_head.weight"].shape)},
            'Set "tie_word_embeddings": false in config.json.')
    head = d.tensors.get("lm_head.weight")
    if (flat.get("draft_vocab_size") is None and head is not None and d.vocab_size
            and head.shape and head.shape[0] != d.vocab_size):
        add("draft_vocab_null", ERROR, f"draft_vocab_size is null but lm_head.weight has {head.shape[0]} rows: "
            f"SGLang builds a {d.vocab_size}-row head and fails to load it",
            {"draft_vocab_size": None, "lm_head.weight": list(head.shape), "vocab_size": d.vocab_size},
            f'Set "draft_vocab_size": {head.shape[0]} in config.json.')

    keys = rules.config_keys if rules is not None else frozenset()
    if flat.get("norm_before_residual"):
        add("norm_before_residual", ERROR, "norm_before_residual is true: no SGLang version implements it "
            "(the first layer's residual differs from training)",
            {"norm_before_residual": True, "read_by_sglang": "norm_before_residual" in keys},
            "Retrain with norm_before_residual false for SGLang, or serve this draft with vLLM (which honours it).")
    ec = d.eagle_config()
    for flag in ("norm_before_fc", "fc_norm", "use_aux_norm", "norm_output"):
        on = ec.get(flag, flat.get(flag)) if flag == "norm_before_fc" else flat.get(flag)
        if on and rules is not None and flag not in keys:
            add("unsupported_flag", ERROR, f"{flag} is true but {rules.cls} in SGLang {version} ignores it",
                {"flag": flag, "sglang_version": version, "supported_since": FLAG_SINCE[flag]},
                f"Upgrade SGLang to >= {FLAG_SINCE[flag]}, or retrain without {flag}.")
    if d.format == "sglang" and flat.get("norm_output"):
        add("norm_output_semantics", WARNING, "norm_output is true in a flat EAGLE-3 config: SpecForge <= 0.2.0 "
            "meant 'norm before lm_head', SGLang reads 'feed the normed state to the next step'",
            {"norm_output": True}, "If the draft was trained with SpecForge <= 0.2.0, set norm_output false.")

    layer_types = flat.get("layer_types") or []
    window = flat.get("sliding_window")
    if any(t == "sliding_attention" for t in layer_types) and window and ctx.settings.draft_window_size != window:
        has_flag = facts.has_draft_window_flag()
        add("sliding_window", WARNING, f"draft trained with a {window}-token sliding window; SGLang's EAGLE-3 "
            "draft ignores layer_types and attends to the full context",
            {"layer_types": layer_types, "sliding_window": window,
             "speculative_draft_window_size": ctx.settings.draft_window_size},
            f"Start SGLang with --speculative-draft-window-size {window}." if has_flag else
            f"SGLang {version} has no --speculative-draft-window-size: upgrade (0.5.23 has it).")
    if not out:
        add("ok", INFO, f"{d.format} config, {arch}: readable by SGLang {version}",
            {"format": d.format, "architectures": cfg.get("architectures")}, "")
    return out
