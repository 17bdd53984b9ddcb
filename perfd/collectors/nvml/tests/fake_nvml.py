"""A small stand-in for the ``pynvml`` module, serving per-device values from dicts.

It is injected into the wrapper (``Nvml(module=FakePynvml(...))``) instead of monkeypatching pynvml
piecemeal. It can raise a chosen NVML error for chosen functions (``fail``), lack chosen functions
(``missing``), and counts every call that reached it (``calls``) — which is how the tests prove a
slow function was not called on the fast path.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    value = 999

    def __str__(self) -> str:
        return type(self).__name__


def _err(name: str, code: int) -> type[NVMLError]:
    return type(f"NVMLError_{name}", (NVMLError,), {"value": code})


NVMLError_InvalidArgument = _err("InvalidArgument", 2)
NVMLError_NotSupported = _err("NotSupported", 3)
NVMLError_NoPermission = _err("NoPermission", 4)
NVMLError_DriverNotLoaded = _err("DriverNotLoaded", 9)
NVMLError_Timeout = _err("Timeout", 10)
NVMLError_LibraryNotFound = _err("LibraryNotFound", 12)
NVMLError_FunctionNotFound = _err("FunctionNotFound", 13)
NVMLError_GpuIsLost = _err("GpuIsLost", 15)
NVMLError_Unknown = _err("Unknown", 999)


@dataclass
class FakeDevice:
    index: int = 0
    uuid: str = "GPU-00000000-fake"
    name: str = "NVIDIA H200"
    util_gpu: int = 55
    util_mem: int = 20
    mem_total: int = 150_000 * 2**20
    mem_used: int = 40_000 * 2**20
    power_mw: int = 350_500
    temp_c: int = 41
    sm_mhz: int = 1980
    mem_mhz: int = 3201
    throttle: int = 0
    energy_mj: int = 123_456_789
    power_limit_mw: int = 700_000
    ecc_corrected: int = 2
    ecc_uncorrected: int = 0
    procs: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes)
    gpm_supported: bool = True
    gpm: dict[int, float] = field(default_factory=dict)  # metric id -> value
    gpm_ret: dict[int, int] = field(default_factory=dict)  # metric id -> nvmlReturn
    xids: list[int] = field(default_factory=list)  # pending XID events


class FakeGpmMetricsGet:
    """Shaped like pynvml.c_nvmlGpmMetricsGet_t."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(98)]


