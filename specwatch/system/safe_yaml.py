"""Reading a YAML config file that may be hostile, bounded in time and memory.

PyYAML's `safe_load` alone raises UnicodeDecodeError on a non-UTF-8 byte, RecursionError on
`[[…]]` nested a few thousand deep, lets an alias bomb ("billion laughs") expand into values that
an error message then prints, and keeps the last of two equal keys silently. `load` refuses each
with `InputError`, naming the key path and line: bytes that are not UTF-8 text, a file over
`MAX_BYTES`, nesting deeper than `MAX_DEPTH`, aliases expanding to more than `MAX_VALUES` values or
referring to their own anchor, and a duplicate key (both lines).
"""

from __future__ import annotations

import yaml
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

MAX_BYTES = 256 * 1024  # many times the size of config.example.yaml, every key written
MAX_DEPTH = 32  # the deepest key of a config is 5 levels down (alerts.routes[0].slack.channel)
MAX_VALUES = 20_000  # values after expanding aliases (config.example.yaml: ~300)


class InputError(Exception):
    """A file refused before its values are read. `where`: key path or `line N` (never a value)."""

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")
        self.where, self.message = where, message


def _path_text(path: list[object]) -> str:
    out = ""
    for seg in path:
        out += f"[{seg}]" if isinstance(seg, int) else (f".{seg}" if out else str(seg))
        if len(out) > 60:
            return out[:60] + "…"
    return out or "(top level)"


class _GuardedLoader(yaml.SafeLoader):
    """SafeLoader whose composer tracks the key path, the depth and each node's expanded size."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._path: list[object] = []
        self._depth = 0
        self._size: dict[int, int] = {}  # id(node) -> values it holds once aliases are expanded

    def compose_node(self, parent, index):
        where = lambda: _path_text(self._path)  # noqa: E731
        mark = self.peek_event().start_mark
        if self._depth >= MAX_DEPTH:
            raise InputError(where(), f"nested deeper than {MAX_DEPTH} levels at line {mark.line + 1}; "
                             "a config needs a few levels, check the brackets")
        if self.check_event(AliasEvent):
            target = self.anchors.get(self.peek_event().anchor)
            if target is not None and id(target) not in self._size:
                raise InputError(where(), f"the alias at line {mark.line + 1} refers to its own anchor "
                                 "(a recursive value); write the value out")
        pushed = isinstance(index, (int, ScalarNode))
        if pushed:
            self._path.append(index if isinstance(index, int) else index.value[:80])
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if id(node) not in self._size:
            if isinstance(node, SequenceNode):
                size = 1 + sum(self._size[id(c)] for c in node.value)
            elif isinstance(node, MappingNode):
                size = 1 + sum(self._size[id(k)] + self._size[id(v)] for k, v in node.value)
            else:
                size = 1
            if size > MAX_VALUES:
                raise InputError(where(), f"the YAML anchors/aliases up to line {node.end_mark.line + 1} expand "
                                 f"to more than {MAX_VALUES} values (an alias bomb?); write the values out")
            self._size[id(node)] = size
        if pushed:
            self._path.pop()
        return node

    def compose_mapping_node(self, anchor: str | None) -> MappingNode:
        node = super().compose_mapping_node(anchor)
        seen: dict[tuple[str, str], int] = {}
        for key, _ in node.value:
            if not isinstance(key, ScalarNode):
                continue
            line, k = key.start_mark.line + 1, (key.tag, key.value)
            if k not in seen:
                seen[k] = line
            else:
                first = seen[k]
                raise InputError(_path_text([*self._path, key.value[:80]]),
                                 f"duplicate key at line {first} and line {line} (the second would "
                                 "silently replace the first); keep one")
        return node


def _key_at(text: str, line: int) -> str | None:
    """The key path of the value on `line` (1-based), or None when the text does not compose."""
    try:
        loader = _GuardedLoader(text)
    except yaml.YAMLError:
        return None
    try:
        node = loader.get_single_node()
    except (InputError, yaml.YAMLError, RecursionError):
        return None
    finally:
        loader.dispose()
    path: list[object] = []
    while isinstance(node, (MappingNode, SequenceNode)):
        items = node.value if isinstance(node, MappingNode) else list(enumerate(node.value))
        for k, v in items:
            first = k.start_mark.line if isinstance(k, ScalarNode) else v.start_mark.line
            if first <= line - 1 <= max(first, v.end_mark.line - (v.end_mark.column == 0)):
                path.append(k.value[:80] if isinstance(k, ScalarNode) else k)
                node = v
                break
        else:
            break
    return _path_text(path) if path else None


def _line_of(raw: bytes, offset: int) -> int:
    return raw.count(b"\n", 0, offset) + 1


def load(raw: bytes) -> object:
    """The YAML document in `raw` (None when empty). Raises InputError, or yaml.YAMLError for a
    syntax error (its `problem_mark` gives the line)."""
    if len(raw) > MAX_BYTES:
        raise InputError("(file)", f"{len(raw)} bytes; a config file is a few KB (at most {MAX_BYTES}), "
                         "is this the right file?")
    nul = raw.find(b"\0")
    if nul >= 0:
        raise InputError(f"line {_line_of(raw, nul)}", "a NUL byte: this is a binary file, not a YAML "
                         "config; give the config file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = _line_of(raw, e.start)
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        key = _key_at(raw.decode("utf-8", errors="replace"), line)
        raise InputError(f"{key + ' at ' if key else ''}line {line}, column {column}",
                         f"byte 0x{raw[e.start]:02x} is not UTF-8; save the file as UTF-8") from None
    loader = None
    try:
        loader = _GuardedLoader(text)  # checks the characters first
        return loader.get_single_data()
    except yaml.reader.ReaderError as e:
        raise InputError(f"line {text.count(chr(10), 0, e.position) + 1}",
                         f"character #x{e.character if isinstance(e.character, int) else ord(e.character):04x} "
                         "is not allowed in YAML; remove it") from None
    except RecursionError:  # MAX_DEPTH keeps the composer shallow; this is a last resort
        raise InputError("(file)", "nested too deeply; a config needs a few levels") from None
    except (ValueError, OverflowError) as e:  # e.g. an integer of more than 4300 digits
        raise InputError("(file)", f"a value cannot be read ({str(e)[:120]})") from None
    finally:
        if loader is not None:
            loader.dispose()
