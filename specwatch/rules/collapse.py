"""Acceptance collapse: the draft model's tokens are (almost) all rejected.

Decided from `accept len` only: its floor is 1.00 in every SGLang version, while `accept rate`
changed meaning twice (0.25 vs 0.00 at the same total collapse; `report_decode_stats` in
sglang/srt/observability/scheduler_metrics_mixin.py 0.5.11 against its 0.5.3.post3-0.5.10 forms).

A rank collapses after `min_batches` consecutive decode batches with accept len <=
`max_accept_length` while requests are running; it recovers after `min_batches` consecutive
batches at or above `recover_accept_length`. Batches in between reset both runs, so a rank that
hovers between the thresholds keeps its current state (no flapping). Lines of idle or
prefill-dominated windows (`rules/windows.py`) are skipped: they neither count nor break a run.

The advice fits the server: checks are chosen by its speculative algorithm (`draft_kind`) and by
its history: an earlier episode that recovered without a restart means the checkpoint loads and
works, so runtime state (load, batch fullness, cache) leads (`runtime_causes`).
"""

from __future__ import annotations

import math
import os
import shlex
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, ClassVar

from specwatch.alerts.model import Alert, code
from specwatch.core.sections import AcceptLength, Count, Seconds, Section, hysteresis, rule_section
from specwatch.core.events import DecodeBatch, MetricsSample, ServerArgs
from specwatch.rules.active import ActiveAlertsRule
from specwatch.rules.base import RuleContext, alert_key, args_evidence, fmt, new_alert, register
from specwatch.engines.vllm.advice import vllm_causes
from specwatch.rules.server_metrics import collapse_from_metrics
from specwatch.rules.summary import RANK_LABELS, VALID_ACCEPT, RankSummary, rank_label_values
from specwatch.rules.windows import Window, WindowConfig

if TYPE_CHECKING:  # annotations only: rule files never import config.py
    from specwatch.config import Config


@rule_section("collapse")
class CollapseConfig(Section):
    """rules.collapse: fire after min_batches lines at or below max_accept_length, resolve
    after min_batches lines at or above recover_accept_length (accept lens: 1 + accepted draft
    tokens). Written alone, one threshold moves the other's default where it no longer fits:
    recover_accept_length becomes max_accept_length + 0.4 (the defaults' distance), or
    max_accept_length becomes recover_accept_length - 0.4 (at least 1.0); both written, a
    recover_accept_length not above max_accept_length is refused."""

    max_accept_length: AcceptLength = 1.10
    min_batches: Count = 3
    recover_accept_length: AcceptLength = 1.5
    # a rank healthy this long since the server started before it collapsed: the draft works,
    # runtime state (and a restart) leads the advice
    healthy_before: Seconds = 1800.0
    default_bounds: ClassVar = hysteresis("max_accept_length", "recover_accept_length",
                                          up=lambda x: x + 0.4, down=lambda x: x - 0.4)

    def problems(self):
        if self.recover_accept_length <= self.max_accept_length:
            yield "recover_accept_length", (f"must be above max_accept_length ({self.max_accept_length}) "
                                            "or the alert would flap; leave it out (it then follows "
                                            f"max_accept_length) or write e.g. {round(self.max_accept_length + 0.4, 2)}")


ALERT_NAME = "AcceptanceCollapse"
EVIDENCE_EVERY = 10.0  # seconds of log time between rebuilds of a firing alert's evidence (it is read rarely)
# Settings shown beside the speculative ones (`args_evidence`), and those whose change at a restart
# is pointed out; a change of CHECKPOINT_KEYS starts the count of recovered episodes again.
SETTING_KEYS = ("max_running_requests", "enable_hierarchical_cache", "enable_dp_attention", "dp_size")
CHANGE_KEYS = SETTING_KEYS + ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
CHECKPOINT_KEYS = ("speculative_algorithm", "speculative_draft_model_path", "model_path")


@dataclass
class _RankState:
    low_run: int = 0
    high_run: int = 0
    low_since: float | None = None
    awaiting_diagnosis: bool = False  # fired before the probes finished: one follow-up due
    healthy_since: float | None = None  # the rank's first healthy line since the server (re)started
    # the firing alert's evidence: the last low line not yet in it (rank summary, entry, low run then)
    # and the log time of the line it was last built from
    stale: tuple | None = None
    evidence_at: float = float("-inf")
    summary: RankSummary | None = None  # the rank's RankSummary once a log line named it (its labels, its last line)
    labels: list | None = None  # its rank labels from the saved state, until a line names it again


@dataclass
class _History:
    """Per server: episodes that recovered without a restart since the server last (re)started,
    under one set of checkpoint settings (`checkpoint`: algorithm, draft, target); other settings
    from before the last change; when a restart last ended an episode still firing
    (`cleared_by_restart`, the restart's time). An episode: ranks collapsed together (one starts
    while no other rank of the server is collapsed); it counts once, when its first rank recovers
    by itself (`counted`)."""

    recovered: int = 0
    last_recovered: float | None = None
    counted: bool = False  # the current episode is in `recovered`
    checkpoint: list = field(default_factory=list)
    previous: dict = field(default_factory=dict)  # setting → value before it last changed
    cleared_by_restart: float | None = None


