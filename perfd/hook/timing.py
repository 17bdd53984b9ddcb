"""Timing markers (CUDA events or host clock) and rolling percentiles for the step hook.

A marker is recorded at a step boundary and read later: ``query()`` says whether it has happened
(a CUDA event completes when the GPU stream reaches it) and ``elapsed_ns`` measures between two.
The host marker is the same interface on ``time.perf_counter_ns`` (CPU-only runs and tests), so the
hook has one code path. Nothing here imports torch at module import.

Threads: ``record()`` runs on the training thread; ``query()`` and ``elapsed_ns()`` may run on the
hook's harvester thread (see ``perfd.hook.harvest``), which first makes the training thread's CUDA
context current (:meth:`CudaApi.capture_context` / :meth:`CudaApi.bind_context`). A marker is
never recorded and read at the same time: the hook hands it from one thread to the other.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    import ctypes

    from typing_extensions import Self


class Marker(Protocol):
    def record(self) -> None: ...

    def query(self) -> bool: ...

    # Between two markers of one kind; None: not complete yet, ask again later.
    def elapsed_ns(self, end: Self) -> int | None: ...


MarkerFactory = Callable[[], Marker]


class HostMarker:
    """A step boundary on the host's clock (``time.perf_counter_ns``): the marker a hook without CUDA
    uses (``StepHook(cuda=False)``, or no GPU), complete as soon as it is recorded."""

    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = 0

    def record(self) -> None:
        """Take the time now."""
        self.t = time.perf_counter_ns()

    def query(self) -> bool:
        """Whether the marker is complete.

        Returns:
            Always True: a host time is complete once taken.
        """
        return True

    def elapsed_ns(self, end: HostMarker) -> int:
        """The time from this marker to a later one.

        Args:
            end: a marker recorded after this one.

        Returns:
            Nanoseconds between the two recordings.
        """
        return end.t - self.t


# CUDA driver results the fast path understands; anything else switches it off.
_CUDA_SUCCESS = 0
_CUDA_ERROR_NOT_READY = 600
_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1


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

    The driver binds a context per thread: the hook's harvester thread calls ``bind_context()``
    with the context the training thread had current when the events were created
    (``capture_context()``), so its ``cuEventQuery``/``cuEventElapsedTime`` see the same events.
    Which calls release the GIL: see ``_load_driver``.
    """

    def __init__(self, torch: ModuleType, use_driver: bool = True) -> None:
        self.torch = torch
        self._get_device = torch._C._cuda_getDevice
        self._get_stream = torch._C._cuda_getCurrentStream
        self._get_raw_stream = torch._C._cuda_getCurrentRawStream
        self._key: tuple[int, int] | None = None
        self._stream: object = None  # a torch.cuda.Stream
        self.driver_errors = 0
        self.last_driver_error: int | None = None
        self.driver: CudaDriver | None = _load_driver() if use_driver else None
        self.context: int | None = None  # CUcontext of the training thread, once captured
        self.device: int | None = None  # and its device
        self._exchange_capture_mode = _load_capture_mode()  # with either API

    @property
    def name(self) -> Literal["driver", "torch"]:
        return "driver" if self.driver is not None else "torch"

    def stream(self) -> object:
        """The current torch.cuda.Stream (an event is recorded on it)."""
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

    def capture_context(self) -> None:
        """On the training thread, after torch has used the device: remember its current context."""
        self.device = int(self._get_device())
        drv = self.driver
        if drv is None:
            return
        ctx = drv.c_void_p()
        rc = drv.ctx_get(drv.byref(ctx))
        if rc != _CUDA_SUCCESS:
            self.driver_failed(rc)
        elif ctx.value:
            self.context = int(ctx.value)

    def bind_context(self) -> bool:
        """On another thread: make the captured context current there (a driver call on a thread
        without it fails with CUDA_ERROR_INVALID_CONTEXT); with the torch API, the device (the
        runtime would use device 0's). False when there is nothing to bind.

        Also puts that thread in the thread-local stream-capture mode. It never captures a CUDA
        graph, but in the default (global) mode an event query from it while the training thread
        captures one is a prohibited call that invalidates the capture; thread-local mode ignores
        other threads' captures (what torch's NCCL watchdog does for its event queries)."""
        fn = self._exchange_capture_mode
        if fn is not None:
            import ctypes

            fn(ctypes.byref(ctypes.c_int(_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)))
        drv = self.driver
        if drv is not None and self.context is not None:
            rc = drv.ctx_set(self.context)
            if rc == _CUDA_SUCCESS:
                return True
            self.driver_failed(rc)
        if self.device is None:
            return False
        self.torch._C._cuda_setDevice(self.device)  # this thread's device only
        return True


