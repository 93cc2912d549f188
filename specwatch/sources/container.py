"""Container log envelopes: the lines a container runtime wraps around SGLang's own, unwrapped.

Three wrappers are known; each file's is detected from its first line (`detect`):

- Docker's json-file driver (`/var/lib/docker/containers/<id>/<id>-json.log`): one JSON object
  per record, `{"log":"...\\n","stream":"stderr","time":"..."}`. A line longer than the copier's
  16 KiB buffer is cut into several records whose `log` does not end in `\\n`; the last one does.
  (moby `daemon/logger/jsonfilelog/jsonlog/jsonlogbytes.go`, `daemon/logger/copier.go`, v29.)
- The Kubernetes CRI format written by containerd/CRI-O under `/var/log/pods/<ns>_<pod>_<uid>/
  <container>/<N>.log`: `<RFC3339Nano time> <stdout|stderr> <P|F>[:tags] <text>`; a long line is
  cut into `P` (partial) records ended by an `F` record (kubernetes
  `pkg/kubelet/kuberuntime/logs/logs.go`, containerd `internal/cri/io/logger.go`).
- A `docker compose logs` / collector prefix `service  | ` in front of plain lines
  (`strip_container_prefix`, used by the SGLang parser itself).

`Unwrap` sits between a `Follower` and the pipeline: it takes each `LineBatch` of a followed file
and hands on a `LineBatch` of the plain lines inside, partial records joined per stream (across
reads and rotations: it lives as long as the follower), so the parser and the rules see the same
text as from a plain file. A plain file's batches pass through untouched.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from specwatch.sources.filestream import LineBatch

log = logging.getLogger(__name__)

PLAIN, DOCKER, CRI = "plain", "docker", "cri"
ENVELOPES = ("auto", PLAIN, DOCKER, CRI)

# "2026-11-30T10:00:00.123456789Z stderr F text": time, stream, P/F tag (more tags after ':').
_CRI = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)) (stdout|stderr) ([PF])(?::\S*)?(?: |$)")
# Compose-style collector prefix "service  | " (recognised when none is configured), also with
# the colours `docker compose logs` writes on a terminal: "\x1b[36msglang-1  |\x1b[0m ".
_COMPOSE = re.compile(r"(?:\x1b\[[\d;]*m)?[\w.@-]+\s*\|(?:\x1b\[[\d;]*m)? ")


@dataclass(slots=True)
class _Unfinished:
    """One stream's unfinished line: the offset of its first record (-1: over max_line_bytes,
    dropped with its later parts), whether every part was valid UTF-8, the parts' texts."""

    start: int
    ok: bool
    texts: list[str] = field(default_factory=list)


def strip_container_prefix(text: str, container_prefix: re.Pattern | None) -> str:
    """Remove a collector prefix: the configured pattern, else a recognised `service  | `."""
    if container_prefix is not None:
        m = container_prefix.match(text)
        return text[m.end():] if m else text
    if text[:1] not in ("[", "(") and ("| " in text[:80] or "|\x1b[" in text[:80]):
        m = _COMPOSE.match(text)
        if m:
            return text[m.end():]
    return text


def detect(line: str) -> str:
    """The envelope of a file whose first line is `line`: DOCKER, CRI or PLAIN."""
    if line[:1] == "{":
        try:
            rec = json.loads(line)
        except ValueError:
            return PLAIN
        if isinstance(rec, dict) and "stream" in rec and "time" in rec:
            return DOCKER
        return PLAIN
    return CRI if _CRI.match(line) else PLAIN