def _summary(report) -> str:
    errors = sum(f.severity == "error" for f in report.findings)
    warnings = sum(f.severity == "warning" for f in report.findings)
    engine = "vLLM" if getattr(report, "engine", "sglang") == "vllm" else "SGLang"
    return f"{errors} error(s), {warnings} warning(s) on {engine} {report.sglang_version or '?'}"


EAGLE, MTP, DRAFT, NGRAM = "eagle", "mtp", "draft", "ngram"


def draft_kind(args: dict[str, object] | None) -> str | None:
    """What drafts on this server, from `speculative_algorithm`: EAGLE ("EAGLE", "EAGLE3": a
    separate EAGLE draft checkpoint), MTP ("NEXTN", "MTP": a head built into the target
    checkpoint; NEXTN is an alias that runs as EAGLE with the target as its draft,
    `_RESERVED_ALIASES` in sglang/srt/speculative/spec_registry.py and `_handle_eagle_family` in
    sglang/srt/arg_groups/speculative_hook.py 0.5.23), NGRAM (no model), DRAFT (STANDALONE and
    every other algorithm: a separately loaded draft model); None when no algorithm is known."""
    algo = str((args or {}).get("speculative_algorithm") or "").strip().upper()
    if not algo or algo == "NONE":
        return None
    if algo in ("EAGLE", "EAGLE3"):
        return EAGLE
    if algo in ("NEXTN", "MTP") or algo.endswith("_MTP"):  # vLLM's deepseek_mtp, qwen3_next_mtp, ...
        return MTP
    return NGRAM if algo == "NGRAM" else DRAFT


def _folder(path: object, placeholder: str) -> str:
    """A model folder for a shell command: quoted; a Hugging Face repo id as its local snapshot."""
    if not path:
        return placeholder
    path = str(path)
    if not os.path.isabs(path) and not os.path.isdir(path):
        return f'"$(huggingface-cli download {shlex.quote(path)})"'
    return shlex.quote(path)


# The folder reaches Python as an argument, never inside its source.
_PY_OPEN = "python -c \"import glob, sys; from safetensors import safe_open; "
_PY_KEYS = (_PY_OPEN + "print(sorted({k.split('.')[0] "
            "for f in glob.glob(glob.escape(sys.argv[1]) + '/*.safetensors') for k in safe_open(f, 'np').keys()}))\" ")
_PY_D2T = (_PY_OPEN + "f=safe_open(glob.glob(glob.escape(sys.argv[1]) + '/*.safetensors')[0], 'np'); "
           "d=f.get_tensor('d2t'); print(d[:8], d.min(), d.max())\" ")
_PY_HEAD = (_PY_OPEN + "import json; d=sys.argv[1]; c=json.load(open(d + '/config.json')); "
            "n=c.get('num_hidden_layers', c.get('text_config', {}).get('num_hidden_layers')); "
            "ks=[k for f in glob.glob(glob.escape(d) + '/*.safetensors') for k in safe_open(f, 'np').keys()]; "
            "print('mtp.*:', sum('mtp.' in k for k in ks), f'layers.{n}.*:', sum(f'layers.{n}.' in k for k in ks))\" ")
_PY_VOCAB = ("python -c \"import json, sys; a, b = (json.load(open(p + '/tokenizer.json'))['model']['vocab'] "
             "for p in sys.argv[1:3]); print(len(a), len(b), 'same' if a == b else 'DIFFERENT')\" ")


def known_causes(args: dict[str, object] | None) -> list[str]:
    """The known causes of a total collapse for the server's speculative algorithm
    (`draft_kind`), each with a check a user can run now. EAGLE drafts (and servers whose
    algorithm is unknown): the whole diagnosis in one command, then the four checkpoint causes.
    NEXTN/MTP: the head inside the target checkpoint. STANDALONE and other separate drafts: the
    shared vocabulary. NGRAM: no model, nothing on disk.

    Paths come from the server's settings (`server_args` line, command line, /server_info) when
    known. Facts, all in `sglang/srt/`: `models/llama_eagle3.py` (module `midlayer` in 0.5.11;
    `layers.0` with a `midlayer` rename in 0.5.12+; fc width check in `LlamaModel.forward`; d2t read
    as offsets in `load_weights`, 0.5.11 and 0.5.23), capture in `model_executor/model_runner.py`
    0.5.11 and `model_runner_components/attention_backend_setup.py` 0.5.23, and the wrappers that
    skip it in `models/gemma3_mm.py` and `models/mllama4.py` 0.5.23; the MTP head's keys in
    `models/deepseek_nextn.py` (`model.layers.{num_hidden_layers}`) and `models/qwen3_5_mtp.py`
    (`mtp.*`, kept unquantized by `_mtp_quant_config`) 0.5.23.
    """
    args = args or {}
    kind = draft_kind(args)
    if args.get("engine") == "vllm":
        return vllm_causes(args, kind)
    if kind == MTP:
        return _mtp_causes(args)
    if kind == DRAFT:
        return _draft_causes(args)
    if kind == NGRAM:
        return _ngram_causes(args)
    return _eagle_causes(args)


