"""d2t_encoding: the draft-to-target vocabulary map, read as SGLang reads it.

SGLang (every version read) turns any tensor named `*d2t*` into `hot_token_id = d2t + arange(Vd)`:
d2t holds offsets, target id = i + d2t[i]; `t2d` is ignored; no d2t → draft id i is target id i
(`load_weights` in models/llama_eagle3.py 0.5.11 and 0.5.23; `hot_token_id[topk_index]` in
speculative/eagle_worker_v2.py 0.5.23). Trainers write offsets too (speculators 0.9.0
`train/vocab_mapping.py`, SpecForge 0.2.0 `data/preprocessing.py`). Checks: d2t present when Vd < V;
integer dtype; `len(d2t) == Vd == lm_head rows`; i + d2t[i] inside [0, V), strictly increasing; the
known wrong encodings — absolute ids (d2t itself increasing, = nonzero(t2d)), `arange` defaults
(target 2·i), all zeros with Vd < V (identity onto the first Vd ids); t2d of length V with Vd
entries, agreeing with d2t. With the target's lm_head at hand, a frozen (speculators) draft head
must satisfy lm_head[i] == target_lm_head[i + d2t[i]]: checked on a sample of rows.

A pair never filled by a mapping is consistent and still wrong: the trainers' constructors
leave d2t all zeros and t2d all False (speculators `_init_vocab`, src/speculators/model.py@v0.7.0;
SafeAILab/EAGLE eagle/model/cnets.py@cb7e084) or all True (SpecForge
specforge/modeling/draft/llama3_eagle.py@a6b6b02), and an identity fill marks t2d's first Vd
ids. With Vd < V each is an error, whatever t2d holds. Nothing is judged when the weights were
not all read (`not_checked`): a missing d2t may sit in the unreadable file.
"""

from __future__ import annotations

from specwatch.probes.base import ERROR, INFO, WARNING, Finding, ProbeContext, fix_checkpoint_command, weights_not_checked
from specwatch.probes.weight_values import initial_value

PROBE_ID = "d2t_encoding"
SAMPLE_ROWS = 32


def _key(tensors: dict, word: str) -> str | None:
    return next((k for k in tensors if word in k), None)


