"""Label matchers in Alertmanager's syntax, shared by routes, inhibit rules and silences.

`name=value`, `name!=value`, `name=~regex`, `name!~regex`; the value may be double-quoted
(`severity="critical"`, with `\\"` and `\\\\` escapes). Regexes are anchored at both ends, as in
Alertmanager, and a label that is absent matches as the empty string.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SYNTAX = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*$', re.S)
_OPS = ("=", "!=", "=~", "!~")


@dataclass(frozen=True)
class Matcher:
    """One label condition. `op` is one of `=`, `!=`, `=~`, `!~`."""

    name: str
    op: str
    value: str

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"unknown operator {self.op!r}; use one of {', '.join(_OPS)}")
        if self.op in ("=~", "!~"):
            try:
                object.__setattr__(self, "_re", re.compile(self.value))
            except re.error as e:
                raise ValueError(f"{self.name}{self.op}{self.value!r}: not a valid regular expression ({e})") from None

    def matches(self, labels: dict[str, str]) -> bool:
        v = labels.get(self.name, "")
        if self.op == "=":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        hit = self._re.fullmatch(v) is not None  # type: ignore[attr-defined]  # set by __post_init__ for a regex op only
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"')
        return f'{self.name}{self.op}"{escaped}"'

    def to_dict(self) -> dict:
        """Alertmanager API v2 form: {name, value, isRegex, isEqual}."""
        return {"name": self.name, "value": self.value, "isRegex": self.op in ("=~", "!~"),
                "isEqual": self.op in ("=", "=~")}

    @classmethod
    def from_dict(cls, d: dict) -> "Matcher":
        op = ("=~" if d.get("isRegex") else "=") if d.get("isEqual", True) else ("!~" if d.get("isRegex") else "!=")
        return cls(str(d["name"]), op, str(d["value"]))


def parse_matcher(text: str) -> Matcher:
    """`severity="critical"` → Matcher. Raises ValueError naming what is wrong."""
    m = _SYNTAX.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a matcher; write e.g. alertname=AcceptanceCollapse or "
                         f'severity=~"critical|warning"')
    name, op, value = m.groups()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = re.sub(r'\\(.)', r'\1', value[1:-1])
    return Matcher(name, op, value)


def matches_all(matchers: list[Matcher] | tuple[Matcher, ...], labels: dict[str, str]) -> bool:
    return all(m.matches(labels) for m in matchers)
