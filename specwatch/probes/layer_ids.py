"""layer_ids: the target layers SGLang will capture vs the layers the draft was trained on.

Positions below are SGLang capture positions: position j = the input of target layer j = HF
`hidden_states[j]` (llama.py@0.5.23). How ids become positions (`spec_aux_hidden_state.py@0.5.23`,
`model_runner.py@0.5.11`, and each target's `set_eagle3_layers_to_capture` in `srt/models/`):

- the engine reads ids only from the draft's nested `eagle_config.eagle_aux_hidden_state_layer_ids`
  (a top-level list, as speculators writes, is ignored for capture); none → `[2, N//2, N-3]`;
- the target class's rule turns ids into positions: +1 (Llama, Qwen, ...); DeepSeek-V2/V3 and Kimi
  +1 only when the first id is 1 (0.5.23; plain +1 on 0.5.11); GPT-OSS as given when max == N;
- positions outside [0, N) are never reached by the layer loop (GPT-OSS also captures N).

What the draft was trained on: speculators' top-level ids are positions (vLLM's "state after L
layers"); flat-config (SpecForge) ids are read with the newest SGLang rule for the target family
(the convention its trainers follow); none → the trainers' defaults, all equal to `[2, N//2, N-3]`.
"""

from __future__ import annotations

from dataclasses import dataclass

from specwatch.probes.base import ERROR, INFO, WARNING, Finding, ProbeContext, sentence
from specwatch.engines.sglang.source import PLUS_ONE, UNKNOWN, capturable, capture_indices

PROBE_ID = "layer_ids"
IDS_KEY = "eagle_aux_hidden_state_layer_ids"


@dataclass
class CaptureView:
    """What the server will capture. positions: requested by the target's rule; captured: the
    distinct positions actually reached, ascending (their count is how many states fc gets)."""

    n_layers: int
    rule: str
    ids_read: list[int] | None
    use_aux: bool
    positions: list[int]
    captured: list[int]
    trained: list[int] | None
    trained_from: str


def _ids(v) -> list[int] | None:
    return list(v) if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v) else None


def family_rule(ctx: ProbeContext) -> str:
    """The newest known rule for the target family (the convention drafts are trained in).
    Callers check first that the target and its architecture are known."""
    from specwatch.engines.sglang.known_versions import CAPTURE, RULE_CHANGES

    arch = ctx.target.architecture if ctx.target is not None else None
    assert arch is not None, "family_rule needs the target's architecture"
    eff = ctx.sglang.capture(arch).effective
    for name in (eff.owner, eff.arch, arch):
        if name in RULE_CHANGES:
            return RULE_CHANGES[name][1]
        if name in CAPTURE:
            return CAPTURE[name][3]
    return eff.id_rule if eff.id_rule != UNKNOWN else PLUS_ONE


