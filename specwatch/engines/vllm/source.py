"""What the installed vLLM does with an EAGLE-3 draft, read from its source with `ast`.

vLLM is never imported (it needs torch and a GPU stack). Facts and where they live (all under
`vllm/`, checked on 0.8.5.post1 and 0.33.0):

- version: `_version.py` (`__version__ = version = '0.33.0'`);
- the draft loader, `Eagle3LlamaForCausalLM.load_weights` in `model_executor/models/llama_eagle3.py`
  (0.8.5.post1 lines 216-232, 0.33.0 lines 420-480): substrings it skips (`if "t2d" in name:
  continue`), its renames (`name.replace("d2t", "draft_id_to_target_id")`), the prefix it puts on
  every name without `lm_head` (`name = "model." + name`), and the substrings it drops when the
  checkpoint lacks them (`orig_to_new_substr["embed_tokens"] = None`, 0.33.0); the inner
  `LlamaModel`'s renames (`'midlayer.'` → `'layers.0.'`: a `replace` call in 0.8.5.post1 line 150, a
  `WeightsMapper` in 0.33.0 line 291) and stacked q/k/v and gate/up projections;
- the draft module: attributes `LlamaModel.__init__` and the decoder layers assign (`self.fc`,
  `self.norm`, `self.input_norm` (0.33.0), `self.hidden_norm`, …; Llama's own from
  `model_executor/models/llama.py`), whether the layers are built `for … in range(…)` (several)
  or as one, whether `draft_vocab_size` may be absent (`getattr(self.config, "draft_vocab_size",
  None)`, 0.33.0 line 314) and whether `draft_id_to_target_id` exists only when the draft vocabulary
  is smaller (`if self.config.draft_vocab_size != target_vocab_size`, 0.33.0 line 339);
- how d2t is read: `targets = base + self.draft_id_to_target_id` (offsets; 0.8.5.post1 line 208,
  0.33.0 line 386);
- targets: `_TEXT_GENERATION_MODELS` / `_MULTIMODAL_MODELS` in `model_executor/models/registry.py`
  (architecture → module, class), the class's bases through the models package; EAGLE-3 needs
  `SupportsEagle3` when the runner checks `supports_eagle3(` (`v1/worker/gpu_model_runner.py@0.33.0`
  line 5173), else (0.8.5.post1) a Llama `model_type` (`config.py` line 2588) and
  `get_eagle3_aux_hidden_state_layers`; the default layers from the return tuple of
  `get_eagle3_default_aux_hidden_state_layers` / `get_eagle3_aux_hidden_state_layers`
  (`(2, num_layers // 2, num_layers - 3)`: `llama.py@0.8.5.post1` line 534,
  `interfaces.py@0.33.0` line 1772);
- the draft config keys the runner reads for the layers: the strings of
  `_get_eagle3_aux_layers_from_config` (`v1/worker/gpu_model_runner.py@0.33.0` line 5190; absent
  in 0.8.5.post1: the default is always used);
- speculators configs: the names registered with `@register_speculator("…")`
  (`transformers_utils/configs/speculators/algos.py`, 0.10.1.1+; none in 0.8.5.post1).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TypedDict

from specwatch.system import pyast

EAGLE3_FILE = "model_executor/models/llama_eagle3.py"
_VERSION = re.compile(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""")


def _tree(path: Path) -> ast.Module | None:
    try:
        tree = pyast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return tree if isinstance(tree, ast.Module) else None  # mode "exec" parses to a Module


