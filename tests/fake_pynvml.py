"""In-process stand-in for the NVML functions specwatch calls, for machines without a GPU.

It implements exactly the ``pynvml`` (nvidia-ml-py) functions that
``specwatch.sources.nvml.GpuSampler`` calls, with the same names and parameters
(checked by a test against the real module), and returns the real ctypes structures
(``c_nvmlMemory_t``, ``c_nvmlUtilization_t``, ``nvmlPciInfo_t``) or the real friendly
objects (process info). Errors are the real ``pynvml.NVMLError_*`` subclasses, and every
constant comes from ``pynvml`` itself, so a sampler that works against this fake uses
the real error codes and bit values.

Each device is configured by a :class:`FakeDevice`; a test changes its fields between
samples. ``errors`` maps a function name to an ``NVML_ERROR_*`` code that call raises;
``fail_all`` makes every call on the device raise (e.g. a lost GPU). XID events are pushed
with :meth:`FakeNvml.push_xid` and delivered by ``nvmlEventSetWait_v2``.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import pynvml
from pynvml import (  # re-exported: the sampler reads these off the module it is given
    NVML_AGGREGATE_ECC,
    NVML_CLOCK_MEM,
    NVML_CLOCK_SM,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    NVML_ERROR_UNINITIALIZED,
    NVML_ERROR_UNKNOWN,
    NVML_MEMORY_ERROR_TYPE_CORRECTED,
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
    NVML_TEMPERATURE_GPU,
    NVML_VOLATILE_ECC,
    NVMLError,
    c_nvmlMemory_t,
    c_nvmlUtilization_t,
    nvmlClocksEventReasonApplicationsClocksSetting,
    nvmlClocksEventReasonDisplayClockSetting,
    nvmlClocksEventReasonGpuIdle,
    nvmlClocksEventReasonHwPowerBrakeSlowdown,
    nvmlClocksEventReasonHwSlowdown,
    nvmlClocksEventReasonHwThermalSlowdown,
    nvmlClocksEventReasonSwPowerCap,
    nvmlClocksEventReasonSwThermalSlowdown,
    nvmlClocksEventReasonSyncBoost,
    nvmlEventTypeXidCriticalError,
    nvmlPciInfo_t,
    nvmlStructToFriendlyObject,
)
# the struct nvmlDeviceGetComputeRunningProcesses fills in the installed nvidia-ml-py: _v3_t where
# it has one (13.615), c_nvmlProcessInfo_t where not (12.535); both carry pid and usedGpuMemory
c_nvmlProcessInfo_v3_t = getattr(pynvml, "c_nvmlProcessInfo_v3_t", None) or pynvml.c_nvmlProcessInfo_t

GIB = 1024**3

# NVML functions the fake implements; a test checks each against pynvml's signature
FUNCTIONS = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
)


@dataclass(frozen=True)
class FakeHandle:
    """Opaque device handle (the real one is a ctypes pointer)."""

    index: int


@dataclass
class FakeEventData:
    """Same attributes as ``pynvml.c_nvmlEventData_t``."""

    device: FakeHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class FakeEventSet:
    devices: set[int] = field(default_factory=set)
    freed: bool = False


@dataclass
class FakeDevice:
    """One GPU; units as NVML returns them (MHz, mW, mJ, percent, bytes)."""

    uuid: str
    pci_bus_id: str
    name: str = "NVIDIA H200"
    gpu_util_percent: int = 0
    mem_util_percent: int = 0
    memory_total_bytes: int = 143771 * 1024**2
    memory_used_bytes: int = 0
    power_mw: int = 75_000
    energy_mj: int = 0
    temperature_c: int = 30
    sm_clock_mhz: int = 345
    mem_clock_mhz: int = 3201
    clock_event_reasons: int = 0
    ecc_volatile: dict[int, int] = field(default_factory=lambda: {NVML_MEMORY_ERROR_TYPE_CORRECTED: 0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED: 0})
    ecc_aggregate: dict[int, int] = field(default_factory=lambda: {NVML_MEMORY_ERROR_TYPE_CORRECTED: 0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED: 0})
    pcie_replays: int = 0
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, usedGpuMemory bytes)
    errors: dict[str, int] = field(default_factory=dict)  # function name -> NVML_ERROR_* it raises
    fail_all: int | None = None  # every call on this device raises this code (GPU lost)


class FakeNvml:
    """Module-like fake: pass an instance where ``pynvml`` would go."""

    # the real exception classes and constants, so sampler code paths are the real ones
    NVMLError = NVMLError
    NVML_ERROR_DRIVER_NOT_LOADED = NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_FUNCTION_NOT_FOUND = NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    NVML_ERROR_UNINITIALIZED = NVML_ERROR_UNINITIALIZED
    NVML_ERROR_UNKNOWN = NVML_ERROR_UNKNOWN
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_CLOCK_MEM = NVML_CLOCK_MEM
    NVML_MEMORY_ERROR_TYPE_CORRECTED = NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = NVML_VOLATILE_ECC
    NVML_AGGREGATE_ECC = NVML_AGGREGATE_ECC
    nvmlEventTypeXidCriticalError = nvmlEventTypeXidCriticalError
    nvmlClocksEventReasonGpuIdle = nvmlClocksEventReasonGpuIdle
    nvmlClocksEventReasonApplicationsClocksSetting = nvmlClocksEventReasonApplicationsClocksSetting
    nvmlClocksEventReasonSwPowerCap = nvmlClocksEventReasonSwPowerCap
    nvmlClocksEventReasonHwSlowdown = nvmlClocksEventReasonHwSlowdown
    nvmlClocksEventReasonSyncBoost = nvmlClocksEventReasonSyncBoost
    nvmlClocksEventReasonSwThermalSlowdown = nvmlClocksEventReasonSwThermalSlowdown
    nvmlClocksEventReasonHwThermalSlowdown = nvmlClocksEventReasonHwThermalSlowdown
    nvmlClocksEventReasonHwPowerBrakeSlowdown = nvmlClocksEventReasonHwPowerBrakeSlowdown
    nvmlClocksEventReasonDisplayClockSetting = nvmlClocksEventReasonDisplayClockSetting

    def __init__(
        self,
        devices: list[FakeDevice],
        *,
        driver_version: str = "570.124.06",
        cuda_driver_version: int = 12080,
        nvml_version: str = "12.570.124.06",
        init_error: int | None = None,
        legacy_driver: bool = False,
    ) -> None:
        """``init_error``: code ``nvmlInit`` raises (e.g. NVML_ERROR_LIBRARY_NOT_FOUND).
        ``legacy_driver``: the driver predates nvmlDeviceGetCurrentClocksEventReasons."""
        self.devices = devices
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        self.nvml_version = nvml_version
        self.init_error = init_error
        self.legacy_driver = legacy_driver
        self.calls: Counter[str] = Counter()
        self.device_calls: Counter[tuple[str, int]] = Counter()
        self.hang: threading.Event | None = None  # when set to an Event, device calls block until it is set
        self.hanging = threading.Event()  # set while a call is blocked on ``hang``
        self._refcount = 0
        self._xids: queue.Queue[tuple[int, int]] = queue.Queue()
        self._lock = threading.Lock()

    # -------------------------------------------------------------- test controls

    def push_xid(self, index: int, xid: int) -> None:
        """Raise an XID on GPU ``index``, as the driver would (delivered to registered sets)."""
        self._xids.put((index, xid))

    @property
    def initialised(self) -> bool:
        return self._refcount > 0

    # -------------------------------------------------------------- internals

    def _record(self, name: str) -> None:
        with self._lock:
            self.calls[name] += 1

    def _check_init(self, name: str) -> None:
        self._record(name)
        if self._refcount <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _device(self, name: str, handle: FakeHandle) -> FakeDevice:
        self._check_init(name)
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.devices):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            self.device_calls[(name, handle.index)] += 1
        if self.hang is not None:
            self.hanging.set()
            self.hang.wait()
        dev = self.devices[handle.index]
        if dev.fail_all is not None:
            raise NVMLError(dev.fail_all)
        if name in dev.errors:
            raise NVMLError(dev.errors[name])
        return dev

    # -------------------------------------------------------------- init / system

    def nvmlInit(self) -> None:
        self._record("nvmlInit")
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self._refcount += 1

    def nvmlShutdown(self) -> None:
        self._check_init("nvmlShutdown")
        self._refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check_init("nvmlSystemGetCudaDriverVersion")
        return self.cuda_driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._check_init("nvmlSystemGetNVMLVersion")
        return self.nvml_version

    def nvmlDeviceGetCount(self) -> int:
        self._check_init("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._check_init("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.devices):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        handle = FakeHandle(index)
        self._device("nvmlDeviceGetHandleByIndex", handle)  # a lost GPU fails here too
        return handle

    # -------------------------------------------------------------- identity

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        return self._device("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        return self._device("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> nvmlPciInfo_t:
        dev = self._device("nvmlDeviceGetPciInfo", handle)
        return nvmlPciInfo_t(busId=dev.pci_bus_id.encode(), busIdLegacy=dev.pci_bus_id.encode())

    # -------------------------------------------------------------- readings

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> c_nvmlUtilization_t:
        dev = self._device("nvmlDeviceGetUtilizationRates", handle)
        return c_nvmlUtilization_t(gpu=dev.gpu_util_percent, memory=dev.mem_util_percent)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version=None) -> c_nvmlMemory_t:
        dev = self._device("nvmlDeviceGetMemoryInfo", handle)
        if version:  # the sampler uses v1; v2 would need c_nvmlMemory_v2_t
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return c_nvmlMemory_t(
            total=dev.memory_total_bytes,
            free=dev.memory_total_bytes - dev.memory_used_bytes,
            used=dev.memory_used_bytes,
        )

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return self._device("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:
        return self._device("nvmlDeviceGetTotalEnergyConsumption", handle).energy_mj

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        dev = self._device("nvmlDeviceGetTemperature", handle)
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return dev.temperature_c

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, type: int) -> int:  # noqa: A002 - pynvml's name
        dev = self._device("nvmlDeviceGetClockInfo", handle)
        if type == NVML_CLOCK_SM:
            return dev.sm_clock_mhz
        if type == NVML_CLOCK_MEM:
            return dev.mem_clock_mhz
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        dev = self._device("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if self.legacy_driver:  # what pynvml raises when libnvidia-ml lacks the symbol
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        return dev.clock_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeHandle) -> int:
        return self._device("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clock_event_reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeHandle, errorType: int, counterType: int) -> int:
        dev = self._device("nvmlDeviceGetTotalEccErrors", handle)
        counters = dev.ecc_volatile if counterType == NVML_VOLATILE_ECC else dev.ecc_aggregate
        return counters[errorType]

    def nvmlDeviceGetPcieReplayCounter(self, handle: FakeHandle) -> int:
        return self._device("nvmlDeviceGetPcieReplayCounter", handle).pcie_replays

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list:
        dev = self._device("nvmlDeviceGetComputeRunningProcesses", handle)
        procs = []
        for pid, used in dev.processes:
            # same path as pynvml: ctypes struct -> friendly object; None = not available
            obj = nvmlStructToFriendlyObject(c_nvmlProcessInfo_v3_t(pid=pid, usedGpuMemory=used or 0))
            obj.usedGpuMemory = used
            procs.append(obj)
        return procs

    # -------------------------------------------------------------- events

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._check_init("nvmlEventSetCreate")
        return FakeEventSet()

    def nvmlDeviceRegisterEvents(self, handle: FakeHandle, eventTypes: int, eventSet: FakeEventSet) -> None:
        self._device("nvmlDeviceRegisterEvents", handle)
        if not eventTypes & nvmlEventTypeXidCriticalError:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        eventSet.devices.add(handle.index)

    def nvmlEventSetWait_v2(self, eventSet: FakeEventSet, timeoutms: int) -> FakeEventData:
        self._check_init("nvmlEventSetWait_v2")
        if eventSet.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        deadline = time.monotonic() + timeoutms / 1000.0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise NVMLError(NVML_ERROR_TIMEOUT)
            try:
                index, xid = self._xids.get(timeout=left)
            except queue.Empty:
                raise NVMLError(NVML_ERROR_TIMEOUT) from None
            if index in eventSet.devices:  # the driver delivers only to sets registered for that GPU
                return FakeEventData(FakeHandle(index), nvmlEventTypeXidCriticalError, xid)

    def nvmlEventSetFree(self, eventSet: FakeEventSet) -> None:
        self._check_init("nvmlEventSetFree")
        eventSet.freed = True


def two_h200s() -> list[FakeDevice]:
    """Two busy H200s with distinct, easily recognisable readings."""
    return [
        FakeDevice(
            uuid="GPU-11111111-2222-3333-4444-555555555555",
            pci_bus_id="00000000:19:00.0",
            gpu_util_percent=87,
            mem_util_percent=41,
            memory_used_bytes=120 * GIB,
            power_mw=412_500,
            energy_mj=123_456_789,
            temperature_c=61,
            sm_clock_mhz=1980,
            mem_clock_mhz=3201,
            ecc_volatile={NVML_MEMORY_ERROR_TYPE_CORRECTED: 3, NVML_MEMORY_ERROR_TYPE_UNCORRECTED: 0},
            ecc_aggregate={NVML_MEMORY_ERROR_TYPE_CORRECTED: 40, NVML_MEMORY_ERROR_TYPE_UNCORRECTED: 2},
            pcie_replays=7,
        ),
        FakeDevice(
            uuid="GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
            pci_bus_id="00000000:3B:00.0",
            gpu_util_percent=5,
            mem_util_percent=0,
            memory_used_bytes=1 * GIB,
            power_mw=98_250,
            energy_mj=5_000,
            temperature_c=34,
            sm_clock_mhz=345,
            mem_clock_mhz=3201,
            pcie_replays=0,
        ),
    ]


__all__ = ["FakeDevice", "FakeEventData", "FakeHandle", "FakeNvml", "FUNCTIONS", "GIB", "two_h200s", "pynvml"]
