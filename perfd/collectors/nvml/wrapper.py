"""The one door to NVML: every NVML call perfd makes goes through ``Nvml.call``.

Why one door: NVML fails in many small ways that are normal on a real fleet (a function this driver
lacks, a counter this board does not have, no permission inside a container, a GPU that fell off the
bus). None of them may stop the agent, and none may flood its log. So the wrapper

- imports pynvml lazily (the agent must start on a node without it),
- turns every NVML error into ``None`` ("absent", never 0), counted per (function, error) and logged
  once per pair,
- treats a function that this pynvml lacks like one the driver lacks (absent, logged once),
- counts calls and the time spent in each function, so the cost of sampling is measured, not guessed
  (docs/design.md §3 "NVML call cost").

Tests inject a fake module (``Nvml(module=fake)``); nothing else here knows it is not pynvml.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable

from perfd.collectors.config_values import as_int

log = logging.getLogger(__name__)

# Errors after which calling the same function on the same device again is pointless: the answer
# will not change while the driver stays loaded. The collector drops such a function from a device's
# fast path. Everything else (Timeout, Unknown, GpuIsLost, ...) is counted and retried next time.
PERMANENT_ERRORS = frozenset({
    "NotSupported", "FunctionNotFound", "Missing", "LibraryMismatch", "NoPermission",
    "ArgumentVersionMismatch", "InvalidArgument", "Deprecated",
})

# NVML return codes (nvml.h) -> the names pynvml gives its NVMLError_* classes. Used when an error
# object carries only its numeric ``value``.
_ERROR_NAMES: dict[int, str] = {
    1: "Uninitialized", 2: "InvalidArgument", 3: "NotSupported", 4: "NoPermission",
    5: "AlreadyInitialized", 6: "NotFound", 7: "InsufficientSize", 8: "InsufficientPower",
    9: "DriverNotLoaded", 10: "Timeout", 11: "IrqIssue", 12: "LibraryNotFound", 13: "FunctionNotFound",
    14: "CorruptedInforom", 15: "GpuIsLost", 16: "ResetRequired", 17: "OperatingSystem",
    18: "LibRmVersionMismatch", 19: "InUse", 20: "Memory", 21: "NoData", 22: "VgpuEccNotSupported",
    23: "InsufficientResources", 24: "FreqNotSupported", 25: "ArgumentVersionMismatch", 26: "Deprecated",
    27: "NotReady", 28: "GpuNotFound", 29: "InvalidState", 999: "Unknown",
}


def error_name(exc: BaseException) -> str:
    """A short, bounded name for an exception raised by an NVML call ("NotSupported", ...)."""
    cls = type(exc).__name__
    if cls.startswith("NVMLError_"):
        return cls[len("NVMLError_"):]
    if cls == "NVMLLibraryMismatchError":
        # pynvml raises this for an unversioned function the loaded libnvidia-ml lacks.
        return "LibraryMismatch"
    value = getattr(exc, "value", None)
    if isinstance(value, int):
        return _ERROR_NAMES.get(value, f"Code{value}")
    return f"Exception:{cls}"


def as_text(value: object) -> str:
    """Old pynvml versions return bytes for strings, newer ones str."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


