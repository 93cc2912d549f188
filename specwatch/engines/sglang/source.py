"""What the installed SGLang does with an EAGLE-3 draft, read from its source with `ast`.

SGLang is never imported (it needs torch and a GPU stack); its files are read and parsed. The
facts each probe needs, and where they live (checked on 0.5.11 and 0.5.23):

- the version: `sglang/_version.py` (`__version__ = '0.5.23'`), else the dist-info `METADATA`;
- EAGLE-3 draft classes: `EntryClass` entries named `*Eagle3*` in `srt/models/*.py`
  (`LlamaForCausalLMEagle3` in `llama_eagle3.py`; `Eagle3DeepseekV2ForCausalLM` in
  `kimi_k25_eagle3.py` from 0.5.17 or so);
- the draft loader (`LlamaForCausalLMEagle3.load_weights`): the legacy rename map
  (`midlayer`→`layers.0`, 0.5.12+), `stacked_params_mapping` (q/k/v→`qkv_proj`,
  gate/up→`gate_up_proj`), the substrings it skips (`d2t`, `t2d`), how it turns `d2t` into hot
  token ids (offsets: `d2t + arange`), and the `model.` prefix rule;
- the draft module (`LlamaModel` of that file): `self.midlayer` (≤0.5.11) or `self.layers`
  (0.5.12+), the fc input width (`hidden_size_in * 3` ≤0.5.11, `* num_aux_hidden_states` after),
  whether `input_norm` (norm_before_fc, 0.5.17+) and `fc_norm` exist, the config keys it reads,
  and the `num_hidden_layers != 1` refusal;
- target capture: which class (through its bases) defines `set_eagle3_layers_to_capture`,
  whether it is a wrapper that delegates (always, only `if hasattr(...)`, or raising), and the
  id rule it applies (+1; +1 only when the first id is 1; as-is when `max(ids) == N`);
- where the engine reads the aux layer ids (`eagle_config["eagle_aux_hidden_state_layer_ids"]`
  only, `model_runner.py@0.5.11`, `spec_aux_hidden_state.py@0.5.23`);
- draft `architectures` rewrites (`configs/model_config.py`), support for the speculators config
  format (none in 0.5.11 or 0.5.23), `--speculative-draft-window-size`.

When a pattern is not found in the source (a refactor), the fact falls back to the table of
`known_versions.py` and `notes` says so.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
from dataclasses import replace
from pathlib import Path
from typing import TypeGuard

from specwatch.system import pyast
from specwatch.alerts.model import code
from specwatch.engines.sglang.known_versions import TableFacts
from specwatch.engines.sglang.facts import (  # noqa: F401  (re-exported: where probes import them from)
    AS_IS, AS_IS_IF_MAX_IS_N, METHOD, PLUS_ONE, PLUS_ONE_IF_FIRST_IS_1, UNKNOWN, CaptureSupport, DraftRules,
    SGLangFacts, capturable, capture_indices, version_tuple)



# --------------------------------------------------------------------------------------------
# Discovery


def sglang_root_from(path: str | Path) -> Path:
    """The folder that contains the `sglang` package: accepts that folder (site-packages, a
    `pip install --target` dir) or the package dir itself. Raises FileNotFoundError saying
    whether the folder is missing or holds no package, and how to get the source."""
    p = Path(path)
    if (p / "sglang" / "__init__.py").is_file():
        return p
    if p.name == "sglang" and (p / "__init__.py").is_file():
        return p.parent
    m = re.search(r"sglang-(\d+\.\d+[\w.]*)$", p.name)  # `.cache/sglang-0.5.11` names its version
    get = (code(f"python3 -m pip install --no-deps --target {shlex.quote(str(path))} "
                f"sglang=={m.group(1) if m else 'VERSION'}") + " puts the source there (read, never imported)")
    if not p.exists():
        raise FileNotFoundError(f"SGLang root {path}: no such folder; {get}, or give the "
                                "site-packages folder of the SGLang the server runs")
    raise FileNotFoundError(f"SGLang root {path}: no `sglang` package in this folder (give the folder that "
                            f"contains sglang/, e.g. the server's site-packages); {get}")


def find_sglang_root() -> Path | None:
    """The importable `sglang`'s folder, found with `importlib.util.find_spec` (not imported)."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


