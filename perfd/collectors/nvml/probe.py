"""Capability probe: once per device, at start, find out which NVML readings work and how.

Each reading lists its NVML function variants, newest first. The probe calls each variant once and
keeps the first that answers; a reading whose every variant fails with a permanent error (not
supported, missing from this driver or pynvml, no permission) is dropped, so the fast path never
calls it again. A variant that fails with a transient error at probe time (Timeout, Unknown, ...)
is kept: it may answer next time, and failures are counted there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from perfd.collectors.nvml.wrapper import PERMANENT_ERRORS, Nvml, as_text

# Header values from nvml.h, used when a (very old) pynvml lacks the constant.
_NVML_TEMPERATURE_GPU = 0
_NVML_CLOCK_SM = 1
_NVML_CLOCK_MEM = 2
_NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
_NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
_NVML_VOLATILE_ECC = 0
_NVML_EVENT_TYPE_XID = 0x8  # nvmlEventTypeXidCriticalError


# What perfd reads of the NVML structs it is given (pynvml's ctypes structures: their fields are
# attributes). A value without them is not what the reading is, and is left out.
@runtime_checkable
class Utilization(Protocol):
    """nvmlUtilization_t: percent of the last sample period."""

    gpu: int
    memory: int


@runtime_checkable
class MemoryInfo(Protocol):
    """nvmlMemory_t, nvmlMemory_v2_t: bytes."""

    used: int
    total: int


class ProcessInfo(Protocol):
    """nvmlProcessInfo_t (each entry of nvmlDeviceGetComputeRunningProcesses*)."""

    pid: int


def is_permanent(err: str | None) -> bool:
    # "Exception:TypeError" etc. means our call does not fit this pynvml's signature: permanent too.
    return err is not None and (err in PERMANENT_ERRORS or err.startswith("Exception:"))


@dataclass(frozen=True)
class Variant:
    fn: str
    args: tuple[object, ...] = ()  # after the device handle: pynvml constants
    kwargs: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class Reading:
    key: str
    variants: tuple[Variant, ...]
    slow: bool = False  # taken every slow_interval_s only (expensive or rarely changing)


def readings(nvml: Nvml) -> tuple[Reading, ...]:
    """The NVML readings the collector takes, with constants resolved against this pynvml."""
    c = nvml.const
    mem_v2 = c("nvmlMemory_v2", None)
    memory = [Variant("nvmlDeviceGetMemoryInfo", (), (("version", mem_v2),))] if mem_v2 is not None else []
    # v1 counts driver-reserved memory as used; v2 (what nvidia-smi shows since R510) does not.
    memory.append(Variant("nvmlDeviceGetMemoryInfo"))
    temp = c("NVML_TEMPERATURE_GPU", _NVML_TEMPERATURE_GPU)
    vol = c("NVML_VOLATILE_ECC", _NVML_VOLATILE_ECC)
    return (
        Reading("utilization", (Variant("nvmlDeviceGetUtilizationRates"),)),
        Reading("memory", tuple(memory)),
        Reading("power", (Variant("nvmlDeviceGetPowerUsage"),)),
        Reading("temperature", (Variant("nvmlDeviceGetTemperatureV", (temp,)),
                                Variant("nvmlDeviceGetTemperature", (temp,)))),
        Reading("sm_clock", (Variant("nvmlDeviceGetClockInfo", (c("NVML_CLOCK_SM", _NVML_CLOCK_SM),)),)),
        Reading("mem_clock", (Variant("nvmlDeviceGetClockInfo", (c("NVML_CLOCK_MEM", _NVML_CLOCK_MEM),)),)),
        Reading("throttle", (Variant("nvmlDeviceGetCurrentClocksEventReasons"),
                             Variant("nvmlDeviceGetCurrentClocksThrottleReasons"))),
        Reading("processes", (Variant("nvmlDeviceGetComputeRunningProcesses_v3"),
                              Variant("nvmlDeviceGetComputeRunningProcesses_v2"),
                              Variant("nvmlDeviceGetComputeRunningProcesses"))),
        # Slow path: 3.9 ms per call on an H200 (docs/design.md §3), a counter anyway.
        Reading("energy", (Variant("nvmlDeviceGetTotalEnergyConsumption"),), slow=True),
        # Settings and error counters change rarely; 10 s resolution is enough.
        Reading("power_limit", (Variant("nvmlDeviceGetEnforcedPowerLimit"),
                                Variant("nvmlDeviceGetPowerManagementLimit")), slow=True),
        Reading("ecc_corrected", (Variant("nvmlDeviceGetTotalEccErrors", (
            c("NVML_MEMORY_ERROR_TYPE_CORRECTED", _NVML_MEMORY_ERROR_TYPE_CORRECTED), vol)),), slow=True),
        Reading("ecc_uncorrected", (Variant("nvmlDeviceGetTotalEccErrors", (
            c("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", _NVML_MEMORY_ERROR_TYPE_UNCORRECTED), vol)),),
            slow=True),
    )


@dataclass
class DeviceState:
    """One GPU: identity, the chosen variant per reading, and per-device collector state."""

    index: int
    handle: object  # NVML's device handle, opaque
    uuid: str
    name: str
    memory_total: int | None = None
    # NVML's bus id ("00000000:3B:00.0"), the value DCGM-exporter's pci_bus_id label carries; None
    # where NVML does not answer (the label is then absent).
    pci_bus_id: str | None = None
    chosen: dict[str, Variant] = field(default_factory=dict)  # reading key -> working variant
    slow_keys: frozenset[str] = frozenset()
    gpm_supported: bool = False
    xid_event_set: object | None = None  # NVML's event set, opaque
    xid_wait_fn: str = ""
    lost: bool = False

    @property
    def labels(self) -> dict[str, str]:
        out = {"gpu": str(self.index), "uuid": self.uuid, "model": self.name}
        if self.pci_bus_id:
            out["pci_bus_id"] = self.pci_bus_id
        return out

    def read(self, nvml: Nvml, key: str) -> object:
        """Take one reading (None: absent); drop it from this device for good on a permanent error."""
        v = self.chosen.get(key)
        if v is None:
            return None
        value = nvml.call(v.fn, self.handle, *v.args, **dict(v.kwargs))
        if value is None and is_permanent(nvml.last_error):
            del self.chosen[key]
        return value


def choose(nvml: Nvml, handle: object, reading: Reading) -> tuple[Variant | None, object]:
    """The first variant that answers (and its value), else the first with a transient failure."""
    fallback: Variant | None = None
    for v in reading.variants:
        if v.kwargs and any(val is None for _, val in v.kwargs):
            continue
        value = nvml.call(v.fn, handle, *v.args, **dict(v.kwargs))
        if value is not None:
            return v, value
        if fallback is None and not is_permanent(nvml.last_error):
            fallback = v
    return fallback, None


def probe_device(nvml: Nvml, index: int, gpm: bool | None, xid: bool) -> DeviceState | None:
    """Probe one device. ``gpm``: True/False forces, None means "auto" (use it where supported)."""
    handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
    if handle is None:
        return None
    uuid = nvml.call("nvmlDeviceGetUUID", handle)
    name = nvml.call("nvmlDeviceGetName", handle)
    dev = DeviceState(index=index, handle=handle, uuid=as_text(uuid) if uuid is not None else f"gpu{index}",
                      name=as_text(name) if name is not None else "unknown",
                     pci_bus_id=_bus_id(nvml, handle))
    slow: set[str] = set()
    for r in readings(nvml):
        v, value = choose(nvml, handle, r)
        if v is None:
            continue
        dev.chosen[r.key] = v
        if r.slow:
            slow.add(r.key)
        if r.key == "memory" and isinstance(value, MemoryInfo):
            dev.memory_total = int(value.total)
    dev.slow_keys = frozenset(slow)
    if gpm is not False:
        support = nvml.call("nvmlGpmQueryDeviceSupport", handle)
        dev.gpm_supported = bool(support is not None and getattr(support, "isSupportedDevice", 0))
    if xid:
        _register_xid(nvml, dev)
    return dev


def _bus_id(nvml: Nvml, handle: object) -> str | None:
    """The device's PCI bus id, read once at probe (identity, like the UUID)."""
    fn = next((f for f in ("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo") if nvml.has(f)), None)
    info = nvml.call(fn, handle) if fn is not None else None
    bus = getattr(info, "busId", None) if info is not None else None
    text = as_text(bus).strip() if bus is not None else ""
    return text or None


def _register_xid(nvml: Nvml, dev: DeviceState) -> None:
    """One event set per device, so an event needs no handle-to-index mapping. Waiting on it with
    timeout 0 is a non-blocking poll; "Timeout" then means "no event"."""
    wait_fn = next((f for f in ("nvmlEventSetWait_v2", "nvmlEventSetWait") if nvml.has(f)), "")
    if not wait_fn:
        return
    es = nvml.call("nvmlEventSetCreate")
    if es is None:
        return
    nvml.call("nvmlDeviceRegisterEvents", dev.handle,
              nvml.const("nvmlEventTypeXidCriticalError", _NVML_EVENT_TYPE_XID), es)
    if nvml.last_error is not None:
        nvml.call("nvmlEventSetFree", es)
        return
    dev.xid_event_set = es
    dev.xid_wait_fn = wait_fn
