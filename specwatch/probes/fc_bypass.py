"""fc_bypass: the draft's fusion layer `fc` [H, k·Ht] skipped because the server feeds H-wide states.

SGLang runs `fc` only when the incoming hidden states are wider than the draft's embeddings
(`if hidden_states.shape[-1] != embeds.shape[-1]`, llama_eagle3.py@0.5.11 and @0.5.23). The target
sends the concatenated captured states, a single captured state unconcatenated, or — when
capture is off — its final hidden state (Ht wide) (logits_processor.py@0.5.23). So with Ht == H
the fc is silently skipped when: the algorithm is not EAGLE3 (`--speculative-algorithm EAGLE`
for an EAGLE-3 draft: no capture at all), the draft's `eagle_config.use_aux_hidden_state` is
false, the target wrapper's capture is a no-op, or exactly one layer is captured. The draft then
runs on features it was never trained on (Kimi-K2.5 fault 2: 7168 instead of 21504).
"""

from __future__ import annotations

from specwatch.probes.base import ERROR, Finding, ProbeContext, sentence
from specwatch.probes.layer_ids import server_capture

PROBE_ID = "fc_bypass"


def run(ctx: ProbeContext) -> list[Finding]:
    d = ctx.draft
    fc = d.tensors.get("fc.weight")
    h, ht = d.hidden_size, d.target_hidden_size
    if fc is None or len(fc.shape) != 2 or not h or not ht or fc.shape[1] == h:
        return []
    algo = ctx.settings.algorithm
    reasons: list[str] = []
    fixes: list[str] = []
    if algo is not None and algo != "EAGLE3":
        reasons.append(f"--speculative-algorithm {algo}: SGLang captures aux hidden states only for EAGLE3")
        fixes.append("start the server with --speculative-algorithm EAGLE3")
    if d.eagle_config().get("use_aux_hidden_state") is False:
        reasons.append("eagle_config.use_aux_hidden_state is false in the draft config")
        fixes.append('remove "use_aux_hidden_state": false from eagle_config')
    if ctx.target is not None and ctx.target.architecture:
        cap = ctx.sglang.capture(ctx.target.architecture)
        if cap.kind == "delegate_if_present" and cap.inner is not None and cap.inner.kind in ("missing", "unregistered"):
            reasons.append(f"{cap.arch} forwards capture only if {cap.inner.arch} has it, and it does not")
            fixes.append("use a target class that captures (see aux_capture)")
    view = server_capture(ctx)
    width = ht
    if not reasons and view is not None and view.use_aux:
        width = ht * len(view.captured) if len(view.captured) > 1 else ht
        if len(view.captured) <= 1:
            reasons.append(f"only {len(view.captured)} layer captured ({view.captured}): a single state is passed "
                           "through unconcatenated")
            fixes.append("list 3 ids in eagle_config.eagle_aux_hidden_state_layer_ids")
    elif not reasons:
        return []  # unknown target and algorithm EAGLE3 (or unknown): nothing says capture is off
    ev = {"fc.weight": list(fc.shape), "draft hidden_size (H)": h, "target hidden (Ht)": ht,
          "hidden width fed to the draft": width, "speculative_algorithm": algo or "unknown",
          "why": reasons}
    if not reasons:
        return []  # a capture count that does not fit fc is reported by layer_ids
    if width == h:
        return [Finding(PROBE_ID, "bypassed", ERROR,
                        f"fc is skipped: the draft receives {width}-wide hidden states, the width of its own "
                        f"embeddings, instead of {fc.shape[1]}", ev, sentence("; ".join(fixes)) + ".")]
    return [Finding(PROBE_ID, "width_mismatch", ERROR,
                    f"the server feeds {width}-wide states, fc.weight takes {fc.shape[1]}: the first draft step fails",
                    ev, sentence("; ".join(fixes)) + ".")]