def _path_code(known: object, path: str) -> str:
    """A path in running text: shell-quoted when it came from the server (a reader pastes it),
    a placeholder such as `<draft dir>/config.json` as it is."""
    return code(shlex.quote(path) if known else path)


def _eagle_causes(args: dict[str, object]) -> list[str]:
    draft_arg = args.get("speculative_draft_model_path")
    target_arg = args.get("model_path")
    draft = str(draft_arg or "<draft dir>")
    target = str(target_arg or "<target dir>")
    algo = args.get("speculative_algorithm")
    # Values from the server go into commands shell-quoted and into the text as code spans.
    q_target = shlex.quote(target) if target_arg else target
    folder = _folder(draft_arg, draft)
    return [
        "Run the whole diagnosis (files only, reads the SGLang this server runs): "
        + code(f"specwatch diagnose --draft {folder} --target {q_target}"
               + (f" --algorithm {shlex.quote(str(algo))}" if algo else ""))
        + " — it names dropped weights, missing capture, fc bypass, layer ids and the d2t map, with the fix.",
        "Unloaded draft weights: SGLang <= 0.5.11 loads the draft decoder layer only from "
        "`midlayer.*` keys and silently drops `layers.0.*` (as saved by the speculators trainer). "
        f"Check: {code(_PY_KEYS + folder)} and `pip show sglang`. "
        f"Fix: {code(f'specwatch fix-checkpoint --draft {folder} --out <new dir>')} (renames `layers.0.` to "
        "`midlayer.`), or upgrade to SGLang >= 0.5.12.",
        "Missing aux hidden-state capture: the target model class must implement "
        "`set_eagle3_layers_to_capture`, and a multimodal wrapper must forward it to its language "
        "model (Gemma3/Llama4 wrappers skip it silently when the inner model lacks it). Check: "
        "`grep -rn set_eagle3_layers_to_capture $(python -c 'import sglang, os; "
        "print(os.path.dirname(sglang.__file__))')/srt/models/` for your target's architecture "
        f"(`architectures` in {_path_code(target_arg, target + '/config.json')}). Fix: use a target class that captures, or upgrade SGLang.",
        "fc bypass: the draft's `fc.weight` is [H, 3*H] (e.g. [7168, 21504]) and runs only when the "
        "target feeds 3*H-wide aux hidden states; with capture off, a single captured layer, or "
        "`--speculative-algorithm EAGLE` for an EAGLE-3 draft, H-wide states skip the fc silently. "
        f"Check: the draft config's `eagle_config.eagle_aux_hidden_state_layer_ids` in {_path_code(draft_arg, draft + '/config.json')} "
        "(3 ids below the target's num_hidden_layers) and that the server runs "
        "`--speculative-algorithm EAGLE3`"
        + (f" (this server: {code(algo)})." if algo else "."),
        "d2t map: SGLang reads `d2t` as offsets (target_id = draft_id + d2t[draft_id]); a map stored "
        f"as absolute target ids sends every draft token to the wrong target token. Check: {code(_PY_D2T + folder)}"
        " — offsets are small and mostly non-decreasing from 0; "
        "values near the vocabulary size mean absolute ids (fix: `specwatch fix-checkpoint` re-encodes them).",
    ]


def _compare_without(what: str) -> str:
    return (f"Compare with speculation off: the same prompts on a server without the `--speculative-*` flags. "
            f"If the answers themselves change (garbage, repetition), the target's weights or kernels are at "
            f"fault; if they are fine, {what}.")


def _mtp_causes(args: dict[str, object]) -> list[str]:
    algo = args.get("speculative_algorithm")
    target_arg = args.get("model_path")
    target = str(target_arg or "<target dir>")
    folder = _folder(target_arg, target)
    return [
        f"{code(algo)} drafts with a head built into the target checkpoint (SGLang runs it as EAGLE with "
        "the target as its own draft): there is no separate draft checkpoint, so the checks of an EAGLE-3 "
        "draft do not apply. Check that the target still carries the head's weights: "
        f"{code(_PY_HEAD + folder)} — Qwen-style heads are `mtp.*` keys, DeepSeek-style ones "
        "`model.layers.<num_hidden_layers>.*` (`num_nextn_predict_layers` in config.json); a re-export "
        "(quantized, pruned, merged) that counts 0 dropped the head.",
        "Quantization of the head: quantized checkpoints usually keep the MTP head in BF16, and SGLang "
        "builds it unquantized only for the formats it recognises (`_mtp_quant_config` in "
        "`sglang/srt/models/qwen3_5_mtp.py` 0.5.23). Check that `quantization_config` in "
        f"{_path_code(target_arg, target + '/config.json')} excludes the head's layers under the names the checkpoint uses "
        "(`mtp.*`), and the load warnings: `grep -n -i -E 'mtp|nextn|draft' <log> | head -50`.",
        _compare_without("the head is: check its weights as above"),
    ]


