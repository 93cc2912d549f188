"""The draft module the installed SGLang builds from a draft config, and where each key goes.

Parameter layout of `LlamaForCausalLMEagle3` (llama_eagle3.py, llama.py @0.5.11 and @0.5.23;
PyTorch `[out, in]` shapes; H hidden, Ht target hidden, k aux states, nh/nkv/hd heads, I MLP,
V vocab, Vd draft vocab). `<L>` is `model.midlayer` (≤0.5.11) or `model.layers.{i}` (0.5.12+):

| parameter | shape | when |
|---|---|---|
| `model.embed_tokens.weight` | [V, H] | always; replaced by the target's when H == Ht |
| `model.fc.weight` / `.bias` | [H, k·Ht] / [H] | bias when config `bias` |
| `model.input_norm.weight` | [k·Ht] | `norm_before_fc` (0.5.17+) |
| `model.fc_norm.{j}.weight` | [Ht] | `fc_norm` / `use_aux_norm` (0.5.12+) |
| `<L>.self_attn.qkv_proj.weight` | [(nh+2·nkv)·hd, 2H] (H for layers ≥ 1) | shards q/k/v; built with bias=False |
| `<L>.self_attn.o_proj.weight` / `.bias` | [H, nh·hd] / [H] | bias when `attention_bias` or `bias` |
| `<L>.mlp.gate_up_proj.weight` | [2I, H] | shards gate (0) / up (1) |
| `<L>.mlp.down_proj.weight` | [H, I] | |
| `<L>.{input_layernorm,post_attention_layernorm,hidden_norm}.weight` | [H] | |
| `model.norm.weight` | [H] | |
| `lm_head.weight` | [Vd, H] | not when `tie_word_embeddings`; from the target when `draft_vocab_size` is null |

The version-dependent parts (container name, renames, stacked mapping, k, optional norms) come
from `DraftRules`, read from the installed source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeGuard

from specwatch.probes.base import ProbeContext
from specwatch.probes.checkpoint import DraftCheckpoint, TensorInfo
from specwatch.engines.sglang.source import DraftRules


@dataclass(frozen=True)
class Param:
    """One parameter: shape, the shards that fill it (shard id → shape), and why the target fills
    it instead of the checkpoint (None: only a checkpoint key can)."""

    name: str
    shape: tuple[int, ...]
    shards: dict = field(default_factory=dict)
    from_target: str | None = None


@dataclass
class KeyMapping:
    """Where every checkpoint key goes under the installed loader.

    loaded: key → (parameter, shard id or None). dropped: key → the name the loader looked up and
    did not find (silently skipped). skipped: key → why (`d2t` builds hot token ids, `t2d` is
    ignored). unfilled: parameters no key fills and the target does not replace (left at init).
    from_target: parameter → why the target's tensor is used. shape_errors: (key, parameter,
    checkpoint shape, expected shape) — SGLang's weight loader fails on these at startup.
    """

    params: dict[str, Param]
    loaded: dict[str, tuple[str, object]] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    unfilled: list[str] = field(default_factory=list)
    from_target: dict[str, str] = field(default_factory=dict)
    shape_errors: list[tuple[str, str, tuple, tuple]] = field(default_factory=list)


def aux_count(rules: DraftRules, flat: dict) -> int:
    """k as SGLang computes the fc input: fixed (3, ≤0.5.11) or `num_aux_hidden_states` →
    len(`eagle_config.eagle_aux_hidden_state_layer_ids`) → 3 (llama_eagle3.py@0.5.23)."""
    if rules.fc_aux.startswith("fixed:"):
        return int(rules.fc_aux.split(":")[1])
    n = flat.get("num_aux_hidden_states")
    if isinstance(n, int) and n > 0:
        return n
    ec = flat.get("eagle_config")
    ids = (ec if isinstance(ec, dict) else {}).get("eagle_aux_hidden_state_layer_ids")
    return len(ids) if isinstance(ids, list) and ids else 3


def decoder_prefixes(rules: DraftRules, n_layers: int) -> list[str]:
    return ["model.midlayer"] if rules.decoder == "midlayer" else [f"model.layers.{i}" for i in range(n_layers)]


def _size(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and x > 0


def build_params(rules: DraftRules, draft: DraftCheckpoint) -> dict[str, Param]:
    """The parameters SGLang builds for this draft config (table above). Missing sizes → {}."""
    c = draft.flat
    H, Ht, V = draft.hidden_size, draft.target_hidden_size, draft.vocab_size
    nh, hd, inter = c.get("num_attention_heads"), draft.head_dim, c.get("intermediate_size")
    nkv = c.get("num_key_value_heads") or nh
    if not (_size(H) and _size(Ht) and _size(V) and _size(nh) and _size(nkv) and _size(hd) and _size(inter)):
        return {}
    k = aux_count(rules, c)
    ec = c.get("eagle_config")
    ec = ec if isinstance(ec, dict) else {}
    p: dict[str, Param] = {}

    def add(name, shape, shards=None, from_target=None):
        p[name] = Param(name, tuple(shape), shards or {}, from_target)

    differs = c.get("target_hidden_size") is not None and c.get("target_hidden_size") != H
    add("model.embed_tokens.weight", (V, H),
        from_target=None if differs else "SGLang replaces the draft embedding with the target's (H == Ht)")
    add("model.fc.weight", (H, k * Ht))
    if c.get("bias"):
        add("model.fc.bias", (H,))
    if rules.input_norm and ec.get("norm_before_fc", c.get("norm_before_fc", False)):
        add("model.input_norm.weight", (k * Ht,))
    if rules.fc_norm and (c.get("fc_norm") or c.get("use_aux_norm")):
        for j in range(k):
            add(f"model.fc_norm.{j}.weight", (Ht,))
    o_bias = bool(c.get("attention_bias") or c.get("bias"))
    for i, L in enumerate(decoder_prefixes(rules, draft.num_hidden_layers)):
        width = 2 * H if i == 0 or not rules.input_layer_only_2h else H
        add(f"{L}.self_attn.qkv_proj.weight", ((nh + 2 * nkv) * hd, width),
            {"q": (nh * hd, width), "k": (nkv * hd, width), "v": (nkv * hd, width)})
        add(f"{L}.self_attn.o_proj.weight", (H, nh * hd))
        if o_bias:
            add(f"{L}.self_attn.o_proj.bias", (H,))
        add(f"{L}.mlp.gate_up_proj.weight", (2 * inter, H), {0: (inter, H), 1: (inter, H)})
        add(f"{L}.mlp.down_proj.weight", (H, inter))
        for norm in ("input_layernorm", "post_attention_layernorm", "hidden_norm"):
            add(f"{L}.{norm}.weight", (H,))
    add("model.norm.weight", (H,))
    if not c.get("tie_word_embeddings"):
        vd = draft.draft_vocab_size
        add("lm_head.weight", (vd or V, H),
            from_target=None if vd is not None else "draft_vocab_size is null: SGLang uses the target's lm_head")
    return p


def map_keys(ctx: ProbeContext) -> KeyMapping | None:
    """Run every checkpoint key through the installed loader's rules (cached per context).
    None when the draft class is not a modelled Llama EAGLE-3 draft or the config lacks sizes."""
    if "key_mapping" in ctx.cache:
        return ctx.cache["key_mapping"]
    rules = ctx.sglang.draft_rules(draft_class(ctx))
    params = build_params(rules, ctx.draft) if rules is not None and rules.modelled else {}
    m = map_with(rules, params, ctx.draft.tensors) if rules is not None and params else None
    ctx.cache["key_mapping"] = m
    return m


def draft_class(ctx: ProbeContext) -> str:
    """The EAGLE-3 class SGLang would build: `architectures[0]` when it is one, else the Llama
    EAGLE-3 class (what a converted config names)."""
    arch = (ctx.draft.config.get("architectures") or [None])[0] if isinstance(ctx.draft.config.get("architectures"), list) else None
    return arch if arch in ctx.sglang.eagle3_draft_classes() else "LlamaForCausalLMEagle3"


def map_with(rules: DraftRules, params: dict[str, Param], tensors: dict[str, TensorInfo]) -> KeyMapping:
    """The loop of `LlamaForCausalLMEagle3.load_weights` (llama_eagle3.py@0.5.23), over the
    checkpoint's tensor headers (name → TensorInfo)."""
    m = KeyMapping(params)
    shards_seen: dict[str, set] = {}
    for key, info in tensors.items():
        name = key
        for legacy, new in rules.renames:
            if legacy in name:
                name = name.replace(legacy, new)
        skip = next((s for s in rules.skips if s in name), None)
        if skip is not None:
            m.skipped[key] = skip
            continue
        shard_id = None
        for param_name, shard_name, sid in rules.stacked:
            if shard_name not in name:
                continue
            name = name.replace(shard_name, param_name)
            target = rules.prefix + name if name not in params else name
            shard_id = sid
            break
        else:
            target = name if name in params else rules.prefix + name
        if target not in params:
            m.dropped[key] = target
            continue
        m.loaded[key] = (target, shard_id)
        param = params[target]
        want = param.shards.get(shard_id, param.shape) if shard_id is not None else param.shape
        if tuple(info.shape) != tuple(want):
            m.shape_errors.append((key, target, tuple(info.shape), tuple(want)))
        shards_seen.setdefault(target, set()).add(shard_id)
    for name, param in params.items():
        seen = shards_seen.get(name, set())
        complete = set(param.shards) <= seen if param.shards else bool(seen)
        if complete:
            continue
        if param.from_target:
            m.from_target[name] = param.from_target
        else:
            m.unfilled.append(name)
    return m
