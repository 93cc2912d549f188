"""`specwatch fix-checkpoint`: write a copy of a draft that the installed SGLang loads correctly.

What it changes (each only when needed, each listed in the result):
- config: a speculators config becomes a flat SGLang config — `transformer_layer_config` fields
  at the top level, `architectures: ["LlamaForCausalLMEagle3"]`, the speculators-only keys
  removed, `target_hidden_size: null` removed (SGLang would build fc from None), and the
  top-level aux ids (positions) written as `eagle_config.eagle_aux_hidden_state_layer_ids` in
  SGLang's convention for the target (ids − 1 on +1 targets); a SafeAILab `LlamaForCausalLM`
  config gets the EAGLE-3 architecture; `tie_word_embeddings` off when a trained head exists;
- keys: a single-layer draft's `layers.0.*` become `midlayer.*` (loaded by every SGLang version:
  ≤0.5.11 as is, ≥0.5.12 through its legacy rename);
- d2t: absolute ids re-encoded as offsets (d2t − arange(Vd)); an all-zero or missing d2t rebuilt
  from t2d when t2d marks exactly Vd ids that are not its initial/identity pattern.
What it cannot change (norm_before_residual, a flag the installed SGLang ignores) stays and is
reported by the probes run on the output. The input directory is only read, and only what resolves
inside it (`checkpoint.inside`): a file linking out of it is neither read nor copied. The output files
keep the input files' permission bits (config.json's, the weights').
"""

from __future__ import annotations

import json
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from specwatch.fixes.safetensors_io import from_numpy, write_safetensors
from specwatch.probes.base import ProbeContext, Report, ServerSettings
from specwatch.probes.checkpoint import (OUTSIDE, CheckpointError, detect_format, flatten_config, inside, load_draft,
                                         load_target)

EAGLE3_ARCH = "LlamaForCausalLMEagle3"
IDS_KEY = "eagle_aux_hidden_state_layer_ids"
# Top-level speculators keys SGLang has no use for (speculators/models/eagle3/config.py 0.9.0).
SPECULATORS_ONLY = ("speculators_model_type", "speculators_version", "speculators_config", "embed_requires_grad",
                    "transformer_layer_config")


class FixError(Exception):
    """The copy cannot be written (bad output folder, unreadable input)."""


@dataclass
class FixResult:
    out: Path
    actions: list[str] = field(default_factory=list)
    report: Report | None = None  # the diagnosis of the output (fix_checkpoint sets it)