def _draft_causes(args: dict[str, object]) -> list[str]:
    algo = args.get("speculative_algorithm")
    draft_arg, target_arg = args.get("speculative_draft_model_path"), args.get("model_path")
    draft, target = _folder(draft_arg, "<draft dir>"), _folder(target_arg, "<target dir>")
    return [
        f"{code(algo)} drafts with a separate model whose tokens the target verifies id by id: draft and "
        f"target must share one vocabulary. Check: {code(_PY_VOCAB + draft + ' ' + target)} — `DIFFERENT` "
        "sends every draft token to the wrong target token.",
        f"The draft model itself: a small model that is weak on this traffic (language, code, chat "
        f"template) proposes tokens the target rejects. Check the draft alone on a few real prompts "
        f"({code('python -m sglang.launch_server --model-path ' + draft)}) and its load warnings: "
        "`grep -n -i -E 'draft|standalone' <log> | head -50`.",
        _compare_without("the draft model is"),
    ]


def _ngram_causes(args: dict[str, object]) -> list[str]:
    return [
        "NGRAM drafts from n-grams already seen in the prompts and outputs: there is no draft model and "
        "nothing to check on disk. On traffic with little repetition (new text, sampling at high "
        "temperature) accept len near 1.0 is expected, not a fault. Check: which requests ran "
        "(repetitive ones such as code edits or RAG quotes accept more) and the `speculative_ngram_*` "
        "settings (match window, branch length) in the server's settings.",
        "If the same traffic accepted more before, compare the settings of the two runs "
        "(`grep -n 'server_args=' <log>`): a restart with other `speculative_ngram_*` values or "
        "`speculative_num_draft_tokens` changes what is proposed.",
    ]


