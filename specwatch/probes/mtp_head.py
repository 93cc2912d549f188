"""mtp_head: the target is its own draft. Does its checkpoint carry the MTP head its config declares?

An MTP / NEXTN server has no separate draft: SGLang takes `--model-path` as the draft when
`--speculative-draft-model-path` is missing (`_handle_eagle_family` in
`srt/arg_groups/speculative_hook.py`@0.5.23, `server_args.py`@0.5.11) and builds the MTP class its
`model_config.py` renames the architecture to (`DeepseekV3ForCausalLM` → `DeepseekV3ForCausalLMNextN`,
`Qwen3NextForCausalLM` → `Qwen3NextForCausalLMMTP`, `MiMoForCausalLM` → `MiMoMTP`, ...); vLLM's
`method: mtp` does the same through `SpeculativeConfig.hf_config_override` (`config/speculative.py`@0.33.0,
`config.py`@0.8.5.post1: model_type → `*_mtp`, `architectures` → e.g. `DeepSeekMTPModel`, the layer
count from `num_nextn_predict_layers`) and the registry's module for that class.

What the head is, is read from the installed engine's MTP file with `ast` (never imported):
- its modules: the norms and projections the MTP classes' `__init__` build (`self.enorm = RMSNorm(...)`,
  `self.eh_proj = nn.Linear(...)`, `self.shared_head.norm`, `self.fc`, `self.token_layernorm`, ...);
- where the checkpoint keeps them, from the key strings of that file and its bases' files:
  `model.mtp_layers.{i}.` (MiMo), `mtp.` with the block at `mtp.layers.{i}.` (Qwen3-Next), else
  `model.layers.{N+i}.` after the N decoder layers (DeepSeek-V3, GLM-4.5: `f"model.layers.{...}"`).

Findings: `mtp_head/missing` (error: declared, not in the checkpoint: the engine serves the head at
its initial values or fails to start), `mtp_head/no_mtp_class` (error: the installed engine has no
MTP class for the target), `mtp_head/not_checked` (info: no weights, no engine source, or a layout
this reader does not know), `mtp_head/ok`; `draft/is_target` (error: the target stands in for an
EAGLE-3 draft, or declares no MTP layers).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from specwatch.alerts.model import code
from specwatch.probes.base import ERROR, INFO, Finding, short_list

PROBE_ID = "mtp_head"
DECLARE_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")
_MODULE_CALL = re.compile(r"(Norm|Linear|SharedHead)")
_NOT_HEAD = ("lm_head", "logits_processor", "embed_tokens")


class Unread(str):
    """Why the layout was not read (no engine source, a layout specwatch does not know): nothing is
    judged, unlike a plain `str` reason (the engine has no MTP class for the target)."""


@dataclass(frozen=True)
class MtpLayout:
    """How an engine version loads an MTP head. engine: `SGLang 0.5.23` / `vLLM 0.33.0`. arch: the
    class it builds. source: the file it was read from. modules: the head's module paths
    (`enorm`, `shared_head.norm`). style: `layers` | `mtp_layers` | `mtp` (module docstring)."""

    engine: str
    arch: str
    source: str
    modules: tuple[str, ...]
    style: str

    def prefixes(self, n_layers: int, i: int) -> tuple[str, str]:
        """(where MTP layer `i`'s head modules live, where its decoder block lives) as key prefixes.
        SGLang reads a one-layer checkpoint (a NextN export) at layer 0 (`_initialize_nextn_conf`,
        `deepseek_common/deepseek_weight_loader.py`@0.5.23: "compatible with old design")."""
        if self.style == "mtp_layers":
            return f"model.mtp_layers.{i}.", f"model.mtp_layers.{i}."
        if self.style == "mtp":
            return "mtp.", f"mtp.layers.{i}."
        first = 0 if n_layers == 1 and self.engine.startswith("SGLang") else n_layers
        return f"model.layers.{first + i}.", f"model.layers.{first + i}."


def _strings(tree: ast.AST | None) -> set[str]:
    """String constants and f-string heads (`f"model.layers.{n}"` → `model.layers.`) of a file."""
    out: set[str] = set()
    for n in ast.walk(tree) if tree is not None else ():
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.add(n.value)
        elif isinstance(n, ast.JoinedStr) and n.values and isinstance(n.values[0], ast.Constant):
            out.add(str(n.values[0].value))
    return out


def _style(strings: set[str]) -> str | None:
    if any("mtp_layers" in s for s in strings):
        return "mtp_layers"
    if any(s == "mtp." or s.startswith("mtp.") for s in strings):
        return "mtp"
    if any(s.startswith("model.layers.") or s == "layers." for s in strings):
        return "layers"
    return None


def _attr_path(node: ast.expr) -> str | None:
    """`self.a.b` → `a.b`; anything else → None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join(reversed(parts)) if isinstance(node, ast.Name) and node.id == "self" and parts else None


def head_modules(tree: ast.AST | None) -> tuple[str, ...]:
    """The norms and projections the classes of an MTP file build in `__init__`, e.g.
    `('eh_proj', 'enorm', 'hnorm', 'shared_head.norm')`; a module whose parent is also listed is dropped."""
    found: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)) if tree is not None else ():
        if _MODULE_CALL.search(cls.name):
            continue  # a submodule (vLLM's `SharedHead`): its parts are named under its parent's attribute
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"):
            for n in ast.walk(fn):
                if not (isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)):
                    continue
                func = n.value.func
                name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                if not _MODULE_CALL.search(name) or "LMHead" in name or "Embedding" in name:
                    continue
                for t in n.targets:
                    path = _attr_path(t)
                    if path and path.split(".")[0] not in _NOT_HEAD:
                        found.add(path)
    return tuple(sorted(p for p in found if not any(p.startswith(q + ".") for q in found)))


