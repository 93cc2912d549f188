"""GPU faults from NVML: XID errors, uncorrected ECC errors, a lost GPU.

Input: `GpuSample` events (one per NVML sampling cycle; sources/nvml.py), fed under the
box's default server name: NVML does not say which SGLang server a GPU serves.

* `GpuXidError` (one alert per GPU and XID): the XID counter rose. Resolves after `window`
  seconds without another one (an XID is an event; like the XID rule in utkuozdemir/
  nvidia_gpu_exporter `charts/nvidia-gpu-exporter/templates/prometheusrule.yaml`). Severity
  critical for XIDs that need a reset or mean lost work, else warning; `ignore_xids` drops some
  (13/31/43 are often the application's own bug).
* `GpuEccError` (per GPU): the volatile uncorrected ECC count rose. Resolves after `window`.
* `GpuLost` (per GPU): NVML fails on the GPU (`NVMLError_GpuIsLost` and kin: the collector marks
  it `device_up 0`), or fewer GPUs are visible than before. Resolves when it is read again.

XID meanings and actions: NVIDIA "XID Errors" catalog (docs.nvidia.com/deploy/xid-errors).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from msgspec import Meta

from specwatch.alerts.model import Alert, iso8601
from specwatch.core.sections import Seconds, Section, rule_section
from specwatch.core.events import GpuSample, GpuState
from specwatch.rules.active import ActiveAlertsRule
from specwatch.rules.base import register

if TYPE_CHECKING:  # annotations only: rule files never import config.py
    from specwatch.config import Config


@rule_section("gpu_errors")
class GpuErrorsConfig(Section):
    window: Seconds = 600.0  # an XID/ECC alert resolves after this long without a new error
    ignore_xids: Annotated[tuple[int, ...], Meta(description="XID numbers, e.g. [13, 43]")] = ()


XID = "GpuXidError"
ECC = "GpuEccError"
LOST = "GpuLost"

# xid -> (meaning, action); critical when the action is a reset, a reboot or lost work
_XIDS: dict[int, tuple[str, str, bool]] = {
    13: ("Graphics Engine Exception", "usually an illegal access in the application (a CUDA kernel "
         "bug); if it appears with several applications, run `nvidia-smi -q` and a GPU diagnostic "
         "(`dcgmi diag -r 2`)", False),
    31: ("GPU memory page fault", "an application accessed an invalid address; check the SGLang log for "
         "`illegal memory access`; repeated with different applications points at the driver or GPU", False),
    43: ("GPU stopped processing", "the application hit a fatal GPU error and was stopped; check the "
          "SGLang log for the CUDA error", False),
    45: ("Preemptive cleanup", "follows another XID or a killed process; look at the XID before it", False),
    48: ("Double-bit ECC error", "stop SGLang and reset the GPU (`sudo nvidia-smi -r -i {i}`) or "
         "reboot; if it recurs, RMA the GPU", True),
    61: ("Internal micro-controller breakpoint", "reset the GPU or reboot; update the driver if it recurs", True),
    62: ("Internal micro-controller halt", "reset the GPU or reboot; update the driver if it recurs", True),
    63: ("ECC page retirement / row remap recorded", "a GPU reset applies the remap "
         "(`nvidia-smi -q -d ROW_REMAPPER -i {i}` shows it pending)", False),
    64: ("ECC page retirement / row remap failure", "the GPU ran out of spare rows: drain the box and RMA the GPU", True),
    74: ("NVLink error", "check `nvidia-smi nvlink -s -i {i}` and `nvidia-smi nvlink -e`; reset the GPUs "
         "or reboot; recurring on one link means hardware", True),
    79: ("GPU has fallen off the bus", "reboot; check PCIe seating, power cables and cooling "
         "(`sudo dmesg -T | grep -i NVRM`); recurring means hardware", True),
    92: ("High single-bit ECC error rate", "watch `nvidia-smi -q -d ECC -i {i}`; plan an RMA if it grows", True),
    94: ("Contained ECC error", "only the application on that memory is affected: SGLang must be "
         "restarted; reset the GPU at the next opportunity", True),
    95: ("Uncontained ECC error", "every application on the GPU is affected: stop SGLang, reset the "
         "GPU (`sudo nvidia-smi -r -i {i}`) or reboot", True),
    119: ("GSP RPC timeout", "reset the GPU or reboot; update the driver (a known GSP firmware issue "
          "on some versions)", True),
    120: ("GSP error", "reset the GPU or reboot; update the driver", True),
    140: ("Unrecovered ECC error", "stop SGLang, reset the GPU or reboot; RMA if it recurs", True),
    154: ("GPU recovery action changed", "`nvidia-smi -q -i {i}` shows the required recovery action "
          "(reset or reboot): perform it", True),
}


def xid_info(xid: int, index: str) -> tuple[str, str, bool]:
    """(meaning, action, critical) for an XID; the action has `{i}` filled with the GPU index."""
    meaning, action, critical = _XIDS.get(xid, ("XID error", "look it up in NVIDIA's XID catalog and "
                                                 "check `sudo dmesg -T | grep -i xid` for its details", False))
    return meaning, action.replace("{i}", index), critical


def _gpu_evidence(g: GpuState) -> list[tuple[str, str]]:
    ev = [("gpu", g.index)]
    if g.uuid:
        ev.append(("uuid", g.uuid))
    if g.pci_bus_id:
        ev.append(("pci bus id", g.pci_bus_id))
    if g.model_name:
        ev.append(("model", g.model_name))
    return ev


@register
class GpuErrorsRule(ActiveAlertsRule):
    name = "gpu_errors"
    alert_names = (XID, ECC, LOST)
    order = 30

    def __init__(self, config: GpuErrorsConfig):
        super().__init__()
        self.config = config
        self._xid_counts: dict[str, float] = {}
        self._ecc: dict[str, float] = {}
        self._last_hit: dict[str, float] = {}
        self._known: dict[str, GpuState] = {}  # index -> last good state (labels for a lost GPU)
        self._max_count = 0

    def reconfigure(self, config: Config) -> None:
        self.config = config.gpu_errors

    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        if not isinstance(event, GpuSample) or not event.up:
            return []  # NVML unavailable: no evidence either way
        out: list[Alert] = []
        present = set()
        for g in event.gpus:
            ident = g.uuid or self._known.get(g.index, g).uuid or g.index
            present.add(ident)
            out += self._xids(server, g, now)
            if not g.up:
                out += self._lost(server, g, ident, now)
                continue
            self._known[g.index] = g
            out += self.active.resolve(f"lost|{ident}", now, ("read again", iso8601(now) or ""))
            out += self._ecc_check(server, g, now)
        if event.count is not None:
            self._max_count = max(self._max_count, event.count)
            if event.count < self._max_count:
                missing = [g for g in self._known.values() if g.uuid and g.uuid not in present]
                out += self.active.fire("count", self._alert(
                    LOST, server, None, now,
                    f"{self._max_count - event.count} GPU(s) disappeared from NVML on {server}",
                    [("GPUs visible", str(event.count)), ("GPUs before", str(self._max_count))]
                    + [("missing", f"GPU {g.index} {g.uuid} {g.pci_bus_id}") for g in missing],
                    self._lost_fixes(missing[0] if missing else None), "critical"))
            else:
                out += self.active.resolve("count", now, ("GPUs visible", str(event.count)))
        return out

    def _xids(self, server: str, g: GpuState, now: float) -> list[Alert]:
        out: list[Alert] = []
        ident = g.uuid or g.index
        for xid_s, (count, last_ts) in g.xids.items():
            key = f"xid|{ident}|{xid_s}"
            before = self._xid_counts.get(key, 0.0)
            self._xid_counts[key] = count
            if count <= before:
                continue
            try:
                xid = int(xid_s)
            except ValueError:
                xid = -1
            if xid in self.config.ignore_xids:
                continue
            self._last_hit[key] = now
            meaning, action, critical = xid_info(xid, g.index)
            firing = self.active.get(key)
            evidence = [("xid", f"{xid_s} ({meaning})"), ("count since specwatch started", f"{count:.0f}"),
                        ("last", iso8601(last_ts) or "")] + _gpu_evidence(self._known.get(g.index, g))
            if firing is not None:
                firing.evidence[:] = evidence
                continue
            alert = self._alert(XID, server, g, now, f"XID {xid_s} ({meaning}) on GPU {g.index} of {server}",
                                evidence, [action[:1].upper() + action[1:] + ".",
                                           "Details: `sudo dmesg -T | grep -i xid` (the line names the "
                                           "process and the channel)."],
                                "critical" if critical else "warning", xid=xid_s)
            out += self.active.fire(key, alert)
        return out

    def _ecc_check(self, server: str, g: GpuState, now: float) -> list[Alert]:
        n = g.ecc.get("uncorrected")
        if n is None:
            return []
        key = f"ecc|{g.uuid or g.index}"
        before = self._ecc.get(key)
        self._ecc[key] = n
        if before is None or n <= before:
            return []  # the first reading is the baseline (volatile: since the driver loaded)
        self._last_hit[key] = now
        evidence = [("new uncorrected ECC errors", f"{n - before:.0f}"), ("volatile uncorrected total", f"{n:.0f}"),
                    ("volatile corrected total", f"{g.ecc.get('corrected', 0):.0f}")] + _gpu_evidence(g)
        firing = self.active.get(key)
        if firing is not None:
            firing.evidence[:] = evidence
            return []
        return self.active.fire(key, self._alert(
            ECC, server, g, now, f"Uncorrected ECC errors on GPU {g.index} of {server}", evidence, [
                f"Processes on GPU {g.index} get XID 94/95 and SGLang may crash or return corrupt "
                f"results: stop SGLang on it and reset the GPU (`sudo nvidia-smi -r -i {g.index}`) or reboot.",
                f"Check `nvidia-smi -q -d ECC,ROW_REMAPPER -i {g.index}`: a pending remap is applied by "
                "the reset; `Remapping Failure Occurred: Yes` or recurring errors mean an RMA.",
            ], "critical"))

    def _lost(self, server: str, g: GpuState, ident: str, now: float) -> list[Alert]:
        known = self._known.get(g.index)
        shown = known or g
        return self.active.fire(f"lost|{ident}", self._alert(
            LOST, server, shown, now, f"GPU {g.index} of {server} is lost (NVML cannot read it)",
            [("NVML", "device calls fail (GPU is lost or unknown error); its metrics are dropped")]
            + _gpu_evidence(shown), self._lost_fixes(shown), "critical"))

    @staticmethod
    def _lost_fixes(g: GpuState | None) -> list[str]:
        i = g.index if g else "<index>"
        return [
            "The SGLang processes on that GPU will hang or crash (NCCL waits forever on a lost rank): "
            "check `sudo dmesg -T | grep -iE 'xid|NVRM'` (XID 79 = fallen off the bus) and "
            f"`nvidia-smi -q -i {i}`.",
            f"Recover with a GPU reset (`sudo nvidia-smi -r -i {i}`, no process may use it) or a reboot, "
            "then restart SGLang; if it recurs, check PCIe seating, power and cooling, and RMA.",
        ]

    def _alert(self, name: str, server: str, g: GpuState | None, now: float, summary: str,
               evidence: list[tuple[str, str]], fixes: list[str], severity: str, **extra: str) -> Alert:
        labels = {"alertname": name, "severity": severity, "server": server, "rank": "",
                  "gpu": g.index if g else "", "uuid": (g.uuid if g else "")}
        labels.update(extra)
        return Alert(labels=labels, annotations={"summary": summary, "description": summary + "."},
                     starts_at=now, evidence=evidence, fixes=fixes)

    def on_tick(self, now: float) -> list[Alert]:
        out: list[Alert] = []
        for key in self.active.keys():
            if key.startswith(("xid|", "ecc|")):
                last = self._last_hit.get(key, self.active[key].starts_at)
                if now - last >= self.config.window:
                    self._last_hit.pop(key, None)
                    out += self.active.resolve(key, now, ("quiet for (s)", f"{now - last:.0f}"))
        return out

    def to_state(self) -> dict:
        return {**super().to_state(), "last_hit": self._last_hit}

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        self._last_hit.update(state.get("last_hit", {}))