def batch_limit(args: dict[str, object] | None) -> int | None:
    """The most requests one rank's decode batch holds: `max_running_requests`, divided among the
    attention DP ranks with DP attention (`max_running_requests // attn_dp_size` in
    sglang/srt/model_executor/pool_configurator.py 0.5.23); None when unknown."""
    args = args or {}
    mrr = args.get("max_running_requests")
    if not isinstance(mrr, int) or isinstance(mrr, bool) or mrr <= 0:
        return None
    dp = args.get("dp_size")
    if args.get("enable_dp_attention") is True and isinstance(dp, int) and dp > 1:
        return max(1, mrr // dp)
    return mrr


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _span(seconds: float) -> str:
    """`2h 05m`, `45m`: a long stretch of serving."""
    m = max(0, int(seconds // 60))
    return f"{m // 60}h {m % 60:02d}m" if m >= 60 else f"{m}m"


def runtime_causes(args: dict[str, object] | None, batch: DecodeBatch, recovered: int = 0,
                   last_recovered: float | None = None, changed: dict | None = None, *,
                   healthy_from: float | None = None, cleared_by_restart: float | None = None) -> list[str]:
    """Runtime state that can break acceptance, each with what to check: the history (episodes that
    recovered without a restart, `recovered` of them, the last at `last_recovered`; a long healthy
    run before this one, from `healthy_from` to the batch; an earlier episode that a restart at
    `cleared_by_restart` ended), load (a full decode batch, a queue), the cache
    (`enable_hierarchical_cache`) and settings that changed at the last restart (`changed`: name →
    (before, now)). Times are epoch seconds. [] when none of them applies."""
    args = args or {}
    out = []
    head = "MTP head" if draft_kind(args) == MTP else "draft"
    if healthy_from is not None:
        out.append(
            f"Acceptance was healthy on this rank for {_span(batch.timestamp - healthy_from)} of serving before it "
            f"collapsed (since {_utc(healthy_from)}): the {head} loads and works, so the checkpoint is not the "
            "first suspect; state that builds up while serving is (cached prefixes, long contexts, memory). "
            "Check whether a restart clears it: restart the server and compare accept len; if it does, note how "
            "long it served before the collapse and what ran then (context lengths, cache hits).")
    if cleared_by_restart is not None:
        out.append(
            f"The last episode on this server ended with a restart (at {_utc(cleared_by_restart)}), after which "
            f"acceptance was healthy: the {head} works from a fresh start, so look at runtime state that builds up "
            "while serving (cache, long contexts, memory), not at the checkpoint.")
    if recovered:
        out.append(
            f"Acceptance recovered by itself {recovered} time(s) on this server without a restart "
            f"(last at {_utc(last_recovered) if last_recovered is not None else 'n/a'}): the "
            f"{head} loads and works, so look at runtime state first (load, batch fullness, cache), not at the checkpoint. "
            "Check whether the episodes line up with load: `specwatch_accept_length` against "
            "`specwatch_running_requests` and `specwatch_queued_requests`.")
    limit = batch_limit(args)
    full = limit is not None and batch.running_requests >= limit
    if full or batch.queued_requests > 0:
        size = f"{batch.running_requests} of {limit}" if limit is not None else str(batch.running_requests)
        out.append(
            f"Load: the decode batch holds {size} requests{' (full: max_running_requests)' if full else ''} "
            f"and {batch.queued_requests} wait in the queue (`#queue-req`). A collapse only at a full batch "
            "points at the batch-size path (CUDA graph of that size, kernels, memory pressure): try a lower "
            "`--max-running-requests` or `--cuda-graph-max-bs`, and compare accept len at low load.")
    if args.get("enable_hierarchical_cache") is True:
        out.append(
            "Cache: `enable_hierarchical_cache` is on: cached prefixes move between GPU and host memory and "
            "are loaded back on a hit. Check whether the episodes follow cache hits (`#cached-token` in "
            "prefill lines) and try once without `--enable-hierarchical-cache` to rule it out.")
    for name, (before, now) in (changed or {}).items():
        out.append(
            f"Changed at the last restart: {code(name)} {code(before)} → {code(now)}. If acceptance was "
            "healthy before, try the old value.")
    return out


@register
class CollapseRule(ActiveAlertsRule):
    """Per (server, rank) collapse state machine; `observe` returns alerts that changed state.
    A rank's collapse is its firing alert in `active` (under `alert_key(server, rank)`).

    Fixes: the known causes of the server's algorithm (`known_causes`) and the runtime state that
    applies (`runtime_causes`); the runtime state leads once an earlier episode of the server
    recovered without a restart (counted per set of checkpoint settings: a new draft, target or
    algorithm starts the count again). With a `diagnoser` (specwatch.diagnosis.Diagnoser) and an
    EAGLE draft (or an unknown algorithm), the fixes start with the cached probe findings of its
    server (errors, then warnings).
    If the probes are still running when the alert fires, it goes out at once with the generic
    causes, and `on_tick` returns it once more — marked `annotations["update"]`, same
    fingerprint — when the findings arrive during that episode.
    """

    name = "collapse"
    alert_names = (ALERT_NAME,)
    order = 0

    @classmethod
    def build(cls, config: Config, ctx: RuleContext) -> "CollapseRule":
        rule = cls(config.collapse, diagnoser=ctx.diagnoser)
        rule.windows = config.windows
        return rule

    def __init__(self, config: CollapseConfig, diagnoser=None):
        super().__init__()
        self.config = config
        self.diagnoser = diagnoser
        self.windows = WindowConfig()
        self._ranks: dict[tuple[str, str], _RankState] = {}
        self._log_decode: dict[str, float] = {}  # per server: the clock of its logs' last decode line
        self._scrapes: dict[str, MetricsSample] = {}  # per server: its engine's last /metrics sample
        self._server_args: dict[str, dict[str, object]] = {}
        self._history: dict[str, _History] = {}

    def on_tick(self, now: float) -> list[Alert]:
        if self.diagnoser is None:
            return []
        updates = []
        for (server, rank), st in self._ranks.items():
            alert = self.active.get(alert_key(server, rank)) if st.awaiting_diagnosis else None
            if alert is None:
                continue
            report = self.diagnoser.report(server)
            if report is None and self.diagnoser.pending(server):
                continue
            st.awaiting_diagnosis = False
            if report is not None and report.actionable():
                self._apply_diagnosis(alert, server, report)
                alert.annotations["update"] = f"specwatch diagnose: {_summary(report)}"
            else:  # not checked, failed, or nothing found: the generic causes stand, and the update says why
                alert.annotations["update"] = f"specwatch diagnose: {self._note_no_findings(alert, server)}"
            updates.append(alert)
        return updates

    def _note_no_findings(self, alert: Alert, server: str) -> str:
        """Put the diagnosis outcome into the evidence of an alert it adds no fixes to; returns it."""
        report = self.diagnoser.report(server)
        note = _summary(report) if report is not None else self.diagnoser.note(server)
        alert.evidence = [p for p in alert.evidence if p[0] != "diagnosis"] + [("diagnosis", note)]
        return note

    def _apply_diagnosis(self, alert: Alert, server: str, report) -> None:
        # Once per episode (at firing, or in one update): the findings go before the other fixes.
        alert.fixes = [f.one_line() for f in report.actionable()] + alert.fixes
        alert.evidence = [p for p in alert.evidence if p[0] != "diagnosis"] + [("diagnosis", _summary(report))]

    def reconfigure(self, config: Config) -> None:
        # Runs of low/high batches carry over: a rank half-way to firing stays half-way.
        self.config, self.windows = config.collapse, config.windows

    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        """Settings (`ServerArgs`) for the evidence; an engine's /metrics sample, which judges the
        collapse while the server's logs give no decode line (`metrics_decide`)."""
        if isinstance(event, ServerArgs):
            self.observe_server_args(server, event)
        elif isinstance(event, MetricsSample):
            self._scrapes[server] = event
            if self.metrics_decide(server, now):
                log_ranks = [(r, st.summary.ranks) for (s, r), st in self._ranks.items()
                             if s == server and st.summary is not None]
                return collapse_from_metrics(self, server, event, self.windows, log_ranks)
        return []

    @staticmethod
    def _labels(server: str, rank: str, st: _RankState) -> list | None:
        """The rank's label values once a decode line named it (or as saved), else None."""
        rs = st.summary
        if rs is not None:
            d = rs.last_decode
            return None if d is None else rank_label_values(server, rs.ranks, d.engine, rank)
        return st.labels

    def metrics_decide(self, server: str, at: float) -> bool:
        """The engine's /metrics judges the collapse of `server` at `at` (seconds): its logs gave
        no decode line within `rules.windows.max_gap` before (rules/server_metrics.py)."""
        last = self._log_decode.get(server)
        return last is None or at - last > self.windows.max_gap

    def metric_families(self) -> list:
        """`specwatch_acceptance_collapsed`: 1 while this rule fires for a rank, else 0; for each
        rank a log named, and each rank of the last /metrics sample while /metrics decides
        (labelled `source="server_metrics"` and its `engine`)."""
        from prometheus_client.core import GaugeMetricFamily  # scrapes only: replay never loads it
        from prometheus_client.samples import Sample
        fam = GaugeMetricFamily("specwatch_acceptance_collapsed", "1 while the acceptance-collapse rule fires for this rank, else 0.", labels=RANK_LABELS)
        for (server, rank), st in self._ranks.items():
            labels = self._labels(server, rank, st)
            if labels is not None:
                fam.add_metric(labels, 1.0 if alert_key(server, rank) in self.active else 0.0)
        for server, sample in self._scrapes.items():
            if sample.error is not None or not self.metrics_decide(server, sample.timestamp):
                continue
            for rm in sample.ranks:
                if rm.accept_length is not None:
                    named = dict(zip(RANK_LABELS, rank_label_values(server, rm.ranks)), source="server_metrics",
                                 engine=sample.engine or "")
                    fam.samples.append(Sample(fam.name, named, 1.0 if self.collapsed(server, rm.rank) else 0.0))
        return [fam]

    def on_restart(self, server: str, now: float, why: str) -> list[Alert]:
        """A restarted server starts from scratch (often with new flags, e.g. speculation off):
        its collapses resolve and every rank's runs reset."""
        out = []
        for key in [k for k in self._ranks if k[0] == server]:
            del self._ranks[key]
            out += self._resolve(alert_key(*key), now, ("resolved because", why))
        hist = self._history.get(server)
        if hist is not None:  # recoveries before the restart say nothing about the new process
            hist.recovered, hist.last_recovered, hist.counted = 0, None, False
            if out:
                hist.cleared_by_restart = now
        return out

    def _resolve(self, akey: str, at: float, first: tuple[str, str]) -> list[Alert]:
        """`ActiveAlerts.resolve`, with the reason as the first line of evidence."""
        resolved = self.active.resolve(akey, at)
        for alert in resolved:
            alert.resolved_with(first, first=True)
        return resolved

    def observe_server_args(self, server: str, event: ServerArgs) -> None:
        old, new = self._server_args.get(server) or {}, event.args
        hist = self._history.setdefault(server, _History())
        checkpoint = [new.get(k) for k in CHECKPOINT_KEYS]
        if hist.checkpoint and any(a is not None and b is not None and a != b
                                   for a, b in zip(hist.checkpoint, checkpoint)):
            hist.recovered, hist.last_recovered = 0, None  # another model: earlier recoveries say nothing
        hist.checkpoint = checkpoint
        for k in CHANGE_KEYS:
            if old.get(k) is not None and new.get(k) is not None and old[k] != new[k]:
                hist.previous.setdefault(k, old[k])
        self._server_args[server] = new

    def _changed(self, server: str) -> dict[str, tuple[object, object]]:
        """Settings that differ from their value before a restart: name → (before, now)."""
        hist, args = self._history.get(server), self._server_args.get(server) or {}
        if hist is None:
            return {}
        return {k: (v, args.get(k)) for k, v in hist.previous.items() if args.get(k) != v}

    def _collapsed_ranks(self, server: str) -> bool:
        """Some rank of `server` is collapsed (its alert firing)."""
        return any(self.active[k].labels.get("server") == server for k in self.active.keys())

    def collapsed(self, server: str, rank: str) -> bool:
        return alert_key(server, rank) in self.active

    def on_lines(self, server: str, ranks: list, emit) -> list[Alert]:
        """Each rank's pending lines in order through `_step`: the runs of low and high lines are a
        state machine. A firing alert's evidence follows the rank's last low line: rebuilt at
        most every EVIDENCE_EVERY s of log time, and whenever it is read (`firing_alerts`, the
        saved state) or the alert resolves (`_fresh`)."""
        step, states, valid = self._step, self._ranks, VALID_ACCEPT
        for rs in ranks:
            st = states.get(rs.key)
            if st is None:
                st = states[rs.key] = _RankState()
            st.summary = rs
            if rs.pending and rs.pending[-1][1] > self._log_decode.get(server, -math.inf):
                self._log_decode[server] = rs.pending[-1][1]
            for e in rs.pending:
                if e[6] & valid:
                    alert, low = step(server, rs.rank, st, e[0], e[2], rs, e)
                    if alert is not None:
                        emit([alert], e)
                        st.stale, st.evidence_at = None, e[0]  # fired or resolved here: its evidence is this line's
                    elif low and st.low_run > self.config.min_batches and not self.active.empty():
                        st.stale = (rs, e, st.low_run)  # a firing rank's newer low line
            if st.stale is not None and st.stale[1][0] - st.evidence_at >= EVIDENCE_EVERY:
                self._fresh(server, rs.rank, st)
        return []

    def _fresh(self, server: str, rank: str, st: _RankState) -> None:
        """The firing alert's evidence from the rank's last low line (`st.stale`), if newer."""
        stale, st.stale = st.stale, None
        if stale is None:
            return
        alert = self.active.get(alert_key(server, rank))
        if alert is not None:
            rs, entry, run = stale
            self._update_evidence(alert, server, rs.batch(entry), st, run)
            st.evidence_at = entry[0]

    def firing_alerts(self) -> list[Alert]:
        for (server, rank), st in self._ranks.items():
            if st.stale is not None:
                self._fresh(server, rank, st)
        return super().firing_alerts()

    def observe(self, server: str, window: Window) -> Alert | None:
        """Feed one classified decode line (an engine's /metrics sample: `rules/server_metrics.py`);
        returns the alert when it fires or resolves, else None."""
        if not window.acceptance_valid:
            return None  # idle or prefill-dominated: says nothing about the draft
        batch = window.batch
        st = self._ranks.get((server, batch.rank))
        if st is None:
            st = self._ranks[(server, batch.rank)] = _RankState()
        accept = batch.accept_length
        assert accept is not None  # acceptance_valid
        alert, low = self._step(server, batch.rank, st, batch.timestamp, accept, batch, None)
        if alert is None and low:
            firing = self.active.get(alert_key(server, batch.rank))
            if firing is not None:
                self._update_evidence(firing, server, batch, st)
        return alert

    def _step(self, server: str, rank: str, st: _RankState, ts: float, accept: float, src, entry) -> tuple:
        """One valid decode line of a rank (timestamp `ts` s, its accept len): its runs and the
        alert that fires or resolves at it. `src`: the line's DecodeBatch (entry None), or the
        `RankSummary` whose pending `entry` it is (its DecodeBatch built only for an alert).
        Returns (alert or None, whether the line is at collapse level)."""
        cfg = self.config
        if accept <= cfg.max_accept_length:
            if st.low_run == 0:
                st.low_since = ts
            st.low_run += 1
            st.high_run = 0
            if st.low_run >= cfg.min_batches:
                akey = alert_key(server, rank)
                if akey not in self.active:
                    if not self._collapsed_ranks(server):  # a new episode (not another rank of this one)
                        self._history.setdefault(server, _History()).counted = False
                    batch = src if entry is None else src.batch(entry)
                    return self.active.fire(akey, self._alert(server, batch, st))[0], True
            return None, True
        if accept >= cfg.recover_accept_length:
            st.high_run += 1
            st.low_run = 0
            if st.healthy_since is None:
                st.healthy_since = ts
            # the key is built only while some alert fires: a healthy line formats nothing
            if st.high_run >= cfg.min_batches and not self.active.empty() \
                    and (akey := alert_key(server, rank)) in self.active:
                self._fresh(server, rank, st)
                st.awaiting_diagnosis = False
                hist = self._history.setdefault(server, _History())
                if not hist.counted:  # recovered by itself (a restart resolves in on_restart), once an episode
                    hist.recovered, hist.counted = hist.recovered + 1, True
                hist.last_recovered = ts
                return self._resolve(akey, ts, ("recovered accept len", fmt(accept)))[0], False
            return None, False
        st.low_run = st.high_run = 0
        return None, False

    def _update_evidence(self, alert: Alert, server: str, batch: DecodeBatch, st: _RankState,
                         low_run: int | None = None) -> None:
        kept = [p for p in alert.evidence if p[0] in ("diagnosis", "read from")]  # not from the batch
        alert.evidence[:] = self._evidence(server, batch, st, low_run) + kept

    def settings(self, server: str) -> dict[str, object]:
        """The server's last settings this rule saw (kept in its persisted state), {} if none."""
        return dict(self._server_args.get(server) or {})

    def _evidence(self, server: str, batch: DecodeBatch, st: _RankState,
                  low_run: int | None = None) -> list[tuple[str, str]]:
        """The batch (acceptance, load: `#running-req`, `#queue-req`, fullness against the batch
        limit), the history, then the settings that matter (a changed one with its old value)."""
        args = self._server_args.get(server) or {}
        out = [
            ("accept len", fmt(batch.accept_length)),
            ("accept rate", fmt(batch.accept_rate)),
            ("gen throughput (token/s)", fmt(batch.gen_throughput)),
            ("running requests", str(batch.running_requests)),
            ("queued requests", str(batch.queued_requests)),
        ]
        if batch.draft_tokens is not None:  # vLLM: the interval's counts and per-position rates
            out.append(("accepted / drafted tokens", f"{batch.accepted_tokens} / {batch.draft_tokens}"))
        if batch.position_accept_rates:
            out.append(("per-position acceptance rate", ", ".join(f"{r:.3f}" for r in batch.position_accept_rates)))
        limit = batch_limit(args)
        if limit is not None:
            full = " (full)" if batch.running_requests >= limit else ""
            out.append(("decode batch", f"{batch.running_requests} of {limit} requests{full}"))
        out.append(("decode batches at or below threshold", str(st.low_run if low_run is None else low_run)))
        hist = self._history.get(server)
        # a firing alert is of the current episode: once its first rank recovered it is counted too
        earlier = hist.recovered - hist.counted if hist is not None else 0
        if earlier:
            out.append(("earlier episodes recovered without a restart", str(earlier)))
        changed = self._changed(server)
        settings = args_evidence(args) + [(k, str(args[k])) for k in SETTING_KEYS if args.get(k) is not None]
        return out + [(k, f"{v} (was {changed[k][0]} before the restart)" if k in changed else v) for k, v in settings]

    def _alert(self, server: str, batch: DecodeBatch, st: _RankState) -> Alert:
        args = self._server_args.get(server, {})
        if batch.engine != "sglang" and "engine" not in args:  # a vLLM log without its engine-config line
            args = {**args, "engine": batch.engine}
        hist = self._history.get(server) or _History()
        start = st.low_since if st.low_since is not None else batch.timestamp
        # a restart ended the last episode and this rank was healthy after it: the restart cleared it
        cleared = hist.cleared_by_restart if st.healthy_since is not None else None
        long_healthy = (not hist.recovered and st.healthy_since is not None  # else the recoveries say it
                        and start - st.healthy_since >= self.config.healthy_before)
        runtime = runtime_causes(args, batch, hist.recovered, hist.last_recovered, self._changed(server),
                                 healthy_from=st.healthy_since if long_healthy else None,
                                 cleared_by_restart=cleared)
        causes = known_causes(args)
        kind = draft_kind(args)
        where = f"{server} {batch.rank}".strip()
        alert = new_alert(
            ALERT_NAME, "critical", server, batch.rank,
            summary=f"Speculative decoding collapsed on {where}: accept len {batch.accept_length:.2f}",
            description=(
                f"accept len stayed at or below {self.config.max_accept_length:.2f} for "
                f"{st.low_run} consecutive decode batches with requests running: the target "
                "rejects (almost) every draft token, so "
                + ("the n-gram drafts cost time and save none." if kind == NGRAM
                   else "the MTP head costs time and saves none." if kind == MTP
                   else "the draft model costs time and saves none.")
            ),
            starts_at=st.low_since if st.low_since is not None else batch.timestamp,
            evidence=self._evidence(server, batch, st),
            fixes=runtime + causes if hist.recovered or long_healthy or cleared else causes + runtime,
        )
        if self.diagnoser is not None and kind in (EAGLE, None):  # the probes read EAGLE drafts (SGLang or vLLM)
            self.diagnoser.ensure(server)  # once per episode: re-runs only if the inputs changed
            report = self.diagnoser.report(server)
            if report is not None and report.actionable():
                self._apply_diagnosis(alert, server, report)
            elif report is None and self.diagnoser.pending(server):
                st.awaiting_diagnosis = True
            else:
                self._note_no_findings(alert, server)
        return alert

    # --- persistence (the daemon saves this with the file offsets, atomically) ---
    def to_state(self) -> dict:
        self.firing_alerts()  # evidence up to date
        return {
            **super().to_state(),
            "ranks": [
                {"server": s, "rank": r, "low_run": st.low_run, "high_run": st.high_run,
                 "low_since": st.low_since, "healthy_since": st.healthy_since, "labels": self._labels(s, r, st)}
                for (s, r), st in self._ranks.items()
            ],
            "server_args": self._server_args,
            "history": {s: vars(h) for s, h in self._history.items()},
        }

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        for d in state.get("ranks", []):
            self._ranks[(d["server"], d["rank"])] = _RankState(
                low_run=d["low_run"], high_run=d["high_run"], low_since=d["low_since"],
                healthy_since=d.get("healthy_since"), labels=d.get("labels"))
            if d.get("collapsed") and d.get("alert"):  # the state of earlier versions: alert per rank
                self.active.load_state({alert_key(d["server"], d["rank"]): d["alert"]})
        self._server_args.update(state.get("server_args", {}))
        for server, h in state.get("history", {}).items():
            self._history[server] = _History(**h)
