#!/usr/bin/env python3
"""Check GpuSampler and GpuCollector against the real NVML on a machine with NVIDIA GPUs (not a pytest test).

    python tests/gpu/nvml_on_real_gpu.py [--samples 3] [--interval 1.0] [--load]

Runs the real sampler (real ``pynvml``) for ``--samples`` cycles, prints the exposition
text and a summary (series per family, collection errors), and exits 0 when
``specwatch_gpu_up`` is 1 and every core family has a value for every GPU, else 1.
``--load`` runs a PyTorch matmul on GPU 0 while sampling (if torch is importable), so
power, clocks, utilisation and the per-process memory sum move off their idle values.
Works from a source checkout without installing specwatch.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # repo root: specwatch need not be installed

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from specwatch.sources.nvml import GpuCollector, GpuSampler  # noqa: E402

# must have a value for every GPU on any datacenter GPU; ECC, PCIe replays and XIDs may be
# unsupported in a VM and are reported but not required
CORE = (
    "specwatch_gpu_device_up",
    "specwatch_gpu_utilization_ratio",
    "specwatch_gpu_memory_used_bytes",
    "specwatch_gpu_memory_total_bytes",
    "specwatch_gpu_power_watts",
    "specwatch_gpu_energy_joules",  # counter family name (sample ends in _total)
    "specwatch_gpu_temperature_celsius",
    "specwatch_gpu_sm_clock_hertz",
    "specwatch_gpu_memory_clock_hertz",
    "specwatch_gpu_clock_event_reason_active",
    "specwatch_gpu_sglang_process_memory_bytes",
)


def all_pids() -> set[int]:
    """Every pid on the host, so the per-process sum covers all compute processes."""
    return {int(p) for p in os.listdir("/proc") if p.isdigit()}


def gpu_load(stop: threading.Event) -> threading.Thread | None:
    try:
        import torch
    except ImportError:
        print("# torch not importable: no load")
        return None
    if not torch.cuda.is_available():
        print("# torch sees no GPU: no load")
        return None

    def run() -> None:
        a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
        while not stop.is_set():
            for _ in range(20):
                a @ a
            torch.cuda.synchronize()

    # joined before exit: a CUDA thread still running at interpreter exit aborts the process
    thread = threading.Thread(target=run, name="gpu-load")
    thread.start()
    print("# bf16 matmul load on cuda:0")
    return thread


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--load", action="store_true", help="run a torch matmul on GPU 0 while sampling")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    stop_load = threading.Event()
    load = gpu_load(stop_load) if args.load else None
    if load is not None:
        time.sleep(2.0)  # let clocks and power ramp before the first sample

    sampler = GpuSampler(interval=args.interval, process_pids=all_pids)
    registry = CollectorRegistry()
    registry.register(GpuCollector(sampler))
    started = time.monotonic()
    sampler.start()
    deadline = started + args.samples * args.interval + 30.0  # nvmlInit can take seconds without persistence mode
    while sampler.cycles < args.samples and time.monotonic() < deadline:
        time.sleep(0.05)
    xid_listening = sampler.xid_listening
    text = generate_latest(registry).decode()
    stopped = sampler.stop(timeout=10.0)
    stop_load.set()
    if load is not None:
        load.join()

    print(text)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    up = [s.value for s in families["specwatch_gpu_up"].samples]
    count_samples = families["specwatch_gpu_count"].samples
    count = int(count_samples[0].value) if count_samples else 0
    gpus = {str(i) for i in range(count)}

    print("# ---- summary")
    print(f"# cycles={sampler.cycles} in {time.monotonic() - started:.1f} s, stopped cleanly={stopped}")
    print(f"# specwatch_gpu_up={up} specwatch_gpu_count={count} xid_listening={xid_listening}")
    for name, fam in families.items():
        per_gpu = Counter(s.labels.get("gpu", "-") for s in fam.samples)
        print(f"# {name:50s} {len(fam.samples):4d} series  {dict(sorted(per_gpu.items()))}")
    errors = {s.labels["error"]: s.value for s in families["specwatch_gpu_collection_errors"].samples if s.value}
    print(f"# collection errors: {errors or 'none'}")

    failures = []
    if up != [1.0]:
        failures.append(f"specwatch_gpu_up is {up}, want [1.0]")
    if not gpus:
        failures.append("no GPUs reported")
    def samples(name: str) -> list:
        return families[name].samples if name in families else []

    for name in CORE:
        seen = {s.labels.get("gpu") for s in samples(name)}
        if seen != gpus:
            failures.append(f"{name}: values for GPUs {sorted(seen)}, want {sorted(gpus)}")
    for s in samples("specwatch_gpu_device_up"):
        if s.value != 1:
            failures.append(f"GPU {s.labels['gpu']} not read (device_up 0)")
    for line in failures:
        print("# FAIL", line)
    print("# RESULT", "PASS" if not failures else "FAIL")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
