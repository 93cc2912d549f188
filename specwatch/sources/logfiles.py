"""The configured logs as files: globs expanded, `server:` templates filled in, and the stage
each file's lines pass on their way from the `Follower` to the pipeline.

`logs[].path` may be a glob (`/var/log/pods/*_sglang-*/*/*.log`,
`/var/lib/docker/containers/*/*-json.log`): `LogSet.scan` lists the files it matches now, leaving
out compressed and temporary files and rotated copies of matched ones (`0.log.20261130-100000`,
`-json.log.1`: the follower reads those itself). The daemon rescans every `follow.rescan_interval`,
so pods and containers that appear later are followed, and it stops following a file whose
directory is gone (a deleted pod or container). `server:` may name fields of the file's place
(`config.TEMPLATE_FIELDS`, from `container.names`): `server: "{pod}"`.

`stage` builds a file's `on_lines`: the container envelope unwrapped (`container.Unwrap`), then
the line grammar (`grammar.Regrammar`); for a plain SGLang file with `format: sglang` it is the
pipeline's own callback, untouched.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import re
import string
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from zoneinfo import ZoneInfo

from specwatch.config import Config, LogSource
from specwatch.sources.container import Unwrap, names
from specwatch.sources.filestream import LineBatch
from specwatch.sources.grammar import Grammar, Regrammar
from specwatch.sources.rotated import rotation_suffix

log = logging.getLogger(__name__)



def is_pattern(path: str) -> bool:
    return glob.has_magic(path)


class _Values(dict):
    def __missing__(self, key: str) -> str:  # a field this file's place does not give
        return self["file"]


def resolve(src: LogSource, path: str) -> LogSource:
    """`src` for the file `path`: its server template filled in (a field that cannot be read from
    the file's place becomes the file's name)."""
    server = src.server
    if "{" in server:
        server = string.Formatter().vformat(server, (), _Values(names(path)))
    return dataclasses.replace(src, path=path, server=server)


def matches(pattern: str, known: AbstractSet[str] = frozenset()) -> list[str]:
    """Regular files matching `pattern`, sorted, without `.gz`/`.tmp` files and without rotated
    copies of another match or of a `known` file."""
    found = sorted(p for p in glob.glob(pattern) if not p.endswith((".gz", ".tmp")) and os.path.isfile(p))
    bases = set(found) | set(known)
    out = []
    for p in found:
        d = os.path.dirname(p)
        if not any(b != p and p.startswith(b) and os.path.dirname(b) == d and rotation_suffix(p[len(b):])
                   for b in bases):
            out.append(p)
    return out


ABSENT_GRACE = 60.0  # s a glob's file may be missing (mid-rotation) before it is dropped


class LogSet:
    """The files of the configured `sources` (LogSources whose path may be a glob)."""

    def __init__(self, sources: list[LogSource]) -> None:
        self.sources = list(sources)
        self.patterns = any(is_pattern(s.path) for s in self.sources)
        self._files: dict[str, tuple[LogSource, bool]] = {}  # path → (its source, from a glob)
        self._empty_warned: set[str] = set()
        self._absent: dict[str, float] = {}  # a glob's file no longer matched → since (monotonic)

    def scan(self) -> list[LogSource]:
        """One LogSource per file, in configured order: plain paths always (followed once they
        appear), each glob's current matches. Never raises."""
        out: dict[str, tuple[LogSource, bool]] = {}
        for src in self.sources:
            if not is_pattern(src.path):
                out.setdefault(src.path, self._files.get(src.path) or (resolve(src, src.path), False))
                continue
            found = matches(src.path, set(self._files) | set(out))
            if not found and src.path not in self._empty_warned:
                self._empty_warned.add(src.path)
                log.warning("logs: %s matches no file yet; files that appear are followed once they do "
                            "(follow.rescan_interval)", src.path)
            for p in found:
                out.setdefault(p, self._files.get(p) or (resolve(src, p), True))
        now = time.monotonic()
        for p, entry in self._files.items():  # mid-rotation the live name can be briefly absent
            if p in out or not entry[1]:
                self._absent.pop(p, None)
                continue
            # ... but a file the runtime deleted (kubelet removes an old container's N.log from a
            # pod directory that stays) is dropped after ABSENT_GRACE, not followed forever
            since = self._absent.setdefault(p, now)
            if os.path.isdir(os.path.dirname(p)) and now - since < ABSENT_GRACE:
                out[p] = entry
        for p in out.keys() - self._files.keys():
            if out[p][1]:
                log.info("logs: following %s (server %s)", p, out[p][0].server)
        self._files = out
        self._absent = {p: t for p, t in self._absent.items() if p in out}
        return [src for src, _ in out.values()]

    def apply(self, cfg: Config) -> Config:
        """`cfg` with `logs` one entry per file (see `scan`)."""
        return dataclasses.replace(cfg, logs=self.scan())


def stage(src: LogSource, on_lines: Callable[[LineBatch], None],
          max_line_bytes: int = 1_048_576) -> Callable[[LineBatch], None]:
    """The `on_lines` of `src`'s Follower: envelope, then grammar, then `on_lines`."""
    cb = on_lines
    if src.grammar:
        prefix = re.compile(src.container_prefix) if src.container_prefix else None
        cb = Regrammar(Grammar(src.grammar, container_prefix=prefix,
                               tz=ZoneInfo(src.timezone) if src.timezone else None), cb)
    if src.envelope != "plain":
        cb = Unwrap(cb, src.envelope, max_line_bytes)
    return cb
