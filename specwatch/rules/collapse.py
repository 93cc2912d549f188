"""Acceptance collapse: the draft model's tokens are (almost) all rejected.

Decided from `accept len` only: its floor is 1.00 in every SGLang version, while `accept rate`
changed meaning twice (0.25 vs 0.00 at the same total collapse; `report_decode_stats` in
sglang/srt/observability/scheduler_metrics_mixin.py 0.5.11 against its 0.5.3.post3-0.5.10 forms).

A rank collapses after `min_batches` consecutive decode batches with accept len <=
`max_accept_length` while requests are running; it recovers after `min_batches` consecutive
batches at or above `recover_accept_length`. Batches in between reset both runs, so a rank that
hovers between the thresholds keeps its current state (no flapping). Lines of idle or
prefill-dominated windows (`rules/windows.py`) are skipped: they neither count nor break a run.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

from specwatch.alerts.model import RESOLVED, Alert, code
from specwatch.config import AcceptLength, Config, Count, Section, rule_section
from specwatch.events import DecodeBatch, ServerArgs
from specwatch.rules.base import Rule, RuleContext, args_evidence, fmt, new_alert, register
from specwatch.rules.windows import Window


@rule_section("collapse")
class CollapseConfig(Section):
    """rules.collapse: fire after min_batches lines at or below max_accept_length, resolve
    after min_batches lines at or above recover_accept_length."""

    max_accept_length: AcceptLength = 1.10
    min_batches: Count = 3
    recover_accept_length: AcceptLength = 1.5

    def problems(self):
        if self.recover_accept_length <= self.max_accept_length:
            yield "recover_accept_length", (f"must be above max_accept_length ({self.max_accept_length}) "
                                            "or the alert would flap; e.g. 1.5")


ALERT_NAME = "AcceptanceCollapse"


@dataclass
class _RankState:
    low_run: int = 0
    high_run: int = 0
    low_since: float | None = None
    collapsed: bool = False
    alert: Alert | None = None
    awaiting_diagnosis: bool = False  # fired before the probes finished: one follow-up due


def _summary(report) -> str:
    errors = sum(f.severity == "error" for f in report.findings)
    warnings = sum(f.severity == "warning" for f in report.findings)
    return f"{errors} error(s), {warnings} warning(s) on SGLang {report.sglang_version or '?'}"


def known_causes(args: dict[str, object] | None) -> list[str]:
    """The known causes of a total collapse, each with a check a user can run now: first the
    whole diagnosis in one command, then the four causes one by one.

    Paths come from the server's settings (`server_args` line, command line, /server_info) when
    known. Facts, all in `sglang/srt/`: `models/llama_eagle3.py` (module `midlayer` in 0.5.11;
    `layers.0` with a `midlayer` rename in 0.5.12+; fc width check in `LlamaModel.forward`; d2t read
    as offsets in `load_weights`, 0.5.11 and 0.5.23), capture in `model_executor/model_runner.py`
    0.5.11 and `model_runner_components/attention_backend_setup.py` 0.5.23, and the wrappers that
    skip it in `models/gemma3_mm.py` and `models/mllama4.py` 0.5.23.
    """
    args = args or {}
    draft_arg = args.get("speculative_draft_model_path")
    target_arg = args.get("model_path")
    draft = str(draft_arg or "<draft dir>")
    target = str(target_arg or "<target dir>")
    algo = args.get("speculative_algorithm")
    # Values from the server go into commands shell-quoted and into the text as code spans.
    q_target = shlex.quote(target) if target_arg else target
    # A Hugging Face repo id is not a folder: the commands need its local snapshot.
    hub = bool(draft_arg) and not os.path.isabs(draft) and not os.path.isdir(draft)
    folder = (f'"$(huggingface-cli download {shlex.quote(draft)})"' if hub
              else shlex.quote(draft) if draft_arg else draft)
    # The folder reaches Python as an argument, never inside its source.
    py_keys = ("python -c \"import glob, sys; from safetensors import safe_open; print(sorted({k.split('.')[0] "
               "for f in glob.glob(glob.escape(sys.argv[1]) + '/*.safetensors') for k in safe_open(f, 'np').keys()}))\" ")
    py_d2t = ("python -c \"import glob, sys; from safetensors import safe_open; "
              "f=safe_open(glob.glob(glob.escape(sys.argv[1]) + '/*.safetensors')[0], 'np'); d=f.get_tensor('d2t'); "
              "print(d[:8], d.min(), d.max())\" ")
    fixes = [
        "Run the whole diagnosis (files only, reads the SGLang this server runs): "
        + code(f"specwatch diagnose --draft {folder} --target {q_target}"
               + (f" --algorithm {shlex.quote(str(algo))}" if algo else ""))
        + " — it names dropped weights, missing capture, fc bypass, layer ids and the d2t map, with the fix.",
        "Unloaded draft weights: SGLang <= 0.5.11 loads the draft decoder layer only from "
        "`midlayer.*` keys and silently drops `layers.0.*` (as saved by the speculators trainer). "
        f"Check: {code(py_keys + folder)} and `pip show sglang`. "
        f"Fix: {code(f'specwatch fix-checkpoint --draft {folder} --out <new dir>')} (renames `layers.0.` to "
        "`midlayer.`), or upgrade to SGLang >= 0.5.12.",
        "Missing aux hidden-state capture: the target model class must implement "
        "`set_eagle3_layers_to_capture`, and a multimodal wrapper must forward it to its language "
        "model (Gemma3/Llama4 wrappers skip it silently when the inner model lacks it). Check: "
        "`grep -rn set_eagle3_layers_to_capture $(python -c 'import sglang, os; "
        "print(os.path.dirname(sglang.__file__))')/srt/models/` for your target's architecture "
        f"(`architectures` in {code(target + '/config.json')}). Fix: use a target class that captures, or upgrade SGLang.",
        "fc bypass: the draft's `fc.weight` is [H, 3*H] (e.g. [7168, 21504]) and runs only when the "
        "target feeds 3*H-wide aux hidden states; with capture off, a single captured layer, or "
        "`--speculative-algorithm EAGLE` for an EAGLE-3 draft, H-wide states skip the fc silently. "
        f"Check: the draft config's `eagle_config.eagle_aux_hidden_state_layer_ids` in {code(draft + '/config.json')} "
        "(3 ids below the target's num_hidden_layers) and that the server runs "
        "`--speculative-algorithm EAGLE3`"
        + (f" (this server: {code(algo)})." if algo else "."),
        "d2t map: SGLang reads `d2t` as offsets (target_id = draft_id + d2t[draft_id]); a map stored "
        f"as absolute target ids sends every draft token to the wrong target token. Check: {code(py_d2t + folder)}"
        " — offsets are small and mostly non-decreasing from 0; "
        "values near the vocabulary size mean absolute ids (fix: `specwatch fix-checkpoint` re-encodes them).",
    ]
    return fixes


@register
class CollapseRule(Rule):
    """Per (server, rank) collapse state machine; `observe` returns alerts that changed state.

    With a `diagnoser` (specwatch.diagnosis.Diagnoser), a firing alert's fixes start with the
    cached probe findings of its server (errors, then warnings), then the generic known causes.
    If the probes are still running when the alert fires, it goes out at once with the generic
    causes, and `on_tick` returns it once more — marked `annotations["update"]`, same
    fingerprint — when the findings arrive during that episode.
    """

    name = "collapse"
    alert_names = (ALERT_NAME,)
    order = 0

    @classmethod
    def build(cls, config: Config, ctx: RuleContext) -> "CollapseRule":
        return cls(config.collapse, diagnoser=ctx.diagnoser)

    def __init__(self, config: CollapseConfig, diagnoser=None):
        self.config = config
        self.diagnoser = diagnoser
        self._ranks: dict[tuple[str, str], _RankState] = {}
        self._server_args: dict[str, dict[str, object]] = {}

    def on_tick(self, now: float) -> list[Alert]:
        if self.diagnoser is None:
            return []
        updates = []
        for (server, _), st in self._ranks.items():
            if not (st.awaiting_diagnosis and st.collapsed and st.alert is not None):
                continue
            report = self.diagnoser.report(server)
            if report is None:
                if not self.diagnoser.pending(server):
                    st.awaiting_diagnosis = False  # failed or gave up: the generic causes stand
                continue
            st.awaiting_diagnosis = False
            if report.actionable():
                self._apply_diagnosis(st.alert, server, report)
                st.alert.annotations["update"] = f"specwatch diagnose: {_summary(report)}"
                updates.append(st.alert)
        return updates

    def _apply_diagnosis(self, alert: Alert, server: str, report) -> None:
        alert.fixes = [f.one_line() for f in report.actionable()] + known_causes(self._server_args.get(server))
        alert.evidence = [p for p in alert.evidence if p[0] != "diagnosis"] + [("diagnosis", _summary(report))]

    def reconfigure(self, config: Config) -> None:
        # Runs of low/high batches carry over: a rank half-way to firing stays half-way.
        self.config = config.collapse

    def on_decode(self, server: str, window: Window, now: float) -> list[Alert]:
        alert = self.observe(server, window)
        return [alert] if alert is not None else []

    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        if isinstance(event, ServerArgs):
            self.observe_server_args(server, event)
        return []

    def on_restart(self, server: str, now: float, why: str) -> list[Alert]:
        """A restarted server starts from scratch (often with new flags, e.g. speculation off):
        its collapses resolve and every rank's runs reset."""
        out = []
        for key in [k for k in self._ranks if k[0] == server]:
            st = self._ranks.pop(key)
            if st.collapsed and st.alert is not None:
                st.alert.status = RESOLVED
                st.alert.ends_at = now
                st.alert.evidence.insert(0, ("resolved because", why))
                out.append(st.alert)
        return out

    def observe_server_args(self, server: str, event: ServerArgs) -> None:
        self._server_args[server] = event.args

    def firing_alerts(self) -> list[Alert]:
        return [st.alert for st in self._ranks.values() if st.collapsed and st.alert is not None]

    def collapsed(self, server: str, rank: str) -> bool:
        st = self._ranks.get((server, rank))
        return bool(st and st.collapsed)

    def observe(self, server: str, window: Window) -> Alert | None:
        """Feed one classified decode line; returns the alert when it fires or resolves, else None."""
        if not window.acceptance_valid:
            return None  # idle or prefill-dominated: says nothing about the draft
        batch = window.batch
        key = (server, batch.rank)
        st = self._ranks.get(key)
        if st is None:
            st = self._ranks[key] = _RankState()
        cfg = self.config
        if batch.accept_length <= cfg.max_accept_length:
            if st.low_run == 0:
                st.low_since = batch.timestamp
            st.low_run += 1
            st.high_run = 0
            if not st.collapsed and st.low_run >= cfg.min_batches:
                st.collapsed = True
                st.alert = self._alert(server, batch, st)
                return st.alert
            if st.collapsed and st.alert is not None:
                self._update_evidence(st.alert, batch, st)
        elif batch.accept_length >= cfg.recover_accept_length:
            st.high_run += 1
            st.low_run = 0
            if st.collapsed and st.high_run >= cfg.min_batches:
                st.collapsed = False
                st.awaiting_diagnosis = False
                alert, st.alert = st.alert, None
                if alert is not None:
                    alert.status = RESOLVED
                    alert.ends_at = batch.timestamp
                    alert.evidence.insert(0, ("recovered accept len", fmt(batch.accept_length)))
                    return alert
        else:
            st.low_run = st.high_run = 0
        return None

    def _update_evidence(self, alert: Alert, batch: DecodeBatch, st: _RankState) -> None:
        kept = [p for p in alert.evidence if p[0] == "diagnosis"]
        alert.evidence[:] = self._evidence(batch, st) + kept

    def _evidence(self, batch: DecodeBatch, st: _RankState) -> list[tuple[str, str]]:
        return [
            ("accept len", fmt(batch.accept_length)),
            ("accept rate", fmt(batch.accept_rate)),
            ("gen throughput (token/s)", fmt(batch.gen_throughput)),
            ("running requests", str(batch.running_requests)),
            ("decode batches at or below threshold", str(st.low_run)),
        ]

    def _alert(self, server: str, batch: DecodeBatch, st: _RankState) -> Alert:
        args = self._server_args.get(server, {})
        evidence = self._evidence(batch, st) + args_evidence(args)
        where = f"{server} {batch.rank}".strip()
        alert = new_alert(
            ALERT_NAME, "critical", server, batch.rank,
            summary=f"Speculative decoding collapsed on {where}: accept len {batch.accept_length:.2f}",
            description=(
                f"accept len stayed at or below {self.config.max_accept_length:.2f} for "
                f"{st.low_run} consecutive decode batches with requests running: the target "
                "rejects (almost) every draft token, so the draft model costs time and saves none."
            ),
            starts_at=st.low_since if st.low_since is not None else batch.timestamp,
            evidence=evidence,
            fixes=known_causes(args),
        )
        if self.diagnoser is not None:
            self.diagnoser.ensure(server)  # once per episode: re-runs only if the inputs changed
            report = self.diagnoser.report(server)
            if report is not None and report.actionable():
                self._apply_diagnosis(alert, server, report)
            elif report is None and self.diagnoser.pending(server):
                st.awaiting_diagnosis = True
        return alert

    # --- persistence (the daemon saves this with the file offsets, atomically) ---
    def to_state(self) -> dict:
        return {
            "ranks": [
                {"server": s, "rank": r, "low_run": st.low_run, "high_run": st.high_run,
                 "low_since": st.low_since, "collapsed": st.collapsed,
                 "alert": st.alert.to_dict() if st.alert else None}
                for (s, r), st in self._ranks.items()
            ],
            "server_args": self._server_args,
        }

    def load_state(self, state: dict) -> None:
        for d in state.get("ranks", []):
            self._ranks[(d["server"], d["rank"])] = _RankState(
                low_run=d["low_run"], high_run=d["high_run"], low_since=d["low_since"],
                collapsed=d["collapsed"], alert=Alert.from_dict(d["alert"]) if d.get("alert") else None,
            )
        self._server_args.update(state.get("server_args", {}))