def run(ctx: ProbeContext) -> list[Finding]:
    import numpy as np

    d = ctx.draft
    out: list[Finding] = []

    def add(kind, severity, title, evidence, fix=""):
        out.append(Finding(PROBE_ID, kind, severity, title, evidence, fix))

    V = (ctx.target.vocab_size if ctx.target is not None else None) or d.vocab_size
    dk, tk = _key(d.tensors, "d2t"), _key(d.tensors, "t2d")
    fix_cmd = fix_checkpoint_command(d.path)
    if not V:
        return out
    Vd = d.draft_vocab_size or V
    skipped = weights_not_checked(PROBE_ID, ctx, "the vocab map (d2t/t2d)")
    if skipped is not None:
        return [skipped]
    if dk is None:
        if Vd < V:
            add("missing_map", ERROR, f"draft vocab {Vd} < target vocab {V} but the checkpoint has no d2t: "
                f"draft token i is read as target token i", {"draft_vocab_size": Vd, "target vocab": V,
                                                              "t2d present": tk is not None},
                "Export the d2t buffer with the draft (the trainer's vocab mapping); "
                + (f"{fix_cmd} builds it from t2d." if tk else "it cannot be rebuilt without t2d."))
        return out
    info = d.tensors[dk]
    if info.dtype not in ("I64", "I32"):
        add("dtype", ERROR, f"{dk} is {info.dtype}; SGLang adds it to arange(Vd) and indexes with the result",
            {"dtype": info.dtype}, "Store d2t as int64 offsets.")
        return out
    d2t = np.asarray(d.values(dk), dtype=np.int64).reshape(-1)
    ev = {"d2t": dk, "len(d2t)": int(d2t.size), "draft_vocab_size": Vd, "target vocab": V,
          "d2t[:5]": d2t[:5].tolist()}
    if d2t.size != Vd:
        add("length", ERROR, f"len(d2t) {d2t.size} != draft_vocab_size {Vd}", ev,
            f'Set "draft_vocab_size": {d2t.size} if the head has that many rows, else re-export d2t.')
    head = d.tensors.get("lm_head.weight")
    if head is not None and head.shape and head.shape[0] != d2t.size:
        add("lm_head_rows", ERROR, f"lm_head.weight has {head.shape[0]} rows, d2t {d2t.size}", ev | {"lm_head.weight": list(head.shape)},
            "Export lm_head and d2t from the same vocab mapping.")
    t2d = np.asarray(d.values(tk)).reshape(-1).astype(bool) if tk else None
    hot = np.flatnonzero(t2d) if t2d is not None else None
    t2d_init = initial_value(t2d) if t2d is not None else None  # all False / all True / identity mask
    idx = np.arange(d2t.size, dtype=np.int64)
    targets = idx + d2t
    offsets_ok = bool(targets.size and targets.min() >= 0 and targets.max() < V and np.all(np.diff(targets) > 0))
    absolute_ok = bool(d2t.size and d2t.min() >= 0 and d2t.max() < V and np.all(np.diff(d2t) > 0))
    ev["i + d2t[i] (first 5)"] = targets[:5].tolist()
    if t2d is not None:  # and so hot
        ev |= {"len(t2d)": int(t2d.size), "t2d.sum()": int(t2d.sum())}

    if d2t.size > 1 and np.array_equal(d2t, idx):
        add("arange_default", ERROR, "d2t == arange(Vd): an absolute identity map read as offsets sends draft "
            "token i to target token 2·i", ev, "Export the real mapping (d2t[i] = hot_id[i] - i) from the trainer.")
    elif not np.any(d2t) and Vd < V:
        rebuild = hot is not None and hot.size == Vd and t2d_init is None  # t2d holds a real mapping
        both = "" if rebuild else (f"; t2d is {t2d_init}, so neither buffer was filled" if t2d_init else
                                   "; no t2d to rebuild it from" if t2d is None else "")
        add("zero_map", ERROR, f"d2t is all zeros with Vd {Vd} < V {V}: every draft token maps to the first {Vd} "
            f"target ids (the trainer's initial value, no mapping exported){both}",
            ev | {"initial values": {"d2t": "all zeros", "t2d": t2d_init or ("absent" if t2d is None else "a mapping")}},
            f"{fix_cmd} rebuilds d2t from t2d." if rebuild else
            "Export the vocab mapping (d2t/t2d) the draft was trained with (the trainer's token-frequency mapping).")
    elif (hot is not None and d2t.size > 1 and np.array_equal(d2t, hot)) or (not offsets_ok and absolute_ok and hot is None):
        add("absolute_ids", ERROR, "d2t holds absolute target ids, SGLang reads offsets: draft token i lands on "
            "target id d2t[i] + i", ev | {"agrees with t2d": hot is not None},
            f"Re-encode as offsets (d2t - arange(Vd)): {fix_cmd}.")
    elif not offsets_ok:
        bad = int(np.sum((targets < 0) | (targets >= V)))
        add("out_of_range", ERROR, f"i + d2t[i] leaves [0, {V}) for {bad} ids or is not increasing", ev | {"out of range": bad},
            "Re-export d2t from the trainer's vocab mapping (offsets of the sorted hot ids).")
    elif hot is not None and not np.array_equal(np.sort(targets), hot):
        add("t2d_mismatch", WARNING, "t2d does not mark the ids d2t maps to (SGLang ignores t2d, so one of them "
            "is stale)", ev, "Re-export both from the same vocab mapping.")
    if t2d is not None and (t2d.size != V or int(t2d.sum()) != Vd):
        init = f" ({t2d_init}: its initial value, never filled)" if t2d_init in ("all False", "all True") else ""
        add("t2d_shape", WARNING, f"t2d has length {t2d.size} and {int(t2d.sum())} true entries{init}; expected {V} "
            f"and {Vd}", ev, "Re-export t2d (SGLang ignores it, vLLM and trainers do not).")
    if not any(f.severity == ERROR for f in out):
        head_finding = _check_head(ctx, d2t)
        if head_finding is not None:
            out.append(head_finding)
    if not out:
        add("ok", INFO, f"d2t holds offsets onto {Vd} increasing target ids, consistent with t2d"
            if hot is not None else f"d2t holds offsets onto {Vd} increasing target ids", ev)
    return out


def _check_head(ctx: ProbeContext, d2t) -> Finding | None:
    """A frozen speculators head copies the target rows: lm_head[i] == target[i + d2t[i]]."""
    import numpy as np

    t, d = ctx.target, ctx.draft
    name = t.lm_head_name() if t is not None else None  # None without a target store
    store = t.store if t is not None else None
    head = d.tensors.get("lm_head.weight")
    if store is None or name is None or head is None or d.format != "speculators" or len(head.shape) != 2:
        return None
    tinfo = store.tensors[name]
    if tinfo.shape[1:] != head.shape[1:] or head.shape[0] != d2t.size:
        return None
    rows = np.unique(np.linspace(0, d2t.size - 1, min(SAMPLE_ROWS, d2t.size)).astype(int))
    draft_head = np.asarray(d.values("lm_head.weight"))[rows]
    target_head = np.asarray(store.values(name))
    offs = rows + d2t[rows]
    if offs.max() >= tinfo.shape[0] or offs.min() < 0:
        return None
    match = float(np.mean([np.allclose(draft_head[j], target_head[o], atol=1e-3) for j, o in enumerate(offs)]))
    ev = {"rows compared": int(rows.size), "rows equal to target[i + d2t[i]]": f"{match:.0%}", "target tensor": name}
    if match >= 0.9:
        return Finding(PROBE_ID, "head_confirms", INFO, "lm_head rows equal the target's rows at i + d2t[i]: "
                       "the offsets are right", ev)
    absn = d2t[rows]
    if absn.max() < tinfo.shape[0] and float(np.mean([np.allclose(draft_head[j], target_head[o], atol=1e-3)
                                                      for j, o in enumerate(absn)])) >= 0.9:
        return Finding(PROBE_ID, "absolute_ids", ERROR, "lm_head rows equal the target's rows at d2t[i]: d2t holds "
                       "absolute ids, SGLang reads offsets", ev,
                       f"Re-encode as offsets: {fix_checkpoint_command(d.path)}.")
    return None
