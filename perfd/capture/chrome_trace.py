"""Read a Kineto / Chrome trace (``.json``, ``.json.gz``, ``.json.xz``, ``.json.zst``) into timeline events.

Kineto writes complete events (``ph: "X"``) with ``ts``/``dur`` in µs. GPU activity has ``cat``
``kernel``, ``gpu_memcpy`` or ``gpu_memset``, and its ``pid`` is the device (``args.device`` says
so explicitly in newer traces). ``gpu_user_annotation`` is the GPU-side projection of a
``record_function`` range, on the device; ``user_annotation`` the CPU-side one. The top-level
``distributedInfo.rank`` names the rank when the process ran under torch.distributed.

The host side (perfd.capture.ops reads it to charge each kernel to its op): ``cpu_op`` (a framework
op, with ``args["Sequence number"]`` when it made or runs an autograd node), ``user_annotation``,
``python_function`` (with Python stacks: ``nn.Module: X_n`` frames), ``cuda_runtime`` /
``cuda_driver`` calls whose ``args.correlation`` equals the kernel's, and ``fwdbwd`` flow events
(``ph`` ``s`` on the forward op, ``f`` on the backward node, one ``id``). Every host event's ``tid``
is its thread. ``Optimizer.step#`` / ``ProfilerStep#`` annotations count the training steps captured.
"""

from __future__ import annotations

import contextlib
import gc
import re
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

from perfd.analytics.breakdown.device_breakdown import CaptureAnalysis
from perfd.analytics.breakdown.op_parts import is_step_annotation
from perfd.capture.analysis import NvtxRange, TraceData, analyze_trace
from perfd.capture.ops import Flow, HostRange, Launch, RangeKind
from perfd.capture.step_marks import optimizer_marks
from perfd.capture.timeline_events import KernelEvent, MemEvent
from perfd.capture.trace_input import TRACE_CAPS, TraceCaps, load_trace_json

_MEM = {"gpu_memcpy": "memcpy", "gpu_memset": "memset"}
_GPU = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
_HOST = {"cpu_op": RangeKind.OP, "user_annotation": RangeKind.ANNOTATION, "python_function": RangeKind.FRAME}
_CALLS = ("cuda_runtime", "cuda_driver")
_PROFILER_SPAN = "trace"  # the profiler's own span of its window ("PyTorch Profiler (0)"), not the job's
# Runtime calls that wait for the device: the host stands still until the GPU drains.
SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cuCtxSynchronize", "cuStreamSynchronize")
_DIGITS = re.compile(r"(\d+)\s*$")
# JSON objects are dicts: ``isinstance(x, dict)`` is a type check, ``isinstance(x, Mapping)`` an ABC
# lookup, ~0.3 µs each of the ~900k a 100k-event trace asked (a third of reading it).


def _int(value: object) -> int | None:
    """An int from 0, "0" or "GPU 0" (Kineto's pid/tid spellings vary by version)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _DIGITS.search(value)
        return int(m.group(1)) if m else None
    return None


def _device(ev: Mapping[str, object]) -> int | None:
    args = ev.get("args")
    if isinstance(args, dict) and "device" in args:
        return _int(args["device"])
    return _int(ev.get("pid"))


def _stream(ev: Mapping[str, object]) -> int | None:
    args = ev.get("args")
    if isinstance(args, dict) and "stream" in args:
        return _int(args["stream"])
    return _int(ev.get("tid"))


def _dim3(v: object) -> tuple[int, int, int] | None:
    """A launch's grid or block ([x, y, z]), None when the trace gives none."""
    if not isinstance(v, list) or len(v) != 3 or not all(isinstance(x, int) and not isinstance(x, bool)
                                                         for x in v):
        return None
    return int(v[0]), int(v[1]), int(v[2])


def _arg(ev: Mapping[str, object], key: str) -> object:
    args = ev.get("args")
    return args.get(key) if isinstance(args, dict) else None