def sglang_root_of_process(pid: int) -> Path | None:
    """The folder holding the `sglang` package the process `pid` (the SGLang server) imports,
    read from `/proc/<pid>` and the files it names (`sources.process.package_site`; nothing is
    run). None when not found or the process cannot be read."""
    import psutil

    from specwatch.sources.process import package_site

    try:
        site = package_site(pid, "sglang")
    except (psutil.Error, OSError):
        return None
    return Path(site) if site else None


def read_version(root: Path) -> str | None:
    """`__version__` from `sglang/_version.py` (ast), else `Version:` of the dist-info METADATA."""
    vfile = root / "sglang" / "_version.py"
    if vfile.is_file():
        try:
            for node in ast.walk(pyast.parse(vfile.read_text(encoding="utf-8-sig"))):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                    if any(isinstance(t, ast.Name) and t.id in ("__version__", "version") for t in node.targets):
                        return node.value.value
        except SyntaxError:
            pass
    for meta in sorted(root.glob("sglang-*.dist-info/METADATA")):
        m = re.search(r"^Version:\s*(\S+)", meta.read_text(errors="replace"), re.M)
        if m:
            return m.group(1)
    return None




# --------------------------------------------------------------------------------------------
# Facts




def _str_const(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is_self_attr(node: ast.AST, attr: str | None = None) -> TypeGuard[ast.Attribute]:
    return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
            and (attr is None or node.attr == attr))


def _self_assigns(func: ast.AST) -> dict[str, list[ast.expr]]:
    """`self.x = value` assignments anywhere in `func`: attr → values."""
    out: dict[str, list[ast.expr]] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if _is_self_attr(t):
                    out.setdefault(t.attr, []).append(node.value)
    return out


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _config_keys(tree: ast.AST) -> set[str]:
    """String keys read as `getattr(x, "k", ...)`, `hasattr(x, "k")`, `x.get("k", ...)`."""
    keys: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in ("getattr", "hasattr") and len(node.args) >= 2:
            k = _str_const(node.args[1])
        elif isinstance(f, ast.Attribute) and f.attr == "get" and node.args:
            k = _str_const(node.args[0])
        else:
            continue
        if k:
            keys.add(k)
    return keys


