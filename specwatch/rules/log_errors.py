"""Errors in the server log: a traceback, CUDA out of memory, an NCCL timeout, a shape mismatch.

The pipeline's error stage (`sources/log_errors.py`) groups each traceback (or burst of torch C++
error lines) into one `LogError` and classifies it. `SGLangLogError` fires per server and kind at
the first one, with the exception line, the last lines and a fix for that kind; later errors of
the same kind update its evidence. Severity by kind: `cuda_oom`, `nccl_timeout` and
`shape_mismatch` stop the server or its requests (critical), `other` is a warning. A failed health
check is left to `SGLangDecodeStalled` and `SGLangServerUnhealthy`. It resolves `resolve_after`
after the last error of its kind.
"""

from __future__ import annotations

import math
import re
import shlex

from specwatch.alerts.model import Alert, code, iso8601
from specwatch.config import Config, Seconds, Section, rule_section
from specwatch.events import LogError
from specwatch.rules.active import ActiveAlertsRule
from specwatch.rules.base import alert_key, new_alert, register


@rule_section("log_errors")
class LogErrorsConfig(Section):
    enabled: bool = True
    resolve_after: Seconds = 900.0  # quiet time after the last error of a kind


ALERT_NAME = "SGLangLogError"
SEVERITY = {"cuda_oom": "critical", "nccl_timeout": "critical", "shape_mismatch": "critical", "other": "warning"}
TITLE = {"cuda_oom": "CUDA out of memory", "nccl_timeout": "NCCL collective timeout",
         "shape_mismatch": "tensor shape mismatch", "other": "Python error"}
SHOWN_LINES = 8
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
        "settings": "the engine-config line (`Initializing a V1 LLM engine (v…) with config: …`)",
    },
}


def fixes_for(kind: str, event: LogError) -> list[str]:
    """What to check for an error of `kind` (most likely first); log text in code spans. The
    options named are the engine's: vLLM's when `event.engine` is "vllm", else SGLang's."""
    path = shlex.quote(event.path)
    opt = _OPTIONS["vllm" if event.engine == "vllm" else "sglang"]
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

    def __init__(self, config: LogErrorsConfig):
        super().__init__()
        self.config = config
        self._last: dict[str, float] = {}  # key → clock of the last error of that server and kind
        self._count: dict[str, int] = {}

    def reconfigure(self, config: Config) -> None:
        self.config = config.log_errors

    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        if type(event) is not LogError or not self.config.enabled or event.kind not in SEVERITY:
            return []
        key = alert_key(server, event.kind)
        self._last[key] = now
        self._count[key] = self._count.get(key, 0) + 1
        alert = self.active.get(key)
        if alert is not None:  # the same trouble again: the evidence shows the newest one
            alert.evidence[:] = self._evidence(event, key, alert.starts_at, now)
            return []
        return self.active.fire(key, self._alert(server, event, key, now))

    def quiet_until(self, server: str, rows, a: int) -> int:
        """Nothing fires (only events fire it): on_tick does nothing."""
        return len(rows.dec) if self.active.empty() else a

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

    def _evidence(self, event: LogError, key: str, first: float, now: float) -> list[tuple[str, str]]:
        ev = [("kind", event.kind),
              ("exception", event.exception or "(cut off before the exception line)"),
              ("errors of this kind", str(self._count.get(key, 1))),
              ("first", iso8601(first) or "n/a"), ("last", iso8601(now) or "n/a"),
              ("log", event.path)]
        if event.rank:
            ev.append(("rank", event.rank))
        shown = event.lines[-SHOWN_LINES:]
        more = event.line_count - len(shown)
        ev.append(("last lines" + (f" ({more} earlier not shown)" if more > 0 else ""), "\n".join(shown)))
        return ev

    def _alert(self, server: str, event: LogError, key: str, now: float) -> Alert:
        kind = event.kind
        title = TITLE[kind]
        where = f" ({event.rank})" if event.rank else ""
        alert = new_alert(
            ALERT_NAME, SEVERITY[kind], server, "",
            summary=f"{title} in the log of {server}{where}",
            description=(
                f"The server log shows a {title}"
                + (f": {code(event.exception)}" if event.exception else " (the traceback was cut off)")
                + ". " + {
                    "cuda_oom": "Requests fail or the server exits; speculative decoding adds the draft's memory.",
                    "nccl_timeout": "A collective between ranks did not finish: the server hangs or exits.",
                    "shape_mismatch": "A model's tensors do not fit together: the server fails at warmup or at the first batch.",
                    "other": "The server or a request failed.",
                }[kind]),
            starts_at=now,
            evidence=self._evidence(event, key, now, now),
            fixes=fixes_for(kind, event),
        )
        alert.labels["kind"] = kind
        return alert

    def to_state(self) -> dict:
        return {"active": self.active.to_state(), "last": dict(self._last), "count": dict(self._count)}

    def load_state(self, state: dict) -> None:
        self.active.load_state(state.get("active", {}))
        self._last.update(state.get("last", {}))
        self._count.update(state.get("count", {}))