def _load_driver() -> _Driver | None:
    """The driver entry points. ``cuEventRecord`` (training thread) goes through ``CDLL``, which
    releases the GIL for the call, as before: it can wait for room in a full launch queue.
    ``cuEventQuery`` and ``cuEventElapsedTime`` (harvester thread) go through ``PyDLL``, which keeps
    it: they never wait for the GPU (an incomplete event is CUDA_ERROR_NOT_READY), take ~1-2 µs,
    and torch's own ``Event.query()``/``elapsed_time()`` make the same calls holding the GIL. A
    harvester that let go of the GIL at each of them would have to win it back from the training
    thread every time, which in a loop that releases the GIL once a step (the worst case, e.g.
    one torch op and host work) reports about one step per step and falls behind: keeping it, a
    pass runs through to its next datagram (one ``sendto`` per 32 records)."""
    try:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")  # already loaded by torch: the same driver instance
        keep_gil = ctypes.PyDLL("libcuda.so.1")  # the same library, its calls keep the GIL
        vp, fp = ctypes.c_void_p, ctypes.POINTER(ctypes.c_float)
        lib.cuEventRecord.argtypes, lib.cuEventRecord.restype = [vp, vp], ctypes.c_int
        keep_gil.cuEventQuery.argtypes, keep_gil.cuEventQuery.restype = [vp], ctypes.c_int
        elapsed = getattr(keep_gil, "cuEventElapsedTime_v2", None) or keep_gil.cuEventElapsedTime
        elapsed.argtypes, elapsed.restype = [fp, vp, vp], ctypes.c_int
        lib.cuCtxGetCurrent.argtypes, lib.cuCtxGetCurrent.restype = [ctypes.POINTER(vp)], ctypes.c_int
        lib.cuCtxSetCurrent.argtypes, lib.cuCtxSetCurrent.restype = [vp], ctypes.c_int
        return _Driver(lib.cuEventRecord, keep_gil.cuEventQuery, elapsed, lib.cuCtxGetCurrent,
                       lib.cuCtxSetCurrent, ctypes.c_float, ctypes.c_void_p, ctypes.byref)
    except (OSError, AttributeError):
        return None


def _load_capture_mode() -> Callable[[object], int] | None:
    """``cuThreadExchangeStreamCaptureMode`` (CUDA >= 10.1), or None."""
    try:
        import ctypes

        fn = ctypes.CDLL("libcuda.so.1").cuThreadExchangeStreamCaptureMode
        fn.argtypes, fn.restype = [ctypes.POINTER(ctypes.c_int)], ctypes.c_int
        return fn
    except (OSError, AttributeError):
        return None


class CudaDriver(Protocol):
    """The CUDA driver calls of the fast path (:class:`_Driver`, or a test's stand-in): each returns
    a CUresult; events, streams and contexts are their handles (ints), results come back through
    ``byref`` of a ctypes value."""

    def record(self, event: int, stream: int, /) -> int: ...

    def query(self, event: int, /) -> int: ...

    def elapsed(self, ms: object, start: int, end: int, /) -> int: ...

    def ctx_get(self, ctx: object, /) -> int: ...

    def ctx_set(self, ctx: int, /) -> int: ...

    def c_float(self) -> ctypes.c_float: ...

    def c_void_p(self) -> ctypes.c_void_p: ...

    def byref(self, value: ctypes.c_float | ctypes.c_void_p, /) -> object: ...


