"""GPU throttling that costs throughput: clocks held down while a server's decode rate fell.

Throttling alone is common and often harmless (`sw_power_cap` is active whenever an H100/H200 runs
flat out), and a throughput drop alone has many causes; together they point at the hardware.

Per (server, rank), every decode line is recorded with its running requests, its generated
tokens/s and whether a GPU was throttled at that moment: one of `reasons` active on a GPU that
holds SGLang memory (on every GPU when that is unknown), per the latest GpuSample. The baseline
is the median throughput of the unthrottled lines of the last `baseline_window` seconds at a
comparable load (running requests within a factor 1.5 of now; at least 3 lines). The alert
`GpuThrottlingThroughputDrop` (warning) fires when the last `min_batches` lines were all
throttled and their mean throughput is below (1 - `drop_ratio`) x that baseline; it resolves
when `min_batches` lines in a row are unthrottled or back above it. Without a baseline (e.g. the
GPU is always power-capped under load) the rule stays quiet.
"""

from __future__ import annotations

import statistics
from collections import deque
from itertools import islice
from typing import TYPE_CHECKING, Annotated

from msgspec import Meta

from specwatch.alerts.model import Alert
from specwatch.core.sections import Count, Seconds, Section, rule_section
from specwatch.core.events import DecodeBatch, GpuSample, GpuState
from specwatch.rules.active import ActiveAlertsRule
from specwatch.rules.base import register
from specwatch.rules.summary import CLOCK, RUNNING, THROUGHPUT

if TYPE_CHECKING:  # annotations only: rule files never import config.py
    from specwatch.config import Config


# NVML clock event reasons (nvmlClocksEventReasons, nvml.h); the first five slow a GPU down.
GPU_THROTTLE_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown",
                        "hw_power_brake_slowdown", "sw_power_cap")
KNOWN_CLOCK_REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown",
                       "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown",
                       "hw_power_brake_slowdown", "display_clock_setting")


@rule_section("gpu_throttle")
class GpuThrottleConfig(Section):
    reasons: tuple[str, ...] = GPU_THROTTLE_REASONS
    drop_ratio: Annotated[float, Meta(ge=0.01, le=0.99)] = 0.2  # below (1 - drop_ratio) x the unthrottled baseline
    min_batches: Count = 3
    baseline_window: Seconds = 3600.0

    def problems(self):
        if not self.reasons or any(x not in KNOWN_CLOCK_REASONS for x in self.reasons):
            yield "reasons", (f"must be a non-empty list of clock event reasons from: {', '.join(KNOWN_CLOCK_REASONS)}; "
                              f"got {list(self.reasons)!r}"[:400])


ALERT_NAME = "GpuThrottlingThroughputDrop"
THERMAL = ("sw_thermal_slowdown", "hw_thermal_slowdown")
LOAD_FACTOR = 1.5
MIN_BASELINE = 3
MAX_LINES = 2048  # per rank; far more than a baseline window holds at one line per second
GPU_STALE = 60.0  # seconds after which the last GpuSample says nothing about now


