"""Errors in the server log: a traceback, CUDA out of memory, an NCCL timeout, a shape mismatch,
a hung scheduler's watchdog, a crashed subprocess, a failed CUDA graph capture, a device-side
assert, a setting the engine does not support.

The pipeline's error stage (`sources/log_errors.py`) groups each traceback (or burst of torch C++
error lines) into one `LogError` and classifies it. `ServerLogError` fires per server and kind at
the first one, with the exception line, the last lines, the settings that matter and a fix for
that kind; later errors of the same kind update its evidence. Severity by kind: every kind but
`other` stops the server or its requests (critical; `unsupported` is a server that refuses a
setting at start-up); `other` is a warning, and critical while the server is starting (no batch
line since its last `server_args` line, or none at all): a server that cannot start cannot serve. A start that failed with the same settings as the one before counts as
another start of a crash loop (evidence `failed starts with these settings`). A subprocess crash
while the watchdog alert of the same server fires is that alert's evidence (the launcher's
reaction to the hang). Kind `shutdown` (an error while the server is being stopped) and a failed
health check raise nothing here (the latter is `DecodeStalled`'s and `ServerUnhealthy`'s).
It resolves `resolve_after` after the last error of its kind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import math
import re
import shlex

from specwatch.alerts.model import Alert, code, iso8601
from specwatch.core.sections import Seconds, Section, rule_section
from specwatch.core.events import LogError, ServerArgs
from specwatch.rules.active import ActiveAlertsRule
from specwatch.rules.base import RuleContext, alert_key, args_evidence, new_alert, register, speculation_configured

if TYPE_CHECKING:  # annotations only: rule files never import config.py
    from specwatch.config import Config


@rule_section("log_errors")
class LogErrorsConfig(Section):
    enabled: bool = True
    resolve_after: Seconds = 900.0  # quiet time after the last error of a kind


ALERT_NAME = "ServerLogError"
SEVERITY = {"cuda_oom": "critical", "nccl_timeout": "critical", "shape_mismatch": "critical",
            "watchdog_timeout": "critical", "subprocess_crash": "critical", "cuda_graph": "critical",
            "device_assert": "critical", "unsupported": "critical", "other": "warning"}
TITLE = {"cuda_oom": "CUDA out of memory", "nccl_timeout": "NCCL collective timeout",
         "shape_mismatch": "tensor shape mismatch", "watchdog_timeout": "hung scheduler (watchdog timeout)",
         "subprocess_crash": "crashed server subprocess", "cuda_graph": "CUDA graph capture failure",
         "device_assert": "CUDA device-side assert", "unsupported": "setting not supported by the engine",
         "other": "Python error"}
IMPACT = {
    "cuda_oom": "Requests fail or the server exits; speculative decoding adds the draft's memory.",
    "nccl_timeout": "A collective between ranks did not finish: the server hangs or exits.",
    "shape_mismatch": "A model's tensors do not fit together: the server fails at warmup or at the first batch.",
    "watchdog_timeout": "A forward pass made no progress for the whole watchdog timeout: every request hung, "
                        "and the watchdog kills the server (its `/health` may have answered 200 all along).",
    "subprocess_crash": "A server subprocess died: the launcher stops the whole server.",
    "cuda_graph": "The server cannot finish start-up: it exits before serving, at every start with these settings.",
    "device_assert": "A CUDA kernel's assert failed: that rank's CUDA context is unusable, the other ranks "
                     "time out waiting for it, and the server exits.",
    "unsupported": "The engine refuses this combination of settings: the server never serves.",
    "other": "The server or a request failed.",
}
# Settings named in the evidence besides the speculative ones (`args_evidence`).
PARALLEL_KEYS = ("tp_size", "dp_size", "enable_dp_attention", "tensor_parallel_size", "data_parallel_size",
                 "watchdog_timeout", "enable_expert_distribution_metrics", "disable_cuda_graph")
_EXIT = re.compile(r"crashed with exit code (-?\d+)")
_SUBPROCESS = re.compile(r"Subprocess (\S+) ")
SHOWN_LINES = 8
# Settings that differ between two starts of the same server without changing what it runs.
_VOLATILE = ("port", "random_seed", "host", "served_model_name")
_SIZES = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)")


def _shape_hint(exception: str | None) -> str | None:
    """`… tensor a (8640) must match … tensor b (5760)` → both as multiples of their common
    width when that is 1-4 × a hidden size (EAGLE-3 concatenates 3 aux hidden states)."""
    m = _SIZES.search(exception or "")
    if m is None:
        return None
    a, b = int(m.group(1)), int(m.group(2))
    h = math.gcd(a, b)
    if h < 256 or a // h > 4 or b // h > 4:
        return None
    return (f"{a} = {a // h} × {h} and {b} = {b // h} × {h}: one side holds {a // h} hidden states "
            f"of width {h}, the other {b // h}")


# The engine's options each fix names. SGLang: sglang/srt/server_args.py@0.5.23; vLLM:
# vllm/engine/arg_utils.py@0.33.0 (the draft in `--speculative-config`, vllm/config/speculative.py).
_OPTIONS = {
    "sglang": {
        "memory": "lower `--mem-fraction-static` (e.g. by 0.05), `--max-running-requests`, "
                  "`--chunked-prefill-size` or `--cuda-graph-max-bs`",
        "draft": "`--speculative-num-draft-tokens` verify tokens per request: lower `--speculative-num-steps`, "
                 "`--speculative-eagle-topk` or `--speculative-num-draft-tokens`",
        "timeout": "`--dist-timeout`",
        "diagnose": "specwatch diagnose --draft DRAFT_DIR --target TARGET_DIR",
        "ids": "the draft was trained on (3 ids), and the target's model class must capture them",
        "eagle": "`--speculative-algorithm EAGLE` instead of `EAGLE3`",
        "settings": "the `server_args` line",
    },
    "vllm": {
        "memory": "lower `--gpu-memory-utilization` (e.g. by 0.05), `--max-num-seqs`, "
                  "`--max-num-batched-tokens` or `--max-model-len`",
        "draft": "its `num_speculative_tokens` per request: lower `num_speculative_tokens` in `--speculative-config`",
        "timeout": "`--distributed-timeout-seconds`",
        "diagnose": "specwatch diagnose --engine vllm --draft DRAFT_DIR --target TARGET_DIR",
        "ids": "the draft was trained on, and the target's model class must support EAGLE-3",
        "eagle": '`"method": "eagle"` instead of `"eagle3"` in `--speculative-config`',
        "settings": "the engine-config line (`Initializing a V1 LLM engine (v...) with config: ...`)",
    },
}


def _on(args: dict, key: str) -> bool:
    return str(args.get(key)).lower() in ("true", "1")


def _int(args: dict, *keys: str) -> int:
    for k in keys:
        try:
            return int(args.get(k) or 0)
        except (TypeError, ValueError):
            continue
    return 0


def fixes_for(kind: str, event: LogError, args: dict | None = None) -> list[str]:
    """What to check for an error of `kind` (most likely first); log text in code spans. The
    options named are the engine's: vLLM's when `event.engine` is "vllm", else SGLang's. `args`:
    the server's settings (`ServerArgs.args`), which pick the known cause of a kind."""
    path = shlex.quote(event.path)
    args = args or {}
    opt = _OPTIONS["vllm" if event.engine == "vllm" else "sglang"]
    spec = bool(speculation_configured(args))
    text = "\n".join((event.exception or "",) + tuple(event.lines))
    if kind == "watchdog_timeout":
        out = []
        if spec and _on(args, "enable_dp_attention"):
            out.append(
                f"Speculative decoding ({args.get('speculative_algorithm')}) with `--enable-dp-attention` hangs "
                "every DP rank in the draft's collectives on the first real request (a known deadlock, "
                "sgl-project/sglang#29144): serve without speculation (drop `--speculative-algorithm`) or "
                "without `--enable-dp-attention` until your SGLang has the fix.")
        elif spec:
            out.append("Restart once without speculative decoding (drop `--speculative-algorithm`): if it then "
                       "serves, the hang is in the draft's forward pass; report it upstream with the `server_args` line.")
        out += [
            "Before restarting, see where it is stuck: `py-spy dump --pid PID` on each scheduler process "
            "(SGLang logs one when `py-spy` is installed), and `nvidia-smi` (GPUs busy with no progress is a "
            "hung kernel or collective).",
            "A hung collective names itself in the NCCL logs: `NCCL_DEBUG=INFO`, and "
            f"{code(f'grep -n -i -e nccl -e Traceback {path}')}; XIDs in `journalctl -k | grep -i xid`.",
            "`--watchdog-timeout` sets how long a stuck forward pass lives; a long first step "
            "(weight loading, torch.compile) needs it raised, a true hang does not.",
        ]
        return out
    if kind == "subprocess_crash":
        m = _EXIT.search(text)
        sig = int(m.group(1)) if m else 0
        why = {-3: "SIGQUIT: the watchdog or a sibling killed it after a hang or an error",
               -6: "SIGABRT: a C++ assert or `terminate called`", -9: "SIGKILL: most often the kernel's OOM killer "
               "(`journalctl -k | grep -i -e oom -e killed`)", -11: "SIGSEGV: a native crash (a kernel, Triton or "
               "a driver)"}.get(sig, f"exit code {sig}")
        return [
            f"It ended with {why}. The cause is in the lines before it: "
            f"{code(f'grep -n -B40 -e crashed -e Traceback {path}')}.",
            f"If it repeats after a restart, report it upstream with the traceback and {opt['settings']}.",
        ]
    if kind == "cuda_graph":
        out = []
        draft = spec or "draft" in text or "eagle" in text.lower()
        if draft and (_on(args, "enable_expert_distribution_metrics") or "expert_distribution" in text):
            out.append("The draft's CUDA graph capture fails with `--enable-expert-distribution-metrics` and "
                       "`--speculative-num-steps` >= 2 (the metrics collect during capture, "
                       "sgl-project/sglang#32105): drop `--enable-expert-distribution-metrics`, or serve "
                       "with `--speculative-num-steps 1`.")
        elif draft:
            out.append("The draft's CUDA graph capture failed: try `--speculative-num-steps 1`, or a smaller "
                       "`--cuda-graph-max-bs`, to find the setting that breaks it.")
        if event.engine == "vllm":
            out.append("`--enforce-eager` serves without CUDA graphs (slower) while you find the cause.")
        else:
            out.append("`--disable-cuda-graph` serves without CUDA graphs (slower) while you find the cause; "
                       "`--cuda-graph-max-bs` lowers the batch sizes captured.")
        out.append("The first CUDA error in the traceback names the operation that is not allowed while "
                   f"capturing: {code(f'grep -n -A40 Traceback {path}')}.")
        return out
    if kind == "device_assert":
        return [
            "The rank with the assert is the cause; the NCCL timeouts of the other ranks follow from it. "
            f"The assert line names the kernel and the check: {code(f'grep -n -e Assertion -e device-side {path}')}.",
            "With speculative decoding an index out of bounds is most often a token id outside the draft's "
            "vocabulary (a draft whose `vocab_size` or `d2t` map does not match the target): check the "
            f"pair with `{opt['diagnose']}`." if spec else
            "An index out of bounds is most often a token id outside the model's vocabulary (a tokenizer "
            "that does not match the checkpoint).",
            "`CUDA_LAUNCH_BLOCKING=1` makes the traceback point at the failing kernel (slow: for one "
            "reproduction only). Restart the server: its CUDA context is lost.",
        ]
    if kind == "unsupported":
        out = []
        dp = _int(args, "data_parallel_size", "dp_size")
        if "Spec Decoding with >1 EngineCore" in text:
            out.append("vLLM before vllm-project/vllm#24049 has no Prometheus metrics for speculative decoding "
                       f"with more than one engine core (data parallel{f' size {dp}' if dp else ''}): "
                       "serve with `--data-parallel-size 1` (more replicas behind a load balancer instead), "
                       "or upgrade vLLM to a release with that change.")
        out.append("The exception names the combination this engine version refuses: change that setting, or "
                   f"use a version that supports it; {code(event.exception or 'the exception line')} "
                   f"is in {code(f'grep -n -A40 Traceback {path}')}.")
        return out
    if kind == "cuda_oom":
        return [
            f"Give the KV cache less memory or the batch fewer tokens: {opt['memory']}, and restart.",
            f"Speculative decoding needs room for the draft model and {opt['draft']} if the error came "
            "with speculation on.",
            "Another process may hold GPU memory: `nvidia-smi --query-compute-apps=pid,used_memory --format=csv`.",
        ]
    if kind == "nccl_timeout":
        return [
            "One rank stopped answering a collective: the first traceback of another rank usually says "
            f"why; {code(f'grep -n -B2 -A30 Traceback {path}')} and the logs of the other nodes.",
            "A GPU or link fault shows as XIDs: `journalctl -k | grep -i xid`; `nvidia-smi topo -m` and "
            "`NCCL_DEBUG=INFO` show the links NCCL uses.",
            "A long first step (weight loading, CUDA graph capture, torch.compile) can exceed the "
            f"timeout: raise {opt['timeout']} only in that case.",
        ]
    if kind == "shape_mismatch":
        hint = _shape_hint(event.exception)
        out = [
            "The draft and the target disagree on a width (`hidden_size`, or the number of aux hidden "
            "states an EAGLE-3 draft's `fc` takes): check the draft checkpoint against the target with "
            f"`{opt['diagnose']}`." + (f" Here {hint}." if hint else ""),
            f"EAGLE-3: `eagle_aux_hidden_state_layer_ids` in the draft's config.json must name the layers {opt['ids']}; "
            f"a draft trained for another target model, or served with {opt['eagle']}, fails the same way.",
        ]
        if event.exception:
            out.append(f"The failing operation is in the last frames of the traceback ending in {code(event.exception)}.")
        return out
    return [
        f"Read the whole traceback: {code(f'grep -n -A40 Traceback {path}')}"
        + (f"; it ends in {code(event.exception)}." if event.exception else " (it was cut off)."),
        f"If it repeats after a restart, report it upstream with the traceback and {opt['settings']}.",
    ]