CFunction = Callable[..., int]  # a ctypes function pointer of the driver: returns a CUresult


class _Driver:
    """The driver entry points, resolved once: each call is a cached ctypes function pointer."""

    __slots__ = ("byref", "c_float", "c_void_p", "ctx_get", "ctx_set", "elapsed", "query", "record")

    def __init__(self, record: CFunction, query: CFunction, elapsed: CFunction, ctx_get: CFunction,
                 ctx_set: CFunction, c_float: type[ctypes.c_float], c_void_p: type[ctypes.c_void_p],
                 byref: Callable[[ctypes.c_float | ctypes.c_void_p], object]) -> None:
        self.record, self.query, self.elapsed = record, query, elapsed
        self.ctx_get, self.ctx_set = ctx_get, ctx_set
        self.c_float, self.c_void_p, self.byref = c_float, c_void_p, byref


class CudaMarker:
    """A ``torch.cuda.Event(enable_timing=True)`` recorded on the current stream.

    ``query()`` never blocks (``cuEventQuery`` / ``cudaEventQuery``). ``elapsed_ns`` is only called
    once the end marker has completed (the hook harvests in order), so it never waits either. torch
    creates the event at its first record, on the current device: the hook does that for its whole
    pool once, with :meth:`prime`, before the first step, so no step creates an event. Later calls
    use the driver fast path of :class:`CudaApi` when it is on.
    """

    __slots__ = ("api", "ev", "handle")

    def __init__(self, api: CudaApi) -> None:
        self.api = api
        self.ev = api.torch.cuda.Event(enable_timing=True)
        self.handle = 0

    def prime(self) -> None:
        """Have torch create the event now (a record on the current stream), not in a step."""
        if not self.handle:
            self.ev.record(self.api.stream())
            self.handle = int(self.ev.cuda_event)

    def record(self) -> None:
        # The step path: one cached ctypes pointer and torch's raw current stream (~0.5 µs; the
        # stream is looked up every time because the loop may switch streams).
        api = self.api
        drv = api.driver
        if drv is not None and self.handle:
            rc = drv.record(self.handle, api._get_raw_stream(api._get_device()))
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

    def elapsed_ns(self, end: CudaMarker) -> int | None:
        """GPU time between the two markers; None if one is not complete yet (the driver says
        CUDA_ERROR_NOT_READY instead of waiting: e.g. events on two streams completing out of
        order), which the hook takes as "ask again later", not as a driver failure."""
        drv = self.api.driver
        if drv is not None and self.handle and end.handle:
            ms = drv.c_float()
            rc = drv.elapsed(drv.byref(ms), self.handle, end.handle)
            if rc == _CUDA_SUCCESS:
                return int(ms.value * 1e6)
            if rc == _CUDA_ERROR_NOT_READY:
                return None
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

    Args:
        window: how many of the latest values the percentiles are of (at least 1).
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
        """Take in a value; the oldest leaves once the window is full.

        Args:
            value: the value (a step time in nanoseconds, as the hook adds them).
        """
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
        """The nearest-rank percentile of the values in the window.

        Args:
            p: the percentile, 0 to 100.

        Returns:
            A value that was added (nearest rank: never an interpolation), or None while the window
            is empty.
        """
        n = len(self._sorted)
        if n == 0:
            return None
        return self._sorted[self._rank_index(p, n)]

    def p50_p90_p99(self) -> tuple[int, int, int] | None:
        """The three percentiles the hook sends with each step, as :meth:`percentile` gives them.

        Returns:
            (p50, p90, p99) of the window, or None while it is empty.
        """
        srt = self._sorted
        n = len(srt)
        if n == 0:
            return None
        if n != self._idx_n:
            self._idx_n = n
            self._idx = (self._rank_index(50, n), self._rank_index(90, n), self._rank_index(99, n))
        i50, i90, i99 = self._idx
        return srt[i50], srt[i90], srt[i99]