def _classes(tree: ast.Module | None) -> dict[str, ast.ClassDef]:
    return {} if tree is None else {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def _method(cls: ast.ClassDef | None, name: str) -> ast.FunctionDef | None:
    if cls is None:
        return None
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _self_attrs(fn: ast.FunctionDef | None) -> set[str]:
    """Names assigned as `self.X = …` anywhere in a function."""
    out: set[str] = set()
    for node in ast.walk(fn) if fn is not None else ():
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    out.add(t.attr)
    return out


def _const(node: ast.AST | None) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def _str(node: ast.AST | None) -> str | None:
    """A string literal's value; None for any other node (or none)."""
    v = _const(node)
    return v if isinstance(v, str) else None


TargetSupport = TypedDict("TargetSupport", {
    "registered": bool,  # the registry names the architecture
    "class": str | None,  # `Class (module.py)`
    "supported": bool | None,  # the runner accepts it as an EAGLE-3 target; None: not registered
    "why": str,
    "default_layers": tuple[int, ...] | None,  # the ids captured when the draft names none
})


@dataclass(frozen=True)
class LoaderRules:
    """How `Eagle3LlamaForCausalLM.load_weights` turns a checkpoint name into a parameter name.

    skips: substrings whose tensors are dropped. renames: outer renames, in order. prefix /
    unprefixed: `prefix` goes before every name that contains none of `unprefixed`. inner_renames:
    the inner model's renames (`midlayer.` → `layers.0.`). stacked: shard → fused name
    (`.q_proj` → `.qkv_proj`). optional: substrings the loader drops when the checkpoint lacks
    them (else the parameter keeps its initial value, silently)."""

    skips: tuple[str, ...] = ()
    renames: tuple[tuple[str, str], ...] = ()
    prefix: str = "model."
    unprefixed: tuple[str, ...] = ("lm_head",)
    inner_renames: tuple[tuple[str, str], ...] = ()
    stacked: tuple[tuple[str, str], ...] = ()
    optional: tuple[str, ...] = ()

    def map(self, name: str) -> str | None:
        """The parameter a checkpoint tensor loads into; None when it is skipped."""
        if any(s in name for s in self.skips):
            return None
        renamed = False
        for a, b in self.renames:
            if a in name:
                name, renamed = name.replace(a, b), True
        if not renamed and not any(u in name for u in self.unprefixed):
            name = self.prefix + name
        if name.startswith(self.prefix):
            inner = name[len(self.prefix):]
            for a, b in self.inner_renames:
                inner = inner.replace(a, b)
            for a, b in self.stacked:
                if a in inner:
                    inner = inner.replace(a, b)
                    break
            name = self.prefix + inner
        return name


@dataclass
class VllmFacts:
    """Facts from a vLLM install: `root` is the folder that holds the `vllm` package."""

    root: Path
    notes: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.root = Path(self.root)
        if not (self.pkg / "__init__.py").is_file() and not (self.pkg / "_version.py").is_file():
            raise FileNotFoundError(f"{self.root}: no vllm package here (give the folder that contains vllm/)")

    @property
    def pkg(self) -> Path:
        return self.root / "vllm"

    def describe(self) -> str:
        return f"vLLM {self.version or '?'} read from {self.pkg}"

    @cached_property
    def version(self) -> str | None:
        try:
            m = _VERSION.search((self.pkg / "_version.py").read_text(encoding="utf-8"))
        except OSError:
            m = None
        if m is None:
            for meta in self.root.glob("vllm-*.dist-info/METADATA"):
                v = re.search(r"^Version: (\S+)", meta.read_text(encoding="utf-8", errors="replace"), re.M)
                if v:
                    return v.group(1)
        return m.group(1) if m else None

    @cached_property
    def _eagle3(self) -> dict[str, ast.ClassDef]:
        return _classes(_tree(self.pkg / EAGLE3_FILE))

    @property
    def has_eagle3(self) -> bool:
        """The install has the EAGLE-3 draft class (vLLM 0.8.5+)."""
        return "Eagle3LlamaForCausalLM" in self._eagle3

    @cached_property
    def loader(self) -> LoaderRules:
        outer = _method(self._eagle3.get("Eagle3LlamaForCausalLM"), "load_weights")
        model = self._eagle3.get("LlamaModel")
        skips: list[str] = []
        renames: list[tuple[str, str]] = []
        optional: list[str] = []
        prefix = "model."
        unprefixed: list[str] = []
        for node in ast.walk(outer) if outer is not None else ():
            if isinstance(node, ast.If) and (sub := _in_name(node.test)) \
                    and any(isinstance(n, ast.Continue) for n in ast.walk(node)):
                if not any(isinstance(n, ast.Assign) and _renames_in(n) for n in node.body):
                    skips.append(sub)
            if isinstance(node, ast.Call) and (pair := _replace_args(node)) is not None:
                renames.append(pair)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.Add) \
                    and (left := _str(node.value.left)) is not None:
                prefix = left
            if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.NotIn) \
                    and (left := _str(node.left)) is not None:
                unprefixed.append(left)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value is None:
                t = node.targets[0]
                if isinstance(t, ast.Subscript) and (key := _str(t.slice)) is not None:
                    optional.append(key)
        inner_renames: list[tuple[str, str]] = []
        stacked: list[tuple[str, str]] = []
        for node in ast.walk(model) if model is not None else ():
            if isinstance(node, ast.Call) and (pair := _replace_args(node)) is not None:
                inner_renames.append(pair)
            if isinstance(node, ast.keyword) and node.arg in ("orig_to_new_substr", "orig_to_new_stacked") \
                    and isinstance(node.value, ast.Dict):
                for k, v in zip(node.value.keys, node.value.values):
                    if (old := _str(k)) is None:
                        continue
                    if (new := _str(v)) is not None:
                        inner_renames.append((old, new))
                    elif isinstance(v, ast.Tuple) and (fused := _str(v.elts[0])) is not None:
                        stacked.append((old, fused))
            if isinstance(node, ast.Tuple) and len(node.elts) == 3 and (param := _str(node.elts[0])) is not None \
                    and (shard := _str(node.elts[1])) is not None and shard.startswith("."):
                stacked.append((shard, param))  # (param, shard, id) rows
        stacked = [(a, b) for a, b in stacked if (a, b) not in inner_renames]
        renames = [(a, b) for a, b in renames if (a, b) not in inner_renames]
        return LoaderRules(tuple(dict.fromkeys(skips)), tuple(renames), prefix, tuple(unprefixed) or ("lm_head",),
                           tuple(inner_renames), tuple(dict.fromkeys(stacked)), tuple(optional))

    @cached_property
    def modules(self) -> dict[str, set[str]]:
        """Attribute names per draft submodule: `model` (the draft's LlamaModel), `layer` (its
        decoder layer, Llama's and the EAGLE-3 one's), `self_attn`, `mlp`, `top` (the CausalLM)."""
        llama = _classes(_tree(self.pkg / "model_executor/models/llama.py"))
        e = self._eagle3
        init = lambda classes, name: _self_attrs(_method(classes.get(name), "__init__"))  # noqa: E731
        layer = init(llama, "LlamaDecoderLayer")
        for name in e:
            if "DecoderLayer" in name:
                layer |= init(e, name)
        return {"top": init(e, "Eagle3LlamaForCausalLM"), "model": init(e, "LlamaModel"), "layer": layer,
                "self_attn": init(llama, "LlamaAttention"), "mlp": init(llama, "LlamaMLP")}

    @cached_property
    def several_layers(self) -> bool:
        """The draft module builds `num_hidden_layers` decoder layers (else exactly one)."""
        init = _method(self._eagle3.get("LlamaModel"), "__init__")
        for node in ast.walk(init) if init is not None else ():
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "layers" for t in node.targets):
                return any(isinstance(n, ast.Name) and n.id == "range" for n in ast.walk(node.value))
        return False

    def _source(self, cls: str) -> str:
        node = self._eagle3.get(cls)
        return "" if node is None else ast.unparse(node)

    @cached_property
    def draft_vocab_optional(self) -> bool:
        """`draft_vocab_size` may be absent from the draft config (defaults to the vocabulary)."""
        return 'getattr(self.config, "draft_vocab_size"' in self._source("Eagle3LlamaForCausalLM").replace("'", '"')

    @cached_property
    def d2t_offsets(self) -> bool:
        return "base + self.draft_id_to_target_id" in self._source("Eagle3LlamaForCausalLM")

    @cached_property
    def d2t_only_smaller_vocab(self) -> bool:
        """`draft_id_to_target_id` is a parameter only when the draft vocabulary is smaller."""
        return "self.draft_id_to_target_id = None" in self._source("Eagle3LlamaForCausalLM")

    # --- targets and their aux layers ---

    @cached_property
    def _runner(self) -> ast.Module | None:
        return _tree(self.pkg / "v1/worker/gpu_model_runner.py")

    @cached_property
    def checks_interface(self) -> bool:
        """The runner refuses a target without the `SupportsEagle3` interface (0.10.1.1+)."""
        return self._runner is not None and "supports_eagle3(" in ast.unparse(self._runner)

    @cached_property
    def llama_only(self) -> bool:
        """EAGLE-3 is refused for a target whose model_type lacks `llama` (`config.py@0.8.5.post1`)."""
        try:
            return "Eagle3 is only supported for Llama models" in (self.pkg / "config.py").read_text(encoding="utf-8")
        except OSError:
            return False

    @cached_property
    def aux_config_keys(self) -> tuple[str, ...]:
        """The draft-config keys the runner reads for the aux layers, in order: `top` (top-level
        `eagle_aux_hidden_state_layer_ids`) and/or `eagle_config`; () = never read."""
        fn = next((n for n in ast.walk(self._runner) if isinstance(n, ast.FunctionDef)
                   and n.name == "_get_eagle3_aux_layers_from_config"), None) if self._runner is not None else None
        if fn is None:
            return ()
        text = ast.unparse(fn)
        keys = []
        if "getattr(hf_config, 'eagle_aux_hidden_state_layer_ids'" in text:
            keys.append("top")
        if "'eagle_config'" in text and "'eagle_aux_hidden_state_layer_ids'" in text:
            keys.append("eagle_config")
        return tuple(keys)

    @cached_property
    def _registry(self) -> dict[str, tuple[str, str]]:
        tree = _tree(self.pkg / "model_executor/models/registry.py")
        out: dict[str, tuple[str, str]] = {}
        for node in tree.body if tree is not None else ():
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
                for k, v in zip(node.value.keys, node.value.values):
                    arch = _str(k)
                    if arch is None or not isinstance(v, ast.Tuple) or len(v.elts) < 2:
                        continue
                    module, cls = _str(v.elts[0]), _str(v.elts[1])
                    if module is not None and cls is not None:
                        out.setdefault(arch, (module, cls))
        return out

    def _models_class(self, module: str, name: str, depth: int = 0) -> tuple[ast.ClassDef, dict[str, str]] | None:
        """A class of `model_executor/models/<module>.py` and that file's imports (name → module)."""
        path = self.pkg / "model_executor/models" / f"{module}.py"
        tree = _tree(path)
        if tree is None:
            return None
        imports: dict[str, str] = {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module is not None:
                mod = node.module.rsplit(".", 1)[-1] if (node.level or node.module.startswith("vllm.model_executor.models")) else None
                for a in node.names:
                    imports[a.asname or a.name] = mod or ""
        cls = _classes(tree).get(name)
        return None if cls is None else (cls, imports)

    def target_support(self, arch: str | None, model_type: str | None, n_layers: int | None) -> TargetSupport:
        """What the runner does for target architecture `arch`: {"registered", "class", "supported",
        "why", "default_layers"} (`TargetSupport`)."""
        out: TargetSupport = {"registered": False, "class": None, "supported": None, "why": "", "default_layers": None}
        entry = self._registry.get(arch or "")
        if entry is None:
            out["why"] = f"{arch} is not a vLLM architecture"
            return out
        out["registered"], out["class"] = True, f"{entry[1]} ({entry[0]}.py)"
        names: set[str] = set()
        methods: dict[str, ast.FunctionDef] = {}
        todo = [(entry[0], entry[1])]
        seen: set[tuple[str, str]] = set()
        while todo and len(seen) < 40:
            module, name = todo.pop()
            if (module, name) in seen:
                continue
            seen.add((module, name))
            found = self._models_class(module, name)
            if found is None:
                names.add(name)
                continue
            cls, imports = found
            names.add(name)
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef):
                    methods.setdefault(fn.name, fn)
            for base in cls.bases:
                b = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
                if b:
                    todo.append((imports.get(b, module) or module, b))
        if self.checks_interface:
            out["supported"] = "SupportsEagle3" in names
            out["why"] = "implements SupportsEagle3" if out["supported"] else "lacks the SupportsEagle3 interface"
            if out["supported"] and "get_eagle3_default_aux_hidden_state_layers" not in methods:
                found = self._models_class("interfaces", "SupportsEagle3")
                if found is not None:
                    methods.update({f.name: f for f in found[0].body if isinstance(f, ast.FunctionDef)})
        else:
            llama_ok = not self.llama_only or "llama" in str(model_type or "")
            out["supported"] = llama_ok and "get_eagle3_aux_hidden_state_layers" in methods
            out["why"] = ("defines get_eagle3_aux_hidden_state_layers" if out["supported"] else
                          "model_type is not Llama" if not llama_ok else "has no get_eagle3_aux_hidden_state_layers")
        layers_fn = (methods.get("get_eagle3_default_aux_hidden_state_layers")
                     or methods.get("get_eagle3_aux_hidden_state_layers"))
        if layers_fn is not None and n_layers:
            out["default_layers"] = _default_layers(layers_fn, n_layers)
        return out

    @cached_property
    def speculators_types(self) -> tuple[str, ...]:
        """`speculators_model_type` values this vLLM reads; () = no speculators config support."""
        tree = _tree(self.pkg / "transformers_utils/configs/speculators/algos.py")
        return tuple(name for d in ast.walk(tree) if isinstance(d, ast.Call) and isinstance(d.func, ast.Name)
                     and d.func.id == "register_speculator" and d.args and (name := _str(d.args[0])) is not None) \
            if tree is not None else ()

    @cached_property
    def speculators_copies_layer_ids(self) -> bool:
        """The speculators eagle3 config copies the top-level `eagle_aux_hidden_state_layer_ids`."""
        try:
            text = (self.pkg / "transformers_utils/configs/speculators/algos.py").read_text(encoding="utf-8")
        except OSError:
            return False
        return "eagle_aux_hidden_state_layer_ids" in text


