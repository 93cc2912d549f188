"""Run the probes on a draft/target pair and keep the results per server.

`diagnose()` is the whole check (what `specwatch diagnose` prints). `Diagnoser` is what the
daemon holds: when a server's settings become known (its `server_args` line, or the config's
`diagnosis:` paths) it runs `diagnose()` ahead of time — in a background thread in the daemon,
inline in replay — and caches the report per server, re-running only when the inputs change.
The collapse rule reads the cached findings when it fires, so an alert never waits for probes.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from specwatch.probes import PROBE_IDS
from specwatch.probes.base import (  # noqa: F401  (Report re-exported: callers know it from here)
    ERROR, SEVERITIES, WARNING, Finding, ProbeContext, Report, ServerSettings, sort_findings)

log = logging.getLogger("specwatch.diagnosis")


NO_SOURCE = "not checked: no SGLang source found"
# Algorithms whose server drafts with the target itself when no draft path is given: SGLang's NEXTN
# (resolved to EAGLE, `_handle_eagle_family` in srt/arg_groups/speculative_hook.py@0.5.23), vLLM's mtp.
MTP_ALGORITHMS = ("NEXTN", "EAGLE", "MTP")


class NoSGLangSource(FileNotFoundError):
    """No SGLang source to read the facts from, and no version asked of the table: the probes
    would judge the draft against a guess, so nothing is checked. The message says how to point
    specwatch at the server's SGLang."""

    def __init__(self, how: str = "pass --sglang-root or --pid, or --sglang-version X.Y.Z to judge against "
                                  "specwatch's built-in table"):
        super().__init__(f"{NO_SOURCE} ({how})")


def facts_for(sglang_root: str | Path | None = None, version: str | None = None, *, discover: bool = True):
    """SGLang facts: from `sglang_root`, else the importable `sglang` (found, never imported),
    else specwatch's table for `version` (asked for explicitly). Raises FileNotFoundError for a
    bad `sglang_root`, NoSGLangSource when there is neither a source nor a `version`."""
    from specwatch.engines.sglang.known_versions import TableFacts
    from specwatch.engines.sglang.source import SourceFacts, find_sglang_root

    if sglang_root:
        return SourceFacts(sglang_root)
    root = find_sglang_root() if discover else None
    if root:
        return SourceFacts(root)
    if version:
        return TableFacts(version)
    raise NoSGLangSource()


def server_of_draft(draft: str | Path) -> int | None:
    """The pid of a running SGLang server whose command line names `draft` (the same folder
    once resolved) as its `--speculative-draft-model-path`, run by this user, root or the
    draft folder's owner (another user's process naming the draft is no evidence of what the
    server runs), or None. Command lines are read as data; nothing is run."""
    import psutil

    from specwatch.engines.sglang.settings import launcher_args, parse_server_argv

    want = Path(draft).resolve()
    try:
        users = {os.getuid(), 0, want.stat().st_uid}
    except OSError:
        return None
    for proc in psutil.process_iter(["pid", "cmdline", "uids"]):
        argv = proc.info.get("cmdline") or []
        uids = proc.info.get("uids")
        if uids is None or uids.real not in users or not any(want.name in a for a in argv):
            continue  # the cheap tests first: most processes name no draft
        args = launcher_args(argv)
        path = parse_server_argv(args).get("speculative_draft_model_path") if args is not None else None
        if path and Path(str(path)).resolve() == want:
            return proc.info["pid"]
    return None


def resolve_model_dir(path: str) -> Path | None:
    """A local directory for `path`: itself, or the newest Hugging Face cache snapshot of a repo
    id like `org/name` ($HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub). None if absent."""
    p = Path(path).expanduser()
    if p.exists():
        return p
    if path.count("/") != 1 or path.startswith(("/", ".")):
        return None
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub").expanduser()
    snaps = hub / f"models--{path.replace('/', '--')}" / "snapshots"
    dirs = sorted((d for d in snaps.glob("*") if d.is_dir()), key=lambda d: d.stat().st_mtime) if snaps.is_dir() else []
    return dirs[-1] if dirs else None


