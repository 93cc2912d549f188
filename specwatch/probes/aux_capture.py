"""aux_capture: does the target class turn on EAGLE-3 aux hidden-state capture in this SGLang?

SGLang calls `model.set_eagle3_layers_to_capture(ids)` on the target at startup for
`--speculative-algorithm EAGLE3` (attention_backend_setup.py@0.5.23, model_runner.py@0.5.11). A
class without it fails at startup (ValueError on 0.5.23, AttributeError before); a wrapper that
forwards only `if hasattr(self.language_model, ...)` (Gemma3 / Llama4 multimodal:
`models/gemma3_mm.py`, `models/mllama4.py` 0.5.23) passes that check and captures nothing when its
language model lacks the method — the silent case. Read from the installed `srt/models/*.py` through
the class's bases.
"""

from __future__ import annotations

from specwatch.alerts.model import code
from specwatch.probes.base import ERROR, INFO, WARNING, Finding, ProbeContext

PROBE_ID = "aux_capture"
_RULES = {"plus_one": "ids +1 (id i = output of layer i)", "plus_one_if_first_is_1": "ids +1 only when the first id is 1",
          "as_is_if_max_is_n": "ids as given when max(id) == N, else +1", "as_is": "ids as given", "unknown": "unknown"}


def run(ctx: ProbeContext) -> list[Finding]:
    t = ctx.target
    if t is None:
        return []
    arch, version = t.architecture, ctx.sglang.version or "?"
    if arch is None:
        return [Finding(PROBE_ID, "no_architecture", WARNING, "the target config has no architectures: capture support "
                        "not checked", {"target": str(t.path)}, "Pass the target's own config.json.")]
    s = ctx.sglang.capture(arch)
    ev = {"target_architecture": arch, "sglang_version": version, "capture": s.kind,
          "defined_in": f"{s.owner} ({s.file})" if s.owner else None}
    ev = {k: v for k, v in ev.items() if v is not None}
    def found(kind: str, severity: str, title: str, fix: str) -> list[Finding]:
        return [Finding(PROBE_ID, kind, severity, title, ev, fix)]

    if s.kind == "unregistered":
        return found("unknown_architecture", ERROR, f"SGLang {version} has no model class {arch}",
                     "Check the target's architectures, or upgrade SGLang.")
    if s.kind == "missing":
        return found("missing", ERROR, f"{arch} does not implement set_eagle3_layers_to_capture in SGLang {version}: "
                     "an EAGLE-3 server fails at startup",
                     "Upgrade SGLang to a version whose target class captures aux hidden states "
                     "(`grep -rn set_eagle3_layers_to_capture <site-packages>/sglang/srt/models/`), or use another target.")
    if s.kind == "unknown" or (s.kind.startswith("delegate") and s.inner is None):
        where = "specwatch's version table" if ctx.sglang.source == "table" else "the source"
        return found("unknown", WARNING, f"capture support of {arch} could not be read from {where}",
                     f"Check {code(f'{arch}.set_eagle3_layers_to_capture')} in the installed SGLang by hand.")
    inner = s.inner
    if inner is not None:
        ev |= {"wraps": f"self.{s.inner_attr} = {inner.arch}", "inner_capture": inner.kind}
        if inner.kind in ("missing", "unregistered") and s.kind == "delegate_if_present":
            return found("silent_noop", ERROR, f"{arch} forwards set_eagle3_layers_to_capture only if {inner.arch} "
                         "has it, and it does not: no aux hidden states are captured, silently",
                         "Upgrade SGLang to a version where the language model captures, or serve the text-only "
                         "architecture; until then the draft's fc is bypassed (see fc_bypass).")
        if inner.kind in ("missing", "unregistered"):
            return found("inner_missing", ERROR, f"{arch} forwards capture to {inner.arch}, which lacks it: startup fails",
                         "Upgrade SGLang, or use a target whose language model implements capture.")
    eff = s.effective
    ev["id_rule"] = f"{eff.owner or eff.arch}: {_RULES.get(eff.id_rule, eff.id_rule)}"
    via = f" through {inner.arch}" if inner is not None else ""
    return found("ok", INFO, f"{arch} captures aux hidden states{via} (SGLang {version})", "")