class Unwrap:
    """`on_lines` for a Follower of one file: unwraps each batch and passes the plain lines to
    `on_lines` (never an empty batch). `envelope`: one of ENVELOPES ("auto": detected from the
    file's first non-empty line, then kept across rotations). `max_line_bytes`: a joined line
    longer than this (characters) is dropped and counted in `long_lines_skipped_total`.

    Counters: `records_total` (envelope records read), `bad_records_total` (records that do not
    read as the envelope: passed on as they are, so nothing is lost silently). `envelope` holds
    the detected kind once known. A partial line still open when specwatch stops is not saved:
    its records are behind the follower's checkpoint, so up to one line per stream can be lost at
    a restart (never at a rotation).
    """

    def __init__(self, on_lines: Callable[[LineBatch], None], envelope: str = "auto",
                 max_line_bytes: int = 1_048_576) -> None:
        if envelope not in ENVELOPES:
            raise ValueError(f"envelope must be one of {ENVELOPES}, not {envelope!r}")
        self._on_lines = on_lines
        self.envelope = None if envelope == "auto" else envelope
        self.max_line_bytes = max_line_bytes
        self._partial: dict[str, _Unfinished] = {}  # stream → its unfinished line
        self.records_total = 0
        self.bad_records_total = 0
        self.long_lines_skipped_total = 0

    def __call__(self, batch: LineBatch) -> None:
        kind = self.envelope
        if kind is None:
            first = next((ln for ln in batch.lines if ln.strip()), None)
            if first is None:
                return self._on_lines(batch)  # blank lines say nothing yet
            kind = self.envelope = detect(first)
            if kind != PLAIN:
                log.info("%s: %s log", batch.path, "Docker json-file" if kind == DOCKER else "Kubernetes CRI")
        if kind == PLAIN:
            return self._on_lines(batch)  # the hot path: no copy, no per-line work
        unwrap = self._docker if kind == DOCKER else self._cri
        lines: list[str] = []
        oks: list[bool] = []
        bounds: list[int] = []
        raw_ok = batch.raw_ok
        offsets = batch.offsets()
        partial = self._partial
        for i, rec in enumerate(batch.lines):
            self.records_total += 1
            got = unwrap(rec)
            if got is None:
                self.bad_records_total += 1
                if self.bad_records_total <= 10:
                    log.warning("%s: record at offset %d is not %s: passed on as it is", batch.path,
                                offsets[i], kind)
                stream, text, done = "", rec, True
            else:
                stream, text, done = got
            ok = raw_ok is None or raw_ok[i]
            parts = partial.get(stream)
            if parts is None and done:  # the usual record: one whole line
                lines.append(text)
                oks.append(ok)
                bounds.append(offsets[i])
                continue
            if parts is None:
                parts = partial[stream] = _Unfinished(offsets[i], ok)
            parts.ok = parts.ok and ok
            if parts.start != -1:
                parts.texts.append(text)
            if parts.texts and sum(map(len, parts.texts)) > self.max_line_bytes:
                parts.start = -1  # too long: dropped, its later parts too (bounded memory)
                parts.texts.clear()
            if done:
                del partial[stream]
                if parts.start == -1:
                    self.long_lines_skipped_total += 1
                    continue
                lines.append("".join(parts.texts))
                oks.append(parts.ok)
                bounds.append(parts.start)
        if lines:
            bounds.append(batch.end)
            self._on_lines(LineBatch(batch.path, bounds[0], batch.end, lines=lines,
                                     raw_ok=None if all(oks) else oks, bounds=bounds))

    @staticmethod
    def _docker(rec: str) -> tuple[str, str, bool] | None:
        try:
            d = json.loads(rec)
            text = d.get("log", "")
            stream = d["stream"]
        except (ValueError, KeyError, AttributeError, TypeError):
            return None
        if not isinstance(text, str):
            return None
        if text[-1:] == "\n":
            return stream, text[:-2] if text[-2:-1] == "\r" else text[:-1], True
        return stream, text, False

    @staticmethod
    def _cri(rec: str) -> tuple[str, str, bool] | None:
        m = _CRI.match(rec)
        if m is None:
            return None
        return m.group(2), rec[m.end():], m.group(3) == "F"


# ------------------------------------------------------------------------------------------ names

def names(path: str) -> dict[str, str]:
    """Template values for a followed file (`server: "{container}"`), from where it lies.

    Docker (`.../containers/<id>/<id>-json.log`): id (12 hex digits), container (the name from
    `config.v2.json` beside it without its leading `/`, else the image, else the id), image.
    CRI (`.../<namespace>_<pod>_<uid>/<container>/<N>.log`): namespace, pod, uid, container.
    Always: file (the file name). Values that cannot be read are absent.
    """
    d, base = os.path.split(path)
    out = {"file": base}
    if base.endswith("-json.log"):
        cid = base[:-len("-json.log")]
        out["id"] = out["container"] = cid[:12]
        try:
            with open(os.path.join(d, "config.v2.json"), "rb") as f:
                cfg = json.loads(f.read(4 << 20))
            image = (cfg.get("Config") or {}).get("Image") or ""
            name = (cfg.get("Name") or "").lstrip("/")
            if image:
                out["image"] = image
            out["container"] = name or image or out["container"]
        except (OSError, ValueError, AttributeError) as e:
            log.debug("%s: no container name (%s)", path, e)
        return out
    pod_dir, container = os.path.split(d)
    parts = os.path.basename(pod_dir).split("_")
    if len(parts) == 3 and container:
        out.update(namespace=parts[0], pod=parts[1], uid=parts[2], container=container)
    return out