def diagnose(draft: str | Path | None, target: str | Path | None = None, *, facts=None,
             settings: ServerSettings | None = None) -> Report:
    """Run every probe. Raises CheckpointError when `draft` is not a directory or the target
    config cannot be read (bad input, reported by the caller); a probe that fails internally
    becomes a warning finding, never an exception. `draft` None (or the target's own folder): the
    server drafts with the target (SGLang's default without --speculative-draft-model-path), so
    only `probes/mtp_head.py` applies: its MTP head checked, or the missing draft named."""
    from specwatch.probes.checkpoint import CheckpointError, load_draft, load_target

    facts = facts if facts is not None else facts_for()
    if draft is None and target is None:
        raise CheckpointError("give --draft (an EAGLE-3 draft folder) or --target (an MTP/NEXTN model served alone)")
    tgt = load_target(target) if target is not None else None
    if tgt is not None:
        from specwatch.probes import mtp_head

        if mtp_head.same_model(None if draft is None else str(draft), tgt):
            settings = settings or ServerSettings()
            findings = mtp_head.self_draft(tgt, mtp_head.sglang_layout(facts, tgt.architecture), settings.algorithm,
                                           "sglang")
            return Report(facts.version, facts.describe(), str(tgt.path), str(tgt.path), sort_findings(findings),
                          list(facts.notes) + ["the draft is the target itself (no separate draft model)"])
    assert draft is not None  # no draft given: a target was (checked above) and same_model held
    if (settings or ServerSettings()).algorithm in ("EAGLE", "MTP"):
        from specwatch.probes import mtp_head

        try:
            mtp = load_target(draft)  # a separate NextN/MTP checkpoint (e.g. an exported DeepSeek NextN layer)
        except CheckpointError:
            mtp = None  # no readable config: the EAGLE probes below report it
        if mtp is not None and mtp_head.declared_layers(mtp)[1]:
            layout = mtp_head.sglang_layout(facts, mtp.architecture)
            return Report(facts.version, facts.describe(), str(mtp.path), str(tgt.path) if tgt else None,
                          sort_findings(mtp_head.check(mtp, layout)),
                          list(facts.notes) + ["an MTP/NextN draft: its MTP head checked, not the EAGLE-3 probes"])
    ckpt = load_draft(draft)
    ctx = ProbeContext(ckpt, tgt, facts, settings or ServerSettings())
    findings = []
    for probe_id in PROBE_IDS:
        module = importlib.import_module(f"specwatch.probes.{probe_id}")
        try:
            findings += module.run(ctx)
        except Exception as e:  # a specwatch bug must not hide the other probes' findings
            log.exception("probe %s failed", probe_id)
            findings.append(Finding(probe_id, "internal_error", WARNING, f"probe failed: {type(e).__name__}: {e}",
                                    {}, "Report this to the specwatch maintainers with the command line."))
    return Report(facts.version, facts.describe(), str(ckpt.path), str(tgt.path) if tgt else None,
                  sort_findings(findings), list(facts.notes))


@dataclass(frozen=True)
class Inputs:
    """What a diagnosis depends on; any change re-runs it. stamp: (name, size, mtime) of the
    draft folder's files, so a checkpoint fixed in place is diagnosed again."""

    draft: str
    target: str | None
    sglang_root: str | None
    settings: ServerSettings
    stamp: tuple = ()
    engine: str = "sglang"  # "vllm": sglang_root is the folder holding vllm/ (engines/vllm/probes.py)


def _stamp(path: str) -> tuple:
    d = resolve_model_dir(path)
    if d is None or not d.is_dir():
        return ()
    try:
        return tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in d.iterdir() if f.is_file()))
    except OSError:
        return ()