def server_capture(ctx: ProbeContext) -> CaptureView | None:
    """The capture the server will set up (cached); None without a target layer count."""
    if "capture" in ctx.cache:
        return ctx.cache["capture"]
    t, d = ctx.target, ctx.draft
    view = None
    if t is not None and t.num_hidden_layers and t.architecture:
        n = t.num_hidden_layers
        rule = ctx.sglang.capture(t.architecture).effective.id_rule
        rule = PLUS_ONE if rule == UNKNOWN else rule
        ec = d.eagle_config()
        ids = _ids(ec.get(IDS_KEY))
        if ids is None and ctx.sglang.aux_ids_top_level_read():
            ids = _ids(d.config.get(IDS_KEY))
        positions = capture_indices(rule, ids, n)
        captured = sorted({p for p in positions if capturable(rule, p, n)})
        top = _ids(d.config.get(IDS_KEY))
        if d.format == "speculators":
            trained, src = (top, "speculators top-level ids (positions)") if top else (
                [2, n // 2, n - 3], "speculators default [2, N//2, N-3]")
        elif _ids(ec.get(IDS_KEY)) is not None:
            fam = family_rule(ctx)
            trained, src = capture_indices(fam, _ids(ec.get(IDS_KEY)), n), f"eagle_config ids read with the {fam} rule"
        else:
            trained, src = [2, n // 2, n - 3], "trainer default (SpecForge [1, N//2-1, N-4] / EAGLE layers 2, N//2, N-3)"
        view = CaptureView(n, rule, ids, bool(ec.get("use_aux_hidden_state", True)), positions, captured,
                           sorted(set(trained)), src)
    ctx.cache["capture"] = view
    return view


def ids_for(rule: str, positions: list[int], n: int) -> list[int] | None:
    """eagle_config ids that make `rule` capture exactly `positions` (None if none do)."""
    for cand in ([p - 1 for p in positions], list(positions)):
        if all(c >= 0 for c in cand) and capture_indices(rule, cand, n) == positions:
            return cand
    return None


def run(ctx: ProbeContext) -> list[Finding]:
    v = server_capture(ctx)
    if v is None:
        return []
    d, version = ctx.draft, ctx.sglang.version or "?"
    ev = {"target_layers (N)": v.n_layers, "ids read by SGLang": v.ids_read, "id_rule": v.rule,
          "captured positions": v.captured, "trained positions": v.trained, "trained_from": v.trained_from,
          "sglang_version": version}
    out: list[Finding] = []
    wanted = ids_for(v.rule, v.trained, v.n_layers) if v.trained else None
    fix_ids = (f'set "eagle_config": {{"{IDS_KEY}": {wanted}}} in the draft config.json'
               if wanted is not None else f"no id list makes SGLang {version} capture {v.trained}")
    top = _ids(d.config.get(IDS_KEY))
    if top is not None and _ids(d.eagle_config().get(IDS_KEY)) is None and not ctx.sglang.aux_ids_top_level_read():
        same = v.captured == v.trained
        out.append(Finding(PROBE_ID, "top_level_ignored", INFO if same else ERROR,
                           f"top-level {IDS_KEY} {top} is ignored by SGLang (it reads only eagle_config)"
                           + (": the default capture happens to match" if same else ""),
                           {"top-level ids": top, **ev}, "" if same else sentence(fix_ids) + "."))
    raw = v.ids_read or []
    if len(set(raw)) != len(raw):
        out.append(Finding(PROBE_ID, "duplicates", ERROR, f"duplicate aux layer ids {raw}: fewer states are captured "
                           "than the list is long", ev, "List each layer once."))
    elif raw != sorted(raw):
        out.append(Finding(PROBE_ID, "unsorted", WARNING, f"aux layer ids {raw} are not ascending; every engine "
                           "concatenates states in ascending layer order anyway", ev, f"Write them sorted: {sorted(raw)}."))
    lost = [p for p in v.positions if not 0 <= p < v.n_layers and p not in v.captured]
    if lost:
        out.append(Finding(PROBE_ID, "never_captured", ERROR, f"capture positions {lost} are outside the target's "
                           f"{v.n_layers} layers: those states never reach the draft", ev, sentence(fix_ids) + "."))
    if v.captured != v.trained and not any(f.kind == "top_level_ignored" and f.severity == ERROR for f in out):
        out.append(Finding(PROBE_ID, "mismatch", ERROR,
                           f"SGLang {version} captures positions {v.captured}, the draft was trained on {v.trained}",
                           ev, sentence(fix_ids) + "."))
    fc = d.tensors.get("fc.weight")
    ht = d.target_hidden_size
    if fc is not None and ht and len(fc.shape) == 2 and fc.shape[1] % ht == 0:
        k = fc.shape[1] // ht
        if len(v.captured) not in (k, 0, 1) and k > 1:
            out.append(Finding(PROBE_ID, "count", ERROR, f"{len(v.captured)} captured states but fc.weight takes {k}: "
                               "the first draft step fails with a shape error", {"fc.weight": list(fc.shape), **ev},
                               f"Give exactly {k} ids in eagle_config.{IDS_KEY}."))
    if not out and v.ids_read is None:
        # No ids in the draft config: the engine falls back to its own choice, which matches only a draft
        # trained with the same default (a trainer's default can differ, and engines change theirs).
        guessed = ids_for(v.rule, v.captured, v.n_layers)
        out.append(Finding(PROBE_ID, "guessed", WARNING,
                           f"the draft config names no aux layers: SGLang {version} guesses them and captures "
                           f"positions {v.captured} (its default [2, N//2, N-3] for N = {v.n_layers})",
                           ev, (f'Write the layers the draft was trained on into its config.json, e.g. '
                                f'"eagle_config": {{"{IDS_KEY}": {guessed}}} for the ones SGLang picks now.'
                                if guessed is not None else "Write the layers the draft was trained on into "
                                f"eagle_config.{IDS_KEY} of its config.json.")))
    if not out:
        out.append(Finding(PROBE_ID, "ok", INFO, f"captures positions {v.captured}, as trained", ev, ""))
    return out
