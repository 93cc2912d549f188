"""The long options of a real SGLang's server command line, read from its sources (never imported).

0.5.11: every `parser.add_argument("--a", "--b", ...)` in `sglang/srt/server_args.py`.
0.5.23: those of `server_args.py` plus one per `A[...]` field of `sglang/srt/arg_groups/fields/`
(`--field-name` or `Arg(cli_name=...)`, with `Arg(aliases=[...])`, none for `Arg(no_cli=True)`),
as `arg_utils.add_cli_args_from_dataclass` registers them.
"""

from __future__ import annotations

import argparse
import ast

from specwatch.system import pyast
from pathlib import Path


def _strs(node) -> list[str]:
    if isinstance(node, (ast.List, ast.Tuple)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _add_argument_calls(path: Path) -> list[list[str]]:
    out = []
    for node in ast.walk(pyast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                     and a.value.startswith("--")]
            if names:
                out.append(names)
    return out


def _field_options(path: Path) -> list[list[str]]:
    out = []
    for node in ast.walk(pyast.parse(path.read_text())):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(node.annotation, ast.Subscript) and getattr(node.annotation.value, "id", "") == "A"):
            continue
        name = node.target.id
        if name.startswith("_"):
            continue
        elts = node.annotation.slice.elts if isinstance(node.annotation.slice, ast.Tuple) else []
        meta = elts[1] if len(elts) > 1 else None
        if isinstance(meta, ast.Call) and getattr(meta.func, "id", "") == "Arg":
            kw = {k.arg: k.value for k in meta.keywords}
            if isinstance(kw.get("no_cli"), ast.Constant) and kw["no_cli"].value:
                continue
            cli = kw["cli_name"].value if isinstance(kw.get("cli_name"), ast.Constant) else "--" + name.replace("_", "-")
            out.append([cli] + _strs(kw.get("aliases")))
        elif isinstance(meta, ast.Constant) and isinstance(meta.value, str):
            out.append(["--" + name.replace("_", "-")])
    return out


def option_groups(root: Path) -> list[list[str]]:
    """Each argument's long option strings (first: its name, then its aliases)."""
    srt = root / "sglang" / "srt"
    groups = _add_argument_calls(srt / "server_args.py")
    for f in sorted((srt / "arg_groups" / "fields").glob("*.py")):
        groups += _field_options(f)
    return groups


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _Refused(message)


def argparse_reading(root: Path):
    """A function `option string → the first long option of the argument a real argparse
    (allow_abbrev=True, SGLang's default) reads it as`, or None when argparse refuses it or it
    is not an option of that SGLang."""
    p = _Parser(add_help=False, allow_abbrev=True)
    for i, names in enumerate(option_groups(root)):
        p.add_argument(*names, dest=f"a{i}", nargs="?")
    first = {f"a{i}": names[0] for i, names in enumerate(option_groups(root))}

    def read(option: str) -> str | None:
        try:
            ns, rest = p.parse_known_args([option, "v"])
        except _Refused:
            return None
        hit = [k for k, v in vars(ns).items() if v is not None]
        return first[hit[0]] if hit else None

    return read