class Diagnoser:
    """Cached diagnoses per server, computed ahead of time.

    `observe(server, server_args)`: the server's settings became known (its `server_args` line;
    {} for config-only paths); starts a run when the inputs changed. `ensure(server)`: start a run
    unless one for the current inputs is done or running (the collapse rule calls it when an
    episode starts). `report(server)`: the finished report for the current inputs, else None.
    `pending(server)`: a run is in progress. `background=False` runs inline (replay: deterministic).
    `timeout`: seconds after which a run is given up and its late result discarded. Thread-safe.
    """

    def __init__(self, *, draft: str | None = None, target: str | None = None, sglang_root: str | None = None,
                 timeout: float = 60.0, background: bool = True, vllm_root: str | None = None):
        self.draft, self.target, self.sglang_root = draft, target, sglang_root
        self.vllm_root = vllm_root
        self.timeout = timeout
        self.background = background
        self._lock = threading.Lock()
        self._args: dict[str, dict] = {}
        self._roots: dict[str, str | None] = {}
        self._current: dict[str, Inputs] = {}
        self._reports: dict[str, tuple[Inputs, Report | None]] = {}
        self._running: dict[str, tuple[Inputs, float]] = {}
        self._why: dict[str, tuple[Inputs, str]] = {}  # why the last run of these inputs gave no report

    def inputs_for(self, server_args: dict, sglang_root: str | None = None) -> Inputs | None:
        """`sglang_root`: the site directory of the SGLang the server process really imports
        (from psutil); the configured `sglang_root` wins over it."""
        draft = self.draft or server_args.get("speculative_draft_model_path")
        target = self.target or server_args.get("model_path")
        if not draft and target and str(server_args.get("speculative_algorithm") or "").upper() in MTP_ALGORITHMS:
            draft = target  # the target drafts with its own MTP head (probes/mtp_head.py)
        if not draft:
            return None
        engine = "vllm" if server_args.get("engine") == "vllm" else "sglang"
        root = (self.vllm_root if engine == "vllm" else self.sglang_root) or sglang_root
        return Inputs(str(draft), str(target) if target else None, root,
                      ServerSettings.from_server_args(server_args), _stamp(str(draft)), engine)

    def observe(self, server: str, server_args: dict) -> None:
        with self._lock:
            self._args[server] = dict(server_args)
        self.ensure(server)

    def observe_install(self, server: str, sglang_root: str | None) -> None:
        """The SGLang install the server process runs (site directory on this host's paths)."""
        with self._lock:
            if self._roots.get(server) == sglang_root:
                return
            self._roots[server] = sglang_root
        self.ensure(server)

    def ensure(self, server: str) -> None:
        with self._lock:
            args = self._args.get(server)
            if args is None and self.draft is None:
                return
            inputs = self.inputs_for(args or {}, self._roots.get(server))
            if inputs is None:
                return
            self._current[server] = inputs
            done = self._reports.get(server)
            if done is not None and done[0] == inputs:
                return
            running = self._running.get(server)
            if running and running[0] == inputs and time.monotonic() - running[1] < self.timeout:
                return
            self._running[server] = (inputs, time.monotonic())
        if self.background:
            threading.Thread(target=self._run, args=(server, inputs), name=f"diagnosis-{server}", daemon=True).start()
        else:
            self._run(server, inputs)

    def pending(self, server: str) -> bool:
        with self._lock:
            r = self._running.get(server)
            return bool(r and time.monotonic() - r[1] < self.timeout)

    def report(self, server: str) -> Report | None:
        with self._lock:
            done = self._reports.get(server)
            return done[1] if done and done[0] == self._current.get(server) else None

    def note(self, server: str) -> str:
        """Why `report(server)` is None, in one line for an alert (not checked and why, failed,
        still running)."""
        with self._lock:
            current = self._current.get(server)
            why, running = self._why.get(server), self._running.get(server)
        if why is not None and why[0] == current:
            return why[1]
        if running is not None and running[0] == current:
            return "not checked yet: the probes are still running"
        return "not checked: no draft known (no server_args line naming one, no diagnosis.draft)"

    def _run(self, server: str, inputs: Inputs) -> None:
        started = time.monotonic()
        try:
            report, why = self._diagnose(inputs), ""
        except _NotChecked as e:
            report, why = None, str(e)
        with self._lock:
            current = self._running.get(server)
            if current is None or current[0] != inputs:
                return  # superseded by newer inputs
            del self._running[server]
            if time.monotonic() - started > self.timeout:
                log.warning("diagnosis of %s took %.0fs, over diagnosis.timeout: result discarded", server,
                            time.monotonic() - started)
                self._why[server] = (inputs, f"not checked: the probes took over diagnosis.timeout ({self.timeout:g}s)")
                return
            self._reports[server] = (inputs, report)
            if why:
                self._why[server] = (inputs, why)

    def _diagnose(self, inputs: Inputs) -> Report:
        """Raises _NotChecked saying why no report was made."""
        draft = resolve_model_dir(inputs.draft)
        if draft is None:
            log.info("diagnosis skipped: draft %s is not a local folder or cached Hugging Face repo", inputs.draft)
            raise _NotChecked(f"not checked: draft {inputs.draft} is not a local folder or cached Hugging Face repo")
        target = resolve_model_dir(inputs.target) if inputs.target else None
        try:
            if inputs.engine == "vllm":
                report = _diagnose_vllm(draft, target, inputs.sglang_root)
                if report is None:
                    raise _NotChecked("not checked: no vLLM source found (set diagnosis.vllm_root)")
                return report
            facts = facts_for(inputs.sglang_root) if inputs.sglang_root else _discover_facts()
            return diagnose(draft, target, facts=facts, settings=inputs.settings)
        except NoSGLangSource as e:
            log.warning("diagnosis of draft %s: %s", inputs.draft, e)
            raise _NotChecked(str(e)) from None
        except _NotChecked:
            raise
        except Exception as e:  # bad paths, unreadable target: the alert keeps its generic causes
            log.warning("diagnosis of draft %s failed: %s", inputs.draft, e)
            raise _NotChecked(f"not checked: the diagnosis failed: {e}") from None


class _NotChecked(Exception):
    """No report: the message says why (for the alert)."""


def _diagnose_vllm(draft: Path, target: Path | None, root: str | None) -> Report | None:
    """The vLLM probes against `root` (the server process's vllm, or `diagnosis.vllm_root`), else
    the importable vllm; None when no vLLM source is on this host."""
    from specwatch.engines.vllm.probes import diagnose_vllm
    from specwatch.engines.vllm.source import VllmFacts, find_vllm_root

    where = root or find_vllm_root()
    if where is None:
        log.info("vLLM diagnosis skipped: no vllm package found (set diagnosis.vllm_root)")
        return None
    return diagnose_vllm(draft, target, VllmFacts(Path(where)))


def _discover_facts():
    """Facts from the importable sglang (specwatch's own environment). The server's own SGLang
    comes from its process (`Diagnoser.observe_install`, fed by the process source for the
    configured servers only); nothing found on the box is ever run. Raises NoSGLangSource."""
    from specwatch.engines.sglang.source import SourceFacts, find_sglang_root

    root = find_sglang_root()
    if root is None:
        raise NoSGLangSource("set diagnosis.sglang_root to the site-packages folder of the SGLang the server "
                             "runs, or run specwatch where it can read the server process")
    return SourceFacts(root)
