"""Timing markers (CUDA events or host clock) and rolling percentiles for the step hook.

A marker is recorded at a step boundary and read later: ``query()`` says whether it has happened
(a CUDA event completes when the GPU stream reaches it) and ``elapsed_ns`` measures between two.
The host marker is the same interface on ``time.perf_counter_ns`` (CPU-only runs and tests), so the
hook has one code path. Nothing here imports torch at module import.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable
from typing import Any, Protocol


class Marker(Protocol):
    def record(self) -> None: ...

    def query(self) -> bool: ...

    def elapsed_ns(self, end: Any) -> int: ...


MarkerFactory = Callable[[], Marker]


class HostMarker:
    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = 0

    def record(self) -> None:
        self.t = time.perf_counter_ns()

    def query(self) -> bool:
        return True

    def elapsed_ns(self, end: HostMarker) -> int:
        return end.t - self.t


# CUDA driver results the fast path understands; anything else switches it off.
_CUDA_SUCCESS = 0
_CUDA_ERROR_NOT_READY = 600


class CudaApi:
    """What the CUDA markers of one hook share: the current-stream cache and the driver fast path.

    Measured on an H200 host (torch 2.11, Python 3.12), per call: ``Event.record()`` 10.6 µs, of
    which ``torch.cuda.current_stream()`` is 7.7 µs (it builds a Stream object); ``record(stream)``
    3.1 µs; ``query()`` 2.1 µs; ``elapsed_time()`` 4.4 µs. Three events a step through that API
    cost ~45 µs, far over the hook's 10 µs budget. So:

    - the current stream is looked up with ``torch._C._cuda_getCurrentStream`` (~0.4 µs) and the
      Stream object rebuilt only when the stream or device changed;
    - after torch has created an event (its first record), record/query/elapsed go straight to the
      CUDA driver (``cuEventRecord``, ``cuEventQuery``, ``cuEventElapsedTime``) on torch's own
      event and stream handles: runtime and driver handles are the same objects (CUDA
      runtime/driver interoperability), the training thread already has the primary context
      current, and ctypes calls cost ~1 µs. Any unexpected driver result switches the fast path
      off for good (``driver_errors``) and the torch API is used from then on.

    ``PERFD_HOOK_CUDA_API=torch`` forces the torch API.
    """

    def __init__(self, torch: Any, use_driver: bool = True) -> None:
        self.torch = torch
        self._get_device = torch._C._cuda_getDevice
        self._get_stream = torch._C._cuda_getCurrentStream
        self._get_raw_stream = torch._C._cuda_getCurrentRawStream
        self._key: tuple[int, int] | None = None
        self._stream: Any = None
        self.driver_errors = 0
        self.last_driver_error: int | None = None
        self.driver: Any = _load_driver() if use_driver else None

    @property
    def name(self) -> str:
        return "driver" if self.driver is not None else "torch"

    def stream(self) -> Any:
        dev = self._get_device()
        sid, didx, dtype = self._get_stream(dev)
        if (sid, dev) != self._key:
            self._stream = self.torch.cuda.Stream(stream_id=sid, device_index=didx, device_type=dtype)
            self._key = (sid, dev)
        return self._stream

    def raw_stream(self) -> int:
        return int(self._get_raw_stream(self._get_device()))

    def driver_failed(self, rc: int) -> None:
        self.driver = None
        self.driver_errors += 1
        self.last_driver_error = rc


def _load_driver() -> Any:
    try:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")  # already loaded by torch: the same driver instance
        vp, fp = ctypes.c_void_p, ctypes.POINTER(ctypes.c_float)
        lib.cuEventRecord.argtypes, lib.cuEventRecord.restype = [vp, vp], ctypes.c_int
        lib.cuEventQuery.argtypes, lib.cuEventQuery.restype = [vp], ctypes.c_int
        elapsed = getattr(lib, "cuEventElapsedTime_v2", None) or lib.cuEventElapsedTime
        elapsed.argtypes, elapsed.restype = [fp, vp, vp], ctypes.c_int
        return _Driver(lib.cuEventRecord, lib.cuEventQuery, elapsed, ctypes.c_float, ctypes.byref)
    except (OSError, AttributeError):
        return None


class _Driver:
    __slots__ = ("byref", "c_float", "elapsed", "query", "record")

    def __init__(self, record: Any, query: Any, elapsed: Any, c_float: Any, byref: Any) -> None:
        self.record, self.query, self.elapsed = record, query, elapsed
        self.c_float, self.byref = c_float, byref


class CudaMarker:
    """A ``torch.cuda.Event(enable_timing=True)`` recorded on the current stream.

    ``query()`` never blocks (``cuEventQuery`` / ``cudaEventQuery``). ``elapsed_ns`` is only called
    once the end marker has completed (the hook harvests in order), so it never waits either. The
    first record goes through torch, which creates the event on the current device; later calls
    use the driver fast path of :class:`CudaApi` when it is on.
    """

    __slots__ = ("api", "ev", "handle")

    def __init__(self, api: CudaApi) -> None:
        self.api = api
        self.ev = api.torch.cuda.Event(enable_timing=True)
        self.handle = 0

    def record(self) -> None:
        api = self.api
        drv = api.driver
        if drv is not None and self.handle:
            rc = drv.record(self.handle, api.raw_stream())
            if rc == _CUDA_SUCCESS:
                return
            api.driver_failed(rc)
        self.ev.record(api.stream())
        if not self.handle:
            self.handle = int(self.ev.cuda_event)

    def query(self) -> bool:
        drv = self.api.driver
        if drv is not None and self.handle:
            rc = drv.query(self.handle)
            if rc == _CUDA_SUCCESS:
                return True
            if rc == _CUDA_ERROR_NOT_READY:
                return False
            self.api.driver_failed(rc)
        return bool(self.ev.query())

    def elapsed_ns(self, end: CudaMarker) -> int:
        drv = self.api.driver
        if drv is not None and self.handle and end.handle:
            ms = drv.c_float()
            rc = drv.elapsed(drv.byref(ms), self.handle, end.handle)
            if rc == _CUDA_SUCCESS:
                return int(ms.value * 1e6)
            self.api.driver_failed(rc)
        return int(self.ev.elapsed_time(end.ev) * 1e6)  # elapsed_time is in ms (float)


def cuda_marker_factory(api: CudaApi) -> MarkerFactory:
    def make() -> Marker:
        return CudaMarker(api)

    return make


class RollingPercentiles:
    """Percentiles over the last ``window`` values: O(log n) search + O(n) memmove per add.

    Keeps the values both in arrival order (a ring, to know which one leaves the window) and sorted
    (so a percentile is an index lookup). For a window of a few hundred the memmove costs a few
    hundred nanoseconds: cheap enough for the training thread, unlike sorting per step.
    ``p50_p90_p99()`` caches the three nearest-rank indices, which only change while the window
    fills (profiling showed three generic ``percentile`` calls cost more than the rest of a step).
    """

    def __init__(self, window: int = 100) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = window
        self._ring: list[int] = []
        self._pos = 0
        self._sorted: list[int] = []
        self._idx_n = -1
        self._idx = (0, 0, 0)

    def add(self, value: int) -> None:
        srt = self._sorted
        ring = self._ring
        if len(ring) == self.window:
            pos = self._pos
            del srt[bisect.bisect_left(srt, ring[pos])]
            ring[pos] = value
            self._pos = (pos + 1) % self.window
        else:
            ring.append(value)
        bisect.insort(srt, value)

    def __len__(self) -> int:
        return len(self._sorted)

    @staticmethod
    def _rank_index(p: float, n: int) -> int:
        return min(max(math.ceil(p * n / 100.0), 1), n) - 1

    def percentile(self, p: float) -> int | None:
        """Nearest-rank percentile (a value that was observed), None when empty."""
        n = len(self._sorted)
        if n == 0:
            return None
        return self._sorted[self._rank_index(p, n)]

    def p50_p90_p99(self) -> tuple[int, int, int] | None:
        srt = self._sorted
        n = len(srt)
        if n == 0:
            return None
        if n != self._idx_n:
            self._idx_n = n
            self._idx = (self._rank_index(50, n), self._rank_index(90, n), self._rank_index(99, n))
        i50, i90, i99 = self._idx
        return srt[i50], srt[i90], srt[i99]