def parse_chrome_trace(doc: object, source: str = "") -> TraceData:
    """Events of a parsed trace (the JSON object, or a bare event list)."""
    events: list[object]
    if isinstance(doc, dict):
        listed = doc.get("traceEvents")
        events = listed if isinstance(listed, list) else []  # (what else it holds has no event)
        info = doc.get("distributedInfo")
        rank = _int(info.get("rank")) if isinstance(info, dict) else None
    elif isinstance(doc, list):
        events, rank = doc, None
    else:
        raise ValueError(f"{source or 'trace'}: not a Chrome trace (expected an object or a list)")
    picked: list[tuple[str, Mapping[str, object], float, float]] = []
    flows: dict[object, dict[str, tuple[int, float]]] = {}  # flow id -> its start and finish
    timed = 0  # complete events, read or not (TraceData.timed_events)
    for ev in events:
        if not isinstance(ev, dict):
            continue
        cat = str(ev.get("cat", "")).lower()
        if cat == "fwdbwd" and ev.get("ph") in ("s", "f"):
            ts, tid = ev.get("ts"), _int(ev.get("tid"))
            if isinstance(ts, (int, float)) and tid is not None and ev.get("id") is not None:
                flows.setdefault(ev.get("id"), {})[str(ev["ph"])] = (tid, float(ts))
            continue
        if ev.get("ph") != "X":
            continue
        ts, dur = ev.get("ts"), ev.get("dur")
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)) or dur < 0:
            continue
        timed += cat != _PROFILER_SPAN
        if cat in _GPU or cat in _HOST or cat in _CALLS:
            picked.append((cat, ev, float(ts), float(dur)))
    # Recent Kineto writes ts relative to baseTimeNanoseconds, older traces large absolute µs values
    # (~1e12 and up); scaled to ns those lose resolution in a float64, and kernels can be shorter
    # than a µs. Rebase on the first event before scaling.
    t0 = min((p[2] for p in picked), default=0.0)
    data = TraceData(source=source, rank=rank, timed_events=timed)
    gpu_ann: list[NvtxRange] = []
    cpu_ann: list[NvtxRange] = []
    steps: dict[str, int] = {}  # step annotation kind -> how many
    for cat, ev, ts, dur in picked:
        start = (ts - t0) * 1000.0
        end = start + dur * 1000.0
        name = str(ev.get("name", "?"))
        if cat in _HOST or cat in _CALLS:
            tid = _int(ev.get("tid"))
            if tid is None:
                continue
            if cat in _CALLS:
                corr = _int(_arg(ev, "correlation"))
                if corr is not None:
                    data.launches.append(Launch(corr, tid, start, name, end))
                if name in SYNC_CALLS:
                    data.syncs.append(Launch(corr or 0, tid, end, name))
                continue
            seq = _arg(ev, "Sequence number")
            data.ranges.append(HostRange(tid, start, end, name, _HOST[cat],
                                         seq if isinstance(seq, int) and not isinstance(seq, bool) else None))
            if cat == "user_annotation":
                cpu_ann.append(NvtxRange(start, end, name))
                if is_step_annotation(name):
                    kind = name.lower().split("#", 1)[0]
                    steps[kind] = steps.get(kind, 0) + 1
            continue
        dev = _device(ev)
        if dev is None:
            continue
        corr = _int(_arg(ev, "correlation"))
        if cat == "kernel":
            data.kernels.append(KernelEvent(dev, start, end, name, _stream(ev), corr=corr,
                                            grid=_dim3(_arg(ev, "grid")), block=_dim3(_arg(ev, "block"))))
        elif cat in _MEM:
            data.memcpys.append(MemEvent(dev, start, end, _MEM[cat], _stream(ev), name=name, corr=corr))
        else:
            gpu_ann.append(NvtxRange(start, end, name, dev))
    for ends in flows.values():
        if "s" in ends and "f" in ends:
            (ftid, fts), (btid, bts) = ends["s"], ends["f"]
            data.flows.append(Flow(ftid, (fts - t0) * 1000.0, btid, (bts - t0) * 1000.0))
    # The GPU-side projection is the one that belongs to a device; use the CPU ranges (for every
    # device of this single-process trace) only when there is none, never both (double counting).
    data.nvtx = gpu_ann or cpu_ann
    # One kind counts the steps: a torch.profiler trace marks each with ProfilerStep# and, when the
    # loop runs a torch optimizer, Optimizer.step# too (counting both doubled them); the profiler's
    # marks, which the trace's owner placed, first.
    data.steps = steps.get("profilerstep") or len(optimizer_marks(data.ranges)) or None
    return data


# The cyclic garbage collector, paused while a trace is read (one pause however many threads read): the
# read allocates a container per JSON object and per event (~1M for a 16k-launch step) and frees none of
# them before it returns, so every collection the allocations trigger walks a growing heap and finds
# nothing. Paused, reading the 16k-launch H100 capture (kineto_h100_megatron/ops_default) took 0.98 s of
# CPU against 1.39 s (three runs each, a quiet 2-core VM). JSON makes trees, not cycles: what the read
# drops is freed by reference counting as before, and the collector runs again once every read is done.
_GC_LOCK = threading.Lock()
_gc_readers = 0
_gc_was_enabled = False


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    global _gc_readers, _gc_was_enabled
    with _GC_LOCK:
        if _gc_readers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_readers += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _gc_readers -= 1
            if _gc_readers == 0 and _gc_was_enabled:
                gc.enable()


def read_chrome_trace(path: str | Path, caps: TraceCaps = TRACE_CAPS) -> TraceData:
    """Read a trace file; gzip, xz and zstd are recognised by their magic bytes, whatever the file is
    called. What the read may take is bounded while the file streams in (perfd.capture.trace_input:
    TraceRefused past a cap). A truncated archive raises EOFError, xz's as gzip's."""
    with _gc_paused():
        return parse_chrome_trace(load_trace_json(path, caps), str(path))


def analyze_chrome_trace(path: str | Path, top_n: int = 10, use_frames: bool = True) -> CaptureAnalysis:
    """The trace's analysis; TraceEmpty where it holds nothing perfd reads (TraceRefused past a cap)."""
    return analyze_trace(read_chrome_trace(path), top_n, use_frames)