@register
class GpuThrottleRule(ActiveAlertsRule):
    name = "gpu_throttle"
    alert_names = (ALERT_NAME,)
    order = 40

    def __init__(self, config: GpuThrottleConfig):
        super().__init__()
        self.config = config
        self.reasons = frozenset(config.reasons)
        self._throttled: list[GpuState] = []
        self._gpu_time: float | None = None
        self._lines: dict[tuple[str, str], deque] = {}

    def reconfigure(self, config: Config) -> None:
        self.config = config.gpu_throttle
        self.reasons = frozenset(self.config.reasons)

    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        if isinstance(event, GpuSample):
            self._gpu_time = now if event.up else None
            gpus = [g for g in event.gpus if g.up]
            sglang = [g for g in gpus if g.sglang_memory_bytes]
            if any(g.sglang_memory_bytes is not None for g in gpus):
                gpus = sglang  # known: only the GPUs SGLang holds memory on
            self._throttled = [g for g in gpus if g.reasons & self.reasons]
        return []

    def on_lines(self, server: str, ranks: list, emit) -> list[Alert]:
        """The pending decode lines of each rank (`rules/summary.py`) with a gen throughput and
        running requests, in line order, each at its clock: the GPU samples do not change within
        an evaluation (one ends before any other event reaches the rules), so each line is
        judged as when it was read alone. Nothing to do before a GPU sample came."""
        if self._gpu_time is None:  # without GPU samples nothing can be throttled
            return []
        for rs in ranks:
            for e in rs.pending:
                if e[THROUGHPUT] is not None and e[RUNNING] > 0:
                    alerts = self._line(server, rs, e)
                    if alerts:
                        emit(alerts, e)
        return []

    def _throttled_now(self, now: float) -> list[GpuState]:
        if self._gpu_time is None or now - self._gpu_time > GPU_STALE:
            return []
        return self._throttled

    def _line(self, server: str, rs, e: tuple) -> list[Alert]:
        """One decode line: pending entry `e` of rank `rs` (its DecodeBatch built only for an alert)."""
        key = rs.key
        now = e[CLOCK]
        lines = self._lines.get(key)
        if lines is None:
            lines = self._lines[key] = deque(maxlen=MAX_LINES)
        throttled = self._throttled_now(now)
        lines.append((now, e[RUNNING], e[THROUGHPUT], bool(throttled)))
        while lines and now - lines[0][0] > self.config.baseline_window:
            lines.popleft()
        n = self.config.min_batches
        if len(lines) < n:
            return []
        recent = [lines[i] for i in range(-n, 0)]
        akey = f"{server}|{rs.rank}"
        active = akey in self.active
        any_throttled = any(r[3] for r in recent)
        if not active and not (any_throttled and all(r[3] for r in recent)):
            return []  # the common case, no throttling: no baseline to compute
        current = statistics.fmean(r[2] for r in recent)
        if active and not any_throttled:
            return self.active.resolve(akey, now, ("gen throughput (token/s)", f"{current:.1f}"),
                                       ("throttled now", "no" if not throttled else "yes"))
        running = statistics.fmean(r[1] for r in recent)
        base_lines = [r[2] for r in islice(lines, len(lines) - n)
                      if not r[3] and running / LOAD_FACTOR <= r[1] <= running * LOAD_FACTOR]
        baseline = statistics.median(base_lines) if len(base_lines) >= MIN_BASELINE else None
        dropped = baseline is not None and current < (1 - self.config.drop_ratio) * baseline
        if active:
            if baseline is not None and not dropped:
                return self.active.resolve(akey, now, ("gen throughput (token/s)", f"{current:.1f}"),
                                           ("throttled now", "no" if not throttled else "yes"))
            return []
        if dropped and baseline is not None:
            return self.active.fire(akey, self._alert(server, rs.batch(e), now, current, baseline, running,
                                                      len(base_lines), throttled))
        return []

    def _alert(self, server: str, b: DecodeBatch, now: float, current: float, baseline: float,
               running: float, n_base: int, gpus: list[GpuState]) -> Alert:
        drop = 1 - current / baseline
        evidence = [
            ("gen throughput (token/s)", f"{current:.1f} (mean of the last {self.config.min_batches} decode lines)"),
            ("unthrottled baseline (token/s)", f"{baseline:.1f} (median of {n_base} lines at a comparable load)"),
            ("drop", f"{drop:.0%}"),
            ("running requests", f"{running:.0f}"),
        ]
        fixes: list[str] = []
        for g in gpus:
            active = sorted(g.reasons & self.reasons)
            parts = [f"reasons {', '.join(active)}"]
            if g.temperature_celsius is not None:
                parts.append(f"{g.temperature_celsius:.0f} °C")
            if g.power_watts is not None:
                parts.append(f"{g.power_watts:.0f} W")
            if g.sm_clock_hertz is not None:
                parts.append(f"SM {g.sm_clock_hertz / 1e6:.0f} MHz")
            evidence.append((f"GPU {g.index}", "; ".join(parts)))
        active_all = set().union(*(g.reasons for g in gpus)) & self.reasons
        idx = ",".join(g.index for g in gpus)
        if active_all & set(THERMAL) or "hw_slowdown" in active_all:
            fixes.append(
                f"Thermal: check cooling of GPU {idx} (fans, airflow, inlet temperature, blanking "
                f"panels): `nvidia-smi -q -d TEMPERATURE,PERFORMANCE -i {idx}` shows the slowdown "
                "thresholds and the current temperature.")
        if "sw_power_cap" in active_all:
            fixes.append(
                f"Power cap: the board is at its power limit. `nvidia-smi -q -d POWER -i {idx}` "
                "compares the enforced and default limits; if someone lowered it, restore it with "
                f"`sudo nvidia-smi -i {idx} -pl <default watts>`.")
        if active_all & {"hw_power_brake_slowdown", "hw_slowdown"}:
            fixes.append(
                "Power brake: an external signal (PSU or chassis power budget) slowed the GPU; check "
                "the power supplies and the BMC event log (`sudo ipmitool sel list`).")
        return Alert(
            labels={"alertname": ALERT_NAME, "severity": "warning", "server": server, "rank": b.rank},
            annotations={
                "summary": f"GPU throttling while {server} {b.rank} decodes {drop:.0%} slower".replace("  ", " "),
                "description": (
                    "The GPU clocks are held down (thermal or power) while the decode throughput fell "
                    f"below {1 - self.config.drop_ratio:.0%} of its unthrottled level at the same load."
                ),
            },
            starts_at=now,
            evidence=evidence,
            fixes=fixes,
        )