class FakePynvml:
    """``devices`` served by index; ``fail``: function -> error class raised on every call;
    ``missing``: functions this "pynvml version" lacks; ``init_error``: raised by nvmlInit."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlMemory_v2 = 0x02000028
    nvmlEventTypeXidCriticalError = 0x8
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL = 2
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
    c_nvmlGpmMetricsGet_t = FakeGpmMetricsGet
    NVMLError = NVMLError

    def __init__(self, devices: list[FakeDevice] | None = None, *,
                 fail: dict[str, type[Exception]] | None = None, missing: set[str] | None = None,
                 init_error: type[Exception] | None = None) -> None:
        self.devices = devices if devices is not None else [FakeDevice()]
        self.fail = dict(fail or {})
        self.missing = set(missing or ())
        self.init_error = init_error
        self.calls: Counter[str] = Counter()
        self._gpm_seq = 0

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and not name.startswith(("nvmlMemory", "nvmlEventType")):
            if name in object.__getattribute__(self, "missing"):
                raise AttributeError(name)
            impl = object.__getattribute__(self, name)
            fail = object.__getattribute__(self, "fail")
            calls = object.__getattribute__(self, "calls")

            def counted(*args: Any, **kwargs: Any) -> Any:
                calls[name] += 1
                if name in fail:
                    raise fail[name]()
                return impl(*args, **kwargs)

            return counted
        return object.__getattribute__(self, name)

    def _dev(self, handle: Any) -> FakeDevice:
        return self.devices[int(handle.index)]

    # --- library ---
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error()

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.159.fake"

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "13.580.fake"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if index >= len(self.devices):
            raise NVMLError_InvalidArgument()
        return SimpleNamespace(index=index)

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return self._dev(h).uuid

    def nvmlDeviceGetName(self, h: Any) -> bytes:
        return self._dev(h).name.encode()  # old pynvml returned bytes

    def nvmlDeviceGetPciInfo_v3(self, h: Any) -> Any:
        return SimpleNamespace(busId=f"00000000:{0x18 + 0x10 * int(h.index):02X}:00.0".encode())

    # --- fast readings ---
    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        d = self._dev(h)
        return SimpleNamespace(gpu=d.util_gpu, memory=d.util_mem)

    def nvmlDeviceGetMemoryInfo(self, h: Any, version: int | None = None) -> Any:
        d = self._dev(h)
        return SimpleNamespace(total=d.mem_total, used=d.mem_used, free=d.mem_total - d.mem_used)

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return self._dev(h).power_mw

    def nvmlDeviceGetTemperatureV(self, h: Any, sensor: int) -> int:
        return self._dev(h).temp_c

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        return self._dev(h).temp_c

    def nvmlDeviceGetClockInfo(self, h: Any, kind: int) -> int:
        d = self._dev(h)
        return d.sm_mhz if kind == self.NVML_CLOCK_SM else d.mem_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return self._dev(h).throttle

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: Any) -> int:
        return self._dev(h).throttle

    def _procs(self, h: Any) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self._dev(h).procs]

    def nvmlDeviceGetComputeRunningProcesses_v3(self, h: Any) -> list[Any]:
        return self._procs(h)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h: Any) -> list[Any]:
        return self._procs(h)

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        return self._procs(h)

    # --- slow readings ---
    def nvmlDeviceGetTotalEnergyConsumption(self, h: Any) -> int:
        return self._dev(h).energy_mj

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Any) -> int:
        return self._dev(h).power_limit_mw

    def nvmlDeviceGetPowerManagementLimit(self, h: Any) -> int:
        return self._dev(h).power_limit_mw

    def nvmlDeviceGetTotalEccErrors(self, h: Any, err_type: int, counter: int) -> int:
        d = self._dev(h)
        return d.ecc_corrected if err_type == self.NVML_MEMORY_ERROR_TYPE_CORRECTED else d.ecc_uncorrected

    # never to be called on the sampling path (docs/design.md §3): present so a call would be counted
    def nvmlDeviceGetPcieThroughput(self, h: Any, counter: int) -> int:
        return 0

    def nvmlDeviceGetFieldValues(self, h: Any, ids: list[int]) -> list[Any]:
        return []

    # --- GPM ---
    def nvmlGpmQueryDeviceSupport(self, h: Any) -> Any:
        return SimpleNamespace(version=1, isSupportedDevice=int(self._dev(h).gpm_supported))

    def nvmlGpmSampleAlloc(self) -> Any:
        return SimpleNamespace(device=None, seq=-1, freed=False)

    def nvmlGpmSampleFree(self, s: Any) -> None:
        s.freed = True

    def nvmlGpmSampleGet(self, h: Any, s: Any) -> Any:
        if not self._dev(h).gpm_supported:
            raise NVMLError_NotSupported()
        self._gpm_seq += 1
        s.device, s.seq = int(h.index), self._gpm_seq
        return s

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        s1, s2 = mg.sample1, mg.sample2
        # The real library wants two samples of the same device, the second newer than the first.
        if mg.version != 1 or s1.freed or s2.freed or s1.device != s2.device or not s2.seq > s1.seq >= 0:
            raise NVMLError_InvalidArgument()
        d = self.devices[s1.device]
        for i in range(mg.numMetrics):
            m = mg.metrics[i]
            if m.metricId in d.gpm_ret:
                m.nvmlReturn, m.value = d.gpm_ret[m.metricId], 0.0
            elif m.metricId in d.gpm:
                m.nvmlReturn, m.value = 0, d.gpm[m.metricId]
            else:
                m.nvmlReturn, m.value = 3, 0.0
        return mg

    # --- events (XID) ---
    def nvmlEventSetCreate(self) -> Any:
        return SimpleNamespace(devices=[])

    def nvmlDeviceRegisterEvents(self, h: Any, types: int, es: Any) -> None:
        es.devices.append(int(h.index))

    def nvmlEventSetWait_v2(self, es: Any, timeout_ms: int) -> Any:
        for i in es.devices:
            if self.devices[i].xids:
                return SimpleNamespace(eventType=0x8, eventData=self.devices[i].xids.pop(0))
        raise NVMLError_Timeout()

    def nvmlEventSetFree(self, es: Any) -> None:
        pass
