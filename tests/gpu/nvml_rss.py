"""Which NVML call makes the agent's process load libcuda and grow? Calls, in the collector's order,
each NVML function the nvml collector uses on GPU 0 and prints RSS (MB) and whether libcuda is
mapped after each. Usage (GPU machine): python3 tests/gpu/nvml_rss.py [INIT_FLAGS]"""

from __future__ import annotations

from collections.abc import Callable

import pynvml as n


def state() -> str:
    rss = int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024
    cuda = "libcuda" in open("/proc/self/maps").read()
    return f"rss {rss:6.1f} MB  libcuda {'mapped' if cuda else '-'}"


def step(name: str, fn: Callable[[], object]) -> None:
    try:
        fn()
        ok = "ok"
    except Exception as exc:  # a probe: print what happened
        ok = f"{type(exc).__name__}: {exc}"[:60]
    print(f"{name:42s} {state()}  {ok}", flush=True)


import sys  # noqa: E402

print(f"{'start':42s} {state()}")
flags = int(sys.argv[1]) if len(sys.argv) > 1 else None  # nvmlInitWithFlags (2: NVML_INIT_FLAG_NO_ATTACH)
step(f"nvmlInit flags={flags}", n.nvmlInit if flags is None else lambda: n.nvmlInitWithFlags(flags))
h = n.nvmlDeviceGetHandleByIndex(0)
step("GetName/UUID/Count", lambda: (n.nvmlDeviceGetName(h), n.nvmlDeviceGetUUID(h),
                                     n.nvmlDeviceGetCount()))
step("versions", lambda: (n.nvmlSystemGetDriverVersion(), n.nvmlSystemGetNVMLVersion()))
step("GetUtilizationRates", lambda: n.nvmlDeviceGetUtilizationRates(h))
step("GetMemoryInfo", lambda: n.nvmlDeviceGetMemoryInfo(h))
step("GetClockInfo", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM))
step("GetPowerUsage/limits/energy", lambda: (n.nvmlDeviceGetPowerUsage(h),
                                              n.nvmlDeviceGetEnforcedPowerLimit(h),
                                              n.nvmlDeviceGetPowerManagementLimit(h),
                                              n.nvmlDeviceGetTotalEnergyConsumption(h)))
step("GetTemperature", lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))
step("GetCurrentClocksEventReasons", lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h))
step("GetTotalEccErrors", lambda: n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                               n.NVML_VOLATILE_ECC))
step("GetComputeRunningProcesses", lambda: n.nvmlDeviceGetComputeRunningProcesses(h))
es = n.nvmlEventSetCreate()
step("EventSetCreate+RegisterEvents(Xid)",
     lambda: n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, es))
step("EventSetWait(1 ms)", lambda: n.nvmlEventSetWait_v2(es, 1))
step("GpmQueryDeviceSupport", lambda: n.nvmlGpmQueryDeviceSupport(h))
s1, s2 = n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()
step("GpmSampleAlloc x2", lambda: None)
step("GpmSampleGet", lambda: n.nvmlGpmSampleGet(h, s1))
import time  # noqa: E402

time.sleep(0.2)
step("GpmSampleGet (2nd)", lambda: n.nvmlGpmSampleGet(h, s2))
for i in range(50):
    n.nvmlGpmSampleGet(h, s1 if i % 2 else s2)
step("50 more GpmSampleGet", lambda: None)
