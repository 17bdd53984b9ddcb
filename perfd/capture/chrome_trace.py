"""Read a Kineto / Chrome trace (``.json`` or ``.json.gz``) into timeline events.

Kineto writes complete events (``ph: "X"``) with ``ts``/``dur`` in µs. GPU activity has ``cat``
``kernel``, ``gpu_memcpy`` or ``gpu_memset``, and its ``pid`` is the device (``args.device`` says
so explicitly in newer traces). ``gpu_user_annotation`` is the GPU-side projection of a
``record_function`` range, on the device; ``user_annotation`` the CPU-side one. The top-level
``distributedInfo.rank`` names the rank when the process ran under torch.distributed.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perfd.capture.analysis import CaptureAnalysis, KernelEvent, MemEvent, NvtxRange, TraceData, analyze_trace

_MEM = {"gpu_memcpy": "memcpy", "gpu_memset": "memset"}
_DIGITS = re.compile(r"(\d+)\s*$")


def _int(value: Any) -> int | None:
    """An int from 0, "0" or "GPU 0" (Kineto's pid/tid spellings vary by version)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _DIGITS.search(value)
        return int(m.group(1)) if m else None
    return None


def _device(ev: Mapping[str, Any]) -> int | None:
    args = ev.get("args")
    if isinstance(args, Mapping) and "device" in args:
        return _int(args["device"])
    return _int(ev.get("pid"))


def _stream(ev: Mapping[str, Any]) -> int | None:
    args = ev.get("args")
    if isinstance(args, Mapping) and "stream" in args:
        return _int(args["stream"])
    return _int(ev.get("tid"))


def parse_chrome_trace(doc: Any, source: str = "") -> TraceData:
    """Events of a parsed trace (the JSON object, or a bare event list)."""
    if isinstance(doc, Mapping):
        events = doc.get("traceEvents") or []
        info = doc.get("distributedInfo")
        rank = _int(info.get("rank")) if isinstance(info, Mapping) else None
    elif isinstance(doc, list):
        events, rank = doc, None
    else:
        raise ValueError(f"{source or 'trace'}: not a Chrome trace (expected an object or a list)")
    picked: list[tuple[str, Mapping[str, Any], float, float]] = []
    for ev in events:
        if not isinstance(ev, Mapping) or ev.get("ph") != "X":
            continue
        cat = str(ev.get("cat", "")).lower()
        if cat not in ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "user_annotation"):
            continue
        ts, dur = ev.get("ts"), ev.get("dur")
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)) or dur < 0:
            continue
        picked.append((cat, ev, float(ts), float(dur)))
    # Recent Kineto writes ts relative to baseTimeNanoseconds, older traces large absolute µs values
    # (~1e12 and up); scaled to ns those lose resolution in a float64, and kernels can be shorter
    # than a µs. Rebase on the first event before scaling.
    t0 = min((p[2] for p in picked), default=0.0)
    data = TraceData(source=source, rank=rank)
    gpu_ann: list[NvtxRange] = []
    cpu_ann: list[NvtxRange] = []
    for cat, ev, ts, dur in picked:
        start = (ts - t0) * 1000.0
        end = start + dur * 1000.0
        name = str(ev.get("name", "?"))
        if cat == "user_annotation":
            cpu_ann.append(NvtxRange(start, end, name))
            continue
        dev = _device(ev)
        if dev is None:
            continue
        if cat == "kernel":
            data.kernels.append(KernelEvent(dev, start, end, name, _stream(ev)))
        elif cat in _MEM:
            data.memcpys.append(MemEvent(dev, start, end, _MEM[cat], _stream(ev), name=name))
        else:
            gpu_ann.append(NvtxRange(start, end, name, dev))
    # The GPU-side projection is the one that belongs to a device; use the CPU ranges (for every
    # device of this single-process trace) only when there is none, never both (double counting).
    data.nvtx = gpu_ann or cpu_ann
    return data


def read_chrome_trace(path: str | Path) -> TraceData:
    """Read a trace file; gzip is recognised by its magic bytes, whatever the file is called."""
    p = Path(path)
    raw = p.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON: {e}") from e
    return parse_chrome_trace(doc, str(p))


def analyze_chrome_trace(path: str | Path, top_n: int = 10) -> CaptureAnalysis:
    return analyze_trace(read_chrome_trace(path), top_n)
