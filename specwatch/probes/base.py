"""What every probe shares: the finding it returns, the server settings and the probe context."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specwatch.alerts.model import code

if TYPE_CHECKING:  # heavy or circular imports stay out of module import time
    from specwatch.probes.checkpoint import DraftCheckpoint, TargetModel
    from specwatch.engines.sglang.source import SGLangFacts

ERROR = "error"
WARNING = "warning"
INFO = "info"
SEVERITIES = (ERROR, WARNING, INFO)  # report order: errors first


@dataclass
class Finding:
    """One thing a probe found.

    probe: the fixed probe id (`unloaded_weights`, ...). kind: the fault kind within the probe
    (`dropped_keys`, ...); `id` is `probe/kind`. severity: `error` (the draft cannot work as
    served, or the server will not start), `warning` (likely to cost acceptance), `info`.
    title: one line. evidence: name → value (JSON-able: str, int, float, list). fix: what to
    change — keys to rename, config lines, a flag, or a `specwatch` command.
    """

    probe: str
    kind: str
    severity: str
    title: str
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: str = ""

    @property
    def id(self) -> str:
        return f"{self.probe}/{self.kind}"

    def to_dict(self) -> dict:
        return {"probe": self.probe, "id": self.id, "severity": self.severity, "title": self.title,
                "evidence": self.evidence, "fix": self.fix}

    @classmethod
    def from_dict(cls, d: dict) -> "Finding":
        kind = d.get("id", "").partition("/")[2] or d.get("kind", "")
        return cls(d["probe"], kind, d["severity"], d["title"], dict(d.get("evidence") or {}), d.get("fix", ""))

    def one_line(self) -> str:
        """`[error] unloaded_weights: title. Fix: ...` — for alert fixes."""
        text = f"[{self.severity}] {self.probe}: {self.title}"
        return f"{text}. Fix: {self.fix}" if self.fix else text


def fix_checkpoint_command(draft: object) -> str:
    """`specwatch fix-checkpoint --draft DRAFT --out DRAFT-sglang` as a code span (`alerts.model.code`),
    both paths shell-quoted: a path from a server's settings is data, never shell syntax."""
    d = str(draft)
    return code(f"specwatch fix-checkpoint --draft {shlex.quote(d)} --out {shlex.quote(d + '-sglang')}")


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Errors first, then warnings, then infos; probe order kept within a severity."""
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))


@dataclass
class ServerSettings:
    """How the server runs the draft (CLI flags, the `server_args` log line or `/server_info`).

    algorithm: `--speculative-algorithm` upper-cased (`EAGLE3`, `EAGLE`; `NEXTN` is SGLang's alias
    of `EAGLE`: server_args.py 0.5.11, arg_groups/speculative_hook.py 0.5.23); None when unknown.
    num_steps / eagle_topk / num_draft_tokens: the speculative flags. draft_window_size:
    `--speculative-draft-window-size` (tokens). context_length: `--context-length` (tokens).
    """

    algorithm: str | None = None
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None
    draft_window_size: int | None = None
    context_length: int | None = None

    @classmethod
    def from_server_args(cls, args: dict[str, object]) -> "ServerSettings":
        def _int(key: str) -> int | None:
            v = args.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) else None

        algo = args.get("speculative_algorithm")
        return cls(
            algorithm=normalize_algorithm(str(algo)) if algo else None,
            num_steps=_int("speculative_num_steps"),
            eagle_topk=_int("speculative_eagle_topk"),
            num_draft_tokens=_int("speculative_num_draft_tokens"),
            draft_window_size=_int("speculative_draft_window_size"),
            context_length=_int("context_length"),
        )


def normalize_algorithm(name: str) -> str:
    """`eagle3` → `EAGLE3`; `NEXTN` → `EAGLE` (SGLang resolves it so, server_args.py@0.5.23)."""
    a = name.strip().upper()
    return "EAGLE" if a == "NEXTN" else a


@dataclass
class ProbeContext:
    """Everything a probe reads. `target` is None when no target config was given.

    `cache` holds results shared between probes (the key mapping, the captured layers), keyed
    by the helper that computed them.
    """

    draft: "DraftCheckpoint"
    target: "TargetModel | None"
    sglang: "SGLangFacts"
    settings: ServerSettings = field(default_factory=ServerSettings)
    cache: dict[str, Any] = field(default_factory=dict)


def weights_not_checked(probe: str, ctx: ProbeContext, what: str) -> Finding | None:
    """`probe/not_checked` (info) when the draft's weights were not all read (a corrupt or missing
    file, no weights): `what` is then not judged from the tensors that happen to be readable.
    None when every tensor was read. The unreadable file itself is `unloaded_weights`' error."""
    why = ctx.draft.store.unread
    if why is None:
        return None
    return Finding(probe, "not_checked", INFO, f"{what} not checked: the draft's weights could not be read",
                   {"reason": why}, "Fix the weights first (see unloaded_weights), then run diagnose again.")


def short_list(items: list, limit: int = 12) -> list:
    """The first `limit` items, plus a `… (+N more)` marker when cut."""
    items = list(items)
    if len(items) <= limit:
        return items
    return items[:limit] + [f"… (+{len(items) - limit} more)"]


def sentence(text: str) -> str:
    """First letter upper-cased, the rest untouched (`capitalize` would lower `SGLang`)."""
    return text[:1].upper() + text[1:]


@dataclass
class Report:
    """The result of one diagnosis. findings: errors first. sglang: where the facts came from."""

    sglang_version: str | None
    sglang: str
    draft: str
    target: str | None
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    engine: str = "sglang"  # "vllm": `sglang_version` / `sglang` then describe the vLLM read (engines/vllm/probes.py)

    @property
    def has_errors(self) -> bool:
        return any(f.severity == ERROR for f in self.findings)

    def actionable(self) -> list[Finding]:
        """Errors, then warnings (what goes into an alert's fixes)."""
        return [f for f in self.findings if f.severity in (ERROR, WARNING)]

    def to_dict(self) -> dict:
        return {"engine": self.engine, "sglang_version": self.sglang_version, "sglang": self.sglang, "draft": self.draft,
                "target": self.target, "notes": self.notes, "findings": [f.to_dict() for f in self.findings]}

    def format_text(self, *, verbose: bool = False) -> str:
        """Readable report grouped by severity; infos are summarised unless `verbose`."""
        lines = [f"draft:  {self.draft}", f"target: {self.target or '(not given)'}", f"{self.engine}: {self.sglang}"]
        lines += [f"note:   {n}" for n in self.notes]
        counts = {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES}
        lines.append(f"result: {counts[ERROR]} error(s), {counts[WARNING]} warning(s), {counts['info']} info")
        for sev in SEVERITIES:
            group = [f for f in self.findings if f.severity == sev]
            if not group:
                continue
            lines += ["", f"{sev.upper()}S"]
            for f in group:
                lines.append(f"  [{f.id}] {f.title}")
                if sev != "info" or verbose:
                    for k, v in f.evidence.items():
                        lines.append(f"      {k}: {v}")
                if f.fix:
                    lines.append(f"    fix: {f.fix}")
        return "\n".join(lines)
