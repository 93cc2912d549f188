"""The building blocks of every config section, declared once and shared by config.py and the
rule files (a rule's section lives in its own file, `@rule_section`): the field types with their
bounds, `Section` (a msgspec Struct), the bounds an unwritten default keeps (`Bound`,
`hysteresis`), the rule-section registry, and what ties a process to a configured server
(`ProcessTies`). Nothing here reads a document: specwatch/config.py does (and imports the rule
files), so a rule file imports only this module, never config.py."""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Annotated, Any, Callable, ClassVar, Iterable, NamedTuple
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

if TYPE_CHECKING:
    from specwatch.config import Config

# Field types shared by sections. A duration field is a float of seconds marked `extra=DURATION`:
# it also accepts `250ms`, `30s`, `5m`, `4h`, `1d`. Every number is bounded, so no value in a
# config can make a timer never fire or a buffer unbounded.
YEAR = 365 * 86400.0
DURATION = {"duration": True}
Seconds = Annotated[float, Meta(ge=0.001, le=YEAR, extra=DURATION)]
Count = Annotated[int, Meta(ge=1, le=1_000_000)]
Ratio = Annotated[float, Meta(ge=0.0, le=1.0)]
AcceptLength = Annotated[float, Meta(ge=1.0, le=100.0)]  # SGLang's accept len: 1 + accepted draft tokens


class Bound(NamedTuple):
    """An entry of `Section.default_bounds` whose limit is computed from other keys.

    While `key` is not written, its default (or inherited) value is kept `how` ("at_most",
    "at_least", "below", "above") `limit(section)`, which reads the keys `on`; a default that
    does not fit takes `bent(section)` (None: the limit itself), held within the key's own range.
    Where no value in that range fits, the default stays and the section's problem is reported
    under the written key of `on` (`_Reader.section_of`)."""

    key: str
    how: str
    on: tuple[str, ...]
    limit: Callable[[Any], float]
    bent: Callable[[Any], float] | None = None


def hysteresis(low: str, high: str, up: Callable[[float], float], down: Callable[[float], float]) -> tuple[Bound, Bound]:
    """The `default_bounds` of two thresholds that must stay apart, `low` below `high` (a firing
    and a recovery threshold): while only `low` is written, `high`'s default, where it is not
    above it, becomes up(low); while only `high` is, `low`'s becomes down(high)."""
    return (Bound(high, "above", (low,), attrgetter(low), lambda c: up(getattr(c, low))),
            Bound(low, "below", (high,), attrgetter(high), lambda c: down(getattr(c, high))))


class Section(msgspec.Struct, kw_only=True):
    """One config section, declared once: fields with types (bounds in `msgspec.Meta`; a
    `description` says what a value is, for messages) and defaults. A field may carry another
    YAML name (`msgspec.field(name="for")`). Read by `_Reader.section_of`."""

    example: ClassVar[str] = ""  # an entry in flow style, for a section that is a list item
    # (key, "at_most" | "at_least", other key), or a `Bound`: while `key` is not written in this
    # mapping, its default (or inherited) value is bounded by `other`'s, so a default never refuses
    # a key the user wrote; Prometheus does the same with scrape_timeout: min(its default, the
    # interval) (prometheus/prometheus config/config.go, GlobalConfig.UnmarshalYAML).
    default_bounds: ClassVar[tuple[tuple[str, str, str] | Bound, ...]] = ()

    def problems(self) -> Iterable[tuple[str, str]]:
        """Checks across fields: (key within the section, what is wrong; how to fix)."""
        return ()


_RULE_SECTIONS: dict[str, tuple[str, type[Section]]] = {}


def rule_section(key: str, attr: str | None = None):
    """Class decorator for a rule's Section: read from `rules.<key>`, found as `Config.<attr>`
    (default: key). Declared in the rule's file, so adding a rule does not touch this module."""

    def deco(cls: type[Section]) -> type[Section]:
        _RULE_SECTIONS[key] = (attr or key, cls)
        return cls

    return deco


# a drop rule's unwritten ratio follows the written one where its default no longer fits:
# recover_drop_ratio becomes half of max_drop_ratio (as the defaults are), max_drop_ratio twice
# recover_drop_ratio but at most halfway from it to 1 (a drop of 1 would never fire)
DROP_BOUNDS = hysteresis("recover_drop_ratio", "max_drop_ratio", up=lambda x: min(2 * x, (1 + x) / 2),
                         down=lambda x: x / 2)


def drop_hysteresis(max_drop: float, recover_drop: float) -> list[tuple[str, str]]:
    """The problem of a drop rule whose recover ratio is not below its firing ratio (it would flap)."""
    if recover_drop >= max_drop:
        return [("recover_drop_ratio", f"must be below max_drop_ratio ({max_drop}) or the alert would flap; "
                 f"leave it out (it then follows max_drop_ratio) or write e.g. {max_drop / 2:g}")]
    return []


LOCAL_HOSTS = frozenset(("127.0.0.1", "localhost", "::1", "0.0.0.0", "::"))


@dataclass(frozen=True)
class ProcessTies:
    """What makes an SGLang process found on the box a configured server (process source).

    logs: followed log path → server (the process writes its stdout/stderr there). api_ports:
    --port of a `server_api` or `server_metrics` URL on this host → server. configured: the names of configured
    servers: `process.servers`' names when given, else those of `logs` and `api_ports`.
    """

    logs: dict[str, str]
    api_ports: dict[int, str]
    configured: frozenset[str]

    @classmethod
    def of(cls, cfg: "Config") -> "ProcessTies":
        logs = {src.path: src.server for src in cfg.logs}
        ports: dict[int, str] = {}
        # both filled by config.py (url and server set on every entry it keeps)
        urls = ([(a.url or "", a.server or "") for a in cfg.server_apis]
                + [(m.url or "", m.server or "") for m in cfg.server_metrics])
        for url, server in urls:  # SGLang serves /metrics on its --port
            u = urlsplit(url)
            if (u.hostname or "") in LOCAL_HOSTS and u.port:
                ports.setdefault(u.port, server)
        named = cfg.process.servers.values() if cfg.process.servers else [*logs.values(), *ports.values()]
        return cls(logs, ports, frozenset(named))
