"""GPU state from NVML (``nvidia-ml-py``, imported as ``pynvml``): typed events and their metrics.

:class:`GpuSampler` reads every GPU on its own thread every ``interval`` seconds and turns
each cycle into one :class:`~specwatch.core.events.GpuSample` event: it keeps the latest and hands
each to ``emit`` (the daemon passes it to ``Pipeline.feed_event`` for the GPU rules). XID
errors are read on a second thread through an NVML event set, so an XID raised between two
samples is still counted. :class:`GpuCollector` only renders: ``collect()`` turns the
sampler's latest sample and its event counters into metric families, so a scrape never waits
on NVML (a wedged driver shows up as a stale ``specwatch_gpu_last_sample_timestamp_seconds``
instead of a hung ``/metrics``), and rules and ``/metrics`` see the same values.

Failure behaviour:

* NVML missing (``pynvml`` not importable, ``NVMLError_LibraryNotFound``,
  ``NVMLError_DriverNotLoaded``, or any other ``nvmlInit`` failure):
  ``specwatch_gpu_up 0``, one warning per outage, init retried with a backoff
  doubling from ``init_retry_min`` to ``init_retry_max`` seconds.
* A call that raises ``NVMLError_NotSupported``, ``NVMLError_NoPermission`` or
  ``NVMLError_FunctionNotFound``: that series is omitted for that GPU, the error is
  counted once per GPU and the call is not made again (the capability does not change
  while the process runs).
* Any other error on a device (``NVMLError_GpuIsLost``, ``NVMLError_Unknown``, ...):
  the GPU is ``up=False`` in the sample and every series of it is dropped (no stale values),
  ``specwatch_gpu_device_up{gpu}`` goes to 0, the error is counted, and on the next cycle
  NVML is shut down and initialised again. If the GPU keeps failing, further
  re-initialisations back off like init retries, while the other GPUs keep being sampled.
* XID counters live outside the samples: they survive a lost GPU (XID 79, "fell off
  the bus", is exactly what precedes one) and NVML re-initialisation.

Metrics (labels ``gpu``, ``uuid``, ``model_name``, ``pci_bus_id`` are written
"GPU labels"; ``gpu`` is the NVML index, which ignores ``CUDA_VISIBLE_DEVICES``):

==================================================  =======  =======  ==================================  ===========================================================================
Metric                                              Type     Unit     Labels                              Meaning
==================================================  =======  =======  ==================================  ===========================================================================
``specwatch_gpu_up``                                gauge    1/0      (none)                              1 when NVML initialised and the GPU count was read in the last cycle.
``specwatch_gpu_count``                             gauge    GPUs     (none)                              GPUs NVML reports (``nvmlDeviceGetCount``); absent while up is 0.
``specwatch_gpu_device_up``                         gauge    1/0      ``gpu``                             1 when the GPU was read in the last cycle, 0 when it failed (lost, unknown error).
``specwatch_gpu_driver_info``                       gauge    1        ``driver_version``,                 Always 1; driver, CUDA driver API (e.g. ``12.8``) and NVML library versions.
                                                                      ``cuda_driver_version``,
                                                                      ``nvml_version``
``specwatch_gpu_last_sample_timestamp_seconds``     gauge    seconds  (none)                              Unix time of the last cycle that ended with up 1; alert on its age.
``specwatch_gpu_sample_duration_seconds``           gauge    seconds  (none)                              Wall time the last sampling cycle took.
``specwatch_gpu_collection_errors_total``           counter  errors   ``error``                           NVML errors by name (``gpu_is_lost``, ``not_supported``, ``library_not_found``,
                                                                                                          ``import_error``, ``process_pids``, ``internal``, ...).
``specwatch_gpu_utilization_ratio``                 gauge    ratio    GPU labels                          Fraction of the driver's last sample period (1/6 s to 1 s) a kernel ran, 0-1.
``specwatch_gpu_memory_utilization_ratio``          gauge    ratio    GPU labels                          Fraction of that period device memory was being read or written, 0-1.
``specwatch_gpu_memory_used_bytes``                 gauge    bytes    GPU labels                          Framebuffer memory in use (``nvmlDeviceGetMemoryInfo`` v1 ``.used``).
``specwatch_gpu_memory_total_bytes``                gauge    bytes    GPU labels                          Framebuffer memory installed (``.total``).
``specwatch_gpu_power_watts``                       gauge    watts    GPU labels                          Board power draw (``nvmlDeviceGetPowerUsage`` mW / 1000).
``specwatch_gpu_energy_joules_total``               counter  joules   GPU labels                          Energy since the driver loaded (``nvmlDeviceGetTotalEnergyConsumption`` mJ / 1000);
                                                                                                          resets on driver reload.
``specwatch_gpu_temperature_celsius``               gauge    celsius  GPU labels                          GPU core temperature (``NVML_TEMPERATURE_GPU``).
``specwatch_gpu_sm_clock_hertz``                    gauge    hertz    GPU labels                          Current SM clock (MHz * 1e6).
``specwatch_gpu_memory_clock_hertz``                gauge    hertz    GPU labels                          Current memory clock (MHz * 1e6).
``specwatch_gpu_clock_event_reason_active``         gauge    1/0      GPU labels, ``reason``              1 while that reason holds clocks down; reasons named like dcgm: ``gpu_idle``,
                                                                                                          ``applications_clocks_setting``, ``sw_power_cap``, ``hw_slowdown``,
                                                                                                          ``sync_boost``, ``sw_thermal_slowdown``, ``hw_thermal_slowdown``,
                                                                                                          ``hw_power_brake_slowdown``, ``display_clock_setting``.
``specwatch_gpu_ecc_errors_total``                  counter  errors   GPU labels, ``type``                VOLATILE ECC error count (since the driver loaded), ``type`` = ``corrected`` |
                                                                                                          ``uncorrected``; absent when ECC is off.
``specwatch_gpu_pcie_replays_total``                counter  replays  GPU labels                          PCIe link replays (``nvmlDeviceGetPcieReplayCounter``).
``specwatch_gpu_sglang_process_memory_bytes``       gauge    bytes    GPU labels                          Sum of ``usedGpuMemory`` of compute processes whose pid is in ``process_pids()``;
                                                                                                          absent without ``process_pids``. Pids are the host's: run in its pid namespace.
``specwatch_gpu_xid_errors_total``                  counter  events   GPU labels, ``xid``                 XID critical-error events seen since specwatch started (NVML event set).
``specwatch_gpu_xid_last_timestamp_seconds``        gauge    seconds  GPU labels, ``xid``                 Unix time of the last such event; lets a rule fire on the first XID
                                                                                                          (``time() - ... < 600``), which a rate() over a new series misses.
==================================================  =======  =======  ==================================  ===========================================================================
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from specwatch.core.events import GpuSample, GpuState

log = logging.getLogger("specwatch.sources.nvml")

GPU_LABELS = ("gpu", "uuid", "model_name", "pci_bus_id")

# (name as exposed, type, help, labels after the GPU labels or, for self metrics, all labels)
_SELF_FAMILIES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("specwatch_gpu_up", "gauge", "1 when NVML initialised and the GPU count was read in the last cycle, else 0.", ()),
    ("specwatch_gpu_count", "gauge", "Number of GPUs NVML reports.", ()),
    ("specwatch_gpu_device_up", "gauge", "1 when the GPU was read in the last cycle, 0 when it failed.", ("gpu",)),
    (
        "specwatch_gpu_driver_info",
        "gauge",
        "NVIDIA driver, CUDA driver API and NVML versions (value always 1).",
        ("driver_version", "cuda_driver_version", "nvml_version"),
    ),
    (
        "specwatch_gpu_last_sample_timestamp_seconds",
        "gauge",
        "Unix time in seconds of the last sampling cycle that ended with specwatch_gpu_up 1.",
        (),
    ),
    ("specwatch_gpu_sample_duration_seconds", "gauge", "Seconds the last sampling cycle took.", ()),
    ("specwatch_gpu_collection_errors_total", "counter", "NVML errors met while collecting, by error name.", ("error",)),
)
_GPU_FAMILIES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("specwatch_gpu_utilization_ratio", "gauge", "Fraction (0-1) of the last driver sample period a kernel ran.", ()),
    (
        "specwatch_gpu_memory_utilization_ratio",
        "gauge",
        "Fraction (0-1) of the last driver sample period device memory was read or written.",
        (),
    ),
    ("specwatch_gpu_memory_used_bytes", "gauge", "Framebuffer memory in use, bytes.", ()),
    ("specwatch_gpu_memory_total_bytes", "gauge", "Framebuffer memory installed, bytes.", ()),
    ("specwatch_gpu_power_watts", "gauge", "Board power draw, watts.", ()),
    ("specwatch_gpu_energy_joules_total", "counter", "Energy used since the driver loaded, joules.", ()),
    ("specwatch_gpu_temperature_celsius", "gauge", "GPU core temperature, degrees celsius.", ()),
    ("specwatch_gpu_sm_clock_hertz", "gauge", "Current SM clock, hertz.", ()),
    ("specwatch_gpu_memory_clock_hertz", "gauge", "Current memory clock, hertz.", ()),
    (
        "specwatch_gpu_clock_event_reason_active",
        "gauge",
        "1 while this reason holds the clocks down (NVML clocks event / throttle reasons), else 0.",
        ("reason",),
    ),
    (
        "specwatch_gpu_ecc_errors_total",
        "counter",
        "Volatile ECC errors (since the driver loaded) by type corrected|uncorrected.",
        ("type",),
    ),
    ("specwatch_gpu_pcie_replays_total", "counter", "PCIe link replays.", ()),
    (
        "specwatch_gpu_sglang_process_memory_bytes",
        "gauge",
        "GPU memory used by the watched SGLang processes, bytes (sum over their pids).",
        (),
    ),
)
_XID_FAMILIES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("specwatch_gpu_xid_errors_total", "counter", "XID critical-error events seen since specwatch started.", ("xid",)),
    (
        "specwatch_gpu_xid_last_timestamp_seconds",
        "gauge",
        "Unix time in seconds of the last XID event of this kind on this GPU.",
        ("xid",),
    ),
)
METRIC_NAMES: tuple[str, ...] = tuple(f[0] for f in _SELF_FAMILIES + _GPU_FAMILIES + _XID_FAMILIES)

# dcgm's reason names; suffixes of pynvml's nvmlClocksEventReason* / nvmlClocksThrottleReason* bits
_REASONS = (
    ("gpu_idle", "GpuIdle"),
    ("applications_clocks_setting", "ApplicationsClocksSetting"),
    ("sw_power_cap", "SwPowerCap"),
    ("hw_slowdown", "HwSlowdown"),
    ("sync_boost", "SyncBoost"),
    ("sw_thermal_slowdown", "SwThermalSlowdown"),
    ("hw_thermal_slowdown", "HwThermalSlowdown"),
    ("hw_power_brake_slowdown", "HwPowerBrakeSlowdown"),
    ("display_clock_setting", "DisplayClockSetting"),
)

# a series is omitted (not the GPU dropped) for these: the device simply lacks the capability
_SKIP_ERRORS = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION", "NVML_ERROR_FUNCTION_NOT_FOUND")
# pre-seeded at 0 so that increase() sees the first one
_SEEDED_ERRORS = ("gpu_is_lost", "unknown", "library_not_found", "driver_not_loaded")


def error_label(err: BaseException) -> str:
    """Snake-case name of an NVML error (``NVMLError_GpuIsLost`` -> ``gpu_is_lost``)."""
    name = type(err).__name__
    if name.startswith("NVMLError_"):
        return re.sub(r"(?<!^)(?=[A-Z])", "_", name[len("NVMLError_"):]).lower()
    if name == "NVMLError":
        return f"nvml_{getattr(err, 'value', 'unknown')}"
    if isinstance(err, ImportError):
        return "import_error"
    return "internal"


def _handle_key(handle: Any) -> Any:
    """Identity of a device handle: the C pointer for real ctypes handles.

    NVML event data carries a fresh ctypes pointer object, so identity must be the address.
    """
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return handle  # not a ctypes pointer (e.g. the test fake): it is its own key


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _cuda_version(value: int) -> str:
    # NVML encodes CUDA 12.8 as 12080
    return f"{value // 1000}.{(value % 1000) // 10}"


@dataclass
class _Gpu:
    index: int
    handle: Any
    labels: tuple[str, str, str, str]

    @property
    def uuid(self) -> str:
        return self.labels[1]


@dataclass
class _Session:
    """One nvmlInit .. nvmlShutdown span."""

    nvml: Any
    count: int
    skip_codes: frozenset[int]
    reasons: tuple[tuple[str, int], ...]
    gpus: dict[int, _Gpu] = field(default_factory=dict)
    failed: set[int] = field(default_factory=set)
    driver: tuple[str, str, str] | None = None
    by_key: dict[Any, tuple[str, str, str, str]] = field(default_factory=dict)
    event_set: Any = None
    xid_thread: threading.Thread | None = None
    xid_stop: threading.Event = field(default_factory=threading.Event)
    xid_failed: bool = False
    reinit_at: float | None = None  # monotonic time; set once something failed


class GpuSampler:
    """NVML → one ``GpuSample`` per cycle; see the module docstring for the failure behaviour.

    ``nvml``: the ``pynvml`` module (default: imported lazily on first init) or a fake with
    the same functions. ``emit``: called with each ``GpuSample`` on the sampling thread, after
    the cycle (an exception it raises is logged, the sampler goes on); ``last`` holds the
    latest either way. ``interval``: seconds between samples. ``process_pids``: returns the
    pids (host namespace) of the SGLang processes whose GPU memory is summed.
    ``init_retry_min`` / ``init_retry_max``: seconds of the doubling backoff between failed
    inits and between repeated re-inits after device failures. ``xid_wait_ms``: milliseconds
    one ``nvmlEventSetWait_v2`` blocks; it bounds how long shutdown waits for the XID thread.
    """

    def __init__(
        self,
        nvml: Any = None,
        *,
        emit: Callable[[GpuSample], None] | None = None,
        interval: float = 5.0,
        process_pids: Callable[[], set[int]] | None = None,
        init_retry_min: float = 30.0,
        init_retry_max: float = 600.0,
        xid_wait_ms: int = 1000,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval}")
        self._nvml_arg = nvml
        self._emit = emit
        self._interval = float(interval)
        self._process_pids = process_pids
        self._retry_min = float(init_retry_min)
        self._retry_max = float(init_retry_max)
        self._xid_wait_ms = int(xid_wait_ms)

        self._lock = threading.Lock()  # errors, xid counters: written by two threads, read by counters()
        self._sample_lock = threading.Lock()  # one cycle (or teardown) at a time
        self._errors: dict[str, int] = {e: 0 for e in _SEEDED_ERRORS}
        self._xid_counts: dict[tuple[str, ...], int] = {}
        self._xid_last: dict[tuple[str, ...], float] = {}
        self.last: GpuSample | None = None  # the latest cycle's event

        self._session: _Session | None = None
        self._next_init = 0.0  # monotonic
        self._init_failures = 0
        self._reinits = 0  # consecutive re-inits caused by device failures
        self._unavailable_warned = False
        self._failing_gpus: set[int] = set()
        self._unsupported: set[tuple[str, str]] = set()  # (uuid, field)
        self._pids_warned = False
        self.last_ok: float | None = None  # wall time of the last cycle with NVML up
        self.unavailable: str | None = None  # why NVML did not initialise (`error_label`); None once it did
        self._cycles = 0

        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ public API

    @property
    def cycles(self) -> int:
        """Number of sampling cycles completed so far."""
        return self._cycles

    @property
    def xid_listening(self) -> bool:
        """True while the XID event thread is running."""
        s = self._session
        return bool(s and s.xid_thread and s.xid_thread.is_alive())

    def start(self) -> None:
        """Start the sampling thread (samples at once, then every ``interval`` seconds)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="specwatch-nvml-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop sampling and shut NVML down; wait at most ``timeout`` seconds.

        Returns False when a thread is still stuck in an NVML call (it is a daemon thread).
        """
        deadline = time.monotonic() + timeout
        self._stop.set()
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))
            if self._thread.is_alive():
                log.warning("NVML sampler did not stop within %.1f s (stuck in an NVML call?)", timeout)
                return False
        if not self._sample_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return False
        try:
            if self._session is not None:
                ok = self._teardown(self._session)
                self._session = None
                return ok
        finally:
            self._sample_lock.release()
        return True

    def sample_once(self) -> bool:
        """Run one sampling cycle now, publish its ``GpuSample`` (``last``, ``emit``); returns up."""
        with self._sample_lock:
            t0 = time.perf_counter()
            try:
                up, count, driver, states = self._cycle()
            except Exception:  # a bug here must not kill the sampler thread
                log.exception("NVML sampling cycle failed")
                self._count_error("internal")
                up, count, driver, states = False, None, None, []
            duration = time.perf_counter() - t0
            now = time.time()
            if up:
                self.last_ok = now
            sample = self.last = GpuSample(timestamp=now, up=up, count=count, gpus=self._with_xids(states) if up else (),
                                           driver=driver, duration_seconds=duration)
            self._cycles += 1
        if self._emit is not None:
            try:
                self._emit(sample)
            except Exception:  # the consumer's bug: keep sampling
                log.exception("handing the GPU sample on failed")
        return up

    def counters(self) -> tuple[dict[str, int], dict[tuple[str, ...], int], dict[tuple[str, ...], float]]:
        """Copies of (errors by name, XID counts, XID last times), live (not per cycle).

        XID keys are GPU labels (gpu, uuid, model_name, pci_bus_id) + (xid,); times in seconds
        since the epoch."""
        with self._lock:
            return dict(self._errors), dict(self._xid_counts), dict(self._xid_last)

    def _with_xids(self, states: list[GpuState]) -> tuple[GpuState, ...]:
        """The cycle's GPUs with the XID counts so far; XIDs of a GPU not listed now get an entry."""
        _, counts, last = self.counters()
        by_index: dict[str, dict[str, tuple[float, float]]] = {}
        labels_of: dict[str, tuple[str, ...]] = {}
        for key, n in counts.items():
            by_index.setdefault(key[0], {})[key[-1]] = (float(n), last.get(key, 0.0))
            labels_of[key[0]] = key[:4]
        out = [dataclasses.replace(g, xids=by_index.pop(g.index, {})) for g in states]
        for index, xids in by_index.items():
            _, uuid, model, pci = labels_of[index]
            out.append(GpuState(index=index, uuid=uuid, model_name=model, pci_bus_id=pci, listed=False, xids=xids))
        out.sort(key=lambda g: int(g.index) if g.index.isdigit() else 1 << 30)
        return tuple(out)

    # ------------------------------------------------------------------ sampling

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample_once()
            except Exception:  # sample_once guards itself; this keeps the thread alive regardless
                log.exception("NVML sampler error")
            self._stop.wait(max(0.0, self._interval - (time.monotonic() - started)))

    def _backoff(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based): min, 2*min, ... capped at max."""
        return min(self._retry_max, self._retry_min * (2**attempt))

    def _cycle(self) -> tuple[bool, int | None, tuple[str, str, str] | None, list[GpuState]]:
        """One cycle: (up, count, driver, a GpuState per listed GPU, without XIDs)."""
        now = time.monotonic()
        s = self._session
        if s is not None and s.reinit_at is not None and now >= s.reinit_at:
            log.info("shutting NVML down to re-initialise it")
            self._teardown(s)
            s = self._session = None
        if s is None:
            if now < self._next_init:
                return False, None, None, []
            s = self._open_session()
            if s is None:
                return False, None, None, []
            self._session = s

        pids = self._read_pids()
        states: list[GpuState] = []
        for index in range(s.count):
            gpu = s.gpus.get(index)
            # (index, uuid, model_name, pci_bus_id): GpuState's first fields, "" when not listed
            ident = gpu.labels if gpu else (str(index), "", "", "")
            if gpu is None or index in s.failed:
                states.append(GpuState(*ident, up=False))
                continue
            try:
                readings = self._read_gpu(s, gpu, pids)
            except Exception as err:  # lost GPU, unknown error, or a bug: drop this GPU only
                self._gpu_failed(s, index, err)
                states.append(GpuState(*ident, up=False))
                continue
            states.append(GpuState(*ident, **readings))
            if index in self._failing_gpus:
                self._failing_gpus.discard(index)
                log.info("GPU %d (%s) is being read again", index, gpu.uuid)

        if s.failed or s.xid_failed:
            if s.reinit_at is None:
                # first re-init right away (next cycle); a GPU that stays lost backs off
                delay = 0.0 if self._reinits == 0 else self._backoff(self._reinits - 1)
                s.reinit_at = now + delay
                self._reinits += 1
        else:
            self._reinits = 0
        return True, s.count, s.driver, states

    def _open_session(self) -> _Session | None:
        nvml = self._nvml_arg
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError as err:
                self._init_failed("import_error", err)
                return None
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as err:
            self._init_failed(error_label(err), err)
            return None
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as err:
            self._safe_shutdown(nvml)
            self._init_failed(error_label(err), err)
            return None

        reasons = []
        for label, suffix in _REASONS:
            bit = getattr(nvml, "nvmlClocksEventReason" + suffix, None)
            if bit is None:  # nvidia-ml-py older than the clocks-event rename
                bit = getattr(nvml, "nvmlClocksThrottleReason" + suffix)
            reasons.append((label, int(bit)))
        s = _Session(
            nvml=nvml,
            count=count,
            skip_codes=frozenset(getattr(nvml, n) for n in _SKIP_ERRORS),
            reasons=tuple(reasons),
        )
        s.driver = (
            self._system_string(nvml, "nvmlSystemGetDriverVersion"),
            self._system_string(nvml, "nvmlSystemGetCudaDriverVersion", _cuda_version),
            self._system_string(nvml, "nvmlSystemGetNVMLVersion"),
        )
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                pci = nvml.nvmlDeviceGetPciInfo(handle)
                labels = (
                    str(index),
                    _text(nvml.nvmlDeviceGetUUID(handle)),
                    _text(nvml.nvmlDeviceGetName(handle)),
                    _text(pci.busId),
                )
            except Exception as err:
                self._gpu_failed(s, index, err)
                continue
            s.gpus[index] = _Gpu(index, handle, labels)
            s.by_key[_handle_key(handle)] = labels
        self._start_xid(s)

        self._init_failures = 0
        self._next_init = 0.0
        self.unavailable = None
        if self._unavailable_warned:
            log.warning("NVML is available again")
            self._unavailable_warned = False
        log.info(
            "NVML initialised: %d GPU(s), driver %s, CUDA %s, XID events %s",
            count,
            s.driver[0],
            s.driver[1],
            "on" if s.xid_thread else "off",
        )
        return s

    def _system_string(self, nvml: Any, fn: str, fmt: Callable[[Any], str] = _text) -> str:
        try:
            return fmt(getattr(nvml, fn)())
        except nvml.NVMLError as err:
            self._count_error(error_label(err))
            return "unknown"

    def _init_failed(self, label: str, err: BaseException) -> None:
        self._count_error(label)
        self.unavailable = label
        delay = self._backoff(self._init_failures)
        self._init_failures += 1
        self._next_init = time.monotonic() + delay
        if not self._unavailable_warned:
            self._unavailable_warned = True
            log.warning(
                "NVML unavailable (%s: %s): GPU metrics off (specwatch_gpu_up 0); retrying with backoff %.0f-%.0f s",
                label,
                err,
                self._retry_min,
                self._retry_max,
            )

    def _gpu_failed(self, s: _Session, index: int, err: BaseException) -> None:
        s.failed.add(index)
        label = error_label(err)
        self._count_error(label)
        if index not in self._failing_gpus:
            self._failing_gpus.add(index)
            if label == "internal":
                log.error("GPU %d dropped after an unexpected error", index, exc_info=err)
            else:
                log.warning("GPU %d dropped from metrics (%s: %s); NVML will be re-initialised", index, label, err)

    def _read_pids(self) -> set[int] | None:
        if self._process_pids is None:
            return None
        try:
            pids = set(self._process_pids())
        except Exception as err:
            self._count_error("process_pids")
            if not self._pids_warned:
                self._pids_warned = True
                log.warning("process_pids() failed (%s); SGLang GPU memory omitted", err)
            return None
        self._pids_warned = False
        return pids

    def _read(self, s: _Session, gpu: _Gpu, what: str, fn_names: tuple[str, ...], *args: Any) -> Any:
        """One NVML device call; None when the device lacks the capability.

        ``fn_names`` are tried in order: a later one is the older name of the same call,
        used when the binding or the driver lacks the newer one.
        """
        key = (gpu.uuid, what)
        if key in self._unsupported:
            return None
        reason = "function_not_found"
        for fn_name in fn_names:
            fn = getattr(s.nvml, fn_name, None)
            if fn is None:
                continue
            try:
                return fn(gpu.handle, *args)
            except s.nvml.NVMLError as err:
                if err.value == s.nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    continue
                if err.value in s.skip_codes:
                    reason = error_label(err)
                    break
                raise
        self._unsupported.add(key)
        self._count_error(reason)
        log.info("GPU %d (%s): %s unavailable (%s); series omitted", gpu.index, gpu.uuid, what, reason)
        return None

    def _read_gpu(self, s: _Session, gpu: _Gpu, pids: set[int] | None) -> dict[str, Any]:
        """GpuState fields read from one GPU (base units); a capability it lacks is left out."""
        nvml = s.nvml
        out: dict[str, Any] = {}

        def read(what: str, *args: Any, fns: tuple[str, ...] = ()) -> Any:
            return self._read(s, gpu, what, fns, *args)

        util = read("utilization", fns=("nvmlDeviceGetUtilizationRates",))
        if util is not None:
            out["utilization_ratio"] = util.gpu / 100.0
            out["memory_utilization_ratio"] = util.memory / 100.0
        mem = read("memory", fns=("nvmlDeviceGetMemoryInfo",))
        if mem is not None:
            out["memory_used_bytes"] = float(mem.used)
            out["memory_total_bytes"] = float(mem.total)
        power_mw = read("power", fns=("nvmlDeviceGetPowerUsage",))
        if power_mw is not None:
            out["power_watts"] = power_mw / 1000.0
        energy_mj = read("energy", fns=("nvmlDeviceGetTotalEnergyConsumption",))
        if energy_mj is not None:
            out["energy_joules"] = energy_mj / 1000.0
        temp = read("temperature", nvml.NVML_TEMPERATURE_GPU, fns=("nvmlDeviceGetTemperature",))
        if temp is not None:
            out["temperature_celsius"] = float(temp)
        sm_mhz = read("sm_clock", nvml.NVML_CLOCK_SM, fns=("nvmlDeviceGetClockInfo",))
        if sm_mhz is not None:
            out["sm_clock_hertz"] = sm_mhz * 1e6
        mem_mhz = read("memory_clock", nvml.NVML_CLOCK_MEM, fns=("nvmlDeviceGetClockInfo",))
        if mem_mhz is not None:
            out["memory_clock_hertz"] = mem_mhz * 1e6
        mask = read("clock_event_reasons",
                    fns=("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"))
        if mask is not None:
            out["reasons"] = frozenset(reason for reason, bit in s.reasons if mask & bit)
            out["reasons_read"] = True
        ecc = {}
        for kind, code in (
            ("corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            n = read(f"ecc_{kind}", code, nvml.NVML_VOLATILE_ECC, fns=("nvmlDeviceGetTotalEccErrors",))
            if n is not None:
                ecc[kind] = float(n)
        out["ecc"] = ecc
        replays = read("pcie_replays", fns=("nvmlDeviceGetPcieReplayCounter",))
        if replays is not None:
            out["pcie_replays"] = float(replays)
        if pids is not None:
            procs = read("processes", fns=("nvmlDeviceGetComputeRunningProcesses",))
            if procs is not None:
                # usedGpuMemory is None where the driver cannot tell (e.g. Windows WDDM)
                out["sglang_memory_bytes"] = float(sum(p.usedGpuMemory or 0 for p in procs if p.pid in pids))
        return out

    # ------------------------------------------------------------------ XID events

    def _start_xid(self, s: _Session) -> None:
        nvml = s.nvml
        try:
            s.event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as err:
            self._count_error(error_label(err))
            log.warning("cannot create an NVML event set (%s); XID errors not counted", err)
            return
        registered = 0
        for gpu in s.gpus.values():
            key = (gpu.uuid, "xid_events")
            if key in self._unsupported:
                continue
            try:
                nvml.nvmlDeviceRegisterEvents(gpu.handle, nvml.nvmlEventTypeXidCriticalError, s.event_set)
                registered += 1
            except nvml.NVMLError as err:
                label = error_label(err)
                self._count_error(label)
                if err.value in s.skip_codes:
                    self._unsupported.add(key)
                log.warning("GPU %d (%s): XID events not available (%s)", gpu.index, gpu.uuid, label)
        if not registered:
            self._free_event_set(s)
            return
        s.xid_thread = threading.Thread(
            target=self._xid_loop, args=(s,), name="specwatch-nvml-xid", daemon=True
        )
        s.xid_thread.start()

    def _xid_loop(self, s: _Session) -> None:
        nvml = s.nvml
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        while not s.xid_stop.is_set():
            try:
                data = wait(s.event_set, self._xid_wait_ms)
            except nvml.NVMLError as err:
                if err.value == nvml.NVML_ERROR_TIMEOUT:
                    continue
                if s.xid_stop.is_set():
                    return
                # the set or the driver is broken: stop listening; the sampler re-initialises
                self._count_error(error_label(err))
                log.warning("XID event wait failed (%s); NVML will be re-initialised", err)
                s.xid_failed = True
                return
            except Exception:
                self._count_error("internal")
                log.exception("XID event thread failed")
                s.xid_failed = True
                return
            if not int(data.eventType) & int(nvml.nvmlEventTypeXidCriticalError):
                continue
            self._record_xid(s, data)

    def _record_xid(self, s: _Session, data: Any) -> None:
        labels = s.by_key.get(_handle_key(data.device))
        if labels is None:
            try:
                uuid = _text(s.nvml.nvmlDeviceGetUUID(data.device))
            except Exception:
                uuid = "unknown"
            labels = next((g.labels for g in s.gpus.values() if g.uuid == uuid), ("unknown", uuid, "", ""))
        key = labels + (str(int(data.eventData)),)
        with self._lock:
            first = key not in self._xid_counts
            self._xid_counts[key] = self._xid_counts.get(key, 0) + 1
            self._xid_last[key] = time.time()
        # an XID storm repeats the same code thousands of times: warn on the first only
        (log.warning if first else log.debug)("XID %s on GPU %s (%s)", key[-1], labels[0], labels[1])

    def _free_event_set(self, s: _Session) -> None:
        if s.event_set is None:
            return
        try:
            s.nvml.nvmlEventSetFree(s.event_set)
        except s.nvml.NVMLError:
            pass  # tearing down anyway
        s.event_set = None

    # ------------------------------------------------------------------ teardown / helpers

    def _teardown(self, s: _Session) -> bool:
        """Stop the XID thread, free the event set, nvmlShutdown. False if the thread is stuck."""
        s.xid_stop.set()
        if s.xid_thread is not None:
            s.xid_thread.join(2 * self._xid_wait_ms / 1000.0 + 1.0)
            if s.xid_thread.is_alive():
                # freeing the set or shutting down under a blocked wait is undefined: leak instead
                log.warning("XID thread stuck in nvmlEventSetWait; leaving NVML initialised")
                return False
        self._free_event_set(s)
        self._safe_shutdown(s.nvml)
        return True

    def _safe_shutdown(self, nvml: Any) -> None:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as err:
            log.debug("nvmlShutdown failed: %s", err)

    def _count_error(self, label: str) -> None:
        with self._lock:
            self._errors[label] = self._errors.get(label, 0) + 1


def _family(spec: tuple[str, str, str, tuple[str, ...]],
            prefix: tuple[str, ...]) -> CounterMetricFamily | GaugeMetricFamily:
    name, kind, help_text, labels = spec
    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
    return cls(name, help_text, labels=list(prefix + labels))


# GpuState field -> family, for the plain per-GPU values
_GPU_FIELDS = {
    "specwatch_gpu_utilization_ratio": "utilization_ratio",
    "specwatch_gpu_memory_utilization_ratio": "memory_utilization_ratio",
    "specwatch_gpu_memory_used_bytes": "memory_used_bytes",
    "specwatch_gpu_memory_total_bytes": "memory_total_bytes",
    "specwatch_gpu_power_watts": "power_watts",
    "specwatch_gpu_energy_joules_total": "energy_joules",
    "specwatch_gpu_temperature_celsius": "temperature_celsius",
    "specwatch_gpu_sm_clock_hertz": "sm_clock_hertz",
    "specwatch_gpu_memory_clock_hertz": "memory_clock_hertz",
    "specwatch_gpu_pcie_replays_total": "pcie_replays",
    "specwatch_gpu_sglang_process_memory_bytes": "sglang_memory_bytes",
}


class GpuCollector(Collector):
    """Renders a GpuSampler's latest ``GpuSample`` and its live event counters (errors, XIDs)
    as the families of the module docstring; never calls NVML."""

    def __init__(self, sampler: GpuSampler):
        self.sampler = sampler

    def describe(self) -> Iterator[Metric]:
        """Every family this collector can yield, without samples (for registry name checks)."""
        for spec in _SELF_FAMILIES + _GPU_FAMILIES + _XID_FAMILIES:
            yield _family(spec, ())

    def collect(self) -> Iterator[Metric]:
        sample = self.sampler.last or GpuSample(timestamp=0.0, up=False, count=None)
        errors, xid_counts, xid_last = self.sampler.counters()
        up = sample.up
        listed = [g for g in sample.gpus if g.listed]

        for spec in _SELF_FAMILIES:
            name = spec[0]
            fam = _family(spec, ())
            if name == "specwatch_gpu_up":
                fam.add_metric([], 1.0 if up else 0.0)
            elif name == "specwatch_gpu_count" and up and sample.count is not None:
                fam.add_metric([], float(sample.count))
            elif name == "specwatch_gpu_device_up" and up:
                for g in listed:
                    fam.add_metric([g.index], 1.0 if g.up else 0.0)
            elif name == "specwatch_gpu_driver_info" and up and sample.driver is not None:
                fam.add_metric(list(sample.driver), 1.0)
            elif name == "specwatch_gpu_last_sample_timestamp_seconds" and self.sampler.last_ok is not None:
                fam.add_metric([], self.sampler.last_ok)
            elif name == "specwatch_gpu_sample_duration_seconds" and sample.duration_seconds is not None:
                fam.add_metric([], sample.duration_seconds)
            elif name == "specwatch_gpu_collection_errors_total":
                for err, n in sorted(errors.items()):
                    fam.add_metric([err], float(n))
            yield fam

        read = [g for g in listed if g.up]
        for spec in _GPU_FAMILIES:
            name = spec[0]
            fam = _family(spec, GPU_LABELS)
            for g in read:
                labels = [g.index, g.uuid, g.model_name, g.pci_bus_id]
                if name == "specwatch_gpu_clock_event_reason_active":
                    if g.reasons_read:
                        for reason, _ in _REASONS:
                            fam.add_metric(labels + [reason], 1.0 if reason in g.reasons else 0.0)
                elif name == "specwatch_gpu_ecc_errors_total":
                    for kind, count in g.ecc.items():
                        fam.add_metric(labels + [kind], count)
                elif (value := getattr(g, _GPU_FIELDS[name])) is not None:
                    fam.add_metric(labels, value)
            yield fam

        counts_fam = _family(_XID_FAMILIES[0], GPU_LABELS)
        for key, n in sorted(xid_counts.items()):
            counts_fam.add_metric(list(key), float(n))
        yield counts_fam
        last_fam = _family(_XID_FAMILIES[1], GPU_LABELS)
        for key, ts in sorted(xid_last.items()):
            last_fam.add_metric(list(key), ts)
        yield last_fam