def sglang_layout(facts, arch: str | None) -> MtpLayout | str:
    """The MTP head the installed SGLang (`SourceFacts`) builds for target `arch`, or why none."""
    version = f"SGLang {facts.version or '?'}"
    if not hasattr(facts, "_find_class"):
        return Unread(f"not read: {version} from specwatch's table (no source to read the MTP class from)")
    rewrites = facts.draft_arch_rewrites()
    mtp = rewrites.get(arch or "") or (arch if arch in rewrites.values() else None)  # a NextN export names its class
    if mtp is None:
        return f"{version} has no MTP/NEXTN class for {arch} (srt/configs/model_config.py renames no such draft)"
    found = facts._find_class(mtp)
    if found is None:
        return f"{version} renames {arch} to {mtp} but defines no such class in srt/models/"
    fname, cls = found
    strings: set[str] = set()
    for f, _ in facts._mro(fname, cls):
        strings |= _strings(facts._tree(f))
    style = _style(strings)
    if style is None:
        return Unread(f"{version}'s {mtp} (srt/models/{fname}): a checkpoint layout specwatch does not know")
    return MtpLayout(version, mtp, f"srt/models/{fname}", head_modules(facts._tree(fname)), style)


def _vllm_override(facts) -> ast.FunctionDef | None:
    from specwatch.engines.vllm.source import _tree

    for rel in ("config/speculative.py", "config.py"):
        tree = _tree(facts.pkg / rel)
        for n in ast.walk(tree) if tree is not None else ():
            if isinstance(n, ast.FunctionDef) and n.name == "hf_config_override":
                return n
    return None


