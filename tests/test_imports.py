"""The layers hold: no import circle among specwatch's modules, counting the imports inside
functions (a circle broken by a late import is still one), and every module imports on its own
in a fresh interpreter. docs/development.md lists both with the other checks."""

from __future__ import annotations

import ast
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def modules() -> dict[str, Path]:
    out = {}
    for p in sorted((ROOT / "specwatch").rglob("*.py")):
        name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The specwatch modules `name` imports at run time: at its top and inside functions,
    not those under `if TYPE_CHECKING:` (annotations only)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(x) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for b in node.body for x in ast.walk(b)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(pkg[:len(pkg) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in out if m in known and m != name}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    # the package itself is imported by every `from specwatch import x`: not an edge of a layer
    graph = {k: {m for m in v if m != "specwatch"} for k, v in graph.items()}
    assert circles(graph) == []


def test_the_os_layer_imports_nothing_above_it():
    """specwatch/system/ (sd_notify, the listener, child processes, storage, ...) is the bottom
    layer: it imports none of specwatch's other modules (docs/development.md)."""
    known = modules()
    above = {name: sorted(m for m in imports(name, path, known) if m not in ("specwatch", "specwatch.system")
                          and not m.startswith("specwatch.system."))
             for name, path in known.items() if name.startswith("specwatch.system")}
    assert above and all(not v for v in above.values()), above


def test_the_circle_finder_finds_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_imports_alone():
    def alone(name: str) -> tuple[str, int, str]:
        r = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
        return name, r.returncode, r.stderr[-2000:]

    with ThreadPoolExecutor(4) as pool:
        # __main__ runs the command line when imported: that is its job
        failed = [(n, err) for n, rc, err in pool.map(alone, sorted(set(modules()) - {"specwatch.__main__"})) if rc]
    assert failed == []


def test_the_core_imports_no_wiring_above_it():
    """specwatch/core/ (events, pipeline, log clock, metrics, sections) is read by the wiring
    (daemon, replay, cli, alerting), never the other way round; the two it may reach are the
    `Config` it runs on and the diagnosis a collapse asks for (docs/development.md)."""
    known = modules()
    wiring = {"specwatch.daemon", "specwatch.replay", "specwatch.cli", "specwatch.alerting", "specwatch.plot",
              "specwatch.__main__"}
    core = {name: sorted(imports(name, path, known) & wiring) for name, path in known.items()
            if name.startswith("specwatch.core")}
    assert len(core) >= 6 and all(not v for v in core.values()), core
