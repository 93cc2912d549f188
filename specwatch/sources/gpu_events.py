"""GpuCollector cycles → `GpuSample` events for the GPU rules.

The collector's public interface is `collect()` (metric families of its latest snapshot, no NVML
call) and `cycles`; this module reads those, so rules see exactly what `/metrics` shows. The
daemon calls `GpuEvents.poll` once a second on its main thread; a sample is made only when a
new cycle completed (every `gpu.interval`).
"""

from __future__ import annotations

from typing import Iterable

from specwatch.events import GpuSample, GpuState


def gpu_sample(families: Iterable, now: float) -> GpuSample:
    """Metric families of a GpuCollector → GpuSample (GPUs ordered by NVML index)."""
    up = False
    count = None
    device_up: dict[str, bool] = {}
    gpus: dict[str, dict] = {}

    def gpu(labels: dict) -> dict:
        d = gpus.get(labels["gpu"])
        if d is None:
            d = gpus[labels["gpu"]] = {"index": labels["gpu"], "uuid": labels.get("uuid", ""),
                                      "model_name": labels.get("model_name", ""),
                                      "pci_bus_id": labels.get("pci_bus_id", ""),
                                      "reasons": set(), "ecc": {}, "xids": {}}
        return d

    fields = {
        "specwatch_gpu_temperature_celsius": "temperature_celsius",
        "specwatch_gpu_power_watts": "power_watts",
        "specwatch_gpu_sm_clock_hertz": "sm_clock_hertz",
        "specwatch_gpu_utilization_ratio": "utilization_ratio",
        "specwatch_gpu_sglang_process_memory_bytes": "sglang_memory_bytes",
    }
    for fam in families:
        for s in fam.samples:
            name, labels, value = s.name, s.labels, s.value
            if name == "specwatch_gpu_up":
                up = value == 1
            elif name == "specwatch_gpu_count":
                count = int(value)
            elif name == "specwatch_gpu_device_up":
                device_up[labels["gpu"]] = value == 1
            elif name in fields:
                gpu(labels)[fields[name]] = value
            elif name == "specwatch_gpu_clock_event_reason_active":
                if value == 1:
                    gpu(labels)["reasons"].add(labels["reason"])
                else:
                    gpu(labels)
            elif name == "specwatch_gpu_ecc_errors_total":
                gpu(labels)["ecc"][labels["type"]] = value
            elif name == "specwatch_gpu_xid_errors_total":
                d = gpu(labels)
                d["xids"][labels["xid"]] = (value, d["xids"].get(labels["xid"], (0, 0.0))[1])
            elif name == "specwatch_gpu_xid_last_timestamp_seconds":
                d = gpu(labels)
                d["xids"][labels["xid"]] = (d["xids"].get(labels["xid"], (0, 0.0))[0], value)
    states = []
    for index in sorted(set(device_up) | set(gpus), key=lambda i: int(i) if i.isdigit() else 1 << 30):
        d = gpus.get(index)
        ok = device_up.get(index, True)
        if d is None or not ok:
            # a failed GPU has no other series (the collector drops them); XIDs survive it
            xids = d["xids"] if d else {}
            uuid = d["uuid"] if d else ""
            states.append(GpuState(index=index, uuid=uuid, up=False, xids=xids))
            continue
        states.append(GpuState(
            index=index, uuid=d["uuid"], model_name=d["model_name"], pci_bus_id=d["pci_bus_id"],
            up=True, reasons=frozenset(d["reasons"]), ecc=d["ecc"], xids=d["xids"],
            **{v: d[v] for v in fields.values() if v in d},
        ))
    return GpuSample(timestamp=now, up=up, count=count, gpus=tuple(states))


class GpuEvents:
    """Turns each new GpuCollector cycle into one GpuSample; `poll` returns None otherwise."""

    def __init__(self, collector) -> None:
        self.collector = collector
        self._cycles = -1

    def poll(self, now: float) -> GpuSample | None:
        cycles = self.collector.cycles
        if cycles == self._cycles:
            return None
        self._cycles = cycles
        return gpu_sample(self.collector.collect(), now)