def _check_out(draft: Path, out: Path) -> None:
    d, o = draft.resolve(), out.resolve()
    if o == d or d in o.parents or o in d.parents:
        raise FixError(f"{out}: the output must be a new folder outside the draft (the input is never modified)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FixError(f"{out}: exists and is not empty; give a new folder")


def convert_config(config: dict, ids: list[int] | None, actions: list[str]) -> dict:
    """The flat SGLang config for `config`; `ids`: eagle_config ids to write (None: leave)."""
    fmt = detect_format(config)
    if fmt == "speculators":
        flat = flatten_config(config)
        for k in SPECULATORS_ONLY + (IDS_KEY,):
            flat.pop(k, None)
        flat["architectures"] = [EAGLE3_ARCH]
        actions.append("config: speculators format → flat SGLang config (transformer_layer_config fields at the top "
                       f'level, "architectures": ["{EAGLE3_ARCH}"])')
    else:
        flat = dict(config)
        if fmt != "sglang":
            flat["architectures"] = [EAGLE3_ARCH]
            actions.append(f'config: "architectures": {config.get("architectures")} → ["{EAGLE3_ARCH}"]')
    if "target_hidden_size" in flat and flat["target_hidden_size"] is None:
        del flat["target_hidden_size"]
        actions.append("config: removed target_hidden_size: null (SGLang reads any present value as the width)")
    if ids is not None:
        ec = dict(flat.get("eagle_config") or {})
        if ec.get(IDS_KEY) != ids:
            ec[IDS_KEY] = ids
            flat["eagle_config"] = ec
            actions.append(f"config: eagle_config.{IDS_KEY} = {ids} (SGLang's convention for this target)")
    return flat


def _mode(src: Path) -> int:
    """The permission bits of an input file, for its output (a server run by another user reads it)."""
    return stat.S_IMODE(src.stat().st_mode)


def fix_checkpoint(draft: str | Path, out: str | Path, *, facts, target: str | Path | None = None,
                   settings: ServerSettings | None = None) -> FixResult:
    """Write the converted copy of `draft` into `out` and diagnose it. Raises FixError or
    CheckpointError for a bad input or output folder."""
    import numpy as np

    from specwatch.diagnosis import diagnose
    from specwatch.probes import d2t_encoding
    from specwatch.probes.layer_ids import family_rule, ids_for
    from specwatch.probes.weight_values import initial_value

    draft, out = Path(draft), Path(out)
    ckpt = load_draft(draft)
    _check_out(draft, out)
    if ckpt.config_problem or ckpt.store.problems or not ckpt.tensors:
        raise FixError(f"{draft}: cannot convert: {ckpt.config_problem or '; '.join(ckpt.store.problems) or 'no weights'}")
    tgt = load_target(target) if target is not None else None
    if tgt is not None:
        from specwatch.probes.mtp_head import same_model

        if same_model(str(draft), tgt):  # an MTP/NEXTN server, or a missing draft: no EAGLE-3 draft to convert
            raise FixError(f"{draft}: is the target model itself, not an EAGLE-3 draft: nothing to convert "
                           "(`specwatch diagnose --target` checks its MTP head; an EAGLE-3 server needs "
                           "--speculative-draft-model-path)")
    ctx = ProbeContext(ckpt, tgt, facts, settings or ServerSettings())
    result = FixResult(out)
    actions = result.actions

    ids = None  # explicit SGLang ids for the positions the draft was trained on
    top = ckpt.config.get(IDS_KEY)
    if ckpt.format == "speculators" and isinstance(top, list):
        n = tgt.num_hidden_layers if tgt is not None else None
        if tgt is not None and n and tgt.architecture:
            ids = ids_for(family_rule(ctx), sorted(set(top)), n)
        else:
            ids = [p - 1 for p in sorted(set(top))]
            actions.append("note: no --target given: aux ids converted for a +1 target family (Llama, Qwen, ...)")
    config = convert_config(ckpt.config, ids, actions)
    if config.get("tie_word_embeddings") and "lm_head.weight" in ckpt.tensors:
        config["tie_word_embeddings"] = False
        actions.append("config: tie_word_embeddings → false (the checkpoint has a trained lm_head)")
    head = ckpt.tensors.get("lm_head.weight")
    if config.get("draft_vocab_size") is None and head is not None and head.shape[0] != config.get("vocab_size"):
        config["draft_vocab_size"] = head.shape[0]
        actions.append(f"config: draft_vocab_size = {head.shape[0]} (lm_head rows)")

    rename = {}
    if ckpt.num_hidden_layers == 1 and any(k.startswith("layers.0.") for k in ckpt.tensors):
        rename["layers.0."] = "midlayer."
        actions.append("keys: layers.0.* → midlayer.* (loaded by every SGLang version)")
    tensors = {}
    for name in ckpt.tensors:
        new = next((b + name[len(a):] for a, b in rename.items() if name.startswith(a)), name)
        tensors[new] = ckpt.store.raw(name)

    kinds = {f.kind for f in d2t_encoding.run(ctx)}
    dk = next((k for k in ckpt.tensors if "d2t" in k), "d2t")
    tk = next((k for k in ckpt.tensors if "t2d" in k), None)
    vd = ckpt.draft_vocab_size
    if "absolute_ids" in kinds:
        d2t = np.asarray(ckpt.values(dk), dtype=np.int64).reshape(-1)
        tensors[dk] = from_numpy(d2t - np.arange(d2t.size, dtype=np.int64))
        actions.append("d2t: absolute target ids re-encoded as offsets (d2t - arange(Vd))")
    elif kinds & {"zero_map", "missing_map"} and tk is not None:
        t2d = np.asarray(ckpt.values(tk)).reshape(-1).astype(bool)
        hot = np.flatnonzero(t2d).astype(np.int64)
        if vd is not None and hot.size == vd and initial_value(t2d) is None:  # an identity t2d is no mapping
            tensors[dk] = from_numpy(hot - np.arange(hot.size, dtype=np.int64))
            actions.append(f"d2t: rebuilt from t2d ({hot.size} hot ids) as offsets")

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "config.json").chmod(_mode(draft / "config.json"))
    weights = draft / next(iter(ckpt.tensors.values())).file
    write_safetensors(out / "model.safetensors", tensors, {"format": "pt"}, mode=_mode(weights))
    for extra in sorted(draft.iterdir()):  # tokenizer files, README, generation config
        if extra.is_file() and extra.name != "config.json" and not extra.name.endswith(
                (".safetensors", ".bin", ".safetensors.index.json", ".pt", ".pth")):
            if not inside(ckpt.store.bounds, extra):  # a link out of the folder: its target is not the draft's
                actions.append(f"skipped {extra.name}: a link that resolves {OUTSIDE} (not copied; copy the "
                               "file itself into the draft folder if the output needs it)")
                continue
            shutil.copy2(extra, out / extra.name)
    actions.append(f"wrote {out}/config.json and {out}/model.safetensors ({len(tensors)} tensors)")
    result.report = diagnose(out, tgt.path if tgt is not None else None, facts=facts, settings=settings)
    return result


__all__ = ["fix_checkpoint", "FixError", "FixResult", "CheckpointError"]
