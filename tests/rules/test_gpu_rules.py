"""GPU rules (XID, ECC, lost GPU, throttling with a throughput drop) through the real
GpuSampler driven by the NVML fake, each cycle's GpuSample fed to the real pipeline as the
daemon does, and decode lines fed through the same pipeline."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pynvml
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ has no __init__.py
from fake_pynvml import GIB, FakeNvml, two_h200s  # noqa: E402
from sglang_lines import decode_line  # noqa: E402

from specwatch.alerts.dispatcher import Dispatcher  # noqa: E402
from specwatch.config import build_config  # noqa: E402
from specwatch.core.events import LogLine  # noqa: E402
from specwatch.core.pipeline import Pipeline  # noqa: E402
from specwatch.sources.nvml import GpuSampler  # noqa: E402

UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
LOG = "/var/log/sglang/server.log"
T0 = 1_800_000_000.0
SGLANG_PID = 424242


class Box:
    """One GPU box: fake NVML, the real sampler, the pipeline, a clock."""

    def __init__(self, rules: dict | None = None, sglang_on: tuple[int, ...] = (0, 1)):
        self.devices = two_h200s()
        for i in sglang_on:
            self.devices[i].processes = [(SGLANG_PID, 60 * GIB)]
        self.nvml = FakeNvml(self.devices)
        cfg = build_config({"server": "gpu-box-1", "logs": [{"path": LOG}], "rules": rules or {}})
        self.pl = Pipeline(cfg, Dispatcher([]))
        self.now = T0
        self.samples = []
        self.sampler = GpuSampler(self.nvml, emit=self._feed, interval=5, init_retry_min=0.0, xid_wait_ms=20,
                                  process_pids=lambda: {SGLANG_PID})

    def _feed(self, sample) -> None:
        self.samples.append(sample)
        self.pl.feed_event("gpu-box-1", sample, self.now)

    def sample(self, advance: float = 5.0) -> None:
        self.now += advance
        n = len(self.samples)
        self.sampler.sample_once()
        assert len(self.samples) == n + 1  # one event per cycle, handed on by the sampler itself
        with self.pl.lock:
            self.pl.tick(self.now)

    def decode(self, throughput: float, running: int = 32, advance: float = 2.0) -> None:
        self.now += advance
        line, _ = decode_line("0.5.23", accept_len=2.9, throughput=throughput, running=running)
        self.pl.feed(LogLine(LOG, line), now=self.now)

    def wait_xids(self, n: int) -> None:
        deadline = time.monotonic() + 3
        while sum(self.sampler.counters()[1].values()) < n:
            assert time.monotonic() < deadline, "XID not delivered"
            time.sleep(0.01)

    def sent(self) -> list[tuple[str, str]]:
        return [(a.name, a.status) for a in self.pl.dispatcher.history]

    def close(self) -> None:
        assert self.sampler.stop(timeout=3)


@pytest.fixture
def box():
    made = []

    def _make(**kw):
        b = Box(**kw)
        made.append(b)
        return b

    yield _make
    for b in made:
        b.close()


# ------------------------------------------------------------------ XID / ECC / lost


def test_healthy_gpus_stay_quiet(box):
    b = box()
    for _ in range(30):
        b.sample()
        b.decode(400.0)
    assert b.sent() == []


def test_xid_fires_with_meaning_then_resolves_after_window(box):
    b = box(rules={"gpu_errors": {"window": "10m"}})
    b.sample()
    b.nvml.push_xid(1, 79)
    b.wait_xids(1)
    b.sample()
    assert b.sent() == [("GpuXidError", "firing")]
    a = b.pl.dispatcher.history[0]
    assert a.labels == {"alertname": "GpuXidError", "severity": "critical", "server": "gpu-box-1", "rank": "",
                        "gpu": "1", "uuid": UUID1, "xid": "79", "engine": "sglang"}
    ev = dict(a.evidence)
    assert ev["xid"] == "79 (GPU has fallen off the bus)"
    assert ev["count since specwatch started"] == "1"
    assert ev["pci bus id"] == "00000000:3B:00.0"
    assert a.fixes[0].startswith("Reboot; check PCIe seating")
    fired_at = b.now
    # two more of the same XID: the same alert, evidence updated, nothing new sent
    b.nvml.push_xid(1, 79)
    b.nvml.push_xid(1, 79)
    b.wait_xids(3)
    b.sample()
    assert b.sent() == [("GpuXidError", "firing")]
    assert dict(next(r for r in b.pl.rules if type(r).__name__ == "GpuErrorsRule").active.get(f"xid|{UUID1}|79").evidence)["count since specwatch started"] == "3"
    last_hit = b.now
    while b.now < last_hit + 595:
        b.sample()
    assert b.sent() == [("GpuXidError", "firing")]
    b.sample(advance=10)
    assert b.sent()[-1] == ("GpuXidError", "resolved")
    assert b.pl.dispatcher.history[-1].ends_at - fired_at >= 600


def test_application_xid_is_a_warning_and_ignored_xids_are_ignored(box):
    b = box(rules={"gpu_errors": {"ignore_xids": [43]}})
    b.sample()
    b.nvml.push_xid(0, 43)
    b.nvml.push_xid(0, 13)
    b.wait_xids(2)
    b.sample()
    assert b.sent() == [("GpuXidError", "firing")]
    a = b.pl.dispatcher.history[0]
    assert a.labels["xid"] == "13" and a.labels["severity"] == "warning"
    assert "illegal access in the application" in a.fixes[0]


def test_uncorrected_ecc_increase(box):
    b = box()
    b.devices[0].ecc_volatile[pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED] = 2  # before specwatch: baseline
    b.sample()
    b.devices[0].ecc_volatile[pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED] += 50  # corrected: no alert
    b.sample()
    assert b.sent() == []
    b.devices[0].ecc_volatile[pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED] = 3
    b.sample()
    assert b.sent() == [("GpuEccError", "firing")]
    a = b.pl.dispatcher.history[0]
    ev = dict(a.evidence)
    assert (ev["new uncorrected ECC errors"], ev["volatile uncorrected total"], ev["volatile corrected total"]) == ("1", "3", "53")
    assert ev["uuid"] == UUID0
    assert any("nvidia-smi -r -i 0" in f for f in a.fixes)
    for _ in range(121):
        b.sample()
    assert b.sent()[-1] == ("GpuEccError", "resolved")


def test_lost_gpu_fires_and_resolves_after_reinit(box):
    b = box()
    b.sample()
    b.devices[1].fail_all = pynvml.NVML_ERROR_GPU_IS_LOST
    b.sample()
    assert b.sent() == [("GpuLost", "firing")]
    a = b.pl.dispatcher.history[0]
    assert a.labels["gpu"] == "1" and a.labels["uuid"] == UUID1
    ev = dict(a.evidence)
    assert ev["uuid"] == UUID1 and ev["pci bus id"] == "00000000:3B:00.0"  # remembered from before
    assert any("XID 79" in f for f in a.fixes)
    b.sample()
    assert b.sent() == [("GpuLost", "firing")]
    b.devices[1].fail_all = None
    b.sample()  # re-initialised and read again
    assert b.sent()[-1] == ("GpuLost", "resolved")


def test_gpu_disappearing_from_nvml(box):
    b = box()
    b.sample()
    b.devices[1].fail_all = pynvml.NVML_ERROR_GPU_IS_LOST
    b.sample()
    b.nvml.devices.pop(1)  # after re-init the driver no longer lists it
    b.sample()
    names = b.sent()
    assert ("GpuLost", "firing") in names and len(names) == 2
    count = [a for a in b.pl.dispatcher.history if a.labels["gpu"] == ""][0]
    ev = dict(count.evidence)
    assert (ev["GPUs visible"], ev["GPUs before"]) == ("1", "2")
    assert ev["missing"] == f"GPU 1 {UUID1} 00000000:3B:00.0"


def test_nvml_unavailable_says_nothing(box):
    b = box()
    b.nvml.init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    for _ in range(5):
        b.sample()
    assert b.sent() == []


# ------------------------------------------------------------------ throttling + throughput


def baseline(b, n=12, thr=400.0, running=32):
    for _ in range(n):
        b.decode(thr, running)
    b.sample()


def test_thermal_throttle_with_drop_fires_and_resolves(box):
    b = box()
    b.sample()
    baseline(b)
    b.devices[0].clock_event_reasons = pynvml.nvmlClocksEventReasonHwThermalSlowdown
    b.devices[0].temperature_c = 91
    b.devices[0].sm_clock_mhz = 990
    b.sample()
    b.decode(250.0)
    b.decode(240.0)
    assert b.sent() == []  # two throttled lines: not yet
    b.decode(245.0)
    assert b.sent() == [("GpuThrottlingThroughputDrop", "firing")]
    a = b.pl.dispatcher.history[0]
    assert a.labels == {"alertname": "GpuThrottlingThroughputDrop", "severity": "warning",
                        "server": "gpu-box-1", "rank": "", "engine": "sglang"}
    ev = dict(a.evidence)
    assert ev["gen throughput (token/s)"].startswith("245.0")
    assert ev["unthrottled baseline (token/s)"].startswith("400.0 (median of 12 lines")
    assert ev["drop"] == "39%"
    assert ev["GPU 0"] == "reasons hw_thermal_slowdown; 91 °C; 412 W; SM 990 MHz"
    assert "GPU 1" not in ev
    assert a.fixes[0].startswith("Thermal: check cooling of GPU 0")
    b.devices[0].clock_event_reasons = 0
    b.sample()
    for _ in range(3):
        b.decode(398.0)
    assert b.sent()[-1] == ("GpuThrottlingThroughputDrop", "resolved")


def test_power_cap_fix_names_the_power_limit(box):
    b = box()
    b.sample()
    baseline(b)
    b.devices[1].clock_event_reasons = pynvml.nvmlClocksEventReasonSwPowerCap
    b.sample()
    for _ in range(3):
        b.decode(300.0)
    assert b.sent() == [("GpuThrottlingThroughputDrop", "firing")]
    a = b.pl.dispatcher.history[0]
    assert any("nvidia-smi -q -d POWER -i 1" in f for f in a.fixes)
    assert "GPU 1" in dict(a.evidence)


@pytest.mark.parametrize("case", ["throttled_steady", "drop_unthrottled", "other_load", "idle_gpu_throttled",
                                  "no_baseline"])
def test_throttle_rule_quiet(box, case):
    b = box(sglang_on=(0,))
    b.sample()
    if case != "no_baseline":
        baseline(b)
    if case in ("throttled_steady", "other_load", "no_baseline"):
        b.devices[0].clock_event_reasons = pynvml.nvmlClocksEventReasonHwThermalSlowdown
    if case == "idle_gpu_throttled":  # GPU 1 holds no SGLang memory
        b.devices[1].clock_event_reasons = pynvml.nvmlClocksEventReasonHwThermalSlowdown
    b.sample()
    for _ in range(6):
        if case == "throttled_steady":
            b.decode(395.0)
        elif case == "other_load":
            b.decode(150.0, running=4)  # fewer requests, lower throughput: no comparable baseline
        else:
            b.decode(200.0)
    assert b.sent() == []


def test_stale_gpu_sample_is_not_throttling(box):
    b = box(rules={"decode_stalled": {"enabled": False}})  # two minutes without a decode line: a stall of its own
    b.sample()
    baseline(b)
    b.devices[0].clock_event_reasons = pynvml.nvmlClocksEventReasonHwThermalSlowdown
    b.sample()
    b.now += 120  # the GPU sampler stalled: its last word is two minutes old
    for _ in range(3):
        b.decode(200.0)
    assert b.sent() == []


def test_firing_gpu_alert_resolves_after_specwatch_restart(box):
    b = box()
    b.sample()
    b.devices[1].fail_all = pynvml.NVML_ERROR_GPU_IS_LOST
    b.sample()
    assert b.sent() == [("GpuLost", "firing")]
    with b.pl.lock:
        state = b.pl.to_state()
    b2 = box()  # specwatch restarted; the GPU was reset meanwhile
    b2.pl.load_state(state)
    b2.sample()
    assert b2.sent() == [("GpuLost", "resolved")]
    assert b2.pl.dispatcher.active == {}
