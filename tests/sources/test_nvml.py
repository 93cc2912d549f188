"""GpuSampler driven through the NVML fake: its GpuSample events, and the same values read back
through GpuCollector and the Prometheus text format."""

from __future__ import annotations

import inspect
import logging
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pynvml
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ has no __init__.py
import fake_pynvml as fake  # noqa: E402
from fake_pynvml import GIB, FakeNvml, two_h200s  # noqa: E402

from specwatch.sources import nvml as nvml_mod  # noqa: E402
from specwatch.sources.nvml import GpuCollector, GpuSampler  # noqa: E402

UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
LOGGER = "specwatch.sources.nvml"


# ---------------------------------------------------------------- helpers


def scrape(registry: CollectorRegistry) -> dict[str, list]:
    """Render and parse the exposition text: sample name -> samples."""
    text = generate_latest(registry).decode()
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def value(samples: dict[str, list], name: str, **labels: str) -> float:
    matches = [s for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matches) == 1, f"{name}{labels}: {matches}"
    return matches[0].value


def gpus_of(samples: dict[str, list], name: str) -> set[str]:
    return {s.labels["gpu"] for s in samples.get(name, [])}


def wait_for(predicate, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.fixture
def make():
    """Build sampler + a registry rendering it; always stop threads and shut NVML down afterwards."""
    made: list[GpuSampler] = []

    def _make(nvml, **kwargs):
        kwargs.setdefault("xid_wait_ms", 50)
        kwargs.setdefault("init_retry_min", 0.0)
        sampler = GpuSampler(nvml, **kwargs)
        registry = CollectorRegistry()
        registry.register(GpuCollector(sampler))
        made.append(sampler)
        return sampler, registry

    yield _make
    for sampler in made:
        assert sampler.stop(timeout=3.0)


CORE = (
    "specwatch_gpu_utilization_ratio",
    "specwatch_gpu_memory_utilization_ratio",
    "specwatch_gpu_memory_used_bytes",
    "specwatch_gpu_memory_total_bytes",
    "specwatch_gpu_power_watts",
    "specwatch_gpu_energy_joules_total",
    "specwatch_gpu_temperature_celsius",
    "specwatch_gpu_sm_clock_hertz",
    "specwatch_gpu_memory_clock_hertz",
    "specwatch_gpu_pcie_replays_total",
)


# ---------------------------------------------------------------- values


def test_two_gpus_values_in_base_units(make):
    nvml = FakeNvml(two_h200s())
    sampler, registry = make(nvml)
    before = time.time()
    assert sampler.sample_once() is True
    m = scrape(registry)

    assert value(m, "specwatch_gpu_up") == 1
    assert value(m, "specwatch_gpu_count") == 2
    assert value(m, "specwatch_gpu_device_up", gpu="0") == 1
    assert value(m, "specwatch_gpu_device_up", gpu="1") == 1
    info = m["specwatch_gpu_driver_info"][0]
    assert info.labels == {"driver_version": "570.124.06", "cuda_driver_version": "12.8", "nvml_version": "12.570.124.06"}
    assert info.value == 1
    assert before <= value(m, "specwatch_gpu_last_sample_timestamp_seconds") <= time.time()
    assert 0 <= value(m, "specwatch_gpu_sample_duration_seconds") < 1

    g0 = {"gpu": "0", "uuid": UUID0, "model_name": "NVIDIA H200", "pci_bus_id": "00000000:19:00.0"}
    g1 = {"gpu": "1", "uuid": UUID1, "model_name": "NVIDIA H200", "pci_bus_id": "00000000:3B:00.0"}
    assert value(m, "specwatch_gpu_utilization_ratio", **g0) == pytest.approx(0.87)
    assert value(m, "specwatch_gpu_utilization_ratio", **g1) == pytest.approx(0.05)
    assert value(m, "specwatch_gpu_memory_utilization_ratio", **g0) == pytest.approx(0.41)
    assert value(m, "specwatch_gpu_memory_used_bytes", **g0) == 120 * GIB
    assert value(m, "specwatch_gpu_memory_used_bytes", **g1) == 1 * GIB
    assert value(m, "specwatch_gpu_memory_total_bytes", **g0) == 143771 * 1024**2
    assert value(m, "specwatch_gpu_power_watts", **g0) == pytest.approx(412.5)
    assert value(m, "specwatch_gpu_power_watts", **g1) == pytest.approx(98.25)
    assert value(m, "specwatch_gpu_energy_joules_total", **g0) == pytest.approx(123456.789)
    assert value(m, "specwatch_gpu_energy_joules_total", **g1) == pytest.approx(5.0)
    assert value(m, "specwatch_gpu_temperature_celsius", **g0) == 61
    assert value(m, "specwatch_gpu_sm_clock_hertz", **g0) == 1_980_000_000
    assert value(m, "specwatch_gpu_sm_clock_hertz", **g1) == 345_000_000
    assert value(m, "specwatch_gpu_memory_clock_hertz", **g1) == 3_201_000_000
    # volatile, not aggregate (aggregate in the fake is 40 / 2)
    assert value(m, "specwatch_gpu_ecc_errors_total", gpu="0", type="corrected") == 3
    assert value(m, "specwatch_gpu_ecc_errors_total", gpu="0", type="uncorrected") == 0
    assert value(m, "specwatch_gpu_pcie_replays_total", **g0) == 7
    # no process_pids given: series absent
    assert "specwatch_gpu_sglang_process_memory_bytes" not in m
    # only the seeded zeros, no error counted
    assert all(s.value == 0 for s in m["specwatch_gpu_collection_errors_total"])

    # the energy counter follows the device between samples
    nvml.devices[0].energy_mj += 2_500
    sampler.sample_once()
    assert value(scrape(registry), "specwatch_gpu_energy_joules_total", gpu="0") == pytest.approx(123459.289)


def test_clock_event_reason_bits(make):
    devices = two_h200s()
    devices[0].clock_event_reasons = pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwThermalSlowdown
    devices[1].clock_event_reasons = pynvml.nvmlClocksEventReasonGpuIdle
    sampler, registry = make(FakeNvml(devices))
    sampler.sample_once()
    m = scrape(registry)
    reasons = [
        "gpu_idle",
        "applications_clocks_setting",
        "sw_power_cap",
        "hw_slowdown",
        "sync_boost",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
        "display_clock_setting",
    ]
    name = "specwatch_gpu_clock_event_reason_active"
    assert len(m[name]) == 2 * len(reasons)
    active0 = {r for r in reasons if value(m, name, gpu="0", reason=r) == 1}
    active1 = {r for r in reasons if value(m, name, gpu="1", reason=r) == 1}
    assert active0 == {"sw_power_cap", "hw_thermal_slowdown"}
    assert active1 == {"gpu_idle"}


def test_older_driver_falls_back_to_throttle_reasons(make):
    devices = two_h200s()
    devices[0].clock_event_reasons = pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    nvml = FakeNvml(devices, legacy_driver=True)
    sampler, registry = make(nvml)
    sampler.sample_once()
    m = scrape(registry)
    assert value(m, "specwatch_gpu_clock_event_reason_active", gpu="0", reason="hw_power_brake_slowdown") == 1
    assert value(m, "specwatch_gpu_clock_event_reason_active", gpu="0", reason="gpu_idle") == 0
    assert nvml.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 2
    assert "function_not_found" not in {s.labels["error"] for s in m["specwatch_gpu_collection_errors_total"]}


def test_each_cycle_emits_one_typed_sample_that_metrics_render(make):
    devices = two_h200s()
    devices[0].clock_event_reasons = pynvml.nvmlClocksEventReasonSwPowerCap
    got = []
    nvml = FakeNvml(devices)
    sampler, registry = make(nvml, emit=got.append, process_pids=lambda: set())
    sampler.sample_once()
    devices[1].fail_all = pynvml.NVML_ERROR_GPU_IS_LOST
    before = time.time()
    sampler.sample_once()
    assert len(got) == 2 and got[1] is sampler.last
    ev = got[1]
    assert (ev.up, ev.count, ev.driver) == (True, 2, ("570.124.06", "12.8", "12.570.124.06"))
    assert before <= ev.timestamp <= time.time() and 0 <= ev.duration_seconds < 1
    g0, g1 = ev.gpus
    assert (g0.index, g0.uuid, g0.model_name, g0.pci_bus_id, g0.up) == ("0", UUID0, "NVIDIA H200", "00000000:19:00.0", True)
    assert (g0.power_watts, g0.temperature_celsius, g0.sm_clock_hertz) == (412.5, 61.0, 1_980_000_000)
    assert g0.reasons == {"sw_power_cap"} and g0.reasons_read
    assert g0.ecc == {"corrected": 3.0, "uncorrected": 0.0} and g0.sglang_memory_bytes == 0
    # a lost GPU: its labels, no values
    assert (g1.index, g1.uuid, g1.up, g1.power_watts, g1.reasons_read) == ("1", UUID1, False, None, False)
    assert got[0].gpus[1].up and got[0].gpus[1].power_watts == 98.25
    m = scrape(registry)
    assert value(m, "specwatch_gpu_power_watts", gpu="0") == g0.power_watts
    assert value(m, "specwatch_gpu_clock_event_reason_active", gpu="0", reason="sw_power_cap") == 1
    assert value(m, "specwatch_gpu_device_up", gpu="1") == 0
    assert value(m, "specwatch_gpu_sample_duration_seconds") == ev.duration_seconds

    # NVML gone (shut down, and the driver unloaded): the cycle still emits, up False and no GPUs
    sampler.stop()
    nvml.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    sampler.sample_once()
    assert len(got) == 3 and (got[2].up, got[2].count, got[2].gpus) == (False, None, ())


def test_emit_failure_is_logged_and_sampling_goes_on(make, caplog):
    def broken(sample):
        raise RuntimeError("pipeline bug")

    sampler, registry = make(FakeNvml(two_h200s()), emit=broken)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert sampler.sample_once() is True
        assert sampler.sample_once() is True
    assert sampler.cycles == 2
    assert len([r for r in caplog.records if "handing the GPU sample on failed" in r.getMessage()]) == 2
    assert value(scrape(registry), "specwatch_gpu_up") == 1


# ---------------------------------------------------------------- XID


def test_xid_between_samples_is_counted(make):
    nvml = FakeNvml(two_h200s())
    sampler, registry = make(nvml)
    sampler.sample_once()
    assert sampler.xid_listening
    assert nvml.calls["nvmlDeviceRegisterEvents"] == 2
    assert scrape(registry).get("specwatch_gpu_xid_errors_total") is None

    t0 = time.time()
    nvml.push_xid(1, 79)
    nvml.push_xid(0, 13)
    nvml.push_xid(0, 13)
    # counted by the event thread, with no sample in between
    wait_for(lambda: len(scrape(registry).get("specwatch_gpu_xid_errors_total", [])) == 2
             and value(scrape(registry), "specwatch_gpu_xid_errors_total", gpu="0", xid="13") == 2)
    m = scrape(registry)
    assert value(m, "specwatch_gpu_xid_errors_total", gpu="1", uuid=UUID1, pci_bus_id="00000000:3B:00.0", xid="79") == 1
    assert value(m, "specwatch_gpu_xid_errors_total", gpu="0", uuid=UUID0, xid="13") == 2
    assert t0 <= value(m, "specwatch_gpu_xid_last_timestamp_seconds", gpu="1", xid="79") <= time.time()

    sampler.sample_once()
    assert value(scrape(registry), "specwatch_gpu_xid_errors_total", gpu="1", xid="79") == 1
    # the next cycle's event carries them, per GPU
    g0, g1 = sampler.last.gpus
    assert g0.xids["13"][0] == 2 and g1.xids["79"][0] == 1
    assert t0 <= g1.xids["79"][1] <= time.time()


# ---------------------------------------------------------------- failures


@pytest.mark.parametrize(
    ("how", "error"),
    [("fail_all", "gpu_is_lost"), ("temperature_unknown", "unknown")],
)
def test_failed_gpu_dropped_then_back_after_reinit(make, how, error, caplog):
    nvml = FakeNvml(two_h200s())
    sampler, registry = make(nvml)
    sampler.sample_once()
    nvml.push_xid(1, 79)
    wait_for(lambda: "specwatch_gpu_xid_errors_total" in scrape(registry))

    if how == "fail_all":
        nvml.devices[1].fail_all = pynvml.NVML_ERROR_GPU_IS_LOST
    else:
        nvml.devices[1].errors["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_UNKNOWN
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        sampler.sample_once()
    m = scrape(registry)
    assert value(m, "specwatch_gpu_up") == 1
    assert value(m, "specwatch_gpu_device_up", gpu="0") == 1
    assert value(m, "specwatch_gpu_device_up", gpu="1") == 0
    for name in CORE:
        assert gpus_of(m, name) == {"0"}, name  # GPU 1 dropped everywhere, no stale values
    assert gpus_of(m, "specwatch_gpu_clock_event_reason_active") == {"0"}
    assert value(m, "specwatch_gpu_collection_errors_total", error=error) == 1
    # XID counters are events, not samples: they survive the drop
    assert value(m, "specwatch_gpu_xid_errors_total", gpu="1", xid="79") == 1
    assert nvml.calls["nvmlShutdown"] == 0
    assert [r for r in caplog.records if r.levelno == logging.WARNING and "GPU 1 dropped" in r.getMessage()]

    # the GPU recovers; the next cycle shuts NVML down and initialises it again
    nvml.devices[1].fail_all = None
    nvml.devices[1].errors.clear()
    sampler.sample_once()
    m = scrape(registry)
    assert nvml.calls["nvmlShutdown"] == 1
    assert nvml.calls["nvmlInit"] == 2
    assert nvml.calls["nvmlEventSetFree"] == 1
    assert value(m, "specwatch_gpu_device_up", gpu="1") == 1
    for name in CORE:
        assert gpus_of(m, name) == {"0", "1"}, name
    assert value(m, "specwatch_gpu_temperature_celsius", gpu="1") == 34
    assert sampler.xid_listening  # a fresh event set after re-init
    nvml.push_xid(1, 79)
    wait_for(lambda: value(scrape(registry), "specwatch_gpu_xid_errors_total", gpu="1", xid="79") == 2)


def test_gpu_that_stays_lost_backs_off_reinit(make):
    nvml = FakeNvml(two_h200s())
    sampler, registry = make(nvml, init_retry_min=3600.0)
    sampler.sample_once()
    nvml.devices[1].fail_all = pynvml.NVML_ERROR_GPU_IS_LOST
    sampler.sample_once()  # lost: re-init scheduled for the next cycle
    sampler.sample_once()  # re-init; GPU 1 fails again at its handle
    for _ in range(3):  # now backing off: no more init/shutdown churn, GPU 0 still sampled
        sampler.sample_once()
    m = scrape(registry)
    assert nvml.calls["nvmlInit"] == 2
    assert nvml.calls["nvmlShutdown"] == 1
    assert gpus_of(m, "specwatch_gpu_power_watts") == {"0"}
    assert value(m, "specwatch_gpu_device_up", gpu="1") == 0
    assert value(m, "specwatch_gpu_collection_errors_total", error="gpu_is_lost") == 2
    # a lost GPU is not called again within a session (a wedged device can hang a call)
    assert nvml.device_calls[("nvmlDeviceGetPowerUsage", 1)] == 1


def test_library_not_found_up0_one_warning(make, caplog):
    nvml = FakeNvml(two_h200s(), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    sampler, registry = make(nvml)  # init_retry_min=0: every cycle retries
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        for _ in range(5):
            assert sampler.sample_once() is False
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "library_not_found" in warnings[0].getMessage()
    assert nvml.calls["nvmlInit"] == 5
    m = scrape(registry)
    assert value(m, "specwatch_gpu_up") == 0
    assert value(m, "specwatch_gpu_collection_errors_total", error="library_not_found") == 5
    assert "specwatch_gpu_count" not in m
    assert "specwatch_gpu_driver_info" not in m
    assert "specwatch_gpu_last_sample_timestamp_seconds" not in m
    assert "specwatch_gpu_power_watts" not in m
    assert value(m, "specwatch_gpu_sample_duration_seconds") >= 0

    # the library appears (driver installed): the next retry brings everything up
    nvml.init_error = None
    assert sampler.sample_once() is True
    m = scrape(registry)
    assert value(m, "specwatch_gpu_up") == 1
    assert value(m, "specwatch_gpu_power_watts", gpu="1") == pytest.approx(98.25)


def test_init_retry_backs_off(make):
    nvml = FakeNvml(two_h200s(), init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    sampler, registry = make(nvml, init_retry_min=3600.0)
    for _ in range(4):
        sampler.sample_once()
    assert nvml.calls["nvmlInit"] == 1  # the next try is an hour away
    assert value(scrape(registry), "specwatch_gpu_collection_errors_total", error="driver_not_loaded") == 1


def nvidia_smi_gpus() -> dict[str, tuple[str, float]] | None:
    """{index: (uuid, memory total bytes)} from `nvidia-smi` (another NVML client), or None."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    out = subprocess.run([smi, "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
    return {i: (uuid, float(mib) * 2**20) for i, uuid, mib in rows}


def test_real_pynvml_on_this_machine(make, caplog):
    """The default (nvml=None) path with the real library. With a GPU, the values agree with
    nvidia-smi; without one: up 0, one warning."""
    sampler, registry = make(None)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        ups = [sampler.sample_once() for _ in range(3)]
    m = scrape(registry)
    if ups[0]:  # a machine with a GPU runs this suite
        assert ups == [True, True, True]
        assert value(m, "specwatch_gpu_up") == 1
        smi = nvidia_smi_gpus()
        if smi is None:
            pytest.skip("a GPU but no nvidia-smi to compare with")
        assert value(m, "specwatch_gpu_count") == len(smi) > 0
        for index, (uuid, total) in smi.items():
            assert value(m, "specwatch_gpu_memory_total_bytes", gpu=index, uuid=uuid) == pytest.approx(
                total, abs=2**20)  # nvidia-smi prints whole MiB
            assert value(m, "specwatch_gpu_device_up", gpu=index) == 1
    else:
        assert ups == [False, False, False]
        assert value(m, "specwatch_gpu_up") == 0
        assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
        errors = {s.labels["error"]: s.value for s in m["specwatch_gpu_collection_errors_total"]}
        assert errors["library_not_found"] + errors.get("driver_not_loaded", 0) == 3


def test_not_supported_omits_just_that_series(make):
    devices = two_h200s()
    devices[0].errors["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    devices[1].errors["nvmlDeviceGetTotalEccErrors"] = pynvml.NVML_ERROR_NOT_SUPPORTED  # ECC off
    nvml = FakeNvml(devices)
    sampler, registry = make(nvml)
    for _ in range(3):
        sampler.sample_once()
    m = scrape(registry)
    assert gpus_of(m, "specwatch_gpu_power_watts") == {"1"}
    assert {(s.labels["gpu"], s.labels["type"]) for s in m["specwatch_gpu_ecc_errors_total"]} == {
        ("0", "corrected"),
        ("0", "uncorrected"),
    }
    for name in set(CORE) - {"specwatch_gpu_power_watts"}:
        assert gpus_of(m, name) == {"0", "1"}, name
    assert value(m, "specwatch_gpu_device_up", gpu="0") == 1
    # counted once per GPU and series (ecc corrected + uncorrected on GPU 1), not per cycle
    assert value(m, "specwatch_gpu_collection_errors_total", error="not_supported") == 3
    assert nvml.device_calls[("nvmlDeviceGetPowerUsage", 0)] == 1
    assert nvml.device_calls[("nvmlDeviceGetPowerUsage", 1)] == 3
    assert nvml.calls["nvmlShutdown"] == 0  # not a reason to re-initialise


def test_sglang_process_memory_filtered_by_pids(make):
    devices = two_h200s()
    devices[0].processes = [(100, 10 * GIB), (200, 5 * GIB), (999, 3 * GIB)]
    devices[1].processes = [(100, 7 * GIB), (300, None), (4242, 60 * GIB)]
    pids = {100, 200, 300}
    sampler, registry = make(FakeNvml(devices), process_pids=lambda: pids)
    sampler.sample_once()
    m = scrape(registry)
    assert value(m, "specwatch_gpu_sglang_process_memory_bytes", gpu="0") == 15 * GIB
    assert value(m, "specwatch_gpu_sglang_process_memory_bytes", gpu="1") == 7 * GIB

    pids.discard(100)  # a server went away
    sampler.sample_once()
    m = scrape(registry)
    assert value(m, "specwatch_gpu_sglang_process_memory_bytes", gpu="0") == 5 * GIB
    assert value(m, "specwatch_gpu_sglang_process_memory_bytes", gpu="1") == 0


def test_process_pids_failure_omits_only_that_series(make):
    def broken() -> set[int]:
        raise OSError("no /proc")

    sampler, registry = make(FakeNvml(two_h200s()), process_pids=broken)
    sampler.sample_once()
    sampler.sample_once()
    m = scrape(registry)
    assert "specwatch_gpu_sglang_process_memory_bytes" not in m
    assert gpus_of(m, "specwatch_gpu_power_watts") == {"0", "1"}
    assert value(m, "specwatch_gpu_collection_errors_total", error="process_pids") == 2


# ---------------------------------------------------------------- threading


def test_collect_never_calls_nvml(make):
    nvml = FakeNvml(two_h200s())
    sampler, registry = make(nvml)
    sampler.sample_once()

    def calls() -> int:  # the XID thread's waits are its own business, not collect()'s
        return sum(n for name, n in nvml.calls.items() if name != "nvmlEventSetWait_v2")

    before = calls()
    for _ in range(5):
        scrape(registry)
    assert calls() == before


def test_hung_nvml_call_does_not_block_scrapes(make):
    nvml = FakeNvml(two_h200s())
    sampler, registry = make(nvml, interval=0.05)
    sampler.sample_once()
    nvml.hang = gate = threading.Event()
    sampler.start()
    assert nvml.hanging.wait(2.0)  # the sampler thread is stuck inside NVML
    t0 = time.perf_counter()
    m = scrape(registry)
    assert time.perf_counter() - t0 < 0.5
    assert value(m, "specwatch_gpu_power_watts", gpu="0") == pytest.approx(412.5)  # last good snapshot
    nvml.hang = None
    gate.set()


def test_start_stop_thread(make):
    nvml = FakeNvml(two_h200s())
    sampler, registry = make(nvml, interval=0.02)
    sampler.start()
    wait_for(lambda: sampler.cycles >= 3)
    assert sampler.stop(timeout=2.0)
    assert nvml.calls["nvmlShutdown"] == 1
    assert not nvml.initialised
    assert value(scrape(registry), "specwatch_gpu_up") == 1  # last snapshot stays readable


# ---------------------------------------------------------------- contracts


def test_fake_matches_pynvml_signatures():
    for name in fake.FUNCTIONS:
        real = getattr(pynvml, name)
        ours = getattr(FakeNvml([]), name)
        assert list(inspect.signature(ours).parameters) == list(inspect.signature(real).parameters), name


def test_sampler_calls_only_faked_functions(make):
    nvml = FakeNvml(two_h200s())
    sampler, registry = make(nvml, process_pids=lambda: {1})
    sampler.sample_once()
    sampler.stop()
    assert set(nvml.calls) <= set(fake.FUNCTIONS)
    # and every faked function but the legacy fallback was exercised
    assert set(fake.FUNCTIONS) - set(nvml.calls) == {"nvmlDeviceGetCurrentClocksThrottleReasons"}


def test_every_metric_documented_and_described():
    doc = nvml_mod.__doc__
    registry = CollectorRegistry()
    collector = GpuCollector(GpuSampler(FakeNvml([])))
    registry.register(collector)  # describe() names every family: a clash would raise here
    described = {m.name for m in collector.describe()}
    for name in nvml_mod.METRIC_NAMES:
        assert f"``{name}``" in doc, name
        assert name.removesuffix("_total") in described
    assert all(name.startswith("specwatch_gpu_") for name in nvml_mod.METRIC_NAMES)