def _in_name(test: ast.AST) -> str | None:
    """`"x" in name` → "x"."""
    if isinstance(test, ast.Compare) and isinstance(test.ops[0], ast.In):
        return _str(test.left)
    return None


def _replace_args(node: ast.Call) -> tuple[str, str] | None:
    """`….replace("a", "b")` → ("a", "b"); None for any other call."""
    if isinstance(node.func, ast.Attribute) and node.func.attr == "replace" and len(node.args) == 2:
        old, new = _str(node.args[0]), _str(node.args[1])
        if old is not None and new is not None:
            return old, new
    return None


def _renames_in(node: ast.Assign) -> bool:
    return any(isinstance(n, ast.Call) and _replace_args(n) is not None for n in ast.walk(node))


def _default_layers(fn: ast.FunctionDef, n: int) -> tuple[int, ...] | None:
    """Evaluate the `return (2, num_layers // 2, num_layers - 3)` of a default-layers method."""
    ret = next((r.value for r in ast.walk(fn) if isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple)), None)
    if ret is None:
        return None

    def ev(e):
        if isinstance(e, ast.Constant) and isinstance(e.value, int):
            return e.value
        if isinstance(e, ast.Name):
            return n
        if isinstance(e, ast.BinOp):
            a, b = ev(e.left), ev(e.right)
            ops = {ast.Add: a + b, ast.Sub: a - b, ast.FloorDiv: a // b if b else None, ast.Mult: a * b}
            return ops.get(type(e.op))
        raise ValueError(ast.dump(e))

    try:
        return tuple(ev(e) for e in ret.elts)
    except (ValueError, TypeError):
        return None


def find_vllm_root() -> Path | None:
    """The folder holding the `vllm` package this Python would import (found, not imported)."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


def vllm_root_of_process(pid: int) -> Path | None:
    """The folder holding the `vllm` package the server process `pid` imports, on this host's
    paths (`sources.process.package_site`: read from `/proc/<pid>`, nothing is run). None when
    not found. Raises psutil.Error for a process that cannot be read."""
    from specwatch.sources.process import package_site

    site = package_site(pid, "vllm")
    return Path(site) if site else None
