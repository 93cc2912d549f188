"""/metrics rendered from a registry with prometheus-client's own encoders, their escaping cached.

prometheus-client renders every sample line from scratch: each label name and value is escaped
character by character (`openmetrics.exposition._escape`, prometheus-client 0.26), the bulk of a
scrape's CPU (docs/performance.md "Scrapes"). The label sets of specwatch's series stay the same
from scrape to scrape while their values move, so `Exposition` asks the library's encoder
(`choose_encoder`, the one its own `/metrics` app picks for the `Accept` header) once per family
*shape*: the family's name, type, help, unit and each sample's name and labels. It renders that
family with every value 0.0 and keeps its header lines and, per sample, the line up to the value.
Later scrapes of the same shape write those prefixes followed by `floatToGoString(value)`, the
library's own value format, so the body is byte for byte what the library writes. A family the
template cannot express (a sample with a timestamp, an exemplar or a native histogram; a histogram
or summary, whose text rendering reorders samples) is rendered by the library each time.

A family whose samples are those of the last scrape is its last text again; in one whose series
are the same, a line whose value stayed is kept. The compressed body is kept beside its text and
reused while the text stays the same (nothing read, nothing changed).
"""

from __future__ import annotations

import copy
import gzip
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import parse_qs

from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

GZIP_LEVEL = 1  # a scrape is compressed once and read once: speed over the last bytes


class _One(Collector):
    """A collector of the given families (the encoders take a registry-like `collect()`)."""

    def __init__(self, *families):
        self.families = families

    def collect(self) -> Iterable:
        return self.families


def _plain(family) -> bool:
    """Every sample one line of `name{labels} value`, in order: no timestamp, exemplar or
    native histogram, and a name the family's type writes as is (no `_bucket`, `_created` ...)."""
    names = (family.name, family.name + "_total", family.name + "_info")
    return all(s.name in names and s.timestamp is None and s.exemplar is None
               and getattr(s, "native_histogram", None) is None for s in family.samples)


@dataclass(slots=True)
class _Rendered:
    """A family as last written: its samples, each sample's (name, labels), the header lines,
    each line up to its value, the lines, the text."""

    samples: list
    labels: list
    header: str
    prefixes: list[str]
    lines: list[str]
    text: str


class Exposition:
    """`render(accept)`: (body, content type) of `registry` for a request's `Accept` header,
    as prometheus-client's `generate_latest` / OpenMetrics `generate_latest` write it.
    Thread-safe (one render at a time: scrapes are seconds apart)."""

    def __init__(self, registry: Collector):
        self.registry = registry
        self._lock = threading.Lock()
        # content type -> {(name, type, help, unit): _Rendered} of the last render
        self._templates: dict[str, dict] = {}
        self._gzipped: tuple[bytes, bytes] | None = None  # (body, its gzip) of the last gzip answer

    def render(self, accept: str | None) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept or "")
        with self._lock:
            old = self._templates.get(content_type, {})
            new: dict = {}
            out: list[str] = []
            for family in self.registry.collect():
                head = (family.name, family.type, family.documentation, family.unit)
                last = old.get(head)
                samples = family.samples
                if last is not None and last.samples == samples:  # nothing changed: its text again
                    new[head] = last
                    out.append(last.text)
                    continue
                if not _plain(family):
                    out.append(self._alone(encoder, family))
                    continue
                labels = [(s.name, s.labels) for s in samples]
                t = last if last is not None and last.labels == labels else self._template(encoder, family, labels)
                if t is None:
                    out.append(self._alone(encoder, family))
                    continue
                prefixes, header = t.prefixes, t.header
                if last is not None and t is last:  # same series: a line whose value stayed is kept
                    before, kept = last.samples, last.lines
                    lines = [line if s.value == was.value and s.value != 0 else f"{p} {floatToGoString(s.value)}\n"
                             for p, s, was, line in zip(prefixes, samples, before, kept)]
                else:
                    lines = [f"{p} {floatToGoString(s.value)}\n" for p, s in zip(prefixes, samples)]
                r = _Rendered(list(samples), labels, header, prefixes, lines, header + "".join(lines))
                new[head] = r
                out.append(r.text)
            out.append(self._trailer(encoder))
            self._templates[content_type] = new  # families gone from this scrape are dropped
        return "".join(out).encode("utf-8"), content_type

    def gzip(self, body: bytes) -> bytes:
        """`body` compressed, reused while the body stays the same."""
        with self._lock:
            if self._gzipped is not None and self._gzipped[0] == body:
                return self._gzipped[1]
        z = gzip.compress(body, compresslevel=GZIP_LEVEL)
        with self._lock:
            self._gzipped = (body, z)
        return z

    @staticmethod
    def _alone(encoder: Callable, family) -> str:
        return encoder(_One(family)).decode("utf-8").removesuffix(Exposition._trailer(encoder))

    @staticmethod
    def _trailer(encoder: Callable) -> str:
        """What the encoder writes after the last family (OpenMetrics: `# EOF`)."""
        return encoder(_One()).decode("utf-8")

    @staticmethod
    def _template(encoder: Callable, family, labels: list) -> _Rendered | None:
        """`family`'s header lines and each sample's line up to its value, as the library writes
        them; None when its rendering is not one `... 0.0` line per sample after the header."""
        zero = copy.copy(family)
        zero.samples = [s._replace(value=0.0) for s in family.samples]
        lines = Exposition._alone(encoder, zero).splitlines(keepends=True)
        n = len(lines) - len(family.samples)
        header, body = lines[:n], lines[n:]
        if any(not h.startswith("#") for h in header) or any(not b.endswith(" 0.0\n") for b in body):
            return None
        return _Rendered([], labels, "".join(header), [b[:-len(" 0.0\n")] for b in body], [], "")


def metrics_answer(exposition: Exposition, environ: dict) -> tuple[str, list[tuple[str, str]], bytes]:
    """(status, headers, body) of a GET /metrics: the format the `Accept` header asks for, gzip
    when `Accept-Encoding` allows it; `?name[]=N` (repeated) only the families named, as
    prometheus-client's app does."""
    names = parse_qs(environ.get("QUERY_STRING", "")).get("name[]")
    if names and hasattr(exposition.registry, "restricted_registry"):  # the library's filter, uncached
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT") or "")
        body = encoder(exposition.registry.restricted_registry(names))
    else:
        body, content_type = exposition.render(environ.get("HTTP_ACCEPT"))
    headers = [("Content-Type", content_type)]
    if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
        body = exposition.gzip(body)
        headers.append(("Content-Encoding", "gzip"))
    return "200 OK", headers, body