class SourceFacts(SGLangFacts):
    """Facts read from an SGLang install at `root` (the folder containing `sglang/`).

    Files are read on demand and parsed once; the whole `srt/models` scan is never needed (files
    are picked by a substring search first). Raises FileNotFoundError from the constructor when
    `root` has no `sglang` package.
    """

    source = "source"

    def __init__(self, root: str | Path):
        super().__init__()
        self.root = sglang_root_from(root)
        self.pkg = self.root / "sglang"
        self.version = read_version(self.root)
        self._texts: dict[str, str] | None = None
        self._trees: dict[str, ast.Module | None] = {}
        self._capture: dict[str, CaptureSupport] = {}
        self._rules: dict[str, DraftRules | None] = {}
        self._fallback = None

    def describe(self) -> str:
        return f"SGLang {self.version or '(version unknown)'} read from {self.pkg}"

    def _table(self):
        if self._fallback is None:
            self._fallback = TableFacts(self.version)
        return self._fallback

    # -- files -------------------------------------------------------------------------------
    def _model_texts(self) -> dict[str, str]:
        if self._texts is None:
            self._texts = {}
            for p in sorted((self.pkg / "srt" / "models").glob("*.py")):
                try:
                    self._texts[p.name] = p.read_text(encoding="utf-8-sig", errors="replace")
                except OSError:
                    continue
        return self._texts

    def _tree(self, rel: str) -> ast.Module | None:
        """Parse `srt/models/<rel>` (a bare file name) or a path relative to the package."""
        if rel not in self._trees:
            text = self._model_texts().get(rel) if "/" not in rel else None
            if text is None:
                p = self.pkg / rel
                text = p.read_text(encoding="utf-8-sig", errors="replace") if p.is_file() else None
            try:
                tree = pyast.parse(text) if text is not None else None
                self._trees[rel] = tree if isinstance(tree, ast.Module) else None  # mode "exec": a Module
            except SyntaxError as e:
                self.notes.append(f"could not parse sglang/{rel}: {e.msg} (line {e.lineno})")
                self._trees[rel] = None
        return self._trees[rel]

    def _find_class(self, name: str) -> tuple[str, ast.ClassDef] | None:
        pat = re.compile(rf"^class {re.escape(name)}\b", re.M)
        for fname, text in self._model_texts().items():
            if pat.search(text):
                tree = self._tree(fname)
                for node in (tree.body if tree else []):
                    if isinstance(node, ast.ClassDef) and node.name == name:
                        return fname, node
        return None

    def _imports(self, fname: str) -> dict[str, tuple[str, str]]:
        out = {}
        tree = self._tree(fname)
        for node in (ast.walk(tree) if tree else []):  # local imports too
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sglang.srt.models."):
                for a in node.names:
                    out[a.asname or a.name] = (node.module.rsplit(".", 1)[1] + ".py", a.name)
        return out

    def _resolve(self, fname: str, expr: ast.expr) -> tuple[str, ast.ClassDef] | None:
        """A class named in `fname` (base or constructor call) → its definition."""
        if not isinstance(expr, ast.Name):
            return None
        tree = self._tree(fname)
        for node in (tree.body if tree else []):
            if isinstance(node, ast.ClassDef) and node.name == expr.id:
                return fname, node
        imp = self._imports(fname).get(expr.id)
        if imp:
            tree = self._tree(imp[0])
            for node in (tree.body if tree else []):
                if isinstance(node, ast.ClassDef) and node.name == imp[1]:
                    return imp[0], node
        return None

    def _mro(self, fname: str, cls: ast.ClassDef, seen=None):
        """Depth-first over sglang-defined bases: yields (file, ClassDef)."""
        seen = seen if seen is not None else set()
        if (fname, cls.name) in seen:
            return
        seen.add((fname, cls.name))
        yield fname, cls
        for b in cls.bases:
            r = self._resolve(fname, b)
            if r:
                yield from self._mro(r[0], r[1], seen)

    # -- registry ----------------------------------------------------------------------------
    def _entry_classes(self, fname: str) -> list[str]:
        tree = self._tree(fname)
        names: list[str] = []
        for node in (tree.body if tree else []):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets):
                names += [n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)]
        return names

    def is_registered(self, arch: str) -> bool:
        return any("EntryClass" in text and arch in text and arch in self._entry_classes(f)
                   for f, text in self._model_texts().items())

    def eagle3_draft_classes(self) -> list[str]:
        out = []
        for f, text in self._model_texts().items():
            if "EntryClass" in text and "Eagle3" in text:
                out += [n for n in self._entry_classes(f) if "Eagle3" in n]
        return sorted(set(out))

    # -- draft loader ------------------------------------------------------------------------
    def draft_rules(self, arch: str) -> DraftRules | None:
        if arch not in self._rules:
            self._rules[arch] = self._read_draft_rules(arch)
        return self._rules[arch]

    def _read_draft_rules(self, arch: str) -> DraftRules | None:
        found = self._find_class(arch)
        if found is None or arch not in self.eagle3_draft_classes():
            return None
        fname, cls = found
        tree = self._tree(fname)  # parsed: the class was found in it
        keys = _config_keys(tree) if tree is not None else set()
        rules = DraftRules(cls=arch, file=f"srt/models/{fname}", config_keys=frozenset(keys))
        load = next((m for _, c in self._mro(fname, cls) if (m := _method(c, "load_weights"))), None)
        init = _method(cls, "__init__")
        model_cls = None
        if init is not None:
            for v in _self_assigns(init).get("model", []):
                if isinstance(v, ast.Call):
                    model_cls = self._resolve(fname, v.func)
        if load is None or model_cls is None:
            self.notes.append(f"{arch}: load_weights or its model class not found in sglang/{rules.file}")
            return replace(rules, modelled=False)
        rules = self._read_loader(arch, load, rules)
        return self._read_module(model_cls[1], init, rules)

    def _read_loader(self, arch: str, load: ast.FunctionDef, rules: DraftRules) -> DraftRules:
        renames: tuple[tuple[str, str], ...] = ()
        stacked: tuple[tuple[str, str, object], ...] | None = None
        skips: list[str] = []
        prefix: str | None = None
        offsets: bool | None = None
        regex_rename = False
        for node in ast.walk(load):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
                try:
                    value = pyast.literal_eval(node.value)
                except (ValueError, SyntaxError, TypeError):
                    continue
                if name == "stacked_params_mapping":
                    stacked = tuple(tuple(row) for row in value)
                elif isinstance(value, dict) and value and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
                    renames = tuple(value.items())
            elif isinstance(node, ast.If):
                t = node.test
                if (isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.In)
                        and (skip := _str_const(t.left)) and isinstance(t.comparators[0], ast.Name)
                        and any(isinstance(s, ast.Continue) for s in node.body)):
                    skips.append(skip)
                    if skip == "d2t":
                        offsets = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "arange"
                                      for n in ast.walk(node))
            elif isinstance(node, ast.JoinedStr) and node.values and (head := _str_const(node.values[0])):
                if head.endswith(".") and prefix is None:
                    prefix = head
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "sub":
                regex_rename = True
        if regex_rename or stacked is None or prefix is None:
            # not the Llama loader shape (e.g. the MLA draft's regex mapping): not modelled
            self.notes.append(f"{arch}: its load_weights is not the Llama EAGLE-3 loader; key mapping not modelled")
            return replace(rules, modelled=False, renames=renames, skips=tuple(skips) or rules.skips)
        return replace(rules, renames=renames, stacked=stacked, skips=tuple(skips) or rules.skips,
                       prefix=prefix, d2t_offsets=True if offsets is None else offsets)

    def _read_module(self, model: ast.ClassDef, outer_init: ast.FunctionDef | None, rules: DraftRules) -> DraftRules:
        if not rules.modelled:
            return rules
        init = _method(model, "__init__")
        assigns = _self_assigns(init) if init else {}
        decoder = "midlayer" if "midlayer" in assigns else "layers" if "layers" in assigns else None
        fc_aux = None
        for v in assigns.get("fc", []):
            if isinstance(v, ast.Call) and v.args and isinstance(v.args[0], ast.BinOp):
                ops = (v.args[0].left, v.args[0].right)
                consts = [o.value for o in ops if isinstance(o, ast.Constant) and isinstance(o.value, int)]
                fc_aux = f"fixed:{consts[0]}" if consts else "config"
        single = False
        for scope in filter(None, (init, outer_init)):
            for n in ast.walk(scope):
                if (isinstance(n, ast.Compare) and isinstance(n.left, ast.Attribute) and n.left.attr == "num_hidden_layers"
                        and isinstance(n.ops[0], ast.NotEq) and isinstance(n.comparators[0], ast.Constant)
                        and n.comparators[0].value == 1):
                    single = True
        has_call = lambda attr: any(isinstance(v, ast.Call) for v in assigns.get(attr, []))  # noqa: E731
        own = self._tree(rules.file.rsplit("/", 1)[1])  # parsed: the draft class was found in it
        tree_text = ast.unparse(own) if own is not None else ""
        if decoder is None or fc_aux is None:
            table = self._table().draft_rules(rules.cls)
            self.notes.append(f"{rules.cls}: decoder container or fc width not found in sglang/{rules.file}; "
                              "using specwatch's table for this version")
            return replace(table, config_keys=rules.config_keys) if table else replace(rules, modelled=False)
        return replace(rules, decoder=decoder, fc_aux=fc_aux, single_layer_only=single,
                       input_norm=has_call("input_norm"), fc_norm=has_call("fc_norm"),
                       input_layer_only_2h="is_input_layer" in tree_text)

    # -- target capture ----------------------------------------------------------------------
    def capture(self, arch: str) -> CaptureSupport:
        if arch not in self._capture:
            self._capture[arch] = self._read_capture(arch, depth=0)
        return self._capture[arch]

    def _read_capture(self, arch: str, depth: int) -> CaptureSupport:
        found = self._find_class(arch)
        if found is None:
            return CaptureSupport(arch, "unregistered")
        fname, cls = found
        owner = next(((f, c, m) for f, c in self._mro(fname, cls) if (m := _method(c, METHOD))), None)
        if owner is None:
            return CaptureSupport(arch, "missing", file=f"srt/models/{fname}")
        f_owner, c_owner, method = owner
        base = CaptureSupport(arch, "direct", owner=c_owner.name, file=f"srt/models/{f_owner}")
        rule = _id_rule(method)
        if rule != UNKNOWN or _sets_layers(method):
            return replace(base, id_rule=rule if rule != UNKNOWN else PLUS_ONE)
        # a wrapper: find `self.<attr>.set_eagle3_layers_to_capture(...)`
        attr, kind = _delegation(method)
        if attr is None:
            return replace(base, kind=UNKNOWN)
        inner = None
        if depth < 4:
            for f, c in self._mro(f_owner, c_owner):
                init = _method(c, "__init__")
                for v in (_self_assigns(init).get(attr, []) if init else []):
                    if isinstance(v, ast.Call) and isinstance(v.func, ast.Name):
                        r = self._resolve(f, v.func)
                        if r:
                            inner = self._read_capture(r[1].name, depth + 1)
                if inner:
                    break
        return replace(base, kind=kind, inner=inner, inner_attr=attr,
                       id_rule=inner.effective.id_rule if inner else UNKNOWN)

    def aux_ids_top_level_read(self) -> bool:
        for rel in ("srt/model_executor/model_runner_components/spec_aux_hidden_state.py",
                    "srt/model_executor/model_runner.py"):
            tree = self._tree(rel)
            if tree is None:
                continue
            for func in ast.walk(tree):
                if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                consts = {_str_const(n) for n in ast.walk(func)}
                if "use_aux_hidden_state" in consts and "eagle_aux_hidden_state_layer_ids" in consts and "eagle_config" in consts:
                    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr"
                               and len(n.args) >= 2 and _str_const(n.args[1]) == "eagle_aux_hidden_state_layer_ids"
                               for n in ast.walk(func))
        self.notes.append("where the engine reads aux layer ids was not found; assuming eagle_config only")
        return False

    def reads_speculators_config(self) -> bool:
        for sub in ("srt/configs", "srt/utils", "srt/model_loader", "srt/models"):
            for p in (self.pkg / sub).rglob("*.py"):
                try:
                    if b"speculators_model_type" in p.read_bytes():
                        return True
                except OSError:
                    continue
        return False

    def draft_arch_rewrites(self) -> dict[str, str]:
        tree = self._tree("srt/configs/model_config.py")
        out: dict[str, str] = {}
        for node in ast.walk(tree) if tree else []:
            if not isinstance(node, ast.If):
                continue
            names = {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node.test)
                     if isinstance(n, (ast.Name, ast.Attribute))}
            if "is_draft_model" not in names or "architectures" not in names:
                continue
            sources = [name for n in ast.walk(node.test) if isinstance(n, ast.Compare)
                       for c in ([n.comparators[0]] if not isinstance(n.comparators[0], (ast.List, ast.Tuple))
                                 else n.comparators[0].elts) if (name := _str_const(c))]
            for stmt in node.body:
                if (isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Subscript)
                        and "architectures" in ast.unparse(stmt.targets[0]) and (value := _str_const(stmt.value))):
                    for s in sources:
                        out[s] = value
        return out

    def has_draft_window_flag(self) -> bool:
        for rel in ("srt/server_args.py", "srt/arg_groups/fields/spec.py"):
            p = self.pkg / rel
            if p.is_file() and "speculative_draft_window_size" in p.read_text(errors="replace"):
                return True
        return False