class Nvml:
    """Lazy, counted, never-raising access to NVML.

    ``init()`` returns None when NVML is usable, else a reason for the user. ``call(name, *args)``
    returns the function's value or None (absent). ``last_error`` holds the error name of the most
    recent call (None after success): the capability probe uses it to tell "not supported here" from
    "failed this time". One instance is used from one thread (the agent calls collectors serially).
    """

    def __init__(self, module: object | None = None,
                 clock_ns: Callable[[], int] = time.perf_counter_ns) -> None:
        # pynvml, or a stand-in with its functions and constants: only ever read by name (getattr).
        self._mod: object | None = module
        self._clock_ns = clock_ns
        self.initialized = False
        self.reason = ""
        self.last_error: str | None = None
        self.calls: Counter[str] = Counter()  # function -> calls (successful or not)
        self.call_ns: Counter[str] = Counter()  # function -> total ns spent inside it
        self.errors: Counter[tuple[str, str]] = Counter()  # (function, error) -> count
        self._logged: set[tuple[str, str]] = set()

    # --- life cycle ---------------------------------------------------------------------------
    def init(self) -> str | None:
        """Load pynvml and initialise NVML. None on success, else why not (never raises)."""
        if self.initialized:
            return None
        if self._mod is None:
            try:
                import pynvml
            except Exception as exc:  # ImportError, or a broken install raising anything
                self.reason = f"NVML not found: python module pynvml (nvidia-ml-py) unavailable ({exc})"
                return self.reason
            self._mod = pynvml
        init_fn = getattr(self._mod, "nvmlInit", None)
        if init_fn is None:
            self.reason = "NVML not found: pynvml has no nvmlInit"
            return self.reason
        try:
            init_fn()
        except Exception as exc:
            name = error_name(exc)
            if name == "LibraryNotFound":
                self.reason = "NVML not found: libnvidia-ml.so.1 could not be loaded (no NVIDIA driver?)"
            elif name == "DriverNotLoaded":
                self.reason = "NVML not found: the NVIDIA kernel driver is not loaded"
            elif name == "NoPermission":
                self.reason = "NVML not usable: no permission to open the NVIDIA devices"
            else:
                self.reason = f"NVML init failed: {name} ({exc})"
            return self.reason
        self.initialized = True
        count = self.call("nvmlDeviceGetCount")
        if not count:
            self.reason = "no NVIDIA GPU (NVML reports 0 devices)"
            self.shutdown()
            return self.reason
        self.reason = ""
        return None

    def shutdown(self) -> None:
        if self.initialized and self._mod is not None:
            try:
                shutdown = getattr(self._mod, "nvmlShutdown", None)
                if shutdown is not None:
                    shutdown()
            except Exception as exc:  # shutting down must never fail the agent
                log.debug("nvmlShutdown failed: %s", exc)
        self.initialized = False

    # --- calls --------------------------------------------------------------------------------
    def has(self, fn_name: str) -> bool:
        """Whether this pynvml defines ``fn_name`` (the driver may still lack it)."""
        return self._mod is not None and callable(getattr(self._mod, fn_name, None))

    def const(self, name: str, default: object) -> object:
        """A pynvml constant or class (``NVML_CLOCK_SM``, ``c_nvmlGpmMetricsGet_t``), or ``default``."""
        if self._mod is None:
            return default
        return getattr(self._mod, name, default)

    def call(self, fn_name: str, *args: object, **kwargs: object) -> object:
        """Call ``pynvml.<fn_name>(*args, **kwargs)``; its value, or None when absent or failed. What
        the value is depends on the function: the caller checks it (perfd reads a few fields of a
        few NVML structs, collectors/nvml/probe.py)."""
        return self.call_quiet(fn_name, (), *args, **kwargs)

    def call_quiet(self, fn_name: str, expected: Iterable[str], *args: object, **kwargs: object) -> object:
        """Like ``call``, but errors named in ``expected`` (e.g. "Timeout" from an event wait with
        timeout 0, which only means "no event") are neither counted nor logged."""
        self.calls[fn_name] += 1
        fn = getattr(self._mod, fn_name, None) if self._mod is not None else None
        if fn is None:
            self._fail(fn_name, "Missing", "function not in this pynvml version")
            return None
        t0 = self._clock_ns()
        try:
            value = fn(*args, **kwargs)
        except Exception as exc:
            self.call_ns[fn_name] += self._clock_ns() - t0
            name = error_name(exc)
            if name in expected:
                self.last_error = name
                return None
            self._fail(fn_name, name, str(exc))
            return None
        self.call_ns[fn_name] += self._clock_ns() - t0
        self.last_error = None
        return value

    def _fail(self, fn_name: str, err: str, detail: str) -> None:
        self.last_error = err
        key = (fn_name, err)
        self.errors[key] += 1
        if key not in self._logged:
            self._logged.add(key)
            level = logging.INFO if err in ("NotSupported", "Missing") else logging.WARNING
            log.log(level, "NVML %s: %s (%s); treated as absent, counted, not logged again",
                    fn_name, err, detail)

    def cost_us(self) -> dict[str, float]:
        """Mean microseconds per call of each function called so far (time inside pynvml)."""
        return {fn: self.call_ns[fn] / n / 1000.0 for fn, n in self.calls.items() if n and fn in self.call_ns}

    # --- conveniences used by probe and record -------------------------------------------------
    def driver_version(self) -> str | None:
        v = self.call("nvmlSystemGetDriverVersion")
        return None if v is None else as_text(v)

    def nvml_version(self) -> str | None:
        v = self.call("nvmlSystemGetNVMLVersion")
        return None if v is None else as_text(v)

    def device_count(self) -> int:
        n = self.call("nvmlDeviceGetCount")
        return as_int(n) if n else 0