@register
class LogErrorsRule(ActiveAlertsRule):
    name = "log_errors"
    alert_names = (ALERT_NAME,)
    order = 85

    @classmethod
    def build(cls, config: Config, ctx: RuleContext) -> "LogErrorsRule":
        return cls(config.log_errors, ctx.last_lines)

    def __init__(self, config: LogErrorsConfig, last_lines=None):
        super().__init__()
        self.config = config
        self.last_lines = last_lines  # server → {line kind: clock of its last line} (the pipeline's)
        self._last: dict[str, float] = {}  # key → clock of the last error of that server and kind
        self._count: dict[str, int] = {}
        self._args: dict[str, dict] = {}  # server → its settings (merged ServerArgs)
        self._start: dict[str, float] = {}  # server → clock of its last `server_args` log line
        # server → (settings of the last start that failed, failed starts in a row with them, clock of the
        # start counted last)
        self._loop: dict[str, tuple[dict, int, float]] = {}

    def reconfigure(self, config: Config) -> None:
        self.config = config.log_errors

    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        if isinstance(event, ServerArgs):
            self._args[server] = dict(event.args)
            if event.source == "log":
                self._start[server] = now
            return []
        if type(event) is not LogError or not self.config.enabled or event.kind not in SEVERITY:
            return []
        starting = self._starting(server, now)
        new_start = starting and self._count_start(server, now)
        kind = event.kind
        watchdog = self.active.get(alert_key(server, "watchdog_timeout"))
        if kind == "subprocess_crash" and watchdog is not None:  # the launcher's reaction to the hang
            self._ranks(watchdog, event)
            watchdog.annotations["update"] = f"the server exits: {event.exception}"
            return [watchdog]  # notified once more: the hang ended in a crash
        key = alert_key(server, kind)
        self._last[key] = now
        self._count[key] = self._count.get(key, 0) + 1
        alert = self.active.get(key)
        if alert is not None:  # the same trouble again: the evidence shows the newest one
            ranks = dict(alert.evidence).get("ranks")
            alert.evidence[:] = self._evidence(server, event, key, alert.starts_at, now, starting)
            if ranks is not None:
                alert.evidence.insert(len(alert.evidence) - 1, ("ranks", ranks))
            self._ranks(alert, event)
            self._summary(server, alert, event)
            n = self.failed_starts(server)
            if new_start and n >= 2:  # another start failed the same way: a crash loop, notified
                alert.annotations["update"] = f"crash loop: {n} failed starts with the same settings"
                return [alert]
            return []
        severity = SEVERITY[kind]
        if kind == "other" and starting:
            severity = "critical"  # a server that cannot start cannot serve
        alert = self._alert(server, event, key, now, severity, starting)
        alert.labels["kind"] = kind
        self._ranks(alert, event)
        poisoned = self.active.get(alert_key(server, "device_assert")) if kind == "nccl_timeout" else None
        if poisoned is not None:  # the ranks wait for the one whose CUDA context the assert broke
            where = dict(poisoned.evidence).get("rank") or "one rank"
            alert.evidence.insert(0, ("caused by", f"the device-side assert on {where} at {iso8601(poisoned.starts_at)}"))
            alert.fixes.insert(0, f"The device-side assert on {where} came first: its rank stopped, the others "
                                  "time out waiting for it. Fix the assert (its alert's advice); this timeout follows from it.")
        return self.active.fire(key, alert)

    def _starting(self, server: str, now: float) -> bool:
        """No batch line since the server's last start (or none at all): it is not serving yet."""
        last = (self.last_lines(server) if self.last_lines else None) or {}
        served = max(last.get("decode", -math.inf), last.get("prefill", -math.inf))
        return served == -math.inf or served < self._start.get(server, -math.inf)

    def _count_start(self, server: str, now: float) -> bool:
        """Count the current start of `server` as failed, once: in a row with the one before when
        its settings are the same (a crash loop), else as the first. True when it was counted now."""
        start = self._start.get(server, -math.inf)
        args = {k: v for k, v in self._args.get(server, {}).items() if k not in _VOLATILE}
        prev = self._loop.get(server)
        if prev is not None and prev[2] == start:
            return False  # this start is counted already
        n = prev[1] + 1 if prev is not None and prev[0] == args and start > -math.inf else 1
        self._loop[server] = (args, n, start)
        return True

    def failed_starts(self, server: str) -> int:
        """Failed starts in a row with the same settings (0: none counted)."""
        loop = self._loop.get(server)
        return 0 if loop is None else loop[1]

    @staticmethod
    def _ranks(alert: Alert, event: LogError) -> None:
        """Add the rank (or the crashed subprocess) of `event` to a watchdog alert's `ranks`
        evidence (every rank's scheduler hangs in a collective: the list says which)."""
        if alert.labels.get("kind") != "watchdog_timeout":
            return
        who = event.rank
        m = _SUBPROCESS.search(event.exception or "") if event.kind == "subprocess_crash" else None
        if m is not None:
            x = _EXIT.search(event.exception or "")
            who = f"{m.group(1)} crashed (exit code {x.group(1) if x else '?'})"
        if not who:
            return
        for i, (name, value) in enumerate(alert.evidence):
            if name == "ranks":
                if who not in value.split(", "):
                    alert.evidence[i] = (name, f"{value}, {who}")
                return
        alert.evidence.insert(len(alert.evidence) - 1, ("ranks", who))

    def _summary(self, server: str, alert: Alert, event: LogError) -> None:
        n = self.failed_starts(server)
        if n >= 2:
            alert.annotations["summary"] = self._title(server, event, n)

    def on_tick(self, now: float) -> list[Alert]:
        if self.active.empty():
            return []
        out = []
        for key in self.active.keys():
            last = self._last.get(key, now)
            if now - last >= self.config.resolve_after:
                self._count.pop(key, None)
                out += self.active.resolve(key, now, ("no error of this kind for", f"{now - last:.0f}s"))
        return out

    def _evidence(self, server: str, event: LogError, key: str, first: float, now: float,
                  starting: bool) -> list[tuple[str, str]]:
        ev = [("kind", event.kind),
              ("exception", event.exception or "(cut off before the exception line)"),
              ("errors of this kind", str(self._count.get(key, 1))),
              ("first", iso8601(first) or "n/a"), ("last", iso8601(now) or "n/a"),
              ("log", event.path)]
        if starting:
            ev.append(("when", "at start-up (no batch line since the server started)"))
            n = self.failed_starts(server)
            if n:
                ev.append(("failed starts with these settings", str(n)))
        if event.rank:
            ev.append(("rank", event.rank))
        args = self._args.get(server) or {}
        ev += args_evidence(args) + [(k, str(args[k])) for k in PARALLEL_KEYS if args.get(k) is not None]
        shown = event.lines[-SHOWN_LINES:]
        more = event.line_count - len(shown)
        ev.append(("last lines" + (f" ({more} earlier not shown)" if more > 0 else ""), "\n".join(shown)))
        return ev

    def _title(self, server: str, event: LogError, starts: int) -> str:
        where = f" ({event.rank})" if event.rank else ""
        with_ = self._settings(server)
        loop = f"; crash loop: {starts} failed starts with the same settings" if starts >= 2 else ""
        return (f"{TITLE[event.kind]} in the log of {server}{where}"
                + (f" ({with_})" if with_ and event.kind != "other" else "") + loop)

    def _settings(self, server: str) -> str:
        """The settings that matter to a crash or hang, in words: "EAGLE + DP attention"."""
        args = self._args.get(server) or {}
        with_ = []
        if speculation_configured(args):
            with_.append(str(args.get("speculative_algorithm")))
        if _on(args, "enable_dp_attention"):
            with_.append("DP attention")
        return " + ".join(with_)

    def _alert(self, server: str, event: LogError, key: str, now: float, severity: str, starting: bool) -> Alert:
        kind = event.kind
        title = TITLE[kind]
        alert = new_alert(
            ALERT_NAME, severity, server, "",
            summary=self._title(server, event, self.failed_starts(server) if starting else 0),
            description=(
                f"The server log shows a {title}"
                + (f": {code(event.exception)}" if event.exception else " (the traceback was cut off)")
                + ". " + IMPACT[kind] + (" It happened at start-up: the server is not serving." if starting
                                         and kind not in ("cuda_graph", "unsupported") else "")
                + (f" Settings: {self._settings(server)}." if self._settings(server) else "")),
            starts_at=now,
            evidence=self._evidence(server, event, key, now, now, starting),
            fixes=fixes_for(kind, event, self._args.get(server)),
        )
        alert.labels["kind"] = kind
        return alert

    def to_state(self) -> dict:
        return {"active": self.active.to_state(), "last": dict(self._last), "count": dict(self._count)}

    def load_state(self, state: dict) -> None:
        self.active.load_state(state.get("active", {}))
        self._last.update(state.get("last", {}))
        self._count.update(state.get("count", {}))