def _sets_layers(method: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "layers_to_capture" for n in ast.walk(method))


def _id_rule(method: ast.FunctionDef) -> str:
    """The id transform a `set_eagle3_layers_to_capture` body applies (module constants)."""
    text = ast.unparse(method)
    plus_one = any(isinstance(n, ast.ListComp) and isinstance(n.elt, ast.BinOp) and isinstance(n.elt.op, ast.Add)
                   and isinstance(n.elt.right, ast.Constant) and n.elt.right.value == 1 for n in ast.walk(method))
    if re.search(r"layer_ids\[0\]\s*==\s*1", text):
        return PLUS_ONE_IF_FIRST_IS_1
    if re.search(r"max\(layer_ids\)\s*==\s*num_layers", text):
        return AS_IS_IF_MAX_IS_N
    if plus_one:
        return PLUS_ONE
    if re.search(r"layers_to_capture\s*=\s*list\(layer_ids\)", text):
        return AS_IS
    return UNKNOWN


def _delegation(method: ast.FunctionDef) -> tuple[str | None, str]:
    """(inner attribute, kind) of a wrapper's `set_eagle3_layers_to_capture`."""
    call_attr = None
    for n in ast.walk(method):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == METHOD
                and _is_self_attr(n.func.value)):
            call_attr = n.func.value.attr
    if call_attr is None:
        return None, UNKNOWN
    for n in ast.walk(method):
        if isinstance(n, ast.If) and "hasattr" in ast.unparse(n.test) and METHOD in ast.unparse(n.test):
            if any(isinstance(s, ast.Raise) for s in n.body):
                return call_attr, "delegate_or_raise"
            if not n.orelse:
                return call_attr, "delegate_if_present"
    return call_attr, "delegate"