def _test_holds(test: ast.expr, model_type: str | None, arch: str | None) -> bool:
    """`hf_config.model_type == "x"`, `... in ("x", "y")`, `hf_config.architectures[0] == "X"`."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    left, right = ast.unparse(test.left), test.comparators[0]
    value = model_type if left.endswith(".model_type") else arch if left.endswith("architectures[0]") else None
    if value is None:
        return False
    if isinstance(test.ops[0], ast.Eq) and isinstance(right, ast.Constant):
        return right.value == value
    if isinstance(test.ops[0], ast.In):
        if isinstance(right, (ast.Tuple, ast.List, ast.Set)):
            return value in [e.value for e in right.elts if isinstance(e, ast.Constant)]
        if isinstance(right, ast.Constant) and isinstance(right.value, str):
            return value == right.value
    return False


def vllm_mtp_arch(facts, model_type: str | None, arch: str | None) -> tuple[str | None, str | None]:
    """(the MTP architecture vLLM's `hf_config_override` gives a target, the config key it reads the
    layer count from), following its `if` chain over the model type as the function runs it."""
    fn = _vllm_override(facts)
    mtp, key = None, None
    for stmt in fn.body if fn is not None else ():
        if not (isinstance(stmt, ast.If) and _test_holds(stmt.test, model_type, arch)):
            continue
        for n in ast.walk(ast.Module(body=stmt.body, type_ignores=[])):
            if (isinstance(n, ast.Assign) and ast.unparse(n.targets[0]).endswith(".model_type")
                    and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)):
                model_type = n.value.value
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr" \
                    and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant) and n.args[1].value in DECLARE_KEYS:
                key = key or n.args[1].value
            elif isinstance(n, ast.Dict):
                for k, v in zip(n.keys, n.values):
                    if isinstance(k, ast.Constant) and k.value == "architectures" and isinstance(v, ast.List) and v.elts:
                        e = v.elts[0]
                        e = e.orelse if isinstance(e, ast.IfExp) else e  # `"V32..." if use_v32 else "..."`: the plain one
                        if isinstance(e, ast.Constant) and isinstance(e.value, str):
                            mtp = e.value
    return mtp, key


def vllm_layout(facts, arch: str | None, model_type: str | None) -> MtpLayout | str:
    """The MTP head the installed vLLM (`VllmFacts`) builds for a target, or why none."""
    from specwatch.engines.vllm.source import _tree

    version = f"vLLM {facts.version or '?'}"
    mtp, _ = vllm_mtp_arch(facts, model_type, arch)
    if mtp is None:
        return f"{version} has no MTP model for {arch} (model_type {model_type!r}: SpeculativeConfig.hf_config_override)"
    reg = facts._registry.get(mtp)
    if reg is None:
        return f"{version} names {mtp} for {arch} but its registry has no such model"
    rel = f"model_executor/models/{reg[0]}.py"
    tree = _tree(facts.pkg / rel)
    style = _style(_strings(tree))
    if tree is None or style is None:
        return Unread(f"{version}'s {mtp} ({rel}): a checkpoint layout specwatch does not know")
    return MtpLayout(version, mtp, rel, head_modules(tree), style)


def declared_layers(target) -> tuple[str | None, int | None]:
    """(the config key, the MTP layer count) the target config declares; (None, None) if none."""
    for key in DECLARE_KEYS:
        v = target.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            return key, v
    return None, None


def check(target, layout: MtpLayout | str) -> list[Finding]:
    """The findings for a checkpoint whose config declares MTP layers (`declared_layers`), served as
    its own MTP draft under `layout` (or the reason there is none)."""
    arch = target.architecture
    key, count = declared_layers(target)
    if key is None or count is None:
        raise ValueError(f"{target.path}: the config declares no MTP layers ({', '.join(DECLARE_KEYS)})")
    if isinstance(layout, Unread):
        return [Finding(PROBE_ID, "not_checked", INFO, f"MTP head not checked: {layout}",
                        {"architecture": arch, key: count}, "Point specwatch at the engine the server runs (--sglang-root, --vllm-root).")]
    if isinstance(layout, str):
        return [Finding(PROBE_ID, "no_mtp_class", ERROR, layout, {"architecture": arch, key: count},
                        f"Use an engine version that serves {arch}'s MTP head, or a separate draft model.")]
    ev = {"architecture": arch, "mtp class": layout.arch, "read from": layout.source, key: count,
          "head modules": list(layout.modules)}
    if target.store is None:
        return [Finding(PROBE_ID, "not_checked", INFO, f"the target's weights were not read (a config only): "
                        f"{layout.engine} loads {layout.arch}'s head from them", ev,
                        "Give the target folder with its `*.safetensors` to check the MTP tensors.")]
    names = list(target.store.tensors)
    n = target.num_hidden_layers or 0
    missing, where = [], []
    for i in range(count):
        head, block = layout.prefixes(n, i)
        where.append(head + "{" + ",".join(layout.modules) + "}")
        missing += [head + m for m in layout.modules if not any(k.startswith(head + m + ".") for k in names)]
        own = {head + m + "." for m in layout.modules}
        if not any(k.startswith(block) and not any(k.startswith(o) for o in own) for k in names):
            missing.append(block.rstrip(".") + " (the MTP decoder block)")
    ev["expected at"] = where
    if missing:
        return [Finding(PROBE_ID, "missing", ERROR,
                        f"the target config declares {count} MTP layer(s) ({key}) but the checkpoint has no "
                        f"{missing[0]}: {layout.engine}'s {layout.arch} gets no weights for its head",
                        {**ev, "missing": short_list(missing)},
                        "Use a checkpoint that ships the MTP layer (the original release: quantised or converted "
                        "copies often drop it), or serve without MTP (no "
                        + code("--speculative-config" if layout.engine.startswith("vLLM") else "--speculative-algorithm")
                        + ").")]
    return [Finding(PROBE_ID, "ok", INFO, f"the checkpoint carries the {count} MTP layer(s) {key} declares, as "
                    f"{layout.engine}'s {layout.arch} loads them", ev)]


def same_model(draft: str | None, target) -> bool:
    """The draft is the target: no draft given, or the same folder once resolved (SGLang then loads
    `--model-path` twice), or a copy with the very same config and tensor names."""
    from pathlib import Path

    if draft is None:
        return True
    d = Path(draft)
    try:
        if d.resolve() == Path(target.path).resolve():
            return True
    except OSError:
        return False
    from specwatch.probes.checkpoint import load_draft

    ck = load_draft(d)
    return ck.config == target.config and target.store is not None and set(ck.tensors) == set(target.store.tensors)


def self_draft(target, layout: MtpLayout | str, algorithm: str | None, engine: str) -> list[Finding]:
    """The findings for a server whose draft is its target. `algorithm`: `EAGLE3` (a separate draft
    is needed), `EAGLE` (SGLang's NEXTN) / `MTP` / None (the target's own MTP head drafts, when its
    config declares one). `engine`: `sglang` | `vllm`."""
    key, count = declared_layers(target)
    if algorithm != "EAGLE3" and count:
        return check(target, layout)
    if engine == "vllm":
        flag = code('--speculative-config \'{"method": "eagle3", "model": "<draft folder>"}\'')
        own = code('--speculative-config \'{"method": "mtp"}\'')
        how = "vLLM has no draft model to load"
    else:
        flag, own = code("--speculative-draft-model-path <draft folder>"), code("--speculative-algorithm NEXTN")
        how = ("SGLang uses --model-path as the draft when --speculative-draft-model-path is missing, and fails at "
               "start-up on a model that is no draft (e.g. no `set_embed`)")
    mtp = (f"; the target carries an MTP head ({key} {count}): or serve that with {own} and no draft"
           if count and isinstance(layout, MtpLayout) else "")
    return [Finding("draft", "is_target", ERROR,
                    f"the draft is the target model itself ({target.architecture}): no EAGLE-3 draft was given; {how}",
                    {"target": str(target.path), "architecture": target.architecture,
                     "algorithm": algorithm or "(not given)"},
                    f"Pass {flag}: an EAGLE-3 draft trained for this target{mtp}.")]
